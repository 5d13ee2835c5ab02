/* SPDX-License-Identifier: MIT */
/*
 * filestore_i: what the file:// backend's files share. filestore.c has
 * the operations (head, get, put, delete, copy) and open; filestore_list.c
 * the listings; filestore_path.c resolves keys beneath the root (the
 * confinement rules are at the top of filestore.c); filestore_sweep.c
 * removes stale temporaries. Calls go one way: filestore.c calls
 * filestore_list.c, both call filestore_path.c. Not a public header.
 */
#ifndef DSTAGE_FILESTORE_I_H
#define DSTAGE_FILESTORE_I_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "objstore_backend.h"

#include <stdint.h>

#define FILESTORE_TMP_PREFIX ".dstage-tmp."
/* Temporary files removed by one sweep at most, and directory entries
 * looked at: each pass's work is bounded, the next pass goes on. */
#define FILESTORE_SWEEP_MAX_REMOVE 1000
#define FILESTORE_SWEEP_MAX_ENTRIES 1000000
struct stat;

/* Immutable after open, but for next_sweep_ms (atomic). */
struct filestore {
	struct objstore base;
	char *root; /* absolute, no trailing slash ("" for "/") */
	char *root_real; /* realpath of root: the fallback's inside check */
	int root_fd; /* directory of root */
	bool follow_inside; /* sources.follow_symlinks = inside */
	bool no_openat2; /* the kernel lacks openat2: resolve by hand */
	uint32_t host_hash; /* FNV-1a of the host name, in temporary names */
	uint64_t tmp_max_age_ms; /* store.tmp_max_age, 0: no sweep */
	int64_t next_sweep_ms; /* CLOCK_MONOTONIC; 0: at the first write */
};

/* Directories a listing goes down at most (the root is the first). */
#define FILESTORE_LIST_DEPTH_MAX 256

/* filestore_list.c: the listings (objstore_list, objstore_list_tree,
 * objstore_upload_list), and an object's ETag and info from its stat. */
int filestore_list(struct objstore *os, const char *prefix, objstore_list_cb cb,
		   void *arg);
int filestore_list_tree(struct objstore *os, const char *prefix,
			objstore_list_cb cb, void *arg);
int filestore_list_uploads(struct objstore *os, const char *prefix,
			   objstore_upload_list_cb cb, void *arg);
void filestore_list_etag(const struct stat *st, char *out, size_t len);
void filestore_list_info(const struct stat *st, struct objstore_info *info);

/*
 * 0 when key is safe as a path (no empty, "." or ".." segment, no leading
 * '/', no temporary-file name, no segment over NAME_MAX); else -EINVAL or
 * -ENAMETOOLONG, logged with the key.
 */
int filestore_path_key_ok(struct filestore *fs, const char *key);

/* "a FIFO", "a directory"...: what a mode is, for messages. */
const char *filestore_path_type_name(mode_t m);

/* Log why key was not resolved (err -ELOOP or -EXDEV; verb "refused" or
 * "skipped"); other errors log nothing. */
void filestore_path_msg(struct filestore *fs, const char *key, int err,
			const char *verb);

/*
 * Open key (a checked key) beneath the root with flags (O_RDONLY |
 * O_NONBLOCK, or O_PATH). Never leaves the root; follows symlinks only when
 * sources.follow_symlinks = inside and they stay inside. Returns 0 with
 * *out set, -ELOOP (a link, not followed), -EXDEV (a link leading out), or
 * the open's -errno. Logs nothing.
 */
int filestore_path_resolve(struct filestore *fs, const char *key, int flags,
			   int *out);

/*
 * Open key as a regular file (flags as above) and fstat it into *st. Every
 * refusal is logged with the key. Returns 0, -ELOOP, -EXDEV, -ENOENT
 * (missing, or a directory: not an object), -EINVAL (a FIFO, socket or
 * device), or the open's -errno.
 */
int filestore_path_open_file(struct filestore *fs, const char *key, int flags,
			     int *out, struct stat *st);

/*
 * Open directory key[0..len) (0: the root) for writing beneath the root,
 * creating missing ones when create is set, never through a symlink.
 * Returns 0 with *out (O_RDONLY, for fsync), -ELOOP (logged) or -errno.
 */
int filestore_path_open_dir(struct filestore *fs, const char *key, size_t len,
			    bool create, int *out);

/*
 * The name of a new temporary file of this process into tmp:
 * ".dstage-tmp.<host hash, 8 hex>.<pid>.<random, 16 hex>". Returns 0, or
 * -EIO when no random bytes could be had (getrandom failed).
 */
int filestore_tmp_name(struct filestore *fs, char tmp[NAME_MAX + 1]);

/*
 * Whether name is a temporary file name of dstage: the form above, or the
 * older ".dstage-tmp.<16 hex>" (no writer recorded). Sets *host and *pid
 * (0 for the older form).
 */
bool filestore_tmp_parse(const char *name, uint32_t *host, long *pid);

/*
 * Remove the temporary files under the root older than store.tmp_max_age
 * (mtime), except this process's own, never following a symlink and
 * removing only regular files whose name filestore_tmp_parse accepts; at
 * most FILESTORE_SWEEP_MAX_REMOVE of them. Each removal is logged (its
 * directory, name and age). Returns the number removed, or -errno when
 * the root could not be read (-ENOMEM, -EACCES...); a subdirectory that
 * cannot be read is logged and skipped.
 */
int filestore_sweep(struct filestore *fs);

/*
 * Sweep when one is due: at the first write of the handle, then at most
 * every store.tmp_max_age / 2 (1 minute to 1 hour). Only one thread
 * sweeps; others go on at once. Failures are logged only.
 */
void filestore_sweep_maybe(struct filestore *fs);

/* Whether openat2 with RESOLVE_BENEATH works here (Linux 5.6);
 * DSTAGE_TEST_NO_OPENAT2=1 says no, for the tests of the fallback. */
bool filestore_path_has_openat2(int root_fd);

#endif
