// SPDX-License-Identifier: MIT
/* ckpt_stage.h's journal walk helpers: which entry names are records, and
 * which records still name their live local copy. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ckpt/ckpt_stage.h"
#include "dstage/log.h"

static int subdir(const char *top, const char *name)
{
	char p[256];

	snprintf(p, sizeof(p), "%s/%s", top, name);
	if (mkdir(p, 0700))
		return -1;
	return open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

int main(void)
{
	char top[] = "/tmp/test_ckpt_journal.XXXXXX";
	struct ckpt_dirs d = { .abandoned_fd = -1, .owners_fd = -1 };
	struct ckpt_rec rec = { .state = 'P', .size = 3 };
	struct stat st;
	ino_t ino;
	int fd;

	log_set_level(LOG_LVL_ERROR);
	if (!mkdtemp(top))
		return 77;
	d.staging = strdup(top);
	d.tree_fd = subdir(top, CKPT_TREE);
	d.journal_fd = subdir(top, CKPT_JOURNAL);
	CHECK(d.tree_fd >= 0 && d.journal_fd >= 0);

	/* names */
	CHECK_INT(ckpt_journal_name("12345", &ino), 0);
	CHECK_INT(ino, 12345);
	CHECK_INT(ckpt_journal_name(".", &ino), -EINVAL);
	CHECK_INT(ckpt_journal_name(".12.tmp", &ino), -EINVAL);
	CHECK_INT(ckpt_journal_name("12x", &ino), -EINVAL);
	CHECK_INT(ckpt_journal_name("-1", &ino), -EINVAL);
	CHECK_INT(ckpt_journal_name("", &ino), -EINVAL);
	CHECK_INT(ckpt_journal_name("99999999999999999999999", &ino), -EINVAL);

	/* a record and its local copy */
	fd = openat(d.tree_fd, "f", O_WRONLY | O_CREAT | O_EXCL, 0600);
	CHECK(fd >= 0 && write(fd, "abc", 3) == 3);
	CHECK(fstat(fd, &st) == 0);
	close(fd);
	ino = st.st_ino;
	snprintf(rec.key, sizeof(rec.key), "f");
	CHECK_INT(ckpt_journal_write(&d, ino, &rec, false), 0);
	memset(&rec, 0, sizeof(rec));
	CHECK_INT(ckpt_journal_live(&d, ino, &rec, &st), 0);
	CHECK_STR(rec.key, "f");
	CHECK(rec.state == 'P' && st.st_ino == ino && st.st_size == 3);

	/* the copy replaced by another file (the old one held open, so its
	 * inode number is not reused): the record is stale */
	int old = openat(d.tree_fd, "f", O_RDONLY);
	CHECK(old >= 0);
	fd = openat(d.tree_fd, "g", O_WRONLY | O_CREAT | O_EXCL, 0600);
	CHECK(fd >= 0);
	close(fd);
	CHECK(renameat(d.tree_fd, "g", d.tree_fd, "f") == 0);
	CHECK_INT(ckpt_journal_live(&d, ino, &rec, &st), -ENOENT);
	close(old);
	/* ... replaced by a directory, or gone */
	CHECK(unlinkat(d.tree_fd, "f", 0) == 0);
	CHECK(mkdirat(d.tree_fd, "f", 0700) == 0);
	CHECK_INT(ckpt_journal_live(&d, ino, &rec, &st), -ENOENT);
	CHECK(unlinkat(d.tree_fd, "f", AT_REMOVEDIR) == 0);
	CHECK_INT(ckpt_journal_live(&d, ino, &rec, &st), -ENOENT);
	/* no record at all */
	CHECK_INT(ckpt_journal_live(&d, ino + 1, &rec, &st), -ENOENT);
	/* a record whose key is not valid */
	snprintf(rec.key, sizeof(rec.key), "../x");
	CHECK_INT(ckpt_journal_write(&d, ino, &rec, false), 0);
	CHECK_INT(ckpt_journal_live(&d, ino, &rec, &st), -ENOENT);

	ckpt_journal_remove(&d, ino);
	ckpt_dirs_close(&d);
	CHECK(d.tree_fd == -1 && d.journal_fd == -1 && d.abandoned_fd == -1 &&
	      !d.staging);
	ckpt_dirs_close(&d); /* closed twice: nothing */
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
		CHECK(system(cmd) == 0);
	}
	return check_result();
}
