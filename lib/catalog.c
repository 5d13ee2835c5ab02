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
 * transaction, every multi-statement read in one read transaction.
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

#include "catalog_internal.h"
#include "dstage/keypath.h"
#include "dstage/log.h"

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

#define SUMS_CHUNK (1u << 20)

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
};

_Static_assert(sizeof(catalog_migrations) / sizeof(catalog_migrations[0]) ==
		       CATALOG_SCHEMA_VERSION,
	       "one migration step per schema version");

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

/* Columns of an entry, in catalog_entry_fill order, from objects o. */
#define ENTRY_COLS_OBJ                                          \
	"o.id, 0, o.size, o.mtime, o.etag, o.expected_sha256, " \
	"o.actual_sha256, o.verified_at"
#define ENTRY_COLS_DIR "0, 1, 0, m.created, NULL, NULL, NULL, 0"

#define DS_COLS                                                            \
	"d.id, d.name, d.source, d.state, d.pinned, d.quota, d.priority, " \
	"d.owner_group, d.created, coalesce(m.version, 0), "               \
	"coalesce(m.bad_keys, 0), coalesce(m.n_objects, 0), "              \
	"coalesce(m.n_bytes, 0), coalesce(m.created, 0), d.sums_key "      \
	"FROM datasets d LEFT JOIN manifests m "                           \
	"ON m.dataset_id = d.id AND m.state = 1 "

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

struct catalog {
	sqlite3 *db;
	char *path;
	sqlite3_stmt *st[ST_COUNT];
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

/* Log a SQLite failure of db and return its -errno. */
static int catalog_sqlerr(sqlite3 *db, int rc, const char *what)
{
	const char *file = db ? sqlite3_db_filename(db, "main") : NULL;

	log_error("catalog %s: %s: %s", file ? file : "?", what,
		  db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
	return catalog_sqlite_errno(rc);
}

static int catalog_exec(sqlite3 *db, const char *sql)
{
	int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);

	return rc == SQLITE_OK ? 0 : catalog_sqlerr(db, rc, sql);
}

static void catalog_rollback(sqlite3 *db)
{
	if (!sqlite3_get_autocommit(db))
		sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

static int64_t catalog_now(void)
{
	return (int64_t)time(NULL);
}

/* The cached statement id, reset and ready for binding. */
static int catalog_stmt(struct catalog *cat, enum catalog_st id,
			sqlite3_stmt **out)
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

static void catalog_stmt_done(sqlite3_stmt *st)
{
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
}

/* Step a statement that returns no rows; then reset it. */
static int catalog_step_done(struct catalog *cat, sqlite3_stmt *st,
			     const char *what)
{
	int rc = sqlite3_step(st);
	int ret = 0;

	if (rc != SQLITE_DONE && rc != SQLITE_ROW)
		ret = catalog_sqlerr(cat->db, rc, what);
	catalog_stmt_done(st);
	return ret;
}

static int catalog_user_version(sqlite3 *db, int *version)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

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
	if (!(flags & CATALOG_CREATE) && access(path, F_OK)) {
		ret = -errno;
		log_error("catalog %s: %s", path, strerror(errno));
		goto err;
	}
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
	sqlite3_busy_timeout(cat->db, CATALOG_BUSY_TIMEOUT_MS);
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

/* ---- datasets ---- */

static char *catalog_col_dup(sqlite3_stmt *st, int col, bool *oom)
{
	const char *s = (const char *)sqlite3_column_text(st, col);
	char *d;

	if (!s)
		return NULL;
	d = strdup(s);
	if (!d)
		*oom = true;
	return d;
}

/* Fill ds from a DS_COLS row; strings point into the statement. */
static void catalog_ds_fill(sqlite3_stmt *st, struct catalog_dataset *ds)
{
	ds->id = sqlite3_column_int64(st, 0);
	ds->name = (char *)sqlite3_column_text(st, 1);
	ds->source = (char *)sqlite3_column_text(st, 2);
	ds->state = (enum catalog_ds_state)sqlite3_column_int(st, 3);
	ds->pinned = sqlite3_column_int(st, 4) != 0;
	ds->quota = (uint64_t)sqlite3_column_int64(st, 5);
	ds->priority = sqlite3_column_int(st, 6);
	ds->group = (char *)sqlite3_column_text(st, 7);
	ds->created = sqlite3_column_int64(st, 8);
	ds->version = sqlite3_column_int64(st, 9);
	ds->bad_keys = (uint64_t)sqlite3_column_int64(st, 10);
	ds->objects = (uint64_t)sqlite3_column_int64(st, 11);
	ds->bytes = (uint64_t)sqlite3_column_int64(st, 12);
	ds->refreshed = sqlite3_column_int64(st, 13);
	ds->sums_key = (char *)sqlite3_column_text(st, 14);
}

int catalog_dataset_add(struct catalog *cat, const char *name,
			const char *source, const char *group)
{
	sqlite3_stmt *st = NULL;
	const char *why;
	int rc, ret = 0;

	if (keypath_check_name(name, strlen(name), &why)) {
		log_error("catalog: bad dataset name '%s': %s", name, why);
		return -EINVAL;
	}
	if (!source || !*source)
		return -EINVAL;
	rc = sqlite3_prepare_v2(cat->db,
				"INSERT INTO datasets(name, source, state,"
				" owner_group, created) VALUES(?, ?, 0, ?, ?)",
				-1, &st, NULL);
	if (rc != SQLITE_OK) {
		ret = catalog_sqlerr(cat->db, rc, "prepare dataset add");
		goto out;
	}
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, source, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, group, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 4, catalog_now());
	rc = sqlite3_step(st);
	if (rc == SQLITE_CONSTRAINT_UNIQUE)
		ret = -EEXIST;
	else if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "dataset add");
out:
	sqlite3_finalize(st);
	return ret;
}

