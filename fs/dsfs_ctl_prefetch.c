// SPDX-License-Identifier: MIT
/*
 * dsfs_ctl_prefetch: .dstage/prefetch lists, and the per-uid limits of the
 * control subtree (dsfs_ctl.c calls it; see dsfs_ctl_i.h).
 *
 * Life of one prefetch list (struct dsfs_ctl_pf), owned by one open file:
 *
 *   OPEN --write--> COLLECTING (complete lines resolved against the
 *   catalog at once; duplicates dropped; the partial last line kept)
 *   COLLECTING --a new object past a limit--> FULL (that line and every
 *   later write refused with EDQUOT)
 *   COLLECTING|FULL --flush (close)--> SUBMITTED (the trailing line
 *   resolved, lists handed to the cache, the list emptied: more writes
 *   start a new one) --release--> freed
 *
 * Limits (any user can open these files on an allow_other mount, and the
 * process runs as root, so nothing a user writes may grow without bound):
 * one list holds at most opts.pf_max_entries distinct objects and
 * opts.pf_max_bytes of memory (keys, ETags and a fixed cost per entry); the
 * lists one uid has open together at most opts.pf_uid_max_entries and
 * opts.pf_uid_max_bytes; one uid has at most opts.ctl_max_handles
 * .dstage files open. Past a limit the write (or open) fails with EDQUOT,
 * logged at most once a minute per uid. A submitted list is the cache's
 * (one per dataset: a new list replaces the previous one), and the
 * per-list log line is at most one every DSFS_CTL_LIST_LOG_S per uid (the
 * others at debug level).
 *
 * Summaries: a submitted list leaves its summary (struct dsfs_ctl_status)
 * as its writer's; reading .dstage/prefetch gives the reader's own, so
 * no uid learns the size of another's list (of a dataset it may not
 * read). At most DSFS_CTL_STATUS_MAX uids keep one; past that the least
 * recently written goes.
 *
 * Paths are accepted as "datasets/NAME/KEY", "/datasets/NAME/KEY",
 * "<mountpoint>/datasets/NAME/KEY" or "NAME/KEY". Unknown datasets,
 * missing keys, directories and datasets the writer may not read are
 * skipped and counted.
 *
 * Locks: pf.lock (one per list; the kernel serialises writes to one file
 * through its inode lock, the lock makes that explicit and covers flush
 * racing release) is taken before ctl.lock, a leaf lock over the per-uid
 * records and summaries.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsfs_ctl_i.h"
#include "dsfs_dataset.h"
#include "dsfs_opts.h"
#include "dstage/cache.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"

struct dsfs_ctl_pf_obj {
	struct dsfs_dataset *ds; /* a reference */
	char *key;
	char *etag;
	uint64_t size;
	uint64_t cost; /* memory charged */
};

/* One prefetch list (see the state machine above). */
struct dsfs_ctl_pf {
	pthread_mutex_t lock; /* protects everything below */
	struct dsfs_caller who; /* the opener, groups loaded */
	struct dsfs_ctl_pf_obj *objs;
	size_t n, cap;
	uint32_t *slots; /* open addressing: index + 1 into objs; 0 free */
	size_t nslots; /* a power of two >= 2 * n, or 0 */
	uint64_t lines, skipped, dups, refused, bytes, mem;
	const char *limit; /* the option whose limit was reached, or NULL */
	size_t partial_len;
	bool partial_too_long;
	char partial[DSFS_CTL_PF_LINE_MAX];
};

void dsfs_ctl_uids_free(struct dsfs_ctl *c)
{
	while (c->uids) {
		struct dsfs_ctl_uid *u = c->uids;

		c->uids = u->next;
		free(u);
	}
	while (c->statuses) {
		struct dsfs_ctl_status *s = c->statuses;

		c->statuses = s->next;
		free(s);
	}
	c->nstatuses = 0;
}

