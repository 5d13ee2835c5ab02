/* SPDX-License-Identifier: MIT */
/*
 * sysfail.h: make one system call fail, for the failure paths the kernel
 * seldom takes (an O_NOATIME open refused, a file system without
 * fallocate, a record write that fails). sysfail() installs a seccomp
 * filter (no privilege needed: PR_SET_NO_NEW_PRIVS) under which system
 * call nr returns -1/err: always, when its argument arg has a bit of val
 * set, or when that argument equals val (the low 32 bits). A filter cannot
 * be taken off, so sysfail_child() runs the failing part in a forked child
 * whose check.h failures count in the parent. io_uring's operations are
 * not system calls: a filter on pwrite64 leaves them alone. Include after
 * check.h.
 */
#ifndef DSTAGE_TEST_SYSFAIL_H
#define DSTAGE_TEST_SYSFAIL_H

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum sysfail_when { SYSFAIL_ALWAYS, SYSFAIL_ARG_HAS, SYSFAIL_ARG_EQ };

/* The exit status of a child that could not install its filter. */
#define SYSFAIL_SKIP 77

/* 0, or -errno (-ENOSYS: no filter for this architecture). */
static inline int sysfail(long nr, int err, enum sysfail_when when, int arg,
			  uint32_t val)
{
#if defined(__x86_64__)
	const uint32_t arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
	const uint32_t arch = AUDIT_ARCH_AARCH64;
#else
	const uint32_t arch = 0;
#endif
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
			 offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
			 offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		/* [6]: the argument's low word (little-endian), or over the
		 * test to the failure */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
			 offsetof(struct seccomp_data, args) +
				 8 * (arg >= 0 && arg < 6 ? arg : 0)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, val, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K,
			 SECCOMP_RET_ERRNO |
				 ((uint32_t)err & SECCOMP_RET_DATA)),
	};
	struct sock_fprog prog = { sizeof(f) / sizeof(f[0]), f };

	if (!arch)
		return -ENOSYS;
	if (when == SYSFAIL_ALWAYS)
		f[6] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JA, 2, 0, 0);
	else if (when == SYSFAIL_ARG_HAS)
		f[7] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K,
						    val, 1, 0);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		return -errno;
	return 0;
}

/*
 * Run fn(arg) in a forked child (which calls sysfail itself, and exits
 * SYSFAIL_SKIP when it cannot); its failed checks fail the parent's.
 * Returns false when the child skipped (said on stderr).
 */
static inline bool sysfail_child(const char *what, void (*fn)(void *),
				 void *arg)
{
	int st = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		fn(arg);
		fflush(NULL);
		_exit(check_failures ? 1 : 0);
	}
	CHECK(pid > 0);
	if (pid <= 0)
		return false;
	CHECK_INT(waitpid(pid, &st, 0), pid);
	if (WIFEXITED(st) && WEXITSTATUS(st) == SYSFAIL_SKIP) {
		fprintf(stderr, "%s: skipped (no seccomp filter here)\n", what);
		return false;
	}
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	return true;
}

#endif
