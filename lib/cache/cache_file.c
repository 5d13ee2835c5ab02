// SPDX-License-Identifier: MIT
/*
 * cache_file.c, layer 1 of the cache (lib/cache/cache_i.h draws all seven): the
 * on-disk format and the locks on it. Calls nothing else of the cache.
 *
 * An object version is a pair of files (format version 3): the data file
 * objects/h2/h30, block b's bytes at b * block_size and nothing else (its
 * size at most the object's: FUSE passthrough reads it to its end), and
 * its sidecar h30.meta: header (struct cache_hdr, then dataset, key and
 * ETag), one struct cache_rec per block from rec_off. Versions 1 and 2 are
 * one file (header, records, blocks from data_off), migrated at open
 * (cache_migrate.c, above this file) or read as they are.
 *
 * Invariants: a header is written once, before its file is linked in, and
 * never changes but for its access time; a record is written only after
 * its block's data is durable, and is valid (magic, check word) or all
 * zeros (absent); files are 0600 and directories 0700. The data file is
 * the pair's anchor and carries the OFD locks: a data file is linked before
 * its sidecar and unlinked after it (cache_pair_unlink), and a sidecar is
 * linked or unlinked only by a process holding the exclusive in-use lock
 * of the data file linked at its name, or (cachectl gc, a sidecar whose
 * data file is gone) its own exclusive in-use lock, which
 * cache_meta_replace takes too. So under a shared in-use lock of a linked
 * data file, the sidecar at its name is its own; a data file found without
 * a sidecar or a header of its own is a crash's leftover.
 *
 * OFD locks (cache_ofd_lock): a wait is a retry loop of non-blocking
 * F_OFD_SETLK calls with a growing pause (50 us to 5 ms), bounded by
 * c->lock_wait_ms; past it the holder is looked up (F_OFD_GETLK, and
 * /proc/PID/fdinfo for a pid), logged, and -ETIMEDOUT returned. Stateless:
 * nothing here holds a mutex.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "cache_i.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"
#include "util/fdutil.h"

#define CACHE_FDINFO_MAX 100000 /* fdinfo files read to find a holder */

/* Whether the text of one /proc/PID/fdinfo file shows a lock of the file
 * want ("MAJ:MIN:INO START "). */
static bool cache_fdinfo_locks(int dfd, const char *name, const char *want)
{
	char buf[4096];
	ssize_t n;
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	for (char *l = strstr(buf, "lock:"); l; l = strstr(l + 5, "lock:")) {
		char *eol = strchr(l, '\n');

		if (eol)
			*eol = '\0';
		if (strstr(l, want))
			return true;
		if (!eol)
			break;
		*eol = '\n';
	}
	return false;
}

/*
 * The pid of a process holding a lock of fd's file that starts at start:
 * F_OFD_GETLK gives none for OFD locks (nor does /proc/locks), but each
 * holder's /proc/PID/fdinfo/FD lists its locks. 0 when none is found (at
 * most CACHE_FDINFO_MAX files are read).
 */
static pid_t cache_lock_holder(int fd, off_t start)
{
	char want[96], path[64];
	struct dirent *pe, *fe;
	unsigned files = 0;
	struct stat st;
	pid_t pid = 0;
	DIR *procs;

	if (fstat(fd, &st))
		return 0;
	snprintf(want, sizeof(want), " %02x:%02x:%lu %lld ", major(st.st_dev),
		 minor(st.st_dev), (unsigned long)st.st_ino, (long long)start);
	procs = opendir("/proc");
	if (!procs)
		return 0;
	while (!pid && files < CACHE_FDINFO_MAX && (pe = readdir(procs))) {
		long p = strtol(pe->d_name, NULL, 10);
		DIR *fds;

		if (p <= 0 || p == getpid())
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/fdinfo", p);
		fds = opendir(path);
		if (!fds)
			continue;
		while (!pid && files < CACHE_FDINFO_MAX &&
		       (fe = readdir(fds))) {
			if (fe->d_name[0] == '.')
				continue;
			files++;
			if (cache_fdinfo_locks(dirfd(fds), fe->d_name, want))
				pid = (pid_t)p;
		}
		closedir(fds);
	}
	closedir(procs);
	return pid;
}

