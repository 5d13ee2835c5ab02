/* SPDX-License-Identifier: MIT */
/*
 * lifecycle_run: apply the catalog's lifecycle rules (include/dstage/
 * lifecycle.h) to the checkpoint store (checkpoints.store), its archive
 * tiers and this node's local copies; and recall an archived checkpoint.
 *
 * The archive tier of a rule is another store URL. Moving a checkpoint
 * there copies each of its objects and their SHA-256 sidecars (with the
 * rule's S3 storage class), writes the marker "<job>/.dstage-archived/
 * <checkpoint>" into the store, and only then deletes the objects from the
 * store: at every moment a reader finds the files or the marker. A recall
 * copies them back and removes the marker. Deleting removes the objects,
 * sidecars and marker from the store and the archive, and the local
 * copies. Every move, deletion and removal is logged and audited
 * (catalog_audit_add: action "lifecycle.archive", "lifecycle.delete",
 * "lifecycle.drop-local", "lifecycle.abandoned", target "<job>/<name>",
 * the rule in new_value) as the uid and user of the run.
 *
 * Errors are -errno: -ENOENT (no checkpoints.store; no marker to recall),
 * store errors (include/dstage/objstore.h), catalog errors, -ENOMEM.
 */
#ifndef DSTAGE_LIFECYCLE_RUN_H
#define DSTAGE_LIFECYCLE_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "dstage/lifecycle.h"

struct catalog;
struct dstage_config;

#define LIFECYCLE_ABANDONED_RM (1u << 3) /* an abandoned file removed */
/* "<job>/.dstage-archived/<checkpoint>": hidden from listings, it keeps
 * the job's directory while all its checkpoints are archived. */
#define LIFECYCLE_MARKER ".dstage-archived/"

struct lifecycle_run_opts {
	int64_t now; /* seconds since the epoch: the clock of the rules */
	bool dry_run; /* decide and report, change nothing */
	uint32_t uid; /* who runs it, for the audit trail */
	const char *user; /* may be NULL */
	int64_t abandoned_keep; /* seconds an abandoned file is kept */
};

/* One decision, reported before (dry-run: instead of) it is carried out. */
struct lifecycle_event {
	const char *job; /* "" for an abandoned file */
	const char *name; /* checkpoint, or the abandoned file */
	unsigned action; /* one LIFECYCLE_* action bit or
			  * LIFECYCLE_ABANDONED_RM */
	const char *from, *to; /* tiers' URLs or paths ("" for none) */
	const struct lifecycle_rule *rule; /* NULL: abandoned */
	int64_t step; /* -1: none */
	int64_t age; /* seconds */
	int result; /* 0 or -errno; 0 in a dry run */
};
typedef void (*lifecycle_event_cb)(void *arg, const struct lifecycle_event *ev);

struct lifecycle_run_stats {
	unsigned jobs, checkpoints; /* seen, with a rule */
	unsigned archived, deleted, dropped, abandoned, errors;
};

/*
 * Apply every rule once. cb (may be NULL) sees each decision and its
 * result. One checkpoint's failure is counted and logged; the run goes
 * on. Returns 0 (even with failed actions: see stats), or -errno when the
 * rules or the store cannot be read.
 */
int lifecycle_run(const struct dstage_config *cfg, struct catalog *cat,
		  const struct lifecycle_run_opts *o, lifecycle_event_cb cb,
		  void *arg, struct lifecycle_run_stats *stats);

/*
 * Recall the archived checkpoint that key ("<job>/<checkpoint>[/...]")
 * belongs to into store (the checkpoint store; NULL: open cfg's
 * checkpoints.store for the call), with cfg for the archive's settings.
 * who (may be NULL: not audited) is whose read asked for it: a recall
 * done is audited in cfg's catalog as who's uid and user, action
 * "lifecycle.recall", target "<job>/<checkpoint>", old value "from
 * <archive URL>", new value "read of <key>" (an audit failure is logged,
 * the recall stands). Returns 0 (recalled), -ENOENT (no marker: not
 * archived), or a store error.
 */
struct objstore;
struct catalog_audit;
int lifecycle_recall(const struct dstage_config *cfg, struct objstore *store,
		     const char *key, const struct catalog_audit *who);

/* What a lookup shows of an archived key without recalling it. */
struct lifecycle_archived {
	bool dir;
	uint64_t size; /* a file's, in the archive */
	int64_t mtime; /* the checkpoint's, from its marker */
};

/*
 * The attributes of key ("<job>/<checkpoint>[/...]") in the archive of
 * the checkpoint it belongs to, read from the marker in store and a HEAD
 * (or a one-object listing, for a directory) of the archive; nothing is
 * copied. Returns 0, -ENOENT (not archived: no marker, or one the store
 * cannot give; or no such key in the archive), or the archive's error.
 */
int lifecycle_archived_stat(const struct dstage_config *cfg,
			    struct objstore *store, const char *key,
			    struct lifecycle_archived *a);

#endif
