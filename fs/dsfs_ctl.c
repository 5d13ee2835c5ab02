// SPDX-License-Identifier: MIT
/*
 * dsfs_ctl: the control subtree, <mount>/.dstage/.
 *
 *   prefetch  writable by everyone: a job writes the paths it will read
 *             next, one per line, in order; on close dstagefs hands them to
 *             cache_prefetch, per dataset, keeping at most
 *             opts.prefetch_window bytes in flight. Reading it gives the
 *             summary of the last list.
 *   stats     read-only: cache and file-system counters, "key value" lines.
 *
 * Life of one prefetch handle (struct dsfs_pf), owned by one open file:
 *
 *   OPEN --write--> COLLECTING (complete lines resolved against the
 *   catalog at once; the partial last line kept) --flush (close)-->
 *   SUBMITTED (the trailing line resolved, lists handed to the cache, the
 *   handle emptied: more writes start a new list) --release--> freed
 *
 * Paths are accepted as "datasets/NAME/KEY", "/datasets/NAME/KEY",
 * "<mountpoint>/datasets/NAME/KEY" or "NAME/KEY". Unknown datasets,
 * missing keys, directories and datasets the writer may not read are
 * skipped and counted. A handle's fields are used by one request at a time
 * (the kernel serialises writes to one file through its inode lock), and
 * pf.lock makes that explicit.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsfs.h"
#include "dstage/cache.h"
#include "dstage/log.h"

#define DSFS_PF_MAX_OBJECTS (1u << 22) /* entries per list */
#define DSFS_PF_LINE_MAX 8192

struct dsfs_pf_obj {
	struct dsfs_dataset *ds; /* a reference */
	char *key;
	char *etag;
	uint64_t size;
};

struct dsfs_pf {
	pthread_mutex_t lock; /* protects everything below */
	struct dsfs_caller who; /* the opener, groups loaded */
	struct dsfs_pf_obj *objs;
	size_t n, cap;
	uint64_t lines, skipped, bytes;
	size_t partial_len;
	bool partial_too_long;
	char partial[DSFS_PF_LINE_MAX];
};

/* The text a read of stats or prefetch returns, made at open. */
struct dsfs_ctl_text {
	size_t len;
	char text[];
};

static void dsfs_ctl_stat(struct dsfs *fs, const struct dsfs_node *n,
			  struct stat *st)
{
	dsfs_stat_fill(fs, st, n->ino, n->kind == DSFS_STATIC_DIR, 0, n->mtime,
		       NULL);
	if (n->ino == DSFS_INO_PREFETCH)
		st->st_mode = S_IFREG | 0666;
}

static double dsfs_ctl_timeout(struct dsfs *fs, const struct dsfs_node *n)
{
	/* Sizes are 0 and content is made at open (direct_io). */
	(void)n;
	return fs->opts->entry_timeout;
}

static int dsfs_ctl_lookup(struct dsfs *fs, struct dsfs_node *dir,
			   const char *name, struct dsfs_caller *who,
			   struct dsfs_node **out)
{
	(void)dir;
	(void)who;
	if (strcmp(name, "prefetch") == 0)
		*out = &fs->prefetch;
	else if (strcmp(name, "stats") == 0)
		*out = &fs->stats;
	else
		return -ENOENT;
	return 0;
}

static int dsfs_ctl_readdir(struct dsfs *fs, struct dsfs_node *n,
			    struct fuse_file_info *fi, off_t off,
			    struct dsfs_dirbuf *db)
{
	struct dsfs_node *ents[] = { n, &fs->root, &fs->prefetch, &fs->stats };
	const char *names[] = { ".", "..", "prefetch", "stats" };

	(void)fi;
	for (off_t i = off; i < 4; i++) {
		if (dsfs_dirbuf_add(db, names[i], i < 2 ? NULL : ents[i],
				    ents[i]->ino, i < 2 ? S_IFDIR : S_IFREG,
				    i + 1))
			break;
	}
	return 0;
}

