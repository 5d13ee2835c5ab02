// SPDX-License-Identifier: MIT
/*
 * dsfs_overlay_cred: the overlay's system calls made as the caller.
 *
 * Run as root, dstagefs makes every call that names a path of the tree
 * (lookups, opens, creates, renames, removals, attribute changes) with the
 * caller's fsuid, fsgid and supplementary groups, set on the worker thread
 * alone (setfsuid/setfsgid are per thread; setgroups through the raw
 * system call, as glibc's would change every thread) and put back after.
 * The underlying file system thus checks the caller, not dstagefs: the
 * overlay never grants what the tree denies (an NFS-like server's
 * root-squash applies to callers that are root, as it would directly).
 * Each worker thread also gets its own umask of 0 (unshare CLONE_FS, once
 * per thread): the kernel already applied the caller's umask to the modes
 * of creates.
 *
 * Not run as root, dstagefs acts only for its own uid: any other caller
 * is refused (EACCES) before a system call is made.
 *
 * State: dstagefs's own groups and gid, set once by init before the session starts, read
 * only after. Per thread: whether CLONE_FS was unshared.
 */
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dsfs_overlay_i.h"
#include "dstage/log.h"

static gid_t dsfs_overlay_cred_groups[256];
static int dsfs_overlay_cred_ngroups;
static gid_t dsfs_overlay_cred_gid;
static _Thread_local bool dsfs_overlay_cred_own_fs;

int dsfs_overlay_cred_init(void)
{
	int n = getgroups(256, dsfs_overlay_cred_groups);

	if (n < 0)
		return -errno;
	dsfs_overlay_cred_ngroups = n;
	dsfs_overlay_cred_gid = getegid();
	return 0;
}

/* A thread-private umask of 0, once per thread. */
static int dsfs_overlay_cred_umask(void)
{
	if (dsfs_overlay_cred_own_fs)
		return 0;
	if (unshare(CLONE_FS)) {
		log_error("overlay: unshare(CLONE_FS) failed: %s: creates are "
			  "refused",
			  strerror(errno));
		return -EPERM;
	}
	umask(0);
	dsfs_overlay_cred_own_fs = true;
	return 0;
}

int dsfs_overlay_cred_take(struct dsfs_overlay *st, struct dsfs_caller *who)
{
	int ret = dsfs_overlay_cred_umask();

	if (ret)
		return ret;
	if (!st->as_caller)
		return who->uid == st->euid ? 0 : -EACCES;
	if (who->uid == 0 && who->gid == 0)
		return 0;
	dsfs_caller_load_groups(who);
	if (syscall(SYS_setgroups, who->ngroups > 0 ? (size_t)who->ngroups : 0,
		    who->groups) ||
	    syscall(SYS_setfsgid, who->gid) < 0 ||
	    syscall(SYS_setfsuid, who->uid) < 0)
		return -EPERM;
	/* setfsuid answers the previous value, never an error: check. */
	if ((uid_t)syscall(SYS_setfsuid, (uid_t)-1) != who->uid ||
	    (gid_t)syscall(SYS_setfsgid, (gid_t)-1) != who->gid)
		return -EPERM;
	return 0;
}

void dsfs_overlay_cred_drop(struct dsfs_overlay *st)
{
	if (!st->as_caller)
		return;
	syscall(SYS_setfsuid, 0);
	syscall(SYS_setfsgid, dsfs_overlay_cred_gid);
	syscall(SYS_setgroups, (size_t)dsfs_overlay_cred_ngroups,
		dsfs_overlay_cred_groups);
}
