// SPDX-License-Identifier: MIT
/*
 * catalog: the node's SQLite catalog. See include/dstage/catalog.h for the
 * API and docs/catalog.md for the schema.
 *
 * A struct catalog is one SQLite connection plus its cached prepared
 * statements. It has no lock: it belongs to one thread at a time (the
 * connection is opened SQLITE_OPEN_NOMUTEX), and nothing in it is shared.
 * What is shared between threads and processes is the database file, and
 * SQLite's WAL locking protects it: every write runs in a BEGIN IMMEDIATE
 * transaction, every multi-statement read in one read transaction. Writers
 * share the write lock fairly (catalog_i.h: a waiter polls every
 * CATALOG_BUSY_POLL_US; a long series of writes holds it for at most about
 * CATALOG_TX_MAX_MS a transaction and yields between them).
 *
 * Manifest state machine (manifests.state):
 *
 *   BUILDING --(flip: one transaction)--> CURRENT --(next flip)--> DEAD
 *      |                                                            |
 *      +--(error, newer registration, dataset removal)--> DEAD --> purged
 *
 * Invariants:
 *   - at most one CURRENT manifest per dataset (a partial unique index);
 *   - readers only ever read CURRENT manifests, in one statement or one
 *     read transaction, so they see the old manifest or the new, never both;
 *   - every directory of a manifest has its parent in dirs, up to the root
 *     (path ''), so lookup and readdir need no other source;
 *   - no path of a CURRENT manifest is both in objects and in dirs;
 *   - DEAD manifests are garbage: deleted in batches by whoever finds them.
 *
 * Dataset states (datasets.state): NEW --register--> READY --remove-->
 * REMOVING --purge--> row deleted. REMOVING datasets are invisible.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "catalog_i.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"

/*
 * Forward migrations: catalog_migrations[v] takes a database from
 * user_version v to v + 1. Never edit a released step; append a new one.
 */
