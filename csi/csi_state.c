// SPDX-License-Identifier: MIT
/*
 * csi_state: what survives a restart of dstage-csi, and the mounts.
 *
 * The state directory (--state-dir, default /run/dstage-csi, mode 0700,
 * root's) holds one file per published target, named by the XXH3-128 of
 * the target path, holding one proto line (dstage/proto.h: target,
 * volume_id, kind, name, subpath, readonly). A record is written before
 * the bind mount and removed after the unmount, so a plugin killed at any
 * point leaves at most a record without a mount (dropped at the next
 * start), never a mount without a record. The records are what a restarted
 * plugin re-binds when dstagefs restarted under them; unpublishing needs
 * none (it looks at /proc/self/mountinfo).
 *
 * Beside them, one ".wait" file per target whose publish waits for
 * staging: its first wait's time (target, since), the clock of the
 * volume's stagingTimeout, so that a restarted plugin goes on counting
 * from it instead of from zero. csi_node.c keeps them bounded and removes
 * one when its publish succeeds, fails for good or is unpublished.
 *
 * Stateless functions over the file system; callers serialize work on one
 * target (csi_node.c's table of targets in flight).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "csi.h"
#include "dstage/log.h"
#include "dstage/proto.h"

#define CSI_STATE_SUFFIX ".vol"
#define CSI_WAIT_SUFFIX ".wait"

static void csi_state_path(const char *dir, const char *target,
			   const char *suffix, char *out, size_t len)
{
	XXH128_hash_t h = XXH3_128bits(target, strlen(target));

	snprintf(out, len, "%s/%016llx%016llx%s", dir,
		 (unsigned long long)h.high64, (unsigned long long)h.low64,
		 suffix);
}

int csi_state_init(const char *dir)
{
	struct stat st;

	if (mkdir(dir, 0700) && errno != EEXIST)
		return -errno;
	if (lstat(dir, &st))
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid())
		return -ENOTDIR;
	if ((st.st_mode & 07777) != 0700 && chmod(dir, 0700))
		return -errno;
	return 0;
}

/* Write b's line (ended) at path durably: a temporary file renamed over
 * it, so a reader sees the old file or the new one, never a part. */
static int csi_state_write(const char *path, const struct proto_buf *b)
{
	char tmp[4300];
	int fd, ret = 0;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
		  0600);
	if (fd < 0)
		return -errno;
	errno = 0; /* a short write sets none */
	if (write(fd, b->data, b->len) != (ssize_t)b->len || fsync(fd))
		ret = errno ? -errno : -EIO;
	if (close(fd) && !ret)
		ret = -errno;
	if (!ret && rename(tmp, path))
		ret = -errno;
	if (ret)
		unlink(tmp);
	return ret;
}

int csi_state_put(const char *dir, const struct csi_record *rec)
{
	char path[4200];
	struct proto_buf b = { 0 };
	int ret;

	proto_add(&b, "target", rec->target);
	proto_add(&b, "volume_id", rec->volume_id);
	proto_add(&b, "kind",
		  rec->kind == CSI_VOL_DATASET ? "dataset" : "checkpoints");
	proto_add(&b, "name", rec->name);
	proto_add(&b, "subpath", rec->subpath);
	proto_add(&b, "readonly", rec->readonly ? "1" : "0");
	ret = proto_end(&b);
	if (!ret) {
		csi_state_path(dir, rec->target, CSI_STATE_SUFFIX, path,
			       sizeof(path));
		ret = csi_state_write(path, &b);
	}
	proto_free(&b);
	return ret;
}

/* Read the one line of the file at path into m. */
static int csi_state_load(const char *path, struct proto_msg *m)
{
	char buf[8192];
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n <= 0 || buf[n - 1] != '\n')
		return n < 0 ? -errno : -EINVAL;
	if (proto_parse(m, buf, (size_t)n - 1))
		return -EINVAL;
	return 0;
}

