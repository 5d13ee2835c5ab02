/* SPDX-License-Identifier: MIT */
/*
 * lifecycle_stage: what the stager daemon does with a node's checkpoint
 * staging directory (checkpoints.staging_dir, written by dstagefs; layout
 * in docs/checkpoints.md) while dstagefs runs: list the local copies and
 * their journal records, publish closed-but-unpublished files (P records:
 * the daemon's retry job), drop published local copies (lifecycle), list
 * and remove the files of killed writers (abandoned/).
 *
 * It never creates the staging directory and never touches a file whose
 * record is W (being written): such files belong to their writer.
 * A handle is used by one thread at a time.
 *
 * Errors are -errno: -ENOENT (no staging directory: dstagefs never ran
 * with checkpoints), -EACCES (the directory is not this user's or is
 * writable by group or others; logged with the fix), -ESTALE (the record
 * changed meanwhile: the file is someone else's now), store errors
 * (include/dstage/objstore.h), -ENOMEM.
 */
#ifndef DSTAGE_LIFECYCLE_STAGE_H
#define DSTAGE_LIFECYCLE_STAGE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct dstage_config;
struct objstore;
struct lifecycle_staging;
struct catalog;

/* Open cfg's checkpoints.staging_dir (it must exist). */
int lifecycle_staging_open(const struct dstage_config *cfg,
			   struct lifecycle_staging **out);

/* Accepts NULL. */
void lifecycle_staging_free(struct lifecycle_staging *s);

/* The staging directory's path. */
const char *lifecycle_staging_path(const struct lifecycle_staging *s);

/* One local copy: its journal record and its file. */
struct lifecycle_local {
	const char *key; /* "<job>/<path>" */
	char state; /* 'W' being written, 'P' to publish, 'C' published */
	uint64_t size;
	int64_t mtime; /* the file's */
	ino_t ino;
};

/* Call cb for every record whose file is there; a non-zero return stops
 * and is returned. */
typedef int (*lifecycle_local_cb)(void *arg, const struct lifecycle_local *l);
int lifecycle_staging_scan(struct lifecycle_staging *s, lifecycle_local_cb cb,
			   void *arg);

/*
 * Publish the closed file key (inode ino, record P) to os the way
 * dstagefs does: a private copy of it is made and checked against the
 * record's SHA-256, stored under key (atomically), its SHA-256 sidecar
 * written, and the record becomes C with the store's ETag (unless it
 * changed meanwhile: -ESTALE, the copy stored is still a closed version).
 * Once published, the SHA-256, size and ETag are recorded in cat (may
 * be NULL) under os's URL by catalog_ckpt_published, as dstagefs records
 * its own publishes (a failure there is logged, not returned: the store
 * has the file).
 * Returns 0, -ESTALE (record not P any more, or another file), -EBUSY
 * (dstagefs is publishing it), -EIO (the copy's SHA-256 is not the
 * recorded one), or a store error.
 */
int lifecycle_staging_publish(struct lifecycle_staging *s, struct objstore *os,
			      struct catalog *cat, const char *key, ino_t ino);

/* Drop the published local copy key (inode ino, record C): the store has
 * it; then its directories below the job's that are empty now. Returns 0,
 * -ESTALE (not C any more), -EBUSY (open in dstagefs: kept), or -errno. */
int lifecycle_staging_drop(struct lifecycle_staging *s, const char *key,
			   ino_t ino);

/* One file of a killed writer, in abandoned/ ("<inode>-<name>"). */
struct lifecycle_abandoned {
	const char *name;
	uint64_t size;
	int64_t mtime;
};
typedef int (*lifecycle_abandoned_cb)(void *arg,
				      const struct lifecycle_abandoned *a);
int lifecycle_abandoned_list(struct lifecycle_staging *s,
			     lifecycle_abandoned_cb cb, void *arg);
/* Remove abandoned/<name>. 0, -EINVAL (a bad name) or -errno. */
int lifecycle_abandoned_remove(struct lifecycle_staging *s, const char *name);

#endif
