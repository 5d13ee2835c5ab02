/* SPDX-License-Identifier: MIT */
/*
 * uring: batched file reads and writes on a per-thread io_uring, with a
 * pread/pwrite fallback where io_uring is unavailable. Not a public header.
 *
 * Each thread lazily creates its own ring on first use; it is torn down when
 * the thread exits. If io_uring_queue_init fails with -EPERM or -ENOSYS (a
 * seccomp'd container, an old kernel), or DSTAGE_NO_URING=1 is set in the
 * environment, every call uses pread/pwrite instead; this is logged once per
 * process.
 */
#ifndef DSTAGE_URING_H
#define DSTAGE_URING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One transfer of a batch. */
struct uring_io {
	void *buf;
	size_t len;
	uint64_t off;
};

/*
 * Read (write == false) or write n transfers on fd, all in flight at once,
 * resubmitting short transfers until each is complete. A read that hits the
 * end of the file returns -EIO (cache files are never short). Returns 0 or
 * the first -errno (-EIO, -ENOSPC, -EDQUOT, -EBADF...).
 */
int uring_rw(int fd, struct uring_io *ios, size_t n, bool write);

/* true when this thread's calls go through io_uring (creating the ring if
 * needed); false when they use the pread/pwrite fallback. */
bool uring_available(void);

#endif
