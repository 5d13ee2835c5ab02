// SPDX-License-Identifier: MIT
/*
 * cache_obj.c, layer 3 of the cache (lib/cache/cache_i.h draws all seven): the
 * object versions open in this process, their files, their claims, their
 * verified-block bitmaps and the lifecycle of their landed fills. Calls layers 1 and 2.
 *
 * An open object (struct cache_obj) in c->buckets (c->lock):
 *
 *   (none) --cache_obj_get: file opened or created, in-use byte shared-
 *            locked--> IN USE (refs > 0)
 *   IN USE --last cache_obj_put: landed fills dropped, in-use lock
 *            released (evictors may take the file)--> IDLE (refs == 0)
 *   IDLE --cache_obj_get: in-use lock re-taken; the file was evicted
 *            meanwhile (no links): freed, opened afresh--> IN USE
 *   IDLE --cache_obj_ref_open: referenced, no lock taken (its caller
 *            locks a description of its own)--> IN USE, unlocked
 *   IDLE --more than c->max_open open, or more than CACHE_MAX_OPEN open
 *            larger than CACHE_SMALL_AHEAD (an idle descriptor of an evicted
 *            file keeps its space), eviction (c->release_idle),
 *            cache_object_drop, close--> freed
 *
 * Invariants: an IN USE object holds the shared lock on CACHE_LOCK_INUSE of
 * a file that was linked when it was taken (o->inuse_locked), unless every
 * reference is cache_obj_ref_open's, whose callers (passthrough opens) take
 * that lock on their own description and check the link count after;
 * cache_obj_get takes it whenever it is not held. An IDLE one
 * holds no lock and no landed fill, and is on the idle list (c->idle_old
 * .. c->idle_new, in the order the entries went idle) exactly while IDLE. A block is in o->claims while a thread
 * of this process fills or verifies it; cache_claim then also holds the
 * block's OFD lock (exclusive across processes).
 *
 * An object's files are created whole or not at all: two O_TMPFILEs
 * (0600), the sidecar's header written, the data file linked under its
 * exclusive in-use lock, then the sidecar (cache_obj_create); the
 * sidecar's header and first page of records are reserved (layer 2)
 * first. At open, a one-file object (versions 1 and 2) is migrated to a
 * pair when no other process has it open (cache_obj_migrate), else read
 * in its own format; a data file with a bad sidecar, or with neither a
 * sidecar nor a header, is removed when nobody uses it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_i.h"
#include "dstage/grow.h"
#include "dstage/log.h"

/* o->lock held: drop a reference; the last one frees the land. */
void cache_land_unref(struct cache_obj *o, struct cache_land *l)
{
	struct cache *c = o->c;

	if (--l->refs)
		return;
	atomic_fetch_sub(&c->land_bytes, (uint64_t)c->batch * c->bs);
	cache_buf_put(c, l->buf);
	free(l);
}

/* o->lock held: take l out of o->lands (a no-op when it is not there). */
void cache_land_unlist(struct cache_obj *o, struct cache_land *l)
{
	for (struct cache_land **pp = &o->lands; *pp; pp = &(*pp)->next)
		if (*pp == l) {
			*pp = l->next;
			o->nlands--;
			cache_land_unref(o, l);
			return;
		}
}

/* o->lock held: whether a landed fill holds any block of [b0, b1). */
bool cache_landed(const struct cache_obj *o, uint64_t b0, uint64_t b1)
{
	for (const struct cache_land *l = o->lands; l; l = l->next)
		if (l->b0 < b1 && b0 < l->b0 + l->n)
			return true;
	return false;
}

/* o->lock held: forget every landed fill of o. */
void cache_lands_drop(struct cache_obj *o)
{
	while (o->lands)
		cache_land_unlist(o, o->lands);
}

/*
 * Create obj's pair of files: the sidecar (header) and the data file, each
 * an O_TMPFILE (0600). The data file is linked first, holding its
 * exclusive in-use lock, then the sidecar (cache_meta_replace): an opener
 * that finds the data file waits for the in-use lock and then finds both.
 * A crash between the two links leaves a data file alone (empty), which
 * the next opener removes. The sidecar's header and first page of records
 * count against the capacity like blocks do (reserved first): -ENOSPC when
 * there is no room, and the caller reads uncached. -EEXIST: another
 * process or thread linked its data file first.
 */