/* Which lock byte of an object file byte is, in words. */
static void cache_lock_byte_name(off_t byte, char *out, size_t len)
{
	if (byte == CACHE_LOCK_INUSE)
		snprintf(out, len, "in-use byte");
	else if (byte >= CACHE_LOCK_BLOCK)
		snprintf(out, len, "fill byte of block %lld",
			 (long long)(byte - CACHE_LOCK_BLOCK));
	else
		snprintf(out, len, "byte %lld", (long long)byte);
}

/* Log who holds the lock that fl (wanted on fd) conflicts with. */
static void cache_ofd_blame(const struct cache *c, int fd,
			    const struct flock *want, const char *ds,
			    const char *key, const char *name)
{
	struct flock fl = *want;
	char held[200], byte[48], hbyte[48];
	pid_t pid;

	cache_lock_byte_name(want->l_start, byte, sizeof(byte));
	if (fcntl(fd, F_OFD_GETLK, &fl)) {
		snprintf(held, sizeof(held), "holder unknown (F_OFD_GETLK: %s)",
			 strerror(errno));
	} else if (fl.l_type == F_UNLCK) {
		snprintf(held, sizeof(held), "released just now");
	} else {
		pid = fl.l_pid > 0 ? fl.l_pid
				   : cache_lock_holder(fd, fl.l_start);
		cache_lock_byte_name(fl.l_start, hbyte, sizeof(hbyte));
		snprintf(held, sizeof(held),
			 "held by %s%d: a %s lock from the %s, %lld byte(s)",
			 pid > 0 ? "pid " : "a process not found, pid ",
			 pid > 0 ? (int)pid : -1,
			 fl.l_type == F_WRLCK ? "write" : "read", hbyte,
			 (long long)fl.l_len);
	}
	log_error("cache: %s/%s: waited %u ms for the %s lock on the %s of "
		  "object file %s/objects/%.2s/%s, %s; giving up (ETIMEDOUT). "
		  "The bound is DSTAGE_CACHE_LOCK_TIMEOUT (seconds, default "
		  "%d)",
		  ds, key, c->lock_wait_ms,
		  want->l_type == F_WRLCK ? "write" : "read", byte,
		  c->cfg->cache_dir, name, name + 2, held, CACHE_LOCK_WAIT_S);
}

/*
 * Take an OFD lock on byte of fd (object file name of ds/key, for the log).
 * wait: retry until c->lock_wait_ms has passed, then log the holder and
 * return -ETIMEDOUT; else -EAGAIN when it is taken. Or -errno.
 */
int cache_ofd_lock(const struct cache *c, int fd, off_t byte, short type,
		   bool wait, const char *ds, const char *key, const char *name)
{
	struct flock fl = {
		.l_type = type,
		.l_whence = SEEK_SET,
		.l_start = byte,
		.l_len = 1,
	};
	uint64_t t0 = 0;
	long pause_ns = 50000;

	for (;;) {
		if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
			return 0;
		if (errno == EINTR)
			continue;
		if (errno != EACCES && errno != EAGAIN)
			return -errno;
		if (!wait)
			return -EAGAIN;
		if (!t0) {
			t0 = timeutil_mono_ms();
		} else if (timeutil_mono_ms() - t0 >= c->lock_wait_ms) {
			cache_ofd_blame(c, fd, &fl, ds, key, name);
			return -ETIMEDOUT;
		}
		nanosleep(&(struct timespec){ 0, pause_ns }, NULL);
		if (pause_ns < 5000000)
			pause_ns *= 2;
	}
}

void cache_ofd_unlock(int fd, off_t byte)
{
	struct flock fl = {
		.l_type = F_UNLCK,
		.l_whence = SEEK_SET,
		.l_start = byte,
		.l_len = 1,
	};

	while (fcntl(fd, F_OFD_SETLK, &fl) && errno == EINTR)
		;
}

/*
 * A fill or a new object file could not be written because cache.dir's
 * file system is full (err: -ENOSPC or -EDQUOT): count it, remember it for
 * cache_disk_full and say so, at most once per CACHE_DISK_FULL_LOG_S.
 */
