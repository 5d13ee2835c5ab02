// SPDX-License-Identifier: MIT
/*
 * dsfs_dataset: the dataset table (see dsfs_dataset.h).
 *
 * The table mirrors the catalog's READY datasets. State of one name:
 *
 *   absent --catalog lists it READY--> present (version v)
 *   present(v) --catalog shows v' != v, another source or group-->
 *                present(v'), name queued as changed
 *   present --gone from the catalog--> absent, name queued as changed
 *   present(v), untiered --its shared tier's MANIFEST appears-->
 *                present(v), tiered, the same entry (same bytes: nothing
 *                queued; nodes and open files holding it follow)
 *
 * A dataset with a shared tier (docs/stager.md, "The shared tier") has
 * its snapshot's copy directory looked up once per version (the catalog's
 * manifest is walked for the snapshot id, outside the lock); until the
 * copy's MANIFEST is there, each refresh looks for it again (one stat).
 * Once it is, the entry's store becomes a tiered handle
 * (objstore_open_tiered), swapped in place: fills read the copy first and
 * fall back to the source. A copy that cannot be opened is given up for
 * that version (logged once).
 *
 * The owner (the datasets subtree) refreshes it from the poller and sends
 * the kernel invalidations for the queued names; a lookup of a name the
 * table lacks refreshes it at once (rate-limited), so a new dataset is
 * visible to the next lookup without waiting for the poller.
 *
 * Locks: t->lock (rwlock) protects ents, nents, stores, polled_ms and the
 * changed queue; it is taken before the node table's lock and is never
 * held across a catalog query. Catalog connections are per thread (a
 * struct catalog serves one thread at a time): opened read-only on first
 * use, closed by a thread-specific-data destructor when the thread exits.
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsfs_caller.h"
#include "dsfs_dataset.h"
#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/sharedtier.h"
#include "dstage/timeutil.h"

/* Least time between two on-demand refreshes from lookups, ms. */
#define DSFS_LOOKUP_REFRESH_MS 200

struct dsfs_store {
	struct dsfs_store *next;
	char *url;
	char *tier; /* the shared tier's copy in front of url, or NULL */
	struct objstore *os;
};

struct dsfs_dataset_table {
	const struct dstage_config *cfg;
	pthread_rwlock_t lock;
	struct dsfs_dataset **ents; /* lock: sorted by name, references */
	size_t nents; /* lock */
	struct dsfs_store *stores; /* lock: opened sources, by URL and tier */
	uint64_t polled_ms; /* lock: last refresh, CLOCK_MONOTONIC */
	char **changed; /* lock: names whose entry changed */
	size_t nchanged, changed_cap; /* lock */
};

static pthread_key_t dsfs_dataset_cat_key;
static pthread_once_t dsfs_dataset_cat_once = PTHREAD_ONCE_INIT;

static void dsfs_dataset_cat_close(void *p)
{
	catalog_close(p);
}

static void dsfs_dataset_cat_key_make(void)
{
	pthread_key_create(&dsfs_dataset_cat_key, dsfs_dataset_cat_close);
}

struct catalog *dsfs_dataset_catalog(struct dsfs_dataset_table *t, int *err)
{
	struct catalog *cat;

	pthread_once(&dsfs_dataset_cat_once, dsfs_dataset_cat_key_make);
	cat = pthread_getspecific(dsfs_dataset_cat_key);
	if (cat)
		return cat;
	*err = catalog_open(t->cfg->catalog_path, CATALOG_READONLY, &cat);
	if (*err) {
		/* A catalog nobody created yet is an empty one (polled). */
		if (*err != -ENOENT)
			log_error("catalog %s: cannot open: %s",
				  t->cfg->catalog_path, strerror(-*err));
		return NULL;
	}
	pthread_setspecific(dsfs_dataset_cat_key, cat);
	return cat;
}

void dsfs_dataset_get(struct dsfs_dataset *d)
{
	atomic_fetch_add(&d->refs, 1);
}

