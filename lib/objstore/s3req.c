// SPDX-License-Identifier: MIT
/*
 * s3req: the request engine of the s3:// backend (see s3store_i.h), on
 * libcurl, signed with our own Signature V4 signer (lib/objstore/sigv4.c).
 *
 * Every operation is a batch of requests (struct s3req) run by s3req_run() on a
 * curl multi handle, at most s3.max_inflight at once. A single GET is a batch
 * of one; get_many and multipart parts are larger batches. Each request moves
 * through:
 *
 *   QUEUED --start--> ACTIVE --finish--> DONE (result 0 or -errno)
 *      ^                          |
 *      +----- retriable, ---------+
 *             after backoff (full jitter), while attempts and deadline last
 *
 * A QUEUED request starts once the process's rate limits grant it; a
 * throttling answer holds them and halves the rate (docs/objstore.md).
 * Retriable: transport errors (reset, truncated body, timeout, refused), 5xx,
 * 429, 408, 400 RequestTimeout, a 200 carrying <Error> for a retriable code,
 * and a body shorter (or longer) than its range. A request is re-signed on
 * every attempt (fresh x-amz-date). Bytes reach the caller's buffer only from
 * a 2xx answer, and a short answer is an error, never data.
 *
 * Connections: a pool of contexts (multi handle + easy handles), each keeping
 * its multi's connection cache alive between calls, so sequential calls reuse
 * connections. Locking: s3store.pool_lock protects pool_head only; it is a
 * leaf lock, never held while a request runs. Everything else in struct
 * s3store is immutable after open; the counters are atomics.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/metrics.h"
#include "dstage/timeutil.h"
#include "ratelimit_shm_i.h"
#include "s3store_i.h"
#include "s3xml.h"
#include "sigv4.h"
#include "util/strutil.h"

/* xorshift64*, per thread, seeded from getrandom: jitter only. */
static uint64_t s3req_rand(void)
{
	static __thread uint64_t x;

	if (!x) {
		if (getrandom(&x, sizeof(x), 0) != sizeof(x) || !x)
			x = (uint64_t)timeutil_mono_ms() *
				    0x9E3779B97F4A7C15ULL |
			    1;
	}
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	return x * 0x2545F4914F6CDD1DULL;
}

/* The node's source limits, taken by every request of every store, thread
 * and process before it is sent (lib/objstore/ratelimit_shm.c; its locks are leaves). */
static struct ratelimit_shm s3_rl = RATELIMIT_SHM_INITIALIZER;

/* 429, SlowDown, or a 503 naming when to come back (or to a HEAD, which
 * has no body to name SlowDown): the store is shedding load, not failing. */
static bool s3req_throttling(const struct s3req *rq)
{
	return rq->status == 429 || !strcmp(rq->s3code, "SlowDown") ||
	       (rq->status == 503 &&
		(rq->retry_after_ms || rq->flags & REQ_HEAD));
}

/* The bytes a request is charged for when it starts. */
static uint64_t s3req_bytes(const struct s3req *rq)
{
	return rq->flags & REQ_RANGE ? rq->len : rq->body_len;
}

/* ---- connection contexts ---- */

void s3req_conn_free(struct s3conn *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nfree; i++)
		curl_easy_cleanup(c->easy[i]);
	if (c->multi)
		curl_multi_cleanup(c->multi);
	free(c->easy);
	free(c);
}

static struct s3conn *s3req_conn_get(struct s3store *st)
{
	struct s3conn *c;

	pthread_mutex_lock(&st->pool_lock);
	c = st->pool_head;
	if (c)
		st->pool_head = c->next;
	pthread_mutex_unlock(&st->pool_lock);
	if (c)
		return c;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->cap = st->inflight;
	c->easy = calloc(c->cap, sizeof(*c->easy));
	c->multi = curl_multi_init();
	if (!c->easy || !c->multi)
		goto err;
	curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)c->cap);
	for (; c->nfree < c->cap; c->nfree++) {
		c->easy[c->nfree] = curl_easy_init();
		if (!c->easy[c->nfree])
			goto err;
	}
	return c;
err:
	s3req_conn_free(c);
	return NULL;
}

static void s3req_conn_put(struct s3store *st, struct s3conn *c)
{
	pthread_mutex_lock(&st->pool_lock);
	c->next = st->pool_head;
	st->pool_head = c;
	pthread_mutex_unlock(&st->pool_lock);
}

