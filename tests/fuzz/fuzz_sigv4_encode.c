// SPDX-License-Identifier: MIT
/*
 * Fuzz sigv4's encoders and canonicalization: sigv4_uri_encode in both
 * modes (checked against a decoder: only unreserved characters, '/' and
 * %XX come out, and decoding gives the input back), sigv4_query_canonical
 * on the input's lines taken as name/value pairs, and the canonical request
 * and Authorization with those lines as extra headers.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/log.h"
#include "objstore/sigv4.h"

#define FUZZ_MAX_LINES 16

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	log_set_level((enum log_level)(LOG_LVL_ERROR - 1));
	return 0;
}

static int fuzz_hex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1; /* lowercase hex is a bug too */
}

static void fuzz_encode(const char *s, bool keep_slash)
{
	char *enc = sigv4_uri_encode(s, keep_slash);
	const char *p;
	size_t i = 0;

	if (!enc)
		return;
	for (p = enc; *p; p++, i++) {
		char c = *p;

		if (c == '%') {
			int hi = fuzz_hex(p[1]);
			int lo = hi < 0 ? -1 : fuzz_hex(p[2]);

			if (lo < 0)
				abort();
			c = (char)(hi << 4 | lo);
			p += 2;
			if (c == '/' && keep_slash)
				abort();
		} else if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			     (c >= '0' && c <= '9') || c == '-' || c == '.' ||
			     c == '_' || c == '~' ||
			     (c == '/' && keep_slash))) {
			abort();
		}
		if (s[i] != c)
			abort();
	}
	if (s[i])
		abort();
	free(enc);
}

static void fuzz_requests(char *s)
{
	const char *lines[FUZZ_MAX_LINES + 3];
	char *p, *save = NULL, *q, *creq = NULL;
	size_t n = 0;
	char auth[1024];
	struct sigv4_request rq = {
		.method = "GET",
		.canonical_uri = "/b/k",
		.payload_hash = SIGV4_UNSIGNED_PAYLOAD,
		.amz_date = "20130524T000000Z",
		.region = "us-east-1",
		.service = "s3",
	};

	for (p = strtok_r(s, "\n", &save); p && n < FUZZ_MAX_LINES;
	     p = strtok_r(NULL, "\n", &save))
		lines[n++] = p;
	q = sigv4_query_canonical(lines, n / 2);
	if (!q && errno != ENOMEM)
		abort();
	if (q && n >= 2 && !q[0])
		abort();

	lines[n++] = "host:h";
	lines[n++] = "x-amz-content-sha256:UNSIGNED-PAYLOAD";
	lines[n++] = "x-amz-date:20130524T000000Z";
	rq.canonical_query = q;
	rq.headers = lines;
	rq.nheaders = n;
	if (sigv4_canonical_request(&rq, &creq) == 0 && !creq)
		abort();
	free(creq);
	(void)sigv4_authorization(&rq, "AK", "SK", auth, sizeof(auth));
	free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);

	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	fuzz_encode(s, true);
	fuzz_encode(s, false);
	fuzz_requests(s);
	free(s);
	return 0;
}
