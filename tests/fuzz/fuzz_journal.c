// SPDX-License-Identifier: MIT
/*
 * fuzz_journal: the checkpoint journal's record reader (ckpt_journal_read in
 * lib/ckpt/ckpt_journal.c) on any file content. The input is written as the
 * record journal/1 of a staging directory under /dev/shm.
 *
 * Checks: a record that reads has state W, P or C and NUL-terminated fields
 * within their arrays; written back with ckpt_journal_write (escaped) it
 * reads back as the same record, its upload lines included; one that does
 * not read leaves state 0 and -EINVAL.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_stage.h"
#include "dstage/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ckpt_base.c's only outside call. */
const char *objstore_url(const struct objstore *os)
{
	(void)os;
	return "file:///fuzz/";
}

static struct ckpt_dirs d;
static char dir[64];

static void cleanup(void)
{
	char p[128];

	snprintf(p, sizeof(p), "%s/%s/1", dir, CKPT_JOURNAL);
	unlink(p);
	snprintf(p, sizeof(p), "%s/%s", dir, CKPT_JOURNAL);
	rmdir(p);
	rmdir(dir);
}

static void setup(void)
{
	char jdir[96];

	log_set_level(LOG_LVL_ERROR);
	snprintf(dir, sizeof(dir), "/dev/shm/fuzz_journal.%d", (int)getpid());
	snprintf(jdir, sizeof(jdir), "%s/%s", dir, CKPT_JOURNAL);
	mkdir(dir, 0700);
	mkdir(jdir, 0700);
	d.staging = dir;
	d.journal_fd = open(jdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (d.journal_fd < 0)
		abort();
	atexit(cleanup);
}

static void check_fields(const struct ckpt_rec *r)
{
	if (!memchr(r->sha, '\0', sizeof(r->sha)) ||
	    !memchr(r->etag, '\0', sizeof(r->etag)) ||
	    !memchr(r->key, '\0', sizeof(r->key)) || !r->state ||
	    !strchr("WPC", r->state))
		abort();
	/* The key may hold any byte but NUL (escaped records, issue 34);
	 * the fields of the first line never a space. */
	if (strchr(r->sha, ' ') || strchr(r->etag, ' ') ||
	    !memchr(r->upload_id, '\0', sizeof(r->upload_id)) ||
	    !memchr(r->upload_key, '\0', sizeof(r->upload_key)))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct ckpt_rec r, back;
	int fd, ret;

	if (d.journal_fd <= 0)
		setup();
	fd = openat(d.journal_fd, "1", O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, data, size) != (ssize_t)size)
		abort();
	close(fd);

	ret = ckpt_journal_read(&d, 1, &r);
	if (ret) {
		if (ret != -EINVAL || r.state)
			abort();
		return 0;
	}
	check_fields(&r);
	if (ckpt_journal_write(&d, 1, &r, false) ||
	    ckpt_journal_read(&d, 1, &back))
		abort();
	if (back.state != r.state || back.size != r.size ||
	    strcmp(back.sha, r.sha) || strcmp(back.etag, r.etag) ||
	    strcmp(back.key, r.key) || strcmp(back.upload_id, r.upload_id) ||
	    strcmp(back.upload_key, r.upload_key))
		abort(); /* a record does not survive its own write */
	return 0;
}
