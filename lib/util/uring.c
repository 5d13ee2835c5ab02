// SPDX-License-Identifier: MIT
/*
 * uring: batched reads and writes on a per-thread io_uring.
 *
 * State, per thread: NONE -> RING (io_uring_queue_init succeeded) or
 * NONE -> FALLBACK (it failed, or io_uring is disabled process-wide). The
 * ring lives in a pthread key whose destructor tears it down at thread exit.
 *
 * State, process-wide: uring_disabled (atomic) goes 0 -> 1 once, when
 * DSTAGE_NO_URING=1 is seen or a queue_init fails with EPERM/ENOSYS; the
 * fallback is logged exactly once (uring_logged, atomic exchange). No lock:
 * a ring is only ever touched by its own thread.
 *
 * fork: a ring's queues are memory shared with the kernel, which a child
 * inherits mapped: the child's and the parent's submissions would mix and
 * corrupt each other. So the child drops the forking thread's ring
 * (pthread_atfork; the only thread a child has) and makes its own.
 *
 * Invariant: a call returns only when every transfer of its batch has
 * completed (or failed), so no SQE or CQE of a call outlives it and buffers
 * may be reused at once.
 */
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dstage/log.h"
#include "uring.h"

#define URING_ENTRIES 64

static pthread_key_t uring_key;
static pthread_once_t uring_once = PTHREAD_ONCE_INIT;
static _Atomic int uring_disabled;
static _Atomic int uring_logged;
static __thread int uring_state; /* 0 none, 1 ring, 2 fallback */
static __thread struct io_uring *uring_ring;

static void uring_destroy(void *p)
{
	struct io_uring *ring = p;

	if (!ring)
		return;
	io_uring_queue_exit(ring);
	free(ring);
}

/* In a forked child: let go of the parent's ring (see "fork"). */
static void uring_atfork_child(void)
{
	struct io_uring *ring = uring_ring;

	if (uring_state != 1)
		return;
	uring_state = 0;
	uring_ring = NULL;
	pthread_setspecific(uring_key, NULL);
	uring_destroy(ring);
}

static void uring_init_once(void)
{
	const char *v = getenv("DSTAGE_NO_URING");

	pthread_key_create(&uring_key, uring_destroy);
	pthread_atfork(NULL, NULL, uring_atfork_child);
	if (v && *v && strcmp(v, "0")) {
		atomic_store(&uring_disabled, 1);
		if (!atomic_exchange(&uring_logged, 1))
			log_info("io_uring disabled by DSTAGE_NO_URING: cache "
				 "I/O uses pread/pwrite");
	}
}

static struct io_uring *uring_get(void)
{
	struct io_uring *ring;
	int ret;

	if (uring_state == 1)
		return uring_ring;
	if (uring_state == 2)
		return NULL;
	pthread_once(&uring_once, uring_init_once);
	uring_state = 2;
	if (atomic_load(&uring_disabled))
		return NULL;
	ring = calloc(1, sizeof(*ring));
	if (!ring)
		return NULL;
	ret = io_uring_queue_init(URING_ENTRIES, ring, 0);
	if (ret < 0) {
		free(ring);
		if (ret == -EPERM || ret == -ENOSYS)
			atomic_store(&uring_disabled, 1);
		if (!atomic_exchange(&uring_logged, 1))
			log_warn("io_uring unavailable (%s): cache I/O uses "
				 "pread/pwrite",
				 strerror(-ret));
		return NULL;
	}
	pthread_setspecific(uring_key, ring);
	uring_ring = ring;
	uring_state = 1;
	return ring;
}

bool uring_available(void)
{
	return uring_get() != NULL;
}

static int uring_rw_fallback(int fd, struct uring_io *ios, size_t n, bool write)
{
	for (size_t i = 0; i < n; i++) {
		size_t done = 0;

		while (done < ios[i].len) {
			char *p = (char *)ios[i].buf + done;
			off_t o = (off_t)(ios[i].off + done);
			size_t l = ios[i].len - done;
			ssize_t r = write ? pwrite(fd, p, l, o)
					  : pread(fd, p, l, o);

			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				return -errno;
			if (r == 0)
				return -EIO;
			done += (size_t)r;
		}
	}
	return 0;
}

/* Queue transfer i from its done offset; user data is its index. */
static void uring_queue(struct io_uring *ring, int fd, struct uring_io *io,
			size_t done, size_t i, bool write)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	char *p = (char *)io->buf + done;
	unsigned l = io->len - done > (1u << 30) ? (1u << 30)
						 : (unsigned)(io->len - done);

	if (write)
		io_uring_prep_write(sqe, fd, p, l, io->off + done);
	else
		io_uring_prep_read(sqe, fd, p, l, io->off + done);
	io_uring_sqe_set_data64(sqe, i);
}

int uring_rw(int fd, struct uring_io *ios, size_t n, bool write)
{
	struct io_uring *ring = uring_get();
	size_t *done = NULL;
	size_t next = 0, inflight = 0;
	int ret = 0;

	if (!ring)
		return uring_rw_fallback(fd, ios, n, write);
	done = calloc(n ? n : 1, sizeof(*done));
	if (!done)
		return -ENOMEM;
	while (next < n || inflight) {
		struct io_uring_cqe *cqe;

		while (next < n && inflight < URING_ENTRIES) {
			if (ios[next].len) {
				uring_queue(ring, fd, &ios[next], 0, next,
					    write);
				inflight++;
			}
			next++;
		}
		if (!inflight)
			break;
		int r = io_uring_submit_and_wait(ring, 1);

		if (r < 0 && r != -EINTR) {
			/* Submission itself failed: reap what is out. */
			ret = r;
			goto drain;
		}
		while (io_uring_peek_cqe(ring, &cqe) == 0) {
			size_t i = (size_t)io_uring_cqe_get_data64(cqe);
			int res = cqe->res;

			io_uring_cqe_seen(ring, cqe);
			inflight--;
			if (res == -EINTR || res == -EAGAIN) {
				res = 0; /* requeue the same range */
			} else if (res < 0) {
				if (!ret)
					ret = res;
				continue;
			} else if (res == 0) {
				if (!ret)
					ret = -EIO;
				continue;
			}
			done[i] += (size_t)res;
			if (done[i] < ios[i].len && !ret) {
				uring_queue(ring, fd, &ios[i], done[i], i,
					    write);
				inflight++;
			}
		}
		if (ret)
			goto drain;
	}
	goto out;
drain:
	/* An error: stop queueing and wait for what is in flight, submitting
	 * first any re-queued SQE not yet handed to the kernel. */
	io_uring_submit(ring);
	while (inflight) {
		struct io_uring_cqe *cqe;

		if (io_uring_wait_cqe(ring, &cqe))
			break;
		io_uring_cqe_seen(ring, cqe);
		inflight--;
	}
out:
	free(done);
	return ret;
}
