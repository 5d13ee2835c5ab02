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

int jobs_open(const char *path, struct jobs **out)
{
	struct jobs *jq;
	int rc, ret, v;

	*out = NULL;
	if (access(path, F_OK) < 0) {
		ret = -errno;
		log_error("jobs: %s: %s", path, strerror(errno));
		return ret;
	}
	jq = calloc(1, sizeof(*jq));
	if (!jq)
		return -ENOMEM;
	rc = sqlite3_open_v2(path, &jq->db,
			     SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK) {
		ret = jq->db ? catalog_sqlerr(jq->db, rc, "jobs open")
			     : -ENOMEM;
		goto err;
	}
	catalog_busy_init(jq->db, &jq->busy);
	ret = catalog_exec(jq->db, "PRAGMA foreign_keys = ON;"
				   "PRAGMA synchronous = FULL");
	if (ret)
		goto err;
	ret = catalog_user_version(jq->db, &v);
	if (ret)
		goto err;
	if (v < 7) {
		log_error("jobs: %s: catalog schema version %d has no job "
			  "counts table (schema 7); open it with the catalog "
			  "first, which migrates it",
			  path, v);
		ret = -EPROTO;
		goto err;
	}
	*out = jq;
	return 0;
err:
	jobs_close(jq);
	return ret;
}

