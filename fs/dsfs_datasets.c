// SPDX-License-Identifier: MIT
/*
 * dsfs_datasets: the dataset subtree, datasets/ (inode 2) and
 * datasets/<name>/<key...> below it, read-only.
 *
 * It owns the dataset table (dsfs_dataset.c; fs->datasets): made in init,
 * refreshed by the poll hook, which then sends the kernel invalidations
 * for the names that changed (fuse_lowlevel_notify_inval_entry on
 * datasets/NAME: that cannot run inside a lookup of datasets/, where the
 * kernel holds the directory's lock, hence the table's queue), freed in
 * destroy.
 *
 * A struct dsfs_dataset is one version. Its root node matches only while
 * it is the current version; after a refresh the next lookup makes a new
 * root (a new inode), while open files keep reading their own version by
 * ETag (If-Match): a source that changed gives EIO, never mixed bytes.
 *
 * Everything below a dataset root is served from the catalog manifest
 * (catalog_lookup, catalog_readdir) and never from the network; each node's
 * priv (struct dsfs_datasets_node) carries size, mtime and ETag, so getattr
 * needs no query. A node's priv is immutable but for error_logged (an
 * atomic); it is freed by the forget hook. datasets/ itself has no priv.
 *
 * Locks: the dataset table's lock is held (read) while nodes for
 * datasets/ are made in readdirplus (then the node table's). Open
 * directories have a per-handle mutex (one readdir at a time). Each file
 * node has pt.lock (a leaf, held across the cache's passthrough check:
 * one node's opens wait for each other, no one else's; dsfs_pt.h).
 *
 * Passthrough (docs/dstagefs.md): with fs->passthrough, an open of a file
 * whose object the cache holds complete and recorded is answered with a
 * backing file (cache_open_passthrough) and the kernel serves its reads;
 * each file node's opens are counted in its struct dsfs_pt (dsfs_pt.h:
 * one backing file an inode, never mixed with plain opens).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsfs_cacheread.h"
#include "dsfs_dataset.h"
#include "dsfs_datasets.h"
#include "dsfs_opts.h"
#include "dsfs_pt.h"
#include "dstage/cache.h"
#include "dstage/log.h"

/* d_ino of plain readdir entries whose node does not exist yet. */
#define DSFS_DATASETS_UNKNOWN_INO 0xffffffffu

/* A node below datasets/ (a dataset root has path ""). */
struct dsfs_datasets_node {
	struct dsfs_dataset *ds; /* a reference */
	char *path; /* key of a file, path of a dir ("" for the root) */
	uint64_t size;
	int64_t mtime;
	char *etag; /* "" when the source gave none */
	bool dir;
	atomic_bool error_logged; /* read errors are logged once per node */
	struct dsfs_pt pt; /* files: what is open (see "Passthrough") */
	/* path and etag point here: one malloc a node, not three */
	char strs[];
};

static void dsfs_datasets_node_free(struct dsfs_datasets_node *p)
{
	if (!p)
		return;
	dsfs_pt_destroy(&p->pt);
	dsfs_dataset_put(p->ds);
	free(p);
}

static void dsfs_datasets_forget(struct dsfs *fs, struct dsfs_node *n)
{
	(void)fs;
	dsfs_datasets_node_free(n->priv);
	n->priv = NULL;
}

/* Drop a lookup this subtree took itself (a listing that did not fit). */
static void dsfs_datasets_unref(struct dsfs *fs, struct dsfs_node *n)
{
	struct dsfs_node *dead = dsfs_nodes_forget(&fs->nodes, n->ino, 1);

	if (dead) {
		dsfs_datasets_forget(fs, dead);
		dsfs_node_free(dead);
	}
}

static int dsfs_datasets_init(struct dsfs *fs)
{
	int ret = dsfs_dataset_table_new(fs->cfg, &fs->datasets);

	if (ret)
		return ret;
	return dsfs_nodes_add_fixed(&fs->nodes, DSFS_INO_DATASETS,
				    DSFS_INO_ROOT, &dsfs_datasets_subtree,
				    "datasets", NULL);
}

static void dsfs_datasets_destroy(struct dsfs *fs)
{
	dsfs_dataset_table_free(fs->datasets);
	fs->datasets = NULL;
}

