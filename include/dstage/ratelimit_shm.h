/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_shm: the node's source limits (s3.max_requests_per_second,
 * s3.max_bytes_per_second), one token bucket shared by every process of the
 * node (dstagefs, the stager daemon, stager push, cachectl) through the file
 * <cache.dir>/ratelimit (mode 0600, owned by cache.dir's owner), so one
 * process's 503 SlowDown or Retry-After slows them all. Where the file cannot
 * be used (cache.dir missing or another user's, a bad file), the process
 * falls back to a bucket of its own and logs why once. Times are
 * milliseconds on CLOCK_MONOTONIC, from the caller.
 */
#ifndef DSTAGE_RATELIMIT_SHM_H
#define DSTAGE_RATELIMIT_SHM_H

#include <stdbool.h>
#include <stdint.h>

/* The file's name inside cache.dir. */
#define RATELIMIT_SHM_FILE "ratelimit"

/* A process's way to the node's bucket: opaque. Its fields and
 * RATELIMIT_SHM_INITIALIZER, which makes one, are lib/objstore's
 * (ratelimit_shm_i.h); the library's requests share the one that
 * lib/objstore/s3req.c holds. */
struct ratelimit_shm;

/*
 * Set the maxima (0: unlimited) and the cache.dir whose file holds the
 * node's bucket. The file is opened (created when cache.dir belongs to this
 * user) on the first call and after a change of dir or a fork; a failure is
 * logged once (naming the file and the fix) and the process goes on with a
 * bucket of its own. Returns 0 when the node's bucket is used, else the
 * -errno of the failure: -ENOENT (no cache.dir), -EPERM (cache.dir is another
 * user's), -EACCES (the file is not a 0600 regular file of cache.dir's
 * owner), -EINVAL (its size, magic or version is wrong), -ENOMEM, or an
 * error of open, ftruncate, mmap or fcntl.
 */
int ratelimit_shm_configure(struct ratelimit_shm *rs, const char *cache_dir,
			    double req_per_s, double bytes_per_s);

/* ratelimit_acquire on the node's bucket (or the process's own). */
uint64_t ratelimit_shm_acquire(struct ratelimit_shm *rs, uint64_t now_ms,
			       uint64_t bytes);

/* ratelimit_throttled on the node's bucket (or the process's own). */
void ratelimit_shm_throttled(struct ratelimit_shm *rs, uint64_t now_ms,
			     uint64_t retry_after_ms);

/* True when the node's bucket is in use. */
bool ratelimit_shm_shared(struct ratelimit_shm *rs);

/* Unmap and close the file; rs can be configured again. NULL ok. */
void ratelimit_shm_release(struct ratelimit_shm *rs);

#endif
