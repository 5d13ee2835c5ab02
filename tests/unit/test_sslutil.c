// SPDX-License-Identifier: MIT
/* sslutil_fail: logs "<what> failed: " with OpenSSL's first queued error,
 * or out of memory / unknown error where none is queued; clears the queue
 * and gives back the caller's -errno. */
#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <string.h>

#include "check.h"
#include "dstage/log.h"
#include "util/sslutil.h"

static const char *cause_after(const char *what, int err, int want)
{
	log_cause_clear();
	CHECK_INT(sslutil_fail(what, err), want);
	CHECK(ERR_peek_error() == 0);
	return log_cause();
}

int main(void)
{
	const char *c;

	/* Nothing queued: the fallback by err. */
	ERR_clear_error();
	CHECK_STR(cause_after("sha256: init", -ENOMEM, -ENOMEM),
		  "sha256: init failed: out of memory");
	CHECK_STR(cause_after("sigv4: HMAC-SHA256", -EIO, -EIO),
		  "sigv4: HMAC-SHA256 failed: unknown error");

	/* Queued errors: the first one's text, and all of them cleared. */
	ERR_raise(ERR_LIB_EVP, EVP_R_UNSUPPORTED_ALGORITHM);
	ERR_raise(ERR_LIB_EVP, EVP_R_BAD_DECRYPT);
	c = cause_after("sha256: final", -ENOMEM, -ENOMEM);
	CHECK(c && !strncmp(c, "sha256: final failed: error:", 28));
	CHECK(c && strstr(c, "unsupported") != NULL);
	CHECK(c && !strstr(c, "out of memory"));
	return check_result();
}
