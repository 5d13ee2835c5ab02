// SPDX-License-Identifier: MIT
/*
 * jobs: the persistent job queue. See include/dstage/jobs.h for the state
 * machine and the API.
 *
 * A struct jobs is one SQLite connection (SQLITE_OPEN_NOMUTEX) and no lock:
 * it belongs to one thread at a time. What is shared is the catalog file;
 * SQLite's WAL locking protects it. Every change is one statement or one
 * BEGIN IMMEDIATE transaction.
 *
 * Invariants:
 *   - a final state (done, failed, cancelled) is never changed: every UPDATE
 *     names the states it may start from in its WHERE clause;
 *   - a job's jobs_args row goes with it (ON DELETE CASCADE).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "dstage/catalog.h"
#include "dstage/jobs.h"
#include "catalog_i.h"
#include "dstage/log.h"

struct jobs {
	sqlite3 *db;
	char *path;
	struct catalog_busy busy;
};

static const char *const jobs_names[] = {
	[JOBS_QUEUED] = "queued",	[JOBS_RUNNING] = "running",
	[JOBS_DONE] = "done",		[JOBS_FAILED] = "failed",
	[JOBS_CANCELLED] = "cancelled",
};

#define JOBS_COLS                                                         \
	"j.id, j.kind, coalesce(d.name, ''), coalesce(j.dataset_id, 0), " \
	"coalesce(d.priority, 0), j.state, j.done, j.total, "             \
	"coalesce(j.error, ''), a.args, j.created, j.updated, "           \
	"c.job_id IS NOT NULL, c.damaged, c.missing, c.mismatched, "      \
	"c.repaired "                                                     \
	"FROM jobs j LEFT JOIN datasets d ON d.id = j.dataset_id "        \
	"LEFT JOIN jobs_args a ON a.job_id = j.id "                       \
	"LEFT JOIN jobs_counts c ON c.job_id = j.id "

const char *jobs_state_name(enum jobs_state st)
{
	if ((unsigned)st > JOBS_CANCELLED)
		return "?";
	return jobs_names[st];
}

int jobs_state_parse(const char *s)
{
	for (int i = 0; i <= JOBS_CANCELLED; i++)
		if (strcmp(s, jobs_names[i]) == 0)
			return i;
	return -EINVAL;
}

bool jobs_state_final(enum jobs_state st)
{
	return st == JOBS_DONE || st == JOBS_FAILED || st == JOBS_CANCELLED;
}

static int jobs_sqlerr(struct jobs *jq, int rc, const char *what)
{
	log_error("jobs: %s: %s: %s", jq->path, what, sqlite3_errmsg(jq->db));
	return catalog_sqlite_errno(rc);
}

static int jobs_exec(struct jobs *jq, const char *sql)
{
	int rc = sqlite3_exec(jq->db, sql, NULL, NULL, NULL);

	return rc == SQLITE_OK ? 0 : jobs_sqlerr(jq, rc, sql);
}

static int jobs_prepare(struct jobs *jq, const char *sql, sqlite3_stmt **st)
{
	int rc = sqlite3_prepare_v2(jq->db, sql, -1, st, NULL);

	return rc == SQLITE_OK ? 0 : jobs_sqlerr(jq, rc, "prepare");
}

int jobs_open(const char *path, struct jobs **out)
{
	struct jobs *jq;
	sqlite3_stmt *st = NULL;
	int rc, ret;

	*out = NULL;
	if (access(path, F_OK) < 0) {
		ret = -errno;
		log_error("jobs: %s: %s", path, strerror(errno));
		return ret;
	}
	jq = calloc(1, sizeof(*jq));
	if (!jq)
		return -ENOMEM;
	jq->path = strdup(path);
	if (!jq->path) {
		ret = -ENOMEM;
		goto err;
	}
	rc = sqlite3_open_v2(path, &jq->db,
			     SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK) {
		ret = jq->db ? jobs_sqlerr(jq, rc, "open") : -ENOMEM;
		goto err;
	}
	catalog_busy_init(jq->db, &jq->busy);
	ret = jobs_exec(jq, "PRAGMA foreign_keys = ON;"
			    "PRAGMA synchronous = FULL");
	if (ret)
		goto err;
	ret = jobs_prepare(jq, "PRAGMA user_version", &st);
	if (ret)
		goto err;
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		ret = jobs_sqlerr(jq, rc, "user_version");
		goto err;
	}
	if (sqlite3_column_int(st, 0) < 7) {
		log_error("jobs: %s: catalog schema version %d has no job "
			  "counts table (schema 7); open it with the catalog "
			  "first, which migrates it",
			  path, sqlite3_column_int(st, 0));
		ret = -EPROTO;
		goto err;
	}
	sqlite3_finalize(st);
	st = NULL;
	*out = jq;
	return 0;
err:
	sqlite3_finalize(st);
	jobs_close(jq);
	return ret;
}

void jobs_close(struct jobs *jq)
{
	if (!jq)
		return;
	sqlite3_close_v2(jq->db);
	free(jq->path);
	free(jq);
}

void jobs_job_release(struct jobs_job *j)
{
	if (!j)
		return;
	free(j->args);
	j->args = NULL;
}

static void jobs_copy(char *dst, size_t cap, const unsigned char *src)
{
	snprintf(dst, cap, "%s", src ? (const char *)src : "");
}

/* Fill j from a row of JOBS_COLS; j->args is allocated when own, else it
 * borrows the column (list callbacks). */
