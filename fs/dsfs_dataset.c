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
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsfs_caller.h"
#include "dsfs_dataset.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/timeutil.h"

/* Least time between two on-demand refreshes from lookups, ms. */
#define DSFS_LOOKUP_REFRESH_MS 200

struct dsfs_store {
	struct dsfs_store *next;
	char *url;
	struct objstore *os;
};

struct dsfs_dataset_table {
	const struct dstage_config *cfg;
	pthread_rwlock_t lock;
	struct dsfs_dataset **ents; /* lock: sorted by name, references */
	size_t nents; /* lock */
	struct dsfs_store *stores; /* lock: opened sources, by URL */
	uint64_t polled_ms; /* lock: last refresh, CLOCK_MONOTONIC */
	char **changed; /* lock: names whose entry changed */
	size_t nchanged; /* lock */
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
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct dsfs_dsrow *p = realloc(l->rows, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		l->rows = p;
		l->cap = cap;
	}
	r = &l->rows[l->n];
	r->name = strdup(ds->name);
	r->source = strdup(ds->source);
	r->group = ds->group && ds->group[0] ? strdup(ds->group) : NULL;
	r->version = ds->version;
	r->refreshed = ds->refreshed;
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
	}
	free(l->rows);
}

/* The opened store for url, opening it on first use. Called with t->lock
 * held for writing. */
static struct objstore *dsfs_dataset_store(struct dsfs_dataset_table *t,
					   const char *url, int *err)
{
	struct dsfs_store *s;

	for (s = t->stores; s; s = s->next)
		if (strcmp(s->url, url) == 0)
			return s->os;
	s = calloc(1, sizeof(*s));
	if (!s) {
		*err = -ENOMEM;
		return NULL;
	}
	s->url = strdup(url);
	*err = s->url ? objstore_open(url, t->cfg, &s->os) : -ENOMEM;
	if (*err) {
		free(s->url);
		free(s);
		return NULL;
	}
	s->next = t->stores;
	t->stores = s;
	return s->os;
}

static bool dsfs_dataset_str_eq(const char *a, const char *b)
{
	if (!a || !b)
		return a == b;
	return strcmp(a, b) == 0;
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
	char **p = realloc(t->changed, (t->nchanged + 1) * sizeof(*p));

	if (!p)
		return; /* the entry times out by itself */
	t->changed = p;
	p[t->nchanged] = strdup(name);
	if (p[t->nchanged])
		t->nchanged++;
}

/* A new dataset version from a catalog row. Called with t->lock (write). */
static struct dsfs_dataset *dsfs_dataset_make(struct dsfs_dataset_table *t,
					      const struct dsfs_dsrow *r)
{
	struct dsfs_dataset *d = calloc(1, sizeof(*d));
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
	if (!d->name || !d->source || (r->group && !d->group)) {
		dsfs_dataset_put(d);
		return NULL;
	}
	d->os = dsfs_dataset_store(t, r->source, &err);
	if (!d->os) {
		log_error("dataset %s: cannot open source %s: %s", r->name,
			  r->source, strerror(-err));
		dsfs_dataset_put(d);
		return NULL;
	}
	return d;
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

		if (old && old->version == r->version &&
		    dsfs_dataset_str_eq(old->source, r->source) &&
		    dsfs_dataset_str_eq(old->group, r->group)) {
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
