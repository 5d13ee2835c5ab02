// SPDX-License-Identifier: MIT
/*
 * cache_migrate.c, layer 1 of the cache with cache_file.c below it
 * (lib/cache/cache_i.h): a one-file object of format version 1 or 2
 * (header, records, blocks from data_off) made a version 3 pair at open
 * (a data file with its blocks at their own offsets and a sidecar).
 * Calls only cache_file.c. docs/cache.md (On-disk layout) tells the steps.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache_i.h"
#include "dstage/log.h"

/*
 * Whether fd's file has no other open file description, in any process:
 * a write lease is granted only then. Taken and given back at once; a
 * lease break in between (an open racing this one) is signalled with
 * SIGURG, ignored unless handled, instead of SIGIO, which ends a process.
 * False where leases are not to be had (then nothing is migrated).
 */
static bool cache_sole_opener(int fd)
{
	bool sole;

	if (fcntl(fd, F_SETSIG, SIGURG))
		return false;
	sole = fcntl(fd, F_SETLEASE, F_WRLCK) == 0;
	if (sole)
		(void)fcntl(fd, F_SETLEASE, F_UNLCK);
	(void)fcntl(fd, F_SETSIG, 0);
	return sole;
}

/* Copy the present blocks of a one-file object down to their offsets in
 * the data file (see cache_migrate, step 3), holes for absent ones. */
static int cache_migrate_copy(struct cache *c, int fd,
			      const struct cache_object *obj, uint64_t data_off,
			      const uint8_t *present)
{
	uint64_t nblocks = (obj->size + c->bs - 1) / c->bs;
	static const char zeros[CACHE_HDR_FIXED];
	char *buf = malloc(c->bs);
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	/* The header goes first, durably: a crash in the copy then leaves a
	 * file that no opener takes for the old object. */
	if (pwrite(fd, zeros, sizeof(zeros), 0) != (ssize_t)sizeof(zeros) ||
	    fdatasync(fd)) {
		ret = errno ? -errno : -EIO;
		goto out;
	}
	for (uint64_t b = 0; b < nblocks; b++) {
		uint64_t at = b * c->bs;
		size_t len = b + 1 < nblocks ? c->bs : obj->size - at;
		ssize_t w;

		if (!(present[b / 8] & (1u << (b % 8)))) {
			/* Never trusted (no record) whatever it holds: a
			 * hole where the file system makes one. */
			(void)fallocate(
				fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				(off_t)at, (off_t)len);
			continue;
		}
		/* Block b's bytes lie at data_off + at > at: below them only
		 * blocks already moved are overwritten. */
		ret = cache_pread_all(fd, buf, len, data_off + at);
		if (ret)
			goto out;
		w = pwrite(fd, buf, len, (off_t)at);
		if (w != (ssize_t)len) {
			ret = w < 0 ? -errno : -EIO;
			goto out;
		}
	}
out:
	free(buf);
	return ret;
}

/*
 * Migrate the one-file object obj (version 1 or 2, layout *l), open as fd
 * and linked at data_path under dirfd, to a pair: its bytes at offset 0 of
 * the same file, header and records in a new sidecar. The caller holds
 * fd's exclusive in-use lock. The order (docs/cache.md, "Migration"):
 *
 *   1. no other open file description of the file may exist (a write
 *      lease can be had): an idle open object of another process, or a
 *      descriptor handed out for splicing, knows the old offsets;
 *   2. the sidecar, an O_TMPFILE: header version 3 (CACHE_HDR_SEED0 for a
 *      version 1 file, whose records keep their seed), each valid record
 *      re-sealed with the new header's sum, all zeros for the others;
 *      fdatasync;
 *   3. the bytes move to offset 0: FALLOC_FL_COLLAPSE_RANGE of [0,
 *      data_off) (ext4, xfs: it removes the header first), or where the
 *      file system cannot, up to CACHE_MIGRATE_COPY_MAX bytes present, the
 *      header is zeroed (durably) and the present blocks copied down in
 *      place (cache_migrate_copy); then cut (or grown) to the object's size
 *      and fdatasync;
 *   4. the sidecar is linked (cache_meta_replace) and the directory
 *      synced.
 *
 * A crash before step 3 leaves the old file whole; during 3 or before 4
 * is durable, a data file with neither a header nor a sidecar, which the
 * next opener removes (the object is fetched again); after 4, the pair.
 * Returns 0 (*mfd: the sidecar, read-write; *l: its layout); with the old
 * file as it was: -EBUSY (open elsewhere, or no lease to tell), -EFBIG (it
 * needs a copy larger than CACHE_MIGRATE_COPY_MAX) or another -errno; or
 * -ESTALE: step 3 failed midway, and the file has been removed.
 */
