// SPDX-License-Identifier: MIT
/*
 * lifecycle_stage: the stager daemon's view of a checkpoint staging
 * directory (include/dstage/lifecycle_stage.h). It reads and writes the
 * journal records with the ckpt module's own functions, through its
 * staging API (ckpt/ckpt_stage.h: the staging directory's descriptors
 * only: no entries, no retry thread, no store).
 *
 * Sharing with dstagefs, which owns the directory: a record is replaced
 * atomically (rename), so each read sees a whole one. The daemon acts
 * only on P records (closed, content final: it publishes a private copy
 * whose SHA-256 matches the record, so it can never publish bytes a
 * writer is changing) and C records (published: the local copy is a clean
 * cache, dropped with its record; dstagefs then reads the store). A record
 * that changes between the check and the write is left alone (-ESTALE).
 * A local copy open in dstagefs is never dropped, and one dstagefs is
 * publishing is not published here (the locks of ckpt_stage.h, taken without
 * waiting: -EBUSY, tried again at the next pass). No state: a handle is
 * one thread's.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_stage.h"
#include "dstage/config.h"
#include "dstage/catalog.h"
#include "dstage/lifecycle_stage.h"
#include "dstage/log.h"
#include "dstage/sha256.h"
#include "util/fdutil.h"
#include "util/strutil.h"

#define STAGE_CHUNK (4u << 20)

struct lifecycle_staging {
	struct ckpt_dirs d; /* the store's staging directory */
};

