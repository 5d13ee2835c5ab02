// SPDX-License-Identifier: MIT
/*
 * metrics_cache: a cache's counters and the process's source totals as
 * Prometheus families (see metrics_cache.h). Stateless: each scrape reads
 * cache_get_stats and objstore_get_total_stats, which take their own locks.
 */
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
}

void metrics_cache_collect(void *arg, struct metrics_buf *b)
{
	struct cache_stats cs;
	struct objstore_stats os;

	if (arg) {
		cache_get_stats(arg, &cs);
		metrics_cache_write(b, &cs);
	}
	objstore_get_total_stats(&os);
	metrics_counter(b, "dstage_source_requests_total",
			"Requests (HTTP, or file operations) sent to sources",
			os.requests);
	metrics_counter(b, "dstage_source_retries_total",
			"Of the source requests, retries", os.retries);
	metrics_counter(b, "dstage_source_errors_total",
			"Source operations that ended in an error", os.errors);
	metrics_counter(b, "dstage_source_received_bytes_total",
			"Body bytes received from sources", os.bytes_in);
	metrics_counter(b, "dstage_source_sent_bytes_total",
			"Body bytes sent to sources (checkpoints, uploads)",
			os.bytes_out);
}
