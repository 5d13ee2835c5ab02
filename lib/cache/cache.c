// SPDX-License-Identifier: MIT
/*
 * cache.c, layer 7 of the cache (lib/cache/cache_i.h draws all seven and has the
 * lock order): open, close and the figures, the record walks that need the
 * configuration (cache_open_passthrough, cache_object_forget_block). Calls
 * layers 1 to 5.
 *
 * Lifecycle: cache_open checks cache.dir (owned by this process's euid,
 * not writable by group or others: refused otherwise, naming the fix),
 * creates what is missing (0700 directories, 0600 files), tightens the modes
 * of an older cache (one log line), checks the identity file's block size,
 * scans objects/ for the usage figures, then starts the workers (layer 5).
 * cache_close stops the workers, then closes every open object (all idle by
 * then: no caller may use the cache during or after cache_close).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_i.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "util/fdutil.h"

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

/* The nonce of this cache's damage generation (the second 8 bytes of
 * CACHE_GEN_FILE): drawn by the first process that finds it 0. A mark of
 * an object found whole (cache_whole.c) names the nonce and generation it
 * was made under, so that a damage.gen removed and made again (its
 * generation from 0 again) leaves every older mark stale. */
static uint64_t cache_gen_nonce(_Atomic uint64_t *n)
{
	uint64_t cur = atomic_load(n), v = 0;

	while (!cur) {
		if (getrandom(&v, sizeof(v), 0) != sizeof(v))
			v = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
		if (!v)
			v = 1;
		if (atomic_compare_exchange_strong(n, &cur, v))
			cur = v;
	}
	return cur;
}

/*
 * The damage generation: the first 8 bytes of CACHE_GEN_FILE (0600, 16
 * bytes: then its nonce, cache_gen_nonce) mapped shared
 * by every process of this cache, bumped (cache_gen_bump) after a valid
 * record was made invalid (cache_object_forget_block: the scrub's damaged
 * blocks). An open object remembers that its records were all valid under
 * generation g (o->pt_whole, o->pt_gen), so a passthrough open of an
 * object this process has open reads no record while the generation stays
 * g: after a page-cache drop that read is a disk read per small file.
 * Without the mapping (a read-only cache.dir, a filesystem without shared
 * mappings) every passthrough open reads the records, as before.
 */
