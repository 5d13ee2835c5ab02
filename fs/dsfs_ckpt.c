// SPDX-License-Identifier: MIT
/*
 * dsfs_ckpt: the checkpoint subtree, checkpoints/ (inode 3 and below),
 * writable and written through to the checkpoint store (libdstage's ckpt
 * module, include/dstage/ckpt.h, does the staging, publishing and
 * recovery; this file and dsfs_ckpt_file.c, the hooks of open files, map
 * FUSE requests onto it; dsfs_ckpt_i.h is what they share).
 *
 * Without checkpoints.store the subtree is an empty, read-only directory
 * (every modifying hook answers EROFS).
 *
 * Nodes: each node's priv is a struct dsfs_ckpt_pn, its place in the
 * namespace (parent pn and name), from which its key in the store is made.
 * A rename moves the pn (the kernel keeps the inode), so the keys of
 * everything below a renamed directory follow. A pn holds a reference on
 * its parent; the node holds one on its pn (dropped by forget).
 *
 * Locks: st->lock guards every pn's parent, name, refs and gone. It is a
 * leaf, taken inside the node table's lock by the match callbacks, and
 * never held across a call into ckpt or the node table.
 *
 * Who may write: root, the mount's owner (-o uid) and, as -o umask
 * allows, its group (-o gid) and others; everyone else gets EACCES. Hard
 * links, symbolic links and special files: EPERM; extended attributes:
 * ENOTSUP. A writer killed by a signal before closing its file does not
 * publish it (its FLUSH comes from an exiting task with a signal as its
 * exit code), nor does a forked child closing its copy of the descriptor:
 * see dsfs_ckpt_file.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsfs_ckpt.h"
#include "dsfs_ckpt_i.h"
#include "dsfs_opts.h"
#include "dstage/catalog.h"
#include "dstage/ckpt.h"
#include "dstage/config.h"
#include "dstage/log.h"

/* A directory listing, taken at opendir. */
struct dsfs_ckpt_dir {
	size_t n, cap;
	struct dsfs_ckpt_ent {
		char *name;
		struct ckpt_attr a;
	} * v;
};

/* ---- pns ---- */

/* ---- attributes and access ---- */

/* ---- life ---- */

static int dsfs_ckpt_init(struct dsfs *fs)
{
	struct dsfs_ckpt *st = calloc(1, sizeof(*st));
	int ret;

	if (!st)
		return -ENOMEM;
	pthread_mutex_init(&st->lock, NULL);
	st->top.dir = true;
	st->top.refs = 1;
	fs->sub_state[DSFS_SUB_CKPT] = st;
	if (fs->cfg && fs->cfg->ckpt_store) {
		struct ckpt_hooks h;

		/* What this node publishes is recorded in the catalog. */
		ret = catalog_ckpt_log_new(fs->cfg->catalog_path, &st->record);
		if (ret)
			return ret;
		catalog_ckpt_log_hooks(st->record, &h);
		ret = ckpt_open_ex(fs->cfg, &h, &st->ck);
		if (ret)
			return ret;
		if (asprintf(&st->cache_label, "checkpoints:%s",
			     ckpt_url(st->ck)) < 0) {
			st->cache_label = NULL;
			return -ENOMEM;
		}
	}
	return dsfs_nodes_add_fixed(&fs->nodes, DSFS_INO_CHECKPOINTS,
				    DSFS_INO_ROOT, &dsfs_ckpt_subtree,
				    "checkpoints", &st->top);
}

static void dsfs_ckpt_destroy(struct dsfs *fs)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);

	if (!st)
		return;
	ckpt_free(st->ck); /* no hook runs after it */
	catalog_ckpt_log_free(st->record);
	free(st->cache_label);
	pthread_mutex_destroy(&st->lock);
	free(st);
	fs->sub_state[DSFS_SUB_CKPT] = NULL;
}

static void dsfs_ckpt_forget(struct dsfs *fs, struct dsfs_node *n)
{
	dsfs_ckpt_pn_forget(fs, n);
}

/* ---- names ---- */

