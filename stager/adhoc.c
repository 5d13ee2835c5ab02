// SPDX-License-Identifier: MIT
/*
 * adhoc: `stager stage PATH` and `stager verify PATH`, a directory under a
 * dstagefs mount (typically a transparent overlay, dstagefs --over DIR)
 * taken as an ad-hoc dataset: nothing is registered.
 *
 *   stage   read every regular file under PATH through the mount, so that
 *           dstagefs fills its verified block cache as it serves them
 *   verify  read and hash every file; when PATH/SHA256SUMS exists, check
 *           each file it lists (mismatch, missing) and count those it
 *           does not list
 *
 * It runs in the caller's process, with the caller's rights: the mount's
 * own checks (the underlying tree's modes, for an overlay) decide what may
 * be read, and a file refused is an error like any other.
 *
 * State: one struct adhoc shared by the reader threads. The file list and
 * the manifest are read-only once built; the next index and the counters
 * are atomics; lock protects the report lines and the first errors (leaf
 * lock, never held across I/O).
 */
#include <errno.h>
#include <fcntl.h>
#include <fts.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "dstage/grow.h"
#include "dstage/sha256.h"
#include "dstage/sha256sums.h"
#include "dstage/timeutil.h"
#include "jsonout.h"
#include "stager.h"

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

#define ADHOC_MAX_FILES 10000000 /* a tree larger is refused, named */
#define ADHOC_MAX_REPORT 100 /* mismatch/missing lines kept for output */
#define ADHOC_CHUNK (1u << 20)
#define ADHOC_MANIFEST "SHA256SUMS"

struct adhoc_file {
	char *rel; /* path relative to the root, no leading "./" */
	uint64_t size;
};

struct adhoc_sum {
	char *name;
	unsigned char hash[32];
	bool seen; /* a file of that name was found (set before readers) */
};

struct adhoc {
	char *root; /* realpath of PATH */
	bool verify;
	struct adhoc_file *files;
	size_t n_files, cap_files;
	uint64_t total_bytes;
	struct adhoc_sum *sums; /* sorted by name; NULL without a manifest */
	size_t n_sums, cap_sums;
	bool has_manifest;
	unsigned long bad_lines;
	/* shared with the readers */
	_Atomic size_t next;
	_Atomic uint64_t done_bytes, done_files, errors, mismatches, unlisted;
	pthread_mutex_t lock; /* report and first_error below */
	char *report[ADHOC_MAX_REPORT];
	size_t n_report;
	char first_error[512];
};

static void adhoc_note(struct adhoc *a, const char *kind, const char *rel,
		       const char *why);

/* One entry of the walk: a regular file is listed, a directory that could
 * not be read is an ERROR line. Returns 0 or -errno (stop the walk). */
static int adhoc_walk_one(struct adhoc *a, const FTSENT *e)
{
	const char *rel = e->fts_path + strlen(a->root);

	while (*rel == '/')
		rel++;
	if (e->fts_info == FTS_DNR || e->fts_info == FTS_NS ||
	    e->fts_info == FTS_ERR) {
		const char *why =
			strerror(e->fts_errno ? e->fts_errno : EACCES);

		atomic_fetch_add(&a->errors, 1);
		adhoc_note(a, "ERROR", *rel ? rel : ".", why);
		if (!a->first_error[0])
			snprintf(a->first_error, sizeof(a->first_error),
				 "%s: %s", *rel ? rel : ".", why);
		return 0;
	}
	if (e->fts_info != FTS_F || !S_ISREG(e->fts_statp->st_mode))
		return 0;
	if (a->verify && !strcmp(rel, ADHOC_MANIFEST))
		return 0; /* the manifest does not list itself */
	if (a->n_files == ADHOC_MAX_FILES) {
		fprintf(stderr,
			"stager: %s: more than %d files; stage or verify a "
			"subdirectory\n",
			a->root, ADHOC_MAX_FILES);
		return -E2BIG;
	}
	if (GROW_ONE(a->files, a->n_files, a->cap_files, 1024))
		return -ENOMEM;
	a->files[a->n_files].rel = strdup(rel);
	if (!a->files[a->n_files].rel)
		return -ENOMEM;
	a->files[a->n_files++].size = (uint64_t)e->fts_statp->st_size;
	a->total_bytes += (uint64_t)e->fts_statp->st_size;
	return 0;
}

/* Walk a->root without following symlinks or leaving its file system.
 * Returns 0 or -errno. */
