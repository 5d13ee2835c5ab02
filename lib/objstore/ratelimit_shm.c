// SPDX-License-Identifier: MIT
/*
 * ratelimit_shm: one token bucket (lib/objstore/ratelimit.c) per node, in the file
 * <cache.dir>/ratelimit mapped by every process that talks to the source.
 *
 * State of a struct ratelimit_shm:
 *
 *   unconfigured (dir NULL) --configure--> shared (fd >= 0, map set)
 *                                  \-----> own bucket (fd -1; failure logged)
 *   shared --fork (pid != getpid())--> reopened on the next call
 *   any --configure with another dir / release--> unconfigured
 *
 * The file (lib/objstore/ratelimit_shm_i.h): a header (magic, version, size) and two
 * copies of the bucket; slot[gen & 1] is in force. Every change is made
 * under the file's lock, an OFD write lock on its first byte, which the
 * kernel drops when its holder dies (even killed -9): the writer reads the
 * slot in force, applies the change to a copy, writes the copy to the other
 * slot and then stores gen + 1, one atomic 64-bit store. A writer killed
 * before that store leaves the previous whole state; after it, the new one.
 * No process trusts the file: the header is checked when it is opened, and
 * each read of the bucket is bounded by ratelimit_bucket_sanitize.
 *
 * Invariants: fd >= 0 iff map != NULL; pid is the process that opened fd
 * (an OFD lock is shared by the processes a fork makes, so a child reopens).
 * The file is a regular file of cache.dir's owner, mode 0600; it is created
 * only by that owner, and never with cache.dir (which is not created here).
 *
 * Locking: rs->lock guards every field of rs and is taken before the file's
 * lock; nothing else is taken under either.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/log.h"
#include "ratelimit_shm_i.h"

static int rlshm_lock_fd(int fd, short type)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_len = 1 };

	while (fcntl(fd, F_OFD_SETLKW, &fl) < 0) {
		if (errno != EINTR)
			return -errno;
	}
	return 0;
}

int ratelimit_shm_lock_file(struct ratelimit_shm *rs)
{
	return rs->fd < 0 ? -EBADF : rlshm_lock_fd(rs->fd, F_WRLCK);
}

static void rlshm_close(struct ratelimit_shm *rs)
{
	if (rs->map)
		munmap(rs->map, sizeof(*rs->map));
	if (rs->fd >= 0)
		close(rs->fd);
	rs->map = NULL;
	rs->fd = -1;
}

/* This boot's id (16 bytes of /proc/sys/kernel/random/boot_id), or zeros. */
static void rlshm_boot_id(uint8_t id[16])
{
	char buf[64];
	unsigned j = 0;
	ssize_t n;
	int fd;

	memset(id, 0, 16);
	fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	for (ssize_t i = 0; i < n && j < 32; i++) {
		const char *hex = "0123456789abcdef";
		const char *d = buf[i] ? strchr(hex, buf[i]) : NULL;

		if (!d) /* the dashes, the newline */
			continue;
		id[j / 2] |= (uint8_t)((d - hex) << (j % 2 ? 0 : 4));
		j++;
	}
}

/* Check the header of the mapped file, initialising a new (all zero) one,
 * and start the slots afresh when they hold another boot's times. Called
 * with the file lock held. */
static int rlshm_check(struct ratelimit_shm_file *f, const char *path,
		       enum log_level lvl)
{
	uint8_t boot[16];

	rlshm_boot_id(boot);
	if (!f->magic && !f->version && !f->size) {
		memcpy(f->boot_id, boot, sizeof(boot));
		memset(f->slot, 0, sizeof(f->slot));
		__atomic_store_n(&f->gen, 0, __ATOMIC_RELAXED);
		f->version = RATELIMIT_SHM_VERSION;
		f->size = sizeof(*f);
		__atomic_store_n(&f->magic, RATELIMIT_SHM_MAGIC,
				 __ATOMIC_RELEASE);
		return 0;
	}
	if (f->magic != RATELIMIT_SHM_MAGIC ||
	    f->version != RATELIMIT_SHM_VERSION || f->size != sizeof(*f)) {
		log_msg(lvl,
			"ratelimit: %s is not a version %u rate-limit file "
			"(magic %#llx, version %u, size %u): stop every "
			"dstage process of this node and remove it",
			path, RATELIMIT_SHM_VERSION,
			(unsigned long long)f->magic, f->version, f->size);
		return -EINVAL;
	}
	if (memcmp(f->boot_id, boot, sizeof(boot))) {
		memset(f->slot, 0, sizeof(f->slot));
		__atomic_store_n(&f->gen, 0, __ATOMIC_RELEASE);
		memcpy(f->boot_id, boot, sizeof(boot));
	}
	return 0;
}

