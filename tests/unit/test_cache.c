// SPDX-License-Identifier: MIT
/*
 * test_cache: the block cache against a file:// source: bytes equal the
 * source (random, block-boundary, empty, 1-byte ranges), each block fetched
 * once (also from 8 threads), restart keeps everything, a flipped byte is
 * detected and re-fetched, a replaced source object fails with EIO, zero-copy
 * descriptors, readahead only for sequential reads, eviction with pins,
 * quotas and priorities, streaming when everything is pinned.
 */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "cachetest.h"
#include "sysfail.h"
#include "dstage/cache.h"
#include "dstage/cachepol.h"
#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "util/uring.h"

#define BS 4096u

static char tmp[256], srcdir[300], cachedir[300], catpath[300];
static struct dstage_config *cfg;
static struct objstore *os;

static uint64_t rnd_state = 88172645463325252ULL;

static uint64_t rnd(void)
{
	return cachetest_rnd(&rnd_state);
}

/* Write a source object of size bytes; returns its bytes (malloc'ed). */
static char *put_src(const char *key, size_t size, struct cache_object *obj,
		     char *etag)
{
	return cachetest_put_src(os, &rnd_state, key, size, obj, etag);
}

/* Policies of the caches opened, closed at the end (main). */
static struct cachepol *pols[64];
static unsigned npols;

static struct cache *open_cache(void)
{
	struct cachepol *pol = NULL;
	struct cache *c = NULL;

	CHECK_INT(cachepol_open(cfg, &pol), 0);
	CHECK(npols < sizeof(pols) / sizeof(pols[0]));
	pols[npols++] = pol;
	CHECK_INT(cache_open(cfg, cachepol_source(pol), &c), 0);
	return c;
}

static bool read_eq(struct cache *c, const struct cache_object *obj,
		    const char *want, uint64_t off, size_t len)
{
	return cachetest_read_eq(c, obj, want, off, len);
}

static void test_ranges(void)
{
	struct cache_object obj = { 0 }, e = { 0 }, one = { 0 };
	char etag[128], etag_e[128], etag_1[128];
	size_t size = 300 * BS + 123;
	char *data = put_src("big.bin", size, &obj, etag);
	char *de = put_src("empty", 0, &e, etag_e);
	char *d1 = put_src("one", 1, &one, etag_1);
	struct cache *c = open_cache();
	struct cache_stats st;
	char b;

	for (int i = 0; i < 200; i++) {
		uint64_t off = rnd() % (size + 10);
		size_t len = rnd() % (8 * BS);

		CHECK(read_eq(c, &obj, data, off, len));
	}
	for (uint64_t k = 1; k < 300; k += 37) {
		CHECK(read_eq(c, &obj, data, k * BS - 1, 2));
		CHECK(read_eq(c, &obj, data, k * BS, BS));
		CHECK(read_eq(c, &obj, data, k * BS - 1, BS + 2));
	}
	CHECK(read_eq(c, &obj, data, size - 1, 1));
	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK_INT(cache_read(c, &e, 0, 10, &b), 0);
	CHECK_INT(cache_read(c, &one, 0, 10, &b), 1);
	CHECK_INT(b, d1[0]);
	cache_get_stats(c, &st);
	/* Each block fetched exactly once (readahead included). */
	CHECK_INT(st.fetches, 301 + 1);
	uint64_t present = 0;

	CHECK_INT(cache_object_present(c, &obj, &present), 0);
	CHECK_INT(present, size);

	/* Zero-copy descriptors of verified blocks. */
	int fd = -1;
	uint64_t fd_off = 0;
	char buf[3 * BS];

	CHECK_INT(cache_read_fd(c, &obj, 5 * BS + 10, 2 * BS, &fd, &fd_off), 0);
	CHECK_INT(pread(fd, buf, 2 * BS, (off_t)fd_off), 2 * BS);
	CHECK(!memcmp(buf, data + 5 * BS + 10, 2 * BS));
	close(fd);

	/* Restart: nothing is fetched again. */
	cache_close(c);
	c = open_cache();
	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK_INT(cache_read_fd(c, &obj, 0, BS, &fd, &fd_off), 0);
	close(fd);
	cache_get_stats(c, &st);
	CHECK_INT(st.fetches, 0);
	CHECK_INT(st.bytes_from_source, 0);
	CHECK(st.used >= size);

	/* Drop. */
	CHECK_INT(cache_object_drop(c, &obj), 0);
	CHECK_INT(cache_object_present(c, &obj, &present), 0);
	CHECK_INT(present, 0);
	cache_close(c);
	free(data);
	free(de);
	free(d1);
}

/* Flip one bit of a byte of the object cached under dataset ds. */
static void flip_byte_in(const char *ds, uint64_t block, uint64_t at)
{
	uint64_t data_off = 0;
	int fd = cachetest_obj_file(cachedir, ds, &data_off);
	off_t p = (off_t)(data_off + block * BS + at);
	char ch;

	CHECK(fd >= 0);
	CHECK(pread(fd, &ch, 1, p) == 1);
	ch ^= 0x20;
	CHECK(pwrite(fd, &ch, 1, p) == 1);
	close(fd);
}

/* Flip one bit of a byte of the object cached under dataset "flip". */
static void flip_byte(uint64_t block, uint64_t at)
{
	flip_byte_in("flip", block, at);
}

/* cache_object_check's report of damaged blocks. */
struct bad_blocks {
	uint64_t blocks[8];
	unsigned n;
	char path[512];
};

static void note_bad(void *arg, uint64_t block, const char *path)
{
	struct bad_blocks *b = arg;

	if (b->n < 8)
		b->blocks[b->n++] = block;
	snprintf(b->path, sizeof(b->path), "%s", path);
}

/*
 * cache_object_check names damaged blocks and their file, counts present
 * and missing ones, and fetches nothing; cache_dir_recover recreates
 * objects/ removed under the cache and refuses one others may write.
 */
static void test_check_and_recover(void)
{
	struct cache_object obj = { .dataset = "chk" };
	struct bad_blocks bb = { .n = 0 };
	struct cache_check chk = { .bad_fn = note_bad, .arg = &bb };
	char etag[128], objdir[400], cmd[500];
	size_t size = 10 * BS;
	char *data = put_src("chk.bin", size, &obj, etag);
	struct cache *c = open_cache();
	struct cache_stats st0, st;
	uint64_t data_off = 0;
	int fd;
	char ch;

	CHECK_INT(cache_fetch(c, &obj, 0, 6 * BS, NULL, NULL), 0);
	fd = cachetest_obj_file(cachedir, "chk", &data_off);
	CHECK(fd >= 0);
	CHECK(pread(fd, &ch, 1, (off_t)(data_off + 3 * BS + 100)) == 1);
	ch ^= 0x11;
	CHECK(pwrite(fd, &ch, 1, (off_t)(data_off + 3 * BS + 100)) == 1);
	close(fd);
	cache_get_stats(c, &st0);
	CHECK_INT(cache_object_check(c, &obj, &chk), 0);
	CHECK_INT(chk.blocks, 10);
	CHECK_INT(chk.present, 6);
	CHECK_INT(chk.bad, 1);
	CHECK_INT(bb.n, 1);
	CHECK_INT(bb.blocks[0], 3);
	CHECK(!strncmp(bb.path, cachedir, strlen(cachedir)) &&
	      strstr(bb.path, "/objects/"));
	fd = open(bb.path, O_RDONLY);
	CHECK(fd >= 0);
	close(fd);
	cache_get_stats(c, &st);
	CHECK_INT(st.fetches, st0.fetches); /* nothing fetched */
	CHECK_INT(st.checksum_failures, st0.checksum_failures + 1);
	CHECK(read_eq(c, &obj, data, 0, size)); /* a read repairs */

	/* objects/ removed under the cache: recreated once. */
	CHECK_INT(cache_dir_recover(c), 0);
	snprintf(objdir, sizeof(objdir), "%s/objects", cachedir);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", objdir);
	CHECK_INT(system(cmd), 0);
	CHECK_INT(cache_dir_recover(c), 1);
	CHECK_INT(cache_dir_recover(c), 0);
	CHECK_INT(access(objdir, F_OK), 0);
	CHECK(read_eq(c, &obj, data, 0, size));
	bb.n = 0;
	CHECK_INT(cache_object_check(c, &obj, &chk), 0);
	CHECK_INT(chk.present, 10);
	CHECK_INT(chk.bad, 0);

	/* One that others may write is refused, until it is gone. */
	CHECK_INT(system(cmd), 0);
	CHECK_INT(mkdir(objdir, 0700), 0);
	CHECK_INT(chmod(objdir, 0777), 0);
	CHECK_INT(cache_dir_recover(c), -EACCES);
	CHECK_INT(rmdir(objdir), 0);
	CHECK_INT(cache_dir_recover(c), 1);
	cache_close(c);
	free(data);
}

