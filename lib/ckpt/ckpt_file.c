// SPDX-License-Identifier: MIT
/*
 * ckpt_file: open checkpoint files, their writes, and the publish.
 *
 * An entry (struct ckpt_ent, ckpt_i.h) is shared by every handle of one
 * local file and listed in ck->ents while open; a file only read from the
 * store gets a private, unlisted entry (fd -1) read with If-Match on the
 * ETag it was opened at. Entry states: clean -> dirty (write, truncate,
 * create; the journal record turns W) -> clean (ckpt_put succeeded: C).
 * A failed publish leaves the record P: ckpt_retry or a restart publishes
 * it once the last handle is closed. A dirty file closed without a
 * publish attempt (its writer was killed) keeps its W record and is moved
 * to abandoned/: never published.
 *
 * Locks: see ckpt_i.h (open_lock, then e->lock, then ns_lock, then
 * ck->lock).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/log.h"
#include "dstage/metrics.h"
#include "dstage/sha256.h"
#include "util/fdutil.h"
#include "util/strutil.h"

#define CKPT_IO_CHUNK (4u << 20)

static void ckpt_ent_free(struct ckpt_ent *e)
{
	if (!e)
		return;
	if (e->fd >= 0)
		close(e->fd);
	sha256_release(&e->hctx);
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->u.cond);
	free(e->u.parts);
	free(e->u.key);
	free(e->key);
	free(e);
}

/* Start hashing e as it is written (it is empty now). e->lock held. */
static void ckpt_hash_start(struct ckpt_ent *e)
{
	sha256_release(&e->hctx);
	sha256_init(&e->hctx); /* failed: no hctx, the publish hashes all */
	e->hashed = 0;
	e->hash_end = 0;
}

static void ckpt_hash_stop(struct ckpt_ent *e)
{
	sha256_release(&e->hctx);
}

/* What closing the last handle of a dirty file leaves behind. */
static void ckpt_ent_orphan(struct ckpt *ck, struct ckpt_ent *e)
{
	struct ckpt_rec rec;
	bool listed;

	if (!ckpt_journal_read(&ck->dirs, e->ino, &rec) && rec.state == 'P') {
		pthread_mutex_lock(&ck->lock);
		ck->pending++;
		pthread_mutex_unlock(&ck->lock);
		return;
	}
	pthread_mutex_lock(&ck->open_lock);
	pthread_mutex_lock(&ck->lock);
	listed = ckpt_is_open_locked(ck, e->key);
	pthread_mutex_unlock(&ck->lock);
	if (!listed)
		ckpt_journal_abandon(ck, e->ino, e->key,
				     "its writer closed it without publishing "
				     "(killed?)");
	pthread_mutex_unlock(&ck->open_lock);
}

void ckpt_ent_put(struct ckpt *ck, struct ckpt_ent *e, bool write)
{
	struct stat st;
	bool last;

	pthread_mutex_lock(&ck->lock);
	last = --e->refs == 0;
	if (write)
		e->writers--;
	if (last && !e->unlinked && e->fd >= 0) {
		for (struct ckpt_ent **pp = &ck->ents; *pp; pp = &(*pp)->next) {
			if (*pp == e) {
				*pp = e->next;
				break;
			}
		}
	}
	if (last)
		ckpt_store_uncharge_locked(ck, e);
	pthread_mutex_unlock(&ck->lock);
	if (!last)
		return;
	if (e->fd >= 0) {
		/* An upload still open was never published: abort it. */
		pthread_mutex_lock(&e->lock);
		ckpt_upload_drain(ck, e);
		pthread_mutex_unlock(&e->lock);
	}
	if (e->space_at_close && !fstat(e->fd, &st)) {
		ckpt_space(ck, e->uid, -(int64_t)st.st_size);
		ckpt_files(ck, e->uid, -1);
	}
	if (e->dirty && !e->unlinked && e->fd >= 0)
		ckpt_ent_orphan(ck, e);
	ckpt_ent_free(e);
}

/* ---- the publish ---- */

