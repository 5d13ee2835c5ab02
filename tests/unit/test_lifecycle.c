// SPDX-License-Identifier: MIT
/*
 * test_lifecycle: lib/format/lifecycle.c (rule checks, step numbers, plans with an
 * injected clock) and the catalog's rule table (schema 6), migrated from a
 * real schema-5 catalog file made by the program before it
 * (tests/data/catalog-v5.db).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "check.h"
#include "dstage/catalog.h"
#include "dstage/lifecycle.h"

#define DAY LIFECYCLE_DAY
#define NOW 2000000000LL

static struct lifecycle_rule rule(const char *pat, unsigned n, unsigned d,
				  unsigned r, unsigned k, const char *arch)
{
	struct lifecycle_rule x;

	memset(&x, 0, sizeof(x));
	snprintf(x.pattern, sizeof(x.pattern), "%s", pat);
	x.keep_local = n;
	x.shared_days = d;
	x.delete_days = r;
	x.keep_every = k;
	snprintf(x.archive, sizeof(x.archive), "%s", arch ? arch : "");
	return x;
}

static void test_check(void)
{
	struct lifecycle_rule r;
	char msg[512];

	r = rule("llm-*", 2, 7, 30, 1000, "s3://arch/ckpt/");
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), 0);
	r = rule("llm-*", 2, 0, 0, 0, NULL);
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), 0);
	/* R < D */
	r = rule("llm-*", 2, 30, 7, 0, "s3://arch/");
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	CHECK(strstr(msg, "--delete-days 7") != NULL);
	/* R == D is accepted */
	r = rule("llm-*", 2, 7, 7, 0, "s3://arch/");
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), 0);
	/* N < 1 */
	r = rule("llm-*", 0, 0, 0, 0, NULL);
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	CHECK(strstr(msg, "--keep-local 0") != NULL);
	/* patterns */
	r = rule("", 1, 0, 0, 0, NULL);
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	r = rule("a/b", 1, 0, 0, 0, NULL);
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	r = rule("llm-[ab", 1, 0, 0, 0, NULL);
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	CHECK(strstr(msg, "'['") != NULL);
	r = rule("llm-[]ab]", 1, 0, 0, 0, NULL);
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), 0);
	r = rule("a\tb", 1, 0, 0, 0, NULL);
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	/* archive and D go together; URL schemes; storage classes */
	r = rule("x", 1, 7, 0, 0, NULL);
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	r = rule("x", 1, 0, 0, 0, "s3://a/");
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	r = rule("x", 1, 7, 0, 0, "http://a/");
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	r = rule("x", 1, 7, 0, 0, "file:///arch/");
	snprintf(r.storage_class, sizeof(r.storage_class), "GLACIER");
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), 0);
	snprintf(r.storage_class, sizeof(r.storage_class), "glacier");
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	r = rule("x", 1, 0, 0, 0, NULL);
	snprintf(r.storage_class, sizeof(r.storage_class), "GLACIER");
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
	r = rule("x", 1, LIFECYCLE_DAYS_MAX + 1, 0, 0, "s3://a/");
	CHECK_INT(lifecycle_rule_check(&r, msg, sizeof(msg)), -EINVAL);
}

static void test_match_step(void)
{
	struct lifecycle_rule rs[3];

	rs[0] = rule("llm-7b", 1, 0, 0, 0, NULL);
	rs[1] = rule("llm-*", 2, 0, 0, 0, NULL);
	rs[2] = rule("*", 3, 0, 0, 0, NULL);
	CHECK(lifecycle_rule_find(rs, 3, "llm-7b") == &rs[0]);
	CHECK(lifecycle_rule_find(rs, 3, "llm-70b") == &rs[1]);
	CHECK(lifecycle_rule_find(rs, 3, "vit") == &rs[2]);
	CHECK(lifecycle_rule_find(rs, 2, "vit") == NULL);
	CHECK_INT(lifecycle_step("step-1000"), 1000);
	CHECK_INT(lifecycle_step("global_step00420.pt"), 420);
	CHECK_INT(lifecycle_step("v2-step-35"), 35);
	CHECK_INT(lifecycle_step("final"), -1);
	CHECK_INT(lifecycle_step("0"), 0);
	CHECK_INT(lifecycle_step("s1234567890123456789012"), -1);
}

static struct lifecycle_ckpt *find(struct lifecycle_ckpt *c, size_t n,
				   const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(c[i].name, name))
			return &c[i];
	return NULL;
}

