/* SPDX-License-Identifier: MIT */
/*
 * catalogtest.h: what the catalog's unit tests share (test_catalog.c,
 * test_catalog_register.c, test_catalog_dataset.c, test_catalog_ckpt.c):
 * a scratch directory with the catalog file's path, a fake registration
 * source, and helpers that list a directory or read one number with SQL.
 * Include after check.h.
 */
#ifndef DSTAGE_TEST_CATALOGTEST_H
#define DSTAGE_TEST_CATALOGTEST_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalog/catalog_i.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

/* The scratch directory (catalogtest_init) and dir/catalog.db in it. */
static char dir[64];
static char dbpath[128];

/* ---- a fake source: keys from an array or a generator ---- */

struct fake {
	const char *const *keys; /* NULL-terminated, or NULL */
	size_t gen; /* else: this many generated keys */
	const char *gen_prefix; /* keys <prefix>NNNN/NNNNNNN */
	const char *sums; /* body of the sums key */
	const char *sums_key; /* NULL: SHA256SUMS */
	int fail_at; /* >= 0: return -EIO before key N */
	uint64_t size; /* non-zero: every key's size */
	void (*hook)(struct fake *f, size_t i); /* before key i */
	size_t hook_at;
};

static inline const char *fake_sums_key(const struct fake *f)
{
	return f->sums_key ? f->sums_key : "SHA256SUMS";
}

static inline int fake_list(void *arg, objstore_list_cb cb, void *cb_arg)
{
	struct fake *f = arg;
	struct objstore_info oi;
	char key[128];
	int ret;

	for (size_t i = 0;; i++) {
		memset(&oi, 0, sizeof(oi));
		if (f->keys) {
			if (!f->keys[i])
				break;
			oi.key = f->keys[i];
		} else {
			if (i == f->gen)
				break;
			snprintf(key, sizeof(key), "%s%04zu/%07zu",
				 f->gen_prefix, i / 1000, i % 1000);
			oi.key = key;
		}
		if (f->fail_at >= 0 && (size_t)f->fail_at == i)
			return -EIO;
		if (f->hook && f->hook_at == i)
			f->hook(f, i);
		oi.size = strcmp(oi.key, fake_sums_key(f)) == 0 && f->sums
				  ? strlen(f->sums)
				  : i;
		if (f->size)
			oi.size = f->size;
		snprintf(oi.etag, sizeof(oi.etag), "\"etag-%zu\"", i);
		oi.mtime = 1700000000 + (int64_t)i;
		ret = cb(cb_arg, &oi);
		if (ret)
			return ret;
	}
	return 0;
}

static inline int fake_read(void *arg, const struct objstore_info *oi,
			    struct sha256sums_parser *p)
{
	struct fake *f = arg;

	CHECK_STR(oi->key, fake_sums_key(f));
	if (!f->sums)
		return -ENOENT;
	/* In small pieces, as a streaming reader would. */
	for (size_t off = 0, n = strlen(f->sums); off < n; off += 7) {
		int ret = sha256sums_feed(p, f->sums + off,
					  n - off < 7 ? n - off : 7);
		if (ret)
			return ret;
	}
	return 0;
}

static inline int reg(struct catalog *cat, const char *name, struct fake *f)
{
	struct catalog_source src = { fake_list, fake_read, f };

	return catalog_register_source(cat, name, &src);
}

/* ---- helpers ---- */

struct names {
	char buf[4096];
	size_t n;
	int dirs;
};

static inline int collect(void *arg, const char *name,
			  const struct catalog_entry *e)
{
	struct names *nm = arg;
	size_t len = strlen(nm->buf);

	snprintf(nm->buf + len, sizeof(nm->buf) - len, "%s%s%s", len ? "," : "",
		 name, e->is_dir ? "/" : "");
	nm->n++;
	nm->dirs += e->is_dir;
	return 0;
}

static inline int count_only(void *arg, const char *name,
			     const struct catalog_entry *e)
{
	struct names *nm = arg;

	(void)name;
	(void)e;
	nm->n++;
	return 0;
}

static inline const char *ls(struct catalog *cat, const char *ds, const char *d,
			     const char *after, struct names *nm)
{
	memset(nm, 0, sizeof(*nm));
	if (catalog_readdir(cat, ds, d, after, collect, nm))
		return "(error)";
	return nm->buf;
}

static inline long long sql_int(const char *sql)
{
	sqlite3 *db;
	sqlite3_stmt *st;
	long long v = -1;

	if (sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READONLY, NULL))
		return -1;
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
		if (sqlite3_step(st) == SQLITE_ROW)
			v = sqlite3_column_int64(st, 0);
		sqlite3_finalize(st);
	}
	sqlite3_close(db);
	return v;
}

/* Rows belonging to dataset "ds" (or to no dataset any more). */
#define DS_MANIFESTS                                             \
	"SELECT count(*) FROM manifests WHERE dataset_id NOT IN" \
	" (SELECT id FROM datasets WHERE name <> 'ds')"
#define DS_OBJECTS                                                          \
	"SELECT count(*) FROM objects WHERE manifest_id IN (SELECT id FROM" \
	" manifests WHERE dataset_id NOT IN"                                \
	" (SELECT id FROM datasets WHERE name <> 'ds'))"
#define DS_DIRS                                                          \
	"SELECT count(*) FROM dirs WHERE manifest_id IN (SELECT id FROM" \
	" manifests WHERE dataset_id NOT IN"                             \
	" (SELECT id FROM datasets WHERE name <> 'ds'))"

/* Quiet logs unless DSTAGE_TEST_VERBOSE; make the scratch directory.
 * 0, or 1 (reported) when it cannot be made. */
static inline int catalogtest_init(void)
{
	if (getenv("DSTAGE_TEST_VERBOSE") == NULL)
		log_set_level(LOG_LVL_ERROR);
	snprintf(dir, sizeof(dir), "/tmp/dstage-catalog-XXXXXX");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(dbpath, sizeof(dbpath), "%s/catalog.db", dir);
	return 0;
}

/* Remove the scratch directory; the test's exit status (check_result). */
static inline int catalogtest_done(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return check_result();
}

#endif