static int jobs_fill(sqlite3_stmt *st, struct jobs_job *j, bool own)
{
	const unsigned char *args = sqlite3_column_text(st, 9);
	int s;

	memset(j, 0, sizeof(*j));
	j->id = sqlite3_column_int64(st, 0);
	jobs_copy(j->kind, sizeof(j->kind), sqlite3_column_text(st, 1));
	jobs_copy(j->dataset, sizeof(j->dataset), sqlite3_column_text(st, 2));
	j->dataset_id = sqlite3_column_int64(st, 3);
	j->priority = sqlite3_column_int(st, 4);
	s = jobs_state_parse((const char *)sqlite3_column_text(st, 5) ?: "");
	j->state = s < 0 ? JOBS_FAILED : (enum jobs_state)s;
	j->done = (uint64_t)sqlite3_column_int64(st, 6);
	j->total = (uint64_t)sqlite3_column_int64(st, 7);
	jobs_copy(j->error, sizeof(j->error), sqlite3_column_text(st, 8));
	j->created = sqlite3_column_int64(st, 10);
	j->updated = sqlite3_column_int64(st, 11);
	j->has_counts = sqlite3_column_int(st, 12) != 0;
	j->counts.damaged = (uint64_t)sqlite3_column_int64(st, 13);
	j->counts.missing = (uint64_t)sqlite3_column_int64(st, 14);
	j->counts.mismatched = (uint64_t)sqlite3_column_int64(st, 15);
	j->counts.repaired = (uint64_t)sqlite3_column_int64(st, 16);
	if (!own) {
		j->args = (char *)args;
		return 0;
	}
	j->args = strdup(args ? (const char *)args : "");
	return j->args ? 0 : -ENOMEM;
}

int jobs_submit(struct jobs *jq, const char *kind, const char *dataset,
		const char *args, int64_t *id)
{
	sqlite3_stmt *st = NULL;
	int64_t now = timeutil_real_s(), ds_id;
	int rc, ret;

	if (!kind || !*kind || strlen(kind) >= JOBS_KIND_MAX || !dataset)
		return -EINVAL;
	ret = jobs_exec(jq, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = jobs_prepare(jq,
			   "SELECT id FROM datasets"
			   " WHERE name = ? AND state <> 2",
			   &st);
	if (ret)
		goto err;
	sqlite3_bind_text(st, 1, dataset, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_DONE) {
		ret = -ENOENT;
		goto err;
	}
	if (rc != SQLITE_ROW) {
		ret = jobs_sqlerr(jq, rc, "submit");
		goto err;
	}
	ds_id = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	ret = jobs_prepare(jq,
			   "INSERT INTO jobs(kind, dataset_id, state,"
			   " created, updated) VALUES(?, ?, 'queued', ?, ?)",
			   &st);
	if (ret)
		goto err;
	sqlite3_bind_text(st, 1, kind, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, ds_id);
	sqlite3_bind_int64(st, 3, now);
	sqlite3_bind_int64(st, 4, now);
	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE) {
		ret = jobs_sqlerr(jq, rc, "submit");
		goto err;
	}
	*id = sqlite3_last_insert_rowid(jq->db);
	sqlite3_finalize(st);
	ret = jobs_prepare(jq,
			   "INSERT INTO jobs_args(job_id, args)"
			   " VALUES(?, ?)",
			   &st);
	if (ret)
		goto err;
	sqlite3_bind_int64(st, 1, *id);
	sqlite3_bind_text(st, 2, args ? args : "", -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE) {
		ret = jobs_sqlerr(jq, rc, "submit");
		goto err;
	}
	sqlite3_finalize(st);
	st = NULL;
	return jobs_exec(jq, "COMMIT");
err:
	sqlite3_finalize(st);
	sqlite3_exec(jq->db, "ROLLBACK", NULL, NULL, NULL);
	return ret;
}