/* The SHA-256 of fd's size bytes; from hctx (of [0, from)) when given. */
static int ckpt_sha256_fd(int fd, uint64_t size, const struct sha256 *hctx,
			  uint64_t from, char hex[CKPT_SHA_HEX])
{
	struct sha256 h = { 0 };
	unsigned char md[SHA256_LEN];
	uint64_t off = hctx ? from : 0;
	char *buf = malloc(CKPT_IO_CHUNK);
	int ret = buf ? 0 : -ENOMEM;

	if (!ret)
		ret = hctx ? sha256_copy(&h, hctx) : sha256_init(&h);
	if (ret)
		goto out;
	while (off < size) {
		size_t want =
			size - off < CKPT_IO_CHUNK ? size - off : CKPT_IO_CHUNK;
		ssize_t r = pread(fd, buf, want, (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			ret = r < 0 ? -errno : -EIO;
			goto out;
		}
		ret = sha256_update(&h, buf, (size_t)r);
		if (ret)
			goto out;
		off += (uint64_t)r;
	}
	ret = sha256_final(&h, md);
	if (!ret)
		strutil_hex(md, SHA256_LEN, hex);
out:
	sha256_release(&h);
	free(buf);
	return ret;
}

int ckpt_put(struct ckpt *ck, struct ckpt_ent *e, int fd, ino_t ino,
	     const char *key, const char *want_sha, const struct sha256 *hctx,
	     uint64_t hashed)
{
	struct ckpt_rec rec = { .state = 'P' };
	struct objstore_info oi;
	char line[CKPT_SHA_HEX + 32], *side = NULL;
	const char *what = "reading the local copy";
	uint64_t t0 = metrics_start();
	struct stat st;
	int ret;

	if (e)
		ckpt_upload_note(e, &rec);
	/* One version at a time goes up: a retry job's publish of an older
	 * one finishes first, so this one lands last. */
	what = "waiting for the stager daemon's publish of it";
	ret = ckpt_lock_publish(fd, true);
	if (ret)
		goto err;
	what = "reading the local copy";
	if (fstat(fd, &st)) {
		ret = -errno;
		goto err;
	}
	rec.size = (uint64_t)st.st_size;
	snprintf(rec.key, sizeof(rec.key), "%s", key);
	if (hashed > rec.size)
		hctx = NULL;
	ret = ckpt_sha256_fd(fd, rec.size, hctx, hashed, rec.sha);
	if (ret)
		goto err;
	if (want_sha && *want_sha && strcmp(want_sha, rec.sha)) {
		what = "checking the local copy against its recorded SHA-256";
		ret = -EIO;
		goto err;
	}
	/* its owners, kept here: stored before its bytes, and those that
	 * stay (a failed store) durable before its P record, as the P record
	 * outlives what follows (the daemon or a restart retries) */
	what = "storing what must precede it (its owner records, made "
	       "durable first)";
	ret = ckpt_owner_publishing(ck, key);
	if (ret)
		goto err;
	ckpt_journal_write(&ck->dirs, ino, &rec, false);
	if (e) {
		/* Parts sent while it was written: let them land (the P
		 * record first: the file is closed, whatever happens now). A
		 * begin that finished meanwhile goes in the record. */
		char id[sizeof(rec.upload_id)];

		snprintf(id, sizeof(id), "%s", rec.upload_id);
		ckpt_upload_quiesce(e);
		ckpt_upload_note(e, &rec);
		if (strcmp(id, rec.upload_id))
			ckpt_journal_write(&ck->dirs, ino, &rec, false);
	}
	ckpt_test_crash("upload");
	what = "storing it";
	/* The rest of an upload sent while it was written, else the whole
	 * file. The upload is over either way (a failed one aborted). */
	ret = e ? ckpt_upload_finish(ck, e, key, rec.size, rec.sha) : 1;
	rec.upload_id[0] = rec.upload_key[0] = '\0';
	if (ret == 1)
		ret = objstore_put_fd_sha(ck->os, key, fd, rec.size, rec.sha);
	if (ret)
		goto err;
	ckpt_test_crash("sidecar");
	what = "storing its SHA-256";
	side = ckpt_sidecar_key(key);
	if (!side) {
		ret = -ENOMEM;
		goto err;
	}
	snprintf(line, sizeof(line), "%s  %" PRIu64 "\n", rec.sha, rec.size);
	ret = objstore_put_buf(ck->os, side, line, strlen(line));
	if (ret)
		goto err;
	if (!objstore_head(ck->os, key, &oi))
		snprintf(rec.etag, sizeof(rec.etag), "%s", oi.etag);
	rec.state = 'C';
	ckpt_journal_write(&ck->dirs, ino, &rec, false);
	if (ck->hooks.published)
		ck->hooks.published(ck->hooks.arg, ckpt_url(ck), key, rec.sha,
				    rec.size, rec.etag, st.st_uid);
	ckpt_store_published(ck, e, key, st.st_uid, rec.size);
	metrics_ckpt_publish(0, rec.size, t0);
	ckpt_unlock_publish(fd);
	free(side);
	return 0;
err:
	ckpt_unlock_publish(fd);
	free(side);
	metrics_ckpt_publish(ret, 0, 0);
	/* The local copy must outlive a crash: it is all there is. */
	fsync(fd);
	if (rec.sha[0])
		ckpt_journal_write(&ck->dirs, ino, &rec, true);
	log_error("checkpoints: cannot publish %s to %s (%s): %s; the local "
		  "copy stays in %s/%s/%s and is retried",
		  key, ckpt_url(ck), what, strerror(-ret), ck->dirs.staging,
		  CKPT_TREE, key);
	return ckpt_store_errno(ret);
}

/* ---- opening ---- */

struct ckpt_ent *ckpt_ent_new(const char *key, int fd)
{
	struct ckpt_ent *e = calloc(1, sizeof(*e));
	struct stat st;

	if (!e)
		return NULL;
	e->key = strdup(key);
	if (!e->key) {
		free(e);
		return NULL;
	}
	e->fd = fd;
	e->refs = 1;
	if (fd >= 0 && !fstat(fd, &st)) {
		e->ino = st.st_ino;
		e->uid = st.st_uid;
	}
	/* In use: the lifecycle does not drop it while it is open (a drop
	 * holds it exclusively only for a moment: this waits). */
	if (fd >= 0 && ckpt_lock_use(fd))
		log_warn("checkpoints: cannot lock the local copy of %s: the "
			 "lifecycle could drop it while it is open",
			 key);
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->u.cond, NULL);
	return e;
}

