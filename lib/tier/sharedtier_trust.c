// SPDX-License-Identifier: MIT
/*
 * sharedtier_trust: the shared tier's trust rule and its readers
 * (include/dstage/sharedtier.h; docs/security.md, "The shared tier").
 *
 * The tier is as trustworthy as the source, or it is not used: its root
 * and everything below it must be directories or regular files that only
 * the service uid (or root) can write. A reader checks that before it
 * reads a copy, and checks each file against the catalog's reference hash
 * (the sums key's), never the copy's own MANIFEST alone; a file without
 * one is read from the source. Logged once per path and rule (a mutex
 * guards the last message logged).
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"
#include "sharedtier_i.h"

#define SHAREDTIER_MEMO_SLOTS 16 /* copies remembered */
#define SHAREDTIER_MEMO_MS 2000 /* how long a walk's answer is used */

static pthread_mutex_t sharedtier_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char sharedtier_logged[PATH_MAX + 64];

/* Log msg unless it was the last one logged. */
static void sharedtier_log_once(const char *msg)
{
	bool fresh;

	pthread_mutex_lock(&sharedtier_log_lock);
	fresh = strcmp(sharedtier_logged, msg) != 0;
	if (fresh)
		snprintf(sharedtier_logged, sizeof(sharedtier_logged), "%s",
			 msg);
	pthread_mutex_unlock(&sharedtier_log_lock);
	if (fresh)
		log_error("shared tier: %s: not used (only the service uid may "
			  "write a shared tier; docs/security.md)",
			  msg);
}

/* The rule the last check on this thread found broken (for the status). */
static __thread char sharedtier_why[PATH_MAX + 64];

static int sharedtier_check_stat(const char *path, const struct stat *st)
{
	char *msg = sharedtier_why;
	size_t msize = sizeof(sharedtier_why);
	uid_t me = geteuid();
	int ret = -EACCES;

	if (!S_ISDIR(st->st_mode) && !S_ISREG(st->st_mode)) {
		snprintf(msg, msize,
			 "%.4000s is not a regular file or "
			 "directory",
			 path);
		ret = -EINVAL;
	} else if (st->st_mode & S_IWOTH) {
		snprintf(msg, msize, "%.4000s is writable by others", path);
	} else if (st->st_mode & S_IWGRP) {
		snprintf(msg, msize, "%.4000s is writable by group", path);
	} else if (st->st_uid != me && st->st_uid != 0) {
		snprintf(msg, msize,
			 "%.4000s is owned by uid %u, not "
			 "the service uid %u",
			 path, (unsigned)st->st_uid, (unsigned)me);
	} else {
		return 0;
	}
	sharedtier_log_once(msg);
	return ret;
}

/* Set the thread's message for path and the failure err. */
static int sharedtier_why_err(const char *path, int err)
{
	snprintf(sharedtier_why, sizeof(sharedtier_why),
		 "%.4000s cannot be looked at: %s", path, strerror(-err));
	return err;
}

int sharedtier_trusted(const char *path)
{
	struct stat st;

	if (lstat(path, &st))
		return sharedtier_why_err(path, -errno);
	return sharedtier_check_stat(path, &st);
}

/* nftw passes no argument: the walk's first error, per thread. */
static __thread int sharedtier_walk_err;

/*
 * An entry that is gone by the time it is looked at (a publisher's
 * temporary file renamed to its name, an expired lease moved aside) is
 * skipped: what is no longer there cannot be read, and its replacement is
 * checked when it is opened (sharedtier_open_file) and against the
 * reference hash. Anything else that cannot be looked at fails the walk.
 */
static int sharedtier_walk_cb(const char *path, const struct stat *st, int type,
			      struct FTW *ftw)
{
	int ret;

	if (type == FTW_NS || type == FTW_DNR) {
		if (errno == ENOENT && ftw->level > 0)
			return FTW_CONTINUE;
		ret = sharedtier_why_err(path, errno ? -errno : -EACCES);
	} else {
		ret = sharedtier_check_stat(path, st);
	}
	if (!ret)
		return FTW_CONTINUE;
	sharedtier_walk_err = ret;
	return FTW_STOP;
}

int sharedtier_trusted_tree(const char *root, const char *dir)
{
	char path[PATH_MAX];
	size_t rl = strlen(root);
	int ret;

	if (strncmp(dir, root, rl) != 0 ||
	    snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path))
		return -EINVAL;
	ret = sharedtier_trusted(root);
	/* each directory between root and dir */
	for (char *p = path + rl + 1; !ret && *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		ret = sharedtier_trusted(path);
		*p = '/';
	}
	if (ret)
		return ret;
	sharedtier_walk_err = 0;
	ret = nftw(dir, sharedtier_walk_cb, 16, FTW_PHYS | FTW_ACTIONRETVAL);
	if (ret == FTW_STOP)
		return sharedtier_walk_err;
	/* nftw's own failure (dir itself) */
	return ret ? sharedtier_why_err(dir, errno ? -errno : -EIO) : 0;
}

/* ---- the readers' memo of the walk ---- */

/* What a walk's answer depends on that a look at root and dir can see. */
struct sharedtier_stamp {
	dev_t dev;
	ino_t ino;
	mode_t mode;
	uid_t uid;
	struct timespec ctime, mtime;
};

