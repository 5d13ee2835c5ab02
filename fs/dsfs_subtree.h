/* SPDX-License-Identifier: MIT */
/*
 * dsfs_subtree: the contract between the dispatcher (dsfs.c, dsfs_ops.c)
 * and the subtrees under it (dsfs_root.c, dsfs_datasets.c,
 * ckpt/dsfs_ckpt.c, dsfs_ctl.c; in transparent mode, --over DIR,
 * overlay/dsfs_overlay.c in the root's slot and dsfs_overlay_off_subtree
 * in the others): the table of hooks a subtree fills in, and struct dsfs, the
 * mount-wide context every hook receives.
 *
 * Layers (each file calls only files below it):
 *
 *   main.c                          process life
 *   dsfs.c, dsfs_ops.c              dispatcher: FUSE lowlevel ops, -errno
 *                                   turned into the one reply, open handles
 *   dsfs_root.c dsfs_datasets.c     subtrees: a struct dsfs_subtree each
 *   ckpt/dsfs_ckpt.c dsfs_ctl.c     (ckpt/: the checkpoint subtree's room)
 *   overlay/dsfs_overlay.c          (overlay/: the whole mount in --over
 *                                   mode)
 *   dsfs_node.c dsfs_reply.c        services: node table, reply helpers,
 *   dsfs_caller.c dsfs_dataset.c    caller, dataset table, options
 *   dsfs_opts.c
 *
 * Every node names its subtree (node->sub); the dispatcher sends each
 * operation on a node to that table, with the caller. A subtree may
 * implement every operation the kernel sends; a hook left NULL gets the
 * default written next to it below (today's answers of a read-only file
 * system), so a writable subtree (checkpoints) only fills in its table.
 *
 * Hooks return 0 (or a length, where said) or -errno; the dispatcher turns
 * that into the FUSE reply. They may block (catalog queries, cache fills):
 * the session loop is multithreaded. fi->fh, where a hook sees one, is the
 * subtree's own (the dispatcher keeps its wrapper).
 */
#ifndef DSFS_SUBTREE_H
#define DSFS_SUBTREE_H

#define FUSE_USE_VERSION 314

#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include "dsfs_caller.h"
#include "dsfs_node.h"
#include "dsfs_reply.h"

struct cache;
struct dstage_config;
struct dsfs_opts;
struct dsfs_dataset_table;
struct dsfs_handle;
struct dsfs;

/* Subtree slots of struct dsfs, in init order (destroy: reverse). */
enum {
	DSFS_SUB_ROOT,
	DSFS_SUB_DATASETS,
	DSFS_SUB_CKPT,
	DSFS_SUB_CTL,
	DSFS_SUB_COUNT,
};

struct dsfs_subtree {
	const char *name;

	/* ---- life: all optional ---- */
	/* Before the mount: register fixed nodes, make sub_state. Returns 0
	 * or -errno (the mount fails). */
	int (*init)(struct dsfs *fs);
	/* After the session ended and every node was forgotten. */
	void (*destroy)(struct dsfs *fs);
	/* Mounted, dstagefs in the background (forked), the session loop
	 * not started: start the subtree's threads (none may be started
	 * before: a fork keeps only its caller). 0 or -errno (the mount
	 * ends). */
	int (*start)(struct dsfs *fs);
	/* The poller thread, every opts.poll_ms once mounted. */
	void (*poll)(struct dsfs *fs);
	/* A node of this subtree is being freed (FORGET to 0, teardown):
	 * release n->priv. */
	void (*forget)(struct dsfs *fs, struct dsfs_node *n);

	/* ---- names; default ENOTDIR (lookup), EROFS (the rest) ---- */
	/* Find name in dir: e->node with nlookup raised and its attributes.
	 * -ENOENT with e->entry_timeout > 0 caches the absence. */
	int (*lookup)(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, const char *name,
		      struct dsfs_entry *e);
	int (*mknod)(struct dsfs *fs, struct dsfs_caller *who,
		     struct dsfs_node *dir, const char *name, mode_t mode,
		     dev_t rdev, struct dsfs_entry *e);
	int (*mkdir)(struct dsfs *fs, struct dsfs_caller *who,
		     struct dsfs_node *dir, const char *name, mode_t mode,
		     struct dsfs_entry *e);
	int (*symlink)(struct dsfs *fs, struct dsfs_caller *who,
		       const char *link, struct dsfs_node *dir,
		       const char *name, struct dsfs_entry *e);
	int (*link)(struct dsfs *fs, struct dsfs_caller *who,
		    struct dsfs_node *n, struct dsfs_node *newdir,
		    const char *newname, struct dsfs_entry *e);
	int (*unlink)(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, const char *name);
	int (*rmdir)(struct dsfs *fs, struct dsfs_caller *who,
		     struct dsfs_node *dir, const char *name);
	/* Only within one subtree: across subtrees the dispatcher answers
	 * EXDEV (EROFS if the source subtree has no rename). */
	int (*rename)(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, const char *name,
		      struct dsfs_node *newdir, const char *newname,
		      unsigned flags);
	/* Create and open; on success fi->fh is the subtree's handle. */
	int (*create)(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, const char *name, mode_t mode,
		      struct fuse_file_info *fi, struct dsfs_entry *e);

