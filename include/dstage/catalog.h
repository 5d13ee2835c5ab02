/* SPDX-License-Identifier: MIT */
/*
 * catalog: the node's SQLite catalog (catalog.path). docs/catalog.md has the
 * schema, the migrations and what survives which crash.
 *
 * It holds the datasets, the manifest of each dataset version (objects and
 * directories, so stat/lookup/readdir never touch the network), per-block
 * cache state, the eviction policy, the job queue and the audit trail.
 *
 * Concurrency: a struct catalog is one SQLite connection and must be used by
 * one thread at a time; open one per thread. Any number of processes and
 * threads may open the same file: it is in WAL mode, so readers never block
 * the writer and see a consistent snapshot per call. Writers wait up to
 * CATALOG_BUSY_TIMEOUT_MS for each other, then fail with -EBUSY: no lock
 * wait is longer.
 *
 * Files: catalog_open refuses a catalog whose directory group or others may
 * write, or that another user owns; catalog.db, -wal and -shm are created
 * 0600, and looser ones (beyond 0640) are tightened to 0600 at open.
 *
 * Errors are -errno; the SQLite message is logged with log_error:
 *   -EBUSY       the database stayed locked (SQLITE_BUSY, SQLITE_LOCKED,
 *                SQLITE_PROTOCOL); the locks other processes hold on the
 *                database and its -shm are logged with their pids
 *   -ENOSPC      the disk is full (SQLITE_FULL)
 *   -ENOENT      the file does not exist and CATALOG_CREATE was not given
 *   -EACCES      the file cannot be opened (SQLITE_CANTOPEN, SQLITE_PERM,
 *                SQLITE_READONLY)
 *   -ENOMEM      out of memory (SQLITE_NOMEM)
 *   -EUCLEAN     the file is not a database or is corrupt (SQLITE_CORRUPT,
 *                SQLITE_NOTADB): "structure needs cleaning"
 *   -EPROTO      the schema is newer than this program knows, or older and
 *                the catalog was opened read-only
 *   -EIO         any other SQLite error
 */
#ifndef DSTAGE_CATALOG_H
#define DSTAGE_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dstage/lifecycle.h"
#include "dstage/objstore.h"

struct catalog;

#define CATALOG_SCHEMA_VERSION 10
#define CATALOG_BUSY_TIMEOUT_MS 5000

/*
 * A dataset's default sums key: the sha256sum-format file, relative to the
 * source, whose hashes registration records as expected. The default is
 * optional at the source; any other key must be there.
 */
#define CATALOG_SUMS_KEY_DEFAULT "SHA256SUMS"

/* catalog_open flags */
#define CATALOG_CREATE 0x1 /* create the file if missing */
#define CATALOG_READONLY 0x2 /* open read-only, never migrate */

enum catalog_ds_state {
	CATALOG_DS_NEW = 0, /* added, never registered: no manifest */
	CATALOG_DS_READY = 1, /* has a current manifest */
	CATALOG_DS_REMOVING = 2, /* being removed; invisible to readers */
};

/* Strings are owned by the struct (see catalog_dataset_release) or, in a
 * list callback, valid only during the call. */
struct catalog_dataset {
	int64_t id;
	char *name;
	char *source; /* URL: s3://... or file://... */
	int64_t version; /* manifest version, 0 before registration */
	enum catalog_ds_state state;
	bool pinned;
	uint64_t quota; /* bytes, 0: none */
	int priority; /* lower is evicted first */
	char *group; /* owning group, may be NULL */
	uint64_t bad_keys; /* keys skipped by the last registration */
	uint64_t objects; /* objects in the current manifest */
	uint64_t bytes; /* their total size */
	int64_t created; /* seconds since the epoch */
	int64_t refreshed; /* last registration, 0: never */
	char *sums_key; /* the expected-hash list; CATALOG_SUMS_KEY_DEFAULT
			 * unless set */
	char *shared_tier; /* the shared tier's directory (an absolute path
			    * or file:///DIR/), NULL: the cluster default */
};

/* One manifest entry: an object (file) or a directory. */
struct catalog_entry {
	int64_t id; /* object id (blocks.object_id); 0 for dirs */
	bool is_dir;
	uint64_t size; /* 0 for dirs */
	int64_t mtime; /* seconds; dirs: the registration time */
	char etag[OBJSTORE_ETAG_MAX]; /* "" when the source gave none */
	bool has_expected;
	unsigned char expected_sha256[32]; /* from the dataset's sums key */
	bool has_actual;
	unsigned char actual_sha256[32]; /* computed by verify */
	int64_t verified_at; /* 0: never */
};