/* Open, check and map <dir>/ratelimit into rs. */
static int rlshm_open(struct ratelimit_shm *rs, const char *dir)
{
	char path[4096];
	struct stat ds, fs;
	int dfd = -1, fd = -1, ret, flags;
	void *map = MAP_FAILED;
	bool locked = false;
	/* only worth a warning when there is a limit to share */
	enum log_level lvl = rs->req_max > 0 || rs->byte_max > 0
				     ? LOG_LVL_WARN
				     : LOG_LVL_DEBUG;

	snprintf(path, sizeof(path), "%s/%s", dir, RATELIMIT_SHM_FILE);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0 || fstat(dfd, &ds) < 0) {
		ret = -errno;
		log_msg(lvl,
			"ratelimit: cache.dir %s: %s: the source limits count "
			"for this process alone, not the node (create "
			"cache.dir, or run as its owner)",
			dir, strerror(-ret));
		goto err;
	}
	if (ds.st_uid != geteuid() && geteuid() != 0) {
		ret = -EPERM;
		log_msg(lvl,
			"ratelimit: cache.dir %s belongs to uid %u, not this "
			"user (uid %u): the source limits count for this "
			"process alone, not the node",
			dir, (unsigned)ds.st_uid, (unsigned)geteuid());
		goto err;
	}
	/* root uses the owner's file but never makes one the owner can't
	 * open */
	flags = O_RDWR | O_NOFOLLOW | O_CLOEXEC;
	if (ds.st_uid == geteuid())
		flags |= O_CREAT;
	fd = openat(dfd, RATELIMIT_SHM_FILE, flags, 0600);
	if (fd < 0 || fstat(fd, &fs) < 0) {
		ret = -errno;
		log_msg(lvl,
			"ratelimit: %s: %s: the source limits count for this "
			"process alone, not the node",
			path, strerror(-ret));
		goto err;
	}
	if (!S_ISREG(fs.st_mode) || fs.st_uid != ds.st_uid ||
	    fs.st_mode & 077) {
		ret = -EACCES;
		log_msg(lvl,
			"ratelimit: %s is not a regular file of cache.dir's "
			"owner (uid %u) with mode 0600 (it has uid %u, mode "
			"%o): the source limits count for this process "
			"alone; fix with chmod 600 / chown, or remove it",
			path, (unsigned)ds.st_uid, (unsigned)fs.st_uid,
			(unsigned)(fs.st_mode & 07777));
		goto err;
	}
	ret = rlshm_lock_fd(fd, F_WRLCK);
	if (ret)
		goto err_sys;
	locked = true;
	if (fstat(fd, &fs) < 0)
		goto err_errno;
	if (fs.st_size == 0 && ftruncate(fd, sizeof(*rs->map)) < 0)
		goto err_errno;
	if (fs.st_size != 0 && fs.st_size != (off_t)sizeof(*rs->map)) {
		ret = -EINVAL;
		log_msg(lvl,
			"ratelimit: %s has %lld bytes, not %zu: stop every "
			"dstage process of this node and remove it",
			path, (long long)fs.st_size, sizeof(*rs->map));
		goto err;
	}
	map = mmap(NULL, sizeof(*rs->map), PROT_READ | PROT_WRITE, MAP_SHARED,
		   fd, 0);
	if (map == MAP_FAILED)
		goto err_errno;
	ret = rlshm_check(map, path, lvl);
	if (ret)
		goto err;
	rlshm_lock_fd(fd, F_UNLCK);
	close(dfd);
	rs->fd = fd;
	rs->map = map;
	rs->pid = getpid();
	log_debug("ratelimit: the node's source limits are in %s", path);
	return 0;
err_errno:
	ret = -errno;
err_sys:
	log_msg(lvl,
		"ratelimit: %s: %s: the source limits count for this process "
		"alone, not the node",
		path, strerror(-ret));
