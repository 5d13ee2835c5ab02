/* SPDX-License-Identifier: MIT */
/*
 * daemon: the stager daemon, the room stager/daemon/ (docs/stager.md,
 * "Code"), as stager/main.c sees it. Inside the room: daemon_i.h (the
 * daemon's files), runner.h and sched.h (its jobs' runner and scheduler),
 * runner_i.h (the runner's files); none is included from outside it.
 */
#ifndef DSTAGE_STAGER_DAEMON_H
#define DSTAGE_STAGER_DAEMON_H

#include "dstage/config.h"
#include "stager.h"

/* Run the daemon until SIGTERM/SIGINT. Returns an exit code. */
int daemon_main(const struct dstage_config *cfg, const struct stager_opts *o);

#endif