void cache_note_disk_full(struct cache *c, int err, const char *what)
{
	int64_t now = (int64_t)time(NULL);
	int64_t last = atomic_load(&c->disk_full_logged);

	cache_count(&c->disk_full, 1);
	atomic_store(&c->last_nospace_disk, true);
	if (now - last < CACHE_DISK_FULL_LOG_S ||
	    !atomic_compare_exchange_strong(&c->disk_full_logged, &last, now))
		return;
	log_warn("cache: the file system of cache.dir %s is full (%s writing "
		 "%s): reading uncached; free space there, or set cache.size "
		 "below what it can hold",
		 c->cfg->cache_dir, strerror(-err), what);
}

/*
 * A record's check word binds it to its place: its block number b and its
 * object (o->rec_seed, the header's checksum), so a record with its block
 * copied to another block of the file, or into another object's file, is
 * not valid there (absent: the block is fetched again).
 */
uint32_t cache_rec_check(const struct cache_obj *o, const struct cache_rec *r,
			 uint64_t b)
{
	return (uint32_t)XXH3_64bits_withSeed(r, 12, b ^ o->rec_seed);
}

/* Whether r marks block b damaged (CACHE_REC_DAMAGED, its check word
 * right): a block that was present, failed its sum and was not fetched
 * again yet. Not valid: every reader fetches it. */
bool cache_rec_damaged(const struct cache_obj *o, const struct cache_rec *r,
		       uint64_t b)
{
	return r->magic == CACHE_REC_DAMAGED &&
	       r->check == cache_rec_check(o, r, b);
}

bool cache_rec_valid(const struct cache_obj *o, const struct cache_rec *r,
		     uint64_t b)
{
	return r->magic == CACHE_REC_MAGIC &&
	       r->check == cache_rec_check(o, r, b);
}

int cache_pread_all(int fd, void *buf, size_t len, uint64_t off)
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
int cache_read_recs(struct cache_obj *o, uint64_t b0, uint64_t n,
		    struct cache_rec *recs)
{
	return cache_pread_all(o->mfd, recs, n * sizeof(*recs),
			       o->rec_off + b0 * sizeof(*recs));
}

uint64_t cache_name_key(const char *name)
{
	uint64_t h = 0;

	for (int i = 0; i < 16 && name[i]; i++) {
		char ch = name[i];

		h = h << 4 |
		    (uint64_t)(ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
	}
	return h;
}

void cache_name_path(const char *name, char out[CACHE_PATH_MAX])
{
	snprintf(out, CACHE_PATH_MAX, "%.2s/%s", name, name + 2);
}

void cache_obj_name(const struct cache_object *obj, char out[33])
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

/* Build the header of obj in the given format version (flags: version 3's
 * CACHE_HDR_SEED0, else 0); *buf (hdr + strings, *len bytes) is
 * malloc'ed. A version 3 header (the sidecar's) has data_off 0. */
int cache_hdr_build(struct cache *c, const struct cache_object *obj,
		    uint32_t version, uint32_t flags, char **buf, size_t *len)
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
	h->version = version;
	h->block_size = c->bs;
	h->size = obj->size;
	h->data_off =
		version >= CACHE_OBJ_VERSION
			? 0
			: cache_roundup(
				  rec_off + nblocks * sizeof(struct cache_rec),
				  CACHE_ALIGN);
	h->ds_len = (uint32_t)dl;
	h->key_len = (uint32_t)kl;
	h->etag_len = (uint32_t)el;
	h->flags = version >= CACHE_OBJ_VERSION ? flags : 0;
	memcpy(p + CACHE_HDR_FIXED, ds, dl);
	memcpy(p + CACHE_HDR_FIXED + dl, obj->key, kl);
	memcpy(p + CACHE_HDR_FIXED + dl + kl, etag, el);
	h->hdr_sum = cache_hdr_sum(h, p + CACHE_HDR_FIXED, dl + kl + el);
	h->atime = (uint64_t)time(NULL);
	*buf = p;
	return 0;
}

