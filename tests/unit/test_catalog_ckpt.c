// SPDX-License-Identifier: MIT
/*
 * catalog_ckpt: the table of checkpoint files this node published, and
 * catalog_ckpt_log, its writer behind ckpt's hooks.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "dstage/ckpt.h"

#include "catalogtest.h"

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
	CHECK_INT(catalog_ckpt_record(cat, s1, "j/x", sha_a, 10, "\"e1\"", -1),
		  0);
	CHECK_INT(catalog_ckpt_record(cat, s2, "j/x", sha_b, 20, "", -1), 0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/x", &c), 0);
	CHECK_STR(c.sha256, sha_a);
	CHECK(c.size == 10);
	CHECK_STR(c.etag, "\"e1\"");
	CHECK(c.published > 0);
	/* a new version replaces the row */
	CHECK_INT(catalog_ckpt_record(cat, s1, "j/x", sha_b, 11, "\"e2\"", -1),
		  0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/x", &c), 0);
	CHECK_STR(c.sha256, sha_b);
	CHECK(c.size == 11);
	/* bounds */
	CHECK_INT(catalog_ckpt_record(cat, s1, "j/y", "abc", 1, "", -1),
		  -EINVAL);
	sha_a[3] = 'G';
	CHECK_INT(catalog_ckpt_record(cat, s1, "j/y", sha_a, 1, "", -1),
		  -EINVAL);
	sha_a[3] = 'a';
	CHECK_INT(catalog_ckpt_record(cat, s1, "", sha_a, 1, "", -1), -EINVAL);

	/* a directory with a UTF-8 name moves with everything below it,
	 * and nothing that only starts with its name ("d\xc3\xa9x") */
	CHECK_INT(catalog_ckpt_record(cat, s1, "d\xc3\xa9/1", sha_a, 1, "", -1),
		  0);
	CHECK_INT(
		catalog_ckpt_record(cat, s1, "d\xc3\xa9/s/2", sha_a, 2, "", -1),
		0);
	CHECK_INT(catalog_ckpt_record(cat, s1, "d\xc3\xa9x", sha_a, 3, "", -1),
		  0);
	CHECK_INT(catalog_ckpt_record(cat, s1, "new/old", sha_b, 4, "", -1), 0);
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
	CHECK_INT(catalog_ckpt_record(cat, s1, "new0", sha_a, 5, "", -1), 0);
	CHECK_INT(catalog_ckpt_forget(cat, s1, "new"), 0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "new/s/2", &c), -ENOENT);
	CHECK_INT(catalog_ckpt_get(cat, s1, "new0", &c), 0);
	CHECK_INT(catalog_ckpt_forget(cat, s1, "nothing"), 0);
}

struct owners {
	unsigned n;
	int64_t uid_sum;
	uint64_t size_sum;
	char first[16];
};

static int owners_cb(void *arg, const char *key, int64_t uid, uint64_t size)
{
	struct owners *o = arg;

	if (!o->n++)
		snprintf(o->first, sizeof(o->first), "%s", key);
	o->uid_sum += uid;
	o->size_sum += size;
	return o->n == 3 ? 7 : 0;
}

/* Schema 10: each row's owner (-1: not recorded), and the walk over the
 * rows of one store whose owner is recorded (stopped by its callback). */