static int dsfs_ctl_access(struct dsfs *fs, struct dsfs_node *n,
			   struct dsfs_caller *who, int mask)
{
	(void)fs;
	(void)who;
	if ((mask & W_OK) && n->ino != DSFS_INO_PREFETCH)
		return -EROFS;
	return 0;
}

static struct dsfs_ctl_text *dsfs_ctl_stats_text(struct dsfs *fs)
{
	struct dsfs_counters *c = &fs->ctr;
	struct cache_stats cs;
	struct dsfs_ctl_text *t;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return NULL;
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
	if (fclose(f)) {
		free(buf);
		return NULL;
	}
	t = malloc(sizeof(*t) + len + 1);
	if (t) {
		t->len = len;
		memcpy(t->text, buf, len + 1);
	}
	free(buf);
	return t;
}

static struct dsfs_ctl_text *dsfs_ctl_status_text(struct dsfs *fs)
{
	struct dsfs_ctl_text *t;
	size_t len;

	pthread_mutex_lock(&fs->ctl_lock);
	len = strlen(fs->ctl_status);
	t = malloc(sizeof(*t) + len + 1);
	if (t) {
		t->len = len;
		memcpy(t->text, fs->ctl_status, len + 1);
	}
	pthread_mutex_unlock(&fs->ctl_lock);
	return t;
}

static int dsfs_ctl_open(struct dsfs *fs, struct dsfs_node *n,
			 struct dsfs_caller *who, struct fuse_file_info *fi)
{
	int acc = fi->flags & O_ACCMODE;

	fi->direct_io = 1; /* content made per open; size is 0 */
	if (n->ino == DSFS_INO_STATS) {
		struct dsfs_ctl_text *t;

		if (acc != O_RDONLY)
			return -EROFS;
		t = dsfs_ctl_stats_text(fs);
		if (!t)
			return -ENOMEM;
		fi->fh = (uintptr_t)t;
		return 0;
	}
	if (acc == O_RDONLY) {
		struct dsfs_ctl_text *t = dsfs_ctl_status_text(fs);

		if (!t)
			return -ENOMEM;
		fi->fh = (uintptr_t)t;
		return 0;
	}
	if (acc == O_RDWR)
		return -EINVAL; /* write-only list; read it separately */
	struct dsfs_pf *pf = calloc(1, sizeof(*pf));

	if (!pf)
		return -ENOMEM;
	pthread_mutex_init(&pf->lock, NULL);
	pf->who = *who;
	dsfs_caller_load_groups(&pf->who);
	pf->who.req = NULL;
	fi->fh = (uintptr_t)pf;
	fi->nonseekable = 1;
	return 0;
}

static void dsfs_ctl_read(fuse_req_t req, struct dsfs *fs, struct dsfs_node *n,
			  struct fuse_file_info *fi, size_t size, off_t off)
{
	struct dsfs_ctl_text *t = (struct dsfs_ctl_text *)(uintptr_t)fi->fh;

	(void)fs;
	(void)n;
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EBADF);
		return;
	}
	if (off < 0 || (size_t)off >= t->len) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size > t->len - (size_t)off)
		size = t->len - (size_t)off;
	fuse_reply_buf(req, t->text + off, size);
}

