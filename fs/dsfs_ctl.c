// SPDX-License-Identifier: MIT
/*
 * dsfs_ctl: the control subtree, .dstage/ (inode 4) and its files.
 *
 *   prefetch  (inode 5) writable by everyone: a job writes the paths it
 *             will read next, one per line, in order; on close dstagefs
 *             hands them to cache_prefetch, per dataset, keeping at most
 *             opts.prefetch_window bytes in flight and at most half of
 *             the cache ahead of the reader (docs/cache.md). Reading it
 *             gives the summary of the last list the reading uid submitted
 *             (each uid sees only its own).
 *   stats     (inode 6) read-only: cache and file-system counters, "key
 *             value" lines.
 *
 * Prefetch lists and the per-uid limits live in dsfs_ctl_prefetch.c
 * (below this file; dsfs_ctl_i.h).
 *
 * Locks: pf.lock (one per list; the kernel serialises writes to one file
 * through its inode lock, the lock makes that explicit and covers flush
 * racing release) is taken before ctl.lock, a leaf lock over the per-uid
 * records and summaries.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsfs_ctl.h"
#include "dsfs_ctl_i.h"
#include "dsfs_opts.h"
#include "dstage/cache.h"
#include "dstage/objstore.h"

static int dsfs_ctl_init(struct dsfs *fs)
{
	struct dsfs_ctl *c = calloc(1, sizeof(*c));
	int ret;

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	fs->sub_state[DSFS_SUB_CTL] = c;
	ret = dsfs_nodes_add_fixed(&fs->nodes, DSFS_INO_CTL, DSFS_INO_ROOT,
				   &dsfs_ctl_subtree, ".dstage", NULL);
	if (!ret)
		ret = dsfs_nodes_add_fixed(&fs->nodes, DSFS_INO_PREFETCH,
					   DSFS_INO_CTL, &dsfs_ctl_subtree,
					   "prefetch", NULL);
	if (!ret)
		ret = dsfs_nodes_add_fixed(&fs->nodes, DSFS_INO_STATS,
					   DSFS_INO_CTL, &dsfs_ctl_subtree,
					   "stats", NULL);
	return ret;
}

static void dsfs_ctl_destroy(struct dsfs *fs)
{
	struct dsfs_ctl *c = dsfs_ctl_of(fs);

	if (!c)
		return;
	dsfs_ctl_uids_free(c);
	pthread_mutex_destroy(&c->lock);
	free(c);
	fs->sub_state[DSFS_SUB_CTL] = NULL;
}

/* ---- attributes and names ---- */

static void dsfs_ctl_attr(struct dsfs *fs, fuse_ino_t ino, struct stat *st)
{
	dsfs_reply_attr(fs->opts, st, ino, ino == DSFS_INO_CTL, 0,
			fs->mount_time);
	if (ino == DSFS_INO_PREFETCH)
		st->st_mode = S_IFREG | 0666;
}

static void dsfs_ctl_entry(struct dsfs *fs, struct dsfs_node *n, fuse_ino_t ino,
			   struct dsfs_entry *e)
{
	memset(e, 0, sizeof(*e));
	e->node = n;
	dsfs_ctl_attr(fs, ino, &e->attr);
	/* Sizes are 0 and content is made at open (direct_io). */
	e->attr_timeout = fs->opts->entry_timeout;
	e->entry_timeout = e->attr_timeout;
}

static int dsfs_ctl_getattr(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, struct fuse_file_info *fi,
			    struct stat *st, double *timeout)
{
	(void)who;
	(void)fi;
	dsfs_ctl_attr(fs, n->ino, st);
	*timeout = fs->opts->entry_timeout;
	return 0;
}

static int dsfs_ctl_lookup(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *dir, const char *name,
			   struct dsfs_entry *e)
{
	fuse_ino_t ino;

	(void)who;
	if (dir->ino != DSFS_INO_CTL)
		return -ENOTDIR;
	if (strcmp(name, "prefetch") == 0)
		ino = DSFS_INO_PREFETCH;
	else if (strcmp(name, "stats") == 0)
		ino = DSFS_INO_STATS;
	else
		return -ENOENT;
	dsfs_ctl_entry(fs, dsfs_nodes_find(&fs->nodes, ino), ino, e);
	return e->node ? 0 : -ENOENT;
}

