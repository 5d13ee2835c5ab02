// SPDX-License-Identifier: MIT
/*
 * test_cache_header: what an object file's header and the cache's identity
 * file protect, neither of which any test reached (found by scripts/test
 * --coverage, issue 21):
 *
 *   another object's file under this object's name (a name collision, or
 *   a file moved by hand): its header names another key, so it is removed
 *   and the object fetched again; its blocks (valid for the other object,
 *   checksums included) are never handed over as this one's.
 *
 *   an identity file that names another block size, or is not one: the
 *   cache refuses to open (its files would be read with the wrong block
 *   size); with the right one it opens.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "cachetest.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define BS 4096u
#define SIZE (8 * BS)

static char tmp[256], srcdir[300], cachedir[300];
static struct dstage_config *cfg;

static void pattern(char *buf, unsigned seed)
{
	for (size_t k = 0; k < SIZE; k++)
		buf[k] = (char)(k * (2 * seed + 1) + seed);
}

static int write_file(const char *path, const char *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	int ok = f && fwrite(data, 1, len, f) == len;

	if (f && fclose(f))
		ok = 0;
	return ok ? 0 : -1;
}

/* Read key whole through a fresh cache; *fetches: what it fetched. */
static int read_key(const char *key, char *got, uint64_t *fetches)
{
	return cachetest_read_fresh(cfg, srcdir, key, SIZE, got, fetches);
}

/* The object files now in the cache; 0 when there are n, names in g. */
static int object_files(glob_t *g, size_t n)
{
	char pat[400];

	snprintf(pat, sizeof(pat), "%s/objects/*/*.meta", cachedir);
	if (glob(pat, 0, NULL, g))
		return -1;
	return g->gl_pathc == n ? 0 : -1;
}

static int identity_then_open(const char *text)
{
	char path[400];
	struct cache *c = NULL;
	int ret;

	snprintf(path, sizeof(path), "%s/dstage-cache", cachedir);
	if (unlink(path) || write_file(path, text, strlen(text)) ||
	    chmod(path, 0600))
		return -1000;
	ret = cache_open(cfg, NULL, &c);
	cache_close(c);
	return ret;
}

int main(void)
{
	char path[400], a[SIZE], b[SIZE], got[SIZE], keep_a[400];
	char *orig_dir;
	uint64_t fetches = 0;
	glob_t g1 = { 0 }, g2 = { 0 };

	log_set_level(LOG_LVL_ERROR);
	snprintf(tmp, sizeof(tmp), "/var/tmp/test_cache_header.XXXXXX");
	if (!mkdtemp(tmp))
		return 1;
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	mkdir(srcdir, 0755);
	pattern(a, 1);
	pattern(b, 2);
	snprintf(path, sizeof(path), "%s/ka", srcdir);
	CHECK_INT(write_file(path, a, SIZE), 0);
	snprintf(path, sizeof(path), "%s/kb", srcdir);
	CHECK_INT(write_file(path, b, SIZE), 0);
	CHECK_INT(config_defaults(&cfg), 0);
	if (!cfg)
		return 1;
	orig_dir = cfg->cache_dir;
	cfg->cache_dir = cachedir;
	cfg->cache_block_size = BS;
	cfg->cache_size = 1ULL << 30;

	/* Cache ka, then kb: one file each. */
	CHECK_INT(read_key("ka", got, &fetches), 0);
	CHECK(!memcmp(got, a, SIZE));
	CHECK_INT(object_files(&g1, 1), 0);
	if (g1.gl_pathc == 1)
		snprintf(keep_a, sizeof(keep_a), "%s", g1.gl_pathv[0]);
	CHECK_INT(read_key("kb", got, &fetches), 0);
	CHECK(!memcmp(got, b, SIZE));
	CHECK_INT(fetches, SIZE / BS); /* fetches counts blocks */
	CHECK_INT(object_files(&g2, 2), 0);
	if (g1.gl_pathc == 1 && g2.gl_pathc == 2) {
		const char *bpath = strcmp(g2.gl_pathv[0], keep_a)
					    ? g2.gl_pathv[0]
					    : g2.gl_pathv[1];
		char cmd[1024];

		/* ka's files (sidecar: header, records; data file: the
		 * blocks) under kb's names */
		snprintf(cmd, sizeof(cmd),
			 "cp -p '%s' '%s' && cp -p '%.*s' '%.*s'", keep_a,
			 bpath, (int)strlen(keep_a) - 5, keep_a,
			 (int)strlen(bpath) - 5, bpath);
		CHECK_INT(system(cmd), 0);
		memset(got, 0, SIZE);
		CHECK_INT(read_key("kb", got, &fetches), 0);
		CHECK(!memcmp(got, b, SIZE)); /* never ka's bytes */
		CHECK_INT(fetches, SIZE / BS); /* the file was not trusted */
		/* and what is cached now is kb's */
		CHECK_INT(read_key("kb", got, &fetches), 0);
		CHECK(!memcmp(got, b, SIZE));
		CHECK_INT(fetches, 0);
	}
	globfree(&g1);
	globfree(&g2);

	/* The identity file: another block size, or not one at all. */
	CHECK(identity_then_open("dstage-cache 1\nblock_size 8192\n") < 0);
	CHECK(identity_then_open("not a dstage cache\n") < 0);
	CHECK_INT(identity_then_open("dstage-cache 1\nblock_size 4096\n"), 0);

	cfg->cache_dir = orig_dir;
	config_free(cfg);
	snprintf(path, sizeof(path), "rm -rf '%s'", tmp);
	if (system(path))
		return 1;
	return check_result();
}
