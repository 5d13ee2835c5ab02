/* SPDX-License-Identifier: MIT */
/*
 * objstore_backend: what a backend (s3store, filestore) provides to the
 * objstore front end. Not a public header.
 */
#ifndef DSTAGE_OBJSTORE_BACKEND_H
#define DSTAGE_OBJSTORE_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "dstage/config.h"

#include "dstage/objstore.h"

struct objstore_ops {
	int (*list)(struct objstore *os, const char *prefix,
		    objstore_list_cb cb, void *arg);
	/* objstore_list_tree; NULL: list. */
	int (*list_tree)(struct objstore *os, const char *prefix,
			 objstore_list_cb cb, void *arg);
	int (*head)(struct objstore *os, const char *key,
		    struct objstore_info *info);
	int (*get_many)(struct objstore *os, struct objstore_get_req *reqs,
			size_t n);
	/* sha256: the content's (hex), or NULL: the backend finds it if it
	 * needs it. */
	int (*put_fd)(struct objstore *os, const char *key, int fd,
		      uint64_t size, const char *sha256);
	/* dig: the body's digests (objstore_put_buf_ex), or NULL. */
	int (*put_buf)(struct objstore *os, const char *key, const void *buf,
		       size_t len, const struct objstore_digests *dig);
	/* objstore_put_buf_new; NULL: the front end answers -EOPNOTSUPP. */
	int (*put_new)(struct objstore *os, const char *key, const void *buf,
		       size_t len);
	int (*del)(struct objstore *os, const char *key);
	int (*copy)(struct objstore *os, const char *src, const char *dst);
	/* objstore_set_sha256: new_etag is never NULL (the front end's
	 * buffer, "" on entry). */
	int (*set_sha256)(struct objstore *os, const char *key,
			  const char *etag, const char *sha256,
			  char new_etag[OBJSTORE_ETAG_MAX]);
	void (*free)(struct objstore *os);
	/* Uploads in parts (objstore_upload_*): arguments checked by the
	 * front end; part and commit are called with a valid handle. */
	int (*up_begin)(struct objstore *os, const char *key,
			const char *sha256, struct objstore_upload **out);
	/* One part: len bytes from buf, or (buf NULL) from fd at off; the
	 * store's tag for it (S3: its ETag) into etag. dig: the body's
	 * digests (objstore_upload_part_ex, buf only), or NULL. */
	int (*up_part)(struct objstore_upload *up, unsigned partno,
		       const void *buf, int fd, uint64_t off, uint64_t len,
		       const struct objstore_digests *dig,
		       char etag[OBJSTORE_ETAG_MAX]);
	/* Publish parts 1..nparts (checked present) as size bytes; the
	 * object's ETag into etag when the backend knows it (it is "" on
	 * entry). */
	int (*up_commit)(struct objstore_upload *up, unsigned nparts,
			 uint64_t size, char etag[OBJSTORE_ETAG_MAX]);
	/* Abort and free (also after a failed commit). */
	void (*up_abort)(struct objstore_upload *up);
	int (*up_abort_id)(struct objstore *os, const char *key,
			   const char *id);
	int (*up_list)(struct objstore *os, const char *prefix,
		       objstore_upload_list_cb cb, void *arg);
};

/*
 * An upload in parts, embedded first in each backend's own. The fields
 * here are immutable after begin except parts[] (lock).
 */
struct objstore_upload {
	struct objstore *os;
	char *key;
	char *id; /* the backend's name for it (UploadId, temporary file) */
	uint64_t part_size;
	pthread_mutex_t lock; /* leaf lock: parts[] */
	struct objstore_part *parts; /* lock: part n at [n - 1] */
	size_t nparts_cap; /* lock */
};

struct objstore_part {
	uint64_t len; /* 0: not sent (or its last send failed) */
	char etag[OBJSTORE_ETAG_MAX];
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
#define OBJSTORE_MAX_PARTS 10000

/* The part size for an upload of about size bytes (0: unknown):
 * s3.part_size (at least 5 MiB), doubled until size fits in 10,000 parts.
 * (Inline: the backends sit below objstore.c.) */
static inline uint64_t objstore_part_size(const struct objstore *os,
					  uint64_t size)
{
	uint64_t part = os->cfg->s3_part_size;

	if (part < (5u << 20))
		part = 5u << 20;
	while (size / part >= OBJSTORE_MAX_PARTS)
		part *= 2;
	return part;
}

/* Free what up holds (not up itself), as a backend frees it. NULL ok. */
static inline void objstore_upload_release(struct objstore_upload *up)
{
	if (!up)
		return;
	pthread_mutex_destroy(&up->lock);
	free(up->parts);
	free(up->key);
	free(up->id);
}

int s3store_open(const char *url, const char *rest,
		 const struct dstage_config *cfg, struct objstore **out);
int filestore_open(const char *url, const char *rest,
		   const struct dstage_config *cfg, struct objstore **out);
/* tierstore.c: over two handles made by the caller (objstore_open_tiered),
 * owned by the result on success and freed with release (the front end's
 * objstore_free: a backend does not call up into objstore.c). */
int tierstore_open(const char *dir, const struct objstore_tier_opts *o,
		   struct objstore *tier, struct objstore *origin,
		   void (*release)(struct objstore *), struct objstore **out);

#endif
