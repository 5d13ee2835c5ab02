// SPDX-License-Identifier: MIT
/*
 * filestore_path: keys of a file:// source resolved beneath its root, with
 * openat2(RESOLVE_BENEATH) or one component at a time (see filestore.c for
 * the rules). Stateless; thread-safe.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/openat2.h>

#include "dstage/log.h"
#include "filestore_i.h"

/*
 * A key is safe as a path when it has no empty, "." or ".." segment, does not
 * start with "/", and no segment is longer than NAME_MAX. This is the only
 * thing that keeps a malicious key inside the root.
 */
static int filestore_path_check_key(const char *key, bool allow_trailing_slash)
{
	const char *seg = key;

	if (!*key || *key == '/')
		return -EINVAL;
	for (;;) {
		const char *end = strchr(seg, '/');
		size_t len = end ? (size_t)(end - seg) : strlen(seg);

		if (len == 0)
			return (!end && allow_trailing_slash) ? 0 : -EINVAL;
		if (len > NAME_MAX)
			return -ENAMETOOLONG;
		if ((len == 1 && seg[0] == '.') ||
		    (len == 2 && seg[0] == '.' && seg[1] == '.'))
			return -EINVAL;
		if (len >= sizeof(FILESTORE_TMP_PREFIX) - 1 &&
		    !strncmp(seg, FILESTORE_TMP_PREFIX,
			     sizeof(FILESTORE_TMP_PREFIX) - 1))
			return -EINVAL;
		if (!end)
			return 0;
		seg = end + 1;
	}
}

int filestore_path_key_ok(struct filestore *fs, const char *key)
{
	int ret = filestore_path_check_key(key, false);

	if (ret)
		log_error("%s: key '%s' cannot be a path under %s: %s",
			  fs->base.url, key, fs->root[0] ? fs->root : "/",
			  ret == -ENAMETOOLONG ? "a segment is too long"
					       : "empty, '.' or '..' segment");
	return ret;
}

/* ---- resolving keys beneath the root ---- */

const char *filestore_path_type_name(mode_t m)
{
	if (S_ISDIR(m))
		return "a directory";
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISBLK(m))
		return "a block device";
	if (S_ISLNK(m))
		return "a symbolic link";
	return "not a regular file";
}

/* Log why key could not be resolved (verb: "refused" or "skipped"). */
void filestore_path_msg(struct filestore *fs, const char *key, int err,
			const char *verb)
{
	if (err == -ELOOP)
		log_warn("%s: '%s' is or passes through a symbolic link: %s "
			 "(sources.follow_symlinks = no; set it to inside to "
			 "follow links that stay in the source)",
			 fs->base.url, key, verb);
	else if (err == -EXDEV)
		log_warn("%s: '%s' is a symbolic link leading outside the "
			 "source %s: %s",
			 fs->base.url, key, fs->root[0] ? fs->root : "/", verb);
}

/* Is the object open on fd inside the root? (fallback of "inside") */
static int filestore_path_fd_inside(struct filestore *fs, int fd)
{
	char proc[64], path[PATH_MAX];
	size_t rl = strlen(fs->root_real);
	ssize_t n;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	n = readlink(proc, path, sizeof(path) - 1);
	if (n < 0) {
		log_error("%s: cannot check where a link leads (%s: %s); "
			  "mount /proc or set sources.follow_symlinks = no",
			  fs->base.url, proc, strerror(errno));
		return -EACCES;
	}
	path[n] = '\0';
	if (rl == 1 || (!strncmp(path, fs->root_real, rl) && path[rl] == '/'))
		return 0;
	return -EXDEV;
}

/* Without openat2: one component at a time, never through a link (the
 * last component is opened with O_NOFOLLOW; with O_PATH that opens the link
 * itself, which the caller's fstat then refuses). */
static int filestore_path_walk(struct filestore *fs, const char *key, int flags,
			       int *out)
{
	char seg[NAME_MAX + 1];
	const char *p = key;
	int dfd = fs->root_fd, fd, ret = 0;

	for (;;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);
		struct stat st;

		if (n > NAME_MAX) {
			ret = -ENAMETOOLONG;
			break;
		}
		memcpy(seg, p, n);
		seg[n] = '\0';
		if (!slash) {
			fd = openat(dfd, seg,
				    flags | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
			if (fd < 0)
				ret = -errno;
			else
				*out = fd;
			break;
		}
		fd = openat(dfd, seg,
			    O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			ret = -errno;
			if (ret == -ENOTDIR &&
			    !fstatat(dfd, seg, &st, AT_SYMLINK_NOFOLLOW) &&
			    S_ISLNK(st.st_mode))
				ret = -ELOOP;
			break;
		}
		if (dfd != fs->root_fd)
			close(dfd);
		dfd = fd;
		p = slash + 1;
	}
	if (dfd != fs->root_fd)
		close(dfd);
	if (ret == -ELOOP || ret == -EMLINK)
		ret = -ELOOP;
	return ret;
}

/*
 * Open key (a checked key) beneath the root with flags (O_RDONLY | O_NONBLOCK
 * or O_PATH). Never leaves the root; follows symlinks only when
 * sources.follow_symlinks = inside and they stay inside. Returns 0 with *out
 * set, -ELOOP (a link, not followed), -EXDEV (a link leading out), or the
 * -errno of the open (-ENOENT...). Logs nothing.
 */