void dsfs_dataset_put(struct dsfs_dataset *d)
{
	if (!d || atomic_fetch_sub(&d->refs, 1) != 1)
		return;
	free(d->name);
	free(d->source);
	free(d->group);
	free(d->tier_dir);
	free(d);
}

bool dsfs_dataset_allowed(const struct dsfs_dataset *d, struct dsfs_caller *who)
{
	if (!d->restricted || who->uid == 0)
		return true;
	if (!d->group_known)
		return false;
	return dsfs_caller_in_group(who, d->gid);
}

/* One row of the catalog's dataset list, copied out of the callback. */
struct dsfs_dsrow {
	char *name, *source, *group;
	int64_t version, refreshed;
	char *tier_dir; /* the snapshot's copy in its shared tier, or NULL */
	bool tier_ready; /* the copy's MANIFEST is there */
	struct sharedtier_copy *copy; /* its reference hashes, once ready */
};

struct dsfs_dslist {
	struct dsfs_dsrow *rows;
	size_t n, cap;
};

static int dsfs_dataset_list_add(void *arg, const struct catalog_dataset *ds)
{
	struct dsfs_dslist *l = arg;
	struct dsfs_dsrow *r;

	if (ds->state != CATALOG_DS_READY || ds->version <= 0)
		return 0;
	if (GROW_ONE(l->rows, l->n, l->cap, 16))
		return -ENOMEM;
	r = &l->rows[l->n];
	r->name = strdup(ds->name);
	r->source = strdup(ds->source);
	r->group = ds->group && ds->group[0] ? strdup(ds->group) : NULL;
	r->version = ds->version;
	r->refreshed = ds->refreshed;
	r->tier_dir = NULL;
	r->tier_ready = false;
	r->copy = NULL;
	if (!r->name || !r->source ||
	    (ds->group && ds->group[0] && !r->group)) {
		free(r->name);
		free(r->source);
		free(r->group);
		return -ENOMEM;
	}
	l->n++;
	return 0;
}

static void dsfs_dataset_list_free(struct dsfs_dslist *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->rows[i].name);
		free(l->rows[i].source);
		free(l->rows[i].group);
		free(l->rows[i].tier_dir);
		sharedtier_copy_free(l->rows[i].copy);
	}
	free(l->rows);
}

static bool dsfs_dataset_str_eq(const char *a, const char *b)
{
	if (!a || !b)
		return a == b;
	return strcmp(a, b) == 0;
}

/* Open url, with the shared tier's copy tier (copy: its reference hashes)
 * in front of it if not NULL. */
static int dsfs_dataset_store_open(struct dsfs_dataset_table *t,
				   const char *url, const char *tier,
				   const struct sharedtier_copy *copy,
				   struct objstore **out)
{
	struct objstore *origin;
	int ret;

	ret = objstore_open(url, t->cfg, &origin);
	if (ret || !tier) {
		*out = ret ? NULL : origin;
		return ret;
	}
	ret = copy ? sharedtier_copy_open(copy, origin, out) : -ENOENT;
	if (ret)
		objstore_free(origin);
	return ret;
}

/* The opened store for url (behind tier, if not NULL), opening it on first
 * use. Called with t->lock held for writing. */
static struct objstore *dsfs_dataset_store(struct dsfs_dataset_table *t,
					   const char *url, const char *tier,
					   const struct sharedtier_copy *copy,
					   int *err)
{
	struct dsfs_store *s;

	for (s = t->stores; s; s = s->next)
		if (strcmp(s->url, url) == 0 &&
		    dsfs_dataset_str_eq(s->tier, tier))
			return s->os;
	s = calloc(1, sizeof(*s));
	if (!s) {
		*err = -ENOMEM;
		return NULL;
	}
	s->url = strdup(url);
	s->tier = tier ? strdup(tier) : NULL;
	*err = s->url && (!tier || s->tier)
		       ? dsfs_dataset_store_open(t, url, tier, copy, &s->os)
		       : -ENOMEM;
	if (*err) {
		free(s->url);
		free(s->tier);
		free(s);
		return NULL;
	}
	s->next = t->stores;
	t->stores = s;
	return s->os;
}

