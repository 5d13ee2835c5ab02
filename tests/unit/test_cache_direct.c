// SPDX-License-Identifier: MIT
/*
 * test_cache_direct: what the cache does to the page cache. Fills write
 * with O_DIRECT (none of the block data lands in the page cache) unless
 * DSTAGE_NO_DIRECT=1, and drop-behind takes what a read used back out of
 * it, by 16 MiB chunks. Checked with mincore(2) on the cache file, so it
 * needs a filesystem with a page cache of its own under $TMPDIR (or /tmp):
 * on a tmpfs every page is resident whatever the cache does, and the test
 * exits 77 (skipped) saying so rather than pass having checked nothing.
 * Run twice by CTest: as is, and with DSTAGE_NO_URING=1 DSTAGE_NO_DIRECT=1.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "check.h"
#include "cachetest.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define BS 4096u

static char tmp[256], srcdir[300], cachedir[300];
static struct dstage_config *cfg;
static struct objstore *os;
static uint64_t rnd_state = 88172645463325252ULL;

/* Pages of fd's last len bytes resident in the page cache. */
static size_t resident_tail(int fd, size_t len)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = 0, span, npages;
	unsigned char vec[256];
	struct stat st;
	off_t start;
	void *m;

	if (fstat(fd, &st) || (size_t)st.st_size < len)
		return (size_t)-1;
	start = (off_t)(((size_t)st.st_size - len) / pg * pg);
	span = (size_t)st.st_size - (size_t)start;
	npages = (span + pg - 1) / pg;
	if (npages > sizeof(vec))
		return (size_t)-1;
	m = mmap(NULL, span, PROT_READ, MAP_SHARED, fd, start);
	if (m == MAP_FAILED)
		return (size_t)-1;
	if (mincore(m, span, vec) == 0)
		for (size_t i = 0; i < npages; i++)
			n += vec[i] & 1;
	munmap(m, span);
	return n;
}

/*
 * Fills write block data with O_DIRECT (none of it lands in the page
 * cache) but for the object's last partial block (its page only), unless
 * DSTAGE_NO_DIRECT=1 (then it all does); bytes read back equal the
 * source, the last block included. With drop-behind, bytes a
 * read got from the cache file leave the page cache.
 */
static void test_direct_and_drop_behind(void)
{
	struct cache_object obj = { 0 };
	char etag[128], dir[320], *saved = cfg->cache_dir;
	size_t size = 40 * BS + 5;
	char *data = cachetest_put_src(os, &rnd_state, "direct.bin", size, &obj,
				       etag);
	bool direct = cachetest_direct_writes(tmp);
	struct cache *c;
	int fd;

	snprintf(dir, sizeof(dir), "%s/cache-direct", tmp);
	cfg->cache_dir = dir;
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	CHECK_INT(cache_fetch(c, &obj, 0, 0, NULL, NULL), 0);
	fd = cachetest_sole_obj_file(dir);
	if (fd >= 0) {
		size_t res = resident_tail(fd, 32 * BS);

		/* The object's last, partial block alone is written buffered
		 * (the data file ends where the object does): one page. */
		if (direct)
			CHECK_INT(res, 1);
		else
			CHECK(res > 0 && res != (size_t)-1);
		/* Read it back (from disk when direct): the same bytes. */
		CHECK(cachetest_read_eq(c, &obj, data, 0, size));
		CHECK(resident_tail(fd, 32 * BS) > 0);
		cache_close(c);

		/* Drop-behind: what a read took leaves the page cache. */
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		CHECK_INT(cache_open(cfg, NULL, &c), 0);
		cache_set_drop_behind(c, true);
		CHECK(cachetest_read_eq(c, &obj, data, 8 * BS, 32 * BS + 5));
		CHECK_INT(resident_tail(fd, 32 * BS), 0);
	}
	if (fd >= 0)
		close(fd);
	cache_close(c);
	cfg->cache_dir = saved;
	free(data);
}

