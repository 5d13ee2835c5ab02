/* SPDX-License-Identifier: MIT */
/*
 * filestore_io: what the stores over a POSIX tree share (filestore for
 * file:// sources, overlay_store for dstagefs --over): a ranged read of
 * an open file into a get request, and a batch of such reads run in
 * parallel. Stateless; private to lib/.
 */
#ifndef DSTAGE_FILESTORE_IO_H
#define DSTAGE_FILESTORE_IO_H

#include <stddef.h>

#include "objstore_backend.h"

/*
 * Read rq->len bytes at rq->off of fd into rq->buf, handing them to
 * rq->on_data (when set) in pieces of at most FILESTORE_IO_PIECE bytes
 * while they are still in the CPU's cache. Sets rq->got (less than len
 * only at end of file) and counts the bytes in os's stats. Returns 0 or
 * pread's -errno (logged, naming os's URL, the key and the offset).
 */
int filestore_io_read(struct objstore *os, int fd, struct objstore_get_req *rq);

/* One request of a batch: 0 or -errno, stored by the caller in result. */
typedef int (*filestore_io_get_fn)(struct objstore *os,
				   struct objstore_get_req *rq);

/*
 * Run fn on every one of the n requests, on up to s3.max_inflight threads
 * (64 at most; the caller's thread is one of them): on a parallel file
 * system latency, not bandwidth, bounds a single reader. Each request's
 * result lands in reqs[i].result. Returns the first request's error in
 * order, or 0. A thread that cannot be started leaves its share to the
 * others.
 */
int filestore_io_get_parallel(struct objstore *os,
			      struct objstore_get_req *reqs, size_t n,
			      filestore_io_get_fn fn);

#endif
