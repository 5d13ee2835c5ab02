// SPDX-License-Identifier: MIT
/*
 * sigv4 against the worked examples of AWS's "Signature Calculations for the
 * Authorization Header: Transferring Payload in a Single Chunk" page
 * (AmazonS3/latest/API/sig-v4-header-based-auth.html): GET Object with a
 * Range, PUT Object, GET Bucket Lifecycle and GET Bucket (List Objects).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "objstore/sigv4.h"

#define AK "AKIAIOSFODNN7EXAMPLE"
#define SK "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define HOST "host:examplebucket.s3.amazonaws.com"
#define DATE "20130524T000000Z"
#define EMPTY SIGV4_EMPTY_SHA256
#define H_DATE "x-amz-date:20130524T000000Z"
#define H_EMPTY                 \
	"x-amz-content-sha256:" \
	"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static void expect(const struct sigv4_request *rq, const char *creq,
		   const char *sts, const char *auth)
{
	char out[512];
	char *s = NULL;

	CHECK_INT(sigv4_canonical_request(rq, &s), 0);
	if (creq)
		CHECK_STR(s, creq);
	free(s);
	s = NULL;
	CHECK_INT(sigv4_string_to_sign(rq, &s), 0);
	if (sts)
		CHECK_STR(s, sts);
	free(s);
	CHECK_INT(sigv4_authorization(rq, AK, SK, out, sizeof(out)), 0);
	CHECK_STR(out, auth);
}

static void test_get_object(void)
{
	/* Deliberately unsorted, mixed case and with extra blanks. */
	const char *const hdrs[] = {
		"X-Amz-Date: 20130524T000000Z",
		"Range:   bytes=0-9 ",
		"Host: examplebucket.s3.amazonaws.com",
		H_EMPTY,
	};
	struct sigv4_request rq = {
		.method = "GET",
		.canonical_uri = "/test.txt",
		.canonical_query = "",
		.headers = hdrs,
		.nheaders = 4,
		.payload_hash = EMPTY,
		.amz_date = DATE,
		.region = "us-east-1",
		.service = "s3",
	};
	char out[512];
	size_t need;

	expect(&rq,
	       "GET\n/test.txt\n\n" HOST "\nrange:bytes=0-9\n"
	       "x-amz-content-sha256:" EMPTY "\nx-amz-date:" DATE "\n\n"
	       "host;range;x-amz-content-sha256;x-amz-date\n" EMPTY,
	       "AWS4-HMAC-SHA256\n" DATE
	       "\n20130524/us-east-1/s3/aws4_request\n"
	       "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc4396494697"
	       "2",
	       "AWS4-HMAC-SHA256 Credential=" AK "/20130524/us-east-1/s3/"
	       "aws4_request,SignedHeaders=host;range;x-amz-content-sha256;"
	       "x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f01"
	       "70aba48dd91039c6036bdb41");

	/* -ENOSPC one byte short, then exactly enough. */
	CHECK_INT(sigv4_authorization(&rq, AK, SK, out, sizeof(out)), 0);
	need = strlen(out) + 1;
	CHECK_INT(sigv4_authorization(&rq, AK, SK, out, need - 1), -ENOSPC);
	CHECK_STR(out, "");
	CHECK_INT(sigv4_authorization(&rq, AK, SK, out, need), 0);

	/* A required header missing. */
	rq.nheaders = 3;
	CHECK_INT(sigv4_authorization(&rq, AK, SK, out, sizeof(out)), -EINVAL);
	rq.nheaders = 4;
	CHECK_INT(sigv4_authorization(&rq, AK, "", out, sizeof(out)), -EINVAL);
	rq.amz_date = "2013-05-24";
	CHECK_INT(sigv4_authorization(&rq, AK, SK, out, sizeof(out)), -EINVAL);
	rq.amz_date = DATE;
	rq.method = NULL;
	CHECK_INT(sigv4_authorization(&rq, AK, SK, out, sizeof(out)), -EINVAL);
}

