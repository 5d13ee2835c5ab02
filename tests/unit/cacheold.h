/* SPDX-License-Identifier: MIT */
/*
 * cacheold.h: write an object as the cache stored it before version 3 (one
 * file: header, records, blocks), written here independently of
 * lib/cache from the layout docs/cache.md gives, so that the tests of the
 * migration (tests/unit/test_cache_migrate.c, test_cache_records.c) read
 * files the old code would have written.
 */
#ifndef DSTAGE_TEST_CACHEOLD_H
#define DSTAGE_TEST_CACHEOLD_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define CACHEOLD_REC 16u
#define CACHEOLD_SUM_AT 48u /* struct cache_hdr: hdr_sum after 48 bytes */

/* The data file's path of the sidecar meta (cut ".meta"). */
static inline void cacheold_data_path(const char *meta, char *out, size_t len)
{
	snprintf(out, len, "%.*s", (int)(strlen(meta) - 5), meta);
}

static inline uint64_t cacheold_round(uint64_t v)
{
	return (v + 4095) & ~(uint64_t)4095;
}

/*
 * Rewrite the object whose sidecar is meta (version 3) as one file of
 * version 1 or 2 at its data file's path, the sidecar removed: header
 * (version, data_off = records' end rounded up to 4 KiB, flags 0, hdr_sum
 * over the first 48 bytes and the strings), at the first 4 KiB boundary
 * after the strings one record per block whose check word is seeded with
 * b (version 1) or b ^ hdr_sum (version 2), the blocks from data_off.
 * Blocks not in keep (bit b; all when keep is ~0) get no record and no
 * bytes. 0 or -1.
 */
static inline int cacheold_make(const char *meta, uint32_t version, uint32_t bs,
				uint64_t keep)
{
	unsigned char hdr[64], *strs = NULL, *file = NULL;
	char data[400], tmpf[420];
	uint64_t size, nblocks, rec_off, data_off, total, sum;
	uint32_t lens[3];
	size_t slen;
	int mfd = open(meta, O_RDONLY), dfd = -1, out = -1, ret = -1;

	cacheold_data_path(meta, data, sizeof(data));
	dfd = open(data, O_RDONLY);
	if (mfd < 0 || dfd < 0 || pread(mfd, hdr, 64, 0) != 64)
		goto out;
	memcpy(&size, hdr + 16, 8);
	memcpy(lens, hdr + 32, 12);
	slen = (size_t)lens[0] + lens[1] + lens[2];
	nblocks = (size + bs - 1) / bs;
	rec_off = cacheold_round(64 + slen);
	data_off = cacheold_round(rec_off + nblocks * CACHEOLD_REC);
	total = data_off + size;
	strs = malloc(slen + 1);
	file = calloc(1, total);
	if (!strs || !file || pread(mfd, strs, slen, 64) != (ssize_t)slen)
		goto out;
	memcpy(hdr + 8, &version, 4);
	memcpy(hdr + 24, &data_off, 8);
	memset(hdr + 44, 0, 4); /* flags: none before version 3 */
	{
		XXH3_state_t *st = XXH3_createState();

		if (!st)
			goto out;
		XXH3_64bits_reset(st);
		XXH3_64bits_update(st, hdr, CACHEOLD_SUM_AT);
		XXH3_64bits_update(st, strs, slen);
		sum = XXH3_64bits_digest(st);
		XXH3_freeState(st);
	}
	memcpy(hdr + CACHEOLD_SUM_AT, &sum, 8);
	memcpy(file, hdr, 64);
	memcpy(file + 64, strs, slen);
	for (uint64_t b = 0; b < nblocks; b++) {
		unsigned char *rec = file + rec_off + b * CACHEOLD_REC;
		uint64_t len = b + 1 < nblocks ? bs : size - b * bs;
		uint32_t check, magic = 0;

		if (!(keep >> (b < 63 ? b : 63) & 1))
			continue;
		if (pread(mfd, rec, CACHEOLD_REC,
			  (off_t)(rec_off + b * CACHEOLD_REC)) != CACHEOLD_REC)
			goto out;
		memcpy(&magic, rec + 8, 4);
		if (magic != 0x4b4c4231u) { /* "1BLK": absent in the pair */
			memset(rec, 0, CACHEOLD_REC);
			continue;
		}
		check = (uint32_t)XXH3_64bits_withSeed(
			rec, 12, version == 1 ? b : b ^ sum);
		memcpy(rec + 12, &check, 4);
		if (pread(dfd, file + data_off + b * bs, len,
			  (off_t)(b * bs)) != (ssize_t)len)
			goto out;
	}
	snprintf(tmpf, sizeof(tmpf), "%s.old", data);
	out = open(tmpf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (out < 0 || pwrite(out, file, total, 0) != (ssize_t)total ||
	    fsync(out) || rename(tmpf, data) || unlink(meta))
		goto out;
	ret = 0;
out:
	if (out >= 0)
		close(out);
	if (mfd >= 0)
		close(mfd);
	if (dfd >= 0)
		close(dfd);
	free(strs);
	free(file);
	return ret;
}

#endif
