// SPDX-License-Identifier: MIT
/* sharedtier_health: the node's tier status file (<cache.dir>/tier-health)
 * counts what it is told, and one that cannot be kept fails nothing but
 * itself: a write that fails (a full disk) leaves the rows there as they
 * were; a path that is a directory, a cache.dir that is not there or not
 * set: each call returns its -errno (a change logged, naming the file),
 * none crashes. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "sysfail.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/sharedtier.h"

static struct dstage_config *cfg;

/* What f(cfg) logs, into buf (stderr caught in a file meanwhile). */
static int logged(int (*f)(void), char *buf, size_t size)
{
	char name[] = "/tmp/test_sharedtier_health.log.XXXXXX";
	int fd = mkstemp(name), saved = dup(2), ret;
	ssize_t n;

	buf[0] = '\0';
	if (fd < 0 || saved < 0)
		return -EIO;
	unlink(name);
	fflush(stderr);
	dup2(fd, 2);
	ret = f();
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	n = pread(fd, buf, size - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	close(fd);
	return ret;
}

static int note_mismatch(void)
{
	return sharedtier_health_note(cfg, "ds", SHAREDTIER_MISMATCH,
				      "/t/ds/data/a differs");
}

/* In a child: every write of the file fails (ENOSPC): the note fails, and
 * the rows there stay. */
static void full_disk(void *arg)
{
	struct sharedtier_health h[SHAREDTIER_CAUSES];

	(void)arg;
	/* write too: stdio's (this child's own messages are lost; its
	 * failures still count) */
	if (sysfail(SYS_pwrite64, ENOSPC, SYSFAIL_ALWAYS, 0, 0) ||
	    sysfail(SYS_write, ENOSPC, SYSFAIL_ALWAYS, 0, 0))
		_exit(SYSFAIL_SKIP);
	CHECK_INT(note_mismatch(), -ENOSPC);
	CHECK_INT(sharedtier_health_get(cfg, "ds", h), 1);
	CHECK_INT(h[SHAREDTIER_UNTRUSTED].count, 2);
	CHECK_INT(h[SHAREDTIER_MISMATCH].count, 0);
}

int main(void)
{
	char top[] = "/tmp/test_sharedtier_health.XXXXXX";
	char path[PATH_MAX], aside[PATH_MAX + 8], msg[4096];
	struct sharedtier_health h[SHAREDTIER_CAUSES];
	char *orig;

	if (!mkdtemp(top))
		return 77;
	if (config_defaults(&cfg))
		return 1;
	log_set_level(LOG_LVL_WARN);
	orig = cfg->cache_dir;
	cfg->cache_dir = top;
	snprintf(path, sizeof(path), "%s/" SHAREDTIER_HEALTH_FILE, top);
	snprintf(aside, sizeof(aside), "%s.aside", path);

	/* counted, read back, forgotten */
	CHECK_INT(sharedtier_health_get(cfg, "ds", h), -ENOENT);
	CHECK_INT(sharedtier_health_note(cfg, "ds", SHAREDTIER_UNTRUSTED,
					 "/t/ds is writable by group"),
		  0);
	CHECK_INT(sharedtier_health_note(cfg, "ds", SHAREDTIER_UNTRUSTED,
					 "/t/ds is writable by group"),
		  0);
	CHECK_INT(
		sharedtier_health_note(cfg, "other", SHAREDTIER_MISMATCH, "x"),
		0);
	CHECK_INT(sharedtier_health_get(cfg, "ds", h), 1);
	CHECK_INT(h[SHAREDTIER_UNTRUSTED].count, 2);
	CHECK_STR(h[SHAREDTIER_UNTRUSTED].what, "/t/ds is writable by group");
	CHECK_INT(sharedtier_health_clear(cfg, "other",
					  1u << SHAREDTIER_MISMATCH),
		  0);
	CHECK_INT(sharedtier_health_get(cfg, "other", h), 0);

	/* a full disk: the note fails, the rows stay (they were cut to
	 * nothing before the new text went in) */
	sysfail_child("a full disk", full_disk, NULL);
	CHECK_INT(sharedtier_health_get(cfg, "ds", h), 1);
	CHECK_INT(h[SHAREDTIER_UNTRUSTED].count, 2);

	/* the path a directory: each call says so, the change in the log */
	CHECK_INT(rename(path, aside), 0);
	CHECK_INT(mkdir(path, 0700), 0);
	CHECK_INT(logged(note_mismatch, msg, sizeof(msg)), -EISDIR);
	CHECK(strstr(msg, path) != NULL);
	CHECK(strstr(msg, strerror(EISDIR)) != NULL);
	CHECK(strstr(msg, "not counted there") != NULL);
	CHECK_INT(sharedtier_health_get(cfg, "ds", h), -EISDIR);
	CHECK_INT(h[SHAREDTIER_UNTRUSTED].count, 0);
	CHECK_INT(sharedtier_health_clear(cfg, "ds", ~0u), -EISDIR);
	CHECK_INT(rmdir(path), 0);
	CHECK_INT(rename(aside, path), 0);
	CHECK_INT(sharedtier_health_get(cfg, "ds", h), 1);

	/* no cache.dir there, none set */
	cfg->cache_dir = "/nonexistent/dstage-test";
	CHECK_INT(note_mismatch(), -ENOENT);
	CHECK_INT(sharedtier_health_get(cfg, "ds", h), -ENOENT);
	cfg->cache_dir = NULL;
	CHECK_INT(note_mismatch(), -ENOENT);
	CHECK_INT(sharedtier_health_clear(cfg, "ds", ~0u), 0);

	cfg->cache_dir = orig;
	config_free(cfg);
	unlink(path);
	rmdir(top);
	return check_result();
}
