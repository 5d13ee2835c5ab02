// SPDX-License-Identifier: MIT
/*
 * catalog_dataset: a dataset's policy (pinned, priority, quota, group),
 * the list of datasets, and removal (gone for readers, rows purged, the
 * name free again).
 */
#include <errno.h>
#include <string.h>

#include "check.h"

#include "catalogtest.h"

static int list_ds(void *arg, const struct catalog_dataset *ds)
{
	struct names *nm = arg;
	size_t len = strlen(nm->buf);

	snprintf(nm->buf + len, sizeof(nm->buf) - len, "%s%s:%d:%d",
		 len ? "," : "", ds->name, ds->pinned, ds->priority);
	return 0;
}

/* Two datasets as registration leaves them: "ds" with a manifest of a
 * few objects, "files" added but not yet registered. */
static void setup(struct catalog *cat)
{
	static const char *const keys[] = { "a/b", "dir/f", "ok", NULL };
	struct fake f = { .keys = keys, .fail_at = -1 };

	CHECK_INT(catalog_dataset_add(cat, "ds", "file:///fake", "staff"), 0);
	CHECK_INT(reg(cat, "ds", &f), 0);
	CHECK(sql_int(DS_OBJECTS) > 0);
	CHECK(sql_int(DS_DIRS) > 0);
	CHECK_INT(catalog_dataset_add(cat, "files", "file:///files", NULL), 0);
}

static void test_admin(struct catalog *cat)
{
	struct catalog_dataset ds;
	struct names nm;

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

	/* Remove: gone for readers, rows purged, name free again. */
	CHECK_INT(catalog_dataset_remove(cat, "ds"), 0);
	CHECK_INT(catalog_dataset_get(cat, "ds", &ds), -ENOENT);
	CHECK_INT(catalog_dataset_remove(cat, "ds"), -ENOENT);
	CHECK_INT(sql_int(DS_OBJECTS), 0);
	CHECK_INT(sql_int(DS_DIRS), 0);
	CHECK_INT(catalog_dataset_add(cat, "ds", "file:///again", NULL), 0);
}

int main(void)
{
	struct catalog *cat = NULL;

	if (catalogtest_init())
		return 1;
	CHECK_INT(catalog_open(dbpath, CATALOG_CREATE, &cat), 0);
	if (cat) {
		setup(cat);
		test_admin(cat);
		catalog_close(cat);
	}
	return catalogtest_done();
}
