// SPDX-License-Identifier: MIT
/*
 * s3store: the s3://bucket/prefix/ backend on libcurl, signed with our own
 * Signature V4 signer (lib/objstore/sigv4.c).
 *
 * Every operation here is a batch of requests (struct s3req) run by the
 * request engine in s3req.c: a single GET is a batch of one; get_many and
 * multipart parts are larger batches. This file builds the batches and
 * reads their answers; s3req.c sends, signs, judges and retries them.
 * The requests that begin, complete and abort a multipart upload are in
 * s3mpu.c (shared with the copies in parts of s3copy_mp.c), the copies in
 * s3copy.c.
 *
 * Everything in struct s3store is immutable after open except the
 * connection pool (s3store.pool_lock, a leaf lock, see s3req.c) and the
 * counters, which are atomics.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "dstage/config.h"
#include "dstage/log.h"
#include "s3copy.h"
#include "s3hash.h"
#include "s3mpu.h"
#include "s3store_i.h"
#include "s3xml.h"
#include "sigv4.h"
#include "util/strutil.h"

static struct s3store *s3store_of(struct objstore *os)
{
	return (struct s3store *)os;
}

/* ---- operations ---- */

/*
 * A paged GET of the bucket (ListObjectsV2, ListMultipartUploads): base's
 * nbase query pairs, then, from the second page on, the marks the last
 * page handed back under names (names[1] may be NULL; a NULL mark is sent
 * empty). page reads one answer, gives its entries to the caller and sets
 * marks[] (allocated) for the next page, marks[0] NULL after the last.
 * Returns 0, or the request's or page's -errno.
 */
typedef int (*s3store_page_fn)(void *ctx, const char *body, size_t len,
			       char *marks[2]);

static int s3store_pages(struct s3store *st, const char *const base[],
			 size_t nbase, const char *const names[2],
			 s3store_page_fn page, void *ctx)
{
	char *marks[2] = { NULL, NULL };
	int ret;

	do {
		const char *kv[10];
		char *next[2] = { NULL, NULL };
		size_t nkv = nbase;
		struct s3req rq;

		memcpy(kv, base, 2 * nbase * sizeof(*kv));
		for (int m = 0; m < 2 && marks[0] && names[m]; m++, nkv++) {
			kv[2 * nkv] = names[m];
			kv[2 * nkv + 1] = marks[m] ? marks[m] : "";
		}
		ret = s3req_init(st, &rq, "GET", NULL, kv, nkv);
		if (ret)
			break;
		rq.flags = REQ_COLLECT;
		ret = s3req_run(st, &rq, 1);
		if (!ret)
			ret = page(ctx, rq.resp ? rq.resp : "", rq.resp_len,
				   next);
		s3req_release(&rq);
		free(marks[0]);
		free(marks[1]);
		marks[0] = next[0];
		marks[1] = next[1];
	} while (!ret && marks[0]);
	free(marks[0]);
	free(marks[1]);
	return ret;
}

/* What a listing's pages go to. */
struct s3store_lister {
	struct objstore *os;
	const char *full; /* the prefix listed, the store's included */
	size_t plen; /* the store's prefix */
	objstore_list_cb cb;
	objstore_upload_list_cb ucb;
	void *arg;
	unsigned pages;
};

static int s3store_list_page(void *ctx, const char *body, size_t len,
			     char *marks[2])
{
	struct s3store_lister *l = ctx;
	const char *sp = s3store_of(l->os)->prefix;
	struct s3xml_list page = { 0 };
	int ret = 0;

	if (s3xml_parse_list(body, len, &page)) {
		log_error("s3: %s: unreadable listing of prefix '%s'",
			  l->os->url, l->full);
		return -EIO; /* page released by the parse */
	}
	for (size_t i = 0; i < page.nobjects && !ret; i++) {
		struct objstore_info oi = { 0 };
		const struct s3xml_object *o = &page.objects[i];

		if (strncmp(o->key, sp, l->plen) || !o->key[l->plen])
			continue;
		oi.key = o->key + l->plen;
		oi.size = o->size;
		oi.mtime = o->mtime;
		snprintf(oi.etag, sizeof(oi.etag), "%s",
			 o->etag ? o->etag : "");
		ret = l->cb(l->arg, &oi);
	}
	if (!ret && page.truncated) {
		if (!page.next_token || !page.next_token[0]) {
			log_error("s3: %s: truncated listing without "
				  "a continuation token",
				  l->os->url);
			ret = -EIO;
		} else {
			marks[0] = page.next_token;
			page.next_token = NULL;
		}
	}
	s3xml_list_release(&page);
	return ret;
}

