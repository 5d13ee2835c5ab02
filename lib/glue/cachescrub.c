// SPDX-License-Identifier: MIT
/*
 * cachescrub: the cache's background scrub (see cachescrub.h, docs/cache.md).
 * Public cache calls only: cache_gc_list walks the object files,
 * cache_object_check re-reads an object's present blocks, and a damaged block
 * goes through cache_object_forget_block, then cache_fetch from the store
 * the catalog names for its dataset.
 *
 * The thread's state machine:
 *
 *   IDLE --next_start reached--> LOCKING
 *   LOCKING --OFD lock on <cache.dir>/scrub.lock taken--> COUNTING
 *           --held by another process--> IDLE (waiting_lock; retried in
 *             at most CACHESCRUB_RETRY_S)
 *   COUNTING --objects and bytes in the cache listed--> WALKING
 *   WALKING --every object checked--> IDLE (passes++, pass_end, the pass's
 *           start and end written into scrub.lock, next_start = start +
 *           interval)
 *   any --stop--> gone (a pass in progress ends after its object)
 *
 * Invariants:
 *   - at most one pass per cache directory at a time, across processes:
 *     a pass runs only while this process holds scrub.lock's OFD lock;
 *   - the bytes read stay within the pace (cachescrub_pace_wait): cache.
 *     scrub_rate a second, plus one second's credit and one object;
 *   - a damaged block is cleared (its record) before it is fetched again,
 *     so a failed fetch leaves it absent, never present with bad bytes;
 *   - every store opened stays open until cachescrub_stop: an idle open
 *     object of the cache may still point at it (cache_obj_get).
 *
 * Locks: s->lock protects s->stop and s->p (the progress); it is a leaf,
 * never held across I/O or a cache call. Everything else is the thread's.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dstage/cache.h"
#include "dstage/cachescrub.h"
#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/metrics.h"
#include "dstage/objstore.h"
#include "dstage/timeutil.h"

#define CACHESCRUB_RETRY_S 60 /* a lock held elsewhere: ask again */
#define CACHESCRUB_LOCK_FILE "scrub.lock"
#define CACHESCRUB_NICE 10 /* the thread's CPU share: below the readers' */

/* A dataset's store, opened for the scrub's repairs: once a pass (each
 * pass opens its stores anew, so a source moved or changed since the last
 * pass is read where the catalog says it is now). Only the scrub's
 * thread touches them. */
struct cachescrub_store {
	struct cachescrub_store *next;
	char *dataset, *source;
	struct objstore *os; /* NULL: could not be opened */
	uint64_t pass; /* the pass that last looked it up */
};

struct cachescrub {
	const struct dstage_config *cfg;
	struct cache *cache;
	pthread_t thread;
	bool started;
	pthread_mutex_t lock; /* s->stop, s->p; a leaf */
	pthread_cond_t cond; /* CLOCK_MONOTONIC; signalled by stop */
	bool stop;
	struct cachescrub_progress p;
	/* the thread's alone */
	struct catalog *cat;
	struct cachescrub_store *stores;
	struct cachescrub_pace pace;
	uint64_t pass; /* passes started */
	uint64_t *bad; /* damaged blocks of the object being checked */
	size_t nbad, badcap;
	bool bad_lost; /* one could not be kept (no memory) */
	char path[4096]; /* its cache file */
};

uint64_t cachescrub_pace_wait(struct cachescrub_pace *p, uint64_t now_ns,
			      uint64_t bytes)
{
	uint64_t floor = now_ns > CACHESCRUB_CREDIT_NS
				 ? now_ns - CACHESCRUB_CREDIT_NS
				 : 0;
	unsigned __int128 d;

	if (!p->rate)
		return 0;
	/* unused time older than the credit is lost: no burst after idling */
	if (p->next_ns < floor)
		p->next_ns = floor;
	/* rounded up: never a nanosecond early, however many reads */
	d = ((unsigned __int128)bytes * 1000000000u + p->rate - 1) / p->rate;
	p->next_ns = d > UINT64_MAX - p->next_ns ? UINT64_MAX
						 : p->next_ns + (uint64_t)d;
	return p->next_ns > now_ns ? p->next_ns - now_ns : 0;
}

int64_t cachescrub_next_start(int64_t start_s, uint64_t interval_ms,
			      int64_t now_s)
{
	int64_t next = start_s + (int64_t)(interval_ms / 1000);

	return next > now_s ? next : now_s;
}

