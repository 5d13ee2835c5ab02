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
 * Who may do what: each file and directory has the owner and mode of its
 * creator, kept with it in the store (dsfs_ckpt_own.c), and every hook
 * checks its caller as POSIX does (search on the directories above,
 * read/write on the object, write on the directory to make, remove or
 * rename, the sticky bit; root may do anything). checkpoints/ itself is
 * 1777. Hard links, symbolic links and special files: EPERM; extended attributes:
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
#include "dstage/grow.h"
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
	pthread_mutex_init(&st->open_lock, NULL);
	st->top.dir = true;
	st->top.refs = 1;
	/* as /tmp: everyone makes job directories, each its owner's */
	st->top.own.uid = fs->opts->uid;
	st->top.own.gid = fs->opts->gid;
	st->top.own.mode = 01777;
	st->top.own_ms = INT64_MAX;
	fs->sub_state[DSFS_SUB_CKPT] = st;
	if (fs->cfg && fs->cfg->ckpt_store) {
		struct ckpt_hooks h;

		/* What this node publishes is recorded in the catalog. */
		ret = catalog_ckpt_log_new(fs->cfg->catalog_path, &st->record);
		if (ret)
			return ret;
		catalog_ckpt_log_hooks(st->record, &h);
		h.threads_later = true; /* dsfs_ckpt_start, after the fork */
		ret = ckpt_open_ex(fs->cfg, &h, &st->ck);
		if (ret)
			return ret;
		st->uid_open_max = fs->cfg->ckpt_uid_open_files;
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

/* The uploader and retry threads, after dstagefs forked (dsfs_start). */
static int dsfs_ckpt_start(struct dsfs *fs)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);

	return st && st->ck ? ckpt_start(st->ck) : 0;
}

static void dsfs_ckpt_destroy(struct dsfs *fs)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);

	if (!st)
		return;
	ckpt_free(st->ck); /* no hook runs after it */
	catalog_ckpt_log_free(st->record);
	free(st->cache_label);
	free(st->open_uids);
	pthread_mutex_destroy(&st->open_lock);
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
	struct ckpt_owner o;
	struct ckpt_attr a;
	uint64_t gen;
	char *key;
	int ret;

	if (!st->ck || ckpt_name_ok("", name))
		return -ENOENT;
	ret = dsfs_ckpt_may_dir(fs, who, dir, X_OK, NULL);
	if (ret)
		return ret;
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
	ret = dsfs_ckpt_own_get(fs, dsfs_ckpt_pn_of(e->node), true, &o);
	if (ret) {
		dsfs_ckpt_pn_unref_node(fs, e->node);
		e->node = NULL;
		return ret;
	}
	dsfs_ckpt_own_entry(fs, &a, &o, e);
	return 0;
}

static int dsfs_ckpt_access(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, int mask)
{
	struct dsfs_ckpt_pn *pn = dsfs_ckpt_pn_of(n);
	struct ckpt_owner o;
	int ret = (mask & W_OK) ? dsfs_ckpt_pn_check(fs, who) : 0;

	if (!ret)
		ret = dsfs_ckpt_may_walk(fs, who, pn);
	if (!ret)
		ret = dsfs_ckpt_own_get(fs, pn, false, &o);
	if (!ret)
		ret = dsfs_ckpt_may(who, &o, mask);
	return ret;
}

