// SPDX-License-Identifier: MIT
/*
 * push_part: a large file pushed to s3:// in parts, each byte read once.
 *
 * A crew of threads (the worker that took the file and up to
 * PUSH_PART_CREW - 1 helpers, as many as the push's part budget allows)
 * takes parts in order. A member:
 *
 *   1. takes the next part number (lock);
 *   2. preads the part into its own buffer (part_size bytes);
 *   3. takes the part's MD5 from the buffer and sends it with
 *      objstore_upload_part_ex: Content-MD5 from that MD5, signed
 *      UNSIGNED-PAYLOAD, no hash pass in the client; the store's ETag for
 *      the part is checked against the MD5 there (-EBADMSG);
 *   4. waits for its turn (turn == its part), feeds the same, unchanged
 *      buffer into the file's SHA-256 (which only the member whose turn it
 *      is touches, so the hash is of the bytes in file order), passes the
 *      turn on. After the send, so that a part whose turn has not come
 *      (an earlier part is still on its way) does not hold its own send
 *      back.
 *
 * So the bytes sent are the bytes hashed, read from the file once, with
 * the SHA-256 serial (it must be) and the MD5s and sends in parallel.
 * After the crew: one more byte past the size and a second fstat tell a
 * file that grew or moved while it was read (-EAGAIN: the upload is
 * aborted, nothing is published); else the upload is committed and the
 * ETag S3 forms (the MD5 of the parts' MD5s, "-N") is the expected one.
 *
 * State machine of a struct push_part_job: RUN (members take parts) ->
 * DONE (next == nparts and every member returned) or FAILED (err set: the
 * members stop taking parts; the ones waiting for their turn wake and
 * leave). Invariants: turn <= next; sha is touched only by the member
 * whose part == turn; md5s[i] only by the member that took part i.
 * lock (a leaf) protects next, turn and err.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "push_i.h"
#include "strutil.h"

#define PUSH_PART_CREW 4 /* most parts of one file in flight */

struct push_part_job {
	struct push *p;
	struct push_file *f;
	int fd;
	struct objstore_upload *up;
	uint64_t part_size;
	unsigned nparts;
	pthread_mutex_t lock; /* a leaf */
	pthread_cond_t cond; /* turn moved or err set */
	unsigned next; /* lock: the next part to take, from 0 */
	unsigned turn; /* lock: the part whose bytes go into sha next */
	int err; /* lock: the first error */
	const char *what; /* lock: the step that failed */
	EVP_MD_CTX *sha; /* the member whose part == turn */
	unsigned char (*md5s)[16]; /* [i]: part i's, by its member */
};

static int64_t push_part_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

bool push_moved(const struct stat *a, const struct stat *b)
{
	return a->st_size != b->st_size || a->st_ino != b->st_ino ||
	       push_part_ns(&a->st_mtim) != push_part_ns(&b->st_mtim) ||
	       push_part_ns(&a->st_ctim) != push_part_ns(&b->st_ctim);
}

static void push_part_fail(struct push_part_job *j, int err, const char *what)
{
	pthread_mutex_lock(&j->lock);
	if (!j->err) {
		j->err = err;
		j->what = what;
	}
	pthread_cond_broadcast(&j->cond);
	pthread_mutex_unlock(&j->lock);
}

/* len bytes of fd at off into buf; -EAGAIN when the file ends first. */
static int push_part_read(int fd, unsigned char *buf, uint64_t len,
			  uint64_t off)
{
	uint64_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, buf + got, (size_t)(len - got),
				  (off_t)(off + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (!n)
			return -EAGAIN;
		got += (uint64_t)n;
	}
	return 0;
}

