// SPDX-License-Identifier: MIT
/*
 * sharedtier: publish a dataset's snapshot into its shared tier under a
 * lease kept on the tier itself (include/dstage/sharedtier.h). Keeps no
 * state between calls; a call's state is its own (no lock).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/sha256.h"
#include "dstage/sharedtier.h"
#include "dstage/timeutil.h"
#include "util/strutil.h"

#define ST_CHUNK (8u << 20) /* bytes fetched per request */
#define ST_POLL_MS 200 /* between looks at another node's lease */

struct st_file {
	char *key;
	uint64_t size;
	char etag[OBJSTORE_ETAG_MAX];
	bool has_expected;
	unsigned char expected[32];
	unsigned char actual[32];
};

struct st_list {
	struct st_file *v;
	size_t n, cap;
	char **dirs; /* directories still to read */
	size_t ndirs, dcap;
	const char *dir; /* the one being read ("" for the root) */
};

struct st_lease {
	int fd; /* -1: not held */
	dev_t dev;
	ino_t ino;
	char path[PATH_MAX];
	char holder[200];
	int64_t expires_ms; /* real time */
	unsigned ttl_ms;
};

static int st_join(char *buf, size_t len, const char *a, const char *b)
{
	int n = snprintf(buf, len, "%s/%s", a, b);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ---- the manifest, from the catalog ---- */

static int st_walk_cb(void *arg, const char *name,
		      const struct catalog_entry *e)
{
	struct st_list *l = arg;
	size_t len = strlen(l->dir) + strlen(name) + 2;
	char *path = malloc(len);

	if (!path)
		return -ENOMEM;
	snprintf(path, len, "%s%s%s", l->dir, *l->dir ? "/" : "", name);
	if (e->is_dir) {
		if (GROW_ONE(l->dirs, l->ndirs, l->dcap, 16))
			goto oom;
		l->dirs[l->ndirs++] = path;
		return 0;
	}
	if (GROW_ONE(l->v, l->n, l->cap, 64))
		goto oom;
	memset(&l->v[l->n], 0, sizeof(l->v[0]));
	l->v[l->n].key = path;
	l->v[l->n].size = e->size;
	memcpy(l->v[l->n].etag, e->etag, sizeof(e->etag));
	l->v[l->n].has_expected = e->has_expected;
	memcpy(l->v[l->n].expected, e->expected_sha256, 32);
	l->n++;
	return 0;
oom:
	free(path);
	return -ENOMEM;
}

static int st_cmp(const void *a, const void *b)
{
	return strcmp(((const struct st_file *)a)->key,
		      ((const struct st_file *)b)->key);
}

static void st_list_free(struct st_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i].key);
	while (l->ndirs)
		free(l->dirs[--l->ndirs]);
	free(l->v);
	free(l->dirs);
	memset(l, 0, sizeof(*l));
}

/* Every file of the current manifest, sorted by key; the snapshot id. */
static int st_load(struct catalog *cat, const char *name, struct st_list *l,
		   char snapshot[SHAREDTIER_SNAPSHOT_LEN + 1])
{
	unsigned char md[SHA256_LEN];
	char *dir = strdup(""), num[32];
	struct sha256 h = { 0 };
	int ret = 0;

	if (!dir)
		return -ENOMEM;
	while (dir) {
		l->dir = dir;
		ret = catalog_readdir(cat, name, dir, NULL, st_walk_cb, l);
		free(dir);
		dir = NULL;
		if (ret)
			goto out;
		if (l->ndirs)
			dir = l->dirs[--l->ndirs];
	}
	qsort(l->v, l->n, sizeof(l->v[0]), st_cmp);
	ret = sha256_init(&h);
	if (ret)
		goto out;
	sha256_update(&h, SHAREDTIER_MAGIC "\n", strlen(SHAREDTIER_MAGIC) + 1);
	for (size_t i = 0; i < l->n; i++) {
		snprintf(num, sizeof(num), "%" PRIu64, l->v[i].size);
		sha256_update(&h, l->v[i].key, strlen(l->v[i].key) + 1);
		sha256_update(&h, num, strlen(num) + 1);
		sha256_update(&h, l->v[i].etag, strlen(l->v[i].etag));
		sha256_update(&h, "\n", 1);
	}
	ret = sha256_final(&h, md);
	if (!ret)
		strutil_hex(md, SHAREDTIER_SNAPSHOT_LEN / 2, snapshot);
out:
	sha256_release(&h);
	return ret;
}

