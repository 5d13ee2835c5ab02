// SPDX-License-Identifier: MIT
/*
 * catalog: open/migrate (from every earlier version), datasets,
 * registration from fake key streams (bad keys, file/directory clashes,
 * SHA256SUMS, another sums key, duplicates), lookup/readdir, atomic refresh
 * under a concurrent reader, superseded registrations, a 1,000,000-key
 * registration in bounded memory, policy and audit.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "catalog/catalog_i.h"
#include "check.h"
#include "dstage/config.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

/* ASan's quarantine keeps freed memory resident: RSS means nothing there. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_MEANINGFUL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_MEANINGFUL 0
#endif
#endif
#ifndef RSS_MEANINGFUL
#define RSS_MEANINGFUL 1
#endif

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

static const char *fake_sums_key(const struct fake *f)
{
	return f->sums_key ? f->sums_key : "SHA256SUMS";
}

static int fake_list(void *arg, objstore_list_cb cb, void *cb_arg)
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

static int fake_read(void *arg, const struct objstore_info *oi,
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

static int reg(struct catalog *cat, const char *name, struct fake *f)
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

static int collect(void *arg, const char *name, const struct catalog_entry *e)
{
	struct names *nm = arg;
	size_t len = strlen(nm->buf);

	snprintf(nm->buf + len, sizeof(nm->buf) - len, "%s%s%s", len ? "," : "",
		 name, e->is_dir ? "/" : "");
	nm->n++;
	nm->dirs += e->is_dir;
	return 0;
}

static int count_only(void *arg, const char *name,
		      const struct catalog_entry *e)
{
	struct names *nm = arg;

	(void)name;
	(void)e;
	nm->n++;
	return 0;
}

static const char *ls(struct catalog *cat, const char *ds, const char *d,
		      const char *after, struct names *nm)
{
	memset(nm, 0, sizeof(*nm));
	if (catalog_readdir(cat, ds, d, after, collect, nm))
		return "(error)";
	return nm->buf;
}

static long long sql_int(const char *sql)
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

static long maxrss_kib(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

/* ---- tests ---- */

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
	catalog_dataset_release(&ds);
	catalog_close(cat);
	check_row(p, NULL,
		  "SELECT j.kind, a.args FROM jobs j JOIN"
		  " jobs_args a ON a.job_id = j.id"
		  " WHERE j.id = 6 AND j.dataset_id = 9",
		  "verify", "mode=source");
}

#define HA "aa00000000000000000000000000000000000000000000000000000000000000"
#define HB "BB00000000000000000000000000000000000000000000000000000000000000"

/* Sizes adding up past INT64_MAX: the key that would pass it is skipped
 * (and counted bad), so registration and every refresh still succeed. */
static void test_size_overflow(struct catalog *cat)
{
	static const char *const keys[] = { "a", "b", "c", NULL };
	struct fake f = { .keys = keys,
			  .fail_at = -1,
			  .size = (1ULL << 62) - 1 };
	struct catalog_dataset ds;
	struct catalog_entry e;

	CHECK_INT(catalog_dataset_add(cat, "huge", "file:///fake", NULL), 0);
	for (int round = 0; round < 2; round++) { /* register, refresh */
		CHECK_INT(reg(cat, "huge", &f), 0);
		CHECK_INT(catalog_dataset_get(cat, "huge", &ds), 0);
		CHECK_INT(ds.version, round + 1);
		CHECK_INT(ds.objects, 2);
		CHECK_INT(ds.bad_keys, 1);
		CHECK(ds.bytes == (uint64_t)INT64_MAX - 1);
		catalog_dataset_release(&ds);
	}
	CHECK_INT(catalog_lookup(cat, "huge", "b", &e), 0);
	CHECK_INT(catalog_lookup(cat, "huge", "c", &e), -ENOENT);
	CHECK_INT(catalog_dataset_remove(cat, "huge"), 0);
}

/* One key limit, S3's 1,024 bytes: a longer key is skipped at
 * registration (objstore would refuse every read of it). */
