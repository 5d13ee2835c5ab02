/* SPDX-License-Identifier: MIT */
/*
 * cache_i.h: the block cache's private header (docs/cache.md has the full
 * story). The cache is one module in nine files, seven layers: each file calls
 * only the files below it, never one above (a hook set at open is the one
 * way up, see "Hooks").
 *
 *   7  cache.c        open, close, stats; the cache.dir checks and modes
 *   6  cache_read.c   the public read paths: read, read_iov, read_fd,
 *                     fetch, present, verify, drop
 *   5  cache_ahead.c  readahead and known-order prefetch: the workers
 *   4  cache_fill.c   the fill engine: claim, fetch, hash, commit; landed
 *                     fills handed to readers; serving present blocks
 *   3  cache_obj.c    the open-object table, object files, claims and the
 *                     verified-block bitmap, the lifecycle of landed fills
 *      cache_whole.c  beside it: the objects found whole, remembered
 *                     without their descriptors
 *   2  cache_space.c  datasets (policy, usage), reservations, eviction,
 *                     the fill-buffer pool
 *   1  cache_file.c   the on-disk format: header, records, identity file,
 *                     OFD locks (bounded waits), page-cache drop-behind
 *      cache_migrate.c  over it: a version 1 or 2 one-file object made a
 *                     version 3 pair at open
 *
 * On disk (cache.dir, 0700, owned by the process's euid):
 *   dstage-cache            "dstage-cache 1\nblock_size N\n", written once
 *   objects/<h2>/<h30>      an object version's data file (0600): its
 *                           bytes at their own offsets (block b at
 *                           b * block_size), holes where absent; h =
 *                           XXH3-128 of (dataset, key, ETag, size) in hex;
 *                           its xattr user.dstage.whole once found whole
 *                           (cache_whole.c)
 *   damage.gen              16 bytes mapped shared: the damage generation
 *                           and its nonce (cache.c)
 *   objects/<h2>/<h30>.meta its sidecar (0600): a header (magic, version 3,
 *                           block size, object size, dataset, key, ETag,
 *                           header checksum, access time), then one
 *                           16-byte record per block from rec_off (XXH3 of
 *                           the block, a magic and a check word: all zeros
 *                           = absent)
 * The data file is the pair's anchor: it carries the OFD locks, it is
 * linked first and unlinked last; the sidecar is linked, replaced or
 * unlinked only by a process holding the data file's exclusive in-use
 * lock (or, for a sidecar without a data file, its own: cache_file.c).
 * Files of versions 1 and 2 (one file: header, records, then the blocks at
 * data_off) are migrated to a pair at open (cache_migrate), or read as
 * they are while another process has them open.
 *
 * Block state machine (per block, on disk):
 *
 *   ABSENT --claim(lock)--> FILLING --data written, fdatasync--> WRITTEN
 *     ^                        |                                    |
 *     |  (claim released by    |                    record written  |
 *     |   kill: still ABSENT)  v                    (no sync)       v
 *     +------------------- (fetch failed)            PRESENT <------+
 *   PRESENT --checksum mismatch (read, check)--> DAMAGED (record's magic
 *            CACHE_REC_DAMAGED, written under the block's claim; the damage
 *            generation bumped) --claim--> FILLING (re-fetched, counted)
 *   any --eviction (file unlinked)--> gone
 *
 * A block is PRESENT iff its record is valid (magic, check word) and, since
 * the record is written only after the data is durable, its data is then
 * durable too; the data checksum is still verified on every read from disk.
 *
 * Locks, in the order they may be taken:
 *   1. c->evict_lock (mutex): one reservation/eviction at a time per process.
 *   2. c->lock (mutex): the open-object table (c->buckets, o->hnext,
 *      c->idle_old/new, o->idle_prev/next, o->refs, c->nobjs, c->nbig,
 *      o->inuse_locked), the job queue (c->jobs, c->njobs,
 *      c->stopping) and c->jobs_cv; the dataset table (c->ds); the running
 *      prefetches (c->pfs), their holds and budgets. Held across
 *      these, and no other, blocking calls: one policy lookup (the caller's
 *      policy source, e.g. one catalog query: its own locks come after this
 *      one); in cache_obj_get, the re-take of an idle entry's in-use lock
 *      (a bounded wait, see OFD locks) and an fstat; in cache_trim_idle and
 *      cache_obj_get, close() of the entries it frees.
 *   3. o->lock (mutex, per open object): o->claims, o->verified, the
 *      sequential-access state (seq_next, window, ra_next), o->atime,
 *      o->pt_whole and o->pt_gen,
 *      o->dfd, o->no_direct and the landed fills (o->lands, their refs and
 *      left). Never held across I/O or while waiting for another lock.
 *   4. c->buf_lock (mutex, a leaf): the idle fill buffers.
 *   5. c->whole_lock (mutex, a leaf, never held with c->buf_lock): the
 *      memo of objects found whole (cache_whole.c).
 * OFD byte-range locks on each object file (released by the kernel when a
 * process dies):
 *   - byte CACHE_LOCK_INUSE: shared by every process using the file, taken
 *     exclusively (non-blocking) by an evictor before it unlinks the file.
 *   - byte CACHE_LOCK_BLOCK + b: exclusive while block b is being filled.
 *     Within a process all threads share one open file description, so a
 *     thread first claims b in o->claims (waiting on o->cond), then takes the
 *     OFD lock. A thread waits for an OFD lock only while it holds no other
 *     block lock; extra blocks of a batch are only tried: no deadlock across
 *     processes.
 * Every wait for an OFD lock is bounded (c->lock_wait_ms: 30 s, or
 * DSTAGE_CACHE_LOCK_TIMEOUT seconds): past it the holder is logged (range,
 * type, pid where the kernel gives one) and the caller gets -ETIMEDOUT.
 * Waits on o->cond are for a thread of this process that holds a claim: it
 * releases it after a bounded fetch (the object store's timeouts and retry
 * budget) or a bounded OFD wait.
 *
 * Hooks: eviction (layer 2) must first close this process's idle open
 * objects (layer 3), which would otherwise keep evicted files' space;
 * it calls c->release_idle, which cache_open points at cache_obj_trim_all.
 *
 * Landed fills: a fill keeps its buffer, after its blocks became PRESENT,
 * for the readers that waited on them (struct cache_land); they copy from
 * memory instead of reading the file back. Only PRESENT, verified bytes
 * land, so a landed fill is just a faster copy of what the file holds.
 *
 * Memory: per open object (idle ones kept: see CACHE_MAX_OPEN_SMALL) a
 * bitmap of verified blocks, capped at CACHE_VERIFIED_MAX_BITS; fill buffers
 * of CACHE_BATCH_BYTES per filling thread, up to CACHE_BUSY_BUFS of them kept
 * while fills run and CACHE_FREE_BUFS when idle; landed fills, at most CACHE_LAND_BYTES, only for objects in
 * use. Nothing is kept per block of objects nobody reads. A running
 * known-order prefetch keeps 16 bytes per list entry (its lookup by name)
 * and one hold per entry it runs ahead with (CACHE_PF_HOLD_MAX at most).
 */
