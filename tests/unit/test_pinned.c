// SPDX-License-Identifier: MIT
/*
 * test_pinned: pinned buffers (include/dstage/pinned.h) in the mode this
 * machine gives (the CPU mode without a GPU): the right bytes for many
 * sizes, offsets and buffer alignments, by path and through the cache, on
 * the device and in host memory; absent, short and corrupt files fail and
 * hand nothing unchecked over; many small files in one batch, all or
 * nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"
#include "cachetest.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/pinned.h"

#define BS 4096u
#define CHUNK (64u << 10)
#define SENTINEL 0xA5
/* st_size 4096, a few bytes of content */
#define SYSFS_SHORT "/sys/devices/system/cpu/online"

static char tmp[256], srcdir[300], cachedir[300];
static struct dstage_config *cfg;
static struct objstore *os;
static uint64_t rnd_state = 0x9E3779B97F4A7C15ULL;

static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

static char *rnd_bytes(size_t size)
{
	char *d = malloc(size ? size : 1);

	for (size_t i = 0; i < size; i++)
		d[i] = (char)rnd();
	return d;
}

/* A local file of size random bytes; returns them (malloc'ed). */
static char *put_file(const char *name, size_t size, char *path, size_t plen)
{
	char *d = rnd_bytes(size);
	FILE *f;

	snprintf(path, plen, "%s/%s", tmp, name);
	f = fopen(path, "wb");
	CHECK(f != NULL);
	if (f) {
		CHECK(fwrite(d, 1, size, f) == size);
		fclose(f);
	}
	return d;
}

/* Pages of path in the page cache (cachestat(2)), or -1 without it. */
static long long cached_pages(const char *path)
{
	uint64_t range[2] = { 0, 0 }, st[5] = { 0 };
	int fd = open(path, O_RDONLY);
	long r;

	if (fd < 0)
		return -1;
	r = syscall(451 /* cachestat */, fd, range, st, 0);
	close(fd);
	return r ? -1 : (long long)st[0];
}

/* Write back and drop path's pages: the next read is cold. */
static void drop_pages(const char *path)
{
	int fd = open(path, O_RDONLY);

	CHECK(fd >= 0);
	CHECK_INT(fdatasync(fd), 0);
	CHECK_INT(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);
}

/* True when every byte of buf is the sentinel. */
static bool untouched(const char *buf, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)buf[i] != SENTINEL)
			return false;
	return true;
}

/* Read [off, off + len) of f to the device and back; compare with want. */
static bool dev_eq(struct pinned *p, struct pinned_file *f, uint64_t off,
		   size_t len, const char *want)
{
	void *dev = NULL;
	char *back = malloc(len + 1);
	bool ok;

	CHECK_INT(pinned_dev_alloc(p, len + 1, &dev), 0);
	CHECK_INT(pinned_read_device(f, off, len, dev, NULL), 0);
	CHECK_INT(pinned_copy_from_dev(p, back, dev, len), 0);
	ok = !memcmp(back, want + off, len);
	pinned_dev_free(p, dev);
	free(back);
	return ok;
}

/* Read into host memory at a given misalignment of the destination. */
static bool host_eq(struct pinned *p, struct pinned_file *f, uint64_t off,
		    size_t len, size_t mis, const char *want)
{
	char *buf = NULL;
	bool ok;

	CHECK_INT(pinned_host_alloc(p, len + mis + 1, (void **)&buf), 0);
	if (!buf)
		return false;
	CHECK_INT(pinned_read_host(f, off, len, buf + mis), 0);
	ok = !memcmp(buf + mis, want + off, len);
	pinned_host_free(p, buf);
	return ok;
}

