/* SPDX-License-Identifier: MIT */
/*
 * dsfs_opts: the command line of dstagefs (a service). Fills a struct
 * dsfs_opts, immutable once the file system is mounted.
 */
#ifndef DSFS_OPTS_H
#define DSFS_OPTS_H

#define FUSE_USE_VERSION 314

#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Exit codes of dstagefs (documented in --help and docs/dstagefs.md). */
enum {
	DSFS_EXIT_OK = 0,
	DSFS_EXIT_RUNTIME = 1, /* the session loop failed */
	DSFS_EXIT_USAGE = 2, /* bad option or configuration */
	DSFS_EXIT_MOUNT = 3, /* mountpoint unusable, stale mount not cleared */
	DSFS_EXIT_STORE = 4, /* catalog or cache could not be opened */
};

/* Defaults of the .dstage limits (docs/dstagefs.md, "Limits per user"). */
#define DSFS_DEF_PF_MAX_ENTRIES (1u << 20)
#define DSFS_DEF_PF_MAX_BYTES (128ULL << 20)
#define DSFS_DEF_PF_UID_MAX_ENTRIES (1u << 21)
#define DSFS_DEF_PF_UID_MAX_BYTES (256ULL << 20)
#define DSFS_DEF_CTL_MAX_HANDLES 64

struct dsfs_opts {
	const char *mountpoint;
	bool mountpoint_given; /* MOUNTPOINT on the command line */
	/* --over DIR: the overlay (transparent) mode, mounted on DIR
	 * (then mountpoint is DIR too); NULL: the dstage namespace. */
	const char *over_dir;
	const char *config_path; /* NULL: config_load's default search */
	const char *log_level; /* NULL: from the config */
	bool foreground, debug, allow_other, show_help, show_version;
	uid_t uid;
	gid_t gid;
	mode_t umask; /* applied to 0777 (dirs) and 0666 (files) */
	unsigned threads; /* max worker threads of the session loop */
	bool clone_fd;
	bool splice; /* reply with cache file descriptors (splice) */
	/* Ask the kernel for FUSE passthrough when libfuse and the kernel
	 * have it (-o nopassthrough: never); see dsfs.c. */
	bool passthrough;
	unsigned max_write_kb; /* request size: sets max_pages (<= 1024) */
	unsigned read_ahead_kb; /* the mount's bdi read_ahead_kb; 0: leave */
	double entry_timeout; /* seconds, dataset subtree and static nodes */
	unsigned poll_ms; /* catalog poll period for new/changed datasets */
	uint64_t prefetch_window; /* bytes in flight for .dstage/prefetch */
	/* .dstage limits: one prefetch list (open handle), one uid's lists
	 * together, one uid's open .dstage files. */
	uint64_t pf_max_entries, pf_max_bytes;
	uint64_t pf_uid_max_entries, pf_uid_max_bytes;
	unsigned ctl_max_handles;
	/* -o options for libfuse (dstagefs's own taken out), as arguments
	 * for fuse_session_new: argv[0] then "-o", "LIST" pairs. */
	struct fuse_args fuse_args;
};

/* Parse argc/argv into o (defaults first). Returns 0, -EINVAL (the
 * message is printed) or -ENOMEM. Release o in either case. */
int dsfs_opts_parse(int argc, char **argv, struct dsfs_opts *o);
void dsfs_opts_help(const char *prog);
void dsfs_opts_release(struct dsfs_opts *o);

#endif
