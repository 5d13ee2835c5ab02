// SPDX-License-Identifier: MIT
/*
 * dsfs_datasets: the dataset table and the read-only dataset subtree
 * (<mount>/datasets/<name>/<key...>).
 *
 * The table mirrors the catalog's READY datasets. State of one name:
 *
 *   absent --catalog lists it READY--> present (version v)
 *   present(v) --catalog shows v' != v, another source or group-->
 *                present(v'), name queued for invalidation
 *   present --gone from the catalog--> absent, name queued for invalidation
 *
 * The poller thread refreshes the table every opts.poll_ms and sends the
 * queued invalidations (fuse_lowlevel_notify_inval_entry on datasets/NAME):
 * that cannot run inside a lookup of datasets/ (the kernel holds the
 * directory's lock), hence the queue. A lookup of a name the table lacks
 * refreshes it at once (rate-limited), so a new dataset is visible to the
 * next lookup without waiting for the poller.
 *
 * A struct dsfs_dataset is one version. Its root node matches only while
 * it is the current version; after a refresh the next lookup makes a new
 * root (a new inode), while open files keep reading their own version by
 * ETag (If-Match): a source that changed gives EIO, never mixed bytes.
 *
 * Everything below a dataset root is served from the catalog manifest
 * (catalog_lookup, catalog_readdir) and never from the network; nodes carry
 * size, mtime and ETag, so getattr needs no query at all.
 *
 * Locks: dsfs.ds_lock (rwlock) protects dsents, ndsents, stores,
 * ds_polled_ms and the pending queue; taken before dsfs.node_lock.
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsfs.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

/* d_ino of plain readdir entries whose node does not exist yet. */
#define DSFS_UNKNOWN_INO 0xffffffffu

/* Least time between two on-demand refreshes from lookups, ms. */
#define DSFS_LOOKUP_REFRESH_MS 200

struct dsfs_store {
	struct dsfs_store *next;
	char *url;
	struct objstore *os;
};

struct dsfs_dsent {
	struct dsfs_dataset *cur; /* a reference */
};

void dsfs_dataset_get(struct dsfs_dataset *d)
{
	atomic_fetch_add(&d->refs, 1);
}

void dsfs_dataset_put(struct dsfs_dataset *d)
{
	if (!d || atomic_fetch_sub(&d->refs, 1) != 1)
		return;
	free(d->name);
	free(d->source);
	free(d->group);
	free(d);
}

bool dsfs_dataset_allowed(const struct dsfs_dataset *d, struct dsfs_caller *who)
{
	if (!d->restricted || who->uid == 0)
		return true;
	if (!d->group_known)
		return false;
	return dsfs_caller_in_group(who, d->gid);
}

/* One row of the catalog's dataset list, copied out of the callback. */
struct dsfs_dsrow {
	char *name, *source, *group;
	int64_t version, refreshed;
};

struct dsfs_dslist {
	struct dsfs_dsrow *rows;
	size_t n, cap;
};

static int dsfs_dslist_add(void *arg, const struct catalog_dataset *ds)
{
	struct dsfs_dslist *l = arg;
	struct dsfs_dsrow *r;

	if (ds->state != CATALOG_DS_READY || ds->version <= 0)
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct dsfs_dsrow *p = realloc(l->rows, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		l->rows = p;
		l->cap = cap;
	}
	r = &l->rows[l->n];
	r->name = strdup(ds->name);
	r->source = strdup(ds->source);
	r->group = ds->group && ds->group[0] ? strdup(ds->group) : NULL;
	r->version = ds->version;
	r->refreshed = ds->refreshed;
	if (!r->name || !r->source ||
	    (ds->group && ds->group[0] && !r->group)) {
		free(r->name);
		free(r->source);
		free(r->group);
		return -ENOMEM;
	}
	l->n++;
	return 0;
}

static void dsfs_dslist_free(struct dsfs_dslist *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->rows[i].name);
		free(l->rows[i].source);
		free(l->rows[i].group);
	}
	free(l->rows);
}

/* The opened store for url, opening it on first use. Called with ds_lock
 * held for writing. */
