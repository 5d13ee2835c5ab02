// SPDX-License-Identifier: MIT
/*
 * push_exec: the workers of a push and the checks of what the store holds.
 *
 * Each worker takes the next file of p->order (largest first, so a big
 * file does not start last and form the tail), reads it once into SHA-256
 * and MD5, uploads it, checks it and appends it to the journal:
 *
 *   small (< PUSH_BUF_MAX and < s3.multipart_threshold): read into the
 *     worker's buffer; stat before and after (size, mtime, ctime) and, when
 *     the mtime is within PUSH_RECENT_S of now (a write in the same clock
 *     tick would not move it), hash it a second time; then
 *     objstore_put_buf_ex from that buffer with the SHA-256 and MD5 just
 *     taken (the client hashes nothing again): the bytes sent are the bytes
 *     hashed, and the store's ETag must be their MD5 (-EBADMSG: deleted).
 *   large, s3://: push_part.c, the parts read once into buffers, hashed
 *     and sent from there by a crew of threads; stat before and after.
 *   large, file://: objstore_put_fd runs in a helper thread while the
 *     worker hashes the file; stat before and after.
 *   check: s3://: the ETag expected from the MD5s just taken (one MD5, or
 *     the MD5 of the parts' MD5s and "-N" as S3 forms it) is journalled at
 *     once and compared with the store's in one listing after all workers
 *     are done, so thousands of small files cost no HEAD each (each PUT's
 *     and part's own ETag was already checked as it was answered).
 *     file://: HEAD and a re-read of the stored file (If-Match on its
 *     ETag) into SHA-256.
 *   A mismatch, or a stat that moved, deletes the object again and reports
 *   the file as changed (PUSH_EV_CHANGED); it is journalled as forgotten.
 *
 * Shared state (struct push): counters and the next index are atomics;
 * ev_lock serializes events; bw_lock guards the bandwidth clock. A
 * push_file is written only by the worker that took it, and read by others
 * only after the workers are joined.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/sha256.h"
#include "dstage/timeutil.h"
#include "push_i.h"
#include "util/strutil.h"

#define PUSH_BUF_MAX (16u << 20) /* files read whole into memory */
#define PUSH_CHUNK (4u << 20) /* read size of the hash pass */
#define PUSH_RECENT_S 2 /* mtime this close to now: hash twice */

void push_emit(struct push *p, enum push_event ev, const char *key,
	       uint64_t size, const char *msg)
{
	if (!p->o->event)
		return;
	pthread_mutex_lock(&p->ev_lock);
	p->o->event(p->o->event_arg, ev, key, size, msg);
	pthread_mutex_unlock(&p->ev_lock);
}

/* --bandwidth: reserve len bytes of the shared budget and wait for it. */
static void push_bw_wait(struct push *p, uint64_t len)
{
	double start, now;

	if (!p->o->bandwidth)
		return;
	pthread_mutex_lock(&p->bw_lock);
	now = timeutil_mono_s();
	start = p->bw_next > now ? p->bw_next : now;
	p->bw_next = start + (double)len / (double)p->o->bandwidth;
	pthread_mutex_unlock(&p->bw_lock);
	while ((now = timeutil_mono_s()) < start && !atomic_load(&p->stop)) {
		double d = start - now > 0.2 ? 0.2 : start - now;
		struct timespec ts = { (time_t)d,
				       (long)((d - (double)(time_t)d) * 1e9) };

		nanosleep(&ts, NULL);
	}
}

static int64_t push_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

/* The hashes of one read pass: SHA-256, and MD5 when the store's ETags
 * are MD5s (s3://, single PUTs). */
struct push_hash {
	struct sha256 sha;
	EVP_MD_CTX *md5; /* NULL: not taken */
	unsigned char sum[32];
	unsigned char md[16]; /* the body's MD5 (md5 taken) */
	char etag[80]; /* the expected S3 ETag, quoted */
};

