// SPDX-License-Identifier: MIT
/*
 * s3store: the s3://bucket/prefix/ backend on libcurl, signed with our own
 * Signature V4 signer (lib/sigv4.c).
 *
 * Every operation is a batch of requests (struct s3req) run by s3_run() on a
 * curl multi handle, at most s3.max_inflight at once. A single GET is a batch
 * of one; get_many and multipart parts are larger batches. Each request moves
 * through:
 *
 *   QUEUED --start--> ACTIVE --finish--> DONE (result 0 or -errno)
 *      ^                          |
 *      +----- retriable, ---------+
 *             after backoff (full jitter), while attempts and deadline last
 *
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
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "creds.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "objstore_backend.h"
#include "s3xml.h"
#include "sigv4.h"
#include "strutil.h"

#define S3_MAX_XML (64u << 20) /* largest XML answer we accept */
#define S3_MAX_ERRBODY (64u << 10) /* largest error body kept */
#define S3_MAX_PARTS 10000
#define S3_MAX_COPY (5ULL << 30) /* single-request copy limit */

struct s3conn {
	CURLM *multi;
	CURL **easy; /* cap handles, easy[0..nfree) are free */
	size_t nfree, cap;
	struct s3conn *next; /* in the pool */
};

struct s3store {
	struct objstore base;
	char *bucket;
	char *prefix; /* "" or ends with '/' */
	char *scheme_host; /* "http://127.0.0.1:7480" or vhost form */
	char *host; /* Host header value */
	char *uri_base; /* "/bucket" (path style) or "" */
	char *ca_file; /* NULL: the system store */
	struct creds creds;
	bool anonymous;
	unsigned inflight;

	pthread_mutex_t pool_lock; /* leaf lock */
	struct s3conn *pool_head; /* pool_lock */
};

enum s3req_state { REQ_QUEUED, REQ_ACTIVE, REQ_DONE };

enum s3req_flags {
	REQ_HEAD = 1 << 0, /* no body expected */
	REQ_COLLECT = 1 << 1, /* collect the 2xx body into resp */
	REQ_RESULT_XML = 1 << 2, /* a 2xx body may be <Error> */
	REQ_RANGE = 1 << 3, /* send Range: bytes=off-(off+len-1) */
	REQ_QUIET_404 = 1 << 4, /* a 404 is an answer, not an error */
};

struct s3req {
	/* What to send; set up before s3_run(). */
	const char *method;
	char *key; /* full key (store prefix included) or NULL */
	char *query; /* canonical query, "" when none */
	unsigned flags;
	uint64_t off; /* REQ_RANGE */
	uint64_t len;
	const char *if_match;
	char *copy_source; /* x-amz-copy-source, encoded */
	const void *body; /* upload from memory, or */
	int body_fd; /* from this fd (pread), -1 for none */
	uint64_t body_off, body_len;
	char payload_hash[65];
	void *dst; /* 2xx body goes here (dst_cap bytes), or */
	size_t dst_cap;
	/* called on each piece stored in dst (objstore_get's on_data) */
	void (*on_data)(void *arg, size_t at, const void *p, size_t n);
	void *on_data_arg;

	/* One attempt's answer. */
	long status;
	size_t got; /* bytes into dst */
	char *resp; /* collected body (2xx when COLLECT, or error) */
	size_t resp_len, resp_cap;
	bool overflow;
	uint64_t body_pos;
	char etag[OBJSTORE_ETAG_MAX];
	uint64_t content_length;
	bool have_cl;
	int64_t last_modified;
	bool have_cr; /* Content-Range seen */
	uint64_t cr_start, cr_end, cr_total;
	char errbuf[CURL_ERROR_SIZE];
	struct curl_slist *hdrs;
	CURL *easy;

	/* Scheduling. */
	enum s3req_state state;
	unsigned attempt;
	uint64_t not_before_ms, deadline_ms;
	int result;
	char s3code[64];
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* xorshift64*, per thread, seeded from getrandom: jitter only. */
static uint64_t s3_rand(void)
{
	static __thread uint64_t x;

	if (!x) {
		if (getrandom(&x, sizeof(x), 0) != sizeof(x) || !x)
			x = (uint64_t)now_ms() * 0x9E3779B97F4A7C15ULL | 1;
	}
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	return x * 0x2545F4914F6CDD1DULL;
}

static struct s3store *s3_of(struct objstore *os)
{
	return (struct s3store *)os;
}

/* ---- connection contexts ---- */

static void s3conn_free(struct s3conn *c)
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

static struct s3conn *s3conn_get(struct s3store *st)
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
	s3conn_free(c);
	return NULL;
}

