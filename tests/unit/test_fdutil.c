// SPDX-License-Identifier: MIT
/* fdutil_open_regular: a regular file opens (its stat given back); a
 * directory, a FIFO and a link under O_NOFOLLOW are refused with nothing
 * left open; a missing name is openat's -ENOENT. fdutil_opendir: a DIR from
 * the first entry with a position of its own, fd left as it was;
 * fdutil_fdopendir: takes fd, closed on failure too. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "util/fdutil.h"

static int open_fds(void)
{
	int n = 0;

	for (int fd = 0; fd < 1024; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			n++;
	return n;
}

/* The entries of d from where it stands, "." and ".." not counted. */
static int count_entries(DIR *d)
{
	struct dirent *de;
	int n = 0;

	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	return n;
}

static void check_opendir(int dfd, int before)
{
	DIR *d1, *d2;
	int fd;

	/* fd's own position at its end (through a dup, which shares it). */
	d1 = fdopendir(dup(dfd));
	CHECK(d1 != NULL);
	CHECK_INT(count_entries(d1), 4);
	closedir(d1);

	/* Two DIRs over one fd: each its own position, from the start, even
	 * with fd's own at the end; fd stays open. */
	CHECK_INT(fdutil_opendir(dfd, &d1), 0);
	CHECK(d1 != NULL && dirfd(d1) != dfd);
	CHECK_INT(count_entries(d1), 4);
	CHECK_INT(fdutil_opendir(dfd, &d2), 0);
	CHECK_INT(count_entries(d2), 4);
	closedir(d1);
	closedir(d2);
	CHECK(fcntl(dfd, F_GETFD) >= 0);
	CHECK_INT(fdutil_opendir(dfd, &d1), 0);
	CHECK_INT(count_entries(d1), 4);
	closedir(d1);

	/* Refusals: *out NULL, nothing left open. */
	d1 = (DIR *)&d2;
	CHECK_INT(fdutil_opendir(-1, &d1), -EBADF);
	CHECK(d1 == NULL);
	CHECK_INT(fdutil_opendir(AT_FDCWD, &d1), -EBADF);
	CHECK_INT(fdutil_opendir(1000, &d1), -EBADF);
	fd = openat(dfd, "f", O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0);
	CHECK_INT(fdutil_opendir(fd, &d1), -ENOTDIR);
	CHECK(d1 == NULL && fcntl(fd, F_GETFD) >= 0);
	close(fd);
	CHECK_INT(open_fds(), before);

	/* fdutil_fdopendir takes fd: closedir closes it; a failure too. */
	fd = openat(dfd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(fd >= 0);
	CHECK_INT(fdutil_fdopendir(fd, &d1), 0);
	CHECK(d1 != NULL && dirfd(d1) == fd);
	CHECK_INT(count_entries(d1), 0);
	closedir(d1);
	fd = openat(dfd, "f", O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0);
	d1 = (DIR *)&d2;
	CHECK_INT(fdutil_fdopendir(fd, &d1), -ENOTDIR);
	CHECK(d1 == NULL && fcntl(fd, F_GETFD) < 0);
	CHECK_INT(fdutil_fdopendir(-1, &d1), -EBADF);
	CHECK_INT(open_fds(), before);
}

int main(void)
{
	char dir[] = "/tmp/test_fdutil.XXXXXX";
	struct stat st;
	int dfd, fd, before;

	CHECK(mkdtemp(dir) != NULL);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(dfd >= 0);
	fd = openat(dfd, "f", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	CHECK(fd >= 0 && write(fd, "abc", 3) == 3);
	close(fd);
	CHECK_INT(mkdirat(dfd, "d", 0700), 0);
	CHECK_INT(mkfifoat(dfd, "p", 0600), 0);
	CHECK_INT(symlinkat("f", dfd, "l"), 0);
	before = open_fds();

	/* A regular file: the descriptor and its stat. */
	memset(&st, 0, sizeof(st));
	fd = fdutil_open_regular(dfd, "f", O_RDONLY | O_CLOEXEC, &st);
	CHECK(fd >= 0);
	CHECK(S_ISREG(st.st_mode) && st.st_size == 3);
	close(fd);
	fd = fdutil_open_regular(dfd, "f", O_RDWR | O_NOFOLLOW, NULL);
	CHECK(fd >= 0);
	close(fd);

	/* Not a regular file: -EINVAL, nothing left open. */
	CHECK_INT(fdutil_open_regular(dfd, "d", O_RDONLY, &st), -EINVAL);
	CHECK_INT(fdutil_open_regular(dfd, "p", O_RDONLY | O_NONBLOCK, NULL),
		  -EINVAL);
	/* A link: followed without O_NOFOLLOW, -ELOOP with it. */
	fd = fdutil_open_regular(dfd, "l", O_RDONLY, NULL);
	CHECK(fd >= 0);
	close(fd);
	CHECK_INT(fdutil_open_regular(dfd, "l", O_RDONLY | O_NOFOLLOW, NULL),
		  -ELOOP);
	CHECK_INT(fdutil_open_regular(dfd, "none", O_RDONLY, NULL), -ENOENT);
	CHECK_INT(open_fds(), before);
	check_opendir(dfd, before);

	unlinkat(dfd, "f", 0);
	unlinkat(dfd, "l", 0);
	unlinkat(dfd, "p", 0);
	unlinkat(dfd, "d", AT_REMOVEDIR);
	close(dfd);
	rmdir(dir);
	return check_result();
}
