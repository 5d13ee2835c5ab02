/* SPDX-License-Identifier: MIT */
/*
 * dsfs_ckpt: a subtree, checkpoints\/: writable, written through to the
 * checkpoint store by lib/ckpt/ (docs/checkpoints.md).
 * See dsfs_ckpt.c for its state and dsfs_subtree.h for the hooks.
 */
#ifndef DSFS_CKPT_H
#define DSFS_CKPT_H

#include "dsfs_subtree.h"

extern const struct dsfs_subtree dsfs_ckpt_subtree;

#endif
