// SPDX-License-Identifier: MIT
/*
 * ckpt_ownrec: an owner record's text ("<uid> <gid> <mode in octal>\n")
 * and the journal of the records kept on this node until a publish takes
 * them to the store (ckpt_stage.h; ckpt_owner.c says what they mean).
 *
 * The journal is the staging directory's owners/: one file per kept key,
 * named by the SHA-256 of the key in hex, holding the record's line and
 * the key on a second line (keys hold no control byte: ckpt_key_ok), mode
 * 0600. It is what makes an owner outlive a failed publish and a crash:
 * every publisher of a file (dstagefs, its restart, the stager daemon's
 * retry job) stores the kept records of the file and of its directories
 * before the file, so no published object is left without its owner.
 *
 * A record's states: absent -> kept (created by ckpt_ownrec_open with
 * create, written) -> changed (written again, in place) -> gone (unlinked
 * once stored, or with its key). Each step holds the file's flock
 * (LOCK_EX, on a descriptor of its own, so it excludes this process's
 * other threads as well as the stager daemon), and a file found unlinked
 * after its lock is taken is absent: a change waits for a publisher that
 * is storing the record, then finds it gone and stores its own, so the
 * store ends with the newer. Records are not fsynced when written: a
 * publish makes those of its key durable before its P record is, in the
 * same pass that stores them (ckpt_owner_store_kept: each record fsynced
 * under its lock before it is stored, owners/ after the last; one open a
 * level, and none more for a level without a record).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/log.h"
#include "dstage/sha256.h"
#include "util/fdutil.h"
#include "util/strutil.h"

/* The records a move reads, at most (kept records are files and
 * directories made and not yet published: bounded by uid_files). */
#define CKPT_OWNREC_SCAN_MAX (1u << 20)
/* A key, its newline and NUL (the store's keys are at most 1,024 bytes;
 * journal records hold up to 4,095). */
#define CKPT_KEY_BUF 4096

int ckpt_ownrec_format(const struct ckpt_owner *o, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%u %u %04o\n", (unsigned)o->uid,
			 (unsigned)o->gid, (unsigned)(o->mode & 07777));

	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : n;
}

int ckpt_ownrec_parse(const char *s, struct ckpt_owner *o)
{
	unsigned long v[3];
	char *end;

	for (int i = 0; i < 3; i++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		errno = 0;
		v[i] = strtoul(s, &end, i == 2 ? 8 : 10);
		if (errno || end == s || *end != (i == 2 ? '\n' : ' '))
			return -EINVAL;
		s = end + 1;
	}
	if (*s || v[0] >= UINT32_MAX || v[1] >= UINT32_MAX || v[2] > 07777)
		return -EINVAL;
	o->uid = (uid_t)v[0];
	o->gid = (gid_t)v[1];
	o->mode = (mode_t)v[2];
	return 0;
}

/* owners/'s name of key: its SHA-256 in hex. 0 or -ENOMEM. */
static int ckpt_ownrec_name(const char *key, char name[2 * SHA256_LEN + 1])
{
	unsigned char md[SHA256_LEN];
	int ret = sha256_buf(key, strlen(key), md);

	if (!ret)
		strutil_hex(md, SHA256_LEN, name);
	return ret;
}

int ckpt_ownrec_open(const struct ckpt_dirs *d, const char *key, bool create,
		     int *out)
{
	char name[2 * SHA256_LEN + 1];
	struct stat st;

	*out = -1;
	if (d->owners_fd < 0)
		return -ENOENT; /* no journal (the drill's) */
	if (ckpt_ownrec_name(key, name))
		return -ENOMEM;
	for (int tries = 0; tries < 100; tries++) {
		int fd = openat(d->owners_fd, name,
				(create ? O_CREAT : 0) | O_RDWR | O_NOFOLLOW |
					O_CLOEXEC,
				0600);

		if (fd < 0)
			return -errno;
		if (flock(fd, LOCK_EX) || fstat(fd, &st)) {
			int ret = -errno;

			close(fd);
			return ret;
		}
		if (st.st_nlink > 0 && S_ISREG(st.st_mode)) {
			*out = fd;
			return 0;
		}
		close(fd); /* stored and unlinked meanwhile */
		if (!create)
			return -ENOENT;
	}
	return -EAGAIN;
}

int ckpt_ownrec_read(int fd, const char *key, struct ckpt_owner *o)
{
	char buf[64 + CKPT_KEY_BUF], *nl;
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	if (n < 0)
		return -errno;
	buf[n] = '\0';
	nl = strchr(buf, '\n');
	if (!nl || nl[1] == '\0')
		return -EINVAL;
	if (key) {
		size_t kl = strlen(key);

		if (strncmp(nl + 1, key, kl) || nl[1 + kl] != '\n')
			return -EINVAL;
	}
	nl[1] = '\0';
	return ckpt_ownrec_parse(buf, o);
}

/* The key written in the record fd (for a scan): 0 and key, or -EINVAL. */
static int ckpt_ownrec_key(int fd, char *key, size_t size)
{
	char buf[64 + CKPT_KEY_BUF], *nl, *end;
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	if (n < 0)
		return -errno;
	buf[n] = '\0';
	nl = strchr(buf, '\n');
	end = nl ? strchr(nl + 1, '\n') : NULL;
	if (!end || (size_t)(end - nl) > size)
		return -EINVAL;
	*end = '\0';
	snprintf(key, size, "%s", nl + 1);
	return 0;
}

int ckpt_ownrec_write(int fd, const char *key, const struct ckpt_owner *o)
{
	char buf[64 + CKPT_KEY_BUF];
	int n = ckpt_ownrec_format(o, buf, sizeof(buf));
	int k;

	if (n < 0)
		return n;
	k = snprintf(buf + n, sizeof(buf) - (size_t)n, "%s\n", key);
	if (k < 0 || (size_t)k >= sizeof(buf) - (size_t)n)
		return -ENAMETOOLONG;
	n += k;
	if (ftruncate(fd, 0) || pwrite(fd, buf, (size_t)n, 0) != n)
		return errno ? -errno : -EIO;
	return 0;
}

void ckpt_ownrec_unlink(const struct ckpt_dirs *d, const char *key)
{
	char name[2 * SHA256_LEN + 1];

	if (d->owners_fd < 0 || ckpt_ownrec_name(key, name))
		return;
	if (unlinkat(d->owners_fd, name, 0) && errno != ENOENT)
		log_warn("checkpoints: %s/%s/%s (the kept owner of %s): %s",
			 d->staging, CKPT_OWNERS, name, key, strerror(errno));
}

int ckpt_ownrec_each(const struct ckpt_dirs *d, ckpt_ownrec_fn fn, void *arg)
{
	struct dirent *de;
	unsigned seen = 0;
	DIR *dir;
	int ret;

	if (d->owners_fd < 0)
		return 0;
	ret = fdutil_opendir(d->owners_fd, &dir);
	if (ret)
		return ret;
	while (!ret && seen++ < CKPT_OWNREC_SCAN_MAX &&
	       (de = readdir(dir)) != NULL) {
		char key[CKPT_KEY_BUF];
		int fd;

		if (de->d_name[0] == '.')
			continue;
		fd = openat(d->owners_fd, de->d_name,
			    O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (!ckpt_ownrec_key(fd, key, sizeof(key)))
			ret = fn(arg, key);
		close(fd);
	}
	closedir(dir);
	return ret;
}
