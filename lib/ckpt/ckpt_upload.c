// SPDX-License-Identifier: MIT
/*
 * ckpt_upload: the overlapped upload (part of the ckpt module, see
 * ckpt_i.h). While an application writes a large checkpoint, the part-sized
 * ranges it has moved past are sent to the store as parts of an upload
 * (objstore_upload_*), so that its close waits only for the tail, any part
 * it changed again, and the commit.
 *
 * Per entry (struct ckpt_upstate, under the entry's lock):
 *
 *   IDLE --the highest byte written passes s3.multipart_threshold and a
 *          whole part--> STARTING (a begin job queued)
 *   STARTING --begin ok--> OPEN (the journal record notes the upload id)
 *            --begin failed--> FAILED (the close uploads the whole file)
 *   OPEN: part k is queued once the highest byte written is past its end;
 *         a write or truncate touching a part bumps its gen, so a part
 *         sent before (or while) it changed is sent again by the close
 *   OPEN/FAILED --ckpt_upload_finish (the publish)--> IDLE, committed
 *               --ckpt_upload_drain (last close, unlink)--> IDLE, aborted
 *
 * Pace: a write waits (ckpt_upload_pace, the entry's lock released in
 * the wait) while more than CKPT_PACE_PARTS of its file's parts are queued
 * or in flight: a writer faster than the store is held to the store's
 * speed, which costs it nothing overall (the close would wait for the
 * backlog), and the close then waits for about one part and the commit.
 *
 * Invariant: nothing reaches the final key before ckpt_upload_finish
 * commits, and that runs only inside the publish (close or fsync), after
 * the content is final and its SHA-256 recorded. A part job reads the
 * local file without the entry's lock; the gen it saw under the lock says
 * whether what it sent may be stale.
 *
 * Hashing behind the writer: the SHA-256 of the in-order written prefix
 * [0, hash_end) is computed by a hash job (one per entry at a time,
 * hash_running) reading the local copy, not on the writer's request, so the
 * write returns without it. A write or truncate below hash_end waits for
 * that job, then drops the running hash (the publish hashes the whole file).
 *
 * Jobs: a FIFO (ck->upq_head, upq_lock, a leaf lock: no other lock is taken
 * while holding it) served by a few threads. A job takes the entry's lock
 * only briefly, never across a request. An entry is not freed while jobs
 * of it are queued or running (u.busy, waited for by ckpt_upload_drain at
 * the last close).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/sha256.h"

#define CKPT_UPLOADERS 4
/* Parts of one file queued or in flight before its writer waits: a
 * writer faster than the store stays about one part ahead of it, so its
 * close waits for the tail, not for a backlog the size of the file. 2
 * (one sending, one ready): 2 GiB to radosgw closed 0.11 s after the last
 * write against 0.11 s for one part alone, and 0.25 s with 4
 * (bench/results/history/issue17-full-runs-2026-12-01-to-02.md); the
 * open-to-close time was the same. */
#define CKPT_PACE_PARTS 2
#define CKPT_MAX_PARTS 10000 /* S3's limit */
#define CKPT_JOB_HASH UINT_MAX /* a job that hashes behind the writer */
#define CKPT_HASH_CHUNK (4u << 20)

struct ckpt_upjob {
	struct ckpt_upjob *next;
	struct ckpt_ent *e;
	unsigned partno; /* 0: begin the upload; CKPT_JOB_HASH: hash */
};

/* Queue a job for e (e->lock held). Returns 0 or -ENOMEM. */
static int ckpt_upload_queue(struct ckpt *ck, struct ckpt_ent *e,
			     unsigned partno)
{
	struct ckpt_upjob *j = calloc(1, sizeof(*j));

	if (!j)
		return -ENOMEM;
	j->e = e;
	j->partno = partno;
	e->u.busy++;
	pthread_mutex_lock(&ck->upq_lock);
	if (ck->upq_tail)
		ck->upq_tail->next = j;
	else
		ck->upq_head = j;
	ck->upq_tail = j;
	pthread_cond_signal(&ck->upq_cond);
	pthread_mutex_unlock(&ck->upq_lock);
	return 0;
}