static int dsfs_ckpt_lookup(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *dir, const char *name,
			    struct dsfs_entry *e)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct ckpt_attr a;
	uint64_t gen;
	char *key;
	int ret;

	(void)who;
	if (!st->ck || ckpt_name_ok("", name))
		return -ENOENT;
	key = dsfs_ckpt_pn_child_key(st, dir, name);
	if (!key)
		return -ENOMEM;
	/* missing a moment ago (no request to the store) */
	if (ckpt_neg_find(st->ck, key)) {
		free(key);
		return -ENOENT;
	}
	gen = ckpt_neg_gen(st->ck);
	ret = ckpt_stat(st->ck, key, &a);
	/* in a checkpoint the lifecycle moved to its archive: shown with its
	 * attributes there, not recalled (an open for read recalls it) */
	if (ret == -ENOENT)
		ret = dsfs_ckpt_arch_stat(fs, key, &a);
	if (ret == -ENOENT)
		ckpt_neg_add(st->ck, key, (unsigned)(DSFS_CKPT_TIMEOUT * 1000),
			     gen);
	free(key);
	if (!ret)
		ret = dsfs_ckpt_pn_node(fs, dir, name, a.dir, &e->node);
	if (ret)
		return ret;
	dsfs_ckpt_pn_attr(fs, e->node->ino, &a, &e->attr);
	e->attr_timeout = e->entry_timeout = DSFS_CKPT_TIMEOUT;
	return 0;
}

static int dsfs_ckpt_access(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, int mask)
{
	(void)n;
	if (!(mask & W_OK))
		return 0;
	return dsfs_ckpt_pn_check(fs, who);
}

static int dsfs_ckpt_mkdir(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *dir, const char *name, mode_t mode,
			   struct dsfs_entry *e)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct ckpt_attr a = { .dir = true };
	char *key;
	int ret = dsfs_ckpt_pn_new_key(fs, who, dir, name, &key);

	(void)mode;
	if (!ret)
		ret = ckpt_mkdir(st->ck, key);
	if (!ret)
		ret = ckpt_stat(st->ck, key, &a);
	free(key);
	if (!ret)
		ret = dsfs_ckpt_pn_node(fs, dir, name, true, &e->node);
	if (ret)
		return ret;
	dsfs_ckpt_pn_attr(fs, e->node->ino, &a, &e->attr);
	e->attr_timeout = e->entry_timeout = DSFS_CKPT_TIMEOUT;
	return 0;
}

/* unlink and rmdir. */
static int dsfs_ckpt_remove(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *dir, const char *name, bool isdir)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	char *key;
	int ret = dsfs_ckpt_pn_check(fs, who);

	if (ret)
		return ret;
	key = dsfs_ckpt_pn_child_key(st, dir, name);
	if (!key)
		return -ENOMEM;
	ret = isdir ? ckpt_rmdir(st->ck, key) : ckpt_unlink(st->ck, key);
	free(key);
	if (!ret)
		dsfs_ckpt_pn_mark(fs, dir, name, NULL, NULL);
	return ret;
}

static int dsfs_ckpt_unlink(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *dir, const char *name)
{
	return dsfs_ckpt_remove(fs, who, dir, name, false);
}

static int dsfs_ckpt_rmdir(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *dir, const char *name)
{
	return dsfs_ckpt_remove(fs, who, dir, name, true);
}

static int dsfs_ckpt_rename(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *dir, const char *name,
			    struct dsfs_node *newdir, const char *newname,
			    unsigned flags)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	char *from = NULL, *to = NULL;
	int ret = dsfs_ckpt_pn_check(fs, who);

	if (ret)
		return ret;
	if (flags & ~RENAME_NOREPLACE)
		return -EINVAL; /* RENAME_EXCHANGE, RENAME_WHITEOUT */
	if (ckpt_name_ok("", newname))
		return -EINVAL;
	from = dsfs_ckpt_pn_child_key(st, dir, name);
	to = dsfs_ckpt_pn_child_key(st, newdir, newname);
	ret = from && to
		      ? ckpt_rename(st->ck, from, to, flags & RENAME_NOREPLACE)
		      : -ENOMEM;
	if (!ret) {
		dsfs_ckpt_pn_mark(fs, newdir, newname, NULL, NULL);
		dsfs_ckpt_pn_mark(fs, dir, name, newdir, newname);
	}
	free(from);
	free(to);
	return ret;
}

static int dsfs_ckpt_symlink(struct dsfs *fs, struct dsfs_caller *who,
			     const char *link, struct dsfs_node *dir,
			     const char *name, struct dsfs_entry *e)
{
	(void)link;
	(void)e;
	return dsfs_ckpt_pn_perm(fs, who, dir, name);
}

static int dsfs_ckpt_link(struct dsfs *fs, struct dsfs_caller *who,
			  struct dsfs_node *n, struct dsfs_node *newdir,
			  const char *newname, struct dsfs_entry *e)
{
	(void)n;
	(void)e;
	return dsfs_ckpt_pn_perm(fs, who, newdir, newname);
}

