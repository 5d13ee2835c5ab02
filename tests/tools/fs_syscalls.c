// SPDX-License-Identifier: MIT
/*
 * fs_syscalls: check the read-only contract of a dstagefs dataset directory
 * with raw system calls (in the manner of libfuse's test_syscalls).
 *
 *   fs_syscalls DIR FILE
 *
 * DIR is a directory of a mounted dataset and FILE (a name in DIR) a
 * non-empty file. Every modifying call must fail with EROFS, every reading
 * call must work. Prints one line per failed check; exit 0 when all pass,
 * 1 otherwise, 2 on bad usage.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

static int failures;

static void expect_erofs(const char *what, int ret)
{
	if (ret >= 0) {
		printf("FAIL %s: succeeded, expected EROFS\n", what);
		failures++;
	} else if (errno != EROFS) {
		printf("FAIL %s: %s, expected EROFS\n", what, strerror(errno));
		failures++;
	}
}

static void expect_ok(const char *what, int ok)
{
	if (!ok) {
		printf("FAIL %s: %s\n", what, strerror(errno));
		failures++;
	}
}

int main(int argc, char **argv)
{
	char file[4096], nfile[4096], ndir[4096];
	struct timespec ts[2] = { { 0, 0 }, { 0, 0 } };
	struct stat st;
	char buf[4096];
	DIR *d;
	int fd;

	if (argc != 3) {
		fprintf(stderr, "usage: fs_syscalls DIR FILE\n");
		return 2;
	}
	snprintf(file, sizeof(file), "%s/%s", argv[1], argv[2]);
	snprintf(nfile, sizeof(nfile), "%s/fs_syscalls.new", argv[1]);
	snprintf(ndir, sizeof(ndir), "%s/fs_syscalls.dir", argv[1]);

	/* Reading works. */
	expect_ok("stat", stat(file, &st) == 0 && S_ISREG(st.st_mode));
	fd = open(file, O_RDONLY);
	expect_ok("open O_RDONLY", fd >= 0);
	if (fd >= 0) {
		ssize_t n = read(fd, buf, sizeof(buf));

		expect_ok("read", n > 0);
		expect_ok("pread", pread(fd, buf, 1, 0) == 1);
		expect_ok("lseek SEEK_END",
			  lseek(fd, 0, SEEK_END) == st.st_size);
		if (st.st_size > 0) {
			void *m = mmap(NULL, (size_t)st.st_size, PROT_READ,
				       MAP_PRIVATE, fd, 0);

			expect_ok("mmap PROT_READ", m != MAP_FAILED);
			if (m != MAP_FAILED)
				munmap(m, (size_t)st.st_size);
			m = mmap(NULL, (size_t)st.st_size,
				 PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (m != MAP_FAILED) {
				printf("FAIL mmap MAP_SHARED PROT_WRITE on a "
				       "read-only descriptor succeeded\n");
				failures++;
				munmap(m, (size_t)st.st_size);
			}
		}
		/* ftruncate on a read-only descriptor: EINVAL by the VFS. */
		expect_erofs("fchmod", fchmod(fd, 0600));
		/* Nothing to sync on a snapshot: the dispatcher's default. */
		expect_ok("fsync", fsync(fd) == 0);
		close(fd);
	}
	d = opendir(argv[1]);
	expect_ok("opendir", d != NULL);
	if (d) {
		int seen = 0;
		struct dirent *de;

		while ((de = readdir(d)))
			seen += strcmp(de->d_name, argv[2]) == 0;
		expect_ok("readdir lists FILE", seen == 1);
		closedir(d);
	}
	expect_ok("access R_OK", access(file, R_OK) == 0);

	/* Modifying fails with EROFS. */
	expect_erofs("open O_WRONLY", open(file, O_WRONLY));
	expect_erofs("open O_RDWR", open(file, O_RDWR));
	expect_erofs("open O_RDONLY|O_TRUNC", open(file, O_RDONLY | O_TRUNC));
	expect_erofs("open O_APPEND", open(file, O_WRONLY | O_APPEND));
	expect_erofs("creat", open(nfile, O_WRONLY | O_CREAT | O_EXCL, 0644));
	expect_erofs("mknod", mknod(nfile, S_IFREG | 0644, 0));
	expect_erofs("mkfifo", mkfifo(nfile, 0644));
	expect_erofs("mkdir", mkdir(ndir, 0755));
	expect_erofs("unlink", unlink(file));
	expect_erofs("rename", rename(file, nfile));
	expect_erofs("link", link(file, nfile));
	expect_erofs("symlink", symlink("target", nfile));
	expect_erofs("truncate", truncate(file, 0));
	expect_erofs("chmod", chmod(file, 0600));
	expect_erofs("chown", chown(file, 1, 1));
	expect_erofs("utimensat", utimensat(AT_FDCWD, file, ts, 0));
	expect_erofs("setxattr", setxattr(file, "user.x", "1", 1, 0));
	expect_erofs("removexattr", removexattr(file, "user.x"));
	/* No extended attributes: EOPNOTSUPP (the dispatcher's default). */
	expect_ok("getxattr EOPNOTSUPP",
		  getxattr(file, "user.x", buf, sizeof(buf)) < 0 &&
			  errno == EOPNOTSUPP);
	expect_ok("listxattr EOPNOTSUPP",
		  listxattr(file, buf, sizeof(buf)) < 0 && errno == EOPNOTSUPP);
	expect_erofs("access W_OK", access(file, W_OK));
	expect_erofs("chmod dir", chmod(argv[1], 0700));
	expect_erofs("rmdir dir", rmdir(argv[1]));

	/* Nothing changed. */
	{
		struct stat st2;

		expect_ok("stat after", stat(file, &st2) == 0 &&
						st2.st_size == st.st_size &&
						st2.st_mode == st.st_mode);
		errno = 0;
		expect_ok("no new file",
			  stat(nfile, &st2) != 0 && errno == ENOENT);
	}
	printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
	return failures ? 1 : 0;
}
