/* SPDX-License-Identifier: MIT */
/*
 * catalog internals shared with the tests: registration from any key
 * stream, and building a schema of an older version.
 */
#ifndef DSTAGE_CATALOG_INTERNAL_H
#define DSTAGE_CATALOG_INTERNAL_H

#include <sqlite3.h>

#include "dstage/catalog.h"
#include "dstage/objstore.h"
#include "dstage/sha256sums.h"

/* Where registration gets its keys and the bytes of its sums key from. */
struct catalog_source {
	/* List every key in byte order, calling cb as objstore_list does
	 * (stop and return cb's value when it returns non-zero). */
	int (*list)(void *arg, objstore_list_cb cb, void *cb_arg);
	/* Feed the whole object oi->key (as listed) to p with
	 * sha256sums_feed; the caller calls sha256sums_finish. */
	int (*read)(void *arg, const struct objstore_info *oi,
		    struct sha256sums_parser *p);
	void *arg;
};

/* catalog_register() with an arbitrary source. Same contract. */
int catalog_register_source(struct catalog *cat, const char *name,
			    const struct catalog_source *src);

/*
 * Migrate the schema of db from its user_version up to version `to` (at most
 * CATALOG_SCHEMA_VERSION), in one transaction. Tests use it to build a
 * catalog of an earlier version. Returns 0 or -errno.
 */
int catalog_migrate(sqlite3 *db, int to);

/*
 * The -errno for a SQLite result code, for every module that talks to the
 * catalog file: BUSY/LOCKED -EBUSY, FULL -ENOSPC, CANTOPEN/PERM/READONLY/AUTH
 * -EACCES, NOMEM -ENOMEM, CORRUPT/NOTADB -EUCLEAN, others -EIO; 0 for
 * OK/ROW/DONE.
 */
int catalog_sqlite_errno(int rc);

/* Rows per write transaction while registering or purging. */
#define CATALOG_BATCH 20000

#endif
