// SPDX-License-Identifier: MIT
/*
 * dsfs_root: the static top of the namespace (/, /checkpoints).
 *
 * Stateless: the nodes are fixed members of struct dsfs, created at init and
 * never freed; their attributes never change.
 *
 * /checkpoints is its own subtree (dsfs_ckpt_subtree). Today it is an empty,
 * read-only directory; the writable checkpoint store fills in the hooks of
 * that table (lookup, readdir, create, mkdir, write, fsync, release, unlink,
 * rename, setattr) in its own module, and nothing else changes.
 */
#include <errno.h>
#include <string.h>

#include "dsfs.h"

static void dsfs_static_stat(struct dsfs *fs, const struct dsfs_node *n,
			     struct stat *st)
{
	dsfs_stat_fill(fs, st, n->ino, true, 0, n->mtime, NULL);
}

static double dsfs_static_timeout(struct dsfs *fs, const struct dsfs_node *n)
{
	(void)n;
	return fs->opts->entry_timeout;
}

static int dsfs_root_lookup(struct dsfs *fs, struct dsfs_node *dir,
			    const char *name, struct dsfs_caller *who,
			    struct dsfs_node **out)
{
	(void)dir;
	(void)who;
	if (strcmp(name, "datasets") == 0)
		*out = &fs->datasets;
	else if (strcmp(name, "checkpoints") == 0)
		*out = &fs->checkpoints;
	else if (strcmp(name, ".dstage") == 0)
		*out = &fs->ctl;
	else
		return -ENOENT;
	return 0;
}

static int dsfs_root_readdir(struct dsfs *fs, struct dsfs_node *n,
			     struct fuse_file_info *fi, off_t off,
			     struct dsfs_dirbuf *db)
{
	struct dsfs_node *ents[] = { &fs->root, &fs->root, &fs->datasets,
				     &fs->checkpoints, &fs->ctl };
	const char *names[] = { ".", "..", "datasets", "checkpoints",
				".dstage" };

	(void)fi;
	(void)n;
	for (off_t i = off; i < (off_t)(sizeof(ents) / sizeof(ents[0])); i++) {
		/* "." and ".." carry no node id in plus listings. */
		struct dsfs_node *e = i < 2 ? NULL : ents[i];

		if (dsfs_dirbuf_add(db, names[i], e, ents[i]->ino, S_IFDIR,
				    i + 1))
			break;
	}
	return 0;
}

const struct dsfs_subtree dsfs_root_subtree = {
	.name = "root",
	.lookup = dsfs_root_lookup,
	.stat = dsfs_static_stat,
	.readdir = dsfs_root_readdir,
	.timeout = dsfs_static_timeout,
};

static int dsfs_ckpt_lookup(struct dsfs *fs, struct dsfs_node *dir,
			    const char *name, struct dsfs_caller *who,
			    struct dsfs_node **out)
{
	(void)fs;
	(void)dir;
	(void)name;
	(void)who;
	(void)out;
	return -ENOENT;
}

static int dsfs_ckpt_readdir(struct dsfs *fs, struct dsfs_node *n,
			     struct fuse_file_info *fi, off_t off,
			     struct dsfs_dirbuf *db)
{
	(void)fs;
	(void)fi;
	if (off < 1 && dsfs_dirbuf_add(db, ".", NULL, n->ino, S_IFDIR, 1))
		return 0;
	if (off < 2)
		dsfs_dirbuf_add(db, "..", NULL, DSFS_INO_ROOT, S_IFDIR, 2);
	return 0;
}

/* The checkpoint subtree: empty and read-only until the store lands. */
const struct dsfs_subtree dsfs_ckpt_subtree = {
	.name = "checkpoints",
	.lookup = dsfs_ckpt_lookup,
	.stat = dsfs_static_stat,
	.readdir = dsfs_ckpt_readdir,
	.timeout = dsfs_static_timeout,
};
