/* SPDX-License-Identifier: MIT */
/*
 * lifecycle (front end): `stager lifecycle` and `cachectl lifecycle`, one
 * implementation both tools link (in cli/'s static library, dstage_cli):
 * parse the subcommand and its options, make the daemon request
 * (lifecycle.list, .add, .remove, .run), print the rows or --json.
 */
#ifndef DSTAGE_CLI_LIFECYCLE_H
#define DSTAGE_CLI_LIFECYCLE_H

#include "dstage/config.h"

/* The help text of the command (usage line and options), for --help and
 * the tools' man pages. */
extern const char lifecycle_cli_help[];

/*
 * Run `prog lifecycle ARGS`: argv[0] is "lifecycle", the subcommand and
 * options follow. config is the --config given before the command (may be
 * NULL; --config after it overrides). Returns the tools' exit code: 0 ok,
 * 1 failed, 2 usage or a rule refused, 3 daemon not running, 4 permission
 * denied, 5 no such rule.
 */
int lifecycle_cli(const char *prog, const char *config, int argc, char **argv);

#endif
