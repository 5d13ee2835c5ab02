// SPDX-License-Identifier: MIT
/* sslutil: what lib/ needs around OpenSSL's calls (sslutil.h). */
#include <errno.h>
#include <openssl/err.h>
#include <stdio.h>

#include "dstage/log.h"
#include "sslutil.h"

int sslutil_fail(const char *what, int err)
{
	unsigned long e = ERR_get_error();
	char msg[256] = "unknown error";

	if (e)
		ERR_error_string_n(e, msg, sizeof(msg));
	else if (err == -ENOMEM)
		snprintf(msg, sizeof(msg), "out of memory");
	log_error("%s failed: %s", what, msg);
	ERR_clear_error();
	return err;
}
