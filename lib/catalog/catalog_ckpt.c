// SPDX-License-Identifier: MIT
/*
 * catalog_ckpt: the table of checkpoint files this node published (schema
 * 8, see include/dstage/catalog.h). Part of the catalog: one connection, no
 * lock of its own. A rename or a forget of a directory changes every row
 * below it in one BEGIN IMMEDIATE transaction, so a reader sees the tree
 * before or after, never half of it.
 *
 * catalog_ckpt_log (below) is the record's writer for ckpt's hooks: it
 * has its own connection, opened at the first change, under its lock.
 *
 * Rows below a directory "d/" are those whose key lies in ["d/", "d0"):
 * '0' is the byte after '/', so the range is exactly the keys that start
 * with "d/", found on the primary key's index without a LIKE (whose
 * wildcards a key may contain).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "catalog_i.h"
#include "dstage/ckpt.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"

static bool catalog_ckpt_key_ok(const char *key)
{
	size_t len = key ? strlen(key) : 0;

	return len && len <= KEYPATH_KEY_MAX;
}

int catalog_ckpt_record(struct catalog *cat, const char *store, const char *key,
			const char *sha256, uint64_t size, const char *etag,
			int64_t uid)
{
	if (!store || !catalog_ckpt_key_ok(key) || !sha256 ||
	    strlen(sha256) != 64 || strspn(sha256, "0123456789abcdef") != 64)
		return -EINVAL;
	return catalog_run(cat, "checkpoint file record",
			   "INSERT OR REPLACE INTO checkpoint_files(store,"
			   " key, sha256, size, etag, published, uid)"
			   " VALUES(?, ?, ?, ?, ?, ?, nullif(?, -1))",
			   CATALOG_ARGS(CATALOG_TEXT(store), CATALOG_TEXT(key),
					CATALOG_TEXT(sha256), CATALOG_INT(size),
					CATALOG_TEXT(etag ? etag : ""),
					CATALOG_INT(timeutil_real_s()),
					CATALOG_INT(uid < 0 ? -1 : uid)),
			   NULL);
}

int catalog_ckpt_get(struct catalog *cat, const char *store, const char *key,
		     struct catalog_ckpt *out)
{
	sqlite3_stmt *st;
	const char *s;
	int ret;

	if (!store || !catalog_ckpt_key_ok(key))
		return -EINVAL;
	ret = catalog_prepare(
		cat, "checkpoint file lookup",
		"SELECT sha256, size, etag, published, ifnull(uid, -1)"
		" FROM checkpoint_files WHERE store = ?"
		" AND key = ?",
		CATALOG_ARGS(CATALOG_TEXT(store), CATALOG_TEXT(key)), &st);
	if (ret)
		return ret;
	ret = catalog_step(cat, st, "checkpoint file lookup");
	if (ret)
		goto out;
	memset(out, 0, sizeof(*out));
	s = (const char *)sqlite3_column_text(st, 0);
	snprintf(out->sha256, sizeof(out->sha256), "%s", s ? s : "");
	out->size = (uint64_t)sqlite3_column_int64(st, 1);
	s = (const char *)sqlite3_column_text(st, 2);
	snprintf(out->etag, sizeof(out->etag), "%s", s ? s : "");
	out->published = sqlite3_column_int64(st, 3);
	out->uid = sqlite3_column_int64(st, 4);
out:
	sqlite3_finalize(st);
	return ret;
}

int catalog_ckpt_each(struct catalog *cat, const char *store,
		      catalog_ckpt_each_cb cb, void *arg)
{
	sqlite3_stmt *st;
	int ret, rc;

	if (!store)
		return -EINVAL;
	ret = catalog_prepare(cat, "checkpoint file owners",
			      "SELECT key, uid, size FROM checkpoint_files"
			      " WHERE store = ? AND uid IS NOT NULL"
			      " ORDER BY key",
			      CATALOG_ARGS(CATALOG_TEXT(store)), &st);
	if (ret)
		return ret;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *key = (const char *)sqlite3_column_text(st, 0);

		ret = key ? cb(arg, key, sqlite3_column_int64(st, 1),
			       (uint64_t)sqlite3_column_int64(st, 2))
			  : 0;
		if (ret)
			break;
	}
	if (!ret && rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "checkpoint file owners");
	sqlite3_finalize(st);
	return ret;
}

/* "key/" and "key0" into lo and hi (KEYPATH_MAX + 1 bytes each). */
static void catalog_ckpt_range(const char *key, char *lo, char *hi)
{
	snprintf(lo, KEYPATH_MAX + 1, "%s/", key);
	snprintf(hi, KEYPATH_MAX + 1, "%s0", key);
}

int catalog_ckpt_forget(struct catalog *cat, const char *store, const char *key)
{
	char lo[KEYPATH_MAX + 1], hi[KEYPATH_MAX + 1];

	if (!store || !catalog_ckpt_key_ok(key))
		return -EINVAL;
	catalog_ckpt_range(key, lo, hi);
	return catalog_run(cat, "checkpoint file forget",
			   "DELETE FROM checkpoint_files WHERE store = ?1"
			   " AND (key = ?2 OR (key >= ?3 AND key < ?4))",
			   CATALOG_ARGS(CATALOG_TEXT(store), CATALOG_TEXT(key),
					CATALOG_TEXT(lo), CATALOG_TEXT(hi)),
			   NULL);
}