static struct objstore *dsfs_store_get(struct dsfs *fs, const char *url,
				       int *err)
{
	struct dsfs_store *s;

	for (s = fs->stores; s; s = s->next)
		if (strcmp(s->url, url) == 0)
			return s->os;
	s = calloc(1, sizeof(*s));
	if (!s) {
		*err = -ENOMEM;
		return NULL;
	}
	s->url = strdup(url);
	*err = s->url ? objstore_open(url, fs->cfg, &s->os) : -ENOMEM;
	if (*err) {
		free(s->url);
		free(s);
		return NULL;
	}
	s->next = fs->stores;
	fs->stores = s;
	return s->os;
}

static bool dsfs_str_eq(const char *a, const char *b)
{
	if (!a || !b)
		return a == b;
	return strcmp(a, b) == 0;
}

static int dsfs_dsent_cmp(const void *a, const void *b)
{
	const struct dsfs_dsent *x = a, *y = b;

	return strcmp(x->cur->name, y->cur->name);
}

/* Find name in the table. Called with ds_lock held. */
static struct dsfs_dsent *dsfs_dsent_find(struct dsfs *fs, const char *name)
{
	size_t lo = 0, hi = fs->ndsents;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, fs->dsents[mid].cur->name);

		if (c == 0)
			return &fs->dsents[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

static void dsfs_queue_inval(struct dsfs *fs, const char *name)
{
	char **p = realloc(fs->pending_inval, (fs->npending + 1) * sizeof(*p));

	if (!p)
		return; /* the entry times out by itself */
	fs->pending_inval = p;
	p[fs->npending] = strdup(name);
	if (p[fs->npending])
		fs->npending++;
}

/* A new dataset version from a catalog row. Called with ds_lock (write). */
static struct dsfs_dataset *dsfs_dataset_make(struct dsfs *fs,
					      const struct dsfs_dsrow *r)
{
	struct dsfs_dataset *d = calloc(1, sizeof(*d));
	int err;

	if (!d)
		return NULL;
	atomic_init(&d->refs, 1);
	d->name = strdup(r->name);
	d->source = strdup(r->source);
	d->version = r->version;
	d->mtime = r->refreshed;
	if (r->group) {
		char buf[4096];
		struct group gr, *res = NULL;

		d->restricted = true;
		d->group = strdup(r->group);
		if (getgrnam_r(r->group, &gr, buf, sizeof(buf), &res) == 0 &&
		    res) {
			d->gid = res->gr_gid;
			d->group_known = true;
		} else {
			log_warn("dataset %s: group '%s' is unknown on this "
				 "node: only root may read it",
				 r->name, r->group);
		}
	}
	if (!d->name || !d->source || (r->group && !d->group)) {
		dsfs_dataset_put(d);
		return NULL;
	}
	d->os = dsfs_store_get(fs, r->source, &err);
	if (!d->os) {
		log_error("dataset %s: cannot open source %s: %s", r->name,
			  r->source, strerror(-err));
		dsfs_dataset_put(d);
		return NULL;
	}
	return d;
}

int dsfs_datasets_refresh(struct dsfs *fs)
{
	struct dsfs_dslist l = { 0 };
	struct dsfs_dsent *ents = NULL;
	size_t n = 0;
	struct catalog *cat;
	int ret;

	cat = dsfs_catalog(fs, &ret);
	if (!cat && ret != -ENOENT)
		return ret;
	/* No catalog file yet: no datasets (until one is registered). */
	ret = cat ? catalog_dataset_list(cat, dsfs_dslist_add, &l) : 0;
	if (ret)
		goto out;
	ents = calloc(l.n ? l.n : 1, sizeof(*ents));
	if (!ents) {
		ret = -ENOMEM;
		goto out;
	}

	pthread_rwlock_wrlock(&fs->ds_lock);
	for (size_t i = 0; i < l.n; i++) {
		const struct dsfs_dsrow *r = &l.rows[i];
		struct dsfs_dsent *old = dsfs_dsent_find(fs, r->name);
		struct dsfs_dataset *d;

		if (old && old->cur->version == r->version &&
		    dsfs_str_eq(old->cur->source, r->source) &&
		    dsfs_str_eq(old->cur->group, r->group)) {
			d = old->cur;
			dsfs_dataset_get(d);
		} else {
			d = dsfs_dataset_make(fs, r);
			if (!d)
				continue;
			if (old) {
				log_info("dataset %s: version %" PRId64
					 " -> %" PRId64,
					 r->name, old->cur->version,
					 r->version);
				dsfs_queue_inval(fs, r->name);
			} else {
				log_info("dataset %s: version %" PRId64
					 " from %s",
					 r->name, r->version, r->source);
			}
		}
		ents[n++].cur = d;
	}
	qsort(ents, n, sizeof(*ents), dsfs_dsent_cmp);
	for (size_t i = 0; i < fs->ndsents; i++) {
		struct dsfs_dataset *d = fs->dsents[i].cur;
		bool kept = false;

		for (size_t j = 0; j < n && !kept; j++)
			kept = strcmp(ents[j].cur->name, d->name) == 0;
		if (!kept) {
			log_info("dataset %s: removed", d->name);
			dsfs_queue_inval(fs, d->name);
		}
		dsfs_dataset_put(d);
	}
	free(fs->dsents);
	fs->dsents = ents;
	fs->ndsents = n;
	ents = NULL;
	fs->ds_polled_ms = dsfs_now_ms();
	pthread_rwlock_unlock(&fs->ds_lock);
out:
	free(ents);
	dsfs_dslist_free(&l);
	return ret;
}

void dsfs_datasets_flush_inval(struct dsfs *fs)
{
	char **names;
	size_t n;

	pthread_rwlock_wrlock(&fs->ds_lock);
	names = fs->pending_inval;
	n = fs->npending;
	fs->pending_inval = NULL;
	fs->npending = 0;
	pthread_rwlock_unlock(&fs->ds_lock);
	for (size_t i = 0; i < n; i++) {
		/* -ENOENT: the kernel had no such entry; nothing to drop. */
		if (!dsfs_poller_stopping(fs))
			fuse_lowlevel_notify_inval_entry(
				fs->se, DSFS_INO_DATASETS, names[i],
				strlen(names[i]));
		free(names[i]);
	}
	if (n && !dsfs_poller_stopping(fs))
		fuse_lowlevel_notify_inval_inode(fs->se, DSFS_INO_DATASETS, 0,
						 0);
	free(names);
}

void dsfs_datasets_destroy(struct dsfs *fs)
{
	for (size_t i = 0; i < fs->ndsents; i++)
		dsfs_dataset_put(fs->dsents[i].cur);
	free(fs->dsents);
	fs->dsents = NULL;
	fs->ndsents = 0;
	for (size_t i = 0; i < fs->npending; i++)
		free(fs->pending_inval[i]);
	free(fs->pending_inval);
	fs->pending_inval = NULL;
	fs->npending = 0;
	while (fs->stores) {
		struct dsfs_store *s = fs->stores;

		fs->stores = s->next;
		objstore_free(s->os);
		free(s->url);
		free(s);
	}
}

struct dsfs_dataset *dsfs_datasets_current(struct dsfs *fs, const char *name)
{
	struct dsfs_dataset *d = NULL;
	struct dsfs_dsent *e;
	bool stale;

	for (int pass = 0; pass < 2; pass++) {
		pthread_rwlock_rdlock(&fs->ds_lock);
		e = dsfs_dsent_find(fs, name);
		if (e) {
			d = e->cur;
			dsfs_dataset_get(d);
		}
		stale = dsfs_now_ms() - fs->ds_polled_ms >=
			DSFS_LOOKUP_REFRESH_MS;
		pthread_rwlock_unlock(&fs->ds_lock);
		if (d || !stale || pass)
			break;
		if (dsfs_datasets_refresh(fs))
			break;
	}
	return d;
}

void dsfs_stat_fill(struct dsfs *fs, struct stat *st, fuse_ino_t ino, bool dir,
		    uint64_t size, int64_t mtime, const struct dsfs_dataset *ds)
{
	mode_t mode = (dir ? 0777 : 0666) & ~fs->opts->umask & ~0222;

	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = fs->opts->uid;
	st->st_gid = fs->opts->gid;
	if (ds && ds->restricted) {
		/* Only the owner and the dataset's group. */
		mode &= ~(mode_t)0007;
		mode |= dir ? 0550 : 0440;
		if (ds->group_known) {
			st->st_gid = ds->gid;
		} else {
			mode &= ~(mode_t)0070;
			st->st_uid = 0;
		}
	}
	st->st_mode = (dir ? S_IFDIR : S_IFREG) | mode;
	st->st_nlink = dir ? 2 : 1;
	st->st_size = (off_t)size;
	st->st_blksize = 1 << 20;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	st->st_mtime = mtime;
	st->st_ctime = mtime;
	st->st_atime = mtime;
}

/* ---- nodes ---- */

struct dsfs_mk {
	struct dsfs_dataset *ds;
	const char *name;
	const char *parent_path;
	const struct catalog_entry *e;
};

static struct dsfs_node *dsfs_ds_make(void *arg)
{
	struct dsfs_mk *mk = arg;
	struct dsfs_node *n = calloc(1, sizeof(*n));
	const struct catalog_entry *e = mk->e;

	if (!n)
		return NULL;
	n->sub = &dsfs_datasets_subtree;
	n->kind = e->is_dir ? DSFS_DS_DIR : DSFS_DS_FILE;
	n->name = strdup(mk->name);
	if (!mk->parent_path)
		n->path = strdup("");
	else if (!mk->parent_path[0])
		n->path = strdup(mk->name);
	else if (asprintf(&n->path, "%s/%s", mk->parent_path, mk->name) < 0)
		n->path = NULL;
	n->etag = strdup(e->etag);
	n->size = e->size;
	n->mtime = e->mtime;
	n->ds = mk->ds;
	dsfs_dataset_get(n->ds);
	atomic_init(&n->error_logged, false);
	if (!n->name || !n->path || !n->etag) {
		dsfs_node_free(n);
		return NULL;
	}
	return n;
}

/* A dataset root matches while it is the current version. */
static bool dsfs_ds_match_root(const struct dsfs_node *n, void *arg)
{
	const struct dsfs_mk *mk = arg;

	return n->ds == mk->ds;
}

/* Below a root, a child is the same snapshot entry for its parent inode;
 * a changed kind (impossible within one manifest) is still checked. */
static bool dsfs_ds_match_child(const struct dsfs_node *n, void *arg)
{
	const struct dsfs_mk *mk = arg;

	return (n->kind == DSFS_DS_DIR) == mk->e->is_dir;
}

static int dsfs_ds_child_path(const struct dsfs_node *dir, const char *name,
			      char *buf, size_t len)
{
	int w;

	if (!dir->path[0])
		w = snprintf(buf, len, "%s", name);
	else
		w = snprintf(buf, len, "%s/%s", dir->path, name);
	return w < 0 || (size_t)w >= len ? -ENAMETOOLONG : 0;
}

/* Lookup in /datasets: a dataset root. */
static int dsfs_ds_lookup_root(struct dsfs *fs, const char *name,
			       struct dsfs_node **out)
{
	struct dsfs_dataset *d = dsfs_datasets_current(fs, name);
	struct catalog_entry e = { .is_dir = true };
	struct dsfs_mk mk = { .ds = d, .name = name, .e = &e };
	int ret;

	if (!d)
		return -ENOENT;
	e.mtime = d->mtime;
	ret = dsfs_node_get_child(fs, DSFS_INO_DATASETS, name,
				  dsfs_ds_match_root, dsfs_ds_make, &mk, out);
	dsfs_dataset_put(d);
	return ret;
}

static int dsfs_ds_lookup(struct dsfs *fs, struct dsfs_node *dir,
			  const char *name, struct dsfs_caller *who,
			  struct dsfs_node **out)
{
	char path[PATH_MAX];
	struct catalog_entry e;
	struct dsfs_mk mk;
	struct catalog *cat;
	int ret;

	atomic_fetch_add_explicit(&fs->ctr.lookups, 1, memory_order_relaxed);
	if (dir->ino == DSFS_INO_DATASETS)
		return dsfs_ds_lookup_root(fs, name, out);
	if (dir->kind != DSFS_DS_DIR)
		return -ENOTDIR;
	if (!dsfs_dataset_allowed(dir->ds, who))
		return -EACCES;
	ret = dsfs_ds_child_path(dir, name, path, sizeof(path));
	if (ret)
		return ret;
	cat = dsfs_catalog(fs, &ret);
	if (!cat)
		return ret;
	ret = catalog_lookup(cat, dir->ds->name, path, &e);
	if (ret)
		return ret;
	mk = (struct dsfs_mk){
		.ds = dir->ds, .name = name, .parent_path = dir->path, .e = &e
	};
	return dsfs_node_get_child(fs, dir->ino, name, dsfs_ds_match_child,
				   dsfs_ds_make, &mk, out);
}

static void dsfs_ds_stat(struct dsfs *fs, const struct dsfs_node *n,
			 struct stat *st)
{
	dsfs_stat_fill(fs, st, n->ino, n->kind != DSFS_DS_FILE, n->size,
		       n->mtime, n->ds);
}

/* ---- directories ---- */

/* Readdir position of one open directory: resume after `last`. */
struct dsfs_dirh {
	pthread_mutex_t lock; /* one readdir at a time on a handle */
	off_t last_off; /* cookie of the entry named last; 0: none */
	char last[NAME_MAX + 1];
};

static int dsfs_ds_opendir(struct dsfs *fs, struct dsfs_node *n,
			   struct dsfs_caller *who, struct fuse_file_info *fi)
{
	struct dsfs_dirh *dh;

	(void)fs;
	if (n->ds && !dsfs_dataset_allowed(n->ds, who))
		return -EACCES;
	dh = calloc(1, sizeof(*dh));
	if (!dh)
		return -ENOMEM;
	pthread_mutex_init(&dh->lock, NULL);
	fi->fh = (uintptr_t)dh;
	/* Snapshots never change under an inode: let the kernel cache it. */
	if (n->ino != DSFS_INO_DATASETS) {
		fi->cache_readdir = 1;
		fi->keep_cache = 1;
	}
	return 0;
}

static void dsfs_ds_releasedir(struct dsfs *fs, struct dsfs_node *n,
			       struct fuse_file_info *fi)
{
	struct dsfs_dirh *dh = (struct dsfs_dirh *)(uintptr_t)fi->fh;

	(void)fs;
	(void)n;
	if (!dh)
		return;
	pthread_mutex_destroy(&dh->lock);
	free(dh);
}

struct dsfs_rd {
	struct dsfs *fs;
	struct dsfs_node *dir;
	struct dsfs_dirbuf *db;
	struct dsfs_dirh *dh;
	off_t cookie; /* of the last entry added */
	off_t skip; /* entries still to skip (seekdir) */
	int err;
};

static int dsfs_rd_entry(void *arg, const char *name,
			 const struct catalog_entry *e)
{
	struct dsfs_rd *rd = arg;
	struct dsfs_node *n = NULL;
	size_t len = strlen(name);

	if (rd->skip) {
		rd->skip--;
		rd->cookie++;
		return 0;
	}
	if (len > NAME_MAX)
		return 0; /* the catalog rejects these; never overflow */
	if (!dsfs_dirbuf_fits(rd->db, name))
		return 1;
	if (rd->db->plus) {
		struct dsfs_mk mk = { .ds = rd->dir->ds,
				      .name = name,
				      .parent_path = rd->dir->path,
				      .e = e };
		int ret = dsfs_node_get_child(rd->fs, rd->dir->ino, name,
					      dsfs_ds_match_child, dsfs_ds_make,
					      &mk, &n);

		if (ret) {
			rd->err = ret;
			return 1;
		}
	}
	if (dsfs_dirbuf_add(rd->db, name, n, DSFS_UNKNOWN_INO,
			    e->is_dir ? S_IFDIR : S_IFREG, rd->cookie + 1)) {
		/* Cannot happen after dsfs_dirbuf_fits; undo the lookup. */
		if (n)
			dsfs_node_forget(rd->fs, n->ino, 1);
		return 1;
	}
	rd->cookie++;
	memcpy(rd->dh->last, name, len + 1);
	rd->dh->last_off = rd->cookie;
	return 0;
}

/* Listing of /datasets from the table. Cookies: 3 + index. */
static int dsfs_ds_readdir_top(struct dsfs *fs, off_t off,
			       struct dsfs_dirbuf *db)
{
	size_t i = off > 2 ? (size_t)(off - 2) : 0;
	int ret = 0;

	dsfs_datasets_current(fs, ""); /* refreshes a stale table */
	pthread_rwlock_rdlock(&fs->ds_lock);
	for (; i < fs->ndsents; i++) {
		struct dsfs_dataset *d = fs->dsents[i].cur;
		struct dsfs_node *n = NULL;

		if (!dsfs_dirbuf_fits(db, d->name))
			break;
		if (db->plus) {
			struct catalog_entry e = { .is_dir = true };
			struct dsfs_mk mk = { .ds = d,
					      .name = d->name,
					      .e = &e };

			e.mtime = d->mtime;
			ret = dsfs_node_get_child(fs, DSFS_INO_DATASETS,
						  d->name, dsfs_ds_match_root,
						  dsfs_ds_make, &mk, &n);
			if (ret)
				break;
		}
		if (dsfs_dirbuf_add(db, d->name, n, DSFS_UNKNOWN_INO, S_IFDIR,
				    (off_t)i + 3)) {
			if (n)
				dsfs_node_forget(fs, n->ino, 1);
			break;
		}
	}
	pthread_rwlock_unlock(&fs->ds_lock);
	return ret;
}

static int dsfs_ds_readdir(struct dsfs *fs, struct dsfs_node *n,
			   struct fuse_file_info *fi, off_t off,
			   struct dsfs_dirbuf *db)
{
	struct dsfs_dirh *dh = (struct dsfs_dirh *)(uintptr_t)fi->fh;
	struct dsfs_rd rd = { .fs = fs, .dir = n, .db = db, .dh = dh };
	const char *after = NULL;
	struct catalog *cat;
	int ret;

	atomic_fetch_add_explicit(&fs->ctr.readdirs, 1, memory_order_relaxed);
	if (off < 1 && dsfs_dirbuf_add(db, ".", NULL, n->ino, S_IFDIR, 1))
		return 0;
	if (off < 2 &&
	    dsfs_dirbuf_add(db, "..", NULL,
			    n->parent ? n->parent : DSFS_INO_DATASETS, S_IFDIR,
			    2))
		return 0;
	if (n->ino == DSFS_INO_DATASETS)
		return dsfs_ds_readdir_top(fs, off, db);

	cat = dsfs_catalog(fs, &ret);
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
	ret = catalog_readdir(cat, n->ds->name, n->path, after, dsfs_rd_entry,
			      &rd);
	pthread_mutex_unlock(&dh->lock);
	if (ret == 1)
		ret = 0;
	return rd.err ? rd.err : ret;
}

/* ---- files ---- */

struct dsfs_file {
	struct cache_object obj; /* strings point into the node */
	struct dsfs_node *n;
};

static int dsfs_ds_open(struct dsfs *fs, struct dsfs_node *n,
			struct dsfs_caller *who, struct fuse_file_info *fi)
{
	struct dsfs_file *f;

	(void)fs;
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC))
		return -EROFS;
	if (n->kind != DSFS_DS_FILE)
		return -EISDIR;
	if (!dsfs_dataset_allowed(n->ds, who))
		return -EACCES;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->n = n;
	f->obj.dataset = n->ds->name;
	f->obj.os = n->ds->os;
	f->obj.key = n->path;
	f->obj.etag = n->etag;
	f->obj.size = n->size;
	fi->fh = (uintptr_t)f;
	/* An immutable snapshot: keep the page cache across opens. */
	fi->keep_cache = 1;
	fi->noflush = 1;
	return 0;
}

