/*
 * faults.so: an LD_PRELOAD shim that makes one kind of system call fail, so
 * the tests can drive fallbacks nothing on this machine would otherwise
 * reach. DSTAGE_FAULT names the fault:
 *
 *   mmap_populate  every file mapping asked for with MAP_POPULATE (how the
 *                  cache checks a block in place, cache_verify_map) fails
 *                  with ENOMEM: the block must be read and checked instead;
 *   direct_write   every pwrite on a descriptor opened with O_DIRECT fails
 *                  with EINVAL, as on a file system that opens with O_DIRECT
 *                  but refuses the writes: fills must fall back to buffered
 *                  writes. Only the pread/pwrite path goes through libc
 *                  (DSTAGE_NO_URING=1); io_uring's writes do not.
 *
 * DSTAGE_FAULT_LOG=FILE: each injected failure appends one byte to FILE, so
 * a test knows the fallback was taken rather than assuming it. Every other
 * call passes through untouched.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#undef _FILE_OFFSET_BITS /* mmap64, pwrite64 below declared as themselves */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);

/* Whether fault `name` is on; if so, log it and set errno to err. */
static bool faults_inject(const char *name, int err)
{
	const char *on = getenv("DSTAGE_FAULT"), *log;
	int fd;

	if (!on || strcmp(on, name))
		return false;
	log = getenv("DSTAGE_FAULT_LOG");
	fd = log ? open(log, O_WRONLY | O_APPEND | O_CREAT, 0644) : -1;
	if (fd >= 0) {
		ssize_t w = write(fd, "x", 1);

		(void)w;
		close(fd);
	}
	errno = err;
	return true;
}

/*
 * The project builds with 64-bit offsets, so its calls bind to mmap64 and
 * pwrite64 (the same functions as mmap and pwrite on 64-bit): interpose
 * those names.
 */
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	static mmap_fn real;

	if (fd >= 0 && (flags & MAP_POPULATE) &&
	    faults_inject("mmap_populate", ENOMEM))
		return MAP_FAILED;
	if (!real)
		real = (mmap_fn)dlsym(RTLD_NEXT, "mmap64");
	return real(addr, len, prot, flags, fd, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t len, off_t off)
{
	static pwrite_fn real;
	int fl = fcntl(fd, F_GETFL);

	if (fl >= 0 && (fl & O_DIRECT) && faults_inject("direct_write", EINVAL))
		return -1;
	if (!real)
		real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
	return real(fd, buf, len, off);
}