/* The tier's base directory of ds: its own setting or ROOT/NAME. */
static int st_base(const struct dstage_config *cfg,
		   const struct catalog_dataset *ds, char *buf, size_t len)
{
	const char *t = ds->shared_tier;
	int n;

	if (t && strncmp(t, "file://", 7) == 0)
		t += 7;
	if (t && *t)
		n = snprintf(buf, len, "%s", t);
	else if (cfg->sources_shared_tier_root)
		n = snprintf(buf, len, "%s/%s", cfg->sources_shared_tier_root,
			     ds->name);
	else
		return -ENOENT;
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	while (n > 1 && buf[n - 1] == '/')
		buf[--n] = '\0';
	return 0;
}

int sharedtier_locate(struct catalog *cat, const struct dstage_config *cfg,
		      const char *name, char *dir, size_t len,
		      char snapshot[SHAREDTIER_SNAPSHOT_LEN + 1])
{
	struct catalog_dataset ds;
	struct st_list l = { 0 };
	char base[PATH_MAX];
	int ret;

	ret = catalog_dataset_get(cat, name, &ds);
	if (ret)
		return ret;
	ret = st_base(cfg, &ds, base, sizeof(base));
	if (!ret)
		ret = st_load(cat, name, &l, snapshot);
	if (!ret)
		ret = st_join(dir, len, base, snapshot);
	st_list_free(&l);
	catalog_dataset_release(&ds);
	return ret;
}

/* ---- directories and files ---- */

/* mkdir every component of path after its first skip bytes (which exist). */
static int st_mkdirs(char *path, size_t skip)
{
	for (char *p = path + skip + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char c = *p;

		*p = '\0';
		if (mkdir(path, 0755) && errno != EEXIST) {
			int e = -errno;

			log_error("shared tier: mkdir %s: %s", path,
				  strerror(-e));
			*p = c;
			return e;
		}
		*p = c;
		if (!c)
			return 0;
	}
}

static int st_fsync_dir_of(const char *path)
{
	char d[PATH_MAX];
	char *slash;
	int fd, ret = 0;

	snprintf(d, sizeof(d), "%s", path);
	slash = strrchr(d, '/');
	if (!slash)
		return 0;
	*slash = '\0';
	fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fsync(fd))
		ret = -errno;
	close(fd);
	return ret;
}

/* A temporary name beside final: DIR/.dstage-tmp.<random>. */
static int st_tmpname(const char *final, char *buf, size_t len)
{
	const char *slash = strrchr(final, '/');
	unsigned char r[8];
	char hex[17];
	int n;

	if (getrandom(r, sizeof(r), 0) != sizeof(r))
		return -EIO;
	strutil_hex(r, sizeof(r), hex);
	n = snprintf(buf, len, "%.*s/.dstage-tmp.%s",
		     (int)(slash ? slash - final : 0), final, hex);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int st_hash_file(const char *path, unsigned char md[32])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	int ret;

	if (fd < 0)
		return -errno;
	ret = sha256_fd(fd, md);
	close(fd);
	return ret;
}

/* 1 when dir/MANIFEST is there and names snapshot; 0 when absent. */
static int st_manifest_done(const char *dir, const char *snapshot)
{
	char path[PATH_MAX], want[128], got[128] = "";
	FILE *f;

	if (st_join(path, sizeof(path), dir, SHAREDTIER_MANIFEST))
		return -ENAMETOOLONG;
	f = fopen(path, "re");
	if (!f)
		return errno == ENOENT ? 0 : -errno;
	snprintf(want, sizeof(want), "snapshot %s\n", snapshot);
	for (int i = 0; i < 3 && fgets(got, sizeof(got), f); i++)
		if (!strcmp(got, want)) {
			fclose(f);
			return 1;
		}
	fclose(f);
	log_error("shared tier: %s names another snapshot than %s", path,
		  snapshot);
	return -EIO;
}

