// SPDX-License-Identifier: MIT
/*
 * dsfs_ops: the FUSE low-level operations of dstagefs. Each one finds the
 * node, dispatches to the node's subtree (struct dsfs_subtree) and turns the
 * subtree's 0 / -errno into the one FUSE reply. Modifying operations whose
 * hook a subtree leaves NULL are answered EROFS: the dataset view is
 * read-only, and the checkpoint subtree becomes writable by filling in its
 * hooks, without touching this file.
 *
 * Stateless apart from struct dsfs (see dsfs.h for its locks).
 *
 * Open handles: the fi->fh the kernel holds is a struct dsfs_handle, kept on
 * fs->handles from the OPEN/OPENDIR/CREATE reply until RELEASE/RELEASEDIR;
 * subtrees see their own fh only (dsfs_fi_sub). Whatever the kernel never
 * releases (the session ended first) dsfs_handles_release releases at
 * teardown, so no subtree state outlives the mount.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "dsfs.h"
#include "dstage/cache.h"
#include "dstage/log.h"

static struct dsfs *dsfs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

struct dsfs_handle {
	struct dsfs_handle *prev, *next; /* fs->handle_lock */
	struct dsfs_node *n; /* kept by the kernel's lookup while open */
	uint64_t fh; /* the subtree's */
	int flags; /* open(2) flags, for the subtree's release */
	bool dir;
};

/* Call the subtree's release for what it handed out (fh, with the open
 * flags it saw). */
static void dsfs_sub_release(struct dsfs *fs, struct dsfs_node *n, bool dir,
			     uint64_t fh, int flags)
{
	struct fuse_file_info fi = { .flags = flags, .fh = fh };

	if (dir && n->sub->releasedir)
		n->sub->releasedir(fs, n, &fi);
	else if (!dir && n->sub->release)
		n->sub->release(fs, n, &fi);
}

/* Wrap the subtree's fi->fh in a handle on fs->handles. On -ENOMEM the
 * subtree's handle is released here. */
static int dsfs_handle_add(struct dsfs *fs, struct dsfs_node *n,
			   struct fuse_file_info *fi, bool dir)
{
	struct dsfs_handle *h = calloc(1, sizeof(*h));

	if (!h) {
		dsfs_sub_release(fs, n, dir, fi->fh, fi->flags);
		return -ENOMEM;
	}
	h->n = n;
	h->fh = fi->fh;
	h->flags = fi->flags;
	h->dir = dir;
	pthread_mutex_lock(&fs->handle_lock);
	h->next = fs->handles;
	if (h->next)
		h->next->prev = h;
	fs->handles = h;
	pthread_mutex_unlock(&fs->handle_lock);
	fi->fh = (uintptr_t)h;
	return 0;
}

/* The subtree's view of fi (its own fh). fi may be NULL. */
static struct fuse_file_info *dsfs_fi_sub(const struct fuse_file_info *fi,
					  struct fuse_file_info *sub)
{
	if (!fi)
		return NULL;
	*sub = *fi;
	sub->fh = ((struct dsfs_handle *)(uintptr_t)fi->fh)->fh;
	return sub;
}

/* RELEASE / RELEASEDIR: take h off fs->handles, release what it wraps. */
static void dsfs_handle_release(struct dsfs *fs, struct dsfs_handle *h)
{
	pthread_mutex_lock(&fs->handle_lock);
	if (h->prev)
		h->prev->next = h->next;
	else
		fs->handles = h->next;
	if (h->next)
		h->next->prev = h->prev;
	pthread_mutex_unlock(&fs->handle_lock);
	dsfs_sub_release(fs, h->n, h->dir, h->fh, h->flags);
	free(h);
}

void dsfs_handles_release(struct dsfs *fs)
{
	struct dsfs_handle *h;
	size_t n = 0;

	pthread_mutex_lock(&fs->handle_lock);
	h = fs->handles;
	fs->handles = NULL;
	pthread_mutex_unlock(&fs->handle_lock);
	while (h) {
		struct dsfs_handle *next = h->next;

		dsfs_sub_release(fs, h->n, h->dir, h->fh, h->flags);
		free(h);
		h = next;
		n++;
	}
	if (n)
		log_info("released %zu handle(s) the kernel left open", n);
}

void dsfs_caller_get(fuse_req_t req, struct dsfs_caller *who)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	who->uid = ctx->uid;
	who->gid = ctx->gid;
	who->pid = ctx->pid;
	who->req = req;
	who->ngroups = -1;
}

