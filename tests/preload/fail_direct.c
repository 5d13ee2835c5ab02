/*
 * fail_direct.so: an LD_PRELOAD shim for a file system that opens files
 * with O_DIRECT but refuses direct writes (EINVAL at write time, as some
 * network and FUSE file systems do). Every pwrite on a descriptor opened
 * with O_DIRECT fails with EINVAL; the cache must then fall back to
 * buffered writes of the same bytes. Only the pread/pwrite path goes
 * through libc (DSTAGE_NO_URING=1); io_uring's writes do not.
 *
 * FAIL_DIRECT_LOG=FILE: each refusal appends one byte to FILE, so a test
 * knows the fallback was taken.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#undef _FILE_OFFSET_BITS /* pwrite64 below is declared as itself */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);

static void fail_direct_log(void)
{
	const char *log = getenv("FAIL_DIRECT_LOG");
	int fd;

	if (!log)
		return;
	fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
	if (fd >= 0) {
		ssize_t w = write(fd, "x", 1);

		(void)w;
		close(fd);
	}
}

/*
 * The project builds with 64-bit offsets, so its calls bind to pwrite64
 * (as they do natively on 64-bit); interpose that name only.
 */
ssize_t pwrite64(int fd, const void *buf, size_t len, off_t off)
{
	static pwrite_fn real;
	int fl = fcntl(fd, F_GETFL);

	if (fl >= 0 && (fl & O_DIRECT)) {
		fail_direct_log();
		errno = EINVAL;
		return -1;
	}
	if (!real)
		real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
	return real(fd, buf, len, off);
}
