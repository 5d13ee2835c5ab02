// SPDX-License-Identifier: MIT
/*
 * dsfs_overlay: the transparent mode (see dsfs_overlay.h and
 * docs/dstagefs.md, "Overlay (transparent) mode").
 *
 * Life: init (before the mount) opens DIR O_PATH|O_DIRECTORY, checks that
 * this process may mount over it (root, or its owner), opens the
 * overlay_store the cache reads from and registers the root node; destroy
 * (after the session) closes them. Nothing is ever written to DIR by the
 * overlay itself: an unmount, or dstagefs dying, leaves the tree as the
 * callers' own calls left it.
 *
 * Names, attributes and directories are served here; every call that
 * names a path of the tree is made as the caller (dsfs_overlay_cred.c).
 * Attributes and entries (and absences) are cached by the kernel for
 * overlay.attr_timeout: the staleness bound of changes made underneath.
 *
 * State: struct dsfs_overlay (dsfs_overlay_i.h), immutable after init but for
 * what its lock guards. A directory handle's position (struct
 * dsfs_overlay_dir) is guarded by its own mutex, a leaf.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "dsfs_opts.h"
#include "dsfs_overlay.h"
#include "dsfs_overlay_i.h"
#include "dstage/config.h"
#include "dstage/log.h"

/* Whether path (absolute) is dir or below it. */
static bool dsfs_overlay_below(const char *path, const char *dir)
{
	size_t l = strlen(dir);
	char *real = path ? realpath(path, NULL) : NULL;
	bool below;

	if (!real)
		return false;
	below = !strncmp(real, dir, l) && (real[l] == '/' || !real[l]);
	free(real);
	return below;
}

/* overlay.no_cache: "a, b,c" -> { "a", "b", "c", NULL } in st. */
static int dsfs_overlay_patterns(struct dsfs_overlay *st, const char *list)
{
	size_t n = 0;
	char *copy, *tok, *save = NULL;

	if (!list)
		return 0;
	st->no_cache = calloc(strlen(list) / 2 + 2, sizeof(char *));
	copy = strdup(list);
	if (!st->no_cache || !copy) {
		free(copy);
		return -ENOMEM;
	}
	for (tok = strtok_r(copy, ", \t", &save); tok;
	     tok = strtok_r(NULL, ", \t", &save))
		if (!(st->no_cache[n++] = strdup(tok))) {
			free(copy);
			return -ENOMEM;
		}
	free(copy);
	return 0;
}

static int dsfs_overlay_init(struct dsfs *fs)
{
	const char *mp = fs->opts->mountpoint;
	struct dsfs_overlay *st = calloc(1, sizeof(*st));
	struct stat sb;
	int ret;

	if (!st)
		return -ENOMEM;
	st->root_fd = -1;
	pthread_mutex_init(&st->lock, NULL);
	dsfs_pt_init(&st->top.pt); /* a directory: never used */
	fs->sub_state[DSFS_SUB_ROOT] = st;
	st->timeout = fs->cfg->overlay_attr_timeout_ms / 1000.0;
	st->min_cached = fs->cfg->overlay_min_cached_size;
	st->passthrough = fs->cfg->overlay_passthrough;
	st->euid = geteuid();
	st->as_caller = st->euid == 0;
	st->dir = realpath(mp, NULL);
	if (!st->dir) {
		ret = -errno;
		log_error("overlay %s: %s", mp, strerror(errno));
		return ret;
	}
	/* Before the mount hides it: the tree is reached through this. */
	st->root_fd = open(st->dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (st->root_fd < 0 || fstat(st->root_fd, &sb)) {
		ret = -errno;
		log_error("overlay %s: cannot open the directory: %s", st->dir,
			  strerror(errno));
		return ret;
	}
	if (st->euid != 0 && sb.st_uid != st->euid) {
		log_error("overlay %s: owned by uid %u: only root may mount "
			  "over a directory it does not own (run dstagefs as "
			  "root, or choose a directory of uid %u)",
			  st->dir, (unsigned)sb.st_uid, (unsigned)st->euid);
		return -EPERM;
	}
	if (dsfs_overlay_below(fs->cfg->cache_dir, st->dir) ||
	    dsfs_overlay_below(fs->cfg->catalog_path, st->dir)) {
		log_error("overlay %s: cache.dir (%s) or catalog.path (%s) "
			  "lies under it: dstagefs would wait on itself; "
			  "move them out of the overlaid tree",
			  st->dir, fs->cfg->cache_dir, fs->cfg->catalog_path);
		return -EINVAL;
	}
	if (asprintf(&st->label, "overlay:%s", st->dir) < 0) {
		st->label = NULL;
		return -ENOMEM;
	}
	ret = dsfs_overlay_patterns(st, fs->cfg->overlay_no_cache);
	if (!ret)
		ret = dsfs_overlay_cred_init();
	if (!ret)
		ret = overlay_store_open(st->root_fd, st->label, fs->cfg,
					 &st->os);
	if (!ret)
		ret = dsfs_nodes_add_fixed(&fs->nodes, DSFS_INO_ROOT,
					   DSFS_INO_ROOT, &dsfs_overlay_subtree,
					   "", &st->top);
	if (!ret)
		log_info("overlay %s: serving the tree under it; attributes "
			 "cached %.3f s, files under %llu bytes read "
			 "directly, %s",
			 st->dir, st->timeout,
			 (unsigned long long)st->min_cached,
			 st->as_caller ? "calls made as the caller"
				       : "only this uid served");
	return ret;
}

static void dsfs_overlay_destroy(struct dsfs *fs)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);

	if (!st)
		return;
	overlay_store_free(st->os);
	if (st->root_fd >= 0)
		close(st->root_fd);
	free(st->dir);
	free(st->label);
	for (char **p = st->no_cache; p && *p; p++)
		free(*p);
	free(st->no_cache);
	dsfs_pt_destroy(&st->top.pt);
	pthread_mutex_destroy(&st->lock);
	free(st);
	fs->sub_state[DSFS_SUB_ROOT] = NULL;
}

