/* SPDX-License-Identifier: MIT */
/*
 * dsfs_dataset: the dataset table (a service): the catalog's READY
 * datasets, each with its current version, and the sources they read from.
 * The datasets subtree owns the table (makes it in its init, refreshes it
 * from its poll hook, frees it in its destroy); other subtrees borrow it
 * (the control subtree resolves prefetch lists with it).
 *
 * Also the per-thread catalog connections every subtree queries with.
 */
#ifndef DSFS_DATASET_H
#define DSFS_DATASET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dstage/catalog.h"

struct dstage_config;
struct dsfs_caller;
struct dsfs_dataset_table;

/*
 * One version of one dataset. Immutable after creation but for refs, and
 * os and tiered, which change once (the source's handle -> the tiered
 * handle, when the shared tier's copy is published: atomics, read without
 * a lock); shared by the nodes, open files and prefetch lists made from
 * it, freed with the last reference.
 */
struct dsfs_dataset {
	atomic_int refs;
	char *name;
	char *source;
	int64_t version;
	int64_t mtime; /* registration time: the root's mtime */
	/* Owned by the table; lives as long as it. Load it once per use. */
	_Atomic(struct objstore *) os;
	char *tier_dir; /* its snapshot's copy in the shared tier, or NULL
			 * (no tier) */
	atomic_bool tiered; /* os reads tier_dir first (MANIFEST found) */
	bool tier_given_up; /* the table's lock: the copy could not be
			     * opened; not tried again for this version */
	bool restricted; /* catalog group set */
	bool group_known; /* the group resolved to gid on this node */
	gid_t gid;
	char *group;
};

void dsfs_dataset_get(struct dsfs_dataset *d);
/* Accepts NULL. */
void dsfs_dataset_put(struct dsfs_dataset *d);
/* Whether who may read d (always true for unrestricted datasets and
 * uid 0). */
bool dsfs_dataset_allowed(const struct dsfs_dataset *d,
			  struct dsfs_caller *who);

/*
 * A table loaded from cfg's catalog (an absent catalog file is an empty
 * table). Returns 0, or -errno from the catalog (the message logged) or
 * -ENOMEM.
 */
int dsfs_dataset_table_new(const struct dstage_config *cfg,
			   struct dsfs_dataset_table **out);
/* Accepts NULL. Datasets still referenced elsewhere stay valid, but their
 * sources (os) are closed: call after every user is gone. */
void dsfs_dataset_table_free(struct dsfs_dataset_table *t);
/* Re-read the catalog's list. Returns 0 or -errno (the table is kept). */
int dsfs_dataset_table_refresh(struct dsfs_dataset_table *t);
/* Current version of dataset name (a reference) or NULL. A name the table
 * lacks re-reads the catalog first, at most every 200 ms. */
struct dsfs_dataset *dsfs_dataset_table_current(struct dsfs_dataset_table *t,
						const char *name);
size_t dsfs_dataset_table_count(struct dsfs_dataset_table *t);
/*
 * Call fn for the datasets from index from on, in name order, with the
 * table read-locked (fn may use the node table, which is locked after
 * this one); stop when fn returns non-zero and return that.
 */
int dsfs_dataset_table_foreach(struct dsfs_dataset_table *t, size_t from,
			       int (*fn)(void *arg, size_t idx,
					 struct dsfs_dataset *d),
			       void *arg);
/* Take the names whose entry changed or vanished since the last call
 * (the caller frees each and the array). Returns their number. */
size_t dsfs_dataset_table_take_changed(struct dsfs_dataset_table *t,
				       char ***names);

/* The calling thread's catalog connection (opened read-only on first use,
 * closed when the thread exits). NULL and *err set on failure (-ENOENT:
 * no catalog file yet). */
struct catalog *dsfs_dataset_catalog(struct dsfs_dataset_table *t, int *err);

#endif