/*
 * Check that the header in the open file fd belongs to obj: a sidecar's
 * (meta: version 3, flags 0 or CACHE_HDR_SEED0) or a one-file object's
 * (versions 2 and 1); *l: where things are. Returns 0, -EUCLEAN (corrupt,
 * torn, another version or another object: a hash collision), -ENOMEM or
 * a read's -errno.
 */
int cache_hdr_check(struct cache *c, int fd, bool meta,
		    const struct cache_object *obj, struct cache_layout *l)
{
	static const uint32_t metas[][2] = {
		{ CACHE_OBJ_VERSION, 0 }, { CACHE_OBJ_VERSION, CACHE_HDR_SEED0 }
	};
	static const uint32_t olds[][2] = { { CACHE_OBJ_VERSION_2, 0 },
					    { CACHE_OBJ_VERSION_1, 0 } };
	const uint32_t(*vs)[2] = meta ? metas : olds;
	char *want = NULL, *got = NULL;
	size_t len;
	int ret = -EUCLEAN;

	for (size_t v = 0; v < 2; v++) {
		struct cache_hdr *w;

		free(want);
		want = NULL;
		ret = cache_hdr_build(c, obj, vs[v][0], vs[v][1], &want, &len);
		if (ret)
			goto out;
		w = (struct cache_hdr *)want;
		if (!got) {
			got = malloc(len);
			if (!got) {
				ret = -ENOMEM;
				goto out;
			}
			ret = cache_pread_all(fd, got, len, 0);
			if (ret)
				goto out;
		}
		/* Everything but the access time must match exactly. */
		((struct cache_hdr *)got)->atime = w->atime;
		if (memcmp(got, want, len)) {
			ret = -EUCLEAN;
			continue;
		}
		l->version = vs[v][0];
		l->flags = vs[v][1];
		l->data_off = w->data_off;
		l->rec_off = cache_roundup(len, CACHE_ALIGN);
		l->rec_seed = l->version == CACHE_OBJ_VERSION_1 ||
					      (l->flags & CACHE_HDR_SEED0)
				      ? 0
			      : w->hdr_sum ? w->hdr_sum
					   : 1;
		ret = 0;
		break;
	}
out:
	free(want);
	free(got);
	return ret;
}

/* Read the dataset name and access time of an object file. */
int cache_file_info(int fd, char *ds, size_t dslen, uint64_t *atime)
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

/* The sidecar's path of the data file data_path ("h2/h30" -> "h2/h30.meta",
 * or a bare entry name likewise). */
void cache_meta_path(const char *data_path, char *out, size_t len)
{
	snprintf(out, len, "%s" CACHE_META_SUFFIX, data_path);
}

/*
 * Take the shared in-use lock on fd (an object's data file: ds, key and
 * name for the log line of a wait that timed out) and fstat it into *st:
 * the link count, looked at after the lock, tells whether an evictor
 * unlinked the file first. Returns 0, the lock's -ETIMEDOUT (or -errno),
 * or fstat's -errno (the lock then stays: it goes with the descriptor).
 */
int cache_inuse_hold(const struct cache *c, int fd, const char *ds,
		     const char *key, const char *name, struct stat *st)
{
	int ret = cache_ofd_lock(c, fd, CACHE_LOCK_INUSE, F_RDLCK, true, ds,
				 key, name);

	if (ret)
		return ret;
	return fstat(fd, st) ? -errno : 0;
}

/*
 * Write the header's pages whole, with access time t: obj's header in
 * format version (and flags), its records from rec_off in mfd (0: right
 * after the header, as in a version 3 sidecar). An 8-byte
 * write into a page not in memory (after drop_caches; fills write with
 * O_DIRECT) made the kernel read that page from disk first, in the
 * reader's thread: one more synchronous disk read for each small file
 * opened. The header is rebuilt from the object (the file's was found
 * equal to it at open, but for the access time), and up to the records the
 * file holds zeros, as written at creation. A torn write is caught by
 * hdr_sum at the next open (the file is then made again), never taken for
 * another object's. Returns 0, -EUCLEAN (rec_off is not where obj's
 * records start), -ENOMEM, -EIO or the write's -errno.
 */
