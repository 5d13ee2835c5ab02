// SPDX-License-Identifier: MIT
/*
 * pinned_fake_cudart: a stand-in libcudart with one "GPU", for running
 * test_pinned through pinned's CUDA mode on machines without one
 * (DSTAGE_CUDART=<this module>, ctest unit_pinned_fakecuda).
 *
 * It is stricter than a GPU where that finds bugs: cudaMemcpyAsync only
 * queues its copy; the copies run, in order, when an event after them is
 * waited for (cudaEventSynchronize), when cudaEventQuery is asked a second
 * time. A staging buffer reused before its copy's event completed therefore
 * sends the wrong bytes, and the test sees them. It aborts on what a GPU
 * would reject or corrupt, or what breaks pinned's contract: an async copy
 * from memory not from cudaHostAlloc or to memory not from cudaMalloc,
 * freeing either while a queued copy still uses it, a synchronous
 * cudaMemcpy touching device bytes an async copy is still queued to (a
 * read returned before its copies were done), and a queue overflow.
 *
 * State: process-wide, under fake_lock (test_pinned is single-threaded; the
 * lock keeps it honest anyway).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_MAX_ALLOCS 4096
#define FAKE_MAX_QUEUE 4096

/* cudaError_t values used. */
enum { FAKE_OK = 0, FAKE_INVALID = 1, FAKE_NOMEM = 2, FAKE_NOT_READY = 600 };

struct fake_alloc {
	char *p;
	size_t len;
	int host; /* 1 cudaHostAlloc, 0 cudaMalloc */
};

struct fake_copy {
	char *dst;
	const char *src;
	size_t len;
};

struct fake_event {
	uint64_t at; /* copies queued before it was recorded */
	int asked; /* cudaEventQuery calls since */
};

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_alloc fake_allocs[FAKE_MAX_ALLOCS];
static struct fake_copy fake_queue[FAKE_MAX_QUEUE];
static uint64_t fake_queued, fake_done; /* copies ever queued / run */

static void fake_die(const char *what)
{
	fprintf(stderr, "pinned_fake_cudart: %s\n", what);
	abort();
}

/* The allocation holding [p, p + len), or NULL. */
static struct fake_alloc *fake_find(const void *p, size_t len, int host)
{
	for (int i = 0; i < FAKE_MAX_ALLOCS; i++) {
		struct fake_alloc *a = &fake_allocs[i];

		if (a->p && a->host == host && (const char *)p >= a->p &&
		    (const char *)p + len <= a->p + a->len)
			return a;
	}
	return NULL;
}

/* Run the queued copies up to (not including) number upto. */
static void fake_run(uint64_t upto)
{
	while (fake_done < upto) {
		struct fake_copy *c = &fake_queue[fake_done % FAKE_MAX_QUEUE];

		memcpy(c->dst, c->src, c->len);
		fake_done++;
	}
}

static int fake_alloc(void **out, size_t len, int host)
{
	pthread_mutex_lock(&fake_lock);
	for (int i = 0; i < FAKE_MAX_ALLOCS; i++)
		if (!fake_allocs[i].p) {
			char *p = aligned_alloc(4096, (len + 4095) & ~4095ul);

			if (!p)
				break;
			fake_allocs[i] = (struct fake_alloc){ p, len, host };
			*out = p;
			pthread_mutex_unlock(&fake_lock);
			return FAKE_OK;
		}
	pthread_mutex_unlock(&fake_lock);
	return FAKE_NOMEM;
}

static int fake_free(void *p, int host)
{
	struct fake_alloc *a;

	pthread_mutex_lock(&fake_lock);
	a = fake_find(p, 1, host);
	if (!a || a->p != p)
		fake_die("freeing memory it did not allocate");
	for (uint64_t i = fake_done; i < fake_queued; i++) {
		struct fake_copy *c = &fake_queue[i % FAKE_MAX_QUEUE];

		if ((c->src >= a->p && c->src < a->p + a->len) ||
		    (c->dst >= a->p && c->dst < a->p + a->len))
			fake_die("freeing memory a queued copy still uses");
	}
	free(a->p);
	a->p = NULL;
	pthread_mutex_unlock(&fake_lock);
	return FAKE_OK;
}

/* The entry points pinned_cuda.c resolves, with the runtime's signatures
 * (enums as int, handles as pointers). */