static void dsfs_overlay_forget(struct dsfs *fs, struct dsfs_node *n)
{
	dsfs_overlay_node_forget(fs, n);
}

/* fstatat of path as who. */
static int dsfs_overlay_stat(struct dsfs_overlay *st, struct dsfs_caller *who,
			     const char *path, struct stat *sb)
{
	int ret = dsfs_overlay_cred_take(st, who);

	if (!ret &&
	    fstatat(st->root_fd, path, sb, AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH))
		ret = -errno;
	dsfs_overlay_cred_drop(st);
	return ret;
}

static int dsfs_overlay_lookup(struct dsfs *fs, struct dsfs_caller *who,
			       struct dsfs_node *dir, const char *name,
			       struct dsfs_entry *e)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	char path[PATH_MAX];
	struct stat sb;
	int ret = dsfs_overlay_node_path(st, dir, name, path);

	if (!ret)
		ret = dsfs_overlay_stat(st, who, path, &sb);
	if (ret == -ENOENT) {
		e->node = NULL;
		e->entry_timeout = st->timeout;
	}
	if (ret)
		return ret;
	return dsfs_overlay_node_entry(fs, dir, name, &sb, e);
}

static int dsfs_overlay_getattr(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *n, struct fuse_file_info *fi,
				struct stat *sb, double *timeout)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	struct dsfs_overlay_node *p = n->priv;
	char path[PATH_MAX];
	bool gone;
	int ret;

	*timeout = st->timeout;
	if (fi && fi->fh)
		return fstat(dsfs_overlay_file_fd(fi), sb) ? -errno : 0;
	pthread_mutex_lock(&st->lock);
	gone = p->gone;
	pthread_mutex_unlock(&st->lock);
	if (gone)
		return -ENOENT;
	ret = dsfs_overlay_node_path(st, n, NULL, path);
	if (!ret)
		ret = dsfs_overlay_stat(st, who, path, sb);
	/* Another kind of file now at the place: another inode. */
	if (!ret && p != &st->top && (sb->st_mode & S_IFMT) != p->type)
		ret = -ESTALE;
	return ret;
}