static int lifecycle_staging_subdir(int dfd, const char *name)
{
	int fd = openat(dfd, name,
			O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

int lifecycle_staging_open(const struct dstage_config *cfg,
			   struct lifecycle_staging **out)
{
	struct lifecycle_staging *s;
	struct stat st;
	char *path = NULL;
	int dfd = -1, sfd = -1, ret;

	*out = NULL;
	if (!cfg->ckpt_staging_dir || !*cfg->ckpt_staging_dir ||
	    !cfg->ckpt_store || !*cfg->ckpt_store)
		return -ENOENT;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->d.tree_fd = s->d.journal_fd = s->d.abandoned_fd = s->d.owners_fd =
		-1;
	s->d.staging = strdup(cfg->ckpt_staging_dir);
	if (!s->d.staging) {
		ret = -ENOMEM;
		goto err;
	}
	dfd = open(s->d.staging,
		   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0 || fstat(dfd, &st)) {
		ret = -errno;
		goto err;
	}
	if (st.st_uid != geteuid() || (st.st_mode & 022)) {
		log_error("lifecycle: checkpoints.staging_dir %s is owned by "
			  "uid %u with mode %04o: it must be this process's "
			  "(uid %u) and writable by no one else; run the "
			  "stager daemon as dstagefs's user and chmod 0700 it",
			  s->d.staging, (unsigned)st.st_uid,
			  (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
		ret = -EACCES;
		goto err;
	}
	/* Only this store's subdirectory (issue 34): dstagefs makes it, and
	 * moves a flat staging directory of the layout before into it. */
	ret = ckpt_store_dir_open(dfd, s->d.staging, cfg->ckpt_store, false,
				  &sfd, &path);
	if (ret)
		goto err;
	free(s->d.staging);
	s->d.staging = path;
	s->d.tree_fd = lifecycle_staging_subdir(sfd, CKPT_TREE);
	s->d.journal_fd = lifecycle_staging_subdir(sfd, CKPT_JOURNAL);
	s->d.abandoned_fd = lifecycle_staging_subdir(sfd, CKPT_ABANDONED);
	/* made here too: a daemon started before dstagefs made it must
	 * still find the owners dstagefs keeps there */
	if (mkdirat(sfd, CKPT_OWNERS, CKPT_DIR_MODE) && errno != EEXIST)
		log_warn("lifecycle: %s/%s: %s", s->d.staging, CKPT_OWNERS,
			 strerror(errno));
	s->d.owners_fd = lifecycle_staging_subdir(sfd, CKPT_OWNERS);
	if (s->d.tree_fd < 0 || s->d.journal_fd < 0) {
		ret = -ENOENT;
		goto err;
	}
	close(sfd);
	close(dfd);
	*out = s;
	return 0;
err:
	if (sfd >= 0)
		close(sfd);
	if (dfd >= 0)
		close(dfd);
	lifecycle_staging_free(s);
	return ret;
}

void lifecycle_staging_free(struct lifecycle_staging *s)
{
	if (!s)
		return;
	ckpt_dirs_close(&s->d);
	free(s);
}

const char *lifecycle_staging_path(const struct lifecycle_staging *s)
{
	return s->d.staging;
}

int lifecycle_staging_scan(struct lifecycle_staging *s, lifecycle_local_cb cb,
			   void *arg)
{
	struct ckpt_rec rec;
	struct dirent *de;
	DIR *d;
	int ret = fdutil_opendir(s->d.journal_fd, &d);

	if (ret)
		return ret;
	while ((de = readdir(d))) {
		struct lifecycle_local l;
		struct stat st;
		ino_t ino;

		if (ckpt_journal_name(de->d_name, &ino) ||
		    ckpt_journal_live(&s->d, ino, &rec, &st))
			continue; /* dstagefs's scan drops those */
		l.key = rec.key;
		l.state = rec.state;
		l.size = (uint64_t)st.st_size;
		l.mtime = st.st_mtime;
		l.ino = ino;
		ret = cb(arg, &l);
		if (ret)
			break;
	}
	closedir(d);
	return ret;
}

/* The record of ino, which must be state for key. */
static int lifecycle_staging_rec(struct lifecycle_staging *s, const char *key,
				 ino_t ino, char state, struct ckpt_rec *rec)
{
	if (ckpt_journal_read(&s->d, ino, rec) || rec->state != state ||
	    strcmp(rec->key, key))
		return -ESTALE;
	return 0;
}

/* Copy fd (size bytes) to the new unnamed file *out in the staging
 * directory, hashing what is copied into hex. */
static int lifecycle_staging_copy(struct lifecycle_staging *s, int fd,
				  uint64_t size, int *out,
				  char hex[CKPT_SHA_HEX])
{
	struct sha256 h = { 0 };
	unsigned char md[SHA256_LEN];
	char *buf = malloc(STAGE_CHUNK);
	uint64_t off = 0;
	int tfd, ret = 0;

	*out = -1;
	tfd = openat(s->d.journal_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC,
		     0600);
	if (tfd < 0 || !buf || sha256_init(&h)) {
		ret = tfd < 0 ? -errno : -ENOMEM;
		goto out;
	}
	while (off < size) {
		size_t want =
			size - off < STAGE_CHUNK ? size - off : STAGE_CHUNK;
		ssize_t r = pread(fd, buf, want, (off_t)off);

		if (r < 0) {
			ret = -errno;
			goto out;
		}
		if (!r) {
			ret = -EIO; /* shorter than it was a moment ago */
			goto out;
		}
		if (pwrite(tfd, buf, (size_t)r, (off_t)off) != r) {
			ret = errno ? -errno : -EIO;
			goto out;
		}
		sha256_update(&h, buf, (size_t)r);
		off += (uint64_t)r;
	}
	ret = sha256_final(&h, md);
	if (ret)
		goto out;
	strutil_hex(md, SHA256_LEN, hex);
	*out = tfd;
	tfd = -1;
out:
	if (tfd >= 0)
		close(tfd);
	sha256_release(&h);
	free(buf);
	return ret;
}

int lifecycle_staging_publish(struct lifecycle_staging *s, struct objstore *os,
			      struct catalog *cat, const char *key, ino_t ino)
{
	struct ckpt_rec rec, now;
	struct objstore_info oi;
	char sha[CKPT_SHA_HEX] = "", line[CKPT_SHA_HEX + 32], *side = NULL;
	struct stat st;
	int fd = -1, cfd = -1, ret;

	ret = lifecycle_staging_rec(s, key, ino, 'P', &rec);
	if (ret)
		return ret;
	fd = openat(s->d.tree_fd, key, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) || st.st_ino != ino) {
		ret = -ESTALE;
		goto out;
	}
	/* dstagefs publishing it now (a newer version): skip, try later */
	ret = ckpt_lock_publish(fd, false);
	if (!ret)
		ret = lifecycle_staging_rec(s, key, ino, 'P', &rec);
	if (ret)
		goto out;
	/* An upload in parts a dead dstagefs left open (its publish lock is
	 * ours: no dstagefs is sending it): abort it, as dstagefs's restart
	 * would, so that none stays open if dstagefs never starts again. */
	if (rec.upload_id[0] &&
	    !objstore_upload_abort_id(os, rec.upload_key, rec.upload_id))
		log_info("lifecycle: aborted the unfinished upload of %s to %s "
			 "(dstagefs stopped while sending it)",
			 rec.upload_key, objstore_url(os));
	ret = lifecycle_staging_copy(s, fd, (uint64_t)st.st_size, &cfd, sha);
	if (ret)
		goto out;
	if ((uint64_t)st.st_size != rec.size || strcmp(sha, rec.sha)) {
		log_error("lifecycle: %s/%s/%s is not what its record says "
			  "(SHA-256 %s, size %" PRIu64 "; recorded %s, %" PRIu64
			  "): not published",
			  s->d.staging, CKPT_TREE, key, sha,
			  (uint64_t)st.st_size, rec.sha, rec.size);
		ret = -EIO;
		goto out;
	}
	ckpt_test_crash("upload"); /* tests: as dstagefs's publish */
	/* the owners dstagefs kept for it (and its directories) first: no
	 * object without its owner record */
	ret = ckpt_owner_store_kept(&s->d, os, key);
	if (!ret)
		ret = objstore_put_fd(os, key, cfd, rec.size);
	side = ckpt_sidecar_key(key);
	if (!ret && !side)
		ret = -ENOMEM;
	if (!ret) {
		ckpt_test_crash("sidecar");
		snprintf(line, sizeof(line), "%s  %" PRIu64 "\n", rec.sha,
			 rec.size);
		ret = objstore_put_buf(os, side, line, strlen(line));
	}
	if (ret)
		goto out;
	/* the record may have changed while the copy went up */
	ret = lifecycle_staging_rec(s, key, ino, 'P', &now);
	if (!ret && strcmp(now.sha, rec.sha))
		ret = -ESTALE;
	if (ret)
		goto out;
	if (!objstore_head(os, key, &oi))
		snprintf(rec.etag, sizeof(rec.etag), "%s", oi.etag);
	rec.state = 'C';
	rec.upload_id[0] = rec.upload_key[0] = '\0'; /* aborted above */
	ret = ckpt_journal_write(&s->d, ino, &rec, true);
	if (!ret)
		catalog_ckpt_published(cat, objstore_url(os), key, rec.sha,
				       rec.size, rec.etag, (int64_t)st.st_uid);
out:
	if (fd >= 0)
		close(fd);
	if (cfd >= 0)
		close(cfd);
	free(side);
	return ret;
}

/* Remove the local directories of key that are empty now, below its job
 * ("a/b/c/f": a/b/c, then a/b; never a). */
static void lifecycle_staging_rmdirs(struct lifecycle_staging *s,
				     const char *key)
{
	char buf[sizeof(((struct ckpt_rec *)0)->key)];
	char *slash;

	snprintf(buf, sizeof(buf), "%s", key);
	while ((slash = strrchr(buf, '/'))) {
		*slash = '\0';
		if (!strchr(buf, '/') ||
		    unlinkat(s->d.tree_fd, buf, AT_REMOVEDIR))
			break;
	}
}

int lifecycle_staging_drop(struct lifecycle_staging *s, const char *key,
			   ino_t ino)
{
	struct ckpt_rec rec;
	struct stat st;
	int fd, ret = lifecycle_staging_rec(s, key, ino, 'C', &rec);

	if (ret)
		return ret;
	fd = openat(s->d.tree_fd, key, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) || st.st_ino != ino) {
		ret = -ESTALE;
		goto out;
	}
	/* Open in dstagefs (read or written): skip it. Holding the lock,
	 * no open can start using it; the record must still say C. */
	ret = ckpt_lock_drop(fd);
	if (!ret)
		ret = lifecycle_staging_rec(s, key, ino, 'C', &rec);
	if (ret)
		goto out;
	if (unlinkat(s->d.tree_fd, key, 0)) {
		ret = -errno;
		goto out;
	}
	ckpt_journal_remove(&s->d, ino);
	lifecycle_staging_rmdirs(s, key);
out:
	if (fd >= 0)
		close(fd);
	return ret;
}

int lifecycle_abandoned_list(struct lifecycle_staging *s,
			     lifecycle_abandoned_cb cb, void *arg)
{
	struct dirent *de;
	int ret = 0;
	DIR *d;

	if (s->d.abandoned_fd < 0)
		return 0;
	ret = fdutil_opendir(s->d.abandoned_fd, &d);
	if (ret)
		return ret;
	while ((de = readdir(d))) {
		struct lifecycle_abandoned a;
		struct stat st;

		if (de->d_name[0] == '.' ||
		    fstatat(s->d.abandoned_fd, de->d_name, &st,
			    AT_SYMLINK_NOFOLLOW) ||
		    !S_ISREG(st.st_mode))
			continue;
		a.name = de->d_name;
		a.size = (uint64_t)st.st_size;
		a.mtime = st.st_mtime;
		ret = cb(arg, &a);
		if (ret)
			break;
	}
	closedir(d);
	return ret;
}

int lifecycle_abandoned_remove(struct lifecycle_staging *s, const char *name)
{
	if (!*name || name[0] == '.' || strchr(name, '/'))
		return -EINVAL;
	if (s->d.abandoned_fd < 0)
		return -ENOENT;
	return unlinkat(s->d.abandoned_fd, name, 0) ? -errno : 0;
}
