/* SPDX-License-Identifier: MIT */
/*
 * cache: the node-local block cache shared by dstagefs and the stager daemon.
 *
 * Objects are cached in fixed-size blocks (cache.block_size, chosen when the
 * cache directory is created and recorded there). An object is identified by
 * its dataset, key and ETag: a new version of a key is a different object.
 * A block is present only once its data and checksum are durable; every read
 * of a cached block checks its checksum, and a mismatch is counted, logged
 * (dataset, key, block), re-fetched and never returned. Fills are claimed with
 * OFD byte-range locks, so each block is fetched once across processes and
 * threads, and a killed filler's claim is released by the kernel.
 *
 * One struct cache per process; it is thread-safe. Every function returns 0
 * (or a count) or -errno:
 *   -ENOENT     the object is gone at the source
 *   -ESTALE     the source object changed (If-Match failed): never mixed bytes
 *   -EIO        source errors after the retry budget, or local I/O errors
 *   -ENOSPC     (cache_fetch only) nothing can be evicted to make room, or
 *               cache.dir's file system is full (cache_disk_full tells)
 *   -ETIMEDOUT  a lock on a cache file stayed held by another process past
 *               its bound (DSTAGE_CACHE_LOCK_TIMEOUT seconds, default 30);
 *               the holder is logged
 *   -ENOMEM, -EINVAL
 * Reads never fail because the cache is full: they stream through uncached.
 */
#ifndef DSTAGE_CACHE_H
#define DSTAGE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

struct dstage_config;
struct objstore;
struct cache;

/* What to read: one object version of one dataset. */
struct cache_object {
	const char *dataset; /* dataset name: pins, quotas, priorities */
	struct objstore *os; /* the dataset's source */
	const char *key; /* key in os */
	const char *etag; /* version (If-Match); "" if the source has none */
	uint64_t size; /* from the manifest */
};

struct cache_stats {
	uint64_t capacity; /* cache.size, or its override (cache_limits) */
	uint64_t used; /* bytes of present blocks */
	uint64_t pinned; /* of which in pinned datasets */
	uint64_t hits; /* blocks served from the cache (file or memory) */
	uint64_t misses; /* blocks fetched from the source for a reader */
	uint64_t bytes_from_cache, bytes_from_source;
	uint64_t fetches; /* blocks fetched from the source */
	uint64_t checksum_failures; /* cached blocks found corrupt */
	uint64_t evictions; /* object files evicted (whole files, not blocks) */
	uint64_t streamed; /* reads or fills served uncached (cache full) */
	uint64_t disk_full; /* of which: cache.dir's file system was full */
	/* Landed fills (fill buffers kept for waiting readers), each charged
	 * a whole fill buffer: */
	uint64_t land_limit; /* bytes they may hold in all */
	uint64_t land_bytes, land_peak; /* held now, most ever held */
	uint64_t lands_refused; /* not kept: land_limit reached */
	uint64_t lands_displaced; /* dropped early: per-object limit */
	/* Descriptors handed out by cache_open_passthrough. */
	uint64_t passthrough_opens;
	/* Of them, for objects this process no longer had open but had found
	 * whole before: their records not read again (lib/cache/
	 * cache_whole.c). */
	uint64_t passthrough_remembered;
};

/* A dataset's eviction policy, as its caller keeps it. */
struct cache_policy {
	bool pinned; /* never evicted */
	uint64_t quota; /* bytes it may hold; 0: no quota */
	int priority; /* lower priorities are evicted first */
	bool restricted; /* readable by one group only: its name is kept off
			    pages every local user can read (metrics) */
};

/* Capacity and watermarks overriding cache.size, cache.high_watermark and
 * cache.low_watermark (cachectl policy set); 0: the configuration's. */
struct cache_limits {
	uint64_t capacity; /* bytes */
	unsigned high, low; /* percent */
};

/*
 * Where the cache takes policies from (lib/glue/cachepol.c reads the catalog).
 * lookup fills *p for a dataset and returns 0, -ENOENT (no such dataset:
 * no pin, quota or priority) or another -errno (the cache keeps the last
 * policy it had). It is called from any thread of the cache, at most once
 * per dataset every 2 seconds, with the cache's table lock held: it must
 * not call into the cache, and should be quick.
 */
struct cache_policy_source {
	int (*lookup)(void *arg, const char *dataset, struct cache_policy *p);
	/*
	 * May be NULL. Fill *l with the overrides in force; 0, or -errno
	 * (the cache keeps the limits it has). Called as lookup is, at most
	 * once every 2 seconds, before a reservation or eviction, with the
	 * cache's eviction lock held. Limits whose low watermark is not
	 * below the high one are ignored (logged).
	 */
	int (*limits)(void *arg, struct cache_limits *l);
	void *arg;
};

