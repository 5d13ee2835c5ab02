/* SPDX-License-Identifier: MIT */
/*
 * fdutil: descriptors made from descriptors. Stateless; safe from any
 * thread.
 */
#ifndef DSTAGE_FDUTIL_H
#define DSTAGE_FDUTIL_H

/*
 * A new read-only open file description of the file fd refers to, through
 * /proc/self/fd (the same inode even when it was unlinked meanwhile, where a
 * path would not be): close-on-exec, and O_NOATIME (reads through it, the
 * kernel's included, write no access time) unless the kernel refuses that
 * to a process that does not own the file (EPERM), then without it.
 * Returns the descriptor, or -errno (-EBADF: fd is not open; -EMFILE).
 */
int fdutil_reopen_rdonly(int fd);

#endif
