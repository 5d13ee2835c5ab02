/* SPDX-License-Identifier: MIT */
/*
 * cachegc: cachectl gc's garbage collection of a node's cache, over the
 * cache (which must not know SQLite) and the catalog. It finds, and unless
 * dry_run removes:
 *   - orphans: object files under cache.dir that no catalog entry owns (no
 *     current manifest of their dataset has their key with their ETag and
 *     size: a removed dataset, an older version of a refreshed one);
 *   - stale rows: rows of the catalog's blocks table (per-block cache
 *     state) of objects whose cache file is gone;
 *   - leftovers older than min_age: files under cache.dir's objects/ that
 *     are not whole object files of this cache (torn headers, stray names),
 *     and in checkpoints.staging_dir the temporary journal records
 *     (journal/.N.tmp) and the partial files moved to abandoned/ of writers
 *     that were killed.
 * A cache file some process uses (open, or a block being filled: the
 * cache's OFD locks) is never removed: it is counted as busy and kept.
 * Stateless.
 */
#ifndef DSTAGE_CACHEGC_H
#define DSTAGE_CACHEGC_H

#include <stdbool.h>
#include <stdint.h>

struct cache;
struct catalog;

struct cachegc_opts {
	bool dry_run; /* count only: change nothing */
	int64_t min_age; /* seconds: younger leftovers are kept */
	const char *staging_dir; /* checkpoints.staging_dir; NULL: skip it */
};

/* What a run found (dry_run) or removed. */
struct cachegc_result {
	uint64_t orphan_files, orphan_bytes;
	uint64_t stale_objects, stale_rows;
	uint64_t leftover_files, leftover_bytes;
	uint64_t busy_files, busy_bytes; /* found but in use: kept */
};

/*
 * Run one collection over cache c and catalog cat (this thread's
 * connection). A catalog error stops it before anything more is removed (a
 * file is only removed after its owner was looked up and not found).
 * Returns 0, -EINVAL (c or cat NULL, min_age negative), or -errno of the
 * catalog or of cache.dir's objects/.
 */
int cachegc_run(struct cache *c, struct catalog *cat,
		const struct cachegc_opts *o, struct cachegc_result *r);

#endif