static const char *const catalog_migrations[] = {
	/* 0 -> 1: the first catalog: datasets and one manifest each. */
	"CREATE TABLE datasets("
	" id INTEGER PRIMARY KEY,"
	" name TEXT NOT NULL UNIQUE,"
	" source TEXT NOT NULL,"
	" state INTEGER NOT NULL DEFAULT 0,"
	" created INTEGER NOT NULL);"
	"CREATE TABLE objects("
	" id INTEGER PRIMARY KEY,"
	" dataset_id INTEGER NOT NULL REFERENCES datasets(id)"
	"  ON DELETE CASCADE,"
	" path TEXT NOT NULL,"
	" size INTEGER NOT NULL,"
	" etag TEXT,"
	" mtime INTEGER,"
	" UNIQUE(dataset_id, path));",

	/* 1 -> 2: versioned manifests, directories, hashes, dataset policy,
	 * block state, policy, jobs and audit. */
	"ALTER TABLE datasets ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE datasets ADD COLUMN quota INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE datasets ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE datasets ADD COLUMN owner_group TEXT;"
	"CREATE TABLE manifests("
	" id INTEGER PRIMARY KEY,"
	" dataset_id INTEGER NOT NULL REFERENCES datasets(id)"
	"  ON DELETE CASCADE,"
	" version INTEGER NOT NULL,"
	" state INTEGER NOT NULL,"
	" created INTEGER NOT NULL,"
	" n_objects INTEGER NOT NULL DEFAULT 0,"
	" n_bytes INTEGER NOT NULL DEFAULT 0,"
	" bad_keys INTEGER NOT NULL DEFAULT 0);"
	"CREATE INDEX manifests_dataset ON manifests(dataset_id, state);"
	"CREATE UNIQUE INDEX manifests_current ON manifests(dataset_id)"
	" WHERE state = 1;"
	/* Every v1 dataset with objects or marked ready gets manifest 1. */
	"INSERT INTO manifests(dataset_id, version, state, created)"
	" SELECT id, 1, 1, created FROM datasets d WHERE state = 1"
	" OR EXISTS (SELECT 1 FROM objects o WHERE o.dataset_id = d.id);"
	"UPDATE datasets SET state = 1"
	" WHERE id IN (SELECT dataset_id FROM manifests);"
	"CREATE TABLE objects2("
	" id INTEGER PRIMARY KEY,"
	" manifest_id INTEGER NOT NULL REFERENCES manifests(id)"
	"  ON DELETE CASCADE,"
	" path TEXT NOT NULL,"
	" parent TEXT NOT NULL,"
	" size INTEGER NOT NULL,"
	" etag TEXT,"
	" mtime INTEGER NOT NULL DEFAULT 0,"
	" expected_sha256 BLOB,"
	" actual_sha256 BLOB,"
	" verified_at INTEGER NOT NULL DEFAULT 0,"
	" UNIQUE(manifest_id, path));"
	/* rtrim(p, replace(p, '/', '')) keeps p up to its last '/'. */
	"INSERT INTO objects2(id, manifest_id, path, parent, size, etag, mtime)"
	" SELECT o.id, m.id, o.path,"
	"  rtrim(rtrim(o.path, replace(o.path, '/', '')), '/'),"
	"  o.size, o.etag, coalesce(o.mtime, 0)"
	" FROM objects o JOIN manifests m ON m.dataset_id = o.dataset_id;"
	"DROP TABLE objects;"
	"ALTER TABLE objects2 RENAME TO objects;"
	"CREATE INDEX objects_parent ON objects(manifest_id, parent, path);"
	"CREATE TABLE dirs("
	" id INTEGER PRIMARY KEY,"
	" manifest_id INTEGER NOT NULL REFERENCES manifests(id)"
	"  ON DELETE CASCADE,"
	" path TEXT NOT NULL,"
	" parent TEXT,"
	" UNIQUE(manifest_id, path));"
	"CREATE INDEX dirs_parent ON dirs(manifest_id, parent, path);"
	"INSERT INTO dirs(manifest_id, path, parent)"
	" SELECT id, '', NULL FROM manifests;"
	"WITH RECURSIVE anc(m, p) AS ("
	" SELECT DISTINCT manifest_id, parent FROM objects WHERE parent <> ''"
	" UNION"
	" SELECT m, rtrim(rtrim(p, replace(p, '/', '')), '/') FROM anc"
	"  WHERE instr(p, '/') > 0)"
	"INSERT INTO dirs(manifest_id, path, parent)"
	" SELECT m, p, rtrim(rtrim(p, replace(p, '/', '')), '/') FROM anc;"
	"UPDATE manifests SET"
	" n_objects = (SELECT count(*) FROM objects o"
	"  WHERE o.manifest_id = manifests.id),"
	" n_bytes = (SELECT coalesce(sum(size), 0) FROM objects o"
	"  WHERE o.manifest_id = manifests.id);"
	"CREATE TABLE blocks("
	" object_id INTEGER NOT NULL REFERENCES objects(id) ON DELETE CASCADE,"
	" block INTEGER NOT NULL,"
	" state INTEGER NOT NULL,"
	" checksum INTEGER,"
	" PRIMARY KEY(object_id, block)) WITHOUT ROWID;"
	"CREATE TABLE policy("
	" key TEXT PRIMARY KEY,"
	" value TEXT NOT NULL,"
	" updated INTEGER NOT NULL) WITHOUT ROWID;"
	"CREATE TABLE jobs("
	" id INTEGER PRIMARY KEY,"
	" kind TEXT NOT NULL,"
	" dataset_id INTEGER REFERENCES datasets(id) ON DELETE SET NULL,"
	" state TEXT NOT NULL,"
	" done INTEGER NOT NULL DEFAULT 0,"
	" total INTEGER NOT NULL DEFAULT 0,"
	" error TEXT,"
	" created INTEGER NOT NULL,"
	" updated INTEGER NOT NULL);"
	"CREATE INDEX jobs_state ON jobs(state, id);"
	"CREATE INDEX jobs_dataset ON jobs(dataset_id);"
	"CREATE TABLE audit("
	" id INTEGER PRIMARY KEY,"
	" at INTEGER NOT NULL,"
	" uid INTEGER NOT NULL,"
	" user TEXT,"
	" action TEXT NOT NULL,"
	" target TEXT,"
	" old_value TEXT,"
	" new_value TEXT);",

	/* 2 -> 3: the arguments of a job (the stager's options), kept with
	 * the job so that a restarted daemon resumes it as submitted. */
	"CREATE TABLE jobs_args("
	" job_id INTEGER PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,"
	" args TEXT NOT NULL);",

	/* 3 -> 4: each dataset's sums key (stager add --manifest); the
	 * datasets already there keep SHA256SUMS at their root. */
	"ALTER TABLE datasets"
	" ADD COLUMN sums_key TEXT NOT NULL"
	" DEFAULT 'SHA256SUMS';",

	/* 4 -> 5: the audit trail is append-only: no tool may edit or
	 * delete a record (cachectl audit). */
	"CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit"
	" BEGIN SELECT RAISE(ABORT, 'the audit table is append-only'); END;"
	"CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit"
	" BEGIN SELECT RAISE(ABORT, 'the audit table is append-only'); END;",

	/* 5 -> 6: checkpoint lifecycle rules (stager lifecycle), one per
	 * job-name pattern; include/dstage/lifecycle.h has their meaning. */
	"CREATE TABLE lifecycle_rules("
	" id INTEGER PRIMARY KEY,"
	" pattern TEXT NOT NULL UNIQUE,"
	" keep_local INTEGER NOT NULL,"
	" shared_days INTEGER NOT NULL DEFAULT 0,"
	" delete_days INTEGER NOT NULL DEFAULT 0,"
	" keep_every INTEGER NOT NULL DEFAULT 0,"
	" archive TEXT NOT NULL DEFAULT '',"
	" storage_class TEXT NOT NULL DEFAULT '',"
	" created INTEGER NOT NULL);",

	/* 6 -> 7: what a verify job found (stager show, the metrics):
	 * counts of blocks and files, one row per finished verify job. */
	"CREATE TABLE jobs_counts("
	" job_id INTEGER PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,"
	" damaged INTEGER NOT NULL,"
	" missing INTEGER NOT NULL,"
	" mismatched INTEGER NOT NULL,"
	" repaired INTEGER NOT NULL);",

	/* 7 -> 8: what this node published into checkpoint stores, with
	 * the SHA-256 of what was written (catalog_ckpt.c): a record the
	 * store itself cannot rewrite, for the drill. */
	"CREATE TABLE checkpoint_files("
	" store TEXT NOT NULL,"
	" key TEXT NOT NULL,"
	" sha256 TEXT NOT NULL,"
	" size INTEGER NOT NULL,"
	" etag TEXT NOT NULL DEFAULT '',"
	" published INTEGER NOT NULL,"
	" PRIMARY KEY(store, key)) WITHOUT ROWID;",

	/* 8 -> 9: each dataset's shared tier (stager add --shared-tier): a
	 * directory on the parallel file system holding a verified copy of
	 * each snapshot (docs/stager.md, "The shared tier"); NULL: the
	 * cluster default, sources.shared_tier_root, if set. */
	"ALTER TABLE datasets ADD COLUMN shared_tier TEXT;",

	/* 9 -> 10: the owner of each checkpoint file this node published
	 * (its creator's uid), for checkpoints.uid_store_size's count; NULL
	 * in the rows from before, which that count leaves out. */
	"ALTER TABLE checkpoint_files ADD COLUMN uid INTEGER;",
};

