// SPDX-License-Identifier: MIT
/*
 * dsfs_overlay_file: the overlay's open files (see dsfs_overlay_i.h).
 *
 * An open file holds a descriptor of the underlying file, opened as the
 * caller (its permission is checked there, by the tree's file system),
 * and the version it had then (overlay_store_etag of the descriptor).
 * Only a regular file is ever opened (dsfs_overlay_node_open_file): a
 * FIFO or device put in its place underneath answers ESTALE, and the
 * kernel opens what it finds on its new lookup itself.
 *
 * Reads: a file opened read-only and at least overlay.min_cached_size big
 * and not matching overlay.no_cache is read through the block cache as object (dataset "overlay:DIR", key
 * its path, ETag its version): a file changed underneath is a new object,
 * never the old blocks. If the cache cannot serve a read (the file changed
 * or moved since the open, the cache refused), the file is read directly
 * from the descriptor from then on (direct, set once). Small files and
 * files opened for writing are always read directly.
 *
 * Passthrough (overlay.passthrough, off by default; dsfs_pt.h): a
 * read-only open that would read through the cache, of a version the
 * cache holds whole and recorded, is handed to the kernel with the cache's
 * data file as backing file (cache_open_passthrough of the object named
 * above: the version at open, never another's blocks). The kernel allows
 * no other kind of open of the inode beside it: an open for writing, or of
 * another version, meanwhile fails with ETXTBSY. Hence opt-in, for trees
 * this node only reads.
 *
 * Writes go to the descriptor. Durability: FLUSH (every close) and FSYNC
 * return once the written bytes are on the tree's file system (fsync of
 * the descriptor); CREATE returns once the new name is (fsync of the
 * directory).
 *
 * State of a handle: fd and etag immutable; direct and dirty are atomics.
 * Each worker thread has its own read buffer (thread-specific data).
 * The kernel keeps its cached pages of a file (keep_cache) only when an
 * open finds the version the previous open of the node saw.
 */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsfs_cacheread.h"
#include "dsfs_opts.h"
#include "dsfs_overlay_i.h"
#include "dstage/cache.h"
#include "dstage/log.h"

struct dsfs_overlay_file {
	int fd;
	uint64_t size; /* at open: the cache object's size */
	char etag[OVERLAY_ETAG_MAX];
	char *key; /* path at open */
	atomic_bool direct; /* read from fd, not through the cache */
	atomic_bool dirty; /* written since the last fsync */
	enum dsfs_pt_kind kind; /* how the open was answered */
};

static struct dsfs_overlay_file *
dsfs_overlay_file_of(const struct fuse_file_info *fi)
{
	return (struct dsfs_overlay_file *)(uintptr_t)fi->fh;
}

bool dsfs_overlay_file_no_cache(const struct dsfs_overlay *st, const char *path)
{
	const char *base = strrchr(path, '/');

	base = base ? base + 1 : path;
	for (char **p = st->no_cache; p && *p; p++)
		if (!fnmatch(*p, strchr(*p, '/') ? path : base,
			     strchr(*p, '/') ? FNM_PATHNAME : 0))
			return true;
	return false;
}

int dsfs_overlay_file_fd(const struct fuse_file_info *fi)
{
	return dsfs_overlay_file_of(fi)->fd;
}

struct dsfs_overlay_file_backing {
	struct dsfs *fs;
	struct dsfs_overlay *st;
	struct dsfs_overlay_file *f;
};

/* The backing file of a passthrough open: the cache's data file of the
 * version opened, when the cache holds it whole and recorded. */
static int dsfs_overlay_file_backing(void *arg, int *fd)
{
	struct dsfs_overlay_file_backing *b = arg;
	struct cache_object obj = {
		.dataset = b->st->label,
		.os = b->st->os,
		.key = b->f->key,
		.etag = b->f->etag,
		.size = b->f->size,
	};

	return cache_open_passthrough(b->fs->cache, &obj, fd);
}

/* Wrap fd (opened with flags for path) in a handle: fi->fh. who: the
 * caller of an open (NULL for a create: never passed through). */
