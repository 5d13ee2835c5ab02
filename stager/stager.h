/* SPDX-License-Identifier: MIT */
/*
 * stager: declarations shared by the stager's modules.
 *
 *   main.c     command line: the command table, options, help, dispatch
 *   client.c   talking to the daemon; text, --json and progress output
 *   adhoc.c    stage and verify of a directory read through a mount
 *   local.c    commands that need no daemon: ls, bench
 *   drill.c    the checkpoint recovery drill
 *   push.c     push: upload a directory (lib/push/push.c), then add, stage and
 *              verify through client.c
 *   daemon/    the daemon, a room of its own (daemon/daemon.h: daemon_main;
 *              its jobs' runner and scheduler are private to it); it takes
 *              its options and limits from this header
 *
 * --json output, exit codes and the global options: cli/ (jsonout.h, cli.h),
 * shared with cachectl.
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

#endif
