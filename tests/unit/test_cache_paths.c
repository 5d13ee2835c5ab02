// SPDX-License-Identifier: MIT
/*
 * test_cache_paths: a flipped byte in a cached block, met on every read path
 * of the cache by a fresh process (one that has verified nothing yet):
 *
 *   copy    cache_read
 *   iov     cache_read_iov, no flags
 *   direct  cache_read_iov with CACHE_READ_DIRECT (the stager's batched
 *           stage and verify reads, pinned.c's reads)
 *   fd      cache_read_fd (dstagefs's splice replies, pinned.c)
 *   verify  cache_object_verify (stager verify of what is cached)
 *
 * Each path gets its own object, filled by one child process, damaged on
 * disk by the parent, then read by another child. The bytes handed over
 * must be the source's (re-fetched), or the call must fail (-EAGAIN for
 * cache_read_fd, which leaves the repair to the copying path); never the
 * damaged ones. The failure is counted in checksum_failures. A new read
 * path of include/dstage/cache.h gets a row in paths[] below.
 *
 * And a block record whose check word is wrong (a torn or misplaced record
 * write) makes its block absent: fetched again, never trusted.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define BS 4096u
#define NBLOCKS 16u
#define SIZE ((size_t)NBLOCKS * BS)
#define BAD_BLOCK 5u /* the block damaged */

static char tmp[256], srcdir[300], cachedir[300];
static struct dstage_config *cfg;

/* The source's bytes of object i: a pattern no flip leaves unchanged. */
static void fill_pattern(char *buf, unsigned i)
{
	uint64_t s = 0x9e3779b97f4a7c15ULL * (i + 1);

	for (size_t k = 0; k < SIZE; k++) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		buf[k] = (char)s;
	}
}

/* The cache object of path i (its key "k<i>", dataset "p<i>"). */
struct path_obj {
	char key[16], ds[16], etag[128];
	struct cache_object obj;
};

static int obj_init(struct path_obj *p, struct objstore *os, unsigned i)
{
	struct objstore_info oi;
	int ret;

	snprintf(p->key, sizeof(p->key), "k%u", i);
	snprintf(p->ds, sizeof(p->ds), "p%u", i);
	ret = objstore_head(os, p->key, &oi);
	if (ret)
		return ret;
	snprintf(p->etag, sizeof(p->etag), "%s", oi.etag);
	p->obj = (struct cache_object){ .dataset = p->ds,
					.os = os,
					.key = p->key,
					.etag = p->etag,
					.size = SIZE };
	return 0;
}

/* ---- the read paths, each in a fresh process ---- */

struct iov_sink {
	char *out;
	size_t len;
};

static int iov_sink_fn(void *arg, const struct iovec *iov, int n)
{
	struct iov_sink *s = arg;

	for (int i = 0; i < n; i++) {
		if (s->len + iov[i].iov_len > SIZE)
			return -EOVERFLOW;
		memcpy(s->out + s->len, iov[i].iov_base, iov[i].iov_len);
		s->len += iov[i].iov_len;
	}
	return 0;
}

/* Each returns 0 when the bytes it got are want's (or it got none and
 * said so), 1 otherwise. got: the bytes handed over. */
static int path_copy(struct cache *c, const struct cache_object *o, char *got)
{
	return cache_read(c, o, 0, SIZE, got) == (ssize_t)SIZE ? 0 : 1;
}

static int read_iov(struct cache *c, const struct cache_object *o, char *got,
		    unsigned flags)
{
	struct iov_sink s = { .out = got };
	char *buf = malloc(SIZE);
	int ret;

	if (!buf)
		return 1;
	/* in batches of 4 blocks, as the stager's workers read */
	for (size_t off = 0; off < SIZE; off += 4 * BS) {
		ret = cache_read_iov(c, o, off, 4 * BS, buf, flags, iov_sink_fn,
				     &s);
		if (ret) {
			fprintf(stderr, "cache_read_iov at %zu: %s\n", off,
				strerror(-ret));
			free(buf);
			return 1;
		}
	}
	free(buf);
	return s.len == SIZE ? 0 : 1;
}

static int path_iov(struct cache *c, const struct cache_object *o, char *got)
{
	return read_iov(c, o, got, 0);
}

static int path_direct(struct cache *c, const struct cache_object *o, char *got)
{
	return read_iov(c, o, got, CACHE_READ_DIRECT);
}

/* The damaged block is refused (-EAGAIN, never a descriptor onto it); the
 * rest is handed out; once the copying path repaired it, it is too. */
