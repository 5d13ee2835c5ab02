// SPDX-License-Identifier: MIT
/*
 * test_cache_records: a block record's check word binds it to its place
 * (lib/cache/cache_file.c, cache_rec_check), issue 34:
 *
 *   a block and its record copied to another block of the same file: the
 *   record is not valid there, so that block is fetched again, never served
 *   as the other block's bytes;
 *
 *   a block and its record copied into another object's file, at the same
 *   block number: likewise, never served as the other object's bytes;
 *
 *   a file in a previous format (version 1: one file, records bound to the
 *   block only) is migrated to a pair at open with its records as they
 *   are, nothing fetched again: an upgrade costs no download; a block of
 *   it copied to another block is still refused.
 *
 * Each case reads through a fresh cache (no block verified in memory) and
 * counts the blocks fetched.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "cacheold.h"
#include "cachetest.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define BS 4096u
#define NBLOCKS 8u
#define SIZE (NBLOCKS * BS)
#define REC 16u /* sizeof(struct cache_rec) */

static char tmp[256], srcdir[300], cachedir[300];
static struct dstage_config *cfg;
static uint64_t rnd_state = 0x9e3779b97f4a7c15ULL;

/* Where an object's files keep things (lib/cache/cache_i.h's layout):
 * records in the sidecar (path) from rec_off, block b at b * BS of the
 * data file. */
struct layout {
	uint64_t rec_off, strs_len;
	char data[400];
};

static int layout_of(const char *meta, struct layout *l)
{
	uint32_t lens[3];
	int fd = open(meta, O_RDONLY), ret = -1;

	if (fd >= 0 &&
	    pread(fd, lens, sizeof(lens), 32) == (ssize_t)sizeof(lens)) {
		l->strs_len = (uint64_t)lens[0] + lens[1] + lens[2];
		l->rec_off = (64 + l->strs_len + 4095) & ~(uint64_t)4095;
		cacheold_data_path(meta, l->data, sizeof(l->data));
		ret = 0;
	}
	if (fd >= 0)
		close(fd);
	return ret;
}

/* Copy block from's data and record of object src (its sidecar's path)
 * onto block to of dst. */
static int copy_block(const char *src, uint64_t from, const char *dst,
		      uint64_t to)
{
	char data[BS], rec[REC];
	struct layout ls, ld;
	int ms = -1, md = -1, ds = -1, dd = -1, ret = -1;

	if (layout_of(src, &ls) || layout_of(dst, &ld))
		return -1;
	ms = open(src, O_RDONLY);
	md = open(dst, O_RDWR);
	ds = open(ls.data, O_RDONLY);
	dd = open(ld.data, O_RDWR);
	if (ms < 0 || md < 0 || ds < 0 || dd < 0)
		goto out;
	if (pread(ds, data, BS, (off_t)(from * BS)) != BS ||
	    pread(ms, rec, REC, (off_t)(ls.rec_off + from * REC)) != REC)
		goto out;
	if (pwrite(dd, data, BS, (off_t)(to * BS)) != BS ||
	    pwrite(md, rec, REC, (off_t)(ld.rec_off + to * REC)) != REC)
		goto out;
	ret = fsync(dd) || fsync(md) ? -1 : 0;
out:
	if (ms >= 0)
		close(ms);
	if (md >= 0)
		close(md);
	if (ds >= 0)
		close(ds);
	if (dd >= 0)
		close(dd);
	return ret;
}

/* The cache file of key (read once through the cache first). */
static int file_of(const char *key, char *out, size_t len)
{
	char pat[400];
	glob_t g;
	int ret = -1;

	snprintf(pat, sizeof(pat), "%s/objects/*/*.meta", cachedir);
	if (glob(pat, 0, NULL, &g))
		return -1;
	for (size_t i = 0; i < g.gl_pathc && ret; i++) {
		int fd = open(g.gl_pathv[i], O_RDONLY);
		char name[16] = "";
		uint32_t lens[3];

		/* the key follows the dataset name ("d") at byte 64 */
		if (fd >= 0 && pread(fd, lens, 12, 32) == 12 &&
		    lens[1] == strlen(key) &&
		    pread(fd, name, lens[1], 64 + lens[0]) == lens[1] &&
		    !memcmp(name, key, lens[1])) {
			snprintf(out, len, "%s", g.gl_pathv[i]);
			ret = 0;
		}
		if (fd >= 0)
			close(fd);
	}
	globfree(&g);
	return ret;
}

