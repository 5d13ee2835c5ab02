// SPDX-License-Identifier: MIT
/*
 * ratelimit: two token buckets (requests, bytes) and an AIMD request rate.
 *
 * State: the buckets refill continuously at req_rate and byte_max per second,
 * up to one second's worth (at least one request). A grant takes one request
 * token and the request's bytes; it needs a whole request token, the bytes
 * (or a full byte bucket for a request larger than it) and now past
 * hold_until_ms.
 *
 *   req_rate == req_max --throttled--> req_rate = max(floor, req_rate / 2)
 *        ^                                  |
 *        +--- + req_max / RECOVER_S per s --+   (additive increase)
 *
 * Invariants: floor <= req_rate <= req_max when req_max > 0; req_tokens <=
 * max(1, req_rate); byte_tokens <= byte_max; last_ms never goes back (an
 * earlier now_ms refills nothing: callers in several threads or processes
 * read the clock before they get the lock). An unlimited (0) maximum leaves
 * its bucket out; Retry-After holds apply whatever the maxima.
 *
 * Locking: the ratelimit_bucket_* functions take none (their caller holds
 * one: lib/objstore/ratelimit_shm.c); struct ratelimit keeps its bucket under
 * rl->lock, a leaf lock.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dstage/ratelimit.h"

int ratelimit_init(struct ratelimit *rl)
{
	memset(rl, 0, sizeof(*rl));
	return -pthread_mutex_init(&rl->lock, NULL);
}

void ratelimit_release(struct ratelimit *rl)
{
	if (!rl)
		return;
	pthread_mutex_destroy(&rl->lock);
}

static double rl_floor(const struct ratelimit_bucket *b)
{
	double f = b->req_max / RATELIMIT_FLOOR_DIV;

	if (f < RATELIMIT_FLOOR_MIN)
		f = RATELIMIT_FLOOR_MIN;
	return f < b->req_max ? f : b->req_max;
}

static double rl_req_cap(const struct ratelimit_bucket *b)
{
	return b->req_rate > 1.0 ? b->req_rate : 1.0;
}

/* Bring the buckets and the rate up to now_ms; an earlier now_ms (another
 * thread or process read the clock first) refills nothing. */
static void rl_refill(struct ratelimit_bucket *b, uint64_t now_ms)
{
	double dt;

	if (!b->started) {
		b->started = 1;
		b->last_ms = now_ms;
		return;
	}
	if (now_ms <= b->last_ms)
		return;
	dt = (double)(now_ms - b->last_ms) / 1000.0;
	b->last_ms = now_ms;
	if (b->req_max > 0) {
		b->req_rate += b->req_max / RATELIMIT_RECOVER_S * dt;
		if (b->req_rate > b->req_max)
			b->req_rate = b->req_max;
		b->req_tokens += b->req_rate * dt;
		if (b->req_tokens > rl_req_cap(b))
			b->req_tokens = rl_req_cap(b);
	}
	if (b->byte_max > 0) {
		b->byte_tokens += b->byte_max * dt;
		if (b->byte_tokens > b->byte_max)
			b->byte_tokens = b->byte_max;
	}
}

void ratelimit_bucket_configure(struct ratelimit_bucket *b, double req_per_s,
				double bytes_per_s)
{
	if (!(req_per_s > 0))
		req_per_s = 0;
	if (!(bytes_per_s > 0))
		bytes_per_s = 0;
	if (b->req_max != req_per_s || b->byte_max != bytes_per_s) {
		b->req_max = req_per_s;
		b->byte_max = bytes_per_s;
		b->req_rate = req_per_s;
		b->req_tokens = rl_req_cap(b);
		b->byte_tokens = bytes_per_s;
		b->cut = 0;
	}
}

void ratelimit_configure(struct ratelimit *rl, double req_per_s,
			 double bytes_per_s)
{
	pthread_mutex_lock(&rl->lock);
	ratelimit_bucket_configure(&rl->b, req_per_s, bytes_per_s);
	pthread_mutex_unlock(&rl->lock);
}

/* Milliseconds for a bucket filling at rate per second to gain need. */
static uint64_t rl_ms_for(double need, double rate)
{
	double ms = ceil(need / rate * 1000.0);

	return ms < 1 ? 1 : (uint64_t)ms;
}

uint64_t ratelimit_bucket_acquire(struct ratelimit_bucket *b, uint64_t now_ms,
				  uint64_t bytes)
{
	uint64_t wait = 0, w;

	rl_refill(b, now_ms);
	if (b->hold_until_ms > now_ms)
		wait = b->hold_until_ms - now_ms;
	if (b->req_max > 0 && b->req_tokens < 1.0) {
		w = rl_ms_for(1.0 - b->req_tokens, b->req_rate);
		if (w > wait)
			wait = w;
	}
	if (b->byte_max > 0) {
		double need = (double)bytes < b->byte_max ? (double)bytes
							  : b->byte_max;

		if (b->byte_tokens < need) {
			w = rl_ms_for(need - b->byte_tokens, b->byte_max);
			if (w > wait)
				wait = w;
		}
	}
	if (!wait) {
		if (b->req_max > 0)
			b->req_tokens -= 1.0;
		if (b->byte_max > 0)
			b->byte_tokens -= (double)bytes;
	}
	return wait;
}