void dsfs_caller_load_groups(struct dsfs_caller *who)
{
	if (who->ngroups == -1) {
		int n = fuse_req_getgroups(
			who->req,
			(int)(sizeof(who->groups) / sizeof(who->groups[0])),
			who->groups);

		if (n > (int)(sizeof(who->groups) / sizeof(who->groups[0])))
			n = (int)(sizeof(who->groups) / sizeof(who->groups[0]));
		who->ngroups = n < 0 ? -2 : n;
	}
}

bool dsfs_caller_in_group(struct dsfs_caller *who, gid_t gid)
{
	if (who->gid == gid)
		return true;
	dsfs_caller_load_groups(who);
	for (int i = 0; i < who->ngroups; i++)
		if (who->groups[i] == gid)
			return true;
	return false;
}

static double dsfs_timeout(struct dsfs *fs, const struct dsfs_node *n)
{
	return n->sub->timeout ? n->sub->timeout(fs, n) : 0;
}

static int dsfs_access_check(struct dsfs *fs, struct dsfs_node *n,
			     struct dsfs_caller *who, int mask)
{
	if (n->sub->access)
		return n->sub->access(fs, n, who, mask);
	return (mask & W_OK) ? -EROFS : 0;
}

static void dsfs_entry_fill(struct dsfs *fs, struct dsfs_node *n,
			    struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = n->ino;
	e->generation = 1;
	n->sub->stat(fs, n, &e->attr);
	e->attr_timeout = dsfs_timeout(fs, n);
	e->entry_timeout = e->attr_timeout;
}

bool dsfs_dirbuf_fits(const struct dsfs_dirbuf *db, const char *name)
{
	size_t need =
		db->plus ? fuse_add_direntry_plus(db->req, NULL, 0, name, NULL,
						  0)
			 : fuse_add_direntry(db->req, NULL, 0, name, NULL, 0);

	return db->used + need <= db->size;
}

int dsfs_dirbuf_add(struct dsfs_dirbuf *db, const char *name,
		    struct dsfs_node *n, fuse_ino_t ino, mode_t mode, off_t off)
{
	char *p = db->buf + db->used;
	size_t left = db->size - db->used, need;

	if (!dsfs_dirbuf_fits(db, name))
		return 1;
	if (db->plus) {
		struct fuse_entry_param e;

		if (n) {
			dsfs_entry_fill(db->fs, n, &e);
		} else {
			/* "." and "..": no node id, so the kernel takes
			 * no lookup reference. */
			memset(&e, 0, sizeof(e));
			e.attr.st_ino = ino;
			e.attr.st_mode = mode;
		}
		need = fuse_add_direntry_plus(db->req, p, left, name, &e, off);
	} else {
		struct stat st = { 0 };

		if (n)
			n->sub->stat(db->fs, n, &st);
		else
			st.st_mode = mode;
		st.st_ino = n ? n->ino : ino;
		need = fuse_add_direntry(db->req, p, left, name, &st, off);
	}
	db->used += need;
	return 0;
}

/* ---- lifecycle ---- */

static void dsfs_op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct dsfs *fs = userdata;
	unsigned max_write = fs->opts->max_write_kb * 1024;

	/*
	 * Request size: the kernel's max_pages follows max_write (libfuse
	 * 3.14 caps it at its buffer, 256 pages), and max_pages bounds READ
	 * requests too; max_read is unlimited unless -o max_read says so.
	 * conn->max_readahead cannot exceed what the kernel offered (its
	 * bdi's read_ahead_kb, 128 KiB by default): the poller raises the
	 * bdi's read_ahead_kb after mounting instead (opts.read_ahead_kb).
	 */
	conn->max_write = max_write;
	if (fs->opts->splice) {
		if (conn->capable & FUSE_CAP_SPLICE_WRITE)
			conn->want |= FUSE_CAP_SPLICE_WRITE;
		if (conn->capable & FUSE_CAP_SPLICE_MOVE)
			conn->want |= FUSE_CAP_SPLICE_MOVE;
	}
	if (conn->capable & FUSE_CAP_READDIRPLUS) {
		conn->want |= FUSE_CAP_READDIRPLUS;
		conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
	}
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	/* Snapshots never change: no invalidation on mtime changes. */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	if (conn->capable & FUSE_CAP_EXPLICIT_INVAL_DATA)
		conn->want |= FUSE_CAP_EXPLICIT_INVAL_DATA;
	if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
		conn->want |= FUSE_CAP_CACHE_SYMLINKS;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	log_info("fuse: protocol %u.%u, max_write %u, max_readahead %u, "
		 "splice %s, readdirplus %s",
		 conn->proto_major, conn->proto_minor, conn->max_write,
		 conn->max_readahead,
		 (conn->want & FUSE_CAP_SPLICE_WRITE) ? "on" : "off",
		 (conn->want & FUSE_CAP_READDIRPLUS) ? "on" : "off");
}

