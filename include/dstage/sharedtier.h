/* SPDX-License-Identifier: MIT */
/*
 * sharedtier: a dataset's verified copy on the cluster's parallel file
 * system, written once for every node (docs/stager.md, "The shared tier").
 *
 * A dataset's tier is its own setting (stager add --shared-tier DIR,
 * catalog_dataset_set_shared_tier) or ROOT/NAME with ROOT the cluster's
 * sources.shared_tier_root. Each snapshot of it lives in its own directory,
 * named by the snapshot id (a hash of the manifest's keys, sizes and
 * ETags: the same on every node that registered the same listing):
 *
 *   TIER/SNAPSHOT/data/KEY   the files, each published whole (temporary
 *                            file, fsync, rename) after its SHA-256 matched
 *                            the dataset's sums key (SHA256SUMS)
 *   TIER/SNAPSHOT/MANIFEST   written last: the copy is complete
 *   TIER/SNAPSHOT/.lease     held by the node that writes the copy
 *
 * The lease is a file created with O_EXCL holding its holder (host, pid)
 * and its expiry (real time, ms), renewed while the copy goes on; a node
 * finding it expired renames it away and takes over, keeping the files
 * already published (checked again) and fetching the rest.
 */
#ifndef DSTAGE_SHAREDTIER_H
#define DSTAGE_SHAREDTIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct catalog;
struct dstage_config;

#define SHAREDTIER_SNAPSHOT_LEN 32 /* hex digits of a snapshot id */
#define SHAREDTIER_MANIFEST "MANIFEST"
#define SHAREDTIER_LEASE ".lease"
#define SHAREDTIER_DATA "data"
#define SHAREDTIER_MAGIC "dstage-shared-tier 1"

/* What sharedtier_publish did. */
struct sharedtier_result {
	char dir[4096]; /* the snapshot's directory */
	char snapshot[SHAREDTIER_SNAPSHOT_LEN + 1];
	uint64_t files, bytes; /* in the snapshot */
	uint64_t copied, copied_bytes; /* fetched and published by this call */
	uint64_t kept; /* found published by an earlier holder, checked */
	uint64_t unchecked; /* files the sums key does not list */
	bool already; /* the copy was complete (MANIFEST) */
	bool waited; /* another node's lease was waited for */
	bool took_over; /* an expired lease was taken over */
	char holder[256]; /* -EBUSY: who holds the lease */
};

/*
 * The directory of dataset name's current snapshot in its shared tier,
 * into dir (len bytes), and the snapshot id into snapshot. The manifest is
 * read once from the catalog (every entry).
 * Returns 0, -ENOENT (no such dataset; or it has no tier: neither its own
 * setting nor sources.shared_tier_root), -ENAMETOOLONG, -ENOMEM, or a
 * catalog error.
 */
int sharedtier_locate(struct catalog *cat, const struct dstage_config *cfg,
		      const char *name, char *dir, size_t len,
		      char snapshot[SHAREDTIER_SNAPSHOT_LEN + 1]);

/*
 * Materialize dataset name's current snapshot in its shared tier, once for
 * the cluster: return at once when its MANIFEST is there; else take the
 * lease (waiting up to wait_ms for another holder, taking over an expired
 * one), copy every file not yet published from the dataset's source
 * (If-Match its ETag), check it against the expected SHA-256, publish it,
 * then write the MANIFEST and drop the lease.
 * Returns 0, -ENOENT (no dataset, no tier, or the tier's directory does not
 * exist: the parallel FS is not mounted?), -EPERM (a dataset restricted to
 * a group: its copy would be readable by everyone), -EACCES (the tier's root is
 * writable by others), -EBUSY (another node holds the
 * lease after wait_ms, res->holder names it; or this node's lease was taken
 * over), -EIO (a file's bytes do not match the sums key: nothing is
 * published under its name), -EINVAL (a key or ETag that cannot be written
 * in the MANIFEST), an objstore error, a catalog error, or -errno of the
 * file system. Each error is logged with the path or key at fault.
 */
