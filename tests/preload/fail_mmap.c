/*
 * fail_mmap.so: an LD_PRELOAD shim that refuses every file mapping asked
 * for with MAP_POPULATE (ENOMEM), the kind the cache checks blocks in place
 * with (cache_verify_map), so the tests can drive the cache's fallback: a
 * block that cannot be mapped is read into a buffer and checked there.
 *
 * FAIL_MMAP_LOG=FILE: each refusal appends one byte to FILE, so a test
 * knows the fallback was taken rather than assuming it. Other mappings
 * (the loader's, malloc's, SQLite's) pass through untouched.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	static mmap_fn real;
	const char *log;

	if (fd >= 0 && (flags & MAP_POPULATE)) {
		log = getenv("FAIL_MMAP_LOG");
		if (log) {
			int lfd =
				open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);

			if (lfd >= 0) {
				ssize_t w = write(lfd, "x", 1);

				(void)w;
				close(lfd);
			}
		}
		errno = ENOMEM;
		return MAP_FAILED;
	}
	if (!real)
		real = (mmap_fn)dlsym(RTLD_NEXT, "mmap");
	return real(addr, len, prot, flags, fd, off);
}