int catalog_dataset_get(struct catalog *cat, const char *name,
			struct catalog_dataset *ds)
{
	struct catalog_dataset row;
	sqlite3_stmt *st = NULL;
	bool oom = false;
	int rc, ret;

	memset(ds, 0, sizeof(*ds));
	ret = catalog_stmt(cat, ST_DS_GET, &st);
	if (ret)
		return ret;
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_DONE) {
		ret = -ENOENT;
		goto out;
	}
	if (rc != SQLITE_ROW) {
		ret = catalog_sqlerr(cat->db, rc, "dataset get");
		goto out;
	}
	catalog_ds_fill(st, &row);
	*ds = row;
	ds->name = catalog_col_dup(st, 1, &oom);
	ds->source = catalog_col_dup(st, 2, &oom);
	ds->group = catalog_col_dup(st, 7, &oom);
	ds->sums_key = catalog_col_dup(st, 14, &oom);
	if (oom) {
		catalog_dataset_release(ds);
		ret = -ENOMEM;
	}
out:
	catalog_stmt_done(st);
	return ret;
}

void catalog_dataset_release(struct catalog_dataset *ds)
{
	if (!ds)
		return;
	free(ds->name);
	free(ds->source);
	free(ds->group);
	free(ds->sums_key);
	ds->name = ds->source = ds->group = ds->sums_key = NULL;
}

int catalog_dataset_list(struct catalog *cat, catalog_dataset_cb cb, void *arg)
{
	struct catalog_dataset ds;
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	rc = sqlite3_prepare_v2(cat->db,
				"SELECT " DS_COLS "WHERE d.state <> 2"
				" ORDER BY d.name",
				-1, &st, NULL);
	if (rc != SQLITE_OK) {
		ret = catalog_sqlerr(cat->db, rc, "prepare dataset list");
		goto out;
	}
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		catalog_ds_fill(st, &ds);
		ret = cb(arg, &ds);
		if (ret)
			goto out;
	}
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "dataset list");
out:
	sqlite3_finalize(st);
	return ret;
}

/* UPDATE datasets SET <col> = value for a visible dataset. */
static int catalog_dataset_set(struct catalog *cat, const char *name,
			       const char *sql, sqlite3_int64 ival,
			       const char *sval, bool is_text)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	rc = sqlite3_prepare_v2(cat->db, sql, -1, &st, NULL);
	if (rc != SQLITE_OK) {
		ret = catalog_sqlerr(cat->db, rc, sql);
		goto out;
	}
	if (is_text)
		sqlite3_bind_text(st, 1, sval, -1, SQLITE_STATIC);
	else
		sqlite3_bind_int64(st, 1, ival);
	sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, sql);
	else if (sqlite3_changes(cat->db) == 0)
		ret = -ENOENT;
out:
	sqlite3_finalize(st);
	return ret;
}

#define DS_SET(col) \
	"UPDATE datasets SET " col " = ?1 WHERE name = ?2 AND state <> 2"

int catalog_dataset_set_pinned(struct catalog *cat, const char *name,
			       bool pinned)
{
	return catalog_dataset_set(cat, name, DS_SET("pinned"), pinned, NULL,
				   false);
}

int catalog_dataset_set_quota(struct catalog *cat, const char *name,
			      uint64_t quota)
{
	if (quota > INT64_MAX)
		return -EINVAL;
	return catalog_dataset_set(cat, name, DS_SET("quota"),
				   (sqlite3_int64)quota, NULL, false);
}

int catalog_dataset_set_priority(struct catalog *cat, const char *name,
				 int priority)
{
	return catalog_dataset_set(cat, name, DS_SET("priority"), priority,
				   NULL, false);
}

int catalog_dataset_set_group(struct catalog *cat, const char *name,
			      const char *group)
{
	return catalog_dataset_set(cat, name, DS_SET("owner_group"), 0, group,
				   true);
}