/* Mark e dirty (e->lock held), its record W first. */
static void ckpt_ent_dirty(struct ckpt *ck, struct ckpt_ent *e)
{
	struct ckpt_rec rec = { .state = 'W' };
	bool unlinked;

	pthread_mutex_lock(&ck->lock);
	unlinked = e->unlinked;
	if (!unlinked)
		snprintf(rec.key, sizeof(rec.key), "%s", e->key);
	pthread_mutex_unlock(&ck->lock);
	if (!e->journal_w && !unlinked) {
		ckpt_journal_write(&ck->dirs, e->ino, &rec, false);
		e->journal_w = true;
	}
	e->dirty = true;
	e->gen++;
}

/* Copy key (size bytes, etag) from the store into fd. */
static int ckpt_fetch(struct ckpt *ck, const char *key, int fd, uint64_t size,
		      const char *etag)
{
	char *buf = malloc(CKPT_IO_CHUNK);
	uint64_t off = 0;
	int ret = buf ? 0 : -ENOMEM;

	while (!ret && off < size) {
		size_t got = 0;
		size_t want =
			size - off < CKPT_IO_CHUNK ? size - off : CKPT_IO_CHUNK;

		ret = objstore_get(ck->os, key, off, want, etag, buf, &got);
		if (!ret && got == 0)
			ret = -EIO;
		if (!ret && pwrite(fd, buf, got, (off_t)off) != (ssize_t)got)
			ret = errno ? -errno : -EIO;
		off += got;
	}
	free(buf);
	return ret;
}

/* Open key's existing local copy (1), or 0 when it has none. */
static int ckpt_open_local(struct ckpt *ck, const char *key, int *fd)
{
	struct stat st;
	int ret;

	*fd = fdutil_open_regular(ck->dirs.tree_fd, key,
				  O_RDWR | O_NOFOLLOW | O_CLOEXEC, NULL);
	if (*fd < 0) {
		ret = *fd;
		*fd = -1;
		return ret == -ENOENT ? 0 : ret == -EINVAL ? -EISDIR : ret;
	}
	/* Dropped by the lifecycle between the open and the lock: gone. */
	if (ckpt_lock_use(*fd) || fstat(*fd, &st) || st.st_nlink == 0) {
		close(*fd);
		*fd = -1;
		return 0;
	}
	return 1;
}

