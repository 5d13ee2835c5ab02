// SPDX-License-Identifier: MIT
/*
 * push_part: a large file pushed to s3:// in parts, each byte read once.
 *
 * Two roles. The worker that took the file is its reader: it takes the
 * parts in file order, preads each into a buffer, feeds it into the file's
 * SHA-256 (in order, by construction) and queues it as ready. Senders,
 * helper threads from the push's shared budget (p->part_helpers,
 * s3.max_inflight threads for the whole push), take ready parts and send
 * them with objstore_upload_part_ex: Content-MD5 from the part's MD5,
 * signed UNSIGNED-PAYLOAD, no hash pass in the client; the store's ETag for
 * the part is checked against the MD5 there (-EBADMSG). A sent part's
 * buffer goes back to the file's pool.
 *
 * Who takes a part's MD5 (from the same buffer): the reader, for the
 * oldest queued part without one, whenever it would otherwise wait for a
 * buffer (the store is the bound: every MD5 is taken ahead, off the
 * senders' way); else the sender that takes the part (the reader is the
 * bound: the MD5s run in parallel on the senders, and the reader's serial
 * work is the read and the SHA-256 alone).
 *
 * Why a reader ahead of the senders: when every member both hashed and
 * sent, the members' parts finished together (the store serves its
 * connections fairly), then all of them hashed their next part at once on
 * the same cores, with nothing on the wire until the slowest was done: the
 * parts went up in waves with the store idle between them (about 0.7 of
 * the store's PUT rate here). Now a part is hashed while others are on
 * their way, and a sender that finishes finds the next one ready.
 *
 * The reader starts up to PUSH_PART_CREW senders and, between parts, one
 * more whenever the budget has one and at least two parts are left to
 * read; senders give their place back when the file's last part is sent.
 * So a file that starts when the budget is spent (the last of several
 * large files) grows its crew as the others finish. A reader with no
 * sender at all (the budget spent by other files) sends its parts itself.
 * The pool holds at most 2 buffers per sender, plus one (push_part_bufs):
 * enough for every sender to find its next part ready.
 *
 * After the senders: one more byte past the size and a second fstat tell
 * a file that grew or moved while it was read (-EAGAIN: the upload is
 * aborted, nothing is published); else the upload is committed and the
 * ETag S3 forms (the MD5 of the parts' MD5s, "-N") is the expected one.
 *
 * State machine of a struct push_part_job: RUN (the reader reads, the
 * senders send) -> READ (the reader has queued the last part; senders
 * drain the queue and leave) -> DONE (every sender returned), or FAILED
 * (err set: the reader stops reading, senders leave without taking more;
 * queued buffers are freed at the end). A queued part: waiting (no MD5),
 * hashing (the reader takes its MD5: busy, no sender takes it), ready
 * (has its MD5); a sender takes a waiting or ready one, the oldest first.
 * Invariants: a buffer is in exactly one place (the reader's hands, the
 * queue, a sender's hands or the free list) and nbufs counts them all; sha
 * is the reader's alone; md5s[i] is written by whoever holds part i (the
 * reader while it is busy, or its sender), and read after the senders are
 * joined; helpers[] and nhelpers are the reader's (it alone starts and
 * joins them). lock (a leaf) protects queue, nqueue, free, nfree, nbufs,
 * read_done, err, what and the queued parts' flags.
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
#include "dstage/sha256.h"
#include "push_i.h"
#include "util/strutil.h"

#define PUSH_PART_CREW 4 /* senders started with the file */
#define PUSH_PART_MAX_HELPERS 256 /* s3.max_inflight's own bound */

struct push_part_job;

struct push_part_helper {
	struct push_part_job *j;
	pthread_t t;
};

struct push_part_queued {
	unsigned i; /* part number, from 0 */
	unsigned char *buf;
	bool md5; /* md5s[i] is taken */
	bool busy; /* the reader is taking it */
};

