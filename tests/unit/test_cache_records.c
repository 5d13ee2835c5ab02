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
 *   a file in the previous format (version 1: records bound to the block
 *   only, as the cache wrote them until now) is still read as it is,
 *   nothing fetched again: an upgrade costs no download.
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
#include "cachetest.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define BS 4096u
#define NBLOCKS 8u
#define SIZE (NBLOCKS * BS)
#define REC 16u /* sizeof(struct cache_rec) */
#define HDR_SUM_AT 48u /* struct cache_hdr: hdr_sum, after 48 bytes */

static char tmp[256], srcdir[300], cachedir[300];
static struct dstage_config *cfg;
static uint64_t rnd_state = 0x9e3779b97f4a7c15ULL;

/* Where a cache file keeps things (lib/cache/cache_i.h's layout). */
struct layout {
	uint64_t data_off, rec_off, strs_len;
};

static int layout_of(int fd, struct layout *l)
{
	uint32_t lens[3];

	if (pread(fd, &l->data_off, 8, 24) != 8 ||
	    pread(fd, lens, sizeof(lens), 32) != (ssize_t)sizeof(lens))
		return -1;
	l->strs_len = (uint64_t)lens[0] + lens[1] + lens[2];
	l->rec_off = (64 + l->strs_len + 4095) & ~(uint64_t)4095;
	return 0;
}

/* Copy block from's data and record of file src onto block to of dst. */
static int copy_block(const char *src, uint64_t from, const char *dst,
		      uint64_t to)
{
	char data[BS], rec[REC];
	struct layout ls, ld;
	int fs = open(src, O_RDONLY), fd = open(dst, O_RDWR), ret = -1;

	if (fs < 0 || fd < 0 || layout_of(fs, &ls) || layout_of(fd, &ld))
		goto out;
	if (pread(fs, data, BS, (off_t)(ls.data_off + from * BS)) != BS ||
	    pread(fs, rec, REC, (off_t)(ls.rec_off + from * REC)) != REC)
		goto out;
	if (pwrite(fd, data, BS, (off_t)(ld.data_off + to * BS)) != BS ||
	    pwrite(fd, rec, REC, (off_t)(ld.rec_off + to * REC)) != REC)
		goto out;
	ret = fsync(fd);
out:
	if (fs >= 0)
		close(fs);
	if (fd >= 0)
		close(fd);
	return ret;
}

/*
 * Rewrite path as the previous format wrote it: header version 1 (its
 * checksum again over the fixed part and the strings) and each present
 * record's check word seeded with its block number alone.
 */
static int make_version_1(const char *path)
{
	unsigned char hdr[64], *strs = NULL;
	struct layout l;
	uint32_t version = 1;
	uint64_t sum;
	int fd = open(path, O_RDWR), ret = -1;

	if (fd < 0 || layout_of(fd, &l) || pread(fd, hdr, 64, 0) != 64)
		goto out;
	strs = malloc(l.strs_len + 1);
	if (!strs || pread(fd, strs, l.strs_len, 64) != (ssize_t)l.strs_len)
		goto out;
	memcpy(hdr + 8, &version, 4);
	{
		XXH3_state_t *st = XXH3_createState();

		if (!st)
			goto out;
		XXH3_64bits_reset(st);
		XXH3_64bits_update(st, hdr, HDR_SUM_AT);
		XXH3_64bits_update(st, strs, l.strs_len);
		sum = XXH3_64bits_digest(st);
		XXH3_freeState(st);
	}
	memcpy(hdr + HDR_SUM_AT, &sum, 8);
	if (pwrite(fd, hdr, 64, 0) != 64)
		goto out;
	for (uint64_t b = 0; b < NBLOCKS; b++) {
		unsigned char rec[REC];
		uint32_t check;

		if (pread(fd, rec, REC, (off_t)(l.rec_off + b * REC)) != REC)
			goto out;
		check = (uint32_t)XXH3_64bits_withSeed(rec, 12, b);
		memcpy(rec + 12, &check, 4);
		if (pwrite(fd, rec, REC, (off_t)(l.rec_off + b * REC)) != REC)
			goto out;
	}
	ret = fsync(fd);
out:
	free(strs);
	if (fd >= 0)
		close(fd);
	return ret;
}

/* The cache file of key (read once through the cache first). */
static int file_of(const char *key, char *out, size_t len)
{
	char pat[400];
	glob_t g;
	int ret = -1;

	snprintf(pat, sizeof(pat), "%s/objects/*/*", cachedir);
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

	/* The previous format is read as it is: nothing fetched. */
	CHECK_INT(make_version_1(fb), 0);
	memset(got, 0, SIZE);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "kb", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, b, SIZE));
	CHECK_INT(fetches, 0);
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