/* Wait up to ns, or until stop. Returns true when stopping. */
static bool cachescrub_sleep(struct cachescrub *s, uint64_t ns)
{
	struct timespec ts;
	bool stop;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (time_t)(ns / 1000000000u);
	ts.tv_nsec += (long)(ns % 1000000000u);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&s->lock);
	while (!s->stop &&
	       pthread_cond_timedwait(&s->cond, &s->lock, &ts) != ETIMEDOUT)
		;
	stop = s->stop;
	pthread_mutex_unlock(&s->lock);
	return stop;
}

static bool cachescrub_stopping(struct cachescrub *s)
{
	bool stop;

	pthread_mutex_lock(&s->lock);
	stop = s->stop;
	pthread_mutex_unlock(&s->lock);
	return stop;
}

/* The store of dataset, looked up in the catalog once a pass; NULL when it
 * has none (not in the catalog, or its store cannot be opened). */
static struct objstore *cachescrub_store(struct cachescrub *s,
					 const char *dataset)
{
	struct catalog_dataset ds = { 0 };
	struct cachescrub_store *st, *found = NULL;
	int ret;

	for (st = s->stores; st; st = st->next)
		if (!strcmp(st->dataset, dataset) && st->pass == s->pass)
			return st->os;
	if (!s->cat && catalog_open(s->cfg->catalog_path, 0, &s->cat))
		s->cat = NULL; /* no catalog: no repairs; next pass again */
	if (!s->cat || catalog_dataset_get(s->cat, dataset, &ds))
		return NULL;
	for (st = s->stores; st && !found; st = st->next)
		if (!strcmp(st->dataset, dataset) &&
		    !strcmp(st->source, ds.source))
			found = st;
	if (!found) {
		found = calloc(1, sizeof(*found));
		if (found) {
			found->dataset = strdup(dataset);
			found->source = strdup(ds.source);
		}
		if (!found || !found->dataset || !found->source) {
			if (found) {
				free(found->dataset);
				free(found->source);
			}
			free(found);
			catalog_dataset_release(&ds);
			return NULL;
		}
		ret = objstore_open(ds.source, s->cfg, &found->os);
		if (ret) {
			log_warn("scrub: %s: its source %s cannot be opened "
				 "(%s): damaged blocks stay absent",
				 dataset, ds.source, strerror(-ret));
			found->os = NULL;
		}
		found->next = s->stores;
		s->stores = found;
	}
	/* a dataset whose source changed: the newer store wins the lookup */
	for (st = s->stores; st; st = st->next)
		if (!strcmp(st->dataset, dataset) && st != found)
			st->pass = 0;
	found->pass = s->pass;
	catalog_dataset_release(&ds);
	return found->os;
}

static void cachescrub_stores_free(struct cachescrub *s)
{
	struct cachescrub_store *st, *next;

	for (st = s->stores; st; st = next) {
		next = st->next;
		objstore_free(st->os);
		free(st->dataset);
		free(st->source);
		free(st);
	}
	s->stores = NULL;
}

static void cachescrub_bad(void *arg, uint64_t block, const char *path)
{
	struct cachescrub *s = arg;

	snprintf(s->path, sizeof(s->path), "%s", path);
	if (GROW_ONE(s->bad, s->nbad, s->badcap, 16)) {
		s->bad_lost = true; /* found again next pass */
		return;
	}
	s->bad[s->nbad++] = block;
}

/* A damaged block: cleared, then fetched again when the source allows. */
static void cachescrub_damaged(struct cachescrub *s,
			       const struct cache_object *obj, uint64_t b)
{
	uint64_t bs = cache_block_size(s->cache);
	int ret = cache_object_forget_block(s->cache, obj, b);

	if (ret) {
		log_error("scrub: %s/%s: block %" PRIu64 " (cache file %s) "
			  "failed its checksum, and clearing its record "
			  "failed (%s): readers check it and fetch it again",
			  obj->dataset, obj->key, b, s->path, strerror(-ret));
	}
	ret = obj->os ? cache_fetch(s->cache, obj, b * bs, bs, NULL, NULL)
		      : -ENXIO;
	pthread_mutex_lock(&s->lock);
	s->p.damaged++;
	if (ret)
		s->p.unrepaired++;
	else
		s->p.repaired++;
	pthread_mutex_unlock(&s->lock);
	if (!ret)
		log_warn("scrub: %s/%s: block %" PRIu64 " (cache file %s) "
			 "failed its checksum: fetched again from %s",
			 obj->dataset, obj->key, b, s->path,
			 objstore_url(obj->os));
	else
		log_error("scrub: %s/%s: block %" PRIu64 " (cache file %s) "
			  "failed its checksum: dropped from the cache and "
			  "not fetched again (%s); readers fetch it from the "
			  "source",
			  obj->dataset, obj->key, b, s->path,
			  ret == -ENXIO	   ? "the dataset's source is not "
					     "known or cannot be opened"
			  : ret == -ESTALE ? "the source object changed"
					   : strerror(-ret));
}

