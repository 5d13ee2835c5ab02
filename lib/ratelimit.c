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
 * earlier now_ms is taken as last_ms). An unlimited (0) maximum leaves its
 * bucket out; Retry-After holds apply whatever the maxima.
 *
 * Locking: every field under rl->lock, a leaf lock.
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

static double rl_floor(const struct ratelimit *rl)
{
	double f = rl->req_max / RATELIMIT_FLOOR_DIV;

	if (f < RATELIMIT_FLOOR_MIN)
		f = RATELIMIT_FLOOR_MIN;
	return f < rl->req_max ? f : rl->req_max;
}

static double rl_req_cap(const struct ratelimit *rl)
{
	return rl->req_rate > 1.0 ? rl->req_rate : 1.0;
}

/* Bring the buckets and the rate up to now_ms. Called with the lock held. */
static void rl_refill(struct ratelimit *rl, uint64_t now_ms)
{
	double dt;

	if (!rl->started || now_ms < rl->last_ms) {
		rl->started = true;
		rl->last_ms = now_ms;
		return;
	}
	dt = (double)(now_ms - rl->last_ms) / 1000.0;
	rl->last_ms = now_ms;
	if (rl->req_max > 0) {
		rl->req_rate += rl->req_max / RATELIMIT_RECOVER_S * dt;
		if (rl->req_rate > rl->req_max)
			rl->req_rate = rl->req_max;
		rl->req_tokens += rl->req_rate * dt;
		if (rl->req_tokens > rl_req_cap(rl))
			rl->req_tokens = rl_req_cap(rl);
	}
	if (rl->byte_max > 0) {
		rl->byte_tokens += rl->byte_max * dt;
		if (rl->byte_tokens > rl->byte_max)
			rl->byte_tokens = rl->byte_max;
	}
}

void ratelimit_configure(struct ratelimit *rl, double req_per_s,
			 double bytes_per_s)
{
	if (req_per_s < 0)
		req_per_s = 0;
	if (bytes_per_s < 0)
		bytes_per_s = 0;
	pthread_mutex_lock(&rl->lock);
	if (rl->req_max != req_per_s || rl->byte_max != bytes_per_s) {
		rl->req_max = req_per_s;
		rl->byte_max = bytes_per_s;
		rl->req_rate = req_per_s;
		rl->req_tokens = rl_req_cap(rl);
		rl->byte_tokens = bytes_per_s;
		rl->cut = false;
	}
	pthread_mutex_unlock(&rl->lock);
}

/* Milliseconds for a bucket filling at rate per second to gain need. */
static uint64_t rl_ms_for(double need, double rate)
{
	double ms = ceil(need / rate * 1000.0);

	return ms < 1 ? 1 : (uint64_t)ms;
}

uint64_t ratelimit_acquire(struct ratelimit *rl, uint64_t now_ms,
			   uint64_t bytes)
{
	uint64_t wait = 0, w;

	pthread_mutex_lock(&rl->lock);
	rl_refill(rl, now_ms);
	if (rl->hold_until_ms > now_ms)
		wait = rl->hold_until_ms - now_ms;
	if (rl->req_max > 0 && rl->req_tokens < 1.0) {
		w = rl_ms_for(1.0 - rl->req_tokens, rl->req_rate);
		if (w > wait)
			wait = w;
	}
	if (rl->byte_max > 0) {
		double need = (double)bytes < rl->byte_max ? (double)bytes
							   : rl->byte_max;

		if (rl->byte_tokens < need) {
			w = rl_ms_for(need - rl->byte_tokens, rl->byte_max);
			if (w > wait)
				wait = w;
		}
	}
	if (!wait) {
		if (rl->req_max > 0)
			rl->req_tokens -= 1.0;
		if (rl->byte_max > 0)
			rl->byte_tokens -= (double)bytes;
	}
	pthread_mutex_unlock(&rl->lock);
	return wait;
}

void ratelimit_throttled(struct ratelimit *rl, uint64_t now_ms,
			 uint64_t retry_after_ms)
{
	pthread_mutex_lock(&rl->lock);
	rl_refill(rl, now_ms);
	rl->n_throttled++;
	if (rl->req_max > 0 &&
	    (!rl->cut || now_ms - rl->last_cut_ms >= RATELIMIT_CUT_GAP_MS)) {
		rl->req_rate /= 2;
		if (rl->req_rate < rl_floor(rl))
			rl->req_rate = rl_floor(rl);
		if (rl->req_tokens > rl_req_cap(rl))
			rl->req_tokens = rl_req_cap(rl);
		rl->cut = true;
		rl->last_cut_ms = now_ms;
	}
	if (retry_after_ms > RATELIMIT_HOLD_MAX_MS)
		retry_after_ms = RATELIMIT_HOLD_MAX_MS;
	if (now_ms + retry_after_ms > rl->hold_until_ms)
		rl->hold_until_ms = now_ms + retry_after_ms;
	pthread_mutex_unlock(&rl->lock);
}

double ratelimit_rate(struct ratelimit *rl)
{
	double r;

	pthread_mutex_lock(&rl->lock);
	r = rl->req_rate;
	pthread_mutex_unlock(&rl->lock);
	return r;
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
