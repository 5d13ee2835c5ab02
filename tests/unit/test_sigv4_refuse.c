// SPDX-License-Identifier: MIT
/*
 * test_sigv4_refuse: every malformed field of a request to sign is refused
 * (-EINVAL, nothing signed). What is signed is what is sent, so a field
 * that carries CR or LF, a space, or a '/' where the credential scope is
 * built would let a caller's input add headers to the request (header
 * injection) or change what the signature covers. test_sigv4.c checks the
 * signatures and a few refusals; scripts/test --coverage showed the rest of
 * lib/objstore/sigv4.c's checks (sigv4_hdr_parse, sigv4_check, sigv4_field_ok,
 * sigv4_amz_date_ok) taken by no test (issue 21). One row a refusal; each
 * changes one field of a request that signs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dstage/log.h"
#include "objstore/sigv4.h"

#define AK "AKIAIOSFODNN7EXAMPLE"
#define SK "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define DATE "20130524T000000Z"
#define HOST "host:examplebucket.s3.amazonaws.com"
#define SHA "x-amz-content-sha256:" SIGV4_EMPTY_SHA256
#define XDATE "x-amz-date:" DATE

static const char *base_headers[] = { HOST, "range:bytes=0-9", SHA, XDATE };

static struct sigv4_request base(void)
{
	return (struct sigv4_request){
		.method = "GET",
		.canonical_uri = "/test.txt",
		.canonical_query = "",
		.headers = base_headers,
		.nheaders = 4,
		.payload_hash = SIGV4_EMPTY_SHA256,
		.amz_date = DATE,
		.region = "us-east-1",
		.service = "s3",
	};
}

/* The request with one extra header line h (after the required ones). */
static int sign_with_header(const char *h)
{
	const char *hs[] = { HOST, SHA, XDATE, h };
	struct sigv4_request rq = base();
	char out[1024] = "x";
	int ret;

	rq.headers = hs;
	rq.nheaders = 4;
	ret = sigv4_authorization(&rq, AK, SK, out, sizeof(out));
	if (ret && strstr(out, "Signature="))
		return -10000; /* refused, yet something signed */
	return ret;
}

static int sign(const struct sigv4_request *rq)
{
	char out[1024] = "x";
	int ret = sigv4_authorization(rq, AK, SK, out, sizeof(out));

	if (ret && strstr(out, "Signature="))
		return -10000;
	return ret;
}

static void test_headers(void)
{
	static const char *bad[] = {
		"x-amz-meta-a: b\r\nx-amz-acl: public-read", /* CR LF */
		"x-amz-meta-a: b\nx-amz-acl: public-read", /* LF */
		"x-amz-meta-a: b\r", /* CR */
		"x-amz-meta-a b", /* no ':' */
		": value", /* empty name */
		"   : value", /* blank name */
		"bad name: v", /* space in it */
		"bad\tname: v", /* tab */
		"bad\x01name: v", /* control */
		"bad\x7fname: v", /* DEL */
		"b\303\244d: v", /* not ASCII */
	};
	char *huge;

	/* the control: an ordinary extra header signs */
	CHECK_INT(sign_with_header("x-amz-meta-a:  b   c "), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int ret = sign_with_header(bad[i]);

		if (ret != -EINVAL) {
			fprintf(stderr,
				"header row %zu: %d, expected -EINVAL\n", i,
				ret);
			check_failures++;
		}
	}
	/* longer than 64 KiB */
	huge = malloc(70 * 1024);
	if (huge) {
		memcpy(huge, "x-amz-meta-a:", 13);
		memset(huge + 13, 'v', 70 * 1024 - 14);
		huge[70 * 1024 - 1] = '\0';
		CHECK_INT(sign_with_header(huge), -EINVAL);
		free(huge);
	}
}

static void test_fields(void)
{
	struct sigv4_request rq;
	const char *many[300];

	rq = base();
	CHECK_INT(sign(&rq), 0); /* the control */
	CHECK_INT(sign(NULL), -EINVAL);

#define REFUSED(field, value)                                             \
	do {                                                              \
		rq = base();                                              \
		rq.field = value;                                         \
		if (sign(&rq) != -EINVAL) {                               \
			fprintf(stderr, "%s = %s: not refused\n", #field, \
				#value);                                  \
			check_failures++;                                 \
		}                                                         \
	} while (0)

	REFUSED(method, "");
	REFUSED(method, "GET\r\nX-Amz-Acl: public-read");
	REFUSED(method, "GET /other");
	REFUSED(canonical_uri, "");
	REFUSED(canonical_uri, "/a b");
	REFUSED(canonical_uri, "/a\nb");
	REFUSED(canonical_query, "a=1\r\nb=2");
	REFUSED(canonical_query, "a=1 b=2");
	REFUSED(payload_hash, "");
	REFUSED(payload_hash, NULL);
	REFUSED(amz_date, NULL);
	REFUSED(amz_date, "20130524T00000Z"); /* short */
	REFUSED(amz_date, "20130524T0000000Z"); /* long */
	REFUSED(amz_date, "20130524X000000Z"); /* no T */
	REFUSED(amz_date, "20130524T000000X"); /* no Z */
	REFUSED(amz_date, "2013052aT000000Z"); /* a letter */
	REFUSED(amz_date, "20130524T00a000Z");
	REFUSED(region, "");
	REFUSED(region, "us-east-1/x");
	REFUSED(region, "us east");
	REFUSED(service, "");
	REFUSED(service, "s3/aws4_request");
	REFUSED(service, "s3\n");
	REFUSED(headers, NULL);
#undef REFUSED

	/* more headers than the limit */
	for (size_t i = 0; i < 300; i++)
		many[i] = "x-amz-meta-a:b";
	many[0] = HOST;
	many[1] = SHA;
	many[2] = XDATE;
	rq = base();
	rq.headers = many;
	rq.nheaders = 257;
	CHECK_INT(sign(&rq), -EINVAL);
	rq.nheaders = 256;
	CHECK_INT(sign(&rq), 0);
}

int main(void)
{
	log_set_level(LOG_LVL_ERROR);
	test_headers();
	test_fields();
	return check_result();
}