/* Step 3: wait for part i's turn, hash, pass the turn on. */
static int push_part_sha(struct push_part_job *j, unsigned i,
			 const unsigned char *buf, uint64_t len)
{
	int ret;

	pthread_mutex_lock(&j->lock);
	while (j->turn != i && !j->err)
		pthread_cond_wait(&j->cond, &j->lock);
	ret = j->err;
	pthread_mutex_unlock(&j->lock);
	if (ret)
		return ret;
	ret = EVP_DigestUpdate(j->sha, buf, (size_t)len) == 1 ? 0 : -ENOMEM;
	pthread_mutex_lock(&j->lock);
	j->turn++;
	if (ret && !j->err) {
		j->err = ret;
		j->what = "hash";
	}
	pthread_cond_broadcast(&j->cond);
	pthread_mutex_unlock(&j->lock);
	return ret;
}

static void push_part_member(struct push_part_job *j, unsigned char *buf)
{
	struct objstore_digests dig = { .flags = OBJSTORE_DIG_MD5 };
	uint64_t size = j->f->size;

	for (;;) {
		unsigned i;
		uint64_t off, len;
		unsigned int mdlen = 0;
		int ret;

		pthread_mutex_lock(&j->lock);
		i = j->next;
		if (j->err || i >= j->nparts) {
			pthread_mutex_unlock(&j->lock);
			return;
		}
		j->next++;
		pthread_mutex_unlock(&j->lock);
		off = (uint64_t)i * j->part_size;
		len = size - off < j->part_size ? size - off : j->part_size;
		ret = push_part_read(j->fd, buf, len, off);
		if (ret) {
			push_part_fail(j, ret, "read");
			return;
		}
		if (EVP_Digest(buf, (size_t)len, dig.md5, &mdlen, EVP_md5(),
			       NULL) != 1) {
			push_part_fail(j, -ENOMEM, "hash");
			return;
		}
		memcpy(j->md5s[i], dig.md5, 16);
		ret = objstore_upload_part_ex(j->up, i + 1, buf, (size_t)len,
					      &dig);
		if (ret) {
			push_part_fail(j, ret, "upload");
			return;
		}
		/* After the send: a member whose part waits for its turn in
		 * the SHA-256 does not hold its send back. */
		if (push_part_sha(j, i, buf, len))
			return; /* another member failed, or ENOMEM (set) */
	}
}

struct push_part_helper {
	struct push_part_job *j;
	unsigned char *buf;
	pthread_t t;
};

static void *push_part_helper_run(void *arg)
{
	struct push_part_helper *h = arg;

	push_part_member(h->j, h->buf);
	return NULL;
}

/* Take up to want helpers from the push's shared budget. */
static unsigned push_part_take(struct push *p, unsigned want)
{
	unsigned have = atomic_load(&p->part_helpers);

	while (have) {
		unsigned take = have < want ? have : want;

		if (atomic_compare_exchange_weak(&p->part_helpers, &have,
						 have - take))
			return take;
	}
	return 0;
}

/* The ETag S3 forms for the parts: MD5 of their MD5s, "-N" (no parts:
 * the empty PUT's, the MD5 of nothing). */
static void push_part_etag(const struct push_part_job *j, char *etag,
			   size_t cap)
{
	unsigned char md[16];
	unsigned int len = 0;
	char hex[33];

	if (!j->nparts) {
		EVP_Digest("", 0, md, &len, EVP_md5(), NULL);
		strutil_hex(md, 16, hex);
		snprintf(etag, cap, "\"%s\"", hex);
		return;
	}
	EVP_Digest(j->md5s, (size_t)j->nparts * 16, md, &len, EVP_md5(), NULL);
	strutil_hex(md, 16, hex);
	snprintf(etag, cap, "\"%s-%u\"", hex, j->nparts);
}

/*
 * x-amz-meta-sha256 on f's object, just committed as the version etag (the
 * hash was not known when its upload began). A failure is only logged: the
 * object is whole and SHA256SUMS and the catalog hold the hash. A copy
 * that gives the object a new ETag (AWS) updates etag, which the listing
 * check compares.
 */
