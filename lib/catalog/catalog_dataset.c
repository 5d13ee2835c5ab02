// SPDX-License-Identifier: MIT
/*
 * catalog_dataset: datasets (add, get, list, set, remove), the purge of
 * dead manifests, and reads of the current manifest (lookup, readdir).
 * The state machines are described at the top of catalog.c; like every
 * catalog file, this one keeps no state of its own beyond the connection.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "catalog_i.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"

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
	ds->shared_tier = (char *)sqlite3_column_text(st, 15);
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
	ret = catalog_prepare(cat, "dataset add",
			      "INSERT INTO datasets(name, source, state,"
			      " owner_group, created) VALUES(?, ?, 0, ?, ?)",
			      CATALOG_ARGS(CATALOG_TEXT(name),
					   CATALOG_TEXT(source),
					   CATALOG_TEXT(group),
					   CATALOG_INT(timeutil_real_s())),
			      &st);
	if (ret)
		return ret;
	rc = sqlite3_step(st);
	if (rc == SQLITE_CONSTRAINT_UNIQUE)
		ret = -EEXIST;
	else if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "dataset add");
	sqlite3_finalize(st);
	return ret;
}

int catalog_dataset_get(struct catalog *cat, const char *name,
			struct catalog_dataset *ds)
{
	struct catalog_dataset row;
	sqlite3_stmt *st;
	bool oom = false;
	int ret;

	memset(ds, 0, sizeof(*ds));
	ret = catalog_stmt_row(cat, ST_DS_GET, "dataset get",
			       CATALOG_ARGS(CATALOG_TEXT(name)), &st);
	if (ret)
		return ret;
	catalog_ds_fill(st, &row);
	*ds = row;
	ds->name = catalog_col_dup(st, 1, &oom);
	ds->source = catalog_col_dup(st, 2, &oom);
	ds->group = catalog_col_dup(st, 7, &oom);
	ds->sums_key = catalog_col_dup(st, 14, &oom);
	ds->shared_tier = catalog_col_dup(st, 15, &oom);
	if (oom) {
		catalog_dataset_release(ds);
		ret = -ENOMEM;
	}
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
	free(ds->shared_tier);
	ds->name = ds->source = ds->group = ds->sums_key = NULL;
	ds->shared_tier = NULL;
}

/* catalog_each's row function of catalog_dataset_list. */
static int catalog_dataset_row(void *arg, sqlite3_stmt *st)
{
	const struct catalog_each_cb *e = arg;
	struct catalog_dataset ds;

	catalog_ds_fill(st, &ds);
	return e->fn.dataset(e->arg, &ds);
}

int catalog_dataset_list(struct catalog *cat, catalog_dataset_cb cb, void *arg)
{
	struct catalog_each_cb e = { .fn.dataset = cb, .arg = arg };

	return catalog_each(cat, "dataset list",
			    "SELECT " DS_COLS "WHERE d.state <> 2"
			    " ORDER BY d.name",
			    NULL, 0, catalog_dataset_row, &e);
}