static void s3conn_put(struct s3store *st, struct s3conn *c)
{
	pthread_mutex_lock(&st->pool_lock);
	c->next = st->pool_head;
	st->pool_head = c;
	pthread_mutex_unlock(&st->pool_lock);
}

/* ---- one request's callbacks ---- */

static int s3_grow(struct s3req *rq, const char *p, size_t n, size_t limit)
{
	if (rq->resp_len + n > limit)
		return -EFBIG;
	if (rq->resp_len + n + 1 > rq->resp_cap) {
		size_t cap = rq->resp_cap ? rq->resp_cap : 4096;
		char *r;

		while (cap < rq->resp_len + n + 1)
			cap *= 2;
		r = realloc(rq->resp, cap);
		if (!r)
			return -ENOMEM;
		rq->resp = r;
		rq->resp_cap = cap;
	}
	memcpy(rq->resp + rq->resp_len, p, n);
	rq->resp_len += n;
	rq->resp[rq->resp_len] = '\0';
	return 0;
}

static size_t s3_write_cb(char *p, size_t size, size_t nmemb, void *arg)
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
	if (s3_grow(rq, p, n,
		    rq->status / 100 == 2 ? S3_MAX_XML : S3_MAX_ERRBODY)) {
		rq->overflow = true;
		return 0;
	}
	return n;
}

static void s3_trim(const char **v, size_t *n)
{
	while (*n && isspace((unsigned char)**v)) {
		(*v)++;
		(*n)--;
	}
	while (*n && isspace((unsigned char)(*v)[*n - 1]))
		(*n)--;
}

static size_t s3_header_cb(char *p, size_t size, size_t nmemb, void *arg)
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
		rq->etag[0] = '\0';
		rq->have_cl = rq->have_cr = false;
		return n;
	}
	if (!colon)
		return n;
	nlen = (size_t)(colon - p);
	v = colon + 1;
	vlen = n - nlen - 1;
	s3_trim(&v, &vlen);
	if (vlen >= sizeof(tmp))
		return n;
	memcpy(tmp, v, vlen);
	tmp[vlen] = '\0';
	if (nlen == 4 && !strncasecmp(p, "etag", 4)) {
		if (vlen < sizeof(rq->etag))
			memcpy(rq->etag, tmp, vlen + 1);
	} else if (nlen == 14 && !strncasecmp(p, "content-length", 14)) {
		char *end;

		rq->content_length = strtoull(tmp, &end, 10);
		rq->have_cl = end != tmp && !*end;
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

static size_t s3_read_cb(char *p, size_t size, size_t nmemb, void *arg)
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

static int s3_seek_cb(void *arg, curl_off_t offset, int origin)
{
	struct s3req *rq = arg;

	if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > rq->body_len)
		return CURL_SEEKFUNC_FAIL;
	rq->body_pos = (uint64_t)offset;
	return CURL_SEEKFUNC_OK;
}

/* ---- building and signing ---- */

static char *s3_strdupf(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));

static char *s3_strdupf(const char *fmt, ...)
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
static char *s3_canonical_uri(struct s3store *st, const char *key)
{
	char *enc, *uri;

	if (!key)
		return s3_strdupf("%s", st->uri_base[0] ? st->uri_base : "/");
	enc = sigv4_uri_encode(key, true);
	if (!enc)
		return NULL;
	uri = s3_strdupf("%s/%s", st->uri_base, enc);
	free(enc);
	return uri;
}