int cache_hdr_write_atime(struct cache *c, const struct cache_object *obj,
			  uint32_t version, uint32_t flags, uint64_t rec_off,
			  int mfd, uint64_t t)
{
	char *hdr = NULL, *page = NULL;
	size_t len;
	ssize_t w;
	int ret = cache_hdr_build(c, obj, version, flags, &hdr, &len);

	if (ret)
		return ret;
	if (!rec_off)
		rec_off = cache_roundup(len, CACHE_ALIGN);
	if (cache_roundup(len, CACHE_ALIGN) != rec_off) {
		ret = -EUCLEAN;
		goto out;
	}
	page = calloc(1, rec_off);
	if (!page) {
		ret = -ENOMEM;
		goto out;
	}
	memcpy(page, hdr, len);
	((struct cache_hdr *)page)->atime = t;
	w = pwrite(mfd, page, rec_off, 0);
	if (w < 0)
		ret = -errno;
	else if ((uint64_t)w != rec_off)
		ret = -EIO;
out:
	free(hdr);
	free(page);
	return ret;
}

/*
 * A small object file (fd, st its fstat) read through the page cache
 * (dstagefs: drop-behind on) whose blocks are all on disk: ask for all of
 * it now, one request, instead of the header's read, the records' and the
 * data's each finding the page cache empty (after drop_caches, 4-6 disk
 * reads per small file against 1-2 for the same file on local disk;
 * bench/smallfile_probe.py). The stager reads present blocks with
 * O_DIRECT: not for it.
 */
void cache_small_ahead(const struct cache *c, int fd, const struct stat *st)
{
	if (!c->drop_behind || st->st_size <= 0 ||
	    st->st_size > CACHE_SMALL_AHEAD ||
	    (uint64_t)st->st_blocks * 512 < (uint64_t)st->st_size)
		return;
	(void)posix_fadvise(fd, 0, st->st_size, POSIX_FADV_WILLNEED);
}

/*
 * The dataset and access time of the object whose data file data_path
 * (under dirfd) is open as fd: from its sidecar, or from the file itself
 * when it is a one-file object (versions 1 and 2) with no sidecar.
 * *meta_bytes: the sidecar's disk bytes (0 without one). With mfdp, the
 * sidecar's descriptor (read-only, or -1) is handed back, not closed.
 * Returns 0, -EUCLEAN (a data file with neither a sidecar nor a header of
 * its own: a crash's leftover, see cache_obj.c; or a bad header), or
 * -errno.
 */
