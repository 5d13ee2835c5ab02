/* SPDX-License-Identifier: MIT */
/*
 * catalog_i: what the catalog's files share, and the internals the tests
 * and the job queue (lib/catalog/jobs.c) use. Not a public header.
 *
 * The catalog is four files, calls going one way (down this list),
 *   catalog_register.c  registration: listing a source into a new manifest
 *   catalog_dataset.c   datasets, manifests' removal, lookup and readdir
 *   catalog.c           open/close, migrations, statements, policy, audit
 *   catalog_file.c      the file's modes, its directory, its lock holders
 * and beside them catalog_blocks.c (the blocks table, for cachectl gc),
 * which calls catalog.c.
 * The state machines and invariants are at the top of catalog.c.
 */
#ifndef DSTAGE_CATALOG_I_H
#define DSTAGE_CATALOG_I_H

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>

#include "dstage/catalog.h"
#include "dstage/jobs.h"
#include "dstage/objstore.h"
#include "dstage/sha256sums.h"
#include "dstage/timeutil.h"

/* Where registration gets its keys and the bytes of its sums key from. */
struct catalog_source {
	/* List every key in byte order, calling cb as objstore_list_tree
	 * does (directories as "KEY/", skipped entries with oi->skipped;
	 * stop and return cb's value when it returns non-zero). */
	int (*list)(void *arg, objstore_list_cb cb, void *cb_arg);
	/* Feed the whole object oi->key (as listed) to p with
	 * sha256sums_feed; the caller calls sha256sums_finish. */
	int (*read)(void *arg, const struct objstore_info *oi,
		    struct sha256sums_parser *p);
	void *arg;
};

/* catalog_register() with an arbitrary source. Same contract. */
int catalog_register_source(struct catalog *cat, const char *name,
			    const struct catalog_source *src);

/*
 * Migrate the schema of db from its user_version up to version `to` (at most
 * CATALOG_SCHEMA_VERSION), in one transaction. Tests use it to build a
 * catalog of an earlier version. Returns 0 or -errno.
 */
int catalog_migrate(sqlite3 *db, int to);

/* The schema version (PRAGMA user_version) of db into *version (0 on a
 * failure). Returns 0 or the logged -errno (catalog_sqlerr): -EBUSY,
 * -ENOSPC, -EACCES, -ENOMEM, -EUCLEAN or -EIO. */
int catalog_user_version(sqlite3 *db, int *version);

/*
 * The -errno for a SQLite result code, for every module that talks to the
 * catalog file: BUSY/LOCKED/PROTOCOL -EBUSY, FULL -ENOSPC, CANTOPEN/PERM/READONLY/AUTH
 * -EACCES, NOMEM -ENOMEM, CORRUPT/NOTADB -EUCLEAN, others -EIO; 0 for
 * OK/ROW/DONE.
 */
int catalog_sqlite_errno(int rc);

/* Rows per write transaction while registering or purging. */
#define CATALOG_BATCH 20000

/*
 * Fair sharing of the write lock (docs/catalog.md, "Writers"). SQLite's
 * own busy handler sleeps up to 100 ms between tries, so a waiter almost
 * never sees the microseconds between two transactions of a busy writer and
 * fails after CATALOG_BUSY_TIMEOUT_MS. Instead:
 *   - waiters try every CATALOG_BUSY_POLL_US (catalog_busy_init), still for
 *     at most CATALOG_BUSY_TIMEOUT_MS;
 *   - a writer that runs many write transactions in a row (registration,
 *     purge) holds the lock at most about CATALOG_TX_MAX_MS each and sleeps
 *     CATALOG_YIELD_US (several polls) between them (catalog_yield).
 */
#define CATALOG_BUSY_POLL_US 1000
#define CATALOG_TX_MAX_MS 200
#define CATALOG_YIELD_US 5000

/* Manifest states (manifests.state); see catalog.c. */
enum {
	MF_BUILDING = 0,
	MF_CURRENT = 1,
	MF_DEAD = 2,
};

/* Every connection runs with these, except while building a manifest. */
#define CATALOG_SAFE_PRAGMAS \
	"PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 1000"
#define CATALOG_BULK_PRAGMAS \
	"PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0"

#define DS_COLS                                                            \
	"d.id, d.name, d.source, d.state, d.pinned, d.quota, d.priority, " \
	"d.owner_group, d.created, coalesce(m.version, 0), "               \
	"coalesce(m.bad_keys, 0), coalesce(m.n_objects, 0), "              \
	"coalesce(m.n_bytes, 0), coalesce(m.created, 0), d.sums_key, "     \
	"d.shared_tier "                                                   \
	"FROM datasets d LEFT JOIN manifests m "                           \
	"ON m.dataset_id = d.id AND m.state = 1 "