err:
	if (map != MAP_FAILED)
		munmap(map, sizeof(*rs->map));
	if (locked)
		rlshm_lock_fd(fd, F_UNLCK);
	if (fd >= 0)
		close(fd);
	if (dfd >= 0)
		close(dfd);
	return ret;
}

int ratelimit_shm_configure(struct ratelimit_shm *rs, const char *cache_dir,
			    double req_per_s, double bytes_per_s)
{
	int ret = 0;

	pthread_mutex_lock(&rs->lock);
	rs->req_max = req_per_s;
	rs->byte_max = bytes_per_s;
	ratelimit_bucket_configure(&rs->own, req_per_s, bytes_per_s);
	if (rs->dir && cache_dir && !strcmp(rs->dir, cache_dir) &&
	    (rs->fd < 0 || rs->pid == getpid())) {
		ret = rs->err;
		goto out;
	}
	rlshm_close(rs);
	free(rs->dir);
	rs->dir = cache_dir ? strdup(cache_dir) : NULL;
	if (!rs->dir) {
		ret = -ENOMEM;
		log_warn("ratelimit: no cache.dir: the source limits count for "
			 "this process alone, not the node");
		goto out;
	}
	ret = rlshm_open(rs, rs->dir);
out:
	rs->err = ret;
	pthread_mutex_unlock(&rs->lock);
	return ret;
}

enum rlshm_op { RLSHM_ACQUIRE, RLSHM_THROTTLED };

/* Apply one operation to the node's bucket, or to the process's own. */
static uint64_t rlshm_apply(struct ratelimit_shm *rs, enum rlshm_op op,
			    uint64_t now_ms, uint64_t arg)
{
	struct ratelimit_shm_file *f;
	struct ratelimit_bucket b, *own = &rs->own;
	uint64_t gen, ret = 0;

	pthread_mutex_lock(&rs->lock);
	if (rs->fd >= 0 && rs->pid != getpid()) {
		/* a forked child: its own open file description */
		rlshm_close(rs);
		rs->err = rlshm_open(rs, rs->dir);
	}
	if (rs->fd < 0 || rlshm_lock_fd(rs->fd, F_WRLCK)) {
		if (op == RLSHM_ACQUIRE)
			ret = ratelimit_bucket_acquire(own, now_ms, arg);
		else
			ratelimit_bucket_throttled(own, now_ms, arg);
		goto out;
	}
	f = rs->map;
	gen = __atomic_load_n(&f->gen, __ATOMIC_ACQUIRE);
	b = f->slot[gen & 1];
	if (ratelimit_bucket_sanitize(&b, now_ms))
		log_debug("ratelimit: %s/%s held values out of bounds: reset",
			  rs->dir, RATELIMIT_SHM_FILE);
	ratelimit_bucket_configure(&b, rs->req_max, rs->byte_max);
	if (op == RLSHM_ACQUIRE)
		ret = ratelimit_bucket_acquire(&b, now_ms, arg);
	else
		ratelimit_bucket_throttled(&b, now_ms, arg);
	f->slot[(gen + 1) & 1] = b;
	__atomic_store_n(&f->gen, gen + 1, __ATOMIC_RELEASE);
	rlshm_lock_fd(rs->fd, F_UNLCK);
out:
	pthread_mutex_unlock(&rs->lock);
	return ret;
}

uint64_t ratelimit_shm_acquire(struct ratelimit_shm *rs, uint64_t now_ms,
			       uint64_t bytes)
{
	return rlshm_apply(rs, RLSHM_ACQUIRE, now_ms, bytes);
}

void ratelimit_shm_throttled(struct ratelimit_shm *rs, uint64_t now_ms,
			     uint64_t retry_after_ms)
{
	rlshm_apply(rs, RLSHM_THROTTLED, now_ms, retry_after_ms);
}

bool ratelimit_shm_shared(struct ratelimit_shm *rs)
{
	bool shared;

	pthread_mutex_lock(&rs->lock);
	shared = rs->fd >= 0;
	pthread_mutex_unlock(&rs->lock);
	return shared;
}

void ratelimit_shm_release(struct ratelimit_shm *rs)
{
	if (!rs)
		return;
	pthread_mutex_lock(&rs->lock);
	rlshm_close(rs);
	free(rs->dir);
	rs->dir = NULL;
	pthread_mutex_unlock(&rs->lock);
}
