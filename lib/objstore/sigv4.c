// SPDX-License-Identifier: MIT
/*
 * sigv4: AWS Signature Version 4 (header-based, single chunk).
 *
 * State: none; every function works on its arguments only and is safe to call
 * from any thread. Buffers that held key material are wiped before they are
 * freed or go out of scope.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/sha256.h"
#include "sigv4.h"
#include "util/sslutil.h"
#include "util/strutil.h"

#define SIGV4_SHA256_LEN 32
/* Bounds that no real request comes near; they keep size arithmetic safe. */
#define SIGV4_MAX_HEADERS 256
#define SIGV4_MAX_FIELD (64 * 1024)

/* A growing string; on allocation failure it remembers and ignores the rest. */
struct sigv4_buf {
	char *p;
	size_t len;
	size_t cap;
	int err;
};

/* One parsed header: name lowercased, value trimmed and collapsed. */
struct sigv4_hdr {
	char *name;
	char *value;
	size_t index; /* position in the caller's list: a stable sort */
};

static void sigv4_buf_add(struct sigv4_buf *b, const char *s, size_t n)
{
	if (b->err)
		return;
	if (grow_array(&b->p, &b->cap, b->len + n + 1, 1, 256)) {
		b->err = -ENOMEM;
		return;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sigv4_buf_str(struct sigv4_buf *b, const char *s)
{
	sigv4_buf_add(b, s, strlen(s));
}

/* Hand the string over (never NULL unless b->err) */
static char *sigv4_buf_take(struct sigv4_buf *b)
{
	char *p;

	if (!b->err && !b->p)
		sigv4_buf_add(b, "", 0);
	if (b->err) {
		free(b->p);
		b->p = NULL;
		return NULL;
	}
	p = b->p;
	b->p = NULL;
	return p;
}

void sigv4_sha256_hex(const void *data, size_t len, char out[65])
{
	unsigned char md[SHA256_LEN];

	if (sha256_buf(data, len, md)) {
		out[0] = '\0';
		return;
	}
	strutil_hex(md, SIGV4_SHA256_LEN, out);
}

void sigv4_amz_date(time_t t, char out[17])
{
	struct tm tm;

	if (!gmtime_r(&t, &tm) ||
	    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm) != 16)
		snprintf(out, 17, "19700101T000000Z");
}

static bool sigv4_unreserved(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
	       (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
	       c == '~';
}

char *sigv4_uri_encode(const char *s, bool keep_slash)
{
	static const char digits[] = "0123456789ABCDEF";
	size_t n = strlen(s);
	char *out, *o;

	if (n > (SIZE_MAX - 1) / 3) {
		errno = ENOMEM;
		return NULL;
	}
	out = malloc(3 * n + 1);
	if (!out)
		return NULL;
	o = out;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (sigv4_unreserved(*p) || (keep_slash && *p == '/')) {
			*o++ = (char)*p;
		} else {
			*o++ = '%';
			*o++ = digits[*p >> 4];
			*o++ = digits[*p & 15];
		}
	}
	*o = '\0';
	return out;
}

/* An encoded query pair for sorting */
struct sigv4_qpair {
	char *name;
	char *value;
};

static int sigv4_qpair_cmp(const void *a, const void *b)
{
	const struct sigv4_qpair *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	return c ? c : strcmp(x->value, y->value);
}

char *sigv4_query_canonical(const char *const *kv, size_t n)
{
	struct sigv4_buf b = { 0 };
	struct sigv4_qpair *pairs = NULL;
	char *out = NULL;
	size_t done = 0;

	if (n == 0)
		return strdup("");
	if (!kv || n > SIZE_MAX / (2 * sizeof(*pairs))) {
		errno = EINVAL;
		return NULL;
	}
	pairs = calloc(n, sizeof(*pairs));
	if (!pairs)
		return NULL;
	for (; done < n; done++) {
		const char *name = kv[2 * done];
		const char *value = kv[2 * done + 1];

		if (!name) {
			errno = EINVAL;
			goto out;
		}
		pairs[done].name = sigv4_uri_encode(name, false);
		pairs[done].value = sigv4_uri_encode(value ? value : "", false);
		if (!pairs[done].name || !pairs[done].value) {
			done++;
			errno = ENOMEM;
			goto out;
		}
	}
	qsort(pairs, n, sizeof(*pairs), sigv4_qpair_cmp);
	for (size_t i = 0; i < n; i++) {
		if (i)
			sigv4_buf_add(&b, "&", 1);
		sigv4_buf_str(&b, pairs[i].name);
		sigv4_buf_add(&b, "=", 1);
		sigv4_buf_str(&b, pairs[i].value);
	}
	out = sigv4_buf_take(&b);
	if (!out)
		errno = ENOMEM;
out:
	for (size_t i = 0; i < done; i++) {
		free(pairs[i].name);
		free(pairs[i].value);
	}
	free(pairs);
	return out;
}

static int sigv4_hdr_cmp(const void *a, const void *b)
{
	const struct sigv4_hdr *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	if (c)
		return c;
	return x->index < y->index ? -1 : x->index > y->index;
}

static bool sigv4_is_space(char c)
{
	return c == ' ' || c == '\t';
}

/* Parse "Name: a   b " into name "name", value "a b". */
static int sigv4_hdr_parse(const char *raw, size_t index, struct sigv4_hdr *h)
{
	const char *colon, *v, *end;
	size_t nlen;
	char *o;

	if (strlen(raw) > SIGV4_MAX_FIELD || strpbrk(raw, "\r\n")) {
		log_error("sigv4: header %zu is too long or holds CR/LF",
			  index);
		return -EINVAL;
	}
	colon = strchr(raw, ':');
	if (!colon) {
		log_error("sigv4: header %zu has no ':'", index);
		return -EINVAL;
	}
	while (sigv4_is_space(*raw))
		raw++;
	nlen = (size_t)(colon - raw);
	while (nlen && sigv4_is_space(raw[nlen - 1]))
		nlen--;
	if (!nlen) {
		log_error("sigv4: header %zu has an empty name", index);
		return -EINVAL;
	}
	h->index = index;
	h->name = strndup(raw, nlen);
	if (!h->name)
		return -ENOMEM;
	for (o = h->name; *o; o++) {
		if ((unsigned char)*o <= ' ' || (unsigned char)*o >= 127) {
			log_error("sigv4: header %zu has a bad name", index);
			return -EINVAL;
		}
		*o = (char)tolower((unsigned char)*o);
	}
	v = colon + 1;
	while (sigv4_is_space(*v))
		v++;
	end = v + strlen(v);
	while (end > v && sigv4_is_space(end[-1]))
		end--;
	h->value = malloc((size_t)(end - v) + 1);
	if (!h->value)
		return -ENOMEM;
	o = h->value;
	for (; v < end; v++) {
		if (sigv4_is_space(*v)) {
			if (o > h->value && o[-1] == ' ')
				continue;
			*o++ = ' ';
		} else {
			*o++ = *v;
		}
	}
	*o = '\0';
	return 0;
}

static bool sigv4_amz_date_ok(const char *d)
{
	if (strlen(d) != 16 || d[8] != 'T' || d[15] != 'Z')
		return false;
	for (int i = 0; i < 15; i++)
		if (i != 8 && !isdigit((unsigned char)d[i]))
			return false;
	return true;
}

static bool sigv4_field_ok(const char *s, bool may_be_empty)
{
	if (!s || (!may_be_empty && !*s) || strlen(s) > SIGV4_MAX_FIELD)
		return false;
	return !strpbrk(s, "\r\n ");
}

static int sigv4_check(const struct sigv4_request *rq)
{
	const char *bad = NULL;

	if (!rq)
		bad = "request";
	else if (!sigv4_field_ok(rq->method, false))
		bad = "method";
	else if (!sigv4_field_ok(rq->canonical_uri, false))
		bad = "canonical_uri";
	else if (rq->canonical_query &&
		 !sigv4_field_ok(rq->canonical_query, true))
		bad = "canonical_query";
	else if (!sigv4_field_ok(rq->payload_hash, false))
		bad = "payload_hash";
	else if (!rq->amz_date || !sigv4_amz_date_ok(rq->amz_date))
		bad = "amz_date";
	else if (!sigv4_field_ok(rq->region, false) || strchr(rq->region, '/'))
		bad = "region";
	else if (!sigv4_field_ok(rq->service, false) ||
		 strchr(rq->service, '/'))
		bad = "service";
	else if ((rq->nheaders && !rq->headers) ||
		 rq->nheaders > SIGV4_MAX_HEADERS)
		bad = "headers";
	if (bad) {
		log_error("sigv4: request has a missing or malformed %s", bad);
		return -EINVAL;
	}
	return 0;
}

/*
 * The canonical request, and the SignedHeaders list when signed is non-NULL.
 * Returns 0, -EINVAL or -ENOMEM.
 */
static int sigv4_canonical(const struct sigv4_request *rq, char **out,
			   char **signed_headers)
{
	static const char *const required[] = { "host", "x-amz-content-sha256",
						"x-amz-date" };
	struct sigv4_buf b = { 0 }, sh = { 0 };
	struct sigv4_hdr *h = NULL;
	size_t nh = 0;
	int r;

	*out = NULL;
	if (signed_headers)
		*signed_headers = NULL;
	r = sigv4_check(rq);
	if (r)
		return r;
	if (rq->nheaders) {
		h = calloc(rq->nheaders, sizeof(*h));
		if (!h)
			return -ENOMEM;
	}
	for (; nh < rq->nheaders; nh++) {
		if (!rq->headers[nh]) {
			log_error("sigv4: header %zu is NULL", nh);
			r = -EINVAL;
			goto out;
		}
		r = sigv4_hdr_parse(rq->headers[nh], nh, &h[nh]);
		if (r) {
			nh++;
			goto out;
		}
	}
	if (nh)
		qsort(h, nh, sizeof(*h), sigv4_hdr_cmp);
	for (size_t k = 0; k < sizeof(required) / sizeof(required[0]); k++) {
		bool found = false;

		for (size_t i = 0; i < nh && !found; i++)
			found = strcmp(h[i].name, required[k]) == 0;
		if (!found) {
			log_error("sigv4: the %s header is required",
				  required[k]);
			r = -EINVAL;
			goto out;
		}
	}

	sigv4_buf_str(&b, rq->method);
	sigv4_buf_add(&b, "\n", 1);
	sigv4_buf_str(&b, rq->canonical_uri);
	sigv4_buf_add(&b, "\n", 1);
	sigv4_buf_str(&b, rq->canonical_query ? rq->canonical_query : "");
	sigv4_buf_add(&b, "\n", 1);
	for (size_t i = 0; i < nh; i++) {
		bool first = i == 0 || strcmp(h[i].name, h[i - 1].name);
		bool last = i + 1 == nh || strcmp(h[i].name, h[i + 1].name);

		if (first) {
			sigv4_buf_str(&b, h[i].name);
			sigv4_buf_add(&b, ":", 1);
			if (i)
				sigv4_buf_add(&sh, ";", 1);
			sigv4_buf_str(&sh, h[i].name);
		} else {
			sigv4_buf_add(&b, ",", 1);
		}
		sigv4_buf_str(&b, h[i].value);
		if (last)
			sigv4_buf_add(&b, "\n", 1);
	}
	sigv4_buf_add(&b, "\n", 1);
	sigv4_buf_add(&b, sh.p ? sh.p : "", sh.len);
	sigv4_buf_add(&b, "\n", 1);
	sigv4_buf_str(&b, rq->payload_hash);

	*out = sigv4_buf_take(&b);
	if (!*out) {
		r = -ENOMEM;
		goto out;
	}
	if (signed_headers) {
		*signed_headers = sigv4_buf_take(&sh);
		if (!*signed_headers) {
			free(*out);
			*out = NULL;
			r = -ENOMEM;
			goto out;
		}
	}
	r = 0;
out:
	for (size_t i = 0; i < nh; i++) {
		free(h[i].name);
		free(h[i].value);
	}
	free(h);
	free(b.p);
	free(sh.p);
	return r;
}

int sigv4_canonical_request(const struct sigv4_request *rq, char **out)
{
	return sigv4_canonical(rq, out, NULL);
}

/* The string to sign for an already built canonical request. */
static int sigv4_sts_from(const struct sigv4_request *rq, const char *creq,
			  char **out)
{
	struct sigv4_buf b = { 0 };
	char hash[65];

	sigv4_sha256_hex(creq, strlen(creq), hash);
	if (!hash[0])
		return -EIO;
	sigv4_buf_str(&b, SIGV4_ALGORITHM "\n");
	sigv4_buf_str(&b, rq->amz_date);
	sigv4_buf_add(&b, "\n", 1);
	sigv4_buf_add(&b, rq->amz_date, 8);
	sigv4_buf_add(&b, "/", 1);
	sigv4_buf_str(&b, rq->region);
	sigv4_buf_add(&b, "/", 1);
	sigv4_buf_str(&b, rq->service);
	sigv4_buf_str(&b, "/aws4_request\n");
	sigv4_buf_str(&b, hash);
	*out = sigv4_buf_take(&b);
	return *out ? 0 : -ENOMEM;
}

int sigv4_string_to_sign(const struct sigv4_request *rq, char **out)
{
	char *creq = NULL;
	int r;

	*out = NULL;
	r = sigv4_canonical(rq, &creq, NULL);
	if (r)
		return r;
	r = sigv4_sts_from(rq, creq, out);
	free(creq);
	return r;
}

/* out = HMAC-SHA256(key, data); out holds SIGV4_SHA256_LEN bytes. */
static int sigv4_hmac(const void *key, size_t keylen, const void *data,
		      size_t len, unsigned char *out)
{
	size_t outlen = 0;

	if (!EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, key, keylen, data,
		       len, out, SIGV4_SHA256_LEN, &outlen) ||
	    outlen != SIGV4_SHA256_LEN) {
		return sslutil_fail("sigv4: HMAC-SHA256", -EIO);
	}
	return 0;
}

