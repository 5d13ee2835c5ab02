// SPDX-License-Identifier: MIT
/*
 * sharedtier_read: the shared tier's readers (include/dstage/sharedtier.h:
 * sharedtier_copy_*, sharedtier_wrap): a snapshot's copy with the
 * catalog's reference hashes, opened in front of the source after the
 * trust rule (sharedtier_trust.c), and why a copy was not used, noted in
 * the node's status (sharedtier_health.c). Keeps no state between calls
 * but the trust rule's memo (sharedtier_trusted_copy).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "sharedtier_i.h"

struct sharedtier_copy {
	const struct dstage_config *cfg; /* the caller's, outlives c */
	char *name;
	char root[PATH_MAX], dir[PATH_MAX];
	char snapshot[SHAREDTIER_SNAPSHOT_LEN + 1];
	struct objstore_tier_ref *refs; /* sorted by key */
	size_t nrefs;
	struct sharedtier_list l; /* owns the keys */
};

void sharedtier_copy_free(struct sharedtier_copy *c)
{
	if (!c)
		return;
	free(c->refs);
	free(c->name);
	sharedtier_list_free(&c->l);
	free(c);
}

int sharedtier_copy_load(struct catalog *cat, const struct dstage_config *cfg,
			 const char *name, struct sharedtier_copy **out)
{
	struct sharedtier_copy *c = calloc(1, sizeof(*c));
	struct catalog_dataset ds;
	int ret;

	*out = NULL;
	if (!c || !(c->name = strdup(name))) {
		free(c);
		return -ENOMEM;
	}
	c->cfg = cfg;
	ret = catalog_dataset_get(cat, name, &ds);
	if (ret) {
		sharedtier_copy_free(c);
		return ret;
	}
	ret = sharedtier_base(cfg, &ds, c->root, sizeof(c->root));
	if (!ret)
		ret = sharedtier_load(cat, name, &c->l, c->snapshot);
	if (!ret)
		ret = sharedtier_join(c->dir, sizeof(c->dir), c->root,
				      c->snapshot);
	if (!ret)
		c->root[sharedtier_rootlen(&ds, c->root)] = '\0';
	catalog_dataset_release(&ds);
	if (!ret && !(c->refs = calloc(c->l.n + 1, sizeof(*c->refs))))
		ret = -ENOMEM;
	for (size_t i = 0; !ret && i < c->l.n; i++) {
		if (!c->l.v[i].has_expected)
			continue; /* read from the source */
		c->refs[c->nrefs].key = c->l.v[i].key;
		memcpy(c->refs[c->nrefs++].sha256, c->l.v[i].expected, 32);
	}
	if (ret) {
		sharedtier_copy_free(c);
		return ret;
	}
	*out = c;
	return 0;
}

const char *sharedtier_copy_dir(const struct sharedtier_copy *c)
{
	return c->dir;
}

/* objstore_tier_opts.report: a file of the copy that failed its check
 * or its read, for the node's status (the rest are not the tier's
 * fault, or noted at open). */
static void sharedtier_report(const struct dstage_config *cfg, const char *name,
			      const char *dir, int cause, const char *key,
			      int err)
{
	char what[512];

	if (cause == OBJSTORE_TIER_DAMAGED) {
		snprintf(what, sizeof(what),
			 "%s/" SHAREDTIER_DATA "/%s differs from its "
			 "reference hash",
			 dir, key);
		(void)sharedtier_health_note(cfg, name, SHAREDTIER_MISMATCH,
					     what);
	} else if (cause == OBJSTORE_TIER_UNREACHABLE) {
		snprintf(what, sizeof(what),
			 "%s/" SHAREDTIER_DATA "/%s cannot be read: %s", dir,
			 key, strerror(err ? -err : EIO));
		(void)sharedtier_health_note(cfg, name, SHAREDTIER_UNREADABLE,
					     what);
	} else if (cause == OBJSTORE_TIER_UNTRUSTED && err) {
		/* the rule broke after the copy was opened (one refused at
		 * open was noted then, with the rule it broke) */
		snprintf(what, sizeof(what),
			 "%s no longer keeps the trust rule (only the service "
			 "uid may write a shared tier)",
			 dir);
		(void)sharedtier_health_note(cfg, name, SHAREDTIER_UNTRUSTED,
					     what);
	}
}

