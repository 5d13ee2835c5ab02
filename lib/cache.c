// SPDX-License-Identifier: MIT
/*
 * cache: the node-local block cache (docs/cache.md has the full story).
 *
 * On disk (cache.dir):
 *   dstage-cache            "dstage-cache 1\nblock_size N\n", written once
 *   objects/<h2>/<h30>      one file per object version: h = XXH3-128 of
 *                           (dataset, key, ETag, size) in hex
 * An object file holds a header (magic, block size, object size, dataset, key,
 * ETag, header checksum, access time), one 16-byte record per block (XXH3 of
 * the block, a magic and a check word: all zeros = absent), then the blocks
 * at data_off + b * block_size.
 *
 * Block state machine (per block, on disk):
 *
 *   ABSENT --claim(lock)--> FILLING --data written, fdatasync--> WRITTEN
 *     ^                        |                                    |
 *     |  (claim released by    |                    record written  |
 *     |   kill: still ABSENT)  v                    (no sync)       v
 *     +------------------- (fetch failed)            PRESENT <------+
 *   PRESENT --checksum mismatch on read--> FILLING (re-fetched, counted)
 *   any --eviction (file unlinked)--> gone
 *
 * A block is PRESENT iff its record is valid (magic, check word) and, since
 * the record is written only after the data is durable, its data is then
 * durable too; the data checksum is still verified on every read from disk.
 *
 * Locks, in the order they may be taken:
 *   1. c->evict_lock (mutex): one reservation/eviction at a time per process.
 *   2. c->lock (mutex): the open-object table (c->objs, o->refs, o->link,
 *      c->nobjs), the job queue (c->jobs, c->njobs, c->stopping) and
 *      c->jobs_cv; the dataset table (c->ds) and the catalog connection
 *      (c->cat). Never held across I/O other than one catalog lookup.
 *   3. o->lock (mutex, per open object): o->claims, o->verified, the
 *      sequential-access state (seq_next, window, ra_next), o->atime and
 *      the landed fills (o->lands, their refs and left). Never held across
 *      I/O or while waiting for another lock.
 *   4. c->buf_lock (mutex, a leaf): the idle fill buffers.
 * OFD byte-range locks on each object file (released by the kernel when a
 * process dies):
 *   - byte CACHE_LOCK_INUSE: shared by every process using the file, taken
 *     exclusively (non-blocking) by an evictor before it unlinks the file.
 *   - byte CACHE_LOCK_BLOCK + b: exclusive while block b is being filled.
 *     Within a process all threads share one open file description, so a
 *     thread first claims b in o->claims (waiting on o->cond), then takes the
 *     OFD lock. A thread blocks on an OFD lock (F_OFD_SETLKW) only while it
 *     holds no other block lock; extra blocks of a batch are only tried
 *     (F_OFD_SETLK): no deadlock across processes.
 *
 * Landed fills: a fill keeps its buffer, after its blocks became PRESENT,
 * for the readers that waited on them (struct cache_land); they copy from
 * memory instead of reading the file back. Only PRESENT, verified bytes
 * land, so a landed fill is just a faster copy of what the file holds.
 *
 * Memory: per open object (at most CACHE_MAX_OPEN idle ones are kept) a
 * bitmap of verified blocks, capped at CACHE_VERIFIED_MAX_BITS; fill buffers
 * of CACHE_BATCH_BYTES per filling thread, CACHE_FREE_BUFS of them kept
 * when idle; landed fills, at most CACHE_LAND_BYTES, only for objects in
 * use. Nothing is kept per block of objects nobody reads.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "dstage/cache.h"
#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "uring.h"

#define CACHE_ID_FILE "dstage-cache"
#define CACHE_OBJ_MAGIC "DSTGOBJ1"
#define CACHE_OBJ_VERSION 1
#define CACHE_REC_MAGIC 0x4b4c4231u /* "1BLK" */
#define CACHE_HDR_FIXED 64
#define CACHE_ALIGN 4096
#define CACHE_HUGE_PAGE (2u << 20) /* fill buffers: see cache_buf_get */
#define CACHE_LOCK_INUSE (1LL << 62)
#define CACHE_LOCK_BLOCK (CACHE_LOCK_INUSE + 1)
#define CACHE_MAX_OPEN 64 /* idle open objects kept */
#define CACHE_VERIFIED_MAX_BITS (1u << 22)
#define CACHE_BATCH_BYTES (16u << 20)
#define CACHE_MAX_BATCH 64
#define CACHE_POOL_THREADS 4
#define CACHE_FREE_BUFS CACHE_POOL_THREADS /* idle fill buffers kept */
#define CACHE_LAND_MAX 8 /* landed fills kept per open object */
#define CACHE_LAND_BYTES (256u << 20) /* landed fills kept in all */
#define CACHE_DFD_UNSET (-2)
#define CACHE_DROP_SLACK (2u << 20) /* largest page-cache folio expected */
#define CACHE_DROP_CHUNK (16u << 20) /* drop-behind granularity */
#define CACHE_MAX_JOBS 64
#define CACHE_POLICY_TTL 2 /* seconds a dataset's policy is trusted */
#define CACHE_ATIME_STEP 1 /* access time granularity, seconds */
#define CACHE_EVICT_HEAP 1024 /* victims chosen per directory scan */

/* On-disk object header (host byte order: caches are node-local). */
struct cache_hdr {
	char magic[8];
	uint32_t version;
	uint32_t block_size;
	uint64_t size;
	uint64_t data_off;
	uint32_t ds_len, key_len, etag_len, pad;
	uint64_t hdr_sum; /* XXH3 of bytes [0, 48) and the strings */
	uint64_t atime; /* last access, seconds; not in hdr_sum */
};

/* On-disk block record. */
struct cache_rec {
	uint64_t sum; /* XXH3_64bits of the block's bytes */
	uint32_t magic; /* CACHE_REC_MAGIC */
	uint32_t check; /* XXH3 of the 12 bytes above, seeded with b */
};

_Static_assert(sizeof(struct cache_hdr) == CACHE_HDR_FIXED, "header size");
_Static_assert(sizeof(struct cache_rec) == 16, "record size");

/* A dataset's policy (from the catalog) and usage (from scans and fills). */
struct cache_ds {
	struct cache_ds *next;
	char *name;
	bool pinned;
	uint64_t quota;
	int priority;
	time_t loaded; /* when the policy was read; 0: never */
	uint64_t used; /* bytes, estimate */
	uint64_t pf_gen; /* generation of the current prefetch */
};

/* An object version open in this process. */
struct cache_obj {
	struct cache *c;
	struct cache_obj *next; /* in c->objs; c->lock */
	unsigned refs; /* c->lock */
	uint64_t used_at; /* c->lock: for closing idle entries */
	char name[33]; /* hex hash */
	char *dataset, *key, *etag;
	struct objstore *os;
	uint64_t size, nblocks, rec_off, data_off;
	int fd;
	int dfd; /* o->lock: O_DIRECT writer, CACHE_DFD_UNSET or -1 (none) */
	bool no_direct; /* o->lock: direct writes were refused */
	bool inuse_locked; /* holds the shared CACHE_LOCK_INUSE; c->lock */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* o->lock: */
	uint64_t *claims; /* blocks being filled by threads of this process */
	size_t nclaims, claims_cap;
	uint8_t *verified; /* NULL when nblocks > CACHE_VERIFIED_MAX_BITS */
	uint64_t seq_next; /* offset right after the last read */
	uint64_t window; /* readahead window, blocks */
	uint64_t ra_next; /* first block not yet handed to readahead */
	time_t atime;
	struct cache_land *lands; /* newest first */
	unsigned nlands;
};

/*
 * A landed fill: the bytes of blocks [b0, b0 + n) of an object, kept in
 * memory after the fill made them PRESENT so that the readers that waited
 * for them copy from here instead of reading the file back. Its blocks are
 * verified (hashed as they arrived, or read and checked). It leaves
 * o->lands when every byte was copied out once, when newer fills push it
 * out (CACHE_LAND_MAX per object, CACHE_LAND_BYTES in all) or when the
 * object goes idle; it is freed when its last reader is done.
 */
struct cache_land {
	struct cache_land *next; /* in o->lands; o->lock */
	unsigned refs; /* o->lock: 1 while listed, +1 per reader copying */
	uint64_t b0, n;
	uint64_t left; /* o->lock: bytes not yet copied out */
	char *buf;
};

enum cache_job_kind { CACHE_JOB_READAHEAD, CACHE_JOB_PREFETCH };

struct cache_job {
	struct cache_job *next;
	enum cache_job_kind kind;
	struct cache_obj *o; /* readahead: a reference */
	uint64_t b0, n; /* readahead: blocks */
	/* prefetch: copies */
	struct cache_object *objs;
	size_t nobjs;
	uint64_t window;
	char *dataset;
	uint64_t gen;
};

struct cache {
	const struct dstage_config *cfg;
	uint32_t bs;
	int dir_fd, objects_fd;
	uint64_t high, low; /* bytes */
	unsigned batch; /* blocks per fill */

	pthread_mutex_t evict_lock;
	pthread_mutex_t lock;
	pthread_cond_t jobs_cv;
	struct cache_obj *objs;
	size_t nobjs;
	uint64_t tick;
	struct cache_ds *ds;
	struct catalog *cat; /* NULL: no policy */
	struct cache_job *jobs, **jobs_tail;
	size_t njobs;
	bool stopping;
	pthread_t pool[CACHE_POOL_THREADS];
	unsigned npool;

	/* c->buf_lock (a leaf: nothing is taken while holding it): */
	pthread_mutex_t buf_lock;
	void *free_bufs[CACHE_FREE_BUFS]; /* fill buffers, c->batch blocks */
	unsigned nfree_bufs;
	_Atomic uint64_t land_bytes; /* bytes held by landed fills */
	_Atomic uint64_t land_peak, lands_refused, lands_displaced;
	bool drop_behind; /* set before use: cache_set_drop_behind */
	bool no_direct; /* DSTAGE_NO_DIRECT=1: fills write through o->fd */

	_Atomic uint64_t used, pinned;
	/* Reserved but not yet on disk: a scan (which counts what is on
	 * disk) adds it back, or a fill in flight would be forgotten. */
	_Atomic uint64_t inflight;
	_Atomic uint64_t hits, misses, bytes_from_cache, bytes_from_source;
	_Atomic uint64_t fetches, checksum_failures, evictions, streamed;
};

static void cache_count(_Atomic uint64_t *ctr, uint64_t v)
{
	atomic_fetch_add_explicit(ctr, v, memory_order_relaxed);
}

/* Raise a high-water mark to v. */
static void cache_count_max(_Atomic uint64_t *ctr, uint64_t v)
{
	uint64_t cur = atomic_load_explicit(ctr, memory_order_relaxed);

	while (v > cur && !atomic_compare_exchange_weak(ctr, &cur, v))
		;
}

static uint64_t cache_roundup(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static uint64_t cache_block_len(const struct cache_obj *o, uint64_t b)
{
	uint64_t bs = o->c->bs;

	return b + 1 < o->nblocks ? bs : o->size - b * bs;
}

/* Disk bytes a block takes, for accounting. */
static uint64_t cache_block_cost(const struct cache_obj *o, uint64_t b)
{
	return cache_roundup(cache_block_len(o, b), CACHE_ALIGN);
}

static const char *cache_ds_or(const char *ds)
{
	return ds ? ds : "";
}

/* ---- OFD locks ---- */

static int cache_ofd_lock(int fd, off_t byte, short type, bool wait)
{
	struct flock fl = {
		.l_type = type,
		.l_whence = SEEK_SET,
		.l_start = byte,
		.l_len = 1,
	};

	for (;;) {
		if (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0)
			return 0;
		if (errno == EINTR)
			continue;
		if (errno == EACCES)
			return -EAGAIN;
		return -errno;
	}
}

static void cache_ofd_unlock(int fd, off_t byte)
{
	cache_ofd_lock(fd, byte, F_UNLCK, false);
}

/* ---- records ---- */

static uint32_t cache_rec_check(const struct cache_rec *r, uint64_t b)
{
	return (uint32_t)XXH3_64bits_withSeed(r, 12, b);
}

static bool cache_rec_valid(const struct cache_rec *r, uint64_t b)
{
	return r->magic == CACHE_REC_MAGIC && r->check == cache_rec_check(r, b);
}

static int cache_pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	/* Short files read as zeros (holes past EOF): records never written. */
	while (done < len) {
		ssize_t r = pread(fd, (char *)buf + done, len - done,
				  (off_t)(off + done));

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0) {
			memset((char *)buf + done, 0, len - done);
			break;
		}
		done += (size_t)r;
	}
	return 0;
}

