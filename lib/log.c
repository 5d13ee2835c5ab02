// SPDX-License-Identifier: MIT
/*
 * log: leveled logging.
 *
 * State: the level and the syslog switch are process-wide atomics; they may be
 * changed by any thread at any time and take effect on the next message.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "dstage/log.h"

static _Atomic int log_level_cur = LOG_LVL_INFO;
static _Atomic int log_syslog;

static const char *const log_names[] = { "error", "warn", "info", "debug" };

int log_level_parse(const char *s)
{
	for (int i = 0; i < 4; i++)
		if (strcasecmp(s, log_names[i]) == 0)
			return i;
	if (strcasecmp(s, "warning") == 0)
		return LOG_LVL_WARN;
	return -EINVAL;
}

const char *log_level_name(enum log_level lvl)
{
	if ((int)lvl < 0 || lvl > LOG_LVL_DEBUG)
		return "?";
	return log_names[lvl];
}

void log_set_level(enum log_level lvl)
{
	atomic_store(&log_level_cur, lvl);
}

enum log_level log_get_level(void)
{
	return atomic_load(&log_level_cur);
}

void log_use_syslog(const char *ident)
{
	openlog(ident, LOG_PID, LOG_DAEMON);
	atomic_store(&log_syslog, 1);
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	char line[2048];
	int n = 0;
	va_list ap;

	if ((int)lvl > atomic_load(&log_level_cur))
		return;
	if (!atomic_load(&log_syslog)) {
		struct timespec ts;
		struct tm tm;

		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		n = snprintf(line, sizeof(line),
			     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s: ",
			     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
			     tm.tm_hour, tm.tm_min, tm.tm_sec,
			     ts.tv_nsec / 1000000, log_level_name(lvl));
	}
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	n += m;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	if (atomic_load(&log_syslog)) {
		line[n] = '\0';
		syslog(prio[lvl], "%s", line);
		return;
	}
	line[n++] = '\n';
	/* One write per line: lines from threads never interleave. */
	ssize_t w = write(STDERR_FILENO, line, (size_t)n);
	(void)w;
}