/*
 * The block records on disk hold the plain XXH3_64bits of each block,
 * whether the cache hashed the block whole or piece by piece as its bytes
 * arrived (objstore_get.on_data): a cache stays readable by any build.
 */
static void test_on_disk_sums(void)
{
	struct cache_object obj = { .dataset = "sums" };
	char etag[128], pat[400];
	size_t size = 3 * BS + 12345;
	char *data = put_src("sums.bin", size, &obj, etag);
	struct cache *c = open_cache();
	unsigned found = 0;
	glob_t g;

	CHECK(read_eq(c, &obj, data, 0, size));
	cache_close(c);
	snprintf(pat, sizeof(pat), "%s/objects/*/*.meta", cachedir);
	CHECK_INT(glob(pat, 0, NULL, &g), 0);
	for (size_t i = 0; i < g.gl_pathc; i++) {
		uint32_t lens[3];
		uint64_t data_off, rec_off, sum;
		char ds[8] = "", dpath[400];
		char *blk = malloc(BS);
		int fd = open(g.gl_pathv[i], O_RDONLY), dfd;
		struct stat st;

		CHECK(fd >= 0 && blk);
		CHECK(pread(fd, ds, 4, 64) == 4);
		if (memcmp(ds, "sums", 4)) {
			close(fd);
			free(blk);
			continue;
		}
		found++;
		/* version 3: the sidecar says data_off 0 */
		CHECK(pread(fd, &data_off, 8, 24) == 8);
		CHECK_INT(data_off, 0);
		snprintf(dpath, sizeof(dpath), "%.*s",
			 (int)(strlen(g.gl_pathv[i]) - 5), g.gl_pathv[i]);
		dfd = open(dpath, O_RDONLY);
		CHECK(dfd >= 0);
		/* exactly the object's bytes: no padding after the last */
		CHECK(fstat(dfd, &st) == 0 && (size_t)st.st_size == size);
		CHECK(pread(fd, lens, sizeof(lens), 32) == sizeof(lens));
		rec_off = (64 + (uint64_t)lens[0] + lens[1] + lens[2] + 4095) &
			  ~(uint64_t)4095;
		for (uint64_t b = 0; b * BS < size; b++) {
			size_t len = size - b * BS < BS ? size - b * BS : BS;

			CHECK(pread(fd, &sum, 8, (off_t)(rec_off + b * 16)) ==
			      8);
			CHECK(pread(dfd, blk, len, (off_t)(b * BS)) ==
			      (ssize_t)len);
			CHECK(!memcmp(blk, data + b * BS, len));
			CHECK(sum == XXH3_64bits(blk, len));
		}
		close(dfd);
		close(fd);
		free(blk);
	}
	globfree(&g);
	CHECK_INT(found, 1);
	free(data);
}

struct iov_sink {
	char *out, *buf; /* out: where the bytes go; buf: the bounce buffer */
	size_t at, len, calls, zero_copy, empty;
};

static int iov_sink_fn(void *arg, const struct iovec *iov, int n)
{
	struct iov_sink *k = arg;

	k->calls++;
	if (n == 0)
		k->empty++;
	else if ((char *)iov[0].iov_base < k->buf ||
		 (char *)iov[0].iov_base >= k->buf + k->len)
		k->zero_copy++;
	for (int i = 0; i < n; i++) {
		memcpy(k->out + k->at, iov[i].iov_base, iov[i].iov_len);
		k->at += iov[i].iov_len;
	}
	return 0;
}

/*
 * A cache file cut short by hand (or by a damaged file system) while its
 * records still say its last blocks are present: no read may crash (a
 * mapping past the end would raise SIGBUS) or fail; the lost blocks are
 * fetched again.
 */
static void test_truncated_file(void)
{
	struct cache_object obj = { .dataset = "trunc" };
	char etag[128], buf[BS];
	size_t size = 10 * BS;
	char *data = put_src("trunc.bin", size, &obj, etag);
	struct cache *c = open_cache();
	struct cache_stats st;
	uint64_t data_off = 0, fd_off;
	int fd, sfd;

	CHECK(read_eq(c, &obj, data, 0, size));
	cache_close(c);
	fd = cachetest_obj_file(cachedir, "trunc", &data_off);
	CHECK(fd >= 0);
	CHECK_INT(ftruncate(fd, (off_t)(data_off + 5 * BS + BS / 2)), 0);
	close(fd);
	c = open_cache();
	CHECK_INT(cache_read_fd(c, &obj, 8 * BS, BS, &sfd, &fd_off), -EAGAIN);
	CHECK_INT(cache_read_fd(c, &obj, 2 * BS, BS, &sfd, &fd_off), 0);
	CHECK_INT(pread(sfd, buf, BS, (off_t)fd_off), BS);
	CHECK(!memcmp(buf, data + 2 * BS, BS));
	close(sfd);
	{
		/* The stager's bulk reads (O_DIRECT batches) too. */
		struct iov_sink k = { .out = malloc(size),
				      .buf = malloc(2 * BS),
				      .len = 2 * BS };

		for (uint64_t off = 0; off < size; off += 2 * BS)
			CHECK_INT(cache_read_iov(c, &obj, off, 2 * BS, k.buf,
						 CACHE_READ_DIRECT, iov_sink_fn,
						 &k),
				  0);
		CHECK(k.at == size && !memcmp(k.out, data, size));
		free(k.out);
		free(k.buf);
	}
	CHECK(read_eq(c, &obj, data, 0, size));
	cache_get_stats(c, &st);
	CHECK(st.fetches >= 4 && st.fetches <= 5);
	cache_close(c);
	/* Repaired: a fresh process reads it all from the cache. */
	c = open_cache();
	CHECK(read_eq(c, &obj, data, 0, size));
	cache_get_stats(c, &st);
	CHECK_INT(st.fetches, 0);
	/* Cut again under a process that verified every block: no short
	 * descriptor for the lost ones, and the bytes come back. */
	fd = cachetest_obj_file(cachedir, "trunc", &data_off);
	CHECK(fd >= 0);
	CHECK_INT(ftruncate(fd, (off_t)(data_off + 7 * BS)), 0);
	close(fd);
	CHECK_INT(cache_read_fd(c, &obj, 6 * BS, BS, &sfd, &fd_off), 0);
	close(sfd);
	CHECK_INT(cache_read_fd(c, &obj, 8 * BS, BS, &sfd, &fd_off), -EAGAIN);
	CHECK(read_eq(c, &obj, data, 0, size));
	cache_close(c);
	free(data);
}

/*
 * cache_open_passthrough (issue 31): a read-only descriptor of a complete
 * object's data file, its bytes the object's from offset 0, holding the
 * in-use lock (the object cannot be dropped while it is open); -EAGAIN for
 * a partial object, a cleared record and verify_reads = always.
 */