struct push_part_job {
	struct push *p;
	struct push_file *f;
	int fd;
	struct objstore_upload *up;
	uint64_t part_size;
	unsigned nparts;
	pthread_mutex_t lock; /* a leaf */
	pthread_cond_t cond; /* queue or pool moved, read_done or err set */
	struct push_part_queued *queue; /* lock: parts read, not yet sent */
	unsigned nqueue; /* lock */
	unsigned char **free; /* lock: buffers no one holds */
	unsigned nfree; /* lock */
	unsigned nbufs; /* lock: buffers allocated */
	bool read_done; /* lock: the last part is queued */
	int err; /* lock: the first error */
	const char *what; /* lock: the step that failed */
	unsigned qcap; /* size of queue[] and free[] */
	struct sha256 sha; /* the reader's */
	unsigned char (*md5s)[16]; /* [i]: part i's, by its holder */
	struct push_part_helper *helpers; /* the reader's */
	unsigned nhelpers; /* the reader's: started */
	unsigned cap; /* most senders for this file */
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

/* With lock held: record the first error and wake every waiter. */
static void push_part_fail_locked(struct push_part_job *j, int err,
				  const char *what)
{
	if (!j->err) {
		j->err = err;
		j->what = what;
	}
	pthread_cond_broadcast(&j->cond);
}

/* With lock held: buf goes back to the pool. */
static void push_part_put_locked(struct push_part_job *j, unsigned char *buf)
{
	j->free[j->nfree++] = buf;
	pthread_cond_broadcast(&j->cond);
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

static uint64_t push_part_len(const struct push_part_job *j, unsigned i)
{
	uint64_t off = (uint64_t)i * j->part_size;

	return j->f->size - off < j->part_size ? j->f->size - off
					       : j->part_size;
}

/* The most buffers the file's pool holds: two per sender (one on the
 * wire, one ready), and the one the reader fills. The reader's alone. */
static unsigned push_part_bufs(const struct push_part_job *j)
{
	return 2 * j->nhelpers + 1;
}

/* Part i's MD5 from buf into md5s[i]; 0 or -ENOMEM. */
static int push_part_md5(struct push_part_job *j, unsigned i,
			 const unsigned char *buf)
{
	unsigned int mdlen = 0;

	return EVP_Digest(buf, (size_t)push_part_len(j, i), j->md5s[i], &mdlen,
			  EVP_md5(), NULL) == 1
		       ? 0
		       : -ENOMEM;
}

/* With lock held, by the reader while it would wait for a buffer: take
 * the MD5 of the oldest queued part without one (lock dropped meanwhile;
 * no sender takes a busy part). false when there was none. */
static bool push_part_md5_ahead(struct push_part_job *j)
{
	struct push_part_queued *q = NULL;
	unsigned char *buf;
	unsigned i;
	int ret;

	for (unsigned k = 0; k < j->nqueue; k++)
		if (!j->queue[k].md5 && (!q || j->queue[k].i < q->i))
			q = &j->queue[k];
	if (!q)
		return false;
	q->busy = true;
	i = q->i;
	buf = q->buf;
	pthread_mutex_unlock(&j->lock);
	ret = push_part_md5(j, i, buf);
	pthread_mutex_lock(&j->lock);
	/* a busy part stays queued, though others' removals may move it */
	for (unsigned k = 0; k < j->nqueue; k++)
		if (j->queue[k].i == i) {
			j->queue[k].busy = false;
			j->queue[k].md5 = !ret;
		}
	if (ret)
		push_part_fail_locked(j, ret, "hash");
	pthread_cond_broadcast(&j->cond);
	return true;
}

/* The reader's next buffer: a free one, a new one within the bound, or
 * wait for a sender to give one back. NULL on a failure (set, or ENOMEM
 * set here). */
static unsigned char *push_part_buffer(struct push_part_job *j)
{
	unsigned char *buf = NULL;

	pthread_mutex_lock(&j->lock);
	while (!j->err && !j->nfree && j->nbufs >= push_part_bufs(j))
		if (!push_part_md5_ahead(j))
			pthread_cond_wait(&j->cond, &j->lock);
	if (j->err)
		goto out;
	if (j->nfree) {
		buf = j->free[--j->nfree];
		goto out;
	}
	j->nbufs++;
	pthread_mutex_unlock(&j->lock);
	buf = malloc((size_t)j->part_size);
	pthread_mutex_lock(&j->lock);
	if (!buf) {
		j->nbufs--;
		push_part_fail_locked(j, -ENOMEM, "buffer");
	}
out:
	pthread_mutex_unlock(&j->lock);
	return buf;
}

/* Send part i from buf; on a failure set err. The buffer goes back. */
static void push_part_send(struct push_part_job *j, unsigned i,
			   unsigned char *buf)
{
	struct objstore_digests dig = { .flags = OBJSTORE_DIG_MD5 };
	int ret;

	memcpy(dig.md5, j->md5s[i], 16);
	ret = objstore_upload_part_ex(j->up, i + 1, buf,
				      (size_t)push_part_len(j, i), &dig);
	pthread_mutex_lock(&j->lock);
	if (ret)
		push_part_fail_locked(j, ret, "upload");
	push_part_put_locked(j, buf);
	pthread_mutex_unlock(&j->lock);
}

/* With lock held: the oldest queued part no one is busy with, out of the
 * queue, or NULL. */
static struct push_part_queued *push_part_next(struct push_part_job *j,
					       struct push_part_queued *out)
{
	unsigned best = j->nqueue;

	for (unsigned k = 0; k < j->nqueue; k++)
		if (!j->queue[k].busy &&
		    (best == j->nqueue || j->queue[k].i < j->queue[best].i))
			best = k;
	if (best == j->nqueue)
		return NULL;
	*out = j->queue[best];
	j->queue[best] = j->queue[--j->nqueue];
	return out;
}

static void *push_part_sender(void *arg)
{
	struct push_part_helper *h = arg;
	struct push_part_job *j = h->j;

	pthread_mutex_lock(&j->lock);
	for (;;) {
		struct push_part_queued q;
		int ret = 0;

		while (!j->err && !push_part_next(j, &q)) {
			if (j->read_done && !j->nqueue)
				goto out; /* every part sent or on its way */
			pthread_cond_wait(&j->cond, &j->lock);
		}
		if (j->err)
			break;
		pthread_mutex_unlock(&j->lock);
		if (!q.md5)
			ret = push_part_md5(j, q.i, q.buf);
		if (!ret) {
			push_part_send(j, q.i, q.buf);
		} else {
			pthread_mutex_lock(&j->lock);
			push_part_fail_locked(j, ret, "hash");
			push_part_put_locked(j, q.buf);
			pthread_mutex_unlock(&j->lock);
		}
		pthread_mutex_lock(&j->lock);
	}
out:
	pthread_mutex_unlock(&j->lock);
	/* its place goes back at once, to a file still being read */
	atomic_fetch_add(&j->p->part_helpers, 1);
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

/* Start up to want more senders, as the budget and j->cap allow. Only the
 * reader calls this. A sender whose thread cannot be had gives its place
 * back; the file goes on with fewer. */
static void push_part_grow(struct push_part_job *j, unsigned want)
{
	unsigned took;

	if (j->nhelpers >= j->cap)
		return;
	if (want > j->cap - j->nhelpers)
		want = j->cap - j->nhelpers;
	took = push_part_take(j->p, want);
	for (unsigned k = 0; k < took; k++) {
		struct push_part_helper *h = &j->helpers[j->nhelpers];

		h->j = j;
		if (pthread_create(&h->t, NULL, push_part_sender, h)) {
			atomic_fetch_add(&j->p->part_helpers, took - k);
			return;
		}
		j->nhelpers++;
	}
}

/* The reader: every part in order, read, hashed and queued (or sent here
 * when the file has no sender). Stops at the first failure. */
static void push_part_reader(struct push_part_job *j)
{
	for (unsigned i = 0; i < j->nparts; i++) {
		uint64_t len = push_part_len(j, i);
		const char *what = "read";
		unsigned char *buf;
		int ret;

		if (j->nparts - i >= 2)
			push_part_grow(j, j->nhelpers ? 1 : PUSH_PART_CREW);
		buf = push_part_buffer(j);
		if (!buf)
			break;
		ret = push_part_read(j->fd, buf, len,
				     (uint64_t)i * j->part_size);
		if (!ret && sha256_update(&j->sha, buf, (size_t)len)) {
			what = "hash";
			ret = -ENOMEM;
		}
		if (!ret && !j->nhelpers && push_part_md5(j, i, buf)) {
			what = "hash";
			ret = -ENOMEM;
		}
		pthread_mutex_lock(&j->lock);
		if (ret || j->err) {
			push_part_fail_locked(j, ret, what);
			push_part_put_locked(j, buf);
			pthread_mutex_unlock(&j->lock);
			break;
		}
		if (!j->nhelpers) {
			pthread_mutex_unlock(&j->lock);
			push_part_send(j, i, buf);
			continue;
		}
		j->queue[j->nqueue++] =
			(struct push_part_queued){ .i = i, .buf = buf };
		pthread_cond_broadcast(&j->cond);
		pthread_mutex_unlock(&j->lock);
	}
	pthread_mutex_lock(&j->lock);
	j->read_done = true;
	pthread_cond_broadcast(&j->cond);
	/* nothing left to read: take the MD5s the senders have not reached */
	while (!j->err && push_part_md5_ahead(j))
		;
	pthread_mutex_unlock(&j->lock);
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
	unsigned char extra;
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
	j.md5s = calloc(j.nparts ? j.nparts : 1, sizeof(*j.md5s));
	j.cap = j.nparts < PUSH_PART_MAX_HELPERS ? j.nparts
						 : PUSH_PART_MAX_HELPERS;
	j.helpers = calloc(j.cap ? j.cap : 1, sizeof(*j.helpers));
	/* room for every buffer the pool may hold (push_part_bufs) */
	j.qcap = 2 * j.cap + 1;
	j.queue = calloc(j.qcap, sizeof(*j.queue));
	j.free = calloc(j.qcap, sizeof(*j.free));
	if (!j.md5s || !j.helpers || !j.queue || !j.free ||
	    sha256_init(&j.sha)) {
		*what = "buffer";
		ret = -ENOMEM;
		goto out;
	}
	push_part_reader(&j);
	for (unsigned i = 0; i < j.nhelpers; i++)
		pthread_join(j.helpers[i].t, NULL);
	ret = j.err;
	*what = j.what;
	/* grown, shrunk or written while read: not published */
	if (!ret && (pread(fd, &extra, 1, (off_t)f->size) > 0 ||
		     fstat(fd, &st2) || push_moved(st1, &st2)))
		ret = -EAGAIN;
	if (ret)
		goto out;
	ret = sha256_final(&j.sha, f->sha);
	if (ret) {
		*what = "hash";
		goto out;
	}
	push_part_etag(&j, etag, etag_cap);
	ret = objstore_upload_commit(j.up, f->size);
	j.up = NULL; /* freed by commit, always */
	if (ret)
		*what = "commit";
	else
		push_part_stamp(p, f, etag, etag_cap);
out:
	objstore_upload_abort(j.up);
	sha256_release(&j.sha);
	for (unsigned k = 0; j.queue && k < j.nqueue; k++)
		free(j.queue[k].buf); /* read, not sent: after a failure */
	for (unsigned k = 0; j.free && k < j.nfree; k++)
		free(j.free[k]);
	free(j.queue);
	free(j.free);
	free(j.md5s);
	free(j.helpers);
	pthread_cond_destroy(&j.cond);
	pthread_mutex_destroy(&j.lock);
	return ret;
}