int catalog_dataset_set_sums_key(struct catalog *cat, const char *name,
				 const char *key)
{
	const char *why;
	char buf[256];

	if (!key)
		key = CATALOG_SUMS_KEY_DEFAULT;
	if (keypath_check(key, strlen(key), &why)) {
		log_error("catalog: dataset %s: bad sums key '%s': %s", name,
			  keypath_printable(key, strlen(key), buf, sizeof(buf)),
			  why);
		return -EINVAL;
	}
	return catalog_dataset_set(cat, name, DS_SET("sums_key"), 0, key, true);
}

/* Delete one manifest in batches of CATALOG_BATCH rows (autocommit). */
static int catalog_manifest_purge(struct catalog *cat, int64_t mf_id)
{
	static const enum catalog_st steps[] = { ST_PURGE_OBJECTS,
						 ST_PURGE_DIRS };
	sqlite3_stmt *st = NULL;
	int ret;

	for (size_t i = 0; i < 2; i++) {
		ret = catalog_stmt(cat, steps[i], &st);
		if (ret)
			return ret;
		do {
			sqlite3_bind_int64(st, 1, mf_id);
			sqlite3_bind_int(st, 2, CATALOG_BATCH);
			ret = catalog_step_done(cat, st, "purge manifest");
			if (ret)
				return ret;
		} while (sqlite3_changes(cat->db) > 0);
	}
	ret = catalog_stmt(cat, ST_PURGE_MANIFEST, &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, mf_id);
	return catalog_step_done(cat, st, "purge manifest");
}

/* Purge every DEAD manifest of a dataset. */
static int catalog_purge_dead(struct catalog *cat, int64_t ds_id)
{
	sqlite3_stmt *st = NULL;
	int64_t mf_id;
	int rc, ret;

	for (;;) {
		ret = catalog_stmt(cat, ST_DEAD_MANIFEST, &st);
		if (ret)
			return ret;
		sqlite3_bind_int64(st, 1, ds_id);
		rc = sqlite3_step(st);
		mf_id = sqlite3_column_int64(st, 0);
		catalog_stmt_done(st);
		if (rc == SQLITE_DONE)
			return 0;
		if (rc != SQLITE_ROW)
			return catalog_sqlerr(cat->db, rc,
					      "find dead manifest");
		ret = catalog_manifest_purge(cat, mf_id);
		if (ret)
			return ret;
	}
}

/*
 * In a transaction: the id and state of dataset name, or -ENOENT. With
 * sums_key (KEYPATH_MAX bytes), also its sums key, which must pass
 * keypath_check (-EUCLEAN: the row was changed behind the catalog's back).
 */
static int catalog_dataset_id(struct catalog *cat, const char *name,
			      int64_t *id, int *state, char *sums_key)
{
	sqlite3_stmt *st = NULL;
	const char *key;
	int rc, ret;

	ret = catalog_stmt(cat, ST_DS_ID, &st);
	if (ret)
		return ret;
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		*id = sqlite3_column_int64(st, 0);
		*state = sqlite3_column_int(st, 1);
		key = (const char *)sqlite3_column_text(st, 2);
		if (sums_key &&
		    (!key || keypath_check(key, strlen(key), NULL))) {
			log_error("catalog: dataset %s: unusable sums key in "
				  "the catalog",
				  name);
			ret = -EUCLEAN;
		} else if (sums_key) {
			memcpy(sums_key, key, strlen(key) + 1);
		}
	} else if (rc == SQLITE_DONE) {
		ret = -ENOENT;
	} else {
		ret = catalog_sqlerr(cat->db, rc, "dataset id");
	}
	catalog_stmt_done(st);
	return ret;
}

/* Run sql with ?1 bound to id; *changes gets the rows changed. */
static int catalog_exec_id(struct catalog *cat, const char *sql, int64_t id,
			   int *changes)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	rc = sqlite3_prepare_v2(cat->db, sql, -1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, id);
		rc = sqlite3_step(st);
	}
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, sql);
	else if (changes)
		*changes = sqlite3_changes(cat->db);
	sqlite3_finalize(st);
	return ret;
}