static void test_passthrough(void)
{
	struct cache_object obj = { .dataset = "pt" };
	char etag[128];
	size_t size = 9 * BS + 100;
	char *data = put_src("pt.bin", size, &obj, etag);
	char *got = malloc(size + 1);
	struct cache *c = open_cache();
	struct cache_stats st;
	int fd = -1;

	CHECK(got);
	/* Nothing cached yet, then a partial object. */
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
	CHECK_INT(fd, -1);
	CHECK(read_eq(c, &obj, data, 2 * BS, BS));
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
	/* Complete: the object's bytes from offset 0, and no more. */
	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	CHECK(fd >= 0);
	CHECK_INT(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
	/* The kernel's reads write no access time (the file is ours). */
	CHECK(fcntl(fd, F_GETFL) & O_NOATIME);
	CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	CHECK_INT(pread(fd, got, size + 1, 0), (ssize_t)size);
	CHECK(!memcmp(got, data, size));
	cache_get_stats(c, &st);
	CHECK_INT(st.passthrough_opens, 1);
	/* Its in-use lock keeps the object: a drop is refused until the
	 * descriptor is closed. */
	CHECK_INT(cache_object_drop(c, &obj), -EBUSY);
	close(fd);
	CHECK_INT(cache_object_drop(c, &obj), 0);
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	/* A record cleared (the scrub, maybe in another process): this
	 * process's verified bitmap does not count. */
	CHECK_INT(cache_object_forget_block(c, &obj, 4), 0);
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	/* The last block's record alone. */
	CHECK_INT(cache_object_forget_block(c, &obj, 9), 0);
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
	CHECK(read_eq(c, &obj, data, 0, size));
	/* Another process (its own handle and mapping of damage.gen) clears
	 * a record of an object this one remembers as whole: the next open
	 * here reads the records again instead of trusting that memory. */
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	{
		struct cache *c2 = open_cache();

		CHECK_INT(cache_object_forget_block(c2, &obj, 6), 0);
		cache_close(c2);
	}
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
	CHECK(read_eq(c, &obj, data, 0, size));
	/* The object idle here (no in-use lock) is evicted by another
	 * process: a passthrough open takes the lock on its own description,
	 * finds the file unlinked and declines; the next read fetches it
	 * again. A passed-through description keeps the other process's
	 * drop out (its lock), as the object's own did. */
	{
		struct cache *c2 = open_cache();

		CHECK_INT(cache_object_drop(c2, &obj), 0);
		CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
		CHECK_INT(fd, -1);
		CHECK(read_eq(c, &obj, data, 0, size));
		CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
		CHECK_INT(cache_object_drop(c2, &obj), -EBUSY);
		CHECK_INT(pread(fd, got, size + 1, 0), (ssize_t)size);
		CHECK(!memcmp(got, data, size));
		close(fd);
		cache_close(c2);
	}
	/* verify_reads = always: every read goes through the cache. */
	cfg->cache_verify_reads = CONFIG_VERIFY_ALWAYS;
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
	cfg->cache_verify_reads = CONFIG_VERIFY_FILL;
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	cache_get_stats(c, &st);
	CHECK_INT(st.passthrough_opens, 7);
	CHECK_INT(cache_open_passthrough(c, NULL, &fd), -EINVAL);
	cache_close(c);
	free(got);
	free(data);
}

/* The access time o's header holds reaches t within a few seconds. */
static bool atime_reaches(struct cache *c, const struct cache_object *obj,
			  uint64_t t)
{
	uint64_t at = 0;

	for (int i = 0; i < 300; i++) {
		if (cache_object_atime(c, obj, &at) == 0 && at >= t)
			return true;
		usleep(10000);
	}
	fprintf(stderr, "access time %llu, wanted %llu or later\n",
		(unsigned long long)at, (unsigned long long)t);
	return false;
}

/*
 * Access times (eviction's recency) are recorded by reads and passthrough
 * opens, at most once a second, and survive the cache's close.
 */
static void test_access_time(void)
{
	struct cache_object obj = { .dataset = "at" };
	char etag[128];
	size_t size = 3 * BS;
	char *data = put_src("at.bin", size, &obj, etag);
	struct cache *c = open_cache();
	uint64_t t;
	int fd = -1;

	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK(atime_reaches(c, &obj, (uint64_t)time(NULL) - 1));
	sleep(2); /* past CACHE_ATIME_STEP */
	t = (uint64_t)time(NULL);
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	CHECK(atime_reaches(c, &obj, t));
	/* Read, then closed at once. */
	sleep(2);
	t = (uint64_t)time(NULL);
	CHECK(read_eq(c, &obj, data, BS, BS));
	cache_close(c);
	c = open_cache();
	CHECK(atime_reaches(c, &obj, t));
	cache_close(c);
	free(data);
}

/* Whether cache_object_check finds bad damaged blocks among present. */
static bool check_is(struct cache *c, const struct cache_object *obj,
		     uint64_t bad, uint64_t present)
{
	struct cache_check chk = { 0 };

	if (cache_object_check(c, obj, &chk) || chk.bad != bad ||
	    chk.present != present) {
		fprintf(stderr, "check: bad %llu present %llu\n",
			(unsigned long long)chk.bad,
			(unsigned long long)chk.present);
		return false;
	}
	return true;
}

/*
 * A damaged block found by a check (stager verify --cache, the scrub) in
 * any process takes its object out of passthrough at once, and stays
 * reported as damaged, not missing, until a read fetches it again; one a
 * read found but could not fetch again stays damaged too (issue 31).
 */
static void test_damaged_mark(void)
{
	struct cache_object obj = { .dataset = "dmg" };
	struct cache_object obj2 = { .dataset = "dmg2" };
	char etag[128], etag2[128], path[4096];
	size_t size = 6 * BS + 10;
	char *data = put_src("dmg.bin", size, &obj, etag);
	char *data2 = put_src("dmg2.bin", size, &obj2, etag2);
	char *got = malloc(size);
	struct cache *c = open_cache(), *c2;
	uint64_t present = 0;
	int fd = -1;

	CHECK(got);
	CHECK(read_eq(c, &obj, data, 0, size));
	/* Whole: remembered so under this damage generation. */
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	flip_byte_in("dmg", 3, 11);
	c2 = open_cache(); /* another process's check */
	CHECK(check_is(c2, &obj, 1, 7));
	cache_close(c2);
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
	/* Still damaged, not missing, in a later check. */
	CHECK(check_is(c, &obj, 1, 7));
	CHECK_INT(cache_object_present(c, &obj, &present), 0);
	CHECK_INT(present, size - BS);
	/* A read fetches it again: the right bytes, then sound and whole. */
	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK(check_is(c, &obj, 0, 7));
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	CHECK_INT(pread(fd, got, size, 0), (ssize_t)size);
	CHECK(!memcmp(got, data, size));
	close(fd);

	/* Found by a read whose fetch fails (the source is gone): the block
	 * is left damaged, never trusted again. */
	CHECK(read_eq(c, &obj2, data2, 0, size));
	cache_close(c);
	flip_byte_in("dmg2", 2, 5);
	snprintf(path, sizeof(path), "%s/dmg2.bin", srcdir);
	CHECK_INT(unlink(path), 0);
	c = open_cache();
	CHECK(cache_read(c, &obj2, BS, 2 * BS, got) < 0);
	CHECK_INT(cache_open_passthrough(c, &obj2, &fd), -EAGAIN);
	CHECK(check_is(c, &obj2, 1, 7));
	cache_close(c);
	free(got);
	free(data);
	free(data2);
}

/* cache_read_iov's bytes compared with the source's (struct iov_cmp). */
struct iov_cmp {
	const char *want;
	uint64_t off;
	bool ok;
};

static int iov_cmp_fn(void *arg, const struct iovec *iov, int n)
{
	struct iov_cmp *w = arg;

	for (int i = 0; i < n; i++) {
		if (memcmp(iov[i].iov_base, w->want + w->off, iov[i].iov_len))
			w->ok = false;
		w->off += iov[i].iov_len;
	}
	return 0;
}

/* The data file of the object cached under dataset ds. */
static bool data_file_stat(const char *ds, struct stat *st)
{
	uint64_t data_off = 0;
	int fd = cachetest_obj_file(cachedir, ds, &data_off);
	bool ok = fd >= 0 && fstat(fd, st) == 0;

	if (fd >= 0)
		close(fd);
	return ok;
}

/*
 * CACHE_READ_WHOLE (stager stage): the first read of an object with nothing
 * on disk allocates its whole room in its file first, the file's size left
 * to its blocks (passthrough reads it to its end); the bytes are the
 * source's. Without the flag the file holds what was filled.
 */
static void test_prealloc(void)
{
	struct cache_object obj = { .dataset = "pre" };
	struct cache_object obj2 = { .dataset = "pre2" };
	char etag[128], etag2[128], *buf = malloc(200 * BS);
	size_t size = 100 * BS + 7;
	char *data = put_src("pre.bin", size, &obj, etag);
	char *data2 = put_src("pre2.bin", size, &obj2, etag2);
	uint64_t ra = cfg->cache_readahead_max;
	struct iov_cmp w = { data, 0, true };
	struct cache *c;
	struct stat st;

	CHECK(buf);
	cfg->cache_readahead_max = 0; /* only what is read is filled */
	c = open_cache();
	CHECK_INT(cache_read_iov(c, &obj, 0, BS, buf,
				 CACHE_READ_DIRECT | CACHE_READ_WHOLE,
				 iov_cmp_fn, &w),
		  0);
	CHECK(w.ok && w.off == BS);
	CHECK(data_file_stat("pre", &st));
	CHECK((uint64_t)st.st_blocks * 512 >= size);
	CHECK_INT(st.st_size, BS);
	/* Read on to the end: the source's bytes, the file the object's. */
	CHECK_INT(cache_read_iov(c, &obj, BS, size - BS, buf,
				 CACHE_READ_DIRECT | CACHE_READ_WHOLE,
				 iov_cmp_fn, &w),
		  0);
	CHECK(w.ok && w.off == size);
	CHECK(data_file_stat("pre", &st));
	CHECK_INT(st.st_size, (off_t)size);
	/* Without the flag: what was filled, no more. */
	w = (struct iov_cmp){ data2, 0, true };
	CHECK_INT(cache_read_iov(c, &obj2, 0, BS, buf, CACHE_READ_DIRECT,
				 iov_cmp_fn, &w),
		  0);
	CHECK(w.ok);
	CHECK(data_file_stat("pre2", &st));
	CHECK((uint64_t)st.st_blocks * 512 < 10 * BS);
	cache_close(c);
	cfg->cache_readahead_max = ra;
	free(buf);
	free(data);
	free(data2);
}

/*
 * A cache whose damage generation cannot be shared (damage.gen cannot be
 * made or mapped: here a directory stands at its name) still opens, and
 * every passthrough open reads its object's records: a record another
 * process clears is seen at this process's next open.
 */
static void test_gen_unshared(void)
{
	struct cache_object obj = { .dataset = "nogen" };
	char *saved = cfg->cache_dir;
	char dir[400], gen[450], etag[128];
	size_t size = 5 * BS + 3;
	char *data = put_src("nogen.bin", size, &obj, etag);
	struct cache *c, *c2;
	int fd = -1;

	snprintf(dir, sizeof(dir), "%s/cache-nogen", tmp);
	snprintf(gen, sizeof(gen), "%s/damage.gen", dir);
	CHECK_INT(mkdir(dir, 0700), 0);
	CHECK_INT(mkdir(gen, 0700), 0);
	cfg->cache_dir = dir;
	c = open_cache();
	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	c2 = open_cache();
	CHECK_INT(cache_object_forget_block(c2, &obj, 2), 0);
	cache_close(c2);
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), -EAGAIN);
	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK_INT(cache_open_passthrough(c, &obj, &fd), 0);
	close(fd);
	cache_close(c);
	cfg->cache_dir = saved;
	free(data);
}