int cache_pair_info(int dirfd, const char *data_path, int fd, char *ds,
		    size_t dslen, uint64_t *atime, uint64_t *meta_bytes,
		    int *mfdp)
{
	char mpath[64];
	struct cache_hdr h;
	struct stat st;
	int mfd, ret;

	*meta_bytes = 0;
	if (mfdp)
		*mfdp = -1;
	cache_meta_path(data_path, mpath, sizeof(mpath));
	mfd = openat(dirfd, mpath, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (mfd < 0 && errno != ENOENT)
		return -errno;
	if (mfd < 0) {
		/* Versions 1 and 2 only: a version 3 data file holds object
		 * bytes, whatever they look like. */
		ret = cache_pread_all(fd, &h, sizeof(h), 0);
		if (ret)
			return ret;
		if (h.version != CACHE_OBJ_VERSION_1 &&
		    h.version != CACHE_OBJ_VERSION_2)
			return -EUCLEAN;
		return cache_file_info(fd, ds, dslen, atime);
	}
	if (fstat(mfd, &st)) {
		ret = -errno;
	} else {
		*meta_bytes = (uint64_t)st.st_blocks * 512;
		ret = cache_file_info(mfd, ds, dslen, atime);
	}
	if (mfdp)
		*mfdp = mfd;
	else
		close(mfd);
	return ret;
}

/*
 * Remove an object's files, the sidecar first: from then on no process
 * finds records for the data (an opener that finds the data file alone
 * takes it for a crash's leftover and removes it), so no reader trusts
 * records whose data is gone. The caller holds the data file's exclusive
 * in-use lock. Returns 0 or -errno (the data file is kept when the sidecar
 * could not be removed).
 */
int cache_pair_unlink(int dirfd, const char *data_path)
{
	char mpath[64];

	cache_meta_path(data_path, mpath, sizeof(mpath));
	if (unlinkat(dirfd, mpath, 0) && errno != ENOENT)
		return -errno;
	return unlinkat(dirfd, data_path, 0) ? -errno : 0;
}

/*
 * Link the sidecar open as mfd (an O_TMPFILE) as the one of the data file
 * entry (under dirfd). The caller holds the exclusive in-use lock of the
 * data file linked there, so no other process links or unlinks that
 * sidecar name meanwhile, except cachectl gc removing a sidecar it found
 * alone (cache_meta_orphan_drop), under the sidecar's own exclusive in-use
 * lock: a sidecar already there (left by a crash, or by an older dstage
 * that removed a data file it could not read) is removed under that same
 * lock. Returns 0 or -errno.
 */
int cache_meta_replace(const struct cache *c, int dirfd, const char *entry,
		       int mfd)
{
	char mpath[64], proc[64];

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", mfd);
	cache_meta_path(entry, mpath, sizeof(mpath));
	for (int tries = 0; tries < 4; tries++) {
		struct stat st;
		int ofd, ret;

		if (linkat(AT_FDCWD, proc, dirfd, mpath, AT_SYMLINK_FOLLOW) ==
		    0)
			return 0;
		if (errno != EEXIST)
			return -errno;
		ofd = openat(dirfd, mpath, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		if (ofd < 0 && errno == ENOENT)
			continue;
		if (ofd < 0)
			return -errno;
		ret = cache_ofd_lock(c, ofd, CACHE_LOCK_INUSE, F_WRLCK, true,
				     "", entry, entry);
		if (!ret && fstat(ofd, &st))
			ret = -errno;
		if (!ret && st.st_nlink > 0 && unlinkat(dirfd, mpath, 0) &&
		    errno != ENOENT)
			ret = -errno;
		close(ofd);
		if (ret)
			return ret;
	}
	return -EEXIST;
}

/*
 * cachectl gc: remove the sidecar meta_path (under dirfd) whose data file
 * is gone. Under the sidecar's exclusive in-use lock (cache_meta_replace
 * takes the same before it replaces one), and only while no data file of
 * its name exists. Returns 0 (*freed: its disk bytes), -EBUSY (locked, or
 * its data file is there: the pair is listed as the data file), -ENOENT,
 * -EINVAL (not a sidecar's name, not a regular file) or -errno.
 */
int cache_meta_orphan_drop(const struct cache *c, int dirfd,
			   const char *meta_path, uint64_t *freed)
{
	size_t n = strlen(meta_path), sl = strlen(CACHE_META_SUFFIX);
	char dpath[64];
	struct stat st;
	int fd, ret = 0;

	*freed = 0;
	if (n <= sl || n - sl >= sizeof(dpath) ||
	    strcmp(meta_path + n - sl, CACHE_META_SUFFIX))
		return -EINVAL;
	memcpy(dpath, meta_path, n - sl);
	dpath[n - sl] = '\0';
	fd = fdutil_open_regular(dirfd, meta_path,
				 O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
				 &st);
	if (fd < 0)
		return fd == -ELOOP ? -EINVAL : fd;
	if (cache_ofd_lock(c, fd, CACHE_LOCK_INUSE, F_WRLCK, false, "", "",
			   meta_path) ||
	    faccessat(dirfd, dpath, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		ret = -EBUSY;
		goto out;
	}
	if (fstat(fd, &st) || st.st_nlink == 0) {
		ret = -ENOENT;
		goto out;
	}
	if (unlinkat(dirfd, meta_path, 0)) {
		ret = -errno;
		goto out;
	}
	*freed = (uint64_t)st.st_blocks * 512;
out:
	close(fd);
	return ret;
}

/* Read or create the cache's identity file; check the block size. */
int cache_identity(struct cache *c)
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
			    CACHE_FILE_MODE);
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
void cache_drop_range(const struct cache *c, int fd, uint64_t data_off,
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

void cache_drop_pages(struct cache_obj *o, uint64_t off, uint64_t len)
{
	cache_drop_range(o->c, o->fd, o->data_off, o->size, off, len);
}
