// SPDX-License-Identifier: MIT
/*
 * push_journal: the resume journal of a push (see push.h).
 *
 * One file per (destination URL, local directory): <base>/push/<32 hex of
 * SHA-256(url NUL realpath(dir))>.journal, where <base> is the directory
 * the caller names, else cache.dir when it exists and belongs to this uid,
 * else $HOME/.cache/dstage. The push/ directory is 0700 and the
 * journal 0600 (it names every key of the dataset); an existing journal
 * that is not a regular file of this uid is refused.
 *
 * Format: one record a line, fields separated by a tab, the key last (keys
 * hold no tab or newline: keypath_check refuses control bytes):
 *   1 TAB sha256-hex TAB size TAB mtime-ns TAB inode TAB etag TAB key
 *   0 TAB key                       (a tombstone: forget the key)
 * Records are appended with one write(2) each under O_APPEND; a line torn
 * by a crash (no newline, or a bad field) is ignored, so the journal never
 * claims more than was checked. On a clean finish it is rewritten (temp
 * file, fsync, rename) holding one record per file of the push.
 *
 * State machine: closed -> open (records loaded, fd for appends) ->
 * released. ents is read-only once open; lock serializes appends.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/sha256.h"
#include "push_i.h"
#include "util/strutil.h"

#define PUSH_JOURNAL_LINE (64 + 3 * 21 + 130 + KEYPATH_MAX + 16)

static int push_journal_mkdir(const char *path)
{
	struct stat st;

	if (mkdir(path, 0700) && errno != EEXIST)
		return -errno;
	if (lstat(path, &st))
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
		log_error("push journal: %s is not a directory of uid %u: "
			  "remove it or set another cache.dir",
			  path, (unsigned)geteuid());
		return -EACCES;
	}
	if ((st.st_mode & 077) && chmod(path, 0700))
		return -errno;
	return 0;
}

/*
 * <base>/push, created 0700. With own_base, base must be an existing
 * directory of this uid (cache.dir: a push never makes it, which would
 * leave it to the wrong owner for the daemon, nor writes into another
 * user's); else it is made 0700 when missing (~/.cache/dstage).
 */
static int push_journal_dir(const char *base, bool own_base, char *out,
			    size_t len)
{
	struct stat st;

	if ((size_t)snprintf(out, len, "%s/push", base) >= len)
		return -ENAMETOOLONG;
	if (stat(base, &st)) {
		if (errno != ENOENT || own_base)
			return -errno;
		if (mkdir(base, 0700))
			return -errno;
	} else if (own_base &&
		   (!S_ISDIR(st.st_mode) || st.st_uid != geteuid())) {
		return -EACCES;
	}
	if (access(base, W_OK | X_OK))
		return -errno;
	return push_journal_mkdir(out);
}

static int push_jent_cmp(const void *a, const void *b)
{
	const struct push_jent *x = a, *y = b;
	int c = strcmp(x->key, y->key);

	/* equal keys keep file order: the later record wins */
	return c ? c : (x->seq < y->seq ? -1 : x->seq > y->seq);
}

static void push_jent_free(struct push_jent *e)
{
	free(e->key);
	free(e->etag);
}

/* Parse one line (no newline). Returns 1 for a record in *e, 2 for a
 * tombstone (e->key set), 0 for a line to ignore, -ENOMEM. */
static int push_journal_parse(char *line, struct push_jent *e)
{
	char *f[7], *s = line, *end;
	int n = 0;

	memset(e, 0, sizeof(*e));
	if (!strncmp(line, "0\t", 2)) {
		if (keypath_check(line + 2, strlen(line + 2), NULL))
			return 0;
		e->key = strdup(line + 2);
		return e->key ? 2 : -ENOMEM;
	}
	for (; n < 6; n++) {
		f[n] = s;
		s = strchr(s, '\t');
		if (!s)
			return 0;
		*s++ = '\0';
	}
	f[6] = s;
	if (strcmp(f[0], "1") || strlen(f[1]) != 64 ||
	    keypath_check(f[6], strlen(f[6]), NULL))
		return 0;
	for (int i = 0; i < 32; i++) {
		int hi = strutil_hexval(f[1][2 * i]),
		    lo = strutil_hexval(f[1][2 * i + 1]);

		if (hi < 0 || lo < 0)
			return 0;
		e->sha[i] = (unsigned char)(hi << 4 | lo);
	}
	errno = 0;
	e->size = strtoull(f[2], &end, 10);
	if (errno || *end)
		return 0;
	e->mtime_ns = strtoll(f[3], &end, 10);
	if (errno || *end)
		return 0;
	e->ino = strtoull(f[4], &end, 10);
	if (errno || *end)
		return 0;
	e->key = strdup(f[6]);
	e->etag = strdup(f[5]);
	if (!e->key || !e->etag) {
		push_jent_free(e);
		return -ENOMEM;
	}
	return 1;
}