static void test_key_limit(struct catalog *cat)
{
	static char k1024[1025], k1025[1026], k4095[4096];
	const char *keys[] = { k1024, k1025, k4095, NULL };
	struct fake f = { .keys = keys, .fail_at = -1 };
	struct catalog_dataset ds;
	struct catalog_entry e;
	char buf[2048];

	memset(k1024, 'k', 1024);
	for (size_t i = 200; i < 1024; i += 200)
		k1024[i] = '/';
	memcpy(k1025, k1024, 1024);
	k1025[1024] = 'x';
	memset(k4095, 'm', 4095);
	for (size_t i = 200; i < 4095; i += 200)
		k4095[i] = '/';
	CHECK_INT(catalog_dataset_add(cat, "keylimit", "file:///fake", NULL),
		  0);
	CHECK_INT(reg(cat, "keylimit", &f), 0);
	CHECK_INT(catalog_dataset_get(cat, "keylimit", &ds), 0);
	CHECK_INT(ds.objects, 1);
	CHECK_INT(ds.bad_keys, 2);
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_lookup(cat, "keylimit", k1024, &e), 0);
	CHECK(!e.is_dir && e.id > 0);
	CHECK_INT(catalog_lookup(cat, "keylimit", k1025, &e), -ENOENT);
	snprintf(buf, sizeof(buf), "%.*s", 800, k1024); /* its directory */
	CHECK_INT(catalog_lookup(cat, "keylimit", buf, &e), 0);
	CHECK(e.is_dir);
	CHECK_INT(catalog_dataset_remove(cat, "keylimit"), 0);
}

static void test_register_keys(struct catalog *cat)
{
	static const char *const keys[] = {
		"SHA256SUMS",
		"a", /* a file, and a directory below: clash */
		"a-x",
		"a/b",
		"a/c/", /* directory marker */
		"bad//key",
		"d/../e",
		"dir/",
		"dir/empty",
		"dir/sub/deep/file",
		"dup",
		"dup",
		"nl\nkey",
		"ok",
		"x/0123456789012345678901234567890123456789012345678901234567"
		"890123456789012345678901234567890123456789012345678901234567"
		"890123456789012345678901234567890123456789012345678901234567"
		"890123456789012345678901234567890123456789012345678901234567"
		"890123456789012345678901234567890123456789",
		"z\xc3\xa9t\xc3\xa9/caf\xc3\xa9.txt",
		"/lead",
		"zz/",
		NULL,
	};
	struct fake f = {
		.keys = keys,
		.fail_at = -1,
		.sums = HA "  ok\r\n" HB " *./dir/empty\n"
			   "not a line\n"
			   "\\" HA "  new\\nline\n",
	};
	struct catalog_dataset ds;
	struct catalog_entry e;
	struct names nm;

	CHECK_INT(catalog_dataset_add(cat, "ds", "file:///fake", "staff"), 0);
	CHECK_INT(catalog_dataset_add(cat, "ds", "file:///fake", NULL),
		  -EEXIST);
	CHECK_INT(catalog_dataset_add(cat, "a/b", "file:///x", NULL), -EINVAL);
	CHECK_INT(catalog_dataset_add(cat, "..", "file:///x", NULL), -EINVAL);
	CHECK_INT(catalog_lookup(cat, "ds", "", &e), -ENOENT);
	CHECK_INT(reg(cat, "nope", &f), -ENOENT);

	CHECK_INT(reg(cat, "ds", &f), 0);
	CHECK_INT(catalog_dataset_get(cat, "ds", &ds), 0);
	CHECK_INT(ds.version, 1);
	CHECK_INT(ds.state, CATALOG_DS_READY);
	/* bad//key, d/../e, dup, nl\nkey, x/<256>, /lead, a (clash) */
	CHECK_INT(ds.bad_keys, 7);
	CHECK_INT(ds.objects, 8);
	CHECK_STR(ds.group, "staff");
	catalog_dataset_release(&ds);
	test_key_limit(cat);
	test_size_overflow(cat);

	CHECK_STR(ls(cat, "ds", "", NULL, &nm),
		  "SHA256SUMS,a/,a-x,dir/,dup,ok,zz/,z\xc3\xa9t\xc3\xa9/");
	CHECK_STR(ls(cat, "ds", "", "a-x", &nm),
		  "dir/,dup,ok,zz/,z\xc3\xa9t\xc3\xa9/");
	CHECK_STR(ls(cat, "ds", "a", NULL, &nm), "b,c/");
	CHECK_STR(ls(cat, "ds", "a/c", NULL, &nm), "");
	CHECK_STR(ls(cat, "ds", "dir", NULL, &nm), "empty,sub/");
	CHECK_STR(ls(cat, "ds", "dir", "empty", &nm), "sub/");
	CHECK_STR(ls(cat, "ds", "dir/sub/deep", NULL, &nm), "file");
	CHECK_INT(catalog_readdir(cat, "ds", "ok", NULL, collect, &nm),
		  -ENOTDIR);
	CHECK_INT(catalog_readdir(cat, "ds", "nope", NULL, collect, &nm),
		  -ENOENT);
	CHECK_INT(catalog_readdir(cat, "nods", "", NULL, collect, &nm),
		  -ENOENT);

	CHECK_INT(catalog_lookup(cat, "ds", "a", &e), 0);
	CHECK(e.is_dir);
	CHECK_INT(catalog_lookup(cat, "ds", "ok", &e), 0);
	CHECK(!e.is_dir && e.id > 0);
	CHECK(e.has_expected && e.expected_sha256[0] == 0xaa);
	CHECK(!e.has_actual);
	CHECK_INT(e.size, 13);
	CHECK_STR(e.etag, "\"etag-13\"");
	CHECK_INT(catalog_object_set_actual(cat, e.id, e.expected_sha256, 77),
		  0);
	CHECK_INT(catalog_object_set_actual(cat, 999999, e.expected_sha256, 7),
		  -ENOENT);
	CHECK_INT(catalog_lookup(cat, "ds", "ok", &e), 0);
	CHECK(e.has_actual && e.actual_sha256[0] == 0xaa);
	CHECK_INT(e.verified_at, 77);
	CHECK_INT(catalog_lookup(cat, "ds", "dir/empty", &e), 0);
	CHECK(e.has_expected && e.expected_sha256[0] == 0xbb);
	CHECK_INT(catalog_lookup(cat, "ds", "a-x", &e), 0);
	CHECK(!e.has_expected);
	CHECK_INT(catalog_lookup(cat, "ds", "dup", &e), 0);
	CHECK_INT(e.size, 10); /* the first one listed */
	CHECK_INT(catalog_lookup(cat, "ds", "d/../e", &e), -ENOENT);
	CHECK_INT(catalog_lookup(cat, "ds", "bad", &e), -ENOENT);
}