struct catalog_audit {
	int64_t id; /* set by the catalog */
	int64_t when; /* seconds; 0 in catalog_audit_add: now */
	uint32_t uid;
	const char *user; /* may be NULL */
	const char *action; /* e.g. "pin", "policy.set" */
	const char *target; /* e.g. a dataset or policy key; may be NULL */
	const char *old_value; /* may be NULL */
	const char *new_value; /* may be NULL */
};

/*
 * Open (and with CATALOG_CREATE create) the catalog at path, set WAL mode,
 * the busy timeout and foreign keys, and migrate the schema forward to
 * CATALOG_SCHEMA_VERSION in one transaction. Errors as listed above.
 */
int catalog_open(const char *path, unsigned flags, struct catalog **out);

/* Accepts NULL. */
void catalog_close(struct catalog *cat);

/* The schema version of the open file (== CATALOG_SCHEMA_VERSION). */
int catalog_schema_version(struct catalog *cat);

/*
 * Add a dataset in state NEW. name must pass keypath_check_name().
 * Returns 0, -EINVAL (bad name or empty source), -EEXIST, or an error above.
 */
int catalog_dataset_add(struct catalog *cat, const char *name,
			const char *source, const char *group);

/* Fill ds (release it with catalog_dataset_release). -ENOENT if no such
 * dataset (datasets being removed are not found). */
int catalog_dataset_get(struct catalog *cat, const char *name,
			struct catalog_dataset *ds);

/* Free the strings of a dataset filled by catalog_dataset_get. NULL ok. */
void catalog_dataset_release(struct catalog_dataset *ds);

/*
 * Call cb for every dataset by name; a non-zero return stops the listing
 * and is returned.
 */
typedef int (*catalog_dataset_cb)(void *arg, const struct catalog_dataset *ds);
int catalog_dataset_list(struct catalog *cat, catalog_dataset_cb cb, void *arg);

/*
 * Set one attribute of a dataset. Returns 0, -ENOENT, -EINVAL (a negative
 * quota is impossible; group may be NULL to clear), or an error above.
 */
int catalog_dataset_set_pinned(struct catalog *cat, const char *name,
			       bool pinned);
int catalog_dataset_set_quota(struct catalog *cat, const char *name,
			      uint64_t quota);
int catalog_dataset_set_priority(struct catalog *cat, const char *name,
				 int priority);
int catalog_dataset_set_group(struct catalog *cat, const char *name,
			      const char *group);

/*
 * Set the sums key of a dataset: the key, relative to its source, of the
 * sha256sum-format file (names in it relative to the source) whose hashes
 * registration records as expected. NULL sets CATALOG_SUMS_KEY_DEFAULT. It
 * takes effect at the next registration (catalog_register), and every
 * later one uses it.
 * Returns 0, -EINVAL (key fails keypath_check; logged with the key and the
 * reason), -ENOENT (no such dataset), or an error above.
 */
int catalog_dataset_set_sums_key(struct catalog *cat, const char *name,
				 const char *key);

/*
 * Set the shared tier of a dataset (docs/stager.md, "The shared tier"): a
 * directory on the cluster's parallel file system, given as an absolute
 * path or a file:///DIR/ URL, under which each snapshot's verified copy
 * lives. NULL or "" clears it (the cluster default, sources.shared_tier_root,
 * applies again).
 * Returns 0, -EINVAL (not absolute, or over PATH_MAX bytes; logged with the
 * value), -ENOENT (no such dataset), or an error above.
 */
int catalog_dataset_set_shared_tier(struct catalog *cat, const char *name,
				    const char *dir);

/*
 * Remove a dataset and all its manifests and block records. Large manifests
 * are deleted in batches; the dataset disappears for readers at once. A
 * removal cut short by a crash is finished by calling this again.
 * Returns 0, -ENOENT, or an error above.
 */
int catalog_dataset_remove(struct catalog *cat, const char *name);

/*
 * Register (or refresh) dataset name from os: list it once, page by page,
 * into a new manifest in bounded memory; skip and count keys that cannot be
 * paths (log_warn naming each key and why); read the dataset's sums key
 * (catalog_dataset_set_sums_key; it stays in the manifest as a file) when
 * listed, to fill expected hashes; a bad line in it is logged with its key
 * and line number and skipped. Then, in one transaction, make the new
 * manifest current and bump the version: readers see the old manifest or
 * the new one, never a mix. The old manifest is then deleted in batches.
 * If another registration of the same dataset starts meanwhile, the later
 * one wins and this one returns -EBUSY. On any error the current manifest
 * stays as it was.
 * Returns 0, -ENOENT (no such dataset), -ENODATA (a sums key other than
 * CATALOG_SUMS_KEY_DEFAULT is not in the listing; logged), -EBUSY, an
 * objstore error, or an error above.
 */