/* ---- names ---- */

static void dsfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *dir = dsfs_node_find(fs, parent), *n = NULL;
	struct fuse_entry_param e;
	struct dsfs_caller who;
	int ret;

	if (!dir) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	if (!dir->sub->lookup) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	dsfs_caller_get(req, &who);
	ret = dir->sub->lookup(fs, dir, name, &who, &n);
	if (ret == -ENOENT && dir->sub->neg_timeout) {
		double t = dir->sub->neg_timeout(fs, dir);

		if (t > 0) {
			memset(&e, 0, sizeof(e));
			e.entry_timeout = t;
			fuse_reply_entry(req, &e);
			return;
		}
	}
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	dsfs_entry_fill(fs, n, &e);
	if (fuse_reply_entry(req, &e) == -ENOENT)
		dsfs_node_forget(fs, n->ino, 1); /* request interrupted */
}

static void dsfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	dsfs_node_forget(dsfs_of(req), ino, nlookup);
	fuse_reply_none(req);
}

static void dsfs_op_forget_multi(fuse_req_t req, size_t count,
				 struct fuse_forget_data *forgets)
{
	struct dsfs *fs = dsfs_of(req);

	for (size_t i = 0; i < count; i++)
		dsfs_node_forget(fs, forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

static void dsfs_op_getattr(fuse_req_t req, fuse_ino_t ino,
			    struct fuse_file_info *fi)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);
	struct dsfs_caller who;
	struct stat st;
	int ret;

	(void)fi;
	if (!n) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	dsfs_caller_get(req, &who);
	ret = dsfs_access_check(fs, n, &who, 0);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	n->sub->stat(fs, n, &st);
	fuse_reply_attr(req, &st, dsfs_timeout(fs, n));
}

static void dsfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
			    int to_set, struct fuse_file_info *fi)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);
	struct stat st;
	int ret;

	if (!n) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	struct fuse_file_info sfi;

	ret = n->sub->setattr ? n->sub->setattr(fs, n, attr, to_set,
						dsfs_fi_sub(fi, &sfi))
			      : -EROFS;
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	n->sub->stat(fs, n, &st);
	fuse_reply_attr(req, &st, dsfs_timeout(fs, n));
}

static void dsfs_op_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);
	struct dsfs_caller who;

	if (!n) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	dsfs_caller_get(req, &who);
	fuse_reply_err(req, -dsfs_access_check(fs, n, &who, mask));
}

/* Reply to an operation that made a node (create, mkdir). */
static void dsfs_reply_new(fuse_req_t req, struct dsfs *fs, int ret,
			   struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct fuse_entry_param e;

	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	dsfs_entry_fill(fs, n, &e);
	if (fi)
		fuse_reply_create(req, &e, fi);
	else
		fuse_reply_entry(req, &e);
}

static void dsfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
			  mode_t mode)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *dir = dsfs_node_find(fs, parent), *n = NULL;
	struct dsfs_caller who;
	int ret;

	if (!dir) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	dsfs_caller_get(req, &who);
	ret = dir->sub->mkdir ? dir->sub->mkdir(fs, dir, name, mode, &who, &n)
			      : -EROFS;
	dsfs_reply_new(req, fs, ret, n, NULL);
}

static void dsfs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
			   mode_t mode, struct fuse_file_info *fi)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *dir = dsfs_node_find(fs, parent), *n = NULL;
	struct dsfs_caller who;
	int ret;

	if (!dir) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	dsfs_caller_get(req, &who);
	ret = dir->sub->create
		      ? dir->sub->create(fs, dir, name, mode, &who, fi, &n)
		      : -EROFS;
	if (!ret)
		ret = dsfs_handle_add(fs, n, fi, false);
	dsfs_reply_new(req, fs, ret, n, fi);
}

