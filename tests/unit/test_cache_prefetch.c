// SPDX-License-Identifier: MIT
/*
 * test_cache_prefetch: known-order prefetch (cache_prefetch) within the
 * cache's space, through the cache API over a file:// store
 * (lib/cache/cache_ahead.c, docs/cache.md "Space: the prefetch stays ahead of its
 * reader").
 *
 *  - stream: a list of 3 x cache.size, read in list order with cache_read:
 *    every byte right, every block fetched exactly once (nothing prefetched
 *    is evicted before it is read), and never more than the budget (half of
 *    cache.size) fetched ahead of the reader;
 *  - idle: a list nobody reads lets go of what it holds after
 *    DSTAGE_PREFETCH_IDLE_S, so another dataset of 5/8 of the cache then
 *    fits whole (its second read fetches nothing).
 * Objects of one block (256 KiB) each, a 16 MiB cache; about 80 MiB of disk
 * under $TMPDIR (or /tmp). Waits are bounded polls; no duration is judged.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "cachetest.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define KIB 1024u
#define BS (256 * KIB)
#define OBJ BS /* one block, one fetch */
#define CACHE (64 * BS) /* 16 MiB */
#define N 192 /* 3 x the cache */
#define N_OTHER 40 /* 10 MiB: does not fit beside 8 MiB held */
/* An entry's charge (cache_pf_cost): its bytes and a page of header and
 * records; the budget is half the cache. */
#define COST (OBJ + 8 * KIB)
#define AHEAD ((CACHE / 2) / COST)

static char tmp[256], srcdir[300], cachedir[300];

struct obj {
	char ds[8], key[16], etag[128];
	struct cache_object co;
};

static void pattern(char *buf, const char *ds, unsigned i)
{
	for (size_t k = 0; k < OBJ; k++)
		buf[k] = (char)(k * 31 + i * 7 + (unsigned char)ds[0]);
}

static int put_objects(const char *ds, unsigned n)
{
	char path[400], *buf = malloc(OBJ);
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	for (unsigned i = 0; i < n && !ret; i++) {
		int fd;

		snprintf(path, sizeof(path), "%s/%s%03u", srcdir, ds, i);
		pattern(buf, ds, i);
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd < 0 || write(fd, buf, OBJ) != (ssize_t)OBJ)
			ret = -EIO;
		if (fd >= 0)
			close(fd);
	}
	free(buf);
	return ret;
}

static int obj_init(struct obj *o, struct objstore *os, const char *ds,
		    unsigned i)
{
	struct objstore_info oi;
	int ret;

	snprintf(o->ds, sizeof(o->ds), "%s", ds);
	snprintf(o->key, sizeof(o->key), "%s%03u", ds, i);
	ret = objstore_head(os, o->key, &oi);
	if (ret)
		return ret;
	snprintf(o->etag, sizeof(o->etag), "%s", oi.etag);
	o->co = (struct cache_object){ .dataset = o->ds,
				       .os = os,
				       .key = o->key,
				       .etag = o->etag,
				       .size = OBJ };
	return 0;
}

static uint64_t fetches(struct cache *c)
{
	struct cache_stats st;

	cache_get_stats(c, &st);
	return st.fetches;
}

static void pause_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* Read object o whole and compare it with its pattern: 0 or 1. */
static int read_check(struct cache *c, struct obj *o, unsigned i, char *buf,
		      char *want)
{
	ssize_t got = cache_read(c, &o->co, 0, OBJ, buf);

	pattern(want, o->ds, i);
	if (got != (ssize_t)OBJ || memcmp(buf, want, OBJ)) {
		fprintf(stderr, "%s: read %zd bytes, or not the source's\n",
			o->key, got);
		return 1;
	}
	return 0;
}

static void test_stream(struct cache *c, struct obj *objs, char *buf,
			char *want)
{
	struct cache_object list[N];
	uint64_t f0 = fetches(c), worst = 0;

	for (unsigned i = 0; i < N; i++)
		list[i] = objs[i].co;
	CHECK_INT(cache_prefetch(c, list, N, 0), 0);
	/* Let it run ahead as far as it will (at most 10 s). */
	for (unsigned k = 0; k < 1000 && fetches(c) - f0 < AHEAD; k++)
		pause_ms(10);
	for (unsigned i = 0; i < N; i++) {
		uint64_t ahead;

		pause_ms(i < 2 ? 100 : 5);
		ahead = fetches(c) - f0 - i;
		if (ahead > worst)
			worst = ahead;
		if (ahead > AHEAD + 1) {
			fprintf(stderr,
				"entry %u: %llu fetched ahead, budget "
				"%u\n",
				i, (unsigned long long)ahead, (unsigned)AHEAD);
			check_failures++;
			break;
		}
		check_failures += read_check(c, &objs[i], i, buf, want);
	}
	/* Each block once: nothing fetched for the reader was evicted first. */
	CHECK_INT(fetches(c) - f0, N);
	CHECK(worst >= AHEAD / 2); /* it did run ahead */
}