static void dsfs_ds_release(struct dsfs *fs, struct dsfs_node *n,
			    struct fuse_file_info *fi)
{
	(void)fs;
	(void)n;
	free((void *)(uintptr_t)fi->fh);
}

/* Per-thread copy buffer for reads that cannot be spliced. */
static pthread_key_t dsfs_buf_key;
static pthread_once_t dsfs_buf_once = PTHREAD_ONCE_INIT;

struct dsfs_tbuf {
	size_t len;
	char data[];
};

static void dsfs_buf_key_make(void)
{
	pthread_key_create(&dsfs_buf_key, free);
}

static void *dsfs_thread_buf(size_t len)
{
	struct dsfs_tbuf *b;

	pthread_once(&dsfs_buf_once, dsfs_buf_key_make);
	b = pthread_getspecific(dsfs_buf_key);
	if (b && b->len >= len)
		return b->data;
	free(b);
	pthread_setspecific(dsfs_buf_key, NULL);
	b = malloc(sizeof(*b) + len);
	if (!b)
		return NULL;
	b->len = len;
	pthread_setspecific(dsfs_buf_key, b);
	return b->data;
}

static void dsfs_read_error(struct dsfs *fs, struct dsfs_node *n, off_t off,
			    size_t len, int err)
{
	atomic_fetch_add_explicit(&fs->ctr.read_errors, 1,
				  memory_order_relaxed);
	if (atomic_exchange(&n->error_logged, true))
		return;
	log_error("dataset %s key %s: read of %zu bytes at %lld failed: %s "
		  "(returned EIO; later errors on this file are not logged)",
		  n->ds->name, n->path, len, (long long)off, strerror(-err));
}