static int dsfs_ckpt_statfs(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, struct statvfs *sv)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);

	if (!st->ck)
		return fs->subs[DSFS_SUB_ROOT]->statfs
			       ? fs->subs[DSFS_SUB_ROOT]->statfs(fs, who, n, sv)
			       : 0;
	return ckpt_statfs(st->ck, sv);
}

/* ---- directories ---- */

static int dsfs_ckpt_dir_add(void *arg, const char *name,
			     const struct ckpt_attr *a)
{
	struct dsfs_ckpt_dir *d = arg;

	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 32;
		struct dsfs_ckpt_ent *v = realloc(d->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		d->v = v;
		d->cap = cap;
	}
	d->v[d->n].name = strdup(name);
	if (!d->v[d->n].name)
		return -ENOMEM;
	d->v[d->n++].a = *a;
	return 0;
}

static void dsfs_ckpt_dir_free(struct dsfs_ckpt_dir *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n; i++)
		free(d->v[i].name);
	free(d->v);
	free(d);
}

static int dsfs_ckpt_opendir(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct dsfs_ckpt_dir *d = calloc(1, sizeof(*d));
	char *key;
	int ret = 0;

	if (!d)
		return -ENOMEM;
	if (st->ck) {
		key = dsfs_ckpt_pn_key(st, dsfs_ckpt_pn_of(n));
		ret = key ? ckpt_list(st->ck, key, dsfs_ckpt_dir_add, d)
			  : -ENOMEM;
		/* listing a directory in an archived checkpoint reads it */
		if (!ret && !d->n && !dsfs_ckpt_arch_recall(fs, who, key))
			ret = ckpt_list(st->ck, key, dsfs_ckpt_dir_add, d);
		free(key);
	}
	if (ret) {
		dsfs_ckpt_dir_free(d);
		return ret;
	}
	fi->fh = (uintptr_t)d;
	return 0;
}

/* A stable, non-zero inode number for a listing entry without a node. */
static ino_t dsfs_ckpt_fake_ino(const char *name)
{
	uint64_t h = 1469598103934665603ULL;

	for (; *name; name++)
		h = (h ^ (unsigned char)*name) * 1099511628211ULL;
	return (ino_t)(h | (1ULL << 62));
}

static int dsfs_ckpt_readdir(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi,
			     off_t off, struct dsfs_reply_dir *d)
{
	struct dsfs_ckpt_dir *l = (struct dsfs_ckpt_dir *)(uintptr_t)fi->fh;
	struct dsfs_entry e = { 0 };

	(void)who;
	e.attr.st_mode = S_IFDIR;
	e.attr.st_ino = n->ino;
	if (off < 1 && dsfs_reply_dir_add(d, ".", &e, 1))
		return 0;
	e.attr.st_ino = DSFS_INO_ROOT;
	if (off < 2 && dsfs_reply_dir_add(d, "..", &e, 2))
		return 0;
	for (size_t i = off > 2 ? (size_t)off - 2 : 0; l && i < l->n; i++) {
		/* No node (and so no lookup reference) for plus entries:
		 * the kernel looks each name up when it needs it. */
		dsfs_ckpt_pn_attr(fs, dsfs_ckpt_fake_ino(l->v[i].name),
				  &l->v[i].a, &e.attr);
		if (dsfs_reply_dir_add(d, l->v[i].name, &e, (off_t)i + 3))
			break;
	}
	return 0;
}

static void dsfs_ckpt_releasedir(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, struct fuse_file_info *fi)
{
	(void)fs;
	(void)who;
	(void)n;
	dsfs_ckpt_dir_free((struct dsfs_ckpt_dir *)(uintptr_t)fi->fh);
}

/* ---- extended attributes ---- */

static int dsfs_ckpt_setxattr(struct dsfs *fs, struct dsfs_caller *who,
			      struct dsfs_node *n, const char *name,
			      const char *value, size_t size, int flags)
{
	(void)who;
	(void)n;
	(void)name;
	(void)value;
	(void)size;
	(void)flags;
	return dsfs_ckpt_st(fs)->ck ? -ENOTSUP : -EROFS;
}

static int dsfs_ckpt_removexattr(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, const char *name)
{
	(void)who;
	(void)n;
	(void)name;
	return dsfs_ckpt_st(fs)->ck ? -ENOTSUP : -EROFS;
}