#ifndef DSTAGE_CACHE_I_H
#define DSTAGE_CACHE_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "dstage/cache.h"

#define CACHE_ID_FILE "dstage-cache"
/* The damage generation shared by every process of the cache (cache.c):
 * the generation and a nonce (drawn by the first process to find none),
 * 8 bytes each, mapped shared. */
#define CACHE_GEN_FILE "damage.gen"
#define CACHE_GEN_BYTES 16 /* its mapping: generation, nonce */
#define CACHE_PATH_MAX 40 /* an object's "h2/h30" and its NUL, with room */
/* The extended attribute of a data file found whole (cache_whole.c). */
#define CACHE_WHOLE_XATTR "user.dstage.whole"
#define CACHE_OBJ_MAGIC "DSTGOBJ1"
/* 3: the object's bytes at offset 0 of their own file, header and records
 * in a sidecar (FUSE passthrough hands the kernel the data file). 2: one
 * file, a record's check word bound to its object as well as to its block
 * (seeded with the header's hdr_sum). 1: one file, records bound to the
 * block only. Versions 1 and 2 are migrated at open (cache_migrate); a
 * version 1 file's records keep their seed (CACHE_HDR_SEED0). */
#define CACHE_OBJ_VERSION 3
#define CACHE_OBJ_VERSION_2 2
#define CACHE_OBJ_VERSION_1 1
#define CACHE_META_SUFFIX ".meta"
#define CACHE_HDR_SEED0 1u /* v3 flags: records seeded with b alone */
/* A migration that must copy (no FALLOC_FL_COLLAPSE_RANGE) holds the
 * object's exclusive lock while it copies: larger objects stay in their
 * old format (read as they are, never passed through) rather than make
 * other openers wait past their bound. */
