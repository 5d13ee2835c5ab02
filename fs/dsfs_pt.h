/* SPDX-License-Identifier: MIT */
/*
 * dsfs_pt: FUSE passthrough of one inode's opens (a service of the
 * subtrees that pass files through: datasets, the overlay, checkpoints;
 * docs/dstagefs.md "Passthrough").
 *
 * The kernel allows one backing file per inode, used by every open of it
 * while any is open: it fails a passthrough open beside a cached (plain)
 * open read through dstagefs, and any open that is not passed through (a
 * plain or direct-I/O one) beside a passthrough one, with EIO (fs/fuse/
 * iomode.c, seen on 6.18). So per inode: the backing id and the opens
 * using it, and the plain opens.
 * Life of id:
 *
 *   0 --open that may pass through, no plain open, a backing descriptor,
 *        fuse_passthrough_open > 0--> id (pt_opens 1)
 *   id --open that may pass through, of the version id holds (tag)-->
 *        id (pt_opens + 1, whatever the backing source says now: the
 *        kernel uses the file it has)
 *   id --open that may not pass through (a writer), or of another
 *        version (a changed overlay file)--> id, that open refused with
 *        ETXTBSY (the kernel would fail it with EIO)
 *   id --RELEASE of the last (pt_opens 0)--> fuse_passthrough_close, 0
 *   id --last release without a request (an interrupted OPEN reply, a
 *        release run after its request's reply, teardown)--> id, unused:
 *        closed by the inode's next open, or with the connection
 *
 * lock is a leaf, held across the backing callback: one inode's opens
 * wait for each other, no one else's.
 *
 * The kernel sends RELEASE after close(2) has returned, so a program that
 * closes a passed-through file and opens it again for writing can reach
 * us before its RELEASE: an open that would be refused first waits, on
 * released, up to DSFS_PT_RELEASE_WAIT_MS for the passed-through opens to
 * be released (another worker thread serves the RELEASE meanwhile).
 */
#ifndef DSFS_PT_H
#define DSFS_PT_H

#include <pthread.h>
#include <stdbool.h>

#include "dstage/objstore.h"

struct dsfs;
struct dsfs_caller;
struct fuse_file_info;

/* How long a refused open waits for RELEASEs in flight, ms. */
#define DSFS_PT_RELEASE_WAIT_MS 1000

struct dsfs_pt {
	pthread_mutex_t lock;
	pthread_cond_t released; /* with lock: pt_opens reached 0 */
	int id; /* lock: backing id registered with the kernel; 0: none */
	unsigned pt_opens; /* lock: opens passed through with id */
	unsigned plain_opens; /* lock: opens read through dstagefs, cached */
	char tag[OBJSTORE_ETAG_MAX]; /* lock: the version id holds */
};

/* How an open was answered (the handle keeps it for its release). */
enum dsfs_pt_kind {
	DSFS_PT_PLAIN, /* read through dstagefs, the mount's page cache */
	DSFS_PT_PASSED, /* the kernel reads the backing file */
};

void dsfs_pt_init(struct dsfs_pt *pt);
void dsfs_pt_destroy(struct dsfs_pt *pt);

/*
 * Answer an open of the inode (every access check done). When may_pass,
 * passthrough is on (fs->passthrough, a request to answer) and no plain
 * open is there, the open is passed through: the inode's backing file if
 * it has one and tag (the version the open is of) is the one it holds,
 * else backing(arg, &fd)'s read-only descriptor (0, or -errno: then it
 * reads through dstagefs), closed here once the kernel holds the file.
 * Sets *kind, and fi->backing_id and fi->keep_cache = 0 when passed
 * through. label and key name the file in the one log line when the
 * kernel refuses a backing file.
 * Returns 0, or -ETXTBSY: passed-through opens of the inode are there and
 * this one cannot join them (may_pass false, or another tag), still after
 * DSFS_PT_RELEASE_WAIT_MS.
 */
int dsfs_pt_open(struct dsfs *fs, struct dsfs_caller *who, struct dsfs_pt *pt,
		 bool may_pass, int (*backing)(void *arg, int *fd), void *arg,
		 const char *tag, struct fuse_file_info *fi, const char *label,
		 const char *key, enum dsfs_pt_kind *kind);

/* The release of an open answered kind. */
void dsfs_pt_release(struct dsfs_caller *who, struct dsfs_pt *pt,
		     enum dsfs_pt_kind kind);

#endif
