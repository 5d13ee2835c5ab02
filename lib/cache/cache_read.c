// SPDX-License-Identifier: MIT
/*
 * cache_read.c, layer 6 of the cache (lib/cache/cache_i.h draws all seven): the
 * public read paths. Calls layers 1 to 5.
 *
 * Each public call takes a reference on the open object (layer 3), does its
 * work and puts it back; none holds a cache lock across its I/O. The paths
 * of cache_read_iov, tried in order:
 *   object file unusable or no room for one -> stream from the source;
 *   CACHE_READ_DIRECT and all present -> one O_DIRECT batch, no copy;
 *   all in landed fills (waiting for this process's fills in flight) ->
 *   handed over from memory, no copy;
 *   otherwise cache_obj_range (layer 4) into the caller's buffer.
 * cache_read_fd only ever serves verified, present, not landed blocks; it
 * answers -EAGAIN for anything else, and the caller takes cache_read_iov.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#ifdef DSTAGE_XXH_DISPATCH
/* XXH3_64bits and XXH3_64bits_update become libxxhash's run-time dispatch
 * (AVX2/AVX-512): same sums, 2.5x the baseline's speed here. */
#include <xxh_x86dispatch.h>
#endif

#include "cache_i.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/metrics.h"
#include "dstage/objstore.h"
#include "util/uring.h"

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
		if (!cache_rec_valid(o, &recs[i], b0 + i) ||
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
		uint64_t bstart = (b0 + i) * c->bs, s, e;

		cache_block_span(o, b0 + i, off, len, &s, &e);
		iov[i].iov_base = buf + i * c->bs + (s - bstart);
		iov[i].iov_len = e - s;
	}
	cache_count_hits(o, n);
	cache_count(&c->bytes_from_cache, len);
	ret = fn(arg, iov, (int)n);
out:
	cache_buf_put(c, buf);
	return ret;
}

static int cache_read_iov_timed(struct cache *c, const struct cache_object *obj,
				uint64_t off, size_t len, void *buf,
				unsigned flags, cache_iov_fn fn, void *arg)
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
	if ((flags & CACHE_READ_WHOLE) && off == 0)
		cache_obj_prealloc(o);
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

/* Every read through the cache counts in dstage_cache_read_seconds while
 * metrics are served (metrics_start reads no clock otherwise). */