#define CACHE_MIGRATE_COPY_MAX (256ull << 20)
#define CACHE_REC_MAGIC 0x4b4c4231u /* "1BLK" */
/* A block found damaged (its bytes fail the record's sum) and not yet
 * fetched again: absent to every reader, reported by cache_object_check. */
#define CACHE_REC_DAMAGED 0x4d414431u /* "1DAM" */
#define CACHE_HDR_FIXED 64
#define CACHE_ALIGN 4096
#define CACHE_HUGE_PAGE (2u << 20) /* fill buffers: see cache_buf_get */
#define CACHE_LOCK_INUSE (1LL << 62)
#define CACHE_LOCK_BLOCK (CACHE_LOCK_INUSE + 1)
#define CACHE_LOCK_WAIT_S 30 /* default bound of an OFD lock wait */
#define CACHE_MAX_OPEN 64 /* idle open objects kept larger than ... */
#define CACHE_SMALL_AHEAD (1u << 20) /* ... this (object files read whole) */
/* Idle open objects kept in all (fewer under a low RLIMIT_NOFILE): an open
 * descriptor keeps the file's inode and directory entry in memory, so a
 * small file read again after the page cache was dropped costs one disk
 * read, not three (objects/xx, the inode, the file). */
#define CACHE_MAX_OPEN_SMALL 8192
/* ... and of those small idle ones at most this many bytes: an idle
 * descriptor of a file another process evicted keeps its space until it
 * is closed, so this bounds what the disk may hold beyond the capacity
 * (as 1,024 objects of at most 1 MiB did before the table grew). */
#define CACHE_IDLE_SMALL_BYTES (1ull << 30)
#define CACHE_VERIFIED_MAX_BITS (1u << 22)
#define CACHE_BATCH_BYTES (16u << 20)
#define CACHE_MAX_BATCH 64
#define CACHE_POOL_THREADS 4
#define CACHE_FREE_BUFS CACHE_POOL_THREADS /* idle fill buffers kept */
/* Fill buffers kept while fills are running: as many as can be in use at
 * once (the workers' and the landed fills'), so that a stream reuses them
 * instead of faulting in (and zeroing) fresh pages; trimmed back to
 * CACHE_FREE_BUFS once the workers saw no job for CACHE_BUF_IDLE_S. */
#define CACHE_BUSY_BUFS \
	(CACHE_POOL_THREADS + CACHE_LAND_BYTES / CACHE_BATCH_BYTES)
#define CACHE_BUF_IDLE_S 2
#define CACHE_LAND_MAX 8 /* landed fills kept per open object */
#define CACHE_LAND_BYTES (256u << 20) /* landed fills kept in all */
#define CACHE_IOV_MAX 8 /* blocks handed out as iovecs in one call */
#define CACHE_DFD_UNSET (-2)
#define CACHE_DROP_SLACK (2u << 20) /* largest page-cache folio expected */
#define CACHE_DROP_CHUNK (16u << 20) /* drop-behind granularity */
#define CACHE_MAX_JOBS 64
/* Most list entries one known-order prefetch fetches at once. */
#define CACHE_PREFETCH_MAX 32
/* A prefetch runs ahead of its reader by at most 1/CACHE_PF_SHARE of the
 * cache's capacity (and of its dataset's quota), and by at most
 * CACHE_PF_HOLD_MAX list entries (half the open objects kept, when fewer). */