/* What a child of test_refused checks (sysfail.h). */
struct refused {
	const struct cache_object *obj;
	const char *data;
	size_t size;
};

/* O_NOATIME refused (the kernel's answer to a process that does not own
 * the file): the passthrough open hands over a descriptor without it. */
static void noatime_refused_child(void *arg)
{
	const struct refused *r = arg;
	char *got = malloc(r->size + 1);
	struct cache *c;
	int fd = -1;

	if (!got || sysfail(SYS_openat, EPERM, SYSFAIL_ARG_HAS, 2, O_NOATIME))
		_exit(SYSFAIL_SKIP);
	c = open_cache();
	CHECK_INT(cache_open_passthrough(c, r->obj, &fd), 0);
	CHECK(fd >= 0 && !(fcntl(fd, F_GETFL) & O_NOATIME));
	CHECK_INT(pread(fd, got, r->size + 1, 0), (ssize_t)r->size);
	CHECK(!memcmp(got, r->data, r->size));
	close(fd);
	cache_close(c);
	free(got);
}

/* A damaged block whose mark cannot be written (every 16-byte pwrite, a
 * record's, fails) and whose source is gone: the read fails, and this
 * process never passes the object through, though its records say valid. */
static void mark_refused_child(void *arg)
{
	const struct refused *r = arg;
	char *got = malloc(r->size);
	struct cache *c;
	int fd = -1;

	if (!got || sysfail(SYS_pwrite64, EIO, SYSFAIL_ARG_EQ, 2, 16))
		_exit(SYSFAIL_SKIP);
	c = open_cache();
	CHECK(cache_read(c, r->obj, BS, 2 * BS, got) < 0);
	CHECK_INT(cache_open_passthrough(c, r->obj, &fd), -EAGAIN);
	CHECK(read_eq(c, r->obj, r->data, 0, BS));
	CHECK_INT(cache_open_passthrough(c, r->obj, &fd), -EAGAIN);
	cache_close(c);
	free(got);
}

/* fallocate refused (a file system without it): a stage's read fills the
 * object all the same, block by block. */
static void fallocate_refused_child(void *arg)
{
	const struct refused *r = arg;
	char *buf = malloc(r->size);
	struct iov_cmp w = { r->data, 0, true };
	struct cache *c;
	struct stat st;

	if (!buf || sysfail(SYS_fallocate, EOPNOTSUPP, SYSFAIL_ALWAYS, -1, 0))
		_exit(SYSFAIL_SKIP);
	cfg->cache_readahead_max = 0;
	c = open_cache();
	CHECK_INT(cache_read_iov(c, r->obj, 0, r->size, buf,
				 CACHE_READ_DIRECT | CACHE_READ_WHOLE,
				 iov_cmp_fn, &w),
		  0);
	CHECK(w.ok && w.off == r->size);
	CHECK(data_file_stat(r->obj->dataset, &st));
	CHECK_INT(st.st_size, (off_t)r->size);
	cache_close(c);
	free(buf);
}

/* The system calls the cache's failure paths answer, made to fail in a
 * child process each (tests/unit/sysfail.h). */
static void test_refused(void)
{
	struct cache_object a = { .dataset = "noat" };
	struct cache_object b = { .dataset = "unmk" };
	struct cache_object p = { .dataset = "nofa" };
	char etag[3][128], path[4096];
	size_t size = 6 * BS + 10, psize = 100 * BS + 7;
	char *da = put_src("noat.bin", size, &a, etag[0]);
	char *db = put_src("unmk.bin", size, &b, etag[1]);
	char *dp = put_src("nofa.bin", psize, &p, etag[2]);
	struct refused r;
	struct cache *c = open_cache();
	int fd = -1;

	CHECK(read_eq(c, &a, da, 0, size));
	CHECK(read_eq(c, &b, db, 0, size));
	cache_close(c);
	r = (struct refused){ &a, da, size };
	sysfail_child("O_NOATIME refused", noatime_refused_child, &r);

	flip_byte_in("unmk", 2, 9);
	snprintf(path, sizeof(path), "%s/unmk.bin", srcdir);
	CHECK_INT(unlink(path), 0);
	r = (struct refused){ &b, db, size };
	if (sysfail_child("record write refused", mark_refused_child, &r)) {
		/* Where the write works, the mark is made: no process passes
		 * the object through. */
		c = open_cache();
		CHECK(check_is(c, &b, 1, 7));
		CHECK_INT(cache_open_passthrough(c, &b, &fd), -EAGAIN);
		cache_close(c);
	}

	r = (struct refused){ &p, dp, psize };
	sysfail_child("fallocate refused", fallocate_refused_child, &r);
	free(da);
	free(db);
	free(dp);
}