static void push_hash_release(struct push_hash *h)
{
	sha256_release(&h->sha);
	EVP_MD_CTX_free(h->md5);
	memset(h, 0, sizeof(*h));
}

static int push_hash_init(struct push_hash *h, bool md5)
{
	memset(h, 0, sizeof(*h));
	h->md5 = md5 ? EVP_MD_CTX_new() : NULL;
	if (sha256_init(&h->sha) || (md5 && !h->md5) ||
	    (md5 && !EVP_DigestInit_ex(h->md5, EVP_md5(), NULL))) {
		push_hash_release(h);
		return -ENOMEM;
	}
	return 0;
}

static void push_hash_update(struct push_hash *h, const unsigned char *b,
			     size_t n)
{
	sha256_update(&h->sha, b, n);
	if (h->md5)
		EVP_DigestUpdate(h->md5, b, n);
}

static void push_hash_final(struct push_hash *h)
{
	unsigned int len = 0;
	char hex[33];

	sha256_final(&h->sha, h->sum);
	if (!h->md5)
		return;
	EVP_DigestFinal_ex(h->md5, h->md, &len);
	strutil_hex(h->md, 16, hex);
	snprintf(h->etag, sizeof(h->etag), "\"%s\"", hex);
}

/* Read size bytes of fd from 0 into h (and into buf when not NULL).
 * Returns 0, -EAGAIN (the file is shorter or longer now), or -errno. */