int cudaGetDeviceCount(int *n);
int cudaSetDevice(int dev);
const char *cudaGetErrorString(int e);
int cudaHostAlloc(void **p, size_t len, unsigned flags);
int cudaFreeHost(void *p);
int cudaMalloc(void **p, size_t len);
int cudaFree(void *p);
int cudaMemcpy(void *dst, const void *src, size_t len, int kind);
int cudaMemcpyAsync(void *dst, const void *src, size_t len, int kind,
		    void *stream);
int cudaEventCreateWithFlags(void **ev, unsigned flags);
int cudaEventDestroy(void *ev);
int cudaEventRecord(void *ev, void *stream);
int cudaEventQuery(void *ev);
int cudaEventSynchronize(void *ev);

int cudaGetDeviceCount(int *n)
{
	*n = 1;
	return FAKE_OK;
}

int cudaSetDevice(int dev)
{
	return dev == 0 ? FAKE_OK : FAKE_INVALID;
}

const char *cudaGetErrorString(int e)
{
	return e == FAKE_NOMEM ? "fake: out of memory" : "fake: error";
}

int cudaHostAlloc(void **p, size_t len, unsigned flags)
{
	(void)flags;
	return fake_alloc(p, len, 1);
}

int cudaFreeHost(void *p)
{
	return fake_free(p, 1);
}

int cudaMalloc(void **p, size_t len)
{
	return fake_alloc(p, len, 0);
}

int cudaFree(void *p)
{
	return fake_free(p, 0);
}

int cudaMemcpy(void *dst, const void *src, size_t len, int kind)
{
	/* The device bytes this copy touches. */
	const char *d = kind == 2 /* DeviceToHost */ ? src : dst;

	pthread_mutex_lock(&fake_lock);
	for (uint64_t i = fake_done; i < fake_queued; i++) {
		struct fake_copy *c = &fake_queue[i % FAKE_MAX_QUEUE];

		if (c->dst < d + len && d < c->dst + c->len)
			fake_die(
				"device bytes used while an async copy to them "
				"is still queued (a read returned before its "
				"copies were done)");
	}
	memcpy(dst, src, len);
	pthread_mutex_unlock(&fake_lock);
	return FAKE_OK;
}

int cudaMemcpyAsync(void *dst, const void *src, size_t len, int kind,
		    void *stream)
{
	(void)stream;
	if (kind != 1 /* cudaMemcpyHostToDevice */)
		fake_die("only host-to-device async copies expected");
	pthread_mutex_lock(&fake_lock);
	if (!fake_find(src, len, 1))
		fake_die("async copy from memory not from cudaHostAlloc");
	if (!fake_find(dst, len, 0))
		fake_die("async copy to memory not from cudaMalloc");
	if (fake_queued - fake_done >= FAKE_MAX_QUEUE)
		fake_die("copy queue overflow: copies never waited for");
	fake_queue[fake_queued % FAKE_MAX_QUEUE] =
		(struct fake_copy){ dst, src, len };
	fake_queued++;
	pthread_mutex_unlock(&fake_lock);
	return FAKE_OK;
}

int cudaEventCreateWithFlags(void **ev, unsigned flags)
{
	(void)flags;
	*ev = calloc(1, sizeof(struct fake_event));
	return *ev ? FAKE_OK : FAKE_NOMEM;
}

int cudaEventDestroy(void *ev)
{
	free(ev);
	return FAKE_OK;
}

int cudaEventRecord(void *ev, void *stream)
{
	struct fake_event *e = ev;

	(void)stream;
	pthread_mutex_lock(&fake_lock);
	e->at = fake_queued;
	e->asked = 0;
	pthread_mutex_unlock(&fake_lock);
	return FAKE_OK;
}

int cudaEventQuery(void *ev)
{
	struct fake_event *e = ev;
	int ret = FAKE_OK;

	pthread_mutex_lock(&fake_lock);
	if (fake_done < e->at) {
		if (e->asked++ == 0)
			ret = FAKE_NOT_READY;
		else
			fake_run(e->at);
	}
	pthread_mutex_unlock(&fake_lock);
	return ret;
}

int cudaEventSynchronize(void *ev)
{
	struct fake_event *e = ev;

	pthread_mutex_lock(&fake_lock);
	fake_run(e->at);
	pthread_mutex_unlock(&fake_lock);
	return FAKE_OK;
}