static int dsfs_overlay_setattr(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *n, const struct stat *attr,
				int to_set, struct fuse_file_info *fi,
				struct stat *sb, double *timeout)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	int fd = fi && fi->fh ? dsfs_overlay_file_fd(fi) : -1;
	char path[PATH_MAX];
	int ret = dsfs_overlay_node_path(st, n, NULL, path);

	if (ret)
		return ret;
	ret = dsfs_overlay_cred_take(st, who);
	if (!ret && (to_set & FUSE_SET_ATTR_MODE) &&
	    fchmodat(st->root_fd, path, attr->st_mode & 07777, 0))
		ret = -errno;
	if (!ret && (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) &&
	    fchownat(st->root_fd, path,
		     (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1,
		     (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1,
		     AT_SYMLINK_NOFOLLOW))
		ret = -errno;
	if (!ret && (to_set & FUSE_SET_ATTR_SIZE)) {
		/* never an open of a FIFO or device swapped in (-ESTALE:
		 * truncate(2) looks the name up again) */
		int tfd = fd >= 0 ? fd
				  : dsfs_overlay_node_reopen(
					    st, path, O_WRONLY | O_CLOEXEC);

		if (tfd < 0)
			ret = tfd;
		else if (ftruncate(tfd, attr->st_size) || fsync(tfd))
			ret = -errno;
		if (tfd >= 0 && tfd != fd)
			close(tfd);
	}
	if (!ret && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
		struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
					  { .tv_nsec = UTIME_OMIT } };

		if (to_set & FUSE_SET_ATTR_ATIME_NOW)
			ts[0].tv_nsec = UTIME_NOW;
		else if (to_set & FUSE_SET_ATTR_ATIME)
			ts[0] = attr->st_atim;
		if (to_set & FUSE_SET_ATTR_MTIME_NOW)
			ts[1].tv_nsec = UTIME_NOW;
		else if (to_set & FUSE_SET_ATTR_MTIME)
			ts[1] = attr->st_mtim;
		if (utimensat(st->root_fd, path, ts, AT_SYMLINK_NOFOLLOW))
			ret = -errno;
	}
	dsfs_overlay_cred_drop(st);
	if (ret)
		return ret;
	return dsfs_overlay_getattr(fs, who, n, fi, sb, timeout);
}

static int dsfs_overlay_access(struct dsfs *fs, struct dsfs_caller *who,
			       struct dsfs_node *n, int mask)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	char path[PATH_MAX];
	int ret = dsfs_overlay_node_path(st, n, NULL, path);

	if (ret)
		return ret;
	ret = dsfs_overlay_cred_take(st, who);
	/* AT_EACCESS: the fsuid set above, not the real uid. */
	if (!ret && faccessat(st->root_fd, path, mask,
			      AT_EACCESS | AT_SYMLINK_NOFOLLOW))
		ret = -errno;
	dsfs_overlay_cred_drop(st);
	return ret;
}

static int dsfs_overlay_readlink(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, char *buf, size_t size)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	char path[PATH_MAX];
	ssize_t len;
	int ret = dsfs_overlay_node_path(st, n, NULL, path);

	if (ret)
		return ret;
	ret = dsfs_overlay_cred_take(st, who);
	len = ret ? -1 : readlinkat(st->root_fd, path, buf, size - 1);
	if (!ret && len < 0)
		ret = -errno;
	dsfs_overlay_cred_drop(st);
	if (!ret)
		buf[len] = '\0';
	return ret;
}

static int dsfs_overlay_statfs(struct dsfs *fs, struct dsfs_caller *who,
			       struct dsfs_node *n, struct statvfs *sv)
{
	(void)who;
	(void)n;
	return fstatvfs(dsfs_overlay_st(fs)->root_fd, sv) ? -errno : 0;
}

/* After a change of name in dir: make it durable, then look it up. */
static int dsfs_overlay_made(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *dir, const char *name,
			     const char *path, struct dsfs_entry *e)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	char dpath[PATH_MAX];
	struct stat sb;
	int ret;

	dsfs_overlay_node_parent_path(path, dpath);
	dsfs_overlay_node_sync_dir(st, dpath);
	ret = dsfs_overlay_stat(st, who, path, &sb);
	return ret ? ret : dsfs_overlay_node_entry(fs, dir, name, &sb, e);
}

static int dsfs_overlay_mkdir(struct dsfs *fs, struct dsfs_caller *who,
			      struct dsfs_node *dir, const char *name,
			      mode_t mode, struct dsfs_entry *e)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	char path[PATH_MAX];
	int ret = dsfs_overlay_node_path(st, dir, name, path);

	if (ret)
		return ret;
	ret = dsfs_overlay_cred_take(st, who);
	if (!ret && mkdirat(st->root_fd, path, mode & 07777))
		ret = -errno;
	dsfs_overlay_cred_drop(st);
	return ret ? ret : dsfs_overlay_made(fs, who, dir, name, path, e);
}

