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
 *
 * DSTAGE_SYNC_TRACE=FILE (no fault): the order of writes and syncs on the
 * cache's object files (regular files with "/objects/" in their path),
 * one line each, appended to FILE:
 *
 *   W INO OFF LEN     a pwrite (the pread/pwrite path, DSTAGE_NO_URING=1)
 *   S INO NVALID      an fdatasync or fsync, with the number of block
 *                     records valid for the object at that moment (read
 *                     from its sidecar, PATH.meta, or from the file itself
 *                     where it has none: io_uring's writes are not seen,
 *                     their results are)
 *
 * tests/integration/test_guards.py checks from it that a block's record is
 * written only after its data is durable.
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
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef int (*sync_fn)(int);

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

/* ---- DSTAGE_SYNC_TRACE ---- */

/* The cache file's layout (lib/cache/cache_i.h): struct cache_hdr is 64 bytes,
 * the strings follow, the records start at the next 4 KiB. */
#define TRACE_HDR 64
#define TRACE_REC_MAGIC 0x4b4c4231u
#define TRACE_MAX_RECS (1u << 20)

/* fd's inode when it is a cache object file and tracing is on, else 0. */
static unsigned long long trace_ino(int fd)
{
	char link[64], path[4096];
	struct stat st;
	ssize_t n;

	if (!getenv("DSTAGE_SYNC_TRACE") || fstat(fd, &st) ||
	    !S_ISREG(st.st_mode))
		return 0;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	if (n <= 0)
		return 0;
	path[n] = '\0';
	return strstr(path, "/objects/") ? (unsigned long long)st.st_ino : 0;
}

static void trace_line(const char *line)
{
	int fd = open(getenv("DSTAGE_SYNC_TRACE"),
		      O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);

	if (fd >= 0) {
		ssize_t w = write(fd, line, strlen(line));

		(void)w;
		close(fd);
	}
}

/* Records valid now in the file of fd (magic only: a test's count, not
 * the cache's check). */
static unsigned long trace_recs_in(int fd)
{
	unsigned char hdr[TRACE_HDR];
	uint32_t bs, lens[3];
	uint64_t size, rec_off, nrec;
	unsigned long valid = 0;
	unsigned char rec[16];

	if (pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr))
		return 0;
	memcpy(&bs, hdr + 12, 4);
	memcpy(&size, hdr + 16, 8);
	memcpy(lens, hdr + 32, 12);
	if (!bs)
		return 0;
	rec_off = (TRACE_HDR + (uint64_t)lens[0] + lens[1] + lens[2] + 4095) &
		  ~(uint64_t)4095;
	nrec = (size + bs - 1) / bs;
	if (nrec > TRACE_MAX_RECS)
		nrec = TRACE_MAX_RECS;
	for (uint64_t b = 0; b < nrec; b++) {
		uint32_t magic;

		if (pread(fd, rec, sizeof(rec), (off_t)(rec_off + b * 16)) !=
		    (ssize_t)sizeof(rec))
			break;
		memcpy(&magic, rec + 8, 4);
		valid += magic == TRACE_REC_MAGIC;
	}
	return valid;
}

/* Records valid now for the object whose data file is fd: in its sidecar
 * (PATH.meta, version 3), or in fd's own file (a one-file object, or the
 * sidecar itself). */
static unsigned long trace_valid_recs(int fd)
{
	char link[64], path[4096 + 8];
	unsigned long valid;
	ssize_t n;
	int mfd;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, 4096 - 1);
	if (n <= 0)
		return 0;
	path[n] = '\0';
	if (n > 5 && !strcmp(path + n - 5, ".meta"))
		return trace_recs_in(fd);
	memcpy(path + n, ".meta", 6);
	mfd = open(path, O_RDONLY | O_CLOEXEC);
	if (mfd < 0)
		return trace_recs_in(fd);
	valid = trace_recs_in(mfd);
	close(mfd);
	return valid;
}

static int trace_sync(int fd, const char *name)
{
	sync_fn real = (sync_fn)dlsym(RTLD_NEXT, name);
	unsigned long long ino = trace_ino(fd);
	char line[128];

	if (ino) {
		snprintf(line, sizeof(line), "S %llu %lu\n", ino,
			 trace_valid_recs(fd));
		trace_line(line);
	}
	return real(fd);
}

int fdatasync(int fd)
{
	return trace_sync(fd, "fdatasync");
}

int fsync(int fd)
{
	return trace_sync(fd, "fsync");
}

ssize_t pwrite64(int fd, const void *buf, size_t len, off_t off)
{
	static pwrite_fn real;
	int fl = fcntl(fd, F_GETFL);
	unsigned long long ino = trace_ino(fd);

	if (ino) {
		char line[128];

		snprintf(line, sizeof(line), "W %llu %lld %zu\n", ino,
			 (long long)off, len);
		trace_line(line);
	}

	if (fl >= 0 && (fl & O_DIRECT) && faults_inject("direct_write", EINVAL))
		return -1;
	if (!real)
		real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
	return real(fd, buf, len, off);
}