static int adhoc_walk(struct adhoc *a)
{
	char *const roots[] = { a->root, NULL };
	FTS *fts = fts_open(roots, FTS_PHYSICAL | FTS_XDEV | FTS_NOCHDIR, NULL);
	FTSENT *e;
	int ret = 0;

	if (!fts)
		return -errno;
	while (!ret) {
		errno = 0;
		e = fts_read(fts);
		if (!e) {
			ret = -errno; /* 0 at the end of the walk */
			break;
		}
		ret = adhoc_walk_one(a, e);
	}
	fts_close(fts);
	return ret;
}

static int adhoc_sum_cmp(const void *x, const void *y)
{
	return strcmp(((const struct adhoc_sum *)x)->name,
		      ((const struct adhoc_sum *)y)->name);
}

static int adhoc_sum_add(void *arg, const char *name, size_t name_len,
			 const unsigned char hash[32], bool binary)
{
	struct adhoc *a = arg;

	(void)name_len;
	(void)binary;
	if (a->n_sums == ADHOC_MAX_FILES)
		return -E2BIG;
	if (GROW_ONE(a->sums, a->n_sums, a->cap_sums, 1024))
		return -ENOMEM;
	a->sums[a->n_sums].name = strdup(name);
	if (!a->sums[a->n_sums].name)
		return -ENOMEM;
	memcpy(a->sums[a->n_sums].hash, hash, 32);
	a->sums[a->n_sums++].seen = false;
	return 0;
}

static int adhoc_sum_bad(void *arg, unsigned long line, const char *why)
{
	struct adhoc *a = arg;

	if (a->bad_lines++ < 5)
		fprintf(stderr, "stager: %s/%s line %lu: %s; skipped\n",
			a->root, ADHOC_MANIFEST, line, why);
	return 0;
}

/* Read PATH/SHA256SUMS, if any, into a->sums (sorted). 0 or -errno. */
static int adhoc_manifest(struct adhoc *a)
{
	struct sha256sums_parser *p = malloc(sizeof(*p));
	char path[PATH_MAX], *buf = malloc(ADHOC_CHUNK);
	int fd = -1, ret = 0;
	ssize_t r;

	if (!p || !buf) {
		ret = -ENOMEM;
		goto out;
	}
	snprintf(path, sizeof(path), "%s/%s", a->root, ADHOC_MANIFEST);
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		if (errno != ENOENT) {
			ret = -errno;
			fprintf(stderr, "stager: %s: %s\n", path,
				strerror(errno));
		}
		goto out;
	}
	a->has_manifest = true;
	sha256sums_init(p, adhoc_sum_add, adhoc_sum_bad, a);
	while ((r = read(fd, buf, ADHOC_CHUNK)) != 0) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = -errno;
			break;
		}
		ret = sha256sums_feed(p, buf, (size_t)r);
		if (ret)
			break;
	}
	if (!ret)
		ret = sha256sums_finish(p);
	if (ret)
		fprintf(stderr, "stager: %s: %s\n", path, strerror(-ret));
	else if (a->n_sums)
		qsort(a->sums, a->n_sums, sizeof(*a->sums), adhoc_sum_cmp);
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	free(p);
	return ret;
}

static struct adhoc_sum *adhoc_sum_find(struct adhoc *a, const char *name)
{
	struct adhoc_sum key = { .name = (char *)name };

	if (!a->n_sums)
		return NULL;
	return bsearch(&key, a->sums, a->n_sums, sizeof(*a->sums),
		       adhoc_sum_cmp);
}

/* One report line, "KIND rel: why". */
static void adhoc_note(struct adhoc *a, const char *kind, const char *rel,
		       const char *why)
{
	char safe[4 * PATH_MAX + 1];

	/* a name under PATH may hold any byte but '/': none reaches the
	 * terminal raw */
	rel = cli_safe(rel, safe, sizeof(safe));
	pthread_mutex_lock(&a->lock);
	if (a->n_report < ADHOC_MAX_REPORT) {
		char *line = NULL;

		if (asprintf(&line, "%s %s: %s", kind, rel, why) >= 0)
			a->report[a->n_report++] = line;
	}
	pthread_mutex_unlock(&a->lock);
}

