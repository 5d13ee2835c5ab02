// SPDX-License-Identifier: MIT
/*
 * ratelimit_shm: the node's bucket in <dir>/ratelimit, shared by processes.
 * Two forked processes drawing on one logical clock (an injected, shared
 * counter: no real time) get the combined rate, not twice it; a process
 * killed -9 while it holds the file's lock half way through an update
 * wedges no one and leaves the last whole state; a bad file (header, mode,
 * values) is refused or bounded.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "objstore/ratelimit_shm_i.h"

static char dir[] = "/tmp/dstage-rlshm-XXXXXX";
static char path[sizeof(dir) + 16];

/* The test's clock: a counter in memory shared with the children. */
static uint64_t *clk;
#define T0 100000u
#define SPAN 20000u /* logical ms per run */

/* Draw from the node's bucket until the shared clock passes T0 + SPAN;
 * each attempt moves the clock on 1 ms. Returns the grants. */
static unsigned draw(void)
{
	struct ratelimit_shm rs = RATELIMIT_SHM_INITIALIZER;
	unsigned n = 0;
	uint64_t t;

	if (ratelimit_shm_configure(&rs, dir, 10, 0))
		return 0;
	while ((t = __atomic_fetch_add(clk, 1, __ATOMIC_SEQ_CST)) < T0 + SPAN)
		if (!ratelimit_shm_acquire(&rs, t, 0))
			n++;
	ratelimit_shm_release(&rs);
	return n;
}

static void test_two_processes(void)
{
	int fds[2][2];
	pid_t pid[2];
	unsigned got[2] = { 0, 0 };

	*clk = T0;
	for (int i = 0; i < 2; i++) {
		CHECK_INT(pipe(fds[i]), 0);
		pid[i] = fork();
		if (pid[i] == 0) {
			unsigned n = draw();

			_exit(write(fds[i][1], &n, sizeof(n)) == sizeof(n) ? 0
									   : 1);
		}
		close(fds[i][1]);
	}
	for (int i = 0; i < 2; i++) {
		int st;

		CHECK(read(fds[i][0], &got[i], sizeof(got[i])) ==
		      sizeof(got[i]));
		close(fds[i][0]);
		CHECK(waitpid(pid[i], &st, 0) == pid[i] && WIFEXITED(st) &&
		      WEXITSTATUS(st) == 0);
	}
	/* 10/s over 20 s plus one burst of 10, shared: not 2 x 210 */
	fprintf(stderr, "two processes: %u + %u grants\n", got[0], got[1]);
	CHECK(got[0] + got[1] >= 205 && got[0] + got[1] <= 212);
}

static void test_killed_holder(void)
{
	struct ratelimit_shm rs = RATELIMIT_SHM_INITIALIZER;
	int fds[2], st;
	char c;
	pid_t pid;

	CHECK_INT(ratelimit_shm_configure(&rs, dir, 10, 0), 0);
	/* hold the bucket at a known state: empty, at t = 500000 */
	for (int i = 0; i < 20; i++)
		ratelimit_shm_acquire(&rs, 500000, 0);
	CHECK_INT(pipe(fds), 0);
	pid = fork();
	if (pid == 0) {
		struct ratelimit_shm cs = RATELIMIT_SHM_INITIALIZER;
		struct ratelimit_shm_file *f;
		uint64_t gen;

		if (ratelimit_shm_configure(&cs, dir, 10, 0) ||
		    ratelimit_shm_lock_file(&cs))
			_exit(1);
		/* half an update: the next slot scribbled, gen not stored */
		f = cs.map;
		gen = __atomic_load_n(&f->gen, __ATOMIC_ACQUIRE);
		memset(&f->slot[(gen + 1) & 1], 0x7f, sizeof(f->slot[0]));
		f->slot[(gen + 1) & 1].hold_until_ms = 500000 + 50000;
		if (write(fds[1], "x", 1) != 1)
			_exit(1);
		for (int i = 0; i < 600; i++)
			sleep(1); /* killed here */
		_exit(1);
	}
	close(fds[1]);
	CHECK(read(fds[0], &c, 1) == 1);
	close(fds[0]);
	kill(pid, SIGKILL);
	CHECK(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st));
	/* a wedged lock would block here: the alarm fails the test */
	alarm(20);
	/* the last whole state: empty at 500000, so 100 ms for one */
	CHECK_INT(ratelimit_shm_acquire(&rs, 500000, 0), 100);
	CHECK_INT(ratelimit_shm_acquire(&rs, 500100, 0), 0);
	alarm(0);
	ratelimit_shm_release(&rs);
}

static void test_bad_values(void)
{
	struct ratelimit_shm rs = RATELIMIT_SHM_INITIALIZER;
	struct ratelimit_shm_file *f;
	uint64_t gen, w;
	unsigned n = 0;

	CHECK_INT(ratelimit_shm_configure(&rs, dir, 10, 1000), 0);
	f = rs.map;
	gen = __atomic_load_n(&f->gen, __ATOMIC_ACQUIRE);
	/* another process wrote nonsense into the state in force */
	f->slot[gen & 1].req_tokens = 1e300;
	f->slot[gen & 1].req_rate = -5;
	f->slot[gen & 1].byte_tokens = 0.0 / 0.0;
	f->slot[gen & 1].hold_until_ms = UINT64_MAX;
	f->slot[gen & 1].last_ms = 1;
	/* a hold no longer than the longest Retry-After */
	w = ratelimit_shm_acquire(&rs, 600000, 0);
	CHECK(w > 0 && w <= RATELIMIT_HOLD_MAX_MS);
	/* tokens no more than one second's worth */
	for (int i = 0; i < 1000; i++)
		if (!ratelimit_shm_acquire(&rs, 600000 + RATELIMIT_HOLD_MAX_MS,
					   0))
			n++;
	CHECK(n <= 10);
	ratelimit_shm_release(&rs);
}

