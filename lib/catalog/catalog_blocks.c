// SPDX-License-Identifier: MIT
/*
 * catalog_blocks: the catalog's per-block cache state (the blocks table of
 * schema 2: object_id, block, state, checksum), as cachectl gc sees it: the
 * objects that have rows, and forgetting an object's rows once its cache
 * file is gone. Stateless: each call is one statement on cat's connection
 * (one connection per thread, see catalog.c).
 */
#include <errno.h>
#include <sqlite3.h>

#include "catalog_i.h"

/* catalog_each's row function of catalog_blocks_list. */
static int catalog_blocks_row(void *arg, sqlite3_stmt *st)
{
	const struct catalog_each_cb *e = arg;
	struct catalog_blocks_obj b = {
		.object_id = sqlite3_column_int64(st, 0),
		.dataset = (const char *)sqlite3_column_text(st, 1),
		.path = (const char *)sqlite3_column_text(st, 2),
		.etag = (const char *)sqlite3_column_text(st, 3),
		.size = (uint64_t)sqlite3_column_int64(st, 4),
		.rows = (uint64_t)sqlite3_column_int64(st, 5),
	};

	if (!b.dataset || !b.path || !b.etag)
		return -ENOMEM; /* SQLite's text conversion failed */
	return e->fn.blocks(e->arg, &b);
}

int catalog_blocks_list(struct catalog *cat, catalog_blocks_cb cb, void *arg)
{
	struct catalog_each_cb e = { .fn.blocks = cb, .arg = arg };

	return catalog_each(cat, "blocks list",
			    "SELECT b.object_id, d.name, o.path,"
			    " coalesce(o.etag, ''), o.size, count(*)"
			    " FROM blocks b"
			    " JOIN objects o ON o.id = b.object_id"
			    " JOIN manifests m ON m.id = o.manifest_id"
			    " JOIN datasets d ON d.id = m.dataset_id"
			    " GROUP BY b.object_id ORDER BY b.object_id",
			    NULL, 0, catalog_blocks_row, &e);
}

int catalog_blocks_forget(struct catalog *cat, int64_t object_id,
			  uint64_t *rows)
{
	int changes = 0;
	int ret =
		catalog_exec_id(cat, "DELETE FROM blocks WHERE object_id = ?1",
				object_id, &changes);

	if (rows)
		*rows = ret ? 0 : (uint64_t)changes;
	return ret;
}
