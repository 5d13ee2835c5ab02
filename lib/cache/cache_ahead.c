// SPDX-License-Identifier: MIT
/*
 * cache_ahead.c, layer 5 of the cache (lib/cache/cache_i.h draws all seven):
 * readahead and known-order prefetch, run by CACHE_POOL_THREADS workers.
 * Calls layers 2 to 4.
 *
 * A job (struct cache_job) is queued on c->jobs (c->lock, c->jobs_cv) and
 * taken by one worker:
 *   READAHEAD: blocks [b0, b0 + n) of an open object (a reference): filled
 *     if absent (never waiting for blocks others fill), checked if present
 *     and not yet verified. At most CACHE_MAX_JOBS queued; more are dropped.
 *   PREFETCH: a list of objects of one dataset, fetched in list order,
 *     up to s3.max_inflight objects at once (CACHE_PREFETCH_MAX at most:
 *     the worker and helper threads it starts, struct cache_pf), each in
 *     steps of window / threads bytes, so at most window bytes in flight;
 *     and at most a budget (half of cache.size) ahead of its reader: what
 *     it fetched is held, safe from eviction, until the reader read it,
 *     and when the budget is full it waits for the reader instead of
 *     evicting (struct cache_pf has the states). It stops as soon as a
 *     newer prefetch of the dataset bumps the dataset's pf_gen, the cache
 *     stops, or its reader read nothing of it for CACHE_PF_IDLE_S.
 * Sequential detection (cache_access, o->lock): a read that continues the
 * stream doubles the object's window up to cache.readahead_max blocks and
 * queues the blocks past the read; any other read resets it.
 * Idle: a worker that waited CACHE_BUF_IDLE_S for a job trims the fill
 * buffers kept for streams (cache_buf_trim).
 * Stopping (cache_ahead_stop): c->stopping set under c->lock, workers
 * joined, queued jobs freed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache_i.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"

static void cache_job_free(struct cache_job *j)
{
	if (!j)
		return;
	cache_obj_put(j->o);
	for (size_t i = 0; i < j->nobjs; i++) {
		free((char *)j->objs[i].dataset);
		free((char *)j->objs[i].key);
		free((char *)j->objs[i].etag);
	}
	free(j->objs);
	free(j->dataset);
	free(j);
}

/* Queue a job; drops it (returns -EBUSY) when the queue is full. */
static int cache_job_push(struct cache *c, struct cache_job *j)
{
	pthread_mutex_lock(&c->lock);
	if (c->stopping || !c->npool ||
	    (j->kind == CACHE_JOB_READAHEAD && c->njobs >= CACHE_MAX_JOBS)) {
		pthread_mutex_unlock(&c->lock);
		return -EBUSY;
	}
	j->next = NULL;
	*c->jobs_tail = j;
	c->jobs_tail = &j->next;
	c->njobs++;
	pthread_cond_signal(&c->jobs_cv);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/*
 * One prefetch (struct cache_pf), run by the worker that took the job and
 * up to CACHE_PREFETCH_MAX - 1 helper threads it starts. Every field marked
 * c->lock is under c->lock; pf->cv waits with it.
 *
 * An entry of the list goes:
 *
 *   LISTED --take (in list order, within the budget)--> HELD IN FLIGHT (a
 *     struct cache_pf_hold, named as the object's file, its cost charged)
 *     --object opened: the hold keeps a reference, fetched--> HELD
 *   HELD IN FLIGHT|HELD --a read reaches its last byte--> (read)
 *   HELD (read, or CACHE_PF_LAG entries behind the furthest entry read)
 *     --> released (reference put, cost uncharged)
 *   HELD* --the fetch failed or found no room, the prefetch ends (list
 *     done and all released, replaced, cache stopping, or its reader idle
 *     for pf->idle_ms)--> released
 *   LISTED --listed twice (held already), or the reader already read an
 *     entry at or after it--> skipped
 *
 * Invariants:
 *   - pf->charged is the cost of pf->holds, pf->ncharged their number; a
 *     take leaves pf->charged <= the budget (a share of cache.size,
 *     cache_pf_budget) and pf->ncharged <= pf->max_held, except that an
 *     entry is always taken when nothing is held (an object larger than
 *     the budget still goes, alone).
 *   - pf->pos is 1 + the furthest entry of the list a read through the
 *     cache touched (cache_access looks the object up in pf->keys while
 *     c->pf_running, the number of prefetches in c->pfs, is not 0); the
 *     prefetch never takes an entry behind it.
 *   - A hold exists from the take on, so a read of the entry is seen even
 *     when it comes before the prefetch opened the object; a hold is
 *     released only once its fetch is over (landed), by whoever sees it.
 *   - A held object that was opened is IN USE (the hold's reference keeps
 *     the shared lock on its in-use byte), so no eviction, of this process
 *     or another, can take it: what the reader has not read yet stays, and
 *     a fill that needs room evicts what was read (or what is not the
 *     list's).
 *   - When the budget is full the takers wait on pf->cv (woken by the
 *     reader, a newer prefetch of the dataset or cache_ahead_stop; at most
 *     CACHE_PF_TICK_MS at a time) instead of evicting anything.
 *   - A prefetch ends with no hold: every one is released before its struct
 *     leaves c->pfs.
 * Locks: c->lock only, and nothing is taken while holding it here; a
 * released hold's reference is put (cache_obj_put takes c->lock) after it
 * was dropped.
 */
struct cache_pf_hold {
	struct cache_pf_hold *next; /* in pf->holds */
	char name[33]; /* the object's file (cache_obj_name) */
	struct cache_obj *o; /* a reference once opened, or NULL (c->lock) */
	size_t idx; /* its list entry */
	uint64_t cost; /* charged */
	bool landed; /* the fetch is over (c->lock) */
	bool read; /* its last byte read, or no use keeping it (c->lock) */
};

/* A list entry found by its object's name (the first 64 bits of it). */
struct cache_pf_key {
	uint64_t h;
	size_t idx;
};

struct cache_pf {
	struct cache *c;
	struct cache_job *j;
	struct cache_pf *next; /* in c->pfs (c->lock) */
	uint64_t step; /* blocks per step, window / threads */
	int64_t idle_ms; /* reader idle this long: the prefetch ends */
	size_t max_held; /* entries charged at once, at most */
	struct cache_pf_key *keys; /* the list's objects, by key (set first) */
	pthread_cond_t cv; /* with c->lock */
	/* c->lock: */
	size_t next_ent; /* next list entry to take */
	bool stop; /* replaced, stopping or idle */
	bool idle; /* ended because the reader went idle */
	uint64_t charged, peak;
	size_t ncharged;
	size_t pos; /* 1 + the furthest entry the reader read */
	int64_t progress_ms; /* when the reader last read an entry */
	struct cache_pf_hold *holds;
};

/* DSTAGE_PREFETCH_IDLE_S (seconds, may be fractional) or CACHE_PF_IDLE_S. */
static int64_t cache_pf_idle_ms(void)
{
	const char *v = getenv("DSTAGE_PREFETCH_IDLE_S");
	char *end = NULL;
	double s;

	if (!v || !*v)
		return CACHE_PF_IDLE_S * 1000;
	s = strtod(v, &end);
	if (*end || !(s > 0) || s > 86400) {
		log_warn("cache: DSTAGE_PREFETCH_IDLE_S=%s is not a number of "
			 "seconds in (0, 86400]: using %d",
			 v, CACHE_PF_IDLE_S);
		return CACHE_PF_IDLE_S * 1000;
	}
	return s * 1000 < 1 ? 1 : (int64_t)(s * 1000);
}

/* c->lock held: whether j is still its dataset's prefetch. */
static bool cache_pf_current(struct cache *c, const struct cache_job *j)
{
	for (struct cache_ds *d = c->ds; d; d = d->next)
		if (!strcmp(d->name, j->dataset))
			return d->pf_gen == j->gen && !c->stopping;
	return false;
}

/* c->lock held: wake every prefetch's takers (replaced, or stopping). */
static void cache_pf_wake_all(struct cache *c)
{
	for (struct cache_pf *pf = c->pfs; pf; pf = pf->next)
		pthread_cond_broadcast(&pf->cv);
}

/* c->lock held: pf's hold named name, or NULL. */
static struct cache_pf_hold *cache_pf_find(const struct cache_pf *pf,
					   const char *name)
{
	for (struct cache_pf_hold *h = pf->holds; h; h = h->next)
		if (!memcmp(h->name, name, 32))
			return h;
	return NULL;
}

/* How far ahead of its reader pf may run, bytes: a share of the capacity
 * and of its dataset's quota. Takes c->lock. */
static uint64_t cache_pf_budget(struct cache_pf *pf)
{
	struct cache_usage u;
	uint64_t b = atomic_load(&pf->c->capacity) / CACHE_PF_SHARE;

	cache_usage_of(pf->c, pf->j->dataset, &u);
	if (u.pol.quota && u.pol.quota / CACHE_PF_SHARE < b)
		b = u.pol.quota / CACHE_PF_SHARE;
	return b;
}

/* The disk bytes an entry takes once fetched: blocks, header, records. */
static uint64_t cache_pf_cost(const struct cache *c,
			      const struct cache_object *ob)
{
	uint64_t nblocks = (ob->size + c->bs - 1) / c->bs;

	return cache_roundup(ob->size, CACHE_ALIGN) +
	       cache_roundup(CACHE_ALIGN + nblocks * sizeof(struct cache_rec),
			     CACHE_ALIGN);
}

/* c->lock held: release the holds that are done with (all when all, once
 * every fetch is over): fetched and read, or fetched and CACHE_PF_LAG
 * entries behind the reader. Returns them, for cache_pf_put_holds. */
static struct cache_pf_hold *cache_pf_collect(struct cache_pf *pf, bool all)
{
	struct cache_pf_hold **pp = &pf->holds, *done = NULL;

	while (*pp) {
		struct cache_pf_hold *h = *pp;

		if (all || (h->landed &&
			    (h->read || h->idx + CACHE_PF_LAG < pf->pos))) {
			*pp = h->next;
			pf->charged -= h->cost;
			pf->ncharged--;
			h->next = done;
			done = h;
		} else {
			pp = &h->next;
		}
	}
	if (done)
		pthread_cond_broadcast(&pf->cv);
	return done;
}

/* Put the references of released holds and free them (no lock held). */
static void cache_pf_put_holds(struct cache_pf_hold *h)
{
	while (h) {
		struct cache_pf_hold *next = h->next;

		cache_obj_put(h->o);
		free(h);
		h = next;
	}
}

static int cache_pf_key_cmp(const void *a, const void *b)
{
	const struct cache_pf_key *x = a, *y = b;

	if (x->h != y->h)
		return x->h < y->h ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* The list entry of the object named name, or -ENOENT. */
static int cache_pf_lookup(const struct cache_pf *pf, const char *name,
			   size_t *idx)
{
	uint64_t h = cache_name_key(name);
	size_t lo = 0, hi = pf->j->nobjs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (pf->keys[mid].h < h)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == pf->j->nobjs || pf->keys[lo].h != h)
		return -ENOENT;
	*idx = pf->keys[lo].idx;
	return 0;
}

/* A read of [off, off + len) of o while prefetches run: if o is one of
 * their entries, its reader moved on (progress, position), and once it
 * read o's last byte a hold on o is let go. */
static void cache_pf_read(struct cache_obj *o, uint64_t off, size_t len)
{
	struct cache *c = o->c;
	struct cache_pf_hold *done = NULL;

	pthread_mutex_lock(&c->lock);
	for (struct cache_pf *pf = c->pfs; pf; pf = pf->next) {
		struct cache_pf_hold *h, *d;
		size_t idx;

		if (cache_pf_lookup(pf, o->name, &idx))
			continue;
		pf->progress_ms = timeutil_mono_ms();
		if (idx + 1 > pf->pos)
			pf->pos = idx + 1;
		h = cache_pf_find(pf, o->name);
		if (h && off + len >= o->size)
			h->read = true;
		d = cache_pf_collect(pf, false);
		while (d) {
			struct cache_pf_hold *next = d->next;

			d->next = done;
			done = d;
			d = next;
		}
		pthread_cond_broadcast(&pf->cv);
	}
	pthread_mutex_unlock(&c->lock);
	cache_pf_put_holds(done);
}

/*
 * c->lock held: wait for the reader (or a stop) at most CACHE_PF_TICK_MS.
 * Returns 0, or -ETIMEDOUT when the reader read nothing of the list for
 * pf->idle_ms (pf->stop and pf->idle are then set).
 */
static int cache_pf_wait(struct cache_pf *pf)
{
	int64_t now = timeutil_mono_ms(), until = pf->progress_ms + pf->idle_ms;
	struct timespec ts;

	if (now >= until) {
		pf->stop = true;
		pf->idle = true;
		pthread_cond_broadcast(&pf->cv);
		return -ETIMEDOUT;
	}
	if (until > now + CACHE_PF_TICK_MS)
		until = now + CACHE_PF_TICK_MS;
	ts.tv_sec = until / 1000;
	ts.tv_nsec = (long)(until % 1000) * 1000000;
	pthread_cond_timedwait(&pf->cv, &pf->c->lock, &ts);
	return 0;
}

/*
 * Take the next entry in list order once the budget has room for it: its
 * hold (charged, listed), or NULL when the list is done or the prefetch
 * stopped.
 */
static struct cache_pf_hold *cache_pf_take(struct cache_pf *pf)
{
	struct cache *c = pf->c;
	const struct cache_job *j = pf->j;
	uint64_t budget = cache_pf_budget(pf);
	struct cache_pf_hold *h = calloc(1, sizeof(*h)), *ret = NULL;

	if (!h)
		return NULL;
	pthread_mutex_lock(&c->lock);
	while (!pf->stop) {
		const struct cache_object *ob;
		uint64_t k;

		if (!cache_pf_current(c, j)) {
			pf->stop = true;
			pthread_cond_broadcast(&pf->cv);
			break;
		}
		if (pf->next_ent < pf->pos)
			pf->next_ent = pf->pos; /* the reader is past them */
		if (pf->next_ent >= j->nobjs)
			break;
		ob = &j->objs[pf->next_ent];
		if (!ob->size) {
			pf->next_ent++;
			continue;
		}
		cache_obj_name(ob, h->name);
		if (cache_pf_find(pf, h->name)) {
			pf->next_ent++; /* held already (listed twice) */
			continue;
		}
		k = cache_pf_cost(c, ob);
		if (!pf->ncharged || (pf->charged + k <= budget &&
				      pf->ncharged < pf->max_held)) {
			h->idx = pf->next_ent++;
			h->cost = k;
			h->next = pf->holds;
			pf->holds = h;
			pf->charged += k;
			pf->ncharged++;
			if (pf->charged > pf->peak)
				pf->peak = pf->charged;
			ret = h;
			break;
		}
		cache_pf_wait(pf); /* the budget is full: for the reader */
	}
	pthread_mutex_unlock(&c->lock);
	if (!ret)
		free(h);
	return ret;
}

/* The fetch of h's object (o: our reference, or NULL) is over: o held for
 * the reader, or released when it was read meanwhile or is not worth
 * keeping (drop). */
static void cache_pf_landed(struct cache_pf *pf, struct cache_pf_hold *h,
			    struct cache_obj *o, bool drop)
{
	struct cache_pf_hold *done;

	pthread_mutex_lock(&pf->c->lock);
	h->o = o;
	h->landed = true;
	if (drop || !o)
		h->read = true;
	done = cache_pf_collect(pf, false);
	pthread_mutex_unlock(&pf->c->lock);
	cache_pf_put_holds(done);
}

static bool cache_pf_going(struct cache_pf *pf)
{
	bool go;

	pthread_mutex_lock(&pf->c->lock);
	if (!cache_pf_current(pf->c, pf->j))
		pf->stop = true;
	go = !pf->stop;
	pthread_mutex_unlock(&pf->c->lock);
	return go;
}

static void *cache_pf_run(void *arg)
{
	struct cache_pf *pf = arg;
	struct cache_pf_hold *h;

	while ((h = cache_pf_take(pf))) {
		const struct cache_object *ob = &pf->j->objs[h->idx];
		struct cache_obj *o = NULL;
		bool no_space = false, failed = false;

		if (cache_obj_get(pf->c, ob, true, &o) || !o) {
			cache_pf_landed(pf, h, NULL, true);
			continue;
		}
		/* No room (cache.size taken by what is pinned, busy, held
		 * or not yet evictable): the rest of this object is not
		 * kept. */
		for (uint64_t b = 0; b < o->nblocks && !no_space;
		     b += pf->step) {
			uint64_t e = b + pf->step < o->nblocks ? b + pf->step
							       : o->nblocks;

			if (!cache_pf_going(pf) ||
			    cache_obj_range(o, b, e, true, false, NULL,
					    &no_space)) {
				failed = true;
				break;
			}
		}
		/* The reader finds it in the file; landed fills kept while
		 * it waits would hold memory. */
		pthread_mutex_lock(&o->lock);
		cache_lands_drop(o);
		pthread_mutex_unlock(&o->lock);
		cache_pf_landed(pf, h, o, no_space || failed);
		if (!cache_pf_going(pf))
			break;
	}
	return NULL;
}

/* Keep up to s3.max_inflight (at most CACHE_PREFETCH_MAX) list entries in
 * flight, within the job's window and the budget; then hold what is not
 * read yet until it is, the prefetch is replaced or the reader idles. */
static void cache_run_prefetch(struct cache *c, struct cache_job *j)
{
	pthread_t th[CACHE_PREFETCH_MAX];
	struct cache_pf pf = { .c = c, .j = j };
	struct cache_pf_hold *done;
	pthread_condattr_t ca;
	size_t n = c->cfg->s3_max_inflight, started = 0;

	if (n > CACHE_PREFETCH_MAX)
		n = CACHE_PREFETCH_MAX;
	if (n > j->nobjs)
		n = j->nobjs;
	if (n < 1)
		n = 1;
	pf.step = j->window / c->bs / n;
	if (pf.step < 1)
		pf.step = 1;
	pf.max_held = c->max_open / 2 < CACHE_PF_HOLD_MAX ? c->max_open / 2
							  : CACHE_PF_HOLD_MAX;
	if (pf.max_held < 1)
		pf.max_held = 1;
	pf.idle_ms = cache_pf_idle_ms();
	pf.keys = calloc(j->nobjs, sizeof(*pf.keys));
	if (!pf.keys) {
		log_error("cache: prefetch of dataset %s: no memory for its "
			  "list of %zu entries",
			  j->dataset, j->nobjs);
		return;
	}
	for (size_t i = 0; i < j->nobjs; i++) {
		char name[33];

		cache_obj_name(&j->objs[i], name);
		pf.keys[i] = (struct cache_pf_key){ cache_name_key(name), i };
	}
	qsort(pf.keys, j->nobjs, sizeof(*pf.keys), cache_pf_key_cmp);
	pf.progress_ms = timeutil_mono_ms();
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pf.cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_lock(&c->lock);
	pf.next = c->pfs;
	c->pfs = &pf;
	atomic_fetch_add(&c->pf_running, 1);
	pthread_mutex_unlock(&c->lock);
	/* Helpers that cannot be started leave fewer in flight. */
	while (started + 1 < n &&
	       !pthread_create(&th[started], NULL, cache_pf_run, &pf))
		started++;
	cache_pf_run(&pf);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_lock(&c->lock);
	while (pf.holds && !pf.stop) {
		if (!cache_pf_current(c, j))
			pf.stop = true;
		else
			cache_pf_wait(&pf);
	}
	done = cache_pf_collect(&pf, true);
	for (struct cache_pf **pp = &c->pfs; *pp; pp = &(*pp)->next)
		if (*pp == &pf) {
			*pp = pf.next;
			break;
		}
	atomic_fetch_sub(&c->pf_running, 1);
	pthread_mutex_unlock(&c->lock);
	cache_pf_put_holds(done);
	if (pf.idle)
		log_info("cache: prefetch of dataset %s: its reader read none "
			 "of the list for %.1f s; stopped at entry %zu of %zu "
			 "and let go what it held",
			 j->dataset, pf.idle_ms / 1000.0, pf.next_ent,
			 j->nobjs);
	log_debug("cache: prefetch of dataset %s ended at entry %zu of %zu; "
		  "at most %" PRIu64 " bytes ahead of the reader",
		  j->dataset, pf.next_ent, j->nobjs, pf.peak);
	pthread_cond_destroy(&pf.cv);
	free(pf.keys);
}

static void *cache_worker(void *arg)
{
	struct cache *c = arg;

	for (;;) {
		struct cache_job *j;
		bool no_space = false, stop;

		pthread_mutex_lock(&c->lock);
		while (!c->jobs && !c->stopping) {
			struct timespec ts;

			timeutil_real_after_ms(&ts, CACHE_BUF_IDLE_S * 1000);
			if (pthread_cond_timedwait(&c->jobs_cv, &c->lock,
						   &ts) == ETIMEDOUT &&
			    !c->jobs) {
				/* No stream for a while: trim the fill
				 * buffers kept for one (a leaf lock). */
				pthread_mutex_unlock(&c->lock);
				cache_buf_trim(c);
				pthread_mutex_lock(&c->lock);
			}
		}
		j = c->jobs;
		if (j) {
			c->jobs = j->next;
			if (!c->jobs)
				c->jobs_tail = &c->jobs;
			c->njobs--;
		}
		/* Read under the lock (cache_ahead_stop writes it under it): a
		 * job taken before the stop runs, and cache_close waits. */
		stop = c->stopping;
		pthread_mutex_unlock(&c->lock);
		if (!j)
			return NULL;
		if (j->kind == CACHE_JOB_READAHEAD && !stop)
			cache_obj_range(j->o, j->b0, j->b0 + j->n, false, true,
					NULL, &no_space);
		else if (j->kind == CACHE_JOB_PREFETCH)
			cache_run_prefetch(c, j);
		cache_job_free(j);
	}
}

/* Hand [b0, b0 + n) to the readahead workers, in batches. */
static void cache_readahead(struct cache_obj *o, uint64_t b0, uint64_t n)
{
	struct cache *c = o->c;

	while (n) {
		uint64_t k = n < c->batch ? n : c->batch;
		struct cache_job *j = calloc(1, sizeof(*j));

		if (!j)
			return;
		j->kind = CACHE_JOB_READAHEAD;
		j->o = o;
		j->b0 = b0;
		j->n = k;
		pthread_mutex_lock(&c->lock);
		o->refs++;
		pthread_mutex_unlock(&c->lock);
		if (cache_job_push(c, j)) {
			cache_job_free(j);
			return;
		}
		b0 += k;
		n -= k;
	}
}

/* Sequential detection: a read starting where the previous one ended grows
 * the window (1, 2, 4... up to cache.readahead_max blocks); any other read
 * resets it. */
void cache_access(struct cache_obj *o, uint64_t off, size_t len)
{
	struct cache *c = o->c;
	uint64_t last = (off + len - 1) / c->bs, ra_b = 0, ra_n = 0;
	uint64_t max = c->cfg->cache_readahead_max;

	pthread_mutex_lock(&o->lock);
	/*
	 * Sequential: the read starts where the stream is, or, once a stream
	 * is established, within its window of it. The kernel's readahead
	 * sends a stream's requests through several FUSE threads at once, so
	 * they arrive slightly out of order; an exact match would see such a
	 * reader as random. A new stream needs an exact match, so random
	 * reads never start one.
	 */
	uint64_t slack = o->window * c->bs;
	bool seq = max && (off == o->seq_next ||
			   (o->window && off + slack >= o->seq_next &&
			    off <= o->seq_next + slack));

	if (seq) {
		o->window = o->window ? o->window * 2 : 1;
		if (o->window > max)
			o->window = max;
		uint64_t start = last + 1 > o->ra_next ? last + 1 : o->ra_next;
		uint64_t end = last + 1 + o->window;

		if (end > o->nblocks)
			end = o->nblocks;
		if (start < end) {
			ra_b = start;
			ra_n = end - start;
			o->ra_next = end;
		}
	} else {
		o->window = 0;
		o->ra_next = 0;
	}
	if (!seq || off + len > o->seq_next)
		o->seq_next = off + len;
	pthread_mutex_unlock(&o->lock);
	/*
	 * Present blocks of the window are read by verify-ahead in the pool,
	 * or, once verified, by the kernel's own readahead on the cache file.
	 * POSIX_FADV_WILLNEED here as well cost the reader's thread the page
	 * allocation and submission: with it a fresh reader ran at 0.8 of
	 * dd's speed and a second pass at 0.75 of its speed without it
	 * (bench/warm_ab.sh, docs/cache.md).
	 */
	if (ra_n)
		cache_readahead(o, ra_b, ra_n);
	/* A prefetched entry: its reader moved on (one relaxed load when
	 * no prefetch runs). Looked at on an object's first and last bytes
	 * and every CACHE_PF_MARK bytes between, not on every read. */
	if (atomic_load_explicit(&c->pf_running, memory_order_relaxed) &&
	    (off == 0 || off + len >= o->size ||
	     off / CACHE_PF_MARK != (off + len - 1) / CACHE_PF_MARK))
		cache_pf_read(o, off, len);
}

int cache_prefetch(struct cache *c, const struct cache_object *objs, size_t n,
		   uint64_t window)
{
	struct cache_job *j;
	struct cache_ds *d;
	const char *ds;
	int ret = -ENOMEM;

	if (!c || (n && !objs))
		return -EINVAL;
	if (!n)
		return 0;
	ds = cache_ds_or(objs[0].dataset);
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->kind = CACHE_JOB_PREFETCH;
	j->window = window ? window : (uint64_t)c->bs * c->batch;
	j->dataset = strdup(ds);
	j->objs = calloc(n, sizeof(*j->objs));
	if (!j->dataset || !j->objs)
		goto err;
	for (size_t i = 0; i < n; i++) {
		struct cache_object *d2 = &j->objs[i];

		j->nobjs = i + 1;
		d2->os = objs[i].os;
		d2->size = objs[i].size;
		d2->dataset = strdup(cache_ds_or(objs[i].dataset));
		d2->key = objs[i].key ? strdup(objs[i].key) : NULL;
		d2->etag = strdup(objs[i].etag ? objs[i].etag : "");
		if (!d2->dataset || !d2->key || !d2->etag)
			goto err;
	}
	pthread_mutex_lock(&c->lock);
	d = cache_ds_get(c, ds);
	if (d) {
		j->gen = ++d->pf_gen; /* replaces the previous prefetch */
		cache_pf_wake_all(c); /* its takers may wait for a reader */
	}
	pthread_mutex_unlock(&c->lock);
	if (!d)
		goto err;
	ret = cache_job_push(c, j);
	if (ret)
		goto err;
	return 0;
err:
	cache_job_free(j);
	return ret;
}

/* Start the workers (as many as can be). Returns 0. */
int cache_ahead_start(struct cache *c)
{
	for (unsigned i = 0; i < CACHE_POOL_THREADS; i++) {
		if (pthread_create(&c->pool[i], NULL, cache_worker, c))
			break;
		c->npool++;
	}
	return 0;
}

/* Stop the workers and free the jobs they did not take. */
void cache_ahead_stop(struct cache *c)
{
	pthread_mutex_lock(&c->lock);
	c->stopping = true;
	pthread_cond_broadcast(&c->jobs_cv);
	cache_pf_wake_all(c);
	pthread_mutex_unlock(&c->lock);
	for (unsigned i = 0; i < c->npool; i++)
		pthread_join(c->pool[i], NULL);
	while (c->jobs) {
		struct cache_job *j = c->jobs;

		c->jobs = j->next;
		cache_job_free(j);
	}
}