/* The status's cause of a trust rule's or an open's failure. */
static int sharedtier_cause_of(int err)
{
	return err == -EACCES	? SHAREDTIER_UNTRUSTED
	       : err == -EINVAL ? SHAREDTIER_NOT_REGULAR
				: SHAREDTIER_UNREADABLE;
}

/* objstore_tier_opts.trusted: the rule still holds (the walk's memo,
 * sharedtier_trusted_copy: at most one walk each 2 s). */
static int sharedtier_still_trusted(const char *root, const char *dir)
{
	char why[PATH_MAX + 64];

	return sharedtier_trusted_copy(root, dir, why, sizeof(why));
}

int sharedtier_copy_open(const struct sharedtier_copy *c,
			 struct objstore *origin, struct objstore **out)
{
	struct objstore_tier_opts o = { .refs = c->refs,
					.nrefs = c->nrefs,
					.refused = -1,
					.report = sharedtier_report,
					.report_tag = c->name,
					.trusted = sharedtier_still_trusted,
					.trust_root = c->root };
	char man[PATH_MAX + 16], why[PATH_MAX + 64];
	int ret;

	snprintf(man, sizeof(man), "%s/" SHAREDTIER_MANIFEST, c->dir);
	if (access(man, F_OK))
		return -errno;
	/* a tier that fails the rule is not read: every read goes to the
	 * source, counted as untrusted */
	ret = sharedtier_trusted_copy(c->root, c->dir, why, sizeof(why));
	if (ret == -ENOMEM)
		return ret;
	if (ret) {
		o.refused = OBJSTORE_TIER_UNTRUSTED;
		(void)sharedtier_health_note(c->cfg, c->name,
					     sharedtier_cause_of(ret), why);
	}
	ret = objstore_open_tiered(c->dir, &o, origin, out);
	if (ret && ret != -ENOMEM && ret != -ENOENT) {
		snprintf(why, sizeof(why),
			 "%.4000s is not a regular file holding a shared-tier "
			 "MANIFEST%s%s",
			 man, ret == -EINVAL ? "" : ": ",
			 ret == -EINVAL ? "" : strerror(-ret));
		(void)sharedtier_health_note(c->cfg, c->name,
					     sharedtier_cause_of(ret), why);
	} else if (!ret && o.refused < 0) {
		/* the rule holds again: what it found is history */
		(void)sharedtier_health_clear(
			c->cfg, c->name,
			1u << SHAREDTIER_UNTRUSTED |
				1u << SHAREDTIER_NOT_REGULAR);
	}
	return ret;
}

int sharedtier_wrap(struct catalog *cat, const struct dstage_config *cfg,
		    const char *name, struct objstore **os)
{
	struct sharedtier_copy *c;
	struct objstore *t;
	int ret;

	if (!*os)
		return 0;
	ret = sharedtier_copy_load(cat, cfg, name, &c);
	if (ret == -ENOMEM)
		return ret;
	if (ret)
		return 0; /* no tier: the common case, not logged */
	ret = sharedtier_copy_open(c, *os, &t);
	if (ret) {
		if (ret != -ENOMEM)
			log_info("shared tier: %s: no copy of snapshot %s in "
				 "%s (%s): reading %s alone",
				 name, c->snapshot, c->dir, strerror(-ret),
				 objstore_url(*os));
		sharedtier_copy_free(c);
		return ret == -ENOMEM ? ret : 0;
	}
	log_info("shared tier: %s: reading snapshot %s from %s first", name,
		 c->snapshot, c->dir);
	sharedtier_copy_free(c);
	*os = t;
	return 1;
}