static int s3_add_header(struct curl_slist **l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int s3_add_header(struct curl_slist **l, const char *fmt, ...)
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
static void s3_describe(struct s3store *st, const struct s3req *rq, char *buf,
			size_t len)
{
	snprintf(buf, len, "%s %s%s%s%s%s%s", rq->method, st->scheme_host,
		 st->uri_base, rq->key ? "/" : "", rq->key ? rq->key : "",
		 rq->query[0] ? "?" : "", rq->query);
}

static int s3_req_setup(struct s3store *st, struct s3req *rq, CURL *e)
{
	const struct dstage_config *cfg = st->base.cfg;
	char amz_date[17], auth[1024], *uri = NULL, *url = NULL;
	const char *hv[8];
	char hbuf[8][1200];
	size_t nh = 0;
	uint64_t now = now_ms(), left;
	int ret = -ENOMEM;

	rq->status = 0;
	rq->got = 0;
	rq->resp_len = 0;
	rq->overflow = false;
	rq->body_pos = 0;
	rq->etag[0] = '\0';
	rq->have_cl = rq->have_cr = false;
	rq->last_modified = 0;
	rq->errbuf[0] = '\0';
	rq->s3code[0] = '\0';
	curl_slist_free_all(rq->hdrs);
	rq->hdrs = NULL;

	uri = s3_canonical_uri(st, rq->key);
	if (!uri)
		goto out;
	url = s3_strdupf("%s%s%s%s", st->scheme_host, uri,
			 rq->query[0] ? "?" : "", rq->query);
	if (!url)
		goto out;
	sigv4_amz_date(time(NULL), amz_date);

#define HDR(...)                                                   \
	do {                                                       \
		snprintf(hbuf[nh], sizeof(hbuf[nh]), __VA_ARGS__); \
		hv[nh] = hbuf[nh];                                 \
		nh++;                                              \
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
#undef HDR
	for (size_t i = 0; i < nh; i++) {
		ret = s3_add_header(&rq->hdrs, "%s", hv[i]);
		if (ret)
			goto out;
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
			goto out;
		ret = s3_add_header(&rq->hdrs, "Authorization: %s", auth);
		if (ret)
			goto out;
	}
	/* No 100-continue round trip; no form content type on POST. */
	ret = s3_add_header(&rq->hdrs, "Expect:");
	if (!ret && !strcmp(rq->method, "POST"))
		ret = s3_add_header(&rq->hdrs, "Content-Type: application/xml");
	if (ret)
		goto out;

	curl_easy_reset(e);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, rq->hdrs);
	curl_easy_setopt(e, CURLOPT_PRIVATE, rq);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, s3_write_cb);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, rq);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, s3_header_cb);
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
		curl_easy_setopt(e, CURLOPT_READFUNCTION, s3_read_cb);
		curl_easy_setopt(e, CURLOPT_READDATA, rq);
		curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, s3_seek_cb);
		curl_easy_setopt(e, CURLOPT_SEEKDATA, rq);
	}
	ret = 0;
out:
	free(uri);
	free(url);
	return ret;
}

/* ---- finishing: what an answer means ---- */

/* Map a final HTTP status to -errno. */
static int s3_status_errno(long status, const char *code)
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
		return -EINVAL;
	case 408:
		return -ETIMEDOUT;
	default:
		return -EIO;
	}
}

