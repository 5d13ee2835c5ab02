/* SPDX-License-Identifier: MIT */
/*
 * grow: the one way arrays and buffers grow, in the library and its
 * programs (git's ALLOC_GROW): capacity doubles, so appending n elements
 * costs O(n) copies in all. Stateless; safe from any thread.
 */
#ifndef DSTAGE_GROW_H
#define DSTAGE_GROW_H

#include <stddef.h>

/*
 * Make the array that *vp points to hold at least need elements of size
 * bytes. vp is the address of the array's pointer (any object pointer type;
 * NULL when none is allocated yet), cap the address of its capacity in
 * elements. When need <= *cap nothing changes; otherwise the capacity
 * becomes the first power-of-two multiple of first (of *cap when not 0) at
 * or above need, and the array is reallocated (new elements uninitialized).
 * Returns 0, or -ENOMEM (realloc failed, or the size overflows size_t);
 * then *vp and *cap are unchanged and the old array is still valid.
 */
int grow_array(void *vp, size_t *cap, size_t need, size_t size, size_t first);

/* Room for one more element after the n that arr holds (capacity cap). */
#define GROW_ONE(arr, n, cap, first) \
	grow_array(&(arr), &(cap), (size_t)(n) + 1, sizeof(*(arr)), (first))

#endif