/* Empty e for an open with O_TRUNC for writing. */
static int ckpt_ent_trunc0(struct ckpt *ck, struct ckpt_ent *e)
{
	return ckpt_file_truncate(
		&(struct ckpt_file){ .ck = ck, .e = e, .write = true }, 0);
}

/* Start e's write from byte 0: dirty (its record W first), hashing anew. */
static void ckpt_ent_begin_write(struct ckpt *ck, struct ckpt_ent *e)
{
	pthread_mutex_lock(&e->lock);
	ckpt_ent_dirty(ck, e);
	ckpt_hash_start(e);
	pthread_mutex_unlock(&e->lock);
}

/* Create key's local copy (and its parents), opened with O_RDWR | O_CREAT
 * | excl_or_trunc, as a new entry that owns the descriptor. The copy is
 * uid's (its owner: the file's creator): chowned to it, so that a restart
 * and abandoned/ still know whose it is; it counts against uid's
 * checkpoints.uid_files (-EDQUOT). A dstagefs that may not chown keeps
 * its own uid on the file. */
static int ckpt_tree_create(struct ckpt *ck, const char *key, int excl_or_trunc,
			    uid_t uid, struct ckpt_ent **out)
{
	int fd, ret;

	ckpt_neg_clear(ck);
	ret = ckpt_tree_mkparents(ck, key);
	if (ret)
		return ret;
	if (uid != geteuid() && geteuid() != 0)
		uid = geteuid();
	ret = ckpt_files(ck, uid, 1);
	if (ret)
		return ret;
	fd = openat(ck->dirs.tree_fd, key,
		    O_RDWR | O_CREAT | excl_or_trunc | O_NOFOLLOW | O_CLOEXEC,
		    0600);
	if (fd < 0) {
		ret = -errno;
		goto err;
	}
	if (uid != geteuid() && fchown(fd, uid, (gid_t)-1)) {
		ret = -errno;
		log_error("checkpoints: cannot chown the local copy of %s to "
			  "uid %u: %s",
			  key, (unsigned)uid, strerror(-ret));
		goto err;
	}
	*out = ckpt_ent_new(key, fd);
	if (!*out) {
		ret = -ENOMEM;
		goto err;
	}
	return 0;
err:
	if (fd >= 0) {
		close(fd);
		unlinkat(ck->dirs.tree_fd, key, 0);
	}
	ckpt_files(ck, uid, -1);
	return ret;
}

int ckpt_file_open(struct ckpt *ck, const char *key, int flags,
		   struct ckpt_file **out, bool *created)
{
	return ckpt_file_open_as(ck, key, flags, geteuid(), out, created);
}

/* Open key, which has an open entry e (a reference taken): O_EXCL fails,
 * O_TRUNC for writing empties it. */
static int ckpt_file_open_found(struct ckpt *ck, struct ckpt_ent *e, int flags)
{
	bool write = (flags & O_ACCMODE) != O_RDONLY;

	if ((flags & O_CREAT) && (flags & O_EXCL))
		return -EEXIST;
	if (write && (flags & O_TRUNC))
		return ckpt_ent_trunc0(ck, e);
	return 0;
}

/* Key's local copy as a new entry (*out), emptied for a write with
 * O_TRUNC. 0; 1 when the lifecycle dropped the copy meanwhile (the store
 * has it: look again); or -errno. */
static int ckpt_file_open_local(struct ckpt *ck, const char *key, int flags,
				struct ckpt_ent **out)
{
	bool write = (flags & O_ACCMODE) != O_RDONLY;
	struct ckpt_ent *e;
	int fd, ret;

	ret = ckpt_open_local(ck, key, &fd);
	if (ret <= 0)
		return ret ? ret : 1;
	e = ckpt_ent_new(key, fd);
	if (!e) {
		close(fd);
		return -ENOMEM;
	}
	if (write && (flags & O_TRUNC)) {
		ret = ckpt_ent_trunc0(ck, e);
		if (ret) {
			ckpt_ent_free(e);
			return ret;
		}
	}
	*out = e;
	return 0;
}