int catalog_register(struct catalog *cat, const char *name,
		     struct objstore *os);

/*
 * Look up path ("" is the root; no leading '/') in the current manifest of
 * dataset. Returns 0, -ENOENT (no dataset, not registered, no such path),
 * or an error above.
 */
int catalog_lookup(struct catalog *cat, const char *dataset, const char *path,
		   struct catalog_entry *e);

/*
 * Call cb for every entry of directory dir ("" for the root) in byte order
 * of name, starting after the name `after` (NULL: from the start). name and
 * e are valid only during the call; a non-zero return stops and is returned.
 * The listing is one snapshot: a concurrent refresh is not seen.
 * Returns 0, -ENOENT, -ENOTDIR, or an error above.
 */
typedef int (*catalog_readdir_cb)(void *arg, const char *name,
				  const struct catalog_entry *e);
int catalog_readdir(struct catalog *cat, const char *dataset, const char *dir,
		    const char *after, catalog_readdir_cb cb, void *arg);

/*
 * Record the SHA-256 computed by verify for object id, at time when.
 * Returns 0, -ENOENT (no such object), or an error above.
 */
int catalog_object_set_actual(struct catalog *cat, int64_t object_id,
			      const unsigned char sha256[32], int64_t when);

/*
 * The blocks table (per-block cache state, schema 2): each object that has
 * rows there, with its dataset, path, ETag ("" when none) and size and the
 * number of its rows (cachectl gc drops the rows of objects whose cache
 * file is gone). Strings are valid only during the call; a non-zero return
 * of cb stops and is returned. Do not change the table from cb. Returns 0,
 * cb's value, or an error above.
 */
struct catalog_blocks_obj {
	int64_t object_id;
	const char *dataset, *path, *etag;
	uint64_t size;
	uint64_t rows;
};
typedef int (*catalog_blocks_cb)(void *arg, const struct catalog_blocks_obj *b);
int catalog_blocks_list(struct catalog *cat, catalog_blocks_cb cb, void *arg);

/* Delete the blocks rows of object_id; *rows (may be NULL) gets how many.
 * Returns 0 or an error above. */
int catalog_blocks_forget(struct catalog *cat, int64_t object_id,
			  uint64_t *rows);

/* The policy keys of the cache's capacity and watermarks (cachectl policy
 * set): decimal bytes and percentages overriding the configuration's
 * cache.size, cache.high_watermark and cache.low_watermark. */
#define CATALOG_POLICY_CACHE_SIZE "cache.size"
#define CATALOG_POLICY_CACHE_HIGH "cache.high_watermark"
#define CATALOG_POLICY_CACHE_LOW "cache.low_watermark"

/* Eviction and other policy, as key/value strings. get: -ENOENT if unset,
 * -ENAMETOOLONG if the value does not fit in len bytes with its NUL. */
int catalog_policy_get(struct catalog *cat, const char *key, char *buf,
		       size_t len);
int catalog_policy_set(struct catalog *cat, const char *key, const char *value);

/* Append an audit record. a->id and a->when are ignored / defaulted.
 * Returns 0, -EINVAL (no action), or an error above. */
int catalog_audit_add(struct catalog *cat, const struct catalog_audit *a);

/* Call cb for every record with id > after_id, oldest first. A non-zero
 * return stops the listing and is returned. */
typedef int (*catalog_audit_cb)(void *arg, const struct catalog_audit *a);
int catalog_audit_list(struct catalog *cat, int64_t after_id,
		       catalog_audit_cb cb, void *arg);

/*
 * Checkpoint lifecycle rules (schema 6). Each change is audited in the same
 * transaction (action "lifecycle.add" / "lifecycle.remove", target the
 * pattern, the rule as old or new value) as uid and user of who (may be
 * NULL: uid 0, no user).
 * add: checks r with lifecycle_rule_check (-EINVAL, the message logged and
 * copied to msg when not NULL) and sets r->id. Returns 0, -EINVAL,
 * -EEXIST (a rule for that pattern exists), or an error above.
 * remove: by id, or by pattern when id is 0. Returns 0, -ENOENT, or an
 * error above; *removed (may be NULL) gets the rule removed.
 * list: every rule in id order into *out (free() it), *n rules.
 */
