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
#include "sharedtier_i.h"

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

static int sharedtier_check_stat(const char *path, const struct stat *st)
{
	char msg[PATH_MAX + 64];
	uid_t me = geteuid();
	int ret = -EACCES;

	if (!S_ISDIR(st->st_mode) && !S_ISREG(st->st_mode)) {
		snprintf(msg, sizeof(msg),
			 "%.4000s is not a regular file or "
			 "directory",
			 path);
		ret = -EINVAL;
	} else if (st->st_mode & S_IWOTH) {
		snprintf(msg, sizeof(msg), "%.4000s is writable by others",
			 path);
	} else if (st->st_mode & S_IWGRP) {
		snprintf(msg, sizeof(msg), "%.4000s is writable by group",
			 path);
	} else if (st->st_uid != me && st->st_uid != 0) {
		snprintf(msg, sizeof(msg),
			 "%.4000s is owned by uid %u, not "
			 "the service uid %u",
			 path, (unsigned)st->st_uid, (unsigned)me);
	} else {
		return 0;
	}
	sharedtier_log_once(msg);
	return ret;
}

int sharedtier_trusted(const char *path)
{
	struct stat st;

	if (lstat(path, &st))
		return -errno;
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
		ret = errno ? -errno : -EACCES;
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
	return ret ? -errno : 0; /* nftw's own failure (dir itself) */
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