_Static_assert(sizeof(catalog_migrations) / sizeof(catalog_migrations[0]) ==
		       CATALOG_SCHEMA_VERSION,
	       "one migration step per schema version");

/* Columns of an entry, in catalog_entry_fill order, from objects o. */
#define ENTRY_COLS_OBJ                                          \
	"o.id, 0, o.size, o.mtime, o.etag, o.expected_sha256, " \
	"o.actual_sha256, o.verified_at"
#define ENTRY_COLS_DIR "0, 1, 0, m.created, NULL, NULL, NULL, 0"

static const char *const catalog_sql[ST_COUNT] = {
	[ST_LOOKUP] = "SELECT m.id, " ENTRY_COLS_OBJ " FROM datasets d"
		      " JOIN manifests m ON m.dataset_id = d.id AND m.state = 1"
		      " JOIN objects o ON o.manifest_id = m.id AND o.path = ?2"
		      " WHERE d.name = ?1"
		      " UNION ALL"
		      " SELECT m.id, " ENTRY_COLS_DIR " FROM datasets d"
		      " JOIN manifests m ON m.dataset_id = d.id AND m.state = 1"
		      " JOIN dirs x ON x.manifest_id = m.id AND x.path = ?2"
		      " WHERE d.name = ?1 LIMIT 1",
	[ST_READDIR] =
		"SELECT path, id, is_dir, size, mtime, etag, e, a, v FROM ("
		" SELECT o.path AS path, o.id AS id, 0 AS is_dir,"
		"  o.size AS size, o.mtime AS mtime, o.etag AS etag,"
		"  o.expected_sha256 AS e, o.actual_sha256 AS a,"
		"  o.verified_at AS v"
		" FROM objects o WHERE o.manifest_id = ?1 AND o.parent = ?2"
		"  AND o.path > ?3"
		" UNION ALL"
		" SELECT x.path, 0, 1, 0, ?4, NULL, NULL, NULL, 0"
		" FROM dirs x WHERE x.manifest_id = ?1 AND x.parent = ?2"
		"  AND x.path > ?3)"
		" ORDER BY path",
	[ST_DS_GET] = "SELECT " DS_COLS "WHERE d.name = ? AND d.state <> 2",
	[ST_DS_ID] = "SELECT id, state, sums_key FROM datasets WHERE name = ?",
	[ST_MF_STATE] = "SELECT state FROM manifests WHERE id = ?",
	[ST_OBJ_INSERT] =
		"INSERT INTO objects(manifest_id, path, parent, size, etag,"
		" mtime) VALUES(?1, ?2, ?3, ?4, ?5, ?6)"
		" ON CONFLICT DO NOTHING",
	[ST_DIR_INSERT] = "INSERT INTO dirs(manifest_id, path, parent)"
			  " VALUES(?1, ?2, ?3) ON CONFLICT DO NOTHING",
	[ST_SUMS_UPDATE] = "UPDATE objects SET expected_sha256 = ?3"
			   " WHERE manifest_id = ?1 AND path = ?2",
	[ST_PURGE_OBJECTS] =
		"DELETE FROM objects WHERE id IN (SELECT id FROM objects"
		" WHERE manifest_id = ?1 LIMIT ?2)",
	[ST_PURGE_DIRS] = "DELETE FROM dirs WHERE id IN (SELECT id FROM dirs"
			  " WHERE manifest_id = ?1 LIMIT ?2)",
	[ST_PURGE_MANIFEST] = "DELETE FROM manifests WHERE id = ?",
	[ST_DEAD_MANIFEST] = "SELECT id FROM manifests"
			     " WHERE dataset_id = ? AND state = 2 LIMIT 1",
};

