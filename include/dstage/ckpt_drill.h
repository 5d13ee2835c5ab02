/* SPDX-License-Identifier: MIT */
/*
 * ckpt_drill: a recovery drill of the checkpoint store (checkpoints.store).
 *
 * A checkpoint is a file or a directory directly under "<job>/". The drill
 * picks the newest one (the highest step number in its name, the last run
 * of digits; without numbers the newest upload) or the one named, restores
 * every object of it into a scratch directory, and checks each file's
 * SHA-256 against the one recorded when it was published (the sidecar
 * ".dstage-sha256/<key>", docs/checkpoints.md), and against this node's
 * catalog record of it where the caller gives one (o->recorded). A file that differs, has no
 * recorded hash, or is recorded but gone from the store is a failure.
 */
#ifndef DSTAGE_CKPT_DRILL_H
#define DSTAGE_CKPT_DRILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct dstage_config;

struct ckpt_drill_opts {
	const char *job; /* required */
	const char *step; /* a step number or a checkpoint name; NULL: newest */
	const char *to; /* scratch directory: made, must be empty if present */
	/*
	 * May be NULL. What this node recorded when it published key to store
	 * (the catalog's checkpoint_files): 0 with sha256 (hex) and etag
	 * filled, or -ENOENT. A file whose version in the store is the one
	 * recorded (same ETag) must also hash to the recorded SHA-256, whatever
	 * the store's own records say ("differs from the catalog's record":
	 * the store changed the bytes and their sidecar together).
	 */
	int (*recorded)(void *arg, const char *store, const char *key,
			char sha256[65], char *etag, size_t etag_len);
	void *recorded_arg;
};

struct ckpt_drill_file {
	char *key; /* relative to the store */
	uint64_t size;
	char want[65], got[65]; /* hex; "" when unknown */
	const char *problem; /* NULL: good; "differs", "missing", ... */
};

struct ckpt_drill_report {
	char *checkpoint; /* "<job>/<name>" */
	size_t nfiles, nbad;
	uint64_t bytes;
	double seconds;
	struct ckpt_drill_file *files;
	size_t files_cap; /* files' capacity */
};

/*
 * Run the drill. Returns 0 when it ran (r->nbad says whether every file
 * matched; release r either way), -ENOENT (no such job or step, logged),
 * -EEXIST (o->to is not empty), -EINVAL (no checkpoints.store), or the
 * store's or the file system's -errno.
 */
int ckpt_drill(const struct dstage_config *cfg, const struct ckpt_drill_opts *o,
	       struct ckpt_drill_report *r);

/* Accepts a zeroed report. */
void ckpt_drill_release(struct ckpt_drill_report *r);

#endif
