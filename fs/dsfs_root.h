/* SPDX-License-Identifier: MIT */
/*
 * dsfs_root: a subtree, the top of the namespace: / (lists the other subtrees' tops), and the
 * mount-wide statfs.
 * See dsfs_root.c for its state and dsfs_subtree.h for the hooks.
 */
#ifndef DSFS_ROOT_H
#define DSFS_ROOT_H

#include "dsfs_subtree.h"

extern const struct dsfs_subtree dsfs_root_subtree;

#endif