/* Step a query that selects one job into j; finalizes st. Returns 0,
 * -ENOENT (no row) or the query's -errno. */
static int jobs_one(struct jobs *jq, sqlite3_stmt *st, struct jobs_job *j,
		    const char *what)
{
	int rc = sqlite3_step(st), ret;

	if (rc == SQLITE_ROW)
		ret = jobs_fill(st, j, true);
	else if (rc == SQLITE_DONE)
		ret = -ENOENT;
	else
		ret = jobs_sqlerr(jq, rc, what);
	sqlite3_finalize(st);
	return ret;
}

int jobs_parse_id(const char *s, int64_t *id)
{
	int64_t v = 0;
	bool big = false;

	if (!s || !*s)
		return -EINVAL;
	for (const char *p = s; *p; p++) {
		int d = *p - '0';

		if (d < 0 || d > 9)
			return -EINVAL;
		if (v > (JOBS_ID_MAX - d) / 10)
			big = true;
		else if (!big)
			v = v * 10 + d;
	}
	if (big || v < 1)
		return -ERANGE;
	*id = v;
	return 0;
}

int jobs_get(struct jobs *jq, int64_t id, struct jobs_job *j)
{
	sqlite3_stmt *st = NULL;
	int ret;

	ret = jobs_prepare(jq, "SELECT " JOBS_COLS "WHERE j.id = ?", &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, id);
	return jobs_one(jq, st, j, "get");
}

int jobs_list(struct jobs *jq, unsigned finished, jobs_cb cb, void *arg)
{
	sqlite3_stmt *st = NULL;
	struct jobs_job j;
	int rc, ret;

	ret = jobs_prepare(jq,
			   "SELECT " JOBS_COLS
			   "WHERE j.state IN ('queued', 'running')"
			   " OR j.id IN (SELECT id FROM jobs WHERE state"
			   "  NOT IN ('queued', 'running')"
			   "  ORDER BY id DESC LIMIT ?)"
			   " ORDER BY j.id DESC",
			   &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, finished);
	ret = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		jobs_fill(st, &j, false);
		ret = cb(arg, &j);
		if (ret)
			break;
	}
	if (!ret && rc != SQLITE_DONE)
		ret = jobs_sqlerr(jq, rc, "list");
	sqlite3_finalize(st);
	return ret;
}

/* Is any job queued? 1, 0 or -errno. A read: takes no write lock. */
static int jobs_any_queued(struct jobs *jq)
{
	sqlite3_stmt *st = NULL;
	int rc, ret;

	ret = jobs_prepare(
		jq, "SELECT 1 FROM jobs WHERE state = 'queued' LIMIT 1", &st);
	if (ret)
		return ret;
	rc = sqlite3_step(st);
	ret = rc == SQLITE_ROW	  ? 1
	      : rc == SQLITE_DONE ? 0
				  : jobs_sqlerr(jq, rc, "claim");
	sqlite3_finalize(st);
	return ret;
}

int jobs_claim(struct jobs *jq, struct jobs_job *j)
{
	sqlite3_stmt *st = NULL;
	int rc, ret;

	/* The dispatcher polls every second: an idle poll must not queue
	 * for the write lock behind a registration. */
	ret = jobs_any_queued(jq);
	if (ret <= 0)
		return ret ? ret : -ENOENT;
	ret = jobs_exec(jq, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = jobs_prepare(
		jq,
		"SELECT " JOBS_COLS "WHERE j.state = 'queued'"
		" ORDER BY coalesce(d.priority, 0) DESC, j.id LIMIT 1",
		&st);
	if (ret)
		goto err;
	rc = sqlite3_step(st);
	if (rc == SQLITE_DONE) {
		ret = -ENOENT;
		goto err;
	}
	if (rc != SQLITE_ROW) {
		ret = jobs_sqlerr(jq, rc, "claim");
		goto err;
	}
	ret = jobs_fill(st, j, true);
	if (ret)
		goto err;
	sqlite3_finalize(st);
	ret = jobs_prepare(jq,
			   "UPDATE jobs SET state = 'running', updated = ?"
			   " WHERE id = ?",
			   &st);
	if (ret)
		goto err;
	sqlite3_bind_int64(st, 1, timeutil_real_s());
	sqlite3_bind_int64(st, 2, j->id);
	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE) {
		ret = jobs_sqlerr(jq, rc, "claim");
		goto err;
	}
	sqlite3_finalize(st);
	st = NULL;
	ret = jobs_exec(jq, "COMMIT");
	if (ret)
		goto err;
	j->state = JOBS_RUNNING;
	return 0;
err:
	sqlite3_finalize(st);
	sqlite3_exec(jq->db, "ROLLBACK", NULL, NULL, NULL);
	if (ret != -ENOENT)
		jobs_job_release(j);
	return ret;
}