struct sharedtier_memo {
	char dir[PATH_MAX]; /* "": an empty slot */
	size_t rootlen;
	struct sharedtier_stamp root, top; /* root's and dir's */
	int64_t at_ms; /* monotonic: when the walk began */
	int ret;
	char why[PATH_MAX + 64];
};

static pthread_mutex_t sharedtier_memo_lock = PTHREAD_MUTEX_INITIALIZER;
/* the last walks, one a copy (sharedtier_memo_lock) */
static struct sharedtier_memo sharedtier_memos[SHAREDTIER_MEMO_SLOTS];

static int sharedtier_stamp(const char *path, struct sharedtier_stamp *s)
{
	struct stat st;

	if (lstat(path, &st))
		return -errno;
	*s = (struct sharedtier_stamp){ .dev = st.st_dev,
					.ino = st.st_ino,
					.mode = st.st_mode,
					.uid = st.st_uid,
					.ctime = st.st_ctim,
					.mtime = st.st_mtim };
	return 0;
}

static bool sharedtier_stamp_eq(const struct sharedtier_stamp *a,
				const struct sharedtier_stamp *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->mode == b->mode &&
	       a->uid == b->uid && a->ctime.tv_sec == b->ctime.tv_sec &&
	       a->ctime.tv_nsec == b->ctime.tv_nsec &&
	       a->mtime.tv_sec == b->mtime.tv_sec &&
	       a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* The memo's slot for (root, dir) still good at now, or NULL. Called
 * with sharedtier_memo_lock held. */
static struct sharedtier_memo *
sharedtier_memo_find(const char *dir, size_t rootlen,
		     const struct sharedtier_memo *m, int64_t now)
{
	for (int i = 0; i < SHAREDTIER_MEMO_SLOTS; i++) {
		struct sharedtier_memo *o = &sharedtier_memos[i];

		if (o->rootlen == rootlen && !strcmp(o->dir, dir) &&
		    now - o->at_ms < SHAREDTIER_MEMO_MS &&
		    sharedtier_stamp_eq(&o->root, &m->root) &&
		    sharedtier_stamp_eq(&o->top, &m->top))
			return o;
	}
	return NULL;
}

/* Keep m in the slot of its dir, or an empty one, or the oldest. */
static void sharedtier_memo_keep(const struct sharedtier_memo *m)
{
	struct sharedtier_memo *slot = &sharedtier_memos[0];

	pthread_mutex_lock(&sharedtier_memo_lock);
	for (int i = 0; i < SHAREDTIER_MEMO_SLOTS; i++) {
		struct sharedtier_memo *o = &sharedtier_memos[i];

		if (!strcmp(o->dir, m->dir) || !*o->dir) {
			slot = o;
			break;
		}
		if (o->at_ms < slot->at_ms)
			slot = o;
	}
	if (m->at_ms >= slot->at_ms || strcmp(slot->dir, m->dir))
		*slot = *m;
	pthread_mutex_unlock(&sharedtier_memo_lock);
}

int sharedtier_trusted_copy(const char *root, const char *dir, char *why,
			    size_t len)
{
	struct sharedtier_memo *m = calloc(1, sizeof(*m)), *o;
	int ret;

	if (!m)
		return -ENOMEM;
	m->rootlen = strlen(root);
	m->at_ms = timeutil_mono_ms();
	if (snprintf(m->dir, sizeof(m->dir), "%s", dir) >= (int)sizeof(m->dir))
		m->dir[0] = '\0'; /* not kept; the walk fails it */
	if (*m->dir && !sharedtier_stamp(root, &m->root) &&
	    !sharedtier_stamp(dir, &m->top)) {
		pthread_mutex_lock(&sharedtier_memo_lock);
		o = sharedtier_memo_find(dir, m->rootlen, m, m->at_ms);
		if (o) {
			ret = o->ret;
			snprintf(why, len, "%s", o->why);
		}
		pthread_mutex_unlock(&sharedtier_memo_lock);
		if (o) {
			free(m);
			return ret;
		}
	} else {
		m->dir[0] = '\0'; /* not kept: nothing to tell a change by */
	}
	sharedtier_why[0] = '\0';
	ret = sharedtier_trusted_tree(root, dir);
	m->ret = ret;
	snprintf(m->why, sizeof(m->why), "%s", ret ? sharedtier_why : "");
	snprintf(why, len, "%s", m->why);
	if (*m->dir)
		sharedtier_memo_keep(m);
	free(m);
	return ret;
}

int sharedtier_open_file(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	struct stat st;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		int e = errno;

		close(fd);
		if (e == 0 || S_ISREG(st.st_mode) == 0) {
			log_error("shared tier: %s is not a regular file: not "
				  "read",
				  path);
			return -EINVAL;
		}
		return -e;
	}
	if (fcntl(fd, F_SETFL, 0)) {
		int e = -errno;

		close(fd);
		return e;
	}
	return fd;
}

size_t sharedtier_rootlen(const struct catalog_dataset *ds, const char *base)
{
	return ds->shared_tier && *ds->shared_tier
		       ? strlen(base)
		       : strlen(base) - strlen(ds->name) - 1;
}
