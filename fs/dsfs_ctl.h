/* SPDX-License-Identifier: MIT */
/*
 * dsfs_ctl: a subtree, the control files, .dstage\/prefetch and .dstage\/stats.
 * See dsfs_ctl.c for its state and dsfs_subtree.h for the hooks.
 */
#ifndef DSFS_CTL_H
#define DSFS_CTL_H

#include "dsfs_subtree.h"

extern const struct dsfs_subtree dsfs_ctl_subtree;

#endif