static int put(const char *key, char *data)
{
	char path[400];
	FILE *f;
	int ok;

	for (size_t i = 0; i < SIZE; i++)
		data[i] = (char)cachetest_rnd(&rnd_state);
	snprintf(path, sizeof(path), "%s/%s", srcdir, key);
	f = fopen(path, "wb");
	ok = f && fwrite(data, 1, SIZE, f) == SIZE;
	if (f && fclose(f))
		ok = 0;
	return ok ? 0 : -1;
}

int main(void)
{
	static char a[SIZE], b[SIZE], got[SIZE];
	const char *base = getenv("TMPDIR");
	char fa[400] = "", fb[400] = "", cmd[400];
	uint64_t fetches = 0;
	char *orig_dir;

	log_set_level(LOG_LVL_ERROR);
	snprintf(tmp, sizeof(tmp), "%s/test_cache_records.XXXXXX",
		 base && *base ? base : "/tmp");
	if (!mkdtemp(tmp))
		return 1;
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	mkdir(srcdir, 0755);
	CHECK_INT(put("ka", a), 0);
	CHECK_INT(put("kb", b), 0);
	CHECK_INT(config_defaults(&cfg), 0);
	if (!cfg)
		return 1;
	orig_dir = cfg->cache_dir;
	cfg->cache_dir = cachedir;
	cfg->cache_block_size = BS;
	cfg->cache_size = 1ULL << 30;

	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "ka", SIZE, got, &fetches),
		  0);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "kb", SIZE, got, &fetches),
		  0);
	CHECK_INT(file_of("ka", fa, sizeof(fa)), 0);
	CHECK_INT(file_of("kb", fb, sizeof(fb)), 0);
	/* Cached whole: a fresh read fetches nothing. */
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "ka", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, a, SIZE));
	CHECK_INT(fetches, 0);

	/* Another position of the same file: block 1 over block 5. */
	CHECK_INT(copy_block(fa, 1, fa, 5), 0);
	memset(got, 0, SIZE);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "ka", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, a, SIZE)); /* never block 1's bytes at 5 */
	CHECK_INT(fetches, 1); /* block 5 alone, fetched again */

	/* Another object's file, same block number: ka's 2 into kb's 2. */
	CHECK_INT(copy_block(fa, 2, fb, 2), 0);
	memset(got, 0, SIZE);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "kb", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, b, SIZE)); /* never ka's bytes in kb */
	CHECK_INT(fetches, 1);

	/* A version 1 file (records bound to the block only) is migrated
	 * to a pair at open, nothing fetched; its records keep their seed
	 * (the sidecar's flags say so: CACHE_HDR_SEED0 at byte 44). */
	CHECK_INT(cacheold_make(fb, 1, BS, ~0ull), 0);
	memset(got, 0, SIZE);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "kb", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, b, SIZE));
	CHECK_INT(fetches, 0);
	{
		uint32_t version = 0, flags = 0;
		int fd = open(fb, O_RDONLY);

		CHECK(fd >= 0 && pread(fd, &version, 4, 8) == 4 &&
		      pread(fd, &flags, 4, 44) == 4);
		CHECK_INT(version, 3);
		CHECK_INT(flags, 1);
		if (fd >= 0)
			close(fd);
	}
	/* ... and a block of it copied to another block is still refused
	 * (version 1 bound records to their block). */
	CHECK_INT(copy_block(fb, 3, fb, 6), 0);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "kb", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, b, SIZE));
	CHECK_INT(fetches, 1);

	cfg->cache_dir = orig_dir;
	config_free(cfg);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd))
		return 1;
	return check_result();
}