static void test_corruption(void)
{
	struct cache_object obj = { .dataset = "flip" };
	char etag[128];
	size_t size = 20 * BS;
	char *data = put_src("flip.bin", size, &obj, etag);
	struct cache *c = open_cache();
	struct cache_stats st;

	CHECK(read_eq(c, &obj, data, 0, size));
	cache_close(c);
	flip_byte(5, 7);
	c = open_cache();
	CHECK(read_eq(c, &obj, data, 5 * BS, 100));
	CHECK(read_eq(c, &obj, data, 0, size));
	cache_get_stats(c, &st);
	CHECK_INT(st.checksum_failures, 1);
	CHECK_INT(st.fetches, 1);
	cache_close(c);

	/* A fresh process's zero-copy descriptors: blocks are checked in
	 * place first, and a damaged one is refused (the copying path
	 * repairs it), never handed out. */
	flip_byte(9, 3);
	c = open_cache();
	{
		char buf[2 * BS];
		uint64_t fd_off = 0;
		int fd = -1;

		CHECK_INT(cache_read_fd(c, &obj, 2 * BS + 5, 2 * BS, &fd,
					&fd_off),
			  0);
		CHECK_INT(pread(fd, buf, 2 * BS, (off_t)fd_off), 2 * BS);
		CHECK(!memcmp(buf, data + 2 * BS + 5, 2 * BS));
		close(fd);
		CHECK_INT(cache_read_fd(c, &obj, 9 * BS, BS, &fd, &fd_off),
			  -EAGAIN);
		CHECK(read_eq(c, &obj, data, 9 * BS, BS));
		CHECK_INT(cache_read_fd(c, &obj, 9 * BS, BS, &fd, &fd_off), 0);
		CHECK_INT(pread(fd, buf, BS, (off_t)fd_off), BS);
		CHECK(!memcmp(buf, data + 9 * BS, BS));
		close(fd);
		cache_get_stats(c, &st);
		CHECK_INT(st.checksum_failures, 1);
		CHECK_INT(st.fetches, 1);
	}
	cache_close(c);
	/* Repaired on disk: the next process reads it clean. */
	c = open_cache();
	CHECK(read_eq(c, &obj, data, 0, size));
	cache_get_stats(c, &st);
	CHECK_INT(st.checksum_failures, 0);
	CHECK_INT(st.fetches, 0);
	cache_close(c);
	free(data);
}

static void test_stale(void)
{
	struct cache_object obj = { 0 }, obj2 = { 0 };
	char etag[128], etag2[128];
	size_t size = 10 * BS;
	char *data = put_src("stale.bin", size, &obj, etag);
	struct cache *c = open_cache();
	char *buf = malloc(size);

	CHECK(read_eq(c, &obj, data, 0, 2 * BS));
	usleep(20000);
	char *data2 = put_src("stale.bin", size, &obj2, etag2);

	/* Uncached part: EIO, whole read fails, no mixed bytes. */
	CHECK_INT(cache_read(c, &obj, 0, size, buf), -EIO);
	CHECK_INT(cache_read(c, &obj, 5 * BS, 10, buf), -EIO);
	/* The new version reads as the new bytes. */
	CHECK(read_eq(c, &obj2, data2, 0, size));
	cache_close(c);
	free(buf);
	free(data);
	free(data2);
}

struct reader {
	struct cache *c;
	struct cache_object *obj;
	const char *data;
	unsigned seed;
	bool ok;
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;
	size_t size = r->obj->size;
	char *buf = malloc(size);

	r->ok = true;
	for (int i = 0; i < 64; i++) {
		uint64_t off = (uint64_t)rand_r(&r->seed) % size;
		size_t len = (size_t)rand_r(&r->seed) % (4 * BS) + 1;
		ssize_t got = cache_read(r->c, r->obj, off, len, buf);

		if (got < 0 || memcmp(buf, r->data + off, (size_t)got))
			r->ok = false;
	}
	if (cache_read(r->c, r->obj, 0, size, buf) != (ssize_t)size ||
	    memcmp(buf, r->data, size))
		r->ok = false;
	free(buf);
	return NULL;
}