static void test_plan(void)
{
	/* step-k written k days ago (k = 1..10, step 100*k): the newest is
	 * step-100 (1 day old)... no: the highest step is the newest. */
	struct lifecycle_ckpt c[10];
	char names[10][32];
	struct lifecycle_rule r = rule("j", 2, 3, 6, 400, "s3://a/");
	struct lifecycle_ckpt *k;

	for (int i = 0; i < 10; i++) {
		snprintf(names[i], sizeof(names[i]), "step-%d", (i + 1) * 100);
		memset(&c[i], 0, sizeof(c[i]));
		c[i].name = names[i];
		/* step-1000 is 0 days old, step-100 is 9 days old */
		c[i].mtime = NOW - (int64_t)(9 - i) * DAY - 60;
		c[i].complete = true;
		c[i].local = true;
	}
	lifecycle_plan(&r, c, 10, NOW);
	CHECK_STR(c[0].name, "step-1000");
	CHECK_INT(c[0].rank, 0);
	CHECK_INT(c[9].step, 100);
	/* newest two keep their local copies */
	CHECK_INT(find(c, 10, "step-1000")->actions, 0);
	CHECK(!(find(c, 10, "step-900")->actions & LIFECYCLE_DROP_LOCAL));
	CHECK_INT(find(c, 10, "step-900")->actions, 0);
	CHECK_INT(find(c, 10, "step-800")->actions, LIFECYCLE_DROP_LOCAL);
	/* 3 days old: archived */
	CHECK_INT(find(c, 10, "step-700")->actions,
		  LIFECYCLE_DROP_LOCAL | LIFECYCLE_ARCHIVE_IT);
	/* 6 days old: deleted, except multiples of 400 */
	CHECK_INT(find(c, 10, "step-400")->actions,
		  LIFECYCLE_DROP_LOCAL | LIFECYCLE_ARCHIVE_IT);
	CHECK_INT(find(c, 10, "step-400")->kept, LIFECYCLE_KEPT_EVERY);
	CHECK_INT(find(c, 10, "step-300")->actions,
		  LIFECYCLE_DELETE | LIFECYCLE_DROP_LOCAL);
	CHECK_INT(find(c, 10, "step-100")->actions,
		  LIFECYCLE_DELETE | LIFECYCLE_DROP_LOCAL);
	/* already archived: not archived again, deleted when due */
	for (int i = 0; i < 10; i++)
		c[i].tier = LIFECYCLE_ARCHIVE, c[i].local = false;
	lifecycle_plan(&r, c, 10, NOW);
	CHECK_INT(find(c, 10, "step-700")->actions, 0);
	CHECK_INT(find(c, 10, "step-200")->actions, LIFECYCLE_DELETE);
	/* the same input gives the same plan, whatever the input order */
	lifecycle_plan(&r, c, 10, NOW);
	CHECK_INT(find(c, 10, "step-200")->actions, LIFECYCLE_DELETE);

	/* the newest complete is never deleted: a job that stopped long
	 * ago, its newest still being written (incomplete) */
	for (int i = 0; i < 10; i++) {
		c[i].mtime = NOW - 100 * DAY - i;
		c[i].tier = LIFECYCLE_SHARED;
		c[i].local = true;
	}
	k = find(c, 10, "step-1000");
	k->complete = false;
	lifecycle_plan(&r, c, 10, NOW);
	CHECK_INT(find(c, 10, "step-1000")->actions, 0); /* incomplete */
	CHECK_INT(find(c, 10, "step-900")->kept, LIFECYCLE_KEPT_NEWEST);
	CHECK(!(find(c, 10, "step-900")->actions & LIFECYCLE_DELETE));
	CHECK(find(c, 10, "step-900")->actions & LIFECYCLE_ARCHIVE_IT);
	/* rank 1 < N = 2, but archived: its local copies go too */
	CHECK(find(c, 10, "step-900")->actions & LIFECYCLE_DROP_LOCAL);
	CHECK_INT(find(c, 10, "step-800")->kept, LIFECYCLE_KEPT_EVERY);
	CHECK(find(c, 10, "step-700")->actions & LIFECYCLE_DELETE);
	/* the clock: one second before day 6, step-300 stays */
	for (int i = 0; i < 10; i++)
		c[i].mtime = NOW - 6 * DAY + 1, c[i].complete = true;
	lifecycle_plan(&r, c, 10, NOW);
	CHECK(!(find(c, 10, "step-300")->actions & LIFECYCLE_DELETE));
	lifecycle_plan(&r, c, 10, NOW + 1);
	CHECK(find(c, 10, "step-300")->actions & LIFECYCLE_DELETE);
}

static void test_plan_mtime(void)
{
	/* names without steps: mtime order; one name with a number does not
	 * make the order by step */
	struct lifecycle_ckpt c[3] = {
		{ .name = "old",
		  .mtime = NOW - 3 * DAY,
		  .complete = true,
		  .local = true },
		{ .name = "latest",
		  .mtime = NOW - 10,
		  .complete = true,
		  .local = true },
		{ .name = "b9",
		  .mtime = NOW - 2 * DAY,
		  .complete = true,
		  .local = true },
	};
	struct lifecycle_rule r = rule("j", 1, 0, 1, 0, NULL);

	lifecycle_plan(&r, c, 3, NOW);
	CHECK_STR(c[0].name, "latest");
	CHECK_STR(c[1].name, "b9");
	CHECK_INT(c[0].actions, 0);
	CHECK_INT(c[1].actions, LIFECYCLE_DELETE | LIFECYCLE_DROP_LOCAL);
	CHECK_INT(c[2].actions, LIFECYCLE_DELETE | LIFECYCLE_DROP_LOCAL);
	/* the only one is the newest: never deleted */
	c[0].mtime = NOW - 50 * DAY;
	lifecycle_plan(&r, c, 1, NOW);
	CHECK_INT(c[0].actions, 0);
	CHECK_INT(c[0].kept, LIFECYCLE_KEPT_NEWEST);
}

