// SPDX-License-Identifier: MIT
/*
 * test_cache_lands: reads stay exact while the caps on landed fills
 * (lib/cache/cache.c: CACHE_LAND_MAX, 8 per open object; CACHE_LAND_BYTES,
 * 256 MiB in all, each land charged a whole fill buffer, CACHE_BATCH_BYTES)
 * push lands out, or keep them from landing, under readers that use them.
 *
 *  - one_object: 12 threads read disjoint parts of one cold object of
 *    200 MiB at once in pieces of about 100 KiB, half with cache_read, half
 *    with cache_read_iov (holding some iovecs into landed fills a while,
 *    then checking them again), so more than 8 fills land on the object at
 *    a time;
 *  - many_objects: 20 threads read 20 cold objects of 16 MiB at once, so
 *    more than 256 MiB of lands are wanted in all.
 * An object nobody reads drops its lands, so each object is kept in use
 * meanwhile by an anchor (a 1-byte read whose callback waits, as a reply
 * that is slow to go out).
 *
 * Every byte equals the source; each block is fetched once; afterwards every
 * object is present whole, and a second pass through a fresh cache_open
 * reads everything again with no fetch and no request to the source.
 * Sources are generated from a seed, never held in memory; the cache
 * writes through O_DIRECT and io_uring unless DSTAGE_NO_DIRECT=1 and
 * DSTAGE_NO_URING=1 (the unit_cache_lands_nouring run). About 1.1 GiB of
 * disk under $TMPDIR (or /tmp), a few seconds.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "util/uring.h"

#define KIB 1024u
#define MIB (1024u * KIB)
#define BS (1 * MIB) /* 16 blocks per fill: every land is charged 16 MiB */

#define BIG_SIZE (200 * MIB + 4321) /* one_object */
#define BIG_THREADS 12
#define SMALL_N 20 /* many_objects: objects, threads */
#define SMALL_SIZE (16 * MIB)
#define HOLD_US 300 /* how long a reader holds iovecs into landed fills */

static char tmp[256], srcdir[300], cachedir[300];
static struct dstage_config *cfg;
static struct objstore *os;

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* Bytes [off, off + len) of the source object made from seed. */
static void gen(uint64_t seed, uint64_t off, char *p, size_t len)
{
	while (len) {
		uint64_t v = mix(seed * 0x100000001b3ULL + off / 8);
		size_t at = off % 8, n = 8 - at < len ? 8 - at : len;

		memcpy(p, (char *)&v + at, n);
		p += n;
		off += n;
		len -= n;
	}
}

/* Whether p holds bytes [off, off + len) of seed's object; scratch has
 * room for len bytes. */
static bool same(uint64_t seed, uint64_t off, const char *p, size_t len,
		 char *scratch)
{
	gen(seed, off, scratch, len);
	return !memcmp(p, scratch, len);
}

struct src {
	char key[32], etag[OBJSTORE_ETAG_MAX];
	uint64_t seed;
	struct cache_object obj;
};

/* Write seed's object of size bytes as key in the source (straight into
 * the file:// store's directory: no fsync, no copy in memory). */
static void put_src(struct src *s, const char *key, uint64_t seed,
		    uint64_t size)
{
	size_t chunk = 4 * MIB;
	char path[400], *buf = malloc(chunk);
	struct objstore_info oi;
	int fd;

	snprintf(s->key, sizeof(s->key), "%s", key);
	snprintf(path, sizeof(path), "%s/%s", srcdir, key);
	s->seed = seed;
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECK(fd >= 0 && buf);
	for (uint64_t off = 0; fd >= 0 && buf && off < size; off += chunk) {
		size_t n = size - off < chunk ? size - off : chunk;

		gen(seed, off, buf, n);
		CHECK_INT(pwrite(fd, buf, n, (off_t)off), n);
	}
	if (fd >= 0)
		close(fd);
	free(buf);
	CHECK_INT(objstore_head(os, s->key, &oi), 0);
	CHECK_INT(oi.size, size);
	snprintf(s->etag, sizeof(s->etag), "%s", oi.etag);
	s->obj = (struct cache_object){ .dataset = "ds",
					.os = os,
					.key = s->key,
					.etag = s->etag,
					.size = size };
}