/* Whether entry d is of row r's version, source and group. */
static bool dsfs_dataset_same(const struct dsfs_dataset *d,
			      const struct dsfs_dsrow *r)
{
	return d->version == r->version &&
	       dsfs_dataset_str_eq(d->source, r->source) &&
	       dsfs_dataset_str_eq(d->group, r->group);
}

static int dsfs_dataset_cmp(const void *a, const void *b)
{
	const struct dsfs_dataset *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

/* The index of name in the table, or -1. Called with t->lock held. */
static ssize_t dsfs_dataset_find(struct dsfs_dataset_table *t, const char *name)
{
	size_t lo = 0, hi = t->nents;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, t->ents[mid]->name);

		if (c == 0)
			return (ssize_t)mid;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -1;
}

/* Called with t->lock held for writing. */
static void dsfs_dataset_queue_changed(struct dsfs_dataset_table *t,
				       const char *name)
{
	if (GROW_ONE(t->changed, t->nchanged, t->changed_cap, 8))
		return; /* the entry times out by itself */
	t->changed[t->nchanged] = strdup(name);
	if (t->changed[t->nchanged])
		t->nchanged++;
}

/* A new dataset version from a catalog row. Called with t->lock (write). */
static struct dsfs_dataset *dsfs_dataset_make(struct dsfs_dataset_table *t,
					      const struct dsfs_dsrow *r)
{
	struct dsfs_dataset *d = calloc(1, sizeof(*d));
	struct objstore *os;
	int err;

	if (!d)
		return NULL;
	atomic_init(&d->refs, 1);
	d->name = strdup(r->name);
	d->source = strdup(r->source);
	d->version = r->version;
	d->mtime = r->refreshed;
	if (r->group) {
		char buf[4096];
		struct group gr, *res = NULL;

		d->restricted = true;
		d->group = strdup(r->group);
		if (getgrnam_r(r->group, &gr, buf, sizeof(buf), &res) == 0 &&
		    res) {
			d->gid = res->gr_gid;
			d->group_known = true;
		} else {
			log_warn("dataset %s: group '%s' is unknown on this "
				 "node: only root may read it",
				 r->name, r->group);
		}
	}
	d->tier_dir = r->tier_dir ? strdup(r->tier_dir) : NULL;
	if (!d->name || !d->source || (r->group && !d->group) ||
	    (r->tier_dir && !d->tier_dir)) {
		dsfs_dataset_put(d);
		return NULL;
	}
	os = dsfs_dataset_store(t, r->source, NULL, NULL, &err);
	if (!os) {
		log_error("dataset %s: cannot open source %s: %s", r->name,
			  r->source, strerror(-err));
		dsfs_dataset_put(d);
		return NULL;
	}
	atomic_init(&d->os, os);
	atomic_init(&d->tiered, false);
	return d;
}

/* Put d's published shared-tier copy in front of its source. Called with
 * t->lock held for writing. */
static void dsfs_dataset_tier_up(struct dsfs_dataset_table *t,
				 struct dsfs_dataset *d,
				 const struct sharedtier_copy *copy)
{
	struct objstore *os;
	int err;

	if (!d->tier_dir || d->tier_given_up || atomic_load(&d->tiered))
		return;
	os = dsfs_dataset_store(t, d->source, d->tier_dir, copy, &err);
	if (!os) {
		if (err == -ENOMEM)
			return; /* the next refresh tries again */
		log_error("dataset %s: shared tier %s: %s: filling from %s "
			  "alone",
			  d->name, d->tier_dir, strerror(-err), d->source);
		d->tier_given_up = true;
		return;
	}
	atomic_store(&d->os, os);
	atomic_store(&d->tiered, true);
	log_info("dataset %s: filling from its shared tier %s first, then %s",
		 d->name, d->tier_dir, d->source);
}

/* Whether the copy in dir is published (its MANIFEST is there). */
static bool dsfs_dataset_tier_published(const char *dir)
{
	char path[PATH_MAX];
	int n = snprintf(path, sizeof(path), "%s/" SHAREDTIER_MANIFEST, dir);

	return n > 0 && (size_t)n < sizeof(path) && access(path, F_OK) == 0;
}