static void push_part_stamp(struct push *p, const struct push_file *f,
			    char *etag, size_t etag_cap)
{
	char sha[65], now[OBJSTORE_ETAG_MAX];
	int ret;

	strutil_hex(f->sha, 32, sha);
	ret = objstore_set_sha256(p->os, f->key, etag, sha, now);
	if (!ret && now[0])
		snprintf(etag, etag_cap, "%s", now);
	else if (ret == -EFBIG)
		log_info("push: %s is larger than S3 copies, even in 10,000 "
			 "parts: its SHA-256 is in SHA256SUMS and the catalog "
			 "only, not in x-amz-meta-sha256",
			 f->key);
	else if (ret == -ESTALE)
		log_warn("push: %s was replaced in the store after it was "
			 "uploaded: its SHA-256 is not recorded as "
			 "x-amz-meta-sha256 on the other version",
			 f->key);
	else if (ret)
		log_warn("push: cannot record the SHA-256 of %s as "
			 "x-amz-meta-sha256: %s; the object is stored and "
			 "SHA256SUMS holds the hash",
			 f->key, strerror(-ret));
}

int push_part_upload(struct push *p, struct push_file *f, int fd,
		     const struct stat *st1, char *etag, size_t etag_cap,
		     const char **what)
{
	struct push_part_job j = { .p = p, .f = f, .fd = fd };
	struct push_part_helper helpers[PUSH_PART_CREW - 1];
	unsigned char *buf = NULL, extra;
	unsigned want, took = 0, started = 0;
	unsigned int len = 0;
	struct stat st2;
	int ret;

	*what = "upload";
	ret = objstore_upload_begin(p->os, f->key, f->size, NULL, &j.up);
	if (ret)
		return ret;
	j.part_size = objstore_upload_part_size(j.up);
	j.nparts = (unsigned)((f->size + j.part_size - 1) / j.part_size);
	pthread_mutex_init(&j.lock, NULL);
	pthread_cond_init(&j.cond, NULL);
	j.sha = EVP_MD_CTX_new();
	j.md5s = calloc(j.nparts ? j.nparts : 1, sizeof(*j.md5s));
	buf = malloc((size_t)j.part_size);
	if (!j.sha || !j.md5s || !buf ||
	    EVP_DigestInit_ex(j.sha, EVP_sha256(), NULL) != 1) {
		*what = "buffer";
		ret = -ENOMEM;
		goto out;
	}
	want = j.nparts < PUSH_PART_CREW ? j.nparts : PUSH_PART_CREW;
	took = want > 1 ? push_part_take(p, want - 1) : 0;
	for (; started < took; started++) {
		struct push_part_helper *h = &helpers[started];

		h->j = &j;
		h->buf = malloc((size_t)j.part_size);
		if (!h->buf)
			break;
		if (pthread_create(&h->t, NULL, push_part_helper_run, h)) {
			free(h->buf);
			break;
		}
	}
	push_part_member(&j, buf);
	for (unsigned i = 0; i < started; i++) {
		pthread_join(helpers[i].t, NULL);
		free(helpers[i].buf);
	}
	atomic_fetch_add(&p->part_helpers, took);
	ret = j.err;
	*what = j.what;
	/* grown, shrunk or written while read: not published */
	if (!ret && (pread(fd, &extra, 1, (off_t)f->size) > 0 ||
		     fstat(fd, &st2) || push_moved(st1, &st2)))
		ret = -EAGAIN;
	if (ret)
		goto out;
	EVP_DigestFinal_ex(j.sha, f->sha, &len);
	push_part_etag(&j, etag, etag_cap);
	ret = objstore_upload_commit(j.up, f->size);
	j.up = NULL; /* freed by commit, always */
	if (ret)
		*what = "commit";
	else
		push_part_stamp(p, f, etag, etag_cap);
out:
	objstore_upload_abort(j.up);
	EVP_MD_CTX_free(j.sha);
	free(j.md5s);
	free(buf);
	pthread_cond_destroy(&j.cond);
	pthread_mutex_destroy(&j.lock);
	return ret;
}