/* Read the records of blocks [b0, b0 + n). */
static int cache_read_recs(struct cache_obj *o, uint64_t b0, uint64_t n,
			   struct cache_rec *recs)
{
	return cache_pread_all(o->fd, recs, n * sizeof(*recs),
			       o->rec_off + b0 * sizeof(*recs));
}

static bool cache_verified(struct cache_obj *o, uint64_t b)
{
	return o->verified && (o->verified[b / 8] & (1u << (b % 8)));
}

static void cache_set_verified(struct cache_obj *o, uint64_t b, bool on)
{
	if (!o->verified)
		return;
	if (on)
		o->verified[b / 8] |= (uint8_t)(1u << (b % 8));
	else
		o->verified[b / 8] &= (uint8_t) ~(1u << (b % 8));
}

/* ---- datasets: policy from the catalog, usage estimates ---- */

/* c->lock held. Returns the entry (created if needed) or NULL (ENOMEM). */
static struct cache_ds *cache_ds_get(struct cache *c, const char *name)
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
	if (c->cat && time(NULL) - d->loaded >= CACHE_POLICY_TTL) {
		struct catalog_dataset cd;
		int ret = catalog_dataset_get(c->cat, name, &cd);

		if (ret == 0) {
			d->pinned = cd.pinned;
			d->quota = cd.quota;
			d->priority = cd.priority;
			catalog_dataset_release(&cd);
		} else if (ret == -ENOENT) {
			d->pinned = false;
			d->quota = 0;
			d->priority = 0;
		}
		/* Other errors: keep the last known policy. */
		d->loaded = time(NULL);
	}
	return d;
}

/* A copy of the policy of a dataset. */
struct cache_policy {
	bool pinned;
	uint64_t quota;
	int priority;
	uint64_t used;
};

static void cache_policy_of(struct cache *c, const char *name,
			    struct cache_policy *p)
{
	struct cache_ds *d;

	memset(p, 0, sizeof(*p));
	pthread_mutex_lock(&c->lock);
	d = cache_ds_get(c, name);
	if (d) {
		p->pinned = d->pinned;
		p->quota = d->quota;
		p->priority = d->priority;
		p->used = d->used;
	}
	pthread_mutex_unlock(&c->lock);
}

static void cache_ds_add_used(struct cache *c, const char *name, int64_t delta)
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

static void cache_sub_used(struct cache *c, uint64_t v)
{
	uint64_t cur = atomic_load(&c->used);

	while (!atomic_compare_exchange_weak(&c->used, &cur,
					     cur > v ? cur - v : 0))
		;
}

/* ---- object files ---- */

static void cache_obj_name(const struct cache_object *obj, char out[33])
{
	XXH3_state_t st;
	XXH128_hash_t h;
	uint64_t size = obj->size;

	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, cache_ds_or(obj->dataset),
			    strlen(cache_ds_or(obj->dataset)) + 1);
	XXH3_128bits_update(&st, obj->key, strlen(obj->key) + 1);
	XXH3_128bits_update(&st, obj->etag ? obj->etag : "",
			    strlen(obj->etag ? obj->etag : "") + 1);
	XXH3_128bits_update(&st, &size, sizeof(size));
	h = XXH3_128bits_digest(&st);
	snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64,
		 (unsigned long long)h.low64);
}

static uint64_t cache_hdr_sum(const struct cache_hdr *h, const char *strs,
			      size_t len)
{
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, h, offsetof(struct cache_hdr, hdr_sum));
	XXH3_64bits_update(&st, strs, len);
	return XXH3_64bits_digest(&st);
}

/* Build the header of obj; *buf (hdr + strings, *len bytes) is malloc'ed. */
static int cache_hdr_build(struct cache *c, const struct cache_object *obj,
			   char **buf, size_t *len)
{
	const char *ds = cache_ds_or(obj->dataset);
	const char *etag = obj->etag ? obj->etag : "";
	size_t dl = strlen(ds), kl = strlen(obj->key), el = strlen(etag);
	uint64_t nblocks = (obj->size + c->bs - 1) / c->bs;
	uint64_t rec_off =
		cache_roundup(CACHE_HDR_FIXED + dl + kl + el, CACHE_ALIGN);
	struct cache_hdr *h;
	char *p;

	*len = CACHE_HDR_FIXED + dl + kl + el;
	p = calloc(1, *len);
	if (!p)
		return -ENOMEM;
	h = (struct cache_hdr *)p;
	memcpy(h->magic, CACHE_OBJ_MAGIC, 8);
	h->version = CACHE_OBJ_VERSION;
	h->block_size = c->bs;
	h->size = obj->size;
	h->data_off = cache_roundup(
		rec_off + nblocks * sizeof(struct cache_rec), CACHE_ALIGN);
	h->ds_len = (uint32_t)dl;
	h->key_len = (uint32_t)kl;
	h->etag_len = (uint32_t)el;
	memcpy(p + CACHE_HDR_FIXED, ds, dl);
	memcpy(p + CACHE_HDR_FIXED + dl, obj->key, kl);
	memcpy(p + CACHE_HDR_FIXED + dl + kl, etag, el);
	h->hdr_sum = cache_hdr_sum(h, p + CACHE_HDR_FIXED, dl + kl + el);
	h->atime = (uint64_t)time(NULL);
	*buf = p;
	return 0;
}

/* Write a new object file with O_TMPFILE and link it in; -EEXIST when
 * another thread or process won the race (the caller opens that one). */
static int cache_reserve(struct cache *c, const char *ds, uint64_t bytes);
static void cache_unreserve(struct cache *c, const char *ds, uint64_t bytes);
static void cache_landed_bytes(struct cache *c, uint64_t bytes);

/*
 * Create obj's file. Its header and first page of records count against the
 * capacity like blocks do (reserved first): -ENOSPC when there is no room,
 * and the caller reads uncached.
 */
