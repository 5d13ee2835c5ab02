// SPDX-License-Identifier: MIT
/*
 * metrics_cache: a cache's counters and the process's source totals as
 * Prometheus families (see metrics_cache.h). Stateless: each scrape reads
 * cache_get_stats, cache_get_ds_stats and objstore_get_total_stats, which
 * take their own locks.
 *
 * Per-dataset hits and misses: the first METRICS_MAX_DATASETS datasets the
 * cache saw (in that order, which does not change while it is open) get a
 * series each; every later one is added into dataset="/other" (a '/' is
 * never in a dataset's name, so it cannot clash with one: a dataset named
 * "other" keeps its own series). A series never moves, so every counter
 * stays monotonic.
 *
 * A restricted dataset (one group may read it) is never named: the page is
 * open to every local user, and a non-member may not learn the name (the
 * stager hides it from them too). Its counts go into dataset="/restricted";
 * a dataset restricted after it was first counted moves there, so its old
 * series stops and "/restricted" grows.
 */
#include <stdio.h>
#include <stdlib.h>

#include "dstage/cache.h"
#include "dstage/metrics_cache.h"
#include "dstage/objstore.h"

static void metrics_cache_write(struct metrics_buf *b,
				const struct cache_stats *st)
{
	metrics_gauge(b, "dstage_cache_capacity_bytes",
		      "Cache capacity (cache.size), bytes",
		      (double)st->capacity);
	metrics_gauge(b, "dstage_cache_used_bytes",
		      "Bytes of blocks present in the cache", (double)st->used);
	metrics_gauge(b, "dstage_cache_pinned_bytes",
		      "Bytes present in the cache of pinned datasets",
		      (double)st->pinned);
	metrics_counter(b, "dstage_cache_hits_total",
			"Blocks served from the cache", st->hits);
	metrics_counter(b, "dstage_cache_misses_total",
			"Blocks a reader had to fetch from the source",
			st->misses);
	metrics_counter(b, "dstage_served_from_cache_bytes_total",
			"Bytes served to readers from the cache",
			st->bytes_from_cache);
	metrics_counter(b, "dstage_served_from_source_bytes_total",
			"Bytes fetched from the source (readers, staging, "
			"prefetch)",
			st->bytes_from_source);
	metrics_counter(b, "dstage_source_fetched_blocks_total",
			"Blocks fetched from the source", st->fetches);
	metrics_counter(b, "dstage_cache_checksum_failures_total",
			"Cached blocks found corrupt (fetched again)",
			st->checksum_failures);
	metrics_counter(b, "dstage_cache_evictions_total",
			"Object files evicted from the cache", st->evictions);
	metrics_counter(b, "dstage_cache_streamed_total",
			"Reads or fills served without caching (cache full)",
			st->streamed);
	metrics_counter(b, "dstage_cache_disk_full_total",
			"Of the streamed: cache.dir's file system was full",
			st->disk_full);
	metrics_counter(b, "dstage_cache_passthrough_opens_total",
			"Whole cached objects handed out as their data file "
			"(FUSE passthrough, the GPU reader's direct reads)",
			st->passthrough_opens);
	metrics_counter(b, "dstage_cache_passthrough_remembered_total",
			"Of the passthrough opens, of objects known whole "
			"from an earlier open (no records read)",
			st->passthrough_remembered);
}

struct metrics_cache_ds {
	struct metrics_ds ds;
	bool misses; /* which family is being written */
};

static int metrics_cache_ds_row(void *arg, const char *name, bool restricted,
				uint64_t hits, uint64_t misses)
{
	struct metrics_cache_ds *a = arg;

	metrics_ds_add(&a->ds, name, restricted,
		       (double)(a->misses ? misses : hits));
	return 0;
}

/* dstage_dataset_cache_{hits,misses}_total{dataset}. */
static void metrics_cache_write_ds(struct metrics_buf *b, struct cache *c)
{
	for (int m = 0; m < 2; m++) {
		struct metrics_cache_ds a = { .misses = m == 1 };
		const char *name = m ? "dstage_dataset_cache_misses_total"
				     : "dstage_dataset_cache_hits_total";

		metrics_family(b, name, "counter",
			       m ? "Blocks a reader had to fetch from the "
				   "source, by dataset"
				 : "Blocks served from the cache, by dataset");
		metrics_ds_begin(&a.ds, b, name);
		cache_get_ds_stats(c, metrics_cache_ds_row, &a);
		metrics_ds_end(&a.ds);
	}
}

void metrics_cache_collect(void *arg, struct metrics_buf *b)
{
	struct cache_stats cs;
	struct objstore_stats os;
	struct objstore_tier_stats ts;

	if (arg) {
		cache_get_stats(arg, &cs);
		metrics_cache_write(b, &cs);
		metrics_cache_write_ds(b, arg);
	}
	/* dstage_source_requests_total{method,status} is the process
	 * collector's (metrics.c): the store backends count there. */
	objstore_get_total_stats(&os);
	metrics_counter(b, "dstage_source_retries_total",
			"Of the source requests, retries", os.retries);
	metrics_counter(b, "dstage_source_errors_total",
			"Source operations that ended in an error", os.errors);
	metrics_counter(b, "dstage_source_received_bytes_total",
			"Body bytes received from sources", os.bytes_in);
	metrics_counter(b, "dstage_source_sent_bytes_total",
			"Body bytes sent to sources (checkpoints, uploads)",
			os.bytes_out);
	objstore_get_tier_stats(&ts);
	metrics_counter(b, "dstage_shared_tier_reads_total",
			"Ranged reads of dataset files served by a shared tier",
			ts.reads);
	metrics_counter(b, "dstage_shared_tier_bytes_total",
			"Bytes of dataset files read from a shared tier",
			ts.bytes);
	metrics_family(b, "dstage_shared_tier_fallbacks_total", "counter",
		       "Reads a shared tier could not serve, sent to the "
		       "dataset's source, by cause");
	metrics_sample(b, "dstage_shared_tier_fallbacks_total",
		       "cause=\"missing\"",
		       (double)ts.fallbacks[OBJSTORE_TIER_MISSING]);
	metrics_sample(b, "dstage_shared_tier_fallbacks_total",
		       "cause=\"damaged\"",
		       (double)ts.fallbacks[OBJSTORE_TIER_DAMAGED]);
	metrics_sample(b, "dstage_shared_tier_fallbacks_total",
		       "cause=\"changed\"",
		       (double)ts.fallbacks[OBJSTORE_TIER_CHANGED]);
	metrics_sample(b, "dstage_shared_tier_fallbacks_total",
		       "cause=\"unreachable\"",
		       (double)ts.fallbacks[OBJSTORE_TIER_UNREACHABLE]);
	metrics_sample(b, "dstage_shared_tier_fallbacks_total",
		       "cause=\"untrusted\"",
		       (double)ts.fallbacks[OBJSTORE_TIER_UNTRUSTED]);
	metrics_sample(b, "dstage_shared_tier_fallbacks_total",
		       "cause=\"unchecked\"",
		       (double)ts.fallbacks[OBJSTORE_TIER_UNCHECKED]);
}
