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

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "dstage/ratelimit.h"

/* The file's name inside cache.dir. */
#define RATELIMIT_SHM_FILE "ratelimit"

struct ratelimit_shm_file;

/* See lib/objstore/ratelimit_shm.c for the state and invariants. Every field under
 * lock, taken before the file's lock (the only order). */
struct ratelimit_shm {
	pthread_mutex_t lock;
	char *dir; /* the cache.dir tried; NULL: not yet */
	int fd; /* the shared file, -1: none (own bucket) */
	pid_t pid; /* the process that opened fd */
	struct ratelimit_shm_file *map; /* fd's mapping, or NULL */
	struct ratelimit_bucket own; /* used while fd == -1 */
	double req_max, byte_max; /* as last configured */
	int err; /* 0, or why the file is not used (-errno) */
};

#define RATELIMIT_SHM_INITIALIZER                                      \
	{                                                              \
		.lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1, .pid = -1 \
	}

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