/* Cached statements, prepared on first use. */
enum catalog_st {
	ST_LOOKUP,
	ST_READDIR,
	ST_DS_GET,
	ST_DS_ID,
	ST_MF_STATE,
	ST_OBJ_INSERT,
	ST_DIR_INSERT,
	ST_SUMS_UPDATE,
	ST_PURGE_OBJECTS,
	ST_PURGE_DIRS,
	ST_PURGE_MANIFEST,
	ST_DEAD_MANIFEST,
	ST_COUNT
};

/* The state of one connection's busy handler: when its current wait
 * began. Only the thread using the connection touches it. */
struct catalog_busy {
	int64_t since_ns;
};

struct catalog {
	sqlite3 *db;
	char *path;
	sqlite3_stmt *st[ST_COUNT];
	struct catalog_busy busy;
};

/*
 * Make db wait for locks by polling every CATALOG_BUSY_POLL_US for at most
 * CATALOG_BUSY_TIMEOUT_MS a wait (then SQLITE_BUSY: -EBUSY), with b (which
 * must live as long as db) as its state. For every connection to the
 * catalog file, the catalog's own and the job queue's.
 */
void catalog_busy_init(sqlite3 *db, struct catalog_busy *b);

/* Between two write transactions of a long series: let the waiting
 * writers in (sleeps CATALOG_YIELD_US). */
void catalog_yield(void);

/* Log a SQLite failure of db (what, and SQLite's message) and return its
 * -errno (catalog_sqlite_errno). */
int catalog_sqlerr(sqlite3 *db, int rc, const char *what);

/* sqlite3_exec of sql; 0 or the logged -errno. */
int catalog_exec(sqlite3 *db, const char *sql);

/* Roll back the open transaction of db, if any. */
void catalog_rollback(sqlite3 *db);

/* The cached statement id of cat, reset and ready for binding; 0 or the
 * logged -errno of its preparation. */
int catalog_stmt(struct catalog *cat, enum catalog_st id, sqlite3_stmt **out);

/* Reset st and clear its bindings. */
void catalog_stmt_done(sqlite3_stmt *st);

/*
 * One parameter of a statement, for the statement helpers below: an
 * integer, a text of num bytes (-1: up to its NUL; NULL binds NULL) or a
 * blob of num bytes. Texts and blobs are bound SQLITE_STATIC: they must
 * outlive the statement (or, for a cached one, its catalog_stmt_done).
 * Written with the macros below, e.g.
 *   catalog_run(cat, "policy set", sql,
 *               CATALOG_ARGS(CATALOG_TEXT(key), CATALOG_INT(now)), NULL);
 */
enum catalog_arg_kind {
	CATALOG_ARG_INT,
	CATALOG_ARG_TEXT,
	CATALOG_ARG_BLOB,
};

struct catalog_arg {
	enum catalog_arg_kind kind;
	int64_t num; /* INT: the value; TEXT, BLOB: the length */
	const char *text;
	const void *blob;
};

#define CATALOG_INT(v) \
	((struct catalog_arg){ .kind = CATALOG_ARG_INT, .num = (int64_t)(v) })
#define CATALOG_TEXT(s) CATALOG_TEXTN(s, -1)
#define CATALOG_TEXTN(s, n)    \
	((struct catalog_arg){ \
		.kind = CATALOG_ARG_TEXT, .text = (s), .num = (int64_t)(n) })
#define CATALOG_BLOB(p, n)     \
	((struct catalog_arg){ \
		.kind = CATALOG_ARG_BLOB, .blob = (p), .num = (int64_t)(n) })
/* The args and n arguments of the statement helpers: ?1..?n. */
#define CATALOG_ARGS(...)                                                   \
	(const struct catalog_arg[]){ __VA_ARGS__ },                        \
		(int)(sizeof((const struct catalog_arg[]){ __VA_ARGS__ }) / \
		      sizeof(struct catalog_arg))

/*
 * The statement helpers, on a bare connection db (the catalog's, cat->db,
 * or the job queue's): what names the statement in the log line of a
 * failure, which is catalog_sqlerr's (the file, what, SQLite's message; on
 * -EBUSY the lock holders). Every -errno below is one of
 * catalog_sqlite_errno's: -EBUSY, -ENOSPC, -EACCES, -ENOMEM, -EUCLEAN or
 * -EIO.
 *
 * catalog_prepare_db: prepare sql on db with args[0..n) bound to ?1..?n.
 * The caller steps *out (catalog_step_db) and finalizes it. Returns 0, or
 * the logged -errno of the preparation or of a binding; *out is then NULL.
 */
int catalog_prepare_db(sqlite3 *db, const char *what, const char *sql,
		       const struct catalog_arg *args, int n,
		       sqlite3_stmt **out);

