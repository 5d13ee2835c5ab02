// SPDX-License-Identifier: MIT
/*
 * log: leveled logging.
 *
 * State: the level and the syslog switch are process-wide atomics; they may be
 * changed by any thread at any time and take effect on the next message.
 *
 * Long lines: a line is at most LOG_LINE_MAX bytes. A longer message loses
 * its middle, never its end (where the reason and the fix are): the first
 * LOG_HEAD_KEEP bytes, then "...(N bytes cut)...", then as much of the end
 * as fits.
 *
 * Control bytes: a message is one line. Its bytes 0x00-0x1f and 0x7f (a
 * newline or an escape sequence in a file name, a key, a peer's text) are
 * written as \xNN, or as '?' where the escaped text would not fit, so no
 * message can forge a line or reach a terminal's controls.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "dstage/log.h"

#define LOG_LINE_MAX 4096 /* bytes of one line, its newline included */
#define LOG_LAST_MAX 1024 /* bytes kept of a thread's last error */
#define LOG_HEAD_KEEP 1024 /* of a message cut short, its first bytes */
#define LOG_MARK_ROOM 40 /* room kept for the "...(N bytes cut)..." mark */

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

/*
 * The message of m bytes did not fit in text (room bytes, no NUL needed):
 * format it again in full (ap) and keep its head and its tail around a
 * mark. Returns the bytes now in text.
 */
static size_t log_cut_middle(char *text, size_t room, size_t m, const char *fmt,
			     va_list ap) __attribute__((format(printf, 4, 0)));
static size_t log_cut_middle(char *text, size_t room, size_t m, const char *fmt,
			     va_list ap)
{
	size_t tail = room - LOG_HEAD_KEEP - LOG_MARK_ROOM, cut, k;
	char *full = malloc(m + 1);
	char mark[LOG_MARK_ROOM];

	if (!full || vsnprintf(full, m + 1, fmt, ap) != (int)m) {
		/* No memory for the whole: keep the head, say so. */
		free(full);
		k = room - LOG_MARK_ROOM;
		k += (size_t)snprintf(text + k, LOG_MARK_ROOM,
				      "...(%zu bytes cut)", m - k);
		return k;
	}
	cut = m - LOG_HEAD_KEEP - tail;
	memcpy(text, full, LOG_HEAD_KEEP);
	k = LOG_HEAD_KEEP;
	k += (size_t)snprintf(mark, sizeof(mark), "...(%zu bytes cut)...", cut);
	memcpy(text + LOG_HEAD_KEEP, mark, k - LOG_HEAD_KEEP);
	memcpy(text + k, full + m - tail, tail);
	free(full);
	return k + tail;
}

static bool log_ctl(unsigned char c)
{
	return c < 0x20 || c == 0x7f;
}

/* Escape the control bytes of text[0, len) in place (room bytes at
 * most); returns the new length. */
static size_t log_escape(char *text, size_t len, size_t room)
{
	static const char hex[] = "0123456789abcdef";
	size_t nctl = 0, out;

	for (size_t i = 0; i < len; i++)
		nctl += log_ctl((unsigned char)text[i]);
	if (!nctl)
		return len;
	if (len + 3 * nctl > room) {
		for (size_t i = 0; i < len; i++)
			if (log_ctl((unsigned char)text[i]))
				text[i] = '?';
		return len;
	}
	out = len + 3 * nctl;
	for (size_t i = len, o = out; i-- > 0;) {
		unsigned char c = (unsigned char)text[i];

		if (!log_ctl(c)) {
			text[--o] = (char)c;
			continue;
		}
		text[--o] = hex[c & 15];
		text[--o] = hex[c >> 4];
		text[--o] = 'x';
		text[--o] = '\\';
	}
	return out;
}

/* This thread's first log_error text since the clear ("" when none). */
static _Thread_local char log_last[LOG_LAST_MAX];

const char *log_cause(void)
{
	return log_last[0] ? log_last : NULL;
}

void log_cause_clear(void)
{
	log_last[0] = '\0';
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	char line[LOG_LINE_MAX + 1];
	size_t n = 0, room;
	va_list ap, again;
	int m;

	if (lvl == LOG_LVL_ERROR && !log_last[0]) {
		va_start(ap, fmt);
		vsnprintf(log_last, sizeof(log_last), fmt, ap);
		va_end(ap);
		for (char *p = log_last; *p; p++)
			if (log_ctl((unsigned char)*p))
				*p = '?';
	}
	if ((int)lvl > atomic_load(&log_level_cur))
		return;
	if (!atomic_load(&log_syslog)) {
		struct timespec ts;
		struct tm tm;

		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		n = (size_t)snprintf(
			line, sizeof(line),
			"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s: ",
			tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
			tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
			log_level_name(lvl));
	}
	/* The text's room: the line less its prefix and its newline. */
	room = LOG_LINE_MAX - n - 1;
	va_start(ap, fmt);
	va_copy(again, ap);
	m = vsnprintf(line + n, room + 1, fmt, ap);
	va_end(ap);
	if (m >= 0 && (size_t)m > room)
		n += log_escape(
			line + n,
			log_cut_middle(line + n, room, (size_t)m, fmt, again),
			room);
	else if (m >= 0)
		n += log_escape(line + n, (size_t)m, room);
	va_end(again);
	if (m < 0)
		return;
	if (atomic_load(&log_syslog)) {
		line[n] = '\0';
		syslog(prio[lvl], "%s", line);
		return;
	}
	line[n++] = '\n';
	/* One write per line: lines from threads never interleave. */
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
}

void log_bug(const char *file, int line, const char *what)
{
	log_error("BUG at %s:%d: %s (a broken invariant; aborting)", file, line,
		  what);
	abort();
}