static int dsfs_overlay_symlink(struct dsfs *fs, struct dsfs_caller *who,
				const char *link, struct dsfs_node *dir,
				const char *name, struct dsfs_entry *e)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	char path[PATH_MAX];
	int ret = dsfs_overlay_node_path(st, dir, name, path);

	if (ret)
		return ret;
	ret = dsfs_overlay_cred_take(st, who);
	if (!ret && symlinkat(link, st->root_fd, path))
		ret = -errno;
	dsfs_overlay_cred_drop(st);
	return ret ? ret : dsfs_overlay_made(fs, who, dir, name, path, e);
}

/* unlink or rmdir (flags AT_REMOVEDIR) of name in dir. */
static int dsfs_overlay_remove(struct dsfs *fs, struct dsfs_caller *who,
			       struct dsfs_node *dir, const char *name,
			       int flags)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	char path[PATH_MAX], dpath[PATH_MAX];
	int ret = dsfs_overlay_node_path(st, dir, name, path);

	if (ret)
		return ret;
	ret = dsfs_overlay_cred_take(st, who);
	if (!ret && unlinkat(st->root_fd, path, flags))
		ret = -errno;
	dsfs_overlay_cred_drop(st);
	if (ret)
		return ret;
	dsfs_overlay_node_parent_path(path, dpath);
	dsfs_overlay_node_sync_dir(st, dpath);
	dsfs_overlay_node_moved(fs, dir, name, NULL, NULL);
	return 0;
}

static int dsfs_overlay_unlink(struct dsfs *fs, struct dsfs_caller *who,
			       struct dsfs_node *dir, const char *name)
{
	return dsfs_overlay_remove(fs, who, dir, name, 0);
}

static int dsfs_overlay_rmdir(struct dsfs *fs, struct dsfs_caller *who,
			      struct dsfs_node *dir, const char *name)
{
	return dsfs_overlay_remove(fs, who, dir, name, AT_REMOVEDIR);
}

static int dsfs_overlay_rename(struct dsfs *fs, struct dsfs_caller *who,
			       struct dsfs_node *dir, const char *name,
			       struct dsfs_node *newdir, const char *newname,
			       unsigned flags)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	char from[PATH_MAX], to[PATH_MAX], dpath[PATH_MAX];
	int ret = dsfs_overlay_node_path(st, dir, name, from);

	if (!ret)
		ret = dsfs_overlay_node_path(st, newdir, newname, to);
	if (ret)
		return ret;
	ret = dsfs_overlay_cred_take(st, who);
	if (!ret && renameat2(st->root_fd, from, st->root_fd, to, flags))
		ret = -errno;
	dsfs_overlay_cred_drop(st);
	if (ret)
		return ret;
	/* temp + rename: the new name is durable when this returns. */
	dsfs_overlay_node_parent_path(to, dpath);
	dsfs_overlay_node_sync_dir(st, dpath);
	if (dir != newdir) {
		dsfs_overlay_node_parent_path(from, dpath);
		dsfs_overlay_node_sync_dir(st, dpath);
	}
	if (flags & RENAME_EXCHANGE) {
		/* Both places keep a file: let lookups find them anew. */
		dsfs_overlay_node_moved(fs, dir, name, NULL, NULL);
		dsfs_overlay_node_moved(fs, newdir, newname, NULL, NULL);
	} else {
		dsfs_overlay_node_moved(fs, dir, name, newdir, newname);
	}
	return 0;
}

/* ---- directories ---- */

struct dsfs_overlay_dir {
	pthread_mutex_t lock; /* leaf: the stream and its position */
	DIR *d;
	off_t pos; /* the cookie the stream is at */
};

static int dsfs_overlay_opendir(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct dsfs_overlay_dir *h;
	char path[PATH_MAX];
	int ret, fd = dsfs_overlay_node_open(dsfs_overlay_st(fs), who, n, NULL,
					     O_RDONLY | O_DIRECTORY |
						     O_NOFOLLOW | O_CLOEXEC,
					     0, path);

	if (fd < 0)
		return fd;
	h = calloc(1, sizeof(*h));
	if (!h || !(h->d = fdopendir(fd))) {
		ret = h ? -errno : -ENOMEM;
		free(h);
		close(fd);
		return ret;
	}
	pthread_mutex_init(&h->lock, NULL);
	fi->fh = (uintptr_t)h;
	return 0;
}