int catalog_dataset_remove(struct catalog *cat, const char *name)
{
	int64_t id;
	int state, ret;

	ret = catalog_exec(cat->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = catalog_dataset_id(cat, name, &id, &state, NULL);
	if (ret)
		goto err;
	ret = catalog_exec_id(cat, "UPDATE datasets SET state = 2 WHERE id = ?",
			      id, NULL);
	if (ret)
		goto err;
	ret = catalog_exec_id(cat,
			      "UPDATE manifests SET state = 2"
			      " WHERE dataset_id = ?",
			      id, NULL);
	if (ret)
		goto err;
	ret = catalog_exec(cat->db, "COMMIT");
	if (ret)
		goto err;
	ret = catalog_purge_dead(cat, id);
	if (ret)
		return ret;
	return catalog_exec_id(cat, "DELETE FROM datasets WHERE id = ?", id,
			       NULL);
err:
	catalog_rollback(cat->db);
	return ret;
}

/* ---- registration ---- */

/*
 * State of one registration. Only the registering thread touches it. Rows
 * are written in transactions of up to CATALOG_BATCH rows.
 */
struct catalog_reg {
	struct catalog *cat;
	const char *name;
	int64_t ds_id;
	int64_t mf_id;
	int64_t now;
	bool in_tx; /* a batch transaction is open */
	unsigned batch; /* rows written in it */
	uint64_t bad;
	bool has_sums;
	struct objstore_info sums; /* .key points to sums_key */
	char sums_key[KEYPATH_MAX]; /* the dataset's, read at the start */
	size_t last_dir_len; /* last directory known to exist */
	char last_dir[KEYPATH_MAX];
};

/* Open a batch transaction if none is open; the manifest must still be
 * BUILDING (else a newer registration or a removal took over). */
static int catalog_reg_begin(struct catalog_reg *r)
{
	struct catalog *cat = r->cat;
	sqlite3_stmt *st = NULL;
	int rc, ret;

	if (r->in_tx)
		return 0;
	ret = catalog_exec(cat->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	r->in_tx = true;
	r->batch = 0;
	ret = catalog_stmt(cat, ST_MF_STATE, &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, r->mf_id);
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "manifest state");
	else if (rc == SQLITE_DONE || sqlite3_column_int(st, 0) != MF_BUILDING)
		ret = -EBUSY;
	catalog_stmt_done(st);
	if (ret == -EBUSY)
		log_error("catalog: dataset %s: registration superseded",
			  r->name);
	return ret;
}

/* Count one row of the open batch; commit when the batch is full. */
static int catalog_reg_commit(struct catalog_reg *r)
{
	if (!r->in_tx)
		return 0;
	r->in_tx = false;
	return catalog_exec(r->cat->db, "COMMIT");
}

static int catalog_reg_row(struct catalog_reg *r)
{
	if (++r->batch < CATALOG_BATCH)
		return 0;
	return catalog_reg_commit(r);
}

/* Make sure directory path (len bytes, valid) and its ancestors exist. */
static int catalog_reg_dir(struct catalog_reg *r, const char *path, size_t len)
{
	size_t orig = len;
	sqlite3_stmt *st = NULL;
	int ret;

	ret = catalog_stmt(r->cat, ST_DIR_INSERT, &st);
	if (ret)
		return ret;
	while (len > 0) {
		size_t plen = keypath_parent_len(path, len);

		if (len == r->last_dir_len && !memcmp(path, r->last_dir, len))
			break;
		sqlite3_bind_int64(st, 1, r->mf_id);
		sqlite3_bind_text(st, 2, path, (int)len, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, path, (int)plen, SQLITE_STATIC);
		ret = catalog_step_done(r->cat, st, "insert dir");
		if (ret)
			return ret;
		if (sqlite3_changes(r->cat->db) == 0)
			break; /* it exists, so do its ancestors */
		len = plen;
	}
	memcpy(r->last_dir, path, orig);
	r->last_dir_len = orig;
	return 0;
}

static void catalog_reg_bad(struct catalog_reg *r, const char *key, size_t len,
			    const char *why)
{
	char buf[1024];

	r->bad++;
	log_warn("catalog: dataset %s: skipping key '%s': %s", r->name,
		 keypath_printable(key, len, buf, sizeof(buf)), why);
}

static int catalog_reg_key(void *arg, const struct objstore_info *oi)
{
	struct catalog_reg *r = arg;
	const char *key = oi->key, *why;
	size_t len = strlen(key);
	sqlite3_stmt *st = NULL;
	int ret;

	ret = catalog_reg_begin(r);
	if (ret)
		return ret;
	if (keypath_dir_marker(key, len)) {
		ret = catalog_reg_dir(r, key, len - 1);
		if (ret)
			return ret;
		return catalog_reg_row(r);
	}
	if (keypath_check(key, len, &why)) {
		catalog_reg_bad(r, key, len, why);
		return 0;
	}
	if (oi->size > INT64_MAX) {
		catalog_reg_bad(r, key, len, "size out of range");
		return 0;
	}
	ret = catalog_stmt(r->cat, ST_OBJ_INSERT, &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, r->mf_id);
	sqlite3_bind_text(st, 2, key, (int)len, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, key, (int)keypath_parent_len(key, len),
			  SQLITE_STATIC);
	sqlite3_bind_int64(st, 4, (sqlite3_int64)oi->size);
	if (oi->etag[0])
		sqlite3_bind_text(st, 5, oi->etag, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 6, oi->mtime);
	ret = catalog_step_done(r->cat, st, "insert object");
	if (ret)
		return ret;
	if (sqlite3_changes(r->cat->db) == 0) {
		catalog_reg_bad(r, key, len, "duplicate key");
		return 0;
	}
	ret = catalog_reg_dir(r, key, keypath_parent_len(key, len));
	if (ret)
		return ret;
	if (strcmp(key, r->sums_key) == 0) {
		r->has_sums = true;
		r->sums = *oi;
		r->sums.key = r->sums_key;
	}
	return catalog_reg_row(r);
}

/*
 * Drop every object whose path is also a directory ("a" and "a/b"): the
 * directory wins, since it may hold many files. Done over the tables, so it
 * does not depend on listing order ("a" < "a-x" < "a/b").
 */
static int catalog_reg_clashes(struct catalog_reg *r)
{
	struct catalog *cat = r->cat;
	sqlite3_stmt *st = NULL;
	int rc, ret, n = 0;
	char buf[1024];

	ret = catalog_reg_begin(r);
	if (ret)
		return ret;
	rc = sqlite3_prepare_v2(cat->db,
				"SELECT o.path FROM objects o JOIN dirs x"
				" ON x.manifest_id = o.manifest_id"
				" AND x.path = o.path WHERE o.manifest_id = ?",
				-1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, r->mf_id);
		while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
			const char *p =
				(const char *)sqlite3_column_text(st, 0);

			log_warn("catalog: dataset %s: skipping key '%s': "
				 "both a file and a directory prefix",
				 r->name,
				 keypath_printable(p, strlen(p), buf,
						   sizeof(buf)));
		}
	}
	if (rc != SQLITE_DONE) {
		ret = catalog_sqlerr(cat->db, rc, "find clashes");
		goto out;
	}
	ret = catalog_exec_id(cat,
			      "DELETE FROM objects WHERE manifest_id = ?1"
			      " AND path IN (SELECT path FROM dirs"
			      " WHERE manifest_id = ?1)",
			      r->mf_id, &n);
	if (ret)
		goto out;
	r->bad += (uint64_t)n;
	ret = catalog_reg_commit(r);