/*
 * Open (creating if needed) the cache in cfg->cache_dir, with the eviction
 * policy (pins, quotas, priorities) from pol (copied; NULL: none; pol->arg
 * must outlive the cache). cfg must outlive the cache.
 *
 * cache.dir must be owned by the process's euid and not writable by group
 * or others: -EACCES otherwise (logged with the chown/chmod that fixes it).
 * The cache keeps its directories 0700 and its files 0600; an older cache's
 * looser modes are tightened here (one log line).
 * -EACCES/-ENOENT/-ENOTDIR for a bad cache.dir; -EINVAL if the directory
 * was created with another block size (message names both).
 */
int cache_open(const struct dstage_config *cfg,
	       const struct cache_policy_source *pol, struct cache **out);

/* Accepts NULL. */
void cache_close(struct cache *c);

uint32_t cache_block_size(const struct cache *c);

/*
 * Drop-behind: once a read has its bytes, ask the kernel to drop the cache
 * file's pages of them (POSIX_FADV_DONTNEED). For a reader that keeps its
 * own copy, such as dstagefs, whose mount keeps read data in the kernel's
 * page cache: holding the bytes twice would halve what fits in RAM. Off by
 * default; set it before the first read. Accepts NULL.
 */
void cache_set_drop_behind(struct cache *c, bool on);

/*
 * After bytes [off, off + len) of an object of obj_size bytes were sent from
 * a cache_read_fd descriptor (fd, fd_off as returned): drop-behind for them,
 * if on. Takes the size, not the object: once a reply is sent, the caller's
 * copy of the object may be gone (FUSE may release the file at once).
 */
void cache_read_fd_done(struct cache *c, uint64_t obj_size, int fd,
			uint64_t fd_off, uint64_t off, size_t len);

/*
 * Read up to len bytes at off into buf through the cache, fetching missing
 * blocks (and reading ahead when the access pattern is sequential). Returns
 * the bytes read (short only at the end of the object) or -errno.
 */
ssize_t cache_read(struct cache *c, const struct cache_object *obj,
		   uint64_t off, size_t len, void *buf);

/* Receives the bytes of a cache_read_iov (n == 0: none, past the end). The
 * iovecs are valid only during the call. Returns 0 or -errno. */
typedef int (*cache_iov_fn)(void *arg, const struct iovec *iov, int n);

/* cache_read_iov flags. */
enum {
	/*
	 * A bulk reader that runs several reads at once (stage, verify):
	 * ranges wholly present are read with O_DIRECT in one batch, with
	 * no page cache and no readahead, and handed over without a copy.
	 */
	CACHE_READ_DIRECT = 1u << 0,
	/*
	 * The caller reads the object whole, front to back (stage): at its
	 * first read (off 0) of an object with nothing on disk yet, the
	 * object's room in its file is allocated in one piece first, so
	 * that fills landing in parallel and out of order leave it in one
	 * extent rather than dozens (cache_obj_prealloc, docs/cache.md).
	 */
	CACHE_READ_WHOLE = 1u << 1,
};

/*
 * Read [off, off + len) (cut at the object's end) as cache_read does, but
 * hand the bytes to fn: straight from memory when they all sit in fills
 * that just landed (a cold sequential read, mostly: no copy), otherwise
 * read into buf (len bytes) and passed as one iovec. fn is called once,
 * unless the read fails first. flags: CACHE_READ_*. Returns fn's result or
 * the read's -errno (as cache_read).
 */
int cache_read_iov(struct cache *c, const struct cache_object *obj,
		   uint64_t off, size_t len, void *buf, unsigned flags,
		   cache_iov_fn fn, void *arg);

/*
 * Zero-copy read support: when [off, off+len) (at most 64 blocks) lies in
 * present blocks, return a file descriptor (a dup the caller closes) and the
 * offset in it where the bytes start, for splice. Blocks this process has
 * not verified yet are checked first, in place in the page cache (a mapping
 * of the file, no copy), waiting while another thread of this process
 * verifies or fills one. -EAGAIN when not possible: a block absent, just
 * landed in memory, failing its checksum or not mappable; the caller then
 * uses cache_read or cache_read_iov, which fetch, copy or repair.
 */
int cache_read_fd(struct cache *c, const struct cache_object *obj, uint64_t off,
		  size_t len, int *fd, uint64_t *fd_off);

/*
 * Make [off, off+len) of the object present (len 0: to the end) without
 * copying it out: the stager's prewarm. progress (may be NULL) is called as
 * blocks land with the bytes done so far; a non-zero return cancels with that
 * value. Returns 0, -ENOSPC when the cache cannot hold the range (nothing
 * left to evict), or -errno.
 */
typedef int (*cache_progress_cb)(void *arg, uint64_t done);
int cache_fetch(struct cache *c, const struct cache_object *obj, uint64_t off,
		uint64_t len, cache_progress_cb progress, void *arg);

