/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_shm_i.h: struct ratelimit_shm's fields (opaque in
 * include/dstage/ratelimit_shm.h), the layout of <cache.dir>/ratelimit,
 * and the file lock for the unit tests. Private to lib/objstore/
 * (ratelimit_shm.c; s3req.c, which holds the library's one) and
 * tests/unit.
 */
#ifndef DSTAGE_RATELIMIT_SHM_I_H
#define DSTAGE_RATELIMIT_SHM_I_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "dstage/ratelimit.h"
#include "dstage/ratelimit_shm.h"

struct ratelimit_shm_file;

/* See lib/objstore/ratelimit_shm.c for the state and invariants. Every
 * field under lock, taken before the file's lock (the only order). */
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

#define RATELIMIT_SHM_MAGIC 0x54494d494c525344ULL /* "DSRLIMIT" */
#define RATELIMIT_SHM_VERSION 1u

/*
 * Two copies of the bucket: slot[gen & 1] is the node's state. A writer
 * (holding the file lock) writes the other slot, then publishes it by
 * storing gen + 1 (one atomic 64-bit store), so a writer killed part way
 * leaves the last whole state in force. The slots' times are
 * CLOCK_MONOTONIC of the boot named by boot_id (the kernel's
 * random/boot_id); a process of another boot starts them afresh.
 */
struct ratelimit_shm_file {
	uint64_t magic; /* RATELIMIT_SHM_MAGIC; 0 until initialised */
	uint32_t version; /* RATELIMIT_SHM_VERSION */
	uint32_t size; /* sizeof(struct ratelimit_shm_file) */
	uint64_t gen; /* atomics only */
	uint8_t boot_id[16]; /* the boot whose CLOCK_MONOTONIC the slots use */
	uint64_t reserved[3];
	struct ratelimit_bucket slot[2];
};

/* Take the file's lock (an OFD lock on its first byte) and keep it: for tests
 * that kill a process while it holds it. 0 or -errno from fcntl. */
int ratelimit_shm_lock_file(struct ratelimit_shm *rs);

#endif