/* UPDATE datasets SET <col> = value for a visible dataset. */
static int catalog_dataset_set(struct catalog *cat, const char *name,
			       const char *sql, sqlite3_int64 ival,
			       const char *sval, bool is_text)
{
	const struct catalog_arg args[] = {
		is_text ? CATALOG_TEXT(sval) : CATALOG_INT(ival),
		CATALOG_TEXT(name),
	};
	int n = 0, ret;

	ret = catalog_run(cat, sql, sql, args, 2, &n);
	return ret ? ret : n == 0 ? -ENOENT : 0;
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

int catalog_dataset_set_shared_tier(struct catalog *cat, const char *name,
				    const char *dir)
{
	const char *path = dir;

	if (dir && strncmp(dir, "file://", 7) == 0)
		path = dir + 7;
	if (dir && *dir && (path[0] != '/' || strlen(dir) >= PATH_MAX)) {
		log_error("catalog: dataset %s: bad shared tier '%.200s': "
			  "an absolute directory (/DIR or file:///DIR/) of "
			  "under %d bytes is needed",
			  name, dir, PATH_MAX);
		return -EINVAL;
	}
	return catalog_dataset_set(cat, name, DS_SET("shared_tier"), 0,
				   dir && *dir ? dir : NULL, true);
}

/* Delete one manifest in batches of CATALOG_BATCH rows (autocommit), letting
 * the waiting writers in between batches (catalog_yield). */
static int catalog_manifest_purge(struct catalog *cat, int64_t mf_id)
{
	static const enum catalog_st steps[] = { ST_PURGE_OBJECTS,
						 ST_PURGE_DIRS };
	int changes, ret;

	for (size_t i = 0; i < 2; i++) {
		for (;;) {
			ret = catalog_stmt_run(
				cat, steps[i], "purge manifest",
				CATALOG_ARGS(CATALOG_INT(mf_id),
					     CATALOG_INT(CATALOG_BATCH)),
				&changes);
			if (ret)
				return ret;
			if (changes < CATALOG_BATCH)
				break; /* that was the last batch */
			catalog_yield();
		}
	}
	return catalog_stmt_run(cat, ST_PURGE_MANIFEST, "purge manifest",
				CATALOG_ARGS(CATALOG_INT(mf_id)), NULL);
}

/* Purge every DEAD manifest of a dataset. */
int catalog_dataset_purge_dead(struct catalog *cat, int64_t ds_id)
{
	sqlite3_stmt *st;
	int64_t mf_id;
	int ret;

	for (;;) {
		ret = catalog_stmt_row(cat, ST_DEAD_MANIFEST,
				       "find dead manifest",
				       CATALOG_ARGS(CATALOG_INT(ds_id)), &st);
		if (ret)
			return ret == -ENOENT ? 0 : ret;
		mf_id = sqlite3_column_int64(st, 0);
		catalog_stmt_done(st);
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
int catalog_dataset_id(struct catalog *cat, const char *name, int64_t *id,
		       int *state, char *sums_key)
{
	sqlite3_stmt *st;
	const char *key;
	int ret;

	ret = catalog_stmt_row(cat, ST_DS_ID, "dataset id",
			       CATALOG_ARGS(CATALOG_TEXT(name)), &st);
	if (ret)
		return ret;
	*id = sqlite3_column_int64(st, 0);
	*state = sqlite3_column_int(st, 1);
	key = (const char *)sqlite3_column_text(st, 2);
	if (sums_key && (!key || keypath_check(key, strlen(key), NULL))) {
		log_error("catalog: dataset %s: unusable sums key in the "
			  "catalog",
			  name);
		ret = -EUCLEAN;
	} else if (sums_key) {
		memcpy(sums_key, key, strlen(key) + 1);
	}
	catalog_stmt_done(st);
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
	ret = catalog_dataset_purge_dead(cat, id);
	if (ret)
		return ret;
	return catalog_exec_id(cat, "DELETE FROM datasets WHERE id = ?", id,
			       NULL);
err:
	catalog_rollback(cat->db);
	return ret;
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
	sqlite3_stmt *st;
	int ret;

	ret = catalog_stmt_row(
		cat, ST_LOOKUP, "lookup",
		CATALOG_ARGS(CATALOG_TEXT(dataset), CATALOG_TEXT(path)), &st);
	if (ret)
		return ret;
	*mf_id = sqlite3_column_int64(st, 0);
	catalog_entry_fill(st, 1, e);
	catalog_stmt_done(st);
	return 0;
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
	int64_t mf_id = 0, dir_mtime; /* mf_id: set by catalog_lookup_mf */
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
	int n = 0, ret;

	ret = catalog_run(cat, "set actual sha256",
			  "UPDATE objects SET actual_sha256 = ?2,"
			  " verified_at = ?3 WHERE id = ?1",
			  CATALOG_ARGS(CATALOG_INT(object_id),
				       CATALOG_BLOB(sha256, 32),
				       CATALOG_INT(when)),
			  &n);
	return ret ? ret : n == 0 ? -ENOENT : 0;
}
