// SPDX-License-Identifier: MIT
/*
 * cli: exit codes, global options, sizes and times for the command-line
 * tools (cli.h). Stateless.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"

int cli_exit_code(int err)
{
	switch (err) {
	case 0:
		return CLI_EXIT_OK;
	case -EPERM:
	case -EACCES:
		return CLI_EXIT_DENIED;
	case -ENOENT:
		return CLI_EXIT_NOENT;
	case -EINVAL:
		return CLI_EXIT_USAGE;
	default:
		return CLI_EXIT_FAIL;
	}
}

int cli_global_opts(int *argc, char ***argv, const char **config)
{
	char **av = *argv;
	int ac = *argc;

	while (ac > 1 && av[1][0] == '-') {
		if (!strcmp(av[1], "--help") || !strcmp(av[1], "-h"))
			return 1;
		if (!strcmp(av[1], "--config") && ac > 2) {
			*config = av[2];
			av += 2;
			ac -= 2;
		} else if (!strncmp(av[1], "--config=", 9)) {
			*config = av[1] + 9;
			av++;
			ac--;
		} else {
			break;
		}
	}
	*argv = av;
	*argc = ac;
	return 0;
}

const char *cli_safe(const char *s, char *buf, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = 0;
	const char *p;

	for (p = s; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			break;
	if (!*p || !len)
		return s;
	for (p = s; *p && n + 5 <= len; p++) {
		unsigned char c = (unsigned char)*p;

		if (c >= 0x20 && c != 0x7f) {
			buf[n++] = (char)c;
			continue;
		}
		buf[n++] = '\\';
		buf[n++] = 'x';
		buf[n++] = hex[c >> 4];
		buf[n++] = hex[c & 15];
	}
	buf[n] = '\0';
	return buf;
}

const char *cli_bytes(uint64_t v, char *buf, size_t len)
{
	static const char *const units[] = { "B",   "KiB", "MiB",
					     "GiB", "TiB", "PiB" };
	double d = (double)v;
	int u = 0;

	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", v);
	else
		snprintf(buf, len, "%.1f %s", d, units[u]);
	return buf;
}

void cli_time(int64_t t, char *buf, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;

	if (!t) {
		snprintf(buf, len, "never");
		return;
	}
	localtime_r(&tt, &tm);
	strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

void cli_eta(double s, char *buf, size_t len)
{
	if (!(s >= 0 && s <= 360000)) /* NaN too: (int)NaN is undefined */
		snprintf(buf, len, "--:--");
	else if (s >= 3600)
		snprintf(buf, len, "%d:%02d:%02d", (int)s / 3600,
			 (int)s / 60 % 60, (int)s % 60);
	else
		snprintf(buf, len, "%d:%02d", (int)s / 60, (int)s % 60);
}

const void *cli_cmd_find(const void *table, size_t n, size_t row_size,
			 const char *name)
{
	const char *row = table;

	for (size_t i = 0; i < n; i++, row += row_size) {
		const char *const *row_name = (const char *const *)row;

		if (!strcmp(*row_name, name))
			return row;
	}
	return NULL;
}

void cli_tier_line(const char *prefix, const char *cause, uint64_t count,
		   int64_t first, int64_t last, const char *what)
{
	char f[64], l[64], safe[1024];

	if (!count)
		return;
	cli_time(first, f, sizeof(f));
	cli_time(last, l, sizeof(l));
	printf("%snot used (%s): %s (%" PRIu64 " time%s since %s, last %s)\n",
	       prefix, cause, cli_safe(what ? what : "", safe, sizeof(safe)),
	       count, count == 1 ? "" : "s", f, l);
}
