// SPDX-License-Identifier: MIT
/*
 * catalog (catalog.c, catalog_file.c): open and its errors, the file's
 * modes, migration from every earlier version, policy and audit.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

#include "catalogtest.h"

/* The mode bits of path, or -1 when it is missing. */
static int mode_of(const char *path)
{
	struct stat st;

	if (lstat(path, &st))
		return -1;
	return (int)(st.st_mode & 07777);
}

/* Every file of a catalog 0600; looser ones tightened at open; a
 * directory others may write, or a link in place of a file, refused. */
static void test_file_modes(void)
{
	char d[128], p[160], f[176];
	struct catalog *cat = NULL;
	mode_t old = umask(022);

	snprintf(d, sizeof(d), "%s/modes", dir);
	CHECK(mkdir(d, 0755) == 0);
	snprintf(p, sizeof(p), "%s/catalog.db", d);
	CHECK_INT(catalog_open(p, CATALOG_CREATE, &cat), 0);
	CHECK_INT(catalog_dataset_add(cat, "m", "file:///x", NULL), 0);
	/* all three exist while the connection is open */
	CHECK_INT(mode_of(p), 0600);
	snprintf(f, sizeof(f), "%s-wal", p);
	CHECK_INT(mode_of(f), 0600);
	snprintf(f, sizeof(f), "%s-shm", p);
	CHECK_INT(mode_of(f), 0600);
	catalog_close(cat);

	/* Existing loose files are tightened at open; 0640 is kept. */
	CHECK(chmod(p, 0644) == 0);
	snprintf(f, sizeof(f), "%s-wal", p);
	if (mode_of(f) >= 0)
		CHECK(chmod(f, 0666) == 0);
	CHECK_INT(catalog_open(p, CATALOG_READONLY, &cat), 0);
	catalog_close(cat);
	CHECK_INT(mode_of(p), 0600);
	CHECK(mode_of(f) == -1 || mode_of(f) == 0600);
	CHECK(chmod(p, 0640) == 0);
	CHECK_INT(catalog_open(p, 0, &cat), 0);
	catalog_close(cat);
	CHECK_INT(mode_of(p), 0640);
	CHECK(chmod(p, 0600) == 0);

	/* A directory group or others may write: refused, file untouched. */
	CHECK(chmod(d, 0775) == 0);
	CHECK_INT(catalog_open(p, 0, &cat), -EACCES);
	CHECK(cat == NULL);
	CHECK(chmod(d, 01777) == 0);
	CHECK_INT(catalog_open(p, CATALOG_READONLY, &cat), -EACCES);
	snprintf(f, sizeof(f), "%s/new.db", d);
	CHECK_INT(catalog_open(f, CATALOG_CREATE, &cat), -EACCES);
	CHECK_INT(mode_of(f), -1);
	CHECK(chmod(d, 0700) == 0);

	/* A link in place of the database or its WAL index: refused. */
	snprintf(f, sizeof(f), "%s/link.db", d);
	CHECK(symlink(p, f) == 0);
	CHECK_INT(catalog_open(f, 0, &cat), -ELOOP);
	CHECK(cat == NULL);
	umask(old);
}

static void test_open_errors(void)
{
	struct catalog *cat = NULL;
	char p[160];
	sqlite3 *db;
	int fd;

	snprintf(p, sizeof(p), "%s/missing.db", dir);
	CHECK_INT(catalog_open(p, 0, &cat), -ENOENT);
	CHECK(cat == NULL);

	snprintf(p, sizeof(p), "%s/garbage.db", dir);
	fd = open(p, O_CREAT | O_WRONLY, 0600);
	CHECK(fd >= 0);
	for (int i = 0; i < 64; i++)
		CHECK(write(fd, "this is not a database!!", 24) == 24);
	close(fd);
	CHECK_INT(catalog_open(p, 0, &cat), -EUCLEAN);

	/* A schema newer than this program. */
	snprintf(p, sizeof(p), "%s/future.db", dir);
	CHECK(sqlite3_open(p, &db) == SQLITE_OK);
	CHECK(sqlite3_exec(db, "PRAGMA user_version = 99", 0, 0, 0) == 0);
	sqlite3_close(db);
	CHECK_INT(catalog_open(p, 0, &cat), -EPROTO);

	/* Read-only open of an old schema cannot migrate. */
	snprintf(p, sizeof(p), "%s/v1ro.db", dir);
	CHECK(sqlite3_open(p, &db) == SQLITE_OK);
	CHECK_INT(catalog_migrate(db, 1), 0);
	sqlite3_close(db);
	CHECK_INT(catalog_open(p, CATALOG_READONLY, &cat), -EPROTO);
	CHECK_INT(catalog_open(p, 0, &cat), 0);
	CHECK_INT(catalog_schema_version(cat), CATALOG_SCHEMA_VERSION);
	catalog_close(cat);
	catalog_close(NULL);
}