static void dsfs_datasets_poll(struct dsfs *fs)
{
	int ret = dsfs_dataset_table_refresh(fs->datasets);
	char **names;
	size_t n;

	if (ret)
		log_warn("catalog poll failed: %s (keeping the current "
			 "datasets)",
			 strerror(-ret));
	n = dsfs_dataset_table_take_changed(fs->datasets, &names);
	for (size_t i = 0; i < n; i++) {
		/* -ENOENT: the kernel had no such entry; nothing to drop. */
		if (!atomic_load(&fs->stopping))
			fuse_lowlevel_notify_inval_entry(
				fs->se, DSFS_INO_DATASETS, names[i],
				strlen(names[i]));
		free(names[i]);
	}
	if (n && !atomic_load(&fs->stopping))
		fuse_lowlevel_notify_inval_inode(fs->se, DSFS_INO_DATASETS, 0,
						 0);
	free(names);
}

/* Attributes of a node below datasets/ (p NULL: datasets/ itself). */
static void dsfs_datasets_attr(struct dsfs *fs, fuse_ino_t ino,
			       const struct dsfs_datasets_node *p,
			       struct stat *st)
{
	const struct dsfs_dataset *ds = p ? p->ds : NULL;
	bool dir = !p || p->dir;
	mode_t mode;

	dsfs_reply_attr(fs->opts, st, ino, dir, p ? p->size : 0,
			p ? p->mtime : fs->mount_time);
	if (!ds || !ds->restricted)
		return;
	/* Only the owner and the dataset's group. */
	mode = st->st_mode & 07777 & ~(mode_t)0007;
	mode |= dir ? 0550 : 0440;
	if (ds->group_known) {
		st->st_gid = ds->gid;
	} else {
		mode &= ~(mode_t)0070;
		st->st_uid = 0;
	}
	st->st_mode = (dir ? S_IFDIR : S_IFREG) | mode;
}

/* How long the kernel may keep n's attributes: none for a restricted
 * dataset's nodes, so that each stat reaches getattr's per-caller check
 * (the mount has no default_permissions: a name a member looked up stays
 * in the kernel's cache, and a cached attribute would answer anyone's
 * stat; issue 42, finding 11). Their names stay cached: an open reaches
 * dsfs_datasets_open's check. */
static double dsfs_datasets_attr_timeout(const struct dsfs *fs,
					 const struct dsfs_datasets_node *p)
{
	return p && p->ds->restricted ? 0 : fs->opts->entry_timeout;
}

static void dsfs_datasets_entry(struct dsfs *fs, struct dsfs_node *n,
				struct dsfs_entry *e)
{
	memset(e, 0, sizeof(*e));
	e->node = n;
	dsfs_datasets_attr(fs, n->ino, n->priv, &e->attr);
	e->attr_timeout = dsfs_datasets_attr_timeout(fs, n->priv);
	e->entry_timeout = fs->opts->entry_timeout;
}

/* What a new node is made from. */
struct dsfs_datasets_mk {
	struct dsfs_dataset *ds;
	const char *name;
	const char *parent_path; /* NULL: a dataset root */
	const struct catalog_entry *e;
};

static struct dsfs_node *dsfs_datasets_make(const struct dsfs_datasets_mk *mk)
{
	const char *pp = mk->parent_path ? mk->parent_path : "";
	const char *nm = mk->parent_path ? mk->name : "";
	size_t lp = strlen(pp), ln = strlen(nm), le = strlen(mk->e->etag);
	/* "parent/name" (or "name" at the top, "" for the root), etag */
	size_t len = lp + (lp ? 1 : 0) + ln + 1 + le + 1;
	struct dsfs_datasets_node *p =
		malloc(offsetof(struct dsfs_datasets_node, strs) + len);
	struct dsfs_node *n;
	char *s;

	if (!p)
		return NULL;
	memset(p, 0, offsetof(struct dsfs_datasets_node, strs));
	s = p->strs;
	p->path = s;
	if (lp) {
		memcpy(s, pp, lp);
		s += lp;
		*s++ = '/';
	}
	memcpy(s, nm, ln + 1);
	s += ln + 1;
	p->etag = s;
	memcpy(s, mk->e->etag, le + 1);
	p->dir = mk->e->is_dir;
	p->size = mk->e->size;
	p->mtime = mk->e->mtime;
	p->ds = mk->ds;
	dsfs_dataset_get(p->ds);
	atomic_init(&p->error_logged, false);
	dsfs_pt_init(&p->pt);
	n = dsfs_node_new(&dsfs_datasets_subtree, mk->name, p);
	if (!n)
		dsfs_datasets_node_free(p);
	return n;
}

