/* SPDX-License-Identifier: MIT */
/*
 * pinned: read dataset files into page-locked (pinned) host buffers with
 * io_uring and hand them to a GPU with cudaMemcpyAsync, the disk reads of
 * one chunk overlapping the PCIe copy of the one before (double or triple
 * buffering). docs/gpu.md describes when to use it.
 *
 * Two modes, chosen once by pinned_init and reported by pinned_mode():
 *   PINNED_MODE_CUDA  built with the CUDA toolkit, libcudart loaded at run
 *                     time (dlopen; $DSTAGE_CUDART names one) and at least
 *                     one GPU: host buffers come from cudaHostAlloc,
 *                     "device" pointers from cudaMalloc.
 *   PINNED_MODE_CPU   no toolkit at build time, no libcudart or no GPU at
 *                     run time, or DSTAGE_PINNED_MODE=cpu: host buffers are
 *                     4 KiB-aligned and mlock'd, "device" pointers are host
 *                     memory and the copy to the device is a memcpy. The
 *                     same calls work and return the same bytes.
 *
 * Sources: a file by path (under a dstagefs mount, or any local file), or
 * one object of a dataset through the cache (struct cache), whose present
 * and verified blocks are read straight from the cache file and the rest
 * through cache_read_iov, so every check of the cache applies.
 *
 * Integrity: a read returns only whole, checked bytes. A file shorter than
 * its size at open (or than the range asked), a block failing its checksum
 * that cannot be repaired, or an I/O error make the call fail with -errno;
 * a chunk is handed to the device only once all its bytes are read and
 * checked, and a batch is handed over only once every file of it is. After
 * a failed pinned_read_device, the destination holds whole earlier chunks
 * and the caller's own bytes after them: treat it as undefined.
 *
 * Threads: one struct pinned (and its files) per thread; different threads
 * use different contexts. Every function returns 0 (or a count) or -errno:
 *   -EINVAL  a bad argument (NULL, a range past the end of the file)
 *   -ENOMEM  out of host memory, pinned memory or device memory
 *   -EIO     a short file, an I/O error, or a CUDA call failing (logged with
 *            CUDA's own message)
 *   -ENODEV  PINNED_CUDA_REQUIRED asked and no CUDA device usable
 *   -ENOENT, -EACCES... from open(2); -ESTALE, -EIO... from the cache
 */
#ifndef DSTAGE_PINNED_H
#define DSTAGE_PINNED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cache;
struct cache_object;
struct pinned;
struct pinned_file;

enum pinned_mode {
	PINNED_MODE_CPU = 0,
	PINNED_MODE_CUDA = 1,
};

/* pinned_opts.flags */
enum {
	PINNED_CUDA_REQUIRED = 1u << 0, /* -ENODEV instead of the CPU mode */
	PINNED_CPU_ONLY = 1u << 1, /* the CPU mode even with a GPU */
	PINNED_NO_DIRECT = 1u << 2, /* never O_DIRECT (buffered reads) */
};

struct pinned_opts {
	size_t chunk; /* staging chunk, bytes; 0: 8 MiB (rounded to 4 KiB) */
	unsigned depth; /* staging chunks, 2..8; 0: 3 (triple buffering) */
	int device; /* CUDA device ordinal */
	unsigned flags; /* PINNED_* */
};

/*
 * Create a context: choose the mode, allocate depth pinned staging chunks
 * and an io_uring (pread where io_uring is unavailable or DSTAGE_NO_URING=1).
 * opts may be NULL for the defaults. Returns 0, -ENODEV, -ENOMEM, -EINVAL.
 */
int pinned_init(const struct pinned_opts *opts, struct pinned **out);

/* Accepts NULL. Files of the context must be closed first. */
void pinned_free(struct pinned *p);

enum pinned_mode pinned_mode(const struct pinned *p);

/* "cuda" or "cpu". */
const char *pinned_mode_name(enum pinned_mode mode);

/* Why the context runs in its mode, for logs and benchmarks (e.g. "no
 * libcudart.so: ...", "cudaGetDeviceCount: no CUDA-capable device"). */
const char *pinned_mode_reason(const struct pinned *p);

/*
 * Page-locked host memory of len bytes, 4 KiB-aligned (cudaHostAlloc, or
 * aligned and mlock'd memory in the CPU mode; where mlock is refused, as
 * under a small RLIMIT_MEMLOCK, the memory is used unlocked and that is
 * logged once). Returns 0, -ENOMEM, -EINVAL (len 0).
 */
int pinned_host_alloc(struct pinned *p, size_t len, void **out);

/* Accepts NULL. */
void pinned_host_free(struct pinned *p, void *buf);

