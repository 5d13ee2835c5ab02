/* SPDX-License-Identifier: MIT */
/*
 * cachetest.h: what the unit tests over a cache on a file:// store share
 * (test_cache.c, test_pinned.c): the configuration they run under and a
 * way to find the file the cache keeps for an object. Include after
 * check.h.
 */
#ifndef DSTAGE_TEST_CACHETEST_H
#define DSTAGE_TEST_CACHETEST_H

#include <fcntl.h>
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dstage/config.h"
#include "dstage/objstore.h"

/* The configuration fields cachetest_setup replaces, for cachetest_free. */
struct cachetest_saved {
	char *cache_dir;
	char *catalog_path;
};

/*
 * Defaults, with the cache in cachedir (blocks of bs bytes, 1 GiB), no
 * catalog, and *os a file:// store over srcdir.
 */
static inline void cachetest_setup(struct dstage_config **cfg,
				   struct objstore **os, char *cachedir,
				   const char *srcdir, uint32_t bs,
				   struct cachetest_saved *sv)
{
	char url[400];

	CHECK_INT(config_defaults(cfg), 0);
	sv->cache_dir = (*cfg)->cache_dir;
	sv->catalog_path = (*cfg)->catalog_path;
	(*cfg)->cache_dir = cachedir;
	(*cfg)->cache_block_size = bs;
	(*cfg)->cache_size = 1ULL << 30;
	(*cfg)->catalog_path = NULL;
	snprintf(url, sizeof(url), "file://%s/", srcdir);
	CHECK_INT(objstore_open(url, *cfg, os), 0);
}

/* Put back what cachetest_setup replaced and free cfg. */
static inline void cachetest_free(struct dstage_config *cfg,
				  const struct cachetest_saved *sv)
{
	cfg->cache_dir = sv->cache_dir;
	cfg->catalog_path = sv->catalog_path;
	config_free(cfg);
}

/*
 * An O_RDWR descriptor on the cache file of the first object cached under
 * dataset ds (its data offset in *data_off), as the cache lays it out:
 * the dataset name at byte 64, the data offset at byte 24; -1 if none.
 */
static inline int cachetest_obj_file(const char *cachedir, const char *ds,
				     uint64_t *data_off)
{
	char pat[400];
	glob_t g;
	int fd = -1;

	snprintf(pat, sizeof(pat), "%s/objects/*/*", cachedir);
	if (glob(pat, 0, NULL, &g))
		return -1;
	for (size_t i = 0; i < g.gl_pathc && fd < 0; i++) {
		char name[32] = "";
		int f = open(g.gl_pathv[i], O_RDWR);

		if (f >= 0 && strlen(ds) < sizeof(name) &&
		    pread(f, name, strlen(ds), 64) > 0 &&
		    !memcmp(name, ds, strlen(ds)) &&
		    pread(f, data_off, 8, 24) == 8)
			fd = f;
		else if (f >= 0)
			close(f);
	}
	globfree(&g);
	return fd;
}

#endif