static int s3store_list(struct objstore *os, const char *prefix,
			objstore_list_cb cb, void *arg)
{
	struct s3store *st = s3store_of(os);
	char *full = s3req_strdupf("%s%s", st->prefix, prefix);
	struct s3store_lister l = { .os = os,
				    .full = full,
				    .plen = strlen(st->prefix),
				    .cb = cb,
				    .arg = arg };
	const char *const base[] = { "list-type",     "2",  "prefix", full,
				     "encoding-type", "url" };
	const char *const names[2] = { "continuation-token", NULL };
	int ret;

	if (!full)
		return -ENOMEM;
	ret = s3store_pages(st, base, 3, names, s3store_list_page, &l);
	free(full);
	return ret;
}

static int s3store_head(struct objstore *os, const char *key,
			struct objstore_info *info)
{
	struct s3store *st = s3store_of(os);
	struct s3req rq;
	int ret = s3req_once(st, &rq, "HEAD", key, NULL, 0,
			     REQ_HEAD | REQ_QUIET_404);

	if (!ret) {
		info->size = rq.have_cl ? rq.content_length : 0;
		info->mtime = rq.last_modified;
		snprintf(info->etag, sizeof(info->etag), "%s", rq.etag);
		memcpy(info->sha256, rq.meta_sha256_got, sizeof(info->sha256));
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
			if (!s3req_run(st, &probe, 1))
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

static void *s3store_part_run(void *arg)
{
	struct s3_part *h = arg;

	h->ret = s3req_run_some(h->st, h->reqs, h->n, h->limit);
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

static int s3store_run_parallel(struct s3store *st, struct s3req *reqs,
				size_t n)
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
		return s3req_run(st, reqs, n);
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
		if (pthread_create(&tids[t], NULL, s3store_part_run, &parts[t]))
			break;
		started = t;
	}
	/* Parts whose thread did not start run here, in turn. */
	for (size_t t = started + 1; t < k; t++)
		s3store_part_run(&parts[t]);
	s3store_part_run(&parts[0]);
	for (size_t t = 1; t <= started; t++)
		pthread_join(tids[t], NULL);
	free(ptrs);
	for (size_t t = 0; t < k && !ret; t++)
		ret = parts[t].ret;
	return ret;
}

static int s3store_get_many(struct objstore *os, struct objstore_get_req *gets,
			    size_t n)
{
	struct s3store *st = s3store_of(os);
	struct s3req *reqs = calloc(n, sizeof(*reqs));
	int ret = 0;

	if (!reqs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		ret = s3req_init(st, &reqs[i], "GET", gets[i].key, NULL, 0);
		if (ret)
			goto out;
		reqs[i].flags =
			REQ_RANGE | (gets[i].missing_ok ? REQ_QUIET_404 : 0);
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
	ret = m ? s3store_run_parallel(st, reqs, m) : 0;
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

/*
 * The caller's digests (objstore_digests) into rq's headers: the MD5 as
 * Content-MD5 (base64), the SHA-256 as the payload hash (hex). Returns
 * which of the two rq still lacks (OBJSTORE_DIG_* bits).
 */
static unsigned s3store_digests_use(struct s3req *rq,
				    const struct objstore_digests *dig)
{
	unsigned lack = OBJSTORE_DIG_MD5 | OBJSTORE_DIG_SHA256;

	if (!dig)
		return lack;
	if (dig->flags & OBJSTORE_DIG_MD5) {
		EVP_EncodeBlock((unsigned char *)rq->content_md5, dig->md5,
				16); /* 24 + NUL */
		lack &= ~OBJSTORE_DIG_MD5;
	}
	if (dig->flags & OBJSTORE_DIG_SHA256) {
		strutil_hex(dig->sha256, 32, rq->payload_hash);
		lack &= ~OBJSTORE_DIG_SHA256;
	}
	return lack;
}

/*
 * The ETag the store answered for a body against the MD5 the caller took
 * of it (dig): -EBADMSG when the ETag is an MD5 (32 hex digits, quoted or
 * not) and another one. partno 0: a single PUT.
 */
static int s3store_etag_check(const struct s3store *st, const char *key,
			      unsigned partno, const char *etag,
			      const struct objstore_digests *dig)
{
	char want[33];
	size_t n;

	if (!dig || !(dig->flags & OBJSTORE_DIG_MD5))
		return 0;
	if (*etag == '"')
		etag++;
	n = strlen(etag);
	if (n && etag[n - 1] == '"')
		n--;
	if (n != 32)
		return 0; /* not an MD5 (encryption, another store's form) */
	for (size_t i = 0; i < 32; i++)
		if (!isxdigit((unsigned char)etag[i]))
			return 0;
	strutil_hex(dig->md5, 16, want);
	if (!strncasecmp(etag, want, 32))
		return 0;
	if (partno)
		log_error("s3: part %u of '%s%s': the store answered ETag "
			  "%.32s, but the part sent has MD5 %s: it holds other "
			  "bytes than were sent (a store that ignores "
			  "Content-MD5, or a proxy that alters bodies); the "
			  "part is not used",
			  partno, st->prefix, key, etag, want);
	else
		log_error("s3: '%s%s': the store answered ETag %.32s, but the "
			  "body sent has MD5 %s: it holds other bytes than "
			  "were sent (a store that ignores Content-MD5, or a "
			  "proxy that alters bodies)",
			  st->prefix, key, etag, want);
	return -EBADMSG;
}

/* excl: only if key is absent (If-None-Match: *; a 412 is -EEXIST). */
static int s3store_put_single(struct s3store *st, const char *key, int fd,
			      const void *buf, uint64_t size,
			      const struct objstore_digests *dig, bool excl)
{
	static const char *const if_absent[] = { "if-none-match:*" };
	struct s3req rq;
	unsigned lack;
	char *sha, *md5;
	int ret = s3req_init(st, &rq, "PUT", key, NULL, 0);

	if (ret)
		return ret;
	rq.body = buf;
	rq.body_fd = fd;
	rq.body_len = size;
	if (excl) {
		rq.xhdrs = if_absent;
		rq.nxhdrs = 1;
		rq.flags |= REQ_QUIET_412;
	}
	/* Only what the caller did not hash already. */
	lack = s3store_digests_use(&rq, dig);
	sha = lack & OBJSTORE_DIG_SHA256 ? rq.payload_hash : NULL;
	md5 = lack & OBJSTORE_DIG_MD5 ? rq.content_md5 : NULL;
	if (lack && buf)
		ret = s3hash_buf(buf, size, sha, md5);
	else if (lack)
		ret = s3hash_fd(fd, 0, size, sha, md5);
	/* The signed payload hash is the object's SHA-256: record it. */
	rq.meta_sha256 = rq.payload_hash;
	if (!ret)
		ret = s3req_run(st, &rq, 1);
	if (excl && ret == -ESTALE)
		ret = -EEXIST;
	if (!ret)
		ret = s3store_etag_check(st, key, 0, rq.etag, dig);
	s3req_release(&rq);
	return ret;
}

/* ---- multipart uploads (objstore_upload_*) ---- */

/*
 * Set rq up as UploadPart partno of upload id: len bytes from buf, or from
 * fd at off. The body is signed as UNSIGNED-PAYLOAD and guarded by its
 * Content-MD5 (one MD5 pass instead of a SHA-256 one; the store refuses a
 * body that does not match with BadDigest, which is retried), taken from
 * dig when the caller has it (no pass at all here).
 */
static int s3store_part_init(struct s3store *st, const char *key,
			     const char *id, unsigned partno, const void *buf,
			     int fd, uint64_t off, uint64_t len,
			     const struct objstore_digests *dig,
			     struct s3req *rq)
{
	char num[16];
	const char *kv[4] = { "partNumber", num, "uploadId", id };
	int ret;

	snprintf(num, sizeof(num), "%u", partno);
	ret = s3req_init(st, rq, "PUT", key, kv, 2);
	if (ret)
		return ret;
	rq->body = buf;
	rq->body_fd = buf ? -1 : fd;
	rq->body_off = buf ? 0 : off;
	rq->body_len = len;
	if (!(s3store_digests_use(rq, buf ? dig : NULL) & OBJSTORE_DIG_MD5))
		ret = 0;
	else if (buf)
		ret = s3hash_buf(buf, (size_t)len, NULL, rq->content_md5);
	else
		ret = s3hash_fd(fd, off, len, NULL, rq->content_md5);
	/* after s3store_digests_use: a part's payload is never signed */
	snprintf(rq->payload_hash, sizeof(rq->payload_hash), "%s",
		 SIGV4_UNSIGNED_PAYLOAD);
	if (ret)
		s3req_release(rq);
	return ret;
}

static void s3store_up_free(struct objstore_upload *up)
{
	objstore_upload_release(up);
	free(up);
}

static int s3store_up_begin(struct objstore *os, const char *key,
			    const char *sha256, struct objstore_upload **out)
{
	struct objstore_upload *up = calloc(1, sizeof(*up));
	int ret;

	if (!up)
		return -ENOMEM;
	up->key = strdup(key);
	if (!up->key) {
		free(up);
		return -ENOMEM;
	}
	ret = s3mpu_create(s3store_of(os), key, sha256, NULL, 0, &up->id);
	if (ret) {
		free(up->key);
		free(up);
		return ret;
	}
	*out = up;
	return 0;
}

static int s3store_up_part(struct objstore_upload *up, unsigned partno,
			   const void *buf, int fd, uint64_t off, uint64_t len,
			   const struct objstore_digests *dig,
			   char etag[OBJSTORE_ETAG_MAX])
{
	struct s3store *st = s3store_of(up->os);
	struct s3req rq;
	int ret = s3store_part_init(st, up->key, up->id, partno, buf, fd, off,
				    len, dig, &rq);

	if (ret)
		return ret;
	ret = s3req_run(st, &rq, 1);
	if (!ret && !rq.etag[0]) {
		log_error("s3: part %u of '%s%s' answered without an ETag",
			  partno, st->prefix, up->key);
		ret = -EIO;
	}
	if (!ret)
		ret = s3store_etag_check(st, up->key, partno, rq.etag,
					 buf ? dig : NULL);
	if (!ret)
		memcpy(etag, rq.etag, OBJSTORE_ETAG_MAX);
	s3req_release(&rq);
	return ret;
}

static void s3store_up_abort(struct objstore_upload *up)
{
	s3mpu_abort(s3store_of(up->os), up->key, up->id);
	s3store_up_free(up);
}

static int s3store_up_commit(struct objstore_upload *up, unsigned nparts,
			     uint64_t size, char etag[OBJSTORE_ETAG_MAX])
{
	struct s3store *st = s3store_of(up->os);
	int ret;

	if (nparts == 0) {
		/* S3 completes no upload of zero parts: an empty PUT. */
		static const char empty[1];

		ret = s3store_put_single(st, up->key, -1, empty, 0, NULL,
					 false);
		s3store_up_abort(up);
		return ret;
	}
	ret = s3mpu_complete(st, up->key, up->id, up->parts, nparts, size, NULL,
			     NULL, NULL);
	if (ret) {
		s3store_up_abort(up);
		return ret;
	}
	/* radosgw answers no <ETag>: the one S3 forms from the parts */
	s3hash_multipart_etag(up->parts, nparts, etag);
	s3store_up_free(up);
	return 0;
}

static int s3store_up_abort_id(struct objstore *os, const char *key,
			       const char *id)
{
	return s3mpu_abort(s3store_of(os), key, id);
}

static int s3store_up_list_page(void *ctx, const char *body, size_t len,
				char *marks[2])
{
	struct s3store_lister *l = ctx;
	const char *sp = s3store_of(l->os)->prefix;
	struct s3xml_mpu_list page = { 0 };
	int ret = 0;

	if (s3xml_parse_mpu_list(body, len, &page)) {
		log_error("s3: %s: unreadable list of the multipart "
			  "uploads under '%s'",
			  l->os->url, l->full);
		return -EIO; /* page released by the parse */
	}
	for (size_t i = 0; i < page.nuploads && !ret; i++) {
		const struct s3xml_mpu *u = &page.uploads[i];
		struct objstore_upload_info ui = {
			.key = u->key + l->plen,
			.id = u->upload_id,
			.initiated = u->initiated,
		};

		if (strncmp(u->key, sp, l->plen) || !u->key[l->plen])
			continue;
		ret = l->ucb(l->arg, &ui);
	}
	if (!ret && page.truncated) {
		/* a marker that does not move would loop forever */
		if (!page.next_key || !page.next_key[0] ||
		    ++l->pages > 1000000) {
			log_error("s3: %s: truncated list of multipart "
				  "uploads without a next key marker",
				  l->os->url);
			ret = -EIO;
		} else {
			marks[0] = page.next_key;
			marks[1] = page.next_id;
			page.next_key = page.next_id = NULL;
		}
	}
	s3xml_mpu_list_release(&page);
	return ret;
}

/* ListMultipartUploads under the prefix, page by page (key-marker,
 * upload-id-marker). */
static int s3store_up_list(struct objstore *os, const char *prefix,
			   objstore_upload_list_cb cb, void *arg)
{
	struct s3store *st = s3store_of(os);
	char *full = s3req_strdupf("%s%s", st->prefix, prefix);
	struct s3store_lister l = { .os = os,
				    .full = full,
				    .plen = strlen(st->prefix),
				    .ucb = cb,
				    .arg = arg };
	const char *const base[] = { "uploads",	      "",   "prefix", full,
				     "encoding-type", "url" };
	const char *const names[2] = { "key-marker", "upload-id-marker" };
	int ret;

	if (!full)
		return -ENOMEM;
	ret = s3store_pages(st, base, 3, names, s3store_up_list_page, &l);
	free(full);
	return ret;
}

/* objstore_put_fd's multipart form: the parts of fd in one batch, up to
 * s3.max_inflight in flight on one connection context. */
static int s3store_put_multipart(struct s3store *st, const char *key, int fd,
				 uint64_t size, const char *sha)
{
	uint64_t part = objstore_part_size(&st->base, size);
	size_t nparts = (size_t)((size + part - 1) / part);
	struct objstore_part *done = NULL;
	struct s3req *parts = NULL;
	char *upload_id = NULL, own_sha[65];
	int ret;

	if (!sha) {
		ret = s3hash_fd(fd, 0, size, own_sha, NULL);
		if (ret)
			return ret;
		sha = own_sha;
	}
	ret = s3mpu_create(st, key, sha, NULL, 0, &upload_id);
	if (ret)
		return ret;
	parts = calloc(nparts, sizeof(*parts));
	done = calloc(nparts, sizeof(*done));
	if (!parts || !done) {
		ret = -ENOMEM;
		goto abort;
	}
	for (size_t i = 0; i < nparts; i++)
		parts[i].body_fd = -1;
	for (size_t i = 0; i < nparts; i++) {
		uint64_t off = (uint64_t)i * part;

		ret = s3store_part_init(
			st, key, upload_id, (unsigned)i + 1, NULL, fd, off,
			i + 1 < nparts ? part : size - off, NULL, &parts[i]);
		if (ret)
			goto abort;
	}
	ret = s3req_run(st, parts, nparts);
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
		done[i].len = parts[i].body_len;
		memcpy(done[i].etag, parts[i].etag, sizeof(done[i].etag));
	}
	ret = s3mpu_complete(st, key, upload_id, done, nparts, size, NULL, NULL,
			     NULL);
	if (!ret)
		goto out;
abort:
	s3mpu_abort(st, key, upload_id);
out:
	if (parts)
		for (size_t i = 0; i < nparts; i++)
			s3req_release(&parts[i]);
	free(parts);
	free(done);
	free(upload_id);
	return ret;
}

static int s3store_put_fd(struct objstore *os, const char *key, int fd,
			  uint64_t size, const char *sha)
{
	struct s3store *st = s3store_of(os);

	if (size >= os->cfg->s3_multipart_threshold)
		return s3store_put_multipart(st, key, fd, size, sha);
	return s3store_put_single(st, key, fd, NULL, size, NULL, false);
}

static int s3store_put_buf(struct objstore *os, const char *key,
			   const void *buf, size_t len,
			   const struct objstore_digests *dig)
{
	static const char empty[1];

	return s3store_put_single(s3store_of(os), key, -1, buf ? buf : empty,
				  len, dig, false);
}

static int s3store_put_new(struct objstore *os, const char *key,
			   const void *buf, size_t len)
{
	static const char empty[1];

	return s3store_put_single(s3store_of(os), key, -1, buf ? buf : empty,
				  len, NULL, true);
}

static int s3store_delete(struct objstore *os, const char *key)
{
	int ret = s3req_once(s3store_of(os), NULL, "DELETE", key, NULL, 0,
			     REQ_QUIET_404);

	return ret == -ENOENT ? 0 : ret;
}

static void s3store_free(struct objstore *os)
{
	struct s3store *st = s3store_of(os);

	if (!st)
		return;
	while (st->pool_head) {
		struct s3conn *c = st->pool_head;

		st->pool_head = c->next;
		s3req_conn_free(c);
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
	.put_new = s3store_put_new,
	.del = s3store_delete,
	.copy = s3copy_object,
	.set_sha256 = s3copy_set_sha256,
	.free = s3store_free,
	.up_begin = s3store_up_begin,
	.up_part = s3store_up_part,
	.up_commit = s3store_up_commit,
	.up_abort = s3store_up_abort,
	.up_abort_id = s3store_up_abort_id,
	.up_list = s3store_up_list,
};

static pthread_once_t s3_global_once = PTHREAD_ONCE_INIT;
static void s3store_global_init(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* Bucket names: 3-63 of [a-z0-9.-] (older buckets allow _ and capitals). */
static bool s3store_bucket_ok(const char *b, size_t len)
{
	if (len < 3 || len > 63)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!isalnum((unsigned char)b[i]) && !strchr(".-_", b[i]))
			return false;
	return true;
}

/*
 * Warn (once a process) about a transport anyone on the path can read or
 * change, and refuse to send a session token in clear unless
 * s3.allow_insecure_token says so. Returns 0 or -EACCES (logged).
 */
static int s3store_check_transport(struct s3store *st, const char *endpoint,
				   const char *url)
{
	static _Atomic bool warned_http, warned_tls;
	const struct dstage_config *cfg = st->base.cfg;
	bool http = strncasecmp(endpoint, "http://", 7) == 0;

	if (http && !atomic_exchange(&warned_http, true))
		log_warn("s3: endpoint %s is plain http: requests and data "
			 "cross the network unencrypted and can be read or "
			 "changed on the way; use an https:// s3.endpoint",
			 endpoint);
	if (!http && !cfg->s3_verify_tls && !atomic_exchange(&warned_tls, true))
		log_warn("s3: s3.verify_tls = false: the certificate of %s is "
			 "not checked, so anyone on the path can pose as it; "
			 "set s3.ca_file to its CA instead",
			 endpoint);
	if (http && !st->anonymous && st->creds.session_token &&
	    !cfg->s3_allow_insecure_token) {
		log_error("s3: %s: refusing to send the session token (from "
			  "%s) in clear to the plain http endpoint %s; use "
			  "https, or set s3.allow_insecure_token = yes to "
			  "accept that anyone on the path may steal it",
			  url, st->creds.source, endpoint);
		return -EACCES;
	}
	return 0;
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

	pthread_once(&s3_global_once, s3store_global_init);
	if (!s3store_bucket_ok(rest, blen)) {
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

		st->prefix = s3req_strdupf(
			"%s%s", p, plen && p[plen - 1] != '/' ? "/" : "");
		if (!st->prefix)
			goto err;
	}
	if (!endpoint) {
		def_endpoint = s3req_strdupf("https://s3.%s.amazonaws.com",
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
			st->uri_base = s3req_strdupf("/%s", st->bucket);
		} else {
			st->host = s3req_strdupf("%s.%.*s", st->bucket,
						 (int)hlen, hostpart);
			st->uri_base = strdup("");
		}
		if (!st->host || !st->uri_base)
			goto err;
		st->scheme_host =
			s3req_strdupf("%.*s%s", (int)slen, endpoint, st->host);
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
	ret = s3store_check_transport(st, endpoint, url);
	if (ret)
		goto err;
	free(def_endpoint);
	*out = &st->base;
	return 0;
err:
	free(def_endpoint);
	s3store_free(&st->base);
	return ret;
}
