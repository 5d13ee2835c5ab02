// SPDX-License-Identifier: MIT
/*
 * cache_fill.c, layer 4 of the cache (lib/cache/cache_i.h draws all seven): the
 * fill engine, and serving blocks already present. Calls layers 1 to 3.
 *
 * cache_obj_range walks a block range: present blocks are served from a
 * landed fill or from the file (checked unless this process verified them),
 * absent ones are filled (cache_fill):
 *
 *   claim b0 (waiting, bounded), try-claim the next ones -> re-read their
 *   records (filled meanwhile? serve those) -> one objstore_get_many, each
 *   block hashed as it arrives -> reserve space (layer 2; none: stream) ->
 *   write the blocks (O_DIRECT where possible), fdatasync -> write the
 *   records -> mark verified -> copy out -> land the buffer for waiting
 *   readers -> unclaim.
 *
 * Invariants: a record is written only after its block's data is durable;
 * nothing unverified is ever copied out or landed; a fill that cannot
 * store its blocks (no room, disk full) still hands the fetched bytes to
 * its reader (*no_space) and leaves the blocks ABSENT. Locks: o->lock only,
 * never across I/O.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
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

/* Copy the part of block b (data at p) that the read wants. */
static void cache_copy_out(struct cache_obj *o, uint64_t b, const char *p,
			   const struct cache_out *out)
{
	uint64_t s, e;

	if (!out->len || !cache_block_span(o, b, out->off, out->len, &s, &e))
		return;
	memcpy(out->buf + (s - out->off), p + (s - b * o->c->bs), e - s);
}

void cache_log_corrupt(struct cache_obj *o, uint64_t b)
{
	cache_count(&o->c->checksum_failures, 1);
	log_warn("cache: %s/%s: block %" PRIu64 " failed its checksum "
		 "(file %.2s/%s): re-fetching",
		 o->dataset, o->key, b, o->name, o->name + 2);
}

int cache_rec_replace(struct cache_obj *o, uint64_t b,
		      const struct cache_rec *r)
{
	/* The record's place: cache_file.c's layout (docs/cache.md): in the
	 * sidecar (o->mfd), or in the one file of versions 1 and 2. */
	ssize_t w = pwrite(o->mfd, r, sizeof(*r),
			   (off_t)(o->rec_off + b * sizeof(*r)));
	int ret = w == (ssize_t)sizeof(*r) ? 0 : w < 0 ? -errno : -EIO;

	cache_gen_bump(o->c);
	pthread_mutex_lock(&o->lock);
	cache_set_verified(o, b, false);
	pthread_mutex_unlock(&o->lock);
	return ret;
}

bool cache_unmarked(struct cache *c, const char *name)
{
	unsigned n;
	bool found = false;

	if (!atomic_load(&c->nunmarked)) /* the usual case: no lock taken */
		return false;
	pthread_mutex_lock(&c->lock);
	n = c->nunmarked < CACHE_UNMARKED_MAX ? c->nunmarked
					      : CACHE_UNMARKED_MAX;
	for (unsigned i = 0; i < n && !found; i++)
		found = !strcmp(c->unmarked[i], name);
	pthread_mutex_unlock(&c->lock);
	return found;
}

/*
 * Mark present block b (record r, valid) damaged: its record's magic becomes
 * CACHE_REC_DAMAGED, so that no one takes its bytes any more (a passthrough
 * open checks the records, and the damage generation makes every process
 * look again) while cache_object_check still reports it, until a fill
 * writes it again. When the record cannot be written (the disk refuses
 * writes), this process remembers the object (c->unmarked) and never
 * passes it through; its reads check every block they have not verified.
 * The caller holds b's claim. Returns 0 or -errno.
 */