out:
	sqlite3_finalize(st);
	return ret;
}

static int catalog_sums_entry(void *arg, const char *name, size_t len,
			      const unsigned char hash[32], bool binary)
{
	struct catalog_reg *r = arg;
	sqlite3_stmt *st = NULL;
	char buf[1024];
	int ret;

	(void)binary;
	ret = catalog_reg_begin(r);
	if (ret)
		return ret;
	ret = catalog_stmt(r->cat, ST_SUMS_UPDATE, &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, r->mf_id);
	sqlite3_bind_text(st, 2, name, (int)len, SQLITE_STATIC);
	sqlite3_bind_blob(st, 3, hash, 32, SQLITE_STATIC);
	ret = catalog_step_done(r->cat, st, "set expected sha256");
	if (ret)
		return ret;
	if (sqlite3_changes(r->cat->db) == 0)
		log_warn("catalog: dataset %s: %s names '%s', which is not a "
			 "file of the dataset",
			 r->name, r->sums_key,
			 keypath_printable(name, len, buf, sizeof(buf)));
	return catalog_reg_row(r);
}

static int catalog_sums_bad(void *arg, unsigned long line, const char *why)
{
	struct catalog_reg *r = arg;

	log_warn("catalog: dataset %s: %s:%lu: %s", r->name, r->sums_key, line,
		 why);
	return 0;
}

static int catalog_reg_sums(struct catalog_reg *r,
			    const struct catalog_source *src)
{
	struct sha256sums_parser *p;
	int ret;

	p = malloc(sizeof(*p));
	if (!p)
		return -ENOMEM;
	sha256sums_init(p, catalog_sums_entry, catalog_sums_bad, r);
	ret = src->read(src->arg, &r->sums, p);
	if (!ret)
		ret = sha256sums_finish(p);
	if (!ret)
		ret = catalog_reg_commit(r);
	if (!ret)
		log_info("catalog: dataset %s: %lu hashes from %s, %lu bad "
			 "lines",
			 r->name, p->entries, r->sums_key, p->bad_lines);
	sha256sums_release(p);
	free(p);
	return ret;
}

