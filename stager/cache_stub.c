// SPDX-License-Identifier: MIT
/*
 * cache_stub: stand-ins for include/dstage/cache.h, linked only while
 * lib/cache.c is missing (see CMakeLists.txt). Every call fails with
 * -ENOSYS, so the daemon runs without a cache. No state.
 */
#include <errno.h>

#include "dstage/cache.h"

int cache_open(const struct dstage_config *cfg, struct cache **out)
{
	(void)cfg;
	*out = NULL;
	return -ENOSYS;
}

void cache_close(struct cache *c)
{
	(void)c;
}

ssize_t cache_read(struct cache *c, const struct cache_object *obj,
		   uint64_t off, size_t len, void *buf)
{
	(void)c, (void)obj, (void)off, (void)len, (void)buf;
	return -ENOSYS;
}

int cache_object_present(struct cache *c, const struct cache_object *obj,
			 uint64_t *bytes)
{
	(void)c, (void)obj;
	*bytes = 0;
	return -ENOSYS;
}

int cache_object_drop(struct cache *c, const struct cache_object *obj)
{
	(void)c, (void)obj;
	return -ENOSYS;
}
