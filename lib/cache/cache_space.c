// SPDX-License-Identifier: MIT
/*
 * cache_space.c, layer 2 of the cache (lib/cache/cache_i.h draws all seven):
 * space on disk and in memory. Calls layer 1 only, and layer 3 through the
 * c->release_idle hook.
 *
 * Datasets (c->ds, c->lock): a dataset's policy comes from the caller's
 * policy source (struct cache_policy_source), re-read when older than
 * CACHE_POLICY_TTL; a lookup error keeps the last one known. Its usage is
 * an estimate: fills and evictions adjust it, each scan recounts it.
 *
 * Accounting: c->used counts the disk bytes of object files (blocks rounded
 * to 4 KiB, headers) plus reservations not on disk yet (c->inflight, added
 * back by a scan). A reservation (cache_reserve) either makes room, by
 * evicting (unpinned, lowest priority, least recently used first; a dataset
 * over its quota from itself), or fails with -ENOSPC and the caller reads
 * uncached. One reservation or eviction at a time per process:
 * c->evict_lock.
 *
 * Eviction: one pass over objects/ per round (cache_scan) recounts usage and
 * keeps the CACHE_EVICT_HEAP best victims; an object's files (data file and
 * sidecar, both counted) go only when nobody holds the data file's in-use
 * byte, the sidecar first (cache_evict_one).
 *
 * Fill buffers (c->buf_lock, a leaf): c->batch blocks each, up to
 * c->busy_bufs (CACHE_BUSY_BUFS at most) of them kept while fills run,
 * CACHE_FREE_BUFS once the readahead workers are idle (cache_buf_trim).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_i.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "util/fdutil.h"

/* c->lock held. Returns the entry (created if needed, its policy not
 * loaded) or NULL (ENOMEM). */
struct cache_ds *cache_ds_entry(struct cache *c, const char *name)
{
	struct cache_ds *d;

	for (d = c->ds; d; d = d->next)
		if (!strcmp(d->name, name))
			break;
	if (!d) {
		d = calloc(1, sizeof(*d));
		if (!d)
			return NULL;
		d->name = strdup(name);
		if (!d->name) {
			free(d);
			return NULL;
		}
		d->next = c->ds;
		c->ds = d;
	}
	return d;
}

/* c->lock held. Returns the entry (created if needed) with its policy
 * loaded when older than CACHE_POLICY_TTL, or NULL (ENOMEM). */
struct cache_ds *cache_ds_get(struct cache *c, const char *name)
{
	struct cache_ds *d = cache_ds_entry(c, name);

	if (d && c->pol.lookup && time(NULL) - d->loaded >= CACHE_POLICY_TTL) {
		struct cache_policy p = { 0 };
		int ret = c->pol.lookup(c->pol.arg, name, &p);

		if (ret == 0)
			d->pol = p;
		else if (ret == -ENOENT)
			d->pol = (struct cache_policy){ 0 };
		/* Other errors: keep the last known policy. */
		d->loaded = time(NULL);
	}
	return d;
}

/* A copy of the policy and usage of dataset name. */
void cache_usage_of(struct cache *c, const char *name, struct cache_usage *u)
{
	struct cache_ds *d;

	memset(u, 0, sizeof(*u));
	pthread_mutex_lock(&c->lock);
	d = cache_ds_get(c, name);
	if (d) {
		u->pol = d->pol;
		u->used = d->used;
	}
	pthread_mutex_unlock(&c->lock);
}

void cache_ds_add_used(struct cache *c, const char *name, int64_t delta)
{
	struct cache_ds *d;

	pthread_mutex_lock(&c->lock);
	d = cache_ds_get(c, name);
	if (d) {
		if (delta < 0 && (uint64_t)-delta > d->used)
			d->used = 0;
		else
			d->used += (uint64_t)delta;
	}
	pthread_mutex_unlock(&c->lock);
}

/* Forget every dataset (cache_close). */
void cache_ds_free_all(struct cache *c)
{
	while (c->ds) {
		struct cache_ds *d = c->ds;

		c->ds = d->next;
		free(d->name);
		free(d);
	}
}

/*
 * c->evict_lock held. Take the capacity and watermarks from the policy
 * source's overrides (cachectl policy set), at most every
 * CACHE_POLICY_TTL; the configuration's where none is set.
 */
