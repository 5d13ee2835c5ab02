// SPDX-License-Identifier: MIT
/*
 * dsfs_ckpt_proc: what /proc says about the processes that close a
 * checkpoint file, for the decision whether a close publishes it
 * (dsfs_ckpt_file.c, docs/checkpoints.md "When a file is published"):
 * the thread group of a thread, whether a task is dying of a signal,
 * whether a process still has the file open through another descriptor,
 * and whether another process holds it open for writing (a forked or
 * exec'd child's copy of the writer's descriptor, which FUSE never
 * announces: looked for in the tree of the processes that opened or wrote
 * the handle, through /proc/PID/task/TID/children, each list read whole,
 * or in every process when the kernel does not list children, the tree
 * passes DSFS_CKPT_PROC_TREE_MAX processes or a list cannot be read whole:
 * no descendant is missed for want of a buffer).
 *
 * Every descriptor is looked at with AT_STATX_DONT_SYNC (the kernel's
 * cached attributes), so no look asks a file system, this one included.
 * Stateless but for the mount's device number, read once (st->mnt_dev,
 * atomic). What /proc cannot show (another user's process when dstagefs
 * is not root, a task whose table is already gone) counts as not holding.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "dsfs_ckpt_i.h"
#include "dsfs_opts.h"

/* Descriptors of one process looked at, at most, per question. */
#define DSFS_CKPT_PROC_FDS_MAX 65536
/* Descriptors looked at in all, at most, when every process is asked:
 * past it the answer is "held" (the publish waits for the RELEASE). */
#define DSFS_CKPT_PROC_ALL_FDS_MAX (1u << 20)
/* Processes of a handle's tree looked at, at most (more: every process). */
#define DSFS_CKPT_PROC_TREE_MAX 1024
/* Bytes of one task's children list read, at most: room for more pids
 * than the tree holds (a pid has at most 7 digits: PID_MAX_LIMIT, 4 Mi,
 * and a space). A longer list cannot fit the tree: every process. */
#define DSFS_CKPT_PROC_CHILDREN_MAX (DSFS_CKPT_PROC_TREE_MAX * 16)

bool dsfs_ckpt_proc_read(pid_t pid, const char *what, char *buf, size_t size)
{
	char path[320];
	ssize_t len;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	len = read(fd, buf, size - 1);
	close(fd);
	if (len <= 0)
		return false;
	buf[len] = '\0';
	return true;
}

pid_t dsfs_ckpt_proc_tgid(pid_t tid)
{
	char buf[512], *p;

	if (!dsfs_ckpt_proc_read(tid, "status", buf, sizeof(buf)))
		return tid;
	p = strstr(buf, "\nTgid:");
	return p ? (pid_t)strtol(p + 6, NULL, 10) : tid;
}

bool dsfs_ckpt_proc_killed(pid_t pid, int *sig)
{
	char buf[1024], *p, *save = NULL;
	unsigned long flags = 0;
	long code = 0;
	int field = 3;

	if (!dsfs_ckpt_proc_read(pid, "stat", buf, sizeof(buf)))
		return false;
	p = strrchr(buf, ')');
	if (!p)
		return false;
	for (p = strtok_r(p + 1, " \n", &save); p;
	     p = strtok_r(NULL, " \n", &save), field++) {
		if (field == 9)
			flags = strtoul(p, NULL, 10);
		else if (field == 52)
			code = strtol(p, NULL, 10);
	}
	if (!(flags & 0x4) || field < 53) /* PF_EXITING */
		return false;
	*sig = (int)(code & 0x7f);
	return *sig != 0;
}

/* The mount's device number, read once without a request to this
 * process; 0 when it cannot be read. */
static dev_t dsfs_ckpt_proc_dev(struct dsfs *fs)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	unsigned long long dev = atomic_load(&st->mnt_dev);
	struct statx sx;

	if (dev || !fs->opts || !fs->opts->mountpoint)
		return (dev_t)dev;
	if (statx(AT_FDCWD, fs->opts->mountpoint, AT_STATX_DONT_SYNC, STATX_INO,
		  &sx))
		return 0;
	dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	atomic_store(&st->mnt_dev, dev);
	return (dev_t)dev;
}