/*
 * Each row's shared tier: the entry's when it is of the row's version
 * (copied under the read lock), else looked up in the catalog (no lock
 * held); then, while the copy is not yet published, whether it is now.
 * Returns 0 or -ENOMEM.
 */
static int dsfs_dataset_rows_tier(struct dsfs_dataset_table *t,
				  struct catalog *cat, struct dsfs_dslist *l)
{
	bool *known = calloc(l->n ? l->n : 1, sizeof(*known));
	int ret = 0;

	if (!known)
		return -ENOMEM;
	pthread_rwlock_rdlock(&t->lock);
	for (size_t i = 0; i < l->n && !ret; i++) {
		struct dsfs_dsrow *r = &l->rows[i];
		ssize_t at = dsfs_dataset_find(t, r->name);
		const struct dsfs_dataset *old = at >= 0 ? t->ents[at] : NULL;

		if (!old || !dsfs_dataset_same(old, r))
			continue;
		known[i] = true;
		/* nothing to look for once tiered or given up */
		r->tier_ready = atomic_load(&old->tiered) || old->tier_given_up;
		if (old->tier_dir && !(r->tier_dir = strdup(old->tier_dir)))
			ret = -ENOMEM;
	}
	pthread_rwlock_unlock(&t->lock);
	for (size_t i = 0; i < l->n && !ret; i++) {
		struct dsfs_dsrow *r = &l->rows[i];
		char dir[PATH_MAX], snap[SHAREDTIER_SNAPSHOT_LEN + 1];
		int err;

		if (!known[i] && cat) {
			err = sharedtier_locate(cat, t->cfg, r->name, dir,
						sizeof(dir), snap);
			if (!err && !(r->tier_dir = strdup(dir)))
				ret = -ENOMEM;
			else if (err == -ENOMEM)
				ret = err;
			else if (err && err != -ENOENT)
				log_warn("dataset %s: shared tier: %s: filling "
					 "from %s",
					 r->name, strerror(-err), r->source);
		}
		if (!r->tier_dir || r->tier_ready)
			continue;
		r->tier_ready = dsfs_dataset_tier_published(r->tier_dir);
		/* the reference hashes, for opening the copy under the lock */
		if (r->tier_ready && cat &&
		    sharedtier_copy_load(cat, t->cfg, r->name, &r->copy) ==
			    -ENOMEM)
			ret = -ENOMEM;
	}
	free(known);
	return ret;
}

int dsfs_dataset_table_refresh(struct dsfs_dataset_table *t)
{
	struct dsfs_dslist l = { 0 };
	struct dsfs_dataset **ents = NULL;
	size_t n = 0;
	struct catalog *cat;
	int ret;

	cat = dsfs_dataset_catalog(t, &ret);
	if (!cat && ret != -ENOENT)
		return ret;
	/* No catalog file yet: no datasets (until one is registered). */
	ret = cat ? catalog_dataset_list(cat, dsfs_dataset_list_add, &l) : 0;
	if (!ret)
		ret = dsfs_dataset_rows_tier(t, cat, &l);
	if (ret)
		goto out;
	ents = calloc(l.n ? l.n : 1, sizeof(*ents));
	if (!ents) {
		ret = -ENOMEM;
		goto out;
	}

	pthread_rwlock_wrlock(&t->lock);
	for (size_t i = 0; i < l.n; i++) {
		const struct dsfs_dsrow *r = &l.rows[i];
		ssize_t at = dsfs_dataset_find(t, r->name);
		struct dsfs_dataset *old = at >= 0 ? t->ents[at] : NULL, *d;

		if (old && dsfs_dataset_same(old, r)) {
			d = old;
			dsfs_dataset_get(d);
		} else {
			d = dsfs_dataset_make(t, r);
			if (!d)
				continue;
			if (old) {
				log_info("dataset %s: version %" PRId64
					 " -> %" PRId64,
					 r->name, old->version, r->version);
				dsfs_dataset_queue_changed(t, r->name);
			} else {
				log_info("dataset %s: version %" PRId64
					 " from %s",
					 r->name, r->version, r->source);
			}
		}
		if (r->tier_ready)
			dsfs_dataset_tier_up(t, d, r->copy);
		ents[n++] = d;
	}
	qsort(ents, n, sizeof(*ents), dsfs_dataset_cmp);
	for (size_t i = 0; i < t->nents; i++) {
		struct dsfs_dataset *d = t->ents[i];
		bool kept = false;

		for (size_t j = 0; j < n && !kept; j++)
			kept = strcmp(ents[j]->name, d->name) == 0;
		if (!kept) {
			log_info("dataset %s: removed", d->name);
			dsfs_dataset_queue_changed(t, d->name);
		}
		dsfs_dataset_put(d);
	}
	free(t->ents);
	t->ents = ents;
	t->nents = n;
	ents = NULL;
	t->polled_ms = timeutil_mono_ms();
	pthread_rwlock_unlock(&t->lock);
out:
	free(ents);
	dsfs_dataset_list_free(&l);
	return ret;
}