static int csi_state_read(const char *path, struct csi_record *rec)
{
	static __thread struct proto_msg m;
	const char *v;
	int ret = csi_state_load(path, &m);

	if (ret)
		return ret;
	memset(rec, 0, sizeof(*rec));
	v = proto_get(&m, "target");
	if (!v || !*v)
		return -EINVAL;
	snprintf(rec->target, sizeof(rec->target), "%s", v);
	v = proto_get(&m, "volume_id");
	snprintf(rec->volume_id, sizeof(rec->volume_id), "%s", v ? v : "");
	v = proto_get(&m, "kind");
	rec->kind = v && !strcmp(v, "checkpoints") ? CSI_VOL_CHECKPOINTS
						   : CSI_VOL_DATASET;
	v = proto_get(&m, "name");
	if (!v || !*v)
		return -EINVAL;
	snprintf(rec->name, sizeof(rec->name), "%s", v);
	v = proto_get(&m, "subpath");
	snprintf(rec->subpath, sizeof(rec->subpath), "%s", v ? v : "");
	v = proto_get(&m, "readonly");
	rec->readonly = v && !strcmp(v, "1");
	return 0;
}

int csi_state_get(const char *dir, const char *target, struct csi_record *rec)
{
	char path[4200];
	int ret;

	csi_state_path(dir, target, CSI_STATE_SUFFIX, path, sizeof(path));
	ret = csi_state_read(path, rec);
	if (!ret && strcmp(rec->target, target))
		ret = -ENOENT; /* another target with the same hash */
	return ret;
}

static int csi_state_unlink(const char *dir, const char *target,
			    const char *suffix)
{
	char path[4200];

	csi_state_path(dir, target, suffix, path, sizeof(path));
	if (unlink(path) && errno != ENOENT)
		return -errno;
	return 0;
}

int csi_state_del(const char *dir, const char *target)
{
	return csi_state_unlink(dir, target, CSI_STATE_SUFFIX);
}

/* Call fn with the path of each file of dir named *suffix. */
static int csi_state_walk(const char *dir, const char *suffix,
			  int (*fn)(void *arg, const char *path), void *arg)
{
	DIR *d = opendir(dir);
	size_t sn = strlen(suffix);
	struct dirent *e;
	int ret = 0;

	if (!d)
		return -errno;
	while (!ret && (e = readdir(d))) {
		size_t n = strlen(e->d_name);
		char path[4200];

		if (n <= sn || strcmp(e->d_name + n - sn, suffix))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		ret = fn(arg, path);
	}
	closedir(d);
	return ret;
}

struct csi_state_cb {
	int (*rec_fn)(void *arg, const struct csi_record *rec);
	int (*wait_fn)(void *arg, const char *target, int64_t since);
	void *arg;
};

static int csi_state_each_cb(void *arg, const char *path)
{
	struct csi_state_cb *cb = arg;
	struct csi_record rec;

	if (csi_state_read(path, &rec)) {
		log_warn("dstage-csi: %s: not a record, skipped", path);
		return 0;
	}
	return cb->rec_fn(cb->arg, &rec);
}

int csi_state_each(const char *dir,
		   int (*fn)(void *arg, const struct csi_record *rec),
		   void *arg)
{
	struct csi_state_cb cb = { .rec_fn = fn, .arg = arg };

	return csi_state_walk(dir, CSI_STATE_SUFFIX, csi_state_each_cb, &cb);
}

/* ---- first waits ---- */

int csi_state_wait_put(const char *dir, const char *target, int64_t since)
{
	char path[4200];
	struct proto_buf b = { 0 };
	int ret;

	proto_add(&b, "target", target);
	proto_add_i64(&b, "since", since);
	ret = proto_end(&b);
	if (!ret) {
		csi_state_path(dir, target, CSI_WAIT_SUFFIX, path,
			       sizeof(path));
		ret = csi_state_write(path, &b);
	}
	proto_free(&b);
	return ret;
}

int csi_state_wait_del(const char *dir, const char *target)
{
	return csi_state_unlink(dir, target, CSI_WAIT_SUFFIX);
}

