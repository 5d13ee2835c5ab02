// SPDX-License-Identifier: MIT
/*
 * cache.c, layer 7 of the cache (lib/cache_i.h draws all seven and has the
 * lock order): open, close and the figures. Calls layers 1 to 5.
 *
 * Lifecycle: cache_open checks cache.dir (owned by this process's euid,
 * not writable by group or others: refused otherwise, naming the fix),
 * creates what is missing (0700 directories, 0600 files), tightens the modes
 * of an older cache (one log line), checks the identity file's block size,
 * scans objects/ for the usage figures, then starts the workers (layer 5).
 * cache_close stops the workers, then closes every open object (all idle by
 * then: no caller may use the cache during or after cache_close).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_i.h"
#include "dstage/config.h"
#include "dstage/log.h"

/* The bound of OFD lock waits: DSTAGE_CACHE_LOCK_TIMEOUT (seconds, may be
 * fractional) or CACHE_LOCK_WAIT_S. */
static unsigned cache_lock_wait_ms(void)
{
	const char *v = getenv("DSTAGE_CACHE_LOCK_TIMEOUT");
	char *end = NULL;
	double s;

	if (!v || !*v)
		return CACHE_LOCK_WAIT_S * 1000;
	s = strtod(v, &end);
	if (*end || !(s > 0) || s > 86400) {
		log_warn("cache: DSTAGE_CACHE_LOCK_TIMEOUT=%s is not a number "
			 "of "
			 "seconds in (0, 86400]: using %d",
			 v, CACHE_LOCK_WAIT_S);
		return CACHE_LOCK_WAIT_S * 1000;
	}
	return s * 1000 < 1 ? 1 : (unsigned)(s * 1000);
}

/*
 * cache.dir (open as fd) must be this process's and writable by nobody
 * else: anyone who can write it could replace object files or plant
 * links. Returns 0 or -EACCES (logged with the fix). A looser read mode
 * is tightened (counted in *t).
 */
static int cache_dir_check(const char *path, int fd, struct cache_modes *t)
{
	struct stat st;

	if (fstat(fd, &st))
		return -errno;
	if (st.st_uid != geteuid()) {
		log_error("cache: cache.dir %s is owned by uid %u, not by this "
			  "process's uid %u: another user could change the "
			  "cache under it; chown %u %s (and chmod 0700 it), "
			  "or set cache.dir to a directory of this user",
			  path, (unsigned)st.st_uid, (unsigned)geteuid(),
			  (unsigned)geteuid(), path);
		return -EACCES;
	}
	if (st.st_mode & 022) {
		log_error("cache: cache.dir %s is writable by %s (mode %04o): "
			  "other users could plant or remove files in it; "
			  "chmod go-w %s (the cache makes it 0700)",
			  path,
			  (st.st_mode & 022) == 022 ? "group and others"
			  : st.st_mode & 002	    ? "others"
						    : "group",
			  (unsigned)(st.st_mode & 07777), path);
		return -EACCES;
	}
	if (st.st_mode & 077) {
		if (fchmod(fd, CACHE_DIR_MODE))
			t->failed++;
		else
			t->dirs++;
	}
	return 0;
}

/* Give the identity file and objects/ the cache's modes (counted in *t). */
static void cache_tighten_top(struct cache *c, struct cache_modes *t)
{
	struct stat st;

	if (!fstatat(c->dir_fd, CACHE_ID_FILE, &st, AT_SYMLINK_NOFOLLOW) &&
	    S_ISREG(st.st_mode) && (st.st_mode & 077)) {
		if (fchmodat(c->dir_fd, CACHE_ID_FILE, CACHE_FILE_MODE, 0))
			t->failed++;
		else
			t->files++;
	}
	if (!fstat(c->objects_fd, &st) && (st.st_mode & 077)) {
		if (fchmod(c->objects_fd, CACHE_DIR_MODE))
			t->failed++;
		else
			t->dirs++;
	}
}