static int push_journal_load(struct push_journal *j, FILE *in)
{
	struct push_jent *v = NULL, e;
	size_t n = 0, cap = 0, k = 0;
	char *line = NULL;
	size_t llen = 0;
	ssize_t got;
	int ret = 0;

	while ((got = getline(&line, &llen, in)) > 0) {
		if (line[got - 1] != '\n' || got > PUSH_JOURNAL_LINE)
			continue; /* torn by a crash, or not ours */
		line[got - 1] = '\0';
		ret = push_journal_parse(line, &e);
		if (ret < 0)
			goto out;
		if (!ret)
			continue;
		e.tomb = ret == 2;
		e.seq = n;
		if (GROW_ONE(v, n, cap, 256)) {
			push_jent_free(&e);
			ret = -ENOMEM;
			goto out;
		}
		v[n++] = e;
	}
	ret = 0;
	if (n)
		qsort(v, n, sizeof(*v), push_jent_cmp);
	/* keep the last record of each key, unless it is a tombstone */
	for (size_t i = 0; i < n; i++) {
		if ((i + 1 < n && !strcmp(v[i].key, v[i + 1].key)) ||
		    v[i].tomb) {
			push_jent_free(&v[i]);
			continue;
		}
		v[k++] = v[i];
	}
	n = 0;
	j->ents = v;
	j->n = k;
	v = NULL;
out:
	for (size_t i = 0; i < n; i++)
		push_jent_free(&v[i]);
	free(v);
	free(line);
	return ret;
}

/* Open path for appending: a regular file of ours, 0600. */
static int push_journal_open_fd(const char *path, int flags)
{
	struct stat st;
	int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		log_error("push journal: %s is not a regular file of uid %u: "
			  "remove it",
			  path, (unsigned)geteuid());
		close(fd);
		return -EACCES;
	}
	if ((st.st_mode & 07777) != 0600 && fchmod(fd, 0600)) {
		int ret = -errno;

		close(fd);
		return ret;
	}
	return fd;
}

int push_journal_open(struct push_journal *j, const struct dstage_config *cfg,
		      const char *dir, const char *url, const char *localdir)
{
	char d[4096], hex[65];
	unsigned char md[SHA256_LEN];
	struct sha256 h = { 0 };
	const char *home = getenv("HOME");
	FILE *in = NULL;
	int ret, fd;

	memset(j, 0, sizeof(*j));
	j->fd = -1;
	pthread_mutex_init(&j->lock, NULL);
	if (sha256_init(&h) || sha256_update(&h, url, strlen(url) + 1) ||
	    sha256_update(&h, localdir, strlen(localdir)) ||
	    sha256_final(&h, md)) {
		sha256_release(&h);
		return -ENOMEM;
	}
	sha256_release(&h);
	strutil_hex(md, 16, hex);
	if (dir)
		ret = push_journal_dir(dir, false, d, sizeof(d));
	else
		ret = push_journal_dir(cfg->cache_dir, true, d, sizeof(d));
	if (ret && !dir && home && home[0] == '/') {
		char base[4096];

		snprintf(base, sizeof(base), "%s/.cache", home);
		mkdir(base, 0700);
		snprintf(base, sizeof(base), "%s/.cache/dstage", home);
		ret = push_journal_dir(base, false, d, sizeof(d));
	}
	if (ret) {
		log_error("push journal: cannot make its directory under %s "
			  "(or ~/.cache/dstage): %s; set cache.dir to a "
			  "directory this user may write",
			  dir ? dir : cfg->cache_dir, strerror(-ret));
		return ret;
	}
	if ((size_t)snprintf(j->path, sizeof(j->path), "%s/%s.journal", d,
			     hex) >= sizeof(j->path))
		return -ENAMETOOLONG;
	fd = push_journal_open_fd(j->path, O_RDWR | O_CREAT | O_APPEND);
	if (fd < 0) {
		log_error("push journal %s: %s", j->path, strerror(-fd));
		return fd;
	}
	j->fd = fd;
	in = fdopen(dup(fd), "r");
	if (!in)
		return -errno;
	ret = push_journal_load(j, in);
	fclose(in);
	return ret;
}