static void test_idle(struct cache *c, struct obj *objs, struct obj *other,
		      char *buf, char *want)
{
	struct cache_object list[N];
	uint64_t f0 = fetches(c);
	bool fits = false;

	for (unsigned i = 0; i < N; i++)
		list[i] = objs[i].co;
	CHECK_INT(cache_prefetch(c, list, N, 0), 0);
	/* It may idle out before the budget is full: some held is enough. */
	for (unsigned k = 0; k < 1000 && fetches(c) - f0 < AHEAD / 4; k++)
		pause_ms(10);
	CHECK(fetches(c) - f0 >= AHEAD / 4);
	/* Once the idle prefetch let go, the other dataset is cached whole:
	 * a second pass fetches nothing (at most 20 tries, ~10 s). */
	for (unsigned t = 0; t < 20 && !fits; t++) {
		uint64_t f1;

		for (unsigned i = 0; i < N_OTHER; i++)
			check_failures +=
				read_check(c, &other[i], i, buf, want);
		f1 = fetches(c);
		for (unsigned i = 0; i < N_OTHER; i++)
			check_failures +=
				read_check(c, &other[i], i, buf, want);
		fits = fetches(c) == f1;
		if (!fits)
			pause_ms(500);
	}
	CHECK(fits);
}

int main(void)
{
	struct cachetest_saved sv;
	struct dstage_config *cfg = NULL;
	struct objstore *os = NULL;
	struct cache *c = NULL;
	struct obj *a = calloc(N, sizeof(*a)), *q = calloc(N, sizeof(*q));
	struct obj *r = calloc(N_OTHER, sizeof(*r));
	char *buf = malloc(OBJ), *want = malloc(OBJ);
	const char *t = getenv("TMPDIR");

	if (!a || !q || !r || !buf || !want)
		return 1;
	log_set_level(getenv("PF_DEBUG") ? LOG_LVL_DEBUG : LOG_LVL_WARN);
	snprintf(tmp, sizeof(tmp), "%s/dstage-pf-XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(tmp))
		return 77;
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	if (mkdir(srcdir, 0700) || mkdir(cachedir, 0700))
		return 1;
	CHECK_INT(put_objects("a", N), 0);
	CHECK_INT(put_objects("q", N), 0);
	CHECK_INT(put_objects("r", N_OTHER), 0);
	unsetenv("DSTAGE_PREFETCH_IDLE_S"); /* 30 s while streaming */
	cachetest_setup(&cfg, &os, cachedir, srcdir, BS, &sv);
	cfg->cache_size = CACHE;
	/* In flight, reservations may be counted twice for a moment (a scan
	 * meets them on disk and in c->inflight): keep that small beside the
	 * cache, or a fill finds no room and its block is fetched again. */
	cfg->s3_max_inflight = 4;
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	for (unsigned i = 0; c && i < N; i++) {
		CHECK_INT(obj_init(&a[i], os, "a", i), 0);
		CHECK_INT(obj_init(&q[i], os, "q", i), 0);
	}
	for (unsigned i = 0; c && i < N_OTHER; i++)
		CHECK_INT(obj_init(&r[i], os, "r", i), 0);
	if (c && !check_failures) {
		test_stream(c, a, buf, want);
		/* read when a prefetch starts (after this, in the worker that
		 * takes the next job) */
		setenv("DSTAGE_PREFETCH_IDLE_S", "1", 1);
		test_idle(c, q, r, buf, want);
	}
	cache_close(c);
	objstore_free(os);
	cachetest_free(cfg, &sv);
	{
		char cmd[400];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
		if (system(cmd))
			fprintf(stderr, "could not remove %s\n", tmp);
	}
	free(a);
	free(q);
	free(r);
	free(buf);
	free(want);
	return check_result();
}