#define CACHE_PF_SHARE 2
#define CACHE_PF_HOLD_MAX 256
/* Entries this far behind the furthest one the reader read are let go. */
#define CACHE_PF_LAG (2 * CACHE_PREFETCH_MAX)
/* A prefetch whose reader read none of its entries for this long (seconds;
 * DSTAGE_PREFETCH_IDLE_S overrides) lets them go and ends. */
#define CACHE_PF_IDLE_S 30
#define CACHE_PF_TICK_MS 1000 /* longest wait between two looks */
/* A read tells the prefetch its reader moved on at an object's first and
 * last bytes and each time it crosses a multiple of this (at 3 MB/s a
 * reader of one huge object still shows progress within CACHE_PF_IDLE_S). */
#define CACHE_PF_MARK (64u << 20)
#define CACHE_POLICY_TTL 2 /* seconds a dataset's policy is trusted */
#define CACHE_ATIME_STEP 1 /* access time granularity, seconds */
#define CACHE_UNMARKED_MAX 64 /* struct cache's unmarked ring */
#define CACHE_WHOLE_MIN 4096 /* the whole-object memo's first slots */
#define CACHE_WHOLE_MAX (1u << 20) /* ... and most (cache_whole.c) */
#define CACHE_WHOLE_PROBE 8 /* slots an entry may take from its home */
#define CACHE_EVICT_HEAP 1024 /* victims chosen per directory scan */
#define CACHE_DIR_MODE 0700
#define CACHE_FILE_MODE 0600
#define CACHE_DISK_FULL_LOG_S 10 /* at most one "disk full" line per this */

/* On-disk object header (host byte order: caches are node-local). */
struct cache_hdr {
	char magic[8];
	uint32_t version;
	uint32_t block_size;
	uint64_t size;
	uint64_t data_off; /* 0 in version 3: the data is in its own file */
	uint32_t ds_len, key_len, etag_len;
	uint32_t flags; /* version 3: CACHE_HDR_SEED0; 0 before */
	uint64_t hdr_sum; /* XXH3 of bytes [0, 48) and the strings */
	uint64_t atime; /* last access, seconds; not in hdr_sum */
};

/* On-disk block record. */
struct cache_rec {
	uint64_t sum; /* XXH3_64bits of the block's bytes */
	uint32_t magic; /* CACHE_REC_MAGIC */
	uint32_t check; /* XXH3 of the 12 bytes above, seeded with b and the
			 * object (cache_rec_check) */
};

_Static_assert(sizeof(struct cache_hdr) == CACHE_HDR_FIXED, "header size");
_Static_assert(sizeof(struct cache_rec) == 16, "record size");

/* Where an object's file(s) keep things (cache_hdr_check). */
struct cache_layout {
	uint32_t version; /* CACHE_OBJ_VERSION(_2, _1) */
	uint32_t flags; /* the header's */
	uint64_t data_off; /* block b at data_off + b * block_size */
	uint64_t rec_off; /* in the header's file */
	uint64_t rec_seed; /* see cache_obj.rec_seed */
};

/* A dataset's policy (from the caller's policy source) and usage (from
 * scans and fills). Every field: c->lock. */
struct cache_ds {
	struct cache_ds *next;
	char *name;
	struct cache_policy pol;
	time_t loaded; /* when the policy was read; 0: never */
	uint64_t used; /* bytes, estimate */
	uint64_t pf_gen; /* generation of the current prefetch */
	/* Blocks, as c->hits and c->misses but for this dataset: lock-free
	 * adds through o->ds (the entry lives until cache_close). */
	_Atomic uint64_t hits, misses;
};

/* A copy of a dataset's policy and usage (cache_usage_of). */
struct cache_usage {
	struct cache_policy pol;
	uint64_t used;
};