/* Run an UPDATE of one job bound as ?1 = id; if it changed nothing, tell
 * -ENOENT (no job) from `none` (the job is in another state). */
static int jobs_update(struct jobs *jq, sqlite3_stmt *st, int64_t id, int none)
{
	sqlite3_stmt *q = NULL;
	int rc, ret;

	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE)
		return jobs_sqlerr(jq, rc, "update");
	if (sqlite3_changes(jq->db) > 0)
		return 0;
	ret = jobs_prepare(jq, "SELECT 1 FROM jobs WHERE id = ?", &q);
	if (ret)
		return ret;
	sqlite3_bind_int64(q, 1, id);
	rc = sqlite3_step(q);
	ret = rc == SQLITE_ROW	  ? none
	      : rc == SQLITE_DONE ? -ENOENT
				  : jobs_sqlerr(jq, rc, "update");
	sqlite3_finalize(q);
	return ret;
}

int jobs_progress(struct jobs *jq, int64_t id, uint64_t done, uint64_t total)
{
	sqlite3_stmt *st = NULL;
	int ret;

	ret = jobs_prepare(jq,
			   "UPDATE jobs SET done = ?2, total = ?3,"
			   " updated = ?4 WHERE id = ?1"
			   " AND state = 'running'",
			   &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, id);
	sqlite3_bind_int64(st, 2, (int64_t)done);
	sqlite3_bind_int64(st, 3, (int64_t)total);
	sqlite3_bind_int64(st, 4, timeutil_real_s());
	ret = jobs_update(jq, st, id, -ECANCELED);
	sqlite3_finalize(st);
	return ret;
}

int jobs_finish(struct jobs *jq, int64_t id, enum jobs_state state,
		const char *error)
{
	return jobs_finish_counts(jq, id, state, error, NULL);
}

/* The UPDATE of jobs_finish_counts (inside its transaction). */
static int jobs_finish_row(struct jobs *jq, int64_t id, enum jobs_state state,
			   const char *error)
{
	sqlite3_stmt *st = NULL;
	char msg[JOBS_ERROR_MAX];
	int ret;

	snprintf(msg, sizeof(msg), "%s", error ? error : "");
	ret = jobs_prepare(jq,
			   "UPDATE jobs SET state = ?2, error = ?3,"
			   " updated = ?4 WHERE id = ?1"
			   " AND state = 'running'",
			   &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, id);
	sqlite3_bind_text(st, 2, jobs_names[state], -1, SQLITE_STATIC);
	if (*msg)
		sqlite3_bind_text(st, 3, msg, -1, SQLITE_STATIC);
	else
		sqlite3_bind_null(st, 3);
	sqlite3_bind_int64(st, 4, timeutil_real_s());
	ret = jobs_update(jq, st, id, -ECANCELED);
	sqlite3_finalize(st);
	return ret;
}

int jobs_finish_counts(struct jobs *jq, int64_t id, enum jobs_state state,
		       const char *error, const struct jobs_counts *counts)
{
	sqlite3_stmt *st = NULL;
	int rc, ret;

	if (state != JOBS_DONE && state != JOBS_FAILED)
		return -EINVAL;
	ret = jobs_exec(jq, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = jobs_finish_row(jq, id, state, error);
	if (ret || !counts)
		goto out;
	ret = jobs_prepare(jq,
			   "INSERT OR REPLACE INTO jobs_counts(job_id, damaged,"
			   " missing, mismatched, repaired)"
			   " VALUES(?, ?, ?, ?, ?)",
			   &st);
	if (ret)
		goto out;
	sqlite3_bind_int64(st, 1, id);
	sqlite3_bind_int64(st, 2, (int64_t)counts->damaged);
	sqlite3_bind_int64(st, 3, (int64_t)counts->missing);
	sqlite3_bind_int64(st, 4, (int64_t)counts->mismatched);
	sqlite3_bind_int64(st, 5, (int64_t)counts->repaired);
	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE)
		ret = jobs_sqlerr(jq, rc, "finish: counts");
out:
	sqlite3_finalize(st);
	if (ret) {
		sqlite3_exec(jq->db, "ROLLBACK", NULL, NULL, NULL);
		return ret;
	}
	return jobs_exec(jq, "COMMIT");
}