/* ---- one request's callbacks ---- */

static int s3req_grow(struct s3req *rq, const char *p, size_t n, size_t limit)
{
	if (rq->resp_len + n > limit)
		return -EFBIG;
	if (grow_array(&rq->resp, &rq->resp_cap, rq->resp_len + n + 1, 1, 4096))
		return -ENOMEM;
	memcpy(rq->resp + rq->resp_len, p, n);
	rq->resp_len += n;
	rq->resp[rq->resp_len] = '\0';
	return 0;
}

static size_t s3req_write_cb(char *p, size_t size, size_t nmemb, void *arg)
{
	struct s3req *rq = arg;
	size_t n = size * nmemb;

	if (rq->status / 100 == 2 && rq->dst) {
		if (rq->got + n > rq->dst_cap) {
			rq->overflow = true;
			return 0;
		}
		memcpy((char *)rq->dst + rq->got, p, n);
		if (rq->on_data)
			rq->on_data(rq->on_data_arg, rq->got,
				    (char *)rq->dst + rq->got, n);
		rq->got += n;
		return n;
	}
	if (rq->status / 100 == 2 &&
	    !(rq->flags & (REQ_COLLECT | REQ_RESULT_XML)))
		return n; /* a body nobody asked for */
	if (s3req_grow(rq, p, n,
		       rq->status / 100 == 2 ? S3_MAX_XML : S3_MAX_ERRBODY)) {
		rq->overflow = true;
		return 0;
	}
	return n;
}

static void s3req_trim(const char **v, size_t *n)
{
	while (*n && isspace((unsigned char)**v)) {
		(*v)++;
		(*n)--;
	}
	while (*n && isspace((unsigned char)(*v)[*n - 1]))
		(*n)--;
}

static size_t s3req_header_cb(char *p, size_t size, size_t nmemb, void *arg)
{
	struct s3req *rq = arg;
	size_t n = size * nmemb;
	const char *colon = memchr(p, ':', n);
	const char *v;
	size_t nlen, vlen;
	char tmp[256];

	if (n > 5 && !memcmp(p, "HTTP/", 5)) {
		/* A new response (after a 100 Continue, say): start over. */
		const char *sp = memchr(p, ' ', n);

		rq->status = sp ? strtol(sp + 1, NULL, 10) : 0;
		rq->etag[0] = rq->meta_sha256_got[0] = '\0';
		rq->have_cl = rq->have_cr = false;
		rq->retry_after_ms = 0;
		if (rq->on_header)
			rq->on_header(rq->on_header_arg, NULL, 0, NULL, 0);
		return n;
	}
	if (!colon)
		return n;
	nlen = (size_t)(colon - p);
	v = colon + 1;
	vlen = n - nlen - 1;
	s3req_trim(&v, &vlen);
	if (rq->on_header)
		rq->on_header(rq->on_header_arg, p, nlen, v, vlen);
	if (vlen >= sizeof(tmp))
		return n;
	memcpy(tmp, v, vlen);
	tmp[vlen] = '\0';
	if (nlen == 4 && !strncasecmp(p, "etag", 4)) {
		if (vlen < sizeof(rq->etag))
			memcpy(rq->etag, tmp, vlen + 1);
	} else if (nlen == 17 && !strncasecmp(p, "x-amz-meta-sha256", 17)) {
		if (vlen == 64 && strspn(tmp, "0123456789abcdef") == 64)
			memcpy(rq->meta_sha256_got, tmp, 65);
	} else if (nlen == 14 && !strncasecmp(p, "content-length", 14)) {
		char *end;

		rq->content_length = strtoull(tmp, &end, 10);
		rq->have_cl = end != tmp && !*end;
	} else if (nlen == 11 && !strncasecmp(p, "retry-after", 11)) {
		rq->retry_after_ms =
			ratelimit_retry_after_ms(tmp, (int64_t)time(NULL));
	} else if (nlen == 13 && !strncasecmp(p, "last-modified", 13)) {
		time_t t = curl_getdate(tmp, NULL);

		rq->last_modified = t > 0 ? t : 0;
	} else if (nlen == 13 && !strncasecmp(p, "content-range", 13)) {
		unsigned long long a, b, t;

		if (sscanf(tmp, "bytes %llu-%llu/%llu", &a, &b, &t) == 3 &&
		    a <= b) {
			rq->cr_start = a;
			rq->cr_end = b;
			rq->cr_total = t;
			rq->have_cr = true;
		}
	}
	return n;
}