static void cache_limits_refresh(struct cache *c)
{
	const struct dstage_config *cfg = c->cfg;
	struct cache_limits l = { 0 };
	uint64_t cap;
	unsigned high, low;

	if (!c->pol.limits || time(NULL) - c->limits_loaded < CACHE_POLICY_TTL)
		return;
	c->limits_loaded = time(NULL);
	if (c->pol.limits(c->pol.arg, &l))
		return; /* keep what we have */
	cap = l.capacity ? l.capacity : cfg->cache_size;
	high = l.high ? l.high : cfg->cache_high_watermark;
	low = l.low ? l.low : cfg->cache_low_watermark;
	if (high > 100 || low >= high) {
		log_warn("cache: catalog policy watermarks low %u%%, high %u%% "
			 "ignored: low must be below high, high at most 100 "
			 "(cachectl policy set)",
			 low, high);
		return;
	}
	if (cap != atomic_load(&c->capacity))
		log_info("cache: capacity %" PRIu64 " bytes, watermarks %u%% "
			 "and %u%% (%s)",
			 cap, high, low,
			 l.capacity ? "catalog policy" : "cache.size");
	atomic_store(&c->capacity, cap);
	atomic_store(&c->high, cap / 100 * high);
	atomic_store(&c->low, cap / 100 * low);
}

/*
 * Make room for bytes more of dataset ds. Returns 0 (accounted) or -ENOSPC:
 * the blocks must not be cached (the caller streams them).
 */
int cache_reserve(struct cache *c, const char *ds, uint64_t bytes)
{
	struct cache_usage p;
	uint64_t used, freed;
	int ret = 0;

	pthread_mutex_lock(&c->evict_lock);
	cache_limits_refresh(c);
	cache_usage_of(c, ds, &p);
	if (p.pol.quota && p.used + bytes > p.pol.quota) {
		/* Over its quota: the dataset makes room from itself. */
		uint64_t need = p.used + bytes - p.pol.quota;

		cache_evict_bytes(c, ds, need, &freed);
		cache_usage_of(c, ds, &p);
		if (p.used + bytes > p.pol.quota) {
			atomic_store(&c->last_nospace_disk, false);
			ret = -ENOSPC;
			goto out;
		}
	}
	used = atomic_load(&c->used);
	if (used + bytes > c->high) {
		uint64_t target = c->low > bytes ? c->low - bytes : 0;

		cache_evict_bytes(c, NULL, used > target ? used - target : 0,
				  &freed);
		used = atomic_load(&c->used);
	}
	if (used + bytes > atomic_load(&c->capacity)) {
		atomic_store(&c->last_nospace_disk, false);
		ret = -ENOSPC;
		goto out;
	}
	atomic_fetch_add(&c->used, bytes);
	atomic_fetch_add(&c->inflight, bytes);
	if (p.pol.pinned)
		atomic_fetch_add(&c->pinned, bytes);
	cache_ds_add_used(c, ds, (int64_t)bytes);
out:
	pthread_mutex_unlock(&c->evict_lock);
	return ret;
}

/* Reserved bytes that are now on disk (a scan counts them from there). */
void cache_landed_bytes(struct cache *c, uint64_t bytes)
{
	cache_count_sub(&c->inflight, bytes);
}

void cache_unreserve(struct cache *c, const char *ds, uint64_t bytes)
{
	struct cache_usage p;

	cache_usage_of(c, ds, &p);
	cache_count_sub(&c->used, bytes);
	cache_landed_bytes(c, bytes); /* no longer in flight either */
	if (p.pol.pinned)
		cache_count_sub(&c->pinned, bytes);
	cache_ds_add_used(c, ds, -(int64_t)bytes);
}

/*
 * A buffer for c->batch blocks, NULL when out of memory. A new one is
 * aligned for transparent huge pages and asked for them: its first touch
 * (curl's copy into it) then faults 2 MiB at a time, not 4 KiB: a cold
 * 2 GiB read through dstagefs took ~110,000 page faults before, a few
 * thousand after, and about 10% less CPU (bench/cold_cpu.sh, docs/cache.md).
 * Where the kernel has none to give, it is an ordinary buffer.
 */
