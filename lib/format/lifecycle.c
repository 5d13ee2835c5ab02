// SPDX-License-Identifier: MIT
/*
 * lifecycle: rule checks and the plan of one job's checkpoints (see
 * include/dstage/lifecycle.h). Stateless and pure: no I/O, no clock, no
 * globals; every result depends only on the arguments.
 *
 * Plan invariants (checked by tests/unit/test_lifecycle.c):
 *   - the newest complete checkpoint is never deleted;
 *   - a checkpoint whose step is a multiple of K is never deleted;
 *   - nothing that is not complete is deleted, archived or dropped;
 *   - a checkpoint is archived only from the shared tier, and never when
 *     it is deleted in the same plan;
 *   - local copies of the newest N stay, unless they are archived.
 */
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/lifecycle.h"

static int lifecycle_fail(char *msg, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int lifecycle_fail(char *msg, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (msg && len) {
		va_start(ap, fmt);
		vsnprintf(msg, len, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* A '[' without its ']' makes fnmatch match nothing: refuse it. */
static bool lifecycle_brackets_ok(const char *p)
{
	for (; *p; p++) {
		if (*p != '[')
			continue;
		p++;
		if (*p == '!' || *p == '^')
			p++;
		if (*p == ']')
			p++;
		while (*p && *p != ']')
			p++;
		if (!*p)
			return false;
	}
	return true;
}

int lifecycle_rule_check(const struct lifecycle_rule *r, char *msg, size_t len)
{
	size_t plen = strnlen(r->pattern, sizeof(r->pattern));

	if (!plen)
		return lifecycle_fail(msg, len,
				      "lifecycle rule: empty job pattern; "
				      "give a job name or a glob like 'llm-*'");
	if (plen >= sizeof(r->pattern))
		return lifecycle_fail(msg, len,
				      "lifecycle rule: job pattern too long "
				      "(at most %u bytes)",
				      LIFECYCLE_PATTERN_MAX - 1);
	for (const char *p = r->pattern; *p; p++)
		if (*p == '/' || (unsigned char)*p < 0x20 || *p == 0x7f)
			return lifecycle_fail(
				msg, len,
				"lifecycle rule: job pattern '%s' has a '/' "
				"or a control character; a pattern "
				"matches one job name (the first directory "
				"under checkpoints/)",
				r->pattern);
	if (!lifecycle_brackets_ok(r->pattern))
		return lifecycle_fail(msg, len,
				      "lifecycle rule: job pattern '%s' has a "
				      "'[' without its ']'",
				      r->pattern);
	if (r->keep_local < 1)
		return lifecycle_fail(
			msg, len,
			"lifecycle rule for '%s': --keep-local %u: keep at "
			"least 1 checkpoint on the local disk (N >= 1)",
			r->pattern, r->keep_local);
	if (r->shared_days > LIFECYCLE_DAYS_MAX ||
	    r->delete_days > LIFECYCLE_DAYS_MAX)
		return lifecycle_fail(msg, len,
				      "lifecycle rule for '%s': a day count "
				      "over %u (100 years)",
				      r->pattern, LIFECYCLE_DAYS_MAX);
	if (r->delete_days && r->shared_days && r->delete_days < r->shared_days)
		return lifecycle_fail(
			msg, len,
			"lifecycle rule for '%s': --delete-days %u is less "
			"than --shared-days: a checkpoint would be deleted "
			"before it is archived; give R >= D, or no "
			"--shared-days",
			r->pattern, r->delete_days);
	if (r->shared_days && !r->archive[0])
		return lifecycle_fail(
			msg, len,
			"lifecycle rule for '%s': --shared-days %u needs "
			"--archive URL (where checkpoints move to)",
			r->pattern, r->shared_days);
	if (!r->shared_days && r->archive[0])
		return lifecycle_fail(
			msg, len,
			"lifecycle rule for '%s': --archive needs "
			"--shared-days D (when checkpoints move there)",
			r->pattern);
	if (r->archive[0] && strncmp(r->archive, "s3://", 5) &&
	    strncmp(r->archive, "file://", 7))
		return lifecycle_fail(
			msg, len,
			"lifecycle rule: archive URL '%s' is not s3://bucket/"
			"prefix/ or file:///dir/",
			r->archive);
	if (strnlen(r->archive, sizeof(r->archive)) >= sizeof(r->archive) ||
	    strnlen(r->storage_class, sizeof(r->storage_class)) >=
		    sizeof(r->storage_class))
		return lifecycle_fail(msg, len,
				      "lifecycle rule for '%s': archive URL or "
				      "storage class too long (%u bytes at "
				      "most)",
				      r->pattern, LIFECYCLE_URL_MAX - 1);
	for (const char *p = r->storage_class; *p; p++)
		if (!((*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
		      *p == '_'))
			return lifecycle_fail(
				msg, len,
				"lifecycle rule: storage class '%s' is not "
				"an S3 storage class (upper-case letters, "
				"digits and '_', e.g. GLACIER, STANDARD_IA)",
				r->storage_class);
	if (r->storage_class[0] && !r->archive[0])
		return lifecycle_fail(msg, len,
				      "lifecycle rule: --storage-class %s "
				      "needs --archive",
				      r->storage_class);
	return 0;
}

bool lifecycle_rule_match(const struct lifecycle_rule *r, const char *job)
{
	return fnmatch(r->pattern, job, 0) == 0;
}

const struct lifecycle_rule *
lifecycle_rule_find(const struct lifecycle_rule *rules, size_t n,
		    const char *job)
{
	for (size_t i = 0; i < n; i++)
		if (lifecycle_rule_match(&rules[i], job))
			return &rules[i];
	return NULL;
}

int64_t lifecycle_step(const char *name)
{
	const char *end = NULL, *start;
	int64_t v = 0;

	for (const char *p = name; *p; p++)
		if (*p >= '0' && *p <= '9')
			end = p;
	if (!end)
		return -1;
	start = end;
	while (start > name && start[-1] >= '0' && start[-1] <= '9')
		start--;
	while (*start == '0' && start < end)
		start++; /* leading zeros do not count towards the limit */
	if (end - start >= 18)
		return -1; /* too big to be a step */
	for (const char *p = start; p <= end; p++)
		v = v * 10 + (*p - '0');
	return v;
}

/* qsort's comparators: newest first. */
static int lifecycle_by_step(const void *a, const void *b)
{
	const struct lifecycle_ckpt *x = a, *y = b;

	if (x->step != y->step)
		return x->step > y->step ? -1 : 1;
	if (x->mtime != y->mtime)
		return x->mtime > y->mtime ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int lifecycle_by_mtime(const void *a, const void *b)
{
	const struct lifecycle_ckpt *x = a, *y = b;

	if (x->mtime != y->mtime)
		return x->mtime > y->mtime ? -1 : 1;
	return strcmp(x->name, y->name);
}

void lifecycle_plan(const struct lifecycle_rule *r, struct lifecycle_ckpt *c,
		    size_t n, int64_t now)
{
	bool numbered = true, newest_seen = false;

	for (size_t i = 0; i < n; i++) {
		c[i].step = lifecycle_step(c[i].name);
		numbered = numbered && c[i].step >= 0;
	}
	if (n > 1)
		qsort(c, n, sizeof(*c),
		      numbered ? lifecycle_by_step : lifecycle_by_mtime);
	for (size_t i = 0; i < n; i++) {
		struct lifecycle_ckpt *k = &c[i];
		int64_t age = now - k->mtime;

		k->rank = (unsigned)i;
		k->actions = 0;
		k->kept = 0;
		if (!k->complete)
			continue; /* being written or waiting to publish */
		if (!newest_seen) {
			newest_seen = true;
			k->kept |= LIFECYCLE_KEPT_NEWEST;
		}
		if (r->keep_every && k->step >= 0 &&
		    k->step % r->keep_every == 0)
			k->kept |= LIFECYCLE_KEPT_EVERY;
		if (r->delete_days &&
		    age >= (int64_t)r->delete_days * LIFECYCLE_DAY) {
			if (!k->kept) {
				k->actions = LIFECYCLE_DELETE;
				if (k->local)
					k->actions |= LIFECYCLE_DROP_LOCAL;
				continue;
			}
		} else {
			k->kept = 0; /* reported only when it stops a delete */
		}
		if (r->shared_days && k->tier == LIFECYCLE_SHARED &&
		    age >= (int64_t)r->shared_days * LIFECYCLE_DAY)
			k->actions |= LIFECYCLE_ARCHIVE_IT;
		/* an archived checkpoint leaves the node too */
		if (k->local && (k->rank >= r->keep_local ||
				 (k->actions & LIFECYCLE_ARCHIVE_IT)))
			k->actions |= LIFECYCLE_DROP_LOCAL;
	}
}

const char *lifecycle_action_name(unsigned action)
{
	switch (action) {
	case LIFECYCLE_DROP_LOCAL:
		return "drop-local";
	case LIFECYCLE_ARCHIVE_IT:
		return "archive";
	case LIFECYCLE_DELETE:
		return "delete";
	default:
		return "?";
	}
}

char *lifecycle_rule_str(const struct lifecycle_rule *r, char *buf, size_t len)
{
	snprintf(buf, len,
		 "%s keep-local=%u shared-days=%u delete-days=%u "
		 "keep-every=%u archive=%s storage-class=%s",
		 r->pattern, r->keep_local, r->shared_days, r->delete_days,
		 r->keep_every, r->archive[0] ? r->archive : "-",
		 r->storage_class[0] ? r->storage_class : "-");
	return buf;
}
