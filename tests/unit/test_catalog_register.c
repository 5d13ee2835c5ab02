// SPDX-License-Identifier: MIT
/*
 * catalog_register: registration from fake key streams (bad keys,
 * file/directory clashes, SHA256SUMS, another sums key, duplicates, the key
 * and size limits) and from a real file:// source, lookup/readdir of what
 * it made, atomic refresh under a concurrent reader, superseded
 * registrations, a 1,000,000-key registration in bounded memory.
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

#include "check.h"
#include "dstage/config.h"
#include "dstage/keypath.h"

#include "catalogtest.h"

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

static long maxrss_kib(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
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
		  "SHA256SUMS,caf\xc3\xa9/,empty,emptydir/,hello.txt,nested/");
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
	/* A directory holding no file is a directory of the manifest, as
	 * in the source (docs/catalog.md, "What a POSIX source's snapshot
	 * shows"), and nothing is under it. */
	CHECK_INT(catalog_lookup(cat, "files", "emptydir", &e), 0);
	CHECK(e.is_dir);
	CHECK_STR(ls(cat, "files", "emptydir", NULL, &nm), "");
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

int main(void)
{
	struct catalog *cat = NULL;

	if (catalogtest_init())
		return 1;
	test_million();

	CHECK_INT(catalog_open(dbpath, CATALOG_CREATE, &cat), 0);
	if (cat) {
		CHECK_INT(catalog_schema_version(cat), CATALOG_SCHEMA_VERSION);
		test_register_keys(cat);
		test_register_file(cat);
		test_sums_key(cat);
		test_refresh(cat);
		test_superseded(cat);
		catalog_close(cat);
	}
	return catalogtest_done();
}
