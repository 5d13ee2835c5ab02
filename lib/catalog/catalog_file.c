// SPDX-License-Identifier: MIT
/*
 * catalog_file: the catalog as files on disk, guarded against the other
 * users of the node. Stateless; every function is safe from any thread.
 *
 *   - its directory is refused when group or others may write it, or when
 *     it belongs to a user other than the caller and root: whoever can write
 *     there can swap the catalog for their own;
 *   - catalog.db, -wal and -shm are regular files of the caller (or root),
 *     mode 0600, or 0640 where an admin group is given read access on
 *     purpose; anything looser is tightened to 0600 at open, with a log
 *     line. SQLite gives the -wal and -shm it creates the mode of the
 *     database, so a database created here at 0600 keeps all three there;
 *   - when a lock wait ends in SQLITE_BUSY, the POSIX locks others hold on
 *     the database and on the WAL index (-shm) are logged with the holder's
 *     pid and command (from /proc/locks), so that an admin can find who
 *     stalls it.
 *
 * Invariant: nothing here opens a catalog file for I/O. close() of any fd
 * on a file drops every POSIX lock the process holds on it, SQLite's too:
 * a second catalog_open (or a busy report) in a process whose connection
 * holds the WAL index's locks would make that connection look gone to the
 * other processes, and the last of them to close would delete the -wal and
 * -shm under it ("disk I/O error" next). Files are inspected through O_PATH
 * descriptors, whose close drops no lock, and /proc/locks.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "catalog_i.h"
#include "dstage/log.h"

/* The file modes a catalog file may keep (owner rw, group read at most). */
#define CATALOG_FILE_MODE 0600
#define CATALOG_FILE_MODE_GROUP 0640

int catalog_file_check_dir(const char *path)
{
	char dir[4096];
	const char *slash = strrchr(path, '/');
	struct stat st;
	uid_t me = geteuid();

	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == path)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	if (stat(dir, &st)) {
		int ret = -errno;

		log_error("catalog %s: its directory %s: %s", path, dir,
			  strerror(-ret));
		return ret;
	}
	if (!S_ISDIR(st.st_mode)) {
		log_error("catalog %s: %s is not a directory", path, dir);
		return -ENOTDIR;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		log_error(
			"catalog %s: refused: its directory %s is writable by "
			"%s (mode %04o), so another user could replace the "
			"catalog; run 'chmod go-w %s' or set catalog.path "
			"to a directory only the service writes",
			path, dir,
			st.st_mode & S_IWOTH ? "others" : "its group",
			(unsigned)(st.st_mode & 07777), dir);
		return -EACCES;
	}
	if (st.st_uid != me && st.st_uid != 0) {
		log_error(
			"catalog %s: refused: its directory %s belongs to uid "
			"%u, not to this service (uid %u) or root; run "
			"'chown %u %s' or move catalog.path",
			path, dir, (unsigned)st.st_uid, (unsigned)me,
			(unsigned)me, dir);
		return -EACCES;
	}
	return 0;
}

/* Check one file (may be missing) and tighten its mode. */
static int catalog_file_guard_one(const char *file)
{
	struct stat st;
	mode_t mode;
	int fd, ret = 0;

	char proc[64];

	/* O_PATH: see the invariant at the top (its close drops no lock). */
	fd = open(file, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		ret = -errno;
		if (ret != -EACCES)
			log_error("catalog: %s: %s", file, strerror(-ret));
		/* EACCES: SQLite's open reports it. */
		return ret == -EACCES ? 0 : ret;
	}
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	if (S_ISLNK(st.st_mode)) {
		log_error("catalog: %s is a symbolic link: refused; remove it",
			  file);
		ret = -ELOOP;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		log_error("catalog: %s is not a regular file: refused", file);
		ret = -EINVAL;
		goto out;
	}
	if (st.st_uid != geteuid() && st.st_uid != 0) {
		log_error("catalog: %s belongs to uid %u, not to this service "
			  "(uid %u) or root: refused; run 'chown %u %s'",
			  file, (unsigned)st.st_uid, (unsigned)geteuid(),
			  (unsigned)geteuid(), file);
		ret = -EACCES;
		goto out;
	}
	mode = st.st_mode & 07777;
	if (!(mode & ~(mode_t)CATALOG_FILE_MODE_GROUP))
		goto out; /* 0600, 0640 or tighter */
	/* fchmod does not take an O_PATH descriptor; its /proc link is the
	 * same inode, so no name can be swapped in between. */
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (chmod(proc, CATALOG_FILE_MODE)) {
		ret = -errno;
		log_error("catalog: %s has mode %04o, readable or writable by "
			  "others, and cannot be tightened: %s; run 'chmod "
			  "600 %s'",
			  file, (unsigned)mode, strerror(-ret), file);
		goto out;
	}
	log_info("catalog: %s had mode %04o; tightened to %04o", file,
		 (unsigned)mode, CATALOG_FILE_MODE);
out:
	close(fd);
	return ret;
}

