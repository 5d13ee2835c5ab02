/* SPDX-License-Identifier: MIT */
/*
 * dsfs_cacheread: the bytes of a READ served through the block cache (a
 * service of the subtrees whose files are objects: datasets/, other nodes'
 * files in checkpoints/, and the overlay).
 *
 * A range present and verified in the cache is spliced from the cache file
 * (no copy in dstagefs); anything else (a fill, a repair, bytes that just
 * landed in memory) goes through cache_read_iov into a per-thread buffer
 * or straight from the landed fill. Counts the reply in fs->ctr.
 *
 * Stateless but for one buffer per FUSE thread (thread-specific data,
 * freed when the thread exits).
 */
#ifndef DSFS_CACHEREAD_H
#define DSFS_CACHEREAD_H

#include <stddef.h>
#include <stdint.h>

#include "dsfs_reply.h"

struct dsfs;
struct cache_object;

/*
 * Answer r with [off, off + size) of obj, which the caller has cut at the
 * object's end (size > 0). obj is read before the reply goes out and not
 * after: the caller's copy may be freed as soon as the kernel has the
 * bytes (a RELEASE may run at once). Returns 0 once r is answered, or the
 * cache's -errno (cache.h) with nothing sent: the caller replies with an
 * error or reads another way.
 */
int dsfs_cacheread_reply(struct dsfs *fs, const struct cache_object *obj,
			 uint64_t off, size_t size, struct dsfs_reply_read *r);

/* This thread's copy buffer, at least len bytes (kept for its next read),
 * or NULL when out of memory. */
void *dsfs_cacheread_buf(size_t len);

#endif
