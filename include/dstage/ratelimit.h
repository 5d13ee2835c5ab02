/* SPDX-License-Identifier: MIT */
/*
 * ratelimit: token buckets for requests per second and bytes per second to a
 * source, with AIMD backoff when the source throttles (429, 503 SlowDown,
 * Retry-After). Pure: every call takes the time (milliseconds on a monotonic
 * clock) from its caller, so tests inject it.
 */
#ifndef DSTAGE_RATELIMIT_H
#define DSTAGE_RATELIMIT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Longest hold one Retry-After imposes (longer answers are cut to this). */
#define RATELIMIT_HOLD_MAX_MS 60000u
/* At most one halving of the request rate per this many ms. */
#define RATELIMIT_CUT_GAP_MS 1000u
/* The request rate never falls below max / RATELIMIT_FLOOR_DIV (nor below
 * RATELIMIT_FLOOR_MIN requests/s, unless the maximum itself is lower). */
#define RATELIMIT_FLOOR_DIV 16.0
#define RATELIMIT_FLOOR_MIN 0.5
/* ratelimit_bucket_sanitize takes a time more than this ahead of the
 * caller's clock for garbage (and resets it); less is a process that read
 * the clock later than the caller (lib/objstore/ratelimit_shm.c resets another
 * boot's times by its boot id). */
#define RATELIMIT_SKEW_MAX_MS 60000u
/* Recovery after a cut: the rate grows by max / RATELIMIT_RECOVER_S per
 * second, so it is back at the maximum RATELIMIT_RECOVER_S s after a cut. */
#define RATELIMIT_RECOVER_S 10.0

/*
 * The buckets and the AIMD rate, without a lock: fixed-width fields only, so
 * lib/objstore/ratelimit_shm.c can keep one in a file mapped by every process of the
 * node. See lib/objstore/ratelimit.c for the state and invariants.
 */
struct ratelimit_bucket {
	double req_max; /* configured requests/s, 0: unlimited */
	double byte_max; /* configured bytes/s, 0: unlimited */
	double req_rate; /* current requests/s (AIMD), <= req_max */
	double req_tokens; /* <= max(1, req_rate) */
	double byte_tokens; /* <= byte_max; may be negative (debt) */
	uint64_t last_ms; /* time of the last refill */
	uint64_t hold_until_ms; /* no grant before this (Retry-After) */
	uint64_t last_cut_ms; /* time of the last halving */
	uint32_t started; /* last_ms valid */
	uint32_t cut; /* last_cut_ms valid */
	uint64_t n_throttled; /* throttling answers reported */
};

/* A bucket for the threads of one process: every field of b under lock. */
struct ratelimit {
	pthread_mutex_t lock; /* leaf lock: no other lock taken under it */
	struct ratelimit_bucket b;
};

#define RATELIMIT_INITIALIZER                     \
	{                                         \
		.lock = PTHREAD_MUTEX_INITIALIZER \
	}

/* Initialise rl unlimited. Returns 0 or -errno from pthread_mutex_init. */
int ratelimit_init(struct ratelimit *rl);

/* Release rl's lock. NULL ok. */
void ratelimit_release(struct ratelimit *rl);

/*
 * Set the maxima (0: unlimited). Does nothing when they are unchanged;
 * otherwise the buckets restart full at the new rates.
 */
void ratelimit_configure(struct ratelimit *rl, double req_per_s,
			 double bytes_per_s);

/*
 * Ask to send one request that moves about bytes bytes, at now_ms.
 * Returns 0 when granted (one request token and bytes byte tokens taken; a
 * request larger than the byte bucket waits for a full bucket and leaves it
 * in debt), else the milliseconds to wait before asking again (nothing
 * taken; at least 1).
 */
uint64_t ratelimit_acquire(struct ratelimit *rl, uint64_t now_ms,
			   uint64_t bytes);

/*
 * The source throttled a request at now_ms (429, 503 SlowDown, or an answer
 * with Retry-After; retry_after_ms 0 when none was given): halve the request
 * rate (at most once per RATELIMIT_CUT_GAP_MS, never below the floor) and
 * hold every grant until now_ms + retry_after_ms (at most
 * RATELIMIT_HOLD_MAX_MS).
 */
void ratelimit_throttled(struct ratelimit *rl, uint64_t now_ms,
			 uint64_t retry_after_ms);

/*
 * A Retry-After value (delta-seconds, or an IMF-fixdate such as "Wed, 21 Oct
 * 2015 07:28:00 GMT" read against now_s, seconds since the epoch) in ms, cut
 * to RATELIMIT_HOLD_MAX_MS; 0 when v is NULL, unreadable or in the past.
 */
uint64_t ratelimit_retry_after_ms(const char *v, int64_t now_s);

/* The current request rate (requests/s; 0: unlimited). */
double ratelimit_rate(struct ratelimit *rl);

/*
 * The same operations on a bare bucket, for callers that hold their own lock
 * (lib/objstore/ratelimit_shm.c): ratelimit_configure, ratelimit_acquire and
 * ratelimit_throttled are these under rl->lock.
 */
void ratelimit_bucket_configure(struct ratelimit_bucket *b, double req_per_s,
				double bytes_per_s);
uint64_t ratelimit_bucket_acquire(struct ratelimit_bucket *b, uint64_t now_ms,
				  uint64_t bytes);
void ratelimit_bucket_throttled(struct ratelimit_bucket *b, uint64_t now_ms,
				uint64_t retry_after_ms);

/*
 * Bring a bucket read from a file another process writes within the
 * invariants at now_ms: non-finite or negative numbers, a rate above the
 * maximum or under the floor, tokens over their caps, a byte debt beyond one
 * hour's worth, a time more than RATELIMIT_SKEW_MAX_MS after now_ms or a
 * hold longer than RATELIMIT_HOLD_MAX_MS are reset to their bounds. Returns true when
 * something had to be changed.
 */
bool ratelimit_bucket_sanitize(struct ratelimit_bucket *b, uint64_t now_ms);

#endif