/* Create the BUILDING manifest and its root directory. */
static int catalog_reg_start(struct catalog_reg *r)
{
	struct catalog *cat = r->cat;
	sqlite3_stmt *st = NULL;
	int64_t version = 0;
	int rc, state, ret;

	ret = catalog_exec(cat->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = catalog_dataset_id(cat, r->name, &r->ds_id, &state, r->sums_key);
	if (ret)
		goto out;
	if (state == CATALOG_DS_REMOVING) {
		ret = -ENOENT;
		goto out;
	}
	/* A newer registration wins over an older one still building. */
	ret = catalog_exec_id(cat,
			      "UPDATE manifests SET state = 2"
			      " WHERE dataset_id = ? AND state = 0",
			      r->ds_id, NULL);
	if (ret)
		goto out;
	rc = sqlite3_prepare_v2(cat->db,
				"SELECT coalesce(max(version), 0) + 1"
				" FROM manifests WHERE dataset_id = ?",
				-1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, r->ds_id);
		rc = sqlite3_step(st);
	}
	if (rc != SQLITE_ROW) {
		ret = catalog_sqlerr(cat->db, rc, "next version");
		goto out;
	}
	version = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	rc = sqlite3_prepare_v2(cat->db,
				"INSERT INTO manifests(dataset_id, version,"
				" state, created) VALUES(?, ?, 0, ?)",
				-1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, r->ds_id);
		sqlite3_bind_int64(st, 2, version);
		sqlite3_bind_int64(st, 3, r->now);
		rc = sqlite3_step(st);
	}
	if (rc != SQLITE_DONE) {
		ret = catalog_sqlerr(cat->db, rc, "new manifest");
		goto out;
	}
	r->mf_id = sqlite3_last_insert_rowid(cat->db);
	ret = catalog_exec_id(cat,
			      "INSERT INTO dirs(manifest_id, path, parent)"
			      " VALUES(?, '', NULL)",
			      r->mf_id, NULL);
	if (ret)
		goto out;
	ret = catalog_exec(cat->db, "COMMIT");
out:
	sqlite3_finalize(st);
	if (ret)
		catalog_rollback(cat->db);
	return ret;
}

/* Make the BUILDING manifest current, in one transaction. */
static int catalog_reg_flip(struct catalog_reg *r)
{
	struct catalog *cat = r->cat;
	sqlite3_stmt *st = NULL;
	int rc, n = 0, ret;

	ret = catalog_exec(cat->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = catalog_exec_id(cat,
			      "UPDATE manifests SET state = 2"
			      " WHERE dataset_id = ? AND state = 1",
			      r->ds_id, NULL);
	if (ret)
		goto out;
	rc = sqlite3_prepare_v2(
		cat->db,
		"UPDATE manifests SET state = 1, bad_keys = ?2,"
		" n_objects = (SELECT count(*) FROM objects"
		"  WHERE manifest_id = ?1),"
		" n_bytes = (SELECT coalesce(sum(size), 0) FROM objects"
		"  WHERE manifest_id = ?1)"
		" WHERE id = ?1 AND state = 0",
		-1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, r->mf_id);
		sqlite3_bind_int64(st, 2, (sqlite3_int64)r->bad);
		rc = sqlite3_step(st);
	}
	if (rc != SQLITE_DONE) {
		ret = catalog_sqlerr(cat->db, rc, "make manifest current");
		goto out;
	}
	if (sqlite3_changes(cat->db) == 0) {
		log_error("catalog: dataset %s: registration superseded",
			  r->name);
		ret = -EBUSY;
		goto out;
	}
	ret = catalog_exec_id(cat,
			      "UPDATE datasets SET state = 1"
			      " WHERE id = ? AND state <> 2",
			      r->ds_id, &n);
	if (ret)
		goto out;
	if (n == 0) {
		ret = -ENOENT;
		goto out;
	}
	ret = catalog_exec(cat->db, "COMMIT");
out:
	sqlite3_finalize(st);
	if (ret)
		catalog_rollback(cat->db);
	return ret;
}

int catalog_register_source(struct catalog *cat, const char *name,
			    const struct catalog_source *src)
{
	struct catalog_reg *r;
	int ret;

	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->cat = cat;
	r->name = name;
	r->now = catalog_now();
	ret = catalog_reg_start(r);
	if (ret)
		goto out;
	/* Leftovers of crashed or superseded registrations. */
	ret = catalog_purge_dead(cat, r->ds_id);
	if (ret)
		goto err;
	/*
	 * The BUILDING manifest is garbage after a crash anyway, so its
	 * batches need not reach the disk one by one, and the WAL is
	 * checkpointed once, at the flip, instead of every 1000 pages.
	 */
	ret = catalog_exec(cat->db, CATALOG_BULK_PRAGMAS);
	if (ret)
		goto err;
	ret = src->list(src->arg, catalog_reg_key, r);
	if (!ret)
		ret = catalog_reg_commit(r);
	if (!ret)
		ret = catalog_reg_clashes(r);
	if (!ret && !r->has_sums &&
	    strcmp(r->sums_key, CATALOG_SUMS_KEY_DEFAULT) != 0) {
		log_error("catalog: dataset %s: its sums key %s is not at the "
			  "source",
			  name, r->sums_key);
		ret = -ENODATA;
	}
	if (!ret && r->has_sums)
		ret = catalog_reg_sums(r, src);
	if (!ret)
		ret = catalog_exec(cat->db, CATALOG_SAFE_PRAGMAS);
	if (!ret)
		ret = catalog_reg_flip(r);
	if (ret)
		goto err;
	log_info("catalog: dataset %s registered, %llu bad keys", name,
		 (unsigned long long)r->bad);
	/* The old manifest; the new one is already visible. */
	if (catalog_purge_dead(cat, r->ds_id))
		log_warn("catalog: dataset %s: old manifest left for later",
			 name);
	goto out;
err:
	catalog_rollback(cat->db);
	catalog_exec(cat->db, CATALOG_SAFE_PRAGMAS);
	r->in_tx = false;
	catalog_exec_id(cat,
			"UPDATE manifests SET state = 2 WHERE id = ?"
			" AND state = 0",
			r->mf_id, NULL);
	catalog_purge_dead(cat, r->ds_id);
out:
	free(r);
	return ret;
}