#define SK_MANIFESTS                                       \
	"SELECT count(*) FROM manifests m JOIN datasets d" \
	" ON d.id = m.dataset_id WHERE d.name = 'sk'"

/* Another sums key: checked like a manifest key, read instead of
 * SHA256SUMS (which stays a plain file), required at the source, kept by
 * every registration; NULL brings back the optional default. */
static void test_sums_key(struct catalog *cat)
{
	static const char *const keys[] = { "SHA256SUMS", "a", "b",
					    "meta/sums.txt", NULL };
	static const char *const no_sums[] = { "SHA256SUMS", "a", "b", NULL };
	static const char *const plain[] = { "a", "b", NULL };
	struct fake f = {
		.keys = keys,
		.fail_at = -1,
		.sums_key = "meta/sums.txt",
		.sums = HA "  a\n"
			   "not a line\n" HB " *./b\n" HA "  missing\n",
	};
	struct fake gone = { .keys = no_sums,
			     .fail_at = -1,
			     .sums_key = "meta/sums.txt" };
	struct fake dflt = { .keys = no_sums,
			     .fail_at = -1,
			     .sums = HB "  a\n" };
	struct fake none = { .keys = plain, .fail_at = -1 };
	char seg[KEYPATH_SEG_MAX + 2];
	const char *bad[] = { "",      "../x", "a/../b", "/abs", "a//b",
			      "meta/", "a\nb", ".",	 seg };
	struct catalog_dataset ds;
	struct catalog_entry e;
	struct names nm;
	int64_t v;

	memset(seg, 'x', sizeof(seg) - 1);
	seg[sizeof(seg) - 1] = '\0';
	CHECK_INT(catalog_dataset_add(cat, "sk", "file:///sk/", NULL), 0);
	CHECK_INT(catalog_dataset_get(cat, "sk", &ds), 0);
	CHECK_STR(ds.sums_key, CATALOG_SUMS_KEY_DEFAULT);
	catalog_dataset_release(&ds);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK_INT(catalog_dataset_set_sums_key(cat, "sk", bad[i]),
			  -EINVAL);
	seg[KEYPATH_SEG_MAX] = '\0'; /* 255 bytes: a valid segment */
	CHECK_INT(catalog_dataset_set_sums_key(cat, "sk", seg), 0);
	CHECK_INT(catalog_dataset_set_sums_key(cat, "nope", "x"), -ENOENT);

	/* Not at the source: the registration fails and leaves nothing. */
	CHECK_INT(catalog_dataset_set_sums_key(cat, "sk", "missing.txt"), 0);
	CHECK_INT(reg(cat, "sk", &f), -ENODATA);
	CHECK_INT(catalog_dataset_get(cat, "sk", &ds), 0);
	CHECK_INT(ds.state, CATALOG_DS_NEW);
	CHECK_INT(ds.version, 0);
	CHECK_STR(ds.sums_key, "missing.txt");
	catalog_dataset_release(&ds);
	CHECK_INT(sql_int(SK_MANIFESTS), 0);

	CHECK_INT(catalog_dataset_set_sums_key(cat, "sk", "meta/sums.txt"), 0);
	CHECK_INT(reg(cat, "sk", &f), 0);
	CHECK_INT(catalog_dataset_get(cat, "sk", &ds), 0);
	CHECK_INT(ds.state, CATALOG_DS_READY);
	CHECK_INT(ds.objects, 4); /* the sums file is a file, as SHA256SUMS */
	CHECK_STR(ds.sums_key, "meta/sums.txt");
	v = ds.version;
	catalog_dataset_release(&ds);
	CHECK_STR(ls(cat, "sk", "", NULL, &nm), "SHA256SUMS,a,b,meta/");
	CHECK_STR(ls(cat, "sk", "meta", NULL, &nm), "sums.txt");
	CHECK_INT(catalog_lookup(cat, "sk", "a", &e), 0);
	CHECK(e.has_expected && e.expected_sha256[0] == 0xaa);
	CHECK_INT(catalog_lookup(cat, "sk", "b", &e), 0);
	CHECK(e.has_expected && e.expected_sha256[0] == 0xbb);
	CHECK_INT(catalog_lookup(cat, "sk", "SHA256SUMS", &e), 0);
	CHECK(!e.has_expected);
	CHECK_INT(catalog_lookup(cat, "sk", "meta/sums.txt", &e), 0);
	CHECK(!e.has_expected);

	/* A refresh reads the same key again. */
	CHECK_INT(reg(cat, "sk", &f), 0);
	CHECK_INT(catalog_dataset_get(cat, "sk", &ds), 0);
	CHECK_INT(ds.version, v + 1);
	CHECK_STR(ds.sums_key, "meta/sums.txt");
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_lookup(cat, "sk", "a", &e), 0);
	CHECK(e.has_expected && e.expected_sha256[0] == 0xaa);

	/* Gone from the source: the refresh fails, the manifest stays. */
	CHECK_INT(reg(cat, "sk", &gone), -ENODATA);
	CHECK_INT(catalog_dataset_get(cat, "sk", &ds), 0);
	CHECK_INT(ds.version, v + 1);
	CHECK_INT(ds.objects, 4);
	catalog_dataset_release(&ds);
	CHECK_INT(sql_int(SK_MANIFESTS), 1);

	/* Back to the default: SHA256SUMS is read, and optional. */
	CHECK_INT(catalog_dataset_set_sums_key(cat, "sk", NULL), 0);
	CHECK_INT(catalog_dataset_get(cat, "sk", &ds), 0);
	CHECK_STR(ds.sums_key, CATALOG_SUMS_KEY_DEFAULT);
	catalog_dataset_release(&ds);
	CHECK_INT(reg(cat, "sk", &dflt), 0);
	CHECK_INT(catalog_lookup(cat, "sk", "a", &e), 0);
	CHECK(e.has_expected && e.expected_sha256[0] == 0xbb);
	CHECK_INT(reg(cat, "sk", &none), 0);
	CHECK_INT(catalog_lookup(cat, "sk", "a", &e), 0);
	CHECK(!e.has_expected);
	CHECK_INT(catalog_dataset_remove(cat, "sk"), 0);
}