uint64_t ratelimit_acquire(struct ratelimit *rl, uint64_t now_ms,
			   uint64_t bytes)
{
	uint64_t wait;

	pthread_mutex_lock(&rl->lock);
	wait = ratelimit_bucket_acquire(&rl->b, now_ms, bytes);
	pthread_mutex_unlock(&rl->lock);
	return wait;
}

void ratelimit_bucket_throttled(struct ratelimit_bucket *b, uint64_t now_ms,
				uint64_t retry_after_ms)
{
	rl_refill(b, now_ms);
	b->n_throttled++;
	if (b->req_max > 0 &&
	    (!b->cut || now_ms >= b->last_cut_ms + RATELIMIT_CUT_GAP_MS)) {
		b->req_rate /= 2;
		if (b->req_rate < rl_floor(b))
			b->req_rate = rl_floor(b);
		if (b->req_tokens > rl_req_cap(b))
			b->req_tokens = rl_req_cap(b);
		b->cut = 1;
		b->last_cut_ms = now_ms;
	}
	if (retry_after_ms > RATELIMIT_HOLD_MAX_MS)
		retry_after_ms = RATELIMIT_HOLD_MAX_MS;
	if (now_ms + retry_after_ms > b->hold_until_ms)
		b->hold_until_ms = now_ms + retry_after_ms;
}

void ratelimit_throttled(struct ratelimit *rl, uint64_t now_ms,
			 uint64_t retry_after_ms)
{
	pthread_mutex_lock(&rl->lock);
	ratelimit_bucket_throttled(&rl->b, now_ms, retry_after_ms);
	pthread_mutex_unlock(&rl->lock);
}

double ratelimit_rate(struct ratelimit *rl)
{
	double r;

	pthread_mutex_lock(&rl->lock);
	r = rl->b.req_rate;
	pthread_mutex_unlock(&rl->lock);
	return r;
}

/* Clamp *v into [lo, hi] (NaN to lo); true when it changed. */
static bool rl_clamp(double *v, double lo, double hi)
{
	double o = *v;

	if (!(o >= lo))
		*v = lo;
	else if (o > hi)
		*v = hi;
	return *v != o || o != o;
}

bool ratelimit_bucket_sanitize(struct ratelimit_bucket *b, uint64_t now_ms)
{
	bool bad = false;

	/* a maximum no configuration can give (config.c's bounds) */
	bad |= rl_clamp(&b->req_max, 0, 1e9);
	bad |= rl_clamp(&b->byte_max, 0, 1e15);
	if (b->req_max > 0) {
		bad |= rl_clamp(&b->req_rate, rl_floor(b), b->req_max);
		bad |= rl_clamp(&b->req_tokens, 0, rl_req_cap(b));
	} else {
		b->req_rate = b->req_tokens = 0;
	}
	if (b->byte_max > 0)
		bad |= rl_clamp(&b->byte_tokens, -3600 * b->byte_max,
				b->byte_max);
	else
		b->byte_tokens = 0;
	if (b->started > 1 || b->cut > 1) {
		b->started = b->cut = 0;
		bad = true;
	}
	/* a little ahead: another process read the clock after this one;
	 * far ahead: a clock of another boot */
	if (b->last_ms > now_ms + RATELIMIT_SKEW_MAX_MS) {
		b->last_ms = now_ms;
		bad = true;
	}
	if (b->last_cut_ms > now_ms + RATELIMIT_SKEW_MAX_MS) {
		b->last_cut_ms = now_ms;
		bad = true;
	}
	if (b->hold_until_ms > now_ms + RATELIMIT_HOLD_MAX_MS) {
		b->hold_until_ms = now_ms + RATELIMIT_HOLD_MAX_MS;
		bad = true;
	}
	return bad;
}

uint64_t ratelimit_retry_after_ms(const char *v, int64_t now_s)
{
	unsigned long long sec;
	struct tm tm;
	char *end;

	if (!v)
		return 0;
	sec = strtoull(v, &end, 10);
	if (end == v || *end || *v == '-') {
		memset(&tm, 0, sizeof(tm));
		end = strptime(v, "%a, %d %b %Y %H:%M:%S GMT", &tm);
		if (!end || *end)
			return 0;
		now_s = (int64_t)timegm(&tm) - now_s;
		sec = now_s > 0 ? (unsigned long long)now_s : 0;
	}
	if (sec > RATELIMIT_HOLD_MAX_MS / 1000)
		return RATELIMIT_HOLD_MAX_MS;
	return sec * 1000;
}
