// SPDX-License-Identifier: MIT
/*
 * dsfs_conn: FUSE passthrough at INIT (see dsfs_conn.h). Built against
 * libfuse < 3.17 (DSTAGE_HAVE_FUSE_PASSTHROUGH 0, fs/CMakeLists.txt) it only
 * says so.
 */
#include <linux/capability.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dsfs_conn.h"
#include "dsfs_opts.h"
#include "dstage/log.h"

#ifndef DSTAGE_HAVE_FUSE_PASSTHROUGH
#define DSTAGE_HAVE_FUSE_PASSTHROUGH 0
#endif

#if DSTAGE_HAVE_FUSE_PASSTHROUGH
/* The kernel opens a backing file (FUSE_DEV_IOC_BACKING_OPEN) only for a
 * daemon with CAP_SYS_ADMIN: without it passthrough could never be used. */
static bool dsfs_cap_sys_admin(void)
{
	struct __user_cap_header_struct h = {
		.version = _LINUX_CAPABILITY_VERSION_3,
	};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];

	memset(d, 0, sizeof(d));
	if (syscall(SYS_capget, &h, d))
		return false;
	return d[CAP_TO_INDEX(CAP_SYS_ADMIN)].effective &
	       CAP_TO_MASK(CAP_SYS_ADMIN);
}
#endif

/* Whether the kernel offers FUSE over io_uring (its fuse module's
 * enable_uring): one line, so that a mount's transport is never a guess. */
static void dsfs_init_uring(const struct fuse_conn_info *conn)
{
#ifdef FUSE_CAP_OVER_IO_URING
	if (conn->capable_ext & FUSE_CAP_OVER_IO_URING)
		log_info("io_uring: offered by the kernel; used when mounted "
			 "with -o io_uring (.dstage/stats fs_uring_requests)");
	else
		log_info("io_uring: not offered by the kernel (the fuse "
			 "module's enable_uring parameter is off): requests "
			 "over /dev/fuse");
#else
	(void)conn;
#endif
}

void dsfs_init_conn(struct dsfs *fs, struct fuse_conn_info *conn)
{
	dsfs_init_uring(conn);
	fs->passthrough = false;
#if DSTAGE_HAVE_FUSE_PASSTHROUGH
	const char *why;

	if (!fs->opts->passthrough) {
		why = "disabled by option (-o nopassthrough)";
	} else if (!(conn->capable & FUSE_CAP_PASSTHROUGH)) {
		why = "the kernel did not offer it";
	} else if (conn->want & FUSE_CAP_WRITEBACK_CACHE) {
		/* The kernel refuses passthrough with the writeback cache. */
		why = "the writeback cache is on";
	} else if (!dsfs_cap_sys_admin()) {
		why = "no CAP_SYS_ADMIN (the kernel opens backing files only "
		      "for it)";
	} else {
		/* A bit of the 32-bit want, like the others dsfs_ops_init
		 * sets (libfuse 3.17 folds want into want_ext). Backing
		 * files are the cache's and the checkpoint staging's files on
		 * a plain local file system: STACKED_UNDER, which also lets
		 * another stacked file system (overlayfs) sit on this mount. */
		conn->want |= FUSE_CAP_PASSTHROUGH;
		conn->max_backing_stack_depth = FUSE_BACKING_STACKED_UNDER;
		fs->passthrough = true;
		log_info("passthrough on: libfuse %s, kernel capable",
			 fuse_pkgversion());
		return;
	}
	log_info("passthrough off: %s (libfuse %s)", why, fuse_pkgversion());
#else
	(void)conn;
	log_info("passthrough off: built against libfuse %d.%d",
		 FUSE_MAJOR_VERSION, FUSE_MINOR_VERSION);
#endif
}