/*
 * Make dir/name a catalog at schema version v holding the rows of sql, check
 * that what version v + 1 adds is not there yet (the statement later fails),
 * then open it (which migrates it to the current version). Returns the
 * catalog or NULL (a failure is recorded); path receives the file's path.
 */
static struct catalog *migrated(const char *name, int v, const char *sql,
				const char *later, char *path, size_t plen)
{
	struct catalog *cat = NULL;
	sqlite3 *db;

	snprintf(path, plen, "%s/%s", dir, name);
	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	CHECK_INT(catalog_migrate(db, v), 0);
	CHECK(sqlite3_exec(db, sql, 0, 0, 0) == SQLITE_OK);
	if (later)
		CHECK(sqlite3_exec(db, later, 0, 0, 0) != SQLITE_OK);
	sqlite3_close(db);
	CHECK_INT(catalog_open(path, 0, &cat), 0);
	if (cat)
		CHECK_INT(catalog_schema_version(cat), CATALOG_SCHEMA_VERSION);
	return cat;
}

/* Run setup (may be NULL) on the file at path, then check that query's
 * first row is (a, b). */
static void check_row(const char *path, const char *setup, const char *query,
		      const char *a, const char *b)
{
	sqlite3_stmt *st = NULL;
	sqlite3 *db;

	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	if (setup)
		CHECK(sqlite3_exec(db, setup, 0, 0, 0) == SQLITE_OK);
	CHECK(sqlite3_prepare_v2(db, query, -1, &st, NULL) == SQLITE_OK);
	CHECK(sqlite3_step(st) == SQLITE_ROW);
	CHECK_STR((const char *)sqlite3_column_text(st, 0), a);
	CHECK_STR((const char *)sqlite3_column_text(st, 1), b);
	sqlite3_finalize(st);
	sqlite3_close(db);
}

static void test_migrate_v1(void)
{
	struct catalog_dataset ds;
	struct catalog_entry e;
	struct catalog *cat;
	struct names nm;
	char p[160];

	cat = migrated("v1.db", 1,
		       "INSERT INTO datasets VALUES"
		       " (7, 'old', 'file:///srv/old', 1, 100),"
		       " (8, 'fresh', 's3://b/p/', 0, 200);"
		       "INSERT INTO objects VALUES"
		       " (41, 7, 'a/b/c.bin', 1000, '\"e1\"', 5),"
		       " (42, 7, 'a/d.txt', 10, NULL, NULL),"
		       " (43, 7, 'top', 0, '\"e3\"', 6);",
		       NULL, p, sizeof(p));
	if (!cat)
		return;
	CHECK_INT(catalog_dataset_get(cat, "old", &ds), 0);
	CHECK_INT(ds.version, 1);
	CHECK_INT(ds.state, CATALOG_DS_READY);
	CHECK_INT(ds.objects, 3);
	CHECK_INT(ds.bytes, 1010);
	CHECK_INT(ds.created, 100);
	CHECK_STR(ds.source, "file:///srv/old");
	CHECK(!ds.pinned && ds.quota == 0 && ds.group == NULL);
	CHECK_STR(ds.sums_key, "SHA256SUMS");
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_dataset_get(cat, "fresh", &ds), 0);
	CHECK_INT(ds.state, CATALOG_DS_NEW);
	CHECK_INT(ds.version, 0);
	CHECK_STR(ds.sums_key, "SHA256SUMS");
	catalog_dataset_release(&ds);

	CHECK_INT(catalog_lookup(cat, "old", "a/b/c.bin", &e), 0);
	CHECK_INT(e.id, 41);
	CHECK_INT(e.size, 1000);
	CHECK_STR(e.etag, "\"e1\"");
	CHECK_INT(e.mtime, 5);
	CHECK_INT(catalog_lookup(cat, "old", "a/d.txt", &e), 0);
	CHECK_STR(e.etag, "");
	CHECK_INT(catalog_lookup(cat, "old", "a/b", &e), 0);
	CHECK(e.is_dir);
	CHECK_STR(ls(cat, "old", "", NULL, &nm), "a/,top");
	CHECK_STR(ls(cat, "old", "a", NULL, &nm), "b/,d.txt");
	CHECK_STR(ls(cat, "old", "a/b", NULL, &nm), "c.bin");
	catalog_close(cat);
}

