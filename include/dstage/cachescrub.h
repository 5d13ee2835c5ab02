/* SPDX-License-Identifier: MIT */
/*
 * cachescrub: the cache's background scrub (docs/cache.md, "The scrub").
 *
 * With cache.verify_reads = fill a block is checked when it is filled, and a
 * reader in FUSE passthrough reads cached files without dstage checking
 * them. The scrub re-reads every present block of every cached object
 * (cache_object_check: local reads only) at most cache.scrub_rate bytes a
 * second, one pass every cache.scrub_interval. A damaged block's record is
 * cleared (cache_object_forget_block: the object is no longer complete), the
 * block is logged and counted, then fetched again from the dataset's source
 * (the catalog names it); when that fails it stays absent and is counted as
 * not repaired.
 *
 * The stager daemon runs it, one per node: a pass holds an OFD lock on
 * <cache.dir>/scrub.lock, so a second process sharing the cache (another
 * daemon) waits for it instead of scrubbing the same bytes.
 */
#ifndef DSTAGE_CACHESCRUB_H
#define DSTAGE_CACHESCRUB_H

#include <stdbool.h>
#include <stdint.h>

struct cache;
struct dstage_config;
struct metrics_buf;
struct cachescrub;

/* What the scrub did; passes and the *_total counts since it started. */
struct cachescrub_progress {
	bool enabled; /* cache.scrub_rate > 0 */
	bool running; /* a pass is under way */
	bool waiting_lock; /* another process holds scrub.lock */
	uint64_t rate; /* cache.scrub_rate, bytes/s */
	uint64_t interval_ms; /* cache.scrub_interval */
	uint64_t passes; /* passes finished */
	int64_t pass_start; /* this pass's start (or the last one's), s */
	int64_t pass_end; /* the last finished pass's end, s; 0: none */
	int64_t next_start; /* when the next pass starts, s (not running) */
	/* this pass (the last one when none runs): */
	uint64_t objects, objects_total; /* objects checked, in the cache */
	uint64_t bytes, bytes_total; /* bytes read and checked, cached */
	/* since the scrub started: */
	uint64_t bytes_all, objects_all;
	uint64_t damaged; /* blocks found failing their checksum */
	uint64_t repaired; /* of which fetched again from the source */
	uint64_t unrepaired; /* of which left absent: source unreachable */
};

/*
 * Start the scrub's thread over cache c (cfg and c must outlive it);
 * cfg->cache_scrub_rate 0: *out is set, no thread runs (progress says
 * disabled). The thread opens its own catalog connection
 * (cfg->catalog_path) to find each dataset's source. Returns 0, -ENOMEM or
 * -EAGAIN.
 */
int cachescrub_start(const struct dstage_config *cfg, struct cache *c,
		     struct cachescrub **out);

/* Stop the thread (a pass in progress ends after its current object),
 * join it and free everything. Accepts NULL. */
void cachescrub_stop(struct cachescrub *s);

/* A snapshot of the progress (zeros for NULL). */
void cachescrub_get(struct cachescrub *s, struct cachescrub_progress *p);

/* A metrics collector (metrics_add_collector) with s as its arg: the
 * dstage_scrub_* families (docs/operations.md). */
void cachescrub_collect(void *arg, struct metrics_buf *b);

/*
 * The rate bound, pure (the clock is the caller's): a reader that read
 * bytes ending at now_ns asks how long to wait before it reads on. Over any
 * span the bytes read are at most rate per second plus one second's worth
 * of credit left unused before it and the last read's own bytes (a read is
 * not split: the scrub reads an object at a time). rate 0: no wait.
 */
#define CACHESCRUB_CREDIT_NS 1000000000ull
struct cachescrub_pace {
	uint64_t rate; /* bytes/s, 0: unbounded */
	uint64_t next_ns; /* the earliest start of the next read */
};
uint64_t cachescrub_pace_wait(struct cachescrub_pace *p, uint64_t now_ns,
			      uint64_t bytes);

/*
 * When the pass after one that started at start_s should start (seconds):
 * start_s + interval, or now_s when that has passed already (a pass that
 * took longer than the interval, or one finished before a restart).
 */
int64_t cachescrub_next_start(int64_t start_s, uint64_t interval_ms,
			      int64_t now_s);

#endif
