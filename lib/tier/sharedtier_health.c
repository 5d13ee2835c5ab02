// SPDX-License-Identifier: MIT
/*
 * sharedtier_health: why this node did not use a dataset's shared tier
 * (include/dstage/sharedtier.h, sharedtier_health_*; docs/security.md,
 * "The shared tier"), counted per dataset and cause in one small file
 * every process of the node's cache shares: <cache.dir>/tier-health
 * (0600, like the cache's own files), so that the daemon's status shows
 * what dstagefs saw as well as its own stage and verify jobs.
 *
 * One line a dataset and cause, "NAME\tCAUSE\tCOUNT\tFIRST\tLAST\tWHAT":
 * the times are seconds since the epoch, WHAT the last message (control
 * bytes written as '?'). Each change reads and rewrites the file in place
 * under an OFD write lock on it; readers take a read lock. No state in
 * memory: the file and its lock are the only shared state. At most
 * SHAREDTIER_HEALTH_ROWS lines are kept (the least recent dropped).
 *
 * The file is the status's, never the reader's: a file that cannot be
 * kept (the path a directory, not writable, a full disk) fails no read of
 * the tier. A change that cannot be written is logged (note, clear) and
 * leaves the rows there as they were (the new text is written whole over
 * the old, then cut to its length); a look that cannot read the file
 * returns its -errno unlogged, for the status to say (the daemon's
 * tier_health_error), not once per dataset in the log.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/sharedtier.h"

#define SHAREDTIER_HEALTH_ROWS 256
#define SHAREDTIER_HEALTH_MAX (256u << 10) /* bytes read at most */

struct sharedtier_health_row {
	char name[256];
	int cause;
	struct sharedtier_health h;
};

struct sharedtier_health_file {
	int fd;
	struct sharedtier_health_row *v; /* SHAREDTIER_HEALTH_ROWS + 1 */
	size_t n;
	char path[PATH_MAX]; /* for messages */
};

static const char *const sharedtier_health_names[SHAREDTIER_CAUSES] = {
	[SHAREDTIER_UNTRUSTED] = "untrusted",
	[SHAREDTIER_NOT_REGULAR] = "not_regular",
	[SHAREDTIER_MISMATCH] = "mismatch",
	[SHAREDTIER_UNREADABLE] = "unreadable",
};

const char *sharedtier_cause_name(int cause)
{
	return cause >= 0 && cause < SHAREDTIER_CAUSES
		       ? sharedtier_health_names[cause]
		       : "?";
}

static int sharedtier_health_cause(const char *s)
{
	for (int i = 0; i < SHAREDTIER_CAUSES; i++)
		if (!strcmp(s, sharedtier_health_names[i]))
			return i;
	return -1;
}

/* One line into r: 0, or -EINVAL (not one of ours: skipped). */
static int sharedtier_health_parse(char *line, struct sharedtier_health_row *r)
{
	char *f[6], *save = NULL;
	int i = 0;

	for (char *p = strtok_r(line, "\t", &save); p && i < 6;
	     p = i < 6 ? strtok_r(NULL, "\t", &save) : NULL)
		f[i++] = p;
	if (i < 5 || strlen(f[0]) >= sizeof(r->name))
		return -EINVAL;
	memset(r, 0, sizeof(*r));
	snprintf(r->name, sizeof(r->name), "%s", f[0]);
	r->cause = sharedtier_health_cause(f[1]);
	r->h.count = strtoull(f[2], NULL, 10);
	r->h.first = strtoll(f[3], NULL, 10);
	r->h.last = strtoll(f[4], NULL, 10);
	if (i == 6)
		snprintf(r->h.what, sizeof(r->h.what), "%s", f[5]);
	return r->cause < 0 ? -EINVAL : 0;
}

/* Open and lock cfg's file (write: create it), and read its rows: 0 or
 * -errno (unlogged: the caller says what it could not do). */
static int sharedtier_health_open(const struct dstage_config *cfg, bool write,
				  struct sharedtier_health_file *hf)
{
	struct flock fl = { .l_type = write ? F_WRLCK : F_RDLCK,
			    .l_whence = SEEK_SET };
	char *buf = NULL, *line, *save = NULL;
	ssize_t got;
	int ret = 0;