int cache_migrate(struct cache *c, int dirfd, const char *data_path, int fd,
		  const struct cache_object *obj, struct cache_layout *l,
		  int *mfd)
{
	uint64_t nblocks = (obj->size + c->bs - 1) / c->bs, present_bytes = 0;
	char sub[3] = { data_path[0], data_path[1], '\0' };
	uint32_t flags =
		l->version == CACHE_OBJ_VERSION_1 ? CACHE_HDR_SEED0 : 0;
	struct cache_rec recs[CACHE_ALIGN / sizeof(struct cache_rec)];
	struct cache_layout nl;
	struct cache_hdr old;
	uint8_t *present = NULL;
	char *hdr = NULL;
	bool moved = false;
	struct stat st;
	size_t len;
	int sfd = -1, m = -1, ret;

	*mfd = -1;
	if (!cache_sole_opener(fd))
		return -EBUSY;
	ret = cache_pread_all(fd, &old, sizeof(old), 0);
	if (ret)
		return ret;
	if (fstat(fd, &st))
		return -errno;
	sfd = openat(dirfd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sfd < 0)
		return -errno;
	present = calloc(1, nblocks / 8 + 1);
	ret = present ? cache_hdr_build(c, obj, CACHE_OBJ_VERSION, flags, &hdr,
					&len)
		      : -ENOMEM;
	if (ret)
		goto out;
	((struct cache_hdr *)hdr)->atime = old.atime; /* keeps its age */
	nl = (struct cache_layout){
		.version = CACHE_OBJ_VERSION,
		.flags = flags,
		.data_off = 0,
		.rec_off = cache_roundup(len, CACHE_ALIGN),
		.rec_seed = flags ? 0
			    : ((struct cache_hdr *)hdr)->hdr_sum
				    ? ((struct cache_hdr *)hdr)->hdr_sum
				    : 1,
	};
	/* 2. the sidecar */
	m = openat(sfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, CACHE_FILE_MODE);
	errno = 0;
	if (m < 0 || pwrite(m, hdr, len, 0) != (ssize_t)len) {
		ret = m < 0 || errno ? -errno : -ENOSPC;
		goto out;
	}
	for (uint64_t b0 = 0; b0 < nblocks;) {
		uint64_t n = nblocks - b0;
		size_t bytes;

		if (n > sizeof(recs) / sizeof(recs[0]))
			n = sizeof(recs) / sizeof(recs[0]);
		bytes = n * sizeof(recs[0]);
		errno = 0;
		ret = cache_pread_all(fd, recs, bytes,
				      l->rec_off + b0 * sizeof(recs[0]));
		if (ret)
			goto out;
		for (uint64_t i = 0; i < n; i++) {
			uint64_t b = b0 + i;
			struct cache_rec *r = &recs[i];

			if (r->magic != CACHE_REC_MAGIC ||
			    r->check != (uint32_t)XXH3_64bits_withSeed(
						r, 12, b ^ l->rec_seed)) {
				memset(r, 0, sizeof(*r));
				continue;
			}
			r->check = (uint32_t)XXH3_64bits_withSeed(
				r, 12, b ^ nl.rec_seed);
			present[b / 8] |= (uint8_t)(1u << (b % 8));
			present_bytes +=
				b + 1 < nblocks ? c->bs : obj->size - b * c->bs;
		}
		if (pwrite(m, recs, bytes,
			   (off_t)(nl.rec_off + b0 * sizeof(recs[0]))) !=
		    (ssize_t)bytes) {
			ret = errno ? -errno : -ENOSPC;
			goto out;
		}
		b0 += n;
	}
	if (fdatasync(m)) {
		ret = -errno;
		goto out;
	}
	/* 3. the bytes to offset 0 */
	if ((uint64_t)st.st_size <= l->data_off) {
		moved = true; /* no block on disk: nothing to move */
	} else if (!getenv("DSTAGE_NO_COLLAPSE") &&
		   fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, 0,
			     (off_t)l->data_off) == 0) {
		moved = true;
	} else if (!getenv("DSTAGE_NO_COLLAPSE") && errno != EOPNOTSUPP &&
		   errno != EINVAL && errno != ENOSYS && errno != EPERM &&
		   errno != ETXTBSY && errno != ENODEV) {
		ret = -errno; /* a collapse that failed midway */
		log_warn("cache: %s/%s: migrating object file %s: collapse: "
			 "%s; removed",
			 cache_ds_or(obj->dataset), obj->key, data_path,
			 strerror(-ret));
		goto stale;
	}
	if (!moved) {
		if (present_bytes > CACHE_MIGRATE_COPY_MAX) {
			ret = -EFBIG;
			goto out;
		}
		ret = cache_migrate_copy(c, fd, obj, l->data_off, present);
		if (ret)
			goto stale;
	}
	if (ftruncate(fd, (off_t)obj->size) || fdatasync(fd)) {
		ret = -errno;
		goto stale;
	}
	/* 4. the pair */
	ret = cache_meta_replace(c, sfd, data_path + 3, m);
	if (ret)
		goto stale;
	(void)fsync(sfd);
	*mfd = m;
	m = -1;
	*l = nl;
	goto out;
stale:
	/* Neither the old object nor the new one: never to be read. */
	if (cache_pair_unlink(dirfd, data_path))
		(void)ftruncate(fd, 0);
	ret = -ESTALE;
out:
	if (m >= 0)
		close(m);
	if (sfd >= 0)
		close(sfd);
	free(present);
	free(hdr);
	return ret;
}
