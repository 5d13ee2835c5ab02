// SPDX-License-Identifier: MIT
/*
 * ckpt_file_writer_done: a deferred publish is paid by the last writable
 * handle released, whichever order the releases come in. The order that
 * lost it: a writer closes (its publish deferred: its process still holds
 * the file) while another writable handle, closed before, has not been
 * released yet; the deferring handle's release saw two writers and left
 * the publish to the other, whose close had already published the old
 * bytes. The file was then abandoned (test_ckpt_crash.py's
 * test_writer_beside_a_reader_publishes_at_release, once in a CI run).
 * A file:// store in a temporary directory; exits 0, 1 or 77.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "dstage/ckpt.h"
#include "dstage/config.h"
#include "dstage/log.h"

/* The store's copy of key, read into buf (len bytes at most): its length,
 * or -1 when there is none. */
static ssize_t stored(const char *top, const char *key, char *buf, size_t len)
{
	char p[512];
	ssize_t n;
	int fd;

	snprintf(p, sizeof(p), "%s/store/%s", top, key);
	fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, len);
	close(fd);
	return n;
}

static void rm_rf(const char *path)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	if (system(cmd))
		fprintf(stderr, "test_ckpt_writers: %s left behind\n", path);
}

static struct ckpt_file *open_w(struct ckpt *ck, const char *key, int flags)
{
	struct ckpt_file *f = NULL;
	bool created;
	int ret = ckpt_file_open(ck, key, O_WRONLY | flags, &f, &created);

	CHECK_INT(ret, 0);
	return ret ? NULL : f;
}

static void put(struct ckpt_file *f, const char *s)
{
	CHECK_INT(ckpt_file_pwrite(f, s, strlen(s), 0), (ssize_t)strlen(s));
}

int main(void)
{
	char top[] = "/tmp/test_ckpt_writers.XXXXXX", url[128], dir[96];
	char buf[64], err[256];
	struct dstage_config *cfg = NULL;
	struct ckpt_file *w0, *w, *r = NULL;
	struct ckpt *ck = NULL;
	bool created;

	log_set_level(LOG_LVL_ERROR);
	if (!mkdtemp(top))
		return 77;
	snprintf(dir, sizeof(dir), "%s/store", top);
	if (mkdir(dir, 0700))
		return 77;
	snprintf(url, sizeof(url), "file://%s/", dir);
	snprintf(dir, sizeof(dir), "%s/staging", top);
	if (config_defaults(&cfg) ||
	    config_set(cfg, "checkpoints.store", url, err, sizeof(err)) ||
	    config_set(cfg, "checkpoints.staging_dir", dir, err, sizeof(err)) ||
	    ckpt_open(cfg, &ck)) {
		fprintf(stderr, "test_ckpt_writers: no checkpoints (%s)\n",
			err);
		return 77;
	}

	/* The order that lost the publish: w0 closed (its own publish at
	 * its close), not yet released; w's close deferred; w released
	 * first, then w0. */
	w0 = open_w(ck, "a.pt", O_CREAT);
	put(w0, "old");
	CHECK_INT(ckpt_file_sync(w0), 0); /* w0's close publishes */
	CHECK_INT(stored(top, "a.pt", buf, sizeof(buf)), 3);
	w = open_w(ck, "a.pt", O_TRUNC);
	put(w, "new bytes");
	CHECK_INT(ckpt_file_writers(w), 2);
	CHECK(!ckpt_file_writer_done(w, true)); /* w0 still counts */
	CHECK_INT(ckpt_file_writers(w0), 1);
	ckpt_file_close(w);
	CHECK(ckpt_file_writer_done(w0, false)); /* the last pays */
	CHECK_INT(ckpt_file_sync(w0), 0);
	ckpt_file_close(w0);
	memset(buf, 0, sizeof(buf));
	CHECK_INT(stored(top, "a.pt", buf, sizeof(buf)), 9);
	CHECK_STR(buf, "new bytes");

	/* Owed, then paid by a publish before the last release: nothing is
	 * owed any more (a second rank's close published it). */
	w0 = open_w(ck, "b.pt", O_CREAT);
	w = open_w(ck, "b.pt", 0);
	put(w, "rank two");
	CHECK(!ckpt_file_writer_done(w, true));
	ckpt_file_close(w);
	put(w0, "rank one");
	CHECK_INT(ckpt_file_sync(w0), 0);
	CHECK(!ckpt_file_writer_done(w0, false));
	CHECK(!ckpt_file_writer_done(w0, true)); /* a second call: nothing */
	ckpt_file_close(w0);

	/* Nothing owed: the last release publishes nothing; a reader's
	 * handle is never a writer. */
	w = open_w(ck, "c.pt", O_CREAT);
	CHECK_INT(ckpt_file_open(ck, "c.pt", O_RDONLY, &r, &created), 0);
	CHECK_INT(ckpt_file_writers(w), 1);
	CHECK(r && !ckpt_file_writer_done(r, true));
	CHECK_INT(ckpt_file_writers(w), 1);
	CHECK(!ckpt_file_writer_done(w, false));
	CHECK_INT(ckpt_file_writers(w), 0);
	ckpt_file_close(r);
	ckpt_file_close(w);

	ckpt_free(ck);
	config_free(cfg);
	rm_rf(top);
	return check_result();
}
