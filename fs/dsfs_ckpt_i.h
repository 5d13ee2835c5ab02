/* SPDX-License-Identifier: MIT */
/*
 * dsfs_ckpt_i: what the checkpoint subtree's files share: dsfs_ckpt.c (the
 * hook table, life, names, directories) calls dsfs_ckpt_file.c (open
 * files), both call dsfs_ckpt_pn.c (nodes, keys, attributes). The state
 * and the locks are described in dsfs_ckpt.c and dsfs_ckpt_pn.c.
 */
#ifndef DSFS_CKPT_I_H
#define DSFS_CKPT_I_H

#include "dsfs_subtree.h"

struct ckpt_attr;

#define DSFS_CKPT_TIMEOUT 1.0 /* entries and attributes: others may write */

struct dsfs_ckpt_pn {
	struct dsfs_ckpt_pn *parent; /* st->lock; NULL for the top */
	char *name; /* st->lock */
	unsigned refs; /* st->lock */
	bool dir;
	bool gone; /* st->lock: removed or replaced */
};

struct dsfs_ckpt {
	struct ckpt *ck; /* NULL: no store configured (read-only) */
	/* The block cache's dataset for other nodes' files:
	 * "checkpoints:<store URL>" (no dataset name has a ':' and a '/',
	 * so it meets none of theirs, nor their pins and quotas). Immutable
	 * after init; NULL without a store. */
	char *cache_label;
	/* What this node publishes, recorded in the catalog through ckpt's
	 * hooks (its lock a leaf, taken inside ckpt's). Immutable after
	 * init; NULL without a store. */
	struct catalog_ckpt_log *record;
	pthread_mutex_t lock;
	struct dsfs_ckpt_pn top;
};

static inline struct dsfs_ckpt *dsfs_ckpt_st(struct dsfs *fs)
{
	return fs->sub_state[DSFS_SUB_CKPT];
}

static inline struct dsfs_ckpt_pn *dsfs_ckpt_pn_of(struct dsfs_node *n)
{
	return n->priv;
}

/* dsfs_ckpt_pn.c */
/* The key of pn, or of name in dir (malloc'd), or NULL. */
char *dsfs_ckpt_pn_key(struct dsfs_ckpt *st, struct dsfs_ckpt_pn *pn);
char *dsfs_ckpt_pn_child_key(struct dsfs_ckpt *st, struct dsfs_node *dir,
			     const char *name);
/* Drop a reference of pn (st->lock held), freeing what reaches 0. */
void dsfs_ckpt_pn_unref_locked(struct dsfs_ckpt *st, struct dsfs_ckpt_pn *pn);
/* The forget hook: drop the node's reference on its pn. */
void dsfs_ckpt_pn_forget(struct dsfs *fs, struct dsfs_node *n);
/* After a remove (newdir NULL: the node of name in dir is gone) or a
 * rename (it moves to newname in newdir). */
void dsfs_ckpt_pn_mark(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		       struct dsfs_node *newdir, const char *newname);
/* The node of name in dir, made if needed, its nlookup raised. */
int dsfs_ckpt_pn_node(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		      bool isdir, struct dsfs_node **out);
/* Drop one lookup reference of n (freeing it at 0). */
void dsfs_ckpt_pn_unref_node(struct dsfs *fs, struct dsfs_node *n);
/* The attributes the kernel sees for a. */
void dsfs_ckpt_pn_attr(struct dsfs *fs, fuse_ino_t ino,
		       const struct ckpt_attr *a, struct stat *st);
/* 0 when who may change the subtree, else -EROFS (no store) or -EACCES. */
int dsfs_ckpt_pn_check(struct dsfs *fs, struct dsfs_caller *who);
/* For a call that makes name in dir: 0 and *key (malloc'd) its key, or
 * what dsfs_ckpt_pn_check refuses, -EINVAL (a name ckpt_name_ok refuses)
 * or -ENOMEM, *key NULL. */
int dsfs_ckpt_pn_new_key(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *dir, const char *name, char **key);
/* What links and special files get: -EPERM (-EROFS without a store). */
int dsfs_ckpt_pn_perm(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, const char *name);

/* dsfs_ckpt_arch.c: checkpoints the lifecycle moved to their archive */
/* key's attributes in the archive, nothing recalled: 0, -ENOENT (not
 * archived) or a store error. */
int dsfs_ckpt_arch_stat(struct dsfs *fs, const char *key, struct ckpt_attr *a);
/* Recall the checkpoint of key (NULL: -ENOMEM) for a read by who,
 * audited as who's uid: 0, -ENOENT (not archived) or a store error. */
int dsfs_ckpt_arch_recall(struct dsfs *fs, struct dsfs_caller *who,
			  const char *key);

/* dsfs_ckpt_file.c: the subtree's hooks for files (dsfs_subtree.h) */
int dsfs_ckpt_file_create(struct dsfs *fs, struct dsfs_caller *who,
			  struct dsfs_node *dir, const char *name, mode_t mode,
			  struct fuse_file_info *fi, struct dsfs_entry *e);
int dsfs_ckpt_file_mknod(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *dir, const char *name, mode_t mode,
			 dev_t rdev, struct dsfs_entry *e);
int dsfs_ckpt_file_open(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, struct fuse_file_info *fi);
int dsfs_ckpt_file_read(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, struct fuse_file_info *fi,
			size_t size, off_t off, struct dsfs_reply_read *r);
ssize_t dsfs_ckpt_file_write(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi,
			     const char *buf, size_t size, off_t off);
int dsfs_ckpt_file_flush(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, struct fuse_file_info *fi);
int dsfs_ckpt_file_fsync(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, int datasync,
			 struct fuse_file_info *fi);
int dsfs_ckpt_file_fallocate(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, int mode, off_t off,
			     off_t len, struct fuse_file_info *fi);
void dsfs_ckpt_file_release(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, struct fuse_file_info *fi);
/* The file behind fi->fh (getattr of an open file). */
struct ckpt_file *dsfs_ckpt_file_of(struct fuse_file_info *fi);

#endif
