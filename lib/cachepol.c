// SPDX-License-Identifier: MIT
/*
 * cachepol: the cache's eviction policy from the catalog (see cachepol.h).
 *
 * State: p->cat, the catalog connection or NULL (no catalog at open, or
 * not usable: no policy for the life of p, as the cache always did); it is
 * used by one lookup at a time, under p->lock. p->lock is a leaf: the
 * cache calls lookup with its own table lock held (lib/cache_i.h), and
 * nothing is taken after p->lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dstage/cachepol.h"
#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/log.h"

struct cachepol {
	struct cache_policy_source src;
	pthread_mutex_t lock;
	struct catalog *cat; /* p->lock; NULL: no policy */
};

static int cachepol_lookup(void *arg, const char *dataset,
			   struct cache_policy *out)
{
	struct cachepol *p = arg;
	struct catalog_dataset cd;
	int ret;

	pthread_mutex_lock(&p->lock);
	ret = p->cat ? catalog_dataset_get(p->cat, dataset, &cd) : -ENOENT;
	pthread_mutex_unlock(&p->lock);
	if (ret)
		return ret;
	out->pinned = cd.pinned;
	out->quota = cd.quota;
	out->priority = cd.priority;
	catalog_dataset_release(&cd);
	return 0;
}

int cachepol_open(const struct dstage_config *cfg, struct cachepol **out)
{
	struct cachepol *p;
	int ret;

	*out = NULL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	p->src.lookup = cachepol_lookup;
	p->src.arg = p;
	if (cfg->catalog_path && access(cfg->catalog_path, F_OK)) {
		log_info("cache: no catalog at %s yet: no pins, quotas or "
			 "priorities",
			 cfg->catalog_path);
	} else if (cfg->catalog_path) {
		ret = catalog_open(cfg->catalog_path, 0, &p->cat);
		if (ret) {
			log_warn("cache: catalog %s not usable (%s): no pins, "
				 "quotas or priorities",
				 cfg->catalog_path, strerror(-ret));
			p->cat = NULL;
		}
	}
	*out = p;
	return 0;
}

const struct cache_policy_source *cachepol_source(struct cachepol *p)
{
	return p ? &p->src : NULL;
}

void cachepol_close(struct cachepol *p)
{
	if (!p)
		return;
	catalog_close(p->cat);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
