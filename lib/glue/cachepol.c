// SPDX-License-Identifier: MIT
/*
 * cachepol: the cache's eviction policy from the catalog (see cachepol.h):
 * each dataset's pin, quota and priority, and the capacity and watermarks
 * that override the configuration's.
 *
 * State: p->cat, the catalog connection or NULL (no catalog at open, or
 * not usable: no policy for the life of p, as the cache always did); it is
 * used by one lookup at a time, under p->lock. p->lock is a leaf: the
 * cache calls lookup with its own table lock held (lib/cache/cache_i.h), and
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
	out->restricted = cd.group && *cd.group;
	catalog_dataset_release(&cd);
	return 0;
}

/* The capacity and watermarks set with cachectl policy set: each a
 * decimal number in the policy table, 0 (the configuration's) where unset
 * or not a number (logged). */
static int cachepol_limits(void *arg, struct cache_limits *l)
{
	static const char *const keys[] = { CATALOG_POLICY_CACHE_SIZE,
					    CATALOG_POLICY_CACHE_HIGH,
					    CATALOG_POLICY_CACHE_LOW };
	struct cachepol *p = arg;
	uint64_t v[3] = { 0 };
	int ret = 0;

	pthread_mutex_lock(&p->lock);
	for (int i = 0; p->cat && i < 3 && !ret; i++) {
		char buf[32], *end;

		ret = catalog_policy_get(p->cat, keys[i], buf, sizeof(buf));
		if (ret == -ENOENT) {
			ret = 0;
			continue;
		}
		if (ret)
			break;
		errno = 0;
		v[i] = strtoull(buf, &end, 10);
		if (errno || *end || buf[0] < '0' || buf[0] > '9') {
			log_warn("catalog policy %s = '%s' is not a number: "
				 "using the configuration's (cachectl policy "
				 "set fixes it)",
				 keys[i], buf);
			v[i] = 0;
		}
	}
	pthread_mutex_unlock(&p->lock);
	if (ret)
		return ret;
	l->capacity = v[0];
	l->high = v[1] <= 100 ? (unsigned)v[1] : 0;
	l->low = v[2] <= 100 ? (unsigned)v[2] : 0;
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
	p->src.limits = cachepol_limits;
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