static int dsfs_ckpt_getattr(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi,
			     struct stat *sb, double *timeout)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct ckpt_attr a = { .dir = true, .mtime = fs->mount_time };
	char *key;
	int ret = 0;

	(void)who;
	*timeout = DSFS_CKPT_TIMEOUT;
	if (n->ino == DSFS_INO_CHECKPOINTS || !st->ck) {
		dsfs_reply_attr(fs->opts, sb, n->ino, true, 0, fs->mount_time);
		if (st->ck)
			dsfs_ckpt_pn_attr(fs, n->ino, &a, sb);
		return 0;
	}
	if (fi && fi->fh && !dsfs_ckpt_pn_of(n)->dir) {
		ret = ckpt_file_attr(dsfs_ckpt_file_of(fi), &a);
	} else {
		key = dsfs_ckpt_pn_key(st, dsfs_ckpt_pn_of(n));
		ret = key ? ckpt_stat(st->ck, key, &a) : -ENOMEM;
		if (ret == -ENOENT)
			ret = dsfs_ckpt_arch_stat(fs, key, &a);
		free(key);
	}
	if (!ret)
		dsfs_ckpt_pn_attr(fs, n->ino, &a, sb);
	return ret;
}

static int dsfs_ckpt_setattr(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, const struct stat *attr,
			     int to_set, struct fuse_file_info *fi,
			     struct stat *sb, double *timeout)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct ckpt_file *f = fi && !dsfs_ckpt_pn_of(n)->dir
				      ? dsfs_ckpt_file_of(fi)
				      : NULL,
			 *tmp = NULL;
	bool created;
	char *key = NULL;
	int ret = dsfs_ckpt_pn_check(fs, who);

	if (ret)
		return ret;
	if (n->ino == DSFS_INO_CHECKPOINTS)
		return (to_set & (FUSE_SET_ATTR_SIZE)) ? -EISDIR : -EPERM;
	if (((to_set & FUSE_SET_ATTR_UID) && attr->st_uid != fs->opts->uid) ||
	    ((to_set & FUSE_SET_ATTR_GID) && attr->st_gid != fs->opts->gid))
		return -EPERM; /* owners are fixed (-o uid, gid) */
	key = dsfs_ckpt_pn_key(st, dsfs_ckpt_pn_of(n));
	if (!key)
		return -ENOMEM;
	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (dsfs_ckpt_pn_of(n)->dir)
			ret = -EISDIR;
		else if (f)
			ret = ckpt_file_truncate(f, (uint64_t)attr->st_size);
		else
			ret = ckpt_truncate(st->ck, key,
					    (uint64_t)attr->st_size);
	}
	if (!ret &&
	    (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)) &&
	    !dsfs_ckpt_pn_of(n)->dir) {
		struct timespec ts = attr->st_mtim;

		if (to_set & FUSE_SET_ATTR_MTIME_NOW)
			clock_gettime(CLOCK_REALTIME, &ts);
		if (!f) {
			ret = ckpt_file_open(st->ck, key, O_RDONLY, &tmp,
					     &created);
			f = tmp;
		}
		if (!ret)
			ret = ckpt_file_set_mtime(f, &ts);
	}
	ckpt_file_close(tmp);
	free(key);
	if (ret)
		return ret;
	/* chmod is accepted and has no effect: modes follow -o umask. */
	return dsfs_ckpt_getattr(fs, who, n, fi, sb, timeout);
}

const struct dsfs_subtree dsfs_ckpt_subtree = {
	.name = "checkpoints",
	.init = dsfs_ckpt_init,
	.destroy = dsfs_ckpt_destroy,
	.forget = dsfs_ckpt_forget,
	.lookup = dsfs_ckpt_lookup,
	.mknod = dsfs_ckpt_file_mknod,
	.mkdir = dsfs_ckpt_mkdir,
	.symlink = dsfs_ckpt_symlink,
	.link = dsfs_ckpt_link,
	.unlink = dsfs_ckpt_unlink,
	.rmdir = dsfs_ckpt_rmdir,
	.rename = dsfs_ckpt_rename,
	.create = dsfs_ckpt_file_create,
	.getattr = dsfs_ckpt_getattr,
	.setattr = dsfs_ckpt_setattr,
	.access = dsfs_ckpt_access,
	.statfs = dsfs_ckpt_statfs,
	.open = dsfs_ckpt_file_open,
	.read = dsfs_ckpt_file_read,
	.write = dsfs_ckpt_file_write,
	.flush = dsfs_ckpt_file_flush,
	.fsync = dsfs_ckpt_file_fsync,
	.fallocate = dsfs_ckpt_file_fallocate,
	.release = dsfs_ckpt_file_release,
	.opendir = dsfs_ckpt_opendir,
	.readdir = dsfs_ckpt_readdir,
	.releasedir = dsfs_ckpt_releasedir,
	.setxattr = dsfs_ckpt_setxattr,
	.removexattr = dsfs_ckpt_removexattr,
};