/* Room for part index idx in e->u.parts (e->lock held). */
static int ckpt_upload_slot(struct ckpt_ent *e, unsigned idx)
{
	size_t old = e->u.cap;

	if (grow_array(&e->u.parts, &e->u.cap, (size_t)idx + 1,
		       sizeof(*e->u.parts), 64))
		return -ENOMEM;
	memset(e->u.parts + old, 0, (e->u.cap - old) * sizeof(*e->u.parts));
	return 0;
}

/* Back to IDLE (e->lock held, nothing busy); the upload is gone. */
static void ckpt_upload_reset(struct ckpt_ent *e)
{
	free(e->u.parts);
	free(e->u.key);
	e->u.parts = NULL;
	e->u.key = NULL;
	e->u.cap = 0;
	e->u.up = NULL;
	e->u.state = CKPT_UP_IDLE;
	e->u.hi = 0;
	e->u.next = 0;
	e->u.cancel = false;
}

static void ckpt_upload_touch(struct ckpt_ent *e, uint64_t from, uint64_t to)
{
	if (!e->u.ps || to <= from)
		return;
	for (uint64_t k = from / e->u.ps; k < e->u.cap && k * e->u.ps < to; k++)
		e->u.parts[k].gen++;
}

void ckpt_upload_wrote(struct ckpt *ck, struct ckpt_ent *e, uint64_t off,
		       uint64_t len)
{
	uint64_t end = off + len, ps;
	unsigned passed;

	if (e->u.state != CKPT_UP_IDLE)
		ckpt_upload_touch(e, off, end);
	if (end > e->u.hi)
		e->u.hi = end;
	if (!ck->n_uploaders || e->u.state == CKPT_UP_FAILED ||
	    e->u.hi < ck->cfg->s3_multipart_threshold)
		return;
	if (e->u.state == CKPT_UP_IDLE) {
		e->u.ps = ck->cfg->s3_part_size; /* objstore_upload_begin's */
		if (e->u.hi < e->u.ps || ckpt_upload_queue(ck, e, 0))
			return;
		e->u.state = CKPT_UP_STARTING;
	}
	ps = e->u.ps;
	passed = e->u.hi / ps > CKPT_MAX_PARTS ? CKPT_MAX_PARTS
					       : (unsigned)(e->u.hi / ps);
	for (; e->u.next < passed; e->u.next++) {
		unsigned k = e->u.next;

		if (ckpt_upload_slot(e, k))
			return;
		if (e->u.parts[k].busy)
			continue;
		if (ckpt_upload_queue(ck, e, k + 1))
			return;
		e->u.parts[k].busy = true;
		e->u.parts_out++;
	}
}

void ckpt_upload_pace(struct ckpt_ent *e)
{
	while ((e->u.state == CKPT_UP_OPEN || e->u.state == CKPT_UP_STARTING) &&
	       !e->u.cancel && e->u.parts_out > CKPT_PACE_PARTS)
		pthread_cond_wait(&e->u.cond, &e->lock);
}

void ckpt_upload_truncated(struct ckpt_ent *e, uint64_t old, uint64_t size)
{
	if (e->u.state == CKPT_UP_IDLE)
		return;
	ckpt_upload_touch(e, size < old ? size : old, size < old ? old : size);
	if (size < e->u.hi)
		e->u.hi = size;
	if (e->u.ps && e->u.next > size / e->u.ps)
		e->u.next = (unsigned)(size / e->u.ps);
}

void ckpt_upload_hash(struct ckpt *ck, struct ckpt_ent *e)
{
	/* A chunk at a time (fewer wake-ups); the publish hashes the rest. */
	if (!e->hctx.ctx || e->hash_running ||
	    e->hash_end - e->hashed < CKPT_HASH_CHUNK || !ck->n_uploaders ||
	    ckpt_upload_queue(ck, e, CKPT_JOB_HASH))
		return;
	e->hash_running = true;
}

void ckpt_upload_hash_wait(struct ckpt_ent *e)
{
	while (e->hash_running)
		pthread_cond_wait(&e->u.cond, &e->lock);
}

