/* SPDX-License-Identifier: MIT */
/*
 * s3store_i: what the s3:// backend's files share. s3store.c holds the
 * operations (list, head, get, put, multipart, delete, copy) and open, with
 * s3mpu.c, s3copy.c and s3copy_mp.c under it; s3req.c the request engine
 * under them all (connection pool, curl callbacks, signing, judging
 * answers, retries), and s3req_once.c its one-call form for a request with
 * no body. Calls go one way, down to s3req.c, never the reverse. Not a
 * public header.
 *
 * The state machine of a request and the locking of struct s3store are
 * described at the top of s3req.c.
 */
#ifndef DSTAGE_S3STORE_I_H
#define DSTAGE_S3STORE_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <curl/curl.h>

#include "creds.h"
#include "objstore_backend.h"

#define S3_MAX_XML (64u << 20) /* largest XML answer we accept */
#define S3_MAX_ERRBODY (64u << 10) /* largest error body kept */
#define S3_MAX_PARTS 10000
#define S3_MAX_COPY (5ULL << 30) /* single-request copy limit */
#define S3REQ_XHDR_MAX 16 /* struct s3req.xhdrs */

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
	REQ_QUIET_412 = 1 << 5, /* a failed precondition too (-ESTALE) */
};

struct s3req {
	/* What to send; set up before s3req_run(). */
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
	char payload_hash[65]; /* or SIGV4_UNSIGNED_PAYLOAD */
	/* Content-MD5 of the body (base64), "" for none: the store refuses a
	 * body that does not match (BadDigest). Set on every upload body. */
	char content_md5[32];
	/* x-amz-meta-sha256 (64 hex digits), NULL for none. */
	const char *meta_sha256;
	/* More headers to send and sign, "name:value" with a lower-case
	 * name, at most S3REQ_XHDR_MAX (the rest are not sent). */
	const char *const *xhdrs;
	size_t nxhdrs;
	/* Optional: called with each header of an answer (name NULL as each
	 * answer begins, a retry's or after a 100 Continue: forget the
	 * earlier ones). name and value are not NUL-terminated. */
	void (*on_header)(void *arg, const char *name, size_t nlen,
			  const char *val, size_t vlen);
	void *on_header_arg;
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
	char meta_sha256_got[65]; /* the answer's x-amz-meta-sha256, or "" */
	uint64_t content_length;
	bool have_cl;
	int64_t last_modified;
	bool have_cr; /* Content-Range seen */
	uint64_t cr_start, cr_end, cr_total;
	uint64_t retry_after_ms; /* Retry-After, 0 when none */
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

/* Free a connection context (its multi and easy handles). NULL ok. */
void s3req_conn_free(struct s3conn *c);

/* asprintf that returns the string, or NULL when out of memory. */
char *s3req_strdupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * Initialise rq for method on key (relative to the store prefix; NULL for
 * the bucket) with canonical query pairs kv[0..2*nkv). Returns 0 or
 * -ENOMEM. Release with s3req_release (NULL ok).
 */
int s3req_init(struct s3store *st, struct s3req *rq, const char *method,
	       const char *key, const char *const *kv, size_t nkv);
void s3req_release(struct s3req *rq);

/*
 * Run n requests to completion, retries included, with up to
 * s3.max_inflight in flight (s3req_run) or limit (s3req_run_some), on one
 * pooled connection context. Each request's result is in rq->result;
 * returns 0 when all succeeded, else the first failing one's -errno
 * (the values listed in dstage/objstore.h).
 */
int s3req_run(struct s3store *st, struct s3req *reqs, size_t n);
int s3req_run_some(struct s3store *st, struct s3req **reqs, size_t n,
		   unsigned limit);

/*
 * One request with no body (s3req_once.c): method on key (relative to the
 * store prefix; NULL for the bucket) with canonical query pairs
 * kv[0..2*nkv) and flags (enum s3req_flags), initialised and run to
 * completion, retries included. rq NULL: the answer is not wanted and is
 * released here. Else rq holds the answer (status, etag, s3code, ...) and
 * the caller releases it with s3req_release, whatever this returned.
 * Returns 0, -ENOMEM, or the request's -errno (those of s3req_run; -ENOENT
 * for a 404 under REQ_QUIET_404, quietly).
 */
int s3req_once(struct s3store *st, struct s3req *rq, const char *method,
	       const char *key, const char *const *kv, size_t nkv,
	       unsigned flags);

#endif