static size_t s3req_read_cb(char *p, size_t size, size_t nmemb, void *arg)
{
	struct s3req *rq = arg;
	uint64_t left = rq->body_len - rq->body_pos;
	size_t n = size * nmemb;

	if (n > left)
		n = (size_t)left;
	if (!n)
		return 0;
	if (rq->body) {
		memcpy(p, (const char *)rq->body + rq->body_pos, n);
	} else {
		ssize_t r;

		do {
			r = pread(rq->body_fd, p, n,
				  (off_t)(rq->body_off + rq->body_pos));
		} while (r < 0 && errno == EINTR);
		if (r <= 0)
			return CURL_READFUNC_ABORT;
		n = (size_t)r;
	}
	rq->body_pos += n;
	return n;
}

static int s3req_seek_cb(void *arg, curl_off_t offset, int origin)
{
	struct s3req *rq = arg;

	if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > rq->body_len)
		return CURL_SEEKFUNC_FAIL;
	rq->body_pos = (uint64_t)offset;
	return CURL_SEEKFUNC_OK;
}

/* ---- building and signing ---- */

char *s3req_strdupf(const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	return s;
}

/* "/bucket/enc(key)" or "/enc(key)"; "/bucket" or "/" for the bucket. */
static char *s3req_canonical_uri(struct s3store *st, const char *key)
{
	char *enc, *uri;

	if (!key)
		return s3req_strdupf("%s",
				     st->uri_base[0] ? st->uri_base : "/");
	enc = sigv4_uri_encode(key, true);
	if (!enc)
		return NULL;
	uri = s3req_strdupf("%s/%s", st->uri_base, enc);
	free(enc);
	return uri;
}