/* v2 -> v3 -> v4: jobs and their new argument table; a dataset. */
static void test_migrate_v2(void)
{
	struct catalog_dataset ds;
	struct catalog *cat;
	char p[160];

	cat = migrated("v2.db", 2,
		       "INSERT INTO datasets(id, name, source, state,"
		       " created, priority) VALUES"
		       " (3, 'two', 's3://b/two/', 0, 10, 2);"
		       "INSERT INTO jobs(id, kind, dataset_id, state,"
		       " created, updated)"
		       " VALUES (5, 'stage', 3, 'queued', 1, 2);",
		       "SELECT * FROM jobs_args", p, sizeof(p));
	if (!cat)
		return;
	CHECK_INT(catalog_dataset_get(cat, "two", &ds), 0);
	CHECK_INT(ds.id, 3);
	CHECK_INT(ds.priority, 2);
	CHECK_STR(ds.source, "s3://b/two/");
	CHECK_STR(ds.sums_key, "SHA256SUMS");
	catalog_dataset_release(&ds);
	catalog_close(cat);
	check_row(p, "INSERT INTO jobs_args VALUES (5, 'parallel=4');",
		  "SELECT kind, state FROM jobs WHERE id = 5", "stage",
		  "queued");
}

/* v9 -> v10: a checkpoint file published before keeps its row, with no
 * owner (-1: uid_store_size's count leaves it out); a new row takes one. */
static void test_migrate_v9(void)
{
	struct catalog_ckpt c;
	struct catalog *cat;
	char p[160], sha[65];

	memset(sha, 'e', 64);
	sha[64] = '\0';
	cat = migrated(
		"v9.db", 9,
		"INSERT INTO checkpoint_files(store, key, sha256, size,"
		" etag, published) VALUES ('file:///s/', 'j/old',"
		" 'eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"
		"eeeeeeeeee', 12, '', 1);",
		"SELECT uid FROM checkpoint_files", p, sizeof(p));
	if (!cat)
		return;
	CHECK_INT(catalog_ckpt_get(cat, "file:///s/", "j/old", &c), 0);
	CHECK(c.size == 12);
	CHECK(c.uid == -1);
	CHECK_INT(catalog_ckpt_record(cat, "file:///s/", "j/new", sha, 3, "",
				      1000),
		  0);
	CHECK_INT(catalog_ckpt_get(cat, "file:///s/", "j/new", &c), 0);
	CHECK(c.uid == 1000);
	catalog_close(cat);
}

/* v3 -> v4: a registered dataset with hashes and a job keeps all of it,
 * and gets the default sums key. */
static void test_migrate_v3(void)
{
	struct catalog_dataset ds;
	struct catalog_entry e;
	struct catalog *cat;
	struct names nm;
	char p[160];

	cat = migrated(
		"v3.db", 3,
		"INSERT INTO datasets(id, name, source, state, created,"
		" pinned, priority, owner_group) VALUES"
		" (9, 'three', 'file:///srv/three/', 1, 300, 1, 5, 'ml'),"
		" (10, 'new', 's3://b/new/', 0, 301, 0, 0, NULL);"
		"INSERT INTO manifests(id, dataset_id, version, state,"
		" created, n_objects, n_bytes, bad_keys)"
		" VALUES (20, 9, 4, 1, 400, 1, 5, 2);"
		"INSERT INTO dirs(manifest_id, path, parent)"
		" VALUES (20, '', NULL), (20, 'd', '');"
		"INSERT INTO objects(id, manifest_id, path, parent, size,"
		" etag, mtime, expected_sha256) VALUES"
		" (61, 20, 'd/f.bin', 'd', 5, '\"e\"', 7, x'2c' ||"
		" zeroblob(31));"
		"INSERT INTO jobs(id, kind, dataset_id, state, created,"
		" updated) VALUES (6, 'verify', 9, 'queued', 1, 2);"
		"INSERT INTO jobs_args VALUES (6, 'mode=source');",
		"SELECT sums_key FROM datasets", p, sizeof(p));
	if (!cat)
		return;
	CHECK_INT(catalog_dataset_get(cat, "three", &ds), 0);
	CHECK_INT(ds.id, 9);
	CHECK_INT(ds.state, CATALOG_DS_READY);
	CHECK_INT(ds.version, 4);
	CHECK_INT(ds.objects, 1);
	CHECK_INT(ds.bytes, 5);
	CHECK_INT(ds.bad_keys, 2);
	CHECK_INT(ds.refreshed, 400);
	CHECK(ds.pinned && ds.priority == 5);
	CHECK_STR(ds.group, "ml");
	CHECK_STR(ds.sums_key, "SHA256SUMS");
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_dataset_get(cat, "new", &ds), 0);
	CHECK_INT(ds.state, CATALOG_DS_NEW);
	CHECK_STR(ds.sums_key, "SHA256SUMS");
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_lookup(cat, "three", "d/f.bin", &e), 0);
	CHECK_INT(e.id, 61);
	CHECK_INT(e.size, 5);
	CHECK_STR(e.etag, "\"e\"");
	CHECK(e.has_expected && e.expected_sha256[0] == 0x2c &&
	      e.expected_sha256[31] == 0);
	CHECK_STR(ls(cat, "three", "", NULL, &nm), "d/");
	/* The new column takes a key, and keeps it across connections. */
	CHECK_INT(catalog_dataset_set_sums_key(cat, "three", "meta/s.txt"), 0);
	catalog_close(cat);
	CHECK_INT(catalog_open(p, 0, &cat), 0);
	if (!cat)
		return;
	CHECK_INT(catalog_dataset_get(cat, "three", &ds), 0);
	CHECK_STR(ds.sums_key, "meta/s.txt");
	/* 8 -> 9: no shared tier of its own until one is set (issue 32) */
	CHECK(ds.shared_tier == NULL);
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_dataset_set_shared_tier(cat, "three", "pfs/t"),
		  -EINVAL);
	CHECK_INT(catalog_dataset_set_shared_tier(cat, "nope", "/pfs/t"),
		  -ENOENT);
	CHECK_INT(
		catalog_dataset_set_shared_tier(cat, "three", "file:///pfs/t/"),
		0);
	CHECK_INT(catalog_dataset_get(cat, "three", &ds), 0);
	CHECK_STR(ds.shared_tier, "file:///pfs/t/");
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_dataset_set_shared_tier(cat, "three", ""), 0);
	CHECK_INT(catalog_dataset_get(cat, "three", &ds), 0);
	CHECK(ds.shared_tier == NULL);
	catalog_dataset_release(&ds);
	catalog_close(cat);
	check_row(p, NULL,
		  "SELECT j.kind, a.args FROM jobs j JOIN"
		  " jobs_args a ON a.job_id = j.id"
		  " WHERE j.id = 6 AND j.dataset_id = 9",
		  "verify", "mode=source");
}