/* The hex signature of sts with the key derived from secret and the scope. */
static int sigv4_sign(const struct sigv4_request *rq, const char *secret,
		      const char *sts, char sig[65])
{
	unsigned char k[SIGV4_SHA256_LEN], k2[SIGV4_SHA256_LEN];
	size_t slen = strlen(secret);
	char *seed;
	int r;

	seed = malloc(slen + 5);
	if (!seed)
		return -ENOMEM;
	memcpy(seed, "AWS4", 4);
	memcpy(seed + 4, secret, slen + 1);
	r = sigv4_hmac(seed, slen + 4, rq->amz_date, 8, k);
	if (!r)
		r = sigv4_hmac(k, sizeof(k), rq->region, strlen(rq->region),
			       k2);
	if (!r)
		r = sigv4_hmac(k2, sizeof(k2), rq->service, strlen(rq->service),
			       k);
	if (!r)
		r = sigv4_hmac(k, sizeof(k), "aws4_request", 12, k2);
	if (!r)
		r = sigv4_hmac(k2, sizeof(k2), sts, strlen(sts), k);
	if (!r)
		strutil_hex(k, sizeof(k), sig);
	explicit_bzero(seed, slen + 4);
	explicit_bzero(k, sizeof(k));
	explicit_bzero(k2, sizeof(k2));
	free(seed);
	return r;
}