/* A catalog_source over an objstore. */
static int catalog_os_list(void *arg, objstore_list_cb cb, void *cb_arg)
{
	return objstore_list(arg, "", cb, cb_arg);
}

static int catalog_os_read(void *arg, const struct objstore_info *oi,
			   struct sha256sums_parser *p)
{
	const char *etag = oi->etag[0] ? oi->etag : NULL;
	uint64_t off = 0;
	char *buf;
	size_t got;
	int ret = 0;

	buf = malloc(SUMS_CHUNK);
	if (!buf)
		return -ENOMEM;
	while (off < oi->size) {
		ret = objstore_get(arg, oi->key, off, SUMS_CHUNK, etag, buf,
				   &got);
		if (ret)
			break;
		if (got == 0) {
			ret = -EIO;
			break;
		}
		ret = sha256sums_feed(p, buf, got);
		if (ret)
			break;
		off += got;
	}
	free(buf);
	return ret;
}

int catalog_register(struct catalog *cat, const char *name, struct objstore *os)
{
	struct catalog_source src = {
		.list = catalog_os_list,
		.read = catalog_os_read,
		.arg = os,
	};

	return catalog_register_source(cat, name, &src);
}

/* ---- lookup and readdir ---- */

/* Fill e from 8 entry columns starting at column c. */
static void catalog_entry_fill(sqlite3_stmt *st, int c, struct catalog_entry *e)
{
	const char *etag;

	memset(e, 0, sizeof(*e));
	e->id = sqlite3_column_int64(st, c);
	e->is_dir = sqlite3_column_int(st, c + 1) != 0;
	e->size = (uint64_t)sqlite3_column_int64(st, c + 2);
	e->mtime = sqlite3_column_int64(st, c + 3);
	etag = (const char *)sqlite3_column_text(st, c + 4);
	if (etag)
		snprintf(e->etag, sizeof(e->etag), "%s", etag);
	if (sqlite3_column_bytes(st, c + 5) == 32) {
		e->has_expected = true;
		memcpy(e->expected_sha256, sqlite3_column_blob(st, c + 5), 32);
	}
	if (sqlite3_column_bytes(st, c + 6) == 32) {
		e->has_actual = true;
		memcpy(e->actual_sha256, sqlite3_column_blob(st, c + 6), 32);
	}
	e->verified_at = sqlite3_column_int64(st, c + 7);
}

/* Lookup; *mf_id gets the manifest the entry was found in. */
static int catalog_lookup_mf(struct catalog *cat, const char *dataset,
			     const char *path, struct catalog_entry *e,
			     int64_t *mf_id)
{
	sqlite3_stmt *st = NULL;
	int rc, ret;

	ret = catalog_stmt(cat, ST_LOOKUP, &st);
	if (ret)
		return ret;
	sqlite3_bind_text(st, 1, dataset, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, path, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		*mf_id = sqlite3_column_int64(st, 0);
		catalog_entry_fill(st, 1, e);
	} else if (rc == SQLITE_DONE) {
		ret = -ENOENT;
	} else {
		ret = catalog_sqlerr(cat->db, rc, "lookup");
	}
	catalog_stmt_done(st);
	return ret;
}

int catalog_lookup(struct catalog *cat, const char *dataset, const char *path,
		   struct catalog_entry *e)
{
	int64_t mf_id;

	return catalog_lookup_mf(cat, dataset, path, e, &mf_id);
}

int catalog_readdir(struct catalog *cat, const char *dataset, const char *dir,
		    const char *after, catalog_readdir_cb cb, void *arg)
{
	char start[2 * KEYPATH_MAX + 2];
	struct catalog_entry e;
	sqlite3_stmt *st = NULL;
	int64_t mf_id, dir_mtime;
	size_t dlen = strlen(dir);
	int rc, ret;

	if (after && *dir)
		rc = snprintf(start, sizeof(start), "%s/%s", dir, after);
	else
		rc = snprintf(start, sizeof(start), "%s", after ? after : "");
	if (rc < 0 || (size_t)rc >= sizeof(start))
		return -EINVAL;
	/* One read transaction: the directory and its entries are one
	 * snapshot even if a refresh commits meanwhile. */
	ret = catalog_exec(cat->db, "BEGIN");
	if (ret)
		return ret;
	ret = catalog_lookup_mf(cat, dataset, dir, &e, &mf_id);
	if (ret)
		goto out;
	if (!e.is_dir) {
		ret = -ENOTDIR;
		goto out;
	}
	dir_mtime = e.mtime;
	ret = catalog_stmt(cat, ST_READDIR, &st);
	if (ret)
		goto out;
	sqlite3_bind_int64(st, 1, mf_id);
	sqlite3_bind_text(st, 2, dir, (int)dlen, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, start, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 4, dir_mtime);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *p = (const char *)sqlite3_column_text(st, 0);

		catalog_entry_fill(st, 1, &e);
		ret = cb(arg, keypath_basename(p, strlen(p)), &e);
		if (ret)
			goto out;
	}
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "readdir");
out:
	if (st)
		catalog_stmt_done(st);
	sqlite3_exec(cat->db, "COMMIT", NULL, NULL, NULL);
	return ret;
}