static int cache_obj_create(struct cache *c, const struct cache_object *obj,
			    const char *name)
{
	char sub[3] = { name[0], name[1], 0 }, proc[64];
	const char *ds = cache_ds_or(obj->dataset);
	char *hdr = NULL;
	uint64_t cost = 0;
	size_t len;
	int dfd = -1, fd = -1, mfd = -1, ret;

	if (mkdirat(c->objects_fd, sub, CACHE_DIR_MODE) && errno != EEXIST) {
		ret = -errno;
		if (ret == -ENOSPC || ret == -EDQUOT) {
			cache_note_disk_full(c, ret, "a directory of objects/");
			ret = -ENOSPC;
		}
		return ret;
	}
	dfd = openat(c->objects_fd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	ret = cache_hdr_build(c, obj, CACHE_OBJ_VERSION, 0, &hdr, &len);
	if (ret)
		goto out;
	ret = cache_reserve(c, ds,
			    cache_roundup(len, CACHE_ALIGN) + CACHE_ALIGN);
	if (ret)
		goto out;
	cost = cache_roundup(len, CACHE_ALIGN) + CACHE_ALIGN;
	mfd = openat(dfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, CACHE_FILE_MODE);
	fd = openat(dfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, CACHE_FILE_MODE);
	if (mfd < 0 || fd < 0) {
		ret = -errno;
		goto out;
	}
	errno = 0;
	if (pwrite(mfd, hdr, len, 0) != (ssize_t)len) {
		ret = errno ? -errno : -ENOSPC;
		goto out;
	}
	/* Nobody else can see it yet: taken at once. */
	ret = cache_ofd_lock(c, fd, CACHE_LOCK_INUSE, F_WRLCK, false, "", "",
			     name);
	if (ret)
		goto out;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (linkat(AT_FDCWD, proc, dfd, name + 2, AT_SYMLINK_FOLLOW)) {
		ret = -errno;
		goto out;
	}
	ret = cache_meta_replace(c, dfd, name + 2, mfd);
	if (ret) /* a data file alone would only be removed again */
		unlinkat(dfd, name + 2, 0);
out:
	if (cost && (ret == -ENOSPC || ret == -EDQUOT)) {
		/* Reserved, so there was room by cache.size: the disk is full. */
		cache_note_disk_full(c, ret, "a new object file");
		ret = -ENOSPC;
	}
	if (ret && cost) /* not ours after all (EEXIST: another one's) */
		cache_unreserve(c, ds, cost);
	else if (cost)
		cache_landed_bytes(c, cost);
	if (fd >= 0)
		close(fd); /* and with it the exclusive lock */
	if (mfd >= 0)
		close(mfd);
	if (dfd >= 0)
		close(dfd);
	free(hdr);
	return ret;
}

static void cache_obj_free(struct cache_obj *o)
{
	if (!o)
		return;
	pthread_mutex_lock(&o->lock);
	cache_lands_drop(o);
	pthread_mutex_unlock(&o->lock);
	if (o->mfd >= 0 && o->mfd != o->fd)
		close(o->mfd);
	if (o->fd >= 0)
		close(o->fd);
	if (o->dfd >= 0)
		close(o->dfd);
	pthread_mutex_destroy(&o->lock);
	pthread_cond_destroy(&o->cond);
	free(o->claims);
	free(o->verified);
	free(o->dataset);
	free(o->key);
	free(o->etag);
	free(o);
}

/*
 * A data file the caller cannot use (bad sidecar or header, or a data file
 * alone: a crash's leftover): remove it, with its sidecar, if nobody else
 * uses it (the exclusive in-use lock, at once), and return -EAGAIN (open
 * again); else -EUCLEAN (the caller reads uncached).
 */
static int cache_obj_unusable(struct cache *c, const struct cache_object *obj,
			      const char *name, const char *path, int fd,
			      const char *what)
{
	if (cache_ofd_lock(c, fd, CACHE_LOCK_INUSE, F_WRLCK, false, "", "",
			   name) == 0) {
		log_warn("cache: %s/%s: object file %s: %s; removed",
			 cache_ds_or(obj->dataset), obj->key, path, what);
		cache_pair_unlink(c->objects_fd, path);
		return -EAGAIN;
	}
	log_warn("cache: %s/%s: object file %s: %s, and it is in use: "
		 "reading uncached",
		 cache_ds_or(obj->dataset), obj->key, path, what);
	return -EUCLEAN;
}

/*
 * A one-file object (version 1 or 2) found at open, fd holding its shared
 * in-use lock: migrate it to a pair when nobody else has it open (the
 * exclusive lock at once, then cache_migrate), and take the shared lock
 * back. Returns 0 (*mfd the sidecar and *l its layout, or *mfd = fd: read
 * in the old format this time), or -EAGAIN (the file was removed: open
 * again).
 */
static int cache_obj_migrate(struct cache *c, const struct cache_object *obj,
			     const char *name, const char *path, int fd,
			     struct cache_layout *l, int *mfd)
{
	int ret;

	*mfd = fd;
	if (cache_ofd_lock(c, fd, CACHE_LOCK_INUSE, F_WRLCK, false, "", "",
			   name))
		return 0; /* another process reads it now */
	ret = cache_migrate(c, c->objects_fd, path, fd, obj, l, mfd);
	/* Back to shared: a write lock converts in place, no gap. */
	cache_ofd_lock(c, fd, CACHE_LOCK_INUSE, F_RDLCK, false, "", "", name);
	if (ret == 0) {
		log_debug("cache: %s/%s: object file %s migrated to version %d",
			  cache_ds_or(obj->dataset), obj->key, path,
			  CACHE_OBJ_VERSION);
		return 0;
	}
	*mfd = fd;
	if (ret == -ESTALE)
		return -EAGAIN;
	if (ret != -EBUSY)
		log_info("cache: %s/%s: object file %s stays in version %u "
			 "for now: %s",
			 cache_ds_or(obj->dataset), obj->key, path, l->version,
			 ret == -EFBIG ? "too large to copy" : strerror(-ret));
	return 0;
}

/*
 * Open (creating if needed) the files of obj, holding the shared in-use
 * lock on a data file that is still linked: *fdp the data file, *mfdp the
 * sidecar (or *fdp for a one-file object read as it is), *l where things
 * are. -EUCLEAN: the files are not usable (a bad header nobody could
 * remove, or a hash collision): stream through.
 */
static int cache_obj_open_file(struct cache *c, const struct cache_object *obj,
			       const char *name, bool create, int *fdp,
			       int *mfdp, struct cache_layout *l)
{
	char path[CACHE_PATH_MAX], mpath[48];
	int fd = -1, mfd = -1, ret = 0;

	cache_name_path(name, path);
	cache_meta_path(path, mpath, sizeof(mpath));
	for (int tries = 0; tries < 16; tries++) {
		struct stat st;

		fd = openat(c->objects_fd, path, O_RDWR | O_CLOEXEC);
		if (fd < 0 && errno == ENOENT && !create)
			return -ENOENT;
		if (fd < 0 && errno == ENOENT) {
			ret = cache_obj_create(c, obj, name);
			if (ret && ret != -EEXIST)
				return ret;
			continue;
		}
		if (fd < 0)
			return -errno;
		ret = cache_inuse_hold(c, fd, cache_ds_or(obj->dataset),
				       obj->key, name, &st);
		if (ret)
			goto fail;
		if (st.st_nlink == 0) { /* evicted meanwhile */
			close(fd);
			fd = -1;
			continue;
		}
		cache_small_ahead(c, fd, &st);
		/* Under the shared lock nobody links or unlinks the sidecar
		 * (cache_file.c): this one is the data file's. */
		mfd = openat(c->objects_fd, mpath,
			     O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		if (mfd < 0 && errno != ENOENT) {
			ret = -errno;
			goto fail;
		}
		if (mfd >= 0) {
			if (c->drop_behind && st.st_size <= CACHE_SMALL_AHEAD)
				(void)posix_fadvise(mfd, 0, 0,
						    POSIX_FADV_WILLNEED);
			ret = cache_hdr_check(c, mfd, true, obj, l);
			if (ret == 0) {
				*fdp = fd;
				*mfdp = mfd;
				return 0;
			}
			close(mfd);
			mfd = -1;
			if (ret != -EUCLEAN)
				goto fail;
			ret = cache_obj_unusable(c, obj, name, path, fd,
						 "bad header");
		} else {
			ret = cache_hdr_check(c, fd, false, obj, l);
			if (ret == 0)
				ret = cache_obj_migrate(c, obj, name, path, fd,
							l, &mfd);
			else if (ret == -EUCLEAN)
				ret = cache_obj_unusable(
					c, obj, name, path, fd,
					"neither a header nor a sidecar");
			if (ret == 0) {
				*fdp = fd;
				*mfdp = mfd;
				return 0;
			}
		}
		if (ret != -EAGAIN)
			goto fail;
		close(fd);
		fd = -1;
	}
	return -EUCLEAN;
fail:
	close(fd);
	return ret;
}

static bool cache_obj_big(const struct cache_obj *o)
{
	return o->size > CACHE_SMALL_AHEAD;
}

/*
 * The open-object table (c->lock held throughout): a chained hash on the
 * name (hex digits of a hash already, so its first 16 are the bucket),
 * and the idle entries in the order they went idle, so that a lookup and
 * closing the least recently used idle entry cost the same with 8,192
 * entries open as with 8 (a list walked on every open cost ~3 walks of
 * the whole table per new small file once it was full).
 */
int cache_obj_table_init(struct cache *c)
{
	size_t n = 64;

	while (n < c->max_open)
		n <<= 1;
	c->buckets = calloc(n, sizeof(*c->buckets));
	if (!c->buckets)
		return -ENOMEM;
	c->nbuckets = n;
	return 0;
}

static struct cache_obj **cache_obj_bucket(struct cache *c, const char *name)
{
	return &c->buckets[cache_name_key(name) & (c->nbuckets - 1)];
}

static struct cache_obj *cache_obj_find(struct cache *c, const char *name)
{
	struct cache_obj *o = *cache_obj_bucket(c, name);

	while (o && strcmp(o->name, name))
		o = o->hnext;
	return o;
}

/* o goes idle: the most recently used end. */
static void cache_idle_add(struct cache *c, struct cache_obj *o)
{
	o->idle_next = NULL;
	o->idle_prev = c->idle_new;
	if (c->idle_new)
		c->idle_new->idle_next = o;
	else
		c->idle_old = o;
	c->idle_new = o;
	if (!cache_obj_big(o))
		c->idle_small_bytes += o->size;
}

static void cache_idle_del(struct cache *c, struct cache_obj *o)
{
	if (o->idle_prev)
		o->idle_prev->idle_next = o->idle_next;
	else
		c->idle_old = o->idle_next;
	if (o->idle_next)
		o->idle_next->idle_prev = o->idle_prev;
	else
		c->idle_new = o->idle_prev;
	o->idle_prev = o->idle_next = NULL;
	if (!cache_obj_big(o))
		c->idle_small_bytes -= o->size;
}

static void cache_obj_link(struct cache *c, struct cache_obj *o)
{
	struct cache_obj **b = cache_obj_bucket(c, o->name);

	o->hnext = *b;
	*b = o;
	c->nobjs++;
	if (cache_obj_big(o))
		c->nbig++;
}

/* Take o out of the table (and of the idle list: it is idle or being
 * dropped by its only user) and free it. */
static void cache_obj_unlink(struct cache *c, struct cache_obj *o)
{
	struct cache_obj **pp = cache_obj_bucket(c, o->name);

	while (*pp != o) {
		BUG_ON(!*pp);
		pp = &(*pp)->hnext;
	}
	*pp = o->hnext;
	if (!o->refs)
		cache_idle_del(c, o);
	c->nobjs--;
	if (cache_obj_big(o))
		c->nbig--;
	cache_obj_free(o);
}

/* The least recently used idle entry that is large (big) or small. */
static struct cache_obj *cache_idle_oldest(struct cache *c, bool big)
{
	struct cache_obj *v = c->idle_old;

	while (v && cache_obj_big(v) != big)
		v = v->idle_next;
	return v;
}

/* Close the least recently used idle entries while more than c->max_open
 * are open, more than CACHE_MAX_OPEN large ones, or the small idle ones
 * hold more than CACHE_IDLE_SMALL_BYTES (all idle ones if all). */
static void cache_trim_idle(struct cache *c, bool all)
{
	for (;;) {
		struct cache_obj *v = all ? c->idle_old : NULL;

		if (!v && c->nbig > CACHE_MAX_OPEN)
			v = cache_idle_oldest(c, true);
		if (!v && c->idle_small_bytes > CACHE_IDLE_SMALL_BYTES)
			v = cache_idle_oldest(c, false);
		if (!v && c->nobjs > c->max_open)
			v = c->idle_old;
		if (!v)
			return;
		cache_obj_unlink(c, v);
	}
}

/* Close this process's idle open objects (the c->release_idle hook:
 * eviction's victims may be among them). */
void cache_obj_trim_all(struct cache *c)
{
	pthread_mutex_lock(&c->lock);
	cache_trim_idle(c, true);
	pthread_mutex_unlock(&c->lock);
}

/* cache_close: every object is idle by now. */
void cache_obj_close_all(struct cache *c)
{
	cache_obj_trim_all(c);
}

/* Close the idle open object of file name (32 hex digits) if there is one.
 * Returns 0, or -EBUSY when it is in use. */
int cache_obj_forget(struct cache *c, const char *name)
{
	struct cache_obj *o;
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	o = cache_obj_find(c, name);
	if (o && o->refs)
		ret = -EBUSY;
	else if (o)
		cache_obj_unlink(c, o);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/*
 * Get a referenced open object for obj. *op is NULL (and 0 returned) when the
 * object cannot be cached (bad file in use: the caller streams), or when it
 * has no file and create is false.
 */
int cache_obj_get(struct cache *c, const struct cache_object *obj, bool create,
		  struct cache_obj **op)
{
	struct cache_layout l = { 0 };
	char name[33];
	struct cache_obj *o, *other;
	int ret;

	*op = NULL;
	cache_obj_name(obj, name);
	pthread_mutex_lock(&c->lock);
	o = cache_obj_find(c, name);
	if (o) {
		if (!o->refs++)
			cache_idle_del(c, o);
		/* An idle entry's store may be gone with the caller that
		 * opened it (a finished stager job frees its own): fetch
		 * through this caller's. */
		if (o->refs == 1)
			o->os = obj->os;
		if (!o->inuse_locked) {
			/* Idle entries hold no in-use lock (nor do the
			 * references of cache_obj_ref_open): re-take it and
			 * make sure the file was not evicted meanwhile. */
			struct stat st;

			ret = cache_ofd_lock(c, o->fd, CACHE_LOCK_INUSE,
					     F_RDLCK, true, o->dataset, o->key,
					     o->name);
			if (ret == 0 && fstat(o->fd, &st) == 0 &&
			    st.st_nlink > 0) {
				o->inuse_locked = true;
			} else {
				if (ret == 0)
					cache_ofd_unlock(o->fd,
							 CACHE_LOCK_INUSE);
				if (o->refs > 1) {
					/* Evicted under a passthrough open's
					 * reference: this read streams. */
					o->refs--;
					pthread_mutex_unlock(&c->lock);
					return 0;
				}
				/* Evicted: forget this entry, open afresh. */
				cache_obj_unlink(c, o);
				o = NULL;
			}
		}
		if (o) {
			pthread_mutex_unlock(&c->lock);
			*op = o;
			return 0;
		}
	}
	pthread_mutex_unlock(&c->lock);

	o = calloc(1, sizeof(*o));
	if (!o)
		return -ENOMEM;
	o->c = c;
	o->fd = o->mfd = -1;
	o->dfd = CACHE_DFD_UNSET;
	pthread_mutex_init(&o->lock, NULL);
	pthread_cond_init(&o->cond, NULL);
	memcpy(o->name, name, sizeof(name));
	o->dataset = strdup(cache_ds_or(obj->dataset));
	o->key = strdup(obj->key);
	o->etag = strdup(obj->etag ? obj->etag : "");
	o->os = obj->os;
	o->size = obj->size;
	o->nblocks = (obj->size + c->bs - 1) / c->bs;
	if (!o->dataset || !o->key || !o->etag) {
		ret = -ENOMEM;
		goto err;
	}
	if (o->nblocks <= CACHE_VERIFIED_MAX_BITS) {
		o->verified = calloc(1, (o->nblocks + 7) / 8 + 1);
		if (!o->verified) {
			ret = -ENOMEM;
			goto err;
		}
	}
	ret = cache_obj_open_file(c, obj, name, create, &o->fd, &o->mfd, &l);
	o->data_off = l.data_off;
	o->rec_off = l.rec_off;
	o->rec_seed = l.rec_seed;
	o->version = l.version;
	o->hdr_flags = l.flags;
	if (ret == -EUCLEAN || ret == -ENOSPC || (ret == -ENOENT && !create)) {
		/* Unusable, no room for a new file, or none wanted: the
		 * caller streams (or has nothing to do). */
		cache_obj_free(o);
		return 0;
	}
	if (ret)
		goto err;
	o->inuse_locked = true;
	o->refs = 1;

	pthread_mutex_lock(&c->lock);
	other = cache_obj_find(c, name);
	if (other) {
		/* Another thread opened it first: use that one. Our
		 * descriptor's shared lock goes away with it. */
		pthread_mutex_unlock(&c->lock);
		cache_obj_free(o);
		return cache_obj_get(c, obj, create, op);
	}
	o->ds = cache_ds_entry(c, o->dataset); /* NULL: counted in all only */
	cache_obj_link(c, o);
	cache_trim_idle(c, false);
	pthread_mutex_unlock(&c->lock);
	*op = o;
	return 0;
err:
	log_error("cache: %s/%s: cannot open its cache file: %s",
		  cache_ds_or(obj->dataset), obj->key, strerror(-ret));
	cache_obj_free(o);
	return ret;
}

void cache_obj_ref_open(struct cache *c, const struct cache_object *obj,
			struct cache_obj **op)
{
	char name[33];
	struct cache_obj *o;

	cache_obj_name(obj, name);
	pthread_mutex_lock(&c->lock);
	o = cache_obj_find(c, name);
	if (o && !o->refs++)
		cache_idle_del(c, o);
	if (o && o->refs == 1)
		o->os = obj->os;
	pthread_mutex_unlock(&c->lock);
	*op = o;
}

void cache_obj_put(struct cache_obj *o)
{
	struct cache *c;

	if (!o)
		return;
	c = o->c;
	pthread_mutex_lock(&c->lock);
	if (--o->refs == 0) {
		/* Idle: nobody is waiting for landed fills. */
		pthread_mutex_lock(&o->lock);
		cache_lands_drop(o);
		pthread_mutex_unlock(&o->lock);
	}
	if (o->refs == 0 && o->inuse_locked) {
		/* Idle: let evictors in. */
		cache_ofd_unlock(o->fd, CACHE_LOCK_INUSE);
		o->inuse_locked = false;
	}
	if (o->refs == 0)
		cache_idle_add(c, o);
	cache_trim_idle(c, false);
	pthread_mutex_unlock(&c->lock);
}

static int cache_obj_write_atime(struct cache_obj *o, uint64_t t)
{
	struct cache_object obj = { .dataset = o->dataset,
				    .key = o->key,
				    .etag = o->etag,
				    .size = o->size };

	/* In the file's own format (a one-file object read as it is). */
	return cache_hdr_write_atime(o->c, &obj, o->version, o->hdr_flags,
				     o->rec_off, o->mfd, t);
}

/*
 * Allocate o's room in its data file in one piece before a caller fetches
 * it whole (CACHE_READ_WHOLE: stager stage). Its fills land in parallel
 * and out of order (the reader's and the readahead workers'), and a 1 GiB
 * object was 40 extents interleaved within ~100 MiB (filefrag), read back
 * slower than its source. FALLOC_FL_KEEP_SIZE: the file's size stays what
 * its blocks make it (passthrough reads the file to its end). Only for a
 * version 3 object larger than one fill batch, with nothing on disk yet,
 * and while the cache holds twice its size free below its high mark: the
 * room is counted as its blocks land (and from the file's blocks at the
 * next scan, should the fetch stop halfway), so the count may lag the disk
 * by at most the objects being staged. Best effort: a filesystem without
 * fallocate fills it as before.
 */
void cache_obj_prealloc(struct cache_obj *o)
{
	struct cache *c = o->c;
	uint64_t used = atomic_load(&c->used);
	struct stat st;
	bool tried;

	if (o->version != CACHE_OBJ_VERSION || o->data_off ||
	    o->nblocks <= c->batch || used + 2 * o->size > c->high)
		return;
	pthread_mutex_lock(&o->lock);
	tried = o->prealloc_tried;
	o->prealloc_tried = true;
	pthread_mutex_unlock(&o->lock);
	if (tried || fstat(o->fd, &st) || st.st_blocks)
		return;
	if (fallocate(o->fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)o->size))
		log_debug("cache: %s/%s: room not allocated in one piece: %s",
			  o->dataset, o->key, strerror(errno));
}

/* Record an access, at most once per CACHE_ATIME_STEP seconds per object. */
void cache_obj_touch(struct cache_obj *o)
{
	time_t now = time(NULL);
	uint64_t t = (uint64_t)now;
	bool write = false;
	int ret;

	pthread_mutex_lock(&o->lock);
	if (now - o->atime >= CACHE_ATIME_STEP) {
		o->atime = now;
		write = true;
	}
	pthread_mutex_unlock(&o->lock);
	if (write && (ret = cache_obj_write_atime(o, t)))
		log_debug("cache: %s/%s: access time not recorded: %s",
			  o->dataset, o->key, strerror(-ret));
}

bool cache_verified(struct cache_obj *o, uint64_t b)
{
	return o->verified && (o->verified[b / 8] & (1u << (b % 8)));
}

void cache_set_verified(struct cache_obj *o, uint64_t b, bool on)
{
	if (!on)
		o->pt_whole = false; /* the next passthrough open reads them */
	if (!o->verified)
		return;
	if (on)
		o->verified[b / 8] |= (uint8_t)(1u << (b % 8));
	else
		o->verified[b / 8] &= (uint8_t) ~(1u << (b % 8));
}

bool cache_claimed(struct cache_obj *o, uint64_t b)
{
	for (size_t i = 0; i < o->nclaims; i++)
		if (o->claims[i] == b)
			return true;
	return false;
}

/* o->lock held. */
int cache_claim_add(struct cache_obj *o, uint64_t b)
{
	if (GROW_ONE(o->claims, o->nclaims, o->claims_cap, 16))
		return -ENOMEM;
	o->claims[o->nclaims++] = b;
	return 0;
}

/* Forget this process's claim on b and wake its waiters. */
void cache_claim_drop(struct cache_obj *o, uint64_t b)
{
	pthread_mutex_lock(&o->lock);
	for (size_t i = 0; i < o->nclaims; i++)
		if (o->claims[i] == b) {
			o->claims[i] = o->claims[--o->nclaims];
			break;
		}
	pthread_cond_broadcast(&o->cond);
	pthread_mutex_unlock(&o->lock);
}

/*
 * Claim block b for filling: in this process (o->claims), then across
 * processes (OFD lock). wait: block until it is ours; else -EAGAIN if taken.
 * Never called with wait while the thread holds another claim.
 */
int cache_claim(struct cache_obj *o, uint64_t b, bool wait)
{
	int ret;

	pthread_mutex_lock(&o->lock);
	while (cache_claimed(o, b)) {
		if (!wait) {
			pthread_mutex_unlock(&o->lock);
			return -EAGAIN;
		}
		pthread_cond_wait(&o->cond, &o->lock);
	}
	ret = cache_claim_add(o, b);
	pthread_mutex_unlock(&o->lock);
	if (ret)
		return ret;
	ret = cache_ofd_lock(o->c, o->fd, CACHE_LOCK_BLOCK + (off_t)b, F_WRLCK,
			     wait, o->dataset, o->key, o->name);
	if (ret)
		cache_claim_drop(o, b);
	return ret;
}

void cache_unclaim(struct cache_obj *o, uint64_t b)
{
	cache_ofd_unlock(o->fd, CACHE_LOCK_BLOCK + (off_t)b);
	cache_claim_drop(o, b);
}