static void test_threads(void)
{
	struct cache_object obj = { 0 };
	char etag[128];
	size_t size = 64 * BS + 5;
	char *data = put_src("shared.bin", size, &obj, etag);
	struct cache *c = open_cache();
	struct reader r[8];
	pthread_t t[8];
	struct cache_stats st;

	for (int i = 0; i < 8; i++) {
		r[i] = (struct reader){ c, &obj, data, (unsigned)i + 1, false };
		pthread_create(&t[i], NULL, reader_main, &r[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		CHECK(r[i].ok);
	}
	cache_get_stats(c, &st);
	CHECK_INT(st.fetches, 65);
	cache_close(c);
	free(data);
}

static void test_readahead(void)
{
	struct cache_object obj = { 0 }, obj2 = { 0 };
	char etag[128], etag2[128];
	size_t size = 200 * BS;
	char *data = put_src("seq.bin", size, &obj, etag);
	char *data2 = put_src("rand.bin", size, &obj2, etag2);
	struct cache *c = open_cache();
	struct cache_stats st;
	uint64_t present = 0;

	/* Random: exactly the blocks read. */
	for (int i = 0; i < 20; i++)
		CHECK(read_eq(c, &obj2, data2, (rnd() % 100) * 2 * BS + 100,
			      10));
	cache_get_stats(c, &st);
	CHECK(st.fetches <= 20);
	CHECK_INT(cache_object_present(c, &obj2, &present), 0);
	CHECK_INT(present, st.fetches * BS);
	/* Sequential: blocks beyond the reads arrive. */
	for (uint64_t off = 0; off < 40 * BS; off += BS / 2)
		CHECK(read_eq(c, &obj, data, off, BS / 2));
	for (int i = 0; i < 100; i++) {
		CHECK_INT(cache_object_present(c, &obj, &present), 0);
		if (present > 40 * BS)
			break;
		usleep(10000);
	}
	CHECK(present > 40 * BS);
	CHECK(present <= (40 + 16) * BS);
	cache_close(c);
	free(data);
	free(data2);
}

static void test_eviction(void)
{
	struct catalog *cat = NULL;
	struct cache_object o[6];
	char etags[6][128], *d[6];
	const char *names[6] = { "pin", "low", "high", "quota", "low", "high" };
	const char *keys[6] = { "p", "l1", "h1", "q", "l2", "h2" };
	struct dstage_config saved = *cfg;
	struct cache *c;
	struct cache_stats st;
	uint64_t present[6];

	CHECK_INT(catalog_open(catpath, CATALOG_CREATE, &cat), 0);
	for (int i = 0; i < 4; i++)
		CHECK_INT(
			catalog_dataset_add(cat, names[i], "file:///x/", NULL),
			0);
	CHECK_INT(catalog_dataset_set_pinned(cat, "pin", true), 0);
	CHECK_INT(catalog_dataset_set_priority(cat, "high", 10), 0);
	CHECK_INT(catalog_dataset_set_priority(cat, "low", -5), 0);
	CHECK_INT(catalog_dataset_set_priority(cat, "quota", 20), 0);
	CHECK_INT(catalog_dataset_set_quota(cat, "quota", 40 * BS), 0);

	/* A fresh cache of 256 blocks; each object 60 blocks. */
	snprintf(cachedir, sizeof(cachedir), "%s/cache-evict", tmp);
	cfg->cache_dir = cachedir;
	cfg->cache_size = 256 * BS;
	cfg->catalog_path = catpath;
	cfg->cache_readahead_max = 0;
	c = open_cache();
	for (int i = 0; i < 6; i++) {
		memset(&o[i], 0, sizeof(o[i]));
		o[i].dataset = names[i];
		d[i] = put_src(keys[i], 60 * BS, &o[i], etags[i]);
	}
	/* pin, l1, h1, q (quota: at most 40 blocks kept). */
	for (int i = 0; i < 4; i++) {
		CHECK(read_eq(c, &o[i], d[i], 0, 60 * BS));
		sleep(1); /* distinct access times */
	}
	CHECK_INT(cache_object_present(c, &o[3], &present[3]), 0);
	CHECK(present[3] <= 40 * BS);
	/* l2, h2 push over the high mark: "low" goes first, pins stay. */
	CHECK(read_eq(c, &o[4], d[4], 0, 60 * BS));
	CHECK(read_eq(c, &o[5], d[5], 0, 60 * BS));
	for (int i = 0; i < 6; i++)
		CHECK_INT(cache_object_present(c, &o[i], &present[i]), 0);
	CHECK_INT(present[0], 60 * BS); /* pinned */
	CHECK_INT(present[1], 0); /* low priority, oldest: evicted */
	CHECK_INT(present[5], 60 * BS); /* newest high */
	cache_get_stats(c, &st);
	CHECK(st.evictions > 0);
	CHECK(st.used <= cfg->cache_size);

	/* Everything pinned: reads stream through and succeed. */
	CHECK_INT(catalog_dataset_set_pinned(cat, "low", true), 0);
	CHECK_INT(catalog_dataset_set_pinned(cat, "high", true), 0);
	CHECK_INT(catalog_dataset_set_pinned(cat, "quota", true), 0);
	sleep(3); /* policy TTL */
	for (int k = 0; k < 3; k++) {
		static char key[3][8];
		struct cache_object x = { .dataset = "pin" };
		char et[128];
		char *dx;

		snprintf(key[k], sizeof(key[k]), "x%d", k);
		dx = put_src(key[k], 60 * BS, &x, et);
		CHECK(read_eq(c, &x, dx, 0, 60 * BS));
		free(dx);
	}
	cache_get_stats(c, &st);
	CHECK(st.streamed > 0);
	CHECK(st.used <= cfg->cache_size);
	cache_close(c);
	catalog_close(cat);
	for (int i = 0; i < 6; i++)
		free(d[i]);
	*cfg = saved;
}

/* Whether fills will write with O_DIRECT here (cachetest.h). */
static bool direct_writes(void)
{
	return cachetest_direct_writes(tmp);
}

static int iov_sink_fail(void *arg, const struct iovec *iov, int n)
{
	(void)arg;
	(void)iov;
	(void)n;
	return -EPIPE;
}

/*
 * cache_read_iov: a cold sequential read hands out bytes straight from the
 * fills that landed (no copy) at least sometimes; all bytes equal the
 * source, cold and warm (from the bounce buffer); past the end fn gets no
 * iovec; fn's error is returned.
 */
static void test_read_iov(void)
{
	struct cache_object obj = { 0 };
	char etag[128];
	size_t size = 512 * BS + 77, chunk = 2 * BS + 100;
	char *data = put_src("iov.bin", size, &obj, etag);
	char *got = malloc(size), *buf = malloc(chunk);
	struct cache *c = open_cache();

	for (int pass = 0; pass < 3; pass++) {
		struct iov_sink k = { .out = got, .buf = buf, .len = chunk };
		unsigned flags = pass == 2 ? CACHE_READ_DIRECT : 0;

		memset(got, 0, size);
		for (uint64_t off = 0; off < size; off += chunk)
			CHECK_INT(cache_read_iov(c, &obj, off, chunk, buf,
						 flags, iov_sink_fn, &k),
				  0);
		CHECK_INT(k.at, size);
		CHECK(!memcmp(got, data, size));
		if (pass == 0) /* cold: some of it from landed fills */
			CHECK(k.zero_copy > 0);
		else if (pass == 1) /* warm, through buf */
			CHECK_INT(k.zero_copy, 0);
		else if (direct_writes()) /* direct reads */
			CHECK(k.zero_copy > k.calls / 2);
		k.calls = k.empty = 0;
		CHECK_INT(cache_read_iov(c, &obj, size, 10, buf, flags,
					 iov_sink_fn, &k),
			  0);
		CHECK_INT(k.empty, 1);
		/* Restart: no landed fills, nothing verified. */
		cache_close(c);
		c = open_cache();
	}
	CHECK_INT(cache_read_iov(c, &obj, 0, 10, buf, 0, iov_sink_fail, NULL),
		  -EPIPE);
	CHECK_INT(cache_read_iov(c, &obj, 0, 2 * BS, buf, CACHE_READ_DIRECT,
				 iov_sink_fail, NULL),
		  -EPIPE);
	cache_close(c);
	free(got);
	free(buf);
	free(data);
}

/*
 * The object files this process holds open (readlink of /proc/self/fd),
 * as a sorted list of at most max paths; returns how many.
 */
static size_t open_objects(char (*paths)[400], size_t max)
{
	char objs[400], link[300], *target = malloc(400);
	size_t n = 0, olen;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;

	snprintf(objs, sizeof(objs), "%s/objects/", cachedir);
	olen = strlen(objs);
	while (d && target && (de = readdir(d))) {
		ssize_t r;
		size_t i;

		snprintf(link, sizeof(link), "/proc/self/fd/%s", de->d_name);
		r = readlink(link, target, 399);
		if (r <= 0)
			continue;
		target[r] = '\0';
		/* data files (each object's sidecar is open beside it) */
		if (strncmp(target, objs, olen) ||
		    !strchr(target + olen, '/') || strstr(target, ".meta"))
			continue;
		for (i = 0; i < n && strcmp(paths[i], target); i++)
			;
		if (i == n && n < max)
			snprintf(paths[n++], sizeof(*paths), "%s", target);
	}
	if (d)
		closedir(d);
	free(target);
	qsort(paths, n, sizeof(*paths),
	      (int (*)(const void *, const void *))strcmp);
	return n;
}

/* The one path in a (n) that b (m) lacks, or NULL. */
static const char *only_in(char (*a)[400], size_t n, char (*b)[400], size_t m)
{
	const char *found = NULL;

	for (size_t i = 0; i < n; i++) {
		size_t j = 0;

		while (j < m && strcmp(a[i], b[j]))
			j++;
		if (j == m) {
			if (found)
				return NULL;
			found = a[i];
		}
	}
	return found;
}

/*
 * The open-object table: with RLIMIT_NOFILE at 768 the cache keeps 128
 * idle objects open, the least recently used closed first. 300 objects
 * read: exactly 128 files stay open; the 128 newest read again open
 * nothing; the oldest read again opens its file and closes the one that
 * went idle first, which is the next one reopened.
 */
#define OT_N 300
#define OT_KEEP 128
static void test_open_table(void)
{
	static struct cache_object obj[OT_N];
	static char keys[OT_N][32], etags[OT_N][OBJSTORE_ETAG_MAX];
	static char before[OT_N][400], after[OT_N][400], again[OT_N][400];
	char *data[OT_N];
	struct rlimit saved, rl;
	struct cache *c;
	size_t n0, n1, n2;
	const char *closed, *opened;
	char was[400];

	/* A cache of its own, far from full: an eviction would close every
	 * idle object (test_eviction left a small size behind). */
	snprintf(cachedir, sizeof(cachedir), "%s/cache-open", tmp);
	cfg->cache_dir = cachedir;
	cfg->cache_size = 1ULL << 30;
	CHECK_INT(getrlimit(RLIMIT_NOFILE, &saved), 0);
	rl = saved;
	rl.rlim_cur = 6 * OT_KEEP;
	CHECK_INT(setrlimit(RLIMIT_NOFILE, &rl), 0);
	c = open_cache();
	for (unsigned i = 0; i < OT_N; i++) {
		snprintf(keys[i], sizeof(keys[i]), "ot/%03u", i);
		obj[i] = (struct cache_object){ 0 };
		data[i] = put_src(keys[i], 3000 + i, &obj[i], etags[i]);
		CHECK(read_eq(c, &obj[i], data[i], 0, obj[i].size));
	}
	n0 = open_objects(before, OT_N);
	CHECK_INT((int)n0, OT_KEEP);
	for (unsigned i = OT_N - OT_KEEP; i < OT_N; i++)
		CHECK(read_eq(c, &obj[i], data[i], 0, obj[i].size));
	n1 = open_objects(after, OT_N);
	CHECK_INT((int)n1, OT_KEEP);
	CHECK(only_in(before, n0, after, n1) == NULL);
	/* The oldest, closed long ago: opened again, and the first of the
	 * newest (idle the longest now) closed for it. */
	CHECK(read_eq(c, &obj[0], data[0], 0, obj[0].size));
	n2 = open_objects(again, OT_N);
	CHECK_INT((int)n2, OT_KEEP);
	closed = only_in(after, n1, again, n2);
	opened = only_in(again, n2, after, n1);
	CHECK(closed && opened);
	{
		/* paths are at most 399 bytes (open_objects): a bounded copy
		 * (snprintf's %s trips gcc's -Wformat-truncation at -O2) */
		size_t l = closed ? strnlen(closed, sizeof(was) - 1) : 0;

		memcpy(was, closed ? closed : "", l);
		was[l] = '\0';
	}
	CHECK(read_eq(c, &obj[OT_N - OT_KEEP], data[OT_N - OT_KEEP], 0,
		      obj[OT_N - OT_KEEP].size));
	n1 = open_objects(after, OT_N);
	opened = only_in(after, n1, again, n2);
	CHECK(opened && !strcmp(opened, was));
	cache_close(c);
	CHECK_INT((int)open_objects(after, OT_N), 0);
	CHECK_INT(setrlimit(RLIMIT_NOFILE, &saved), 0);
	for (unsigned i = 0; i < OT_N; i++)
		free(data[i]);
}

/* A passthrough open of obj: 0 and its bytes right, or the open's error. */
static int pt_open_eq(struct cache *c, const struct cache_object *obj,
		      const char *want, int *keep)
{
	char *got = malloc(obj->size + 1);
	int fd = -1, ret = cache_open_passthrough(c, obj, &fd);

	CHECK(got);
	if (ret == 0) {
		CHECK_INT(pread(fd, got, obj->size + 1, 0), (ssize_t)obj->size);
		CHECK(!memcmp(got, want, obj->size));
		if (keep)
			*keep = fd;
		else
			close(fd);
	}
	free(got);
	return ret;
}

static uint64_t remembered(struct cache *c)
{
	struct cache_stats st;

	cache_get_stats(c, &st);
	return st.passthrough_remembered;
}

/*
 * The memo of objects found whole (lib/cache/cache_whole.c): with
 * RLIMIT_NOFILE at 384 the cache keeps 64 objects open; of 80 opened in
 * passthrough the 16 first are closed, and their next passthrough opens
 * are answered from the memo (no records read), with the right bytes and
 * the in-use lock held. The memo is not trusted for a data file written
 * since (its change time), after a record was made invalid by another
 * process (the damage generation), for a file made again after an
 * eviction (a partial one of the object's size, maybe on the same inode),
 * nor with verify_reads = always; it records access times as the long
 * way does. A new damage generation makes every entry stale at once.
 */
#define WM_N 80
#define WM_OUT 16
static void test_whole_memo(void)
{
	static struct cache_object obj[WM_N];
	static char keys[WM_N][32], dss[WM_N][16], etags[WM_N][128];
	char *data[WM_N], *saved_dir = cfg->cache_dir;
	struct rlimit saved, rl;
	struct cache *c, *c2;
	uint64_t n0, t;
	int fd = -1;

	snprintf(cachedir, sizeof(cachedir), "%s/cache-whole", tmp);
	cfg->cache_dir = cachedir;
	CHECK_INT(getrlimit(RLIMIT_NOFILE, &saved), 0);
	rl = saved;
	rl.rlim_cur = 6 * 64;
	CHECK_INT(setrlimit(RLIMIT_NOFILE, &rl), 0);
	c = open_cache();
	for (unsigned i = 0; i < WM_N; i++) {
		snprintf(keys[i], sizeof(keys[i]), "wm/%03u", i);
		snprintf(dss[i], sizeof(dss[i]), "wm%03u", i);
		obj[i] = (struct cache_object){ .dataset = dss[i] };
		data[i] =
			put_src(keys[i], 2 * BS + 7 * i + 1, &obj[i], etags[i]);
		CHECK(read_eq(c, &obj[i], data[i], 0, obj[i].size));
		CHECK_INT(pt_open_eq(c, &obj[i], data[i], NULL), 0);
	}
	CHECK_INT(remembered(c), 0);
	for (unsigned i = 0; i < WM_OUT; i++)
		CHECK_INT(pt_open_eq(c, &obj[i], data[i], NULL), 0);
	CHECK_INT(remembered(c), WM_OUT);
	/* Its descriptor holds the in-use lock: no other process drops it. */
	c2 = open_cache();
	CHECK_INT(pt_open_eq(c, &obj[0], data[0], &fd), 0);
	CHECK_INT(cache_object_drop(c2, &obj[0]), -EBUSY);
	close(fd);
	/* The access time, as the long way records it. */
	sleep(2); /* past CACHE_ATIME_STEP */
	t = (uint64_t)time(NULL);
	CHECK_INT(pt_open_eq(c, &obj[7], data[7], NULL), 0);
	CHECK_INT(remembered(c), WM_OUT + 2);
	CHECK(atime_reaches(c, &obj[7], t));
	n0 = remembered(c);
	/* Written since (a flipped byte: the scrub's business, but the file
	 * changed): the records are read again, still whole. */
	flip_byte_in(dss[1], 0, 3);
	CHECK_INT(cache_open_passthrough(c, &obj[1], &fd), 0);
	close(fd);
	CHECK_INT(remembered(c), n0);
	/* A record cleared by another process: not whole, and the memo of
	 * every object is checked against the new generation. */
	CHECK_INT(cache_object_forget_block(c2, &obj[2], 1), 0);
	CHECK_INT(pt_open_eq(c, &obj[2], data[2], NULL), -EAGAIN);
	CHECK_INT(pt_open_eq(c, &obj[3], data[3], NULL), 0);
	CHECK_INT(remembered(c), n0);
	/* Evicted by another process and made again with its last block
	 * alone (the file has the object's size, maybe the old inode). */
	CHECK_INT(cache_object_drop(c2, &obj[4]), 0);
	CHECK(read_eq(c2, &obj[4], data[4], 2 * BS, obj[4].size - 2 * BS));
	CHECK_INT(pt_open_eq(c, &obj[4], data[4], NULL), -EAGAIN);
	CHECK_INT(remembered(c), n0);
	cache_close(c2);
	/* verify_reads = always: no passthrough, memo or not. */
	cfg->cache_verify_reads = CONFIG_VERIFY_ALWAYS;
	CHECK_INT(pt_open_eq(c, &obj[5], data[5], NULL), -EAGAIN);
	cfg->cache_verify_reads = CONFIG_VERIFY_FILL;
	cache_close(c);
	CHECK_INT(setrlimit(RLIMIT_NOFILE, &saved), 0);
	cfg->cache_dir = saved_dir;
	for (unsigned i = 0; i < WM_N; i++)
		free(data[i]);
}

/* The mark refused by the file system (fsetxattr and fgetxattr fail
 * with EOPNOTSUPP): the object is still marked whole (1), a fresh
 * process's open goes the long way, right. */
static void mark_refused_fs_child(void *arg)
{
	const struct refused *r = arg;
	struct cache *c;

	if (sysfail(SYS_fsetxattr, EOPNOTSUPP, SYSFAIL_ALWAYS, -1, 0) ||
	    sysfail(SYS_fgetxattr, EOPNOTSUPP, SYSFAIL_ALWAYS, -1, 0))
		_exit(SYSFAIL_SKIP);
	c = open_cache();
	CHECK_INT(cache_object_mark_whole(c, r->obj), 1);
	cache_close(c);
	c = open_cache();
	CHECK_INT(pt_open_eq(c, r->obj, r->data, NULL), 0);
	CHECK_INT(remembered(c), 0);
	cache_close(c);
}

/* O_NOATIME refused (cache files another user owns): the memo's open
 * tries again without it, and the object is still answered from its mark
 * (a retry missing there would send every such open the long way). */
static void mark_noatime_child(void *arg)
{
	const struct refused *r = arg;
	struct cache *c;
	int fd = -1;

	if (sysfail(SYS_openat, EPERM, SYSFAIL_ARG_HAS, 2, O_NOATIME))
		_exit(SYSFAIL_SKIP);
	c = open_cache();
	CHECK_INT(pt_open_eq(c, r->obj, r->data, &fd), 0);
	CHECK_INT(remembered(c), 1);
	CHECK(fd >= 0 && !(fcntl(fd, F_GETFL) & O_NOATIME));
	if (fd >= 0)
		close(fd);
	cache_close(c);
}

/* A failure of the memo's access-time write, made in a child (the time
 * recorded last at least CACHE_ATIME_STEP old): whether the memo still
 * hands the file over (remembered: 1, the sidecar then unwritten) or
 * leaves the open to the long way (0), which passes it through all the
 * same and records the time in the sidecar. */
struct memo_fail {
	const struct refused *r;
	long nr;
	int err;
	enum sysfail_when when;
	uint32_t val;
	uint64_t remembered;
};

static void mark_touch_child(void *arg)
{
	const struct memo_fail *f = arg;
	struct stat st0, st1;
	char meta[400];
	struct cache *c;
	bool written;

	if (!cachetest_meta_path(cachedir, f->r->obj->dataset, meta,
				 sizeof(meta)) ||
	    stat(meta, &st0) || sysfail(f->nr, f->err, f->when, 2, f->val))
		_exit(SYSFAIL_SKIP);
	c = open_cache();
	CHECK_INT(pt_open_eq(c, f->r->obj, f->r->data, NULL), 0);
	CHECK_INT(remembered(c), f->remembered);
	cache_close(c);
	CHECK_INT(stat(meta, &st1), 0);
	written = st1.st_mtim.tv_sec != st0.st_mtim.tv_sec ||
		  st1.st_mtim.tv_nsec != st0.st_mtim.tv_nsec;
	CHECK(written == !f->remembered);
}

/* The mark cannot be written for want of space (ENOSPC, not a file
 * system without attributes): r->obj, written since its mark, is passed
 * through the long way and left unmarked, and the other object's mark
 * (r[1]) is still read by the same process. */
static void mark_nospace_child(void *arg)
{
	const struct refused *r = arg;
	struct cache *c;

	if (sysfail(SYS_fsetxattr, ENOSPC, SYSFAIL_ALWAYS, -1, 0))
		_exit(SYSFAIL_SKIP);
	flip_byte_in(r[0].obj->dataset, 0, 0);
	flip_byte_in(r[0].obj->dataset, 0, 0);
	c = open_cache();
	CHECK_INT(pt_open_eq(c, r[0].obj, r[0].data, NULL), 0);
	CHECK_INT(remembered(c), 0);
	CHECK_INT(pt_open_eq(c, r[1].obj, r[1].data, NULL), 0);
	CHECK_INT(remembered(c), 1);
	cache_close(c);
	c = open_cache(); /* no mark was made: the long way again */
	CHECK_INT(pt_open_eq(c, r[0].obj, r[0].data, NULL), 0);
	CHECK_INT(remembered(c), 0);
	cache_close(c);
}

/*
 * The mark in the data file (cache_object_mark_whole, as stager stage
 * makes it): a fresh process's first passthrough open of the object is
 * answered from it. Stale after a damage generation bump by another
 * process (the long way then marks it again), after a write to the data
 * file, and after damage.gen is made anew (another nonce); not made for
 * a partial object; refused by the file system, no harm done. The memo's
 * open with O_NOATIME refused, its sidecar unopenable, its access time
 * unwritten, and a mark not written for want of space (sysfail.h).
 */
static void test_whole_mark(void)
{
	struct cache_object obj = { .dataset = "wk1" };
	struct cache_object part = { .dataset = "wk2" };
	struct cache_object other = { .dataset = "wk3" };
	struct cache_object spare = { .dataset = "wk4" };
	char etag[128], etag_p[128], etag_o[128], etag_s[128], gen[400];
	size_t size = 4 * BS + 9;
	char *data = put_src("wk.bin", size, &obj, etag);
	char *dpart = put_src("wkp.bin", size, &part, etag_p);
	char *dother = put_src("wko.bin", size, &other, etag_o);
	char *dspare = put_src("wks.bin", size, &spare, etag_s);
	struct cache *c = open_cache();
	struct refused r = { &obj, data, size }, rr[2];
	struct memo_fail mf;
	uint64_t g = 0;
	int fd;

	CHECK(read_eq(c, &obj, data, 0, size));
	CHECK(read_eq(c, &part, dpart, 0, BS));
	CHECK(read_eq(c, &other, dother, 0, size));
	CHECK_INT(cache_object_mark_whole(c, &obj), 1);
	CHECK_INT(cache_object_mark_whole(c, &part), 0);
	CHECK_INT(cache_object_mark_whole(c, NULL), -EINVAL);
	cache_close(c);
	/* A fresh process: from the mark, right bytes. */
	c = open_cache();
	CHECK_INT(pt_open_eq(c, &obj, data, NULL), 0);
	CHECK_INT(remembered(c), 1);
	CHECK_INT(pt_open_eq(c, &part, dpart, NULL), -EAGAIN);
	CHECK_INT(cache_object_forget_block(c, &other, 1), 0);
	cache_close(c);
	/* A generation later: the long way, which marks it again. */
	c = open_cache();
	CHECK_INT(pt_open_eq(c, &obj, data, NULL), 0);
	CHECK_INT(remembered(c), 0);
	cache_close(c);
	c = open_cache();
	CHECK_INT(pt_open_eq(c, &obj, data, NULL), 0);
	CHECK_INT(remembered(c), 1);
	cache_close(c);
	/* The data file written since (its modification time moved). */
	flip_byte_in("wk1", 0, 0);
	flip_byte_in("wk1", 0, 0); /* the bytes as they were */
	c = open_cache();
	CHECK_INT(pt_open_eq(c, &obj, data, NULL), 0);
	CHECK_INT(remembered(c), 0);
	cache_close(c);
	/* damage.gen made anew: its generation from 0, another nonce; even
	 * once the generation comes round to the mark's again. */
	snprintf(gen, sizeof(gen), "%s/damage.gen", cachedir);
	fd = open(gen, O_RDONLY);
	CHECK(fd >= 0 && pread(fd, &g, sizeof(g), 0) == sizeof(g));
	close(fd);
	CHECK_INT(unlink(gen), 0);
	c = open_cache();
	cache_close(c);
	fd = open(gen, O_WRONLY);
	CHECK(fd >= 0 && pwrite(fd, &g, sizeof(g), 0) == sizeof(g));
	close(fd);
	c = open_cache();
	CHECK_INT(pt_open_eq(c, &obj, data, NULL), 0);
	CHECK_INT(remembered(c), 0);
	cache_close(c);
	sysfail_child("xattr refused", mark_refused_fs_child, &r);
	/* Every failure path of the memo's open, the mark current. */
	sysfail_child("memo: O_NOATIME refused", mark_noatime_child, &r);
	/* The sidecar unopenable: not handed over (the long way records the
	 * access time). Its write failing (a full disk): handed over all the
	 * same; recency is a hint, the bytes were checked. */
	sleep(2); /* the access time recorded last: past CACHE_ATIME_STEP */
	mf = (struct memo_fail){ .r = &r,
				 .nr = SYS_openat,
				 .err = EACCES,
				 .when = SYSFAIL_ARG_HAS,
				 .val = O_WRONLY };
	sysfail_child("memo: sidecar refused", mark_touch_child, &mf);
	mf = (struct memo_fail){ .r = &r,
				 .nr = SYS_pwrite64,
				 .err = EIO,
				 .when = SYSFAIL_ARG_EQ,
				 .val = 4096,
				 .remembered = 1 };
	sysfail_child("memo: access time unwritten", mark_touch_child, &mf);
	c = open_cache();
	CHECK(read_eq(c, &spare, dspare, 0, size));
	CHECK_INT(cache_object_mark_whole(c, &spare), 1);
	cache_close(c);
	rr[0] = r;
	rr[1] = (struct refused){ &spare, dspare, size };
	sysfail_child("mark: no space", mark_nospace_child, rr);
	free(data);
	free(dpart);
	free(dother);
	free(dspare);
}

int main(void)
{
	struct cachetest_saved saved;
	const char *base = getenv("TMPDIR");

	log_set_level(LOG_LVL_ERROR);
	snprintf(tmp, sizeof(tmp), "%s/test_cache.XXXXXX",
		 base && *base ? base : "/tmp");
	if (!mkdtemp(tmp))
		return 1;
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	snprintf(catpath, sizeof(catpath), "%s/catalog.db", tmp);
	mkdir(srcdir, 0755);
	cachetest_setup(&cfg, &os, cachedir, srcdir, BS, &saved);
	CHECK(uring_available() || getenv("DSTAGE_NO_URING"));

	test_ranges();
	test_on_disk_sums();
	test_corruption();
	test_damaged_mark();
	test_prealloc();
	test_gen_unshared();
	test_refused();
	test_check_and_recover();
	test_truncated_file();
	test_passthrough();
	test_access_time();
	test_stale();
	test_threads();
	test_readahead();
	test_eviction();
	test_read_iov();
	test_open_table();
	test_whole_memo();
	test_whole_mark();

	/* A cache created with another block size is refused. */
	struct cache *c = NULL;

	cfg->cache_dir = cachedir;
	cfg->cache_block_size = 2 * BS;
	CHECK_INT(cache_open(cfg, NULL, &c), -EINVAL);

	objstore_free(os);
	while (npols)
		cachepol_close(pols[--npols]);
	cachetest_free(cfg, &saved);
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
	if (system(cmd))
		return 1;
	return check_result();
}