void ckpt_upload_quiesce(struct ckpt_ent *e)
{
	while (e->u.busy)
		pthread_cond_wait(&e->u.cond, &e->lock);
}

void ckpt_upload_note(struct ckpt_ent *e, struct ckpt_rec *rec)
{
	rec->upload_id[0] = rec->upload_key[0] = '\0';
	if (e->u.state != CKPT_UP_OPEN)
		return;
	snprintf(rec->upload_id, sizeof(rec->upload_id), "%s",
		 objstore_upload_id(e->u.up));
	snprintf(rec->upload_key, sizeof(rec->upload_key), "%s", e->u.key);
}

void ckpt_upload_drain(struct ckpt *ck, struct ckpt_ent *e)
{
	(void)ck;
	e->u.cancel = true;
	ckpt_upload_quiesce(e);
	objstore_upload_abort(e->u.up);
	ckpt_upload_reset(e);
}

/*
 * x-amz-meta-sha256 on key, just committed from parts begun before its
 * hash was known, if it is still the version etag (a copy onto itself, in
 * parts above s3.copy_threshold: the ETag may change, and the publish
 * records the one a HEAD finds afterwards). A failure is only logged: the
 * object is whole and its sidecar holds the hash.
 */
static void ckpt_upload_stamp(struct ckpt *ck, const char *key,
			      const char *etag, const char *sha)
{
	int ret = objstore_set_sha256(ck->os, key, etag, sha, NULL);

	if (ret == -EFBIG)
		log_info("checkpoints: %s is larger than S3 copies, even in "
			 "10,000 parts: its SHA-256 is kept in its sidecar "
			 "only, not as x-amz-meta-sha256",
			 key);
	else if (ret == -ESTALE)
		log_warn("checkpoints: %s was replaced in %s after this node "
			 "stored it: its SHA-256 is not recorded as "
			 "x-amz-meta-sha256 on the other version",
			 key, ckpt_url(ck));
	else if (ret)
		log_warn("checkpoints: cannot record the SHA-256 of %s as "
			 "x-amz-meta-sha256 in %s: %s; the object is stored "
			 "and its sidecar holds the hash",
			 key, ckpt_url(ck), strerror(-ret));
}

int ckpt_upload_finish(struct ckpt *ck, struct ckpt_ent *e, const char *key,
		       uint64_t size, const char *sha)
{
	char etag[OBJSTORE_ETAG_MAX] = "";
	struct objstore_upload *up = e->u.up;
	uint64_t ps = e->u.ps, n = ps ? (size + ps - 1) / ps : 0;
	unsigned early = 0;
	int ret = 0;

	if (e->u.state != CKPT_UP_OPEN || strcmp(e->u.key, key) ||
	    n > CKPT_MAX_PARTS || ckpt_upload_slot(e, (unsigned)n)) {
		/* Never begun, begin failed, renamed since, or too many
		 * parts: the whole file goes up in one upload. */
		objstore_upload_abort(up);
		ckpt_upload_reset(e);
		return 1;
	}
	for (uint64_t k = 0; k < n && !ret; k++) {
		struct ckpt_part *p = &e->u.parts[k];
		uint64_t len = k + 1 < n ? ps : size - k * ps;

		/* Sent parts are whole parts: a shorter last one is new. */
		if (p->sent && p->sent_gen == p->gen && len == ps) {
			early++;
			continue;
		}
		if (k > 0) /* parts 1 to k are in the store, not this one */
			ckpt_test_crash("mid-upload");
		ret = objstore_upload_part_fd(up, (unsigned)k + 1, e->fd,
					      k * ps, len);
	}
	if (ret) {
		objstore_upload_abort(up);
	} else {
		ckpt_test_crash("mid-upload"); /* every part sent early */
		ret = objstore_upload_commit_etag(up, size, etag);
	}
	if (!ret) {
		if (ck->cfg->ckpt_stamp_sha256)
			ckpt_upload_stamp(ck, key, etag, sha);
		log_debug("checkpoints: %s: %u of %" PRIu64 " parts were sent "
			  "while it was written",
			  key, early, n);
	}
	ckpt_upload_reset(e);
	return ret;
}