/* A dataset root matches while it is the current version. */
static bool dsfs_datasets_match_root(const struct dsfs_node *n, void *arg)
{
	const struct dsfs_datasets_mk *mk = arg;
	const struct dsfs_datasets_node *p = n->priv;

	return p->ds == mk->ds;
}

/* Below a root, a child is the same snapshot entry for its parent inode;
 * a changed kind (impossible within one manifest) is still checked. */
static bool dsfs_datasets_match_child(const struct dsfs_node *n, void *arg)
{
	const struct dsfs_datasets_mk *mk = arg;
	const struct dsfs_datasets_node *p = n->priv;

	return p->dir == mk->e->is_dir;
}

/* The child (parent, mk->name), found or made, with nlookup raised. */
static int dsfs_datasets_child(struct dsfs *fs, fuse_ino_t parent,
			       bool (*match)(const struct dsfs_node *, void *),
			       struct dsfs_datasets_mk *mk,
			       struct dsfs_node **out)
{
	struct dsfs_node *n;

	*out = dsfs_nodes_find_child(&fs->nodes, parent, mk->name, match, mk);
	if (*out)
		return 0;
	/* Build outside the lock; another thread may race us. */
	n = dsfs_datasets_make(mk);
	if (!n)
		return -ENOMEM;
	if (dsfs_nodes_insert(&fs->nodes, parent, n, match, mk, out) == 1) {
		dsfs_datasets_forget(fs, n);
		dsfs_node_free(n);
	}
	return 0;
}

static int dsfs_datasets_child_path(const struct dsfs_datasets_node *dir,
				    const char *name, char *buf, size_t len)
{
	int w;

	if (!dir->path[0])
		w = snprintf(buf, len, "%s", name);
	else
		w = snprintf(buf, len, "%s/%s", dir->path, name);
	return w < 0 || (size_t)w >= len ? -ENAMETOOLONG : 0;
}

/* Lookup in datasets/: a dataset root. */
static int dsfs_datasets_lookup_root(struct dsfs *fs, const char *name,
				     struct dsfs_node **out)
{
	struct dsfs_dataset *d = dsfs_dataset_table_current(fs->datasets, name);
	struct catalog_entry e = { .is_dir = true, .etag = "" };
	struct dsfs_datasets_mk mk = { .ds = d, .name = name, .e = &e };
	int ret;

	if (!d)
		return -ENOENT;
	e.mtime = d->mtime;
	ret = dsfs_datasets_child(fs, DSFS_INO_DATASETS,
				  dsfs_datasets_match_root, &mk, out);
	dsfs_dataset_put(d);
	return ret;
}

static int dsfs_datasets_lookup(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *dir, const char *name,
				struct dsfs_entry *e)
{
	const struct dsfs_datasets_node *dp = dir->priv;
	char path[PATH_MAX];
	struct catalog_entry ce;
	struct dsfs_node *n;
	struct dsfs_datasets_mk mk;
	struct catalog *cat;
	int ret;

	atomic_fetch_add_explicit(&fs->ctr.lookups, 1, memory_order_relaxed);
	if (!dp) {
		ret = dsfs_datasets_lookup_root(fs, name, &n);
		goto out;
	}
	if (!dp->dir)
		return -ENOTDIR;
	/* Names absent from a snapshot stay absent (datasets/ changes). */
	e->entry_timeout = fs->opts->entry_timeout;
	if (!dsfs_dataset_allowed(dp->ds, who))
		return -EACCES;
	ret = dsfs_datasets_child_path(dp, name, path, sizeof(path));
	if (ret)
		return ret;
	cat = dsfs_dataset_catalog(fs->datasets, &ret);
	if (!cat)
		return ret;
	ret = catalog_lookup(cat, dp->ds->name, path, &ce);
	if (ret)
		return ret;
	mk = (struct dsfs_datasets_mk){
		.ds = dp->ds, .name = name, .parent_path = dp->path, .e = &ce
	};
	ret = dsfs_datasets_child(fs, dir->ino, dsfs_datasets_match_child, &mk,
				  &n);
out:
	if (!ret)
		dsfs_datasets_entry(fs, n, e);
	return ret;
}