static int dsfs_ctl_readdir(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, struct fuse_file_info *fi,
			    off_t off, struct dsfs_reply_dir *d)
{
	static const char *const names[] = { ".", "..", "prefetch", "stats" };
	const fuse_ino_t inos[] = { DSFS_INO_CTL, DSFS_INO_ROOT,
				    DSFS_INO_PREFETCH, DSFS_INO_STATS };
	struct dsfs_entry e;

	(void)who;
	(void)fi;
	if (n->ino != DSFS_INO_CTL)
		return -ENOTDIR;
	for (off_t i = off; i < 4; i++) {
		/* "." and ".." carry no node id in plus listings. */
		dsfs_ctl_entry(
			fs, i < 2 ? NULL : dsfs_nodes_find(&fs->nodes, inos[i]),
			inos[i], &e);
		if (i < 2)
			e.attr.st_mode = S_IFDIR;
		if (dsfs_reply_dir_add(d, names[i], &e, i + 1))
			break;
	}
	return 0;
}

static int dsfs_ctl_access(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *n, int mask)
{
	(void)fs;
	(void)who;
	if ((mask & W_OK) && n->ino != DSFS_INO_PREFETCH)
		return -EROFS;
	return 0;
}

/* Truncation (shell "> file") and times are accepted and ignored. */
static int dsfs_ctl_setattr(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, const struct stat *attr,
			    int to_set, struct fuse_file_info *fi,
			    struct stat *st, double *timeout)
{
	(void)attr;
	if (n->ino != DSFS_INO_PREFETCH ||
	    (to_set &
	     (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)))
		return -EROFS;
	return dsfs_ctl_getattr(fs, who, n, fi, st, timeout);
}

/* ---- open files ---- */

static struct dsfs_ctl_fh *dsfs_ctl_fh_text(const char *text, size_t len)
{
	struct dsfs_ctl_fh *h = malloc(sizeof(*h) + len + 1);

	if (h) {
		h->pf = NULL;
		h->len = len;
		memcpy(h->text, text, len);
		h->text[len] = '\0';
	}
	return h;
}

static struct dsfs_ctl_fh *dsfs_ctl_stats_text(struct dsfs *fs)
{
	struct dsfs_counters *c = &fs->ctr;
	struct dsfs_ctl_fh *h;
	struct cache_stats cs = { 0 };
	struct objstore_tier_stats ts;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return NULL;
	if (fs->cache)
		cache_get_stats(fs->cache, &cs);
	fprintf(f,
		"cache_capacity %" PRIu64 "\ncache_used %" PRIu64
		"\ncache_pinned %" PRIu64 "\ncache_hits %" PRIu64
		"\ncache_misses %" PRIu64 "\nbytes_from_cache %" PRIu64
		"\nbytes_from_source %" PRIu64 "\nfetches %" PRIu64
		"\nchecksum_failures %" PRIu64 "\nevictions %" PRIu64
		"\nstreamed %" PRIu64 "\n",
		cs.capacity, cs.used, cs.pinned, cs.hits, cs.misses,
		cs.bytes_from_cache, cs.bytes_from_source, cs.fetches,
		cs.checksum_failures, cs.evictions, cs.streamed);
	fprintf(f,
		"fs_reads %llu\nfs_read_bytes %llu\nfs_splice_replies %llu\n"
		"fs_copy_replies %llu\nfs_read_errors %llu\nfs_lookups %llu\n"
		"fs_readdirs %llu\nfs_prefetch_lists %llu\n"
		"fs_prefetch_objects %llu\n",
		atomic_load(&c->reads), atomic_load(&c->read_bytes),
		atomic_load(&c->splice_replies), atomic_load(&c->copy_replies),
		atomic_load(&c->read_errors), atomic_load(&c->lookups),
		atomic_load(&c->readdirs), atomic_load(&c->prefetch_lists),
		atomic_load(&c->prefetch_objects));
	fprintf(f, "fs_passthrough %d\n", fs->passthrough); /* 1: on */
	fprintf(f, "fs_passthrough_opens %llu\n",
		atomic_load(&c->passthrough_opens));
	fprintf(f, "cache_passthrough_remembered %" PRIu64 "\n",
		cs.passthrough_remembered);
	fprintf(f, "fs_uring_requests %llu\n", atomic_load(&c->uring_requests));
	objstore_get_tier_stats(&ts);
	fprintf(f, "tier_reads %" PRIu64 "\ntier_bytes %" PRIu64 "\n", ts.reads,
		ts.bytes);
	for (int i = 0; i < OBJSTORE_TIER_CAUSES; i++)
		fprintf(f, "tier_fallbacks_%s %" PRIu64 "\n",
			objstore_tier_cause_name(i), ts.fallbacks[i]);
	if (fclose(f)) {
		free(buf);
		return NULL;
	}
	h = dsfs_ctl_fh_text(buf, len);
	free(buf);
	return h;
}

