/* SPDX-License-Identifier: MIT */
/*
 * cachectl: the admins' console over the stager daemon's socket
 * (docs/cachectl.md). main.c parses the command line through its command
 * table; conn.c talks to the daemon; cmds.c holds each command's request
 * and printers.
 */
#ifndef DSTAGE_CACHECTL_H
#define DSTAGE_CACHECTL_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "cli.h"
#include "dstage/config.h"
#include "dstage/proto.h"
#include "dstage/proto_client.h"

/* Exit codes: CLI_EXIT_* (cli/cli.h), the same as the stager's. */

/* The parsed command line. */
struct cachectl_opts {
	const char *config;
	bool json, dry_run, to_low;
	const char *capacity, *high, *low; /* policy set, already checked */
	int64_t since; /* audit --since, seconds; 0: all */
	int64_t older_than; /* evict and gc --older-than, seconds; 0: not given */
	const char *user; /* audit --user */
	int argc;
	char **argv;
};

struct cachectl_cmd;
typedef int (*cachectl_run_fn)(const struct dstage_config *cfg,
			       const struct cachectl_cmd *cmd,
			       const struct cachectl_opts *o);

struct cachectl_cmd {
	const char *name;
	cachectl_run_fn run;
	int min_args, max_args;
	const char *opts; /* short codes of the options it takes */
	const char *usage; /* arguments */
	const char *help;
};

/* conn.c: one request, its rows and its end line. */
struct conn {
	const struct dstage_config *cfg;
	struct proto_client pc; /* the request in pc.out, the row in pc.msg,
				   the end line's pc.rc and pc.endmsg */
};

/* Called for each row (not the end line); non-zero stops. */
typedef int (*conn_row_cb)(struct conn *cn, void *arg);

/* Connect to daemon.socket and start a request for cmd in cn->pc.out.
 * Returns 0 or -errno (message printed). */
int conn_open(struct conn *cn, const struct dstage_config *cfg,
	      const char *cmd);
/* Send cn->pc.out, feed rows to cb until the end line. Returns 0 (the
 * daemon's answer in cn->pc.rc) or -errno (message printed). */
int conn_call(struct conn *cn, conn_row_cb cb, void *arg);
/* The exit code for a finished call, printing the daemon's error. */
int conn_result(struct conn *cn);
/* Close (accepts a never-opened, zeroed cn). */
void conn_close(struct conn *cn);
/* Field k of the row ("" when absent). */
const char *conn_get(struct conn *cn, const char *k);

/* cmds.c: the commands. */
/* lifecycle.c: `cachectl lifecycle`, o->argv from the command's name on
 * (cfg is NULL: it loads the configuration itself). */
int lifecycle_cachectl_run(const struct dstage_config *cfg,
			   const struct cachectl_cmd *cmd,
			   const struct cachectl_opts *o);
int cmds_status(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
		const struct cachectl_opts *o);
int cmds_dataset(const struct dstage_config *cfg,
		 const struct cachectl_cmd *cmd, const struct cachectl_opts *o);
int cmds_policy(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
		const struct cachectl_opts *o);
int cmds_evict(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
	       const struct cachectl_opts *o);
int cmds_audit(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
	       const struct cachectl_opts *o);
int cmds_gc(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
	    const struct cachectl_opts *o);

#endif