/* A private entry (fd -1, never listed) for reading key from the store at
 * oi's ETag; NULL when out of memory. */
static struct ckpt_ent *ckpt_ent_private(const char *key,
					 const struct objstore_info *oi)
{
	struct ckpt_ent *e = ckpt_ent_new(key, -1);

	if (!e)
		return NULL;
	snprintf(e->etag, sizeof(e->etag), "%s", oi->etag);
	e->rsize = oi->size;
	e->rmtime = oi->mtime;
	return e;
}

/* Key, which only the store has (oi: its HEAD), opened for writing: a
 * local copy as a new entry (*out), empty and dirty with O_TRUNC, else the
 * store's copy fetched into it (its record C at oi's ETag). */
static int ckpt_file_copy_stored(struct ckpt *ck, const char *key, int flags,
				 uid_t uid, const struct objstore_info *oi,
				 struct ckpt_ent **out)
{
	struct ckpt_rec rec = { .state = 'C', .size = oi->size };
	struct ckpt_ent *e;
	int ret;

	ret = ckpt_tree_create(ck, key, O_TRUNC, uid, &e);
	if (ret)
		return ret;
	if (flags & O_TRUNC) {
		ckpt_ent_begin_write(ck, e);
		*out = e;
		return 0;
	}
	ret = ckpt_space(ck, e->uid, (int64_t)oi->size);
	if (!ret) {
		ret = ckpt_fetch(ck, key, e->fd, oi->size, oi->etag);
		if (ret) /* give the reservation back */
			ckpt_space(ck, e->uid, -(int64_t)oi->size);
	}
	if (ret) {
		ckpt_files(ck, e->uid, -1);
		log_error("checkpoints: cannot copy %s from %s to write it: %s",
			  key, ckpt_url(ck), strerror(-ret));
		ret = ckpt_store_errno(ret);
		unlinkat(ck->dirs.tree_fd, key, 0);
		ckpt_ent_free(e);
		return ret;
	}
	snprintf(rec.etag, sizeof(rec.etag), "%s", oi->etag);
	snprintf(rec.key, sizeof(rec.key), "%s", key);
	ckpt_journal_write(&ck->dirs, e->ino, &rec, false);
	*out = e;
	return 0;
}

/* Open key, which has no open entry (ck->open_lock held): its local copy,
 * the store's copy or, with O_CREAT, a new file (*created), as a new
 * entry (*out) listed in ck->ents; a read of the store's copy gets a
 * private entry instead. */
static int ckpt_file_open_new(struct ckpt *ck, const char *key, int flags,
			      uid_t uid, struct ckpt_ent **out, bool *created)
{
	bool write = (flags & O_ACCMODE) != O_RDONLY;
	bool excl = (flags & O_CREAT) && (flags & O_EXCL);
	struct ckpt_ent *e = NULL;
	struct objstore_info oi;
	struct ckpt_attr a;
	int ret, tries = 0;

again:
	/* What the name is now: a stale clean copy is dropped by stat. */
	ret = ckpt_stat(ck, key, &a);
	if (ret && ret != -ENOENT)
		return ret;
	if (!ret && a.dir)
		return -EISDIR;
	if (!ret && excl)
		return -EEXIST;
	if (ret == -ENOENT && !(flags & O_CREAT))
		return ret;
	if (!ret && a.local) {
		ret = ckpt_file_open_local(ck, key, flags, &e);
		if (ret == 1 && tries++ < 3)
			goto again; /* dropped meanwhile: the store has it */
		if (ret)
			return ret == 1 ? -ENOENT : ret;
	} else if (!ret) {
		/* Only the store has it. */
		ret = objstore_head(ck->os, key, &oi);
		if (ret)
			return ckpt_store_errno(ret);
		if (!write) {
			*out = ckpt_ent_private(key, &oi);
			return *out ? 0 : -ENOMEM;
		}
		ret = ckpt_file_copy_stored(ck, key, flags, uid, &oi, &e);
		if (ret)
			return ret;
	} else {
		/* A new file (the caller checked the parent). */
		ret = ckpt_key_new_ok(ck, key);
		if (!ret)
			ret = ckpt_tree_create(ck, key, O_EXCL, uid, &e);
		if (ret)
			return ret;
		*created = true;
		ckpt_ent_begin_write(ck, e);
	}
	pthread_mutex_lock(&ck->lock);
	e->next = ck->ents;
	ck->ents = e;
	pthread_mutex_unlock(&ck->lock);
	*out = e;
	return 0;
}