static void test_put_object(void)
{
	const char body[] = "Welcome to Amazon S3.";
	const char *const hdrs[] = {
		"x-amz-storage-class:REDUCED_REDUNDANCY",
		"Date: Fri, 24 May 2013 00:00:00 GMT",
		H_DATE,
		"x-amz-content-sha256:"
		"44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b"
		"4e99e42034a8b803f8b072",
		"host:examplebucket.s3.amazonaws.com",
	};
	struct sigv4_request rq = {
		.method = "PUT",
		.canonical_query = "",
		.headers = hdrs,
		.nheaders = 5,
		.amz_date = DATE,
		.region = "us-east-1",
		.service = "s3",
	};
	char hash[65];
	char *path;

	sigv4_sha256_hex(body, strlen(body), hash);
	CHECK_STR(hash, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8"
			"b803f8b072");
	path = sigv4_uri_encode("/test$file.text", true);
	CHECK_STR(path, "/test%24file.text");
	rq.canonical_uri = path;
	rq.payload_hash = hash;

	expect(&rq,
	       "PUT\n/test%24file.text\n\n"
	       "date:Fri, 24 May 2013 00:00:00 GMT\n" HOST "\n"
	       "x-amz-content-sha256:44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b"
	       "4e99e42034a8b803f8b072\nx-amz-date:" DATE "\n"
	       "x-amz-storage-class:REDUCED_REDUNDANCY\n\n"
	       "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n"
	       "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b07"
	       "2",
	       "AWS4-HMAC-SHA256\n" DATE
	       "\n20130524/us-east-1/s3/aws4_request\n"
	       "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019"
	       "d",
	       "AWS4-HMAC-SHA256 Credential=" AK "/20130524/us-east-1/s3/"
	       "aws4_request,SignedHeaders=date;host;x-amz-content-sha256;"
	       "x-amz-date;x-amz-storage-class,Signature=98ad721746da40c64f1a"
	       "55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
	free(path);
}

static void test_bucket_queries(void)
{
	const char *const hdrs[] = {
		HOST,
		H_EMPTY,
		H_DATE,
	};
	const char *const lifecycle[] = { "lifecycle", "" };
	const char *const list[] = { "prefix", "J", "max-keys", "2" };
	struct sigv4_request rq = {
		.method = "GET",
		.canonical_uri = "/",
		.headers = hdrs,
		.nheaders = 3,
		.payload_hash = EMPTY,
		.amz_date = DATE,
		.region = "us-east-1",
		.service = "s3",
	};
	char *q;

	q = sigv4_query_canonical(lifecycle, 1);
	CHECK_STR(q, "lifecycle=");
	rq.canonical_query = q;
	expect(&rq,
	       "GET\n/\nlifecycle=\n" HOST "\nx-amz-content-sha256:" EMPTY
	       "\nx-amz-date:" DATE
	       "\n\nhost;x-amz-content-sha256;x-amz-date\n" EMPTY,
	       "AWS4-HMAC-SHA256\n" DATE
	       "\n20130524/us-east-1/s3/aws4_request\n"
	       "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395c"
	       "a",
	       "AWS4-HMAC-SHA256 Credential=" AK "/20130524/us-east-1/s3/"
	       "aws4_request,SignedHeaders=host;x-amz-content-sha256;x-amz-"
	       "date,"
	       "Signature="
	       "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a"
	       "0136783543");
	free(q);

	q = sigv4_query_canonical(list, 2);
	CHECK_STR(q, "max-keys=2&prefix=J");
	rq.canonical_query = q;
	expect(&rq, NULL,
	       "AWS4-HMAC-SHA256\n" DATE
	       "\n20130524/us-east-1/s3/aws4_request\n"
	       "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b"
	       "7",
	       "AWS4-HMAC-SHA256 Credential=" AK "/20130524/us-east-1/s3/"
	       "aws4_request,SignedHeaders=host;x-amz-content-sha256;x-amz-"
	       "date,"
	       "Signature="
	       "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed571"
	       "1ef69dc6f7");
	free(q);
}

static void test_uri_encode(void)
{
	static const struct {
		const char *in;
		bool slash;
		const char *want;
	} cases[] = {
		{ "a b.txt", true, "a%20b.txt" },
		{ "a+b", true, "a%2Bb" },
		{ "100%", true, "100%25" },
		{ "k=v&x", true, "k%3Dv%26x" },
		{ "A-Za-z0-9-._~", false, "A-Za-z0-9-._~" },
		{ "dir/sub/f", true, "dir/sub/f" },
		{ "dir/sub/f", false, "dir%2Fsub%2Ff" },
		{ "caf\xc3\xa9", true, "caf%C3%A9" },
		{ "\xe2\x82\xac", false, "%E2%82%AC" },
		{ "!*'();:@$,?#[]", true,
		  "%21%2A%27%28%29%3B%3A%40%24%2C%3F%23"
		  "%5B%5D" },
		{ "", true, "" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *s = sigv4_uri_encode(cases[i].in, cases[i].slash);

		CHECK_STR(s, cases[i].want);
		free(s);
	}
}

static void test_query(void)
{
	const char *const kv[] = {
		"prefix", "a b/c", "list-type", "2",  "continuation-token",
		"1+/=",	  "a",	   "2",		"a",  "10",
		"A",	  "z",	   "uploads",	NULL,
	};
	char *q = sigv4_query_canonical(kv, 7);

	/* Uppercase sorts before lowercase; equal names by value. */
	CHECK_STR(q, "A=z&a=10&a=2&continuation-token=1%2B%2F%3D&list-type=2&"
		     "prefix=a%20b%2Fc&uploads=");
	free(q);
	q = sigv4_query_canonical(NULL, 0);
	CHECK_STR(q, "");
	free(q);
}

static void test_headers_and_dates(void)
{
	const char *const hdrs[] = {
		"Host:h",
		"x-amz-content-sha256:UNSIGNED-PAYLOAD",
		H_DATE,
		"X-Amz-Meta-A:  one   two\tthree ",
		"x-amz-meta-a:second",
	};
	const char *const bad[] = {
		"Host:h",
		"x-amz-content-sha256:UNSIGNED-PAYLOAD",
		H_DATE,
		"x-evil:a\r\nx-injected: b",
	};
	struct sigv4_request rq = {
		.method = "HEAD",
		.canonical_uri = "/b/k",
		.headers = hdrs,
		.nheaders = 5,
		.payload_hash = SIGV4_UNSIGNED_PAYLOAD,
		.amz_date = DATE,
		.region = "r",
		.service = "s3",
	};
	char *s = NULL;
	char d[17];

	CHECK_INT(sigv4_canonical_request(&rq, &s), 0);
	CHECK_STR(s, "HEAD\n/b/k\n\nhost:h\nx-amz-content-sha256:"
		     "UNSIGNED-PAYLOAD\nx-amz-date:" DATE "\n"
		     "x-amz-meta-a:one two three,second\n\n"
		     "host;x-amz-content-sha256;x-amz-date;x-amz-meta-a\n"
		     "UNSIGNED-PAYLOAD");
	free(s);
	rq.headers = bad;
	rq.nheaders = 4;
	s = NULL;
	CHECK_INT(sigv4_canonical_request(&rq, &s), -EINVAL);
	CHECK(s == NULL);

	sigv4_amz_date(1369353600, d);
	CHECK_STR(d, DATE);
	sigv4_amz_date(0, d);
	CHECK_STR(d, "19700101T000000Z");
}

int main(void)
{
	char h[65];

	sigv4_sha256_hex("", 0, h);
	CHECK_STR(h, SIGV4_EMPTY_SHA256);
	test_get_object();
	test_put_object();
	test_bucket_queries();
	test_uri_encode();
	test_query();
	test_headers_and_dates();
	return check_result();
}
