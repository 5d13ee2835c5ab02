// SPDX-License-Identifier: MIT
/*
 * catalog_ckpt: the table of checkpoint files this node published (schema
 * 8, see include/dstage/catalog.h). Part of the catalog: one connection, no
 * lock of its own. A rename or a forget of a directory changes every row
 * below it in one BEGIN IMMEDIATE transaction, so a reader sees the tree
 * before or after, never half of it.
 *
 * Rows below a directory "d/" are those whose key lies in ["d/", "d0"):
 * '0' is the byte after '/', so the range is exactly the keys that start
 * with "d/", found on the primary key's index without a LIKE (whose
 * wildcards a key may contain).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "catalog_i.h"
#include "dstage/keypath.h"
#include "dstage/log.h"

static bool catalog_ckpt_key_ok(const char *key)
{
	size_t len = key ? strlen(key) : 0;

	return len && len <= KEYPATH_KEY_MAX;
}

int catalog_ckpt_record(struct catalog *cat, const char *store, const char *key,
			const char *sha256, uint64_t size, const char *etag)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	if (!store || !catalog_ckpt_key_ok(key) || !sha256 ||
	    strlen(sha256) != 64 || strspn(sha256, "0123456789abcdef") != 64)
		return -EINVAL;
	rc = sqlite3_prepare_v2(cat->db,
				"INSERT OR REPLACE INTO checkpoint_files(store,"
				" key, sha256, size, etag, published)"
				" VALUES(?, ?, ?, ?, ?, ?)",
				-1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_text(st, 1, store, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, sha256, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 4, (sqlite3_int64)size);
		sqlite3_bind_text(st, 5, etag ? etag : "", -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 6, timeutil_real_s());
		rc = sqlite3_step(st);
	}
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "checkpoint file record");
	sqlite3_finalize(st);
	return ret;
}

int catalog_ckpt_get(struct catalog *cat, const char *store, const char *key,
		     struct catalog_ckpt *out)
{
	sqlite3_stmt *st = NULL;
	const char *s;
	int rc, ret = 0;

	if (!store || !catalog_ckpt_key_ok(key))
		return -EINVAL;
	rc = sqlite3_prepare_v2(cat->db,
				"SELECT sha256, size, etag, published"
				" FROM checkpoint_files WHERE store = ?"
				" AND key = ?",
				-1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_text(st, 1, store, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
		rc = sqlite3_step(st);
	}
	if (rc == SQLITE_ROW) {
		memset(out, 0, sizeof(*out));
		s = (const char *)sqlite3_column_text(st, 0);
		snprintf(out->sha256, sizeof(out->sha256), "%s", s ? s : "");
		out->size = (uint64_t)sqlite3_column_int64(st, 1);
		s = (const char *)sqlite3_column_text(st, 2);
		snprintf(out->etag, sizeof(out->etag), "%s", s ? s : "");
		out->published = sqlite3_column_int64(st, 3);
	} else if (rc == SQLITE_DONE) {
		ret = -ENOENT;
	} else {
		ret = catalog_sqlerr(cat->db, rc, "checkpoint file lookup");
	}
	sqlite3_finalize(st);
	return ret;
}

/* "key/" and "key0" into lo and hi (KEYPATH_MAX + 1 bytes each). */
static void catalog_ckpt_range(const char *key, char *lo, char *hi)
{
	snprintf(lo, KEYPATH_MAX + 1, "%s/", key);
	snprintf(hi, KEYPATH_MAX + 1, "%s0", key);
}

/* Run sql with args[0..n) bound as text; 0 or the logged -errno. */
static int catalog_ckpt_run(struct catalog *cat, const char *sql,
			    const char *const *args, int n, const char *what)
{
	sqlite3_stmt *st = NULL;
	int rc, ret = 0;

	rc = sqlite3_prepare_v2(cat->db, sql, -1, &st, NULL);
	for (int i = 0; rc == SQLITE_OK && i < n; i++)
		rc = sqlite3_bind_text(st, i + 1, args[i], -1, SQLITE_STATIC);
	if (rc == SQLITE_OK)
		rc = sqlite3_step(st);
	if (rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, what);
	sqlite3_finalize(st);
	return ret;
}

int catalog_ckpt_forget(struct catalog *cat, const char *store, const char *key)
{
	char lo[KEYPATH_MAX + 1], hi[KEYPATH_MAX + 1];
	const char *args[4];

	if (!store || !catalog_ckpt_key_ok(key))
		return -EINVAL;
	catalog_ckpt_range(key, lo, hi);
	args[0] = store;
	args[1] = key;
	args[2] = lo;
	args[3] = hi;
	return catalog_ckpt_run(cat,
				"DELETE FROM checkpoint_files WHERE store = ?1"
				" AND (key = ?2 OR (key >= ?3 AND key < ?4))",
				args, 4, "checkpoint file forget");
}

int catalog_ckpt_rename(struct catalog *cat, const char *store,
			const char *from, const char *to)
{
	char lo[KEYPATH_MAX + 1], hi[KEYPATH_MAX + 1];
	const char *args[5];
	int ret;

	if (!store || !catalog_ckpt_key_ok(from) || !catalog_ckpt_key_ok(to))
		return -EINVAL;
	if (!strcmp(from, to))
		return 0;
	ret = catalog_exec(cat->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	/* What to had (a file, or a directory's files) is replaced. */
	ret = catalog_ckpt_forget(cat, store, to);
	if (ret)
		goto err;
	catalog_ckpt_range(from, lo, hi);
	args[0] = store;
	args[1] = from;
	args[2] = lo;
	args[3] = hi;
	args[4] = to;
	/* "from/x" becomes "to/x": the bytes after from's (substr of a
	 * blob counts bytes, of text characters). */
	ret = catalog_ckpt_run(cat,
			       "UPDATE checkpoint_files SET key = ?5 ||"
			       " CAST(substr(CAST(key AS BLOB),"
			       " length(CAST(?2 AS BLOB)) + 1) AS TEXT)"
			       " WHERE store = ?1 AND (key = ?2 OR"
			       " (key >= ?3 AND key < ?4))",
			       args, 5, "checkpoint file rename");
	if (ret)
		goto err;
	return catalog_exec(cat->db, "COMMIT");
err:
	catalog_rollback(cat->db);
	return ret;
}