int ckpt_file_open_as(struct ckpt *ck, const char *key, int flags, uid_t uid,
		      struct ckpt_file **out, bool *created)
{
	bool write = (flags & O_ACCMODE) != O_RDONLY;
	struct ckpt_file *f = calloc(1, sizeof(*f));
	struct ckpt_ent *e;
	int ret;

	*created = false;
	if (!f)
		return -ENOMEM;
	ret = ckpt_key_ok(key);
	if (ret || !*key) {
		free(f);
		return ret ? ret : -EISDIR;
	}
	f->write = write;
	f->ck = ck;
	pthread_mutex_lock(&ck->open_lock);
	pthread_mutex_lock(&ck->lock);
	e = ckpt_ent_find_locked(ck, key);
	pthread_mutex_unlock(&ck->lock);
	if (e)
		ret = ckpt_file_open_found(ck, e, flags);
	else
		ret = ckpt_file_open_new(ck, key, flags, uid, &e, created);
	if (ret) {
		pthread_mutex_unlock(&ck->open_lock);
		/* e is the entry found, if any (a new one that failed is
		 * freed already): give the find's reference back. */
		if (e && e->refs > 1)
			ckpt_ent_put(ck, e, false);
		else
			ckpt_ent_free(e);
		free(f);
		return ret;
	}
	if (write) {
		pthread_mutex_lock(&ck->lock);
		e->writers++;
		pthread_mutex_unlock(&ck->lock);
	}
	pthread_mutex_unlock(&ck->open_lock);
	if (write && (*created || (flags & O_TRUNC)))
		ckpt_test_crash("create");
	f->e = e;
	*out = f;
	return 0;
}

/* ---- I/O ---- */

ssize_t ckpt_file_pread(struct ckpt_file *f, void *buf, size_t len, off_t off)
{
	struct ckpt_ent *e = f->e;
	size_t got = 0;
	ssize_t r;
	int ret;

	if (off < 0)
		return -EINVAL;
	if (e->fd >= 0) {
		do
			r = pread(e->fd, buf, len, off);
		while (r < 0 && errno == EINTR);
		return r < 0 ? -errno : r;
	}
	if ((uint64_t)off >= e->rsize || !len)
		return 0;
	if (len > e->rsize - (uint64_t)off)
		len = (size_t)(e->rsize - (uint64_t)off);
	ret = objstore_get(f->ck->os, e->key, (uint64_t)off, len, e->etag, buf,
			   &got);
	if (ret == -ERANGE)
		return 0;
	if (ret) {
		log_error("checkpoints: cannot read %s at %lld from %s: %s",
			  e->key, (long long)off, ckpt_url(f->ck),
			  strerror(-ret));
		return ret == -ENOMEM ? -ENOMEM : -EIO;
	}
	return (ssize_t)got;
}

