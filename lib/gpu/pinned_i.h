/* SPDX-License-Identifier: MIT */
/*
 * pinned_cuda: the device side of pinned (include/dstage/pinned.h), private
 * to lib/pinned*.c: libcudart loaded with dlopen when the library was built
 * with the CUDA toolkit (DSTAGE_HAVE_CUDA), or its CPU stand-in (mlock'd
 * host memory, memcpy for copies, events that are always complete).
 */
#ifndef DSTAGE_PINNED_I_H
#define DSTAGE_PINNED_I_H

#include <stdbool.h>
#include <stddef.h>

#include "dstage/pinned.h"

struct pinned_cudart; /* the dlsym'd entry points (pinned_cuda.c) */

/* State: mode is set once by pinned_cuda_init and never changes; rt is
 * non-NULL exactly in PINNED_MODE_CUDA. Owned by one struct pinned, so by
 * one thread: no lock. */
struct pinned_cuda {
	enum pinned_mode mode;
	int device;
	struct pinned_cudart *rt;
	bool mlock_logged; /* CPU mode: an mlock refusal was logged */
	char reason[256];
};

/* Choose the mode (flags: PINNED_*). Returns 0 or -ENODEV when
 * PINNED_CUDA_REQUIRED and no device is usable (reason says why). */
int pinned_cuda_init(struct pinned_cuda *cu, int device, unsigned flags);
void pinned_cuda_release(struct pinned_cuda *cu);

int pinned_cuda_host_alloc(struct pinned_cuda *cu, size_t len, void **out);
void pinned_cuda_host_free(struct pinned_cuda *cu, void *buf);
int pinned_cuda_dev_alloc(struct pinned_cuda *cu, size_t len, void **out);
void pinned_cuda_dev_free(struct pinned_cuda *cu, void *dev);

/* Synchronous copies; to_dev false copies device -> host. */
int pinned_cuda_copy(struct pinned_cuda *cu, void *dst, const void *src,
		     size_t len, bool to_dev);

/* Events: one per staging chunk; *ev stays NULL in the CPU mode. */
int pinned_cuda_event_new(struct pinned_cuda *cu, void **ev);
void pinned_cuda_event_free(struct pinned_cuda *cu, void *ev);

/* cudaMemcpyAsync host -> device on stream, then record ev on it (ev may
 * be NULL). CPU mode: memcpy. Returns 0 or -EIO. */
int pinned_cuda_copy_async(struct pinned_cuda *cu, void *dev, const void *src,
			   size_t len, void *stream, void *ev);

/* 1 when ev's copy is done, 0 when not yet, -EIO on a CUDA error. */
int pinned_cuda_event_done(struct pinned_cuda *cu, void *ev);

/* Wait for ev's copy. Returns 0 or -EIO. */
int pinned_cuda_event_wait(struct pinned_cuda *cu, void *ev);

#endif