int sigv4_authorization(const struct sigv4_request *rq, const char *access_key,
			const char *secret_key, char *out, size_t outlen)
{
	char *creq = NULL, *signed_headers = NULL, *sts = NULL;
	char sig[65];
	int r, n;

	if (out && outlen)
		out[0] = '\0';
	if (!out || !outlen || !access_key || !*access_key || !secret_key ||
	    !*secret_key || strpbrk(access_key, "/, \r\n")) {
		log_error("sigv4: missing output buffer, access key or secret "
			  "key");
		return -EINVAL;
	}
	r = sigv4_canonical(rq, &creq, &signed_headers);
	if (r)
		goto out;
	r = sigv4_sts_from(rq, creq, &sts);
	if (r)
		goto out;
	r = sigv4_sign(rq, secret_key, sts, sig);
	if (r)
		goto out;
	n = snprintf(out, outlen,
		     SIGV4_ALGORITHM " Credential=%s/%.8s/%s/%s/aws4_request,"
				     "SignedHeaders=%s,Signature=%s",
		     access_key, rq->amz_date, rq->region, rq->service,
		     signed_headers, sig);
	if (n < 0 || (size_t)n >= outlen) {
		out[0] = '\0';
		r = -ENOSPC;
		goto out;
	}
	r = 0;
out:
	explicit_bzero(sig, sizeof(sig));
	free(creq);
	free(signed_headers);
	free(sts);
	return r;
}