static int dsfs_ckpt_mkdir(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *dir, const char *name, mode_t mode,
			   struct dsfs_entry *e)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct ckpt_attr a = { .dir = true };
	struct ckpt_owner downer, o = { 0 };
	char *key;
	int ret = dsfs_ckpt_pn_new_key(fs, who, dir, name, &key);

	if (!ret)
		ret = dsfs_ckpt_may_dir(fs, who, dir, W_OK | X_OK, &downer);
	if (!ret)
		ret = ckpt_mkdir(st->ck, key);
	/* the name is claimed in the store (other nodes see the directory
	 * with its first file); another uid's claim: it exists elsewhere,
	 * and is shown here as the store's */
	if (!ret) {
		dsfs_ckpt_own_new(who, &downer, true, mode, &o);
		ret = dsfs_ckpt_own_claim(fs, key, &o);
		if (ret && ret != -EEXIST)
			ckpt_rmdir(st->ck, key);
	}
	if (!ret)
		ret = ckpt_stat(st->ck, key, &a);
	free(key);
	if (!ret)
		ret = dsfs_ckpt_pn_node(fs, dir, name, true, &e->node);
	if (ret)
		return ret;
	dsfs_ckpt_own_remember(fs, dsfs_ckpt_pn_of(e->node), &o);
	dsfs_ckpt_own_entry(fs, &a, &o, e);
	return 0;
}

/* unlink and rmdir. */
static int dsfs_ckpt_remove(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *dir, const char *name, bool isdir)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct ckpt_owner downer;
	char *key = NULL;
	int ret = dsfs_ckpt_pn_check(fs, who);

	if (!ret)
		ret = dsfs_ckpt_may_dir(fs, who, dir, X_OK, &downer);
	if (ret)
		return ret;
	key = dsfs_ckpt_pn_child_key(st, dir, name);
	if (!key)
		return -ENOMEM;
	ret = dsfs_ckpt_may_remove(fs, who, &downer, key, isdir, NULL);
	if (!ret)
		ret = isdir ? ckpt_rmdir(st->ck, key)
			    : ckpt_unlink(st->ck, key);
	if (!ret) {
		ckpt_owner_remove(st->ck, key);
		ckpt_owner_move_kept(st->ck, key, NULL);
		dsfs_ckpt_pn_mark(fs, dir, name, NULL, NULL);
	}
	free(key);
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

/*
 * A directory renamed onto a name this node does not list: the name may
 * be a directory made on another node with nothing below it published
 * yet (its claim, the record, is all the store has of it). Claim the new
 * name for the directory's owner o before anything moves, as its mkdir
 * would: another uid's claim refuses the rename (-EEXIST), so that no
 * rename takes another user's directory; the same uid's yields it, as a
 * mkdir does. Returns 0, -EEXIST or the claim's -errno (the store away:
 * the rename fails, as the owners' copy that follows would).
 */
static int dsfs_ckpt_rename_claim(struct dsfs *fs, const char *from,
				  const char *to, const struct ckpt_owner *o)
{
	struct ckpt_owner theirs;
	int ret = ckpt_owner_claim(dsfs_ckpt_st(fs)->ck, to, o, &theirs);

	if (ret == -EEXIST)
		log_warn("checkpoints: %s is not renamed to %s: that name is "
			 "uid %u's directory, made on another node",
			 from, to, theirs.uid);
	return ret;
}