static int s3req_add_header(struct curl_slist **l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int s3req_add_header(struct curl_slist **l, const char *fmt, ...)
{
	struct curl_slist *n;
	char buf[2048];
	va_list ap;
	int len;

	va_start(ap, fmt);
	len = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (len < 0 || (size_t)len >= sizeof(buf))
		return -EINVAL;
	n = curl_slist_append(*l, buf);
	if (!n)
		return -ENOMEM;
	*l = n;
	return 0;
}

/* Describe the request for messages: "GET http://host/bucket/key". Never
 * holds credentials: requests are signed in headers, not in the URL. */
static void s3req_describe(struct s3store *st, const struct s3req *rq,
			   char *buf, size_t len)
{
	snprintf(buf, len, "%s %s%s%s%s%s%s", rq->method, st->scheme_host,
		 st->uri_base, rq->key ? "/" : "", rq->key ? rq->key : "",
		 rq->query[0] ? "?" : "", rq->query);
}

/* Whether rq->xhdrs has a header name (lower-case). */
static bool s3req_xhdrs_have(const struct s3req *rq, const char *name)
{
	size_t n = strlen(name);

	for (size_t i = 0; i < rq->nxhdrs && i < S3REQ_XHDR_MAX; i++)
		if (!strncmp(rq->xhdrs[i], name, n) && rq->xhdrs[i][n] == ':')
			return true;
	return false;
}

#define S3REQ_HDR_MAX 10 /* the most headers s3req_signed_headers adds */
#define S3REQ_HDR_LEN 1200 /* the longest of them, "name:value" */

/* Clear what the last attempt of rq left: status, counts, the response's
 * headers and the request's header list. */
static void s3req_reset(struct s3req *rq)
{
	rq->status = 0;
	rq->got = 0;
	rq->resp_len = 0;
	rq->overflow = false;
	rq->body_pos = 0;
	rq->etag[0] = rq->meta_sha256_got[0] = '\0';
	rq->have_cl = rq->have_cr = false;
	rq->last_modified = 0;
	rq->errbuf[0] = '\0';
	rq->s3code[0] = '\0';
	rq->retry_after_ms = 0;
	curl_slist_free_all(rq->hdrs);
	rq->hdrs = NULL;
}

/* The headers rq signs, "name:value" in hbuf, pointed to from hv (room for
 * S3REQ_HDR_MAX of ours and S3REQ_XHDR_MAX of rq's). Returns how many. */
static size_t s3req_signed_headers(const struct s3store *st,
				   const struct s3req *rq, const char *amz_date,
				   const char **hv, char (*hbuf)[S3REQ_HDR_LEN])
{
	size_t nh = 0;

#define HDR(...)                                                \
	do {                                                    \
		snprintf(hbuf[nh], S3REQ_HDR_LEN, __VA_ARGS__); \
		hv[nh] = hbuf[nh];                              \
		nh++;                                           \
	} while (0)
	HDR("host:%s", st->host);
	HDR("x-amz-content-sha256:%s", rq->payload_hash);
	HDR("x-amz-date:%s", amz_date);
	if (rq->flags & REQ_RANGE)
		HDR("range:bytes=%" PRIu64 "-%" PRIu64, rq->off,
		    rq->off + rq->len - 1);
	if (rq->if_match)
		HDR("if-match:%s", rq->if_match);
	if (rq->copy_source)
		HDR("x-amz-copy-source:%s", rq->copy_source);
	if (st->creds.session_token && !st->anonymous)
		HDR("x-amz-security-token:%s", st->creds.session_token);
	/* a new object's class: on PUT and copy, and on the start of a
	 * multipart upload (not on its parts) */
	if (st->base.storage_class &&
	    ((!strcmp(rq->method, "PUT") && !strstr(rq->query, "uploadId")) ||
	     (!strcmp(rq->method, "POST") && !strcmp(rq->query, "uploads="))))
		HDR("x-amz-storage-class:%s", st->base.storage_class);
	if (rq->content_md5[0])
		HDR("content-md5:%s", rq->content_md5);
	if (rq->meta_sha256)
		HDR("x-amz-meta-sha256:%s", rq->meta_sha256);
#undef HDR
	for (size_t i = 0; i < rq->nxhdrs && i < S3REQ_XHDR_MAX; i++)
		hv[nh++] = rq->xhdrs[i];
	return nh;
}

/* rq's header list: the signed headers, the SigV4 Authorization (unless
 * anonymous), no Expect and, on POST, a Content-Type. Returns 0 or
 * -errno. */
static int s3req_headers(struct s3store *st, struct s3req *rq, const char *uri)
{
	const struct dstage_config *cfg = st->base.cfg;
	char amz_date[17], auth[1024];
	const char *hv[S3REQ_HDR_MAX + S3REQ_XHDR_MAX];
	char hbuf[S3REQ_HDR_MAX][S3REQ_HDR_LEN];
	size_t nh;
	int ret;

	sigv4_amz_date(time(NULL), amz_date);
	nh = s3req_signed_headers(st, rq, amz_date, hv, hbuf);
	for (size_t i = 0; i < nh; i++) {
		ret = s3req_add_header(&rq->hdrs, "%s", hv[i]);
		if (ret)
			return ret;
		/* curl wants "Name: value"; the signer took "name:value". */
	}
	if (!st->anonymous) {
		struct sigv4_request sr = {
			.method = rq->method,
			.canonical_uri = uri,
			.canonical_query = rq->query,
			.headers = hv,
			.nheaders = nh,
			.payload_hash = rq->payload_hash,
			.amz_date = amz_date,
			.region = cfg->s3_region,
			.service = "s3",
		};
		ret = sigv4_authorization(&sr, st->creds.access_key,
					  st->creds.secret_key, auth,
					  sizeof(auth));
		if (ret)
			return ret;
		ret = s3req_add_header(&rq->hdrs, "Authorization: %s", auth);
		if (ret)
			return ret;
	}
	/* No 100-continue round trip; no form content type on POST. The
	 * start of a multipart upload has no body: its Content-Type is the
	 * object's, the one a single PUT gets (S3's default), unless xhdrs
	 * names it (a copy in parts; sent once, as signed). */
	ret = s3req_add_header(&rq->hdrs, "Expect:");
	if (!ret && !strcmp(rq->method, "POST") &&
	    !s3req_xhdrs_have(rq, "content-type"))
		ret = s3req_add_header(
			&rq->hdrs,
			strcmp(rq->query, "uploads=")
				? "Content-Type: application/xml"
				: "Content-Type: binary/octet-stream");
	return ret;
}

/* Set the easy handle e up for rq at url: callbacks, timeouts, TLS and the
 * method with its body. */
static void s3req_curl_opts(const struct s3store *st, struct s3req *rq, CURL *e,
			    const char *url)
{
	const struct dstage_config *cfg = st->base.cfg;
	uint64_t now = timeutil_mono_ms(), left;

	curl_easy_reset(e);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, rq->hdrs);
	curl_easy_setopt(e, CURLOPT_PRIVATE, rq);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, s3req_write_cb);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, rq);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, s3req_header_cb);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, rq);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, rq->errbuf);
	curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 256L * 1024);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
			 (long)cfg->s3_connect_timeout_ms);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME,
			 (long)(cfg->s3_low_speed_time_ms + 999) / 1000);
	left = rq->deadline_ms > now ? rq->deadline_ms - now : 1;
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)left);
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER,
			 cfg->s3_verify_tls ? 1L : 0L);
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST,
			 cfg->s3_verify_tls ? 2L : 0L);
	if (st->ca_file)
		curl_easy_setopt(e, CURLOPT_CAINFO, st->ca_file);
	if (rq->flags & REQ_HEAD) {
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
	} else if (!strcmp(rq->method, "PUT")) {
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE,
				 (curl_off_t)rq->body_len);
	} else if (!strcmp(rq->method, "POST")) {
		curl_easy_setopt(e, CURLOPT_POST, 1L);
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
				 (curl_off_t)rq->body_len);
	} else if (strcmp(rq->method, "GET")) {
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, rq->method);
	}
	if (!strcmp(rq->method, "PUT") || !strcmp(rq->method, "POST")) {
		curl_easy_setopt(e, CURLOPT_READFUNCTION, s3req_read_cb);
		curl_easy_setopt(e, CURLOPT_READDATA, rq);
		curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, s3req_seek_cb);
		curl_easy_setopt(e, CURLOPT_SEEKDATA, rq);
	}
}