/* An object version open in this process. */
struct cache_obj {
	struct cache *c;
	struct cache_obj *hnext; /* in its chain of c->buckets; c->lock */
	/* in c->idle_old..c->idle_new while refs == 0; c->lock */
	struct cache_obj *idle_prev, *idle_next;
	unsigned refs; /* c->lock */
	char name[33]; /* hex hash */
	char *dataset, *key, *etag;
	struct cache_ds *ds; /* set before the object is listed; its counters */
	struct objstore *os;
	uint64_t size, nblocks, rec_off, data_off;
	/* What each record's check word is seeded with besides its block
	 * number (cache_rec_check): the header's hdr_sum, which names this
	 * object version; 0 for records of a version 1 file (bound to the
	 * block only), migrated or not. */
	uint64_t rec_seed;
	uint32_t version, hdr_flags; /* the header's (set at open) */
	int fd; /* the data file: block data, OFD locks */
	int mfd; /* header and records: the sidecar, or fd (versions 1, 2) */
	int dfd; /* o->lock: O_DIRECT writer, CACHE_DFD_UNSET or -1 (none) */
	bool no_direct; /* o->lock: direct writes were refused */
	bool prealloc_tried; /* o->lock: cache_obj_prealloc ran */
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
	/* A passthrough open found every block's record valid while the
	 * damage generation was pt_gen (cache_open_passthrough). */
	bool pt_whole;
	uint64_t pt_gen;
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

struct cache_pf; /* a prefetch running (cache_ahead.c) */
struct cache_whole_ent; /* an object found whole (cache_whole.c) */
struct cache_pf_hold; /* an entry it fetched for its reader */

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
	struct cache_policy_source pol; /* .lookup NULL: no policy */
	uint32_t bs;
	int dir_fd, objects_fd;
	/* bytes; set at open, then by cache_limits_refresh under evict_lock;
	 * read anywhere */
	_Atomic uint64_t capacity, high, low;
	time_t limits_loaded; /* evict_lock */
	unsigned batch; /* blocks per fill */
	unsigned lock_wait_ms; /* bound of an OFD lock wait */
	/* Layer 3's cache_obj_trim_all, for eviction (see "Hooks"). */
	void (*release_idle)(struct cache *c);

	pthread_mutex_t evict_lock;
	pthread_mutex_t lock;
	pthread_cond_t jobs_cv;
	/* The open objects, chained by the first hex digits of their name
	 * (nbuckets, a power of two, set at open), and the idle ones among
	 * them from the least recently used (idle_old) to the most. */
	struct cache_obj **buckets;
	size_t nbuckets;
	struct cache_obj *idle_old, *idle_new;
	uint64_t idle_small_bytes; /* the sizes of the idle small ones */
	size_t nobjs;
	size_t nbig; /* of them, larger than CACHE_SMALL_AHEAD */
	size_t max_open; /* set at open: CACHE_MAX_OPEN_SMALL or fewer */
	/* Objects (file names) holding a damaged block whose mark could not
	 * be written (cache_mark_damaged): their records still say valid, so
	 * this process never passes them through (cache_whole). A ring of
	 * the last CACHE_UNMARKED_MAX; c->lock. */
	char unmarked[CACHE_UNMARKED_MAX][33];
	/* entries written (the ring holds the last); read without c->lock
	 * only to see that there are none */
	_Atomic unsigned nunmarked;
	struct cache_ds *ds;
	struct cache_job *jobs, **jobs_tail;
	size_t njobs;
	bool stopping;
	struct cache_pf *pfs; /* prefetches running (cache_ahead.c) */
	_Atomic unsigned pf_running; /* of them: reads look when > 0 */
	pthread_t pool[CACHE_POOL_THREADS];
	unsigned npool;

	/* c->buf_lock (a leaf: nothing is taken while holding it): */
	pthread_mutex_t buf_lock;
	void *free_bufs[CACHE_BUSY_BUFS]; /* fill buffers, c->batch blocks */
	unsigned busy_bufs; /* set at open: kept while fills run (<= the
			     * array's; fewer for buffers over 16 MiB) */
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
	_Atomic uint64_t disk_full; /* see struct cache_stats */
	_Atomic uint64_t passthrough_opens; /* see struct cache_stats */
	_Atomic uint64_t passthrough_remembered; /* see struct cache_stats */
	/* The memo of objects found whole (cache_whole.c): c->whole_lock, a
	 * leaf. */
	pthread_mutex_t whole_lock;
	struct cache_whole_ent *whole; /* nwhole slots (a power of 2, or 0) */
	size_t nwhole, whole_used;
	/* The damage generation (CACHE_GEN_FILE, mapped shared; NULL when it
	 * could not be: every passthrough open reads the records). Bumped by
	 * any process after it made a valid record invalid. */
	_Atomic uint64_t *damage_gen;
	uint64_t gen_nonce; /* set at open with damage_gen: its nonce */
	/* Data files take no CACHE_WHOLE_XATTR here (the file system
	 * refused one); set once */
	_Atomic bool whole_xattr_off;
	_Atomic int64_t disk_full_logged; /* time of the last such line */
	_Atomic bool last_nospace_disk; /* see cache_disk_full */
};