static void test_mode(void)
{
	struct pinned_opts o = { .flags = PINNED_CUDA_REQUIRED };
	struct pinned *p = NULL;
	void *h = NULL;

	CHECK_INT(pinned_init(NULL, &p), 0);
	CHECK(p != NULL);
	if (!p)
		return;
	fprintf(stderr, "test_pinned: mode %s (%s)\n",
		pinned_mode_name(pinned_mode(p)), pinned_mode_reason(p));
	CHECK(*pinned_mode_reason(p));
	if (getenv("DSTAGE_TEST_EXPECT_MODE"))
		CHECK_STR(pinned_mode_name(pinned_mode(p)),
			  getenv("DSTAGE_TEST_EXPECT_MODE"));
	if (pinned_mode(p) == PINNED_MODE_CPU) {
		struct pinned *q = NULL;

		/* No GPU: CUDA required is refused, not faked. */
		CHECK_INT(pinned_init(&o, &q), -ENODEV);
		CHECK(q == NULL);
	}
	/* Host buffers are 4 KiB-aligned (O_DIRECT, DMA). */
	CHECK_INT(pinned_host_alloc(p, 1, &h), 0);
	CHECK(((uintptr_t)h & 4095) == 0);
	pinned_host_free(p, h);
	CHECK_INT(pinned_host_alloc(p, 0, &h), -EINVAL);
	pinned_free(p);

	o = (struct pinned_opts){ .depth = 1 };
	CHECK_INT(pinned_init(&o, &p), -EINVAL);
	o = (struct pinned_opts){ .flags = PINNED_CPU_ONLY };
	CHECK_INT(pinned_init(&o, &p), 0);
	CHECK_INT(pinned_mode(p), PINNED_MODE_CPU);
	pinned_free(p);
}

/* Many sizes and offsets, whole and in ranges, with depth 2 and 3, O_DIRECT
 * and buffered. */
static void test_sizes(void)
{
	static const size_t sizes[] = { 0,	  1,	     4095,
					4096,	  4097,	     CHUNK - 1,
					CHUNK,	  CHUNK + 1, 3 * CHUNK + 123,
					5 * CHUNK };
	static const unsigned depths[] = { 2, 3 };
	static const unsigned flags[] = { 0, PINNED_NO_DIRECT };

	for (size_t d = 0; d < 2; d++)
		for (size_t fl = 0; fl < 2; fl++) {
			struct pinned_opts o = { .chunk = CHUNK,
						 .depth = depths[d],
						 .flags = flags[fl] };
			struct pinned *p = NULL;

			CHECK_INT(pinned_init(&o, &p), 0);
			for (size_t i = 0;
			     p && i < sizeof(sizes) / sizeof(sizes[0]); i++) {
				size_t sz = sizes[i];
				char path[400], name[32];
				struct pinned_file *f = NULL;
				char *data;

				snprintf(name, sizeof(name), "size%zu", sz);
				data = put_file(name, sz, path, sizeof(path));
				CHECK_INT(pinned_file_open(p, path, &f), 0);
				CHECK_INT(pinned_file_size(f), sz);
				/* Cold: O_DIRECT where aligned (the tail
				 * too, rounded up in the staging chunk), so
				 * the page cache stays empty; warm (or with
				 * PINNED_NO_DIRECT): buffered. */
				drop_pages(path);
				CHECK(dev_eq(p, f, 0, sz, data));
				if (sz >= 4096 && cached_pages(path) >= 0)
					CHECK_INT(cached_pages(path),
						  flags[fl] ? (sz + 4095) / 4096
							    : 0);
				CHECK(dev_eq(p, f, 0, sz, data));
				CHECK(host_eq(p, f, 0, sz, 0, data));
				CHECK(host_eq(p, f, 0, sz, 1, data));
				if (sz > 4097) {
					CHECK(dev_eq(p, f, 1, sz - 1, data));
					CHECK(dev_eq(p, f, 4095, sz - 4096,
						     data));
					CHECK(dev_eq(p, f, 4096, sz - 4096,
						     data));
					CHECK(host_eq(p, f, 4096, sz - 4096, 0,
						      data));
					CHECK(host_eq(p, f, 4097, 4096, 7,
						      data));
					CHECK(dev_eq(p, f, 4097, 1, data));
				}
				/* Past the end: refused, not short. */
				{
					char b[2];

					CHECK_INT(pinned_read_host(f, sz, 1, b),
						  -EINVAL);
					CHECK_INT(pinned_read_device(f, 0,
								     sz + 1, b,
								     NULL),
						  -EINVAL);
				}
				pinned_file_close(f);
				unlink(path);
				free(data);
			}
			pinned_free(p);
		}
}

/* Absent files, and a file cut short after open: an error, and no byte of
 * the short chunk (nor any after it) on the device. */