static int path_fd(struct cache *c, const struct cache_object *o, char *got)
{
	int bad = 0;

	for (unsigned b = 0; b < NBLOCKS; b++) {
		uint64_t fd_off = 0;
		int fd = -1;
		int ret =
			cache_read_fd(c, o, (uint64_t)b * BS, BS, &fd, &fd_off);

		if (ret == -EAGAIN && b == BAD_BLOCK) {
			/* the caller's fallback, as dstagefs does */
			if (cache_read(c, o, (uint64_t)b * BS, BS,
				       got + (size_t)b * BS) != BS)
				bad = 1;
			ret = cache_read_fd(c, o, (uint64_t)b * BS, BS, &fd,
					    &fd_off);
			if (ret)
				bad = 1;
			if (fd >= 0)
				close(fd);
			continue;
		}
		if (ret) {
			fprintf(stderr, "cache_read_fd block %u: %s\n", b,
				strerror(-ret));
			bad = 1;
			continue;
		}
		if (pread(fd, got + (size_t)b * BS, BS, (off_t)fd_off) != BS)
			bad = 1;
		close(fd);
	}
	return bad;
}

/* Fetches nothing: reports the block bad, counts it and marks it damaged;
 * the next read re-fetches it (a damaged record: not counted again). */
static int path_verify(struct cache *c, const struct cache_object *o, char *got)
{
	uint64_t present = 0, bad = 0;
	int ret = cache_object_verify(c, o, &present, &bad);

	if (ret || present != NBLOCKS || bad != 1) {
		fprintf(stderr, "verify: %d, present %llu bad %llu\n", ret,
			(unsigned long long)present, (unsigned long long)bad);
		return 1;
	}
	return path_copy(c, o, got);
}

static const struct {
	const char *name;
	int (*read)(struct cache *c, const struct cache_object *o, char *got);
	unsigned failures; /* checksum_failures expected */
} paths[] = {
	{ "copy", path_copy, 1 },     { "iov", path_iov, 1 },
	{ "direct", path_direct, 1 }, { "fd", path_fd, 1 },
	{ "verify", path_verify, 1 },
};

#define NPATHS (sizeof(paths) / sizeof(paths[0]))

/* ---- processes ---- */

/* In a child: open the source and the cache, run fn, exit with the result
 * (0 pass, 1 fail). */
static int child_open(struct objstore **os, struct cache **c)
{
	char url[400];

	snprintf(url, sizeof(url), "file://%s/", srcdir);
	if (objstore_open(url, cfg, os))
		return 1;
	if (cache_open(cfg, NULL, c)) {
		objstore_free(*os);
		return 1;
	}
	return 0;
}

static void child_fill(unsigned i)
{
	struct objstore *os = NULL;
	struct cache *c = NULL;
	struct path_obj p;

	if (child_open(&os, &c))
		_exit(1);
	CHECK_INT(obj_init(&p, os, i), 0);
	CHECK_INT(cache_fetch(c, &p.obj, 0, 0, NULL, NULL), 0);
	cache_close(c);
	objstore_free(os);
	_exit(check_result());
}

static void child_read(unsigned i)
{
	struct objstore *os = NULL;
	struct cache *c = NULL;
	struct cache_stats st;
	struct path_obj p;
	char *want = malloc(SIZE), *got = calloc(1, SIZE);

	if (!want || !got || child_open(&os, &c))
		_exit(1);
	fill_pattern(want, i);
	CHECK_INT(obj_init(&p, os, i), 0);
	CHECK_INT(paths[i].read(c, &p.obj, got), 0);
	if (memcmp(got, want, SIZE)) {
		size_t k = 0;

		while (k < SIZE && got[k] == want[k])
			k++;
		fprintf(stderr, "%s: bytes differ from the source at %zu\n",
			paths[i].name, k);
		check_failures++;
	}
	cache_get_stats(c, &st);
	/* counted once (verify marks what it met damaged, and the read after
	 * it fetches a damaged block without checking it again), re-fetched
	 * once */
	CHECK_INT(st.checksum_failures, paths[i].failures);
	CHECK_INT(st.fetches, 1);
	cache_close(c);
	objstore_free(os);
	free(want);
	free(got);
	_exit(check_result());
}

