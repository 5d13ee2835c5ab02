/* SPDX-License-Identifier: MIT */
/*
 * sigv4: AWS Signature Version 4 for S3 requests signed in the Authorization
 * header (single-chunk payloads), on OpenSSL's EVP API.
 *
 * The caller builds the request (method, encoded path, canonical query, the
 * headers it will send) and asks for the Authorization value; everything the
 * signature covers is taken from struct sigv4_request, so what is signed is
 * exactly what is sent. Secrets are never logged; intermediate keys are wiped.
 */
#ifndef DSTAGE_SIGV4_H
#define DSTAGE_SIGV4_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

/* "AWS4-HMAC-SHA256 Credential=<64>/<8>/<region>/<service>/aws4_request,..." */
#define SIGV4_ALGORITHM "AWS4-HMAC-SHA256"
#define SIGV4_UNSIGNED_PAYLOAD "UNSIGNED-PAYLOAD"
/* SHA-256 of the empty string: the payload hash of a request without a body */
#define SIGV4_EMPTY_SHA256 \
	"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct sigv4_request {
	const char *method; /* "GET" */
	/* already URI-encoded path, e.g. "/bucket/a%20b.txt" */
	const char *canonical_uri;
	/* already sorted and encoded "a=1&b=2" (sigv4_query_canonical), or ""
	 * (NULL is taken as "") */
	const char *canonical_query;
	/*
	 * "name:value" strings. Names are lowercased, values trimmed and inner
	 * runs of spaces collapsed, and the list sorted by name here; a name
	 * given twice is signed once with its values joined by ','. Must
	 * include host, x-amz-content-sha256 and x-amz-date. CR, LF and NUL are
	 * refused (header injection).
	 */
	const char *const *headers;
	size_t nheaders;
	/* lowercase hex SHA-256 of the body, or SIGV4_UNSIGNED_PAYLOAD */
	const char *payload_hash;
	const char *amz_date; /* "20130524T000000Z" */
	const char *region; /* "us-east-1" */
	const char *service; /* "s3" */
};

/*
 * Build the Authorization header value
 *   "AWS4-HMAC-SHA256 Credential=AK/20130524/us-east-1/s3/aws4_request,
 *    SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,
 *    Signature=<64 hex>" (one line, no spaces after the commas)
 * into out (outlen bytes, NUL included). Returns:
 *   0        done
 *   -ENOSPC  outlen is too small (out is then an empty string)
 *   -EINVAL  a missing or malformed field, a header without ':', a required
 *            header absent, an empty key (logged, without the secret)
 *   -ENOMEM  out of memory
 *   -EIO     OpenSSL failed (its message logged)
 * Never logs the secret.
 */
int sigv4_authorization(const struct sigv4_request *rq, const char *access_key,
			const char *secret_key, char *out, size_t outlen);

/*
 * The canonical request (*out, malloc'd, no trailing newline), for tests and
 * debug logging. Returns 0, -EINVAL (as above, logged) or -ENOMEM.
 */
int sigv4_canonical_request(const struct sigv4_request *rq, char **out);

/*
 * The string to sign (*out, malloc'd): algorithm, date, scope and the hex
 * SHA-256 of the canonical request. Returns 0, -EINVAL (logged), -ENOMEM or
 * -EIO (OpenSSL failure, logged).
 */
int sigv4_string_to_sign(const struct sigv4_request *rq, char **out);

/*
 * SigV4 URI encoding: A-Z a-z 0-9 - . _ ~ are kept, every other byte becomes
 * %XX (uppercase hex); '/' is kept when keep_slash (object paths) and encoded
 * otherwise (query names and values). Returns a malloc'd string, or NULL with
 * errno ENOMEM.
 */
char *sigv4_uri_encode(const char *s, bool keep_slash);

/*
 * The canonical query string from n (name, value) pairs kv[2*i], kv[2*i+1],
 * raw and unencoded (a NULL or "" value gives "name="): each is encoded with
 * sigv4_uri_encode(.., false), the pairs sorted by encoded name then encoded
 * value (byte order) and joined "a=1&b=2". n == 0 gives "". Returns a
 * malloc'd string, or NULL with errno ENOMEM (or EINVAL for a NULL name).
 */
char *sigv4_query_canonical(const char *const *kv, size_t n);

/*
 * Lowercase hex SHA-256 of len bytes at data into out. Should OpenSSL fail
 * (out of memory), the failure is logged and out is the empty string, which
 * no server accepts as a hash.
 */
void sigv4_sha256_hex(const void *data, size_t len, char out[65]);

/* The x-amz-date form "YYYYMMDDTHHMMSSZ" (16 chars + NUL) of t, in UTC. */
void sigv4_amz_date(time_t t, char out[17]);

#endif