/* Read (and, for verify, hash) one file through the mount. */
static void adhoc_one(struct adhoc *a, const struct adhoc_file *f, char *buf)
{
	char path[PATH_MAX], hex[SHA256_HEX_LEN], why[128];
	unsigned char md[SHA256_LEN];
	struct sha256 h = { 0 };
	struct adhoc_sum *want;
	int fd, err = 0;
	ssize_t r;

	snprintf(path, sizeof(path), "%s/%s", a->root, f->rel);
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		err = errno;
		goto out;
	}
	if (a->verify && sha256_init(&h)) {
		err = ENOMEM;
		goto out;
	}
	while ((r = read(fd, buf, ADHOC_CHUNK)) != 0) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			err = errno;
			goto out;
		}
		if (h.ctx && sha256_update(&h, buf, (size_t)r)) {
			err = EIO;
			goto out;
		}
		atomic_fetch_add(&a->done_bytes, (uint64_t)r);
	}
	/* what the mount cached, not the reader's page cache, is kept */
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	if (!h.ctx)
		goto out;
	if (sha256_final(&h, md)) {
		err = EIO;
		goto out;
	}
	want = adhoc_sum_find(a, f->rel);
	if (!want) {
		if (a->has_manifest)
			atomic_fetch_add(&a->unlisted, 1);
	} else if (memcmp(want->hash, md, 32)) {
		sha256_hex(md, hex);
		atomic_fetch_add(&a->mismatches, 1);
		snprintf(why, sizeof(why), "sha256 %s differs from SHA256SUMS",
			 hex);
		adhoc_note(a, "MISMATCH", f->rel, why);
	}
out:
	if (err) {
		atomic_fetch_add(&a->errors, 1);
		adhoc_note(a, "ERROR", f->rel, strerror(err));
		pthread_mutex_lock(&a->lock);
		if (!a->first_error[0])
			snprintf(a->first_error, sizeof(a->first_error),
				 "%s: %s", f->rel, strerror(err));
		pthread_mutex_unlock(&a->lock);
	}
	atomic_fetch_add(&a->done_files, 1);
	sha256_release(&h);
	if (fd >= 0)
		close(fd);
}

static void *adhoc_reader(void *arg)
{
	struct adhoc *a = arg;
	char *buf = malloc(ADHOC_CHUNK);
	size_t i;

	if (!buf)
		return NULL; /* the other readers take its share */
	while ((i = atomic_fetch_add(&a->next, 1)) < a->n_files)
		adhoc_one(a, &a->files[i], buf);
	free(buf);
	return NULL;
}

/* A progress line on stderr: redrawn in place on a terminal. */
static void adhoc_show(struct adhoc *a, const char *what, double t0, bool tty,
		       bool last)
{
	uint64_t done = atomic_load(&a->done_bytes);
	double el = timeutil_mono_s() - t0,
	       rate = el > 0 ? (double)done / el : 0;
	char d[32], t[32], r[32], eta[32];

	cli_bytes(done, d, sizeof(d));
	cli_bytes(a->total_bytes, t, sizeof(t));
	cli_bytes((uint64_t)rate, r, sizeof(r));
	cli_eta(rate > 0 && a->total_bytes >= done
			? (double)(a->total_bytes - done) / rate
			: -1,
		eta, sizeof(eta));
	fprintf(stderr,
		"%s%s %s: %s of %s, %" PRIu64 "/%zu files, %s/s, "
		"ETA %s%s",
		tty ? "\r" : "", what, a->root, d, t,
		(uint64_t)atomic_load(&a->done_files), a->n_files, r, eta,
		tty ? (last ? "\033[K\n" : "\033[K") : "\n");
	fflush(stderr);
}