char *cache_buf_get(struct cache *c)
{
	size_t len = (size_t)c->batch * c->bs;
	size_t align = len >= CACHE_HUGE_PAGE ? CACHE_HUGE_PAGE : CACHE_ALIGN;
	void *p = NULL;

	pthread_mutex_lock(&c->buf_lock);
	if (c->nfree_bufs)
		p = c->free_bufs[--c->nfree_bufs];
	pthread_mutex_unlock(&c->buf_lock);
	if (p)
		return p;
	if (posix_memalign(&p, align, len))
		return NULL;
	if (align == CACHE_HUGE_PAGE)
		(void)madvise(p, len, MADV_HUGEPAGE);
	return p;
}

/*
 * Keep p for the next fill (reused pages need no faulting in). Accepts NULL.
 * A stream's live buffers swing between the fills in flight and the landed
 * fills its reader has not consumed yet: with only CACHE_FREE_BUFS kept,
 * every swing freed buffers that the next fills faulted in again, and
 * zeroing those huge pages was 15-25% of a cold read's CPU (perf).
 */
void cache_buf_put(struct cache *c, char *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&c->buf_lock);
	if (c->nfree_bufs < c->busy_bufs) {
		c->free_bufs[c->nfree_bufs++] = p;
		p = NULL;
	}
	pthread_mutex_unlock(&c->buf_lock);
	free(p);
}

/* Idle: give back the buffers kept beyond CACHE_FREE_BUFS. */
void cache_buf_trim(struct cache *c)
{
	void *extra[CACHE_BUSY_BUFS];
	unsigned n = 0;

	pthread_mutex_lock(&c->buf_lock);
	while (c->nfree_bufs > CACHE_FREE_BUFS)
		extra[n++] = c->free_bufs[--c->nfree_bufs];
	pthread_mutex_unlock(&c->buf_lock);
	while (n)
		free(extra[--n]);
}

struct cache_victim {
	char name[33];
	int priority;
	uint64_t atime;
};

/* Evicted first: lower priority, then older access. */
static bool cache_victim_before(const struct cache_victim *a,
				const struct cache_victim *b)
{
	if (a->priority != b->priority)
		return a->priority < b->priority;
	return a->atime < b->atime;
}

/* A bounded max-heap of the CACHE_EVICT_HEAP best victims: the root is the
 * one evicted last, replaced when a better one comes. */
struct cache_heap {
	struct cache_victim *v;
	size_t n;
};

static void cache_heap_swap(struct cache_heap *h, size_t i, size_t j)
{
	struct cache_victim t = h->v[i];

	h->v[i] = h->v[j];
	h->v[j] = t;
}

static void cache_heap_down(struct cache_heap *h, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;

		if (l < h->n && cache_victim_before(&h->v[m], &h->v[l]))
			m = l;
		if (r < h->n && cache_victim_before(&h->v[m], &h->v[r]))
			m = r;
		if (m == i)
			return;
		cache_heap_swap(h, i, m);
		i = m;
	}
}

