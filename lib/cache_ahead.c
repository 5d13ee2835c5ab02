// SPDX-License-Identifier: MIT
/*
 * cache_ahead.c, layer 5 of the cache (lib/cache_i.h draws all seven):
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
 *     it stops as soon as a newer prefetch of the dataset bumps the
 *     dataset's pf_gen, or the cache stops.
 * Sequential detection (cache_access, o->lock): a read that continues the
 * stream doubles the object's window up to cache.readahead_max blocks and
 * queues the blocks past the read; any other read resets it.
 * Idle: a worker that waited CACHE_BUF_IDLE_S for a job trims the fill
 * buffers kept for streams (cache_buf_trim).
 * Stopping (cache_ahead_stop): c->stopping set under c->lock, workers
 * joined, queued jobs freed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache_i.h"
#include "dstage/config.h"

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

static bool cache_prefetch_current(struct cache *c, const struct cache_job *j)
{
	struct cache_ds *d;
	bool cur = false;

	pthread_mutex_lock(&c->lock);
	for (d = c->ds; d; d = d->next)
		if (!strcmp(d->name, j->dataset))
			cur = d->pf_gen == j->gen && !c->stopping;
	pthread_mutex_unlock(&c->lock);
	return cur;
}

/*
 * One prefetch, run by its worker and up to CACHE_PREFETCH_MAX - 1 helper
 * threads it starts: each takes the next list entry (pf->lock, a leaf,
 * taken under no other lock) and fetches that object in steps of
 * pf->step blocks, one step in flight per thread, so that all together
 * hold at most the job's window in flight. A thread that finds the
 * prefetch replaced or the cache stopping sets pf->stop (pf->lock) and
 * the others end at their next step.
 */
struct cache_pf {
	struct cache *c;
	struct cache_job *j;
	uint64_t step; /* blocks per step, window / threads */
	pthread_mutex_t lock;
	size_t next; /* next list entry to take (lock) */
	bool stop; /* replaced or stopping (lock) */
};

/* Take the next entry: 0, or -ENOENT when the list is done or stopped. */
static int cache_pf_take(struct cache_pf *pf, size_t *i)
{
	int ret = -ENOENT;

	pthread_mutex_lock(&pf->lock);
	if (!pf->stop && pf->next < pf->j->nobjs) {
		*i = pf->next++;
		ret = 0;
	}
	pthread_mutex_unlock(&pf->lock);
	return ret;
}

static bool cache_pf_going(struct cache_pf *pf)
{
	bool go = cache_prefetch_current(pf->c, pf->j);

	pthread_mutex_lock(&pf->lock);
	if (!go)
		pf->stop = true;
	go = !pf->stop;
	pthread_mutex_unlock(&pf->lock);
	return go;
}

static void *cache_pf_run(void *arg)
{
	struct cache_pf *pf = arg;
	size_t i;

	while (!cache_pf_take(pf, &i)) {
		const struct cache_object *ob = &pf->j->objs[i];
		struct cache_obj *o;
		bool no_space = false;

		if (!ob->size)
			continue;
		if (cache_obj_get(pf->c, ob, true, &o) || !o)
			continue;
		/* No room (cache.size taken by what is pinned, busy or not
		 * yet evictable): the rest of this object is not kept. */
		for (uint64_t b = 0; b < o->nblocks && !no_space;
		     b += pf->step) {
			uint64_t e = b + pf->step < o->nblocks ? b + pf->step
							       : o->nblocks;

			if (!cache_pf_going(pf) ||
			    cache_obj_range(o, b, e, true, false, NULL,
					    &no_space))
				break;
		}
		cache_obj_put(o);
		if (!cache_pf_going(pf))
			break;
	}
	return NULL;
}

/* Keep up to s3.max_inflight (at most CACHE_PREFETCH_MAX) list entries in
 * flight, within the job's window. */
static void cache_run_prefetch(struct cache *c, struct cache_job *j)
{
	pthread_t th[CACHE_PREFETCH_MAX];
	struct cache_pf pf = { .c = c, .j = j };
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
	pthread_mutex_init(&pf.lock, NULL);
	/* Helpers that cannot be started leave fewer in flight. */
	while (started + 1 < n &&
	       !pthread_create(&th[started], NULL, cache_pf_run, &pf))
		started++;
	cache_pf_run(&pf);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&pf.lock);
}

static void *cache_worker(void *arg)
{
	struct cache *c = arg;

	for (;;) {
		struct cache_job *j;
		bool no_space = false;

		pthread_mutex_lock(&c->lock);
		while (!c->jobs && !c->stopping) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += CACHE_BUF_IDLE_S;
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
		pthread_mutex_unlock(&c->lock);
		if (!j)
			return NULL;
		if (j->kind == CACHE_JOB_READAHEAD && !c->stopping)
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
	if (d)
		j->gen = ++d->pf_gen; /* replaces the previous prefetch */
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
	pthread_mutex_unlock(&c->lock);
	for (unsigned i = 0; i < c->npool; i++)
		pthread_join(c->pool[i], NULL);
	while (c->jobs) {
		struct cache_job *j = c->jobs;

		c->jobs = j->next;
		cache_job_free(j);
	}
}
