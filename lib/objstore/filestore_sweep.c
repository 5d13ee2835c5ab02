// SPDX-License-Identifier: MIT
/*
 * filestore_sweep: the temporary files of the file:// backend, named so
 * that they can be told apart and aged, and the sweep that removes those a
 * writer left behind when it died (kill -9 in the middle of a put).
 *
 * A temporary file is ".dstage-tmp.<host>.<pid>.<random>": host is the
 * FNV-1a hash of the writer's host name (8 hex digits), pid its process id,
 * random 16 hex digits. A live put keeps its file's mtime fresh: every
 * write updates it. A file older than store.tmp_max_age is taken as
 * abandoned and removed, unless it carries this host and this process's
 * pid (our own, in progress). The older form ".dstage-tmp.<16 hex>" is
 * recognised too (files left before the writer was named).
 *
 * The sweep walks the store's tree beneath its root fd only: directories
 * are opened with O_NOFOLLOW (a link to a directory is never entered),
 * entries are looked at with fstatat(AT_SYMLINK_NOFOLLOW), and only a
 * regular file whose name has the exact form above is unlinked. The work
 * of a pass is bounded (FILESTORE_SWEEP_MAX_REMOVE removals,
 * FILESTORE_SWEEP_MAX_ENTRIES entries, 256 levels).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dstage/log.h"
#include "dstage/timeutil.h"
#include "filestore_i.h"
#include "util/fdutil.h"

struct fs_sweep {
	struct filestore *fs;
	char dir[PATH_MAX]; /* key form of the directory walked, "" or "a/b/" */
	int64_t now_ns, max_age_ns;
	long self_pid;
	unsigned depth;
	unsigned long entries;
	int removed;
};

int filestore_tmp_name(struct filestore *fs, char tmp[NAME_MAX + 1])
{
	uint64_t rnd;

	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		return -EIO;
	snprintf(tmp, NAME_MAX + 1, "%s%08x.%ld.%016llx", FILESTORE_TMP_PREFIX,
		 fs->host_hash, (long)getpid(), (unsigned long long)rnd);
	return 0;
}

/* Number of leading characters of s that are lowercase hex digits. */
static size_t hex_span(const char *s)
{
	return strspn(s, "0123456789abcdef");
}

bool filestore_tmp_parse(const char *name, uint32_t *host, long *pid)
{
	const char *p;
	size_t n;
	long v = 0;
	uint32_t h = 0;

	if (strncmp(name, FILESTORE_TMP_PREFIX,
		    sizeof(FILESTORE_TMP_PREFIX) - 1))
		return false;
	p = name + sizeof(FILESTORE_TMP_PREFIX) - 1;
	n = hex_span(p);
	if (n == 16 && p[16] == '\0') { /* the older form */
		*host = 0;
		*pid = 0;
		return true;
	}
	if (n != 8 || p[8] != '.')
		return false;
	for (size_t i = 0; i < 8; i++)
		h = h << 4 |
		    (uint32_t)(p[i] <= '9' ? p[i] - '0' : p[i] - 'a' + 10);
	p += 9;
	n = strspn(p, "0123456789");
	if (n == 0 || n > 10 || p[n] != '.')
		return false;
	for (size_t i = 0; i < n; i++)
		v = v * 10 + (p[i] - '0');
	p += n + 1;
	if (hex_span(p) != 16 || p[16] != '\0')
		return false;
	*host = h;
	*pid = v;
	return true;
}

/* Remove entry name of directory dfd when it is an old temporary file. */
static void sweep_entry(struct fs_sweep *s, int dfd, const char *name)
{
	struct filestore *fs = s->fs;
	struct stat st;
	uint32_t host;
	long pid;
	int64_t age;

	if (!filestore_tmp_parse(name, &host, &pid))
		return;
	if (host == fs->host_hash && pid == s->self_pid)
		return; /* ours: a put of this process in progress */
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) ||
	    !S_ISREG(st.st_mode))
		return;
	age = s->now_ns -
	      ((int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec);
	if (age <= s->max_age_ns)
		return;
	if (unlinkat(dfd, name, 0)) {
		if (errno != ENOENT)
			log_warn("%s: cannot remove stale temporary file "
				 "'%s%s': %s",
				 fs->base.url, s->dir, name, strerror(errno));
		return;
	}
	s->removed++;
	log_info("%s: removed stale temporary file '%s%s' (%lld bytes, last "
		 "written %llds ago; store.tmp_max_age %llus)",
		 fs->base.url, s->dir, name, (long long)st.st_size,
		 (long long)(age / 1000000000),
		 (unsigned long long)(fs->tmp_max_age_ms / 1000));
}

