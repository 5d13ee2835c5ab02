/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_shm_i.h: the layout of <cache.dir>/ratelimit, and the file lock
 * for the unit tests. Private to lib/objstore/ratelimit_shm.c and tests/unit.
 */
#ifndef DSTAGE_RATELIMIT_SHM_I_H
#define DSTAGE_RATELIMIT_SHM_I_H

#include <stdint.h>

#include "dstage/ratelimit_shm.h"

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