static int cachescrub_count(void *arg, const struct cache_gc_file *f)
{
	struct cachescrub *s = arg;

	if (!f->object)
		return 0;
	pthread_mutex_lock(&s->lock);
	s->p.objects_total++;
	s->p.bytes_total += f->bytes;
	pthread_mutex_unlock(&s->lock);
	return cachescrub_stopping(s);
}

static int cachescrub_one(void *arg, const struct cache_gc_file *f)
{
	struct cachescrub *s = arg;
	struct cache_check chk = { .bad_fn = cachescrub_bad, .arg = s };
	uint64_t bs = cache_block_size(s->cache), bytes;
	struct cache_object obj = {
		.dataset = f->dataset,
		.key = f->key,
		.etag = f->etag,
		.size = f->size,
	};
	int ret;

	if (!f->object)
		return cachescrub_stopping(s);
	obj.os = cachescrub_store(s, f->dataset);
	s->nbad = 0;
	s->bad_lost = false;
	ret = cache_object_check(s->cache, &obj, &chk);
	if (ret && ret != -ENOENT) /* -ENOENT: evicted meanwhile */
		log_warn("scrub: %s/%s: reading its blocks in the cache "
			 "failed: %s",
			 f->dataset, f->key, strerror(-ret));
	for (size_t i = 0; i < s->nbad; i++)
		cachescrub_damaged(s, &obj, s->bad[i]);
	bytes = chk.present * bs < f->size ? chk.present * bs : f->size;
	pthread_mutex_lock(&s->lock);
	s->p.objects++;
	s->p.objects_all++;
	s->p.bytes += bytes;
	s->p.bytes_all += bytes;
	pthread_mutex_unlock(&s->lock);
	return cachescrub_sleep(
		s, cachescrub_pace_wait(&s->pace, (uint64_t)timeutil_mono_ns(),
					bytes));
}

/* The last pass's start and end, from scrub.lock ("" when none). */
static void cachescrub_state_read(int fd, int64_t *start, int64_t *end)
{
	char buf[128];
	long long a, b;
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	if (n <= 0)
		return;
	buf[n] = '\0';
	if (sscanf(buf, "dstage-scrub 1\nlast_start %lld\nlast_end %lld", &a,
		   &b) == 2 &&
	    a > 0 && b >= a) {
		*start = a;
		*end = b;
	}
}

static void cachescrub_state_write(const struct cachescrub *s, int fd,
				   int64_t start, int64_t end)
{
	char buf[128];
	int n = snprintf(buf, sizeof(buf),
			 "dstage-scrub 1\nlast_start %lld\nlast_end %lld\n",
			 (long long)start, (long long)end);

	if (ftruncate(fd, 0) || pwrite(fd, buf, (size_t)n, 0) != n)
		log_warn("scrub: writing %s/%s: %s", s->cfg->cache_dir,
			 CACHESCRUB_LOCK_FILE, strerror(errno));
}

/* scrub.lock, opened (created 0600); -errno. */
static int cachescrub_lock_open(const struct cachescrub *s)
{
	char path[4096];
	struct stat st;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", s->cfg->cache_dir,
		 CACHESCRUB_LOCK_FILE);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	/* left wider by an older release or a chmod -R: as the cache's
	 * own files (cache.c), tightened, never refused */
	if (!fstat(fd, &st) && (st.st_mode & 077)) {
		if (fchmod(fd, 0600))
			log_warn("cache: cannot tighten %s to 0600: %s", path,
				 strerror(errno));
		else
			log_info("cache: tightened %s from %04o to 0600", path,
				 (unsigned)(st.st_mode & 07777));
	}
	return fd;
}