/* Whether descriptor name of process pid was opened for writing (its
 * fdinfo's flags); true when that cannot be read (a descriptor that was
 * seen on the file counts until shown read-only). */
static bool dsfs_ckpt_proc_fd_writes(pid_t pid, const char *name)
{
	char what[300], buf[256], *p;
	unsigned long flags;

	snprintf(what, sizeof(what), "fdinfo/%s", name);
	if (!dsfs_ckpt_proc_read(pid, what, buf, sizeof(buf)))
		return true;
	p = strstr(buf, "flags:");
	if (!p)
		return true;
	flags = strtoul(p + 6, NULL, 8);
	return (flags & O_ACCMODE) != O_RDONLY;
}

/*
 * Look at pid's descriptors (at most *budget, which is spent) for node
 * ino of the mount (dev): 1 when one is on it (and, with writing, open for
 * writing), 0 when none, -errno when the table cannot be read.
 */
static int dsfs_ckpt_proc_scan(pid_t pid, dev_t dev, fuse_ino_t ino,
			       bool writing, unsigned *budget)
{
	struct dirent *d;
	char path[64];
	int found = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	if (!dir)
		return -errno;
	while (!found && *budget && (d = readdir(dir)) != NULL) {
		struct statx sx;

		(*budget)--;
		if (d->d_name[0] == '.' ||
		    statx(dirfd(dir), d->d_name, AT_STATX_DONT_SYNC, STATX_INO,
			  &sx))
			continue;
		if (makedev(sx.stx_dev_major, sx.stx_dev_minor) != dev ||
		    sx.stx_ino != (uint64_t)ino)
			continue;
		found = !writing || dsfs_ckpt_proc_fd_writes(pid, d->d_name);
	}
	closedir(dir);
	return found;
}

bool dsfs_ckpt_proc_held(struct dsfs *fs, pid_t tid, fuse_ino_t ino)
{
	dev_t dev = dsfs_ckpt_proc_dev(fs);
	unsigned budget = DSFS_CKPT_PROC_FDS_MAX;

	return dev && dsfs_ckpt_proc_scan(tid, dev, ino, false, &budget) > 0;
}

/* Whether the kernel lists a task's children (CONFIG_PROC_CHILDREN):
 * 1 yes, 0 no, -1 not asked yet. */
static atomic_int dsfs_ckpt_proc_has_children = -1;

static bool dsfs_ckpt_proc_children_ok(void)
{
	int v = atomic_load(&dsfs_ckpt_proc_has_children);
	char path[64];

	if (v < 0) {
		snprintf(path, sizeof(path), "/proc/%d/task/%d/children",
			 (int)getpid(), (int)getpid());
		v = access(path, R_OK) == 0;
		atomic_store(&dsfs_ckpt_proc_has_children, v);
	}
	return v;
}

/* Add pid to the set (v, *n of max) unless it is there: false when full. */
static bool dsfs_ckpt_proc_add(pid_t *v, size_t *n, size_t max, pid_t pid)
{
	for (size_t i = 0; i < *n; i++)
		if (v[i] == pid)
			return true;
	if (*n == max)
		return false;
	v[(*n)++] = pid;
	return true;
}

/* The whole of /proc/PID/what into buf (size bytes, its NUL included):
 * 0, -E2BIG (longer than size - 1 bytes), or -errno (-ENOENT, -ESRCH:
 * the task is gone). A seq_file such as a children list gives at most
 * what one read asks for, and the rest to the next reads. */
static int dsfs_ckpt_proc_read_all(pid_t pid, const char *what, char *buf,
				   size_t size)
{
	char path[320], more;
	size_t len = 0;
	ssize_t r;
	int fd, ret = 0;

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (;;) {
		r = len < size - 1 ? read(fd, buf + len, size - 1 - len)
				   : read(fd, &more, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = -errno;
			goto out;
		}
		if (r == 0)
			break;
		if (len == size - 1) {
			ret = -E2BIG; /* past the bound */
			goto out;
		}
		len += (size_t)r;
	}
	buf[len] = '\0';
out:
	close(fd);
	return ret;
}

