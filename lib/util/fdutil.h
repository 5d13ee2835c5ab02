/* SPDX-License-Identifier: MIT */
/*
 * fdutil: descriptors made from descriptors. Stateless; safe from any
 * thread.
 */
#ifndef DSTAGE_FDUTIL_H
#define DSTAGE_FDUTIL_H

#include <dirent.h>
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

/*
 * fdopendir(3) that takes fd whatever comes of it: a DIR over fd into *out
 * (closedir closes fd), or -errno with fd closed and *out NULL (-EBADF: fd
 * is not open; -ENOTDIR; -ENOMEM).
 */
int fdutil_fdopendir(int fd, DIR **out);

/*
 * A DIR over the directory fd refers to, from its first entry, into *out
 * (closedir it): a new open of fd's "." with a position of its own (a dup
 * would share fd's, and another reader's). fd stays open and the caller's.
 * Returns 0, or -errno with *out NULL: -EBADF (fd is negative or not open),
 * -ENOTDIR, -EACCES (no search permission on it), -EMFILE, -ENOMEM.
 */
int fdutil_opendir(int fd, DIR **out);

#endif