/* One pass, under scrub.lock. Returns 0 (done or stopped), -EBUSY (another
 * process scrubs this cache) or -errno (logged). */
static int cachescrub_pass(struct cachescrub *s)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	int64_t start, end;
	int fd, ret;

	fd = cachescrub_lock_open(s);
	if (fd < 0) {
		log_warn("scrub: opening %s/%s: %s", s->cfg->cache_dir,
			 CACHESCRUB_LOCK_FILE, strerror(-fd));
		return fd;
	}
	if (fcntl(fd, F_OFD_SETLK, &fl)) {
		ret = errno == EAGAIN || errno == EACCES ? -EBUSY : -errno;
		close(fd);
		return ret;
	}
	start = timeutil_real_s();
	s->pass++;
	cachescrub_stores_free(s);
	pthread_mutex_lock(&s->lock);
	s->p.waiting_lock = false;
	s->p.running = true;
	s->p.pass_start = start;
	s->p.objects = s->p.objects_total = 0;
	s->p.bytes = s->p.bytes_total = 0;
	pthread_mutex_unlock(&s->lock);
	log_info("scrub: pass %" PRIu64 " over %s starts (at most %" PRIu64
		 " bytes/s)",
		 s->pass, s->cfg->cache_dir, s->cfg->cache_scrub_rate);
	ret = cache_gc_list(s->cache, cachescrub_count, s);
	if (!ret)
		ret = cache_gc_list(s->cache, cachescrub_one, s);
	end = timeutil_real_s();
	pthread_mutex_lock(&s->lock);
	s->p.running = false;
	if (!ret) {
		s->p.passes++;
		s->p.pass_end = end;
	}
	pthread_mutex_unlock(&s->lock);
	if (ret < 0)
		log_warn("scrub: listing %s/objects: %s", s->cfg->cache_dir,
			 strerror(-ret));
	if (!ret) {
		struct cachescrub_progress p;

		cachescrub_get(s, &p);
		cachescrub_state_write(s, fd, start, end);
		log_info("scrub: pass %" PRIu64 " done in %lld s: %" PRIu64
			 " objects, %" PRIu64 " bytes checked; %" PRIu64
			 " damaged blocks found, %" PRIu64 " repaired, %" PRIu64
			 " not repaired since start",
			 s->pass, (long long)(end - start), p.objects, p.bytes,
			 p.damaged, p.repaired, p.unrepaired);
	}
	close(fd); /* the OFD lock goes with it */
	return ret > 0 ? 0 : ret;
}

/* After a pass that could not run: the interval, at most
 * CACHESCRUB_RETRY_S (another process may stop scrubbing any time). */
static int64_t cachescrub_retry_s(const struct dstage_config *cfg)
{
	int64_t s = (int64_t)(cfg->cache_scrub_interval_ms / 1000) + 1;

	return s < CACHESCRUB_RETRY_S ? s : CACHESCRUB_RETRY_S;
}

static void *cachescrub_thread(void *arg)
{
	struct cachescrub *s = arg;
	pid_t tid = (pid_t)syscall(SYS_gettid);
	int64_t last_start = 0, last_end = 0;
	bool told = false;
	int fd;

	/* CPU and disk below the readers': nice 10, best-effort I/O class at
	 * its lowest level (not idle: the pass must end within its period) */
	if (setpriority(PRIO_PROCESS, (id_t)tid, CACHESCRUB_NICE))
		log_debug("scrub: setpriority: %s", strerror(errno));
	if (syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, tid,
		    (2 << 13) | 7 /* IOPRIO_CLASS_BE, level 7 */))
		log_debug("scrub: ioprio_set: %s", strerror(errno));
	fd = cachescrub_lock_open(s);
	if (fd >= 0) {
		cachescrub_state_read(fd, &last_start, &last_end);
		close(fd);
	}
	pthread_mutex_lock(&s->lock);
	s->p.pass_start = last_start;
	s->p.pass_end = last_end;
	s->p.next_start =
		last_start
			? cachescrub_next_start(last_start,
						s->cfg->cache_scrub_interval_ms,
						timeutil_real_s())
			: timeutil_real_s();
	pthread_mutex_unlock(&s->lock);
	for (;;) {
		int64_t now = timeutil_real_s(), next, start;
		int ret;

		pthread_mutex_lock(&s->lock);
		next = s->p.next_start;
		pthread_mutex_unlock(&s->lock);
		if (next > now) {
			uint64_t wait = (uint64_t)(next - now);

			if (cachescrub_sleep(s, wait * 1000000000u))
				break;
			continue;
		}
		ret = cachescrub_pass(s);
		if (cachescrub_stopping(s))
			break;
		now = timeutil_real_s();
		pthread_mutex_lock(&s->lock);
		start = s->p.pass_start;
		s->p.waiting_lock = ret == -EBUSY;
		if (ret)
			next = now + cachescrub_retry_s(s->cfg);
		else
			next = cachescrub_next_start(
				start, s->cfg->cache_scrub_interval_ms, now);
		s->p.next_start = next;
		pthread_mutex_unlock(&s->lock);
		if (ret == -EBUSY && !told)
			log_info("scrub: another process scrubs %s (it holds "
				 "%s/%s): this one waits",
				 s->cfg->cache_dir, s->cfg->cache_dir,
				 CACHESCRUB_LOCK_FILE);
		told = ret == -EBUSY;
		if (!ret && next <= now)
			log_warn("scrub: a pass over %s took longer than "
				 "cache.scrub_interval: raise cache.scrub_rate "
				 "or the interval",
				 s->cfg->cache_dir);
	}
	return NULL;
}