/* Resolve one line of a prefetch list into pf. */
static void dsfs_pf_line(struct dsfs *fs, struct dsfs_pf *pf, char *line)
{
	const char *mnt = fs->opts->mountpoint;
	size_t mlen = strlen(mnt), len = strlen(line);
	struct catalog_entry e;
	struct dsfs_dataset *ds;
	struct catalog *cat;
	char *p = line, *key;
	int ret;

	while (len && (line[len - 1] == '\r' || line[len - 1] == ' '))
		line[--len] = '\0';
	if (!len || line[0] == '#')
		return;
	pf->lines++;
	if (mlen > 1 && strncmp(p, mnt, mlen) == 0 && p[mlen] == '/')
		p += mlen;
	while (*p == '/')
		p++;
	if (strncmp(p, "datasets/", 9) == 0)
		p += 9;
	key = strchr(p, '/');
	if (!key || pf->n >= DSFS_PF_MAX_OBJECTS) {
		pf->skipped++;
		return;
	}
	*key++ = '\0';
	ds = dsfs_datasets_current(fs, p);
	if (!ds) {
		pf->skipped++;
		return;
	}
	cat = dsfs_catalog(fs, &ret);
	if (!dsfs_dataset_allowed(ds, &pf->who) || !cat ||
	    catalog_lookup(cat, ds->name, key, &e) || e.is_dir)
		goto skip;
	if (pf->n == pf->cap) {
		size_t cap = pf->cap ? pf->cap * 2 : 256;
		struct dsfs_pf_obj *o = realloc(pf->objs, cap * sizeof(*o));

		if (!o)
			goto skip;
		pf->objs = o;
		pf->cap = cap;
	}
	pf->objs[pf->n].key = strdup(key);
	pf->objs[pf->n].etag = strdup(e.etag);
	if (!pf->objs[pf->n].key || !pf->objs[pf->n].etag) {
		free(pf->objs[pf->n].key);
		free(pf->objs[pf->n].etag);
		goto skip;
	}
	pf->objs[pf->n].ds = ds;
	pf->objs[pf->n].size = e.size;
	pf->bytes += e.size;
	pf->n++;
	return;
skip:
	pf->skipped++;
	dsfs_dataset_put(ds);
}

static ssize_t dsfs_ctl_write(struct dsfs *fs, struct dsfs_node *n,
			      struct fuse_file_info *fi, const char *buf,
			      size_t size, off_t off)
{
	struct dsfs_pf *pf = (struct dsfs_pf *)(uintptr_t)fi->fh;

	(void)off;
	if (n->ino != DSFS_INO_PREFETCH)
		return -EROFS;
	pthread_mutex_lock(&pf->lock);
	for (size_t i = 0; i < size; i++) {
		if (buf[i] != '\n') {
			if (pf->partial_len + 1 < sizeof(pf->partial))
				pf->partial[pf->partial_len++] = buf[i];
			else
				pf->partial_too_long = true;
			continue;
		}
		pf->partial[pf->partial_len] = '\0';
		if (pf->partial_too_long) {
			pf->lines++;
			pf->skipped++;
		} else {
			dsfs_pf_line(fs, pf, pf->partial);
		}
		pf->partial_len = 0;
		pf->partial_too_long = false;
	}
	pthread_mutex_unlock(&pf->lock);
	return (ssize_t)size;
}

/* Hand the list to the cache, one call per dataset, in list order. */
static void dsfs_pf_submit(struct dsfs *fs, struct dsfs_pf *pf)
{
	struct cache_object *objs = NULL;
	size_t nds = 0;
	int err = 0;

	if (pf->partial_len) {
		pf->partial[pf->partial_len] = '\0';
		dsfs_pf_line(fs, pf, pf->partial);
	}
	if (pf->n)
		objs = calloc(pf->n, sizeof(*objs));
	for (size_t i = 0; objs && i < pf->n; i++) {
		struct dsfs_dataset *ds = pf->objs[i].ds;
		size_t m = 0;
		bool seen = false;

		for (size_t j = 0; j < i && !seen; j++)
			seen = pf->objs[j].ds->name == ds->name ||
			       strcmp(pf->objs[j].ds->name, ds->name) == 0;
		if (seen)
			continue;
		for (size_t j = i; j < pf->n; j++) {
			struct dsfs_pf_obj *o = &pf->objs[j];

			if (strcmp(o->ds->name, ds->name))
				continue;
			objs[m++] = (struct cache_object){ .dataset = ds->name,
							   .os = o->ds->os,
							   .key = o->key,
							   .etag = o->etag,
							   .size = o->size };
		}
		nds++;
		int r = cache_prefetch(fs->cache, objs, m,
				       fs->opts->prefetch_window);
		if (r && !err)
			err = r;
	}
	atomic_fetch_add(&fs->ctr.prefetch_lists, 1);
	atomic_fetch_add(&fs->ctr.prefetch_objects, pf->n);
	pthread_mutex_lock(&fs->ctl_lock);
	snprintf(fs->ctl_status, sizeof(fs->ctl_status),
		 "lines %" PRIu64 "\nobjects %zu\nbytes %" PRIu64
		 "\nskipped %" PRIu64 "\ndatasets %zu\nwindow %" PRIu64
		 "\nresult %s\n",
		 pf->lines, pf->n, pf->bytes, pf->skipped, nds,
		 fs->opts->prefetch_window,
		 !objs && pf->n ? "out of memory"
		 : err		? strerror(-err)
				: "ok");
	pthread_mutex_unlock(&fs->ctl_lock);
	log_info("prefetch: %zu objects (%" PRIu64 " bytes) in %zu datasets, "
		 "%" PRIu64 " lines skipped, by uid %u",
		 pf->n, pf->bytes, nds, pf->skipped, (unsigned)pf->who.uid);
	free(objs);
}