int catalog_sqlite_errno(int rc)
{
	switch (rc & 0xff) {
	case SQLITE_OK:
	case SQLITE_ROW:
	case SQLITE_DONE:
		return 0;
	case SQLITE_BUSY:
	case SQLITE_LOCKED:
	case SQLITE_PROTOCOL: /* WAL locks not obtained */
		return -EBUSY;
	case SQLITE_FULL:
		return -ENOSPC;
	case SQLITE_CANTOPEN:
	case SQLITE_PERM:
	case SQLITE_READONLY:
	case SQLITE_AUTH:
		return -EACCES;
	case SQLITE_NOMEM:
		return -ENOMEM;
	case SQLITE_CORRUPT:
	case SQLITE_NOTADB:
		return -EUCLEAN;
	default:
		return -EIO;
	}
}

/*
 * Log a SQLite failure of db and return its -errno: never 0, since callers
 * call it on a result they did not expect (a step that returned DONE where a
 * row was due is -EIO, not success with an unset output).
 */
int catalog_sqlerr(sqlite3 *db, int rc, const char *what)
{
	const char *file = db ? sqlite3_db_filename(db, "main") : NULL;
	int ret = catalog_sqlite_errno(rc);

	log_error("catalog %s: %s: %s", file ? file : "?", what,
		  db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
	if (catalog_sqlite_errno(rc) == -EBUSY) {
		log_error("catalog %s: locked (each wait is at most %d ms); "
			  "locks held by other processes follow",
			  file ? file : "?", CATALOG_BUSY_TIMEOUT_MS);
		catalog_file_log_holders(file);
	}
	return ret ? ret : -EIO;
}

int catalog_exec(sqlite3 *db, const char *sql)
{
	int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);

	return rc == SQLITE_OK ? 0 : catalog_sqlerr(db, rc, sql);
}