/*
 * Add the children of every thread of process pid to the set, reading
 * each task's list whole into buf (DSFS_CKPT_PROC_CHILDREN_MAX bytes):
 * false when the set is full, or when a list cannot be read whole (longer
 * than buf, or an error but the task's end): the caller then asks every
 * process, so a child missed here never counts as not holding the file.
 */
static bool dsfs_ckpt_proc_children(pid_t pid, char *buf, pid_t *v, size_t *n,
				    size_t max)
{
	char path[64], *p, *end;
	struct dirent *d;
	bool ok = true;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	dir = opendir(path);
	if (!dir) /* gone: no children to hold anything */
		return errno == ENOENT || errno == ESRCH;
	while (ok && (d = readdir(dir)) != NULL) {
		int ret;

		if (d->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "task/%.20s/children", d->d_name);
		ret = dsfs_ckpt_proc_read_all(pid, path, buf,
					      DSFS_CKPT_PROC_CHILDREN_MAX);
		if (ret == -ENOENT || ret == -ESRCH)
			continue; /* the thread ended */
		if (ret) {
			ok = false;
			break;
		}
		for (p = buf; ok && *p; p = end) {
			long c = strtol(p, &end, 10);

			if (end == p)
				break;
			ok = c <= 0 || dsfs_ckpt_proc_add(v, n, max, (pid_t)c);
		}
	}
	closedir(dir);
	return ok;
}

/* Every process of /proc but tgid and dstagefs: the fallback. */
static bool dsfs_ckpt_proc_all_write(dev_t dev, pid_t tgid, fuse_ino_t ino)
{
	unsigned budget = DSFS_CKPT_PROC_ALL_FDS_MAX;
	pid_t self = getpid();
	bool found = false;
	struct dirent *d;
	DIR *dir = opendir("/proc");

	if (!dir)
		return false;
	while (!found && (d = readdir(dir)) != NULL) {
		unsigned each = DSFS_CKPT_PROC_FDS_MAX;
		pid_t pid;

		if (!isdigit((unsigned char)d->d_name[0]))
			continue;
		pid = (pid_t)strtol(d->d_name, NULL, 10);
		if (pid == tgid || pid == self)
			continue;
		if (!budget) {
			found = true; /* not all seen: the RELEASE decides */
			break;
		}
		if (each > budget)
			each = budget;
		budget -= each;
		found = dsfs_ckpt_proc_scan(pid, dev, ino, true, &each) > 0;
		budget += each; /* what the process left unspent */
	}
	closedir(dir);
	return found;
}

bool dsfs_ckpt_proc_others_write(struct dsfs *fs, pid_t tgid, fuse_ino_t ino,
				 const pid_t *known, size_t nknown)
{
	pid_t set[DSFS_CKPT_PROC_TREE_MAX];
	dev_t dev = dsfs_ckpt_proc_dev(fs);
	size_t n = 0;
	bool found = false, all;
	char *buf = NULL;

	if (!dev)
		return false;
	if (dsfs_ckpt_proc_children_ok())
		buf = malloc(DSFS_CKPT_PROC_CHILDREN_MAX);
	all = !buf;
	/* a copy of a descriptor reaches another process by fork: the
	 * processes that opened or wrote the handle, the closing one, and
	 * every descendant of theirs (a child a dying parent left to init
	 * is no longer one, nor is a descriptor sent over a socket) */
	dsfs_ckpt_proc_add(set, &n, DSFS_CKPT_PROC_TREE_MAX, tgid);
	for (size_t i = 0; i < nknown; i++)
		if (known[i] > 0)
			dsfs_ckpt_proc_add(set, &n, DSFS_CKPT_PROC_TREE_MAX,
					   known[i]);
	for (size_t i = 0; !all && i < n && !found; i++) {
		unsigned each = DSFS_CKPT_PROC_FDS_MAX;

		all = !dsfs_ckpt_proc_children(set[i], buf, set, &n,
					       DSFS_CKPT_PROC_TREE_MAX);
		if (!all && set[i] != tgid && set[i] != getpid())
			found = dsfs_ckpt_proc_scan(set[i], dev, ino, true,
						    &each) > 0;
	}
	free(buf);
	return all ? dsfs_ckpt_proc_all_write(dev, tgid, ino) : found;
}