int dsfs_dataset_table_new(const struct dstage_config *cfg,
			   struct dsfs_dataset_table **out)
{
	struct dsfs_dataset_table *t = calloc(1, sizeof(*t));
	int ret;

	*out = NULL;
	if (!t)
		return -ENOMEM;
	t->cfg = cfg;
	if (pthread_rwlock_init(&t->lock, NULL)) {
		free(t);
		return -ENOMEM;
	}
	ret = dsfs_dataset_table_refresh(t);
	if (ret) {
		dsfs_dataset_table_free(t);
		return ret;
	}
	*out = t;
	return 0;
}

void dsfs_dataset_table_free(struct dsfs_dataset_table *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->nents; i++)
		dsfs_dataset_put(t->ents[i]);
	free(t->ents);
	for (size_t i = 0; i < t->nchanged; i++)
		free(t->changed[i]);
	free(t->changed);
	while (t->stores) {
		struct dsfs_store *s = t->stores;

		t->stores = s->next;
		objstore_free(s->os);
		free(s->url);
		free(s->tier);
		free(s);
	}
	pthread_rwlock_destroy(&t->lock);
	free(t);
}

size_t dsfs_dataset_table_take_changed(struct dsfs_dataset_table *t,
				       char ***names)
{
	size_t n;

	pthread_rwlock_wrlock(&t->lock);
	*names = t->changed;
	n = t->nchanged;
	t->changed = NULL;
	t->nchanged = 0;
	t->changed_cap = 0;
	pthread_rwlock_unlock(&t->lock);
	return n;
}

struct dsfs_dataset *dsfs_dataset_table_current(struct dsfs_dataset_table *t,
						const char *name)
{
	struct dsfs_dataset *d = NULL;
	ssize_t at;
	bool stale;

	for (int pass = 0; pass < 2; pass++) {
		pthread_rwlock_rdlock(&t->lock);
		at = dsfs_dataset_find(t, name);
		if (at >= 0) {
			d = t->ents[at];
			dsfs_dataset_get(d);
		}
		stale = timeutil_mono_ms() - t->polled_ms >=
			DSFS_LOOKUP_REFRESH_MS;
		pthread_rwlock_unlock(&t->lock);
		if (d || !stale || pass)
			break;
		if (dsfs_dataset_table_refresh(t))
			break;
	}
	return d;
}

size_t dsfs_dataset_table_count(struct dsfs_dataset_table *t)
{
	size_t n;

	pthread_rwlock_rdlock(&t->lock);
	n = t->nents;
	pthread_rwlock_unlock(&t->lock);
	return n;
}

int dsfs_dataset_table_foreach(struct dsfs_dataset_table *t, size_t from,
			       int (*fn)(void *arg, size_t idx,
					 struct dsfs_dataset *d),
			       void *arg)
{
	int ret = 0;

	pthread_rwlock_rdlock(&t->lock);
	for (size_t i = from; i < t->nents && !ret; i++)
		ret = fn(arg, i, t->ents[i]);
	pthread_rwlock_unlock(&t->lock);
	return ret;
}