/* The summary of uid's own last list: another uid's could name the size
 * of a dataset uid may not read. */
static struct dsfs_ctl_fh *dsfs_ctl_status_text(struct dsfs_ctl *c, uid_t uid)
{
	static const char none[] = "no list yet\n";
	struct dsfs_ctl_fh *h;
	const char *text;

	pthread_mutex_lock(&c->lock);
	text = dsfs_ctl_status_find(c, uid);
	if (!text)
		text = none;
	h = dsfs_ctl_fh_text(text, strlen(text));
	pthread_mutex_unlock(&c->lock);
	return h;
}

static int dsfs_ctl_open(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, struct fuse_file_info *fi)
{
	int acc = fi->flags & O_ACCMODE, ret;
	struct dsfs_ctl_fh *h;

	if (n->ino == DSFS_INO_CTL)
		return -EISDIR;
	if (n->ino == DSFS_INO_STATS && acc != O_RDONLY)
		return -EROFS;
	if (n->ino == DSFS_INO_PREFETCH && acc == O_RDWR)
		return -EINVAL; /* write-only list; read it separately */
	ret = dsfs_ctl_hold(fs, who->uid);
	if (ret)
		return ret;
	if (n->ino == DSFS_INO_STATS)
		h = dsfs_ctl_stats_text(fs);
	else if (acc == O_RDONLY)
		h = dsfs_ctl_status_text(dsfs_ctl_of(fs), who->uid);
	else
		h = dsfs_ctl_fh_pf(who);
	if (!h) {
		dsfs_ctl_unhold(fs, who->uid);
		return -ENOMEM;
	}
	h->uid = who->uid;
	fi->fh = (uintptr_t)h;
	fi->direct_io = 1; /* content made per open; size is 0 */
	if (h->pf)
		fi->nonseekable = 1;
	return 0;
}

static int dsfs_ctl_read(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, struct fuse_file_info *fi,
			 size_t size, off_t off, struct dsfs_reply_read *r)
{
	struct dsfs_ctl_fh *h = (struct dsfs_ctl_fh *)(uintptr_t)fi->fh;

	(void)fs;
	(void)who;
	(void)n;
	if (h->pf)
		return -EBADF;
	if (off < 0 || (size_t)off >= h->len)
		return 0;
	if (size > h->len - (size_t)off)
		size = h->len - (size_t)off;
	return dsfs_reply_read_buf(r, h->text + off, size);
}

static void dsfs_ctl_release(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct dsfs_ctl_fh *h = (struct dsfs_ctl_fh *)(uintptr_t)fi->fh;
	struct dsfs_ctl_pf *pf = h->pf;

	(void)who;
	(void)n;
	dsfs_ctl_pf_free(fs, pf);
	dsfs_ctl_unhold(fs, h->uid);
	free(h);
}

const struct dsfs_subtree dsfs_ctl_subtree = {
	.name = ".dstage",
	.init = dsfs_ctl_init,
	.destroy = dsfs_ctl_destroy,
	.lookup = dsfs_ctl_lookup,
	.getattr = dsfs_ctl_getattr,
	.setattr = dsfs_ctl_setattr,
	.access = dsfs_ctl_access,
	.readdir = dsfs_ctl_readdir,
	.open = dsfs_ctl_open,
	.read = dsfs_ctl_read,
	.write = dsfs_ctl_write,
	.flush = dsfs_ctl_flush,
	.release = dsfs_ctl_release,
};
