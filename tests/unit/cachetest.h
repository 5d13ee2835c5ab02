/* SPDX-License-Identifier: MIT */
/*
 * cachetest.h: what the unit tests over a cache on a file:// store share
 * (test_cache.c, test_cache_direct.c, test_pinned.c): the configuration
 * they run under, source objects of random bytes, a checked read, and ways
 * to find the file the cache keeps for an object. Include after check.h.
 */
#ifndef DSTAGE_TEST_CACHETEST_H
#define DSTAGE_TEST_CACHETEST_H

#include <fcntl.h>
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <stdbool.h>
#include <stdlib.h>

#include "dstage/cache.h"
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
 * The sidecar of the first object cached under dataset ds, as the cache
 * lays it out: objects/h2/h30 holds the bytes, its sidecar
 * objects/h2/h30.meta the header (dataset name at byte 64) and records.
 * Its path into meta (len bytes); false if none.
 */
static inline bool cachetest_meta_path(const char *cachedir, const char *ds,
				       char *meta, size_t len)
{
	char pat[400];
	bool found = false;
	glob_t g;

	snprintf(pat, sizeof(pat), "%s/objects/*/*.meta", cachedir);
	if (glob(pat, 0, NULL, &g))
		return false;
	for (size_t i = 0; i < g.gl_pathc && !found; i++) {
		char name[32] = "";
		int f = open(g.gl_pathv[i], O_RDONLY);

		if (f >= 0 && strlen(ds) < sizeof(name) &&
		    strlen(g.gl_pathv[i]) < len &&
		    pread(f, name, strlen(ds), 64) > 0 &&
		    !memcmp(name, ds, strlen(ds))) {
			snprintf(meta, len, "%s", g.gl_pathv[i]);
			found = true;
		}
		if (f >= 0)
			close(f);
	}
	globfree(&g);
	return found;
}

/*
 * An O_RDWR descriptor on the data file of the first object cached under
 * dataset ds (*data_off: where its bytes start in it, 0 since version 3);
 * -1 if none.
 */
static inline int cachetest_obj_file(const char *cachedir, const char *ds,
				     uint64_t *data_off)
{
	char meta[400];
	size_t n;

	if (!cachetest_meta_path(cachedir, ds, meta, sizeof(meta)))
		return -1;
	n = strlen(meta) - strlen(".meta");
	meta[n] = '\0';
	*data_off = 0;
	return open(meta, O_RDWR);
}

/* Open (read-only) the data file of the one object of the cache at dir;
 * -1, a failed check, when the cache holds none or several. */
static inline int cachetest_sole_obj_file(const char *dir)
{
	char pat[400], data[400];
	glob_t g;
	int fd = -1;

	snprintf(pat, sizeof(pat), "%s/objects/*/*.meta", dir);
	CHECK_INT(glob(pat, 0, NULL, &g), 0);
	CHECK_INT(g.gl_pathc, 1);
	if (g.gl_pathc == 1 && strlen(g.gl_pathv[0]) - 5 < sizeof(data)) {
		snprintf(data, sizeof(data), "%.*s",
			 (int)(strlen(g.gl_pathv[0]) - 5), g.gl_pathv[0]);
		fd = open(data, O_RDONLY);
	}
	CHECK(fd >= 0);
	globfree(&g);
	return fd;
}

/*
 * Read key (size bytes) whole into got through a fresh cache opened on cfg
 * (no policy source) over a file:// store at srcdir, as dataset "d";
 * *fetches: the blocks it fetched. 0 or -1.
 */
static inline int cachetest_read_fresh(struct dstage_config *cfg,
				       const char *srcdir, const char *key,
				       uint64_t size, char *got,
				       uint64_t *fetches)
{
	struct objstore *os = NULL;
	struct cache *c = NULL;
	struct objstore_info oi;
	struct cache_object o;
	struct cache_stats st;
	char url[400];
	int ret = -1;

	snprintf(url, sizeof(url), "file://%s/", srcdir);
	if (objstore_open(url, cfg, &os))
		return -1;
	if (cache_open(cfg, NULL, &c))
		goto out;
	if (objstore_head(os, key, &oi))
		goto out;
	o = (struct cache_object){ .dataset = "d",
				   .os = os,
				   .key = key,
				   .etag = oi.etag,
				   .size = size };
	if (cache_read(c, &o, 0, size, got) == (ssize_t)size)
		ret = 0;
	cache_get_stats(c, &st);
	*fetches = st.fetches;
out:
	cache_close(c);
	objstore_free(os);
	return ret;
}

/* xorshift64 over *state: the tests' reproducible random bytes. */
static inline uint64_t cachetest_rnd(uint64_t *state)
{
	*state ^= *state << 13;
	*state ^= *state >> 7;
	*state ^= *state << 17;
	return *state;
}

/*
 * Write a source object of size random bytes (from *rnd) under key in os
 * and describe it in obj (dataset "ds" unless set; etag: a buffer of
 * OBJSTORE_ETAG_MAX bytes that obj points to); returns its bytes
 * (malloc'ed).
 */
static inline char *cachetest_put_src(struct objstore *os, uint64_t *rnd,
				      const char *key, size_t size,
				      struct cache_object *obj, char *etag)
{
	char *data = malloc(size ? size : 1);
	struct objstore_info oi;

	for (size_t i = 0; i < size; i++)
		data[i] = (char)cachetest_rnd(rnd);
	CHECK_INT(objstore_put_buf(os, key, data, size), 0);
	CHECK_INT(objstore_head(os, key, &oi), 0);
	snprintf(etag, OBJSTORE_ETAG_MAX, "%s", oi.etag);
	obj->os = os;
	obj->key = key;
	obj->etag = etag;
	obj->size = size;
	if (!obj->dataset)
		obj->dataset = "ds";
	return data;
}

/* cache_read of [off, off + len) gives want's bytes (short at the end). */
static inline bool cachetest_read_eq(struct cache *c,
				     const struct cache_object *obj,
				     const char *want, uint64_t off, size_t len)
{
	char *buf = malloc(len + 1);
	size_t exp = off >= obj->size
			     ? 0
			     : (len > obj->size - off ? obj->size - off : len);
	ssize_t r = cache_read(c, obj, off, len, buf);
	bool ok = r == (ssize_t)exp && !memcmp(buf, want + off, exp);

	if (!ok)
		fprintf(stderr, "read %llu+%zu: got %zd, expected %zu\n",
			(unsigned long long)off, len, r, exp);
	free(buf);
	return ok;
}

/* Whether fills will write with O_DIRECT in dir: not with
 * DSTAGE_NO_DIRECT=1, nor on a filesystem that refuses it (the cache then
 * writes buffered). */
static inline bool cachetest_direct_writes(const char *dir)
{
	char p[320];
	void *b = NULL;
	bool ok = false;
	int fd;

	if (getenv("DSTAGE_NO_DIRECT"))
		return false;
	snprintf(p, sizeof(p), "%s/dio-probe", dir);
	fd = open(p, O_CREAT | O_RDWR | O_DIRECT, 0600);
	if (fd >= 0 && posix_memalign(&b, 4096, 4096) == 0) {
		memset(b, 0, 4096);
		ok = pwrite(fd, b, 4096, 0) == 4096;
	}
	free(b);
	if (fd >= 0)
		close(fd);
	unlink(p);
	return ok;
}

#endif