/* Device memory of len bytes (cudaMalloc; host memory in the CPU mode).
 * Returns 0, -ENOMEM, -EINVAL (len 0). */
int pinned_dev_alloc(struct pinned *p, size_t len, void **out);

/* Accepts NULL. */
void pinned_dev_free(struct pinned *p, void *dev);

/* Synchronous copies between host memory (pinned or not) and the device,
 * for checking results and for baselines (cudaMemcpy). Returns 0, -EIO. */
int pinned_copy_to_dev(struct pinned *p, void *dev, const void *host,
		       size_t len);
int pinned_copy_from_dev(struct pinned *p, void *host, const void *dev,
			 size_t len);

/*
 * Open a file by path for reading (O_DIRECT too where the filesystem takes
 * it). Its size is taken now: a later read finding fewer bytes fails with
 * -EIO. Returns 0, -ENOMEM or open(2)'s -errno (-ENOENT, -EACCES, -EISDIR).
 */
int pinned_file_open(struct pinned *p, const char *path,
		     struct pinned_file **out);

/*
 * Open one object of a dataset through the cache: obj (copied; its size is
 * the manifest's). When the cache holds it whole and verified
 * (cache_open_passthrough: every block present and checked when filled,
 * cache.verify_reads = fill), its data file is read directly, O_DIRECT
 * where aligned, as FUSE passthrough reads it: its blocks were checked
 * when filled and are re-checked by the scrub, not on each read (the file
 * keeps the object from eviction while open). Otherwise (partial,
 * verify_reads = always, an older cache format) it is read as
 * cache_read_fd and cache_read_iov read it, so a damaged block is
 * re-fetched from the source or the read fails (-ESTALE when the source
 * changed, -ENOENT when it is gone, -EIO). The cache must outlive the file.
 * Returns 0, -EINVAL, -ENOMEM.
 */
int pinned_file_open_cached(struct pinned *p, struct cache *c,
			    const struct cache_object *obj,
			    struct pinned_file **out);

/* Whether f, opened by pinned_file_open_cached, reads its cache file
 * directly (see above). */
bool pinned_file_direct(const struct pinned_file *f);

/* Accepts NULL. */
void pinned_file_close(struct pinned_file *f);

uint64_t pinned_file_size(const struct pinned_file *f);

/*
 * Read [off, off + len) into host memory dst (ideally pinned_host_alloc'd;
 * any host memory works), straight from the file with io_uring, O_DIRECT
 * where dst, off and len are 4 KiB-aligned. The range must lie within the
 * file (-EINVAL otherwise). Returns 0 or -errno.
 */
int pinned_read_host(struct pinned_file *f, uint64_t off, size_t len,
		     void *dst);

/*
 * Read [off, off + len) onto the device at dev: each chunk is read into a
 * pinned staging chunk and copied with cudaMemcpyAsync on stream (a
 * cudaStream_t; NULL for the default stream), up to depth chunks in flight
 * so that the disk and PCIe overlap. Returns once every copy is done (the
 * staging chunks are free again). In the CPU mode dev is host memory and
 * the copy a memcpy. The range must lie within the file. Returns 0 or
 * -errno (see Integrity above).
 */
int pinned_read_device(struct pinned_file *f, uint64_t off, size_t len,
		       void *dev, void *stream);

/* One file of a batch: path (the whole file), or cache and obj (the whole
 * object), or file, off and len (a range of an open file, e.g. a member of
 * a tar shard). The rest is set by pinned_read_batch. */
struct pinned_entry {
	const char *path;
	struct cache *cache;
	const struct cache_object *obj;
	struct pinned_file *file;
	uint64_t off, len; /* file's range (must lie within it) */
	uint64_t size; /* out: its size in bytes */
	uint64_t arena_off; /* out: where its bytes start in the arena */
	int err; /* out: 0 or this file's -errno */
};

/*
 * Read n whole small files into one pinned arena (arena_len bytes, from
 * pinned_host_alloc), each starting at a multiple of align (a power of 2,
 * 0: 256), with one io_uring submission for all the path entries (cache
 * entries are read through the cache). When dev is not NULL, the used part
 * of the arena, [0, returned length), is then copied to dev in one
 * cudaMemcpyAsync on stream and waited for. All or nothing: if any file
 * fails (its err says which; the others keep 0 or -ECANCELED), nothing is
 * copied to dev and the first error is returned. Returns the arena bytes
 * used, -ENOSPC when the files do not fit in arena_len (no file is read),
 * or -errno.
 */
int64_t pinned_read_batch(struct pinned *p, struct pinned_entry *e, size_t n,
			  void *arena, size_t arena_len, size_t align,
			  void *dev, void *stream);

#endif