static int dsfs_ckpt_rename(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *dir, const char *name,
			    struct dsfs_node *newdir, const char *newname,
			    unsigned flags)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct ckpt_owner dfrom, dto, o, oldto;
	struct ckpt_attr a, ta;
	char *from = NULL, *to = NULL;
	bool had_to = false;
	int ret = dsfs_ckpt_pn_check(fs, who);

	if (ret)
		return ret;
	if (flags & ~RENAME_NOREPLACE)
		return -EINVAL; /* RENAME_EXCHANGE, RENAME_WHITEOUT */
	if (ckpt_name_ok("", newname))
		return -EINVAL;
	from = dsfs_ckpt_pn_child_key(st, dir, name);
	to = dsfs_ckpt_pn_child_key(st, newdir, newname);
	if (!from || !to) {
		ret = -ENOMEM;
		goto out;
	}
	ret = ckpt_key_check(st->ck, to); /* before the owners move */
	if (ret)
		goto out;
	/* as POSIX: write and search on both directories, the sticky bit
	 * on both names, write on a directory that changes its parent */
	ret = dsfs_ckpt_may_dir(fs, who, dir, X_OK, &dfrom);
	if (!ret)
		ret = dsfs_ckpt_may_dir(fs, who, newdir, X_OK, &dto);
	if (!ret)
		ret = ckpt_stat(st->ck, from, &a);
	if (!ret)
		ret = dsfs_ckpt_may_remove(fs, who, &dfrom, from, a.dir, &o);
	if (!ret && a.dir && dir != newdir)
		ret = dsfs_ckpt_may(who, &o, W_OK);
	if (!ret)
		ret = dsfs_ckpt_may(who, &dto, W_OK | X_OK);
	if (!ret && !ckpt_stat(st->ck, to, &ta)) {
		had_to = true;
		ret = dsfs_ckpt_may_remove(fs, who, &dto, to, ta.dir, &oldto);
	}
	if (!ret && a.dir && !had_to)
		ret = dsfs_ckpt_rename_claim(fs, from, to, &o);
	if (ret)
		goto out;
	/* the owners first, so that no moment shows the data without them;
	 * a copy that failed part-way (a key below past the store's limit)
	 * or a rename refused is undone: no record stays under to but the
	 * one it had */
	ret = ckpt_owner_copy(st->ck, from, to, a.dir, false);
	if (!ret)
		ret = ckpt_rename(st->ck, from, to, flags & RENAME_NOREPLACE);
	if (ret) {
		ckpt_owner_copy(st->ck, to, NULL, a.dir, true);
		if (had_to)
			dsfs_ckpt_own_write(fs, NULL, to, &oldto);
		goto out;
	}
	ckpt_owner_copy(st->ck, from, NULL, a.dir, true);
	ckpt_owner_move_kept(st->ck, to, NULL); /* the one it replaced */
	ckpt_owner_move_kept(st->ck, from, to);
	dsfs_ckpt_pn_mark(fs, newdir, newname, NULL, NULL);
	dsfs_ckpt_pn_mark(fs, dir, name, newdir, newname);
out:
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

	if (GROW_ONE(d->v, d->n, d->cap, 32))
		return -ENOMEM;
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
	struct dsfs_ckpt_dir *d;
	struct ckpt_owner o;
	char *key;
	int ret = 0;

	if (st->ck) {
		ret = dsfs_ckpt_may_walk(fs, who, dsfs_ckpt_pn_of(n));
		if (!ret)
			ret = dsfs_ckpt_own_get(fs, dsfs_ckpt_pn_of(n), false,
						&o);
		if (!ret)
			ret = dsfs_ckpt_may(who, &o, R_OK);
		if (ret)
			return ret;
	}
	d = calloc(1, sizeof(*d));
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
				  &l->v[i].a, NULL, &e.attr);
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
	struct dsfs_ckpt_pn *pn = dsfs_ckpt_pn_of(n);
	struct ckpt_owner o;
	char *key;
	int ret = 0;

	*timeout = DSFS_CKPT_TIMEOUT;
	if (n->ino == DSFS_INO_CHECKPOINTS || !st->ck) {
		dsfs_reply_attr(fs->opts, sb, n->ino, true, 0, fs->mount_time);
		if (st->ck)
			dsfs_ckpt_pn_attr(fs, n->ino, &a, &st->top.own, sb);
		return 0;
	}
	/* stat(2) needs search on the directories above; fstat(2) not */
	if (!(fi && fi->fh)) {
		ret = dsfs_ckpt_may_walk(fs, who, pn);
		if (ret)
			return ret;
	}
	ret = dsfs_ckpt_own_get(fs, pn, false, &o);
	if (ret)
		return ret;
	if (fi && fi->fh && !dsfs_ckpt_pn_of(n)->dir) {
		ret = ckpt_file_attr(dsfs_ckpt_file_of(fi), &a);
	} else {
		key = dsfs_ckpt_pn_key(st, dsfs_ckpt_pn_of(n));
		ret = key ? ckpt_stat(st->ck, key, &a) : -ENOMEM;
		if (ret == -ENOENT)
			ret = dsfs_ckpt_arch_stat(fs, key, &a);
		free(key);
	}
	if (!ret) {
		dsfs_ckpt_pn_attr(fs, n->ino, &a, &o, sb);
		*timeout = dsfs_ckpt_attr_timeout(fs, pn);
	}
	return ret;
}