/* Bytes of the object present in the cache. */
int cache_object_present(struct cache *c, const struct cache_object *obj,
			 uint64_t *bytes);

/*
 * When the object was last read or filled (seconds since the epoch, kept
 * in its file's header, CACHE_ATIME_STEP apart): cachectl's last access and
 * evict --older-than. -ENOENT when the cache holds no file for it.
 */
int cache_object_atime(struct cache *c, const struct cache_object *obj,
		       uint64_t *atime);

/*
 * Check every present block of the object against its checksum without
 * fetching anything (stager verify, crash tests): *present gets the number
 * of present blocks, *bad those whose bytes fail their checksum (each is
 * counted in checksum_failures, logged and marked damaged: no passthrough
 * open of the object in any process until the next read re-fetches it).
 * Returns 0 or -errno (-EIO for a local read error).
 */
int cache_object_verify(struct cache *c, const struct cache_object *obj,
			uint64_t *present, uint64_t *bad);

/*
 * What cache_object_check found in one object: its blocks (from its size),
 * how many are present, and of those how many fail their checksum, found
 * now (and marked damaged) or marked so by an earlier check or read. bad_fn
 * (may be NULL) is called for each failing block with its index and the
 * object's cache file (absolute path), from the caller's thread.
 */
struct cache_check {
	uint64_t blocks, present, bad;
	void (*bad_fn)(void *arg, uint64_t block, const char *path);
	void *arg;
};

/*
 * As cache_object_verify, naming each damaged block through chk->bad_fn;
 * never contacts the source. A block that is not present (never fetched,
 * or evicted) is neither bad nor present: blocks - present are missing.
 * Returns 0 or -errno (-EIO for a local read error, -EINVAL).
 */
int cache_object_check(struct cache *c, const struct cache_object *obj,
		       struct cache_check *chk);

/*
 * Whether cache.dir is still the directory the cache opened, with its
 * identity file and objects/. When it or its contents were removed under
 * the running process, recreate them empty (logged once as an error naming
 * the path: the blocks are gone and will be fetched again), forget the
 * open objects nobody uses and recount usage. For a caller whose read
 * failed with a local error (-ENOENT opening a cache file, mostly), to
 * tell the cache's side from the source's. Returns 0 when it was intact,
 * 1 when this call recreated it, -EACCES when a directory now at the path
 * is not this process's alone (refused, logged with the fix), or -errno.
 */
int cache_dir_recover(struct cache *c);

/*
 * Make one block of the object absent: its record is cleared (under the
 * block's fill lock, so no fill of it is torn), whatever its bytes. For the
 * scrub (lib/glue/cachescrub.c), which found the block damaged: the object
 * is no longer complete, so no open hands its file to the kernel (FUSE
 * passthrough) and every read fetches the block again. Its disk space is
 * kept (the next fill writes the same place). Returns 0 (also when the
 * object has no file or the block no record), -EINVAL (block past the
 * object's end), or -errno.
 */
int cache_object_forget_block(struct cache *c, const struct cache_object *obj,
			      uint64_t block);

/*
 * cache.verify_reads (docs/cache.md): true for `always`, where every block is
 * checked when a process first reads it, so a reader must go through the
 * cache's reads: dstagefs then never opens a file in FUSE passthrough.
 * false for `fill` (the default): blocks were checked when filled and the
 * stager daemon's scrub re-checks them, and an object whose blocks are all
 * present may be handed to the kernel. true for NULL (no cache: nothing to
 * pass through).
 */
bool cache_verify_reads_always(const struct cache *c);

/*
 * A descriptor of the object's bytes for FUSE passthrough: the data file
 * reopened read-only (O_RDONLY | O_CLOEXEC; not the cache's own O_RDWR
 * descriptor), its bytes the object's from offset 0. Given only when the
 * object's files are format version 3, the data file is exactly the
 * object's size, every block's record on disk is present and valid (read
 * at this call: another process's scrub may have cleared one), and
 * cache.verify_reads is not `always`. The descriptor's open file
 * description holds the data file's shared in-use lock (CACHE_LOCK_INUSE)
 * as long as it, or anything it was handed to (the kernel's backing
 * file), stays open: eviction and cachectl gc treat the object as open
 * and leave it. The caller closes *fd. Returns 0, -EAGAIN when the object
 * cannot be passed through (no file, partial, empty, an older format,
 * verify_reads = always: the caller reads through the cache instead),
 * -ETIMEDOUT (a lock wait), -EINVAL, or -errno (-EMFILE, -EIO).
 */
int cache_open_passthrough(struct cache *c, const struct cache_object *obj,
			   int *fd);