int jobs_verify_counts(struct jobs *jq, unsigned max, jobs_counts_cb cb,
		       void *arg)
{
	sqlite3_stmt *st = NULL;
	unsigned n = 0;
	int rc = SQLITE_DONE, ret;

	ret = jobs_prepare(
		jq,
		"SELECT d.name, d.owner_group IS NOT NULL, c.damaged,"
		" c.missing, c.mismatched, c.repaired FROM datasets d"
		" JOIN jobs_counts c ON c.job_id = (SELECT max(j.id)"
		"  FROM jobs j WHERE j.dataset_id = d.id"
		"  AND j.kind = 'verify' AND j.state IN ('done', 'failed'))"
		" WHERE d.state <> 2 ORDER BY d.id",
		&st);
	if (ret)
		return ret;
	while (n++ < max && (rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct jobs_counts k = {
			.damaged = (uint64_t)sqlite3_column_int64(st, 2),
			.missing = (uint64_t)sqlite3_column_int64(st, 3),
			.mismatched = (uint64_t)sqlite3_column_int64(st, 4),
			.repaired = (uint64_t)sqlite3_column_int64(st, 5),
		};
		const unsigned char *name = sqlite3_column_text(st, 0);

		ret = cb(arg, name ? (const char *)name : "",
			 sqlite3_column_int(st, 1) != 0, &k);
		if (ret)
			goto out;
	}
	if (n <= max && rc != SQLITE_DONE)
		ret = jobs_sqlerr(jq, rc, "verify counts");
out:
	sqlite3_finalize(st);
	return ret;
}

int jobs_cancel(struct jobs *jq, int64_t id, enum jobs_state *was)
{
	struct jobs_job j = { 0 };
	sqlite3_stmt *st = NULL;
	int ret;

	ret = jobs_exec(jq, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = jobs_get(jq, id, &j);
	if (ret)
		goto out;
	if (was)
		*was = j.state;
	if (jobs_state_final(j.state)) {
		ret = -EALREADY;
		goto out;
	}
	ret = jobs_prepare(jq,
			   "UPDATE jobs SET state = 'cancelled',"
			   " error = 'cancelled', updated = ?2"
			   " WHERE id = ?1",
			   &st);
	if (ret)
		goto out;
	sqlite3_bind_int64(st, 1, id);
	sqlite3_bind_int64(st, 2, timeutil_real_s());
	ret = jobs_update(jq, st, id, -EALREADY);
out:
	sqlite3_finalize(st);
	jobs_job_release(&j);
	if (ret) {
		sqlite3_exec(jq->db, "ROLLBACK", NULL, NULL, NULL);
		return ret;
	}
	return jobs_exec(jq, "COMMIT");
}

int jobs_recover(struct jobs *jq, unsigned *n)
{
	sqlite3_stmt *st = NULL;
	int rc, ret;

	ret = jobs_prepare(jq,
			   "UPDATE jobs SET state = 'queued', updated = ?"
			   " WHERE state = 'running'",
			   &st);
	if (ret)
		return ret;
	sqlite3_bind_int64(st, 1, timeutil_real_s());
	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE)
		ret = jobs_sqlerr(jq, rc, "recover");
	else if (n)
		*n = (unsigned)sqlite3_changes(jq->db);
	sqlite3_finalize(st);
	return ret;
}

int jobs_last(struct jobs *jq, const char *dataset, const char *kind,
	      struct jobs_job *j)
{
	sqlite3_stmt *st = NULL;
	int ret;

	ret = jobs_prepare(jq,
			   "SELECT " JOBS_COLS "WHERE d.name = ? AND j.kind = ?"
			   " AND j.state IN ('done', 'failed')"
			   " ORDER BY j.id DESC LIMIT 1",
			   &st);
	if (ret)
		return ret;
	sqlite3_bind_text(st, 1, dataset, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, kind, -1, SQLITE_STATIC);
	return jobs_one(jq, st, j, "last");
}
