/* SPDX-License-Identifier: MIT */
/*
 * dsfs_overlay_i: what the overlay subtree's files share. dsfs_overlay.c
 * has the hooks on names, attributes and directories, the state's life and
 * the table; dsfs_overlay_file.c the open files (open, create, read,
 * write, sync); dsfs_overlay_node.c the nodes (paths, entries);
 * dsfs_overlay_cred.c the caller's credentials around system calls.
 * Calls go dsfs_overlay.c -> dsfs_overlay_file.c -> dsfs_overlay_node.c
 * -> dsfs_overlay_cred.c.
 */
#ifndef DSFS_OVERLAY_I_H
#define DSFS_OVERLAY_I_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dsfs_pt.h"
#include "dsfs_subtree.h"
#include "dstage/overlay.h"

/*
 * One node's place in the tree (n->priv). parent and name change on
 * rename; refs counts the node itself and its children's nodes (a parent
 * outlives its children). The root is the state's top (never freed).
 */
struct dsfs_overlay_node {
	struct dsfs_overlay_node *parent; /* st->lock */
	char *name; /* st->lock */
	unsigned refs; /* st->lock */
	bool gone; /* st->lock: unlinked or replaced by a rename */
	mode_t type; /* S_IFMT bits at lookup, immutable */
	/* The version the last open saw (keep_cache when unchanged). */
	char etag[OVERLAY_ETAG_MAX]; /* st->lock */
	struct dsfs_pt pt; /* files: passthrough opens (dsfs_pt.h) */
};

/*
 * The subtree's state (fs->sub_state[DSFS_SUB_ROOT]). Immutable after init
 * but for lock and what it protects. lock is a leaf lock: taken under the
 * node table's lock (match callbacks), never the other way round.
 */
struct dsfs_overlay {
	int root_fd; /* O_PATH|O_DIRECTORY: DIR under the mount */
	char *dir; /* DIR, absolute, for messages */
	char *label; /* "overlay:DIR": the cache's dataset name */
	struct objstore *os; /* overlay_store on root_fd */
	double timeout; /* overlay.attr_timeout, seconds */
	uint64_t min_cached; /* overlay.min_cached_size */
	bool passthrough; /* overlay.passthrough */
	char **no_cache; /* overlay.no_cache, split; NULL-terminated */
	bool as_caller; /* euid 0: system calls as the caller */
	uid_t euid;
	pthread_mutex_t lock;
	struct dsfs_overlay_node top;
};

static inline struct dsfs_overlay *dsfs_overlay_st(struct dsfs *fs)
{
	return fs->sub_state[DSFS_SUB_ROOT];
}

/* ---- dsfs_overlay_node.c ---- */
/* n's path relative to the root ("." for the root; with name, n's child
 * name) into buf (PATH_MAX). 0 or -ENAMETOOLONG. */
int dsfs_overlay_node_path(struct dsfs_overlay *st, struct dsfs_node *n,
			   const char *name, char *buf);
/* Open n (or name in the directory n, name not NULL) under DIR as the
 * caller who (its fsuid and groups: dsfs_overlay_cred_take): openat with
 * flags and, for O_CREAT, mode; path (PATH_MAX) gets its path below DIR.
 * Returns the descriptor, or dsfs_overlay_node_path's, the credentials'
 * or openat's -errno. For directories (O_DIRECTORY opens nothing else);
 * files go through dsfs_overlay_node_open_file. */
int dsfs_overlay_node_open(struct dsfs_overlay *st, struct dsfs_caller *who,
			   struct dsfs_node *n, const char *name, int flags,
			   mode_t mode, char *path);
/* The same for a regular file (open, create): never opens anything
 * else. Without O_CREAT the file at the place is reopened
 * through an O_PATH descriptor once its type is checked; with O_CREAT a
 * new file is made (O_EXCL), else (not asked O_EXCL) the one there is
 * reopened so. -ESTALE when a FIFO, device, socket, directory or link is
 * there: the kernel then looks the name up again and does what the tree
 * would with it (its open of a FIFO, nodev for a device). Returns the
 * descriptor or -errno. */
int dsfs_overlay_node_open_file(struct dsfs_overlay *st,
				struct dsfs_caller *who, struct dsfs_node *n,
				const char *name, int flags, mode_t mode,
				char *path);
/* The regular file at path, opened with flags as the credentials in
 * force (dsfs_overlay_cred_take): its descriptor, -ESTALE when anything
 * else is there now (nothing else is ever opened), or -errno. */
int dsfs_overlay_node_reopen(struct dsfs_overlay *st, const char *path,
			     int flags);
/* The node of name in dir for the attributes st (made if needed), its
 * nlookup raised, and e filled. 0 or -ENOMEM. */
int dsfs_overlay_node_entry(struct dsfs *fs, struct dsfs_node *dir,
			    const char *name, const struct stat *st,
			    struct dsfs_entry *e);
/* fsync directory path (relative), as dstagefs: best effort, logged. */
void dsfs_overlay_node_sync_dir(struct dsfs_overlay *st, const char *path);
/* The parent directory's path of path ("." at the top) into buf. */
void dsfs_overlay_node_parent_path(const char *path, char *buf);
/* Release n's place (FORGET, teardown). */
void dsfs_overlay_node_forget(struct dsfs *fs, struct dsfs_node *n);
/* After a rename or unlink of name in dir: the node the kernel has for it
 * (if any) moves to (newdir, newname), or is marked gone (newdir NULL). */
void dsfs_overlay_node_moved(struct dsfs *fs, struct dsfs_node *dir,
			     const char *name, struct dsfs_node *newdir,
			     const char *newname);

/* ---- dsfs_overlay_cred.c ---- */
/* Act as who for the file-system calls of this thread (fsuid, fsgid,
 * groups; umask 0, per thread). 0, or -EACCES/-EPERM when who may not or
 * cannot be acted for. Undo with dsfs_overlay_cred_drop, also on failure. */
int dsfs_overlay_cred_take(struct dsfs_overlay *st, struct dsfs_caller *who);
void dsfs_overlay_cred_drop(struct dsfs_overlay *st);
/* Save dstagefs's own groups (init). 0 or -errno. */
int dsfs_overlay_cred_init(void);

/* ---- dsfs_overlay_file.c ---- */
int dsfs_overlay_file_open(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *n, struct fuse_file_info *fi);
int dsfs_overlay_file_create(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *dir, const char *name,
			     mode_t mode, struct fuse_file_info *fi,
			     struct dsfs_entry *e);
int dsfs_overlay_file_read(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *n, struct fuse_file_info *fi,
			   size_t size, off_t off, struct dsfs_reply_read *r);
ssize_t dsfs_overlay_file_write(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *n, struct fuse_file_info *fi,
				const char *buf, size_t size, off_t off);
int dsfs_overlay_file_flush(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, struct fuse_file_info *fi);
int dsfs_overlay_file_fsync(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, int datasync,
			    struct fuse_file_info *fi);
int dsfs_overlay_file_fallocate(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_node *n, int mode, off_t off,
				off_t len, struct fuse_file_info *fi);
void dsfs_overlay_file_release(struct dsfs *fs, struct dsfs_caller *who,
			       struct dsfs_node *n, struct fuse_file_info *fi);
/* Whether path (relative) matches overlay.no_cache. */
bool dsfs_overlay_file_no_cache(const struct dsfs_overlay *st,
				const char *path);
/* The descriptor of an open file handle (fi->fh). */
int dsfs_overlay_file_fd(const struct fuse_file_info *fi);

#endif