/* Refresh while a reader on another connection watches: old or new. */
struct watch {
	atomic_int stop;
	long long seen_old, seen_new, seen_other;
	size_t old_n, new_n;
};

static void *watcher(void *arg)
{
	struct watch *w = arg;
	struct catalog *cat;
	struct names nm;

	if (catalog_open(dbpath, CATALOG_READONLY, &cat))
		return NULL;
	while (!atomic_load(&w->stop)) {
		memset(&nm, 0, sizeof(nm));
		if (catalog_readdir(cat, "ds", "", NULL, count_only, &nm)) {
			w->seen_other++;
			continue;
		}
		if (nm.n == w->old_n)
			w->seen_old++;
		else if (nm.n == w->new_n)
			w->seen_new++;
		else
			w->seen_other++;
	}
	catalog_close(cat);
	return NULL;
}

static struct catalog *g_other;

static void check_still_old(struct fake *f, size_t i)
{
	struct catalog_entry e;
	struct catalog_dataset ds;

	(void)f;
	(void)i;
	CHECK_INT(catalog_dataset_get(g_other, "ds", &ds), 0);
	CHECK_INT(ds.version, 1);
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_lookup(g_other, "ds", "ok", &e), 0);
	CHECK_INT(catalog_lookup(g_other, "ds", "0000/0000001", &e), -ENOENT);
}