ssize_t ckpt_file_pwrite(struct ckpt_file *f, const void *buf, size_t len,
			 off_t off)
{
	struct ckpt_ent *e = f->e;
	struct ckpt *ck = f->ck;
	uint64_t end = (uint64_t)off + len, old, now;
	struct stat st;
	ssize_t w = 0;
	int ret;

	if (!f->write || e->fd < 0)
		return -EBADF;
	if (off < 0)
		return -EINVAL;
	pthread_mutex_lock(&e->lock);
	if (fstat(e->fd, &st)) {
		ret = -errno;
		goto out;
	}
	old = (uint64_t)st.st_size;
	ret = ckpt_store_charge(ck, e, old, end > old ? end : old, true);
	if (ret)
		goto out;
	ret = ckpt_space(ck, e->uid, end > old ? (int64_t)(end - old) : 0);
	if (ret) {
		ckpt_store_charge(ck, e, old, old, false);
		goto out;
	}
	ckpt_ent_dirty(ck, e);
	do
		w = pwrite(e->fd, buf, len, off);
	while (w < 0 && errno == EINTR);
	now = w > 0 && (uint64_t)off + (uint64_t)w > old
		      ? (uint64_t)off + (uint64_t)w
		      : old;
	if (end > old) { /* give back what was reserved and not written */
		ckpt_space(ck, e->uid, (int64_t)now - (int64_t)end);
		ckpt_store_charge(ck, e, old, now, false);
	}
	ret = w < 0 ? -errno : 0;
	if (w > 0)
		ckpt_upload_wrote(ck, e, (uint64_t)off, (uint64_t)w);
	if (w > 0 && e->hctx.ctx && (uint64_t)off < e->hash_end) {
		/* A rewrite: hash it all at publish. */
		ckpt_upload_hash_wait(e);
		ckpt_hash_stop(e);
	} else if (w > 0 && e->hctx.ctx && (uint64_t)off == e->hash_end) {
		e->hash_end += (uint64_t)w;
		if (ck->n_uploaders) {
			ckpt_upload_hash(ck, e);
		} else { /* no uploader thread: hash it here */
			if (sha256_update(&e->hctx, buf, (size_t)w))
				ckpt_hash_stop(e); /* the publish hashes all */
			else
				e->hashed += (uint64_t)w;
		}
	}
	if (ret == -ENOSPC || ret == -EDQUOT)
		log_warn("checkpoints: the staging disk of %s is full: %s",
			 ck->dirs.staging, strerror(-ret));
	else if (w > 0)
		ckpt_upload_pace(e);
	if (old < CKPT_TEST_MID_WRITE && now >= CKPT_TEST_MID_WRITE)
		ckpt_test_crash("mid-write");
out:
	pthread_mutex_unlock(&e->lock);
	return ret ? ret : w;
}

int ckpt_file_truncate(struct ckpt_file *f, uint64_t size)
{
	struct ckpt_ent *e = f->e;
	struct stat st;
	int ret;

	if (!f->write || e->fd < 0)
		return -EBADF;
	pthread_mutex_lock(&e->lock);
	if (fstat(e->fd, &st)) {
		ret = -errno;
		goto out;
	}
	ret = ckpt_store_charge(f->ck, e, (uint64_t)st.st_size, size, true);
	if (ret)
		goto out;
	ret = ckpt_space(f->ck, e->uid, (int64_t)size - (int64_t)st.st_size);
	if (ret) {
		ckpt_store_charge(f->ck, e, (uint64_t)st.st_size,
				  (uint64_t)st.st_size, false);
		goto out;
	}
	ckpt_ent_dirty(f->ck, e);
	if (ftruncate(e->fd, (off_t)size)) {
		ret = -errno;
		ckpt_space(f->ck, e->uid, (int64_t)st.st_size - (int64_t)size);
		ckpt_store_charge(f->ck, e, (uint64_t)st.st_size,
				  (uint64_t)st.st_size, false);
		goto out;
	}
	ckpt_upload_truncated(e, (uint64_t)st.st_size, size);
	ckpt_test_crash("truncate");
	if (size == 0) {
		ckpt_upload_hash_wait(e);
		ckpt_hash_start(e);
	} else if (size < e->hash_end) {
		ckpt_upload_hash_wait(e);
		ckpt_hash_stop(e);
	}
out:
	pthread_mutex_unlock(&e->lock);
	return ret;
}

int ckpt_file_set_mtime(struct ckpt_file *f, const struct timespec *mtime)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, *mtime };

	if (f->e->fd < 0)
		return 0; /* the store keeps its own time */
	return futimens(f->e->fd, ts) ? -errno : 0;
}

int ckpt_file_fd(const struct ckpt_file *f)
{
	return f->e->fd;
}

int ckpt_file_reopen(const struct ckpt_file *f)
{
	return f->e->fd < 0 ? -EAGAIN : fdutil_reopen_rdonly(f->e->fd);
}

bool ckpt_file_writable(const struct ckpt_file *f)
{
	return f->write;
}

unsigned ckpt_file_writers(const struct ckpt_file *f)
{
	unsigned n;

	pthread_mutex_lock(&f->ck->lock);
	n = f->e->writers;
	pthread_mutex_unlock(&f->ck->lock);
	return n;
}