int catalog_object_set_actual(struct catalog *cat, int64_t object_id,
			      const unsigned char sha256[32], int64_t when)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	rc = sqlite3_prepare_v2(cat->db,
				"UPDATE objects SET actual_sha256 = ?2,"
				" verified_at = ?3 WHERE id = ?1",
				-1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, object_id);
		sqlite3_bind_blob(st, 2, sha256, 32, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, when);
		rc = sqlite3_step(st);
	}
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "set actual sha256");
	else if (sqlite3_changes(cat->db) == 0)
		ret = -ENOENT;
	sqlite3_finalize(st);
	return ret;
}

/* ---- policy and audit ---- */

int catalog_policy_get(struct catalog *cat, const char *key, char *buf,
		       size_t len)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	rc = sqlite3_prepare_v2(cat->db,
				"SELECT value FROM policy WHERE key = ?", -1,
				&st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
		rc = sqlite3_step(st);
	}
	if (rc == SQLITE_ROW) {
		const char *v = (const char *)sqlite3_column_text(st, 0);

		if ((size_t)snprintf(buf, len, "%s", v ? v : "") >= len)
			ret = -ENAMETOOLONG;
	} else if (rc == SQLITE_DONE) {
		ret = -ENOENT;
	} else {
		ret = catalog_sqlerr(cat->db, rc, "policy get");
	}
	sqlite3_finalize(st);
	return ret;
}

int catalog_policy_set(struct catalog *cat, const char *key, const char *value)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	if (!key || !*key || !value)
		return -EINVAL;
	rc = sqlite3_prepare_v2(cat->db,
				"INSERT INTO policy(key, value, updated)"
				" VALUES(?1, ?2, ?3) ON CONFLICT(key) DO UPDATE"
				" SET value = ?2, updated = ?3",
				-1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, value, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, catalog_now());
		rc = sqlite3_step(st);
	}
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "policy set");
	sqlite3_finalize(st);
	return ret;
}

int catalog_audit_add(struct catalog *cat, const struct catalog_audit *a)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	if (!a->action || !*a->action)
		return -EINVAL;
	rc = sqlite3_prepare_v2(cat->db,
				"INSERT INTO audit(at, uid, user, action,"
				" target, old_value, new_value)"
				" VALUES(?, ?, ?, ?, ?, ?, ?)",
				-1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_int64(st, 1, a->when ? a->when : catalog_now());
		sqlite3_bind_int64(st, 2, a->uid);
		sqlite3_bind_text(st, 3, a->user, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 4, a->action, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 5, a->target, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 6, a->old_value, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 7, a->new_value, -1, SQLITE_STATIC);
		rc = sqlite3_step(st);
	}
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "audit add");
	sqlite3_finalize(st);
	return ret;
}

int catalog_audit_list(struct catalog *cat, int64_t after_id,
		       catalog_audit_cb cb, void *arg)
{
	struct catalog_audit a;
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	rc = sqlite3_prepare_v2(cat->db,
				"SELECT id, at, uid, user, action, target,"
				" old_value, new_value FROM audit"
				" WHERE id > ? ORDER BY id",
				-1, &st, NULL);
	if (rc != SQLITE_OK) {
		ret = catalog_sqlerr(cat->db, rc, "prepare audit list");
		goto out;
	}
	sqlite3_bind_int64(st, 1, after_id);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		a.id = sqlite3_column_int64(st, 0);
		a.when = sqlite3_column_int64(st, 1);
		a.uid = (uint32_t)sqlite3_column_int64(st, 2);
		a.user = (const char *)sqlite3_column_text(st, 3);
		a.action = (const char *)sqlite3_column_text(st, 4);
		a.target = (const char *)sqlite3_column_text(st, 5);
		a.old_value = (const char *)sqlite3_column_text(st, 6);
		a.new_value = (const char *)sqlite3_column_text(st, 7);
		ret = cb(arg, &a);
		if (ret)
			goto out;
	}
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "audit list");
out:
	sqlite3_finalize(st);
	return ret;
}