int sharedtier_publish(struct catalog *cat, const struct dstage_config *cfg,
		       const char *name, unsigned wait_ms,
		       struct sharedtier_result *res);

struct objstore;

/*
 * Put dataset name's shared tier in front of its source *os
 * (objstore_open_tiered) when the dataset has a tier and its current
 * snapshot's copy is published there (MANIFEST); *os is then the tiered
 * handle, which owns the old one. Otherwise *os stays as it was and the
 * reason is logged at info (no tier, not published) or as an error (a
 * MANIFEST that cannot be read). A copy that fails the trust rule is put
 * in front refused: every read goes to the source (sharedtier_copy_open).
 * Returns 1 (tiered), 0 (not), -ENOMEM.
 */
int sharedtier_wrap(struct catalog *cat, const struct dstage_config *cfg,
		    const char *name, struct objstore **os);

/*
 * A reader's view of dataset name's current snapshot copy: its tier's
 * root, the copy's directory and the reference hashes of the manifest's
 * files (the sums key's), loaded from the catalog, so that the copy can be
 * opened later without it (dstagefs opens under its table's lock).
 * sharedtier_copy_load: 0, -ENOENT (no dataset or no tier), -ENOMEM, or a
 * catalog error. sharedtier_copy_open: objstore_open_tiered's answer for
 * the copy in front of origin, after the trust rule (docs/security.md):
 * a copy that fails it is not read (every read goes to origin, counted as
 * "untrusted", logged once); -ENOENT when the MANIFEST is not there.
 */
struct sharedtier_copy;
int sharedtier_copy_load(struct catalog *cat, const struct dstage_config *cfg,
			 const char *name, struct sharedtier_copy **out);
const char *sharedtier_copy_dir(const struct sharedtier_copy *c);
int sharedtier_copy_open(const struct sharedtier_copy *c,
			 struct objstore *origin, struct objstore **out);
void sharedtier_copy_free(struct sharedtier_copy *c); /* accepts NULL */

/*
 * Why this node did not use a dataset's shared tier, kept per dataset and
 * cause in <cache.dir>/tier-health, which every process of the node's
 * cache (dstagefs, the daemon's stage and verify jobs) writes and the
 * daemon's status reads (lib/tier/sharedtier_health.c). Counted once per
 * reader's open of the copy and cause: untrusted (the trust rule),
 * not_regular (a FIFO, link or device where a file or directory belongs,
 * or a MANIFEST that is not one), mismatch (a file or its MANIFEST line
 * differs from the reference hash), unreadable (a read or look that
 * failed). what: the last message (e.g. "/x/ds is writable by group").
 */
/* The file's name in cache.dir. */
#define SHAREDTIER_HEALTH_FILE "tier-health"

enum {
	SHAREDTIER_UNTRUSTED,
	SHAREDTIER_NOT_REGULAR,
	SHAREDTIER_MISMATCH,
	SHAREDTIER_UNREADABLE,
	SHAREDTIER_CAUSES
};

struct sharedtier_health {
	uint64_t count; /* 0: never */
	int64_t first, last; /* seconds since the epoch */
	char what[512];
};

/* "untrusted", "not_regular", "mismatch", "unreadable"; "?" otherwise. */
const char *sharedtier_cause_name(int cause);
/* Count one more of cause for dataset name, now, with its message. 0,
 * -EINVAL, -ENOENT (no cache.dir), or the file's -errno (logged; the rows
 * there stay as they were). */
int sharedtier_health_note(const struct dstage_config *cfg, const char *name,
			   int cause, const char *what);
/* Forget name's rows of the causes in mask (1u << cause each): 0 or
 * -errno (logged when there were rows to forget). */
int sharedtier_health_clear(const struct dstage_config *cfg, const char *name,
			    unsigned mask);
/* name's rows into h (may be NULL), indexed by cause, count 0 where none:
 * how many there are, -ENOENT (no file yet), or -errno (not logged: a
 * status says it, e.g. -EISDIR: the path is a directory). */
int sharedtier_health_get(const struct dstage_config *cfg, const char *name,
			  struct sharedtier_health h[SHAREDTIER_CAUSES]);

#endif
