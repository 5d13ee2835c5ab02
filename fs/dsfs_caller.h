/* SPDX-License-Identifier: MIT */
/*
 * dsfs_caller: who is asking (a service). Every subtree hook receives the
 * caller of the request it serves: uid, gid and pid from fuse_req_ctx, and
 * the supplementary groups, fetched on first use (fuse_req_getgroups reads
 * /proc/<pid>/task/<tid>/status, so it is only done when a check needs it).
 *
 * A struct dsfs_caller belongs to one request (or, copied with its groups
 * loaded and req cleared, to one open file); it is not shared.
 */
#ifndef DSFS_CALLER_H
#define DSFS_CALLER_H

#define FUSE_USE_VERSION 314

#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <sys/types.h>

struct dsfs_caller {
	uid_t uid;
	gid_t gid;
	pid_t pid;
	/* NULL: no request (teardown, a stored copy, or a release run
	 * after the request that dropped the handle was answered) */
	fuse_req_t req;
	/* In a release hook: the kernel sent its RELEASE for the handle
	 * (false at teardown, and for an open whose reply was never taken),
	 * whichever request dropped the handle last, so req may be NULL */
	bool released;
	int ngroups; /* -1: not fetched yet, -2: unknown */
	gid_t groups[64];
};

/* Fill who from req; the groups are fetched on first use. */
void dsfs_caller_get(fuse_req_t req, struct dsfs_caller *who);
/* The caller of work no request asked for (teardown): uid 0, no groups. */
void dsfs_caller_none(struct dsfs_caller *who);
/* Fetch the groups now (before the request is answered). */
void dsfs_caller_load_groups(struct dsfs_caller *who);
/* Whether who's gid or one of its supplementary groups is gid. */
bool dsfs_caller_in_group(struct dsfs_caller *who, gid_t gid);

#endif