static void test_refresh(struct catalog *cat)
{
	struct fake f = {
		.gen = 3 * CATALOG_BATCH + 5,
		.gen_prefix = "",
		.fail_at = -1,
		.hook = check_still_old,
		.hook_at = 2 * CATALOG_BATCH + 3,
	};
	struct catalog_dataset ds;
	struct catalog_entry e;
	struct watch w = { .old_n = 8, .new_n = 61 };
	struct names nm;
	pthread_t th;

	CHECK_INT(catalog_open(dbpath, 0, &g_other), 0);
	CHECK_INT(pthread_create(&th, NULL, watcher, &w), 0);
	CHECK_INT(reg(cat, "ds", &f), 0);
	/* Let the watcher see the new manifest a few times. */
	for (int i = 0; i < 200 && w.seen_new < 3; i++)
		usleep(10000);
	atomic_store(&w.stop, 1);
	pthread_join(th, NULL);
	fprintf(stderr, "watcher: old %lld new %lld other %lld\n", w.seen_old,
		w.seen_new, w.seen_other);
	CHECK_INT(w.seen_other, 0);
	CHECK(w.seen_new > 0);

	CHECK_INT(catalog_dataset_get(cat, "ds", &ds), 0);
	CHECK_INT(ds.version, 2);
	CHECK_INT(ds.objects, f.gen);
	CHECK_INT(ds.bad_keys, 0);
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_lookup(cat, "ds", "ok", &e), -ENOENT);
	CHECK_INT(catalog_lookup(cat, "ds", "0000/0000001", &e), 0);
	memset(&nm, 0, sizeof(nm));
	CHECK_INT(catalog_readdir(cat, "ds", "0000", NULL, count_only, &nm), 0);
	CHECK_INT(nm.n, 1000);
	/* The old manifest is gone. */
	CHECK_INT(sql_int(DS_MANIFESTS), 1);

	/* A failing listing leaves the current version alone. */
	f.hook = NULL;
	f.fail_at = CATALOG_BATCH + 10;
	CHECK_INT(reg(cat, "ds", &f), -EIO);
	CHECK_INT(catalog_dataset_get(cat, "ds", &ds), 0);
	CHECK_INT(ds.version, 2);
	CHECK_INT(ds.objects, f.gen);
	catalog_dataset_release(&ds);
	CHECK_INT(sql_int(DS_MANIFESTS), 1);
	CHECK_INT(sql_int(DS_OBJECTS), f.gen);
}

/* A registration started while another is listing wins. */
static void start_newer(struct fake *f, size_t i)
{
	static const char *const keys[] = { "newer", NULL };
	struct fake g = { .keys = keys, .fail_at = -1 };

	(void)f;
	(void)i;
	CHECK_INT(reg(g_other, "ds", &g), 0);
}

