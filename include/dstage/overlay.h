/* SPDX-License-Identifier: MIT */
/*
 * overlay: the source behind dstagefs's transparent mode (dstagefs --over
 * DIR): an object store whose root is a directory descriptor opened before
 * a mount hid the directory's path, so the cache can fetch the blocks of
 * the files under it.
 *
 * Keys are paths relative to the root ("a/b.bin"). An object's version
 * (its ETag, overlay_store_etag) is the file's identity and version:
 * device, inode, size, mtime and ctime (nanoseconds). A read resolves the
 * key beneath the root (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS:
 * never outside the tree, never through a link) and compares the opened
 * file's version with the one asked for: a file changed or replaced since
 * is -ESTALE, never mixed bytes. Reads run with the process's credentials:
 * the caller (dstagefs) checks the reader's permission when it opens the
 * file on the reader's behalf.
 *
 * Only reads are supported: writes to the tree go through dstagefs's own
 * system calls, not through the cache. The handle is immutable after open
 * but for its counters (atomics) and thread-safe; it is not on the
 * objstore module's list of live handles: free it with overlay_store_free,
 * never objstore_free.
 */
#ifndef DSTAGE_OVERLAY_H
#define DSTAGE_OVERLAY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

struct dstage_config;
struct objstore;

/* Room for overlay_store_etag's answer. */
#define OVERLAY_ETAG_MAX 96

/*
 * A store reading beneath dirfd (duplicated: the caller keeps its own).
 * name is the store's URL for messages (such as "overlay:/mnt/pfs").
 * Returns 0, -EBADF (dirfd not a directory), -ENOSYS (no openat2: Linux
 * 5.6 or later is needed), -ENOMEM.
 */
int overlay_store_open(int dirfd, const char *name,
		       const struct dstage_config *cfg, struct objstore **out);

/* Accepts NULL. */
void overlay_store_free(struct objstore *os);

/* The version string of a file from its stat (dev-ino-size-mtime-ctime,
 * hex, quoted), into out (OVERLAY_ETAG_MAX bytes). */
void overlay_store_etag(const struct stat *st, char *out, size_t len);

#endif