/* Where a read wants its bytes (len 0: nowhere). */
struct cache_out {
	uint64_t off;
	size_t len;
	char *buf;
};

/* A cache_iov_fn that copies into dst (nothing to do for bytes already
 * there: the fallback of cache_read_iov reads into the caller's buffer). */
struct cache_sink {
	char *dst;
	size_t got;
};

static inline void cache_count(_Atomic uint64_t *ctr, uint64_t v)
{
	atomic_fetch_add_explicit(ctr, v, memory_order_relaxed);
}

/* Count n blocks served from the cache (or fetched for a reader), in all
 * and for the object's dataset. */
static inline void cache_count_hits(struct cache_obj *o, uint64_t n)
{
	cache_count(&o->c->hits, n);
	if (o->ds)
		cache_count(&o->ds->hits, n);
}

static inline void cache_count_misses(struct cache_obj *o, uint64_t n)
{
	cache_count(&o->c->misses, n);
	if (o->ds)
		cache_count(&o->ds->misses, n);
}

/* Raise a high-water mark to v. */
static inline void cache_count_max(_Atomic uint64_t *ctr, uint64_t v)
{
	uint64_t cur = atomic_load_explicit(ctr, memory_order_relaxed);

	while (v > cur && !atomic_compare_exchange_weak(ctr, &cur, v))
		;
}

/* Subtract v from a counter, stopping at 0. */
static inline void cache_count_sub(_Atomic uint64_t *ctr, uint64_t v)
{
	uint64_t cur = atomic_load(ctr);

	while (!atomic_compare_exchange_weak(ctr, &cur, cur > v ? cur - v : 0))
		;
}

/* Make every process read the records again at its next passthrough
 * opens (cache.c, "The damage generation"): called after a valid record
 * was made invalid (absent or damaged). */
static inline void cache_gen_bump(struct cache *c)
{
	if (c->damage_gen)
		atomic_fetch_add(c->damage_gen, 1);
}