/* Prepare rq's next attempt on e: reset it, build its URL and its signed
 * headers, set the handle up. Returns 0 or -errno. */
static int s3req_setup(struct s3store *st, struct s3req *rq, CURL *e)
{
	char *uri = NULL, *url = NULL;
	int ret = -ENOMEM;

	s3req_reset(rq);
	uri = s3req_canonical_uri(st, rq->key);
	if (!uri)
		goto out;
	url = s3req_strdupf("%s%s%s%s", st->scheme_host, uri,
			    rq->query[0] ? "?" : "", rq->query);
	if (!url)
		goto out;
	ret = s3req_headers(st, rq, uri);
	if (ret)
		goto out;
	s3req_curl_opts(st, rq, e, url);
out:
	free(uri);
	free(url);
	return ret;
}

/* ---- finishing: what an answer means ---- */

/* Map a final HTTP status to -errno. */
static int s3req_status_errno(long status, const char *code)
{
	switch (status) {
	case 404:
		return -ENOENT;
	case 401:
	case 403:
		return -EACCES;
	case 412:
		return -ESTALE;
	case 416:
		return -ERANGE;
	case 409:
		return -EBUSY;
	case 400:
		if (!strcmp(code, "EntityTooLarge"))
			return -EFBIG;
		if (!strcmp(code, "BadDigest") ||
		    !strcmp(code, "XAmzContentSHA256Mismatch"))
			return -EIO;
		return -EINVAL;
	case 408:
		return -ETIMEDOUT;
	default:
		return -EIO;
	}
}

static bool s3req_code_retriable(const char *code)
{
	static const char *const codes[] = {
		"InternalError",
		"SlowDown",
		"ServiceUnavailable",
		"RequestTimeout",
		"RequestTimeTooSkewed",
		"Throttling",
		"ThrottlingException",
		"OperationAborted",
		/* The body arrived damaged (Content-MD5, signed payload
		 * hash): send it again. */
		"BadDigest",
		"XAmzContentSHA256Mismatch",
	};

	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		if (!strcmp(code, codes[i]))
			return true;
	return false;
}

/*
 * Judge one finished attempt. Returns 0 (done, success), -errno with
 * *retry set when another attempt may help, or a final -errno. why gets a
 * short description for the log.
 */