static struct cache *open_cache(void)
{
	struct cache *c = NULL;

	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	return c;
}

/* One reader thread: [from, to) of one object, in pieces of piece bytes. */
struct reader {
	struct cache *c;
	const struct src *s;
	uint64_t from, to;
	size_t piece;
	bool iov; /* cache_read_iov, else cache_read */
	char *buf, *scratch;
	/* cache_read_iov's sink: */
	uint64_t at; /* object offset of the next byte handed over */
	/* results */
	uint64_t bad; /* pieces (or iovecs) not equal to the source */
	uint64_t zero_copy; /* calls that got iovecs into landed fills */
	int err;
};

/* Count (and report the first few of) the pieces not equal to the source. */
static void bad_bytes(struct reader *r, uint64_t off, size_t len,
		      const char *how)
{
	if (r->bad++ < 3)
		fprintf(stderr,
			"%s: bytes %llu+%zu differ from the source (%s)\n",
			r->s->key, (unsigned long long)off, len, how);
}

/*
 * cache_read_iov's callback: check the bytes handed over against the
 * source. Iovecs into landed fills are held for HOLD_US, so that other
 * threads' fills push those lands out meanwhile, and checked again: a
 * landed buffer must stay intact while a reader uses it.
 */
static int sink(void *arg, const struct iovec *iov, int n)
{
	struct reader *r = arg;
	uint64_t at = r->at;
	bool landed = false;

	for (int i = 0; i < n; i++) {
		if (!same(r->s->seed, at, iov[i].iov_base, iov[i].iov_len,
			  r->scratch))
			bad_bytes(r, at, iov[i].iov_len, "cache_read_iov");
		if ((char *)iov[i].iov_base < r->buf ||
		    (char *)iov[i].iov_base >= r->buf + r->piece)
			landed = true;
		at += iov[i].iov_len;
	}
	r->zero_copy += landed;
	if (landed) {
		usleep(HOLD_US);
		at = r->at;
		for (int i = 0; i < n; i++) {
			if (!same(r->s->seed, at, iov[i].iov_base,
				  iov[i].iov_len, r->scratch))
				bad_bytes(r, at, iov[i].iov_len,
					  "a landed iovec changed while held");
			at += iov[i].iov_len;
		}
	}
	r->at = at;
	return 0;
}

static void *reader_main(void *arg)
{
	struct reader *r = arg;

	for (uint64_t off = r->from; off < r->to && !r->err;) {
		size_t len = r->to - off < r->piece ? r->to - off : r->piece;

		if (r->iov) {
			int ret;

			r->at = off;
			ret = cache_read_iov(r->c, &r->s->obj, off, len, r->buf,
					     0, sink, r);
			if (ret)
				r->err = ret;
			else if (r->at != off + len)
				r->err = -EIO; /* short */
		} else {
			ssize_t got =
				cache_read(r->c, &r->s->obj, off, len, r->buf);

			if (got != (ssize_t)len)
				r->err = got < 0 ? (int)got : -EIO;
			else if (!same(r->s->seed, off, r->buf, len,
				       r->scratch))
				bad_bytes(r, off, len, "cache_read");
		}
		if (r->err)
			fprintf(stderr, "%s: read %llu+%zu: %s\n", r->s->key,
				(unsigned long long)off, len,
				strerror(-r->err));
		off += len;
	}
	return NULL;
}

/*
 * An anchor keeps one object in use while its readers run: a read of its
 * last byte whose callback waits until they are done, as a reader whose
 * reply is slow to go out. An object nobody uses drops its landed fills,
 * so without it a lone reader's lands would go between two of its reads
 * and the caps would rarely be reached.
 */