/* ---- the uploader threads ---- */

/* Begin e's upload (job 0). */
static void ckpt_upload_begin_job(struct ckpt *ck, struct ckpt_ent *e)
{
	struct objstore_upload *up = NULL;
	struct ckpt_rec rec = { .state = 'W' };
	char *key;
	int ret;

	pthread_mutex_lock(&e->lock);
	pthread_mutex_lock(&ck->lock);
	key = e->u.cancel || e->unlinked ? NULL : strdup(e->key);
	pthread_mutex_unlock(&ck->lock);
	pthread_mutex_unlock(&e->lock);
	ret = key ? objstore_upload_begin(ck->os, key, 0, NULL, &up)
		  : -ECANCELED;
	pthread_mutex_lock(&e->lock);
	if (!ret && (e->u.cancel || objstore_upload_part_size(up) != e->u.ps)) {
		objstore_upload_abort(up);
		ret = -ECANCELED;
	}
	if (ret) {
		if (ret != -ECANCELED)
			log_warn(
				"checkpoints: cannot start sending %s while it "
				"is written (%s): it is uploaded whole when "
				"closed",
				key, strerror(-ret));
		e->u.state = CKPT_UP_FAILED;
		free(key);
	} else {
		e->u.up = up;
		e->u.key = key;
		e->u.state = CKPT_UP_OPEN;
		/* A crash from here on leaves an open upload: note its id
		 * so that the restart aborts it. */
		pthread_mutex_lock(&ck->lock);
		snprintf(rec.key, sizeof(rec.key), "%s", e->key);
		pthread_mutex_unlock(&ck->lock);
		ckpt_upload_note(e, &rec);
		ckpt_journal_write(&ck->dirs, e->ino, &rec, true);
	}
	e->u.busy--;
	pthread_cond_broadcast(&e->u.cond);
	pthread_mutex_unlock(&e->lock);
}

/* Send part partno of e, whole, from the local file. *buf: the thread's
 * part buffer, grown to the part size. */
static void ckpt_upload_part_job(struct ckpt *ck, struct ckpt_ent *e,
				 unsigned partno, char **buf, uint64_t *bufcap)
{
	struct ckpt_part *p;
	struct objstore_upload *up;
	uint64_t ps, got = 0;
	uint32_t gen;
	int ret = -ECANCELED;

	pthread_mutex_lock(&e->lock);
	/* Wait for the begin job, which runs first. */
	while (e->u.state == CKPT_UP_STARTING && !e->u.cancel)
		pthread_cond_wait(&e->u.cond, &e->lock);
	if (e->u.state != CKPT_UP_OPEN || e->u.cancel)
		goto done;
	up = e->u.up;
	ps = e->u.ps;
	gen = e->u.parts[partno - 1].gen;
	pthread_mutex_unlock(&e->lock);

	if (!strncmp(objstore_url(ck->os), "file://", 7)) {
		/* A directory store copies from the file in the kernel; a
		 * change meanwhile is caught by gen as below. (S3 reads it
		 * into memory first: its Content-MD5 must match the body.) */
		ret = objstore_upload_part_fd(up, partno, e->fd,
					      (uint64_t)(partno - 1) * ps, ps);
		goto sent;
	}
	if (*bufcap < ps) {
		free(*buf);
		*buf = malloc(ps);
		*bufcap = *buf ? ps : 0;
	}
	ret = *buf ? 0 : -ENOMEM;
	while (!ret && got < ps) {
		ssize_t r = pread(e->fd, *buf + got, ps - got,
				  (off_t)((partno - 1) * ps + got));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) /* truncated meanwhile: the close sends it */
			ret = r < 0 ? -errno : -ENODATA;
		else
			got += (uint64_t)r;
	}
	if (!ret)
		ret = objstore_upload_part(up, partno, *buf, ps);
sent:
	pthread_mutex_lock(&e->lock);
	p = &e->u.parts[partno - 1];
	if (!ret) {
		p->sent = true;
		p->sent_gen = gen;
	} else {
		p->sent = false; /* the close sends it */
	}