static int dsfs_overlay_readdir(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *n, struct fuse_file_info *fi,
				off_t off, struct dsfs_reply_dir *d)
{
	struct dsfs_overlay_dir *h =
		(struct dsfs_overlay_dir *)(uintptr_t)fi->fh;
	int ret = 0;

	pthread_mutex_lock(&h->lock);
	/* Entries' attributes (plus) are looked up as the caller. */
	ret = dsfs_overlay_cred_take(dsfs_overlay_st(fs), who);
	if (ret)
		goto out;
	if (off != h->pos) {
		seekdir(h->d, off);
		h->pos = off;
	}
	for (;;) {
		struct dsfs_entry e = { 0 };
		struct dirent *de;
		struct stat sb;

		errno = 0;
		de = readdir(h->d);
		if (!de) {
			ret = -errno;
			break;
		}
		if (d->plus && strcmp(de->d_name, ".") &&
		    strcmp(de->d_name, "..")) {
			if (!dsfs_reply_dir_fits(d, de->d_name)) {
				seekdir(h->d, h->pos); /* next time */
				break;
			}
			if (fstatat(dirfd(h->d), de->d_name, &sb,
				    AT_SYMLINK_NOFOLLOW)) {
				h->pos = de->d_off; /* gone since: skipped */
				continue;
			}
			ret = dsfs_overlay_node_entry(fs, n, de->d_name, &sb,
						      &e);
			if (ret)
				break;
		} else {
			e.attr.st_ino = de->d_ino;
			e.attr.st_mode = (mode_t)DTTOIF(de->d_type);
		}
		if (dsfs_reply_dir_add(d, de->d_name, &e, de->d_off)) {
			if (e.node) {
				struct dsfs_node *gone = dsfs_nodes_forget(
					&fs->nodes, e.node->ino, 1);

				if (gone) {
					dsfs_overlay_node_forget(fs, gone);
					dsfs_node_free(gone);
				}
			}
			seekdir(h->d, h->pos);
			break;
		}
		h->pos = de->d_off;
	}
out:
	dsfs_overlay_cred_drop(dsfs_overlay_st(fs));
	pthread_mutex_unlock(&h->lock);
	return ret;
}

static void dsfs_overlay_releasedir(struct dsfs *fs, struct dsfs_caller *who,
				    struct dsfs_node *n,
				    struct fuse_file_info *fi)
{
	struct dsfs_overlay_dir *h =
		(struct dsfs_overlay_dir *)(uintptr_t)fi->fh;

	(void)fs;
	(void)who;
	(void)n;
	if (!h)
		return;
	closedir(h->d);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

static int dsfs_overlay_fsyncdir(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, int datasync,
				 struct fuse_file_info *fi)
{
	struct dsfs_overlay_dir *h =
		(struct dsfs_overlay_dir *)(uintptr_t)fi->fh;

	(void)fs;
	(void)who;
	(void)n;
	if (datasync ? fdatasync(dirfd(h->d)) : fsync(dirfd(h->d)))
		return -errno;
	return 0;
}

const struct dsfs_subtree dsfs_overlay_subtree = {
	.name = "overlay",
	.init = dsfs_overlay_init,
	.destroy = dsfs_overlay_destroy,
	.forget = dsfs_overlay_forget,
	.lookup = dsfs_overlay_lookup,
	.mkdir = dsfs_overlay_mkdir,
	.symlink = dsfs_overlay_symlink,
	.unlink = dsfs_overlay_unlink,
	.rmdir = dsfs_overlay_rmdir,
	.rename = dsfs_overlay_rename,
	.create = dsfs_overlay_file_create,
	.getattr = dsfs_overlay_getattr,
	.setattr = dsfs_overlay_setattr,
	.access = dsfs_overlay_access,
	.readlink = dsfs_overlay_readlink,
	.statfs = dsfs_overlay_statfs,
	.open = dsfs_overlay_file_open,
	.read = dsfs_overlay_file_read,
	.write = dsfs_overlay_file_write,
	.flush = dsfs_overlay_file_flush,
	.fsync = dsfs_overlay_file_fsync,
	.fallocate = dsfs_overlay_file_fallocate,
	.release = dsfs_overlay_file_release,
	.opendir = dsfs_overlay_opendir,
	.readdir = dsfs_overlay_readdir,
	.releasedir = dsfs_overlay_releasedir,
	.fsyncdir = dsfs_overlay_fsyncdir,
};

const struct dsfs_subtree dsfs_overlay_off_subtree = {
	.name = "off",
};
