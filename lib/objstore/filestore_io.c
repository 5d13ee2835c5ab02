// SPDX-License-Identifier: MIT
/*
 * filestore_io: ranged reads of an open file into a get request, and
 * batches of them in parallel, for the stores over a POSIX tree
 * (filestore_io.h). Stateless: a batch's only shared state is its next
 * request's index, taken with an atomic add.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "dstage/log.h"
#include "filestore_io.h"

/* Bytes per read(2) when the caller hashes as they land (on_data): half
 * of this machine's per-core L2, so that the hash reads them from the
 * CPU's cache (a whole 4 MiB block was hashed from memory again). */
#define FILESTORE_IO_PIECE (256u << 10)
#define FILESTORE_IO_THREADS 64

int filestore_io_read(struct objstore *os, int fd, struct objstore_get_req *rq)
{
	size_t done = 0;

	while (done < rq->len) {
		size_t want = rq->len - done;
		ssize_t r;

		if (rq->on_data && want > FILESTORE_IO_PIECE)
			want = FILESTORE_IO_PIECE;
		r = pread(fd, (char *)rq->buf + done, want,
			  (off_t)(rq->off + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;

			log_error("%s: read of '%s' at %llu failed: %s",
				  os->url, rq->key,
				  (unsigned long long)(rq->off + done),
				  strerror(e));
			return -e;
		}
		if (r == 0)
			break;
		if (rq->on_data)
			rq->on_data(rq->on_data_arg, done,
				    (char *)rq->buf + done, (size_t)r);
		done += (size_t)r;
	}
	rq->got = done;
	objstore_count(&os->n_bytes_in, done);
	return 0;
}

struct filestore_io_batch {
	struct objstore *os;
	struct objstore_get_req *reqs;
	size_t n;
	filestore_io_get_fn fn;
	_Atomic size_t next; /* the next request to take */
};

static void *filestore_io_worker(void *arg)
{
	struct filestore_io_batch *b = arg;
	size_t i;

	while ((i = atomic_fetch_add(&b->next, 1)) < b->n)
		b->reqs[i].result = b->fn(b->os, &b->reqs[i]);
	return NULL;
}

int filestore_io_get_parallel(struct objstore *os,
			      struct objstore_get_req *reqs, size_t n,
			      filestore_io_get_fn fn)
{
	struct filestore_io_batch b = {
		.os = os, .reqs = reqs, .n = n, .fn = fn
	};
	size_t nthreads = os->cfg->s3_max_inflight, started = 0;
	pthread_t tids[FILESTORE_IO_THREADS];

	if (nthreads > n)
		nthreads = n;
	if (nthreads > FILESTORE_IO_THREADS)
		nthreads = FILESTORE_IO_THREADS;
	for (size_t i = 1; i < nthreads; i++) {
		if (pthread_create(&tids[started], NULL, filestore_io_worker,
				   &b))
			break;
		started++;
	}
	filestore_io_worker(&b);
	for (size_t i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	for (size_t i = 0; i < n; i++)
		if (reqs[i].result)
			return reqs[i].result;
	return 0;
}