done:
	e->u.parts[partno - 1].busy = false;
	e->u.parts_out--;
	e->u.busy--;
	pthread_cond_broadcast(&e->u.cond);
	pthread_mutex_unlock(&e->lock);
}

/* Hash [e->hashed, e->hash_end) from the local copy into e->hctx, in
 * chunks, until it has caught up with the writer. Writes below hash_end
 * wait for this job (ckpt_file_pwrite), so the bytes read are final. */
static void ckpt_upload_hash_job(struct ckpt_ent *e, char **buf,
				 uint64_t *bufcap)
{
	int ret = 0;

	if (*bufcap < CKPT_HASH_CHUNK) {
		free(*buf);
		*buf = malloc(CKPT_HASH_CHUNK);
		*bufcap = *buf ? CKPT_HASH_CHUNK : 0;
	}
	pthread_mutex_lock(&e->lock);
	while (*buf && !ret && e->hctx.ctx && !e->u.cancel &&
	       e->hashed < e->hash_end) {
		uint64_t from = e->hashed, to = e->hash_end;

		if (to - from > CKPT_HASH_CHUNK)
			to = from + CKPT_HASH_CHUNK;
		pthread_mutex_unlock(&e->lock);
		while (!ret && from < to) {
			ssize_t r = pread(e->fd, *buf, (size_t)(to - from),
					  (off_t)from);

			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0 || sha256_update(&e->hctx, *buf, (size_t)r))
				ret = -EIO;
			else
				from += (uint64_t)r;
		}
		pthread_mutex_lock(&e->lock);
		if (!ret)
			e->hashed = to;
	}
	if (ret) { /* the publish hashes the whole file */
		sha256_release(&e->hctx);
	}
	e->hash_running = false;
	e->u.busy--;
	pthread_cond_broadcast(&e->u.cond);
	pthread_mutex_unlock(&e->lock);
}

static void *ckpt_upload_main(void *arg)
{
	struct ckpt *ck = arg;
	char *buf = NULL;
	uint64_t cap = 0;

	for (;;) {
		struct ckpt_upjob *j;

		pthread_mutex_lock(&ck->upq_lock);
		while (!ck->upq_head && !ck->up_stop)
			pthread_cond_wait(&ck->upq_cond, &ck->upq_lock);
		j = ck->up_stop ? NULL : ck->upq_head;
		if (j) {
			ck->upq_head = j->next;
			if (!ck->upq_head)
				ck->upq_tail = NULL;
		}
		pthread_mutex_unlock(&ck->upq_lock);
		if (!j)
			break;
		if (j->partno == CKPT_JOB_HASH)
			ckpt_upload_hash_job(j->e, &buf, &cap);
		else if (j->partno == 0)
			ckpt_upload_begin_job(ck, j->e);
		else
			ckpt_upload_part_job(ck, j->e, j->partno, &buf, &cap);
		free(j);
	}
	free(buf);
	return NULL;
}

int ckpt_upload_start(struct ckpt *ck)
{
	for (unsigned i = 0; i < CKPT_UPLOADERS; i++) {
		if (pthread_create(&ck->uploaders[i], NULL, ckpt_upload_main,
				   ck))
			break;
		ck->n_uploaders++;
	}
	if (!ck->n_uploaders)
		log_warn("checkpoints: no uploader thread: files are uploaded "
			 "when closed");
	return 0;
}

void ckpt_upload_stop(struct ckpt *ck)
{
	pthread_mutex_lock(&ck->upq_lock);
	ck->up_stop = true;
	pthread_cond_broadcast(&ck->upq_cond);
	pthread_mutex_unlock(&ck->upq_lock);
	for (unsigned i = 0; i < ck->n_uploaders; i++)
		pthread_join(ck->uploaders[i], NULL);
	ck->n_uploaders = 0;
	/* Jobs left (entries still open at shutdown) are dropped. */
	while (ck->upq_head) {
		struct ckpt_upjob *j = ck->upq_head;

		ck->upq_head = j->next;
		free(j);
	}
	ck->upq_tail = NULL;
}