static int s3req_judge(struct s3store *st, struct s3req *rq, CURLcode cc,
		       bool *retry, char *why, size_t whylen)
{
	struct s3xml_error xe;

	*retry = false;
	if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && rq->overflow)) {
		snprintf(why, whylen, "%s",
			 rq->errbuf[0] ? rq->errbuf : curl_easy_strerror(cc));
		switch (cc) {
		case CURLE_OPERATION_TIMEDOUT:
			*retry = true;
			return -ETIMEDOUT;
		case CURLE_SSL_CONNECT_ERROR:
		case CURLE_PEER_FAILED_VERIFICATION:
		case CURLE_SSL_CACERT_BADFILE:
		case CURLE_SSL_CERTPROBLEM:
		case CURLE_UNSUPPORTED_PROTOCOL:
		case CURLE_URL_MALFORMAT:
			return -EIO;
		case CURLE_OUT_OF_MEMORY:
			return -ENOMEM;
		case CURLE_ABORTED_BY_CALLBACK:
		case CURLE_READ_ERROR:
			return -EIO;
		default:
			*retry = true;
			return -EIO;
		}
	}
	if (rq->overflow) {
		snprintf(why, whylen, "HTTP %ld: body larger than %s",
			 rq->status,
			 rq->dst ? "the requested range" : "allowed");
		*retry = rq->status / 100 == 2;
		return -EIO;
	}
	if (rq->status / 100 == 2) {
		if (rq->dst) {
			/* A ranged GET: exactly the bytes asked for, or up to
			 * the object's end. */
			uint64_t want = rq->len;

			if (rq->status == 200 && rq->off > 0) {
				snprintf(why, whylen,
					 "HTTP 200 to a ranged GET at offset "
					 "%" PRIu64 ": Range ignored",
					 rq->off);
				return -EIO;
			}
			if (rq->have_cr) {
				if (rq->cr_start != rq->off) {
					snprintf(why, whylen,
						 "Content-Range starts at "
						 "%" PRIu64 ", asked %" PRIu64,
						 rq->cr_start, rq->off);
					*retry = true;
					return -EIO;
				}
				want = rq->cr_end - rq->cr_start + 1;
			} else if (rq->have_cl) {
				want = rq->content_length;
			}
			if (want > rq->len || rq->got != want) {
				snprintf(why, whylen,
					 "short body: %zu of %" PRIu64 " bytes",
					 rq->got, want);
				*retry = true;
				return -EIO;
			}
		}
		if (rq->flags & REQ_RESULT_XML &&
		    !s3xml_parse_error(rq->resp ? rq->resp : "", rq->resp_len,
				       &xe)) {
			snprintf(rq->s3code, sizeof(rq->s3code), "%s", xe.code);
			snprintf(why, whylen, "HTTP 200 with error %s%s%s",
				 xe.code, xe.message[0] ? ": " : "",
				 xe.message);
			*retry = s3req_code_retriable(xe.code);
			return -EIO;
		}
		return 0;
	}
	/* An error answer: its XML names the code (HEAD has no body). */
	xe.code[0] = xe.message[0] = '\0';
	if (rq->resp_len)
		s3xml_parse_error(rq->resp, rq->resp_len, &xe);
	snprintf(rq->s3code, sizeof(rq->s3code), "%s", xe.code);
	snprintf(why, whylen, "HTTP %ld%s%s%s%s", rq->status,
		 xe.code[0] ? " " : "", xe.code, xe.message[0] ? ": " : "",
		 xe.message);
	if (rq->status >= 500 || rq->status == 429 || rq->status == 408 ||
	    s3req_code_retriable(xe.code)) {
		*retry = true;
		return rq->status == 408 ? -ETIMEDOUT : -EIO;
	}
	if (rq->status == 416 && rq->dst && rq->off == 0) {
		/* Range 0-N of an empty object. */
		rq->got = 0;
		return 0;
	}
	(void)st;
	return s3req_status_errno(rq->status, xe.code);
}

/* The fix to suggest with a request's final error, or "". */
static const char *s3req_hint(const struct s3req *rq, CURLcode cc)
{
	if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && rq->overflow))
		return ": the store did not answer; is it up, and is "
		       "s3.endpoint (or AWS_ENDPOINT_URL) where it listens?";
	if (!strcmp(rq->s3code, "SignatureDoesNotMatch") ||
	    !strcmp(rq->s3code, "InvalidAccessKeyId"))
		return ": the store refused the credentials; check the access "
		       "key and secret (AWS_ACCESS_KEY_ID, "
		       "AWS_SECRET_ACCESS_KEY, s3.credentials_file, "
		       "s3.profile)";
	if (rq->status == 403)
		return ": access denied; check the credentials' rights on "
		       "the bucket";
	if (!strcmp(rq->s3code, "NoSuchBucket"))
		return ": no such bucket at s3.endpoint; check the URL's "
		       "bucket and s3.endpoint";
	return "";
}