/* May who use n? mask: 0 (see its attributes), or R_OK, W_OK, X_OK. */
static int dsfs_datasets_access(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *n, int mask)
{
	const struct dsfs_datasets_node *p = n->priv;

	(void)fs;
	if (mask & W_OK)
		return -EROFS;
	if (!p)
		return 0; /* datasets/ itself */
	/* A restricted root's own attributes are visible (ls -l datasets/);
	 * entering it, listing it and everything below are not. */
	if (!p->path[0] && !mask)
		return 0;
	return dsfs_dataset_allowed(p->ds, who) ? 0 : -EACCES;
}

static int dsfs_datasets_getattr(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, struct fuse_file_info *fi,
				 struct stat *st, double *timeout)
{
	int ret = dsfs_datasets_access(fs, who, n, 0);

	(void)fi;
	if (ret)
		return ret;
	dsfs_datasets_attr(fs, n->ino, n->priv, st);
	*timeout = dsfs_datasets_attr_timeout(fs, n->priv);
	return 0;
}

/* ---- directories ---- */

/* Readdir position of one open directory: resume after `last`. */
struct dsfs_datasets_dirh {
	pthread_mutex_t lock; /* one readdir at a time on a handle */
	off_t last_off; /* lock: cookie of the entry named last; 0: none */
	char last[NAME_MAX + 1]; /* lock */
};

static int dsfs_datasets_opendir(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, struct fuse_file_info *fi)
{
	const struct dsfs_datasets_node *p = n->priv;
	struct dsfs_datasets_dirh *dh;

	(void)fs;
	if (p && !p->dir)
		return -ENOTDIR;
	if (p && !dsfs_dataset_allowed(p->ds, who))
		return -EACCES;
	dh = calloc(1, sizeof(*dh));
	if (!dh)
		return -ENOMEM;
	pthread_mutex_init(&dh->lock, NULL);
	fi->fh = (uintptr_t)dh;
	/* Snapshots never change under an inode: let the kernel cache it. */
	if (p) {
		fi->cache_readdir = 1;
		fi->keep_cache = 1;
	}
	return 0;
}

static void dsfs_datasets_releasedir(struct dsfs *fs, struct dsfs_caller *who,
				     struct dsfs_node *n,
				     struct fuse_file_info *fi)
{
	struct dsfs_datasets_dirh *dh =
		(struct dsfs_datasets_dirh *)(uintptr_t)fi->fh;

	(void)fs;
	(void)who;
	(void)n;
	if (!dh)
		return;
	pthread_mutex_destroy(&dh->lock);
	free(dh);
}

struct dsfs_datasets_rd {
	struct dsfs *fs;
	struct dsfs_node *dir;
	struct dsfs_reply_dir *d;
	struct dsfs_datasets_dirh *dh;
	off_t cookie; /* of the last entry added */
	off_t skip; /* entries still to skip (seekdir) */
	int err;
};

static int dsfs_datasets_rd_entry(void *arg, const char *name,
				  const struct catalog_entry *ce)
{
	struct dsfs_datasets_rd *rd = arg;
	const struct dsfs_datasets_node *dp = rd->dir->priv;
	struct dsfs_entry e = { 0 };
	size_t len = strlen(name);

	if (rd->skip) {
		rd->skip--;
		rd->cookie++;
		return 0;
	}
	if (len > NAME_MAX)
		return 0; /* the catalog rejects these; never overflow */
	if (!dsfs_reply_dir_fits(rd->d, name))
		return 1;
	e.attr.st_ino = DSFS_DATASETS_UNKNOWN_INO;
	e.attr.st_mode = ce->is_dir ? S_IFDIR : S_IFREG;
	if (rd->d->plus) {
		struct dsfs_datasets_mk mk = { .ds = dp->ds,
					       .name = name,
					       .parent_path = dp->path,
					       .e = ce };
		struct dsfs_node *n;
		int ret =
			dsfs_datasets_child(rd->fs, rd->dir->ino,
					    dsfs_datasets_match_child, &mk, &n);

		if (ret) {
			rd->err = ret;
			return 1;
		}
		dsfs_datasets_entry(rd->fs, n, &e);
	}
	if (dsfs_reply_dir_add(rd->d, name, &e, rd->cookie + 1)) {
		/* Cannot happen after dsfs_reply_dir_fits; undo the lookup. */
		if (e.node)
			dsfs_datasets_unref(rd->fs, e.node);
		return 1;
	}
	rd->cookie++;
	memcpy(rd->dh->last, name, len + 1);
	rd->dh->last_off = rd->cookie;
	return 0;
}