static void dsfs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
			  mode_t mode, dev_t rdev)
{
	(void)parent;
	(void)name;
	(void)mode;
	(void)rdev;
	fuse_reply_err(req, EROFS);
}

static void dsfs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
			    const char *name)
{
	(void)link;
	(void)parent;
	(void)name;
	fuse_reply_err(req, EROFS);
}

static void dsfs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
			 const char *newname)
{
	(void)ino;
	(void)newparent;
	(void)newname;
	fuse_reply_err(req, EROFS);
}

static void dsfs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *dir = dsfs_node_find(fs, parent);

	if (!dir) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	fuse_reply_err(req, dir->sub->unlink ? -dir->sub->unlink(fs, dir, name)
					     : EROFS);
}

static void dsfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *dir = dsfs_node_find(fs, parent);

	if (!dir) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	fuse_reply_err(req, dir->sub->rmdir ? -dir->sub->rmdir(fs, dir, name)
					    : EROFS);
}

static void dsfs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
			   fuse_ino_t newparent, const char *newname,
			   unsigned int flags)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *dir = dsfs_node_find(fs, parent);
	struct dsfs_node *ndir = dsfs_node_find(fs, newparent);

	if (!dir || !ndir) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	/* Only within one subtree; across subtrees is another device. */
	if (dir->sub != ndir->sub || !dir->sub->rename) {
		fuse_reply_err(req, dir->sub->rename ? EXDEV : EROFS);
		return;
	}
	fuse_reply_err(req,
		       -dir->sub->rename(fs, dir, name, ndir, newname, flags));
}

/* ---- files ---- */

static void dsfs_op_open(fuse_req_t req, fuse_ino_t ino,
			 struct fuse_file_info *fi)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);
	struct dsfs_caller who;
	int ret;

	if (!n) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	dsfs_caller_get(req, &who);
	ret = n->sub->open ? n->sub->open(fs, n, &who, fi) : -EISDIR;
	if (!ret)
		ret = dsfs_handle_add(fs, n, fi, false);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	if (fuse_reply_open(req, fi) == -ENOENT) /* interrupted: no RELEASE */
		dsfs_handle_release(fs,
				    (struct dsfs_handle *)(uintptr_t)fi->fh);
}

static void dsfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			 struct fuse_file_info *fi)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);

	if (!n || !n->sub->read) {
		fuse_reply_err(req, n ? EISDIR : ESTALE);
		return;
	}
	struct fuse_file_info sfi;

	n->sub->read(req, fs, n, dsfs_fi_sub(fi, &sfi), size, off);
}

static void dsfs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
			  size_t size, off_t off, struct fuse_file_info *fi)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);
	ssize_t w;

	if (!n) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	struct fuse_file_info sfi;

	w = n->sub->write ? n->sub->write(fs, n, dsfs_fi_sub(fi, &sfi), buf,
					  size, off)
			  : -EROFS;
	if (w < 0)
		fuse_reply_err(req, (int)-w);
	else
		fuse_reply_write(req, (size_t)w);
}

static void dsfs_op_flush(fuse_req_t req, fuse_ino_t ino,
			  struct fuse_file_info *fi)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);

	if (!n) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	struct fuse_file_info sfi;

	fuse_reply_err(req,
		       n->sub->flush
			       ? -n->sub->flush(fs, n, dsfs_fi_sub(fi, &sfi))
			       : 0);
}

static void dsfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
			  struct fuse_file_info *fi)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);

	if (!n) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	struct fuse_file_info sfi;

	fuse_reply_err(req, n->sub->fsync
				    ? -n->sub->fsync(fs, n, datasync,
						     dsfs_fi_sub(fi, &sfi))
				    : 0);
}

static void dsfs_op_release(fuse_req_t req, fuse_ino_t ino,
			    struct fuse_file_info *fi)
{
	(void)ino;
	dsfs_handle_release(dsfs_of(req),
			    (struct dsfs_handle *)(uintptr_t)fi->fh);
	fuse_reply_err(req, 0);
}

static void dsfs_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode,
			      off_t offset, off_t length,
			      struct fuse_file_info *fi)
{
	(void)ino;
	(void)mode;
	(void)offset;
	(void)length;
	(void)fi;
	fuse_reply_err(req, EROFS);
}

/* ---- directories ---- */

