// SPDX-License-Identifier: MIT
/*
 * catalog_register: registration (or refresh) of a dataset. It lists the
 * source once into a BUILDING manifest in batches, then flips it CURRENT in
 * one transaction (the manifest state machine is at the top of catalog.c).
 * The state of one registration (struct catalog_reg) belongs to the
 * registering thread alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "catalog_i.h"
#include "dstage/keypath.h"
#include "dstage/log.h"

#define SUMS_CHUNK (1u << 20)

/* ---- registration ---- */

/*
 * Listed rows wait in a batch, outside any transaction; a full batch is
 * written in as few short transactions as it takes (catalog_reg_flush). So
 * the write lock is never held while the source is listed or read, which
 * takes most of the time (a stat per file, a request per page), and other
 * writers (the job queue, requests, audit) get in between batches.
 */
#define REG_BATCH_ROWS CATALOG_BATCH
#define REG_BATCH_BYTES (4u << 20) /* keys, ETags and hashes of a batch */
#define REG_NONE UINT32_MAX

enum reg_kind {
	REG_OBJ, /* an object: key, size, etag (aux), mtime */
	REG_DIR, /* a directory marker "a/b/": key without its '/' */
	REG_SUM, /* a sums entry: key, its 32-byte hash (aux) */
};

/* One row of a batch; strings live in the batch's arena. */
struct catalog_reg_row {
	uint32_t key; /* offset of the key in the arena */
	uint32_t len;
	uint32_t aux; /* offset of the etag (NUL-ended) or hash; REG_NONE */
	uint32_t kind;
	int64_t size;
	int64_t mtime;
};

/*
 * State of one registration. Only the registering thread touches it.
 * Invariants: rows[0..n) and arena[0..used) are the listed rows not yet
 * written; in_tx only inside catalog_reg_flush and the single-transaction
 * steps (clashes), never while the source is listed or read.
 */
struct catalog_reg {
	struct catalog *cat;
	const char *name;
	int64_t ds_id;
	int64_t mf_id;
	int64_t now;
	bool in_tx; /* a batch transaction is open */
	int64_t tx_start_ns; /* when it began */
	uint64_t bad;
	uint64_t objects; /* objects written (not the skipped ones) */
	uint64_t bytes; /* sum of the sizes listed and kept, <= INT64_MAX */
	bool has_sums;
	struct objstore_info sums; /* .key points to sums_key */
	char sums_key[KEYPATH_MAX]; /* the dataset's, read at the start */
	size_t last_dir_len; /* last directory known to exist */
	char last_dir[KEYPATH_MAX];
	/* the batch */
	struct catalog_reg_row *rows;
	unsigned n;
	char *arena;
	size_t used;
	/* what the time went on, for the log */
	unsigned n_tx;
	int64_t write_ns; /* inside write transactions */
	int64_t max_tx_ns; /* the longest one */
};

/* Begin a write transaction; the manifest must still be BUILDING (else a
 * newer registration or a removal took over). */