static void cache_gen_map(struct cache *c, struct cache_modes *t)
{
	struct stat st;
	void *p;
	int fd;

	fd = openat(c->dir_fd, CACHE_GEN_FILE,
		    O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, CACHE_FILE_MODE);
	if (fd < 0)
		goto fail;
	if (fstat(fd, &st))
		goto fail;
	if (!S_ISREG(st.st_mode)) {
		errno = EINVAL;
		goto fail;
	}
	if (st.st_mode & 077) { /* an older cache's looser mode */
		if (fchmod(fd, CACHE_FILE_MODE))
			t->failed++;
		else
			t->files++;
	}
	/* 8 bytes before the nonce was added: made 16, the nonce 0. */
	if ((uint64_t)st.st_size < CACHE_GEN_BYTES &&
	    ftruncate(fd, CACHE_GEN_BYTES))
		goto fail;
	p = mmap(NULL, CACHE_GEN_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		 0);
	if (p == MAP_FAILED)
		goto fail;
	close(fd);
	c->damage_gen = p;
	c->gen_nonce = cache_gen_nonce((_Atomic uint64_t *)p + 1);
	return;
fail:
	log_info("cache: %s/%s: not shared (%s): every passthrough open "
		 "reads its object's records",
		 c->cfg->cache_dir, CACHE_GEN_FILE, strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* Idle open objects kept: a sixth of the descriptors the process may
 * open (an object may hold three: data file, sidecar, O_DIRECT writer; so
 * half of them at most), CACHE_MAX_OPEN at least. */
static size_t cache_max_open(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY ||
	    rl.rlim_cur / 6 >= CACHE_MAX_OPEN_SMALL)
		return CACHE_MAX_OPEN_SMALL;
	return rl.rlim_cur / 6 > CACHE_MAX_OPEN ? rl.rlim_cur / 6
						: CACHE_MAX_OPEN;
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
	c->max_open = cache_max_open();
	/* As many buffers as the workers and the landed fills can hold. */
	c->busy_bufs = CACHE_POOL_THREADS +
		       CACHE_LAND_BYTES / ((uint64_t)c->batch * c->bs);
	if (c->busy_bufs > CACHE_BUSY_BUFS)
		c->busy_bufs = CACHE_BUSY_BUFS;
	c->release_idle = cache_obj_trim_all;
	pthread_mutex_init(&c->evict_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->buf_lock, NULL);
	pthread_mutex_init(&c->whole_lock, NULL);
	{
		const char *v = getenv("DSTAGE_NO_DIRECT");

		c->no_direct = v && *v && strcmp(v, "0") != 0;
	}
	pthread_cond_init(&c->jobs_cv, NULL);
	c->jobs_tail = &c->jobs;
	ret = cache_obj_table_init(c);
	if (ret)
		goto err;

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
	cache_gen_map(c, &t);
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
	free(c->buckets);
	cache_whole_free(c);
	cache_ds_free_all(c);
	if (c->damage_gen)
		munmap((void *)c->damage_gen, CACHE_GEN_BYTES);
	if (c->objects_fd >= 0)
		close(c->objects_fd);
	if (c->dir_fd >= 0)
		close(c->dir_fd);
	while (c->nfree_bufs)
		free(c->free_bufs[--c->nfree_bufs]);
	pthread_mutex_destroy(&c->buf_lock);
	pthread_mutex_destroy(&c->whole_lock);
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

bool cache_verify_reads_always(const struct cache *c)
{
	return !c || c->cfg->cache_verify_reads == CONFIG_VERIFY_ALWAYS;
}

int cache_object_forget_block(struct cache *c, const struct cache_object *obj,
			      uint64_t block)
{
	static const struct cache_rec none; /* all zeros: a hole, absent */
	struct cache_obj *o = NULL;
	int ret;

	if (!c || !obj || !obj->key)
		return -EINVAL;
	ret = obj->size ? cache_obj_get(c, obj, false, &o) : 0;
	if (ret || !o)
		return ret;
	if (block >= o->nblocks) {
		ret = -EINVAL;
		goto out;
	}
	ret = cache_claim(o, block, true);
	if (ret)
		goto out;
	ret = cache_rec_replace(o, block, &none);
	cache_unclaim(o, block);
out:
	cache_obj_put(o);
	return ret;
}

/* Whether every block of o has a valid record on disk now. 1, 0 or
 * -errno. */
static int cache_all_present(struct cache_obj *o)
{
	struct cache_rec recs[CACHE_MAX_BATCH];

	for (uint64_t b = 0; b < o->nblocks; b += CACHE_MAX_BATCH) {
		uint64_t n = o->nblocks - b < CACHE_MAX_BATCH ? o->nblocks - b
							      : CACHE_MAX_BATCH;
		int ret = cache_read_recs(o, b, n, recs);

		if (ret)
			return ret;
		for (uint64_t i = 0; i < n; i++)
			if (!cache_rec_valid(o, &recs[i], b + i))
				return 0;
	}
	return 1;
}

/* cache_all_present, or what it found under the same damage generation g
 * (cache_gen_map). The caller reads g before the records: a record made
 * invalid after they were read bumps it past the one remembered. */
static int cache_whole(struct cache *c, struct cache_obj *o, uint64_t g)
{
	bool known;
	int ret;

	if (cache_unmarked(c, o->name))
		return 0;

	pthread_mutex_lock(&o->lock);
	known = c->damage_gen && o->pt_whole && o->pt_gen == g;
	pthread_mutex_unlock(&o->lock);
	if (known)
		return 1;
	ret = cache_all_present(o);
	if (ret == 1 && c->damage_gen) {
		pthread_mutex_lock(&o->lock);
		o->pt_whole = true;
		o->pt_gen = g;
		pthread_mutex_unlock(&o->lock);
	}
	return ret;
}

/* o (its data file st) was found whole under generation g: remember it
 * (cache_whole.c), with the access time it last recorded. */
static void cache_whole_remember(struct cache *c, struct cache_obj *o,
				 const struct stat *st, uint64_t g)
{
	time_t at;

	if (!c->damage_gen)
		return;
	pthread_mutex_lock(&o->lock);
	at = o->atime;
	pthread_mutex_unlock(&o->lock);
	cache_whole_note(c, o->name, st, o->fd, g, o->hdr_flags, at);
}

int cache_open_passthrough(struct cache *c, const struct cache_object *obj,
			   int *fd)
{
	struct cache_obj *o = NULL;
	struct stat st;
	uint64_t g;
	char name[33];
	int ret, pfd = -1;

	if (!c || !obj || !obj->key || !fd)
		return -EINVAL;
	*fd = -1;
	if (cache_verify_reads_always(c) || !obj->size)
		return -EAGAIN;
	g = c->damage_gen ? atomic_load(c->damage_gen) : 0;
	/* An object open here already (the usual case: a stage or an
	 * earlier open left it idle) is referenced without its in-use lock,
	 * which the new description takes below: one lock, not three calls. */
	cache_obj_ref_open(c, obj, &o);
	if (!o && c->damage_gen) {
		/* Not open, but found whole before (cache_whole.c): no
		 * sidecar read, when the memo still vouches for the file. (An
		 * object whose damage could not be marked is never noted, and
		 * the failed mark bumped the generation of those noted.) */
		cache_obj_name(obj, name);
		ret = cache_whole_open(c, obj, name, g, fd);
		if (ret != -EAGAIN) {
			if (ret == 0) {
				cache_count(&c->passthrough_opens, 1);
				cache_count(&c->passthrough_remembered, 1);
			}
			return ret;
		}
	}
	if (!o) {
		ret = cache_obj_get(c, obj, false, &o);
		if (ret)
			return ret;
		if (!o)
			return -EAGAIN;
	}
	if (o->version != CACHE_OBJ_VERSION || o->data_off) {
		ret = -EAGAIN;
		goto out;
	}
	/* The same inode even if it was unlinked meanwhile, as the O_DIRECT
	 * writer reopens it; O_NOATIME where allowed: the kernel's reads of
	 * a passed-through file update no access time of the cache's file (a
	 * journal write per small file and epoch); recency is the sidecar's
	 * (cache_obj_touch). */
	pfd = fdutil_reopen_rdonly(o->fd);
	if (pfd < 0) {
		ret = pfd;
		goto out;
	}
	/* The description the kernel will hold keeps the shared in-use
	 * lock while it does (layer 3): taken before the link count is
	 * looked at, so that no evictor unlinks the file after the check. */
	ret = cache_inuse_hold(c, pfd, o->dataset, o->key, o->name, &st);
	if (ret)
		goto out;
	if ((uint64_t)st.st_size != o->size || st.st_nlink == 0) {
		ret = -EAGAIN; /* evicted: this open reads through dstagefs */
		goto out;
	}
	ret = cache_whole(c, o, g);
	if (ret <= 0) {
		ret = ret ? ret : -EAGAIN;
		goto out;
	}
	ret = 0;
	cache_count(&c->passthrough_opens, 1);
	cache_obj_touch(o);
	cache_whole_remember(c, o, &st, g);
	*fd = pfd;
	pfd = -1;
out:
	if (pfd >= 0)
		close(pfd);
	cache_obj_put(o);
	return ret;
}

int cache_object_mark_whole(struct cache *c, const struct cache_object *obj)
{
	struct cache_obj *o = NULL;
	struct stat st;
	uint64_t g;
	int ret;

	if (!c || !obj || !obj->key)
		return -EINVAL;
	if (!c->damage_gen || !obj->size)
		return 0;
	g = atomic_load(c->damage_gen); /* before the file and its records */
	ret = cache_obj_get(c, obj, false, &o);
	if (ret || !o)
		return ret;
	ret = 0;
	if (o->version != CACHE_OBJ_VERSION || o->data_off)
		goto out;
	if (fstat(o->fd, &st)) {
		ret = -errno;
		goto out;
	}
	if ((uint64_t)st.st_size != o->size)
		goto out;
	ret = cache_whole(c, o, g);
	if (ret == 1)
		cache_whole_remember(c, o, &st, g);
out:
	cache_obj_put(o);
	return ret;
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
	st->passthrough_opens = atomic_load(&c->passthrough_opens);
	st->passthrough_remembered = atomic_load(&c->passthrough_remembered);
}

int cache_get_ds_stats(struct cache *c, cache_ds_stats_fn fn, void *arg)
{
	struct cache_ds_copy {
		char *name;
		bool restricted;
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
		e->restricted = d->pol.restricted;
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
		ret = fn(arg, v[i].name, v[i].restricted, v[i].hits,
			 v[i].misses);
	for (i = 0; i < n; i++)
		free(v[i].name);
	free(v);
	return ret;
}

/* ---- garbage collection (cachectl gc) ---- */

#define CACHE_GC_STRS_MAX 16384 /* a header's strings, at most */

/* Read fd's header as an object (strings in *strs, freed by the caller)
 * and check it whole against name. 0, -EUCLEAN (not an object file of this
 * cache, or not the one its name says), or -ENOMEM. */
static int cache_gc_hdr(struct cache *c, int fd, bool meta, const char *name,
			struct cache_object *obj, char **strs)
{
	struct cache_layout l;
	struct cache_hdr h;
	char want[33], *p;
	size_t dl, kl, el;
	int ret;

	*strs = NULL;
	if (cache_pread_all(fd, &h, sizeof(h), 0) ||
	    memcmp(h.magic, CACHE_OBJ_MAGIC, 8) ||
	    (meta ? h.version != CACHE_OBJ_VERSION
		  : (h.version != CACHE_OBJ_VERSION_2 &&
		     h.version != CACHE_OBJ_VERSION_1)) ||
	    h.block_size != c->bs ||
	    (uint64_t)h.ds_len + h.key_len + h.etag_len > CACHE_GC_STRS_MAX ||
	    !h.key_len)
		return -EUCLEAN;
	dl = h.ds_len;
	kl = h.key_len;
	el = h.etag_len;
	p = malloc(dl + kl + el + 3);
	if (!p)
		return -ENOMEM;
	if (cache_pread_all(fd, p, dl, CACHE_HDR_FIXED) ||
	    cache_pread_all(fd, p + dl + 1, kl, CACHE_HDR_FIXED + dl) ||
	    cache_pread_all(fd, p + dl + kl + 2, el,
			    CACHE_HDR_FIXED + dl + kl)) {
		free(p);
		return -EUCLEAN;
	}
	p[dl] = p[dl + 1 + kl] = p[dl + kl + 2 + el] = '\0';
	*obj = (struct cache_object){
		.dataset = p,
		.key = p + dl + 1,
		.etag = p + dl + kl + 2,
		.size = h.size,
	};
	*strs = p;
	/* The whole header, checksum included, as cache_obj_get checks it;
	 * and the name must be this object's (not a renamed file). */
	ret = cache_hdr_check(c, fd, meta, obj, &l);
	if (ret == -ENOMEM)
		return ret;
	cache_obj_name(obj, want);
	if (ret || strlen(name) != 33 || memcmp(name, want, 2) ||
	    strcmp(name + 3, want + 2))
		return -EUCLEAN;
	return 0;
}

/* Whether entry (under dfd) is a sidecar whose data file is there: it is
 * listed with it. */
static bool cache_gc_paired_meta(int dfd, const char *entry)
{
	size_t n = strlen(entry), sl = strlen(CACHE_META_SUFFIX);
	char data[NAME_MAX + 1];

	if (n <= sl || strcmp(entry + n - sl, CACHE_META_SUFFIX))
		return false;
	memcpy(data, entry, n - sl);
	data[n - sl] = '\0';
	return faccessat(dfd, data, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Describe the file name (at dfd/entry) and hand it to fn: a data file
 * with its sidecar (bytes: both; the header: the sidecar's, or its own in
 * a one-file object), or any other file alone. */
static int cache_gc_one(struct cache *c, int dfd, const char *entry,
			const char *name, cache_gc_fn fn, void *arg)
{
	struct cache_gc_file f = { .name = name };
	struct cache_object obj;
	struct stat st;
	char *strs = NULL, mentry[NAME_MAX + 8];
	int fd, mfd = -1, ret;

	if (cache_gc_paired_meta(dfd, entry))
		return 0;
	fd = fdutil_open_regular(dfd, entry,
				 O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
				 &st);
	if (fd < 0)
		return 0; /* gone meanwhile, or a link: not ours to judge */
	f.bytes = (uint64_t)st.st_blocks * 512;
	f.mtime = (int64_t)st.st_mtime;
	if (strlen(entry) == 30) {
		cache_meta_path(entry, mentry, sizeof(mentry));
		mfd = openat(dfd, mentry,
			     O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	}
	if (mfd >= 0 && fstat(mfd, &st) == 0 && S_ISREG(st.st_mode)) {
		f.bytes += (uint64_t)st.st_blocks * 512;
		if ((int64_t)st.st_mtime > f.mtime)
			f.mtime = (int64_t)st.st_mtime;
		ret = cache_gc_hdr(c, mfd, true, name, &obj, &strs);
	} else {
		ret = cache_gc_hdr(c, fd, false, name, &obj, &strs);
	}
	if (mfd >= 0)
		close(mfd);
	close(fd);
	if (ret == -ENOMEM)
		return ret;
	if (!ret) {
		f.object = true;
		f.dataset = obj.dataset;
		f.key = obj.key;
		f.etag = obj.etag;
		f.size = obj.size;
	}
	ret = fn(arg, &f);
	free(strs);
	return ret;
}

int cache_gc_list(struct cache *c, cache_gc_fn fn, void *arg)
{
	struct dirent *de;
	DIR *top;
	int tfd, ret;

	if (!c || !fn)
		return -EINVAL;
	ret = fdutil_opendir(c->objects_fd, &top);
	if (ret)
		return ret;
	tfd = dirfd(top);
	while (!ret && (de = readdir(top))) {
		struct dirent *fe;
		DIR *sub;
		int sfd;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		sfd = openat(tfd, de->d_name,
			     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sfd < 0) {
			/* A stray file directly in objects/. */
			if (errno == ENOTDIR)
				ret = cache_gc_one(c, tfd, de->d_name,
						   de->d_name, fn, arg);
			continue;
		}
		if (strlen(de->d_name) != 2) {
			close(sfd); /* not one of ours: left alone */
			continue;
		}
		if (fdutil_fdopendir(sfd, &sub))
			continue;
		while (!ret && (fe = readdir(sub))) {
			char name[2 + 1 + NAME_MAX + 1];

			if (!strcmp(fe->d_name, ".") ||
			    !strcmp(fe->d_name, ".."))
				continue;
			snprintf(name, sizeof(name), "%.2s/%s", de->d_name,
				 fe->d_name);
			ret = cache_gc_one(c, sfd, fe->d_name, name, fn, arg);
		}
		closedir(sub);
	}
	closedir(top);
	return ret;
}

/* Whether some process holds a fill lock on a block of fd. */
static bool cache_gc_filling(int fd)
{
	struct flock fl = {
		.l_type = F_WRLCK,
		.l_whence = SEEK_SET,
		.l_start = CACHE_LOCK_BLOCK,
		.l_len = 0, /* every block */
	};

	if (fcntl(fd, F_OFD_GETLK, &fl))
		return true; /* cannot tell: keep it */
	return fl.l_type != F_UNLCK;
}

int cache_gc_remove(struct cache *c, const char *name, uint64_t *freed)
{
	const char *slash = name ? strchr(name, '/') : NULL;
	char ds[4096], objname[33];
	struct stat st;
	uint64_t atime, mbytes = 0;
	bool counted;
	int fd = -1, ret = 0;

	*freed = 0;
	if (!c || !name || !*name || strstr(name, "..") ||
	    (slash && (slash - name != 2 || strchr(slash + 1, '/'))))
		return -EINVAL;
	if (slash && strlen(name) == 33 + strlen(CACHE_META_SUFFIX) &&
	    !strcmp(name + 33, CACHE_META_SUFFIX)) {
		/* A sidecar listed alone: its data file is gone. */
		pthread_mutex_lock(&c->evict_lock);
		ret = cache_meta_orphan_drop(c, c->objects_fd, name, freed);
		pthread_mutex_unlock(&c->evict_lock);
		if (!ret)
			log_info("cache: gc removed %s (%" PRIu64 " bytes)",
				 name, *freed);
		return ret;
	}
	/* This process's own entry: in use (-EBUSY), or idle (closed). */
	if (slash && strlen(name) == 33) {
		memcpy(objname, name, 2);
		memcpy(objname + 2, name + 3, 31);
		ret = cache_obj_forget(c, objname);
		if (ret)
			return ret;
	}
	pthread_mutex_lock(&c->evict_lock);
	fd = fdutil_open_regular(c->objects_fd, name,
				 O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
				 &st);
	if (fd < 0) {
		ret = fd == -ELOOP ? -EINVAL : fd;
		goto out;
	}
	/* The evictor's protocol: the in-use byte exclusively, at once or
	 * not at all; then no fill may be in flight either. */
	if (cache_ofd_lock(c, fd, CACHE_LOCK_INUSE, F_WRLCK, false, "", "",
			   name) ||
	    cache_gc_filling(fd)) {
		ret = -EBUSY;
		goto out;
	}
	if (fstat(fd, &st) || st.st_nlink == 0) {
		ret = -ENOENT;
		goto out;
	}
	/* Scans count the data files of an object's name that have a
	 * sidecar or a header of their own (cache_scan): un-count such a
	 * file, and its sidecar, which goes first (cache_pair_unlink). */
	counted = slash && strlen(name) == 33 &&
		  cache_pair_info(c->objects_fd, name, fd, ds, sizeof(ds),
				  &atime, &mbytes, NULL) == 0;
	ret = slash && strlen(name) == 33
		      ? cache_pair_unlink(c->objects_fd, name)
		      : (unlinkat(c->objects_fd, name, 0) ? -errno : 0);
	if (ret)
		goto out;
	*freed = (uint64_t)st.st_blocks * 512 + mbytes;
	if (counted) {
		cache_count_sub(&c->used, *freed);
		cache_ds_add_used(c, ds, -(int64_t)*freed);
	}
	log_info("cache: gc removed %s (%" PRIu64 " bytes)", name, *freed);
out:
	if (fd >= 0)
		close(fd); /* and with it the locks */
	pthread_mutex_unlock(&c->evict_lock);
	return ret;
}