static bool s3_code_retriable(const char *code)
{
	static const char *const codes[] = {
		"InternalError",	"SlowDown",
		"ServiceUnavailable",	"RequestTimeout",
		"RequestTimeTooSkewed", "Throttling",
		"ThrottlingException",	"OperationAborted",
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
static int s3_judge(struct s3store *st, struct s3req *rq, CURLcode cc,
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
			*retry = s3_code_retriable(xe.code);
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
	    s3_code_retriable(xe.code)) {
		*retry = true;
		return rq->status == 408 ? -ETIMEDOUT : -EIO;
	}
	if (rq->status == 416 && rq->dst && rq->off == 0) {
		/* Range 0-N of an empty object. */
		rq->got = 0;
		return 0;
	}
	(void)st;
	return s3_status_errno(rq->status, xe.code);
}

static void s3_finish(struct s3store *st, struct s3req *rq, CURLcode cc)
{
	const struct dstage_config *cfg = st->base.cfg;
	char why[512], what[1536];
	bool retry;
	int ret;

	ret = s3_judge(st, rq, cc, &retry, why, sizeof(why));
	if (!ret) {
		rq->state = REQ_DONE;
		rq->result = 0;
		objstore_count(&st->base.n_bytes_in,
			       rq->dst ? rq->got : rq->resp_len);
		objstore_count(&st->base.n_bytes_out, rq->body_len);
		return;
	}
	s3_describe(st, rq, what, sizeof(what));
	if (retry && rq->attempt < cfg->s3_max_attempts) {
		uint64_t ceil = cfg->s3_backoff_base_ms;
		uint64_t now = now_ms(), delay;

		for (unsigned i = 1;
		     i < rq->attempt && ceil < cfg->s3_backoff_max_ms; i++)
			ceil *= 2;
		if (ceil > cfg->s3_backoff_max_ms)
			ceil = cfg->s3_backoff_max_ms;
		delay = s3_rand() % (ceil + 1); /* full jitter */
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
	if (ret == -ENOENT && rq->flags & REQ_QUIET_404)
		log_debug("s3: %s: %s", what, why);
	else if (rq->flags & REQ_HEAD && !rq->s3code[0] &&
		 (rq->status == 400 || rq->status == 403))
		log_debug("s3: %s: %s (no body to name the error: probing "
			  "with GET)",
			  what, why);
	else
		log_error("s3: %s: %s (attempt %u of %u)", what, why,
			  rq->attempt, cfg->s3_max_attempts);
}

/* ---- the engine ---- */

static int s3_run_some(struct s3store *st, struct s3req **reqs, size_t n,
		       unsigned limit);

static int s3_run(struct s3store *st, struct s3req *reqs, size_t n)
{
	struct s3req *one[1], **ptrs = n == 1 ? one : calloc(n, sizeof(*ptrs));
	int ret;

	if (!ptrs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		ptrs[i] = &reqs[i];
	ret = s3_run_some(st, ptrs, n, st->inflight);
	if (ptrs != one)
		free(ptrs);
	return ret;
}

/* Run n requests with at most limit in flight, on one connection context. */
static int s3_run_some(struct s3store *st, struct s3req **reqs, size_t n,
		       unsigned limit)
{
	struct s3conn *c = s3conn_get(st);
	size_t done = 0, active = 0;
	uint64_t start = now_ms();
	int ret = 0;

	if (!c)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		reqs[i]->state = REQ_QUEUED;
		reqs[i]->attempt = 0;
		reqs[i]->not_before_ms = 0;
		reqs[i]->deadline_ms = start + st->base.cfg->s3_deadline_ms;
		reqs[i]->result = 0;
	}
	while (done < n) {
		uint64_t now = now_ms(), wake = UINT64_MAX;
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
			rq->easy = c->easy[--c->nfree];
			rq->attempt++;
			objstore_count(&st->base.n_requests, 1);
			ret = s3_req_setup(st, rq, rq->easy);
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
			s3_finish(st, rq, msg->data.result);
			if (rq->state == REQ_DONE)
				done++;
		}
		if (done < n && active) {
			int timeout = 100;

			now = now_ms();
			if (wake != UINT64_MAX && c->nfree)
				timeout = wake > now ? (int)(wake - now) : 0;
			if (timeout > 100)
				timeout = 100;
			curl_multi_poll(c->multi, NULL, 0, timeout, NULL);
		}
	}
	s3conn_put(st, c);
	for (size_t i = 0; i < n; i++)
		if (reqs[i]->result)
			return reqs[i]->result;
	return 0;
}

static void s3req_release(struct s3req *rq)
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
static int s3req_init(struct s3store *st, struct s3req *rq, const char *method,
		      const char *key, const char *const *kv, size_t nkv)
{
	static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41"
					"e4649b934ca495991b7852b855";

	memset(rq, 0, sizeof(*rq));
	rq->body_fd = -1;
	rq->method = method;
	memcpy(rq->payload_hash, empty_sha, sizeof(empty_sha));
	if (key) {
		rq->key = s3_strdupf("%s%s", st->prefix, key);
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

/* ---- hashing upload bodies ---- */

static int s3_hash_fd(int fd, uint64_t off, uint64_t len, char out[65])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned char md[32];
	char *buf = malloc(1 << 20);
	int ret = -EIO;

	if (!ctx || !buf) {
		ret = -ENOMEM;
		goto out;
	}
	if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
		goto out;
	while (len) {
		size_t want = len > (1 << 20) ? (1 << 20) : (size_t)len;
		ssize_t r = pread(fd, buf, want, (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			ret = r < 0 ? -errno : -EIO;
			log_error("s3: reading the upload source failed: %s",
				  r < 0 ? strerror(errno) : "file shrank");
			goto out;
		}
		if (EVP_DigestUpdate(ctx, buf, (size_t)r) != 1)
			goto out;
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
	if (EVP_DigestFinal_ex(ctx, md, NULL) != 1)
		goto out;
	strutil_hex(md, sizeof(md), out);
	ret = 0;
out:
	EVP_MD_CTX_free(ctx);
	free(buf);
	return ret;
}

/* ---- operations ---- */

static int s3store_list(struct objstore *os, const char *prefix,
			objstore_list_cb cb, void *arg)
{
	struct s3store *st = s3_of(os);
	size_t plen = strlen(st->prefix);
	char *full = s3_strdupf("%s%s", st->prefix, prefix);
	char *token = NULL;
	struct s3xml_list page = { 0 };
	int ret = 0;

	if (!full)
		return -ENOMEM;
	do {
		const char *kv[8] = { "list-type",     "2",  "prefix", full,
				      "encoding-type", "url" };
		size_t nkv = 3;
		struct s3req rq;

		if (token) {
			kv[2 * nkv] = "continuation-token";
			kv[2 * nkv + 1] = token;
			nkv++;
		}
		ret = s3req_init(st, &rq, "GET", NULL, kv, nkv);
		if (ret)
			break;
		rq.flags = REQ_COLLECT;
		ret = s3_run(st, &rq, 1);
		if (!ret) {
			ret = s3xml_parse_list(rq.resp ? rq.resp : "",
					       rq.resp_len, &page);
			if (ret) {
				log_error("s3: %s: unreadable listing of "
					  "prefix '%s'",
					  os->url, full);
				ret = -EIO;
			}
		}
		s3req_release(&rq);
		if (ret)
			break;
		for (size_t i = 0; i < page.nobjects && !ret; i++) {
			struct objstore_info oi = { 0 };
			const struct s3xml_object *o = &page.objects[i];

			if (strncmp(o->key, st->prefix, plen) || !o->key[plen])
				continue;
			oi.key = o->key + plen;
			oi.size = o->size;
			oi.mtime = o->mtime;
			snprintf(oi.etag, sizeof(oi.etag), "%s",
				 o->etag ? o->etag : "");
			ret = cb(arg, &oi);
		}
		free(token);
		token = NULL;
		if (!ret && page.truncated) {
			if (!page.next_token || !page.next_token[0]) {
				log_error("s3: %s: truncated listing without "
					  "a continuation token",
					  os->url);
				ret = -EIO;
			} else {
				token = page.next_token;
				page.next_token = NULL;
			}
		}
		s3xml_list_release(&page);
	} while (!ret && token);
	free(token);
	free(full);
	return ret;
}

static int s3store_head(struct objstore *os, const char *key,
			struct objstore_info *info)
{
	struct s3store *st = s3_of(os);
	struct s3req rq;
	int ret = s3req_init(st, &rq, "HEAD", key, NULL, 0);

	if (ret)
		return ret;
	rq.flags = REQ_HEAD | REQ_QUIET_404;
	ret = s3_run(st, &rq, 1);
	if (!ret) {
		info->size = rq.have_cl ? rq.content_length : 0;
		info->mtime = rq.last_modified;
		snprintf(info->etag, sizeof(info->etag), "%s", rq.etag);
	} else if (!rq.s3code[0] && (rq.status == 400 || rq.status == 403)) {
		/* A HEAD answer has no body to say why (SignatureDoesNotMatch,
		 * AccessDenied, ...): ask with a 1-byte GET, which logs the
		 * code. */
		char byte;
		struct s3req probe;

		if (!s3req_init(st, &probe, "GET", key, NULL, 0)) {
			probe.flags = REQ_RANGE;
			probe.len = 1;
			probe.dst = &byte;
			probe.dst_cap = 1;
			if (!s3_run(st, &probe, 1))
				log_error("s3: HEAD of '%s%s' refused with "
					  "HTTP %ld, but GET works",
					  st->prefix, key, rq.status);
			s3req_release(&probe);
		}
	}
	s3req_release(&rq);
	return ret;
}

struct s3_part {
	struct s3store *st;
	struct s3req **reqs;
	size_t n;
	unsigned limit;
	int ret;
};

static void *s3_part_run(void *arg)
{
	struct s3_part *h = arg;

	h->ret = s3_run_some(h->st, h->reqs, h->n, h->limit);
	return NULL;
}

/*
 * A large batch of GETs is spread over several engine threads (one per two
 * requests in flight, at most S3_ENGINE_THREADS), dealing requests out in
 * turn so that every thread walks the object front to back. One thread
 * copying every byte and running every HTTP parser is what keeps a single
 * process behind several parallel curl processes on a busy node.
 */
#define S3_ENGINE_THREADS 2

static int s3_run_parallel(struct s3store *st, struct s3req *reqs, size_t n)
{
	struct s3_part parts[S3_ENGINE_THREADS];
	pthread_t tids[S3_ENGINE_THREADS];
	size_t k = st->inflight / 2, started = 0;
	struct s3req **ptrs;
	int ret = 0;

	if (k > S3_ENGINE_THREADS)
		k = S3_ENGINE_THREADS;
	if (k > n / 2)
		k = n / 2;
	if (k < 2)
		return s3_run(st, reqs, n);
	ptrs = calloc(n, sizeof(*ptrs));
	if (!ptrs)
		return -ENOMEM;
	for (size_t t = 0, i = 0; t < k; t++) {
		parts[t] = (struct s3_part){
			st, ptrs + i, (n - t + k - 1) / k,
			(unsigned)((st->inflight - t + k - 1) / k), 0
		};
		for (size_t j = t; j < n; j += k)
			ptrs[i++] = &reqs[j];
	}
	for (size_t t = 1; t < k; t++) {
		if (pthread_create(&tids[t], NULL, s3_part_run, &parts[t]))
			break;
		started = t;
	}
	/* Parts whose thread did not start run here, in turn. */
	for (size_t t = started + 1; t < k; t++)
		s3_part_run(&parts[t]);
	s3_part_run(&parts[0]);
	for (size_t t = 1; t <= started; t++)
		pthread_join(tids[t], NULL);
	free(ptrs);
	for (size_t t = 0; t < k && !ret; t++)
		ret = parts[t].ret;
	return ret;
}

static int s3store_get_many(struct objstore *os, struct objstore_get *gets,
			    size_t n)
{
	struct s3store *st = s3_of(os);
	struct s3req *reqs = calloc(n, sizeof(*reqs));
	int ret = 0;

	if (!reqs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		ret = s3req_init(st, &reqs[i], "GET", gets[i].key, NULL, 0);
		if (ret)
			goto out;
		reqs[i].flags = REQ_RANGE;
		reqs[i].off = gets[i].off;
		reqs[i].len = gets[i].len;
		reqs[i].if_match = gets[i].if_match;
		reqs[i].dst = gets[i].buf;
		reqs[i].dst_cap = gets[i].len;
		reqs[i].on_data = gets[i].on_data;
		reqs[i].on_data_arg = gets[i].on_data_arg;
	}
	/* A zero-length read sends no request. */
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		if (!gets[i].len)
			continue;
		if (m != i) {
			struct s3req t = reqs[m];

			reqs[m] = reqs[i];
			reqs[i] = t;
		}
		m++;
	}
	ret = m ? s3_run_parallel(st, reqs, m) : 0;
	for (size_t i = 0, j = 0; i < n; i++) {
		if (!gets[i].len) {
			gets[i].got = 0;
			gets[i].result = 0;
			continue;
		}
		gets[i].got = reqs[j].got;
		gets[i].result = reqs[j].result;
		j++;
	}
out:
	for (size_t i = 0; i < n; i++)
		s3req_release(&reqs[i]);
	free(reqs);
	return ret;
}

static int s3_put_single(struct s3store *st, const char *key, int fd,
			 const void *buf, uint64_t size)
{
	struct s3req rq;
	int ret = s3req_init(st, &rq, "PUT", key, NULL, 0);

	if (ret)
		return ret;
	rq.body = buf;
	rq.body_fd = fd;
	rq.body_len = size;
	if (buf)
		sigv4_sha256_hex(buf, size, rq.payload_hash);
	else
		ret = s3_hash_fd(fd, 0, size, rq.payload_hash);
	if (!ret)
		ret = s3_run(st, &rq, 1);
	s3req_release(&rq);
	return ret;
}

static int s3_abort_multipart(struct s3store *st, const char *key,
			      const char *upload_id)
{
	const char *kv[2] = { "uploadId", upload_id };
	struct s3req rq;
	int ret = s3req_init(st, &rq, "DELETE", key, kv, 1);

	if (ret)
		return ret;
	ret = s3_run(st, &rq, 1);
	s3req_release(&rq);
	if (ret && ret != -ENOENT)
		log_error("s3: could not abort multipart upload of '%s%s' "
			  "(upload %s): parts may linger until a lifecycle "
			  "rule removes them",
			  st->prefix, key, upload_id);
	return ret;
}

static int s3_put_multipart(struct s3store *st, const char *key, int fd,
			    uint64_t size)
{
	const struct dstage_config *cfg = st->base.cfg;
	uint64_t part = cfg->s3_part_size;
	struct s3req *parts = NULL, rq;
	const char **etags = NULL;
	char *upload_id = NULL, *body = NULL, num[24];
	size_t nparts;
	int ret;

	while ((size + part - 1) / part > S3_MAX_PARTS)
		part *= 2;
	nparts = (size_t)((size + part - 1) / part);

	/* 1. Initiate. */
	{
		const char *kv[2] = { "uploads", "" };

		ret = s3req_init(st, &rq, "POST", key, kv, 1);
		if (ret)
			return ret;
		rq.flags = REQ_COLLECT;
		ret = s3_run(st, &rq, 1);
		if (!ret && s3xml_parse_upload_id(rq.resp ? rq.resp : "",
						  rq.resp_len, &upload_id)) {
			log_error("s3: no UploadId in the answer to initiating "
				  "a multipart upload of '%s%s'",
				  st->prefix, key);
			ret = -EIO;
		}
		s3req_release(&rq);
		if (ret)
			return ret;
	}

	/* 2. Parts, s3.max_inflight at a time. */
	parts = calloc(nparts, sizeof(*parts));
	etags = calloc(nparts, sizeof(*etags));
	if (!parts || !etags) {
		ret = -ENOMEM;
		goto abort;
	}
	for (size_t i = 0; i < nparts; i++) {
		const char *kv[4] = { "partNumber", num, "uploadId",
				      upload_id };

		snprintf(num, sizeof(num), "%zu", i + 1);
		ret = s3req_init(st, &parts[i], "PUT", key, kv, 2);
		if (ret)
			goto abort;
		parts[i].body_fd = fd;
		parts[i].body_off = (uint64_t)i * part;
		parts[i].body_len =
			i + 1 < nparts ? part : size - (uint64_t)i * part;
		ret = s3_hash_fd(fd, parts[i].body_off, parts[i].body_len,
				 parts[i].payload_hash);
		if (ret)
			goto abort;
	}
	ret = s3_run(st, parts, nparts);
	if (ret)
		goto abort;
	for (size_t i = 0; i < nparts; i++) {
		if (!parts[i].etag[0]) {
			log_error("s3: part %zu of '%s%s' answered without an "
				  "ETag",
				  i + 1, st->prefix, key);
			ret = -EIO;
			goto abort;
		}
		etags[i] = parts[i].etag;
	}

	/* 3. Complete. A 200 may still carry <Error>. */
	body = s3xml_build_complete(etags, nparts);
	if (!body) {
		ret = -ENOMEM;
		goto abort;
	}
	{
		const char *kv[2] = { "uploadId", upload_id };

		ret = s3req_init(st, &rq, "POST", key, kv, 1);
		if (ret)
			goto abort;
		rq.flags = REQ_COLLECT | REQ_RESULT_XML;
		rq.body = body;
		rq.body_len = strlen(body);
		sigv4_sha256_hex(body, rq.body_len, rq.payload_hash);
		ret = s3_run(st, &rq, 1);
		if (ret == -ENOENT && rq.attempt > 1) {
			/* NoSuchUpload on a retry: the first attempt may have
			 * completed it and lost the answer. Trust the size. */
			struct objstore_info oi = { 0 };

			if (!s3store_head(&st->base, key, &oi) &&
			    oi.size == size) {
				log_warn("s3: '%s%s': upload completed by an "
					 "earlier attempt",
					 st->prefix, key);
				ret = 0;
			}
		}
		s3req_release(&rq);
	}
	if (!ret)
		goto out;
abort:
	s3_abort_multipart(st, key, upload_id);
out:
	if (parts)
		for (size_t i = 0; i < nparts; i++)
			s3req_release(&parts[i]);
	free(parts);
	free(etags);
	free(body);
	free(upload_id);
	return ret;
}

static int s3store_put_fd(struct objstore *os, const char *key, int fd,
			  uint64_t size)
{
	struct s3store *st = s3_of(os);

	if (size >= os->cfg->s3_multipart_threshold)
		return s3_put_multipart(st, key, fd, size);
	return s3_put_single(st, key, fd, NULL, size);
}

static int s3store_put_buf(struct objstore *os, const char *key,
			   const void *buf, size_t len)
{
	static const char empty[1];

	return s3_put_single(s3_of(os), key, -1, buf ? buf : empty, len);
}

static int s3store_delete(struct objstore *os, const char *key)
{
	struct s3store *st = s3_of(os);
	struct s3req rq;
	int ret = s3req_init(st, &rq, "DELETE", key, NULL, 0);

	if (ret)
		return ret;
	rq.flags = REQ_QUIET_404;
	ret = s3_run(st, &rq, 1);
	s3req_release(&rq);
	return ret == -ENOENT ? 0 : ret;
}

static int s3store_copy(struct objstore *os, const char *src, const char *dst)
{
	struct s3store *st = s3_of(os);
	struct objstore_info oi = { 0 };
	char *full = NULL, *enc = NULL;
	struct s3req rq;
	int ret;

	ret = s3store_head(os, src, &oi);
	if (ret)
		return ret;
	if (oi.size > S3_MAX_COPY) {
		log_error("s3: copy of '%s%s' (%" PRIu64 " bytes) exceeds the "
			  "5 GiB single-request copy limit",
			  st->prefix, src, oi.size);
		return -EFBIG;
	}
	ret = s3req_init(st, &rq, "PUT", dst, NULL, 0);
	if (ret)
		return ret;
	full = s3_strdupf("%s/%s%s", st->bucket, st->prefix, src);
	enc = full ? sigv4_uri_encode(full, true) : NULL;
	if (!enc) {
		ret = -ENOMEM;
		goto out;
	}
	rq.copy_source = enc;
	enc = NULL;
	rq.flags = REQ_COLLECT | REQ_RESULT_XML;
	ret = s3_run(st, &rq, 1);
out:
	s3req_release(&rq);
	free(full);
	free(enc);
	return ret;
}

static void s3store_free(struct objstore *os)
{
	struct s3store *st = s3_of(os);

	if (!st)
		return;
	while (st->pool_head) {
		struct s3conn *c = st->pool_head;

		st->pool_head = c->next;
		s3conn_free(c);
	}
	pthread_mutex_destroy(&st->pool_lock);
	creds_release(&st->creds);
	free(st->bucket);
	free(st->prefix);
	free(st->scheme_host);
	free(st->host);
	free(st->uri_base);
	free(st->ca_file);
	free(st);
}

static const struct objstore_ops s3store_ops = {
	.list = s3store_list,
	.head = s3store_head,
	.get_many = s3store_get_many,
	.put_fd = s3store_put_fd,
	.put_buf = s3store_put_buf,
	.del = s3store_delete,
	.copy = s3store_copy,
	.free = s3store_free,
};

static pthread_once_t s3_global_once = PTHREAD_ONCE_INIT;
static void s3_global_init(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* Bucket names: 3-63 of [a-z0-9.-] (older buckets allow _ and capitals). */
static bool s3_bucket_ok(const char *b, size_t len)
{
	if (len < 3 || len > 63)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!isalnum((unsigned char)b[i]) && !strchr(".-_", b[i]))
			return false;
	return true;
}

int s3store_open(const char *url, const char *rest,
		 const struct dstage_config *cfg, struct objstore **out)
{
	const char *slash = strchr(rest, '/');
	size_t blen = slash ? (size_t)(slash - rest) : strlen(rest);
	const char *endpoint = cfg->s3_endpoint;
	const char *hostpart, *ca;
	char *def_endpoint = NULL, err[512];
	struct s3store *st;
	int ret = -ENOMEM;

	pthread_once(&s3_global_once, s3_global_init);
	if (!s3_bucket_ok(rest, blen)) {
		log_error("bad URL '%s': expected s3://BUCKET/PREFIX/ with a "
			  "bucket name of 3 to 63 letters, digits, '.', '-'",
			  url);
		return -EINVAL;
	}
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	pthread_mutex_init(&st->pool_lock, NULL);
	st->base.ops = &s3store_ops;
	st->base.cfg = cfg;
	st->inflight = cfg->s3_max_inflight ? cfg->s3_max_inflight : 1;
	st->bucket = strndup(rest, blen);
	if (!st->bucket)
		goto err;
	/* The prefix, normalised to "" or "dir/". */
	{
		const char *p = slash ? slash + 1 : "";
		size_t plen = strlen(p);

		st->prefix = s3_strdupf("%s%s", p,
					plen && p[plen - 1] != '/' ? "/" : "");
		if (!st->prefix)
			goto err;
	}
	if (!endpoint) {
		def_endpoint = s3_strdupf("https://s3.%s.amazonaws.com",
					  cfg->s3_region);
		if (!def_endpoint)
			goto err;
		endpoint = def_endpoint;
	}
	hostpart = strstr(endpoint, "://");
	if (!hostpart) {
		ret = -EINVAL;
		goto err;
	}
	hostpart += 3;
	{
		size_t hlen = strcspn(hostpart, "/?#");
		size_t slen = (size_t)(hostpart - endpoint);

		if (!hlen) {
			log_error("bad s3.endpoint '%s': no host", endpoint);
			ret = -EINVAL;
			goto err;
		}
		if (cfg->s3_path_style) {
			st->host = strndup(hostpart, hlen);
			st->uri_base = s3_strdupf("/%s", st->bucket);
		} else {
			st->host = s3_strdupf("%s.%.*s", st->bucket, (int)hlen,
					      hostpart);
			st->uri_base = strdup("");
		}
		if (!st->host || !st->uri_base)
			goto err;
		st->scheme_host =
			s3_strdupf("%.*s%s", (int)slen, endpoint, st->host);
		if (!st->scheme_host)
			goto err;
	}
	ca = cfg->s3_ca_file;
	if (!ca && !strncmp(endpoint, "https://", 8))
		ca = getenv("AWS_CA_BUNDLE");
	if (ca && *ca && !(st->ca_file = strdup(ca)))
		goto err;

	ret = creds_load(cfg->s3_credentials_file, cfg->s3_profile, &st->creds,
			 err, sizeof(err));
	if (ret == -ENOENT) {
		log_info("s3: no credentials found (environment, shared "
			 "credentials file, s3.credentials_file): sending "
			 "anonymous requests to %s",
			 url);
		st->anonymous = true;
	} else if (ret) {
		log_error("s3: %s", err);
		goto err;
	}
	free(def_endpoint);
	*out = &st->base;
	return 0;
err:
	free(def_endpoint);
	s3store_free(&st->base);
	return ret;
}
