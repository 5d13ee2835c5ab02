/* SPDX-License-Identifier: MIT */
/*
 * log: leveled logging to stderr or syslog.
 *
 * The level is process-wide and may be changed at any time; each message is
 * written with one write(2) (stderr) or one syslog(3) call, so lines from
 * different threads never interleave.
 *
 * A line is at most 4 KiB. A longer message keeps its first 1 KiB and its
 * end (where messages put the reason and the fix) around a mark
 * "...(N bytes cut)...".
 */
#ifndef DSTAGE_LOG_H
#define DSTAGE_LOG_H

enum log_level {
	LOG_LVL_ERROR = 0,
	LOG_LVL_WARN = 1,
	LOG_LVL_INFO = 2,
	LOG_LVL_DEBUG = 3,
};

/* Parse "error", "warn", "info" or "debug". Returns the level or -EINVAL. */
int log_level_parse(const char *s);
const char *log_level_name(enum log_level lvl);

void log_set_level(enum log_level lvl);
enum log_level log_get_level(void);

/* Send messages to syslog (ident) instead of stderr. */
void log_use_syslog(const char *ident);

void log_msg(enum log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * The calling thread's first error message (log_error, whatever the level
 * in force; without the time and level prefix) since its last
 * log_cause_clear, or NULL: the root cause, before the errors that follow
 * from it ("fetching block 3 failed: EIO" after the store's own message).
 * For a server that hands a failure's cause to the user who asked: clear
 * before the request, read on failure.
 */
const char *log_cause(void);
void log_cause_clear(void);

/*
 * A broken invariant (BUG_ON): logs where and what at error level, then
 * aborts. Never returns. For states the code's own locks and counts rule
 * out, not for anything input, a store or the disk can cause.
 */
_Noreturn void log_bug(const char *file, int line, const char *what);
#define BUG_ON(cond)                                        \
	do {                                                \
		if (__builtin_expect(!!(cond), 0))          \
			log_bug(__FILE__, __LINE__, #cond); \
	} while (0)

#define log_error(...) log_msg(LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...)                                       \
	do {                                                 \
		if (log_get_level() >= LOG_LVL_DEBUG)        \
			log_msg(LOG_LVL_DEBUG, __VA_ARGS__); \
	} while (0)

#endif