static int dsfs_overlay_file_new(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, int fd, const char *path,
				 struct fuse_file_info *fi)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	struct dsfs_overlay_node *p = n->priv;
	struct dsfs_overlay_file *f;
	bool rdonly = (fi->flags & O_ACCMODE) == O_RDONLY;
	struct stat sb;
	int ret;

	if (fstat(fd, &sb))
		return -errno;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->key = strdup(path);
	if (!f->key) {
		free(f);
		return -ENOMEM;
	}
	f->fd = fd;
	f->size = (uint64_t)sb.st_size;
	overlay_store_etag(&sb, f->etag, sizeof(f->etag));
	atomic_init(&f->direct, !rdonly || !S_ISREG(sb.st_mode) || !fs->cache ||
					f->size < st->min_cached ||
					dsfs_overlay_file_no_cache(st, path));
	atomic_init(&f->dirty, false);
	if (who) {
		struct dsfs_overlay_file_backing b = { fs, st, f };

		ret = dsfs_pt_open(fs, who, &p->pt,
				   st->passthrough && !atomic_load(&f->direct),
				   dsfs_overlay_file_backing, &b, f->etag, fi,
				   st->label, path, &f->kind);
	} else {
		ret = dsfs_pt_open(fs, NULL, &p->pt, false, NULL, NULL, "", fi,
				   st->label, path, &f->kind);
	}
	if (ret) {
		log_info("overlay %s: %s: refused %s open (ETXTBSY): it is "
			 "open in passthrough (overlay.passthrough)",
			 st->dir, path,
			 rdonly ? "another version's" : "a writing");
		free(f->key);
		free(f);
		return ret;
	}
	pthread_mutex_lock(&st->lock);
	fi->keep_cache = rdonly && !strcmp(p->etag, f->etag);
	if (rdonly)
		memcpy(p->etag, f->etag, sizeof(p->etag));
	else
		p->etag[0] = '\0';
	pthread_mutex_unlock(&st->lock);
	if (f->kind == DSFS_PT_PASSED)
		fi->keep_cache = 0; /* the backing file's pages, not ours */
	fi->fh = (uintptr_t)f;
	return 0;
}

/* open(2) flags for the underlying file from the kernel's. */
static int dsfs_overlay_file_flags(int flags)
{
	flags &= ~(O_CREAT | O_EXCL | O_NOCTTY | O_DIRECT);
	return flags | O_CLOEXEC | O_NOFOLLOW;
}

int dsfs_overlay_file_open(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *n, struct fuse_file_info *fi)
{
	char path[PATH_MAX];
	int ret, fd = dsfs_overlay_node_open_file(
			 dsfs_overlay_st(fs), who, n, NULL,
			 dsfs_overlay_file_flags(fi->flags), 0, path);

	if (fd < 0)
		return fd;
	ret = dsfs_overlay_file_new(fs, who, n, fd, path, fi);
	if (ret)
		close(fd);
	return ret;
}

int dsfs_overlay_file_create(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *dir, const char *name,
			     mode_t mode, struct fuse_file_info *fi,
			     struct dsfs_entry *e)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	char path[PATH_MAX], dpath[PATH_MAX];
	struct stat sb;
	int ret, fd = dsfs_overlay_node_open_file(
			 st, who, dir, name,
			 dsfs_overlay_file_flags(fi->flags) | O_CREAT |
				 (fi->flags & O_EXCL),
			 mode & 07777, path);

	if (fd < 0)
		return fd;
	if (fstat(fd, &sb)) {
		ret = -errno;
		close(fd);
		return ret;
	}
	dsfs_overlay_node_parent_path(path, dpath);
	dsfs_overlay_node_sync_dir(st, dpath);
	ret = dsfs_overlay_node_entry(fs, dir, name, &sb, e);
	if (!ret)
		ret = dsfs_overlay_file_new(fs, NULL, e->node, fd, path, fi);
	if (ret) {
		close(fd);
		if (e->node) {
			struct dsfs_node *gone =
				dsfs_nodes_forget(&fs->nodes, e->node->ino, 1);

			if (gone) {
				dsfs_overlay_node_forget(fs, gone);
				dsfs_node_free(gone);
			}
			e->node = NULL;
		}
	}
	return ret;
}

/* Each worker thread's read buffer, grown to the largest read it served,
 * freed when the thread exits. */
