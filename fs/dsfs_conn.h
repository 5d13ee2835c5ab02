/* SPDX-License-Identifier: MIT */
/*
 * dsfs_conn: the modes of the FUSE connection that dstagefs negotiates at
 * INIT beyond request sizes (today: passthrough). Called by the INIT
 * handler (dsfs_ops.c); docs/dstagefs.md, "Passthrough".
 */
#ifndef DSFS_CONN_H
#define DSFS_CONN_H

#include "dsfs_subtree.h"

/*
 * The FUSE INIT handler's part that is about modes (dsfs_ops.c calls it
 * last): request passthrough when built against libfuse >= 3.17
 * (DSTAGE_HAVE_FUSE_PASSTHROUGH), not disabled by -o nopassthrough, the
 * kernel offers it and this process may open backing files; set
 * fs->passthrough; log one line saying which mode and why.
 */
void dsfs_init_conn(struct dsfs *fs, struct fuse_conn_info *conn);

#endif