static void cache_heap_add(struct cache_heap *h, const struct cache_victim *v)
{
	size_t i;

	if (h->n == CACHE_EVICT_HEAP) {
		if (!cache_victim_before(v, &h->v[0]))
			return;
		h->v[0] = *v;
		cache_heap_down(h, 0);
		return;
	}
	i = h->n++;
	h->v[i] = *v;
	while (i && cache_victim_before(&h->v[(i - 1) / 2], &h->v[i])) {
		cache_heap_swap(h, i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
}

static int cache_victim_cmp(const void *a, const void *b)
{
	const struct cache_victim *x = a, *y = b;

	if (cache_victim_before(x, y))
		return -1;
	return cache_victim_before(y, x) ? 1 : 0;
}

/* Give fd (a directory when dir) the cache's mode if it is looser; counted
 * in *t. */
static void cache_tighten(int fd, bool dir, struct cache_modes *t)
{
	mode_t want = dir ? CACHE_DIR_MODE : CACHE_FILE_MODE;
	struct stat st;

	if (!t || fstat(fd, &st) || !(st.st_mode & 077))
		return;
	if (fchmod(fd, want)) {
		t->failed++;
		return;
	}
	if (dir)
		t->dirs++;
	else
		t->files++;
}

/*
 * One pass over the cache directory: recount usage (total, pinned, per
 * dataset) and collect the best victims among unpinned objects (of only_ds
 * when not NULL) in h. With t, also give every subdirectory and object file
 * the cache's modes, counting those changed in *t (cache_open). Entries
 * that cannot be opened or read are skipped. evict_lock held.
 */
static int cache_scan(struct cache *c, const char *only_ds,
		      struct cache_heap *h, struct cache_modes *t)
{
	char ds[4096];
	uint64_t total = 0, pinned = 0;
	DIR *top = NULL;
	struct dirent *de;
	/*
	 * Bytes in flight now either land while the directory is walked (and
	 * may or may not be seen on disk) or are still in flight at the end.
	 * Adding this snapshot, not the count at the end, can only count a
	 * landing twice, never miss one: a fill that lands after its file was
	 * walked but before the end would otherwise be in neither figure.
	 * (No reservation can start meanwhile: evict_lock is held.)
	 */
	uint64_t inflight = atomic_load(&c->inflight);

	h->n = 0;
	pthread_mutex_lock(&c->lock);
	for (struct cache_ds *d = c->ds; d; d = d->next)
		d->used = 0;
	pthread_mutex_unlock(&c->lock);
	int err = fdutil_opendir(c->objects_fd, &top);

	if (err)
		return err;
	while ((de = readdir(top))) {
		DIR *sub;
		struct dirent *fe;
		int sfd;

		if (de->d_name[0] == '.' || strlen(de->d_name) != 2)
			continue;
		sfd = openat(c->objects_fd, de->d_name,
			     O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (sfd < 0)
			continue;
		cache_tighten(sfd, true, t);
		if (fdutil_fdopendir(sfd, &sub))
			continue;
		while ((fe = readdir(sub))) {
			struct cache_victim v;
			struct cache_usage p;
			struct stat st;
			uint64_t bytes, mbytes;
			int fd, mfd = -1, ret;

			/* A data file (its sidecar goes with it); a sidecar
			 * alone is not counted (see docs/cache.md). */
			if (strlen(fe->d_name) != 30)
				continue;
			fd = openat(sfd, fe->d_name, O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				continue;
			cache_tighten(fd, false, t);
			ret = fstat(fd, &st);
			if (!ret)
				ret = cache_pair_info(sfd, fe->d_name, fd, ds,
						      sizeof(ds), &v.atime,
						      &mbytes, &mfd);
			if (mfd >= 0) {
				cache_tighten(mfd, false, t);
				close(mfd);
			}
			close(fd);
			if (ret)
				continue;
			bytes = (uint64_t)st.st_blocks * 512 + mbytes;
			total += bytes;
			cache_usage_of(c, ds, &p);
			cache_ds_add_used(c, ds, (int64_t)bytes);
			if (p.pol.pinned) {
				pinned += bytes;
				continue;
			}
			if (only_ds && strcmp(only_ds, ds))
				continue;
			/* 2 + 30 hex digits, both lengths checked above */
			memcpy(v.name, de->d_name, 2);
			memcpy(v.name + 2, fe->d_name, 30);
			v.name[32] = '\0';
			v.priority = p.pol.priority;
			cache_heap_add(h, &v);
		}
		closedir(sub);
	}
	closedir(top);
	atomic_store(&c->used, total + inflight);
	atomic_store(&c->pinned, pinned);
	qsort(h->v, h->n, sizeof(*h->v), cache_victim_cmp);
	return 0;
}

/* Unlink one object file unless some process uses it. Returns the bytes it
 * held, 0 if it was in use or gone. */
uint64_t cache_evict_one(struct cache *c, const char *name, char *ds,
			 size_t dslen)
{
	char path[CACHE_PATH_MAX];
	struct stat st;
	uint64_t atime, mbytes, bytes = 0;
	int fd;

	cache_name_path(name, path);
	fd = openat(c->objects_fd, path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return 0;
	if (cache_ofd_lock(c, fd, CACHE_LOCK_INUSE, F_WRLCK, false, "", "",
			   name) ||
	    fstat(fd, &st) || st.st_nlink == 0 ||
	    cache_pair_info(c->objects_fd, path, fd, ds, dslen, &atime, &mbytes,
			    NULL))
		goto out;
	/* The sidecar first (cache_pair_unlink): no window where its
	 * records name bytes that are gone. */
	if (cache_pair_unlink(c->objects_fd, path))
		goto out;
	bytes = (uint64_t)st.st_blocks * 512 + mbytes;
	cache_count(&c->evictions, 1);
	log_debug("cache: evicted %s (%s, %" PRIu64 " bytes)", path, ds, bytes);
out:
	close(fd);
	return bytes;
}

/* Evict the victims of h, best first, until *freed reaches need. */
static void cache_evict_heap(struct cache *c, const struct cache_heap *h,
			     uint64_t need, uint64_t *freed)
{
	char ds[4096];

	for (size_t i = 0; i < h->n && *freed < need; i++) {
		uint64_t b = cache_evict_one(c, h->v[i].name, ds, sizeof(ds));

		if (!b)
			continue;
		*freed += b;
		cache_count_sub(&c->used, b);
		cache_ds_add_used(c, ds, -(int64_t)b);
	}
}

/*
 * Free at least need bytes (of only_ds if not NULL) if possible, scanning
 * for victims into h; scanned: h holds a scan just made (of the same
 * only_ds), used before any other. evict_lock held.
 */
static int cache_evict_run(struct cache *c, const char *only_ds,
			   struct cache_heap *h, bool scanned, uint64_t need,
			   uint64_t *freed)
{
	int ret = 0;

	*freed = 0;
	while (*freed < need) {
		uint64_t before = *freed;

		if (!scanned) {
			ret = cache_scan(c, only_ds, h, NULL);
			if (ret)
				break;
		}
		scanned = false;
		cache_evict_heap(c, h, need, freed);
		if (*freed == before || h->n < CACHE_EVICT_HEAP)
			break;
	}
	return ret;
}

/* Free at least need bytes (of only_ds if not NULL) if possible. evict_lock
 * held. */
int cache_evict_bytes(struct cache *c, const char *only_ds, uint64_t need,
		      uint64_t *freed)
{
	struct cache_heap h = { 0 };
	int ret;

	*freed = 0;
	if (!need)
		return 0;
	/* Our idle entries may be victims: close them. */
	if (c->release_idle)
		c->release_idle(c);
	h.v = malloc(CACHE_EVICT_HEAP * sizeof(*h.v));
	if (!h.v)
		return -ENOMEM;
	ret = cache_evict_run(c, only_ds, &h, false, need, freed);
	free(h.v);
	return ret;
}

/*
 * One walk of the directory refreshes the usage figures and, when no
 * dataset is over its quota, also yields the victims for the low mark;
 * each dataset over its quota takes one walk more (its own victims).
 */
int cache_evict(struct cache *c, uint64_t *freed)
{
	uint64_t f = 0, used;
	struct cache_heap h = { 0 };
	bool rescan = false;
	int ret;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->evict_lock);
	c->limits_loaded = 0; /* an explicit eviction takes the newest */
	cache_limits_refresh(c);
	if (c->release_idle)
		c->release_idle(c);
	h.v = malloc(CACHE_EVICT_HEAP * sizeof(*h.v));
	if (!h.v) {
		ret = -ENOMEM;
		goto out;
	}
	ret = cache_scan(c, NULL, &h, NULL);
	if (ret)
		goto out;
	/* Datasets over their quota first, then down to the low mark. */
	for (;;) {
		struct cache_ds *over = NULL;
		uint64_t excess = 0, got = 0;

		pthread_mutex_lock(&c->lock);
		for (struct cache_ds *d = c->ds; d && !over; d = d->next)
			if (d->pol.quota && d->used > d->pol.quota &&
			    !d->pol.pinned) {
				over = d;
				excess = d->used - d->pol.quota;
			}
		char *name = over ? strdup(over->name) : NULL;

		pthread_mutex_unlock(&c->lock);
		if (!name)
			break;
		cache_evict_bytes(c, name, excess, &got);
		free(name);
		f += got;
		rescan = true; /* h's victims may be gone */
		if (!got)
			break;
	}
	used = atomic_load(&c->used);
	if (used > c->low) {
		uint64_t got = 0;

		ret = cache_evict_run(c, NULL, &h, !rescan, used - c->low,
				      &got);
		f += got;
	}
out:
	free(h.v);
	pthread_mutex_unlock(&c->evict_lock);
	if (freed)
		*freed = f;
	return ret;
}

/* The scan of cache_open: usage, and modes (see cache_scan). */
int cache_scan_all(struct cache *c, struct cache_modes *t)
{
	struct cache_heap h = { 0 };
	int ret;

	h.v = malloc(CACHE_EVICT_HEAP * sizeof(*h.v));
	if (!h.v)
		return -ENOMEM;
	pthread_mutex_lock(&c->evict_lock);
	ret = cache_scan(c, NULL, &h, t);
	pthread_mutex_unlock(&c->evict_lock);
	free(h.v);
	return ret;
}
