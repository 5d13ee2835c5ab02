/* SPDX-License-Identifier: MIT */
/*
 * runner: running one stage or verify job (workers, hashing; runner.c),
 * as the daemon's other files see it: the job's live state, shared with
 * its watchers, and the walk over a dataset's files. Private to
 * stager/daemon/ (runner_i.h is what runner.c and runner_report.c share).
 */
#ifndef DSTAGE_STAGER_RUNNER_H
#define DSTAGE_STAGER_RUNNER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dstage/config.h"
#include "dstage/jobs.h"

struct cache;
struct sched;

/* runner.c: the live state of a running job, shared with watchers. */
struct runner_mismatch {
	char *key;
	char expected[65]; /* hex, "" when unknown */
	bool listed; /* expected is from the dataset's sums key, not staging */
	char actual[65];
	/* NULL: a SHA-256 mismatch (above). Otherwise what verify found in
	 * the cache: "damaged" or "repaired" (one block: block, path: the
	 * cache file), "missing" or "fetched" (count blocks not in it). */
	const char *kind;
	uint64_t block, count;
	char *path; /* or NULL */
};

struct runner_job {
	int64_t id;
	char kind[JOBS_KIND_MAX];
	char dataset[JOBS_NAME_MAX];
	int64_t created;
	/* counters: atomics, written by the workers, read by anyone */
	_Atomic uint64_t bytes_done, bytes_total;
	_Atomic uint64_t files_done, files_total;
	_Atomic bool cancel;
	_Atomic bool finished;
	_Atomic int refs; /* the daemon's list, its thread, each watcher */
	double started; /* monotonic seconds, set before the job is listed */
	/* lock protects the fields below; taken after daemon's jobs_lock */
	pthread_mutex_t lock;
	pthread_cond_t cond; /* broadcast when finished becomes true */
	struct runner_mismatch *mm; /* mismatches so far */
	size_t n_mm, cap_mm;
	enum jobs_state state; /* final state once finished */
	char error[JOBS_ERROR_MAX];
};

/* What the runner needs from the daemon. */
struct runner_env {
	const struct dstage_config *cfg;
	struct cache *cache; /* NULL when the cache could not be opened */
	struct sched *sched;
};

/* Run one claimed job to its end and record the result in the catalog. */
void runner_run(const struct runner_env *env, struct runner_job *rj,
		const struct jobs_job *j);

/*
 * Call cb for every file of dataset's current manifest with its path (in
 * no particular order). cb must not use cat. A non-zero return stops the
 * walk and is returned. Returns 0 or -errno as catalog_readdir.
 */
struct catalog;
struct catalog_entry;
typedef int (*runner_file_cb)(void *arg, const char *path,
			      const struct catalog_entry *e);
int runner_walk(struct catalog *cat, const char *dataset, runner_file_cb cb,
		void *arg);

/* Drop a reference; frees the job with the last one. */
void runner_put(struct runner_job *rj);

#endif