static int catalog_reg_begin(struct catalog_reg *r)
{
	struct catalog *cat = r->cat;
	sqlite3_stmt *st = NULL;
	int rc, ret;

	if (r->in_tx)
		return 0;
	ret = catalog_exec(cat->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	r->in_tx = true;
	r->tx_start_ns = timeutil_mono_ns();
	ret = catalog_stmt(cat, ST_MF_STATE, &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, r->mf_id);
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		ret = catalog_sqlerr(cat->db, rc, "manifest state");
	else if (rc == SQLITE_DONE || sqlite3_column_int(st, 0) != MF_BUILDING)
		ret = -EBUSY;
	catalog_stmt_done(st);
	if (ret == -EBUSY)
		log_error("catalog: dataset %s: registration superseded",
			  r->name);
	return ret;
}

/* Commit the open write transaction, if any. */
static int catalog_reg_commit(struct catalog_reg *r)
{
	int64_t held;

	if (!r->in_tx)
		return 0;
	r->in_tx = false;
	held = timeutil_mono_ns() - r->tx_start_ns;
	r->n_tx++;
	r->write_ns += held;
	if (held > r->max_tx_ns)
		r->max_tx_ns = held;
	return catalog_exec(r->cat->db, "COMMIT");
}

/* Make sure directory path (len bytes, valid) and its ancestors exist. */
static int catalog_reg_dir(struct catalog_reg *r, const char *path, size_t len)
{
	size_t orig = len;
	int changes, ret;

	while (len > 0) {
		size_t plen = keypath_parent_len(path, len);

		if (len == r->last_dir_len && !memcmp(path, r->last_dir, len))
			break;
		ret = catalog_stmt_run(r->cat, ST_DIR_INSERT, "insert dir",
				       CATALOG_ARGS(CATALOG_INT(r->mf_id),
						    CATALOG_TEXTN(path, len),
						    CATALOG_TEXTN(path, plen)),
				       &changes);
		if (ret)
			return ret;
		if (changes == 0)
			break; /* it exists, so do its ancestors */
		len = plen;
	}
	memcpy(r->last_dir, path, orig);
	r->last_dir_len = orig;
	return 0;
}

static void catalog_reg_bad(struct catalog_reg *r, const char *key, size_t len,
			    const char *why)
{
	char buf[1024];

	r->bad++;
	log_warn("catalog: dataset %s: skipping key '%s': %s", r->name,
		 keypath_printable(key, len, buf, sizeof(buf)), why);
}

/* Write one object row of the batch (in a transaction). */
static int catalog_reg_put_obj(struct catalog_reg *r,
			       const struct catalog_reg_row *w)
{
	const char *key = r->arena + w->key;
	const char *etag = w->aux != REG_NONE ? r->arena + w->aux : NULL;
	int changes, ret;

	ret = catalog_stmt_run(
		r->cat, ST_OBJ_INSERT, "insert object",
		CATALOG_ARGS(
			CATALOG_INT(r->mf_id), CATALOG_TEXTN(key, w->len),
			CATALOG_TEXTN(key, keypath_parent_len(key, w->len)),
			CATALOG_INT(w->size), CATALOG_TEXT(etag),
			CATALOG_INT(w->mtime)),
		&changes);
	if (ret)
		return ret;
	if (changes == 0) {
		r->bytes -= (uint64_t)w->size; /* counted when listed */
		catalog_reg_bad(r, key, w->len, "duplicate key");
		return 0;
	}
	r->objects++;
	ret = catalog_reg_dir(r, key, keypath_parent_len(key, w->len));
	if (ret)
		return ret;
	if (w->len == strlen(r->sums_key) &&
	    !memcmp(key, r->sums_key, w->len)) {
		r->has_sums = true;
		r->sums.key = r->sums_key;
		r->sums.size = (uint64_t)w->size;
		r->sums.mtime = w->mtime;
		snprintf(r->sums.etag, sizeof(r->sums.etag), "%s",
			 w->aux != REG_NONE ? r->arena + w->aux : "");
	}
	return 0;
}

/* Write one sums entry of the batch (in a transaction). */
static int catalog_reg_put_sum(struct catalog_reg *r,
			       const struct catalog_reg_row *w)
{
	const char *name = r->arena + w->key;
	char buf[1024];
	int changes, ret;

	ret = catalog_stmt_run(
		r->cat, ST_SUMS_UPDATE, "set expected sha256",
		CATALOG_ARGS(CATALOG_INT(r->mf_id), CATALOG_TEXTN(name, w->len),
			     CATALOG_BLOB(r->arena + w->aux, 32)),
		&changes);
	if (ret)
		return ret;
	if (changes == 0)
		log_warn("catalog: dataset %s: %s names '%s', which is not a "
			 "file of the dataset",
			 r->name, r->sums_key,
			 keypath_printable(name, w->len, buf, sizeof(buf)));
	return 0;
}

/*
 * Write the batch and empty it: in transactions of at most about
 * CATALOG_TX_MAX_MS each (then commit, yield to the writers waiting, go
 * on), so that a slow disk or a loaded machine cannot make one batch hold
 * the write lock for long.
 */
static int catalog_reg_flush(struct catalog_reg *r)
{
	const int64_t max_ns = (int64_t)CATALOG_TX_MAX_MS * 1000000;
	int ret = 0;

	for (unsigned i = 0; i < r->n && !ret; i++) {
		const struct catalog_reg_row *w = &r->rows[i];

		ret = catalog_reg_begin(r);
		if (ret)
			break;
		if (w->kind == REG_OBJ)
			ret = catalog_reg_put_obj(r, w);
		else if (w->kind == REG_DIR)
			ret = catalog_reg_dir(r, r->arena + w->key, w->len);
		else
			ret = catalog_reg_put_sum(r, w);
		if (!ret && i + 1 < r->n && (i & 63) == 63 &&
		    timeutil_mono_ns() - r->tx_start_ns >= max_ns) {
			ret = catalog_reg_commit(r);
			catalog_yield();
		}
	}
	if (!ret)
		ret = catalog_reg_commit(r);
	r->n = 0;
	r->used = 0;
	return ret;
}

/* Copy len bytes of s (and a NUL) into the arena: its offset. The caller
 * made room (catalog_reg_room). */
static uint32_t catalog_reg_copy(struct catalog_reg *r, const void *s,
				 size_t len)
{
	uint32_t off = (uint32_t)r->used;

	memcpy(r->arena + r->used, s, len);
	r->arena[r->used + len] = '\0';
	r->used += len + 1;
	return off;
}

/* A free row with room for bytes of strings: flushes a full batch. */
static int catalog_reg_room(struct catalog_reg *r, size_t bytes,
			    struct catalog_reg_row **out)
{
	int ret;

	if (bytes > REG_BATCH_BYTES)
		return -ENAMETOOLONG; /* no source has keys that long */
	if (r->n == REG_BATCH_ROWS || r->used + bytes > REG_BATCH_BYTES) {
		ret = catalog_reg_flush(r);
		if (ret)
			return ret;
	}
	*out = &r->rows[r->n++];
	return 0;
}

static int catalog_reg_key(void *arg, const struct objstore_info *oi)
{
	struct catalog_reg *r = arg;
	const char *key = oi->key, *why;
	size_t len = strlen(key), elen = strlen(oi->etag);
	struct catalog_reg_row *w;
	int ret;

	if (oi->skipped) { /* an entry the source cannot serve as a file */
		catalog_reg_bad(r, key, len, oi->skipped);
		return 0;
	}
	if (keypath_dir_marker(key, len)) {
		ret = catalog_reg_room(r, len, &w);
		if (ret)
			return ret;
		*w = (struct catalog_reg_row){ .kind = REG_DIR,
					       .len = (uint32_t)len - 1,
					       .aux = REG_NONE };
		w->key = catalog_reg_copy(r, key, len - 1);
		return 0;
	}
	if (keypath_check(key, len, &why)) {
		catalog_reg_bad(r, key, len, why);
		return 0;
	}
	if (oi->size > INT64_MAX) {
		catalog_reg_bad(r, key, len, "size out of range");
		return 0;
	}
	/* The manifest's total is an SQLite integer: a source whose sizes
	 * add up past INT64_MAX would make every refresh fail. */
	if (oi->size > (uint64_t)INT64_MAX - r->bytes) {
		catalog_reg_bad(r, key, len,
				"the dataset's total size would pass "
				"INT64_MAX bytes (8 EiB)");
		return 0;
	}
	ret = catalog_reg_room(r, len + 1 + elen + 1, &w);
	if (ret)
		return ret;
	*w = (struct catalog_reg_row){ .kind = REG_OBJ,
				       .len = (uint32_t)len,
				       .aux = REG_NONE,
				       .size = (int64_t)oi->size,
				       .mtime = oi->mtime };
	w->key = catalog_reg_copy(r, key, len);
	if (elen)
		w->aux = catalog_reg_copy(r, oi->etag, elen);
	r->bytes += oi->size;
	return 0;
}

/*
 * Drop every object whose path is also a directory ("a" and "a/b"): the
 * directory wins, since it may hold many files. Done over the tables, so it
 * does not depend on listing order ("a" < "a-x" < "a/b").
 */
static int catalog_reg_clashes(struct catalog_reg *r)
{
	struct catalog *cat = r->cat;
	sqlite3_stmt *st;
	uint64_t found = 0, bytes = 0;
	int ret, n = 0;
	char buf[1024];

	/* Found with a read (no write lock), one probe per directory. */
	ret = catalog_prepare(cat, "find clashes",
			      "SELECT o.path, o.size FROM dirs x CROSS JOIN"
			      " objects o ON o.manifest_id = x.manifest_id"
			      " AND o.path = x.path WHERE x.manifest_id = ?",
			      CATALOG_ARGS(CATALOG_INT(r->mf_id)), &st);
	if (ret)
		return ret;
	while (!(ret = catalog_step(cat, st, "find clashes"))) {
		const char *p = (const char *)sqlite3_column_text(st, 0);

		log_warn("catalog: dataset %s: skipping key '%s': "
			 "both a file and a directory prefix",
			 r->name,
			 keypath_printable(p, strlen(p), buf, sizeof(buf)));
		found++;
		bytes += (uint64_t)sqlite3_column_int64(st, 1);
	}
	if (ret == -ENOENT)
		ret = 0;
	sqlite3_finalize(st);
	if (ret || !found)
		return ret;
	ret = catalog_reg_begin(r);
	if (ret)
		return ret;
	ret = catalog_exec_id(cat,
			      "DELETE FROM objects WHERE manifest_id = ?1"
			      " AND path IN (SELECT path FROM dirs"
			      " WHERE manifest_id = ?1)",
			      r->mf_id, &n);
	if (ret)
		return ret;
	if ((uint64_t)n != found) {
		log_error("catalog: dataset %s: %llu file/directory clashes "
			  "found, %d deleted",
			  r->name, (unsigned long long)found, n);
		return -EIO;
	}
	r->bad += found;
	r->objects -= found;
	r->bytes -= bytes;
	return catalog_reg_commit(r);
}

static int catalog_sums_entry(void *arg, const char *name, size_t len,
			      const unsigned char hash[32], bool binary)
{
	struct catalog_reg *r = arg;
	struct catalog_reg_row *w;
	int ret;

	(void)binary;
	ret = catalog_reg_room(r, len + 1 + 32 + 1, &w);
	if (ret)
		return ret;
	*w = (struct catalog_reg_row){ .kind = REG_SUM, .len = (uint32_t)len };
	w->key = catalog_reg_copy(r, name, len);
	w->aux = catalog_reg_copy(r, hash, 32);
	return 0;
}

static int catalog_sums_bad(void *arg, unsigned long line, const char *why)
{
	struct catalog_reg *r = arg;

	log_warn("catalog: dataset %s: %s:%lu: %s", r->name, r->sums_key, line,
		 why);
	return 0;
}

static int catalog_reg_sums(struct catalog_reg *r,
			    const struct catalog_source *src)
{
	struct sha256sums_parser *p;
	int ret;

	p = malloc(sizeof(*p));
	if (!p)
		return -ENOMEM;
	sha256sums_init(p, catalog_sums_entry, catalog_sums_bad, r);
	ret = src->read(src->arg, &r->sums, p);
	if (!ret)
		ret = sha256sums_finish(p);
	if (!ret)
		ret = catalog_reg_flush(r);
	if (!ret)
		log_info("catalog: dataset %s: %lu hashes from %s, %lu bad "
			 "lines",
			 r->name, p->entries, r->sums_key, p->bad_lines);
	sha256sums_release(p);
	free(p);
	return ret;
}

/* Run body(r) in one IMMEDIATE transaction, rolled back if it fails. */
static int catalog_reg_tx(struct catalog_reg *r,
			  int (*body)(struct catalog_reg *r))
{
	struct catalog *cat = r->cat;
	int ret;

	ret = catalog_exec(cat->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = body(r);
	if (!ret)
		ret = catalog_exec(cat->db, "COMMIT");
	if (ret)
		catalog_rollback(cat->db);
	return ret;
}

/* Retire the dataset's manifests in state (0 BUILDING, 1 current). */
static int catalog_reg_retire(struct catalog_reg *r, int state)
{
	return catalog_run(
		r->cat, "retire manifests",
		"UPDATE manifests SET state = 2"
		" WHERE dataset_id = ?1 AND state = ?2",
		CATALOG_ARGS(CATALOG_INT(r->ds_id), CATALOG_INT(state)), NULL);
}

/* Create the BUILDING manifest and its root directory. */
static int catalog_reg_start_tx(struct catalog_reg *r)
{
	struct catalog *cat = r->cat;
	sqlite3_stmt *st;
	int64_t version = 0;
	int state, ret;

	ret = catalog_dataset_id(cat, r->name, &r->ds_id, &state, r->sums_key);
	if (ret)
		return ret;
	if (state == CATALOG_DS_REMOVING)
		return -ENOENT;
	/* A newer registration wins over an older one still building. */
	ret = catalog_reg_retire(r, 0);
	if (ret)
		return ret;
	ret = catalog_prepare(cat, "next version",
			      "SELECT coalesce(max(version), 0) + 1"
			      " FROM manifests WHERE dataset_id = ?",
			      CATALOG_ARGS(CATALOG_INT(r->ds_id)), &st);
	if (ret)
		return ret;
	ret = catalog_step(cat, st, "next version");
	if (!ret)
		version = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	if (ret)
		return ret == -ENOENT ? -EIO : ret;
	ret = catalog_run(cat, "new manifest",
			  "INSERT INTO manifests(dataset_id, version,"
			  " state, created) VALUES(?, ?, 0, ?)",
			  CATALOG_ARGS(CATALOG_INT(r->ds_id),
				       CATALOG_INT(version),
				       CATALOG_INT(r->now)),
			  NULL);
	if (ret)
		return ret;
	r->mf_id = sqlite3_last_insert_rowid(cat->db);
	return catalog_exec_id(cat,
			       "INSERT INTO dirs(manifest_id, path, parent)"
			       " VALUES(?, '', NULL)",
			       r->mf_id, NULL);
}

static int catalog_reg_start(struct catalog_reg *r)
{
	return catalog_reg_tx(r, catalog_reg_start_tx);
}

/* Make the BUILDING manifest current, in one transaction. */
static int catalog_reg_flip_tx(struct catalog_reg *r)
{
	struct catalog *cat = r->cat;
	int n = 0, ret;

	ret = catalog_reg_retire(r, 1);
	if (ret)
		return ret;
	/* The counts kept while writing: no scan of the objects. */
	ret = catalog_run(
		cat, "make manifest current",
		"UPDATE manifests SET state = 1, bad_keys = ?2,"
		" n_objects = ?3, n_bytes = ?4"
		" WHERE id = ?1 AND state = 0",
		CATALOG_ARGS(CATALOG_INT(r->mf_id), CATALOG_INT(r->bad),
			     CATALOG_INT(r->objects), CATALOG_INT(r->bytes)),
		&n);
	if (ret)
		return ret;
	if (n == 0) {
		log_error("catalog: dataset %s: registration superseded",
			  r->name);
		return -EBUSY;
	}
	ret = catalog_exec_id(cat,
			      "UPDATE datasets SET state = 1"
			      " WHERE id = ? AND state <> 2",
			      r->ds_id, &n);
	if (ret)
		return ret;
	return n == 0 ? -ENOENT : 0;
}

static int catalog_reg_flip(struct catalog_reg *r)
{
	return catalog_reg_tx(r, catalog_reg_flip_tx);
}

int catalog_register_source(struct catalog *cat, const char *name,
			    const struct catalog_source *src)
{
	int64_t t0 = 0, t1, t2;
	struct catalog_reg *r;
	int ret;

	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->cat = cat;
	r->name = name;
	r->now = timeutil_real_s();
	r->rows = malloc(REG_BATCH_ROWS * sizeof(*r->rows));
	r->arena = malloc(REG_BATCH_BYTES);
	if (!r->rows || !r->arena) {
		ret = -ENOMEM;
		goto out;
	}
	t0 = timeutil_mono_ns();
	ret = catalog_reg_start(r);
	if (ret)
		goto out;
	/* Leftovers of crashed or superseded registrations. */
	ret = catalog_dataset_purge_dead(cat, r->ds_id);
	if (ret)
		goto err;
	/*
	 * The BUILDING manifest is garbage after a crash anyway, so its
	 * batches need not reach the disk one by one, and the WAL is
	 * checkpointed once, at the flip, instead of every 1000 pages.
	 */
	ret = catalog_exec(cat->db, CATALOG_BULK_PRAGMAS);
	if (ret)
		goto err;
	ret = src->list(src->arg, catalog_reg_key, r);
	if (!ret)
		ret = catalog_reg_flush(r);
	if (!ret)
		ret = catalog_reg_clashes(r);
	if (!ret && !r->has_sums &&
	    strcmp(r->sums_key, CATALOG_SUMS_KEY_DEFAULT) != 0) {
		log_error("catalog: dataset %s: its sums key %s is not at the "
			  "source",
			  name, r->sums_key);
		ret = -ENODATA;
	}
	if (!ret && r->has_sums)
		ret = catalog_reg_sums(r, src);
	if (!ret)
		ret = catalog_exec(cat->db, CATALOG_SAFE_PRAGMAS);
	t1 = timeutil_mono_ns();
	if (!ret)
		ret = catalog_reg_flip(r);
	if (ret)
		goto err;
	t2 = timeutil_mono_ns();
	log_info("catalog: dataset %s registered, %llu bad keys (%llu files; "
		 "%.1f s: listing %.1f, writing %.1f in %u transactions of at "
		 "most %lld ms, making it current %.1f)",
		 name, (unsigned long long)r->bad,
		 (unsigned long long)r->objects, (double)(t2 - t0) / 1e9,
		 (double)(t1 - t0 - r->write_ns) / 1e9,
		 (double)r->write_ns / 1e9, r->n_tx,
		 (long long)(r->max_tx_ns / 1000000), (double)(t2 - t1) / 1e9);
	/* The old manifest; the new one is already visible. */
	if (catalog_dataset_purge_dead(cat, r->ds_id))
		log_warn("catalog: dataset %s: old manifest left for later",
			 name);
	goto out;
err:
	catalog_rollback(cat->db);
	catalog_exec(cat->db, CATALOG_SAFE_PRAGMAS);
	r->in_tx = false;
	catalog_exec_id(cat,
			"UPDATE manifests SET state = 2 WHERE id = ?"
			" AND state = 0",
			r->mf_id, NULL);
	catalog_dataset_purge_dead(cat, r->ds_id);
out:
	free(r->rows);
	free(r->arena);
	free(r);
	return ret;
}

/* A catalog_source over an objstore: its tree listing, so that a file://
 * source's directories (empty ones too) and skipped entries are seen. */
static int catalog_os_list(void *arg, objstore_list_cb cb, void *cb_arg)
{
	return objstore_list_tree(arg, "", cb, cb_arg);
}

static int catalog_os_read(void *arg, const struct objstore_info *oi,
			   struct sha256sums_parser *p)
{
	const char *etag = oi->etag[0] ? oi->etag : NULL;
	uint64_t off = 0;
	char *buf;
	size_t got;
	int ret = 0;

	buf = malloc(SUMS_CHUNK);
	if (!buf)
		return -ENOMEM;
	while (off < oi->size) {
		ret = objstore_get(arg, oi->key, off, SUMS_CHUNK, etag, buf,
				   &got);
		if (ret)
			break;
		if (got == 0) {
			ret = -EIO;
			break;
		}
		ret = sha256sums_feed(p, buf, got);
		if (ret)
			break;
		off += got;
	}
	free(buf);
	return ret;
}

int catalog_register(struct catalog *cat, const char *name, struct objstore *os)
{
	struct catalog_source src = {
		.list = catalog_os_list,
		.read = catalog_os_read,
		.arg = os,
	};

	return catalog_register_source(cat, name, &src);
}
