/* SPDX-License-Identifier: MIT */
/*
 * objstore: one interface to the object stores dstage reads datasets from and
 * writes checkpoints to.
 *
 *   s3://bucket/prefix/   any S3-compatible endpoint (Signature V4, libcurl)
 *   file:///dir/          a POSIX directory (parallel FS, NFS, local disk)
 *
 * Keys passed to every call are relative to the URL's prefix ("a/b.tar" under
 * s3://bkt/ds/ is object "ds/a/b.tar"). A handle is safe to use from many
 * threads at once; each call blocks until done, retries included.
 *
 * Errors are -errno, each logged once with the URL, HTTP status and S3 code:
 *   -ENOENT     no such key or bucket
 *   -EACCES     credentials refused (InvalidAccessKeyId, SignatureDoesNotMatch,
 *               AccessDenied)
 *   -ESTALE     If-Match failed: the object changed under a snapshot
 *   -ETIMEDOUT  connect/low-speed timeout or the deadline passed while retrying
 *   -EIO        5xx after the retry budget, short or corrupt bodies, resets
 *   -EINVAL     a bad URL, key or argument
 *   -ENOMEM     out of memory
 *   -ERANGE     a range past the end of the object
 * file:// sources only (docs/objstore.md, "Confinement"):
 *   -ELOOP      the key is or passes through a symlink not followed
 *               (sources.follow_symlinks = no)
 *   -EXDEV      the key is a symlink leading outside the source
 *   -EINVAL     the key names a FIFO, socket or device (never opened)
 * Keys are 1 to 1,024 bytes (KEYPATH_KEY_MAX); others are -EINVAL.
 */
#ifndef DSTAGE_OBJSTORE_H
#define DSTAGE_OBJSTORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct dstage_config;
struct objstore;

#define OBJSTORE_ETAG_MAX 128

struct objstore_info {
	const char *key; /* relative to the store's prefix */
	uint64_t size;
	char etag[OBJSTORE_ETAG_MAX]; /* quoted as the server sends it */
	int64_t mtime; /* seconds since the epoch */
};

/* One ranged GET. len bytes from off into buf; if_match may be NULL. */
struct objstore_get {
	const char *key;
	uint64_t off;
	size_t len;
	const char *if_match;
	void *buf;
	size_t got; /* out: bytes stored; == len unless at EOF */
	int result; /* out: 0 or -errno */
	/*
	 * Optional (NULL: none): called as the body lands in buf, in order,
	 * with each piece just stored at buf + at (n bytes), while it is
	 * still in the CPU's cache. A retry that starts over calls it again
	 * from at == 0. Must not fail or block.
	 */
	void (*on_data)(void *arg, size_t at, const void *p, size_t n);
	void *on_data_arg;
};

/* Counters since objstore_open; all monotonic. */
struct objstore_stats {
	uint64_t requests; /* HTTP requests or file operations sent */
	uint64_t retries; /* of those, retries */
	uint64_t bytes_in; /* body bytes received */
	uint64_t bytes_out; /* body bytes sent */
	uint64_t errors; /* operations that ended in an error */
};

/*
 * Open a store for url (s3://... or file://...). cfg supplies the endpoint,
 * region, credentials, timeouts and retry policy; it must outlive the handle.
 * Returns 0, -EINVAL (bad URL, message logged), -EACCES (credentials file
 * readable by group or others; a session token over plain http without
 * s3.allow_insecure_token), -ENOENT (file:// dir missing), -ENOMEM.
 */
int objstore_open(const char *url, const struct dstage_config *cfg,
		  struct objstore **out);

/* Accepts NULL. */
void objstore_free(struct objstore *os);

/* The URL the store was opened with (for messages: checkpoints name it). */
const char *objstore_url(const struct objstore *os);

/*
 * List every object whose key starts with prefix (may be "" for all), in key
 * order, page by page: cb is called once per object and may stop the listing
 * by returning non-zero, which objstore_list then returns. The info passed to
 * cb is valid only during the call.
 */
typedef int (*objstore_list_cb)(void *arg, const struct objstore_info *oi);
int objstore_list(struct objstore *os, const char *prefix, objstore_list_cb cb,
		  void *arg);

/* Size, ETag and mtime of one object. info->key points at key. */
int objstore_head(struct objstore *os, const char *key,
		  struct objstore_info *info);

/*
 * Read len bytes at off into buf. *got is set to the bytes stored, fewer than
 * len only when the object ends first. A body shorter than promised is retried,
 * never returned. if_match (may be NULL) is sent as If-Match; a mismatch is
 * -ESTALE. off at or past the end of a non-empty object is -ERANGE.
 */
int objstore_get(struct objstore *os, const char *key, uint64_t off, size_t len,
		 const char *if_match, void *buf, size_t *got);

/*
 * Run n ranged GETs with up to s3.max_inflight in flight at once over reused
 * connections. Each request's result lands in its own result/got fields.
 * Returns 0 when all succeeded, else the first failing request's -errno.
 */
int objstore_get_many(struct objstore *os, struct objstore_get *reqs, size_t n);

/*
 * Store size bytes read from fd (from its offset 0, with pread) as key.
 * Objects at or above s3.multipart_threshold go up as a multipart upload
 * with parallel parts; a failed multipart upload is aborted. The object
 * appears atomically: whole or not at all.
 */
int objstore_put_fd(struct objstore *os, const char *key, int fd,
		    uint64_t size);

/* Store len bytes from buf as key (single request). */
int objstore_put_buf(struct objstore *os, const char *key, const void *buf,
		     size_t len);

/* Delete key. Deleting a missing key succeeds (as S3 does). */
int objstore_delete(struct objstore *os, const char *key);

/* Server-side copy of src_key to dst_key within the store. */
int objstore_copy(struct objstore *os, const char *src_key,
		  const char *dst_key);

/*
 * The S3 storage class (x-amz-storage-class, e.g. GLACIER, STANDARD_IA) of
 * objects this handle creates from now on; NULL or "": the store's
 * default. Ignored by file:// stores. Call it before the handle is shared
 * between threads. Returns 0, -EINVAL (not upper-case letters, digits and
 * '_'), -ENOMEM.
 */
int objstore_set_storage_class(struct objstore *os, const char *cls);

void objstore_get_stats(const struct objstore *os, struct objstore_stats *st);

/* The sums over every handle of this process, open or freed since it
 * started (for the metrics endpoint). */
void objstore_get_total_stats(struct objstore_stats *st);

#endif