static void test_superseded(struct catalog *cat)
{
	struct fake f = {
		.gen = 2 * CATALOG_BATCH,
		.gen_prefix = "",
		.fail_at = -1,
		.hook = start_newer,
		.hook_at = CATALOG_BATCH,
	};
	struct catalog_dataset ds;
	struct catalog_entry e;

	CHECK_INT(reg(cat, "ds", &f), -EBUSY);
	CHECK_INT(catalog_dataset_get(cat, "ds", &ds), 0);
	CHECK_INT(ds.objects, 1);
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_lookup(cat, "ds", "newer", &e), 0);
	CHECK_INT(sql_int(DS_OBJECTS), 1);
	catalog_close(g_other);
	g_other = NULL;
}

static int list_ds(void *arg, const struct catalog_dataset *ds)
{
	struct names *nm = arg;
	size_t len = strlen(nm->buf);

	snprintf(nm->buf + len, sizeof(nm->buf) - len, "%s%s:%d:%d",
		 len ? "," : "", ds->name, ds->pinned, ds->priority);
	return 0;
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

static void test_admin(struct catalog *cat)
{
	struct catalog_audit a = { .uid = 1000,
				   .user = "ann",
				   .action = "pin",
				   .target = "ds",
				   .old_value = "0",
				   .new_value = "1" };
	struct catalog_dataset ds;
	struct names nm;
	char buf[32];

	CHECK_INT(catalog_dataset_add(cat, "b2", "s3://bkt/b2/", NULL), 0);
	CHECK_INT(catalog_dataset_set_pinned(cat, "ds", true), 0);
	CHECK_INT(catalog_dataset_set_priority(cat, "b2", -3), 0);
	CHECK_INT(catalog_dataset_set_quota(cat, "b2", 1ull << 40), 0);
	CHECK_INT(catalog_dataset_set_group(cat, "b2", "ml"), 0);
	CHECK_INT(catalog_dataset_set_pinned(cat, "zz", true), -ENOENT);
	memset(&nm, 0, sizeof(nm));
	CHECK_INT(catalog_dataset_list(cat, list_ds, &nm), 0);
	CHECK_STR(nm.buf, "b2:0:-3,ds:1:0,files:0:0");
	CHECK_INT(catalog_dataset_get(cat, "b2", &ds), 0);
	CHECK_INT(ds.quota, 1ull << 40);
	CHECK_STR(ds.group, "ml");
	catalog_dataset_release(&ds);

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

	/* Remove: gone for readers, rows purged, name free again. */
	CHECK_INT(catalog_dataset_remove(cat, "ds"), 0);
	CHECK_INT(catalog_dataset_get(cat, "ds", &ds), -ENOENT);
	CHECK_INT(catalog_dataset_remove(cat, "ds"), -ENOENT);
	CHECK_INT(sql_int(DS_OBJECTS), 0);
	CHECK_INT(sql_int(DS_DIRS), 0);
	CHECK_INT(catalog_dataset_add(cat, "ds", "file:///again", NULL), 0);
}

static void put_file(const char *root, const char *rel, const char *body)
{
	char p[512];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", root, rel);
	fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK(write(fd, body, strlen(body)) == (ssize_t)strlen(body));
	close(fd);
}

#define SHA_HELLO \
	"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
#define SHA_EMPTY \
	"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* A real file:// source: nested dirs, empty files, UTF-8, a bad name. */
static void test_register_file(struct catalog *cat)
{
	static const char *const dirs[] = { "src", "src/nested",
					    "src/nested/dir", "src/caf\xc3\xa9",
					    "src/emptydir" };
	struct dstage_config *cfg = NULL;
	struct objstore *os = NULL;
	struct catalog_dataset ds;
	struct catalog_entry e;
	struct names nm;
	char root[160], url[200], p[300];
	const char *sums =
		SHA_HELLO "  hello.txt\n" SHA_EMPTY " *./empty\r\n" SHA_HELLO
			  " *nested/dir/deep.bin\n"
			  "\\" SHA_EMPTY "  bad\\nname\n" SHA_EMPTY
			  "  caf\xc3\xa9/\xe6\x97\xa5.txt\n";

	snprintf(root, sizeof(root), "%s/src", dir);
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, dirs[i]);
		CHECK(mkdir(p, 0755) == 0);
	}
	put_file(root, "hello.txt", "hello");
	put_file(root, "empty", "");
	put_file(root, "nested/dir/deep.bin", "hello");
	put_file(root, "caf\xc3\xa9/\xe6\x97\xa5.txt", "");
	put_file(root, "bad\nname", "x");
	put_file(root, "SHA256SUMS", sums);

	snprintf(url, sizeof(url), "file://%s/", root);
	CHECK_INT(config_defaults(&cfg), 0);
	CHECK_INT(objstore_open(url, cfg, &os), 0);
	if (!os)
		goto out;
	CHECK_INT(catalog_dataset_add(cat, "files", url, NULL), 0);
	CHECK_INT(catalog_register(cat, "files", os), 0);
	CHECK_INT(catalog_dataset_get(cat, "files", &ds), 0);
	CHECK_INT(ds.bad_keys, 1);
	CHECK_INT(ds.objects, 5);
	CHECK_INT(ds.bytes, 5 + 5 + 0 + 0 + strlen(sums));
	catalog_dataset_release(&ds);

	CHECK_STR(ls(cat, "files", "", NULL, &nm),
		  "SHA256SUMS,caf\xc3\xa9/,empty,hello.txt,nested/");
	CHECK_STR(ls(cat, "files", "nested", NULL, &nm), "dir/");
	CHECK_INT(catalog_lookup(cat, "files", "hello.txt", &e), 0);
	CHECK_INT(e.size, 5);
	CHECK(e.etag[0] == '"');
	CHECK(e.mtime > 0);
	CHECK(e.has_expected && e.expected_sha256[0] == 0x2c &&
	      e.expected_sha256[31] == 0x24);
	CHECK_INT(catalog_lookup(cat, "files", "empty", &e), 0);
	CHECK(e.has_expected && e.expected_sha256[0] == 0xe3);
	CHECK_INT(e.size, 0);
	CHECK_INT(catalog_lookup(cat, "files", "nested/dir/deep.bin", &e), 0);
	CHECK(e.has_expected && e.expected_sha256[0] == 0x2c);
	CHECK_INT(catalog_lookup(cat, "files", "caf\xc3\xa9/\xe6\x97\xa5.txt",
				 &e),
		  0);
	CHECK(e.has_expected);
	CHECK_INT(catalog_lookup(cat, "files", "bad\nname", &e), -ENOENT);
	/* Directories holding no file are not objects: not in the manifest. */
	CHECK_INT(catalog_lookup(cat, "files", "emptydir", &e), -ENOENT);