static inline uint64_t cache_roundup(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static inline uint64_t cache_block_len(const struct cache_obj *o, uint64_t b)
{
	uint64_t bs = o->c->bs;

	return b + 1 < o->nblocks ? bs : o->size - b * bs;
}

/* Disk bytes a block takes, for accounting. */
static inline uint64_t cache_block_cost(const struct cache_obj *o, uint64_t b)
{
	return cache_roundup(cache_block_len(o, b), CACHE_ALIGN);
}

static inline const char *cache_ds_or(const char *ds)
{
	return ds ? ds : "";
}

/*
 * The clamp: the part [*s, *e) of bytes [a, a_end) that [off, off + len)
 * covers. Returns whether it is not empty.
 */
static inline bool cache_span(uint64_t a, uint64_t a_end, uint64_t off,
			      uint64_t len, uint64_t *s, uint64_t *e)
{
	*s = off > a ? off : a;
	*e = off + len < a_end ? off + len : a_end;
	return *s < *e;
}

/* The clamp for block b of o (object bytes). */
static inline bool cache_block_span(const struct cache_obj *o, uint64_t b,
				    uint64_t off, uint64_t len, uint64_t *s,
				    uint64_t *e)
{
	uint64_t bstart = b * o->c->bs;

	return cache_span(bstart, bstart + cache_block_len(o, b), off, len, s,
			  e);
}

/* ---- layer 1: cache_file.c ---- */
int cache_ofd_lock(const struct cache *c, int fd, off_t byte, short type,
		   bool wait, const char *ds, const char *key,
		   const char *name);
void cache_ofd_unlock(int fd, off_t byte);
uint32_t cache_rec_check(const struct cache_obj *o, const struct cache_rec *r,
			 uint64_t b);
bool cache_rec_damaged(const struct cache_obj *o, const struct cache_rec *r,
		       uint64_t b);
bool cache_rec_valid(const struct cache_obj *o, const struct cache_rec *r,
		     uint64_t b);
int cache_pread_all(int fd, void *buf, size_t len, uint64_t off);
int cache_read_recs(struct cache_obj *o, uint64_t b0, uint64_t n,
		    struct cache_rec *recs);
void cache_obj_name(const struct cache_object *obj, char out[33]);
/* The number of an object file's name (32 hex digits, a hash already):
 * its first 16 digits, for tables keyed by it. */
uint64_t cache_name_key(const char *name);
/* Its data file's path under objects/ ("h2/h30"). */
void cache_name_path(const char *name, char out[CACHE_PATH_MAX]);
int cache_hdr_build(struct cache *c, const struct cache_object *obj,
		    uint32_t version, uint32_t flags, char **buf, size_t *len);
int cache_hdr_check(struct cache *c, int fd, bool meta,
		    const struct cache_object *obj, struct cache_layout *l);
int cache_file_info(int fd, char *ds, size_t dslen, uint64_t *atime);
void cache_meta_path(const char *data_path, char *out, size_t len);
int cache_inuse_hold(const struct cache *c, int fd, const char *ds,
		     const char *key, const char *name, struct stat *st);
int cache_hdr_write_atime(struct cache *c, const struct cache_object *obj,
			  uint32_t version, uint32_t flags, uint64_t rec_off,
			  int mfd, uint64_t t);
void cache_small_ahead(const struct cache *c, int fd, const struct stat *st);
int cache_pair_info(int dirfd, const char *data_path, int fd, char *ds,
		    size_t dslen, uint64_t *atime, uint64_t *meta_bytes,
		    int *mfdp);
int cache_pair_unlink(int dirfd, const char *data_path);
int cache_meta_replace(const struct cache *c, int dirfd, const char *data_path,
		       int mfd);
int cache_meta_orphan_drop(const struct cache *c, int dirfd,
			   const char *meta_path, uint64_t *freed);
int cache_identity(struct cache *c);
void cache_drop_range(const struct cache *c, int fd, uint64_t data_off,
		      uint64_t size, uint64_t off, uint64_t len);
void cache_drop_pages(struct cache_obj *o, uint64_t off, uint64_t len);
void cache_note_disk_full(struct cache *c, int err, const char *what);

/* ---- layer 1, over cache_file.c: cache_migrate.c ---- */
int cache_migrate(struct cache *c, int dirfd, const char *data_path, int fd,
		  const struct cache_object *obj, struct cache_layout *l,
		  int *mfd);

/* ---- layer 2: cache_space.c ---- */
struct cache_ds *cache_ds_entry(struct cache *c, const char *name);
struct cache_ds *cache_ds_get(struct cache *c, const char *name);
void cache_usage_of(struct cache *c, const char *name, struct cache_usage *u);
void cache_ds_add_used(struct cache *c, const char *name, int64_t delta);
int cache_reserve(struct cache *c, const char *ds, uint64_t bytes);
void cache_unreserve(struct cache *c, const char *ds, uint64_t bytes);
void cache_landed_bytes(struct cache *c, uint64_t bytes);
int cache_evict_bytes(struct cache *c, const char *only_ds, uint64_t need,
		      uint64_t *freed);
uint64_t cache_evict_one(struct cache *c, const char *name, char *ds,
			 size_t dslen);
/* Modes changed by the scan of cache_open. */
struct cache_modes {
	unsigned dirs, files, failed;
};
int cache_scan_all(struct cache *c, struct cache_modes *t);
void cache_ds_free_all(struct cache *c);
char *cache_buf_get(struct cache *c);
void cache_buf_put(struct cache *c, char *p);
void cache_buf_trim(struct cache *c);

/* ---- layer 3: cache_obj.c ---- */
int cache_obj_table_init(struct cache *c);
void cache_obj_trim_all(struct cache *c);
void cache_obj_close_all(struct cache *c);
int cache_obj_get(struct cache *c, const struct cache_object *obj, bool create,
		  struct cache_obj **op);
/* A reference to obj's object when this process has it open (in use or
 * idle; *op NULL when not), without its in-use lock: the caller takes
 * that lock on a description of its own, then checks the file is linked. */
void cache_obj_ref_open(struct cache *c, const struct cache_object *obj,
			struct cache_obj **op);
void cache_obj_put(struct cache_obj *o);
void cache_obj_touch(struct cache_obj *o);
void cache_obj_prealloc(struct cache_obj *o);
int cache_obj_forget(struct cache *c, const char *name);
bool cache_verified(struct cache_obj *o, uint64_t b);
void cache_set_verified(struct cache_obj *o, uint64_t b, bool on);
bool cache_claimed(struct cache_obj *o, uint64_t b);
int cache_claim_add(struct cache_obj *o, uint64_t b);
void cache_claim_drop(struct cache_obj *o, uint64_t b);
int cache_claim(struct cache_obj *o, uint64_t b, bool wait);
void cache_unclaim(struct cache_obj *o, uint64_t b);
void cache_land_unref(struct cache_obj *o, struct cache_land *l);
void cache_land_unlist(struct cache_obj *o, struct cache_land *l);
bool cache_landed(const struct cache_obj *o, uint64_t b0, uint64_t b1);
void cache_lands_drop(struct cache_obj *o);

/* Write record r as block b's, then bump the damage generation and clear
 * b's verified bit (whatever the write did: a passthrough open that read
 * the old record sees a new generation). b's claim held. 0 or -errno. */
int cache_rec_replace(struct cache_obj *o, uint64_t b,
		      const struct cache_rec *r);
/* Whether this process found damage in o that it could not mark. */
bool cache_unmarked(struct cache *c, const char *name);

/* ---- layer 3: cache_whole.c (the memo of objects found whole) ---- */
/* Remember that the data file st (of object name, open for writing as fd;
 * a version 3 header with flags) had every record valid under damage
 * generation gen, its access time last written at atime: in this
 * process's memo, and in the file (CACHE_WHOLE_XATTR) for every process.
 * Best effort: no memory, no entry; an attribute refused, none. */
void cache_whole_note(struct cache *c, const char *name, const struct stat *st,
		      int fd, uint64_t gen, uint32_t flags, time_t atime);
/* A passthrough descriptor of obj (file name) from the memo alone, its
 * access time recorded: 0 and *fd (read-only, holding the shared in-use
 * lock), -EAGAIN when the memo does not vouch for the file under damage
 * generation gen (go the long way), or the in-use lock's -errno. */
int cache_whole_open(struct cache *c, const struct cache_object *obj,
		     const char *name, uint64_t gen, int *fd);
void cache_whole_free(struct cache *c);
/* ---- layer 4: cache_fill.c ---- */
int cache_land_send(struct cache_obj *o, uint64_t off, size_t len,
		    cache_iov_fn fn, void *arg);
int cache_sink_copy(void *arg, const struct iovec *iov, int n);
int cache_obj_dfd(struct cache_obj *o);
void cache_log_corrupt(struct cache_obj *o, uint64_t b);
int cache_mark_damaged(struct cache_obj *o, uint64_t b,
		       const struct cache_rec *r);
bool cache_check_block(struct cache_obj *o, uint64_t b, const void *p,
		       size_t len, const struct cache_rec *r);
bool cache_file_covers(struct cache_obj *o, uint64_t b1);
int cache_verify_map(struct cache_obj *o, uint64_t b,
		     const struct cache_rec *r);
int cache_obj_range(struct cache_obj *o, uint64_t b, uint64_t e, bool wait,
		    bool verify, const struct cache_out *out, bool *no_space);

/* ---- layer 5: cache_ahead.c ---- */
void cache_access(struct cache_obj *o, uint64_t off, size_t len);
int cache_ahead_start(struct cache *c);
void cache_ahead_stop(struct cache *c);

#endif
