// SPDX-License-Identifier: MIT
/*
 * ckpt_recover: what a restart and the retry thread do with the journal
 * (part of the ckpt module, see ckpt_i.h): closed files not yet published
 * (P records) are published, files never closed (W records) are moved to
 * abandoned/ and reported, records without a file are dropped.
 *
 * Retry thread: RUNNING (every checkpoints.retry_interval, when
 * ck->pending says P records are waiting: a scan that publishes them) ->
 * STOPPED by ckpt_retry_stop (ck->stop under ck->lock, ck->cond).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "util/fdutil.h"

/*
 * Publish the P record rec of the closed file ino: it becomes a listed
 * entry while it is published, so that a rename or unlink waits for it.
 */
static void ckpt_republish(struct ckpt *ck, ino_t ino,
			   const struct ckpt_rec *rec)
{
	struct ckpt_ent *e = NULL;
	struct stat st;
	int fd, ret;

	pthread_mutex_lock(&ck->open_lock);
	pthread_mutex_lock(&ck->lock);
	ret = ckpt_is_open_locked(ck, rec->key);
	pthread_mutex_unlock(&ck->lock);
	if (ret) { /* its writer publishes it */
		pthread_mutex_unlock(&ck->open_lock);
		return;
	}
	fd = openat(ck->dirs.tree_fd, rec->key,
		    O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0 && (fstat(fd, &st) || st.st_ino != ino)) {
		close(fd);
		fd = -1;
	}
	if (fd >= 0)
		e = ckpt_ent_new(rec->key, fd);
	if (!e) {
		if (fd >= 0)
			close(fd);
		pthread_mutex_unlock(&ck->open_lock);
		return;
	}
	e->dirty = true;
	pthread_mutex_lock(&ck->lock);
	e->next = ck->ents;
	ck->ents = e;
	pthread_mutex_unlock(&ck->lock);
	pthread_mutex_unlock(&ck->open_lock);
	ret = ckpt_ent_publish(ck, e, rec->sha);
	if (!ret)
		log_info("checkpoints: %s published to %s (retried)", rec->key,
			 ckpt_url(ck));
	ckpt_ent_put(ck, e, false); /* a failure leaves it P: counted pending */
}

/*
 * A record naming an upload in parts (a crash while the file was sent):
 * abort it in the store, so that no multipart upload stays open forever,
 * and drop the note from the record. Its file is then handled as any other
 * (a W record abandoned, a P record published whole).
 */
static void ckpt_abort_left_upload(struct ckpt *ck, ino_t ino,
				   struct ckpt_rec *rec)
{
	int ret = objstore_upload_abort_id(ck->os, rec->upload_key,
					   rec->upload_id);

	if (ret) {
		log_error("checkpoints: cannot abort the unfinished upload %s "
			  "of %s in %s: %s; a later start tries again (a "
			  "lifecycle rule AbortIncompleteMultipartUpload on "
			  "the bucket also removes it)",
			  rec->upload_id, rec->upload_key, ckpt_url(ck),
			  strerror(-ret));
		return;
	}
	log_info("checkpoints: aborted the unfinished upload of %s to %s "
		 "(dstagefs stopped while sending it)",
		 rec->upload_key, ckpt_url(ck));
	rec->upload_id[0] = rec->upload_key[0] = '\0';
	ckpt_journal_write(&ck->dirs, ino, rec, true);
}

int ckpt_journal_scan(struct ckpt *ck, bool recovery, bool publish)
{
	struct ckpt_rec rec;
	struct dirent *de;
	uint64_t used = 0;
	unsigned pending = 0, abandoned = 0;
	DIR *d;
	int ret = fdutil_opendir(ck->dirs.journal_fd, &d);

	if (ret)
		return ret;
	if (publish) {
		pthread_mutex_lock(&ck->lock);
		ck->pending = 0; /* failures count themselves again */
		pthread_mutex_unlock(&ck->lock);
	}
	while ((de = readdir(d))) {
		struct stat st;
		ino_t ino;

		if (ckpt_journal_name(de->d_name, &ino))
			continue;
		if (recovery && !ckpt_journal_read(&ck->dirs, ino, &rec) &&
		    rec.upload_id[0])
			ckpt_abort_left_upload(ck, ino, &rec);
		if (ckpt_journal_live(&ck->dirs, ino, &rec, &st)) {
			ckpt_journal_remove(&ck->dirs, ino);
			continue;
		}
		if (rec.state == 'W' && recovery) {
			abandoned++;
			ckpt_journal_abandon(ck, ino, rec.key,
					     "it was being written when "
					     "dstagefs stopped (never closed)");
			continue;
		}
		used += (uint64_t)st.st_size;
		if (rec.state != 'P')
			continue;
		if (publish)
			ckpt_republish(ck, ino, &rec);
		else
			pending++;
	}
	closedir(d);
	pthread_mutex_lock(&ck->lock);
	if (recovery)
		ck->used = used;
	if (!publish)
		ck->pending = pending;
	pthread_mutex_unlock(&ck->lock);
	if (recovery && (pending || abandoned))
		log_info("checkpoints: %u closed file(s) to publish, %u never "
			 "closed (kept, not published)",
			 pending, abandoned);
	return 0;
}

static void *ckpt_retry_main(void *arg)
{
	struct ckpt *ck = arg;
	bool first = true;

	pthread_mutex_lock(&ck->lock);
	while (!ck->stop) {
		struct timespec ts;
		unsigned ms = ck->cfg->ckpt_retry_ms;

		if (!(first && ck->pending)) {
			timeutil_real_after_ms(&ts, ms);
			pthread_cond_timedwait(&ck->cond, &ck->lock, &ts);
		}
		first = false;
		if (ck->stop)
			continue;
		/* abandoned/ counts until removed (by gc, by hand) */
		pthread_mutex_unlock(&ck->lock);
		ckpt_abandoned_count(ck);
		pthread_mutex_lock(&ck->lock);
		if (ck->stop || !ck->pending)
			continue;
		pthread_mutex_unlock(&ck->lock);
		ckpt_journal_scan(ck, false, true);
		pthread_mutex_lock(&ck->lock);
	}
	pthread_mutex_unlock(&ck->lock);
	return NULL;
}

int ckpt_retry_start(struct ckpt *ck)
{
	int ret = pthread_create(&ck->retry_thread, NULL, ckpt_retry_main, ck);

	if (ret)
		return -ret;
	ck->retry_running = true;
	return 0;
}

void ckpt_retry_stop(struct ckpt *ck)
{
	if (!ck->retry_running)
		return;
	pthread_mutex_lock(&ck->lock);
	ck->stop = true;
	pthread_cond_signal(&ck->cond);
	pthread_mutex_unlock(&ck->lock);
	pthread_join(ck->retry_thread, NULL);
	ck->retry_running = false;
}

void ckpt_retry(struct ckpt *ck)
{
	pthread_mutex_lock(&ck->lock);
	if (ck->pending)
		pthread_cond_signal(&ck->cond);
	pthread_mutex_unlock(&ck->lock);
}