/* ---- the lease ---- */

static int st_lease_write(struct st_lease *l)
{
	char buf[320];
	int n;

	l->expires_ms = timeutil_real_ms() + l->ttl_ms;
	n = snprintf(buf, sizeof(buf), "holder %s\nexpires_ms %" PRId64 "\n",
		     l->holder, l->expires_ms);
	if (pwrite(l->fd, buf, (size_t)n, 0) != n || ftruncate(l->fd, n) ||
	    fsync(l->fd))
		return errno ? -errno : -EIO;
	return 0;
}

/* Read a lease file: its holder and expiry, and the whole text. */
static int st_lease_read(const char *path, char *text, size_t len, char *holder,
			 size_t hlen, int64_t *expires_ms)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	const char *h, *e;
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, text, len - 1);
	close(fd);
	if (n < 0)
		return -errno;
	text[n] = '\0';
	h = strstr(text, "holder ");
	e = strstr(text, "expires_ms ");
	/* a lease being written (empty, or cut short) is not expired yet */
	*expires_ms = e ? strtoll(e + 11, NULL, 10) : INT64_MAX;
	snprintf(holder, hlen, "%.*s", h ? (int)strcspn(h + 7, "\n") : 7,
		 h ? h + 7 : "unknown");
	return 0;
}