out:
	objstore_free(os);
	config_free(cfg);
}

/* 1,000,000 keys in bounded memory and bounded time. */
static void test_million(void)
{
	struct fake f = {
		.gen = 1000000,
		.gen_prefix = "d",
		.fail_at = -1,
	};
	struct catalog_dataset ds;
	struct catalog *cat;
	struct timespec t0, t1;
	char p[160];
	long rss0, rss1;
	double secs;

	snprintf(p, sizeof(p), "%s/million.db", dir);
	CHECK_INT(catalog_open(p, CATALOG_CREATE, &cat), 0);
	if (!cat)
		return;
	CHECK_INT(catalog_dataset_add(cat, "big", "file:///big", NULL), 0);
	rss0 = maxrss_kib();
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK_INT(reg(cat, "big", &f), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	rss1 = maxrss_kib();
	secs = (double)(t1.tv_sec - t0.tv_sec) +
	       (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	fprintf(stderr, "1M keys: %.2f s, peak RSS %ld -> %ld KiB\n", secs,
		rss0, rss1);
	/* Holding the keys alone would take > 40 MiB. */
	if (RSS_MEANINGFUL)
		CHECK(rss1 - rss0 < 24 * 1024);
	CHECK_INT(catalog_dataset_get(cat, "big", &ds), 0);
	CHECK_INT(ds.objects, 1000000);
	catalog_dataset_release(&ds);
	catalog_close(cat);
}

/* The checkpoint files table (schema 8): record, replace, rename of a file
 * and of a directory (its rows only, byte-wise on UTF-8 names, over what
 * the target had), forget of a directory, bounds. */
static void test_ckpt_files(struct catalog *cat)
{
	const char *s1 = "file:///store/", *s2 = "s3://b/p/";
	char sha_a[65], sha_b[65];
	struct catalog_ckpt c;

	memset(sha_a, 'a', 64);
	sha_a[64] = '\0';
	memset(sha_b, 'b', 64);
	sha_b[64] = '\0';
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/x", &c), -ENOENT);
	CHECK_INT(catalog_ckpt_record(cat, s1, "j/x", sha_a, 10, "\"e1\""), 0);
	CHECK_INT(catalog_ckpt_record(cat, s2, "j/x", sha_b, 20, ""), 0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/x", &c), 0);
	CHECK_STR(c.sha256, sha_a);
	CHECK(c.size == 10);
	CHECK_STR(c.etag, "\"e1\"");
	CHECK(c.published > 0);
	/* a new version replaces the row */
	CHECK_INT(catalog_ckpt_record(cat, s1, "j/x", sha_b, 11, "\"e2\""), 0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/x", &c), 0);
	CHECK_STR(c.sha256, sha_b);
	CHECK(c.size == 11);
	/* bounds */
	CHECK_INT(catalog_ckpt_record(cat, s1, "j/y", "abc", 1, ""), -EINVAL);
	sha_a[3] = 'G';
	CHECK_INT(catalog_ckpt_record(cat, s1, "j/y", sha_a, 1, ""), -EINVAL);
	sha_a[3] = 'a';
	CHECK_INT(catalog_ckpt_record(cat, s1, "", sha_a, 1, ""), -EINVAL);

	/* a directory with a UTF-8 name moves with everything below it,
	 * and nothing that only starts with its name ("d\xc3\xa9x") */
	CHECK_INT(catalog_ckpt_record(cat, s1, "d\xc3\xa9/1", sha_a, 1, ""), 0);
	CHECK_INT(catalog_ckpt_record(cat, s1, "d\xc3\xa9/s/2", sha_a, 2, ""),
		  0);
	CHECK_INT(catalog_ckpt_record(cat, s1, "d\xc3\xa9x", sha_a, 3, ""), 0);
	CHECK_INT(catalog_ckpt_record(cat, s1, "new/old", sha_b, 4, ""), 0);
	CHECK_INT(catalog_ckpt_rename(cat, s1, "d\xc3\xa9", "new"), 0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "new/1", &c), 0);
	CHECK(c.size == 1);
	CHECK_INT(catalog_ckpt_get(cat, s1, "new/s/2", &c), 0);
	CHECK(c.size == 2);
	CHECK_INT(catalog_ckpt_get(cat, s1, "d\xc3\xa9/1", &c), -ENOENT);
	CHECK_INT(catalog_ckpt_get(cat, s1, "d\xc3\xa9x", &c), 0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "new/old", &c), -ENOENT);
	/* a file renamed over another */
	CHECK_INT(catalog_ckpt_rename(cat, s1, "d\xc3\xa9x", "j/x"), 0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/x", &c), 0);
	CHECK(c.size == 3);
	CHECK_INT(catalog_ckpt_get(cat, s2, "j/x", &c), 0); /* other store */
	CHECK(c.size == 20);
	/* forget a directory: its rows, not its neighbours' */
	CHECK_INT(catalog_ckpt_record(cat, s1, "new0", sha_a, 5, ""), 0);
	CHECK_INT(catalog_ckpt_forget(cat, s1, "new"), 0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "new/s/2", &c), -ENOENT);
	CHECK_INT(catalog_ckpt_get(cat, s1, "new0", &c), 0);
	CHECK_INT(catalog_ckpt_forget(cat, s1, "nothing"), 0);
}

int main(void)
{
	struct catalog *cat = NULL;
	char cmd[128];

	if (getenv("DSTAGE_TEST_VERBOSE") == NULL)
		log_set_level(LOG_LVL_ERROR);
	snprintf(dir, sizeof(dir), "/tmp/dstage-catalog-XXXXXX");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(dbpath, sizeof(dbpath), "%s/catalog.db", dir);

	test_million();
	test_open_errors();
	test_file_modes();
	test_migrate_v1();
	test_migrate_v2();
	test_migrate_v3();

	CHECK_INT(catalog_open(dbpath, CATALOG_CREATE, &cat), 0);
	if (cat) {
		CHECK_INT(catalog_schema_version(cat), CATALOG_SCHEMA_VERSION);
		test_register_keys(cat);
		test_register_file(cat);
		test_sums_key(cat);
		test_refresh(cat);
		test_superseded(cat);
		test_admin(cat);
		test_ckpt_files(cat);
		catalog_close(cat);
	}

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return check_result();
}