static void test_absent_short(void)
{
	struct pinned_opts o = { .chunk = CHUNK, .depth = 2 };
	struct pinned *p = NULL;
	struct pinned_file *f = NULL;
	size_t sz = 4 * CHUNK;
	char path[400], *data, *dev = NULL, *back = malloc(sz);
	int fd;

	CHECK_INT(pinned_init(&o, &p), 0);
	snprintf(path, sizeof(path), "%s/absent", tmp);
	CHECK_INT(pinned_file_open(p, path, &f), -ENOENT);
	CHECK(f == NULL);
	CHECK_INT(pinned_file_open(p, tmp, &f), -EISDIR);

	data = put_file("short", sz, path, sizeof(path));
	CHECK_INT(pinned_file_open(p, path, &f), 0);
	fd = open(path, O_WRONLY);
	CHECK_INT(ftruncate(fd, (off_t)(2 * CHUNK + CHUNK / 2)), 0);
	close(fd);
	CHECK_INT(pinned_dev_alloc(p, sz, (void **)&dev), 0);
	memset(back, SENTINEL, sz);
	CHECK_INT(pinned_copy_to_dev(p, dev, back, sz), 0);
	CHECK_INT(pinned_read_device(f, 0, sz, dev, NULL), -EIO);
	CHECK_INT(pinned_copy_from_dev(p, back, dev, sz), 0);
	/* Whole chunks before the cut may be there, and right; from the cut
	 * chunk on, nothing. */
	for (size_t c = 0; c < 2; c++)
		CHECK(untouched(back + c * CHUNK, CHUNK) ||
		      !memcmp(back + c * CHUNK, data + c * CHUNK, CHUNK));
	CHECK(untouched(back + 2 * CHUNK, 2 * CHUNK));
	/* One chunk, short: nothing at all. */
	memset(back, SENTINEL, sz);
	CHECK_INT(pinned_copy_to_dev(p, dev, back, sz), 0);
	CHECK_INT(pinned_read_device(f, 2 * CHUNK, CHUNK, dev, NULL), -EIO);
	CHECK_INT(pinned_copy_from_dev(p, back, dev, sz), 0);
	CHECK(untouched(back, sz));
	CHECK_INT(pinned_read_host(f, 2 * CHUNK, CHUNK, back), -EIO);
	/* The part still there reads fine. */
	CHECK(host_eq(p, f, CHUNK, CHUNK, 0, data));
	pinned_file_close(f);
	/* A file shorter than its own size says. */
	if (pinned_file_open(p, SYSFS_SHORT, &f) == 0) {
		CHECK_INT(pinned_file_size(f), 4096);
		memset(back, SENTINEL, sz);
		CHECK_INT(pinned_copy_to_dev(p, dev, back, sz), 0);
		CHECK_INT(pinned_read_device(f, 0, 4096, dev, NULL), -EIO);
		CHECK_INT(pinned_copy_from_dev(p, back, dev, sz), 0);
		CHECK(untouched(back, sz));
		pinned_file_close(f);
	}
	pinned_dev_free(p, dev);
	pinned_free(p);
	free(data);
	free(back);
}

static char *put_obj(const char *ds, const char *key, size_t size,
		     struct cache_object *obj, char etag[OBJSTORE_ETAG_MAX])
{
	char *d = rnd_bytes(size);
	struct objstore_info oi;

	CHECK_INT(objstore_put_buf(os, key, d, size), 0);
	CHECK_INT(objstore_head(os, key, &oi), 0);
	snprintf(etag, OBJSTORE_ETAG_MAX, "%s", oi.etag);
	*obj = (struct cache_object){
		.dataset = ds, .os = os, .key = key, .etag = etag, .size = size
	};
	return d;
}

/* Read obj to the device over a sentinel; returns the call's result and
 * leaves the device bytes in back. */
static int cached_dev(struct pinned *p, struct cache *c,
		      const struct cache_object *obj, char *back)
{
	struct pinned_file *f = NULL;
	char *dev = NULL;
	int ret;

	CHECK_INT(pinned_file_open_cached(p, c, obj, &f), 0);
	CHECK_INT(pinned_dev_alloc(p, obj->size, (void **)&dev), 0);
	memset(back, SENTINEL, obj->size);
	CHECK_INT(pinned_copy_to_dev(p, dev, back, obj->size), 0);
	ret = pinned_read_device(f, 0, obj->size, dev, NULL);
	CHECK_INT(pinned_copy_from_dev(p, back, dev, obj->size), 0);
	pinned_dev_free(p, dev);
	pinned_file_close(f);
	return ret;
}