static void s3req_finish(struct s3store *st, struct s3req *rq, CURLcode cc)
{
	const struct dstage_config *cfg = st->base.cfg;
	char why[512], what[1536];
	bool retry;
	int ret;

	ret = s3req_judge(st, rq, cc, &retry, why, sizeof(why));
	if (!ret) {
		rq->state = REQ_DONE;
		rq->result = 0;
		objstore_count(&st->base.n_bytes_in,
			       rq->dst ? rq->got : rq->resp_len);
		objstore_count(&st->base.n_bytes_out, rq->body_len);
		return;
	}
	s3req_describe(st, rq, what, sizeof(what));
	if (s3req_throttling(rq))
		ratelimit_shm_throttled(&s3_rl, timeutil_mono_ms(),
					rq->retry_after_ms);
	if (retry && rq->attempt < cfg->s3_max_attempts) {
		uint64_t ceil = cfg->s3_backoff_base_ms;
		uint64_t now = timeutil_mono_ms(), delay;

		for (unsigned i = 1;
		     i < rq->attempt && ceil < cfg->s3_backoff_max_ms; i++)
			ceil *= 2;
		if (ceil > cfg->s3_backoff_max_ms)
			ceil = cfg->s3_backoff_max_ms;
		delay = s3req_rand() % (ceil + 1); /* full jitter */
		/* never before the time the store asked for (capped) */
		if (delay < rq->retry_after_ms)
			delay = rq->retry_after_ms;
		if (now + delay < rq->deadline_ms) {
			log_warn("s3: %s: %s; retry %u of %u in %" PRIu64 " ms",
				 what, why, rq->attempt,
				 cfg->s3_max_attempts - 1, delay);
			objstore_count(&st->base.n_retries, 1);
			rq->state = REQ_QUEUED;
			rq->not_before_ms = now + delay;
			return;
		}
		ret = -ETIMEDOUT;
		snprintf(why + strlen(why), sizeof(why) - strlen(why),
			 "; deadline of %u ms reached", cfg->s3_deadline_ms);
	}
	rq->state = REQ_DONE;
	rq->result = ret;
	if ((ret == -ENOENT && rq->flags & REQ_QUIET_404) ||
	    (ret == -ESTALE && rq->flags & REQ_QUIET_412))
		log_debug("s3: %s: %s", what, why);
	else if (rq->flags & REQ_HEAD && !rq->s3code[0] &&
		 (rq->status == 400 || rq->status == 403))
		log_debug("s3: %s: %s (no body to name the error: probing "
			  "with GET)",
			  what, why);
	else
		log_error("s3: %s: %s (attempt %u of %u)%s", what, why,
			  rq->attempt, cfg->s3_max_attempts,
			  s3req_hint(rq, cc));
}

/* ---- the engine ---- */

