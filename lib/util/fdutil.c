// SPDX-License-Identifier: MIT
/* fdutil: descriptors made from descriptors (fdutil.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fdutil.h"

int fdutil_reopen_rdonly(int fd)
{
	char proc[64];
	int nfd;

	if (fd < 0)
		return -EBADF;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	nfd = open(proc, O_RDONLY | O_CLOEXEC | O_NOATIME);
	if (nfd < 0 && errno == EPERM) /* a file another user owns */
		nfd = open(proc, O_RDONLY | O_CLOEXEC);
	return nfd < 0 ? -errno : nfd;
}

int fdutil_open_regular(int dirfd, const char *path, int flags, struct stat *st)
{
	struct stat sb;
	int fd = openat(dirfd, path, flags), ret;

	if (fd < 0)
		return -errno;
	if (!st)
		st = &sb;
	if (fstat(fd, st)) {
		ret = -errno;
		goto err;
	}
	if (!S_ISREG(st->st_mode)) {
		ret = -EINVAL;
		goto err;
	}
	return fd;
err:
	close(fd);
	return ret;
}

int fdutil_fdopendir(int fd, DIR **out)
{
	int ret;

	*out = fdopendir(fd);
	if (*out)
		return 0;
	ret = -errno;
	if (fd >= 0)
		close(fd);
	return ret;
}

int fdutil_opendir(int fd, DIR **out)
{
	int dfd;

	*out = NULL;
	if (fd < 0) /* openat would take AT_FDCWD for the working directory */
		return -EBADF;
	dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	return fdutil_fdopendir(dfd, out);
}