void jobs_close(struct jobs *jq)
{
	if (!jq)
		return;
	sqlite3_close_v2(jq->db);
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
	int ret;

	if (!kind || !*kind || strlen(kind) >= JOBS_KIND_MAX || !dataset)
		return -EINVAL;
	ret = catalog_exec(jq->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = catalog_prepare_db(jq->db, "jobs submit",
				 "SELECT id FROM datasets"
				 " WHERE name = ? AND state <> 2",
				 CATALOG_ARGS(CATALOG_TEXT(dataset)), &st);
	if (!ret)
		ret = catalog_step_db(jq->db, st, "jobs submit");
	if (ret)
		goto err;
	ds_id = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	st = NULL;
	ret = catalog_run_db(jq->db, "jobs submit",
			     "INSERT INTO jobs(kind, dataset_id, state,"
			     " created, updated) VALUES(?, ?, 'queued', ?, ?)",
			     CATALOG_ARGS(CATALOG_TEXT(kind),
					  CATALOG_INT(ds_id), CATALOG_INT(now),
					  CATALOG_INT(now)),
			     NULL);
	if (ret)
		goto err;
	*id = sqlite3_last_insert_rowid(jq->db);
	ret = catalog_run_db(
		jq->db, "jobs submit",
		"INSERT INTO jobs_args(job_id, args)"
		" VALUES(?, ?)",
		CATALOG_ARGS(CATALOG_INT(*id), CATALOG_TEXT(args ? args : "")),
		NULL);
	if (ret)
		goto err;
	return catalog_exec(jq->db, "COMMIT");
err:
	sqlite3_finalize(st);
	catalog_rollback(jq->db);
	return ret;
}

/* catalog_each_db's row function of jobs_one: fill the job (arg) and stop
 * (1), or -ENOMEM. */
static int jobs_one_row(void *arg, sqlite3_stmt *st)
{
	int ret = jobs_fill(st, arg, true);

	return ret ? ret : 1;
}

/* Run a query (sql with args[0..n) bound) that selects one job into j.
 * Returns 0, -ENOENT (no row), -ENOMEM (j's args) or the query's logged
 * -errno (catalog_each_db). */
static int jobs_one(struct jobs *jq, const char *what, const char *sql,
		    const struct catalog_arg *args, int n, struct jobs_job *j)
{
	int ret = catalog_each_db(jq->db, what, sql, args, n, jobs_one_row, j);

	return ret == 1 ? 0 : ret ? ret : -ENOENT;
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
	return jobs_one(jq, "jobs get", "SELECT " JOBS_COLS "WHERE j.id = ?",
			CATALOG_ARGS(CATALOG_INT(id)), j);
}

/* catalog_each_db's row function of jobs_list. */
static int jobs_list_row(void *arg, sqlite3_stmt *st)
{
	const struct catalog_each_cb *e = arg;
	struct jobs_job j;

	jobs_fill(st, &j, false);
	return e->fn.jobs(e->arg, &j);
}

int jobs_list(struct jobs *jq, unsigned finished, jobs_cb cb, void *arg)
{
	struct catalog_each_cb e = { .fn.jobs = cb, .arg = arg };

	return catalog_each_db(
		jq->db, "jobs list",
		"SELECT " JOBS_COLS "WHERE j.state IN ('queued', 'running')"
		" OR j.id IN (SELECT id FROM jobs WHERE state"
		"  NOT IN ('queued', 'running')"
		"  ORDER BY id DESC LIMIT ?)"
		" ORDER BY j.id DESC",
		CATALOG_ARGS(CATALOG_INT(finished)), jobs_list_row, &e);
}

/* catalog_each_db's row function of jobs_exists: stop at the first row. */
static int jobs_exists_row(void *arg, sqlite3_stmt *st)
{
	(void)arg;
	(void)st;
	return 1;
}

/* Does the query (sql with args[0..n) bound) return a row? 1, 0 or the
 * logged -errno (catalog_each_db). */
static int jobs_exists(struct jobs *jq, const char *what, const char *sql,
		       const struct catalog_arg *args, int n)
{
	return catalog_each_db(jq->db, what, sql, args, n, jobs_exists_row,
			       NULL);
}

int jobs_claim(struct jobs *jq, struct jobs_job *j)
{
	int ret;

	/* The dispatcher polls every second: an idle poll must not queue
	 * for the write lock behind a registration (a read takes none). */
	ret = jobs_exists(jq, "jobs claim",
			  "SELECT 1 FROM jobs WHERE state = 'queued' LIMIT 1",
			  NULL, 0);
	if (ret <= 0)
		return ret ? ret : -ENOENT;
	ret = catalog_exec(jq->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = jobs_one(jq, "jobs claim",
		       "SELECT " JOBS_COLS "WHERE j.state = 'queued'"
		       " ORDER BY coalesce(d.priority, 0) DESC, j.id LIMIT 1",
		       NULL, 0, j);
	if (ret)
		goto err;
	ret = catalog_run_db(jq->db, "jobs claim",
			     "UPDATE jobs SET state = 'running', updated = ?"
			     " WHERE id = ?",
			     CATALOG_ARGS(CATALOG_INT(timeutil_real_s()),
					  CATALOG_INT(j->id)),
			     NULL);
	if (!ret)
		ret = catalog_exec(jq->db, "COMMIT");
	if (ret)
		goto err;
	j->state = JOBS_RUNNING;
	return 0;
err:
	catalog_rollback(jq->db);
	if (ret != -ENOENT)
		jobs_job_release(j);
	return ret;
}

/* Run an UPDATE of the job id (sql with args[0..n) bound); if it changed
 * nothing, tell -ENOENT (no job) from `none` (the job is in another
 * state). 0 or the logged -errno otherwise. */
static int jobs_update(struct jobs *jq, const char *sql,
		       const struct catalog_arg *args, int n, int64_t id,
		       int none)
{
	int changes = 0, ret;

	ret = catalog_run_db(jq->db, "jobs update", sql, args, n, &changes);
	if (ret || changes > 0)
		return ret;
	ret = jobs_exists(jq, "jobs update", "SELECT 1 FROM jobs WHERE id = ?",
			  CATALOG_ARGS(CATALOG_INT(id)));
	return ret < 0 ? ret : ret ? none : -ENOENT;
}

int jobs_progress(struct jobs *jq, int64_t id, uint64_t done, uint64_t total)
{
	return jobs_update(jq,
			   "UPDATE jobs SET done = ?2, total = ?3,"
			   " updated = ?4 WHERE id = ?1"
			   " AND state = 'running'",
			   CATALOG_ARGS(CATALOG_INT(id), CATALOG_INT(done),
					CATALOG_INT(total),
					CATALOG_INT(timeutil_real_s())),
			   id, -ECANCELED);
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
	char msg[JOBS_ERROR_MAX];

	snprintf(msg, sizeof(msg), "%s", error ? error : "");
	return jobs_update(jq,
			   "UPDATE jobs SET state = ?2, error = ?3,"
			   " updated = ?4 WHERE id = ?1"
			   " AND state = 'running'",
			   CATALOG_ARGS(CATALOG_INT(id),
					CATALOG_TEXT(jobs_names[state]),
					CATALOG_TEXT(*msg ? msg : NULL),
					CATALOG_INT(timeutil_real_s())),
			   id, -ECANCELED);
}

int jobs_finish_counts(struct jobs *jq, int64_t id, enum jobs_state state,
		       const char *error, const struct jobs_counts *counts)
{
	int ret;

	if (state != JOBS_DONE && state != JOBS_FAILED)
		return -EINVAL;
	ret = catalog_exec(jq->db, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = jobs_finish_row(jq, id, state, error);
	if (!ret && counts)
		ret = catalog_run_db(
			jq->db, "jobs finish: counts",
			"INSERT OR REPLACE INTO jobs_counts(job_id, damaged,"
			" missing, mismatched, repaired)"
			" VALUES(?, ?, ?, ?, ?)",
			CATALOG_ARGS(CATALOG_INT(id),
				     CATALOG_INT(counts->damaged),
				     CATALOG_INT(counts->missing),
				     CATALOG_INT(counts->mismatched),
				     CATALOG_INT(counts->repaired)),
			NULL);
	if (ret) {
		catalog_rollback(jq->db);
		return ret;
	}
	return catalog_exec(jq->db, "COMMIT");
}

/* catalog_each_db's row function of jobs_verify_counts. */
static int jobs_counts_row(void *arg, sqlite3_stmt *st)
{
	const struct catalog_each_cb *e = arg;
	struct jobs_counts k = {
		.damaged = (uint64_t)sqlite3_column_int64(st, 2),
		.missing = (uint64_t)sqlite3_column_int64(st, 3),
		.mismatched = (uint64_t)sqlite3_column_int64(st, 4),
		.repaired = (uint64_t)sqlite3_column_int64(st, 5),
	};
	const unsigned char *name = sqlite3_column_text(st, 0);

	return e->fn.counts(e->arg, name ? (const char *)name : "",
			    sqlite3_column_int(st, 1) != 0, &k);
}

int jobs_verify_counts(struct jobs *jq, unsigned max, jobs_counts_cb cb,
		       void *arg)
{
	struct catalog_each_cb e = { .fn.counts = cb, .arg = arg };

	return catalog_each_db(
		jq->db, "jobs verify counts",
		"SELECT d.name, d.owner_group IS NOT NULL, c.damaged,"
		" c.missing, c.mismatched, c.repaired FROM datasets d"
		" JOIN jobs_counts c ON c.job_id = (SELECT max(j.id)"
		"  FROM jobs j WHERE j.dataset_id = d.id"
		"  AND j.kind = 'verify' AND j.state IN ('done', 'failed'))"
		" WHERE d.state <> 2 ORDER BY d.id LIMIT ?",
		CATALOG_ARGS(CATALOG_INT(max)), jobs_counts_row, &e);
}

int jobs_cancel(struct jobs *jq, int64_t id, enum jobs_state *was)
{
	struct jobs_job j = { 0 };
	int ret;

	ret = catalog_exec(jq->db, "BEGIN IMMEDIATE");
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
	ret = jobs_update(
		jq,
		"UPDATE jobs SET state = 'cancelled',"
		" error = 'cancelled', updated = ?2"
		" WHERE id = ?1",
		CATALOG_ARGS(CATALOG_INT(id), CATALOG_INT(timeutil_real_s())),
		id, -EALREADY);
out:
	jobs_job_release(&j);
	if (ret) {
		catalog_rollback(jq->db);
		return ret;
	}
	return catalog_exec(jq->db, "COMMIT");
}

int jobs_recover(struct jobs *jq, unsigned *n)
{
	int changes = 0, ret;

	ret = catalog_run_db(jq->db, "jobs recover",
			     "UPDATE jobs SET state = 'queued', updated = ?"
			     " WHERE state = 'running'",
			     CATALOG_ARGS(CATALOG_INT(timeutil_real_s())),
			     &changes);
	if (!ret && n)
		*n = (unsigned)changes;
	return ret;
}

int jobs_last(struct jobs *jq, const char *dataset, const char *kind,
	      struct jobs_job *j)
{
	return jobs_one(jq, "jobs last",
			"SELECT " JOBS_COLS "WHERE d.name = ? AND j.kind = ?"
			" AND j.state IN ('done', 'failed')"
			" ORDER BY j.id DESC LIMIT 1",
			CATALOG_ARGS(CATALOG_TEXT(dataset), CATALOG_TEXT(kind)),
			j);
}

int jobs_newest(struct jobs *jq, const char *dataset, const char *kind,
		struct jobs_job *j)
{
	return jobs_one(jq, "jobs newest",
			"SELECT " JOBS_COLS "WHERE d.name = ? AND j.kind = ?"
			" ORDER BY j.id DESC LIMIT 1",
			CATALOG_ARGS(CATALOG_TEXT(dataset), CATALOG_TEXT(kind)),
			j);
}

int jobs_active(struct jobs *jq, const char *dataset, const char *kind,
		struct jobs_job *j)
{
	return jobs_one(jq, "jobs active",
			"SELECT " JOBS_COLS "WHERE d.name = ? AND j.kind = ?"
			" AND j.state IN ('queued', 'running')"
			" ORDER BY j.id LIMIT 1",
			CATALOG_ARGS(CATALOG_TEXT(dataset), CATALOG_TEXT(kind)),
			j);
}
