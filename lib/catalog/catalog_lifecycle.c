// SPDX-License-Identifier: MIT
/*
 * catalog_lifecycle: the table of checkpoint lifecycle rules (schema 6, see
 * include/dstage/catalog.h). Part of the catalog: one connection, no lock
 * of its own; each change and its audit record are one BEGIN IMMEDIATE
 * transaction, so a rule never changes without its record.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "catalog_i.h"
#include "dstage/grow.h"
#include "dstage/lifecycle.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"

#define RULE_COLS                                                        \
	"id, pattern, keep_local, shared_days, delete_days, keep_every," \
	" archive, storage_class"

static void catalog_lifecycle_fill(sqlite3_stmt *st, struct lifecycle_rule *r)
{
	const char *s;

	memset(r, 0, sizeof(*r));
	r->id = sqlite3_column_int64(st, 0);
	s = (const char *)sqlite3_column_text(st, 1);
	snprintf(r->pattern, sizeof(r->pattern), "%s", s ? s : "");
	r->keep_local = (unsigned)sqlite3_column_int64(st, 2);
	r->shared_days = (unsigned)sqlite3_column_int64(st, 3);
	r->delete_days = (unsigned)sqlite3_column_int64(st, 4);
	r->keep_every = (unsigned)sqlite3_column_int64(st, 5);
	s = (const char *)sqlite3_column_text(st, 6);
	snprintf(r->archive, sizeof(r->archive), "%s", s ? s : "");
	s = (const char *)sqlite3_column_text(st, 7);
	snprintf(r->storage_class, sizeof(r->storage_class), "%s", s ? s : "");
}

static int catalog_lifecycle_audit(struct catalog *cat,
				   const struct catalog_audit *who,
				   const char *action,
				   const struct lifecycle_rule *r, bool added)
{
	struct catalog_audit a = { 0 };
	char desc[LIFECYCLE_PATTERN_MAX + LIFECYCLE_URL_MAX + 200];

	if (who) {
		a.uid = who->uid;
		a.user = who->user;
	}
	a.action = action;
	a.target = r->pattern;
	lifecycle_rule_str(r, desc, sizeof(desc));
	if (added)
		a.new_value = desc;
	else
		a.old_value = desc;
	return catalog_audit_add(cat, &a);
}

int catalog_lifecycle_add(struct catalog *cat, struct lifecycle_rule *r,
			  const struct catalog_audit *who, char *msg,
			  size_t len)
{
	char local[512];
	sqlite3_stmt *st = NULL;
	int rc, ret;

	if (!msg || !len) {
		msg = local;
		len = sizeof(local);
	}
	ret = lifecycle_rule_check(r, msg, len);
	if (ret) {
		log_error("%s", msg);
		return ret;
	}
	ret = catalog_exec(cat->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = catalog_prepare(cat, "lifecycle rule add",
			      "INSERT INTO lifecycle_rules(pattern,"
			      " keep_local, shared_days, delete_days,"
			      " keep_every, archive, storage_class, created)"
			      " VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
			      CATALOG_ARGS(CATALOG_TEXT(r->pattern),
					   CATALOG_INT(r->keep_local),
					   CATALOG_INT(r->shared_days),
					   CATALOG_INT(r->delete_days),
					   CATALOG_INT(r->keep_every),
					   CATALOG_TEXT(r->archive),
					   CATALOG_TEXT(r->storage_class),
					   CATALOG_INT(timeutil_real_s())),
			      &st);
	if (ret)
		goto err;
	rc = sqlite3_step(st);
	if ((rc & 0xff) == SQLITE_CONSTRAINT) {
		snprintf(msg, len,
			 "lifecycle rule for '%s' exists; remove it first "
			 "(stager lifecycle remove '%s')",
			 r->pattern, r->pattern);
		ret = -EEXIST;
		goto err;
	}
	if (rc != SQLITE_DONE) {
		ret = catalog_sqlerr(cat->db, rc, "lifecycle rule add");
		goto err;
	}
	r->id = sqlite3_last_insert_rowid(cat->db);
	ret = catalog_lifecycle_audit(cat, who, "lifecycle.add", r, true);
	if (ret)
		goto err;
	sqlite3_finalize(st);
	return catalog_exec(cat->db, "COMMIT");
err:
	sqlite3_finalize(st);
	catalog_rollback(cat->db);
	return ret;
}

int catalog_lifecycle_remove(struct catalog *cat, int64_t id,
			     const char *pattern,
			     const struct catalog_audit *who,
			     struct lifecycle_rule *removed)
{
	struct lifecycle_rule r;
	sqlite3_stmt *st = NULL;
	int ret;

	if (!id && (!pattern || !*pattern))
		return -EINVAL;
	ret = catalog_exec(cat->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = catalog_prepare(
		cat, "lifecycle rule find",
		"SELECT " RULE_COLS " FROM lifecycle_rules"
		" WHERE id = ?1 OR (?1 = 0 AND pattern = ?2)",
		CATALOG_ARGS(CATALOG_INT(id),
			     CATALOG_TEXT(pattern ? pattern : "")),
		&st);
	if (!ret)
		ret = catalog_step(cat, st, "lifecycle rule find");
	if (ret)
		goto err;
	catalog_lifecycle_fill(st, &r);
	sqlite3_finalize(st);
	st = NULL;
	ret = catalog_exec_id(cat, "DELETE FROM lifecycle_rules WHERE id = ?1",
			      r.id, NULL);
	if (!ret)
		ret = catalog_lifecycle_audit(cat, who, "lifecycle.remove", &r,
					      false);
	if (ret)
		goto err;
	ret = catalog_exec(cat->db, "COMMIT");
	if (!ret && removed)
		*removed = r;
	return ret;
err:
	sqlite3_finalize(st);
	catalog_rollback(cat->db);
	return ret;
}

/* The rules catalog_lifecycle_list has read so far. */
struct catalog_lifecycle_rules {
	struct lifecycle_rule *v;
	size_t cap, cnt;
};

/* catalog_each's row function of catalog_lifecycle_list: append the row
 * to the rules, 0 or -ENOMEM. */
static int catalog_lifecycle_row(void *arg, sqlite3_stmt *st)
{
	struct catalog_lifecycle_rules *rs = arg;

	if (GROW_ONE(rs->v, rs->cnt, rs->cap, 8))
		return -ENOMEM;
	catalog_lifecycle_fill(st, &rs->v[rs->cnt++]);
	return 0;
}

int catalog_lifecycle_list(struct catalog *cat, struct lifecycle_rule **out,
			   size_t *n)
{
	struct catalog_lifecycle_rules rs = { 0 };
	int ret;

	*out = NULL;
	*n = 0;
	ret = catalog_each(cat, "lifecycle list",
			   "SELECT " RULE_COLS " FROM lifecycle_rules"
			   " ORDER BY id",
			   NULL, 0, catalog_lifecycle_row, &rs);
	if (ret) {
		free(rs.v);
		return ret;
	}
	*out = rs.v;
	*n = rs.cnt;
	return 0;
}