static int push_read(int fd, uint64_t size, unsigned char *buf,
		     unsigned char *chunk, struct push_hash *h)
{
	uint64_t off = 0;
	unsigned char extra;

	while (off < size) {
		size_t want = size - off < PUSH_CHUNK ? (size_t)(size - off)
						      : PUSH_CHUNK;
		unsigned char *dst = buf ? buf + off : chunk;
		ssize_t n = pread(fd, dst, want, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (!n)
			return -EAGAIN;
		push_hash_update(h, dst, (size_t)n);
		off += (uint64_t)n;
	}
	if (pread(fd, &extra, 1, (off_t)size) > 0)
		return -EAGAIN;
	return 0;
}

struct push_worker {
	struct push *p;
	unsigned char *buf; /* small files, grown up to PUSH_BUF_MAX */
	size_t buf_cap;
	unsigned char *chunk; /* PUSH_CHUNK, hash passes */
};

/* file://: the stored object's size and SHA-256 must be what was read. */
static int push_check_file(struct push_worker *w, struct push_file *f,
			   const char **why)
{
	struct push *p = w->p;
	struct objstore_info oi = { 0 };
	struct push_hash h;
	uint64_t off = 0;
	int ret = objstore_head(p->os, f->key, &oi);

	if (ret) {
		*why = "cannot HEAD the stored object";
		return ret;
	}
	if (oi.size != f->size) {
		*why = "the stored object has another size than was read";
		return -EAGAIN;
	}
	ret = push_hash_init(&h, false);
	if (ret)
		return ret;
	while (off < oi.size) {
		size_t want = oi.size - off < PUSH_CHUNK
				      ? (size_t)(oi.size - off)
				      : PUSH_CHUNK;
		size_t got = 0;

		ret = objstore_get(p->os, f->key, off, want, oi.etag, w->chunk,
				   &got);
		if (!ret && !got)
			ret = -EIO;
		if (ret) {
			*why = "cannot read the stored object back";
			goto out;
		}
		push_hash_update(&h, w->chunk, got);
		off += got;
	}
	push_hash_final(&h);
	if (memcmp(h.sum, f->sha, 32)) {
		*why = "the stored object's SHA-256 differs from the one read "
		       "while uploading";
		ret = -EAGAIN;
		goto out;
	}
	free(f->etag);
	f->etag = strdup(oi.etag);
	ret = f->etag ? 0 : -ENOMEM;
out:
	push_hash_release(&h);
	return ret;
}

struct push_putter {
	struct objstore *os;
	const char *key;
	int fd;
	uint64_t size;
	int ret;
};

static void *push_putter_run(void *arg)
{
	struct push_putter *pt = arg;

	pt->ret = objstore_put_fd(pt->os, pt->key, pt->fd, pt->size);
	return NULL;
}

/* Mark f changed: delete what was stored (if anything), tell. */
static void push_changed(struct push *p, struct push_file *f, bool stored,
			 const char *why)
{
	int ret;

	f->state = PF_CHANGED;
	atomic_fetch_add(&p->changed, 1);
	if (stored) {
		ret = objstore_delete(p->os, f->key);
		if (ret)
			log_error("push: %s: could not delete the object again "
				  "(%s): it holds bytes of a changing file",
				  f->key, strerror(-ret));
	}
	push_emit(p, PUSH_EV_CHANGED, f->key, f->size, why);
}

static void push_failed(struct push *p, struct push_file *f, int err,
			const char *what)
{
	char msg[256];

	f->state = PF_FAILED;
	atomic_fetch_add(&p->failed, 1);
	snprintf(msg, sizeof(msg), "%s: %s", what, strerror(-err));
	push_emit(p, PUSH_EV_FAILED, f->key, f->size, msg);
}

/* The store's ETag for a body (or a part) was not the MD5 sent: it holds
 * other bytes than were sent (the client logged which). A single PUT's
 * object (stored) is deleted; a part's upload was aborted, and what the
 * key held before is left alone. */
static void push_etag_differs(struct push *p, struct push_file *f, bool stored)
{
	int ret = stored ? objstore_delete(p->os, f->key) : 0;

	if (ret)
		log_error("push: %s: could not delete the object (%s): it "
			  "holds other bytes than were sent",
			  f->key, strerror(-ret));
	push_failed(p, f, -EBADMSG,
		    "the store's ETag is not the MD5 of the bytes sent (the "
		    "store or a proxy altered them): not published, run the "
		    "push again");
}

/* Grow the worker's buffer to hold size bytes. Returns 0 or -ENOMEM. */
static int push_buf_reserve(struct push_worker *w, uint64_t size)
{
	unsigned char *nb;

	if (size <= w->buf_cap)
		return 0;
	nb = realloc(w->buf, (size_t)size);
	if (!nb)
		return -ENOMEM;
	w->buf = nb;
	w->buf_cap = (size_t)size;
	return 0;
}

/* A file written in the last PUSH_RECENT_S seconds: read it again and
 * compare its SHA-256 with h's. Returns 0 when they match, else non-zero
 * (reported). */
static int push_second_look(struct push_worker *w, struct push_file *f, int fd,
			    const struct push_hash *h)
{
	struct push_hash h2;
	int ret;

	ret = push_hash_init(&h2, false);
	if (!ret)
		ret = push_read(fd, f->size, NULL, w->chunk, &h2);
	if (!ret)
		push_hash_final(&h2);
	if (ret || memcmp(h2.sum, h->sum, 32)) {
		push_hash_release(&h2);
		push_changed(w->p, f, false,
			     "its hash differs on a second "
			     "look: not uploaded");
		return -EAGAIN;
	}
	push_hash_release(&h2);
	return 0;
}

/* A small file: read it whole into the buffer, hashing it, then put it in
 * one request with its digests. Returns 0 when stored, else non-zero
 * (reported). */
static int push_small(struct push_worker *w, struct push_file *f, int fd,
		      const struct stat *st1, struct push_hash *h)
{
	struct push *p = w->p;
	struct objstore_digests dig = { .flags = OBJSTORE_DIG_MD5 |
						 OBJSTORE_DIG_SHA256 };
	struct stat st2;
	int ret;

	if (push_buf_reserve(w, f->size)) {
		push_failed(p, f, -ENOMEM, "buffer");
		return -ENOMEM;
	}
	ret = push_read(fd, f->size, w->buf, NULL, h);
	if (!ret && fstat(fd, &st2))
		ret = -errno;
	if (ret == -EAGAIN || (!ret && push_moved(st1, &st2))) {
		push_changed(p, f, false,
			     "changed while it was read (size, mtime "
			     "or ctime moved): not uploaded");
		return -EAGAIN;
	}
	if (ret) {
		push_failed(p, f, ret, "read");
		return ret;
	}
	push_hash_final(h);
	if (st2.st_mtim.tv_sec + PUSH_RECENT_S >= time(NULL) &&
	    push_second_look(w, f, fd, h))
		return -EAGAIN;
	memcpy(dig.md5, h->md, 16);
	memcpy(dig.sha256, h->sum, 32);
	ret = objstore_put_buf_ex(p->os, f->key, w->buf, (size_t)f->size, &dig);
	if (ret == -EBADMSG) {
		push_etag_differs(p, f, true);
		return ret;
	}
	if (ret) {
		push_failed(p, f, ret, "upload");
		return ret;
	}
	/* written while it went up: what is stored is a snapshot the
	 * file no longer holds */
	if (fstat(fd, &st2) || push_moved(st1, &st2)) {
		push_changed(p, f, true,
			     "changed while it was uploaded (size, "
			     "mtime or ctime moved): removed from the "
			     "store");
		return -EAGAIN;
	}
	return 0;
}

/* A large file to S3: a multipart upload in parallel parts. Returns 0
 * when stored, else non-zero (reported). */
static int push_large_s3(struct push *p, struct push_file *f, int fd,
			 const struct stat *st1, struct push_hash *h)
{
	const char *why = NULL;
	int ret;

	ret = push_part_upload(p, f, fd, st1, h->etag, sizeof(h->etag), &why);
	if (ret == -EAGAIN) {
		push_changed(p, f, false,
			     "changed while it was read (size, mtime "
			     "or ctime moved): upload aborted, not "
			     "published");
		return ret;
	}
	if (ret == -EBADMSG) {
		push_etag_differs(p, f, false);
		return ret;
	}
	if (ret) {
		push_failed(p, f, ret, why);
		return ret;
	}
	memcpy(h->sum, f->sha, 32);
	return 0;
}

/* A large file to file://: a thread streams it to the store while this
 * one reads it again for the hash. Returns 0 when stored, else non-zero
 * (reported). */
static int push_streamed(struct push_worker *w, struct push_file *f, int fd,
			 const struct stat *st1, struct push_hash *h)
{
	struct push *p = w->p;
	struct push_putter pt = { p->os, f->key, fd, f->size, 0 };
	struct stat st2;
	pthread_t t;
	int hr;

	if (pthread_create(&t, NULL, push_putter_run, &pt)) {
		push_failed(p, f, -EAGAIN, "thread");
		return -EAGAIN;
	}
	hr = push_read(fd, f->size, NULL, w->chunk, h);
	pthread_join(t, NULL);
	if (!hr && fstat(fd, &st2))
		hr = -errno;
	if (hr == -EAGAIN || (!hr && push_moved(st1, &st2))) {
		push_changed(p, f, !pt.ret,
			     "changed while it was uploaded (size, "
			     "mtime or ctime moved): removed from the "
			     "store");
		return -EAGAIN;
	}
	if (pt.ret || hr) {
		push_failed(p, f, pt.ret ? pt.ret : hr,
			    pt.ret ? "upload" : "read");
		return pt.ret ? pt.ret : hr;
	}
	push_hash_final(h);
	return 0;
}

/* After the upload: record the hash and ETag (s3://) or check the stored
 * copy (file://), journal the file as done and count it. */
static void push_record(struct push_worker *w, struct push_file *f,
			const struct push_hash *h)
{
	struct push *p = w->p;
	const char *why = NULL;
	int ret;

	memcpy(f->sha, h->sum, 32);
	atomic_fetch_add(&p->sent, f->size);
	if (p->s3) {
		free(f->etag);
		f->etag = strdup(h->etag);
		if (!f->etag) {
			push_failed(p, f, -ENOMEM, "record");
			return;
		}
	} else {
		ret = push_check_file(w, f, &why);
		if (ret == -EAGAIN) {
			push_changed(p, f, true, why);
			return;
		}
		if (ret) {
			push_failed(p, f, ret, why);
			return;
		}
	}
	f->state = PF_DONE;
	ret = push_journal_put(&p->j, f);
	if (ret) {
		int zero = 0;

		atomic_compare_exchange_strong(&p->err, &zero, ret);
	}
	atomic_fetch_add(&p->files_done, 1);
	atomic_fetch_add(&p->bytes_done, f->size);
	if (!p->s3) /* s3:// files are told once the listing checked them */
		push_emit(p, PUSH_EV_UPLOADED, f->key, f->size, NULL);
}

/* Open the file, take what it is now, upload it the way its size and the
 * store call for and record it; each failure is reported on the file. */
static void push_one(struct push_worker *w, struct push_file *f)
{
	struct push *p = w->p;
	struct stat st1;
	struct push_hash h = { 0 };
	bool small;
	int fd, ret;

	fd = openat(p->rootfd, f->key,
		    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		if (ret == -ENOENT || ret == -ELOOP)
			push_changed(p, f, false,
				     "gone or replaced since the "
				     "walk");
		else
			push_failed(p, f, ret, "open");
		return;
	}
	if (fstat(fd, &st1) || !S_ISREG(st1.st_mode)) {
		push_changed(p, f, false, "no longer a regular file");
		goto out;
	}
	/* changed since the walk, before any read: push what is there now */
	f->size = (uint64_t)st1.st_size;
	f->mtime_ns = push_ns(&st1.st_mtim);
	f->ino = (uint64_t)st1.st_ino;
	small = f->size < PUSH_BUF_MAX &&
		(f->size < p->cfg->s3_multipart_threshold || !p->s3);
	ret = push_hash_init(&h, p->s3 && small);
	if (ret) {
		push_failed(p, f, ret, "hash");
		goto out;
	}
	push_bw_wait(p, f->size);
	if (small)
		ret = push_small(w, f, fd, &st1, &h);
	else if (p->s3)
		ret = push_large_s3(p, f, fd, &st1, &h);
	else
		ret = push_streamed(w, f, fd, &st1, &h);
	if (!ret)
		push_record(w, f, &h);
out:
	push_hash_release(&h);
	close(fd);
}

static void *push_worker_run(void *arg)
{
	struct push_worker *w = arg;
	struct push *p = w->p;
	size_t i;

	while (!atomic_load(&p->stop) && !atomic_load(&p->err) &&
	       (i = atomic_fetch_add(&p->next, 1)) < p->n_order)
		push_one(w, &p->files[p->order[i]]);
	return NULL;
}

static int push_obj_find(const struct push *p, const char *key,
			 struct push_obj *objs, size_t n, size_t *at)
{
	size_t lo = 0, hi = n;

	(void)p;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(key, objs[mid].key);

		if (!c) {
			*at = mid;
			return 0;
		}
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -ENOENT;
}

struct push_listing {
	struct push_obj *v;
	size_t n, cap;
};

static int push_listing_cb(void *arg, const struct objstore_info *oi)
{
	struct push_listing *l = arg;

	if (GROW_ONE(l->v, l->n, l->cap, 1024))
		return -ENOMEM;
	l->v[l->n].key = strdup(oi->key);
	l->v[l->n].etag = strdup(oi->etag);
	l->v[l->n].size = oi->size;
	l->v[l->n].matched = false;
	if (!l->v[l->n].key || !l->v[l->n].etag) {
		free(l->v[l->n].key);
		free(l->v[l->n].etag);
		return -ENOMEM;
	}
	l->n++;
	return 0;
}

/* An ETag S3 forms from MD5s: "<32 hex>" or "<32 hex>-N". */
static bool push_md5_etag(const char *e, uint64_t *parts)
{
	size_t n = strlen(e);
	char *end;

	*parts = 0;
	if (n < 34 || e[0] != '"' || e[n - 1] != '"')
		return false;
	for (int i = 1; i <= 32; i++)
		if (strutil_hexval(e[i]) < 0)
			return false;
	if (n == 34)
		return true;
	if (e[33] != '-')
		return false;
	errno = 0;
	*parts = strtoull(e + 34, &end, 10);
	return !errno && *parts && end == e + n - 1;
}

/* s3://: one listing; every file uploaded this run must be there with the
 * size read and the ETag expected from its MD5s. */
static int push_check_s3(struct push *p)
{
	struct push_listing l = { 0 };
	uint64_t unverifiable = 0;
	int ret = objstore_list(p->os, "", push_listing_cb, &l);

	if (ret) {
		log_error("push: %s: listing to check the upload: %s",
			  objstore_url(p->os), strerror(-ret));
		goto out;
	}
	for (size_t i = 0; i < p->n_files; i++) {
		struct push_file *f = &p->files[i];
		struct push_obj *o;
		uint64_t want, got;
		size_t at;

		if (f->state != PF_DONE || !f->etag)
			continue;
		if (push_obj_find(p, f->key, l.v, l.n, &at)) {
			f->state = PF_FAILED;
			atomic_fetch_add(&p->failed, 1);
			push_emit(p, PUSH_EV_FAILED, f->key, f->size,
				  "not in the store's listing after its "
				  "upload");
			push_journal_put(&p->j, f);
			continue;
		}
		o = &l.v[at];
		if (o->size != f->size) {
			push_changed(p, f, true,
				     "the stored object's size differs from "
				     "the bytes read: removed from the store");
			push_journal_put(&p->j, f);
			continue;
		}
		if (strcmp(o->etag, f->etag)) {
			if (!push_md5_etag(o->etag, &got) ||
			    (push_md5_etag(f->etag, &want) && want != got)) {
				/* not an MD5 ETag (e.g. SSE-KMS), or other
				 * parts: the size is all that can be said */
				unverifiable++;
				free(f->etag);
				f->etag = strdup(o->etag);
				push_journal_put(&p->j, f);
				push_emit(p, PUSH_EV_UPLOADED, f->key, f->size,
					  "ETag not comparable: size checked");
				continue;
			}
			push_changed(p, f, true,
				     "the store holds other bytes than were "
				     "hashed (ETag differs): the file changed "
				     "during its upload; removed from the "
				     "store");
			push_journal_put(&p->j, f);
			continue;
		}
		push_emit(p, PUSH_EV_UPLOADED, f->key, f->size, NULL);
	}
	if (unverifiable)
		log_warn("push: %s: %" PRIu64 " object(s) have ETags that are "
			 "not MD5s of their bytes (server-side encryption?): "
			 "their size was checked, run stager verify --source",
			 objstore_url(p->os), unverifiable);
out:
	for (size_t i = 0; i < l.n; i++) {
		free(l.v[i].key);
		free(l.v[i].etag);
	}
	free(l.v);
	return ret;
}

int push_exec_run(struct push *p)
{
	unsigned n = p->o->parallel ? p->o->parallel : p->cfg->s3_max_inflight;
	struct push_worker *w;
	pthread_t *t;
	unsigned k = 0;
	int ret = 0;

	if (!n)
		n = 1;
	if (n > p->n_order)
		n = p->n_order ? (unsigned)p->n_order : 1;
	w = calloc(n, sizeof(*w));
	t = calloc(n, sizeof(*t));
	if (!w || !t) {
		ret = -ENOMEM;
		goto out;
	}
	atomic_store(&p->part_helpers, p->cfg->s3_max_inflight);
	for (; k < n; k++) {
		w[k].p = p;
		w[k].chunk = malloc(PUSH_CHUNK);
		if (!w[k].chunk ||
		    pthread_create(&t[k], NULL, push_worker_run, &w[k])) {
			free(w[k].buf);
			free(w[k].chunk);
			break;
		}
	}
	if (!k) {
		ret = -EAGAIN;
		goto out;
	}
	for (unsigned i = 0; i < k; i++) {
		pthread_join(t[i], NULL);
		free(w[i].buf);
		free(w[i].chunk);
	}
	ret = atomic_load(&p->err);
	if (!ret && p->s3 && p->n_order)
		ret = push_check_s3(p);
out:
	free(w);
	free(t);
	return ret;
}

/* ---- uploads in parts left open by an earlier run ---- */

struct push_leftover {
	char *key, *id;
	const char *why; /* static */
};

struct push_leftovers {
	struct push *p;
	int64_t now;
	struct push_leftover *v;
	size_t n, cap;
};

/* Whether key is one of this push's files (files are sorted by key). */
static bool push_is_file(const struct push *p, const char *key)
{
	size_t lo = 0, hi = p->n_files;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(key, p->files[mid].key);

		if (!c)
			return true;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return false;
}

/* file://: whether directory key[0..dlen) holds one of this push's keys
 * directly (a temporary file there is a put of this push's). */
static bool push_is_dir(const struct push *p, const char *key, size_t dlen)
{
	for (size_t i = 0; i < p->n_files; i++) {
		const char *k = p->files[i].key;
		const char *s = strrchr(k, '/');
		size_t kd = s ? (size_t)(s - k) : 0;

		if (kd == dlen && !memcmp(k, key, dlen))
			return true;
	}
	return false;
}

static int push_leftover_cb(void *arg, const struct objstore_upload_info *ui)
{
	struct push_leftovers *l = arg;
	struct push *p = l->p;
	const char *why = NULL;

	if (p->s3) {
		if (push_is_file(p, ui->key))
			why = "left open on this push's key by an earlier run";
	} else {
		const char *s = strrchr(ui->key, '/');

		if (push_is_dir(p, ui->key, s ? (size_t)(s - ui->key) : 0))
			why = "left open in this push's directory by an "
			      "earlier run";
	}
	if (!why && ui->initiated > 0 &&
	    l->now - ui->initiated > PUSH_STALE_UPLOAD_S)
		why = "open for more than 24 hours: abandoned";
	if (!why)
		return 0;
	if (GROW_ONE(l->v, l->n, l->cap, 16))
		return -ENOMEM;
	l->v[l->n].key = strdup(ui->key);
	l->v[l->n].id = strdup(ui->id);
	l->v[l->n].why = why;
	if (!l->v[l->n].key || !l->v[l->n].id) {
		free(l->v[l->n].key);
		free(l->v[l->n].id);
		return -ENOMEM;
	}
	l->n++;
	return 0;
}

int push_exec_abort_leftovers(struct push *p)
{
	struct push_leftovers l = { .p = p, .now = (int64_t)time(NULL) };
	int ret;

	/* listed whole first: aborting while paging could move markers */
	ret = objstore_upload_list(p->os, "", push_leftover_cb, &l);
	if (ret == -ENOMEM)
		goto out;
	if (ret)
		log_warn("push: cannot list the uploads left open under %s "
			 "(%s): any stay until a later push or a lifecycle "
			 "rule removes them",
			 p->o->url, strerror(-ret));
	ret = 0;
	for (size_t i = 0; i < l.n; i++) {
		int r = objstore_upload_abort_id(p->os, l.v[i].key, l.v[i].id);

		if (r) {
			log_warn("push: %s: cannot abort the upload %s of '%s' "
				 "(%s): it stays until a later push or a "
				 "lifecycle rule removes it",
				 p->o->url, l.v[i].id, l.v[i].key,
				 strerror(-r));
			continue;
		}
		p->aborted++;
		push_emit(p, PUSH_EV_ABORTED, l.v[i].key, 0, l.v[i].why);
	}
out:
	for (size_t i = 0; i < l.n; i++) {
		free(l.v[i].key);
		free(l.v[i].id);
	}
	free(l.v);
	return ret;
}
