/* SPDX-License-Identifier: MIT */
/*
 * metrics_cache: the collector that exports a cache's counters
 * (cache_get_stats) and this process's source totals
 * (objstore_get_total_stats) as dstage_cache_*, dstage_served_* and
 * dstage_source_* families. Everything is read at scrape time.
 */
#ifndef DSTAGE_METRICS_CACHE_H
#define DSTAGE_METRICS_CACHE_H

#include "dstage/metrics.h"

/* A metrics_collect_fn; arg is a struct cache * (NULL: no cache open, only
 * the source totals are written). */
void metrics_cache_collect(void *arg, struct metrics_buf *b);

#endif