static void dsfs_op_opendir(fuse_req_t req, fuse_ino_t ino,
			    struct fuse_file_info *fi)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);
	struct dsfs_caller who;
	int ret;

	if (!n) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	if (!n->sub->readdir) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	dsfs_caller_get(req, &who);
	ret = n->sub->opendir ? n->sub->opendir(fs, n, &who, fi) : 0;
	if (!ret)
		ret = dsfs_handle_add(fs, n, fi, true);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	if (fuse_reply_open(req, fi) == -ENOENT)
		dsfs_handle_release(fs,
				    (struct dsfs_handle *)(uintptr_t)fi->fh);
}

static void dsfs_readdir_any(fuse_req_t req, fuse_ino_t ino, size_t size,
			     off_t off, struct fuse_file_info *fi, bool plus)
{
	struct dsfs *fs = dsfs_of(req);
	struct dsfs_node *n = dsfs_node_find(fs, ino);
	struct dsfs_dirbuf db = { .req = req, .fs = fs, .plus = plus };
	int ret;

	if (!n) {
		fuse_reply_err(req, ESTALE);
		return;
	}
	db.size = size;
	db.buf = malloc(size ? size : 1);
	if (!db.buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	struct fuse_file_info sfi;

	ret = n->sub->readdir(fs, n, dsfs_fi_sub(fi, &sfi), off, &db);
	/* Entries already added were counted as looked up (plus): they
	 * must go out even if a later one failed. */
	if (ret && !db.used)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_buf(req, db.buf, db.used);
	free(db.buf);
}

static void dsfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
			    off_t off, struct fuse_file_info *fi)
{
	dsfs_readdir_any(req, ino, size, off, fi, false);
}

static void dsfs_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
				off_t off, struct fuse_file_info *fi)
{
	dsfs_readdir_any(req, ino, size, off, fi, true);
}

static void dsfs_op_releasedir(fuse_req_t req, fuse_ino_t ino,
			       struct fuse_file_info *fi)
{
	(void)ino;
	dsfs_handle_release(dsfs_of(req),
			    (struct dsfs_handle *)(uintptr_t)fi->fh);
	fuse_reply_err(req, 0);
}

static void dsfs_op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct dsfs *fs = dsfs_of(req);
	struct cache_stats cs;
	struct statvfs sv = { 0 };

	(void)ino;
	cache_get_stats(fs->cache, &cs);
	sv.f_bsize = 4096;
	sv.f_frsize = 4096;
	sv.f_blocks = cs.capacity / 4096;
	sv.f_bfree = cs.capacity > cs.used ? (cs.capacity - cs.used) / 4096 : 0;
	sv.f_bavail = sv.f_bfree;
	sv.f_namemax = 255;
	fuse_reply_statfs(req, &sv);
}

/* ---- extended attributes: none; setting them is a modification ---- */

static void dsfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			     const char *value, size_t size, int flags)
{
	(void)ino;
	(void)name;
	(void)value;
	(void)size;
	(void)flags;
	fuse_reply_err(req, EROFS);
}

static void dsfs_op_removexattr(fuse_req_t req, fuse_ino_t ino,
				const char *name)
{
	(void)ino;
	(void)name;
	fuse_reply_err(req, EROFS);
}

const struct fuse_lowlevel_ops dsfs_ll_ops = {
	.init = dsfs_op_init,
	.lookup = dsfs_op_lookup,
	.forget = dsfs_op_forget,
	.forget_multi = dsfs_op_forget_multi,
	.getattr = dsfs_op_getattr,
	.setattr = dsfs_op_setattr,
	.access = dsfs_op_access,
	.mknod = dsfs_op_mknod,
	.mkdir = dsfs_op_mkdir,
	.unlink = dsfs_op_unlink,
	.rmdir = dsfs_op_rmdir,
	.symlink = dsfs_op_symlink,
	.rename = dsfs_op_rename,
	.link = dsfs_op_link,
	.create = dsfs_op_create,
	.open = dsfs_op_open,
	.read = dsfs_op_read,
	.write = dsfs_op_write,
	.flush = dsfs_op_flush,
	.fsync = dsfs_op_fsync,
	.release = dsfs_op_release,
	.fallocate = dsfs_op_fallocate,
	.opendir = dsfs_op_opendir,
	.readdir = dsfs_op_readdir,
	.readdirplus = dsfs_op_readdirplus,
	.releasedir = dsfs_op_releasedir,
	.statfs = dsfs_op_statfs,
	.setxattr = dsfs_op_setxattr,
	.removexattr = dsfs_op_removexattr,
};