/* A file whose times are another boot's clock starts afresh. */
static void test_other_boot(void)
{
	struct ratelimit_shm rs = RATELIMIT_SHM_INITIALIZER;
	struct ratelimit_shm_file *f;
	uint64_t gen;

	CHECK_INT(ratelimit_shm_configure(&rs, dir, 10, 0), 0);
	f = rs.map;
	gen = __atomic_load_n(&f->gen, __ATOMIC_ACQUIRE);
	/* held for 50 s from 700000, and empty */
	f->slot[gen & 1].hold_until_ms = 750000;
	f->slot[gen & 1].req_tokens = 0;
	f->slot[gen & 1].last_ms = 700000;
	CHECK(ratelimit_shm_acquire(&rs, 700000, 0) > 0);
	f->boot_id[0] ^= 1;
	ratelimit_shm_release(&rs);
	/* a process of this boot opens it: the state is started afresh */
	CHECK_INT(ratelimit_shm_configure(&rs, dir, 10, 0), 0);
	CHECK_INT(ratelimit_shm_acquire(&rs, 700000, 0), 0);
	ratelimit_shm_release(&rs);
}

static void test_bad_file(void)
{
	struct ratelimit_shm rs = RATELIMIT_SHM_INITIALIZER;
	struct ratelimit_shm_file *f;
	int fd;

	/* a loose mode: refused, the process keeps its own bucket */
	CHECK_INT(chmod(path, 0644), 0);
	CHECK_INT(ratelimit_shm_configure(&rs, dir, 10, 0), -EACCES);
	CHECK(!ratelimit_shm_shared(&rs));
	CHECK_INT(ratelimit_shm_acquire(&rs, 1000, 0), 0);
	ratelimit_shm_release(&rs);
	CHECK_INT(chmod(path, 0600), 0);
	/* a wrong magic */
	fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(f != MAP_FAILED);
	f->magic ^= 1;
	CHECK_INT(ratelimit_shm_configure(&rs, dir, 10, 0), -EINVAL);
	ratelimit_shm_release(&rs);
	f->magic ^= 1;
	f->version = 99;
	CHECK_INT(ratelimit_shm_configure(&rs, dir, 10, 0), -EINVAL);
	ratelimit_shm_release(&rs);
	f->version = RATELIMIT_SHM_VERSION;
	munmap(f, sizeof(*f));
	/* a wrong size */
	CHECK_INT(ftruncate(fd, 100), 0);
	CHECK_INT(ratelimit_shm_configure(&rs, dir, 10, 0), -EINVAL);
	ratelimit_shm_release(&rs);
	close(fd);
	/* no cache.dir: its own bucket */
	CHECK_INT(ratelimit_shm_configure(&rs, "/nonexistent/dstage", 10, 0),
		  -ENOENT);
	ratelimit_shm_release(&rs);
	unlink(path);
}

/*
 * A cache.dir its owner cannot write (a read-only file system, or mode
 * 0555 as here): no file is made, the process keeps its own bucket and
 * its limit still holds. Run as a second uid, since root writes anyway.
 */
static void test_read_only_dir(void)
{
	char ro[sizeof(dir) + 8];
	int status = -1;
	pid_t pid;

	if (geteuid() != 0)
		return; /* needs a second uid */
	snprintf(ro, sizeof(ro), "%s/ro", dir);
	CHECK_INT(mkdir(ro, 0555), 0);
	CHECK_INT(chown(ro, 65534, 65534), 0);
	pid = fork();
	if (pid == 0) {
		struct ratelimit_shm rs = RATELIMIT_SHM_INITIALIZER;
		int bad = 0;

		if (setgid(65534) || setuid(65534))
			_exit(3);
		bad |= ratelimit_shm_configure(&rs, ro, 1, 0) != -EACCES;
		bad |= ratelimit_shm_shared(&rs);
		/* the burst of 1, then the limit: refused in the same ms */
		bad |= ratelimit_shm_acquire(&rs, 5000, 0) != 0;
		bad |= ratelimit_shm_acquire(&rs, 5000, 0) == 0;
		ratelimit_shm_release(&rs);
		_exit(bad ? 1 : 0);
	}
	CHECK(pid > 0);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(access(ro, F_OK) == 0);
	{
		char f[sizeof(ro) + 16];
		snprintf(f, sizeof(f), "%s/%s", ro, RATELIMIT_SHM_FILE);
		CHECK(access(f, F_OK) != 0);
	}
	rmdir(ro);
}

int main(void)
{
	struct stat st;

	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/%s", dir, RATELIMIT_SHM_FILE);
	clk = mmap(NULL, sizeof(*clk), PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (clk == MAP_FAILED)
		return 1;
	test_two_processes();
	CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
	test_killed_holder();
	test_bad_values();
	test_other_boot();
	test_bad_file();
	test_read_only_dir();
	rmdir(dir);
	return check_result();
}