static int list_audit(void *arg, const struct catalog_audit *a)
{
	struct names *nm = arg;
	size_t len = strlen(nm->buf);

	snprintf(nm->buf + len, sizeof(nm->buf) - len, "%s%u:%s:%s:%s->%s",
		 len ? "," : "", a->uid, a->user ? a->user : "-", a->action,
		 a->old_value ? a->old_value : "-",
		 a->new_value ? a->new_value : "-");
	return 0;
}

static void test_policy_audit(struct catalog *cat)
{
	struct catalog_audit a = { .uid = 1000,
				   .user = "ann",
				   .action = "pin",
				   .target = "ds",
				   .old_value = "0",
				   .new_value = "1" };
	struct names nm;
	char buf[32];

	CHECK_INT(catalog_policy_get(cat, "cache.high", buf, sizeof(buf)),
		  -ENOENT);
	CHECK_INT(catalog_policy_set(cat, "cache.high", "90"), 0);
	CHECK_INT(catalog_policy_set(cat, "cache.high", "85"), 0);
	CHECK_INT(catalog_policy_get(cat, "cache.high", buf, sizeof(buf)), 0);
	CHECK_STR(buf, "85");
	CHECK_INT(catalog_policy_get(cat, "cache.high", buf, 2), -ENAMETOOLONG);

	CHECK_INT(catalog_audit_add(cat, &a), 0);
	a.uid = 0;
	a.user = NULL;
	a.action = "policy.set";
	a.old_value = "90";
	a.new_value = "85";
	CHECK_INT(catalog_audit_add(cat, &a), 0);
	a.action = NULL;
	CHECK_INT(catalog_audit_add(cat, &a), -EINVAL);
	memset(&nm, 0, sizeof(nm));
	CHECK_INT(catalog_audit_list(cat, 0, list_audit, &nm), 0);
	CHECK_STR(nm.buf, "1000:ann:pin:0->1,0:-:policy.set:90->85");
	memset(&nm, 0, sizeof(nm));
	CHECK_INT(catalog_audit_list(cat, 1, list_audit, &nm), 0);
	CHECK_STR(nm.buf, "0:-:policy.set:90->85");
}

int main(void)
{
	struct catalog *cat = NULL;

	if (catalogtest_init())
		return 1;
	test_open_errors();
	test_file_modes();
	test_migrate_v1();
	test_migrate_v2();
	test_migrate_v3();
	test_migrate_v9();

	CHECK_INT(catalog_open(dbpath, CATALOG_CREATE, &cat), 0);
	if (cat) {
		CHECK_INT(catalog_schema_version(cat), CATALOG_SCHEMA_VERSION);
		test_policy_audit(cat);
		catalog_close(cat);
	}
	return catalogtest_done();
}