int catalog_ckpt_rename(struct catalog *cat, const char *store,
			const char *from, const char *to)
{
	char lo[KEYPATH_MAX + 1], hi[KEYPATH_MAX + 1];
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
	/* "from/x" becomes "to/x": the bytes after from's (substr of a
	 * blob counts bytes, of text characters). */
	ret = catalog_run(cat, "checkpoint file rename",
			  "UPDATE checkpoint_files SET key = ?5 ||"
			  " CAST(substr(CAST(key AS BLOB),"
			  " length(CAST(?2 AS BLOB)) + 1) AS TEXT)"
			  " WHERE store = ?1 AND (key = ?2 OR"
			  " (key >= ?3 AND key < ?4))",
			  CATALOG_ARGS(CATALOG_TEXT(store), CATALOG_TEXT(from),
				       CATALOG_TEXT(lo), CATALOG_TEXT(hi),
				       CATALOG_TEXT(to)),
			  NULL);
	if (ret)
		goto err;
	return catalog_exec(cat->db, "COMMIT");
err:
	catalog_rollback(cat->db);
	return ret;
}

void catalog_ckpt_published(struct catalog *cat, const char *store,
			    const char *key, const char *sha256, uint64_t size,
			    const char *etag, int64_t uid)
{
	if (cat &&
	    catalog_ckpt_record(cat, store, key, sha256, size, etag, uid))
		log_warn("checkpoints: %s is published to %s, but its SHA-256 "
			 "could not be recorded in the catalog",
			 key, store);
}

/* ---- the record's writer for ckpt's hooks ---- */

struct catalog_ckpt_log {
	/* A leaf: taken inside ckpt's locks (the hooks), takes none. */
	pthread_mutex_t lock;
	char *path; /* immutable; NULL: no record */
	struct catalog *cat; /* lock: NULL until the first change */
	bool failed; /* lock: the open failed once (logged) */
};

int catalog_ckpt_log_new(const char *path, struct catalog_ckpt_log **out)
{
	struct catalog_ckpt_log *l = calloc(1, sizeof(*l));

	*out = NULL;
	if (!l)
		return -ENOMEM;
	if (path) {
		l->path = strdup(path);
		if (!l->path) {
			free(l);
			return -ENOMEM;
		}
	}
	pthread_mutex_init(&l->lock, NULL);
	*out = l;
	return 0;
}

void catalog_ckpt_log_free(struct catalog_ckpt_log *l)
{
	if (!l)
		return;
	catalog_close(l->cat);
	pthread_mutex_destroy(&l->lock);
	free(l->path);
	free(l);
}

/* l's connection (l->lock held), NULL when it cannot be opened (logged
 * once: the store still gets every file). */
static struct catalog *catalog_ckpt_log_cat(struct catalog_ckpt_log *l)
{
	int ret;

	if (l->cat || l->failed || !l->path)
		return l->cat;
	ret = catalog_open(l->path, CATALOG_CREATE, &l->cat);
	if (ret) {
		l->cat = NULL;
		l->failed = true;
		log_error("checkpoints: cannot open the catalog %s to record "
			  "the SHA-256 of published files: %s; the store's "
			  "records (sidecar, x-amz-meta-sha256) stay the only "
			  "ones",
			  l->path, strerror(-ret));
	}
	return l->cat;
}

static void catalog_ckpt_log_published(void *arg, const char *store,
				       const char *key, const char *sha256,
				       uint64_t size, const char *etag,
				       uid_t uid)
{
	struct catalog_ckpt_log *l = arg;

	pthread_mutex_lock(&l->lock);
	catalog_ckpt_published(catalog_ckpt_log_cat(l), store, key, sha256,
			       size, etag, (int64_t)uid);
	pthread_mutex_unlock(&l->lock);
}

struct catalog_ckpt_census {
	ckpt_census_cb cb;
	void *ctx;
};

static int catalog_ckpt_census_row(void *arg, const char *key, int64_t uid,
				   uint64_t size)
{
	struct catalog_ckpt_census *c = arg;

	if (uid >= 0 && uid <= (int64_t)(uid_t)-1)
		c->cb(c->ctx, key, (uid_t)uid, size);
	return 0;
}

static int catalog_ckpt_log_census(void *arg, const char *store,
				   ckpt_census_cb cb, void *ctx)
{
	struct catalog_ckpt_log *l = arg;
	struct catalog_ckpt_census c = { cb, ctx };
	struct catalog *cat;
	int ret = 0;

	pthread_mutex_lock(&l->lock);
	cat = catalog_ckpt_log_cat(l);
	if (cat)
		ret = catalog_ckpt_each(cat, store, catalog_ckpt_census_row,
					&c);
	pthread_mutex_unlock(&l->lock);
	return ret;
}

static void catalog_ckpt_log_renamed(void *arg, const char *store,
				     const char *from, const char *to)
{
	struct catalog_ckpt_log *l = arg;
	struct catalog *cat;

	pthread_mutex_lock(&l->lock);
	cat = catalog_ckpt_log_cat(l);
	if (cat && catalog_ckpt_rename(cat, store, from, to))
		log_warn("checkpoints: %s was renamed to %s, but not in the "
			 "catalog's record",
			 from, to);
	pthread_mutex_unlock(&l->lock);
}

static void catalog_ckpt_log_removed(void *arg, const char *store,
				     const char *key)
{
	struct catalog_ckpt_log *l = arg;
	struct catalog *cat;

	pthread_mutex_lock(&l->lock);
	cat = catalog_ckpt_log_cat(l);
	if (cat && catalog_ckpt_forget(cat, store, key))
		log_warn("checkpoints: %s was removed, but not from the "
			 "catalog's record",
			 key);
	pthread_mutex_unlock(&l->lock);
}

void catalog_ckpt_log_hooks(struct catalog_ckpt_log *l, struct ckpt_hooks *h)
{
	*h = (struct ckpt_hooks){ 0 };
	h->published = catalog_ckpt_log_published;
	h->census = catalog_ckpt_log_census;
	h->renamed = catalog_ckpt_log_renamed;
	h->removed = catalog_ckpt_log_removed;
	h->arg = l;
}
