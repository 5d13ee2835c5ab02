/* SPDX-License-Identifier: MIT */
/*
 * cachepol: the block cache's eviction policy (pins, quotas, priorities;
 * capacity and watermarks set with cachectl policy set) read from the
 * catalog, for cache_open. The cache itself knows nothing of
 * the catalog; dstagefs, the stager and the test tools hand it this.
 *
 *   struct cachepol *pol;
 *   cachepol_open(cfg, &pol);
 *   cache_open(cfg, cachepol_source(pol), &cache);
 *   ...
 *   cache_close(cache);
 *   cachepol_close(pol);
 */
#ifndef DSTAGE_CACHEPOL_H
#define DSTAGE_CACHEPOL_H

#include "dstage/cache.h"

struct dstage_config;
struct cachepol;

/*
 * Open the catalog at cfg->catalog_path read for policies. A catalog that
 * does not exist yet or cannot be opened is logged and means no policy
 * (every dataset unpinned, no quota, priority 0): only -ENOMEM fails.
 */
int cachepol_open(const struct dstage_config *cfg, struct cachepol **out);

/* The source to give cache_open; valid until cachepol_close. */
const struct cache_policy_source *cachepol_source(struct cachepol *p);

/* After cache_close. Accepts NULL. */
void cachepol_close(struct cachepol *p);

#endif