void catalog_rollback(sqlite3 *db)
{
	if (!sqlite3_get_autocommit(db))
		sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

/* SQLite's busy handler: n is the number of earlier calls in this wait. */
static int catalog_busy_handler(void *arg, int n)
{
	struct catalog_busy *b = arg;
	int64_t now = timeutil_mono_ns();

	if (n == 0)
		b->since_ns = now;
	else if (now - b->since_ns >=
		 (int64_t)CATALOG_BUSY_TIMEOUT_MS * 1000000)
		return 0; /* give up: SQLITE_BUSY */
	usleep(CATALOG_BUSY_POLL_US);
	return 1;
}

void catalog_busy_init(sqlite3 *db, struct catalog_busy *b)
{
	b->since_ns = 0;
	sqlite3_busy_handler(db, catalog_busy_handler, b);
}

void catalog_yield(void)
{
	usleep(CATALOG_YIELD_US);
}

/* The cached statement id, reset and ready for binding. */
int catalog_stmt(struct catalog *cat, enum catalog_st id, sqlite3_stmt **out)
{
	int rc;

	if (!cat->st[id]) {
		rc = sqlite3_prepare_v3(cat->db, catalog_sql[id], -1,
					SQLITE_PREPARE_PERSISTENT, &cat->st[id],
					NULL);
		if (rc != SQLITE_OK)
			return catalog_sqlerr(cat->db, rc, catalog_sql[id]);
	}
	*out = cat->st[id];
	return 0;
}

void catalog_stmt_done(sqlite3_stmt *st)
{
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
}

int catalog_user_version(sqlite3 *db, int *version)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	*version = 0;
	rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		ret = catalog_sqlerr(db, rc, "read user_version");
		goto out;
	}
	*version = sqlite3_column_int(st, 0);
out:
	sqlite3_finalize(st);
	return ret;
}

int catalog_migrate(sqlite3 *db, int to)
{
	sqlite3_stmt *st = NULL;
	char sql[64];
	int v, rc, ret;

	if (to > CATALOG_SCHEMA_VERSION)
		return -EINVAL;
	/* Table rebuilds need foreign keys off; only outside a transaction. */
	ret = catalog_exec(db, "PRAGMA foreign_keys = OFF");
	if (ret)
		return ret;
	ret = catalog_exec(db, "BEGIN IMMEDIATE");
	if (ret)
		goto out;
	/* Read the version under the write lock: one process migrates. */
	ret = catalog_user_version(db, &v);
	if (ret)
		goto out;
	if (v > CATALOG_SCHEMA_VERSION) {
		log_error("catalog %s: schema version %d is newer than %d",
			  sqlite3_db_filename(db, "main"), v,
			  CATALOG_SCHEMA_VERSION);
		ret = -EPROTO;
		goto out;
	}
	for (; v < to; v++) {
		log_info("catalog %s: migrating schema %d -> %d",
			 sqlite3_db_filename(db, "main"), v, v + 1);
		ret = catalog_exec(db, catalog_migrations[v]);
		if (ret)
			goto out;
		snprintf(sql, sizeof(sql), "PRAGMA user_version = %d", v + 1);
		ret = catalog_exec(db, sql);
		if (ret)
			goto out;
	}
	rc = sqlite3_prepare_v2(db, "PRAGMA foreign_key_check", -1, &st, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		log_error("catalog %s: foreign key violation in table %s",
			  sqlite3_db_filename(db, "main"),
			  (const char *)sqlite3_column_text(st, 0));
		ret = -EUCLEAN;
		goto out;
	}
	if (rc != SQLITE_DONE) {
		ret = catalog_sqlerr(db, rc, "foreign_key_check");
		goto out;
	}
	ret = catalog_exec(db, "COMMIT");
out:
	sqlite3_finalize(st);
	if (ret)
		catalog_rollback(db);
	rc = catalog_exec(db, "PRAGMA foreign_keys = ON");
	return ret ? ret : rc;
}