/* One read directly from the descriptor, answered from a thread buffer. */
static int dsfs_overlay_file_read_direct(struct dsfs_overlay_file *f,
					 size_t size, off_t off,
					 struct dsfs_reply_read *r)
{
	char *buf = dsfs_cacheread_buf(size);
	size_t done = 0;

	if (!buf)
		return -ENOMEM;
	while (done < size) {
		ssize_t got = pread(f->fd, buf + done, size - done,
				    off + (off_t)done);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -errno;
		if (!got)
			break;
		done += (size_t)got;
	}
	return dsfs_reply_read_buf(r, buf, done);
}

int dsfs_overlay_file_read(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *n, struct fuse_file_info *fi,
			   size_t size, off_t off, struct dsfs_reply_read *r)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	struct dsfs_overlay_file *f = dsfs_overlay_file_of(fi);
	struct cache_object obj = {
		.dataset = st->label,
		.os = st->os,
		.key = f->key,
		.etag = f->etag,
		.size = f->size,
	};
	uint64_t uoff = (uint64_t)off;
	int ret;

	(void)who;
	(void)n;
	if (off < 0)
		return -EINVAL;
	atomic_fetch_add_explicit(&fs->ctr.reads, 1, memory_order_relaxed);
	if (atomic_load(&f->direct))
		return dsfs_overlay_file_read_direct(f, size, off, r);
	if (uoff >= f->size || !size)
		return 0;
	if (size > f->size - uoff)
		size = (size_t)(f->size - uoff);
	ret = dsfs_cacheread_reply(fs, &obj, uoff, size, r);
	if (!ret)
		return 0;
	/* The file changed or moved since it was opened, or the cache
	 * failed: the descriptor still has the bytes. */
	if (!atomic_exchange(&f->direct, true))
		log_info("overlay %s: %s: read directly from now on (the cache "
			 "could not serve it: %s)",
			 st->dir, f->key, strerror(-ret));
	return dsfs_overlay_file_read_direct(f, size, off, r);
}

ssize_t dsfs_overlay_file_write(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *n, struct fuse_file_info *fi,
				const char *buf, size_t size, off_t off)
{
	struct dsfs_overlay_file *f = dsfs_overlay_file_of(fi);
	ssize_t w;

	(void)fs;
	(void)who;
	(void)n;
	do
		w = pwrite(f->fd, buf, size, off);
	while (w < 0 && errno == EINTR);
	if (w < 0)
		return -errno;
	atomic_store(&f->dirty, true);
	atomic_store(&f->direct, true);
	return w;
}

static int dsfs_overlay_file_sync(struct dsfs_overlay_file *f, int datasync)
{
	if (!atomic_exchange(&f->dirty, false))
		return 0;
	if ((datasync ? fdatasync(f->fd) : fsync(f->fd)) == 0)
		return 0;
	atomic_store(&f->dirty, true);
	return -errno;
}

int dsfs_overlay_file_flush(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, struct fuse_file_info *fi)
{
	(void)fs;
	(void)who;
	(void)n;
	return dsfs_overlay_file_sync(dsfs_overlay_file_of(fi), 0);
}

int dsfs_overlay_file_fsync(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, int datasync,
			    struct fuse_file_info *fi)
{
	struct dsfs_overlay_file *f = dsfs_overlay_file_of(fi);

	(void)fs;
	(void)who;
	(void)n;
	/* An fsync asks for the whole file, written here or not. */
	atomic_store(&f->dirty, true);
	return dsfs_overlay_file_sync(f, datasync);
}

int dsfs_overlay_file_fallocate(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *n, int mode, off_t off,
				off_t len, struct fuse_file_info *fi)
{
	struct dsfs_overlay_file *f = dsfs_overlay_file_of(fi);

	(void)fs;
	(void)who;
	(void)n;
	if (fallocate(f->fd, mode, off, len))
		return -errno;
	atomic_store(&f->dirty, true);
	return 0;
}

void dsfs_overlay_file_release(struct dsfs *fs, struct dsfs_caller *who,
			       struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct dsfs_overlay_file *f = dsfs_overlay_file_of(fi);
	struct dsfs_overlay_node *p = n->priv;

	(void)fs;
	if (!f)
		return;
	dsfs_pt_release(who, &p->pt, f->kind);
	close(f->fd);
	free(f->key);
	free(f);
}
