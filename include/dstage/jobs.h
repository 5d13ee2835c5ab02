/* SPDX-License-Identifier: MIT */
/*
 * jobs: the stager's persistent work queue, in the catalog's `jobs` table.
 *
 * Job states (jobs.state, stored as the names below):
 *
 *   queued --claim--> running --finish--> done | failed
 *     |                 |  ^
 *     |                 |  +--(jobs_recover: the daemon died)-- running
 *     +----cancel-------+--cancel--> cancelled
 *
 * done, failed and cancelled are final: nothing changes them again.
 * Progress and finish only apply to a running job, so a job cancelled while
 * it runs stays cancelled, and the runner learns it from -ECANCELED.
 *
 * A job's arguments (a proto line, see proto.h) live in the `jobs_args`
 * table, created by jobs_open when missing (see docs/stager.md).
 *
 * Concurrency: a struct jobs is one SQLite connection to the catalog file:
 * one thread at a time; open one per thread. Processes share the file
 * through SQLite's WAL locking; every change is one BEGIN IMMEDIATE
 * transaction, so two daemons never claim the same job.
 *
 * Errors are -errno; the SQLite message is logged:
 *   -ENOENT   no such job / dataset, or the catalog file is missing
 *   -EPROTO   the catalog's schema has no jobs table (older than version 2)
 *   -EBUSY    the database stayed locked past the busy timeout
 *   -ENOSPC   the disk is full
 *   -EACCES   the file cannot be opened or written
 *   -ENOMEM   out of memory
 *   -EINVAL   a bad argument
 *   -EIO      any other SQLite error
 */
#ifndef DSTAGE_JOBS_H
#define DSTAGE_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jobs;

enum jobs_state {
	JOBS_QUEUED = 0,
	JOBS_RUNNING = 1,
	JOBS_DONE = 2,
	JOBS_FAILED = 3,
	JOBS_CANCELLED = 4,
};

#define JOBS_KIND_MAX 16
#define JOBS_NAME_MAX 256
#define JOBS_ERROR_MAX 1024

/* What a verify job found (table jobs_counts, schema 7), kept with the
 * job when it finishes: the blocks still damaged or missing in the cache
 * (not fixed by --repair / --fetch-missing), the files whose SHA-256
 * differs, and the damaged blocks --repair fetched again. */
struct jobs_counts {
	uint64_t damaged, missing, mismatched, repaired;
};

struct jobs_job {
	int64_t id;
	char kind[JOBS_KIND_MAX]; /* "stage", "verify" */
	char dataset[JOBS_NAME_MAX]; /* "" when the dataset was removed */
	int64_t dataset_id; /* 0 when the dataset was removed */
	int priority; /* the dataset's */
	enum jobs_state state;
	uint64_t done, total; /* bytes */
	char error[JOBS_ERROR_MAX]; /* "" when none */
	char *args; /* proto line without '\n'; owned, jobs_job_release */
	int64_t created, updated; /* seconds since the epoch */
	bool has_counts; /* a finished verify job: counts is set */
	struct jobs_counts counts;
};

/* "queued", "running", ... ; "?" for a bad value. */
const char *jobs_state_name(enum jobs_state st);

/* Parse a state name. Returns the state or -EINVAL. */
int jobs_state_parse(const char *s);

/* true for done, failed and cancelled. */
bool jobs_state_final(enum jobs_state st);

/*
 * Open a connection to the catalog at path (which catalog_open has created
 * and migrated). Creates the jobs_args table if missing. Returns 0, -ENOENT,
 * -EPROTO, or an error above.
 */
int jobs_open(const char *path, struct jobs **out);

/* Accepts NULL. */
void jobs_close(struct jobs *jq);

/*
 * Queue a job of kind for dataset (by name; it must exist) with args
 * (may be NULL). *id gets the new job's id. Returns 0, -ENOENT (no such
 * dataset), -EINVAL (empty kind or one of JOBS_KIND_MAX or more bytes), or
 * an error above.
 */
int jobs_submit(struct jobs *jq, const char *kind, const char *dataset,
		const char *args, int64_t *id);

