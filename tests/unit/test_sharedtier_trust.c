// SPDX-License-Identifier: MIT
/* sharedtier_trusted_tree: a tree of the service uid's 0755 directories and
 * 0644 files passes; a group- or world-writable entry (-EACCES), a FIFO or a
 * symbolic link (-EINVAL) below it fails; a missing top directory is
 * -ENOENT. An entry that disappears while the tree is walked (a publisher
 * renaming its temporary files into place, as another node does while this
 * one waits for its MANIFEST) is skipped, not an error: the walk raced a
 * churning child for a bounded count and time and must never fail. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "dstage/timeutil.h"
#include "tier/sharedtier_i.h"

#define RACE_WALKS 4000
#define RACE_MS 8000

static char root[] = "/tmp/dstage-trust.XXXXXX";

static void put(const char *dir, const char *name, mode_t mode)
{
	char p[512];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0);
	if (fd >= 0) {
		CHECK(write(fd, "x", 1) == 1);
		CHECK(fchmod(fd, mode) == 0);
		close(fd);
	}
}

static void test_rules(const char *snap)
{
	char p[512];

	CHECK_INT(sharedtier_trusted_tree(root, snap), 0);

	snprintf(p, sizeof(p), "%s/data/a", snap);
	CHECK(chmod(p, 0664) == 0);
	CHECK_INT(sharedtier_trusted_tree(root, snap), -EACCES);
	CHECK(chmod(p, 0646) == 0);
	CHECK_INT(sharedtier_trusted_tree(root, snap), -EACCES);
	CHECK(chmod(p, 0644) == 0);

	snprintf(p, sizeof(p), "%s/data/fifo", snap);
	CHECK(mkfifo(p, 0644) == 0);
	CHECK_INT(sharedtier_trusted_tree(root, snap), -EINVAL);
	CHECK(unlink(p) == 0);

	snprintf(p, sizeof(p), "%s/data/link", snap);
	CHECK(symlink("/etc/passwd", p) == 0);
	CHECK_INT(sharedtier_trusted_tree(root, snap), -EINVAL);
	CHECK(unlink(p) == 0);

	/* a directory between the root and the snapshot counts too */
	CHECK(chmod(root, 0775) == 0);
	CHECK_INT(sharedtier_trusted_tree(root, snap), -EACCES);
	CHECK(chmod(root, 0755) == 0);

	snprintf(p, sizeof(p), "%s/none", root);
	CHECK_INT(sharedtier_trusted_tree(root, p), -ENOENT);
	CHECK_INT(sharedtier_trusted_tree(root, snap), 0);
}

/* sharedtier_trusted_copy: the walk's answer is used again for its
 * 2 s, unless root or the snapshot's directory changed, and names the rule
 * broken. */
static void test_memo(const char *snap)
{
	char p[512], why[PATH_MAX + 64];

	CHECK_INT(sharedtier_trusted_copy(root, snap, why, sizeof(why)), 0);
	CHECK_STR(why, "");
	/* deep below: not seen until the memo's time is up */
	snprintf(p, sizeof(p), "%s/data/a", snap);
	CHECK(chmod(p, 0664) == 0);
	CHECK_INT(sharedtier_trusted_copy(root, snap, why, sizeof(why)), 0);
	usleep(2100 * 1000);
	CHECK_INT(sharedtier_trusted_copy(root, snap, why, sizeof(why)),
		  -EACCES);
	CHECK(strstr(why, "/data/a is writable by group") != NULL);
	/* remembered failing, too */
	CHECK(chmod(p, 0644) == 0);
	CHECK_INT(sharedtier_trusted_copy(root, snap, why, sizeof(why)),
		  -EACCES);
	CHECK(strstr(why, "/data/a is writable by group") != NULL);
	/* a change to the snapshot's directory is seen at once */
	CHECK(chmod(snap, 0775) == 0);
	CHECK_INT(sharedtier_trusted_copy(root, snap, why, sizeof(why)),
		  -EACCES);
	CHECK(strstr(why, "snap1 is writable by group") != NULL);
	CHECK(chmod(snap, 0755) == 0);
	CHECK_INT(sharedtier_trusted_copy(root, snap, why, sizeof(why)), 0);
	/* and to the root */
	CHECK(chmod(root, 0757) == 0);
	CHECK_INT(sharedtier_trusted_copy(root, snap, why, sizeof(why)),
		  -EACCES);
	CHECK(strstr(why, "is writable by others") != NULL);
	CHECK(chmod(root, 0755) == 0);
	CHECK_INT(sharedtier_trusted_copy(root, snap, why, sizeof(why)), 0);
}

/* The child: temporary files renamed over their final names and leases
 * moved aside, as fast as it can, until killed. */
static void churn(const char *data)
{
	char tmp[512], fin[512];

	for (unsigned i = 0;; i++) {
		int fd;

		snprintf(tmp, sizeof(tmp), "%s/.f%u.tmp.%u", data, i % 8, i);
		snprintf(fin, sizeof(fin), "%s/f%u", data, i % 8);
		fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			_exit(1);
		close(fd);
		if (rename(tmp, fin))
			_exit(1);
		if (i % 3 == 0)
			unlink(fin);
	}
}

static void test_race(const char *snap)
{
	char data[320];
	int64_t end = timeutil_mono_ms() + RACE_MS;
	unsigned walks = 0, failed = 0;
	int first = 0, st;
	pid_t pid;

	snprintf(data, sizeof(data), "%s/data", snap);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		churn(data);
	while (walks < RACE_WALKS && timeutil_mono_ms() < end) {
		int ret = sharedtier_trusted_tree(root, snap);

		walks++;
		if (ret) {
			failed++;
			if (!first)
				first = ret;
		}
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	CHECK(WIFSIGNALED(st)); /* the child churned until killed */
	if (failed)
		fprintf(stderr, "%u of %u walks failed, the first: %s\n",
			failed, walks, strerror(-first));
	CHECK_INT(failed, 0u);
	CHECK(walks > 0);
}

int main(void)
{
	char snap[256], p[512];

	if (!mkdtemp(root))
		return 1;
	CHECK(chmod(root, 0755) == 0);
	snprintf(snap, sizeof(snap), "%s/ds", root);
	CHECK(mkdir(snap, 0755) == 0);
	snprintf(snap, sizeof(snap), "%s/ds/snap1", root);
	CHECK(mkdir(snap, 0755) == 0);
	snprintf(p, sizeof(p), "%s/data", snap);
	CHECK(mkdir(p, 0755) == 0);
	put(p, "a", 0644);
	put(p, "b", 0644);
	put(snap, "MANIFEST", 0644);

	test_rules(snap);
	test_memo(snap);
	test_race(snap);

	snprintf(p, sizeof(p), "rm -rf '%s'", root);
	CHECK(system(p) == 0);
	return check_result();
}
