/* SPDX-License-Identifier: MIT */
/*
 * dsfs_reply: reply helpers for subtrees (a service): the entry a lookup or
 * a create makes, directory listings (one READDIR/READDIRPLUS reply
 * buffer), the bytes of a READ (buffer, iovec or a file descriptor to
 * splice from), and the base attributes every node starts from.
 *
 * Stateless; each struct here belongs to the one request being answered.
 */
#ifndef DSFS_REPLY_H
#define DSFS_REPLY_H

#define FUSE_USE_VERSION 314

#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

struct dsfs_node;
struct dsfs_opts;

/*
 * What lookup, mknod, mkdir, symlink, link and create answer, and one
 * entry of a listing. node: the node found or made, its nlookup raised by
 * one (NULL for "." and ".." in listings, and for a name that does not
 * exist: then entry_timeout > 0 caches its absence).
 */
struct dsfs_entry {
	struct dsfs_node *node;
	struct stat attr;
	double attr_timeout, entry_timeout;
};

/* A directory being listed: wraps the reply buffer of one readdir call. */
struct dsfs_reply_dir {
	fuse_req_t req;
	bool plus; /* READDIRPLUS: entries carry attributes and a lookup */
	char *buf;
	size_t size, used;
};

/* Whether an entry named name still fits (to avoid making nodes). */
bool dsfs_reply_dir_fits(const struct dsfs_reply_dir *d, const char *name);
/*
 * Append the entry e named name at cookie off (the offset of the next
 * entry). Plain listings use e->attr's st_ino (or e->node's ino) and
 * st_mode only. In plus listings an entry with a node counts as one
 * lookup of it: the subtree raised its nlookup, and must undo that when
 * this returns 1 (the buffer is full, nothing was added). Else 0.
 */
int dsfs_reply_dir_add(struct dsfs_reply_dir *d, const char *name,
		       const struct dsfs_entry *e, off_t off);

/* The bytes of one READ. A read hook replies at most once through these;
 * each returns 0 (a failed send means the request was interrupted: it is
 * finished either way). */
struct dsfs_reply_read {
	fuse_req_t req;
	bool sent;
};

int dsfs_reply_read_buf(struct dsfs_reply_read *r, const void *buf, size_t len);
int dsfs_reply_read_iov(struct dsfs_reply_read *r, const struct iovec *iov,
			int n);
/* len bytes of fd at pos, spliced into /dev/fuse when the kernel allows
 * (flags of fuse_reply_data). fd stays the caller's. */
int dsfs_reply_read_fd(struct dsfs_reply_read *r, int fd, off_t pos, size_t len,
		       enum fuse_buf_copy_flags flags);

/*
 * The base attributes of a node: owned by -o uid/gid, mode 0777 (dir) or
 * 0666 (file) less -o umask and all write bits, the given size and mtime.
 * Subtrees adjust the result (restricted datasets, the prefetch file).
 */
void dsfs_reply_attr(const struct dsfs_opts *o, struct stat *st, fuse_ino_t ino,
		     bool dir, uint64_t size, int64_t mtime);

#endif