/* Create the lease; -EEXIST when another holds it. */
static int st_lease_try(struct st_lease *l)
{
	struct stat st;
	int ret;

	l->fd = open(l->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (l->fd < 0)
		return -errno;
	if (fstat(l->fd, &st)) {
		ret = -errno;
		goto err;
	}
	l->dev = st.st_dev;
	l->ino = st.st_ino;
	ret = st_lease_write(l);
	if (ret)
		goto err;
	return 0;
err:
	unlink(l->path);
	close(l->fd);
	l->fd = -1;
	return ret;
}

/* Still ours? Renew it past half its time. -EBUSY: taken over. */
static int st_lease_renew(struct st_lease *l)
{
	struct stat st;

	if (stat(l->path, &st) || st.st_dev != l->dev || st.st_ino != l->ino) {
		log_error("shared tier: lease %s was taken over by another "
			  "node: stopping",
			  l->path);
		return -EBUSY;
	}
	if (timeutil_real_ms() < l->expires_ms - l->ttl_ms / 2)
		return 0;
	return st_lease_write(l);
}

static void st_lease_release(struct st_lease *l)
{
	struct stat st;

	if (l->fd < 0)
		return;
	if (!stat(l->path, &st) && st.st_dev == l->dev && st.st_ino == l->ino)
		unlink(l->path);
	close(l->fd);
	l->fd = -1;
}

/* An expired lease (text seen): rename it away, then check that what was
 * renamed is what was seen (else put it back). 0: gone, -EAGAIN: look
 * again. */
static int st_lease_take_over(struct st_lease *l, const char *seen,
			      const char *holder, int64_t expires_ms)
{
	char aside[PATH_MAX + 64], text[512], h[200];
	int64_t e;
	int n;

	n = snprintf(aside, sizeof(aside), "%s.expired.%d.%" PRId64, l->path,
		     (int)getpid(), timeutil_mono_ns());
	if (n < 0 || (size_t)n >= sizeof(aside))
		return -ENAMETOOLONG;
	if (rename(l->path, aside))
		return errno == ENOENT ? -EAGAIN : -errno;
	if (st_lease_read(aside, text, sizeof(text), h, sizeof(h), &e) ||
	    strcmp(text, seen) != 0) {
		/* another node replaced it in between: give it back */
		if (link(aside, l->path) && errno != EEXIST)
			log_warn("shared tier: putting back lease %s: %s",
				 l->path, strerror(errno));
		unlink(aside);
		return -EAGAIN;
	}
	unlink(aside);
	log_warn("shared tier: lease %s of %s expired %" PRId64
		 " ms ago: taking over",
		 l->path, holder, timeutil_real_ms() - expires_ms);
	return 0;
}

/* ---- the copy ---- */

struct st_pub {
	struct objstore *os;
	struct st_lease lease;
	struct sharedtier_result *res;
	const char *name;
	char data[PATH_MAX]; /* DIR/data */
	unsigned char *buf; /* ST_CHUNK bytes */
};

static int st_write_all(int fd, const unsigned char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Fetch f into tmp (hashing it), check, publish as final. */
static int st_fetch(struct st_pub *p, struct st_file *f, const char *final)
{
	char tmp[PATH_MAX], got_hex[65], want_hex[65];
	struct sha256 h = { 0 };
	uint64_t off = 0;
	int fd = -1, ret;

	ret = st_tmpname(final, tmp, sizeof(tmp));
	if (!ret)
		ret = sha256_init(&h);
	if (ret)
		goto out_h;
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		ret = -errno;
		log_error("shared tier: creating %s: %s", tmp, strerror(-ret));
		goto out_h;
	}
	while (off < f->size) {
		size_t len =
			f->size - off < ST_CHUNK ? f->size - off : ST_CHUNK;
		size_t got = 0;

		ret = objstore_get(p->os, f->key, off, len,
				   *f->etag ? f->etag : NULL, p->buf, &got);
		if (!ret && got == 0)
			ret = -EIO;
		if (!ret)
			ret = st_write_all(fd, p->buf, got);
		if (!ret)
			ret = st_lease_renew(&p->lease);
		if (ret) {
			log_error("shared tier: %s: copying %s at %" PRIu64
				  ": %s",
				  p->name, f->key, off, strerror(-ret));
			goto err;
		}
		sha256_update(&h, p->buf, got);
		off += got;
	}
	if (fsync(fd)) {
		ret = -errno;
		log_error("shared tier: fsync %s: %s", tmp, strerror(-ret));
		goto err;
	}
	ret = sha256_final(&h, f->actual);
	if (ret)
		goto err;
	if (f->has_expected && memcmp(f->actual, f->expected, 32) != 0) {
		strutil_hex(f->actual, 32, got_hex);
		strutil_hex(f->expected, 32, want_hex);
		log_error("shared tier: %s: %s from the source has SHA-256 %s, "
			  "the sums key lists %s: not published",
			  p->name, f->key, got_hex, want_hex);
		ret = -EIO;
		goto err;
	}
	ret = st_lease_renew(&p->lease);
	if (ret)
		goto err;
	if (rename(tmp, final)) {
		ret = -errno;
		log_error("shared tier: rename %s to %s: %s", tmp, final,
			  strerror(-ret));
		goto err;
	}
	close(fd);
	sha256_release(&h);
	p->res->copied++;
	p->res->copied_bytes += f->size;
	return st_fsync_dir_of(final);
err:
	close(fd);
	unlink(tmp);
out_h:
	sha256_release(&h);
	return ret ? ret : -ENOMEM;
}

static int st_one(struct st_pub *p, struct st_file *f)
{
	char final[PATH_MAX];
	struct stat st;
	int ret;

	ret = st_join(final, sizeof(final), p->data, f->key);
	if (ret)
		return ret;
	if (strchr(f->key, '/')) {
		*strrchr(final, '/') = '\0';
		ret = st_mkdirs(final, strlen(p->data));
		final[strlen(final)] = '/';
		if (ret)
			return ret;
	}
	if (!lstat(final, &st) && S_ISREG(st.st_mode) &&
	    (uint64_t)st.st_size == f->size) {
		/* published by an earlier holder: check it again */
		ret = st_hash_file(final, f->actual);
		if (!ret &&
		    (!f->has_expected || !memcmp(f->actual, f->expected, 32))) {
			p->res->kept++;
			return 0;
		}
		log_warn("shared tier: %s: %s is damaged (%s): fetching it "
			 "again",
			 p->name, final, ret ? strerror(-ret) : "SHA-256");
	}
	return st_fetch(p, f, final);
}

static int st_write_manifest(struct st_pub *p, const char *dir,
			     const struct st_list *l)
{
	char path[PATH_MAX], tmp[PATH_MAX], hex[65];
	FILE *f = NULL;
	int fd = -1, ret;

	ret = st_join(path, sizeof(path), dir, SHAREDTIER_MANIFEST);
	if (!ret)
		ret = st_tmpname(path, tmp, sizeof(tmp));
	if (ret)
		return ret;
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0 || !(f = fdopen(fd, "w"))) {
		ret = -errno;
		goto err;
	}
	fprintf(f,
		SHAREDTIER_MAGIC "\ndataset %s\nsnapshot %s\nfiles %" PRIu64
				 "\nbytes %" PRIu64 "\n",
		p->name, p->res->snapshot, p->res->files, p->res->bytes);
	for (size_t i = 0; i < l->n; i++) {
		strutil_hex(l->v[i].actual, 32, hex);
		fprintf(f, "%s %" PRIu64 " %s %s\n", hex, l->v[i].size,
			*l->v[i].etag ? l->v[i].etag : "-", l->v[i].key);
	}
	if (fflush(f) || fsync(fd)) {
		ret = -errno;
		goto err;
	}
	ret = st_lease_renew(&p->lease);
	if (ret)
		goto err;
	if (rename(tmp, path)) {
		ret = -errno;
		goto err;
	}
	fclose(f);
	return st_fsync_dir_of(path);
err:
	log_error("shared tier: writing %s: %s", path, strerror(-ret));
	if (f)
		fclose(f);
	else if (fd >= 0)
		close(fd);
	unlink(tmp);
	return ret;
}