int catalog_file_guard(const char *path, bool create)
{
	static const char *const suffixes[] = { "", "-wal", "-shm" };
	char file[4096 + 8];
	int fd, ret;

	if (create) {
		/* Created here, at its final mode, before SQLite sees it. */
		fd = open(path,
			  O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			  CATALOG_FILE_MODE);
		if (fd >= 0)
			close(fd);
		else if (errno != EEXIST && errno != EACCES) {
			ret = -errno;
			log_error("catalog %s: cannot create it: %s", path,
				  strerror(-ret));
			return ret;
		}
	}
	for (size_t i = 0; i < 3; i++) {
		if (snprintf(file, sizeof(file), "%s%s", path, suffixes[i]) >=
		    (int)sizeof(file))
			return -ENAMETOOLONG;
		ret = catalog_file_guard_one(file);
		if (ret)
			return ret;
	}
	return 0;
}

/* The command of pid, from /proc, or "?". */
static void catalog_file_comm(pid_t pid, char *buf, size_t len)
{
	char p[64];
	ssize_t n;
	int fd;

	snprintf(buf, len, "?");
	snprintf(p, sizeof(p), "/proc/%d/comm", (int)pid);
	fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n <= 0) {
		snprintf(buf, len, "?");
		return;
	}
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
}

/* One range of lock bytes to report on, and what SQLite uses it for. */
struct catalog_lock_range {
	unsigned long long start, len;
	const char *what;
};

/*
 * Log the POSIX locks other processes hold on file that overlap one of the
 * n ranges r, read from /proc/locks (a query through F_GETLK would need an
 * open descriptor, whose close would drop this process's own locks).
 */
static void catalog_file_holders(const char *file,
				 const struct catalog_lock_range *r, size_t n)
{
	char line[256], type[16], adv[16], rw[16], end[32], comm[64];
	unsigned long long start, last;
	unsigned long ino;
	unsigned maj, min;
	struct stat st;
	FILE *f;
	int pid;

	if (stat(file, &st))
		return;
	f = fopen("/proc/locks", "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		const char *p = strchr(line, ':');

		/* "N: POSIX ADVISORY WRITE pid maj:min:ino start end"; a
		 * waiter's line has "->" after the colon: not a holder. */
		if (!p || strstr(p, "->") ||
		    sscanf(p + 1, "%15s %15s %15s %d %x:%x:%lu %llu %31s", type,
			   adv, rw, &pid, &maj, &min, &ino, &start, end) != 9)
			continue;
		if (strcmp(type, "POSIX") || pid == getpid() ||
		    ino != st.st_ino || makedev(maj, min) != st.st_dev)
			continue;
		last = strcmp(end, "EOF") ? strtoull(end, NULL, 10)
					  : ULLONG_MAX;
		for (size_t i = 0; i < n; i++) {
			if (start > r[i].start + r[i].len - 1 ||
			    last < r[i].start)
				continue;
			catalog_file_comm(pid, comm, sizeof(comm));
			log_error("catalog: %s: %s is held (%s lock, bytes "
				  "%llu+%llu) by pid %d (%s)",
				  file, r[i].what,
				  strcmp(rw, "WRITE") ? "read" : "write", start,
				  last == ULLONG_MAX ? 0 : last - start + 1,
				  pid, comm);
		}
	}
	fclose(f);
}

/* SQLite's lock bytes: the database's (os_unix.c) and the WAL index's. */
#define CATALOG_PENDING_BYTE 0x40000000
#define CATALOG_SHM_LOCK0 120 /* WAL_WRITE_LOCK, then CKPT, RECOVER */

void catalog_file_log_holders(const char *path)
{
	static const struct catalog_lock_range db[] = {
		{ CATALOG_PENDING_BYTE, 512 + 2, "the database lock" },
	};
	static const struct catalog_lock_range shm[] = {
		{ CATALOG_SHM_LOCK0, 1, "the WAL write lock" },
		{ CATALOG_SHM_LOCK0 + 1, 1, "the checkpoint lock" },
		{ CATALOG_SHM_LOCK0 + 2, 1, "the recovery lock" },
	};
	char file[4096 + 8];

	if (!path || !*path)
		return;
	catalog_file_holders(path, db, 1);
	snprintf(file, sizeof(file), "%s-shm", path);
	catalog_file_holders(file, shm, 3);
}