	memset(hf, 0, sizeof(*hf));
	hf->fd = -1;
	if (!cfg->cache_dir)
		return -ENOENT;
	if (snprintf(hf->path, sizeof(hf->path), "%s/" SHAREDTIER_HEALTH_FILE,
		     cfg->cache_dir) >= (int)sizeof(hf->path))
		return -ENAMETOOLONG;
	hf->fd = open(hf->path,
		      (write ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC |
			      O_NOFOLLOW | O_NONBLOCK,
		      0600);
	if (hf->fd < 0)
		return -errno;
	buf = malloc(SHAREDTIER_HEALTH_MAX + 1);
	hf->v = calloc(SHAREDTIER_HEALTH_ROWS + 1, sizeof(*hf->v));
	if (!buf || !hf->v) {
		ret = -ENOMEM;
		goto out;
	}
	if (fcntl(hf->fd, F_OFD_SETLKW, &fl)) {
		ret = -errno;
		goto out;
	}
	got = pread(hf->fd, buf, SHAREDTIER_HEALTH_MAX, 0);
	if (got < 0) {
		ret = -errno; /* EINVAL, EISDIR: not a regular file */
		goto out;
	}
	buf[got] = '\0';
	for (line = strtok_r(buf, "\n", &save);
	     line && hf->n < SHAREDTIER_HEALTH_ROWS;
	     line = strtok_r(NULL, "\n", &save))
		if (!sharedtier_health_parse(line, &hf->v[hf->n]))
			hf->n++;
out:
	free(buf);
	return ret;
}

static void sharedtier_health_close(struct sharedtier_health_file *hf)
{
	if (hf->fd >= 0)
		close(hf->fd); /* and its lock */
	free(hf->v);
}

/* Rewrite the file from hf's rows (still locked): the new text over the
 * old, then cut to its length, so that a write that fails (a full disk)
 * leaves the rows that were there. */
static int sharedtier_health_write(struct sharedtier_health_file *hf)
{
	/* a row: its name, cause, three numbers, what and separators */
	size_t size =
		hf->n * (sizeof(hf->v[0].name) + sizeof(hf->v[0].h.what) + 96) +
		1;
	char *buf = malloc(size);
	size_t len = 0;
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < hf->n; i++) {
		const struct sharedtier_health_row *r = &hf->v[i];

		len += (size_t)snprintf(
			buf + len, size - len,
			"%s\t%s\t%" PRIu64 "\t%" PRId64 "\t%" PRId64 "\t%s\n",
			r->name, sharedtier_cause_name(r->cause), r->h.count,
			r->h.first, r->h.last, r->h.what);
		if (len >= size) {
			ret = -EOVERFLOW; /* cannot be: size bounds a row */
			goto out;
		}
	}
	for (size_t off = 0; off < len;) {
		ssize_t w = pwrite(hf->fd, buf + off, len - off, (off_t)off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			ret = w < 0 ? -errno : -EIO;
			goto out;
		}
		off += (size_t)w;
	}
	if (ftruncate(hf->fd, (off_t)len))
		ret = -errno;
out:
	free(buf);
	return ret;
}

/* The least recent row's index. */
static size_t sharedtier_health_oldest(const struct sharedtier_health_file *hf)
{
	size_t o = 0;

	for (size_t i = 1; i < hf->n; i++)
		if (hf->v[i].h.last < hf->v[o].h.last)
			o = i;
	return o;
}

int sharedtier_health_note(const struct dstage_config *cfg, const char *name,
			   int cause, const char *what)
{
	struct sharedtier_health_file hf;
	struct sharedtier_health_row *r = NULL;
	int64_t now = (int64_t)time(NULL);
	int ret;

	if (cause < 0 || cause >= SHAREDTIER_CAUSES ||
	    strlen(name) >= sizeof(r->name))
		return -EINVAL;
	ret = sharedtier_health_open(cfg, true, &hf);
	for (size_t i = 0; !ret && i < hf.n && !r; i++)
		if (hf.v[i].cause == cause && !strcmp(hf.v[i].name, name))
			r = &hf.v[i];
	if (!ret && !r) {
		if (hf.n == SHAREDTIER_HEALTH_ROWS)
			hf.v[sharedtier_health_oldest(&hf)] = hf.v[--hf.n];
		r = &hf.v[hf.n++];
		memset(r, 0, sizeof(*r));
		snprintf(r->name, sizeof(r->name), "%s", name);
		r->cause = cause;
		r->h.first = now;
	}
	if (!ret) {
		r->h.count++;
		r->h.last = now;
		snprintf(r->h.what, sizeof(r->h.what), "%s", what ? what : "");
		for (char *p = r->h.what; *p; p++)
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				*p = '?';
		ret = sharedtier_health_write(&hf);
	}
	if (ret && ret != -ENOENT)
		log_warn("shared tier: %s: %s (not counted there: %s's tier "
			 "not used (%s): %s)",
			 hf.path, strerror(-ret), name,
			 sharedtier_cause_name(cause), what ? what : "");
	sharedtier_health_close(&hf);
	return ret;
}

int sharedtier_health_clear(const struct dstage_config *cfg, const char *name,
			    unsigned mask)
{
	struct sharedtier_health_file hf;
	size_t n;
	int ret;

	/* a look first, without the write lock: nothing to clear is usual
	 * (a file that cannot be read shows nothing to forget either) */
	ret = sharedtier_health_get(cfg, name, NULL);
	if (ret <= 0)
		return ret == -ENOENT ? 0 : ret;
	ret = sharedtier_health_open(cfg, true, &hf);
	n = hf.n;
	for (size_t i = 0; !ret && i < hf.n;) {
		if (!strcmp(hf.v[i].name, name) &&
		    (mask & (1u << hf.v[i].cause)))
			hf.v[i] = hf.v[--hf.n];
		else
			i++;
	}
	if (!ret && hf.n != n)
		ret = sharedtier_health_write(&hf);
	if (ret)
		log_warn("shared tier: %s: %s (%s's past refusals stay in this "
			 "node's status)",
			 hf.path, strerror(-ret), name);
	sharedtier_health_close(&hf);
	return ret;
}

int sharedtier_health_get(const struct dstage_config *cfg, const char *name,
			  struct sharedtier_health h[SHAREDTIER_CAUSES])
{
	struct sharedtier_health_file hf;
	int ret, found = 0;

	if (h)
		memset(h, 0, SHAREDTIER_CAUSES * sizeof(*h));
	ret = sharedtier_health_open(cfg, false, &hf);
	for (size_t i = 0; !ret && i < hf.n; i++) {
		if (strcmp(hf.v[i].name, name))
			continue;
		found++;
		if (h)
			h[hf.v[i].cause] = hf.v[i].h;
	}
	sharedtier_health_close(&hf);
	return ret ? ret : found;
}
