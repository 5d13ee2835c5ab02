// SPDX-License-Identifier: MIT
/*
 * push_journal: records survive a reopen, the last record of a key wins,
 * tombstones forget a key, a line torn by a crash or not ours is ignored,
 * compaction keeps exactly the done and skipped files, and the modes are
 * 0600 (journal) and 0700 (its directory).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "push/push_i.h"

static void file_rec(struct push_file *f, char *key, uint64_t size,
		     enum push_state st, unsigned char fill)
{
	memset(f, 0, sizeof(*f));
	f->key = key;
	f->size = size;
	f->mtime_ns = 1700000000123456789LL;
	f->ino = 42;
	f->etag = "\"0123456789abcdef0123456789abcdef\"";
	f->state = st;
	memset(f->sha, fill, sizeof(f->sha));
}

static int open_j(struct push_journal *j, const char *dir)
{
	return push_journal_open(j, NULL, dir, "s3://bkt/ds/", "/data/ds");
}

int main(void)
{
	char dir[] = "/tmp/test_push_journal.XXXXXX", sub[256];
	struct push_journal j;
	struct push_file f[4];
	const struct push_jent *e;
	struct stat st;
	int fd;

	if (!mkdtemp(dir))
		return 77;
	CHECK_INT(open_j(&j, dir), 0);
	CHECK_INT(j.n, 0);
	CHECK_INT(stat(j.path, &st), 0);
	CHECK_INT(st.st_mode & 07777, 0600);
	snprintf(sub, sizeof(sub), "%s/push", dir);
	CHECK_INT(stat(sub, &st), 0);
	CHECK_INT(st.st_mode & 07777, 0700);

	file_rec(&f[0], "a/one.bin", 10, PF_DONE, 0x11);
	file_rec(&f[1], "b.bin", 20, PF_DONE, 0x22);
	file_rec(&f[2], "c.bin", 30, PF_DONE, 0x33);
	CHECK_INT(push_journal_put(&j, &f[0]), 0);
	CHECK_INT(push_journal_put(&j, &f[1]), 0);
	CHECK_INT(push_journal_put(&j, &f[2]), 0);
	f[2].size = 31; /* c again: the later record wins */
	CHECK_INT(push_journal_put(&j, &f[2]), 0);
	f[1].state = PF_CHANGED; /* b forgotten */
	CHECK_INT(push_journal_put(&j, &f[1]), 0);
	/* not ours, then a whole record torn by a crash (no newline) */
	fd = open(j.path, O_WRONLY | O_APPEND);
	CHECK(fd >= 0);
	{
		const char *junk = "2\tjunk\n1\tnothex\t1\t2\t3\t\"e\"\tx\n";
		char torn[256];

		snprintf(torn, sizeof(torn), "1\t%064d\t5\t6\t7\t\"e\"\tt.bin",
			 0);
		CHECK(write(fd, junk, strlen(junk)) == (ssize_t)strlen(junk));
		CHECK(write(fd, torn, strlen(torn)) == (ssize_t)strlen(torn));
	}
	close(fd);
	push_journal_release(&j);

	CHECK_INT(open_j(&j, dir), 0);
	CHECK_INT(j.n, 2);
	e = push_journal_find(&j, "a/one.bin");
	CHECK(e && e->size == 10 && e->ino == 42 &&
	      e->mtime_ns == 1700000000123456789LL && e->sha[0] == 0x11 &&
	      !strcmp(e->etag, f[0].etag));
	CHECK(push_journal_find(&j, "b.bin") == NULL);
	e = push_journal_find(&j, "c.bin");
	CHECK(e && e->size == 31);
	CHECK(push_journal_find(&j, "x") == NULL);
	CHECK(push_journal_find(&j, "t.bin") == NULL); /* torn */

	/* compaction: only the done and skipped files stay */
	file_rec(&f[3], "d.bin", 40, PF_SKIP, 0x44);
	f[0].state = PF_FAILED;
	CHECK_INT(push_journal_compact(&j, f, 4), 0);
	CHECK_INT(stat(j.path, &st), 0);
	CHECK_INT(st.st_mode & 07777, 0600);
	push_journal_release(&j);
	CHECK_INT(open_j(&j, dir), 0);
	CHECK_INT(j.n, 2);
	CHECK(push_journal_find(&j, "c.bin") != NULL);
	CHECK(push_journal_find(&j, "d.bin") != NULL);
	CHECK(push_journal_find(&j, "a/one.bin") == NULL);
	push_journal_release(&j);

	/* a looser mode is tightened at open */
	{
		char path[4096];

		snprintf(path, sizeof(path), "%s", j.path);
		CHECK_INT(chmod(path, 0644), 0);
		CHECK_INT(open_j(&j, dir), 0);
		CHECK_INT(stat(path, &st), 0);
		CHECK_INT(st.st_mode & 07777, 0600);
		unlink(path);
		push_journal_release(&j);
	}
	rmdir(sub);
	rmdir(dir);
	return check_result();
}
