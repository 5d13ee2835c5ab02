/* SPDX-License-Identifier: MIT */
/*
 * lifecycle: the checkpoint lifecycle rules and what they decide, as pure
 * functions (no I/O, no clock: the caller passes "now"). What applies the
 * decisions to the stores is include/dstage/lifecycle_run.h.
 *
 * A rule names a job-name pattern (fnmatch(3) glob: * ? [...]) and:
 *   keep_local  N >= 1  the newest N checkpoints of a job keep their local
 *                       copies (checkpoints.staging_dir); older published
 *                       copies are dropped (the store keeps them), and so
 *                       are those of archived checkpoints
 *   shared_days D       after D days on the shared tier (the store), a
 *                       checkpoint moves to the archive URL (0: never)
 *   delete_days R       after R days a checkpoint is deleted from every
 *                       tier (0: never); R >= D when both are set
 *   keep_every  K       checkpoints whose step number is a multiple of K
 *                       are never deleted (0: none)
 *   archive             the archive tier's URL (s3:// or file://); needed
 *                       by D > 0
 *   storage_class       the S3 storage class of archived objects ("": the
 *                       store's default), e.g. GLACIER, STANDARD_IA
 * The newest complete checkpoint of a job is never deleted.
 *
 * A checkpoint is a file or a directory directly under "<job>/". Its age is
 * now minus its mtime (its newest file). Order, newest first: by the step
 * number in the name (the last run of digits) when every checkpoint of
 * the job has one, else by mtime (ties: by name).
 */
#ifndef DSTAGE_LIFECYCLE_H
#define DSTAGE_LIFECYCLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LIFECYCLE_PATTERN_MAX 256 /* with the NUL */
#define LIFECYCLE_URL_MAX 1024 /* with the NUL */
#define LIFECYCLE_CLASS_MAX 64 /* with the NUL */
#define LIFECYCLE_DAYS_MAX 36500u /* 100 years */
#define LIFECYCLE_DAY 86400 /* seconds */

struct lifecycle_rule {
	int64_t id; /* set by the catalog; rules apply in id order */
	char pattern[LIFECYCLE_PATTERN_MAX];
	unsigned keep_local; /* N */
	unsigned shared_days; /* D, 0: never archived */
	unsigned delete_days; /* R, 0: never deleted */
	unsigned keep_every; /* K, 0: none kept forever */
	char archive[LIFECYCLE_URL_MAX]; /* "" when D is 0 */
	char storage_class[LIFECYCLE_CLASS_MAX]; /* "" : default */
};

/* Where a checkpoint's bytes are. */
enum lifecycle_tier {
	LIFECYCLE_SHARED = 0, /* in the store */
	LIFECYCLE_ARCHIVE = 1, /* moved to the archive URL */
};

/* What a plan does to one checkpoint (bits). */
enum {
	LIFECYCLE_DROP_LOCAL = 1u << 0, /* drop its published local copies */
	LIFECYCLE_ARCHIVE_IT = 1u << 1, /* move shared -> archive */
	LIFECYCLE_DELETE = 1u << 2, /* delete from every tier */
};

/* Why a checkpoint is kept although a rule would act (bits). */
enum {
	LIFECYCLE_KEPT_NEWEST = 1u << 0, /* the newest complete one */
	LIFECYCLE_KEPT_EVERY = 1u << 1, /* step is a multiple of K */
};

/* One checkpoint of a job, as the caller found it. */
struct lifecycle_ckpt {
	const char *name; /* directly under "<job>/" */
	int64_t mtime; /* seconds since the epoch: its newest file */
	enum lifecycle_tier tier;
	bool local; /* has published local copies */
	bool complete; /* every file published (none being written or
			* waiting to publish) */
	/* out, set by lifecycle_plan */
	int64_t step; /* -1: no number in the name */
	unsigned rank; /* 0: the newest */
	unsigned actions; /* LIFECYCLE_DROP_LOCAL | ... */
	unsigned kept; /* LIFECYCLE_KEPT_* that stopped a deletion */
};

/*
 * Check a rule before it is stored. Returns 0, or -EINVAL with a message
 * in msg (len bytes) naming the value at fault and what is accepted:
 * an empty pattern, one over LIFECYCLE_PATTERN_MAX - 1 bytes, with '/',
 * control characters or an unclosed '['; N < 1; a day count over
 * LIFECYCLE_DAYS_MAX; R < D (both set: it would delete before archiving);
 * D > 0 without an archive URL, or an archive URL without D; an archive
 * URL that is not s3:// or file://; a storage class that is not
 * upper-case letters, digits and '_'.
 */
int lifecycle_rule_check(const struct lifecycle_rule *r, char *msg, size_t len);

/* Whether job matches r's pattern (fnmatch without flags). */
bool lifecycle_rule_match(const struct lifecycle_rule *r, const char *job);

/* The first rule (lowest id; rules must be sorted by id) matching job, or
 * NULL. */
const struct lifecycle_rule *
lifecycle_rule_find(const struct lifecycle_rule *rules, size_t n,
		    const char *job);

/* The step number of a checkpoint name: its last run of digits (at most
 * 18), or -1 when it has none. */
int64_t lifecycle_step(const char *name);

/*
 * Decide what rule r does to the n checkpoints of one job at time now:
 * sets step, rank, actions and kept of each (the array is reordered,
 * newest first). Pure: the same input gives the same plan.
 */
void lifecycle_plan(const struct lifecycle_rule *r, struct lifecycle_ckpt *c,
		    size_t n, int64_t now);

/* "drop-local", "archive", "delete" for one action bit. */
const char *lifecycle_action_name(unsigned action);

/* Print r as "pattern N=.. D=.. R=.. K=.. archive=.. class=.." into buf.
 * Returns buf. */
char *lifecycle_rule_str(const struct lifecycle_rule *r, char *buf, size_t len);

#endif
