/* SPDX-License-Identifier: MIT */
/*
 * runner_i.h: what runner.c (a job's life: files, workers, reads, hashes)
 * and runner_report.c (what the job found, and its final message) share.
 * The locking rules of struct runner_ctx are in runner.c's opening comment.
 */
#ifndef DSTAGE_RUNNER_I_H
#define DSTAGE_RUNNER_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dstage/catalog.h"
#include "dstage/objstore.h"
#include "runner.h"
#include "sched.h"
#include "stager.h"

struct cache_object;

/* At most this many cache-block entries (damaged, missing...) a job keeps
 * for its watchers: a never-staged dataset of a million files must not
 * hold a million rows. */
#define RUNNER_FOUND_MAX 10000

struct runner_file {
	char *key;
	int64_t id;
	uint64_t size;
	char etag[OBJSTORE_ETAG_MAX];
	bool has_exp, has_act;
	unsigned char exp[32], act[32];
	int64_t verified_at;
};

struct runner_ctx {
	const struct runner_env *env;
	struct runner_job *rj;
	struct objstore *os;
	struct sched_job *sj;
	pthread_mutex_t cat_lock; /* protects cat; before rj->lock */
	struct catalog *cat;
	struct runner_file *files;
	size_t n, cap;
	_Atomic size_t next; /* next file to take */
	pthread_mutex_t run_lock; /* a leaf; protects running */
	pthread_cond_t run_cv; /* a worker ended */
	unsigned running; /* workers not finished */
	_Atomic uint64_t errors, unchecked;
	_Atomic uint64_t mismatched; /* files whose SHA-256 differs */
	/* verify in the cache: what cache_object_check found */
	_Atomic uint64_t damaged, damaged_files, missing, missing_files;
	bool stage, cache_mode, repair, fit, fetch_missing;
	_Atomic bool cache_recreated; /* cache_dir_recover did, in this job */
	/* rj->lock: cache-block entries kept in rj->mm, and those left out
	 * past RUNNER_FOUND_MAX (the counts above stay exact) */
	size_t n_found, n_unlisted;
	size_t chunk;
	unsigned workers;
	uint64_t rate;
	char *files_arg; /* newline-separated keys, or NULL */
	const char *sums_key; /* the dataset's, for messages */
	struct catalog_dataset ds; /* the job's dataset, read at the start */
	_Atomic unsigned refs; /* the job's thread + each running worker */
};

/* runner_report.c */

/* Keep the first error message of the job (rj->lock); logged. */
void runner_error(struct runner_ctx *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* The cache's view of file f. */
void runner_obj(const struct runner_ctx *c, const struct runner_file *f,
		struct cache_object *o);

/* Add an entry to rj->mm (struct runner_mismatch): src's fields, f's key,
 * a copy of path (may be NULL). Best effort: left out on no memory. */
void runner_found(struct runner_ctx *c, const struct runner_file *f,
		  const struct runner_mismatch *src, const char *path);

/* A SHA-256 mismatch of f: got, and the reference (NULL: none). */
void runner_mismatch(struct runner_ctx *c, const struct runner_file *f,
		     const unsigned char *ref, const unsigned char got[32]);

/* verify in the cache: check f's blocks first; true when f is to be read. */
bool runner_check(struct runner_ctx *c, const struct runner_file *f);

/* What a verify job found, for the catalog (jobs_finish_counts): what is
 * left damaged or missing, the SHA-256 mismatches, the blocks repaired. */
void runner_counts(struct runner_ctx *c, struct jobs_counts *k);

/* The job's final state and message (ret: the job's own error, or 0). */
void runner_result(struct runner_ctx *c, int ret, enum jobs_state *st,
		   char *msg, size_t len);

#endif
