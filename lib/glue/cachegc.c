// SPDX-License-Identifier: MIT
/*
 * cachegc: garbage collection of the cache (see cachegc.h). The cache
 * enumerates its files and removes one under its own lock protocol
 * (cache_gc_list, cache_gc_remove); this file decides, from the catalog,
 * which ones nobody owns. It sits above both (scripts/check-layers), so the
 * cache never reaches SQLite.
 *
 * Stateless: one run walks objects/ once (a catalog lookup per object
 * file), then the blocks table once, then the two leftover directories of
 * checkpoints.staging_dir. Races: a file is removed only after the lookup
 * that found no owner; a reader that opens it meanwhile holds its in-use
 * lock, which makes cache_gc_remove refuse (busy), and one that opens it
 * after the unlink finds it gone and fetches again, as after an eviction.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dstage/cache.h"
#include "dstage/cachegc.h"
#include "dstage/catalog.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "util/fdutil.h"

struct cachegc_walk {
	struct cache *c;
	struct catalog *cat;
	const struct cachegc_opts *o;
	struct cachegc_result *r;
	int64_t now;
	int64_t *stale; /* object ids whose rows go */
	size_t nstale, stale_cap;
};

/* Remove (or, dry, count) one cache file found to be garbage. */
static void cachegc_drop(struct cachegc_walk *w, const struct cache_gc_file *f,
			 uint64_t *files, uint64_t *bytes)
{
	uint64_t freed = 0;
	int ret;

	if (w->o->dry_run) {
		(*files)++;
		*bytes += f->bytes;
		return;
	}
	ret = cache_gc_remove(w->c, f->name, &freed);
	if (!ret) {
		(*files)++;
		*bytes += freed;
	} else if (ret == -EBUSY) {
		w->r->busy_files++;
		w->r->busy_bytes += f->bytes;
	} else if (ret != -ENOENT) {
		log_warn("gc: cannot remove the cache file objects/%s: %s",
			 f->name, strerror(-ret));
	}
}

/* Whether the current manifest of f's dataset has f's object version.
 * 1 owned, 0 not, or -errno of the catalog. */
static int cachegc_owned(struct cachegc_walk *w, const struct cache_gc_file *f)
{
	struct catalog_entry e;
	int ret = catalog_lookup(w->cat, f->dataset, f->key, &e);

	if (ret == -ENOENT || ret == -ENOTDIR || ret == -EINVAL)
		return 0;
	if (ret)
		return ret;
	return !e.is_dir && e.size == f->size && !strcmp(e.etag, f->etag);
}

static int cachegc_file(void *arg, const struct cache_gc_file *f)
{
	struct cachegc_walk *w = arg;
	int ret;

	if (!f->object) {
		if (w->now - f->mtime >= w->o->min_age)
			cachegc_drop(w, f, &w->r->leftover_files,
				     &w->r->leftover_bytes);
		return 0;
	}
	ret = cachegc_owned(w, f);
	if (ret < 0) {
		log_error("gc: looking up %s/%s in the catalog: %s; stopped, "
			  "nothing more removed",
			  f->dataset, f->key, strerror(-ret));
		return ret;
	}
	if (!ret)
		cachegc_drop(w, f, &w->r->orphan_files, &w->r->orphan_bytes);
	return 0;
}

/* A blocks row's object: stale when the cache has no file for it. */
static int cachegc_blocks_obj(void *arg, const struct catalog_blocks_obj *b)
{
	struct cachegc_walk *w = arg;
	struct cache_object obj = {
		.dataset = b->dataset,
		.key = b->path,
		.etag = b->etag,
		.size = b->size,
	};
	uint64_t atime;
	int ret = cache_object_atime(w->c, &obj, &atime);

	if (ret != -ENOENT)
		return 0; /* there (or cannot tell): the rows stay */
	w->r->stale_objects++;
	w->r->stale_rows += b->rows;
	if (w->o->dry_run)
		return 0;
	if (GROW_ONE(w->stale, w->nstale, w->stale_cap, 64))
		return -ENOMEM;
	w->stale[w->nstale++] = b->object_id;
	return 0;
}