static void test_ckpt_owners(struct catalog *cat)
{
	const char *s = "file:///owned/";
	struct owners o = { 0 };
	struct catalog_ckpt c;
	char sha[65];

	memset(sha, 'd', 64);
	sha[64] = '\0';
	CHECK_INT(catalog_ckpt_record(cat, s, "o/a", sha, 5, "", 1000), 0);
	CHECK_INT(catalog_ckpt_record(cat, s, "o/b", sha, 7, "", 1001), 0);
	CHECK_INT(catalog_ckpt_record(cat, s, "o/c", sha, 9, "", -1), 0);
	CHECK_INT(catalog_ckpt_record(cat, "s3://other/", "o/d", sha, 1, "", 5),
		  0);
	CHECK_INT(catalog_ckpt_get(cat, s, "o/a", &c), 0);
	CHECK(c.uid == 1000);
	CHECK_INT(catalog_ckpt_get(cat, s, "o/c", &c), 0);
	CHECK(c.uid == -1);
	CHECK_INT(catalog_ckpt_each(cat, s, owners_cb, &o), 0);
	CHECK(o.n == 2);
	CHECK_STR(o.first, "o/a");
	CHECK(o.uid_sum == 2001);
	CHECK(o.size_sum == 12);
	/* a replaced row takes the new owner */
	CHECK_INT(catalog_ckpt_record(cat, s, "o/b", sha, 3, "", 1000), 0);
	CHECK_INT(catalog_ckpt_record(cat, s, "o/e", sha, 4, "", 1002), 0);
	/* three rows now: the callback's 7 at the third comes back */
	memset(&o, 0, sizeof(o));
	CHECK_INT(catalog_ckpt_each(cat, s, owners_cb, &o), 7);
	CHECK(o.uid_sum == 3002);
	/* and stops the walk before a fourth */
	memset(&o, 0, sizeof(o));
	CHECK_INT(catalog_ckpt_record(cat, s, "o/f", sha, 4, "", 1003), 0);
	CHECK_INT(catalog_ckpt_each(cat, s, owners_cb, &o), 7);
	CHECK(o.n == 3);
	CHECK(o.size_sum == 12);
}

/* The hooks of a catalog_ckpt_log write what cat (another connection to
 * the same file) then reads; without a catalog they record nothing. */
static void test_ckpt_log(struct catalog *cat)
{
	const char *s1 = "file:///logged/";
	struct catalog_ckpt_log *l = NULL;
	struct catalog_ckpt c;
	struct ckpt_hooks h;
	char sha[65], bad[192];

	memset(sha, 'c', 64);
	sha[64] = '\0';
	CHECK_INT(catalog_ckpt_log_new(dbpath, &l), 0);
	if (!l)
		return;
	catalog_ckpt_log_hooks(l, &h);
	CHECK(h.arg == l);
	h.published(h.arg, s1, "j/1", sha, 7, "\"e\"", 4242);
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/1", &c), 0);
	CHECK(c.size == 7);
	CHECK(c.uid == 4242);
	CHECK_STR(c.etag, "\"e\"");
	h.renamed(h.arg, s1, "j", "k");
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/1", &c), -ENOENT);
	CHECK_INT(catalog_ckpt_get(cat, s1, "k/1", &c), 0);
	h.removed(h.arg, s1, "k/1");
	CHECK_INT(catalog_ckpt_get(cat, s1, "k/1", &c), -ENOENT);
	/* a bad record is logged, not fatal */
	h.published(h.arg, s1, "j/2", "not a sha", 1, "", 0);
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/2", &c), -ENOENT);
	catalog_ckpt_log_free(l);
	catalog_ckpt_log_free(NULL);

	/* no catalog there, or none configured: nothing recorded */
	snprintf(bad, sizeof(bad), "%s/missing/dir/catalog.db", dir);
	CHECK_INT(catalog_ckpt_log_new(bad, &l), 0);
	if (l) {
		catalog_ckpt_log_hooks(l, &h);
		h.published(h.arg, s1, "j/3", sha, 1, "", 0);
		h.published(h.arg, s1, "j/4", sha, 1, "", 0);
		catalog_ckpt_log_free(l);
	}
	CHECK_INT(catalog_ckpt_log_new(NULL, &l), 0);
	if (l) {
		catalog_ckpt_log_hooks(l, &h);
		h.published(h.arg, s1, "j/5", sha, 1, "", 0);
		h.removed(h.arg, s1, "j/5");
		catalog_ckpt_log_free(l);
	}
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/3", &c), -ENOENT);
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/5", &c), -ENOENT);
	catalog_ckpt_published(NULL, s1, "j/6", sha, 1, "", -1);
	catalog_ckpt_published(cat, s1, "j/6", sha, 1, "", -1);
	CHECK_INT(catalog_ckpt_get(cat, s1, "j/6", &c), 0);
}

int main(void)
{
	struct catalog *cat = NULL;

	if (catalogtest_init())
		return 1;
	CHECK_INT(catalog_open(dbpath, CATALOG_CREATE, &cat), 0);
	if (cat) {
		test_ckpt_files(cat);
		test_ckpt_owners(cat);
		test_ckpt_log(cat);
		catalog_close(cat);
	}
	return catalogtest_done();
}
