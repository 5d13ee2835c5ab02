/* SPDX-License-Identifier: MIT */
/*
 * fdutil: descriptors made from descriptors. Stateless; safe from any
 * thread.
 */
#ifndef DSTAGE_FDUTIL_H
#define DSTAGE_FDUTIL_H

#include <sys/stat.h>

/*
 * A new read-only open file description of the file fd refers to, through
 * /proc/self/fd (the same inode even when it was unlinked meanwhile, where a
 * path would not be): close-on-exec, and O_NOATIME (reads through it, the
 * kernel's included, write no access time) unless the kernel refuses that
 * to a process that does not own the file (EPERM), then without it.
 * Returns the descriptor, or -errno (-EBADF: fd is not open; -EMFILE).
 */
int fdutil_reopen_rdonly(int fd);

/*
 * Open path (relative to dirfd, as openat(2); AT_FDCWD for the working
 * directory) with flags, the caller's (O_NOFOLLOW to refuse a link, then
 * -ELOOP; not O_CREAT: no mode is given), and check that it is a regular
 * file, its stat into *st when st is not NULL. Returns the descriptor, or
 * -errno: openat's, fstat's, or -EINVAL when it is not a regular file (a
 * directory, a FIFO, a device...; then nothing stays open).
 */
int fdutil_open_regular(int dirfd, const char *path, int flags,
			struct stat *st);

#endif