/* Take the lease on dir, or find the copy done. 1: done, 0: held. */
static int st_acquire(struct st_pub *p, const char *dir, unsigned wait_ms)
{
	int64_t deadline = timeutil_mono_ms() + wait_ms, exp;
	char text[512], holder[200];
	struct timespec ts = { 0, ST_POLL_MS * 1000000L };
	int ret;

	for (;;) {
		ret = st_manifest_done(dir, p->res->snapshot);
		if (ret)
			return ret;
		ret = st_lease_try(&p->lease);
		if (ret != -EEXIST)
			break;
		ret = st_lease_read(p->lease.path, text, sizeof(text), holder,
				    sizeof(holder), &exp);
		if (ret == -ENOENT)
			continue;
		if (ret)
			return ret;
		if (exp < timeutil_real_ms()) {
			ret = st_lease_take_over(&p->lease, text, holder, exp);
			if (!ret)
				p->res->took_over = true;
			if (ret && ret != -EAGAIN)
				return ret;
			if (ret) /* another node took it first */
				nanosleep(&ts, NULL);
			continue;
		}
		if (timeutil_mono_ms() >= deadline) {
			snprintf(p->res->holder, sizeof(p->res->holder), "%s",
				 holder);
			log_info("shared tier: %s: %s is held by %s", p->name,
				 p->lease.path, holder);
			return -EBUSY;
		}
		p->res->waited = true;
		nanosleep(&ts, NULL);
	}
	if (ret) {
		log_error("shared tier: creating %s: %s", p->lease.path,
			  strerror(-ret));
		return ret;
	}
	/* the holder before us may have finished just now */
	ret = st_manifest_done(dir, p->res->snapshot);
	if (ret)
		st_lease_release(&p->lease);
	return ret;
}

int sharedtier_publish(struct catalog *cat, const struct dstage_config *cfg,
		       const char *name, unsigned wait_ms,
		       struct sharedtier_result *res)
{
	struct st_pub p = { .res = res, .name = name, .lease.fd = -1 };
	struct catalog_dataset ds;
	struct st_list l = { 0 };
	char base[PATH_MAX], host[64] = "?";
	struct stat st;
	size_t rootlen;
	int ret;