const char *dsfs_ctl_status_find(struct dsfs_ctl *c, uid_t uid)
{
	for (struct dsfs_ctl_status *s = c->statuses; s; s = s->next)
		if (s->uid == uid)
			return s->text;
	return NULL;
}

/* Keep text as uid's summary, first in the list. At the cap (or out of
 * memory) the least recently written summary is reused. ctl.lock held. */
static void dsfs_ctl_status_set(struct dsfs_ctl *c, uid_t uid, const char *text)
{
	struct dsfs_ctl_status **pp = &c->statuses, **last = NULL, *s = NULL;

	for (; *pp; pp = &(*pp)->next) {
		if ((*pp)->uid == uid) {
			s = *pp;
			*pp = s->next;
			break;
		}
		last = pp;
	}
	if (!s && c->nstatuses < DSFS_CTL_STATUS_MAX &&
	    (s = calloc(1, sizeof(*s))))
		c->nstatuses++;
	if (!s && last) { /* the oldest: *last is the list's tail */
		s = *last;
		*last = NULL;
	}
	if (!s)
		return;
	s->uid = uid;
	snprintf(s->text, sizeof(s->text), "%s", text);
	s->next = c->statuses;
	c->statuses = s;
}

/* ---- per-uid records (ctl.lock held) ---- */

static bool dsfs_ctl_uid_idle(const struct dsfs_ctl_uid *u, int64_t now)
{
	return !u->handles && !u->entries &&
	       now - u->refuse_logged >= DSFS_CTL_REFUSE_LOG_S &&
	       now - u->list_logged >= DSFS_CTL_LIST_LOG_S;
}

/* The record of uid, made if absent (NULL: out of memory); idle records
 * of others are freed on the way. */
static struct dsfs_ctl_uid *dsfs_ctl_uid_get(struct dsfs_ctl *c, uid_t uid)
{
	int64_t now = timeutil_mono_ms() / 1000;
	struct dsfs_ctl_uid **pp = &c->uids, *u, *found = NULL;

	while ((u = *pp)) {
		if (u->uid == uid) {
			found = u;
		} else if (dsfs_ctl_uid_idle(u, now)) {
			*pp = u->next;
			free(u);
			continue;
		}
		pp = &u->next;
	}
	if (found)
		return found;
	u = calloc(1, sizeof(*u));
	if (!u)
		return NULL;
	u->uid = uid;
	u->refuse_logged = now - DSFS_CTL_REFUSE_LOG_S;
	u->list_logged = now - DSFS_CTL_LIST_LOG_S;
	u->next = c->uids;
	c->uids = u;
	return u;
}

/* The one log line of a refusal burst. */
static void dsfs_ctl_refused(struct dsfs_ctl_uid *u, const char *what,
			     const char *limit, uint64_t value)
{
	int64_t now = timeutil_mono_ms() / 1000;

	u->refused++;
	if (now - u->refuse_logged < DSFS_CTL_REFUSE_LOG_S)
		return;
	log_warn(".dstage: uid %u reached %s=%" PRIu64 " (%s): refused with "
		 "EDQUOT (%" PRIu64 " refusal(s) since the last such line; at "
		 "most one line a minute per uid); raise it with "
		 "-o %s=N if this use is legitimate",
		 (unsigned)u->uid, limit, value, what, u->refused, limit);
	u->refuse_logged = now;
	u->refused = 0;
}

struct dsfs_ctl_fh *dsfs_ctl_fh_pf(struct dsfs_caller *who)
{
	struct dsfs_ctl_fh *h = calloc(1, sizeof(*h));
	struct dsfs_ctl_pf *pf = calloc(1, sizeof(*pf));

	if (!h || !pf) {
		free(h);
		free(pf);
		return NULL;
	}
	pthread_mutex_init(&pf->lock, NULL);
	pf->who = *who;
	dsfs_caller_load_groups(&pf->who);
	pf->who.req = NULL;
	h->pf = pf;
	return h;
}