static int csi_state_wait_cb(void *arg, const char *path)
{
	static __thread struct proto_msg m;
	struct csi_state_cb *cb = arg;
	const char *target;
	int64_t since;

	if (csi_state_load(path, &m) || !(target = proto_get(&m, "target")) ||
	    target[0] != '/' || proto_get_i64(&m, "since", &since)) {
		/* ours, and of no use to anyone: a clock lost */
		log_warn("dstage-csi: %s: not a first-wait time, removed",
			 path);
		unlink(path);
		return 0;
	}
	return cb->wait_fn(cb->arg, target, since);
}

int csi_state_wait_each(const char *dir,
			int (*fn)(void *arg, const char *target, int64_t since),
			void *arg)
{
	struct csi_state_cb cb = { .wait_fn = fn, .arg = arg };

	return csi_state_walk(dir, CSI_WAIT_SUFFIX, csi_state_wait_cb, &cb);
}

/* Undo mountinfo's octal escapes (\040 for a space) in place. */
static void csi_state_unescape(char *s)
{
	char *w = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' &&
		    s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
			*w++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 +
				      (s[3] - '0'));
			s += 3;
		} else {
			*w++ = *s;
		}
	}
	*w = '\0';
}

int csi_state_mounted(const char *path, char *fstype)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	int found = 0;

	if (!f)
		return -errno;
	/* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [TAGS...] - FSTYPE SRC SOPTS;
	 * the last entry for a path is the one on top. */
	while (getline(&line, &cap, f) > 0) {
		char *save = NULL, *tok, *mp = NULL;
		int i = 0;

		for (tok = strtok_r(line, " \n", &save); tok;
		     tok = strtok_r(NULL, " \n", &save), i++) {
			if (i == 4)
				mp = tok;
			if (i > 5 && !strcmp(tok, "-"))
				break;
		}
		if (!mp)
			continue;
		csi_state_unescape(mp);
		if (strcmp(mp, path))
			continue;
		found = 1;
		tok = strtok_r(NULL, " \n", &save);
		if (fstype)
			snprintf(fstype, 64, "%s", tok ? tok : "");
	}
	free(line);
	fclose(f);
	return found;
}

bool csi_state_stale(const char *target)
{
	struct statvfs sv;

	/* statfs always reaches the FUSE daemon; a stat may be answered
	 * from the attributes the kernel keeps (dstagefs's long timeouts). */
	return statvfs(target, &sv) && errno == ENOTCONN;
}

/* mkdir -p, 0750 for what it makes (kubelet makes the parents itself). */
static int csi_state_mkdirs(const char *path)
{
	char buf[4096];
	size_t n = strlen(path);

	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0750) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0750) && errno != EEXIST)
		return -errno;
	return 0;
}

int csi_state_rebind(const char *src, const char *target, bool readonly)
{
	int ret;

	if (mount(src, target, NULL, MS_BIND, NULL))
		return -errno;
	if (readonly &&
	    mount(NULL, target, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL)) {
		ret = -errno;
		umount2(target, MNT_DETACH);
		return ret;
	}
	return 0;
}

int csi_state_bind(const char *src, const char *target, bool readonly)
{
	int ret = csi_state_mkdirs(target);

	if (ret)
		return ret;
	if (mount(src, target, NULL, MS_BIND, NULL))
		return -errno;
	/* A bind mount takes the flags of its source; read-only needs a
	 * remount of the bind itself. */
	if (readonly &&
	    mount(NULL, target, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL)) {
		ret = -errno;
		if (umount2(target, MNT_DETACH))
			log_warn("dstage-csi: %s: bound, not read-only, and "
				 "the unmount failed: %s",
				 target, strerror(errno));
		return ret;
	}
	return 0;
}

int csi_state_unbind(const char *target)
{
	/* Bind mounts can be stacked (a re-bind over a stale one that a
	 * lazy unmount left, or a CO that published twice by hand). */
	for (int i = 0; i < 16; i++) {
		int m = csi_state_mounted(target, NULL);

		if (m < 0)
			return m;
		if (!m)
			break;
		if (umount2(target, 0) && umount2(target, MNT_DETACH))
			return -errno;
	}
	if (rmdir(target) && errno != ENOENT) {
		/* a file left by someone else, or still a mount point */
		return -errno;
	}
	return 0;
}
