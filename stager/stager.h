/* SPDX-License-Identifier: MIT */
/*
 * stager: declarations shared by the stager's modules.
 *
 *   main.c     command line: the command table, options, help, dispatch
 *   client.c   talking to the daemon; text, --json and progress output
 *   jsonout.c  --json output (jansson) and its non-UTF-8 policy
 *   daemon.c   the daemon (daemon_i.h: daemon_conn.c, daemon_req.c)
 *   runner.c   running stage and verify jobs (workers, hashing)
 *   sched.c    request slots shared by priority; per-job bandwidth caps
 *   local.c    commands that need no daemon: ls, bench
 *   push.c     push: upload a directory (lib/push/push.c), then add, stage and
 *              verify through client.c
 *
 * docs/stager.md describes the commands, the protocol and the exit codes.
 */
#ifndef DSTAGE_STAGER_H
#define DSTAGE_STAGER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cli.h"
#include "dstage/config.h"
#include "dstage/jobs.h"
#include "dstage/proto.h"
#include "dstage/timeutil.h"

/* Exit codes: CLI_EXIT_* (cli/cli.h), the same for every tool. */

#define STAGER_PARALLEL_MAX 256 /* --parallel */
#define STAGER_EXCLUDES_MAX 256 /* push --exclude, as PUSH_EXCLUDES_MAX */

/* The daemon's connection limits (stager daemon --help, docs/stager.md). */
struct stager_daemon_limits {
	unsigned max_conns; /* served at once, all uids but 0 together */
	unsigned max_conns_uid; /* served at once per uid */
	unsigned idle_ms; /* a connection without a whole request closes */
};
#define STAGER_MAX_CONNS 64
#define STAGER_MAX_CONNS_UID 16
#define STAGER_IDLE_MS 5000
#define STAGER_CONNS_LIMIT 4096 /* the most --max-conns may say */

/* The parsed command line of every command. */
struct stager_opts {
	const char *config; /* --config */
	bool json; /* --json */
	bool wait; /* --wait */
	bool pin; /* --pin */
	bool fit; /* --fit */
	bool repair; /* --repair */
	bool fetch_missing; /* --fetch-missing (verify) */
	bool all; /* --all */
	const char *mode; /* "cache" or "source" (verify) */
	const char *version; /* --version */
	const char *manifest; /* --manifest */
	const char *shared_tier; /* --shared-tier DIR (add) */
	bool shared; /* --shared (stage) */
	const char *group; /* --group */
	const char *files; /* --files, comma-separated or @FILE */
	int64_t priority; /* --priority */
	bool has_priority;
	uint64_t bandwidth; /* --bandwidth, bytes/s, 0: none */
	unsigned parallel; /* --parallel, 0: default, else 1 to
			      STAGER_PARALLEL_MAX */
	unsigned jitter_s; /* --jitter (stage): most seconds to wait, 0: none */
	uint64_t bench_bytes; /* --size (bench) */
	const char *to; /* --to DIR (drill) */
	const char *step; /* --step S (drill) */
	int64_t since; /* --since T (unpublished), -1: not given */
	unsigned
		timeout_ms; /* --timeout T (unpublished --wait), 0: not given */
	struct stager_daemon_limits lim; /* daemon */
	/* push */
	const char *push_name; /* --name */
	bool push_stage, push_verify; /* --stage, --verify */
	bool push_delete, push_dry_run; /* --delete, --dry-run */
	bool push_new_version; /* --new-version */
	const char *push_excludes[STAGER_EXCLUDES_MAX]; /* --exclude */
	size_t push_n_excludes;
	int argc; /* positional arguments after the command */
	char **argv;
};

/* The shape of a command's --json output. */
enum stager_json {
	STAGER_JSON_NONE, /* prints nothing on success */
	STAGER_JSON_OBJECT, /* one object */
	STAGER_JSON_ARRAY, /* an array of objects, one a row */
};

/* stager_cmd.flags */
enum {
	STAGER_NEEDS_DAEMON = 1u << 0, /* a request to the daemon */
	STAGER_ARG_JOB = 1u << 1, /* the argument is a job id */
	STAGER_SUBMIT = 1u << 2, /* queues a job: prints its id or follows it */
	STAGER_ALWAYS_WAIT = 1u << 3, /* --wait is implied */
	STAGER_OWN_OPTS = 1u << 4, /* run(NULL, cmd, o) parses o->argv (the
				    * command and all after it) itself */
};

struct stager_cmd;
/* A command's handler. Returns an exit code. */
typedef int (*stager_run_fn)(const struct dstage_config *cfg,
			     const struct stager_cmd *cmd,
			     const struct stager_opts *o);

/* One entry of main.c's command table: the one list of commands. */
struct stager_cmd {
	const char *name; /* also the daemon request's cmd= */
	stager_run_fn run;
	unsigned flags;
	enum stager_json json;
	int min_args, max_args;
	const char *opts; /* accepted options: their letters in main.c's
			   * option table */
	const char *needs; /* options it cannot run without ("": none), shown
			    * after the arguments in its synopsis */
	const char *usage; /* the arguments */
	const char *summary; /* one line for `stager --help` */
	const char *help; /* `stager COMMAND --help` */
};

/* adhoc.c: stage and verify of a directory under a dstagefs mount (a PATH,
 * told from a dataset NAME by its '/'), run in this process. */
bool adhoc_is_path(const char *arg);
int adhoc_run(const struct dstage_config *cfg, const struct stager_cmd *cmd,
	      const struct stager_opts *o);

/* client.c: the commands that are requests to the daemon. */
int client_list(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o);
int client_show(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o);
int client_jobs(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o); /* jobs, status */
int client_add(const struct dstage_config *cfg, const struct stager_cmd *cmd,
	       const struct stager_opts *o); /* add, refresh */
int client_remove(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		  const struct stager_opts *o);
int client_cancel(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		  const struct stager_opts *o);
int client_submit(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		  const struct stager_opts *o); /* stage, verify */
int client_unpublished(const struct dstage_config *cfg,
		       const struct stager_cmd *cmd,
		       const struct stager_opts *o);

/* daemon.c: run the daemon until SIGTERM/SIGINT. Returns an exit code. */
int daemon_main(const struct dstage_config *cfg, const struct stager_opts *o);

/* local.c: the commands that need no daemon. */
int local_ls(const struct dstage_config *cfg, const struct stager_cmd *cmd,
	     const struct stager_opts *o);
int local_bench(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o);

/* push.c: upload a directory, register it (no daemon for the upload). */
int local_push(const struct dstage_config *cfg, const struct stager_cmd *cmd,
	       const struct stager_opts *o);

/* drill.c: the checkpoint recovery drill (no daemon). */
int local_drill(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o);

/* sched.c: see there for the rules. */
struct sched;
struct sched_job;
int sched_create(unsigned slots, struct sched **out);
void sched_destroy(struct sched *s); /* accepts NULL */
/* Register a job with weight (>= 1) and a cap in bytes/s (0: none). */
int sched_join(struct sched *s, unsigned weight, uint64_t rate,
	       struct sched_job **out);
void sched_leave(struct sched *s, struct sched_job *j); /* accepts NULL */
/* Wait for a slot and for the cap to allow len bytes. */
void sched_acquire(struct sched *s, struct sched_job *j, uint64_t len);
void sched_release(struct sched *s);

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
