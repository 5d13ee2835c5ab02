/* SPDX-License-Identifier: MIT */
/*
 * dsfs: the dispatcher's life cycle (what main.c calls): set up the mount
 * context and its subtrees, run the poller, tear down. The FUSE operations
 * themselves are in dsfs_ops.c; the hooks they dispatch to in
 * dsfs_subtree.h.
 */
#ifndef DSFS_H
#define DSFS_H

#include "dsfs_opts.h"
#include "dsfs_subtree.h"

/*
 * Set up fs and every subtree (in DSFS_SUB_* order; the datasets subtree
 * loads the dataset table from the catalog). Returns 0 or -errno from the
 * first subtree that failed (everything undone).
 */
int dsfs_init(struct dsfs *fs, const struct dsfs_opts *o,
	      const struct dstage_config *cfg);
/* Each subtree's start hook, in DSFS_SUB_* order, once mounted and in
 * the background, before the session loop: the threads that would not
 * survive the fork. 0 or the first -errno. */
int dsfs_start(struct dsfs *fs);
/* Stop the poller, release open handles, forget every node, destroy the
 * subtrees (reverse order). Accepts a context dsfs_init failed on. */
void dsfs_destroy(struct dsfs *fs);

/*
 * Release what subtrees still hold for open files and directories, as
 * RELEASE and RELEASEDIR would have: the kernel sends none once the session
 * has ended (an unmount with files open, or a RELEASE still queued when a
 * signal stopped the loop). Call after the session loop, while the cache is
 * still open.
 */
void dsfs_release_handles(struct dsfs *fs);

/* The poller calls each subtree's poll hook every opts.poll_ms (and first
 * raises the bdi's read_ahead_kb). Start it only after the session is
 * mounted: returns 0 or -errno. Stop it in two steps around
 * fuse_session_unmount: request (no more kernel notifications: sets
 * fs->stopping), unmount, then stop (join). */
int dsfs_poller_start(struct dsfs *fs);
void dsfs_poller_request_stop(struct dsfs *fs);
void dsfs_poller_stop(struct dsfs *fs);

/* How many datasets are mounted now (for the start-up log line). */
size_t dsfs_ndatasets(struct dsfs *fs);

#endif