int cache_read_iov(struct cache *c, const struct cache_object *obj,
		   uint64_t off, size_t len, void *buf, unsigned flags,
		   cache_iov_fn fn, void *arg)
{
	uint64_t t0 = metrics_start();
	int ret;

	ret = cache_read_iov_timed(c, obj, off, len, buf, flags, fn, arg);
	metrics_observe_since(METRICS_HIST_READ, t0);
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

		if (!ret && (!cache_rec_valid(o, r, mine[i]) ||
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
			/* hits counts blocks, as every other path does */
			cache_count_hits(o, (off + len - 1) / c->bs -
						    off / c->bs + 1);
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

/* For a walk over a whole object's records: its open object, or NULL (and
 * 0) when it is empty or has no file. */
static int cache_obj_existing(struct cache *c, const struct cache_object *obj,
			      struct cache_obj **op)
{
	*op = NULL;
	return obj->size ? cache_obj_get(c, obj, false, op) : 0;
}

/* How many records from block b such a walk reads at once. */
static uint64_t cache_recs_batch(const struct cache_obj *o, uint64_t b)
{
	return o->nblocks - b < CACHE_MAX_BATCH ? o->nblocks - b
						: CACHE_MAX_BATCH;
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
	ret = cache_obj_existing(c, obj, &o);
	if (ret || !o)
		return ret;
	for (uint64_t b = 0; b < o->nblocks; b += CACHE_MAX_BATCH) {
		uint64_t n = cache_recs_batch(o, b);

		ret = cache_read_recs(o, b, n, recs);
		if (ret)
			break;
		for (uint64_t i = 0; i < n; i++)
			if (cache_rec_valid(o, &recs[i], b + i))
				*bytes += cache_block_len(o, b + i);
	}
	cache_obj_put(o);
	return ret;
}

int cache_object_atime(struct cache *c, const struct cache_object *obj,
		       uint64_t *atime)
{
	struct cache_obj *o = NULL;
	char ds[256];
	int ret;

	if (!c || !obj || !atime)
		return -EINVAL;
	ret = cache_obj_existing(c, obj, &o);
	if (!ret && !o)
		ret = -ENOENT;
	if (!ret)
		ret = cache_file_info(o->mfd, ds, sizeof(ds), atime);
	cache_obj_put(o);
	return ret;
}

/* What cache_check_one found of a block. */
enum cache_check_state {
	CACHE_CHECK_ABSENT, /* no record (or gone meanwhile) */
	CACHE_CHECK_SOUND, /* present, its bytes match the record */
	CACHE_CHECK_FOUND, /* present, damaged: found now and marked so */
	CACHE_CHECK_MARKED, /* present, marked damaged before */
};

/*
 * Check block k (record r as read) for cache_object_check into buf (a
 * block's room). A mismatch is read again under the block's claim (a fill
 * may have just written it) and, when it stands, the block is marked
 * damaged (cache_mark_damaged): then no passthrough open of any process
 * takes the object's bytes, and every reader fetches the block, while a
 * later check still reports it. Returns an enum cache_check_state, or
 * -errno (the block unreadable, its record unwritable).
 */
static int cache_check_one(struct cache_obj *o, uint64_t k,
			   const struct cache_rec *r, char *buf)
{
	size_t len = cache_block_len(o, k);
	struct uring_io io = { buf, len, o->data_off + k * o->c->bs };
	struct cache_rec now;
	bool ok;
	int ret;

	if (cache_rec_damaged(o, r, k))
		return CACHE_CHECK_MARKED;
	if (!cache_rec_valid(o, r, k))
		return CACHE_CHECK_ABSENT;
	ret = uring_rw(o->fd, &io, 1, false);
	if (ret)
		return ret;
	ok = XXH3_64bits(buf, len) == r->sum;
	if (!ok) { /* again, under the claim */
		ret = cache_claim(o, k, true);
		if (ret)
			return ret;
		ret = cache_read_recs(o, k, 1, &now);
		if (!ret && cache_rec_valid(o, &now, k))
			ret = uring_rw(o->fd, &io, 1, false);
		if (!ret && cache_rec_valid(o, &now, k)) {
			ok = XXH3_64bits(buf, len) == now.sum;
			if (!ok)
				ret = cache_mark_damaged(o, k, &now);
		}
		cache_unclaim(o, k);
		if (ret)
			return ret;
		if (cache_rec_damaged(o, &now, k))
			return CACHE_CHECK_MARKED;
		if (!cache_rec_valid(o, &now, k))
			return CACHE_CHECK_ABSENT;
	}
	pthread_mutex_lock(&o->lock);
	cache_set_verified(o, k, ok);
	pthread_mutex_unlock(&o->lock);
	return ok ? CACHE_CHECK_SOUND : CACHE_CHECK_FOUND;
}

int cache_object_check(struct cache *c, const struct cache_object *obj,
		       struct cache_check *chk)
{
	struct cache_rec recs[CACHE_MAX_BATCH];
	struct cache_obj *o = NULL;
	char *buf = NULL, path[4096];
	int ret;

	if (!c || !obj || !chk)
		return -EINVAL;
	chk->blocks = obj->size ? (obj->size - 1) / c->bs + 1 : 0;
	chk->present = chk->bad = 0;
	ret = cache_obj_existing(c, obj, &o);
	if (ret || !o)
		return ret;
	buf = malloc(c->bs);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	snprintf(path, sizeof(path), "%s/objects/%.2s/%s", c->cfg->cache_dir,
		 o->name, o->name + 2);
	for (uint64_t b = 0; b < o->nblocks && !ret; b += CACHE_MAX_BATCH) {
		uint64_t n = cache_recs_batch(o, b);

		ret = cache_read_recs(o, b, n, recs);
		for (uint64_t i = 0; i < n && !ret; i++) {
			uint64_t k = b + i;
			int st = cache_check_one(o, k, &recs[i], buf);

			if (st < 0) {
				ret = st;
				break;
			}
			if (st == CACHE_CHECK_ABSENT)
				continue;
			chk->present++;
			if (st == CACHE_CHECK_SOUND)
				continue;
			chk->bad++;
			if (st == CACHE_CHECK_FOUND)
				cache_log_corrupt(o, k);
			if (chk->bad_fn)
				chk->bad_fn(chk->arg, k, path);
		}
	}
out:
	free(buf);
	cache_obj_put(o);
	return ret;
}

int cache_object_verify(struct cache *c, const struct cache_object *obj,
			uint64_t *present, uint64_t *bad)
{
	struct cache_check chk = { 0 };
	int ret;

	if (!present || !bad)
		return -EINVAL;
	ret = cache_object_check(c, obj, &chk);
	*present = chk.present;
	*bad = chk.bad;
	return ret;
}

/* Whether fd is no longer the directory at name (in dirfd, or the path
 * itself when dirfd is AT_FDCWD): removed, or replaced by another. */
static bool cache_dir_gone(int fd, int dirfd, const char *name)
{
	struct stat a, b;

	if (fstat(fd, &a) || a.st_nlink == 0)
		return true;
	if (fstatat(dirfd, name, &b, AT_SYMLINK_NOFOLLOW))
		return true;
	return a.st_dev != b.st_dev || a.st_ino != b.st_ino;
}

/* Put a fresh descriptor of directory name (in dirfd) at *fdp's number,
 * creating the directory (0700) if needed; refuse one that others may
 * write or that another user owns. */
static int cache_dir_reopen(struct cache *c, int dirfd, const char *name,
			    int *fdp)
{
	struct stat st;
	int fd, ret = 0;

	if (mkdirat(dirfd, name, CACHE_DIR_MODE) && errno != EEXIST)
		return -errno;
	fd = openat(dirfd, name,
		    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		ret = -errno;
	} else if (st.st_uid != geteuid() || (st.st_mode & 022)) {
		log_error(
			"cache: %s%s%s: recreated by another user or writable "
			"by others (owner uid %u, mode %04o): refusing it; "
			"remove it, or chown %u and chmod 0700 it",
			c->cfg->cache_dir, dirfd == AT_FDCWD ? "" : "/",
			dirfd == AT_FDCWD ? "" : name, (unsigned)st.st_uid,
			(unsigned)(st.st_mode & 07777), (unsigned)geteuid());
		ret = -EACCES;
	} else if (dup3(fd, *fdp, O_CLOEXEC) < 0) {
		ret = -errno;
	}
	close(fd);
	return ret;
}

int cache_dir_recover(struct cache *c)
{
	const char *dir;
	bool top, objs, id;
	int ret = 0;

	if (!c)
		return -EINVAL;
	dir = c->cfg->cache_dir;
	/* One at a time, and not during a scan or an eviction. */
	pthread_mutex_lock(&c->evict_lock);
	top = cache_dir_gone(c->dir_fd, AT_FDCWD, dir);
	if (top)
		ret = cache_dir_reopen(c, AT_FDCWD, dir, &c->dir_fd);
	id = !ret &&
	     faccessat(c->dir_fd, CACHE_ID_FILE, F_OK, AT_SYMLINK_NOFOLLOW) &&
	     errno == ENOENT;
	if (id)
		ret = cache_identity(c);
	objs = !ret && cache_dir_gone(c->objects_fd, c->dir_fd, "objects");
	if (objs)
		ret = cache_dir_reopen(c, c->dir_fd, "objects", &c->objects_fd);
	pthread_mutex_unlock(&c->evict_lock);
	if (ret) {
		log_error("cache: cache.dir %s was damaged under the running "
			  "process and cannot be recreated: %s; the cache's "
			  "side fails, not the source: fix the directory and "
			  "restart",
			  dir, strerror(-ret));
		return ret;
	}
	if (!top && !id && !objs)
		return 0;
	log_error("cache: cache.dir %s: %s removed under the running process; "
		  "recreated it empty: cached blocks are gone and are fetched "
		  "again from the source",
		  dir,
		  top	 ? "the directory was"
		  : objs ? "its objects/ directory was"
			 : "its identity file " CACHE_ID_FILE " was");
	/* Entries whose files went with it, and the usage they counted. */
	c->release_idle(c);
	ret = cache_scan_all(c, NULL);
	return ret ? ret : 1;
}

int cache_object_drop(struct cache *c, const struct cache_object *obj)
{
	char name[33], path[CACHE_PATH_MAX], ds[4096];
	uint64_t bytes;
	int ret;

	if (!c || !obj || !obj->key)
		return -EINVAL;
	cache_obj_name(obj, name);
	ret = cache_obj_forget(c, name);
	if (ret)
		return ret;
	cache_name_path(name, path);
	if (faccessat(c->objects_fd, path, F_OK, 0))
		return 0; /* nothing cached */
	pthread_mutex_lock(&c->evict_lock);
	bytes = cache_evict_one(c, name, ds, sizeof(ds));
	if (bytes) {
		cache_count_sub(&c->used, bytes);
		cache_ds_add_used(c, ds, -(int64_t)bytes);
	} else if (!faccessat(c->objects_fd, path, F_OK, 0)) {
		ret = -EBUSY;
	}
	pthread_mutex_unlock(&c->evict_lock);
	return ret;
}

void cache_read_fd_done(struct cache *c, uint64_t obj_size, int fd,
			uint64_t fd_off, uint64_t off, size_t len)
{
	if (c && fd >= 0 && fd_off >= off)
		cache_drop_range(c, fd, fd_off - off, obj_size, off, len);
}