int s3req_run(struct s3store *st, struct s3req *reqs, size_t n)
{
	struct s3req *one[1], **ptrs = n == 1 ? one : calloc(n, sizeof(*ptrs));
	int ret;

	if (!ptrs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		ptrs[i] = &reqs[i];
	ret = s3req_run_some(st, ptrs, n, st->inflight);
	if (ptrs != one)
		free(ptrs);
	return ret;
}

/* Run n requests with at most limit in flight, on one connection context. */
int s3req_run_some(struct s3store *st, struct s3req **reqs, size_t n,
		   unsigned limit)
{
	struct s3conn *c = s3req_conn_get(st);
	size_t done = 0, active = 0;
	uint64_t start = timeutil_mono_ms();
	int ret = 0;

	if (!c)
		return -ENOMEM;
	ratelimit_shm_configure(&s3_rl, st->base.cfg->cache_dir,
				st->base.cfg->s3_max_requests_per_second,
				st->base.cfg->s3_max_bytes_per_second);
	for (size_t i = 0; i < n; i++) {
		reqs[i]->state = REQ_QUEUED;
		reqs[i]->attempt = 0;
		reqs[i]->not_before_ms = 0;
		reqs[i]->deadline_ms = start + st->base.cfg->s3_deadline_ms;
		reqs[i]->result = 0;
	}
	while (done < n) {
		uint64_t now = timeutil_mono_ms(), wake = UINT64_MAX, lwait;
		CURLMsg *msg;
		int running, left;

		for (size_t i = 0; i < n && c->nfree && active < limit; i++) {
			struct s3req *rq = reqs[i];

			if (rq->state != REQ_QUEUED)
				continue;
			if (rq->not_before_ms > now) {
				if (rq->not_before_ms < wake)
					wake = rq->not_before_ms;
				continue;
			}
			lwait = ratelimit_shm_acquire(&s3_rl, now,
						      s3req_bytes(rq));
			if (lwait && now + lwait >= rq->deadline_ms) {
				log_error("s3: %s %s: held past s3.deadline "
					  "(%u ms) by "
					  "the rate limits or a Retry-After: "
					  "raise "
					  "s3.max_requests_per_second, "
					  "s3.max_bytes_per_second or "
					  "s3.deadline",
					  rq->method, rq->key ? rq->key : "",
					  st->base.cfg->s3_deadline_ms);
				rq->state = REQ_DONE;
				rq->result = -ETIMEDOUT;
				done++;
				continue;
			}
			if (lwait) {
				/* in order: later requests wait too */
				if (now + lwait < wake)
					wake = now + lwait;
				break;
			}
			rq->easy = c->easy[--c->nfree];
			rq->attempt++;
			objstore_count(&st->base.n_requests, 1);
			ret = s3req_setup(st, rq, rq->easy);
			if (!ret && curl_multi_add_handle(c->multi, rq->easy))
				ret = -ENOMEM;
			if (ret) {
				c->easy[c->nfree++] = rq->easy;
				rq->easy = NULL;
				rq->state = REQ_DONE;
				rq->result = ret;
				done++;
				continue;
			}
			rq->state = REQ_ACTIVE;
			active++;
		}
		if (!active) {
			if (done < n && wake != UINT64_MAX && wake > now)
				usleep((useconds_t)((wake - now) * 1000));
			continue;
		}
		curl_multi_perform(c->multi, &running);
		while ((msg = curl_multi_info_read(c->multi, &left))) {
			struct s3req *rq = NULL;

			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE,
					  (char **)&rq);
			curl_multi_remove_handle(c->multi, msg->easy_handle);
			c->easy[c->nfree++] = msg->easy_handle;
			rq->easy = NULL;
			active--;
			/* metrics: an attempt's answer (or its lack) */
			metrics_source_request(
				rq->method,
				rq->status ? (int)rq->status
				: msg->data.result == CURLE_OPERATION_TIMEDOUT
					? -ETIMEDOUT
					: -EIO);
			s3req_finish(st, rq, msg->data.result);
			if (rq->state == REQ_DONE)
				done++;
		}
		if (done < n && active) {
			int timeout = 100;

			now = timeutil_mono_ms();
			if (wake != UINT64_MAX && c->nfree)
				timeout = wake > now ? (int)(wake - now) : 0;
			if (timeout > 100)
				timeout = 100;
			curl_multi_poll(c->multi, NULL, 0, timeout, NULL);
		}
	}
	s3req_conn_put(st, c);
	for (size_t i = 0; i < n; i++)
		if (reqs[i]->result)
			return reqs[i]->result;
	return 0;
}

void s3req_release(struct s3req *rq)
{
	if (!rq)
		return;
	free(rq->key);
	free(rq->query);
	free(rq->copy_source);
	free(rq->resp);
	curl_slist_free_all(rq->hdrs);
	memset(rq, 0, sizeof(*rq));
	rq->body_fd = -1;
}

/* Initialise a request for key (relative to the store prefix; NULL for the
 * bucket) with query pairs kv[0..2*nkv). */
int s3req_init(struct s3store *st, struct s3req *rq, const char *method,
	       const char *key, const char *const *kv, size_t nkv)
{
	static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41"
					"e4649b934ca495991b7852b855";

	memset(rq, 0, sizeof(*rq));
	rq->body_fd = -1;
	rq->method = method;
	memcpy(rq->payload_hash, empty_sha, sizeof(empty_sha));
	if (key) {
		rq->key = s3req_strdupf("%s%s", st->prefix, key);
		if (!rq->key)
			goto err;
	}
	rq->query = sigv4_query_canonical(kv, nkv);
	if (!rq->query)
		goto err;
	return 0;
err:
	s3req_release(rq);
	return -ENOMEM;
}