/* Leftovers in staging_dir/sub: regular files older than min_age; in
 * journal/, only the temporary records (".N.tmp"). */
static void cachegc_staging(struct cachegc_walk *w, int sfd, const char *sub,
			    bool tmp_only)
{
	struct dirent *de;
	DIR *d;
	int dfd = openat(sfd, sub,
			 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (dfd < 0) {
		if (errno != ENOENT)
			log_warn("gc: %s/%s: %s", w->o->staging_dir, sub,
				 strerror(errno));
		return;
	}
	if (fdutil_fdopendir(dfd, &d))
		return;
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);
		struct stat st;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (tmp_only && (de->d_name[0] != '.' || len < 5 ||
				 strcmp(de->d_name + len - 4, ".tmp")))
			continue;
		if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISREG(st.st_mode) ||
		    w->now - (int64_t)st.st_mtime < w->o->min_age)
			continue;
		if (!w->o->dry_run && unlinkat(dfd, de->d_name, 0)) {
			if (errno != ENOENT)
				log_warn("gc: cannot remove %s/%s/%s: %s",
					 w->o->staging_dir, sub, de->d_name,
					 strerror(errno));
			continue;
		}
		if (!w->o->dry_run)
			log_info("gc: removed %s/%s/%s", w->o->staging_dir, sub,
				 de->d_name);
		w->r->leftover_files++;
		w->r->leftover_bytes += (uint64_t)st.st_blocks * 512;
	}
	closedir(d);
}

/* Each store's subdirectory of staging_dir: stores/<hash>/ (issue 34). */
static void cachegc_stores(struct cachegc_walk *w, int sfd)
{
	struct dirent *de;
	unsigned n = 0;
	DIR *d;
	int dfd = openat(sfd, "stores",
			 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (dfd < 0)
		return;
	if (fdutil_fdopendir(dfd, &d))
		return;
	while ((de = readdir(d)) && n++ < 65536) {
		char sub[300];

		if (de->d_name[0] == '.' || strlen(de->d_name) > 64)
			continue;
		snprintf(sub, sizeof(sub), "stores/%s/journal", de->d_name);
		cachegc_staging(w, sfd, sub, true);
		snprintf(sub, sizeof(sub), "stores/%s/abandoned", de->d_name);
		cachegc_staging(w, sfd, sub, false);
	}
	closedir(d);
}

int cachegc_run(struct cache *c, struct catalog *cat,
		const struct cachegc_opts *o, struct cachegc_result *r)
{
	struct cachegc_walk w = {
		.c = c,
		.cat = cat,
		.o = o,
		.r = r,
		.now = (int64_t)time(NULL),
	};
	int ret;

	memset(r, 0, sizeof(*r));
	if (!c || !cat || !o || o->min_age < 0)
		return -EINVAL;
	ret = cache_gc_list(c, cachegc_file, &w);
	if (!ret)
		ret = catalog_blocks_list(cat, cachegc_blocks_obj, &w);
	for (size_t i = 0; !ret && i < w.nstale; i++)
		ret = catalog_blocks_forget(cat, w.stale[i], NULL);
	free(w.stale);
	if (ret)
		return ret;
	if (o->staging_dir && *o->staging_dir) {
		int sfd = open(o->staging_dir,
			       O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (sfd >= 0) {
			/* the layout before issue 34, then each store's */
			cachegc_staging(&w, sfd, "journal", true);
			cachegc_staging(&w, sfd, "abandoned", false);
			cachegc_stores(&w, sfd);
			close(sfd);
		} else if (errno != ENOENT) {
			log_warn("gc: checkpoints.staging_dir %s: %s",
				 o->staging_dir, strerror(errno));
		}
	}
	return 0;
}