int filestore_path_resolve(struct filestore *fs, const char *key, int flags,
			   int *out)
{
	/* openat2 refuses O_NOCTTY next to O_PATH (EINVAL). */
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC |
				    (flags & O_PATH ? 0 : O_NOCTTY)),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS |
			   (fs->follow_inside ? 0 : RESOLVE_NO_SYMLINKS),
	};
	int ret;

	if (!fs->follow_inside)
		how.flags |= O_NOFOLLOW;
	if (!fs->no_openat2) {
		for (int i = 0; i < 16; i++) {
			long fd = syscall(SYS_openat2, fs->root_fd, key, &how,
					  sizeof(how));

			if (fd >= 0) {
				*out = (int)fd;
				return 0;
			}
			/* EAGAIN: a concurrent rename; try again. */
			if (errno != EAGAIN && errno != EINTR)
				break;
		}
		return errno == ELOOP ? -ELOOP : -errno;
	}
	if (!fs->follow_inside)
		return filestore_path_walk(fs, key, flags, out);
	/* Fallback of "inside": resolve, then check where it landed. */
	ret = openat(fs->root_fd, key, flags | O_CLOEXEC | O_NOCTTY);
	if (ret < 0)
		return -errno;
	*out = ret;
	ret = filestore_path_fd_inside(fs, *out);
	if (ret) {
		close(*out);
		*out = -1;
	}
	return ret;
}

/*
 * Open key as a regular file (flags as for filestore_resolve) and fstat it
 * into *st. Every refusal is logged with the key. Returns 0, -ELOOP, -EXDEV,
 * -ENOENT (missing, or a directory: not an object), -EINVAL (a FIFO, socket,
 * device or link), or the open's -errno.
 */
int filestore_path_open_file(struct filestore *fs, const char *key, int flags,
			     int *out, struct stat *st)
{
	int fd = -1, ret;

	ret = filestore_path_resolve(fs, key, flags, &fd);
	if (ret == -ENXIO) { /* a socket, or a device without a driver */
		log_error("%s: '%s' is a socket or a device, not a regular "
			  "file: refused",
			  fs->base.url, key);
		return -EINVAL;
	}
	if (ret) {
		filestore_path_msg(fs, key, ret, "refused");
		return ret;
	}
	if (fstat(fd, st)) {
		ret = -errno;
		goto err;
	}
	if (S_ISREG(st->st_mode)) {
		*out = fd;
		return 0;
	}
	if (S_ISLNK(st->st_mode)) { /* O_PATH | O_NOFOLLOW on a link */
		ret = -ELOOP;
		filestore_path_msg(fs, key, ret, "refused");
		goto err;
	}
	ret = S_ISDIR(st->st_mode) ? -ENOENT : -EINVAL;
	log_error("%s: '%s' is %s, not a regular file: refused", fs->base.url,
		  key, filestore_path_type_name(st->st_mode));
err:
	close(fd);
	return ret;
}

/*
 * Open directory key[0..len) (a checked key's prefix; 0: the root) for
 * writing beneath the root, creating missing directories when create is
 * set, one component at a time and never through a symbolic link. Returns
 * 0 with *out (O_RDONLY, for fsync), -ELOOP (a link on the way, logged) or
 * -errno.
 */
int filestore_path_open_dir(struct filestore *fs, const char *key, size_t len,
			    bool create, int *out)
{
	char seg[NAME_MAX + 1];
	size_t at = 0;
	int dfd, ret = 0;

	dfd = openat(fs->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	while (at < len) {
		const char *slash = memchr(key + at, '/', len - at);
		size_t n = slash ? (size_t)(slash - (key + at)) : len - at;
		struct stat st;
		int fd;

		if (n > NAME_MAX) {
			ret = -ENAMETOOLONG;
			break;
		}
		memcpy(seg, key + at, n);
		seg[n] = '\0';
		if (create && mkdirat(dfd, seg, 0755) && errno != EEXIST) {
			ret = -errno;
			break;
		}
		fd = openat(dfd, seg,
			    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			ret = -errno;
			if ((ret == -ENOTDIR || ret == -ELOOP) &&
			    !fstatat(dfd, seg, &st, AT_SYMLINK_NOFOLLOW) &&
			    S_ISLNK(st.st_mode)) {
				ret = -ELOOP;
				log_error("%s: '%.*s' is a symbolic link: "
					  "writes never pass through one",
					  fs->base.url, (int)(at + n), key);
			}
			break;
		}
		close(dfd);
		dfd = fd;
		at += n + 1;
	}
	if (ret) {
		close(dfd);
		return ret;
	}
	*out = dfd;
	return 0;
}

/*
 * Does this kernel have openat2 with RESOLVE_BENEATH (Linux 5.6)?
 * DSTAGE_TEST_NO_OPENAT2=1 makes the tests take the fallback path.
 */
bool filestore_path_has_openat2(int root_fd)
{
	struct open_how how = {
		.flags = O_PATH | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH,
	};
	const char *force = getenv("DSTAGE_TEST_NO_OPENAT2");
	long fd;

	if (force && !strcmp(force, "1"))
		return false;
	fd = syscall(SYS_openat2, root_fd, ".", &how, sizeof(how));
	if (fd < 0)
		return errno != ENOSYS && errno != EINVAL && errno != EPERM;
	close((int)fd);
	return true;
}