uint64_t ckpt_file_gen(struct ckpt_file *f)
{
	uint64_t gen;

	pthread_mutex_lock(&f->e->lock);
	gen = f->e->gen;
	pthread_mutex_unlock(&f->e->lock);
	return gen;
}

ssize_t ckpt_file_pread_gen(struct ckpt_file *f, void *buf, size_t len,
			    off_t off, uint64_t gen)
{
	struct ckpt_ent *e = f->e;
	ssize_t r;

	if (e->fd < 0)
		return -EBADF;
	if (off < 0)
		return -EINVAL;
	/* under e->lock: no write or truncate between the check and the
	 * read (each bumps gen under it, ckpt_ent_dirty) */
	pthread_mutex_lock(&e->lock);
	if (e->gen != gen) {
		r = -ESTALE;
	} else {
		do
			r = pread(e->fd, buf, len, off);
		while (r < 0 && errno == EINTR);
		if (r < 0)
			r = -errno;
	}
	pthread_mutex_unlock(&e->lock);
	return r;
}

int ckpt_file_remote(const struct ckpt_file *f, struct ckpt_remote *r)
{
	const struct ckpt_ent *e = f->e;

	/* fd and etag are fixed once opened from the store: e is private. */
	if (e->fd >= 0 || !e->etag[0])
		return -ENOENT;
	r->os = f->ck->os;
	r->key = e->key;
	r->etag = e->etag;
	r->size = e->rsize;
	return 0;
}

int ckpt_file_attr(struct ckpt_file *f, struct ckpt_attr *a)
{
	struct stat st;

	memset(a, 0, sizeof(*a));
	if (f->e->fd < 0) {
		a->size = f->e->rsize;
		a->mtime = f->e->rmtime;
		return 0;
	}
	if (fstat(f->e->fd, &st))
		return -errno;
	a->size = (uint64_t)st.st_size;
	a->mtime = st.st_mtim.tv_sec;
	a->local = true;
	return 0;
}

int ckpt_ent_publish(struct ckpt *ck, struct ckpt_ent *e, const char *want_sha)
{
	char *key = NULL;
	int ret = 0;

	if (e->fd < 0)
		return 0;
	pthread_mutex_lock(&e->lock);
	if (!e->dirty)
		goto out;
	ckpt_upload_hash_wait(e); /* hctx and hashed are settled */
	pthread_rwlock_rdlock(&ck->ns_lock);
	pthread_mutex_lock(&ck->lock);
	if (!e->unlinked) {
		key = strdup(e->key);
		e->publishing = key != NULL;
	}
	pthread_mutex_unlock(&ck->lock);
	if (key) {
		ret = ckpt_put(ck, e, e->fd, e->ino, key, want_sha,
			       e->hctx.ctx ? &e->hctx : NULL, e->hashed);
		pthread_mutex_lock(&ck->lock);
		e->publishing = false;
		if (!ret)
			e->owed = false; /* paid */
		pthread_mutex_unlock(&ck->lock);
		if (!ret) {
			e->dirty = false;
			e->journal_w = false;
		}
	} else if (!e->unlinked) {
		ret = -ENOMEM;
	}
	pthread_rwlock_unlock(&ck->ns_lock);
	free(key);
out:
	pthread_mutex_unlock(&e->lock);
	return ret;
}

int ckpt_file_sync(struct ckpt_file *f)
{
	return ckpt_ent_publish(f->ck, f->e, NULL);
}

bool ckpt_file_writer_done(struct ckpt_file *f, bool owe)
{
	struct ckpt *ck = f->ck;
	bool pay = false;

	if (!f->write || f->writer_done)
		return false;
	pthread_mutex_lock(&ck->lock);
	f->writer_done = true;
	f->e->writers--;
	if (owe)
		f->e->owed = true;
	if (!f->e->writers && f->e->owed) {
		f->e->owed = false;
		pay = true;
	}
	pthread_mutex_unlock(&ck->lock);
	return pay;
}

void ckpt_file_close(struct ckpt_file *f)
{
	if (!f)
		return;
	ckpt_ent_put(f->ck, f->e, f->write && !f->writer_done);
	free(f);
}