struct anchors {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int holding; /* anchors in their callback */
	bool done; /* the readers are done */
};

struct anchor {
	struct cache *c;
	const struct src *s;
	struct anchors *all;
	bool ok;
	int err;
};

static int anchor_hold(void *arg, const struct iovec *iov, int n)
{
	struct anchor *a = arg;
	char want;

	gen(a->s->seed, a->s->obj.size - 1, &want, 1);
	a->ok = n == 1 && iov[0].iov_len == 1 &&
		*(char *)iov[0].iov_base == want;
	pthread_mutex_lock(&a->all->lock);
	a->all->holding++;
	pthread_cond_broadcast(&a->all->cond);
	while (!a->all->done)
		pthread_cond_wait(&a->all->cond, &a->all->lock);
	pthread_mutex_unlock(&a->all->lock);
	return 0;
}

static void *anchor_main(void *arg)
{
	struct anchor *a = arg;
	char b;

	a->err = cache_read_iov(a->c, &a->s->obj, a->s->obj.size - 1, 1, &b, 0,
				anchor_hold, a);
	if (a->err) { /* let run_readers go on */
		pthread_mutex_lock(&a->all->lock);
		a->all->holding++;
		pthread_cond_broadcast(&a->all->cond);
		pthread_mutex_unlock(&a->all->lock);
	}
	return NULL;
}

/*
 * Run the n readers of r at once, while an anchor holds each of the
 * nobj objects of s; returns the pieces they found wrong (read errors are
 * checked here) and adds their zero-copy calls to *zero_copy.
 */
static uint64_t run_readers(struct cache *c, const struct src *s, int nobj,
			    struct reader *r, int n, uint64_t *zero_copy)
{
	struct anchors all = { .lock = PTHREAD_MUTEX_INITIALIZER,
			       .cond = PTHREAD_COND_INITIALIZER };
	struct anchor a[64];
	pthread_t t[64], at[64];
	uint64_t bad = 0;

	for (int i = 0; i < nobj; i++) {
		a[i] = (struct anchor){ .c = c, .s = &s[i], .all = &all };
		CHECK_INT(pthread_create(&at[i], NULL, anchor_main, &a[i]), 0);
	}
	pthread_mutex_lock(&all.lock);
	while (all.holding < nobj)
		pthread_cond_wait(&all.cond, &all.lock);
	pthread_mutex_unlock(&all.lock);
	for (int i = 0; i < n; i++) {
		r[i].c = c;
		r[i].buf = malloc(r[i].piece);
		r[i].scratch = malloc(r[i].piece);
		CHECK(r[i].buf && r[i].scratch);
		CHECK_INT(pthread_create(&t[i], NULL, reader_main, &r[i]), 0);
	}
	for (int i = 0; i < n; i++) {
		pthread_join(t[i], NULL);
		CHECK_INT(r[i].err, 0);
		bad += r[i].bad;
		*zero_copy += r[i].zero_copy;
		free(r[i].buf);
		free(r[i].scratch);
	}
	pthread_mutex_lock(&all.lock);
	all.done = true;
	pthread_cond_broadcast(&all.cond);
	pthread_mutex_unlock(&all.lock);
	for (int i = 0; i < nobj; i++) {
		pthread_join(at[i], NULL);
		CHECK_INT(a[i].err, 0);
		CHECK(a[i].ok);
	}
	return bad;
}