struct dsfs_datasets_rd_top {
	struct dsfs *fs;
	struct dsfs_reply_dir *d;
	int err;
};

/* One dataset of the listing of datasets/. Cookies: 3 + index. */
static int dsfs_datasets_rd_top_entry(void *arg, size_t idx,
				      struct dsfs_dataset *ds)
{
	struct dsfs_datasets_rd_top *rt = arg;
	struct dsfs_entry e = { 0 };

	if (!dsfs_reply_dir_fits(rt->d, ds->name))
		return 1;
	e.attr.st_ino = DSFS_DATASETS_UNKNOWN_INO;
	e.attr.st_mode = S_IFDIR;
	if (rt->d->plus) {
		struct catalog_entry ce = { .is_dir = true };
		struct dsfs_datasets_mk mk = { .ds = ds,
					       .name = ds->name,
					       .e = &ce };
		struct dsfs_node *n;

		ce.mtime = ds->mtime;
		rt->err =
			dsfs_datasets_child(rt->fs, DSFS_INO_DATASETS,
					    dsfs_datasets_match_root, &mk, &n);
		if (rt->err)
			return 1;
		dsfs_datasets_entry(rt->fs, n, &e);
	}
	if (dsfs_reply_dir_add(rt->d, ds->name, &e, (off_t)idx + 3)) {
		if (e.node)
			dsfs_datasets_unref(rt->fs, e.node);
		return 1;
	}
	return 0;
}

static int dsfs_datasets_readdir(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, struct fuse_file_info *fi,
				 off_t off, struct dsfs_reply_dir *d)
{
	const struct dsfs_datasets_node *p = n->priv;
	struct dsfs_datasets_dirh *dh =
		(struct dsfs_datasets_dirh *)(uintptr_t)fi->fh;
	struct dsfs_datasets_rd rd = { .fs = fs, .dir = n, .d = d, .dh = dh };
	struct dsfs_entry e = { 0 };
	const char *after = NULL;
	struct catalog *cat;
	int ret;

	(void)who;
	atomic_fetch_add_explicit(&fs->ctr.readdirs, 1, memory_order_relaxed);
	e.attr.st_mode = S_IFDIR;
	e.attr.st_ino = n->ino;
	if (off < 1 && dsfs_reply_dir_add(d, ".", &e, 1))
		return 0;
	e.attr.st_ino = n->parent;
	if (off < 2 && dsfs_reply_dir_add(d, "..", &e, 2))
		return 0;
	if (!p) {
		struct dsfs_datasets_rd_top rt = { .fs = fs, .d = d };

		/* A stale table is re-read first (no such name). */
		dsfs_dataset_table_current(fs->datasets, "");
		dsfs_dataset_table_foreach(fs->datasets,
					   off > 2 ? (size_t)(off - 2) : 0,
					   dsfs_datasets_rd_top_entry, &rt);
		return rt.err;
	}

	cat = dsfs_dataset_catalog(fs->datasets, &ret);
	if (!cat)
		return ret;
	pthread_mutex_lock(&dh->lock);
	rd.cookie = 2;
	if (off > 2 && dh->last_off == off) {
		after = dh->last;
		rd.cookie = off;
	} else if (off > 2) {
		rd.skip = off - 2;
	}
	ret = catalog_readdir(cat, p->ds->name, p->path, after,
			      dsfs_datasets_rd_entry, &rd);
	pthread_mutex_unlock(&dh->lock);
	if (ret == 1)
		ret = 0;
	return rd.err ? rd.err : ret;
}

/* ---- files ---- */

struct dsfs_datasets_file {
	struct cache_object obj; /* strings point into the node's priv */
	enum dsfs_pt_kind kind; /* how the open was answered (dsfs_pt) */
};

struct dsfs_datasets_backing {
	struct dsfs *fs;
	const struct cache_object *obj;
};

/* The backing file of a passthrough open: the cache's data file when it
 * holds the object whole and recorded (else the open reads through us). */