static int cache_obj_create(struct cache *c, const struct cache_object *obj,
			    const char *name)
{
	char sub[3] = { name[0], name[1], 0 }, proc[64];
	const char *ds = cache_ds_or(obj->dataset);
	char *hdr = NULL;
	uint64_t cost = 0;
	size_t len;
	int dfd = -1, fd = -1, ret;

	if (mkdirat(c->objects_fd, sub, 0755) && errno != EEXIST)
		return -errno;
	dfd = openat(c->objects_fd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	ret = cache_hdr_build(c, obj, &hdr, &len);
	if (ret)
		goto out;
	ret = cache_reserve(c, ds,
			    cache_roundup(len, CACHE_ALIGN) + CACHE_ALIGN);
	if (ret)
		goto out;
	cost = cache_roundup(len, CACHE_ALIGN) + CACHE_ALIGN;
	fd = openat(dfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	errno = 0;
	if (pwrite(fd, hdr, len, 0) != (ssize_t)len) {
		ret = errno ? -errno : -ENOSPC;
		goto out;
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (linkat(AT_FDCWD, proc, dfd, name + 2, AT_SYMLINK_FOLLOW))
		ret = -errno;
out:
	if (ret && cost) /* not ours after all (EEXIST: another one's) */
		cache_unreserve(c, ds, cost);
	else if (cost)
		cache_landed_bytes(c, cost);
	if (fd >= 0)
		close(fd);
	if (dfd >= 0)
		close(dfd);
	free(hdr);
	return ret;
}

/* Check that the header of the open file fd belongs to obj. Returns 0,
 * -EUCLEAN (corrupt, torn or another object: a hash collision). */
static int cache_hdr_check(struct cache *c, int fd,
			   const struct cache_object *obj, uint64_t *data_off,
			   uint64_t *rec_off)
{
	char *want = NULL, *got = NULL;
	size_t len;
	int ret = cache_hdr_build(c, obj, &want, &len);

	if (ret)
		return ret;
	got = malloc(len);
	if (!got) {
		ret = -ENOMEM;
		goto out;
	}
	ret = cache_pread_all(fd, got, len, 0);
	if (ret)
		goto out;
	/* Everything but the access time must match exactly. */
	((struct cache_hdr *)got)->atime = ((struct cache_hdr *)want)->atime;
	if (memcmp(got, want, len)) {
		ret = -EUCLEAN;
		goto out;
	}
	*data_off = ((struct cache_hdr *)want)->data_off;
	*rec_off = cache_roundup(len, CACHE_ALIGN);
out:
	free(want);
	free(got);
	return ret;
}

static void cache_lands_drop(struct cache_obj *o);

static void cache_obj_free(struct cache_obj *o)
{
	if (!o)
		return;
	pthread_mutex_lock(&o->lock);
	cache_lands_drop(o);
	pthread_mutex_unlock(&o->lock);
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

/* Open (creating if needed) the file of obj, holding the shared in-use lock
 * on a file that is still linked. -EUCLEAN: the file is not usable (corrupt
 * header nobody could remove, or a hash collision): stream through. */
static int cache_obj_open_file(struct cache *c, const struct cache_object *obj,
			       const char *name, bool create, int *fdp,
			       uint64_t *data_off, uint64_t *rec_off)
{
	char path[40];
	int fd = -1, ret = 0;

	snprintf(path, sizeof(path), "%.2s/%s", name, name + 2);
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
		ret = cache_ofd_lock(fd, CACHE_LOCK_INUSE, F_RDLCK, true);
		if (ret)
			goto fail;
		if (fstat(fd, &st)) {
			ret = -errno;
			goto fail;
		}
		if (st.st_nlink == 0) { /* evicted meanwhile */
			close(fd);
			fd = -1;
			continue;
		}
		ret = cache_hdr_check(c, fd, obj, data_off, rec_off);
		if (ret == 0) {
			*fdp = fd;
			return 0;
		}
		if (ret != -EUCLEAN)
			goto fail;
		/* A bad header (torn by a power loss, or a collision): remove
		 * the file if nobody else uses it, else stream through. */
		if (cache_ofd_lock(fd, CACHE_LOCK_INUSE, F_WRLCK, false) == 0) {
			log_warn("cache: %s/%s: object file %s has a bad "
				 "header, removed",
				 cache_ds_or(obj->dataset), obj->key, path);
			unlinkat(c->objects_fd, path, 0);
			close(fd);
			fd = -1;
			continue;
		}
		log_warn("cache: %s/%s: object file %s has a bad header and "
			 "is in use: reading uncached",
			 cache_ds_or(obj->dataset), obj->key, path);
		goto fail;
	}
	return -EUCLEAN;
fail:
	close(fd);
	return ret;
}

/* c->lock held: close idle entries beyond CACHE_MAX_OPEN (all if all). */
static void cache_trim_idle(struct cache *c, bool all)
{
	while (c->nobjs > (all ? 0 : CACHE_MAX_OPEN)) {
		struct cache_obj **pp, **victim = NULL;

		for (pp = &c->objs; *pp; pp = &(*pp)->next)
			if (!(*pp)->refs &&
			    (!victim || (*pp)->used_at < (*victim)->used_at))
				victim = pp;
		if (!victim)
			return;
		struct cache_obj *o = *victim;

		*victim = o->next;
		c->nobjs--;
		cache_obj_free(o);
	}
}

/*
 * Get a referenced open object for obj. *op is NULL (and 0 returned) when the
 * object cannot be cached (bad file in use: the caller streams), or when it
 * has no file and create is false.
 */
static int cache_obj_get(struct cache *c, const struct cache_object *obj,
			 bool create, struct cache_obj **op)
{
	char name[33];
	struct cache_obj *o, *other;
	int ret;

	*op = NULL;
	cache_obj_name(obj, name);
	pthread_mutex_lock(&c->lock);
	for (o = c->objs; o; o = o->next)
		if (!strcmp(o->name, name))
			break;
	if (o) {
		o->refs++;
		o->used_at = ++c->tick;
		if (o->refs == 1 && !o->inuse_locked) {
			/* Idle entries hold no in-use lock: re-take it and
			 * make sure the file was not evicted meanwhile. */
			struct stat st;

			ret = cache_ofd_lock(o->fd, CACHE_LOCK_INUSE, F_RDLCK,
					     true);
			if (ret == 0 && fstat(o->fd, &st) == 0 &&
			    st.st_nlink > 0) {
				o->inuse_locked = true;
			} else {
				/* Evicted: forget this entry, open afresh. */
				struct cache_obj **pp;

				if (ret == 0)
					cache_ofd_unlock(o->fd,
							 CACHE_LOCK_INUSE);
				for (pp = &c->objs; *pp != o; pp = &(*pp)->next)
					;
				*pp = o->next;
				c->nobjs--;
				cache_obj_free(o);
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
	o->fd = -1;
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
	ret = cache_obj_open_file(c, obj, name, create, &o->fd, &o->data_off,
				  &o->rec_off);
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
	for (other = c->objs; other; other = other->next)
		if (!strcmp(other->name, name))
			break;
	if (other) {
		/* Another thread opened it first: use that one. Our
		 * descriptor's shared lock goes away with it. */
		pthread_mutex_unlock(&c->lock);
		cache_obj_free(o);
		return cache_obj_get(c, obj, create, op);
	}
	o->used_at = ++c->tick;
	o->next = c->objs;
	c->objs = o;
	c->nobjs++;
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

static void cache_obj_put(struct cache_obj *o)
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
	cache_trim_idle(c, false);
	pthread_mutex_unlock(&c->lock);
}

/* Record an access, at most once per CACHE_ATIME_STEP seconds per object. */
static void cache_obj_touch(struct cache_obj *o)
{
	time_t now = time(NULL);
	uint64_t t = (uint64_t)now;
	bool write = false;

	pthread_mutex_lock(&o->lock);
	if (now - o->atime >= CACHE_ATIME_STEP) {
		o->atime = now;
		write = true;
	}
	pthread_mutex_unlock(&o->lock);
	if (write &&
	    pwrite(o->fd, &t, sizeof(t), offsetof(struct cache_hdr, atime)) < 0)
		log_debug("cache: %s/%s: access time not recorded: %s",
			  o->dataset, o->key, strerror(errno));
}

/* ---- claims: who fills which block ---- */

static bool cache_claimed(struct cache_obj *o, uint64_t b)
{
	for (size_t i = 0; i < o->nclaims; i++)
		if (o->claims[i] == b)
			return true;
	return false;
}

/* o->lock held. */
static int cache_claim_add(struct cache_obj *o, uint64_t b)
{
	if (o->nclaims == o->claims_cap) {
		size_t cap = o->claims_cap ? o->claims_cap * 2 : 16;
		uint64_t *n = realloc(o->claims, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		o->claims = n;
		o->claims_cap = cap;
	}
	o->claims[o->nclaims++] = b;
	return 0;
}

/* Forget this process's claim on b and wake its waiters. */
static void cache_claim_drop(struct cache_obj *o, uint64_t b)
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
static int cache_claim(struct cache_obj *o, uint64_t b, bool wait)
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
	ret = cache_ofd_lock(o->fd, CACHE_LOCK_BLOCK + (off_t)b, F_WRLCK, wait);
	if (ret)
		cache_claim_drop(o, b);
	return ret;
}

static void cache_unclaim(struct cache_obj *o, uint64_t b)
{
	cache_ofd_unlock(o->fd, CACHE_LOCK_BLOCK + (off_t)b);
	cache_claim_drop(o, b);
}

/* ---- space ---- */

static int cache_evict_bytes(struct cache *c, const char *only_ds,
			     uint64_t need, uint64_t *freed);

/*
 * Make room for bytes more of dataset ds. Returns 0 (accounted) or -ENOSPC:
 * the blocks must not be cached (the caller streams them).
 */
static int cache_reserve(struct cache *c, const char *ds, uint64_t bytes)
{
	const struct dstage_config *cfg = c->cfg;
	struct cache_policy p;
	uint64_t used, freed;
	int ret = 0;

	pthread_mutex_lock(&c->evict_lock);
	cache_policy_of(c, ds, &p);
	if (p.quota && p.used + bytes > p.quota) {
		/* Over its quota: the dataset makes room from itself. */
		uint64_t need = p.used + bytes - p.quota;

		cache_evict_bytes(c, ds, need, &freed);
		cache_policy_of(c, ds, &p);
		if (p.used + bytes > p.quota) {
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
	if (used + bytes > cfg->cache_size) {
		ret = -ENOSPC;
		goto out;
	}
	atomic_fetch_add(&c->used, bytes);
	atomic_fetch_add(&c->inflight, bytes);
	if (p.pinned)
		atomic_fetch_add(&c->pinned, bytes);
	cache_ds_add_used(c, ds, (int64_t)bytes);
out:
	pthread_mutex_unlock(&c->evict_lock);
	return ret;
}

/* Reserved bytes that are now on disk (a scan counts them from there). */
static void cache_landed_bytes(struct cache *c, uint64_t bytes)
{
	uint64_t cur = atomic_load(&c->inflight);

	while (!atomic_compare_exchange_weak(&c->inflight, &cur,
					     cur > bytes ? cur - bytes : 0))
		;
}

static void cache_unreserve(struct cache *c, const char *ds, uint64_t bytes)
{
	struct cache_policy p;

	cache_policy_of(c, ds, &p);
	cache_sub_used(c, bytes);
	cache_landed_bytes(c, bytes); /* no longer in flight either */
	if (p.pinned) {
		uint64_t cur = atomic_load(&c->pinned);

		while (!atomic_compare_exchange_weak(
			&c->pinned, &cur, cur > bytes ? cur - bytes : 0))
			;
	}
	cache_ds_add_used(c, ds, -(int64_t)bytes);
}

/* ---- filling ---- */

/* Where a read wants its bytes (len 0: nowhere). */
struct cache_out {
	uint64_t off;
	size_t len;
	char *buf;
};

/* Copy the part of block b (data at p) that the read wants. */
static void cache_copy_out(struct cache_obj *o, uint64_t b, const char *p,
			   const struct cache_out *out)
{
	uint64_t bs = o->c->bs, bstart = b * bs;
	uint64_t bend = bstart + cache_block_len(o, b);
	uint64_t s = out->off > bstart ? out->off : bstart;
	uint64_t e = out->off + out->len < bend ? out->off + out->len : bend;

	if (!out->len || s >= e)
		return;
	memcpy(out->buf + (s - out->off), p + (s - bstart), e - s);
}

static void cache_log_corrupt(struct cache_obj *o, uint64_t b)
{
	cache_count(&o->c->checksum_failures, 1);
	log_warn("cache: %s/%s: block %" PRIu64 " failed its checksum "
		 "(file %.2s/%s): re-fetching",
		 o->dataset, o->key, b, o->name, o->name + 2);
}

static int cache_fetch_error(struct cache_obj *o, uint64_t b, int ret)
{
	if (ret == -ESTALE) {
		log_error("cache: %s/%s: the source object changed under the "
			  "snapshot (expected ETag %s): EIO",
			  o->dataset, o->key, o->etag);
		return -EIO;
	}
	log_error("cache: %s/%s: fetching block %" PRIu64 " failed: %s",
		  o->dataset, o->key, b, strerror(-ret));
	return ret;
}

/* ---- fill buffers and landed fills ---- */

/*
 * A buffer for c->batch blocks, NULL when out of memory. A new one is
 * aligned for transparent huge pages and asked for them: its first touch
 * (curl's copy into it) then faults 2 MiB at a time, not 4 KiB: a cold
 * 2 GiB read through dstagefs took ~110,000 page faults before, a few
 * thousand after, and about 10% less CPU (bench/cold_cpu.sh, docs/cache.md).
 * Where the kernel has none to give, it is an ordinary buffer.
 */
static char *cache_buf_get(struct cache *c)
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

/* Keep p for the next fill (reused pages need no faulting in). Accepts NULL. */
static void cache_buf_put(struct cache *c, char *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&c->buf_lock);
	if (c->nfree_bufs < CACHE_FREE_BUFS) {
		c->free_bufs[c->nfree_bufs++] = p;
		p = NULL;
	}
	pthread_mutex_unlock(&c->buf_lock);
	free(p);
}

/*
 * Drop-behind on descriptor fd, where the object's bytes start at data_off:
 * the reader has object bytes [off, off + len) of an object of size bytes.
 *
 * POSIX_FADV_DONTNEED is dear whatever its range (it drains every CPU's
 * page lists first): once per FUSE request it cost a warm read 40% of its
 * speed. So a stream's pages go a CACHE_DROP_CHUNK at a time, when a read
 * crosses a chunk boundary, one chunk behind it (requests still in flight
 * keep theirs), and the rest when a read reaches the object's end. Pages of
 * reads that never cross a boundary (random access) stay, reclaimable like
 * any page cache. The kernel only drops folios wholly inside the range, and
 * a file's folios can be large (up to CACHE_DROP_SLACK, naturally aligned),
 * so the range reaches back that far; a folio straddling its end goes with
 * the next one. One straddling the start of the data stays: the header and
 * records before it are read all the time.
 */
static void cache_drop_range(const struct cache *c, int fd, uint64_t data_off,
			     uint64_t size, uint64_t off, uint64_t len)
{
	uint64_t end = off + len, s, e;

	if (!c->drop_behind || !len)
		return;
	if (end >= size) { /* the object's end: its last page is whole */
		e = cache_roundup(size, CACHE_ALIGN);
		s = off / CACHE_DROP_CHUNK * CACHE_DROP_CHUNK;
		s = s > CACHE_DROP_CHUNK ? s - CACHE_DROP_CHUNK : 0;
	} else if (off / CACHE_DROP_CHUNK != end / CACHE_DROP_CHUNK &&
		   end / CACHE_DROP_CHUNK >= 2) {
		e = (end / CACHE_DROP_CHUNK - 1) * CACHE_DROP_CHUNK;
		s = e - CACHE_DROP_CHUNK;
	} else {
		return;
	}
	s = s > CACHE_DROP_SLACK ? s - CACHE_DROP_SLACK : 0;
	posix_fadvise(fd, (off_t)(data_off + s), (off_t)(e - s),
		      POSIX_FADV_DONTNEED);
}

static void cache_drop_pages(struct cache_obj *o, uint64_t off, uint64_t len)
{
	cache_drop_range(o->c, o->fd, o->data_off, o->size, off, len);
}

/* o->lock held: drop a reference; the last one frees the land. */
static void cache_land_unref(struct cache_obj *o, struct cache_land *l)
{
	struct cache *c = o->c;

	if (--l->refs)
		return;
	atomic_fetch_sub(&c->land_bytes, (uint64_t)c->batch * c->bs);
	cache_buf_put(c, l->buf);
	free(l);
}

/* o->lock held: take l out of o->lands (a no-op when it is not there). */
static void cache_land_unlist(struct cache_obj *o, struct cache_land *l)
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
static bool cache_landed(const struct cache_obj *o, uint64_t b0, uint64_t b1)
{
	for (const struct cache_land *l = o->lands; l; l = l->next)
		if (l->b0 < b1 && b0 < l->b0 + l->n)
			return true;
	return false;
}

/* o->lock held: forget every landed fill of o. */
static void cache_lands_drop(struct cache_obj *o)
{
	while (o->lands)
		cache_land_unlist(o, o->lands);
}

/*
 * Land buf, which holds blocks [b0, b0 + n) of o, all PRESENT and verified;
 * used: bytes of them the filling thread copied out itself. Returns true
 * when the land took buf (the caller must not free it).
 */
static bool cache_land_publish(struct cache_obj *o, uint64_t b0, uint64_t n,
			       char *buf, uint64_t used)
{
	struct cache *c = o->c;
	uint64_t bytes = 0, cost = (uint64_t)c->batch * c->bs, held;
	struct cache_land *l;

	for (uint64_t i = 0; i < n; i++)
		bytes += cache_block_len(o, b0 + i);
	if (used >= bytes)
		return false;
	held = atomic_fetch_add(&c->land_bytes, cost) + cost;
	if (held > CACHE_LAND_BYTES) {
		cache_count(&c->lands_refused, 1);
		goto no;
	}
	cache_count_max(&c->land_peak, held);
	l = calloc(1, sizeof(*l));
	if (!l)
		goto no;
	l->refs = 1;
	l->b0 = b0;
	l->n = n;
	l->left = bytes - used;
	l->buf = buf;
	pthread_mutex_lock(&o->lock);
	if (o->nlands == CACHE_LAND_MAX) {
		struct cache_land *old = o->lands;

		while (old->next)
			old = old->next;
		cache_land_unlist(o, old);
		cache_count(&c->lands_displaced, 1);
	}
	l->next = o->lands;
	o->lands = l;
	o->nlands++;
	pthread_mutex_unlock(&o->lock);
	return true;
no:
	atomic_fetch_sub(&c->land_bytes, cost);
	return false;
}

/* At most this many blocks are handed out as iovecs in one call. */
#define CACHE_IOV_MAX 8

/*
 * If every block of [off, off + len) is in a landed fill, call fn with
 * iovecs pointing into them (the lands referenced meanwhile) and return its
 * result; -EAGAIN when some block is not.
 */
static int cache_land_send(struct cache_obj *o, uint64_t off, size_t len,
			   cache_iov_fn fn, void *arg)
{
	struct cache *c = o->c;
	uint64_t b0 = off / c->bs, b1 = (off + len - 1) / c->bs;
	struct cache_land *ls[CACHE_IOV_MAX];
	struct iovec iov[CACHE_IOV_MAX];
	uint64_t drop_off = UINT64_MAX, drop_end = 0;
	int n = 0, ret;

	if (b1 - b0 + 1 > CACHE_IOV_MAX)
		return -EAGAIN;
	pthread_mutex_lock(&o->lock);
	for (uint64_t b = b0; b <= b1; b++, n++) {
		struct cache_land *l;
		uint64_t bstart = b * c->bs;
		uint64_t s = off > bstart ? off : bstart;
		uint64_t e = bstart + cache_block_len(o, b);

		if (e > off + len)
			e = off + len;
		for (l = o->lands; l; l = l->next)
			if (b >= l->b0 && b < l->b0 + l->n)
				break;
		if (!l)
			break;
		l->refs++;
		ls[n] = l;
		iov[n].iov_base = l->buf + (b - l->b0) * c->bs + (s - bstart);
		iov[n].iov_len = e - s;
	}
	if (n < (int)(b1 - b0 + 1)) {
		while (n)
			cache_land_unref(o, ls[--n]);
		pthread_mutex_unlock(&o->lock);
		return -EAGAIN;
	}
	pthread_mutex_unlock(&o->lock);
	ret = fn(arg, iov, n);
	pthread_mutex_lock(&o->lock);
	for (int i = 0; i < n; i++) {
		struct cache_land *l = ls[i];

		l->left -= iov[i].iov_len < l->left ? iov[i].iov_len : l->left;
		if (l->left == 0) {
			/* Every byte went to a reader: the file's pages of it
			 * are not needed in memory either. */
			if (l->b0 * c->bs < drop_off)
				drop_off = l->b0 * c->bs;
			if ((l->b0 + l->n) * c->bs > drop_end)
				drop_end = (l->b0 + l->n) * c->bs;
			cache_land_unlist(o, l);
		}
		cache_land_unref(o, l);
	}
	pthread_mutex_unlock(&o->lock);
	if (drop_end > drop_off)
		cache_drop_pages(o, drop_off, drop_end - drop_off);
	cache_count(&c->hits, (uint64_t)n);
	cache_count(&c->bytes_from_cache, len);
	return ret;
}

/* A cache_iov_fn that copies into dst (nothing to do for bytes already
 * there: the fallback of cache_read_iov reads into the caller's buffer). */
struct cache_sink {
	char *dst;
	size_t got;
};

static int cache_sink_copy(void *arg, const struct iovec *iov, int n)
{
	struct cache_sink *k = arg;

	for (int i = 0; i < n; i++) {
		if (iov[i].iov_base != k->dst + k->got)
			memcpy(k->dst + k->got, iov[i].iov_base,
			       iov[i].iov_len);
		k->got += iov[i].iov_len;
	}
	return 0;
}

/* Copy what out wants of block b from a landed fill holding it. Returns
 * false when none does. */
static bool cache_land_copy(struct cache_obj *o, uint64_t b,
			    const struct cache_out *out)
{
	uint64_t bstart = b * o->c->bs, bend = bstart + cache_block_len(o, b);
	uint64_t s = out->off > bstart ? out->off : bstart;
	uint64_t e = out->off + out->len < bend ? out->off + out->len : bend;
	struct cache_sink k = { out->buf + (s - out->off), 0 };

	return s < e && cache_land_send(o, s, e - s, cache_sink_copy, &k) == 0;
}

/*
 * The descriptor fills write block data through (and bulk readers read
 * through, cache_read_direct): the object file reopened with O_DIRECT (through /proc/self/fd, so it is the same inode even if the
 * file was evicted meanwhile), which spares a copy into the page cache and
 * its writeback, or -1 where that is not possible (then o->fd).
 */
static int cache_obj_dfd(struct cache_obj *o)
{
	char path[40];
	int fd;

	if (o->c->no_direct)
		return -1;
	pthread_mutex_lock(&o->lock);
	fd = o->no_direct ? -1 : o->dfd;
	pthread_mutex_unlock(&o->lock);
	if (fd != CACHE_DFD_UNSET)
		return fd;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", o->fd);
	fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
	if (fd < 0)
		log_debug("cache: %s/%s: no direct writes (%s): buffered",
			  o->dataset, o->key, strerror(errno));
	pthread_mutex_lock(&o->lock);
	if (o->dfd == CACHE_DFD_UNSET) {
		o->dfd = fd < 0 ? -1 : fd;
	} else {
		if (fd >= 0)
			close(fd);
		fd = o->dfd;
	}
	pthread_mutex_unlock(&o->lock);
	return fd;
}

/* Write the fetched blocks and then their records, each durable before the
 * next step. Returns 0 or -errno (nothing is PRESENT then). */
static int cache_commit(struct cache_obj *o, uint64_t b0, const bool *fetch,
			const struct cache_rec *recs, char *buf, uint64_t n)
{
	struct uring_io ios[CACHE_MAX_BATCH];
	size_t nio = 0;
	int ret, dfd = cache_obj_dfd(o);

	for (uint64_t i = 0; i < n; i++) {
		if (!fetch[i])
			continue;
		ios[nio].buf = buf + i * o->c->bs;
		ios[nio].len = cache_block_len(o, b0 + i);
		ios[nio].off = o->data_off + (b0 + i) * o->c->bs;
		if (dfd >= 0 && ios[nio].len % CACHE_ALIGN) {
			/* Direct I/O writes whole 4 KiB units: pad the
			 * object's last block (its slot has room). */
			size_t pad = CACHE_ALIGN - ios[nio].len % CACHE_ALIGN;

			memset((char *)ios[nio].buf + ios[nio].len, 0, pad);
			ios[nio].len += pad;
		}
		nio++;
	}
	ret = uring_rw(dfd >= 0 ? dfd : o->fd, ios, nio, true);
	if (ret == -EINVAL && dfd >= 0) {
		/* The filesystem opened it but refuses direct writes. */
		log_debug("cache: %s/%s: direct writes refused: buffered",
			  o->dataset, o->key);
		pthread_mutex_lock(&o->lock);
		o->no_direct = true; /* dfd is closed with the object */
		pthread_mutex_unlock(&o->lock);
		return cache_commit(o, b0, fetch, recs, buf, n);
	}
	if (!ret && fdatasync(o->fd))
		ret = -errno;
	if (ret)
		return ret;
	nio = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (!fetch[i])
			continue;
		ios[nio].buf = (void *)&recs[i];
		ios[nio].len = sizeof(recs[i]);
		ios[nio].off = o->rec_off + (b0 + i) * sizeof(recs[i]);
		nio++;
	}
	/*
	 * No second fdatasync: the records need not be durable now. A record
	 * that a crash loses leaves its block ABSENT (fetched again); one that
	 * survives was written after its data was durable, and its check word
	 * rejects a torn write. Writeback, or the next batch's fdatasync,
	 * makes it durable. This halves the syncs of a cold read.
	 */
	return uring_rw(o->fd, ios, nio, true);
}

/*
 * A block's checksum, computed as its bytes arrive (objstore_get's on_data)
 * while they are still in the CPU's cache, rather than read back from
 * memory afterwards. Any gap or reordering falls back to hashing the whole
 * block once it is complete.
 */
struct cache_rx {
	XXH3_state_t st;
	size_t hashed; /* bytes hashed so far, from the block's start */
	bool broken; /* pieces out of order: hash the block afterwards */
};

static void cache_rx_reset(struct cache_rx *rx)
{
	XXH3_64bits_reset(&rx->st);
	rx->hashed = 0;
	rx->broken = false;
}

static void cache_rx_data(void *arg, size_t at, const void *p, size_t n)
{
	struct cache_rx *rx = arg;

	if (at == 0) /* the first piece, or a retry starting over */
		cache_rx_reset(rx);
	if (rx->broken || at != rx->hashed) {
		rx->broken = true;
		return;
	}
	XXH3_64bits_update(&rx->st, p, n);
	rx->hashed += n;
}

/* The checksum of a fetched block of len bytes at p. */
static uint64_t cache_rx_sum(struct cache_rx *rx, const void *p, size_t len)
{
	if (rx && !rx->broken && rx->hashed == len)
		return XXH3_64bits_digest(&rx->st);
	return XXH3_64bits(p, len);
}

/*
 * Fill blocks starting at b0 (at most max of them, all believed absent):
 * claim b0 (waiting for it when wait), try to claim the following ones, then
 * re-check each on disk, fetch those still missing in one objstore_get_many,
 * write them, make them durable, record them. Bytes the read wants are
 * copied to out. *no_space is set when the blocks could not be cached.
 * Returns the number of blocks handled from b0 (>= 1; 0 when !wait and b0 is
 * taken), -EALREADY when this process filled and verified b0 meanwhile (the
 * caller serves it from the file), or -errno.
 */
static int cache_fill(struct cache_obj *o, uint64_t b0, uint64_t max, bool wait,
		      const struct cache_out *out, bool *no_space)
{
	struct cache *c = o->c;
	struct objstore_get reqs[CACHE_MAX_BATCH];
	struct cache_rec recs[CACHE_MAX_BATCH];
	struct cache_rx *rx = NULL; /* per block (not per request) */
	bool fetch[CACHE_MAX_BATCH];
	uint64_t n = 0, nfetch = 0, cost = 0;
	char *buf = NULL;
	int ret;

	if (max > c->batch)
		max = c->batch;
	ret = cache_claim(o, b0, wait);
	if (ret)
		return ret == -EAGAIN ? 0 : ret;
	n = 1;
	while (n < max && b0 + n < o->nblocks &&
	       cache_claim(o, b0 + n, false) == 0)
		n++;
	buf = cache_buf_get(c);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	ret = cache_read_recs(o, b0, n, recs);
	if (ret)
		goto out;
	/* Blocks this process filled while we waited for the claim (the
	 * readahead workers, mostly) are present and verified: serve them
	 * from the file instead of reading and hashing them again here. */
	{
		uint64_t keep = n;

		pthread_mutex_lock(&o->lock);
		for (uint64_t i = 0; i < n && keep == n; i++)
			if (cache_rec_valid(&recs[i], b0 + i) &&
			    cache_verified(o, b0 + i))
				keep = i;
		pthread_mutex_unlock(&o->lock);
		while (n > keep)
			cache_unclaim(o, b0 + --n);
	}
	if (n == 0) {
		ret = -EALREADY;
		goto out;
	}
	for (uint64_t i = 0; i < n; i++) {
		uint64_t b = b0 + i, len = cache_block_len(o, b);
		char *p = buf + i * c->bs;

		fetch[i] = true;
		if (!cache_rec_valid(&recs[i], b))
			continue;
		/* Landed meanwhile (or a corrupt block): check it. */
		struct uring_io io = { p, len, o->data_off + b * c->bs };

		ret = uring_rw(o->fd, &io, 1, false);
		if (ret == -EIO) /* unreadable, or past a cut-off end */
			continue;
		if (ret)
			goto out;
		if (XXH3_64bits(p, len) == recs[i].sum) {
			fetch[i] = false;
			continue;
		}
		cache_log_corrupt(o, b);
	}
	/* Without it (no memory) each block is hashed after it arrives. */
	rx = aligned_alloc(64, ((n * sizeof(*rx)) + 63) & ~(size_t)63);
	for (uint64_t i = 0; i < n; i++) {
		if (!fetch[i])
			continue;
		reqs[nfetch] = (struct objstore_get){
			.key = o->key,
			.off = (b0 + i) * c->bs,
			.len = cache_block_len(o, b0 + i),
			.if_match = o->etag[0] ? o->etag : NULL,
			.buf = buf + i * c->bs,
			.on_data = rx ? cache_rx_data : NULL,
			.on_data_arg = rx ? &rx[i] : NULL,
		};
		if (rx)
			cache_rx_reset(&rx[i]);
		nfetch++;
		cost += cache_block_cost(o, b0 + i);
	}
	if (nfetch) {
		ret = objstore_get_many(o->os, reqs, nfetch);
		for (uint64_t i = 0; !ret && i < nfetch; i++)
			if (reqs[i].got != reqs[i].len)
				ret = -EIO;
		if (ret) {
			uint64_t bad = b0;

			for (uint64_t i = 0; i < nfetch; i++)
				if (reqs[i].result) {
					bad = reqs[i].off / c->bs;
					if (ret == -EIO)
						ret = reqs[i].result;
					break;
				}
			ret = cache_fetch_error(o, bad, ret);
			goto out;
		}
		cache_count(&c->fetches, nfetch);
		cache_count(&c->misses, nfetch);
		for (uint64_t i = 0; i < n; i++) {
			if (!fetch[i])
				continue;
			recs[i].sum = cache_rx_sum(rx ? &rx[i] : NULL,
						   buf + i * c->bs,
						   cache_block_len(o, b0 + i));
			recs[i].magic = CACHE_REC_MAGIC;
			recs[i].check = cache_rec_check(&recs[i], b0 + i);
		}
		ret = cache_reserve(c, o->dataset, cost);
		if (ret == 0) {
			ret = cache_commit(o, b0, fetch, recs, buf, n);
			if (ret == -ENOSPC || ret == -EDQUOT) {
				/* The filesystem is fuller than we thought:
				 * free some room and try once more. */
				uint64_t freed;

				cache_evict_bytes(c, NULL, cost * 2, &freed);
				ret = cache_commit(o, b0, fetch, recs, buf, n);
			}
			if (ret == 0)
				cache_landed_bytes(c, cost);
			if (ret) {
				cache_unreserve(c, o->dataset, cost);
				if (ret != -ENOSPC && ret != -EDQUOT)
					log_warn("cache: %s/%s: cannot store "
						 "blocks: %s; reading uncached",
						 o->dataset, o->key,
						 strerror(-ret));
				ret = -ENOSPC;
			}
		}
		if (ret == -ENOSPC) {
			*no_space = true;
			cache_count(&c->streamed, 1);
			ret = 0;
		}
		if (ret)
			goto out;
	}
	pthread_mutex_lock(&o->lock);
	for (uint64_t i = 0; i < n; i++)
		if (!*no_space || !fetch[i])
			cache_set_verified(o, b0 + i, true);
	pthread_mutex_unlock(&o->lock);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t len = cache_block_len(o, b0 + i);

		if (out)
			cache_copy_out(o, b0 + i, buf + i * c->bs, out);
		cache_count(fetch[i] ? &c->bytes_from_source
				     : &c->bytes_from_cache,
			    len);
		if (!fetch[i])
			cache_count(&c->hits, 1);
	}
	if (!*no_space) {
		/* Readers waiting for these blocks take them from memory
		 * (landed before the claims go, so that they find it). */
		uint64_t s = b0 * c->bs, e = s, used = 0;

		for (uint64_t i = 0; i < n; i++)
			e += cache_block_len(o, b0 + i);
		if (out && out->len) {
			uint64_t os = out->off > s ? out->off : s;
			uint64_t oe = out->off + out->len < e
					      ? out->off + out->len
					      : e;

			if (os < oe) {
				used = oe - os;
				cache_drop_pages(o, os, used);
			}
		}
		if (cache_land_publish(o, b0, n, buf, used))
			buf = NULL;
	}
	ret = (int)n;
out:
	for (uint64_t i = 0; i < n; i++)
		cache_unclaim(o, b0 + i);
	cache_buf_put(c, buf);
	free(rx);
	return ret;
}

/*
 * Serve blocks [b, e) that have valid records (recs[0] is block b's) from
 * disk into out, verifying every block not yet verified. Returns the number
 * of blocks served; fewer than e - b when a block failed its checksum (it
 * is counted and logged; the caller re-fetches it) or -errno.
 */
static int cache_serve(struct cache_obj *o, uint64_t b, uint64_t e,
		       const struct cache_rec *recs,
		       const struct cache_out *out)
{
	struct cache *c = o->c;
	uint64_t bs = c->bs, n = e - b;
	struct uring_io ios[CACHE_MAX_BATCH];
	bool direct[CACHE_MAX_BATCH], verified[CACHE_MAX_BATCH];
	char *tmp = NULL;
	int ret;

	if (n > CACHE_MAX_BATCH)
		n = CACHE_MAX_BATCH;
	pthread_mutex_lock(&o->lock);
	for (uint64_t i = 0; i < n; i++)
		verified[i] = cache_verified(o, b + i);
	pthread_mutex_unlock(&o->lock);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t k = b + i, len = cache_block_len(o, k);
		uint64_t bstart = k * bs, s, en;

		s = out->off > bstart ? out->off : bstart;
		en = out->off + out->len < bstart + len ? out->off + out->len
							: bstart + len;
		direct[i] = verified[i] || (s == bstart && en == bstart + len);
		if (direct[i]) {
			/* Straight into the caller's buffer: whole blocks, or
			 * the wanted part of a verified one. */
			ios[i].buf = out->buf + (s - out->off);
			ios[i].len = en - s;
			ios[i].off = o->data_off + s;
			continue;
		}
		if (!tmp) {
			tmp = malloc(2 * bs);
			if (!tmp)
				return -ENOMEM;
		}
		/* A partial unverified block: only the first and the last
		 * block of a read can be partial. */
		ios[i].buf = tmp + (i == 0 ? 0 : bs);
		ios[i].len = len;
		ios[i].off = o->data_off + bstart;
	}
	ret = uring_rw(o->fd, ios, n, false);
	if (ret == -EIO && n > 1) /* which block? the first alone */
		ret = uring_rw(o->fd, ios, n = 1, false);
	if (ret == -EIO) {
		/* Unreadable or cut off (a file shorter than its records
		 * say): like a checksum mismatch, cache_fill fetches it
		 * again and rewrites it. */
		log_warn("cache: %s/%s: block %" PRIu64 " is unreadable (file "
			 "%.2s/%s: %s): re-fetching",
			 o->dataset, o->key, b, o->name, o->name + 2,
			 strerror(-ret));
		/* Not verified any more, or cache_fill would send it back
		 * here as one this process already checked. */
		pthread_mutex_lock(&o->lock);
		cache_set_verified(o, b, false);
		pthread_mutex_unlock(&o->lock);
		ret = 0;
		goto out;
	}
	if (ret) {
		log_error("cache: %s/%s: reading cached blocks failed: %s",
			  o->dataset, o->key, strerror(-ret));
		goto out;
	}
	ret = (int)n;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t k = b + i, len = cache_block_len(o, k);

		if (!verified[i]) {
			if (XXH3_64bits(ios[i].buf, len) != recs[i].sum) {
				/* cache_fill re-checks it under the block's
				 * lock, then counts and logs it. */
				ret = (int)i;
				break;
			}
			pthread_mutex_lock(&o->lock);
			cache_set_verified(o, k, true);
			pthread_mutex_unlock(&o->lock);
			if (!direct[i])
				cache_copy_out(o, k, ios[i].buf, out);
		}
		cache_count(&c->hits, 1);
		cache_count(&c->bytes_from_cache,
			    ios[i].len < len && direct[i] ? ios[i].len : len);
	}
	if (ret > 0) {
		/* The reader has its bytes (and, for dstagefs, the kernel
		 * keeps them in the mount's page cache). */
		uint64_t ds = b * bs > out->off ? b * bs : out->off;
		uint64_t de = (b + (uint64_t)ret) * bs;

		if (de > out->off + out->len)
			de = out->off + out->len;
		if (ds < de)
			cache_drop_pages(o, ds, de - ds);
	}
out:
	free(tmp);
	return ret;
}

/* Read through without caching (the object file is unusable). */
static ssize_t cache_stream(struct cache *c, const struct cache_object *obj,
			    uint64_t off, size_t len, void *buf)
{
	size_t got = 0;
	int ret;

	ret = objstore_get(obj->os, obj->key, off, len,
			   obj->etag && obj->etag[0] ? obj->etag : NULL, buf,
			   &got);
	if (ret == -ESTALE) {
		log_error("cache: %s/%s: the source object changed under the "
			  "snapshot (expected ETag %s): EIO",
			  cache_ds_or(obj->dataset), obj->key, obj->etag);
		return -EIO;
	}
	if (ret)
		return ret;
	if (got != len)
		return -EIO;
	cache_count(&c->streamed, 1);
	cache_count(&c->bytes_from_source, len);
	return (ssize_t)len;
}

/* Check block b's bytes (p, len) against its record r, unless this process
 * verified it already; one that passes is marked verified. */
static bool cache_check_block(struct cache_obj *o, uint64_t b, const void *p,
			      size_t len, const struct cache_rec *r)
{
	bool ok;

	pthread_mutex_lock(&o->lock);
	ok = cache_verified(o, b);
	pthread_mutex_unlock(&o->lock);
	if (ok)
		return true;
	if (XXH3_64bits(p, len) != r->sum)
		return false;
	pthread_mutex_lock(&o->lock);
	cache_set_verified(o, b, true);
	pthread_mutex_unlock(&o->lock);
	return true;
}

/*
 * Whether o's file still holds the data of blocks up to b1: one cut short
 * (damaged, or by hand) while its records say those blocks are present
 * would fault a mapping past its end (SIGBUS) and splice short, so such
 * blocks go to the read path, which repairs them.
 */
static bool cache_file_covers(struct cache_obj *o, uint64_t b1)
{
	struct stat st;

	return fstat(o->fd, &st) == 0 &&
	       (uint64_t)st.st_size >=
		       o->data_off + b1 * o->c->bs + cache_block_len(o, b1);
}

/*
 * Check present block b (record r) where it lies, in the page cache, through
 * a mapping of the file: no copy into a buffer, and the pages stay for the
 * splice that follows. The caller made sure the file covers the block
 * (cache_file_covers). Returns 1 (verified, marked so), 0 (mismatch: left
 * to the reader's path, which re-checks, counts and re-fetches), or -errno
 * when it cannot be mapped (the caller reads it instead).
 */
static int cache_verify_map(struct cache_obj *o, uint64_t b,
			    const struct cache_rec *r)
{
	uint64_t off = o->data_off + b * o->c->bs;
	size_t len = cache_block_len(o, b);
	void *p;
	bool ok;

	p = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, o->fd,
		 (off_t)off);
	if (p == MAP_FAILED)
		return -errno;
	ok = cache_check_block(o, b, p, len, r);
	munmap(p, len);
	return ok;
}

/*
 * Readahead over present blocks: read and check those of [b, b + n) (recs[0]
 * is block b's) this process has not verified yet, so that the reader finds
 * them verified and in the page cache and dstagefs splices them. Otherwise
 * each FUSE request (a quarter of a 4 MiB block) would read and hash the
 * whole block itself, several at once. Blocks another thread holds are
 * skipped; a mismatch is left to the reader's path, which counts, logs and
 * re-fetches it under the block's fill lock.
 */
static void cache_verify_ahead(struct cache_obj *o, uint64_t b, uint64_t n,
			       const struct cache_rec *recs)
{
	struct cache *c = o->c;
	struct uring_io ios[CACHE_MAX_BATCH];
	uint64_t idx[CACHE_MAX_BATCH], m = 0, k = 0;
	bool covers;
	char *buf;

	if (n > c->batch)
		n = c->batch;
	pthread_mutex_lock(&o->lock);
	for (uint64_t i = 0; i < n; i++)
		if (!cache_verified(o, b + i) && !cache_claimed(o, b + i) &&
		    cache_claim_add(o, b + i) == 0)
			idx[m++] = i;
	pthread_mutex_unlock(&o->lock);
	/* Checked in place; those that cannot be mapped are read. */
	covers = m && cache_file_covers(o, b + idx[m - 1]);
	for (uint64_t j = 0; j < m; j++) {
		if (covers &&
		    cache_verify_map(o, b + idx[j], &recs[idx[j]]) >= 0)
			cache_claim_drop(o, b + idx[j]);
		else
			idx[k++] = idx[j];
	}
	m = k;
	if (!m)
		return;
	buf = cache_buf_get(c);
	for (uint64_t j = 0; buf && j < m; j++) {
		ios[j].buf = buf + j * c->bs;
		ios[j].len = cache_block_len(o, b + idx[j]);
		ios[j].off = o->data_off + (b + idx[j]) * c->bs;
	}
	if (buf && uring_rw(o->fd, ios, m, false) == 0)
		for (uint64_t j = 0; j < m; j++)
			cache_check_block(o, b + idx[j], ios[j].buf, ios[j].len,
					  &recs[idx[j]]);
	cache_buf_put(c, buf);
	for (uint64_t j = 0; j < m; j++)
		cache_claim_drop(o, b + idx[j]);
}

/* Make the blocks of [b, e) present (or stream them) and copy out what the
 * read wants. wait: block for blocks others are filling. verify: check
 * present blocks not yet verified (readahead, see cache_verify_ahead). */
static int cache_obj_range(struct cache_obj *o, uint64_t b, uint64_t e,
			   bool wait, bool verify, const struct cache_out *out,
			   bool *no_space)
{
	struct cache_rec recs[CACHE_MAX_BATCH];
	int ret;

	while (b < e) {
		uint64_t n = e - b, k = 0;

		if (n > CACHE_MAX_BATCH)
			n = CACHE_MAX_BATCH;
		ret = cache_read_recs(o, b, n, recs);
		if (ret)
			return ret;
		if (cache_rec_valid(&recs[0], b)) {
			if (out && cache_land_copy(o, b, out)) {
				b++;
				continue;
			}
			while (k < n && cache_rec_valid(&recs[k], b + k))
				k++;
			if (!out) { /* prewarm: present is enough */
				if (verify)
					cache_verify_ahead(o, b, k, recs);
				b += k;
				continue;
			}
			ret = cache_serve(o, b, b + k, recs, out);
			if (ret < 0)
				return ret;
			b += (uint64_t)ret;
			if ((uint64_t)ret == k)
				continue;
			/* b failed its checksum: re-fetch it. */
			ret = cache_fill(o, b, 1, true, out, no_space);
		} else {
			while (k < n && !cache_rec_valid(&recs[k], b + k))
				k++;
			ret = cache_fill(o, b, k, wait, out, no_space);
			if (ret == 0) { /* taken, and we do not wait */
				b++;
				continue;
			}
		}
		if (ret == -EALREADY) /* filled meanwhile: serve it */
			continue;
		if (ret < 0)
			return ret;
		b += (uint64_t)ret;
	}
	return 0;
}

/* ---- background work: readahead and prefetch ---- */

static void cache_job_free(struct cache_job *j)
{
	if (!j)
		return;
	cache_obj_put(j->o);
	for (size_t i = 0; i < j->nobjs; i++) {
		free((char *)j->objs[i].dataset);
		free((char *)j->objs[i].key);
		free((char *)j->objs[i].etag);
	}
	free(j->objs);
	free(j->dataset);
	free(j);
}

/* Queue a job; drops it (returns -EBUSY) when the queue is full. */
static int cache_job_push(struct cache *c, struct cache_job *j)
{
	pthread_mutex_lock(&c->lock);
	if (c->stopping || !c->npool ||
	    (j->kind == CACHE_JOB_READAHEAD && c->njobs >= CACHE_MAX_JOBS)) {
		pthread_mutex_unlock(&c->lock);
		return -EBUSY;
	}
	j->next = NULL;
	*c->jobs_tail = j;
	c->jobs_tail = &j->next;
	c->njobs++;
	pthread_cond_signal(&c->jobs_cv);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

static bool cache_prefetch_current(struct cache *c, const struct cache_job *j)
{
	struct cache_ds *d;
	bool cur = false;

	pthread_mutex_lock(&c->lock);
	for (d = c->ds; d; d = d->next)
		if (!strcmp(d->name, j->dataset))
			cur = d->pf_gen == j->gen && !c->stopping;
	pthread_mutex_unlock(&c->lock);
	return cur;
}

static void cache_run_prefetch(struct cache *c, struct cache_job *j)
{
	uint64_t step = j->window / c->bs;

	if (step < 1)
		step = 1;
	for (size_t i = 0; i < j->nobjs; i++) {
		struct cache_obj *o;
		bool no_space = false;

		if (!j->objs[i].size)
			continue;
		if (cache_obj_get(c, &j->objs[i], true, &o) || !o)
			continue;
		for (uint64_t b = 0; b < o->nblocks && !no_space; b += step) {
			uint64_t e =
				b + step < o->nblocks ? b + step : o->nblocks;

			if (!cache_prefetch_current(c, j) ||
			    cache_obj_range(o, b, e, true, false, NULL,
					    &no_space))
				break;
		}
		cache_obj_put(o);
		if (!cache_prefetch_current(c, j))
			break;
	}
}

static void *cache_worker(void *arg)
{
	struct cache *c = arg;

	for (;;) {
		struct cache_job *j;
		bool no_space = false;

		pthread_mutex_lock(&c->lock);
		while (!c->jobs && !c->stopping)
			pthread_cond_wait(&c->jobs_cv, &c->lock);
		j = c->jobs;
		if (j) {
			c->jobs = j->next;
			if (!c->jobs)
				c->jobs_tail = &c->jobs;
			c->njobs--;
		}
		pthread_mutex_unlock(&c->lock);
		if (!j)
			return NULL;
		if (j->kind == CACHE_JOB_READAHEAD && !c->stopping)
			cache_obj_range(j->o, j->b0, j->b0 + j->n, false, true,
					NULL, &no_space);
		else if (j->kind == CACHE_JOB_PREFETCH)
			cache_run_prefetch(c, j);
		cache_job_free(j);
	}
}

/* Hand [b0, b0 + n) to the readahead workers, in batches. */
static void cache_readahead(struct cache_obj *o, uint64_t b0, uint64_t n)
{
	struct cache *c = o->c;

	while (n) {
		uint64_t k = n < c->batch ? n : c->batch;
		struct cache_job *j = calloc(1, sizeof(*j));

		if (!j)
			return;
		j->kind = CACHE_JOB_READAHEAD;
		j->o = o;
		j->b0 = b0;
		j->n = k;
		pthread_mutex_lock(&c->lock);
		o->refs++;
		pthread_mutex_unlock(&c->lock);
		if (cache_job_push(c, j)) {
			cache_job_free(j);
			return;
		}
		b0 += k;
		n -= k;
	}
}

/* Sequential detection: a read starting where the previous one ended grows
 * the window (1, 2, 4... up to cache.readahead_max blocks); any other read
 * resets it. */
static void cache_access(struct cache_obj *o, uint64_t off, size_t len)
{
	struct cache *c = o->c;
	uint64_t last = (off + len - 1) / c->bs, ra_b = 0, ra_n = 0;
	uint64_t max = c->cfg->cache_readahead_max;

	pthread_mutex_lock(&o->lock);
	/*
	 * Sequential: the read starts where the stream is, or, once a stream
	 * is established, within its window of it. The kernel's readahead
	 * sends a stream's requests through several FUSE threads at once, so
	 * they arrive slightly out of order; an exact match would see such a
	 * reader as random. A new stream needs an exact match, so random
	 * reads never start one.
	 */
	uint64_t slack = o->window * c->bs;
	bool seq = max && (off == o->seq_next ||
			   (o->window && off + slack >= o->seq_next &&
			    off <= o->seq_next + slack));

	if (seq) {
		o->window = o->window ? o->window * 2 : 1;
		if (o->window > max)
			o->window = max;
		uint64_t start = last + 1 > o->ra_next ? last + 1 : o->ra_next;
		uint64_t end = last + 1 + o->window;

		if (end > o->nblocks)
			end = o->nblocks;
		if (start < end) {
			ra_b = start;
			ra_n = end - start;
			o->ra_next = end;
		}
	} else {
		o->window = 0;
		o->ra_next = 0;
	}
	if (!seq || off + len > o->seq_next)
		o->seq_next = off + len;
	pthread_mutex_unlock(&o->lock);
	/*
	 * Present blocks of the window are read by verify-ahead in the pool,
	 * or, once verified, by the kernel's own readahead on the cache file.
	 * POSIX_FADV_WILLNEED here as well cost the reader's thread the page
	 * allocation and submission: with it a fresh reader ran at 0.8 of
	 * dd's speed and a second pass at 0.75 of its speed without it
	 * (bench/warm_ab.sh, docs/cache.md).
	 */
	if (ra_n)
		cache_readahead(o, ra_b, ra_n);
}

/* ---- reads ---- */

ssize_t cache_read(struct cache *c, const struct cache_object *obj,
		   uint64_t off, size_t len, void *buf)
{
	struct cache_sink k = { buf, 0 };
	int ret;

	ret = cache_read_iov(c, obj, off, len, buf, 0, cache_sink_copy, &k);
	return ret ? ret : (ssize_t)k.got;
}

/* Wait while a thread of this process fills a block of [off, off + len).
 * Returns true if it waited. */
static bool cache_wait_fills(struct cache_obj *o, uint64_t off, size_t len)
{
	uint64_t b0 = off / o->c->bs, b1 = (off + len - 1) / o->c->bs;
	bool waited = false;

	pthread_mutex_lock(&o->lock);
	for (uint64_t b = b0; b <= b1; b++)
		while (cache_claimed(o, b)) {
			pthread_cond_wait(&o->cond, &o->lock);
			waited = true;
		}
	pthread_mutex_unlock(&o->lock);
	return waited;
}

/*
 * Bulk read (CACHE_READ_DIRECT): when every block of [off, off + len) is
 * present and whole 4 KiB units, read them with O_DIRECT into a fill buffer
 * in one batch (no page cache, no readahead: the caller runs several such
 * reads at once), check those not verified yet, and hand the bytes to fn
 * without a copy. -EAGAIN when not possible (the caller takes the usual
 * path, which also deals with a block failing its checksum).
 */
static int cache_read_direct(struct cache_obj *o, uint64_t off, size_t len,
			     cache_iov_fn fn, void *arg)
{
	struct cache *c = o->c;
	uint64_t b0 = off / c->bs, n = (off + len - 1) / c->bs - b0 + 1;
	struct cache_rec recs[CACHE_MAX_BATCH];
	struct uring_io ios[CACHE_MAX_BATCH];
	struct iovec iov[CACHE_IOV_MAX];
	char *buf = NULL;
	int dfd, ret;

	if (n > c->batch || n > CACHE_IOV_MAX)
		return -EAGAIN;
	/* Some of it landed (in memory; a stage's own readahead lands most
	 * of what its workers read next) or is being filled: the usual path
	 * hands that over. Known without reading the records. */
	pthread_mutex_lock(&o->lock);
	ret = cache_landed(o, b0, b0 + n) ? -EAGAIN : 0;
	for (uint64_t b = b0; !ret && b < b0 + n; b++)
		if (cache_claimed(o, b))
			ret = -EAGAIN;
	pthread_mutex_unlock(&o->lock);
	if (ret)
		return ret;
	dfd = cache_obj_dfd(o);
	if (dfd < 0)
		return -EAGAIN;
	ret = cache_read_recs(o, b0, n, recs);
	if (ret)
		return ret;
	for (uint64_t i = 0; i < n; i++)
		if (!cache_rec_valid(&recs[i], b0 + i) ||
		    cache_block_len(o, b0 + i) % CACHE_ALIGN)
			return -EAGAIN;
	buf = cache_buf_get(c);
	if (!buf)
		return -ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		ios[i].buf = buf + i * c->bs;
		ios[i].len = cache_block_len(o, b0 + i);
		ios[i].off = o->data_off + (b0 + i) * c->bs;
	}
	ret = uring_rw(dfd, ios, n, false);
	if (ret) {
		/* EINVAL: O_DIRECT refused after all; EIO: a block unreadable
		 * or past a cut-off end. The usual path copes (and repairs). */
		if (ret == -EINVAL || ret == -EIO)
			ret = -EAGAIN;
		goto out;
	}
	for (uint64_t i = 0; i < n; i++)
		if (!cache_check_block(o, b0 + i, ios[i].buf, ios[i].len,
				       &recs[i])) {
			ret = -EAGAIN; /* counted, logged, re-fetched there */
			goto out;
		}
	for (uint64_t i = 0; i < n; i++) {
		uint64_t bstart = (b0 + i) * c->bs;
		uint64_t s = off > bstart ? off : bstart;
		uint64_t e = bstart + ios[i].len;

		if (e > off + len)
			e = off + len;
		iov[i].iov_base = buf + i * c->bs + (s - bstart);
		iov[i].iov_len = e - s;
	}
	cache_count(&c->hits, n);
	cache_count(&c->bytes_from_cache, len);
	ret = fn(arg, iov, (int)n);
out:
	cache_buf_put(c, buf);
	return ret;
}

int cache_read_iov(struct cache *c, const struct cache_object *obj,
		   uint64_t off, size_t len, void *buf, unsigned flags,
		   cache_iov_fn fn, void *arg)
{
	struct cache_obj *o = NULL;
	struct cache_out out;
	struct iovec v;
	bool no_space = false;
	ssize_t got;
	int ret;

	if (!c || !obj || !obj->key || !fn || (len && !buf))
		return -EINVAL;
	if (off >= obj->size || len == 0)
		return fn(arg, NULL, 0);
	if (len > obj->size - off)
		len = obj->size - off;
	ret = cache_obj_get(c, obj, true, &o);
	if (ret)
		return ret;
	if (!o) {
		got = cache_stream(c, obj, off, len, buf);
		if (got < 0)
			return (int)got;
		v = (struct iovec){ buf, (size_t)got };
		return fn(arg, &v, 1);
	}
	cache_obj_touch(o);
	if (flags & CACHE_READ_DIRECT) {
		ret = cache_read_direct(o, off, len, fn, arg);
		if (ret != -EAGAIN)
			goto out;
	}
	cache_access(o, off, len);
	/* Bytes landing now (readahead ahead of us, mostly): take them
	 * from memory without a copy, once their fill is done. */
	do {
		ret = cache_land_send(o, off, len, fn, arg);
		if (ret != -EAGAIN)
			goto out;
	} while (cache_wait_fills(o, off, len));
	out = (struct cache_out){ .off = off, .len = len, .buf = buf };
	ret = cache_obj_range(o, off / c->bs, (off + len - 1) / c->bs + 1, true,
			      false, &out, &no_space);
	if (ret == 0) {
		v = (struct iovec){ buf, len };
		ret = fn(arg, &v, 1);
	}
out:
	cache_obj_put(o);
	return ret;
}

/*
 * For cache_read_fd: make [b0, b1] verified in this process, checking in
 * place (cache_verify_map) the present blocks nobody holds; waits while
 * another thread of this process holds one (verifying or filling it).
 * Returns 0 when all are verified and none is landed, -EAGAIN when the
 * caller must take cache_read_iov (a block absent, landed, damaged, past
 * the file's end or not mappable), or -errno.
 */
static int cache_fd_ready(struct cache_obj *o, uint64_t b0, uint64_t b1)
{
	struct cache_rec recs[CACHE_MAX_BATCH];
	uint64_t mine[CACHE_MAX_BATCH], nmine = 0;
	int ret = 0;

	if (b1 - b0 + 1 > CACHE_MAX_BATCH)
		return -EAGAIN;
	pthread_mutex_lock(&o->lock);
	for (uint64_t b = b0; b <= b1; b++)
		while (cache_claimed(o, b))
			pthread_cond_wait(&o->cond, &o->lock);
	/* Bytes a fill just landed are in memory; with direct writes the
	 * file's pages are not: cache_read_iov hands them from the land. */
	if (cache_landed(o, b0, b1 + 1))
		ret = -EAGAIN;
	for (uint64_t b = b0; !ret && b <= b1; b++)
		if (!cache_verified(o, b)) {
			ret = cache_claim_add(o, b);
			if (!ret)
				mine[nmine++] = b;
		}
	pthread_mutex_unlock(&o->lock);
	/* One fstat for the range: what the splice sends and what
	 * cache_verify_map maps. */
	if (!ret && !cache_file_covers(o, b1))
		ret = -EAGAIN;
	if (!ret && nmine)
		ret = cache_read_recs(o, b0, b1 - b0 + 1, recs);
	for (uint64_t i = 0; i < nmine; i++) {
		const struct cache_rec *r = &recs[mine[i] - b0];

		if (!ret && (!cache_rec_valid(r, mine[i]) ||
			     cache_verify_map(o, mine[i], r) != 1))
			ret = -EAGAIN;
		cache_claim_drop(o, mine[i]);
	}
	return ret;
}

int cache_read_fd(struct cache *c, const struct cache_object *obj, uint64_t off,
		  size_t len, int *fd, uint64_t *fd_off)
{
	struct cache_obj *o = NULL;
	int ret;

	if (!c || !obj || !fd || !fd_off)
		return -EINVAL;
	if (off >= obj->size || len == 0)
		return -EAGAIN;
	if (len > obj->size - off)
		len = obj->size - off;
	ret = cache_obj_get(c, obj, false, &o);
	if (ret)
		return ret;
	if (!o)
		return -EAGAIN;
	ret = cache_fd_ready(o, off / c->bs, (off + len - 1) / c->bs);
	if (!ret) {
		/* (cache_read_iov sees the others.) */
		cache_access(o, off, len);
		*fd = fcntl(o->fd, F_DUPFD_CLOEXEC, 0);
		if (*fd < 0) {
			ret = -errno;
		} else {
			*fd_off = o->data_off + off;
			cache_count(&c->hits, 1);
			cache_count(&c->bytes_from_cache, len);
			cache_obj_touch(o);
		}
	}
	cache_obj_put(o);
	return ret;
}

int cache_fetch(struct cache *c, const struct cache_object *obj, uint64_t off,
		uint64_t len, cache_progress_cb progress, void *arg)
{
	struct cache_obj *o = NULL;
	uint64_t b, e;
	int ret;

	if (!c || !obj || !obj->key)
		return -EINVAL;
	if (off >= obj->size)
		return 0;
	if (len == 0 || len > obj->size - off)
		len = obj->size - off;
	ret = cache_obj_get(c, obj, true, &o);
	if (ret)
		return ret;
	if (!o)
		return -ENOSPC;
	cache_obj_touch(o);
	b = off / c->bs;
	e = (off + len - 1) / c->bs + 1;
	while (b < e) {
		uint64_t k = e - b < c->batch ? e - b : c->batch;
		bool no_space = false;

		ret = cache_obj_range(o, b, b + k, true, false, NULL,
				      &no_space);
		if (!ret && no_space)
			ret = -ENOSPC;
		if (ret)
			break;
		b += k;
		if (progress) {
			uint64_t end =
				b * c->bs < off + len ? b * c->bs : off + len;

			ret = progress(arg, end - off);
			if (ret)
				break;
		}
	}
	cache_obj_put(o);
	return ret;
}

int cache_object_present(struct cache *c, const struct cache_object *obj,
			 uint64_t *bytes)
{
	struct cache_rec recs[CACHE_MAX_BATCH];
	struct cache_obj *o = NULL;
	int ret;

	if (!c || !obj || !bytes)
		return -EINVAL;
	*bytes = 0;
	if (!obj->size)
		return 0;
	ret = cache_obj_get(c, obj, false, &o);
	if (ret || !o)
		return ret;
	for (uint64_t b = 0; b < o->nblocks; b += CACHE_MAX_BATCH) {
		uint64_t n = o->nblocks - b < CACHE_MAX_BATCH ? o->nblocks - b
							      : CACHE_MAX_BATCH;

		ret = cache_read_recs(o, b, n, recs);
		if (ret)
			break;
		for (uint64_t i = 0; i < n; i++)
			if (cache_rec_valid(&recs[i], b + i))
				*bytes += cache_block_len(o, b + i);
	}
	cache_obj_put(o);
	return ret;
}

int cache_object_verify(struct cache *c, const struct cache_object *obj,
			uint64_t *present, uint64_t *bad)
{
	struct cache_rec recs[CACHE_MAX_BATCH];
	struct cache_obj *o = NULL;
	char *buf = NULL;
	int ret;

	if (!c || !obj || !present || !bad)
		return -EINVAL;
	*present = *bad = 0;
	if (!obj->size)
		return 0;
	ret = cache_obj_get(c, obj, false, &o);
	if (ret || !o)
		return ret;
	buf = malloc(c->bs);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	for (uint64_t b = 0; b < o->nblocks && !ret; b += CACHE_MAX_BATCH) {
		uint64_t n = o->nblocks - b < CACHE_MAX_BATCH ? o->nblocks - b
							      : CACHE_MAX_BATCH;

		ret = cache_read_recs(o, b, n, recs);
		for (uint64_t i = 0; i < n && !ret; i++) {
			uint64_t k = b + i, len = cache_block_len(o, k);
			struct uring_io io = { buf, len,
					       o->data_off + k * c->bs };

			if (!cache_rec_valid(&recs[i], k))
				continue;
			(*present)++;
			ret = uring_rw(o->fd, &io, 1, false);
			if (ret)
				break;
			pthread_mutex_lock(&o->lock);
			bool ok = XXH3_64bits(buf, len) == recs[i].sum;

			cache_set_verified(o, k, ok);
			pthread_mutex_unlock(&o->lock);
			if (!ok) {
				(*bad)++;
				cache_log_corrupt(o, k);
			}
		}
	}
out:
	free(buf);
	cache_obj_put(o);
	return ret;
}

/* ---- eviction ---- */

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

/* Read the dataset name and access time of an object file. */
static int cache_file_info(int fd, char *ds, size_t dslen, uint64_t *atime)
{
	struct cache_hdr h;
	int ret = cache_pread_all(fd, &h, sizeof(h), 0);

	if (ret)
		return ret;
	if (memcmp(h.magic, CACHE_OBJ_MAGIC, 8) || h.ds_len >= dslen)
		return -EUCLEAN;
	ret = cache_pread_all(fd, ds, h.ds_len, CACHE_HDR_FIXED);
	ds[h.ds_len] = '\0';
	*atime = h.atime;
	return ret;
}

/*
 * One pass over the cache directory: recount usage (total, pinned, per
 * dataset) and collect the best victims among unpinned objects (of only_ds
 * when not NULL) in h. evict_lock held.
 */
static int cache_scan(struct cache *c, const char *only_ds,
		      struct cache_heap *h)
{
	char ds[4096];
	uint64_t total = 0, pinned = 0;
	DIR *top = NULL;
	struct dirent *de;
	int ret = 0;

	h->n = 0;
	pthread_mutex_lock(&c->lock);
	for (struct cache_ds *d = c->ds; d; d = d->next)
		d->used = 0;
	pthread_mutex_unlock(&c->lock);
	int tfd =
		openat(c->objects_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (tfd < 0)
		return -errno;
	top = fdopendir(tfd);
	if (!top) {
		close(tfd);
		return -errno;
	}
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
		sub = fdopendir(sfd);
		if (!sub) {
			close(sfd);
			continue;
		}
		while ((fe = readdir(sub))) {
			struct cache_victim v;
			struct cache_policy p;
			struct stat st;
			uint64_t bytes;
			int fd;

			if (strlen(fe->d_name) != 30)
				continue;
			fd = openat(sfd, fe->d_name, O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				continue;
			if (fstat(fd, &st) ||
			    cache_file_info(fd, ds, sizeof(ds), &v.atime)) {
				close(fd);
				continue;
			}
			close(fd);
			bytes = (uint64_t)st.st_blocks * 512;
			total += bytes;
			cache_policy_of(c, ds, &p);
			cache_ds_add_used(c, ds, (int64_t)bytes);
			if (p.pinned) {
				pinned += bytes;
				continue;
			}
			if (only_ds && strcmp(only_ds, ds))
				continue;
			/* 2 + 30 hex digits, both lengths checked above */
			memcpy(v.name, de->d_name, 2);
			memcpy(v.name + 2, fe->d_name, 30);
			v.name[32] = '\0';
			v.priority = p.priority;
			cache_heap_add(h, &v);
		}
		closedir(sub);
	}
	closedir(top);
	atomic_store(&c->used, total + atomic_load(&c->inflight));
	atomic_store(&c->pinned, pinned);
	qsort(h->v, h->n, sizeof(*h->v), cache_victim_cmp);
	return ret;
}

/* Unlink one object file unless some process uses it. Returns the bytes it
 * held, 0 if it was in use or gone. */
static uint64_t cache_evict_one(struct cache *c, const char *name, char *ds,
				size_t dslen)
{
	char path[40];
	struct stat st;
	uint64_t atime, bytes = 0;
	int fd;

	snprintf(path, sizeof(path), "%.2s/%s", name, name + 2);
	fd = openat(c->objects_fd, path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return 0;
	if (cache_ofd_lock(fd, CACHE_LOCK_INUSE, F_WRLCK, false) ||
	    fstat(fd, &st) || st.st_nlink == 0 ||
	    cache_file_info(fd, ds, dslen, &atime))
		goto out;
	if (unlinkat(c->objects_fd, path, 0))
		goto out;
	bytes = (uint64_t)st.st_blocks * 512;
	cache_count(&c->evictions, 1);
	log_debug("cache: evicted %s (%s, %" PRIu64 " bytes)", path, ds, bytes);
out:
	close(fd);
	return bytes;
}

/* Free at least need bytes (of only_ds if not NULL) if possible. evict_lock
 * held. */
static int cache_evict_bytes(struct cache *c, const char *only_ds,
			     uint64_t need, uint64_t *freed)
{
	struct cache_heap h = { 0 };
	char ds[4096];
	int ret = 0;

	*freed = 0;
	if (!need)
		return 0;
	/* Our idle entries may be victims: close them. */
	pthread_mutex_lock(&c->lock);
	cache_trim_idle(c, true);
	pthread_mutex_unlock(&c->lock);
	h.v = malloc(CACHE_EVICT_HEAP * sizeof(*h.v));
	if (!h.v)
		return -ENOMEM;
	while (*freed < need) {
		uint64_t before = *freed;

		ret = cache_scan(c, only_ds, &h);
		if (ret)
			break;
		for (size_t i = 0; i < h.n && *freed < need; i++) {
			uint64_t b =
				cache_evict_one(c, h.v[i].name, ds, sizeof(ds));

			if (!b)
				continue;
			*freed += b;
			cache_sub_used(c, b);
			cache_ds_add_used(c, ds, -(int64_t)b);
		}
		if (*freed == before || h.n < CACHE_EVICT_HEAP)
			break;
	}
	free(h.v);
	return ret;
}

int cache_evict(struct cache *c, uint64_t *freed)
{
	uint64_t f = 0, used;
	struct cache_heap h = { 0 };
	int ret;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->evict_lock);
	h.v = malloc(CACHE_EVICT_HEAP * sizeof(*h.v));
	if (!h.v) {
		ret = -ENOMEM;
		goto out;
	}
	ret = cache_scan(c, NULL, &h); /* refresh the usage figures */
	if (ret)
		goto out;
	/* Datasets over their quota first, then down to the low mark. */
	for (;;) {
		struct cache_ds *over = NULL;
		uint64_t excess = 0, got = 0;

		pthread_mutex_lock(&c->lock);
		for (struct cache_ds *d = c->ds; d && !over; d = d->next)
			if (d->quota && d->used > d->quota && !d->pinned) {
				over = d;
				excess = d->used - d->quota;
			}
		char *name = over ? strdup(over->name) : NULL;

		pthread_mutex_unlock(&c->lock);
		if (!name)
			break;
		cache_evict_bytes(c, name, excess, &got);
		free(name);
		f += got;
		if (!got)
			break;
	}
	used = atomic_load(&c->used);
	if (used > c->low) {
		uint64_t got = 0;

		ret = cache_evict_bytes(c, NULL, used - c->low, &got);
		f += got;
	}
out:
	free(h.v);
	pthread_mutex_unlock(&c->evict_lock);
	if (freed)
		*freed = f;
	return ret;
}

/* ---- open, close, admin ---- */

/* Read or create the cache's identity file; check the block size. */
static int cache_identity(struct cache *c)
{
	char want[96], got[96] = "", proc[64];
	unsigned long bs = 0;
	ssize_t r;
	int fd, ret = 0;

	snprintf(want, sizeof(want), "dstage-cache 1\nblock_size %u\n", c->bs);
	for (int tries = 0; tries < 3; tries++) {
		fd = openat(c->dir_fd, CACHE_ID_FILE, O_RDONLY | O_CLOEXEC);
		if (fd >= 0)
			break;
		if (errno != ENOENT)
			return -errno;
		fd = openat(c->dir_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC,
			    0644);
		if (fd < 0)
			return -errno;
		errno = 0;
		if (write(fd, want, strlen(want)) != (ssize_t)strlen(want) ||
		    fsync(fd)) {
			ret = errno ? -errno : -ENOSPC;
			close(fd);
			return ret;
		}
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
		ret = linkat(AT_FDCWD, proc, c->dir_fd, CACHE_ID_FILE,
			     AT_SYMLINK_FOLLOW)
			      ? -errno
			      : 0;
		close(fd);
		fd = -1;
		if (ret && ret != -EEXIST)
			return ret;
		if (!ret)
			fsync(c->dir_fd);
	}
	if (fd < 0)
		return -EIO;
	r = read(fd, got, sizeof(got) - 1);
	close(fd);
	if (r < 0)
		return -errno;
	got[r] = '\0';
	if (sscanf(got, "dstage-cache 1\nblock_size %lu", &bs) != 1) {
		log_error("cache: %s/%s is not a dstage cache identity file",
			  c->cfg->cache_dir, CACHE_ID_FILE);
		return -EINVAL;
	}
	if (bs != c->bs) {
		log_error("cache: %s was created with block size %lu, but "
			  "cache.block_size is %u: use the same block size or "
			  "another cache.dir",
			  c->cfg->cache_dir, bs, c->bs);
		return -EINVAL;
	}
	return 0;
}

int cache_open(const struct dstage_config *cfg, struct cache **out)
{
	struct cache_heap h = { 0 };
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
	c->bs = cfg->cache_block_size;
	c->dir_fd = c->objects_fd = -1;
	c->high = cfg->cache_size / 100 * cfg->cache_high_watermark;
	c->low = cfg->cache_size / 100 * cfg->cache_low_watermark;
	c->batch = CACHE_BATCH_BYTES / c->bs;
	if (c->batch < 1)
		c->batch = 1;
	if (c->batch > CACHE_MAX_BATCH)
		c->batch = CACHE_MAX_BATCH;
	pthread_mutex_init(&c->evict_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->buf_lock, NULL);
	{
		const char *v = getenv("DSTAGE_NO_DIRECT");

		c->no_direct = v && *v && strcmp(v, "0") != 0;
	}
	pthread_cond_init(&c->jobs_cv, NULL);
	c->jobs_tail = &c->jobs;

	if (mkdir(cfg->cache_dir, 0755) && errno != EEXIST) {
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
	ret = cache_identity(c);
	if (ret) {
		if (ret != -EINVAL)
			log_error("cache: %s: cannot read or write %s: %s",
				  cfg->cache_dir, CACHE_ID_FILE,
				  strerror(-ret));
		goto err;
	}
	if (mkdirat(c->dir_fd, "objects", 0755) && errno != EEXIST) {
		ret = -errno;
		goto err;
	}
	c->objects_fd = openat(c->dir_fd, "objects",
			       O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->objects_fd < 0) {
		ret = -errno;
		goto err;
	}
	if (cfg->catalog_path && access(cfg->catalog_path, F_OK)) {
		log_info("cache: no catalog at %s yet: no pins, quotas or "
			 "priorities",
			 cfg->catalog_path);
	} else if (cfg->catalog_path) {
		ret = catalog_open(cfg->catalog_path, 0, &c->cat);
		if (ret) {
			log_warn("cache: catalog %s not usable (%s): no pins, "
				 "quotas or priorities",
				 cfg->catalog_path, strerror(-ret));
			c->cat = NULL;
		}
	}
	h.v = malloc(CACHE_EVICT_HEAP * sizeof(*h.v));
	if (!h.v) {
		ret = -ENOMEM;
		goto err;
	}
	pthread_mutex_lock(&c->evict_lock);
	ret = cache_scan(c, NULL, &h);
	pthread_mutex_unlock(&c->evict_lock);
	free(h.v);
	if (ret)
		goto err;
	for (unsigned i = 0; i < CACHE_POOL_THREADS; i++) {
		if (pthread_create(&c->pool[i], NULL, cache_worker, c))
			break;
		c->npool++;
	}
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
	pthread_mutex_lock(&c->lock);
	c->stopping = true;
	pthread_cond_broadcast(&c->jobs_cv);
	pthread_mutex_unlock(&c->lock);
	for (unsigned i = 0; i < c->npool; i++)
		pthread_join(c->pool[i], NULL);
	while (c->jobs) {
		struct cache_job *j = c->jobs;

		c->jobs = j->next;
		cache_job_free(j);
	}
	pthread_mutex_lock(&c->lock);
	cache_trim_idle(c, true);
	pthread_mutex_unlock(&c->lock);
	while (c->ds) {
		struct cache_ds *d = c->ds;

		c->ds = d->next;
		free(d->name);
		free(d);
	}
	catalog_close(c->cat);
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

void cache_read_fd_done(struct cache *c, uint64_t obj_size, int fd,
			uint64_t fd_off, uint64_t off, size_t len)
{
	if (c && fd >= 0 && fd_off >= off)
		cache_drop_range(c, fd, fd_off - off, obj_size, off, len);
}

int cache_object_drop(struct cache *c, const struct cache_object *obj)
{
	char name[33], path[40], ds[4096];
	struct cache_obj **pp;
	uint64_t bytes;
	int ret = 0;

	if (!c || !obj || !obj->key)
		return -EINVAL;
	cache_obj_name(obj, name);
	pthread_mutex_lock(&c->lock);
	for (pp = &c->objs; *pp; pp = &(*pp)->next)
		if (!strcmp((*pp)->name, name))
			break;
	if (*pp && (*pp)->refs) {
		ret = -EBUSY;
	} else if (*pp) {
		struct cache_obj *o = *pp;

		*pp = o->next;
		c->nobjs--;
		cache_obj_free(o);
	}
	pthread_mutex_unlock(&c->lock);
	if (ret)
		return ret;
	snprintf(path, sizeof(path), "%.2s/%s", name, name + 2);
	if (faccessat(c->objects_fd, path, F_OK, 0))
		return 0; /* nothing cached */
	pthread_mutex_lock(&c->evict_lock);
	bytes = cache_evict_one(c, name, ds, sizeof(ds));
	if (bytes) {
		cache_sub_used(c, bytes);
		cache_ds_add_used(c, ds, -(int64_t)bytes);
	} else if (!faccessat(c->objects_fd, path, F_OK, 0)) {
		ret = -EBUSY;
	}
	pthread_mutex_unlock(&c->evict_lock);
	return ret;
}

void cache_get_stats(struct cache *c, struct cache_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (!c)
		return;
	st->capacity = c->cfg->cache_size;
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
	st->land_limit = CACHE_LAND_BYTES;
	st->land_bytes = atomic_load(&c->land_bytes);
	st->land_peak = atomic_load(&c->land_peak);
	st->lands_refused = atomic_load(&c->lands_refused);
	st->lands_displaced = atomic_load(&c->lands_displaced);
}

int cache_prefetch(struct cache *c, const struct cache_object *objs, size_t n,
		   uint64_t window)
{
	struct cache_job *j;
	struct cache_ds *d;
	const char *ds;
	int ret = -ENOMEM;

	if (!c || (n && !objs))
		return -EINVAL;
	if (!n)
		return 0;
	ds = cache_ds_or(objs[0].dataset);
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->kind = CACHE_JOB_PREFETCH;
	j->window = window ? window : (uint64_t)c->bs * c->batch;
	j->dataset = strdup(ds);
	j->objs = calloc(n, sizeof(*j->objs));
	if (!j->dataset || !j->objs)
		goto err;
	for (size_t i = 0; i < n; i++) {
		struct cache_object *d2 = &j->objs[i];

		j->nobjs = i + 1;
		d2->os = objs[i].os;
		d2->size = objs[i].size;
		d2->dataset = strdup(cache_ds_or(objs[i].dataset));
		d2->key = objs[i].key ? strdup(objs[i].key) : NULL;
		d2->etag = strdup(objs[i].etag ? objs[i].etag : "");
		if (!d2->dataset || !d2->key || !d2->etag)
			goto err;
	}
	pthread_mutex_lock(&c->lock);
	d = cache_ds_get(c, ds);
	if (d)
		j->gen = ++d->pf_gen; /* replaces the previous prefetch */
	pthread_mutex_unlock(&c->lock);
	if (!d)
		goto err;
	ret = cache_job_push(c, j);
	if (ret)
		goto err;
	return 0;
err:
	cache_job_free(j);
	return ret;
}