int cache_mark_damaged(struct cache_obj *o, uint64_t b,
		       const struct cache_rec *r)
{
	struct cache *c = o->c;
	struct cache_rec d = *r;
	int ret;

	d.magic = CACHE_REC_DAMAGED;
	d.check = cache_rec_check(o, &d, b);
	ret = cache_rec_replace(o, b, &d);
	if (!ret)
		return 0;
	log_error("cache: %s/%s: block %" PRIu64 " is damaged and its record "
		  "could not be marked so (%s/objects/%.2s/%s%s: %s): this "
		  "process no longer passes the object through",
		  o->dataset, o->key, b, c->cfg->cache_dir, o->name,
		  o->name + 2, o->mfd != o->fd ? ".meta" : "", strerror(-ret));
	if (!cache_unmarked(c, o->name)) {
		pthread_mutex_lock(&c->lock);
		memcpy(c->unmarked[c->nunmarked++ % CACHE_UNMARKED_MAX],
		       o->name, sizeof(o->name));
		pthread_mutex_unlock(&c->lock);
	}
	return ret;
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

/*
 * If every block of [off, off + len) is in a landed fill, call fn with
 * iovecs pointing into them (the lands referenced meanwhile) and return its
 * result; -EAGAIN when some block is not.
 */
int cache_land_send(struct cache_obj *o, uint64_t off, size_t len,
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
		uint64_t bstart = b * c->bs, s, e;

		cache_block_span(o, b, off, len, &s, &e);
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
	cache_count_hits(o, (uint64_t)n);
	cache_count(&c->bytes_from_cache, len);
	return ret;
}

int cache_sink_copy(void *arg, const struct iovec *iov, int n)
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
	uint64_t s, e;
	struct cache_sink k;

	if (!cache_block_span(o, b, out->off, out->len, &s, &e))
		return false;
	k = (struct cache_sink){ out->buf + (s - out->off), 0 };
	return cache_land_send(o, s, e - s, cache_sink_copy, &k) == 0;
}

/*
 * The descriptor fills write block data through (and bulk readers read
 * through, cache_read_direct): the object file reopened with O_DIRECT
 * (through /proc/self/fd, so it is the same inode even if the file was
 * evicted meanwhile), which spares a copy into the page cache and its
 * writeback, or -1 where that is not possible (then o->fd).
 */
int cache_obj_dfd(struct cache_obj *o)
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
	size_t tail = 0; /* 1: the last io goes through o->fd */
	int ret, dfd = cache_obj_dfd(o);

	for (uint64_t i = 0; i < n; i++) {
		if (!fetch[i])
			continue;
		ios[nio].buf = buf + i * o->c->bs;
		ios[nio].len = cache_block_len(o, b0 + i);
		ios[nio].off = o->data_off + (b0 + i) * o->c->bs;
		if (dfd >= 0 && ios[nio].len % CACHE_ALIGN &&
		    o->data_off == 0) {
			/* A data file holds the object's bytes exactly (FUSE
			 * passthrough reads it to its end): its last block is
			 * written buffered, not padded. */
			tail = 1;
		} else if (dfd >= 0 && ios[nio].len % CACHE_ALIGN) {
			/* Direct I/O writes whole 4 KiB units: pad the
			 * object's last block (its slot has room). */
			size_t pad = CACHE_ALIGN - ios[nio].len % CACHE_ALIGN;

			memset((char *)ios[nio].buf + ios[nio].len, 0, pad);
			ios[nio].len += pad;
		}
		nio++;
	}
	ret = uring_rw(dfd >= 0 ? dfd : o->fd, ios, nio - tail, true);
	if (ret == -EINVAL && dfd >= 0) {
		/* The filesystem opened it but refuses direct writes. */
		log_debug("cache: %s/%s: direct writes refused: buffered",
			  o->dataset, o->key);
		pthread_mutex_lock(&o->lock);
		o->no_direct = true; /* dfd is closed with the object */
		pthread_mutex_unlock(&o->lock);
		return cache_commit(o, b0, fetch, recs, buf, n);
	}
	if (!ret && tail)
		ret = uring_rw(o->fd, &ios[nio - 1], 1, true);
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
	 * rejects a torn write. Writeback makes it durable (the sidecar's;
	 * in a one-file object also the next batch's fdatasync). This halves
	 * the syncs of a cold read.
	 */
	return uring_rw(o->mfd, ios, nio, true);
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

/* Claim b0 (waiting for it when wait), then as many of the following
 * blocks, up to max, as are free at once; *n is how many were claimed.
 * Returns 0, -EAGAIN (!wait and b0 is taken) or -errno. */
static int cache_fill_claim(struct cache_obj *o, uint64_t b0, uint64_t max,
			    bool wait, uint64_t *n)
{
	int ret = cache_claim(o, b0, wait);

	if (ret)
		return ret;
	*n = 1;
	while (*n < max && b0 + *n < o->nblocks &&
	       cache_claim(o, b0 + *n, false) == 0)
		(*n)++;
	return 0;
}

/* Blocks this process filled while we waited for the claim (the readahead
 * workers, mostly) are present and verified: unclaim the run from the
 * first such block on, to serve them from the file instead of reading and
 * hashing them again here. Returns how many blocks stay claimed. */
static uint64_t cache_fill_trim(struct cache_obj *o, uint64_t b0, uint64_t n,
				const struct cache_rec *recs)
{
	uint64_t keep = n;

	pthread_mutex_lock(&o->lock);
	for (uint64_t i = 0; i < n && keep == n; i++)
		if (cache_rec_valid(o, &recs[i], b0 + i) &&
		    cache_verified(o, b0 + i))
			keep = i;
	pthread_mutex_unlock(&o->lock);
	while (n > keep)
		cache_unclaim(o, b0 + --n);
	return n;
}

/* Decide which of the n claimed blocks to fetch (fetch[i]): those without
 * a valid record, and those whose data on disk fails its checksum (marked
 * damaged). Returns 0 or -errno. */
static int cache_fill_recheck(struct cache_obj *o, uint64_t b0, uint64_t n,
			      struct cache_rec *recs, char *buf, bool *fetch)
{
	struct cache *c = o->c;
	int ret;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t b = b0 + i, len = cache_block_len(o, b);
		char *p = buf + i * c->bs;

		fetch[i] = true;
		if (!cache_rec_valid(o, &recs[i], b))
			continue;
		/* Landed meanwhile (or a corrupt block): check it. */
		struct uring_io io = { p, len, o->data_off + b * c->bs };

		ret = uring_rw(o->fd, &io, 1, false);
		if (ret == -EIO) /* unreadable, or past a cut-off end */
			continue;
		if (ret)
			return ret;
		if (XXH3_64bits(p, len) == recs[i].sum) {
			fetch[i] = false;
			continue;
		}
		cache_log_corrupt(o, b);
		/* Claimed: marked, so that a failed fetch leaves it damaged
		 * (absent to readers) rather than trusted. */
		(void)cache_mark_damaged(o, b, &recs[i]);
	}
	return 0;
}