const struct push_jent *push_journal_find(const struct push_journal *j,
					  const char *key)
{
	size_t lo = 0, hi = j->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(key, j->ents[mid].key);

		if (!c)
			return &j->ents[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

static int push_journal_line(const struct push_file *f, char *buf, size_t len)
{
	char hex[65];

	if (f->state != PF_DONE && f->state != PF_SKIP)
		return snprintf(buf, len, "0\t%s\n", f->key);
	strutil_hex(f->sha, 32, hex);
	return snprintf(
		buf, len,
		"1\t%s\t%" PRIu64 "\t%" PRId64 "\t%" PRIu64 "\t%s\t%s\n", hex,
		f->size, f->mtime_ns, f->ino, f->etag ? f->etag : "-", f->key);
}

int push_journal_put(struct push_journal *j, const struct push_file *f)
{
	char buf[PUSH_JOURNAL_LINE + 8];
	int n = push_journal_line(f, buf, sizeof(buf)), ret = 0;

	if (n < 0 || (size_t)n >= sizeof(buf))
		return -ENAMETOOLONG;
	pthread_mutex_lock(&j->lock);
	if (j->fd < 0)
		ret = -EBADF;
	else if (write(j->fd, buf, (size_t)n) != n)
		ret = errno ? -errno : -EIO;
	pthread_mutex_unlock(&j->lock);
	if (ret)
		log_error("push journal %s: %s", j->path, strerror(-ret));
	return ret;
}

int push_journal_compact(struct push_journal *j, const struct push_file *files,
			 size_t n)
{
	char tmp[4200], buf[PUSH_JOURNAL_LINE + 8];
	int fd, ret = 0;
	FILE *out;

	snprintf(tmp, sizeof(tmp), "%s.tmp", j->path);
	unlink(tmp);
	fd = push_journal_open_fd(tmp, O_WRONLY | O_CREAT | O_EXCL);
	if (fd < 0)
		return fd;
	out = fdopen(fd, "w");
	if (!out) {
		close(fd);
		unlink(tmp);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		if (files[i].state != PF_DONE && files[i].state != PF_SKIP)
			continue;
		if (push_journal_line(&files[i], buf, sizeof(buf)) > 0)
			fputs(buf, out);
	}
	if (fflush(out) || fsync(fileno(out)))
		ret = -errno;
	if (fclose(out) && !ret)
		ret = -errno;
	if (!ret && rename(tmp, j->path))
		ret = -errno;
	if (ret) {
		unlink(tmp);
		log_error("push journal %s: rewrite: %s", j->path,
			  strerror(-ret));
		return ret;
	}
	pthread_mutex_lock(&j->lock);
	if (j->fd >= 0)
		close(j->fd);
	j->fd = push_journal_open_fd(j->path, O_WRONLY | O_APPEND);
	if (j->fd < 0)
		ret = j->fd;
	pthread_mutex_unlock(&j->lock);
	return ret;
}

void push_journal_release(struct push_journal *j)
{
	if (!j)
		return;
	for (size_t i = 0; i < j->n; i++)
		push_jent_free(&j->ents[i]);
	free(j->ents);
	j->ents = NULL;
	j->n = 0;
	if (j->fd >= 0)
		close(j->fd);
	j->fd = -1;
	pthread_mutex_destroy(&j->lock);
}