static void test_cached(void)
{
	struct pinned_opts o = { .chunk = 4 * BS, .depth = 3 };
	struct pinned *p = NULL;
	struct cache *c = NULL;
	struct cache_object obj;
	struct cache_stats st;
	char etag[128];
	size_t sz = 40 * BS + 77;
	char *data = put_obj("good", "good.bin", sz, &obj, etag);
	char *back = malloc(sz), *d2;
	uint64_t data_off = 0, present = 0;
	int fd;

	CHECK_INT(pinned_init(&o, &p), 0);
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	/* Not cached yet: read through the cache, not its file. */
	{
		struct pinned_file *f = NULL;

		CHECK_INT(pinned_file_open_cached(p, c, &obj, &f), 0);
		CHECK(!pinned_file_direct(f));
		pinned_file_close(f);
	}
	/* Cold: through the cache, fetched from the source. */
	CHECK_INT(cached_dev(p, c, &obj, back), 0);
	CHECK(!memcmp(back, data, sz));
	CHECK_INT(cache_object_present(c, &obj, &present), 0);
	CHECK_INT(present, sz);
	/* Warm, a fresh process: straight from the cache file, checked. */
	cache_close(c);
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	CHECK_INT(cached_dev(p, c, &obj, back), 0);
	CHECK(!memcmp(back, data, sz));
	cache_get_stats(c, &st);
	CHECK_INT(st.fetches, 0);
	/* Whole and verified (verify_reads = fill): its data file read
	 * directly, holding the object open (not evictable meanwhile). */
	{
		struct pinned_file *f = NULL;
		uint64_t opens;

		cache_get_stats(c, &st);
		opens = st.passthrough_opens; /* cached_dev's above: 1 */
		CHECK_INT(pinned_file_open_cached(p, c, &obj, &f), 0);
		CHECK(pinned_file_direct(f));
		cache_get_stats(c, &st);
		CHECK_INT(st.passthrough_opens, opens + 1);
		CHECK(host_eq(p, f, 4097, 9 * BS, 3, data));
		CHECK(host_eq(p, f, 0, sz, 1, data));
		CHECK_INT(cache_object_drop(c, &obj), -EBUSY);
		pinned_file_close(f);
	}
	cache_close(c);

	/* From here on every read is checked (cache.verify_reads = always):
	 * never the direct path, so a damaged block is caught. */
	cfg->cache_verify_reads = CONFIG_VERIFY_ALWAYS;
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	{
		struct pinned_file *f = NULL;

		CHECK_INT(pinned_file_open_cached(p, c, &obj, &f), 0);
		CHECK(!pinned_file_direct(f));
		pinned_file_close(f);
	}
	cache_close(c);

	/* A flipped byte, source intact: repaired, right bytes. */
	fd = cachetest_obj_file(cachedir, "good", &data_off);
	CHECK(fd >= 0);
	{
		char ch;

		CHECK(pread(fd, &ch, 1, (off_t)(data_off + 9 * BS + 5)) == 1);
		ch ^= 0x10;
		CHECK(pwrite(fd, &ch, 1, (off_t)(data_off + 9 * BS + 5)) == 1);
	}
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	CHECK_INT(cached_dev(p, c, &obj, back), 0);
	CHECK(!memcmp(back, data, sz));
	cache_get_stats(c, &st);
	CHECK_INT(st.checksum_failures, 1);
	cache_close(c);

	/* Flipped again, and the source replaced: the bad block cannot be
	 * repaired. An error, and its chunk (block 9 is in chunk 2) and all
	 * after it never reach the device. */
	{
		char ch;

		CHECK(pread(fd, &ch, 1, (off_t)(data_off + 9 * BS + 5)) == 1);
		ch ^= 0x10;
		CHECK(pwrite(fd, &ch, 1, (off_t)(data_off + 9 * BS + 5)) == 1);
	}
	d2 = rnd_bytes(sz);
	CHECK_INT(objstore_put_buf(os, "good.bin", d2, sz), 0);
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	CHECK(cached_dev(p, c, &obj, back) < 0);
	CHECK(untouched(back + 8 * BS, sz - 8 * BS));
	for (size_t i = 0; i < 8 * BS; i++)
		if (back[i] != data[i] && (unsigned char)back[i] != SENTINEL) {
			CHECK(!"garbage on the device");
			break;
		}
	/* ... and from host reads too. */
	{
		struct pinned_file *f = NULL;

		CHECK_INT(pinned_file_open_cached(p, c, &obj, &f), 0);
		CHECK(pinned_read_host(f, 9 * BS, BS, back) < 0);
		pinned_file_close(f);
	}
	cache_close(c);

	/* A cache file cut short, the source gone: an error. */
	CHECK_INT(ftruncate(fd, (off_t)(data_off + 20 * BS + 100)), 0);
	close(fd);
	CHECK_INT(objstore_delete(os, "good.bin"), 0);
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	CHECK(cached_dev(p, c, &obj, back) < 0);
	CHECK(untouched(back + 20 * BS, sz - 20 * BS));

	/* Absent everywhere: an error, nothing handed over. */
	{
		struct cache_object none = obj;

		none.key = "none.bin";
		none.dataset = "none";
		CHECK(cached_dev(p, c, &none, back) < 0);
		CHECK(untouched(back, sz));
	}
	cache_close(c);
	cfg->cache_verify_reads = CONFIG_VERIFY_FILL;
	pinned_free(p);
	free(data);
	free(d2);
	free(back);
}