int cachescrub_start(const struct dstage_config *cfg, struct cache *c,
		     struct cachescrub **out)
{
	struct cachescrub *s = calloc(1, sizeof(*s));
	pthread_condattr_t ca;

	*out = NULL;
	if (!s)
		return -ENOMEM;
	s->cfg = cfg;
	s->cache = c;
	s->pace.rate = cfg->cache_scrub_rate;
	s->p.enabled = cfg->cache_scrub_rate > 0 && c;
	s->p.rate = cfg->cache_scrub_rate;
	s->p.interval_ms = cfg->cache_scrub_interval_ms;
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (s->p.enabled) {
		if (pthread_create(&s->thread, NULL, cachescrub_thread, s)) {
			cachescrub_stop(s);
			return -EAGAIN;
		}
		s->started = true;
	}
	*out = s;
	return 0;
}

void cachescrub_stop(struct cachescrub *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->stop = true;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	if (s->started)
		pthread_join(s->thread, NULL);
	cachescrub_stores_free(s);
	catalog_close(s->cat);
	free(s->bad);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

void cachescrub_get(struct cachescrub *s, struct cachescrub_progress *p)
{
	memset(p, 0, sizeof(*p));
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	*p = s->p;
	pthread_mutex_unlock(&s->lock);
}

void cachescrub_collect(void *arg, struct metrics_buf *b)
{
	struct cachescrub_progress p;

	cachescrub_get(arg, &p);
	metrics_gauge(b, "dstage_scrub_enabled",
		      "1 when this process scrubs the cache (cache.scrub_rate "
		      "above 0)",
		      p.enabled);
	metrics_counter(
		b, "dstage_scrub_bytes_total",
		"Bytes of cached blocks re-read and checked by the scrub",
		p.bytes_all);
	metrics_counter(b, "dstage_scrub_objects_total",
			"Cached objects checked by the scrub", p.objects_all);
	metrics_counter(b, "dstage_scrub_damaged_blocks_total",
			"Cached blocks the scrub found failing their checksum",
			p.damaged);
	metrics_counter(
		b, "dstage_scrub_repaired_blocks_total",
		"Damaged blocks the scrub fetched again from the source",
		p.repaired);
	metrics_counter(b, "dstage_scrub_unrepaired_blocks_total",
			"Damaged blocks the scrub dropped and could not fetch "
			"again (source unreachable)",
			p.unrepaired);
	metrics_counter(b, "dstage_scrub_passes_total",
			"Scrub passes finished over the whole cache", p.passes);
	metrics_gauge(b, "dstage_scrub_pass_progress",
		      "Share of the cache's bytes the current (or last) pass "
		      "has checked, 0 to 1",
		      p.bytes_total ? (p.bytes >= p.bytes_total
					       ? 1.0
					       : (double)p.bytes /
							 (double)p.bytes_total)
		      : p.running   ? 0.0
				    : 1.0);
	metrics_gauge(b, "dstage_scrub_last_pass_end_timestamp_seconds",
		      "When the last finished scrub pass ended (0: none yet)",
		      (double)p.pass_end);
}