/*
 * Mark the object as whole if it is (cached in format version 3, every
 * block's record valid now), in its data file (an extended attribute,
 * docs/cache.md "The whole-object memo"), so that a passthrough open in
 * any process, a dstagefs started later included, hands it over without
 * reading its records again (stager stage calls it for each object it
 * filled). A damage found later anywhere makes every mark stale. Returns
 * 1 (whole; marked where the file system takes the attribute), 0 (not
 * whole, not cached, or no shared damage generation), -EINVAL, or the
 * -errno of opening the object's files.
 */
int cache_object_mark_whole(struct cache *c, const struct cache_object *obj);

/*
 * Drop the object's cached blocks (e.g. verify --repair after a mismatch,
 * or a dataset removed). Returns 0, -EBUSY when a reader (this process or
 * another) has the object open, or -errno.
 */
int cache_object_drop(struct cache *c, const struct cache_object *obj);

/*
 * Garbage collection (cachectl gc, lib/glue/cachegc.c decides what goes): one
 * regular file under cache.dir's objects/. object is true when it is an
 * object file of this cache, whole: its header checks out (magic, version,
 * block size, checksum) and names the object its file name is the hash of;
 * then dataset, key, etag and size say which object version it holds.
 * Otherwise it is a leftover (a torn or foreign file, a stray name) and only
 * name, bytes and mtime are set.
 */
struct cache_gc_file {
	const char *name; /* under objects/: "h2/h30", or a stray name */
	bool object;
	const char *dataset, *key, *etag;
	uint64_t size; /* the object's size */
	uint64_t bytes; /* disk bytes (allocated blocks) */
	int64_t mtime; /* seconds since the epoch */
};

/*
 * Call fn for every regular file under objects/ (one level of two-letter
 * directories, and stray files directly in objects/); strings are valid
 * only during the call. fn may call cache_gc_remove on the file it is
 * given. Takes no lock on the files. Returns 0, fn's non-zero value, or
 * -errno of objects/ itself (-EINVAL: c is NULL).
 */
typedef int (*cache_gc_fn)(void *arg, const struct cache_gc_file *f);
int cache_gc_list(struct cache *c, cache_gc_fn fn, void *arg);

/*
 * Remove the file name (a cache_gc_file's name) unless some process uses
 * it, by the cache's lock protocol: this process has it open (-EBUSY), or
 * another holds its in-use byte or a block's fill lock (-EBUSY: the
 * exclusive in-use lock, as an evictor takes it, is refused, or a fill
 * lock is held). A reader that opens it meanwhile waits for the in-use
 * lock, then finds it unlinked and starts afresh. *freed gets the disk
 * bytes freed; the usage counts drop by them. Returns 0, -EBUSY, -ENOENT
 * (gone already), -EINVAL (a name with "..", or not a regular file), or
 * -errno.
 */
int cache_gc_remove(struct cache *c, const char *name, uint64_t *freed);

/* Evict down to the low watermark now (unpinned, lowest priority, least
 * recently used first). *freed gets the bytes freed. */
int cache_evict(struct cache *c, uint64_t *freed);

void cache_get_stats(struct cache *c, struct cache_stats *st);

/*
 * Each dataset's hits and misses (blocks, as in struct cache_stats) since
 * the cache opened, for every dataset this process read or filled, in the
 * order they were first seen (stable: a dataset keeps its place). fn is
 * called after the cache's locks were released; name is valid only during
 * the call; restricted is the dataset's policy flag as last looked up. A
 * non-zero return stops and is returned. Returns 0, -ENOMEM or fn's value.
 */
typedef int (*cache_ds_stats_fn)(void *arg, const char *name, bool restricted,
				 uint64_t hits, uint64_t misses);
int cache_get_ds_stats(struct cache *c, cache_ds_stats_fn fn, void *arg);

/*
 * Whether the last time blocks (or a new object file) could not be kept,
 * the cause was cache.dir's file system being full (ENOSPC or EDQUOT from
 * the disk) rather than cache.size being taken by pinned or busy data (or a
 * dataset's quota). For a caller's message on what was not kept.
 */
bool cache_disk_full(struct cache *c);

/*
 * Known-order prefetch (dstagefs's control file): fetch these objects ahead,
 * in order, keeping at most window bytes in flight and at most half of the
 * cache's capacity ahead of the reader: what it fetched is kept from
 * eviction until a read through the cache reaches its last byte, and past
 * that budget it waits for the reader (docs/cache.md). Returns at once; the
 * work runs on the cache's background threads and is replaced by the next
 * call for the same dataset; it ends when its reader reads none of it for
 * 30 s (DSTAGE_PREFETCH_IDLE_S). objs and their strings are copied.
 * Returns 0, -EINVAL (c NULL, or objs NULL with n), -ENOMEM, or -EBUSY (the
 * cache is stopping or has no worker thread).
 */
int cache_prefetch(struct cache *c, const struct cache_object *objs, size_t n,
		   uint64_t window);

#endif
