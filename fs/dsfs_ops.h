/* SPDX-License-Identifier: MIT */
/*
 * dsfs_ops: the FUSE low-level operations of dstagefs, the top of the
 * dispatcher (see dsfs_ops.c).
 */
#ifndef DSFS_OPS_H
#define DSFS_OPS_H

#include "dsfs_subtree.h"

/* For fuse_session_new, with the struct dsfs as userdata. */
extern const struct fuse_lowlevel_ops dsfs_ops_ll;

/* Release every handle the kernel has not released (see
 * dsfs_release_handles in dsfs.h). */
void dsfs_ops_release_handles(struct dsfs *fs);

#endif