int catalog_open(const char *path, unsigned flags, struct catalog **out)
{
	bool ro = flags & CATALOG_READONLY;
	struct catalog *cat;
	int oflags, rc, ret, v;

	*out = NULL;
	cat = calloc(1, sizeof(*cat));
	if (!cat)
		return -ENOMEM;
	cat->path = strdup(path);
	if (!cat->path) {
		ret = -ENOMEM;
		goto err;
	}
	ret = catalog_file_check_dir(path);
	if (ret)
		goto err;
	if (!(flags & CATALOG_CREATE) && access(path, F_OK)) {
		ret = -errno;
		log_error("catalog %s: %s", path, strerror(errno));
		goto err;
	}
	ret = catalog_file_guard(path, !ro && (flags & CATALOG_CREATE));
	if (ret)
		goto err;
	oflags = SQLITE_OPEN_NOMUTEX;
	if (ro)
		oflags |= SQLITE_OPEN_READONLY;
	else
		oflags |= SQLITE_OPEN_READWRITE |
			  (flags & CATALOG_CREATE ? SQLITE_OPEN_CREATE : 0);
	rc = sqlite3_open_v2(path, &cat->db, oflags, NULL);
	if (rc != SQLITE_OK) {
		ret = catalog_sqlerr(cat->db, rc, "open");
		goto err;
	}
	sqlite3_extended_result_codes(cat->db, 1);
	catalog_busy_init(cat->db, &cat->busy);
	if (!ro) {
		ret = catalog_exec(cat->db, "PRAGMA journal_mode = WAL");
		if (ret)
			goto err;
	}
	ret = catalog_exec(
		cat->db,
		"PRAGMA foreign_keys = ON;"
		"PRAGMA journal_size_limit = 67108864;" CATALOG_SAFE_PRAGMAS);
	if (ret)
		goto err;
	ret = catalog_user_version(cat->db, &v);
	if (ret)
		goto err;
	if (v > CATALOG_SCHEMA_VERSION || (v < CATALOG_SCHEMA_VERSION && ro)) {
		log_error("catalog %s: schema version %d, this program needs "
			  "%d%s",
			  path, v, CATALOG_SCHEMA_VERSION,
			  ro ? " (read-only: cannot migrate)" : "");
		ret = -EPROTO;
		goto err;
	}
	if (v < CATALOG_SCHEMA_VERSION) {
		ret = catalog_migrate(cat->db, CATALOG_SCHEMA_VERSION);
		if (ret)
			goto err;
	}
	*out = cat;
	return 0;
err:
	catalog_close(cat);
	return ret;
}

void catalog_close(struct catalog *cat)
{
	if (!cat)
		return;
	for (int i = 0; i < ST_COUNT; i++)
		sqlite3_finalize(cat->st[i]);
	sqlite3_close(cat->db);
	free(cat->path);
	free(cat);
}

int catalog_schema_version(struct catalog *cat)
{
	int v = -1;

	catalog_user_version(cat->db, &v);
	return v;
}

/* Bind args[0..n) to ?1..?n of st: SQLITE_OK or SQLite's result code. */
static int catalog_bind(sqlite3_stmt *st, const struct catalog_arg *args, int n)
{
	int rc = SQLITE_OK;

	for (int i = 0; rc == SQLITE_OK && i < n; i++) {
		switch (args[i].kind) {
		case CATALOG_ARG_INT:
			rc = sqlite3_bind_int64(st, i + 1, args[i].num);
			break;
		case CATALOG_ARG_TEXT:
			rc = sqlite3_bind_text(st, i + 1, args[i].text,
					       (int)args[i].num, SQLITE_STATIC);
			break;
		case CATALOG_ARG_BLOB:
			rc = sqlite3_bind_blob(st, i + 1, args[i].blob,
					       (int)args[i].num, SQLITE_STATIC);
			break;
		default:
			rc = SQLITE_MISUSE;
		}
	}
	return rc;
}