/* Every object present whole. */
static void check_present(struct cache *c, const struct src *s, int n)
{
	for (int i = 0; i < n; i++) {
		uint64_t present = 0;

		CHECK_INT(cache_object_present(c, &s[i].obj, &present), 0);
		CHECK_INT(present, s[i].obj.size);
	}
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * Two passes over the objects of s (n of them) with the readers set up by
 * setup: the first, cold, fetches every block exactly once and leaves
 * every object whole; the second, through a fresh cache_open, fetches
 * nothing.
 */
/* Which cap a test's cold pass must run into. */
enum cap { CAP_PER_OBJECT, CAP_TOTAL };

static void two_passes(const char *name, const struct src *s, int n,
		       int (*setup)(const struct src *, struct reader *),
		       enum cap cap)
{
	struct reader r[64];
	uint64_t blocks = 0, bytes = 0;

	for (int i = 0; i < n; i++) {
		blocks += (s[i].obj.size + BS - 1) / BS;
		bytes += s[i].obj.size;
	}
	for (int pass = 0; pass < 2; pass++) {
		struct objstore_stats os0, os1;
		struct cache *c = open_cache();
		struct cache_stats st;
		uint64_t zc = 0;
		double t0 = now();
		int k;

		if (!c)
			return;
		objstore_get_stats(os, &os0);
		k = setup(s, r);
		CHECK_INT(run_readers(c, s, n, r, k, &zc), 0);
		/* The readers are done, but a readahead fill may still be in
		 * flight: it holds its object, whose landed fills go when it
		 * is idle. Wait for that (bounded: 30 s), then check. Read at
		 * once, land_bytes was once 48 MiB (a fill of the readahead
		 * landing after the last reader). */
		for (int i = 0; i < 3000; i++) {
			cache_get_stats(c, &st);
			if (!st.land_bytes)
				break;
			usleep(10000);
		}
		cache_get_stats(c, &st);
		objstore_get_stats(os, &os1);
		fprintf(stderr,
			"%s pass %d: %.2f s, %d threads, %llu iovec calls "
			"from landed fills; lands: peak %llu MiB of %llu, "
			"%llu refused, %llu displaced\n",
			name, pass, now() - t0, k, (unsigned long long)zc,
			(unsigned long long)(st.land_peak >> 20),
			(unsigned long long)(st.land_limit >> 20),
			(unsigned long long)st.lands_refused,
			(unsigned long long)st.lands_displaced);
		/* The caps hold, and nothing stays landed once the objects
		 * are idle. */
		CHECK(st.land_peak <= st.land_limit);
		CHECK_INT(st.land_bytes, 0);
		check_present(c, s, n);
		CHECK_INT(st.streamed, 0);
		CHECK_INT(st.checksum_failures, 0);
		if (pass == 0) {
			/* Each block fetched once, lands or not. */
			CHECK_INT(st.fetches, blocks);
			CHECK_INT(os1.bytes_in - os0.bytes_in, bytes);
			/* Some bytes were handed over from landed fills,
			 * and the cap under test was reached. */
			CHECK(zc > 0);
			CHECK(st.land_peak > 0);
			if (cap == CAP_PER_OBJECT)
				CHECK(st.lands_displaced > 0);
			else
				CHECK(st.lands_refused > 0);
		} else {
			CHECK_INT(st.fetches, 0);
			CHECK_INT(st.bytes_from_source, 0);
			CHECK_INT(os1.requests - os0.requests, 0);
		}
		cache_close(c);
	}
}

/* one_object: BIG_THREADS readers of disjoint parts of s[0]; the parts do
 * not end on block boundaries, so neighbours share a block. */
static int setup_one_object(const struct src *s, struct reader *r)
{
	uint64_t size = s[0].obj.size;

	for (int i = 0; i < BIG_THREADS; i++)
		r[i] = (struct reader){
			.s = &s[0],
			.from = size * (uint64_t)i / BIG_THREADS,
			.to = size * (uint64_t)(i + 1) / BIG_THREADS,
			.iov = i % 2,
			.piece = i % 2 ? 100 * KIB + 7 : 128 * KIB,
		};
	return BIG_THREADS;
}

/* many_objects: reader i reads s[i] from start to end. */
static int setup_many_objects(const struct src *s, struct reader *r)
{
	for (int i = 0; i < SMALL_N; i++)
		r[i] = (struct reader){
			.s = &s[i],
			.from = 0,
			.to = s[i].obj.size,
			.iov = i % 2,
			.piece = i % 2 ? 100 * KIB + 7 : 128 * KIB,
		};
	return SMALL_N;
}

static void test_one_object(void)
{
	struct src s[1];

	put_src(&s[0], "big.bin", 1, BIG_SIZE);
	two_passes("one_object", s, 1, setup_one_object, CAP_PER_OBJECT);
}

static void test_many_objects(void)
{
	struct src s[SMALL_N];

	for (int i = 0; i < SMALL_N; i++) {
		char key[32];

		snprintf(key, sizeof(key), "small-%02d.bin", i);
		put_src(&s[i], key, 100 + (uint64_t)i, SMALL_SIZE);
	}
	two_passes("many_objects", s, SMALL_N, setup_many_objects, CAP_TOTAL);
}

/* The tests, in a child process (see main). */
static int run_tests(void)
{
	struct rusage ru;
	char url[400];

	alarm(120); /* a hang kills the child: main reports it */
	if (getenv("DSTAGE_NO_URING") && uring_available()) {
		fprintf(stderr, "DSTAGE_NO_URING=1 did not disable io_uring\n");
		return 1;
	}
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	mkdir(srcdir, 0755);
	CHECK_INT(config_defaults(&cfg), 0);
	char *orig_dir = cfg->cache_dir, *orig_cat = cfg->catalog_path;

	cfg->cache_dir = cachedir;
	cfg->cache_block_size = BS;
	cfg->cache_size = 4ULL << 30; /* everything fits: no eviction */
	cfg->catalog_path = NULL;
	snprintf(url, sizeof(url), "file://%s/", srcdir);
	if (objstore_open(url, cfg, &os)) {
		fprintf(stderr, "cannot open the source %s\n", url);
		return 1;
	}

	test_one_object();
	test_many_objects();

	if (getrusage(RUSAGE_SELF, &ru) == 0)
		fprintf(stderr, "test_cache_lands: peak RSS %ld MiB\n",
			ru.ru_maxrss / 1024);
	objstore_free(os);
	cfg->cache_dir = orig_dir;
	cfg->catalog_path = orig_cat;
	config_free(cfg);
	return check_result();
}

/*
 * The tests run in a child, so that the temporary directory (about
 * 1.1 GiB) goes whatever becomes of them: a crash or a hang (killed after
 * 120 s) is a failure, not a leftover.
 */
int main(void)
{
	const char *base = getenv("TMPDIR");
	uint64_t need = 3ULL * (BIG_SIZE + SMALL_N * (uint64_t)SMALL_SIZE);
	struct statvfs sv;
	char cmd[300];
	int status = 0, ret;
	pid_t pid;

	log_set_level(LOG_LVL_ERROR);
	snprintf(tmp, sizeof(tmp), "%s/test_cache_lands.XXXXXX",
		 base && *base ? base : "/tmp");
	if (!mkdtemp(tmp))
		return 1;
	/* Sources and cache: 2 copies of 520 MiB, and some room. */
	if (statvfs(tmp, &sv) == 0 &&
	    (uint64_t)sv.f_bavail * sv.f_frsize < need) {
		fprintf(stderr,
			"test_cache_lands: %s has under %llu MiB free: "
			"skipped\n",
			tmp, (unsigned long long)(need >> 20));
		rmdir(tmp);
		return 77;
	}
	fflush(stderr);
	pid = fork();
	if (pid == 0)
		exit(run_tests());
	if (pid < 0 || waitpid(pid, &status, 0) != pid) {
		perror("test_cache_lands: fork/waitpid");
		ret = 1;
	} else if (WIFSIGNALED(status)) {
		fprintf(stderr, "test_cache_lands: killed by %s%s\n",
			strsignal(WTERMSIG(status)),
			WTERMSIG(status) == SIGALRM ? " (timed out: a hang?)"
						    : "");
		ret = 1;
	} else {
		ret = WEXITSTATUS(status);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
	if (system(cmd))
		ret = 1;
	return ret;
}