static int run_child(void (*fn)(unsigned), unsigned i)
{
	int status = 0;
	pid_t pid = fork();

	if (pid < 0)
		return 1;
	if (pid == 0) {
		check_failures = 0; /* the parent's count is not the child's */
		fn(i);
	}
	if (waitpid(pid, &status, 0) != pid)
		return 1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* Flip a bit of a byte of dataset ds's cache files: byte at of its data
 * file, or (rec) of its block records in the sidecar. The header
 * (lib/cache/cache_i.h's struct cache_hdr) has the lengths of the dataset
 * name, key and ETag at 32 and the name at 64; the records start at the
 * first 4 KiB boundary after the strings, 16 bytes each, the check word
 * last. */
static int flip_byte_in(const char *ds, uint64_t at, bool rec)
{
	char pat[400], name[16], dpath[400];
	uint32_t lens[3];
	glob_t g;
	int ret = 1;

	snprintf(pat, sizeof(pat), "%s/objects/*/*.meta", cachedir);
	if (glob(pat, 0, NULL, &g))
		return 1;
	for (size_t k = 0; k < g.gl_pathc; k++) {
		int fd = open(g.gl_pathv[k], O_RDWR), tfd = -1;
		uint64_t base;
		char ch;

		memset(name, 0, sizeof(name));
		if (fd < 0)
			continue;
		snprintf(dpath, sizeof(dpath), "%.*s",
			 (int)(strlen(g.gl_pathv[k]) - 5), g.gl_pathv[k]);
		if (pread(fd, lens, sizeof(lens), 32) == sizeof(lens) &&
		    lens[0] == strlen(ds) &&
		    pread(fd, name, lens[0], 64) == (ssize_t)lens[0] &&
		    !memcmp(name, ds, lens[0])) {
			/* records in the sidecar, bytes in the data file */
			base = rec ? (64 + (uint64_t)lens[0] + lens[1] +
				      lens[2] + 4095) &
					       ~(uint64_t)4095
				   : 0;
			tfd = rec ? fd : open(dpath, O_RDWR);
			if (tfd >= 0 &&
			    pread(tfd, &ch, 1, (off_t)(base + at)) == 1) {
				ch ^= 0x01;
				if (pwrite(tfd, &ch, 1, (off_t)(base + at)) ==
				    1)
					ret = 0;
			}
			if (tfd >= 0 && tfd != fd)
				close(tfd);
		}
		close(fd);
	}
	globfree(&g);
	return ret;
}

static int flip_byte(const char *ds, uint64_t at)
{
	return flip_byte_in(ds, at, false);
}

/* Object NPATHS after its record of block BAD_BLOCK lost its check word:
 * that block is absent (one block fetched again), nothing is counted as
 * corrupt, the bytes are the source's. */
static void child_torn_record(unsigned i)
{
	struct objstore *os = NULL;
	struct cache *c = NULL;
	struct cache_stats st;
	struct path_obj p;
	uint64_t present = 0;
	char *want = malloc(SIZE), *got = calloc(1, SIZE);

	if (!want || !got || child_open(&os, &c))
		_exit(1);
	fill_pattern(want, i);
	CHECK_INT(obj_init(&p, os, i), 0);
	CHECK_INT(cache_object_present(c, &p.obj, &present), 0);
	CHECK_INT(present, SIZE - BS);
	CHECK_INT(cache_read(c, &p.obj, 0, SIZE, got), SIZE);
	CHECK(!memcmp(got, want, SIZE));
	cache_get_stats(c, &st);
	CHECK_INT(st.checksum_failures, 0);
	CHECK_INT(st.fetches, 1);
	cache_close(c);
	objstore_free(os);
	free(want);
	free(got);
	_exit(check_result());
}

int main(void)
{
	char path[400], *orig_dir;
	char *data = malloc(SIZE);

	log_set_level(LOG_LVL_ERROR);
	snprintf(tmp, sizeof(tmp), "/var/tmp/test_cache_paths.XXXXXX");
	if (!data || !mkdtemp(tmp))
		return 1;
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	mkdir(srcdir, 0755);
	CHECK_INT(config_defaults(&cfg), 0);
	orig_dir = cfg->cache_dir;
	cfg->cache_dir = cachedir;
	cfg->cache_block_size = BS;
	cfg->cache_size = 1ULL << 30;

	for (unsigned i = 0; i < NPATHS; i++) {
		FILE *f;

		fill_pattern(data, i);
		snprintf(path, sizeof(path), "%s/k%u", srcdir, i);
		f = fopen(path, "wb");
		CHECK(f && fwrite(data, 1, SIZE, f) == SIZE);
		if (f)
			fclose(f);
		CHECK_INT(run_child(child_fill, i), 0);
		snprintf(path, sizeof(path), "p%u", i);
		CHECK_INT(flip_byte(path, (uint64_t)BAD_BLOCK * BS + 77), 0);
		if (run_child(child_read, i)) {
			fprintf(stderr, "read path '%s': FAILED\n",
				paths[i].name);
			check_failures++;
		}
	}

	/* A torn record: its check word (the last 4 of its 16 bytes). */
	{
		unsigned i = NPATHS;
		FILE *f;

		fill_pattern(data, i);
		snprintf(path, sizeof(path), "%s/k%u", srcdir, i);
		f = fopen(path, "wb");
		CHECK(f && fwrite(data, 1, SIZE, f) == SIZE);
		if (f)
			fclose(f);
		CHECK_INT(run_child(child_fill, i), 0);
		snprintf(path, sizeof(path), "p%u", i);
		CHECK_INT(flip_byte_in(path, BAD_BLOCK * 16 + 13, true), 0);
		if (run_child(child_torn_record, i)) {
			fprintf(stderr, "torn record: FAILED\n");
			check_failures++;
		}
	}

	cfg->cache_dir = orig_dir;
	config_free(cfg);
	free(data);
	snprintf(path, sizeof(path), "rm -rf %s", tmp);
	if (system(path))
		return 1;
	return check_result();
}