/*
 * Step st, a statement of db: 0 when it has a row, -ENOENT when it has no
 * more, else the logged -errno.
 */
int catalog_step_db(sqlite3 *db, sqlite3_stmt *st, const char *what);

/*
 * Prepare sql on db with args[0..n) bound, step it once to its end (a
 * statement that returns no rows), finalize it; *changes (may be NULL) gets
 * the rows it changed. Returns 0 or the logged -errno (a row where none
 * was due: -EIO).
 */
int catalog_run_db(sqlite3 *db, const char *what, const char *sql,
		   const struct catalog_arg *args, int n, int *changes);

/*
 * Prepare sql on db with args[0..n) bound and call row(arg, st) on each
 * row it returns (the row's columns are valid during the call only), then
 * finalize it. Returns 0 when every row was seen; the first nonzero value
 * of row, as is, which stops the loop; or the logged -errno of the
 * preparation or of a step.
 */
int catalog_each_db(sqlite3 *db, const char *what, const char *sql,
		    const struct catalog_arg *args, int n,
		    int (*row)(void *arg, sqlite3_stmt *st), void *arg);

/*
 * A list function's callback and its argument, for its catalog_each row
 * function (given as arg), which calls the member of its own type:
 *   struct catalog_each_cb e = { .fn.audit = cb, .arg = arg };
 */
struct catalog_each_cb {
	union {
		catalog_audit_cb audit;
		catalog_blocks_cb blocks;
		catalog_dataset_cb dataset;
		jobs_cb jobs;
		jobs_counts_cb counts;
	} fn;
	void *arg;
};

/* The same four on cat's connection (cat->db), with the same returns. */
int catalog_prepare(struct catalog *cat, const char *what, const char *sql,
		    const struct catalog_arg *args, int n, sqlite3_stmt **out);
int catalog_step(struct catalog *cat, sqlite3_stmt *st, const char *what);
int catalog_run(struct catalog *cat, const char *what, const char *sql,
		const struct catalog_arg *args, int n, int *changes);
int catalog_each(struct catalog *cat, const char *what, const char *sql,
		 const struct catalog_arg *args, int n,
		 int (*row)(void *arg, sqlite3_stmt *st), void *arg);

/*
 * The cached statement id of cat with args[0..n) bound, stepped to its
 * first row: 0 with *out on that row (the caller reads it, then calls
 * catalog_stmt_done(*out)); else *out is NULL, the statement is reset, and
 * the return is -ENOENT (no row) or the logged -errno of its preparation
 * (catalog_stmt), a binding or the step (logged with what), as
 * catalog_step.
 */
int catalog_stmt_row(struct catalog *cat, enum catalog_st id, const char *what,
		     const struct catalog_arg *args, int n, sqlite3_stmt **out);

/*
 * The cached statement id of cat with args[0..n) bound, stepped once (a
 * statement that returns no rows, or one ignored row) and reset; *changes
 * (may be NULL) gets the rows it changed. Returns 0 or the logged -errno of
 * its preparation (catalog_stmt), a binding or the step (logged with
 * what).
 */
int catalog_stmt_run(struct catalog *cat, enum catalog_st id, const char *what,
		     const struct catalog_arg *args, int n, int *changes);

/* catalog_run of sql with ?1 bound to id, sql naming it in the error. */
int catalog_exec_id(struct catalog *cat, const char *sql, int64_t id,
		    int *changes);

/*
 * In a transaction: the id and state of dataset name, or -ENOENT. With
 * sums_key (KEYPATH_MAX bytes), also its sums key, which must pass
 * keypath_check (-EUCLEAN: the row was changed behind the catalog's back).
 */
int catalog_dataset_id(struct catalog *cat, const char *name, int64_t *id,
		       int *state, char *sums_key);

/* Purge every DEAD manifest of a dataset, in batches. 0 or -errno. */
int catalog_dataset_purge_dead(struct catalog *cat, int64_t ds_id);

/*
 * The directory of catalog path: refused when writable by group or others
 * or owned by a user other than the caller and root. Returns 0, -EACCES
 * (logged with the path and the fix), -ENOTDIR, or stat's -errno.
 */
int catalog_file_check_dir(const char *path);

/*
 * With create, make path at mode 0600 when it is missing. Then check
 * path, path-wal and path-shm (missing ones are fine): regular files, not
 * links, of the caller or root; a mode looser than 0640 is tightened to
 * 0600 (logged). Returns 0, -ELOOP, -EINVAL, -EACCES (logged) or -errno.
 */
int catalog_file_guard(const char *path, bool create);

/* Log the POSIX locks other processes hold on path and on path-shm that
 * block SQLite, each with the holder's pid and command. */
void catalog_file_log_holders(const char *path);

#endif