int catalog_prepare_db(sqlite3 *db, const char *what, const char *sql,
		       const struct catalog_arg *args, int n,
		       sqlite3_stmt **out)
{
	sqlite3_stmt *st = NULL;
	int rc;

	*out = NULL;
	rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
	if (rc == SQLITE_OK)
		rc = catalog_bind(st, args, n);
	if (rc != SQLITE_OK) {
		sqlite3_finalize(st);
		return catalog_sqlerr(db, rc, what);
	}
	*out = st;
	return 0;
}

int catalog_step_db(sqlite3 *db, sqlite3_stmt *st, const char *what)
{
	int rc = sqlite3_step(st);

	if (rc == SQLITE_ROW)
		return 0;
	if (rc == SQLITE_DONE)
		return -ENOENT;
	return catalog_sqlerr(db, rc, what);
}

/* Step st of db, due to return no rows (with row_ok, one ignored row is
 * fine too); *changes (may be NULL) gets the rows it changed. 0 or the
 * logged -errno (what); a row where none was due is -EIO. */
static int catalog_step_end(sqlite3 *db, sqlite3_stmt *st, const char *what,
			    bool row_ok, int *changes)
{
	int rc = sqlite3_step(st);

	if (rc != SQLITE_DONE && !(row_ok && rc == SQLITE_ROW))
		return catalog_sqlerr(db, rc, what);
	if (changes)
		*changes = sqlite3_changes(db);
	return 0;
}

int catalog_run_db(sqlite3 *db, const char *what, const char *sql,
		   const struct catalog_arg *args, int n, int *changes)
{
	sqlite3_stmt *st;
	int ret;

	ret = catalog_prepare_db(db, what, sql, args, n, &st);
	if (ret)
		return ret;
	ret = catalog_step_end(db, st, what, false, changes);
	sqlite3_finalize(st);
	return ret;
}

int catalog_each_db(sqlite3 *db, const char *what, const char *sql,
		    const struct catalog_arg *args, int n,
		    int (*row)(void *arg, sqlite3_stmt *st), void *arg)
{
	sqlite3_stmt *st;
	int ret;

	ret = catalog_prepare_db(db, what, sql, args, n, &st);
	if (ret)
		return ret;
	while (!(ret = catalog_step_db(db, st, what))) {
		ret = row(arg, st);
		if (ret)
			goto out;
	}
	if (ret == -ENOENT)
		ret = 0;
out:
	sqlite3_finalize(st);
	return ret;
}

/* The cached statement id of cat with args[0..n) bound: 0, or the logged
 * -errno of its preparation or of a binding (then reset, *out NULL). */
static int catalog_stmt_bind(struct catalog *cat, enum catalog_st id,
			     const char *what, const struct catalog_arg *args,
			     int n, sqlite3_stmt **out)
{
	sqlite3_stmt *st = NULL;
	int rc, ret;

	*out = NULL;
	ret = catalog_stmt(cat, id, &st);
	if (ret)
		return ret;
	rc = catalog_bind(st, args, n);
	if (rc != SQLITE_OK) {
		ret = catalog_sqlerr(cat->db, rc, what);
		catalog_stmt_done(st);
		return ret;
	}
	*out = st;
	return 0;
}

int catalog_stmt_row(struct catalog *cat, enum catalog_st id, const char *what,
		     const struct catalog_arg *args, int n, sqlite3_stmt **out)
{
	int ret;

	ret = catalog_stmt_bind(cat, id, what, args, n, out);
	if (ret)
		return ret;
	ret = catalog_step(cat, *out, what);
	if (ret) {
		catalog_stmt_done(*out);
		*out = NULL;
	}
	return ret;
}

int catalog_stmt_run(struct catalog *cat, enum catalog_st id, const char *what,
		     const struct catalog_arg *args, int n, int *changes)
{
	sqlite3_stmt *st;
	int ret;

	ret = catalog_stmt_bind(cat, id, what, args, n, &st);
	if (ret)
		return ret;
	ret = catalog_step_end(cat->db, st, what, true, changes);
	catalog_stmt_done(st);
	return ret;
}

int catalog_prepare(struct catalog *cat, const char *what, const char *sql,
		    const struct catalog_arg *args, int n, sqlite3_stmt **out)
{
	return catalog_prepare_db(cat->db, what, sql, args, n, out);
}