static int count_audit(void *arg, const struct catalog_audit *a)
{
	int *n = arg;

	if (!strncmp(a->action, "lifecycle.", 10))
		(*n)++;
	return 0;
}

static void test_catalog(const char *dir)
{
	char src[1024], path[1024], cmd[4096], msg[512];
	struct catalog_audit who = { .uid = 1234, .user = "alice" };
	struct lifecycle_rule r, *v = NULL, gone;
	struct catalog *cat = NULL;
	struct catalog_dataset ds;
	size_t n = 0;
	int audits = 0;

	snprintf(src, sizeof(src), "%s/catalog-v5.db",
		 getenv("DSTAGE_TEST_DATA") ? getenv("DSTAGE_TEST_DATA")
					    : "tests/data");
	snprintf(path, sizeof(path), "%s/catalog.db", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s' && chmod 600 '%s'", src, path,
		 path);
	CHECK_INT(system(cmd), 0);
	/* it is a real schema-5 file */
	{
		sqlite3 *db;
		sqlite3_stmt *st;

		CHECK(sqlite3_open(path, &db) == SQLITE_OK);
		CHECK(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st,
					 NULL) == SQLITE_OK);
		CHECK(sqlite3_step(st) == SQLITE_ROW);
		CHECK_INT(sqlite3_column_int(st, 0), 5);
		sqlite3_finalize(st);
		sqlite3_close(db);
	}
	CHECK_INT(catalog_open(path, 0, &cat), 0);
	if (!cat)
		return;
	CHECK_INT(catalog_schema_version(cat), CATALOG_SCHEMA_VERSION);
	/* what it held survives */
	CHECK_INT(catalog_dataset_get(cat, "imagenet", &ds), 0);
	CHECK(ds.pinned);
	catalog_dataset_release(&ds);
	CHECK_INT(catalog_lifecycle_list(cat, &v, &n), 0);
	CHECK_INT(n, 0);
	free(v);

	r = rule("llm-*", 2, 7, 30, 1000, "s3://arch/ckpt/");
	snprintf(r.storage_class, sizeof(r.storage_class), "GLACIER");
	CHECK_INT(catalog_lifecycle_add(cat, &r, &who, msg, sizeof(msg)), 0);
	CHECK(r.id > 0);
	CHECK_INT(catalog_lifecycle_add(cat, &r, &who, msg, sizeof(msg)),
		  -EEXIST);
	r = rule("vit", 1, 30, 7, 0, "s3://arch/");
	CHECK_INT(catalog_lifecycle_add(cat, &r, &who, msg, sizeof(msg)),
		  -EINVAL);
	r = rule("vit", 1, 0, 7, 0, NULL);
	CHECK_INT(catalog_lifecycle_add(cat, &r, NULL, NULL, 0), 0);
	CHECK_INT(catalog_lifecycle_list(cat, &v, &n), 0);
	CHECK_INT(n, 2);
	if (n == 2) {
		CHECK_STR(v[0].pattern, "llm-*");
		CHECK_STR(v[0].storage_class, "GLACIER");
		CHECK_STR(v[0].archive, "s3://arch/ckpt/");
		CHECK_INT(v[0].keep_every, 1000);
		CHECK_STR(v[1].pattern, "vit");
		CHECK_INT(v[1].delete_days, 7);
	}
	free(v);
	CHECK_INT(catalog_lifecycle_remove(cat, 0, "nope", &who, NULL),
		  -ENOENT);
	CHECK_INT(catalog_lifecycle_remove(cat, 0, "llm-*", &who, &gone), 0);
	CHECK_STR(gone.pattern, "llm-*");
	CHECK_INT(catalog_lifecycle_remove(cat, r.id, NULL, &who, NULL), 0);
	CHECK_INT(catalog_lifecycle_list(cat, &v, &n), 0);
	CHECK_INT(n, 0);
	free(v);
	/* two adds and two removes audited; the refused ones not */
	CHECK_INT(catalog_audit_list(cat, 0, count_audit, &audits), 0);
	CHECK_INT(audits, 4);
	catalog_close(cat);
}

int main(void)
{
	char dir[] = "/tmp/test_lifecycle.XXXXXX";
	char cmd[64];

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	test_check();
	test_match_step();
	test_plan();
	test_plan_mtime();
	test_catalog(dir);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd))
		fprintf(stderr, "cannot remove %s\n", dir);
	return check_result();
}