/* A READ answered from cache_read_iov's bytes (no copy when they are in
 * memory already). */
struct dsfs_reply {
	fuse_req_t req;
	bool sent;
	unsigned long long bytes;
};

static int dsfs_reply_iov(void *arg, const struct iovec *iov, int n)
{
	struct dsfs_reply *r = arg;

	for (int i = 0; i < n; i++)
		r->bytes += iov[i].iov_len;
	r->sent = true;
	/* A failed reply (the request was interrupted) has nothing left to
	 * answer: the request is finished either way. */
	if (n)
		fuse_reply_iov(r->req, iov, n);
	else
		fuse_reply_buf(r->req, NULL, 0);
	return 0;
}

static void dsfs_ds_read(fuse_req_t req, struct dsfs *fs, struct dsfs_node *n,
			 struct fuse_file_info *fi, size_t size, off_t off)
{
	struct dsfs_file *f = (struct dsfs_file *)(uintptr_t)fi->fh;
	struct dsfs_reply r = { .req = req };
	uint64_t uoff = (uint64_t)off;
	void *buf;
	int ret;

	if (off < 0 || uoff >= n->size || !size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size > n->size - uoff)
		size = (size_t)(n->size - uoff);
	atomic_fetch_add_explicit(&fs->ctr.reads, 1, memory_order_relaxed);
	if (fs->opts->splice) {
		struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
		/* f may be freed once the reply is out (RELEASE). */
		uint64_t fd_off, obj_size = f->obj.size;
		int fd;

		if (cache_read_fd(fs->cache, &f->obj, uoff, size, &fd,
				  &fd_off) == 0) {
			bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
			bv.buf[0].fd = fd;
			bv.buf[0].pos = (off_t)fd_off;
			fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
			/* The mount's page cache has them now (keep_cache):
			 * drop the cache file's copy (cache_set_drop_behind). */
			cache_read_fd_done(fs->cache, obj_size, fd, fd_off,
					   uoff, size);
			close(fd);
			atomic_fetch_add_explicit(&fs->ctr.splice_replies, 1,
						  memory_order_relaxed);
			atomic_fetch_add_explicit(&fs->ctr.read_bytes, size,
						  memory_order_relaxed);
			return;
		}
	}
	buf = dsfs_thread_buf(size);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ret = cache_read_iov(fs->cache, &f->obj, uoff, size, buf, 0,
			     dsfs_reply_iov, &r);
	if (!r.sent) {
		dsfs_read_error(fs, n, off, size, ret);
		fuse_reply_err(req, ret == -ENOMEM ? ENOMEM : EIO);
		return;
	}
	atomic_fetch_add_explicit(&fs->ctr.copy_replies, 1,
				  memory_order_relaxed);
	atomic_fetch_add_explicit(&fs->ctr.read_bytes, r.bytes,
				  memory_order_relaxed);
}