int cache_open(const struct dstage_config *cfg,
	       const struct cache_policy_source *pol, struct cache **out)
{
	struct cache_modes t = { 0 };
	struct cache *c;
	int ret;

	*out = NULL;
	if (!cfg || !cfg->cache_dir || !cfg->cache_block_size ||
	    (cfg->cache_block_size & (cfg->cache_block_size - 1)) ||
	    cfg->cache_block_size < CACHE_ALIGN)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->cfg = cfg;
	if (pol)
		c->pol = *pol;
	c->bs = cfg->cache_block_size;
	c->dir_fd = c->objects_fd = -1;
	c->capacity = cfg->cache_size;
	c->high = cfg->cache_size / 100 * cfg->cache_high_watermark;
	c->low = cfg->cache_size / 100 * cfg->cache_low_watermark;
	c->batch = CACHE_BATCH_BYTES / c->bs;
	if (c->batch < 1)
		c->batch = 1;
	if (c->batch > CACHE_MAX_BATCH)
		c->batch = CACHE_MAX_BATCH;
	c->lock_wait_ms = cache_lock_wait_ms();
	c->release_idle = cache_obj_trim_all;
	pthread_mutex_init(&c->evict_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->buf_lock, NULL);
	{
		const char *v = getenv("DSTAGE_NO_DIRECT");

		c->no_direct = v && *v && strcmp(v, "0") != 0;
	}
	pthread_cond_init(&c->jobs_cv, NULL);
	c->jobs_tail = &c->jobs;

	if (mkdir(cfg->cache_dir, CACHE_DIR_MODE) && errno != EEXIST) {
		ret = -errno;
		log_error("cache: cannot create cache.dir %s: %s",
			  cfg->cache_dir, strerror(errno));
		goto err;
	}
	c->dir_fd = open(cfg->cache_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->dir_fd < 0) {
		ret = -errno;
		log_error("cache: cannot open cache.dir %s: %s", cfg->cache_dir,
			  strerror(errno));
		goto err;
	}
	ret = cache_dir_check(cfg->cache_dir, c->dir_fd, &t);
	if (ret)
		goto err;
	ret = cache_identity(c);
	if (ret) {
		if (ret != -EINVAL)
			log_error("cache: %s: cannot read or write %s: %s",
				  cfg->cache_dir, CACHE_ID_FILE,
				  strerror(-ret));
		goto err;
	}
	if (mkdirat(c->dir_fd, "objects", CACHE_DIR_MODE) && errno != EEXIST) {
		ret = -errno;
		goto err;
	}
	c->objects_fd = openat(c->dir_fd, "objects",
			       O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->objects_fd < 0) {
		ret = -errno;
		goto err;
	}
	cache_tighten_top(c, &t);
	ret = cache_scan_all(c, &t);
	if (ret)
		goto err;
	if (t.dirs || t.files)
		log_warn("cache: %s: modes tightened: %u director%s to %04o "
			 "and %u file%s to %04o were readable by other users",
			 cfg->cache_dir, t.dirs, t.dirs == 1 ? "y" : "ies",
			 CACHE_DIR_MODE, t.files, t.files == 1 ? "" : "s",
			 CACHE_FILE_MODE);
	if (t.failed)
		log_warn("cache: %s: the modes of %u entries could not be "
			 "tightened (owned by another user?): chmod -R go-rwx "
			 "%s",
			 cfg->cache_dir, t.failed, cfg->cache_dir);
	ret = cache_ahead_start(c);
	if (ret)
		goto err;
	*out = c;
	return 0;
err:
	cache_close(c);
	return ret;
}

void cache_close(struct cache *c)
{
	if (!c)
		return;
	cache_ahead_stop(c);
	cache_obj_close_all(c);
	cache_ds_free_all(c);
	if (c->objects_fd >= 0)
		close(c->objects_fd);
	if (c->dir_fd >= 0)
		close(c->dir_fd);
	while (c->nfree_bufs)
		free(c->free_bufs[--c->nfree_bufs]);
	pthread_mutex_destroy(&c->buf_lock);
	pthread_cond_destroy(&c->jobs_cv);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->evict_lock);
	free(c);
}

uint32_t cache_block_size(const struct cache *c)
{
	return c->bs;
}

void cache_set_drop_behind(struct cache *c, bool on)
{
	if (c)
		c->drop_behind = on;
}

bool cache_disk_full(struct cache *c)
{
	return c && atomic_load(&c->last_nospace_disk);
}

void cache_get_stats(struct cache *c, struct cache_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (!c)
		return;
	st->capacity = atomic_load(&c->capacity);
	st->used = atomic_load(&c->used);
	st->pinned = atomic_load(&c->pinned);
	st->hits = atomic_load(&c->hits);
	st->misses = atomic_load(&c->misses);
	st->bytes_from_cache = atomic_load(&c->bytes_from_cache);
	st->bytes_from_source = atomic_load(&c->bytes_from_source);
	st->fetches = atomic_load(&c->fetches);
	st->checksum_failures = atomic_load(&c->checksum_failures);
	st->evictions = atomic_load(&c->evictions);
	st->streamed = atomic_load(&c->streamed);
	st->disk_full = atomic_load(&c->disk_full);
	st->land_limit = CACHE_LAND_BYTES;
	st->land_bytes = atomic_load(&c->land_bytes);
	st->land_peak = atomic_load(&c->land_peak);
	st->lands_refused = atomic_load(&c->lands_refused);
	st->lands_displaced = atomic_load(&c->lands_displaced);
}

int cache_get_ds_stats(struct cache *c, cache_ds_stats_fn fn, void *arg)
{
	struct cache_ds_copy {
		char *name;
		uint64_t hits, misses;
	} *v = NULL;
	size_t n = 0, i = 0;
	int ret = 0;

	if (!c)
		return 0;
	pthread_mutex_lock(&c->lock);
	for (struct cache_ds *d = c->ds; d; d = d->next)
		n++;
	v = n ? calloc(n, sizeof(*v)) : NULL;
	/* c->ds is newest first: fill from the end for first-seen order. */
	for (struct cache_ds *d = c->ds; v && d; d = d->next) {
		struct cache_ds_copy *e = &v[n - ++i];

		e->name = strdup(d->name);
		e->hits = atomic_load_explicit(&d->hits, memory_order_relaxed);
		e->misses =
			atomic_load_explicit(&d->misses, memory_order_relaxed);
		if (!e->name)
			ret = -ENOMEM;
	}
	pthread_mutex_unlock(&c->lock);
	if (n && !v)
		return -ENOMEM;
	for (i = 0; i < n && !ret; i++)
		ret = fn(arg, v[i].name, v[i].hits, v[i].misses);
	for (i = 0; i < n; i++)
		free(v[i].name);
	free(v);
	return ret;
}