	/* ---- attributes ---- */
	/* Required: n's attributes and how long they may be cached; the
	 * subtree checks who may see them (default ENOSYS). */
	int (*getattr)(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_node *n, struct fuse_file_info *fi,
		       struct stat *st, double *timeout);
	/* Change what to_set names, then give the attributes (default
	 * EROFS). fi may be NULL. */
	int (*setattr)(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_node *n, const struct stat *attr, int to_set,
		       struct fuse_file_info *fi, struct stat *st,
		       double *timeout);
	/* access(2): mask 0 or R_OK|W_OK|X_OK. Default: all allowed but
	 * W_OK, which is EROFS. */
	int (*access)(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *n, int mask);
	/* The link's target into buf (size bytes, NUL-terminated). Default
	 * EINVAL (not a link). */
	int (*readlink)(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, char *buf, size_t size);
	/* Default: the root subtree's statfs, else zeros. */
	int (*statfs)(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *n, struct statvfs *sv);

	/* ---- files ---- */
	/* Default EISDIR. On success fi->fh is the subtree's handle. */
	int (*open)(struct dsfs *fs, struct dsfs_caller *who,
		    struct dsfs_node *n, struct fuse_file_info *fi);
	/* Reply through r (dsfs_reply_read_*), or return -errno having sent
	 * nothing. Returning 0 without a reply answers 0 bytes. Default
	 * EISDIR. */
	int (*read)(struct dsfs *fs, struct dsfs_caller *who,
		    struct dsfs_node *n, struct fuse_file_info *fi, size_t size,
		    off_t off, struct dsfs_reply_read *r);
	/* Bytes taken (a short count is a short write), or -errno. Default
	 * EROFS. */
	ssize_t (*write)(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, struct fuse_file_info *fi,
			 const char *buf, size_t size, off_t off);
	/* Defaults 0 (nothing to flush or sync). */
	int (*flush)(struct dsfs *fs, struct dsfs_caller *who,
		     struct dsfs_node *n, struct fuse_file_info *fi);
	int (*fsync)(struct dsfs *fs, struct dsfs_caller *who,
		     struct dsfs_node *n, int datasync,
		     struct fuse_file_info *fi);
	/* Default EROFS. */
	int (*fallocate)(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi);
	/* The kernel's RELEASE, or teardown for handles it never released
	 * (then who is dsfs_caller_none). Runs once every request on the
	 * handle has finished (replied and returned), maybe on the thread
	 * of the last of them: a read may reply from memory fi->fh owns,
	 * and use it after its reply. So who->req may be NULL after a
	 * RELEASE too: who->released says whether one came. Same for
	 * releasedir. Cannot fail. */
	void (*release)(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, struct fuse_file_info *fi);

	/* ---- directories ---- */
	/* Default 0 (no handle) if readdir is set, else ENOTDIR. */
	int (*opendir)(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_node *n, struct fuse_file_info *fi);
	/* Add entries from cookie off on until d is full. An error after
	 * entries were added still sends those. */
	int (*readdir)(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_node *n, struct fuse_file_info *fi,
		       off_t off, struct dsfs_reply_dir *d);
	void (*releasedir)(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *n, struct fuse_file_info *fi);
	/* Default 0. */
	int (*fsyncdir)(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, int datasync,
			struct fuse_file_info *fi);

	/* ---- extended attributes: set/remove default EROFS, get/list
	 * default ENOTSUP ---- */
	int (*setxattr)(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, const char *name,
			const char *value, size_t size, int flags);
	/* The value's length; with size 0 only the length; -ERANGE when
	 * size is too small. */
	ssize_t (*getxattr)(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, const char *name, char *value,
			    size_t size);
	ssize_t (*listxattr)(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, char *list, size_t size);
	int (*removexattr)(struct dsfs *fs, struct dsfs_caller *who,
			   struct dsfs_node *n, const char *name);
};

/* Counters shown in .dstage/stats; relaxed atomics. */
struct dsfs_counters {
	atomic_ullong reads, read_bytes, splice_replies, copy_replies;
	atomic_ullong read_errors, lookups, readdirs, prefetch_lists;
	atomic_ullong prefetch_objects;
	atomic_ullong passthrough_opens; /* opens given a backing file */
	atomic_ullong uring_requests; /* arrived over io_uring (libfuse 3.18) */
};

/*
 * The mount. Set up by dsfs_init before the session starts; after that
 * only cache (set once, before the loop), stopping and what the
 * subtrees' own states guard change.
 */
struct dsfs {
	const struct dsfs_opts *opts;
	const struct dstage_config *cfg;
	struct cache *cache;
	struct fuse_session *se;
	int64_t mount_time; /* mtime of the fixed directories */
	struct dsfs_nodes nodes;
	struct dsfs_counters ctr;
	/* FUSE passthrough negotiated (dsfs_init_conn, at INIT, before any
	 * open): an open may be answered with a backing file
	 * (fuse_passthrough_open), whose reads the kernel then serves
	 * itself. Never true when built against libfuse < 3.17. */
	bool passthrough;
	/* Set when unmounting begins: no more kernel notifications. */
	atomic_bool stopping;
	/* Owned by the datasets subtree (its init and destroy); borrowed
	 * by the others (set once, before the session starts). */
	struct dsfs_dataset_table *datasets;
	const struct dsfs_subtree *subs[DSFS_SUB_COUNT];
	void *sub_state[DSFS_SUB_COUNT]; /* each subtree's own, from init */

	/* ---- the dispatcher's own (dsfs.c, dsfs_ops.c); hands off ---- */
	/* The poller thread: see dsfs.c. poll_lock is a leaf lock. */
	pthread_t poller;
	bool poller_running;
	pthread_mutex_t poll_lock;
	pthread_cond_t poll_cond;
	bool poll_stop; /* poll_lock */
	/* Open handles the kernel has not released (dsfs_ops.c). Leaf. */
	pthread_mutex_t handle_lock;
	struct dsfs_handle *handles; /* handle_lock: doubly linked */
};

#endif