static double dsfs_ds_timeout(struct dsfs *fs, const struct dsfs_node *n)
{
	(void)n;
	return fs->opts->entry_timeout;
}

/* Names absent from a snapshot stay absent; datasets/ itself changes. */
static double dsfs_ds_neg_timeout(struct dsfs *fs, const struct dsfs_node *dir)
{
	return dir->ino == DSFS_INO_DATASETS ? 0 : fs->opts->entry_timeout;
}

static int dsfs_ds_access(struct dsfs *fs, struct dsfs_node *n,
			  struct dsfs_caller *who, int mask)
{
	(void)fs;
	if (mask & W_OK)
		return -EROFS;
	if (!n->ds)
		return 0; /* datasets/ itself */
	/* A restricted root's own attributes are visible (ls -l datasets/);
	 * entering it, listing it and everything below are not. */
	if (!n->path[0] && !mask)
		return 0;
	return dsfs_dataset_allowed(n->ds, who) ? 0 : -EACCES;
}

/* Used for /datasets itself (a static node) and everything below it. */
const struct dsfs_subtree dsfs_datasets_subtree = {
	.name = "datasets",
	.lookup = dsfs_ds_lookup,
	.stat = dsfs_ds_stat,
	.opendir = dsfs_ds_opendir,
	.readdir = dsfs_ds_readdir,
	.releasedir = dsfs_ds_releasedir,
	.open = dsfs_ds_open,
	.read = dsfs_ds_read,
	.release = dsfs_ds_release,
	.access = dsfs_ds_access,
	.timeout = dsfs_ds_timeout,
	.neg_timeout = dsfs_ds_neg_timeout,
};
