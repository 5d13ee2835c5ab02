/* SPDX-License-Identifier: MIT */
/*
 * objstore_backend: what a backend (s3store, filestore) provides to the
 * objstore front end. Not a public header.
 */
#ifndef DSTAGE_OBJSTORE_BACKEND_H
#define DSTAGE_OBJSTORE_BACKEND_H

#include <stdatomic.h>

#include "dstage/objstore.h"

struct objstore_ops {
	int (*list)(struct objstore *os, const char *prefix,
		    objstore_list_cb cb, void *arg);
	int (*head)(struct objstore *os, const char *key,
		    struct objstore_info *info);
	int (*get_many)(struct objstore *os, struct objstore_get *reqs,
			size_t n);
	int (*put_fd)(struct objstore *os, const char *key, int fd,
		      uint64_t size);
	int (*put_buf)(struct objstore *os, const char *key, const void *buf,
		       size_t len);
	int (*del)(struct objstore *os, const char *key);
	int (*copy)(struct objstore *os, const char *src, const char *dst);
	void (*free)(struct objstore *os);
};

/* Embedded first in each backend's handle. Immutable after open, except the
 * counters, which are atomics. */
struct objstore {
	const struct objstore_ops *ops;
	const struct dstage_config *cfg;
	char *url;
	/* x-amz-storage-class of new objects (objstore_set_storage_class),
	 * NULL: the store's default; set before the handle is shared */
	char *storage_class;
	_Atomic uint64_t n_requests, n_retries, n_bytes_in, n_bytes_out,
		n_errors;
	/* Every open handle, for objstore_get_total_stats; objstore.c's
	 * objstore_live_lock protects the links. */
	struct objstore *live_prev, *live_next;
};

static inline void objstore_count(_Atomic uint64_t *ctr, uint64_t v)
{
	atomic_fetch_add_explicit(ctr, v, memory_order_relaxed);
}

/* Backends' constructors. url is the full URL; rest is what follows the
 * scheme ("bucket/prefix/" or "/dir/"). Each sets *out to a handle whose
 * base is initialised by the caller afterwards (ops set by the backend). */
int s3store_open(const char *url, const char *rest,
		 const struct dstage_config *cfg, struct objstore **out);
int filestore_open(const char *url, const char *rest,
		   const struct dstage_config *cfg, struct objstore **out);

#endif