int dsfs_ctl_hold(struct dsfs *fs, uid_t uid)
{
	struct dsfs_ctl *c = dsfs_ctl_of(fs);
	struct dsfs_ctl_uid *u;
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	u = dsfs_ctl_uid_get(c, uid);
	if (!u) {
		ret = -ENOMEM;
	} else if (u->handles >= fs->opts->ctl_max_handles) {
		dsfs_ctl_refused(u, "open .dstage files", "ctl_max_handles",
				 fs->opts->ctl_max_handles);
		ret = -EDQUOT;
	} else {
		u->handles++;
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

void dsfs_ctl_unhold(struct dsfs *fs, uid_t uid)
{
	struct dsfs_ctl *c = dsfs_ctl_of(fs);
	struct dsfs_ctl_uid *u;

	pthread_mutex_lock(&c->lock);
	for (u = c->uids; u && u->uid != uid; u = u->next)
		;
	if (u && u->handles)
		u->handles--;
	pthread_mutex_unlock(&c->lock);
}

/* ---- prefetch lists ---- */

static size_t dsfs_ctl_pf_hash(const char *ds, const char *key)
{
	uint64_t h = 1469598103934665603ULL;

	for (const unsigned char *p = (const unsigned char *)ds; *p; p++)
		h = (h ^ *p) * 1099511628211ULL;
	h = (h ^ '/') * 1099511628211ULL;
	for (const unsigned char *p = (const unsigned char *)key; *p; p++)
		h = (h ^ *p) * 1099511628211ULL;
	return (size_t)(h ^ (h >> 31));
}

/* The slot where (ds, key) is or would go. pf->nslots > 0. */
static uint32_t *dsfs_ctl_pf_slot(struct dsfs_ctl_pf *pf, const char *ds,
				  const char *key)
{
	size_t mask = pf->nslots - 1, i = dsfs_ctl_pf_hash(ds, key) & mask;

	for (;; i = (i + 1) & mask) {
		const struct dsfs_ctl_pf_obj *o;

		if (!pf->slots[i])
			return &pf->slots[i];
		o = &pf->objs[pf->slots[i] - 1];
		if (strcmp(o->key, key) == 0 && strcmp(o->ds->name, ds) == 0)
			return &pf->slots[i];
	}
}

/* Room for one more entry (objs and a load of at most one half). */
static int dsfs_ctl_pf_reserve(struct dsfs_ctl_pf *pf)
{
	if (GROW_ONE(pf->objs, pf->n, pf->cap, 256))
		return -ENOMEM;
	if (2 * (pf->n + 1) > pf->nslots) {
		size_t ns = pf->nslots ? pf->nslots * 2 : 512;
		uint32_t *s = calloc(ns, sizeof(*s)), *old = pf->slots;

		if (!s)
			return -ENOMEM;
		pf->slots = s;
		pf->nslots = ns;
		for (size_t i = 0; i < pf->n; i++)
			*dsfs_ctl_pf_slot(pf, pf->objs[i].ds->name,
					  pf->objs[i].key) = (uint32_t)(i + 1);
		free(old);
	}
	return 0;
}

/*
 * Charge one entry of cost bytes to the list and to its uid, or say which
 * limit it would pass. Returns 0 or -EDQUOT (pf->limit set, logged).
 */
static int dsfs_ctl_pf_charge(struct dsfs *fs, struct dsfs_ctl_pf *pf,
			      uint64_t cost)
{
	const struct dsfs_opts *o = fs->opts;
	struct dsfs_ctl *c = dsfs_ctl_of(fs);
	struct dsfs_ctl_uid *u;
	const char *limit = NULL;
	uint64_t value = 0;

	if (pf->n + 1 > o->pf_max_entries) {
		limit = "prefetch_max_entries";
		value = o->pf_max_entries;
	} else if (pf->mem + cost > o->pf_max_bytes) {
		limit = "prefetch_max_bytes";
		value = o->pf_max_bytes;
	}
	pthread_mutex_lock(&c->lock);
	u = dsfs_ctl_uid_get(c, pf->who.uid);
	if (!u) {
		pthread_mutex_unlock(&c->lock);
		return -ENOMEM;
	}
	if (!limit && u->entries + 1 > o->pf_uid_max_entries) {
		limit = "prefetch_uid_max_entries";
		value = o->pf_uid_max_entries;
	} else if (!limit && u->bytes + cost > o->pf_uid_max_bytes) {
		limit = "prefetch_uid_max_bytes";
		value = o->pf_uid_max_bytes;
	}
	if (limit) {
		dsfs_ctl_refused(u, "a .dstage/prefetch list", limit, value);
	} else {
		u->entries++;
		u->bytes += cost;
	}
	pthread_mutex_unlock(&c->lock);
	if (limit) {
		pf->limit = limit;
		return -EDQUOT;
	}
	pf->mem += cost;
	return 0;
}

/* Give back entries and bytes charged to uid. */
static void dsfs_ctl_pf_uncharge(struct dsfs *fs, uid_t uid, uint64_t entries,
				 uint64_t bytes)
{
	struct dsfs_ctl *c = dsfs_ctl_of(fs);
	struct dsfs_ctl_uid *u;

	pthread_mutex_lock(&c->lock);
	for (u = c->uids; u && u->uid != uid; u = u->next)
		;
	if (u) {
		u->entries -= u->entries < entries ? u->entries : entries;
		u->bytes -= u->bytes < bytes ? u->bytes : bytes;
	}
	pthread_mutex_unlock(&c->lock);
}

/* Resolve one line of a prefetch list into pf. Returns 0, or -EDQUOT
 * when its object would pass a limit (the list is FULL then). */
static int dsfs_ctl_pf_line(struct dsfs *fs, struct dsfs_ctl_pf *pf, char *line)
{
	const char *mnt = fs->opts->mountpoint;
	size_t mlen = strlen(mnt), len = strlen(line);
	struct dsfs_ctl_pf_obj *o;
	struct catalog_entry e;
	struct dsfs_dataset *ds;
	struct catalog *cat;
	char *p = line, *key;
	uint64_t cost;
	int ret;

	while (len && (line[len - 1] == '\r' || line[len - 1] == ' '))
		line[--len] = '\0';
	if (!len || line[0] == '#')
		return 0;
	pf->lines++;
	if (mlen > 1 && strncmp(p, mnt, mlen) == 0 && p[mlen] == '/')
		p += mlen;
	while (*p == '/')
		p++;
	if (strncmp(p, "datasets/", 9) == 0)
		p += 9;
	key = strchr(p, '/');
	if (!key) {
		pf->skipped++;
		return 0;
	}
	*key++ = '\0';
	if (pf->nslots && *dsfs_ctl_pf_slot(pf, p, key)) {
		pf->dups++; /* listed already: nothing to keep */
		return 0;
	}
	ds = dsfs_dataset_table_current(fs->datasets, p);
	if (!ds) {
		pf->skipped++;
		return 0;
	}
	cat = dsfs_dataset_catalog(fs->datasets, &ret);
	if (!dsfs_dataset_allowed(ds, &pf->who) || !cat ||
	    catalog_lookup(cat, ds->name, key, &e) || e.is_dir ||
	    dsfs_ctl_pf_reserve(pf))
		goto skip;
	cost = DSFS_CTL_PF_ENTRY_COST + strlen(key) + strlen(e.etag) + 2;
	ret = dsfs_ctl_pf_charge(fs, pf, cost);
	if (ret) {
		dsfs_dataset_put(ds);
		pf->lines--; /* refused: not part of the list */
		return ret == -EDQUOT ? ret : 0;
	}
	o = &pf->objs[pf->n];
	o->key = strdup(key);
	o->etag = strdup(e.etag);
	if (!o->key || !o->etag) {
		free(o->key);
		free(o->etag);
		pf->mem -= cost;
		dsfs_ctl_pf_uncharge(fs, pf->who.uid, 1, cost);
		goto skip;
	}
	o->ds = ds;
	o->size = e.size;
	o->cost = cost;
	pf->n++;
	*dsfs_ctl_pf_slot(pf, ds->name, key) = (uint32_t)pf->n;
	pf->bytes += e.size;
	return 0;
skip:
	pf->skipped++;
	dsfs_dataset_put(ds);
	return 0;
}

ssize_t dsfs_ctl_write(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_node *n, struct fuse_file_info *fi,
		       const char *buf, size_t size, off_t off)
{
	struct dsfs_ctl_fh *h = (struct dsfs_ctl_fh *)(uintptr_t)fi->fh;
	struct dsfs_ctl_pf *pf = h->pf;
	size_t start = 0; /* where this call's current line began */
	ssize_t ret = (ssize_t)size;

	(void)who;
	(void)off;
	if (n->ino != DSFS_INO_PREFETCH || !pf)
		return -EBADF;
	pthread_mutex_lock(&pf->lock);
	for (size_t i = 0; i < size && !pf->limit; i++) {
		if (buf[i] != '\n') {
			if (pf->partial_len + 1 < sizeof(pf->partial))
				pf->partial[pf->partial_len++] = buf[i];
			else
				pf->partial_too_long = true;
			continue;
		}
		pf->partial[pf->partial_len] = '\0';
		if (pf->partial_too_long) {
			pf->lines++;
			pf->skipped++;
		} else if (dsfs_ctl_pf_line(fs, pf, pf->partial)) {
			/* FULL: the lines before this one are taken. */
			ret = start ? (ssize_t)start : -EDQUOT;
		}
		pf->partial_len = 0;
		pf->partial_too_long = false;
		start = i + 1;
	}
	if (pf->limit) {
		pf->refused++;
		if (ret == (ssize_t)size)
			ret = -EDQUOT; /* FULL already */
	}
	pthread_mutex_unlock(&pf->lock);
	return ret;
}

/* Hand the list to the cache, one call per dataset, in list order. */
static void dsfs_ctl_pf_submit(struct dsfs *fs, struct dsfs_ctl_pf *pf)
{
	struct dsfs_ctl *c = dsfs_ctl_of(fs);
	struct cache_object *objs = NULL;
	struct dsfs_ctl_uid *u;
	char status[DSFS_CTL_STATUS_LEN];
	size_t nds = 0;
	bool loud = true;
	int err = 0;

	if (pf->partial_len && !pf->limit) {
		pf->partial[pf->partial_len] = '\0';
		if (dsfs_ctl_pf_line(fs, pf, pf->partial))
			pf->refused++;
	}
	if (pf->n)
		objs = calloc(pf->n, sizeof(*objs));
	for (size_t i = 0; objs && fs->cache && i < pf->n; i++) {
		struct dsfs_dataset *ds = pf->objs[i].ds;
		size_t m = 0;
		bool seen = false;

		for (size_t j = 0; j < i && !seen; j++)
			seen = pf->objs[j].ds->name == ds->name ||
			       strcmp(pf->objs[j].ds->name, ds->name) == 0;
		if (seen)
			continue;
		for (size_t j = i; j < pf->n; j++) {
			struct dsfs_ctl_pf_obj *o = &pf->objs[j];

			if (strcmp(o->ds->name, ds->name))
				continue;
			objs[m++] = (struct cache_object){ .dataset = ds->name,
							   .os = o->ds->os,
							   .key = o->key,
							   .etag = o->etag,
							   .size = o->size };
		}
		nds++;
		int r = cache_prefetch(fs->cache, objs, m,
				       fs->opts->prefetch_window);
		if (r && !err)
			err = r;
	}
	atomic_fetch_add(&fs->ctr.prefetch_lists, 1);
	atomic_fetch_add(&fs->ctr.prefetch_objects, pf->n);
	snprintf(status, sizeof(status),
		 "lines %" PRIu64 "\nobjects %" PRIu64 "\nbytes %" PRIu64
		 "\nskipped %" PRIu64 "\ndatasets %zu\nwindow %" PRIu64
		 "\nduplicates %" PRIu64 "\nrefused %" PRIu64
		 "\nlimit %s\nresult %s\n",
		 pf->lines, (uint64_t)pf->n + pf->dups, pf->bytes, pf->skipped,
		 nds, fs->opts->prefetch_window, pf->dups, pf->refused,
		 pf->limit ? pf->limit : "none",
		 !objs && pf->n ? "out of memory"
		 : err		? strerror(-err)
				: "ok");
	pthread_mutex_lock(&c->lock);
	dsfs_ctl_status_set(c, pf->who.uid, status);
	u = dsfs_ctl_uid_get(c, pf->who.uid);
	if (u) {
		int64_t now = timeutil_mono_ms() / 1000;

		loud = now - u->list_logged >= DSFS_CTL_LIST_LOG_S;
		if (loud)
			u->list_logged = now;
	}
	pthread_mutex_unlock(&c->lock);
	log_msg(loud ? LOG_LVL_INFO : LOG_LVL_DEBUG,
		"prefetch: %zu objects (%" PRIu64 " bytes) in %zu datasets, "
		"%" PRIu64 " duplicates dropped, %" PRIu64 " lines skipped, "
		"%" PRIu64 " writes refused, by uid %u",
		pf->n, pf->bytes, nds, pf->dups, pf->skipped, pf->refused,
		(unsigned)pf->who.uid);
	free(objs);
}

/* Submit what was written since the last submission, then forget it.
 * pf->lock held. */
static void dsfs_ctl_pf_flush(struct dsfs *fs, struct dsfs_ctl_pf *pf)
{
	if (!pf->lines && !pf->partial_len && !pf->refused)
		return;
	dsfs_ctl_pf_submit(fs, pf);
	for (size_t i = 0; i < pf->n; i++) {
		dsfs_dataset_put(pf->objs[i].ds);
		free(pf->objs[i].key);
		free(pf->objs[i].etag);
	}
	dsfs_ctl_pf_uncharge(fs, pf->who.uid, pf->n, pf->mem);
	free(pf->objs);
	free(pf->slots);
	pf->objs = NULL;
	pf->slots = NULL;
	pf->n = pf->cap = pf->nslots = 0;
	pf->lines = pf->skipped = pf->dups = pf->refused = 0;
	pf->bytes = pf->mem = 0;
	pf->limit = NULL;
	pf->partial_len = 0;
	pf->partial_too_long = false;
}

/*
 * FLUSH normally comes with close(2), which waits for its answer; RELEASE
 * comes later, asynchronously. Submitting on flush means that, usually, when
 * the writer's close returns the list is with the cache and the status file
 * shows it. The kernel does not promise a FLUSH for every close (seen here
 * right after a daemonized mount): then RELEASE submits, a moment later.
 */
int dsfs_ctl_flush(struct dsfs *fs, struct dsfs_caller *who,
		   struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct dsfs_ctl_fh *h = (struct dsfs_ctl_fh *)(uintptr_t)fi->fh;

	(void)who;
	(void)n;
	if (!h->pf)
		return 0;
	pthread_mutex_lock(&h->pf->lock);
	dsfs_ctl_pf_flush(fs, h->pf);
	pthread_mutex_unlock(&h->pf->lock);
	return 0;
}

void dsfs_ctl_pf_free(struct dsfs *fs, struct dsfs_ctl_pf *pf)
{
	if (!pf)
		return;
	pthread_mutex_lock(&pf->lock);
	dsfs_ctl_pf_flush(fs, pf); /* written without a flush (no close) */
	pthread_mutex_unlock(&pf->lock);
	pthread_mutex_destroy(&pf->lock);
	free(pf);
}