int catalog_lifecycle_add(struct catalog *cat, struct lifecycle_rule *r,
			  const struct catalog_audit *who, char *msg,
			  size_t len);
int catalog_lifecycle_remove(struct catalog *cat, int64_t id,
			     const char *pattern,
			     const struct catalog_audit *who,
			     struct lifecycle_rule *removed);
int catalog_lifecycle_list(struct catalog *cat, struct lifecycle_rule **out,
			   size_t *n);

/*
 * What this node published into a checkpoint store (schema 8): one row per
 * (store URL, key), the SHA-256 and size of the content written, the ETag
 * the store gave it and when. Written by whoever published (dstagefs, the
 * stager daemon's retry), moved by renames, dropped with the file; read by
 * the recovery drill, which then needs no record from the store itself,
 * and (schema 10: its owner) by checkpoints.uid_store_size's count.
 */
struct catalog_ckpt {
	char sha256[65]; /* hex */
	uint64_t size;
	int64_t uid; /* the owner (its creator); -1: not recorded (before
		      * schema 10) */
	char etag[OBJSTORE_ETAG_MAX]; /* "" when the store gave none */
	int64_t published; /* seconds since the epoch */
};

/* Insert or replace key's row; uid -1: owner unknown. 0, -EINVAL (a key or
 * hash out of bounds: KEYPATH_KEY_MAX bytes, 64 hex digits), or an error
 * above. */
int catalog_ckpt_record(struct catalog *cat, const char *store, const char *key,
			const char *sha256, uint64_t size, const char *etag,
			int64_t uid);
/* cb for each row of store whose owner is recorded, in key order; a
 * non-zero return stops the walk and is returned. 0 or an error above. */
typedef int (*catalog_ckpt_each_cb)(void *arg, const char *key, int64_t uid,
				    uint64_t size);
int catalog_ckpt_each(struct catalog *cat, const char *store,
		      catalog_ckpt_each_cb cb, void *arg);
/* key's row into *out: 0, -ENOENT (none), or an error above. */
int catalog_ckpt_get(struct catalog *cat, const char *store, const char *key,
		     struct catalog_ckpt *out);
/* Drop key's row and every row below "key/" (a removed directory). 0 (also
 * when there was none) or an error above. */
int catalog_ckpt_forget(struct catalog *cat, const char *store,
			const char *key);
/* Rename key from to to, and every row below "from/" to below "to/", over
 * what to had, in one transaction. 0 (also when there was none), -EINVAL,
 * or an error above. */
int catalog_ckpt_rename(struct catalog *cat, const char *store,
			const char *from, const char *to);

/*
 * What a writer of checkpoint stores calls once key is published (dstagefs
 * through ckpt's hooks, the stager's retry through lifecycle_staging_publish):
 * catalog_ckpt_record into cat, which may be NULL (nothing is recorded). A
 * failure is logged, not returned: the store has the file either way, and
 * its own records (sidecar, x-amz-meta-sha256) stay.
 */
void catalog_ckpt_published(struct catalog *cat, const char *store,
			    const char *key, const char *sha256, uint64_t size,
			    const char *etag, int64_t uid);

/*
 * A checkpoint store's record in the catalog, for ckpt_open_ex's hooks: a
 * read-write connection to the catalog at path, opened (CATALOG_CREATE) at
 * the first change; when it cannot be, that is logged once and nothing is
 * recorded. Each hook logs what it could not record (catalog_ckpt_published,
 * catalog_ckpt_rename, catalog_ckpt_forget) and returns nothing.
 *
 * Thread-safe: one lock guards the connection, a leaf (ckpt calls the hooks
 * with its own locks held, include/dstage/ckpt.h); a hook may wait for the
 * catalog file's write lock, at most CATALOG_BUSY_TIMEOUT_MS.
 */
struct catalog_ckpt_log;
struct ckpt_hooks;

/* path may be NULL: no record. 0 or -ENOMEM. */
int catalog_ckpt_log_new(const char *path, struct catalog_ckpt_log **out);
/* Accepts NULL. No hook of l may run any more (ckpt_free first). */
void catalog_ckpt_log_free(struct catalog_ckpt_log *l);
/* Fill h with the hooks that record into l (h->arg = l). */
void catalog_ckpt_log_hooks(struct catalog_ckpt_log *l, struct ckpt_hooks *h);

#endif
