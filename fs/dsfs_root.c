// SPDX-License-Identifier: MIT
/*
 * dsfs_root: the root subtree, "/" (inode 1).
 *
 * Stateless: the root is a fixed node registered at init. Its entries are
 * the tops of the other subtrees, fixed nodes those subtrees registered in
 * their own init (datasets/, checkpoints/, .dstage/); the root only names
 * them and gives their attributes, the ones every fixed directory has
 * (dsfs_reply_attr, mtime = mount time), as their own getattr does.
 *
 * It also answers statfs for the whole mount (the cache's capacity and
 * use): the dispatcher falls back to it for subtrees without a statfs.
 */
#include <errno.h>
#include <string.h>
#include <sys/statvfs.h>

#include "dsfs_opts.h"
#include "dsfs_root.h"
#include "dstage/cache.h"

static const struct {
	const char *name;
	fuse_ino_t ino;
} dsfs_root_tops[] = {
	{ "datasets", DSFS_INO_DATASETS },
	{ "checkpoints", DSFS_INO_CHECKPOINTS },
	{ ".dstage", DSFS_INO_CTL },
};

#define DSFS_ROOT_NTOPS (sizeof(dsfs_root_tops) / sizeof(dsfs_root_tops[0]))

static int dsfs_root_init(struct dsfs *fs)
{
	return dsfs_nodes_add_fixed(&fs->nodes, DSFS_INO_ROOT, DSFS_INO_ROOT,
				    &dsfs_root_subtree, "", NULL);
}

static void dsfs_root_dir_entry(struct dsfs *fs, struct dsfs_node *n,
				fuse_ino_t ino, struct dsfs_entry *e)
{
	memset(e, 0, sizeof(*e));
	e->node = n;
	dsfs_reply_attr(fs->opts, &e->attr, ino, true, 0, fs->mount_time);
	e->attr_timeout = fs->opts->entry_timeout;
	e->entry_timeout = e->attr_timeout;
}

static int dsfs_root_lookup(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *dir, const char *name,
			    struct dsfs_entry *e)
{
	(void)dir;
	for (size_t i = 0; i < DSFS_ROOT_NTOPS; i++) {
		struct dsfs_node *n;

		if (strcmp(name, dsfs_root_tops[i].name))
			continue;
		n = dsfs_nodes_find(&fs->nodes, dsfs_root_tops[i].ino);
		if (!n)
			return -ENOENT;
		/* Fixed nodes are never forgotten: no nlookup to raise. */
		dsfs_root_dir_entry(fs, n, n->ino, e);
		/* a subtree's top may have its own owner and mode
		 * (checkpoints/ is 1777): as its getattr says */
		if (n->sub != &dsfs_root_subtree && n->sub->getattr)
			return n->sub->getattr(fs, who, n, NULL, &e->attr,
					       &e->attr_timeout);
		return 0;
	}
	return -ENOENT;
}

static int dsfs_root_getattr(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi,
			     struct stat *st, double *timeout)
{
	(void)who;
	(void)fi;
	dsfs_reply_attr(fs->opts, st, n->ino, true, 0, fs->mount_time);
	*timeout = fs->opts->entry_timeout;
	return 0;
}

static int dsfs_root_readdir(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi,
			     off_t off, struct dsfs_reply_dir *d)
{
	struct dsfs_entry e;

	(void)who;
	(void)fi;
	for (off_t i = off; i < (off_t)DSFS_ROOT_NTOPS + 2; i++) {
		const char *name = i == 0 ? "." : i == 1 ? ".." : NULL;
		struct dsfs_node *top = NULL;
		fuse_ino_t ino = n->ino;

		if (!name) {
			name = dsfs_root_tops[i - 2].name;
			ino = dsfs_root_tops[i - 2].ino;
			top = dsfs_nodes_find(&fs->nodes, ino);
			if (!top)
				continue;
		}
		/* "." and ".." carry no node id in plus listings. */
		dsfs_root_dir_entry(fs, top, ino, &e);
		if (dsfs_reply_dir_add(d, name, &e, i + 1))
			break;
	}
	return 0;
}

static int dsfs_root_statfs(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, struct statvfs *sv)
{
	struct cache_stats cs;

	(void)who;
	(void)n;
	memset(sv, 0, sizeof(*sv));
	sv->f_bsize = 4096;
	sv->f_frsize = 4096;
	sv->f_namemax = 255;
	if (!fs->cache)
		return 0;
	cache_get_stats(fs->cache, &cs);
	sv->f_blocks = cs.capacity / 4096;
	sv->f_bfree =
		cs.capacity > cs.used ? (cs.capacity - cs.used) / 4096 : 0;
	sv->f_bavail = sv->f_bfree;
	return 0;
}

const struct dsfs_subtree dsfs_root_subtree = {
	.name = "root",
	.init = dsfs_root_init,
	.lookup = dsfs_root_lookup,
	.getattr = dsfs_root_getattr,
	.readdir = dsfs_root_readdir,
	.statfs = dsfs_root_statfs,
};
