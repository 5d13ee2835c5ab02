// SPDX-License-Identifier: MIT
/*
 * pinned_cuda: the device side of pinned, CUDA or its CPU stand-in.
 *
 * State: pinned_cuda_init sets mode once: CUDA when the library was built
 * with the toolkit's headers (DSTAGE_HAVE_CUDA), libcudart could be loaded
 * with dlopen, every entry point resolved and the device is usable;
 * otherwise CPU, with reason saying why. Nothing is linked against
 * libcudart, so a library built with CUDA runs on machines without it.
 * The handle and entry points (rt) live until pinned_cuda_release; the
 * struct belongs to one struct pinned, so to one thread: no lock.
 *
 * CPU mode: host and "device" memory are anonymous mappings (page-aligned,
 * the host ones mlock'd), each preceded by one page holding its length so
 * that the free functions need no size; copies are memcpy.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dstage/log.h"
#include "pinned_i.h"

#ifdef DSTAGE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define PINNED_PAGE 4096u
#define PINNED_MAGIC 0x64737470696e6e64ULL /* "dstpinnd" */

/* The page before a CPU-mode buffer. */
struct pinned_hdr {
	uint64_t magic;
	size_t len; /* of the whole mapping */
};

static int pinned_map(size_t len, bool lock, bool *lock_failed, void **out)
{
	size_t total;
	struct pinned_hdr *h;
	char *base;

	if (len == 0)
		return -EINVAL;
	if (len > SIZE_MAX - 2 * PINNED_PAGE)
		return -ENOMEM;
	total = PINNED_PAGE +
		((len + PINNED_PAGE - 1) & ~(size_t)(PINNED_PAGE - 1));
	base = mmap(NULL, total, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		return -ENOMEM;
	h = (struct pinned_hdr *)base;
	h->magic = PINNED_MAGIC;
	h->len = total;
	if (lock && mlock(base + PINNED_PAGE, total - PINNED_PAGE))
		*lock_failed = true;
	*out = base + PINNED_PAGE;
	return 0;
}

static void pinned_unmap(void *buf)
{
	struct pinned_hdr *h;

	if (!buf)
		return;
	h = (struct pinned_hdr *)((char *)buf - PINNED_PAGE);
	if (h->magic != PINNED_MAGIC) {
		log_error("pinned: freeing %p, which pinned did not allocate: "
			  "leaked",
			  buf);
		return;
	}
	h->magic = 0;
	munmap(h, h->len); /* unlocks too */
}

#ifdef DSTAGE_HAVE_CUDA

#ifndef DSTAGE_CUDART_PATH
#define DSTAGE_CUDART_PATH "libcudart.so"
#endif
#ifndef DSTAGE_CUDART_SONAME
#define DSTAGE_CUDART_SONAME "libcudart.so"
#endif

/* Each pointer has the type of the prototype in cuda_runtime_api.h. */
struct pinned_cudart {
	void *lib;
	__typeof__(cudaGetDeviceCount) *GetDeviceCount;
	__typeof__(cudaSetDevice) *SetDevice;
	__typeof__(cudaGetErrorString) *GetErrorString;
	__typeof__(cudaHostAlloc) *HostAlloc;
	__typeof__(cudaFreeHost) *FreeHost;
	__typeof__(cudaMalloc) *Malloc;
	__typeof__(cudaFree) *Free;
	__typeof__(cudaMemcpy) *Memcpy;
	__typeof__(cudaMemcpyAsync) *MemcpyAsync;
	__typeof__(cudaEventCreateWithFlags) *EventCreateWithFlags;
	__typeof__(cudaEventDestroy) *EventDestroy;
	__typeof__(cudaEventRecord) *EventRecord;
	__typeof__(cudaEventQuery) *EventQuery;
	__typeof__(cudaEventSynchronize) *EventSynchronize;
};

/* 0 when e is cudaSuccess; else log the failed CUDA call (what) with
 * CUDA's message and return -ENOMEM (out of memory) or -EIO. */
static int pinned_cuda_check(struct pinned_cuda *cu, const char *what,
			     cudaError_t e)
{
	if (e == cudaSuccess)
		return 0;
	log_error("pinned: %s failed on CUDA device %d: %s (error %d)", what,
		  cu->device, cu->rt->GetErrorString(e), (int)e);
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

#define PINNED_SYM(rt, name)                                               \
	do {                                                               \
		*(void **)&(rt)->name = dlsym((rt)->lib, "cuda" #name);    \
		if (!(rt)->name) {                                         \
			snprintf(why, wl, "%s lacks cuda" #name, libname); \
			goto err;                                          \
		}                                                          \
	} while (0)

/* Load one CUDA runtime and check that it sees the device. Returns 0, or
 * -ENODEV with why (wl bytes) saying what failed. */
static int pinned_cuda_try(struct pinned_cuda *cu, const char *libname,
			   int device, char *why, size_t wl)
{
	struct pinned_cudart *rt = calloc(1, sizeof(*rt));
	cudaError_t e;
	int n = 0;

	if (!rt)
		return -ENOMEM;
	rt->lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
	if (!rt->lib) {
		snprintf(why, wl, "no CUDA runtime: %s", dlerror());
		goto err;
	}
	PINNED_SYM(rt, GetDeviceCount);
	PINNED_SYM(rt, SetDevice);
	PINNED_SYM(rt, GetErrorString);
	PINNED_SYM(rt, HostAlloc);
	PINNED_SYM(rt, FreeHost);
	PINNED_SYM(rt, Malloc);
	PINNED_SYM(rt, Free);
	PINNED_SYM(rt, Memcpy);
	PINNED_SYM(rt, MemcpyAsync);
	PINNED_SYM(rt, EventCreateWithFlags);
	PINNED_SYM(rt, EventDestroy);
	PINNED_SYM(rt, EventRecord);
	PINNED_SYM(rt, EventQuery);
	PINNED_SYM(rt, EventSynchronize);
	e = rt->GetDeviceCount(&n);
	if (e != cudaSuccess || n <= 0) {
		snprintf(why, wl, "%s: cudaGetDeviceCount: %s", libname,
			 e != cudaSuccess ? rt->GetErrorString(e)
					  : "no CUDA device");
		goto err;
	}
	if (device < 0 || device >= n) {
		snprintf(why, wl, "CUDA device %d asked, %d present", device,
			 n);
		goto err;
	}
	e = rt->SetDevice(device);
	if (e != cudaSuccess) {
		snprintf(why, wl, "%s: cudaSetDevice(%d): %s", libname, device,
			 rt->GetErrorString(e));
		goto err;
	}
	cu->rt = rt;
	cu->mode = PINNED_MODE_CUDA;
	snprintf(cu->reason, sizeof(cu->reason), "CUDA device %d of %d (%s)",
		 device, n, libname);
	return 0;
err:
	/* A runtime that loaded stays loaded: unloading libcudart is not
	 * safe once it has started (its exit handlers). */
	free(rt);
	return -ENODEV;
}

/*
 * Try the runtimes in turn: $DSTAGE_CUDART (a path; ignored in setuid
 * and setgid programs, as secure_getenv does, since it names code to load),
 * the one the library was built with, then any the loader finds (an older
 * major version works: these entry points are unchanged since CUDA 10),
 * then the toolkit's own copy. The first one whose driver sees the device
 * wins; reason keeps the first failure that got as far as loading one.
 */
static int pinned_cuda_load(struct pinned_cuda *cu, int device)
{
	const char *names[] = { secure_getenv("DSTAGE_CUDART"),
				DSTAGE_CUDART_SONAME,
				"libcudart.so",
				"libcudart.so.13",
				"libcudart.so.12",
				DSTAGE_CUDART_PATH };
	char why[256];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		int ret;

		if (!names[i] || !*names[i])
			continue;
		ret = pinned_cuda_try(cu, names[i], device, why, sizeof(why));
		if (ret != -ENODEV)
			return ret;
		if (!*cu->reason ||
		    (!strncmp(cu->reason, "no CUDA runtime", 15) &&
		     strncmp(why, "no CUDA runtime", 15)))
			snprintf(cu->reason, sizeof(cu->reason), "%s", why);
	}
	return -ENODEV;
}

/* Runtime calls act on the calling thread's current device: a context
 * may be used from another thread than the one that made it. */
static int pinned_cuda_bind(struct pinned_cuda *cu)
{
	cudaError_t e = cu->rt->SetDevice(cu->device);

	if (e == cudaSuccess)
		return 0;
	log_error("pinned: cudaSetDevice(%d) failed: %s", cu->device,
		  cu->rt->GetErrorString(e));
	return -EIO;
}

#else /* !DSTAGE_HAVE_CUDA */

struct pinned_cudart {
	int unused;
};

static int pinned_cuda_load(struct pinned_cuda *cu, int device)
{
	(void)device;
	snprintf(cu->reason, sizeof(cu->reason),
		 "built without the CUDA toolkit (DSTAGE_CUDA=OFF or no "
		 "toolkit found): rebuild with the toolkit for the GPU mode");
	return -ENODEV;
}

#endif

int pinned_cuda_init(struct pinned_cuda *cu, int device, unsigned flags)
{
	const char *env = getenv("DSTAGE_PINNED_MODE");
	int ret;

	memset(cu, 0, sizeof(*cu));
	cu->device = device;
	cu->mode = PINNED_MODE_CPU;
	if (flags & PINNED_CPU_ONLY) {
		snprintf(cu->reason, sizeof(cu->reason),
			 "CPU mode asked (PINNED_CPU_ONLY)");
		return 0;
	}
	if (env && !strcmp(env, "cpu") && !(flags & PINNED_CUDA_REQUIRED)) {
		snprintf(cu->reason, sizeof(cu->reason),
			 "CPU mode asked (DSTAGE_PINNED_MODE=cpu)");
		return 0;
	}
	ret = pinned_cuda_load(cu, device);
	if (ret == -ENOMEM)
		return ret;
	if (ret && (flags & PINNED_CUDA_REQUIRED)) {
		log_error("pinned: CUDA required but unusable: %s", cu->reason);
		return -ENODEV;
	}
	if (ret)
		log_info("pinned: CPU mode: %s", cu->reason);
	return 0;
}

void pinned_cuda_release(struct pinned_cuda *cu)
{
	if (!cu || !cu->rt)
		return;
#ifdef DSTAGE_HAVE_CUDA
	/* libcudart is not unloaded: its own exit handlers may still run. */
	free(cu->rt);
#endif
	cu->rt = NULL;
}

/* len bytes for pinned_cuda_host_alloc (host) or pinned_cuda_dev_alloc. */
static int pinned_cuda_alloc_mem(struct pinned_cuda *cu, size_t len, bool host,
				 void **out)
{
	bool lock_failed = false;
	int ret;

	if (len == 0 || !out)
		return -EINVAL;
#ifdef DSTAGE_HAVE_CUDA
	if (cu->rt) {
		ret = pinned_cuda_bind(cu);
		if (ret)
			return ret;
		if (host)
			return pinned_cuda_check(
				cu, "cudaHostAlloc",
				cu->rt->HostAlloc(out, len,
						  cudaHostAllocDefault));
		return pinned_cuda_check(cu, "cudaMalloc",
					 cu->rt->Malloc(out, len));
	}
#endif
	/* Only host memory is locked (device memory is a CPU-mode stand-in). */
	ret = pinned_map(len, host, &lock_failed, out);
	if (!ret && lock_failed && !cu->mlock_logged) {
		cu->mlock_logged = true;
		log_warn("pinned: mlock of %zu bytes refused (%s): host "
			 "buffers stay pageable; raise RLIMIT_MEMLOCK "
			 "(ulimit -l) to lock them",
			 len, strerror(errno));
	}
	return ret;
}

int pinned_cuda_host_alloc(struct pinned_cuda *cu, size_t len, void **out)
{
	return pinned_cuda_alloc_mem(cu, len, true, out);
}

/* Free p from pinned_cuda_host_alloc (host) or pinned_cuda_dev_alloc. */
static void pinned_cuda_free_mem(struct pinned_cuda *cu, void *p, bool host)
{
	if (!p)
		return;
#ifdef DSTAGE_HAVE_CUDA
	if (cu->rt) {
		if (host)
			pinned_cuda_check(cu, "cudaFreeHost",
					  cu->rt->FreeHost(p));
		else
			pinned_cuda_check(cu, "cudaFree", cu->rt->Free(p));
		return;
	}
#endif
	(void)cu;
	(void)host;
	pinned_unmap(p);
}

void pinned_cuda_host_free(struct pinned_cuda *cu, void *buf)
{
	pinned_cuda_free_mem(cu, buf, true);
}

int pinned_cuda_dev_alloc(struct pinned_cuda *cu, size_t len, void **out)
{
	return pinned_cuda_alloc_mem(cu, len, false, out);
}

void pinned_cuda_dev_free(struct pinned_cuda *cu, void *dev)
{
	pinned_cuda_free_mem(cu, dev, false);
}

int pinned_cuda_copy(struct pinned_cuda *cu, void *dst, const void *src,
		     size_t len, bool to_dev)
{
	if (len == 0)
		return 0;
#ifdef DSTAGE_HAVE_CUDA
	if (cu->rt) {
		int b = pinned_cuda_bind(cu);

		if (b)
			return b;
		return pinned_cuda_check(
			cu, "cudaMemcpy",
			cu->rt->Memcpy(dst, src, len,
				       to_dev ? cudaMemcpyHostToDevice
					      : cudaMemcpyDeviceToHost));
	}
#endif
	(void)cu;
	(void)to_dev;
	memcpy(dst, src, len);
	return 0;
}

int pinned_cuda_event_new(struct pinned_cuda *cu, void **ev)
{
	*ev = NULL;
#ifdef DSTAGE_HAVE_CUDA
	if (cu->rt) {
		int b = pinned_cuda_bind(cu);

		if (b)
			return b;
		return pinned_cuda_check(
			cu, "cudaEventCreate",
			cu->rt->EventCreateWithFlags((cudaEvent_t *)ev,
						     cudaEventDisableTiming));
	}
#endif
	(void)cu;
	return 0;
}

void pinned_cuda_event_free(struct pinned_cuda *cu, void *ev)
{
	if (!ev)
		return;
#ifdef DSTAGE_HAVE_CUDA
	if (cu->rt)
		cu->rt->EventDestroy((cudaEvent_t)ev);
#endif
	(void)cu;
}

int pinned_cuda_copy_async(struct pinned_cuda *cu, void *dev, const void *src,
			   size_t len, void *stream, void *ev)
{
	if (len == 0)
		return 0;
#ifdef DSTAGE_HAVE_CUDA
	if (cu->rt) {
		int b = pinned_cuda_bind(cu);

		if (b)
			return b;
		cudaError_t e = cu->rt->MemcpyAsync(dev, src, len,
						    cudaMemcpyHostToDevice,
						    (cudaStream_t)stream);

		if (e != cudaSuccess)
			return pinned_cuda_check(cu, "cudaMemcpyAsync", e);
		if (ev) {
			e = cu->rt->EventRecord((cudaEvent_t)ev,
						(cudaStream_t)stream);
			if (e != cudaSuccess)
				return pinned_cuda_check(cu, "cudaEventRecord",
							 e);
		}
		return 0;
	}
#endif
	(void)cu;
	(void)stream;
	(void)ev;
	memcpy(dev, src, len);
	return 0;
}

int pinned_cuda_event_done(struct pinned_cuda *cu, void *ev)
{
#ifdef DSTAGE_HAVE_CUDA
	if (cu->rt && ev) {
		cudaError_t e = cu->rt->EventQuery((cudaEvent_t)ev);

		if (e == cudaSuccess)
			return 1;
		if (e == cudaErrorNotReady)
			return 0;
		return pinned_cuda_check(cu, "cudaEventQuery", e);
	}
#endif
	(void)cu;
	(void)ev;
	return 1;
}

int pinned_cuda_event_wait(struct pinned_cuda *cu, void *ev)
{
#ifdef DSTAGE_HAVE_CUDA
	if (cu->rt && ev) {
		return pinned_cuda_check(
			cu, "cudaEventSynchronize",
			cu->rt->EventSynchronize((cudaEvent_t)ev));
	}
#endif
	(void)cu;
	(void)ev;
	return 0;
}