/* Fetch the blocks marked in fetch into buf in one objstore_get_many,
 * hashing them as they arrive into rx (when not NULL); *nfetch and *cost:
 * how many blocks and what they cost the cache. Returns 0 or -errno (the
 * first failed block's, through cache_fetch_error). */
static int cache_fill_fetch(struct cache_obj *o, uint64_t b0, uint64_t n,
			    const bool *fetch, char *buf, struct cache_rx *rx,
			    uint64_t *nfetch, uint64_t *cost)
{
	struct cache *c = o->c;
	struct objstore_get_req reqs[CACHE_MAX_BATCH];
	uint64_t t0;
	int ret;

	*nfetch = 0;
	*cost = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (!fetch[i])
			continue;
		reqs[*nfetch] = (struct objstore_get_req){
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
		(*nfetch)++;
		*cost += cache_block_cost(o, b0 + i);
	}
	if (!*nfetch)
		return 0;
	t0 = metrics_start();
	ret = objstore_get_many(o->os, reqs, *nfetch);
	metrics_observe_since(METRICS_HIST_FETCH, t0);
	for (uint64_t i = 0; !ret && i < *nfetch; i++)
		if (reqs[i].got != reqs[i].len)
			ret = -EIO;
	if (ret) {
		uint64_t bad = b0;

		for (uint64_t i = 0; i < *nfetch; i++)
			if (reqs[i].result) {
				bad = reqs[i].off / c->bs;
				if (ret == -EIO)
					ret = reqs[i].result;
				break;
			}
		return cache_fetch_error(o, bad, ret);
	}
	cache_count(&c->fetches, *nfetch);
	cache_count_misses(o, *nfetch);
	return 0;
}

/* Record the fetched blocks' checksums and write them to the cache within
 * its space (evicting once more when the disk is fuller than counted).
 * Sets *no_space when they could not be stored: the read goes on
 * uncached. Returns 0 or -errno. */
static int cache_fill_store(struct cache_obj *o, uint64_t b0, uint64_t n,
			    const bool *fetch, struct cache_rec *recs,
			    char *buf, struct cache_rx *rx, uint64_t cost,
			    bool *no_space)
{
	struct cache *c = o->c;
	int ret;

	for (uint64_t i = 0; i < n; i++) {
		if (!fetch[i])
			continue;
		recs[i].sum = cache_rx_sum(rx ? &rx[i] : NULL, buf + i * c->bs,
					   cache_block_len(o, b0 + i));
		recs[i].magic = CACHE_REC_MAGIC;
		recs[i].check = cache_rec_check(o, &recs[i], b0 + i);
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
			if (ret == -ENOSPC || ret == -EDQUOT)
				cache_note_disk_full(c, ret, "fetched blocks");
			else
				log_warn("cache: %s/%s: cannot store "
					 "blocks: %s; reading uncached",
					 o->dataset, o->key, strerror(-ret));
			ret = -ENOSPC;
		}
	}
	if (ret == -ENOSPC) {
		*no_space = true;
		cache_count(&c->streamed, 1);
		ret = 0;
	}
	return ret;
}