/* Submit what was written since the last submission, then forget it.
 * pf->lock held. */
static void dsfs_pf_flush(struct dsfs *fs, struct dsfs_pf *pf)
{
	if (!pf->lines && !pf->partial_len)
		return;
	dsfs_pf_submit(fs, pf);
	for (size_t i = 0; i < pf->n; i++) {
		dsfs_dataset_put(pf->objs[i].ds);
		free(pf->objs[i].key);
		free(pf->objs[i].etag);
	}
	pf->n = 0;
	pf->lines = pf->skipped = pf->bytes = 0;
	pf->partial_len = 0;
	pf->partial_too_long = false;
}

/*
 * FLUSH normally comes with close(2), which waits for its answer; RELEASE
 * comes later, asynchronously. Submitting on flush means that, usually, when
 * the writer's close returns the list is with the cache and the status file
 * shows it. The kernel does not promise a FLUSH for every close (seen here
 * right after a daemonized mount): then RELEASE submits, a moment later.
 */
static int dsfs_ctl_flush(struct dsfs *fs, struct dsfs_node *n,
			  struct fuse_file_info *fi)
{
	struct dsfs_pf *pf;

	if (n->ino != DSFS_INO_PREFETCH || (fi->flags & O_ACCMODE) == O_RDONLY)
		return 0;
	pf = (struct dsfs_pf *)(uintptr_t)fi->fh;
	pthread_mutex_lock(&pf->lock);
	dsfs_pf_flush(fs, pf);
	pthread_mutex_unlock(&pf->lock);
	return 0;
}

static void dsfs_ctl_release(struct dsfs *fs, struct dsfs_node *n,
			     struct fuse_file_info *fi)
{
	struct dsfs_pf *pf;

	if (n->ino != DSFS_INO_PREFETCH ||
	    (fi->flags & O_ACCMODE) == O_RDONLY) {
		free((void *)(uintptr_t)fi->fh);
		return;
	}
	pf = (struct dsfs_pf *)(uintptr_t)fi->fh;
	pthread_mutex_lock(&pf->lock);
	dsfs_pf_flush(fs, pf); /* written without a flush (no close) */
	pthread_mutex_unlock(&pf->lock);
	free(pf->objs);
	pthread_mutex_destroy(&pf->lock);
	free(pf);
}

/* Truncation (shell "> file") and times are accepted and ignored. */
static int dsfs_ctl_setattr(struct dsfs *fs, struct dsfs_node *n,
			    const struct stat *attr, int to_set,
			    struct fuse_file_info *fi)
{
	(void)fs;
	(void)attr;
	(void)fi;
	if (n->ino != DSFS_INO_PREFETCH ||
	    (to_set &
	     (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)))
		return -EROFS;
	return 0;
}

const struct dsfs_subtree dsfs_ctl_subtree = {
	.name = ".dstage",
	.lookup = dsfs_ctl_lookup,
	.stat = dsfs_ctl_stat,
	.readdir = dsfs_ctl_readdir,
	.open = dsfs_ctl_open,
	.read = dsfs_ctl_read,
	.write = dsfs_ctl_write,
	.flush = dsfs_ctl_flush,
	.release = dsfs_ctl_release,
	.setattr = dsfs_ctl_setattr,
	.access = dsfs_ctl_access,
	.timeout = dsfs_ctl_timeout,
};
