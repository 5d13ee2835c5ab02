/* SPDX-License-Identifier: MIT */
/*
 * dsfs_overlay: the transparent mode's subtree (dstagefs --over DIR, or
 * overlay.dir): the whole mount is DIR's own tree, served through a
 * descriptor of DIR opened before the mount hid it. Reads go through the
 * block cache, writes straight to the tree, each system call made with the
 * caller's file-system uid, gid and groups. See docs/dstagefs.md,
 * "Overlay (transparent) mode".
 */
#ifndef DSFS_OVERLAY_H
#define DSFS_OVERLAY_H

#include "dsfs_subtree.h"

/* The root of an overlay mount (DSFS_SUB_ROOT's slot). */
extern const struct dsfs_subtree dsfs_overlay_subtree;
/* The other slots in overlay mode: no nodes, no hooks. */
extern const struct dsfs_subtree dsfs_overlay_off_subtree;

#endif