/* Sweep directory dfd (closed here), named s->dir[0..len). */
static int sweep_dir(struct fs_sweep *s, int dfd, size_t len)
{
	struct dirent *de;
	DIR *d = NULL;
	int ret = 0;

	if (++s->depth > 256) {
		close(dfd);
		goto out;
	}
	ret = fdutil_fdopendir(dfd, &d);
	if (ret)
		goto out;
	while (s->removed < FILESTORE_SWEEP_MAX_REMOVE &&
	       s->entries < FILESTORE_SWEEP_MAX_ENTRIES &&
	       (errno = 0, de = readdir(d))) {
		size_t nl = strlen(de->d_name);
		unsigned char type = de->d_type;
		struct stat st;
		int sub, r;

		s->entries++;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (type == DT_UNKNOWN) {
			if (fstatat(dirfd(d), de->d_name, &st,
				    AT_SYMLINK_NOFOLLOW))
				continue; /* vanished */
			type = S_ISDIR(st.st_mode)   ? DT_DIR
			       : S_ISREG(st.st_mode) ? DT_REG
						     : DT_UNKNOWN;
		}
		if (type == DT_REG) {
			sweep_entry(s, dirfd(d), de->d_name);
			continue;
		}
		if (type != DT_DIR || len + nl + 2 > sizeof(s->dir))
			continue;
		sub = openat(dirfd(d), de->d_name,
			     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0)
			continue; /* vanished, or swapped for a link */
		memcpy(s->dir + len, de->d_name, nl);
		s->dir[len + nl] = '/';
		s->dir[len + nl + 1] = '\0';
		r = sweep_dir(s, sub, len + nl + 1);
		if (r)
			log_warn("%s: stale temporary files: cannot read "
				 "directory '%s': %s",
				 s->fs->base.url, s->dir, strerror(-r));
		s->dir[len] = '\0';
	}
	if (!ret && errno && s->removed < FILESTORE_SWEEP_MAX_REMOVE &&
	    s->entries < FILESTORE_SWEEP_MAX_ENTRIES)
		ret = -errno;
out:
	if (d)
		closedir(d);
	s->depth--;
	return ret;
}

int filestore_sweep(struct filestore *fs)
{
	struct fs_sweep *s = calloc(1, sizeof(*s));
	struct timespec now;
	int dfd, ret;

	if (!s)
		return -ENOMEM;
	clock_gettime(CLOCK_REALTIME, &now);
	s->fs = fs;
	s->now_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
	s->max_age_ns = (int64_t)fs->tmp_max_age_ms * 1000000;
	s->self_pid = (long)getpid();
	dfd = openat(fs->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		ret = -errno;
		goto out;
	}
	ret = sweep_dir(s, dfd, 0);
	if (!ret)
		ret = s->removed;
	if (s->removed >= FILESTORE_SWEEP_MAX_REMOVE ||
	    s->entries >= FILESTORE_SWEEP_MAX_ENTRIES)
		log_info("%s: stale temporary files: this pass stopped after "
			 "%d removals and %lu entries; the next goes on",
			 fs->base.url, s->removed, s->entries);
out:
	free(s);
	return ret;
}

void filestore_sweep_maybe(struct filestore *fs)
{
	int64_t now_ms, next, every;
	int ret;

	if (!fs->tmp_max_age_ms)
		return;
	now_ms = timeutil_mono_ms();
	next = __atomic_load_n(&fs->next_sweep_ms, __ATOMIC_ACQUIRE);
	if (next && now_ms < next)
		return;
	every = (int64_t)(fs->tmp_max_age_ms / 2);
	if (every < 60000)
		every = 60000;
	if (every > 3600000)
		every = 3600000;
	/* One thread wins the pass; the others do not wait for it. */
	if (!__atomic_compare_exchange_n(&fs->next_sweep_ms, &next,
					 now_ms + every, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	ret = filestore_sweep(fs);
	if (ret < 0)
		log_warn("%s: stale temporary files: sweep failed: %s",
			 fs->base.url, strerror(-ret));
}