/* Many small files in one batch, by path and through the cache. */
static void test_batch(void)
{
	enum { N = 300 };
	struct pinned_opts o = { .chunk = CHUNK };
	struct pinned *p = NULL;
	struct pinned_entry e[N + 1];
	char *data[N + 1], paths[N][400];
	size_t arena_len = 4u << 20;
	char *arena = NULL, *dev = NULL, *back = malloc(arena_len);
	struct cache *c = NULL;
	struct cache_object obj;
	char etag[128];
	int64_t used;

	CHECK_INT(pinned_init(&o, &p), 0);
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	CHECK_INT(pinned_host_alloc(p, arena_len, (void **)&arena), 0);
	CHECK_INT(pinned_dev_alloc(p, arena_len, (void **)&dev), 0);
	for (int i = 0; i < N; i++) {
		char name[32];
		size_t sz = i % 50 == 0 ? 0 : rnd() % 9000;

		snprintf(name, sizeof(name), "small%03d", i);
		data[i] = put_file(name, sz, paths[i], sizeof(paths[i]));
		e[i] = (struct pinned_entry){ .path = paths[i] };
	}
	data[N] = put_obj("batch", "batch.bin", 3 * BS + 5, &obj, etag);
	e[N] = (struct pinned_entry){ .cache = c, .obj = &obj };

	memset(back, SENTINEL, arena_len);
	CHECK_INT(pinned_copy_to_dev(p, dev, back, arena_len), 0);
	used = pinned_read_batch(p, e, N + 1, arena, arena_len, 0, dev, NULL);
	CHECK(used > 0);
	CHECK_INT(pinned_copy_from_dev(p, back, dev, arena_len), 0);
	for (int i = 0; i <= N; i++) {
		CHECK_INT(e[i].err, 0);
		CHECK_INT(e[i].arena_off % 256, 0);
		CHECK(e[i].arena_off + e[i].size <= (uint64_t)used);
		CHECK(!memcmp(arena + e[i].arena_off, data[i], e[i].size));
		CHECK(!memcmp(back + e[i].arena_off, data[i], e[i].size));
	}
	CHECK_INT(e[N].size, 3 * BS + 5);
	/* Alignment 4096 and no device. */
	used = pinned_read_batch(p, e, 10, arena, arena_len, 4096, NULL, NULL);
	CHECK(used > 0);
	for (int i = 0; i < 10; i++) {
		CHECK_INT(e[i].arena_off % 4096, 0);
		CHECK(!memcmp(arena + e[i].arena_off, data[i], e[i].size));
	}
	CHECK_INT(pinned_read_batch(p, e, 10, arena, arena_len, 3, NULL, NULL),
		  -EINVAL);
	/* Ranges of an open file (members of a tar shard). */
	{
		static const uint64_t r[][2] = {
			{ 0, 100 }, { 100, 4000 }, { 5000, 0 }, { 60000, 5536 }
		};
		char path[400];
		char *shard = put_file("shard", 65536, path, sizeof(path));
		struct pinned_file *f = NULL;
		struct pinned_entry re[5];

		CHECK_INT(pinned_file_open(p, path, &f), 0);
		for (int i = 0; i < 4; i++)
			re[i] = (struct pinned_entry){ .file = f,
						       .off = r[i][0],
						       .len = r[i][1] };
		re[4] = (struct pinned_entry){ .path = paths[1] };
		used = pinned_read_batch(p, re, 5, arena, arena_len, 64, dev,
					 NULL);
		CHECK_INT(used,
			  9728 + e[1].size); /* 0, 128, 4160, 4160, 9728 */
		for (int i = 0; i < 4; i++) {
			CHECK_INT(re[i].err, 0);
			CHECK_INT(re[i].size, r[i][1]);
			CHECK(!memcmp(arena + re[i].arena_off, shard + r[i][0],
				      r[i][1]));
		}
		CHECK(!memcmp(arena + re[4].arena_off, data[1], re[4].size));
		re[3].len = 5537;
		CHECK_INT(pinned_read_batch(p, re, 5, arena, arena_len, 64, dev,
					    NULL),
			  -EINVAL);
		CHECK_INT(re[3].err, -EINVAL);
		pinned_file_close(f);
		free(shard);
	}
	/* Too small an arena: refused before reading. */
	memset(arena, SENTINEL, 4096);
	CHECK_INT(pinned_read_batch(p, e, N, arena, 4096, 0, dev, NULL),
		  -ENOSPC);
	CHECK(untouched(arena, 4096));
	/* One file absent: that error, the others cancelled, nothing on the
	 * device. */
	unlink(paths[7]);
	memset(back, SENTINEL, arena_len);
	CHECK_INT(pinned_copy_to_dev(p, dev, back, arena_len), 0);
	CHECK_INT(pinned_read_batch(p, e, N, arena, arena_len, 0, dev, NULL),
		  -ENOENT);
	CHECK_INT(e[7].err, -ENOENT);
	CHECK_INT(e[8].err, -ECANCELED);
	CHECK_INT(pinned_copy_from_dev(p, back, dev, arena_len), 0);
	CHECK(untouched(back, arena_len));
	/* A file that reads shorter than its size (a sysfs attribute says
	 * 4096 bytes and holds a few): read-time failure, all or nothing. */
	if (access(SYSFS_SHORT, R_OK) == 0) {
		e[9] = (struct pinned_entry){ .path = SYSFS_SHORT };
		memset(back, SENTINEL, arena_len);
		CHECK_INT(pinned_copy_to_dev(p, dev, back, arena_len), 0);
		CHECK_INT(pinned_read_batch(p, e + 8, 50, arena, arena_len, 0,
					    dev, NULL),
			  -EIO);
		CHECK_INT(e[9].err, -EIO);
		CHECK_INT(e[10].err, -ECANCELED);
		CHECK_INT(pinned_copy_from_dev(p, back, dev, arena_len), 0);
		CHECK(untouched(back, arena_len));
		e[9] = (struct pinned_entry){ .path = paths[9] };
	}
	/* A cached object whose source is gone and which is not cached. */
	e[7] = (struct pinned_entry){ .path = paths[8] };
	{
		struct cache_object gone = obj;

		gone.key = "gone.bin";
		e[N] = (struct pinned_entry){ .cache = c, .obj = &gone };
		CHECK(pinned_read_batch(p, e, N + 1, arena, arena_len, 0, dev,
					NULL) < 0);
		CHECK(e[N].err < 0 && e[N].err != -ECANCELED);
		CHECK_INT(pinned_copy_from_dev(p, back, dev, arena_len), 0);
		CHECK(untouched(back, arena_len));
	}
	for (int i = 0; i <= N; i++) {
		if (i < N)
			unlink(paths[i]);
		free(data[i]);
	}
	pinned_host_free(p, arena);
	pinned_dev_free(p, dev);
	cache_close(c);
	pinned_free(p);
	free(back);
}

int main(void)
{
	struct cachetest_saved saved;
	char url[400];
	int ret;

	log_set_level(LOG_LVL_ERROR);
	/* On the build's disk, not a tmpfs: O_DIRECT is exercised. */
	snprintf(tmp, sizeof(tmp), "%s/test_pinned.XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp))
		return 1;
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	mkdir(srcdir, 0700);
	cachetest_setup(&cfg, &os, cachedir, srcdir, BS, &saved);

	test_mode();
	test_sizes();
	test_absent_short();
	test_cached();
	test_batch();

	objstore_free(os);
	cachetest_free(cfg, &saved);
	snprintf(url, sizeof(url), "rm -rf %s", tmp);
	ret = system(url);
	return ret ? 1 : check_result();
}