static int dsfs_datasets_backing(void *arg, int *fd)
{
	struct dsfs_datasets_backing *b = arg;

	return cache_open_passthrough(b->fs->cache, b->obj, fd);
}

static int dsfs_datasets_open(struct dsfs *fs, struct dsfs_caller *who,
			      struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct dsfs_datasets_node *p = n->priv;
	struct dsfs_datasets_file *f;
	struct dsfs_datasets_backing b;
	int ret;

	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC))
		return -EROFS;
	if (!p || p->dir)
		return -EISDIR;
	if (!dsfs_dataset_allowed(p->ds, who))
		return -EACCES;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->obj.dataset = p->ds->name;
	f->obj.os = atomic_load(&p->ds->os);
	f->obj.key = p->path;
	f->obj.etag = p->etag;
	f->obj.size = p->size;
	fi->fh = (uintptr_t)f;
	/* An immutable snapshot: keep the page cache across opens. */
	fi->keep_cache = 1;
	fi->noflush = 1;
	/* Every access check is done: only now may the kernel be handed
	 * the bytes. */
	b = (struct dsfs_datasets_backing){ .fs = fs, .obj = &f->obj };
	ret = dsfs_pt_open(fs, who, &p->pt, true, dsfs_datasets_backing, &b,
			   p->etag, fi, p->ds->name, p->path, &f->kind);
	if (ret) { /* not for a snapshot: every open may join */
		fi->fh = 0;
		free(f);
	}
	return ret;
}

static void dsfs_datasets_release(struct dsfs *fs, struct dsfs_caller *who,
				  struct dsfs_node *n,
				  struct fuse_file_info *fi)
{
	struct dsfs_datasets_file *f =
		(struct dsfs_datasets_file *)(uintptr_t)fi->fh;
	struct dsfs_datasets_node *p = n->priv;

	(void)fs;
	dsfs_pt_release(who, &p->pt, f->kind);
	free(f);
}

static void dsfs_datasets_read_error(struct dsfs *fs,
				     struct dsfs_datasets_node *p, off_t off,
				     size_t len, int err)
{
	atomic_fetch_add_explicit(&fs->ctr.read_errors, 1,
				  memory_order_relaxed);
	if (atomic_exchange(&p->error_logged, true))
		return;
	log_error("dataset %s key %s: read of %zu bytes at %lld failed: %s "
		  "(returned EIO; later errors on this file are not logged)",
		  p->ds->name, p->path, len, (long long)off, strerror(-err));
}

static int dsfs_datasets_read(struct dsfs *fs, struct dsfs_caller *who,
			      struct dsfs_node *n, struct fuse_file_info *fi,
			      size_t size, off_t off, struct dsfs_reply_read *r)
{
	struct dsfs_datasets_node *p = n->priv;
	struct dsfs_datasets_file *f =
		(struct dsfs_datasets_file *)(uintptr_t)fi->fh;
	uint64_t uoff = (uint64_t)off;
	int ret;

	(void)who;
	if (off < 0 || uoff >= p->size || !size)
		return 0;
	if (size > p->size - uoff)
		size = (size_t)(p->size - uoff);
	atomic_fetch_add_explicit(&fs->ctr.reads, 1, memory_order_relaxed);
	/* f and p stay until this request returns, its reply sent or not:
	 * the dispatcher holds f's handle, which pins the node (dsfs_ops.c). */
	ret = dsfs_cacheread_reply(fs, &f->obj, uoff, size, r);
	if (ret) {
		dsfs_datasets_read_error(fs, p, off, size, ret);
		return ret == -ENOMEM ? -ENOMEM : -EIO;
	}
	return 0;
}

/* datasets/ itself and everything below it. */
const struct dsfs_subtree dsfs_datasets_subtree = {
	.name = "datasets",
	.init = dsfs_datasets_init,
	.destroy = dsfs_datasets_destroy,
	.poll = dsfs_datasets_poll,
	.forget = dsfs_datasets_forget,
	.lookup = dsfs_datasets_lookup,
	.getattr = dsfs_datasets_getattr,
	.access = dsfs_datasets_access,
	.opendir = dsfs_datasets_opendir,
	.readdir = dsfs_datasets_readdir,
	.releasedir = dsfs_datasets_releasedir,
	.open = dsfs_datasets_open,
	.read = dsfs_datasets_read,
	.release = dsfs_datasets_release,
};
