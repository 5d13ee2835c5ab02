/* SPDX-License-Identifier: MIT */
/*
 * keypath: decide whether an object key can be a path under a dataset.
 *
 * A key is accepted when it is a relative path of one or more segments
 * separated by single '/' where:
 *   - no segment is empty: no leading '/', no "a//b", no trailing '/'
 *     (a key ending in '/' is handled by the catalog as a directory marker,
 *     see keypath_dir_marker());
 *   - no segment is "." or "..";
 *   - no segment is longer than KEYPATH_SEG_MAX bytes (NAME_MAX);
 *   - the whole key is at most KEYPATH_KEY_MAX (1,024) bytes: S3's own
 *     limit, and the one objstore enforces on every call, so that a key
 *     the catalog accepts can always be read (one limit, not two);
 *   - no byte is NUL, a C0 control (0x01-0x1f) or DEL (0x7f). POSIX allows
 *     all but NUL, but newlines and escapes in names break log lines,
 *     SHA256SUMS files and terminals, and no sane dataset needs them.
 * Bytes 0x80-0xff are accepted as they are, valid UTF-8 or not: Linux names
 * are bytes, and a file:// source may hold Latin-1 names that must stay
 * readable. (S3 keys are always UTF-8.)
 *
 * "A key that is both a file and a directory prefix" (a and a/b) cannot be
 * decided from one key; the catalog detects it over the whole listing.
 *
 * Every function here is pure and thread-safe.
 */
#ifndef DSTAGE_KEYPATH_H
#define DSTAGE_KEYPATH_H

#include <stdbool.h>
#include <stddef.h>

#define KEYPATH_SEG_MAX 255
#define KEYPATH_KEY_MAX 1024
#define KEYPATH_MAX (KEYPATH_KEY_MAX + 1) /* a key and its NUL */

/*
 * Check len bytes of key (which may contain NUL bytes; they are rejected).
 * Returns 0 if the key is a valid path, or -EINVAL with *why (if why is not
 * NULL) pointing at a static, human-readable reason.
 */
int keypath_check(const char *key, size_t len, const char **why);

/*
 * Check a dataset name: one segment by the rules above (so no '/').
 * Returns 0 or -EINVAL with *why set as for keypath_check().
 */
int keypath_check_name(const char *name, size_t len, const char **why);

/*
 * True if key is a directory marker: it ends in exactly one '/' and the part
 * before it is a valid path (as created by S3 consoles for "folders").
 */
bool keypath_dir_marker(const char *key, size_t len);

/*
 * Length of the parent directory of a valid path: the bytes before its last
 * '/', or 0 for a top-level name (whose parent is the dataset root, "").
 */
size_t keypath_parent_len(const char *path, size_t len);

/* The last segment of a valid path (a pointer into path). */
const char *keypath_basename(const char *path, size_t len);

/*
 * Write len bytes of s (any bytes, valid key or not) into buf for a log line
 * or a message: NUL, control bytes, DEL and '\\' as "\\xNN", other bytes as
 * they are; cut with "..." when it does not fit. size must be at least 16.
 * Returns buf.
 */
const char *keypath_printable(const char *s, size_t len, char *buf,
			      size_t size);

#endif