/* Pages of [off, off + len) of fd in the page cache; -1 on error. */
static long resident_range(int fd, uint64_t off, uint64_t len)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), npages = (len + pg - 1) / pg;
	unsigned char *vec = malloc(npages ? npages : 1);
	long n = -1;
	void *m;

	if (!vec || off % pg)
		goto out;
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)off);
	if (m == MAP_FAILED)
		goto out;
	if (mincore(m, len, vec) == 0)
		for (size_t i = n = 0; i < npages; i++)
			n += vec[i] & 1;
	munmap(m, len);
out:
	free(vec);
	return n;
}

/*
 * Drop-behind goes by 16 MiB chunks, one behind the stream (a per-request
 * POSIX_FADV_DONTNEED cost a warm read 40% of its speed), and the rest at
 * the object's end.
 */
static void test_drop_behind_chunks(void)
{
	struct cache_object obj = { 0 };
	char etag[128], dir[320], *saved = cfg->cache_dir;
	const uint64_t mib = 1 << 20;
	size_t size = 40 * mib;
	char *data = cachetest_put_src(os, &rnd_state, "chunks.bin", size, &obj,
				       etag);
	uint64_t data_off = 0;
	struct cache *c;
	int fd;

	snprintf(dir, sizeof(dir), "%s/cache-chunks", tmp);
	cfg->cache_dir = dir;
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	CHECK_INT(cache_fetch(c, &obj, 0, 0, NULL, NULL), 0);
	cache_close(c);
	fd = cachetest_sole_obj_file(dir);
	if (fd >= 0) {
		/* data_off: 0, the data file holds the bytes alone */
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		CHECK_INT(cache_open(cfg, NULL, &c), 0);
		cache_set_drop_behind(c, true);
		for (uint64_t off = 0; off < 35 * mib; off += mib)
			CHECK(cachetest_read_eq(c, &obj, data, off, mib));
		/* Past 32 MiB: the first chunk went, the second stays. (A
		 * folio straddling the start of the data, up to 2 MiB, stays
		 * with the header and records.) */
		CHECK_INT(resident_range(fd, data_off + 2 * mib, 12 * mib), 0);
		CHECK(resident_range(fd, data_off + 20 * mib, 10 * mib) > 0);
		/* At the end, the rest goes. */
		CHECK(cachetest_read_eq(c, &obj, data, 35 * mib, 5 * mib));
		CHECK_INT(
			resident_range(fd, data_off + 2 * mib, size - 2 * mib),
			0);
		cache_close(c);
	}
	if (fd >= 0)
		close(fd);
	cfg->cache_dir = saved;
	free(data);
}

int main(void)
{
	struct cachetest_saved saved;
	const char *base = getenv("TMPDIR");
	struct statfs sf;
	char cmd[300];

	log_set_level(LOG_LVL_ERROR);
	snprintf(tmp, sizeof(tmp), "%s/test_cache_direct.XXXXXX",
		 base && *base ? base : "/tmp");
	if (!mkdtemp(tmp)) {
		fprintf(stderr, "test_cache_direct: mkdtemp %s: %s\n", tmp,
			strerror(errno));
		return 1;
	}
	if (statfs(tmp, &sf) == 0 && sf.f_type == TMPFS_MAGIC) {
		fprintf(stderr,
			"test_cache_direct: %s is a tmpfs, where every page "
			"stays resident: skipped (set TMPDIR to a directory "
			"on a disk)\n",
			tmp);
		rmdir(tmp);
		return 77;
	}
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	mkdir(srcdir, 0755);
	cachetest_setup(&cfg, &os, cachedir, srcdir, BS, &saved);

	test_direct_and_drop_behind();
	test_drop_behind_chunks();

	objstore_free(os);
	cachetest_free(cfg, &saved);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
	if (system(cmd))
		return 1;
	return check_result();
}