/* The n blocks in buf are filled: mark them verified (the stored ones),
 * copy what the read wants to out, count them and, when stored, land buf
 * for readers waiting on these blocks. Returns true when buf was handed
 * over (landed). */
static bool cache_fill_done(struct cache_obj *o, uint64_t b0, uint64_t n,
			    const bool *fetch, char *buf,
			    const struct cache_out *out, bool no_space)
{
	struct cache *c = o->c;
	uint64_t s = b0 * c->bs, e = s, used = 0, os, oe;

	pthread_mutex_lock(&o->lock);
	for (uint64_t i = 0; i < n; i++)
		if (!no_space || !fetch[i])
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
			cache_count_hits(o, 1);
	}
	if (no_space)
		return false;
	/* Readers waiting for these blocks take them from memory
	 * (landed before the claims go, so that they find it). */
	for (uint64_t i = 0; i < n; i++)
		e += cache_block_len(o, b0 + i);
	if (out && out->len && cache_span(s, e, out->off, out->len, &os, &oe)) {
		used = oe - os;
		cache_drop_pages(o, os, used);
	}
	return cache_land_publish(o, b0, n, buf, used);
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
	struct cache_rec recs[CACHE_MAX_BATCH];
	struct cache_rx *rx = NULL; /* per block (not per request) */
	bool fetch[CACHE_MAX_BATCH];
	uint64_t n = 0, nfetch = 0, cost = 0;
	char *buf = NULL;
	int ret;

	if (max > c->batch)
		max = c->batch;
	ret = cache_fill_claim(o, b0, max, wait, &n);
	if (ret)
		return ret == -EAGAIN ? 0 : ret;
	buf = cache_buf_get(c);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	ret = cache_read_recs(o, b0, n, recs);
	if (ret)
		goto out;
	n = cache_fill_trim(o, b0, n, recs);
	if (n == 0) {
		ret = -EALREADY;
		goto out;
	}
	ret = cache_fill_recheck(o, b0, n, recs, buf, fetch);
	if (ret)
		goto out;
	/* Without it (no memory) each block is hashed after it arrives. */
	rx = aligned_alloc(64, ((n * sizeof(*rx)) + 63) & ~(size_t)63);
	ret = cache_fill_fetch(o, b0, n, fetch, buf, rx, &nfetch, &cost);
	if (!ret && nfetch)
		ret = cache_fill_store(o, b0, n, fetch, recs, buf, rx, cost,
				       no_space);
	if (ret)
		goto out;
	if (cache_fill_done(o, b0, n, fetch, buf, out, *no_space))
		buf = NULL;
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

		cache_block_span(o, k, out->off, out->len, &s, &en);
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
		cache_count_hits(o, 1);
		cache_count(&c->bytes_from_cache,
			    ios[i].len < len && direct[i] ? ios[i].len : len);
	}
	if (ret > 0) {
		/* The reader has its bytes (and, for dstagefs, the kernel
		 * keeps them in the mount's page cache). */
		uint64_t ds, de;

		if (cache_span(b * bs, (b + (uint64_t)ret) * bs, out->off,
			       out->len, &ds, &de))
			cache_drop_pages(o, ds, de - ds);
	}
out:
	free(tmp);
	return ret;
}

/* Check block b's bytes (p, len) against its record r, unless this process
 * verified it already; one that passes is marked verified. */
bool cache_check_block(struct cache_obj *o, uint64_t b, const void *p,
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
bool cache_file_covers(struct cache_obj *o, uint64_t b1)
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
int cache_verify_map(struct cache_obj *o, uint64_t b, const struct cache_rec *r)
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
int cache_obj_range(struct cache_obj *o, uint64_t b, uint64_t e, bool wait,
		    bool verify, const struct cache_out *out, bool *no_space)
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
		if (cache_rec_valid(o, &recs[0], b)) {
			if (out && cache_land_copy(o, b, out)) {
				b++;
				continue;
			}
			while (k < n && cache_rec_valid(o, &recs[k], b + k))
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
			while (k < n && !cache_rec_valid(o, &recs[k], b + k))
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