/*
 * Parse a job id strictly: decimal digits only (no sign, space or other
 * byte), 1 to JOBS_ID_MAX. Returns 0, -EINVAL (not a number) or -ERANGE
 * (0, or larger than JOBS_ID_MAX).
 */
#define JOBS_ID_MAX INT64_MAX
int jobs_parse_id(const char *s, int64_t *id);

/* Fill j (release with jobs_job_release). -ENOENT if no such job. */
int jobs_get(struct jobs *jq, int64_t id, struct jobs_job *j);

/* Free j->args; accepts NULL and a zeroed job. */
void jobs_job_release(struct jobs_job *j);

/*
 * Call cb for jobs, newest first: every job not final, and the newest
 * `finished` final ones (0: none; UINT32_MAX: all). The job passed is valid
 * only during the call; a non-zero return stops and is returned.
 */
typedef int (*jobs_cb)(void *arg, const struct jobs_job *j);
int jobs_list(struct jobs *jq, unsigned finished, jobs_cb cb, void *arg);

/*
 * Take the next queued job (highest dataset priority, then oldest) and make
 * it running. Returns 0 with j filled, -ENOENT when none is queued, or an
 * error above. When none is queued it only reads: it never waits for the
 * write lock (a dispatcher polls it).
 */
int jobs_claim(struct jobs *jq, struct jobs_job *j);

/*
 * Record progress of a running job. Returns 0, -ECANCELED when the job is
 * no longer running (cancelled), -ENOENT, or an error above.
 */
int jobs_progress(struct jobs *jq, int64_t id, uint64_t done, uint64_t total);

/*
 * Finish a running job with st (JOBS_DONE or JOBS_FAILED) and error (may be
 * NULL; truncated to JOBS_ERROR_MAX - 1 bytes). Returns 0, -ECANCELED when
 * it is no longer running, -EINVAL for another st, -ENOENT, or an error.
 */
int jobs_finish(struct jobs *jq, int64_t id, enum jobs_state st,
		const char *error);

/*
 * jobs_finish, and keep what the job found (counts; NULL: nothing, as
 * jobs_finish) with it, in one transaction. Returns as jobs_finish.
 */
int jobs_finish_counts(struct jobs *jq, int64_t id, enum jobs_state st,
		       const char *error, const struct jobs_counts *counts);

/*
 * For each dataset (not being removed), in the order it was added, whose
 * newest finished verify job has counts: cb(arg, name, restricted (the
 * dataset has a group), counts). At most `max` calls; a non-zero return
 * stops and is returned. Returns 0 or an error above.
 */
typedef int (*jobs_counts_cb)(void *arg, const char *dataset, bool restricted,
			      const struct jobs_counts *counts);
int jobs_verify_counts(struct jobs *jq, unsigned max, jobs_counts_cb cb,
		       void *arg);

/*
 * Cancel a queued or running job. *was (may be NULL) gets its state before.
 * Returns 0, -EALREADY when it had already finished, -ENOENT, or an error.
 */
int jobs_cancel(struct jobs *jq, int64_t id, enum jobs_state *was);

/*
 * After a crash: make every running job queued again, for this (the only)
 * daemon to resume. *n (may be NULL) gets how many. Returns 0 or an error.
 */
int jobs_recover(struct jobs *jq, unsigned *n);

/*
 * The newest final job of kind for dataset (by name), for `stager show`.
 * Returns 0, -ENOENT when there is none, or an error above.
 */
int jobs_last(struct jobs *jq, const char *dataset, const char *kind,
	      struct jobs_job *j);

/*
 * The newest job of kind for dataset (by name), in any state: the job a
 * request with join=1 and after=N follows when its id is above N (a job
 * queued, or even finished, since the caller looked). Returns 0, -ENOENT
 * when there is none, or an error above.
 */
int jobs_newest(struct jobs *jq, const char *dataset, const char *kind,
		struct jobs_job *j);

/*
 * The oldest queued or running job of kind for dataset (by name): the one
 * a request that joins (the stager's `join=1`, dstage-csi's publish)
 * follows instead of queueing another. Returns 0, -ENOENT when there is
 * none, or an error above.
 */
int jobs_active(struct jobs *jq, const char *dataset, const char *kind,
		struct jobs_job *j);

#endif