/*
 * May who make setattr's changes to n (f: its open file, or NULL)? As
 * POSIX: chmod by the owner or root; chown to another user by root only;
 * chgrp by root, or by the owner to one of its groups; truncate with
 * write permission (or a descriptor open for writing); times set to
 * given values by the owner or root, to now also with write permission.
 * Returns 0 (*o the owner and mode after the change, *changed whether
 * they change), -EPERM or -EACCES.
 */
static int dsfs_ckpt_setattr_may(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, const struct stat *attr,
				 int to_set, struct ckpt_file *f,
				 struct ckpt_owner *o, bool *changed)
{
	struct dsfs_ckpt_pn *pn = dsfs_ckpt_pn_of(n);
	struct ckpt_owner cur;
	bool root = who->uid == 0, owner;
	int ret = dsfs_ckpt_may_walk(fs, who, pn);

	*changed = false;
	if (!ret)
		ret = dsfs_ckpt_own_get(fs, pn, true, &cur);
	if (ret)
		return ret;
	*o = cur;
	owner = root || who->uid == cur.uid;
	if ((to_set & FUSE_SET_ATTR_UID) && attr->st_uid != cur.uid) {
		if (!root)
			return -EPERM;
		o->uid = attr->st_uid;
		*changed = true;
	}
	if ((to_set & FUSE_SET_ATTR_GID) && attr->st_gid != cur.gid) {
		if (!owner ||
		    (!root && !dsfs_caller_in_group(who, attr->st_gid)))
			return -EPERM;
		o->gid = attr->st_gid;
		*changed = true;
	}
	if (*changed && !pn->dir) /* as chown(2): no set-ID bits survive */
		o->mode &= ~(mode_t)(S_ISUID | S_ISGID);
	if (to_set & FUSE_SET_ATTR_MODE) {
		if (!owner)
			return -EPERM;
		o->mode = attr->st_mode & 07777;
		if (!pn->dir && !root && !dsfs_caller_in_group(who, o->gid))
			o->mode &= ~(mode_t)S_ISGID;
		*changed = true;
	}
	if ((to_set & FUSE_SET_ATTR_SIZE) && !(f && ckpt_file_writable(f)))
		ret = dsfs_ckpt_may(who, &cur, W_OK);
	if (!ret && !owner &&
	    (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME)) &&
	    !(to_set & (FUSE_SET_ATTR_MTIME_NOW | FUSE_SET_ATTR_ATIME_NOW)))
		ret = -EPERM;
	if (!ret && !owner &&
	    (to_set & (FUSE_SET_ATTR_MTIME_NOW | FUSE_SET_ATTR_ATIME_NOW)))
		ret = dsfs_ckpt_may(who, &cur, W_OK);
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
	struct ckpt_owner o;
	bool created, own_changed;
	char *key = NULL;
	int ret = dsfs_ckpt_pn_check(fs, who);

	if (ret)
		return ret;
	if (n->ino == DSFS_INO_CHECKPOINTS) /* 1777, the mount owner's */
		return (to_set & (FUSE_SET_ATTR_SIZE)) ? -EISDIR : -EPERM;
	ret = dsfs_ckpt_setattr_may(fs, who, n, attr, to_set, f, &o,
				    &own_changed);
	if (ret)
		return ret;
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
	/* chmod, chown: the owner record, which every node enforces */
	if (!ret && own_changed)
		ret = dsfs_ckpt_own_write(fs, dsfs_ckpt_pn_of(n), key, &o);
	free(key);
	if (ret)
		return ret;
	return dsfs_ckpt_getattr(fs, who, n, fi, sb, timeout);
}

const struct dsfs_subtree dsfs_ckpt_subtree = {
	.name = "checkpoints",
	.init = dsfs_ckpt_init,
	.start = dsfs_ckpt_start,
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
