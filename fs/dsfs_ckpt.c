// SPDX-License-Identifier: MIT
/*
 * dsfs_ckpt: the checkpoint subtree, checkpoints/ (inode 3).
 *
 * A placeholder: an empty, read-only directory (a fixed node, no state).
 * Every hook it leaves NULL gets the dispatcher's read-only default
 * (EROFS for create, mkdir, write, setattr...). The writable checkpoint
 * store fills in this table (lookup, create, mkdir, write, fsync, release,
 * unlink, rename, setattr, forget for its nodes' priv...) and keeps its
 * state in fs->sub_state[DSFS_SUB_CKPT]; nothing else changes.
 */
#include <errno.h>
#include <string.h>

#include "dsfs_ckpt.h"
#include "dsfs_opts.h"

static int dsfs_ckpt_init(struct dsfs *fs)
{
	return dsfs_nodes_add_fixed(&fs->nodes, DSFS_INO_CHECKPOINTS,
				    DSFS_INO_ROOT, &dsfs_ckpt_subtree,
				    "checkpoints", NULL);
}

static int dsfs_ckpt_lookup(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *dir, const char *name,
			    struct dsfs_entry *e)
{
	(void)fs;
	(void)who;
	(void)dir;
	(void)name;
	(void)e;
	return -ENOENT;
}

static int dsfs_ckpt_getattr(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi,
			     struct stat *st, double *timeout)
{
	(void)who;
	(void)fi;
	dsfs_reply_attr(fs->opts, st, n->ino, true, 0, fs->mount_time);
	*timeout = fs->opts->entry_timeout;
	return 0;
}

static int dsfs_ckpt_readdir(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi,
			     off_t off, struct dsfs_reply_dir *d)
{
	struct dsfs_entry e = { 0 };

	(void)fs;
	(void)who;
	(void)fi;
	e.attr.st_mode = S_IFDIR;
	e.attr.st_ino = n->ino;
	if (off < 1 && dsfs_reply_dir_add(d, ".", &e, 1))
		return 0;
	e.attr.st_ino = DSFS_INO_ROOT;
	if (off < 2)
		dsfs_reply_dir_add(d, "..", &e, 2);
	return 0;
}

const struct dsfs_subtree dsfs_ckpt_subtree = {
	.name = "checkpoints",
	.init = dsfs_ckpt_init,
	.lookup = dsfs_ckpt_lookup,
	.getattr = dsfs_ckpt_getattr,
	.readdir = dsfs_ckpt_readdir,
};