static int adhoc_print(struct adhoc *a, const char *what, double secs,
		       size_t missing, bool json)
{
	uint64_t errors = atomic_load(&a->errors),
		 mism = atomic_load(&a->mismatches);
	bool ok = !errors && !mism && !missing;

	if (json) {
		json_t *doc = json_pack(
			"{ss ss sI sI sf sI sI sI sI sb sb}", "kind", what,
			"path", a->root, "files", (json_int_t)a->n_files,
			"bytes", (json_int_t)a->total_bytes, "seconds", secs,
			"errors", (json_int_t)errors, "mismatches",
			(json_int_t)mism, "missing", (json_int_t)missing,
			"unlisted", (json_int_t)atomic_load(&a->unlisted),
			"manifest", a->has_manifest, "ok", ok);
		json_t *lines = json_array();

		for (size_t i = 0; doc && lines && i < a->n_report; i++)
			json_array_append_new(lines, json_string(a->report[i]));
		if (doc && lines)
			json_object_set_new(doc, "report", lines);
		if (jsonout_print(doc))
			ok = false;
		json_decref(doc);
	} else {
		for (size_t i = 0; i < a->n_report; i++)
			printf("%s\n", a->report[i]);
		printf("%s %s: %zu files, %" PRIu64 " bytes in %.1f s: %s\n",
		       what, a->root, a->n_files, a->total_bytes, secs,
		       ok ? "ok" : "FAILED");
		if (a->has_manifest && a->verify)
			printf("  SHA256SUMS: %zu listed, %" PRIu64
			       " mismatched, %zu missing, %" PRIu64
			       " not listed\n",
			       a->n_sums, mism, missing,
			       (uint64_t)atomic_load(&a->unlisted));
		else if (a->verify)
			printf("  no SHA256SUMS under %s: every file was read "
			       "through the mount's checks, none compared\n",
			       a->root);
		if (errors)
			printf("  %" PRIu64 " file(s) could not be read; the "
			       "first: %s\n",
			       errors, a->first_error);
	}
	return ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

bool adhoc_is_path(const char *arg)
{
	return strchr(arg, '/') != NULL; /* dataset names hold no '/' */
}

int adhoc_run(const struct dstage_config *cfg, const struct stager_cmd *cmd,
	      const struct stager_opts *o)
{
	struct adhoc a = { .verify = !strcmp(cmd->name, "verify") };
	char *root = NULL;
	pthread_t tids[STAGER_PARALLEL_MAX];
	size_t started = 0, missing = 0;
	unsigned n = o->parallel ? o->parallel : cfg->s3_max_inflight;
	struct statfs sf;
	struct stat st;
	double t0, next;
	int ret, code = CLI_EXIT_FAIL;
	bool tty = !o->json && isatty(STDERR_FILENO);

	pthread_mutex_init(&a.lock, NULL);
	if (o->files || o->fit || o->bandwidth || o->mode || o->repair ||
	    o->fetch_missing) {
		fprintf(stderr,
			"stager %s %s: --files, --fit, --bandwidth, "
			"--source, --cache, --repair and "
			"--fetch-missing apply to a registered dataset, "
			"not to a directory\n",
			cmd->name, o->argv[0]);
		code = CLI_EXIT_USAGE;
		goto out;
	}
	root = realpath(o->argv[0], NULL);
	if (!root || stat(root, &st) || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "stager %s: %s: %s\n", cmd->name, o->argv[0],
			root ? "not a directory" : strerror(errno));
		code = root || errno != ENOENT ? CLI_EXIT_FAIL : CLI_EXIT_NOENT;
		goto out;
	}
	if (statfs(root, &sf) || sf.f_type != FUSE_SUPER_MAGIC) {
		fprintf(stderr,
			"stager %s: %s is not under a dstagefs mount: a "
			"directory is staged by reading it through the mount "
			"(dstagefs --over DIR, or <mount>/datasets/NAME); a "
			"registered dataset is named without '/'\n",
			cmd->name, root);
		code = CLI_EXIT_USAGE;
		goto out;
	}
	a.root = root;
	ret = adhoc_walk(&a);
	if (ret) {
		fprintf(stderr, "stager %s: walking %s: %s\n", cmd->name, root,
			strerror(-ret));
		goto out;
	}
	if (a.verify && adhoc_manifest(&a))
		goto out;
	for (size_t i = 0; i < a.n_files; i++) {
		struct adhoc_sum *s = adhoc_sum_find(&a, a.files[i].rel);

		if (s)
			s->seen = true;
	}
	for (size_t i = 0; i < a.n_sums; i++) {
		if (a.sums[i].seen)
			continue;
		missing++;
		adhoc_note(&a, "MISSING", a.sums[i].name,
			   "listed in SHA256SUMS, not found");
	}
	if (n < 1)
		n = 1;
	if (n > STAGER_PARALLEL_MAX)
		n = STAGER_PARALLEL_MAX;
	if (n > a.n_files)
		n = a.n_files ? (unsigned)a.n_files : 1;
	t0 = timeutil_mono_s();
	for (unsigned i = 0; i < n; i++) {
		if (pthread_create(&tids[started], NULL, adhoc_reader, &a))
			break;
		started++;
	}
	if (!started)
		adhoc_reader(&a);
	/* progress every second on a terminal, every 10 s otherwise */
	next = t0 + (tty ? 1 : 10);
	for (size_t i = 0; i < started; i++) {
		while (pthread_tryjoin_np(tids[i], NULL) == EBUSY) {
			usleep(100000);
			if (!o->json && timeutil_mono_s() >= next) {
				adhoc_show(&a, cmd->name, t0, tty, false);
				next += tty ? 1 : 10;
			}
		}
	}
	if (!o->json && tty)
		adhoc_show(&a, cmd->name, t0, tty, true);
	code = adhoc_print(&a, cmd->name, timeutil_mono_s() - t0, missing,
			   o->json);
out:
	for (size_t i = 0; i < a.n_files; i++)
		free(a.files[i].rel);
	for (size_t i = 0; i < a.n_sums; i++)
		free(a.sums[i].name);
	for (size_t i = 0; i < a.n_report; i++)
		free(a.report[i]);
	free(a.files);
	free(a.sums);
	free(root);
	pthread_mutex_destroy(&a.lock);
	return code;
}
