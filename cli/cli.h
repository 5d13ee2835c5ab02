/* SPDX-License-Identifier: MIT */
/*
 * cli: what the command-line tools (stager, cachectl) share: exit codes,
 * the global options before a command, and how sizes and times are
 * printed. Stateless.
 */
#ifndef DSTAGE_CLI_H
#define DSTAGE_CLI_H

#include <stddef.h>
#include <stdint.h>

/* Exit codes, the same for every tool (docs/stager.md, docs/cachectl.md). */
enum {
	CLI_EXIT_OK = 0,
	CLI_EXIT_FAIL = 1, /* the operation or job failed, or a mismatch */
	CLI_EXIT_USAGE = 2, /* bad command line or configuration */
	CLI_EXIT_DAEMON = 3, /* the daemon is not reachable */
	CLI_EXIT_DENIED = 4, /* refused: not root nor the admin group */
	CLI_EXIT_NOENT = 5, /* no such dataset or job */
};

/* The exit code for 0 or -errno: EPERM/EACCES denied, ENOENT no such
 * thing, EINVAL usage, anything else a failure. */
int cli_exit_code(int err);

/*
 * Consume the global options before the command word: --config FILE,
 * --config=FILE (stored in *config) and --help/-h. Returns 1 when help was
 * asked for (the caller prints its usage and exits 0), else 0 with
 * argc and argv advanced so that (*argv)[1] is the command word, if any.
 */
int cli_global_opts(int *argc, char ***argv, const char **config);

/* s for a terminal: its control bytes (0x00-0x1f, 0x7f: a newline or an
 * escape sequence in a file name) as \xNN, in buf (len bytes, cut short
 * when it does not fit); returns buf, or s itself when it has none. */
const char *cli_safe(const char *s, char *buf, size_t len);

/* v bytes for people ("512 B", "1.5 GiB") in buf; returns buf. */
const char *cli_bytes(uint64_t v, char *buf, size_t len);

/* s seconds left as "M:SS" or "H:MM:SS" in buf ("--:--" when unknown:
 * negative, NaN or over 100 hours). */
void cli_eta(double s, char *buf, size_t len);

/*
 * The row named name in a command table of n rows of row_size bytes each,
 * or NULL. Every row must begin with its name (`const char *name` as the
 * first member), as stager's and cachectl's tables do.
 */
const void *cli_cmd_find(const void *table, size_t n, size_t row_size,
			 const char *name);

/* Unix time t as local "YYYY-MM-DD HH:MM:SS" in buf ("never" for 0). */
void cli_time(int64_t t, char *buf, size_t len);

/* One cause of a shared tier not used on the node (the daemon's tier_CAUSE
 * fields), on stdout: "PREFIXnot used (CAUSE): WHAT (N times since FIRST,
 * last LAST)", WHAT through cli_safe; nothing when count is 0. */
void cli_tier_line(const char *prefix, const char *cause, uint64_t count,
		   int64_t first, int64_t last, const char *what);

#endif