int catalog_step(struct catalog *cat, sqlite3_stmt *st, const char *what)
{
	return catalog_step_db(cat->db, st, what);
}

int catalog_run(struct catalog *cat, const char *what, const char *sql,
		const struct catalog_arg *args, int n, int *changes)
{
	return catalog_run_db(cat->db, what, sql, args, n, changes);
}

int catalog_each(struct catalog *cat, const char *what, const char *sql,
		 const struct catalog_arg *args, int n,
		 int (*row)(void *arg, sqlite3_stmt *st), void *arg)
{
	return catalog_each_db(cat->db, what, sql, args, n, row, arg);
}

int catalog_exec_id(struct catalog *cat, const char *sql, int64_t id,
		    int *changes)
{
	return catalog_run(cat, sql, sql, CATALOG_ARGS(CATALOG_INT(id)),
			   changes);
}

/* ---- policy and audit ---- */

int catalog_policy_get(struct catalog *cat, const char *key, char *buf,
		       size_t len)
{
	sqlite3_stmt *st;
	const char *v;
	int ret;

	ret = catalog_prepare(cat, "policy get",
			      "SELECT value FROM policy WHERE key = ?",
			      CATALOG_ARGS(CATALOG_TEXT(key)), &st);
	if (ret)
		return ret;
	ret = catalog_step(cat, st, "policy get");
	if (ret)
		goto out;
	v = (const char *)sqlite3_column_text(st, 0);
	if ((size_t)snprintf(buf, len, "%s", v ? v : "") >= len)
		ret = -ENAMETOOLONG;
out:
	sqlite3_finalize(st);
	return ret;
}

int catalog_policy_set(struct catalog *cat, const char *key, const char *value)
{
	if (!key || !*key || !value)
		return -EINVAL;
	return catalog_run(cat, "policy set",
			   "INSERT INTO policy(key, value, updated)"
			   " VALUES(?1, ?2, ?3) ON CONFLICT(key) DO UPDATE"
			   " SET value = ?2, updated = ?3",
			   CATALOG_ARGS(CATALOG_TEXT(key), CATALOG_TEXT(value),
					CATALOG_INT(timeutil_real_s())),
			   NULL);
}

int catalog_audit_add(struct catalog *cat, const struct catalog_audit *a)
{
	int64_t when = a->when ? a->when : timeutil_real_s();

	if (!a->action || !*a->action)
		return -EINVAL;
	return catalog_run(cat, "audit add",
			   "INSERT INTO audit(at, uid, user, action,"
			   " target, old_value, new_value)"
			   " VALUES(?, ?, ?, ?, ?, ?, ?)",
			   CATALOG_ARGS(CATALOG_INT(when), CATALOG_INT(a->uid),
					CATALOG_TEXT(a->user),
					CATALOG_TEXT(a->action),
					CATALOG_TEXT(a->target),
					CATALOG_TEXT(a->old_value),
					CATALOG_TEXT(a->new_value)),
			   NULL);
}

/* catalog_each's row function of catalog_audit_list. */
static int catalog_audit_row(void *arg, sqlite3_stmt *st)
{
	const struct catalog_each_cb *e = arg;
	struct catalog_audit a;

	a.id = sqlite3_column_int64(st, 0);
	a.when = sqlite3_column_int64(st, 1);
	a.uid = (uint32_t)sqlite3_column_int64(st, 2);
	a.user = (const char *)sqlite3_column_text(st, 3);
	a.action = (const char *)sqlite3_column_text(st, 4);
	a.target = (const char *)sqlite3_column_text(st, 5);
	a.old_value = (const char *)sqlite3_column_text(st, 6);
	a.new_value = (const char *)sqlite3_column_text(st, 7);
	return e->fn.audit(e->arg, &a);
}

int catalog_audit_list(struct catalog *cat, int64_t after_id,
		       catalog_audit_cb cb, void *arg)
{
	struct catalog_each_cb e = { .fn.audit = cb, .arg = arg };

	return catalog_each(cat, "audit list",
			    "SELECT id, at, uid, user, action, target,"
			    " old_value, new_value FROM audit"
			    " WHERE id > ? ORDER BY id",
			    CATALOG_ARGS(CATALOG_INT(after_id)),
			    catalog_audit_row, &e);
}