	memset(res, 0, sizeof(*res));
	ret = catalog_dataset_get(cat, name, &ds);
	if (ret)
		return ret;
	if (ds.group && ds.group[0]) {
		/* The copy's files are world-readable on the parallel FS,
		 * which every node mounts: that would bypass the group. */
		log_error(
			"shared tier: dataset %s is restricted to group '%s': "
			"its copy on the parallel file system would be "
			"readable by every user there; not published",
			name, ds.group);
		ret = -EPERM;
		goto out;
	}
	ret = st_base(cfg, &ds, base, sizeof(base));
	if (ret == -ENOENT)
		log_error("shared tier: dataset %s has none: set one with "
			  "stager add --shared-tier DIR or "
			  "sources.shared_tier_root",
			  name);
	if (!ret)
		ret = st_load(cat, name, &l, res->snapshot);
	if (ret)
		goto out;
	for (size_t i = 0; i < l.n; i++) {
		if (strchr(l.v[i].key, '\n') || strpbrk(l.v[i].etag, " \n")) {
			log_error("shared tier: %s: key '%.200s' or its ETag "
				  "cannot be written in a MANIFEST",
				  name, l.v[i].key);
			ret = -EINVAL;
			goto out;
		}
		res->files++;
		res->bytes += l.v[i].size;
		res->unchecked += !l.v[i].has_expected;
	}
	/* the tier's root must exist: a parallel FS not mounted is not
	 * filled in on the local disk underneath */
	rootlen = ds.shared_tier && *ds.shared_tier
			  ? strlen(base)
			  : strlen(base) - strlen(ds.name) - 1;
	base[rootlen] = '\0';
	if (stat(base, &st) || !S_ISDIR(st.st_mode)) {
		ret = -ENOENT;
		log_error("shared tier: %s: %s is not a directory (is the "
			  "parallel file system mounted?)",
			  name, base);
		goto out;
	}
	if (st.st_mode & S_IWOTH) {
		/* every node trusts what is published there */
		ret = -EACCES;
		log_error("shared tier: %s: %s is writable by others: refused "
			  "(chmod o-w it)",
			  name, base);
		goto out;
	}
	if (!(ds.shared_tier && *ds.shared_tier))
		base[rootlen] = '/';
	ret = st_join(res->dir, sizeof(res->dir), base, res->snapshot);
	if (!ret)
		ret = st_join(p.data, sizeof(p.data), res->dir,
			      SHAREDTIER_DATA);
	if (!ret)
		ret = st_join(p.lease.path, sizeof(p.lease.path), res->dir,
			      SHAREDTIER_LEASE);
	if (!ret)
		ret = st_mkdirs(p.data, rootlen);
	if (ret)
		goto out;
	gethostname(host, sizeof(host) - 1);
	snprintf(p.lease.holder, sizeof(p.lease.holder), "%s pid %d", host,
		 (int)getpid());
	p.lease.ttl_ms = cfg->sources_shared_tier_lease_ms;
	ret = st_acquire(&p, res->dir, wait_ms);
	if (ret == 1) {
		res->already = true;
		ret = 0;
		goto out;
	}
	if (ret)
		goto out;
	p.buf = malloc(ST_CHUNK);
	ret = p.buf ? objstore_open(ds.source, cfg, &p.os) : -ENOMEM;
	for (size_t i = 0; !ret && i < l.n; i++)
		ret = st_one(&p, &l.v[i]);
	if (!ret)
		ret = st_write_manifest(&p, res->dir, &l);
	if (!ret)
		log_info(
			"shared tier: %s: snapshot %s published in %s: %" PRIu64
			" files fetched, %" PRIu64 " kept",
			name, res->snapshot, res->dir, res->copied, res->kept);
out:
	st_lease_release(&p.lease);
	objstore_free(p.os);
	free(p.buf);
	st_list_free(&l);
	catalog_dataset_release(&ds);
	return ret;
}

int sharedtier_wrap(struct catalog *cat, const struct dstage_config *cfg,
		    const char *name, struct objstore **os)
{
	char dir[PATH_MAX], snap[SHAREDTIER_SNAPSHOT_LEN + 1];
	struct objstore *t;
	int ret;

	if (!*os)
		return 0;
	ret = sharedtier_locate(cat, cfg, name, dir, sizeof(dir), snap);
	if (ret == -ENOMEM)
		return ret;
	if (ret)
		return 0; /* no tier: the common case, not logged */
	ret = objstore_open_tiered(dir, *os, &t);
	if (ret == -ENOMEM)
		return ret;
	if (ret) {
		log_info("shared tier: %s: no copy of snapshot %s in %s (%s): "
			 "reading %s alone",
			 name, snap, dir, strerror(-ret), objstore_url(*os));
		return 0;
	}
	log_info("shared tier: %s: reading snapshot %s from %s first", name,
		 snap, dir);
	*os = t;
	return 1;
}
