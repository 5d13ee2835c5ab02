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
#include "sharedtier_i.h"
#include "util/strutil.h"

#define SHAREDTIER_CHUNK (8u << 20) /* bytes fetched per request */
#define SHAREDTIER_POLL_MS 200 /* between looks at another node's lease */

struct sharedtier_lease {
	int fd; /* -1: not held */
	dev_t dev;
	ino_t ino;
	char path[PATH_MAX];
	char holder[200];
	int64_t expires_ms; /* real time */
	unsigned ttl_ms;
};

int sharedtier_join(char *buf, size_t len, const char *a, const char *b)
{
	int n = snprintf(buf, len, "%s/%s", a, b);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ---- the manifest, from the catalog ---- */

static int sharedtier_walk_cb(void *arg, const char *name,
			      const struct catalog_entry *e)
{
	struct sharedtier_list *l = arg;
	size_t len = strlen(l->dir) + strlen(name) + 2;
	char *path = malloc(len);

	if (!path)
		return -ENOMEM;
	snprintf(path, len, "%s%s%s", l->dir, *l->dir ? "/" : "", name);
	l->seen++;
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

static int sharedtier_cmp(const void *a, const void *b)
{
	return strcmp(((const struct sharedtier_file *)a)->key,
		      ((const struct sharedtier_file *)b)->key);
}

static int sharedtier_cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Read directory dir (taken) of the manifest into l: its files, its
 * directories to read next, or dir into l->empty when it holds nothing. */
static int sharedtier_load_dir(struct catalog *cat, const char *name,
			       struct sharedtier_list *l, char *dir)
{
	int ret;

	l->dir = dir;
	l->seen = 0;
	ret = catalog_readdir(cat, name, dir, NULL, sharedtier_walk_cb, l);
	if (ret || l->seen || !*dir)
		goto out;
	if (GROW_ONE(l->empty, l->nempty, l->ecap, 16)) {
		ret = -ENOMEM;
		goto out;
	}
	l->empty[l->nempty++] = dir;
	return 0;
out:
	free(dir);
	return ret;
}

/* The snapshot id: a hash over the files' keys, sizes and ETags, and the
 * empty directories (none: the id of a listing of files alone, as before
 * directories were kept). */
static int sharedtier_snapshot_id(const struct sharedtier_list *l,
				  char snapshot[SHAREDTIER_SNAPSHOT_LEN + 1])
{
	unsigned char md[SHA256_LEN];
	struct sha256 h = { 0 };
	char num[32];
	int ret;

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
	/* "DIR/": no file's key ends in '/' */
	for (size_t i = 0; i < l->nempty; i++) {
		sha256_update(&h, l->empty[i], strlen(l->empty[i]));
		sha256_update(&h, "/\n", 2);
	}
	ret = sha256_final(&h, md);
	if (!ret)
		strutil_hex(md, SHAREDTIER_SNAPSHOT_LEN / 2, snapshot);
out:
	sha256_release(&h);
	return ret;
}

void sharedtier_list_free(struct sharedtier_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i].key);
	while (l->ndirs)
		free(l->dirs[--l->ndirs]);
	while (l->nempty)
		free(l->empty[--l->nempty]);
	free(l->v);
	free(l->dirs);
	free(l->empty);
	memset(l, 0, sizeof(*l));
}

/* Every file of the current manifest, sorted by key, and the empty
 * directories, sorted; the snapshot id. */
int sharedtier_load(struct catalog *cat, const char *name,
		    struct sharedtier_list *l,
		    char snapshot[SHAREDTIER_SNAPSHOT_LEN + 1])
{
	char *dir = strdup("");
	int ret = 0;

	if (!dir)
		return -ENOMEM;
	while (dir) {
		ret = sharedtier_load_dir(cat, name, l, dir);
		dir = NULL;
		if (ret)
			return ret;
		if (l->ndirs)
			dir = l->dirs[--l->ndirs];
	}
	if (l->n) /* qsort's base: never NULL */
		qsort(l->v, l->n, sizeof(l->v[0]), sharedtier_cmp);
	if (l->nempty)
		qsort(l->empty, l->nempty, sizeof(l->empty[0]),
		      sharedtier_cmp_str);
	return sharedtier_snapshot_id(l, snapshot);
}

/* The tier's base directory of ds: its own setting or ROOT/NAME. */
int sharedtier_base(const struct dstage_config *cfg,
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
	struct sharedtier_list l = { 0 };
	char base[PATH_MAX];
	int ret;

	ret = catalog_dataset_get(cat, name, &ds);
	if (ret)
		return ret;
	ret = sharedtier_base(cfg, &ds, base, sizeof(base));
	if (!ret)
		ret = sharedtier_load(cat, name, &l, snapshot);
	if (!ret)
		ret = sharedtier_join(dir, len, base, snapshot);
	sharedtier_list_free(&l);
	catalog_dataset_release(&ds);
	return ret;
}

/* ---- directories and files ---- */

/* mkdir every component of path after its first skip bytes (which exist). */
static int sharedtier_mkdirs(char *path, size_t skip)
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

static int sharedtier_fsync_dir_of(const char *path)
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
static int sharedtier_tmpname(const char *final, char *buf, size_t len)
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

static int sharedtier_hash_file(const char *path, unsigned char md[32])
{
	int fd = sharedtier_open_file(path);
	int ret;

	if (fd < 0)
		return fd;
	ret = sha256_fd(fd, md);
	close(fd);
	return ret;
}

/* 1 when dir/MANIFEST is there and names snapshot; 0 when absent. */
static int sharedtier_manifest_done(const char *dir, const char *snapshot)
{
	char path[PATH_MAX], want[128], got[128] = "";
	FILE *f;
	int fd;

	if (sharedtier_join(path, sizeof(path), dir, SHAREDTIER_MANIFEST))
		return -ENAMETOOLONG;
	fd = sharedtier_open_file(path);
	if (fd < 0)
		return fd == -ENOENT ? 0 : fd;
	f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return -ENOMEM;
	}
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

static int sharedtier_lease_write(struct sharedtier_lease *l)
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

/* Read a lease file: its holder and expiry, and the whole text. One
 * without an expiry (empty, cut short, unreadable) expires ttl_ms after it
 * was last written. */
static int sharedtier_lease_read(const char *path, unsigned ttl_ms, char *text,
				 size_t len, char *holder, size_t hlen,
				 int64_t *expires_ms)
{
	int fd = sharedtier_open_file(path);
	const char *h, *e;
	struct stat st;
	ssize_t n;

	if (fd < 0)
		return fd;
	n = fstat(fd, &st) ? -1 : read(fd, text, len - 1);
	close(fd);
	if (n < 0)
		return -errno;
	text[n] = '\0';
	h = strstr(text, "holder ");
	e = strstr(text, "expires_ms ");
	/* a lease being written (empty, or cut short) expires a lease period
	 * after its last write: its writer may have died right there */
	*expires_ms = e ? strtoll(e + 11, NULL, 10)
			: (int64_t)st.st_mtim.tv_sec * 1000 +
				      st.st_mtim.tv_nsec / 1000000 + ttl_ms;
	snprintf(holder, hlen, "%.*s", h ? (int)strcspn(h + 7, "\n") : 7,
		 h ? h + 7 : "unknown");
	return 0;
}

/* Create the lease; -EEXIST when another holds it. */
static int sharedtier_lease_try(struct sharedtier_lease *l)
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
	ret = sharedtier_lease_write(l);
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
static int sharedtier_lease_renew(struct sharedtier_lease *l)
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
	return sharedtier_lease_write(l);
}

static void sharedtier_lease_release(struct sharedtier_lease *l)
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
static int sharedtier_lease_take_over(struct sharedtier_lease *l,
				      const char *seen, const char *holder,
				      int64_t expires_ms)
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
	if (sharedtier_lease_read(aside, l->ttl_ms, text, sizeof(text), h,
				  sizeof(h), &e) ||
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

struct sharedtier_pub {
	struct objstore *os;
	struct sharedtier_lease lease;
	struct sharedtier_result *res;
	const char *name;
	char data[PATH_MAX]; /* DIR/data */
	unsigned char *buf; /* SHAREDTIER_CHUNK bytes */
};

static int sharedtier_write_all(int fd, const unsigned char *p, size_t n)
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
static int sharedtier_fetch(struct sharedtier_pub *p, struct sharedtier_file *f,
			    const char *final)
{
	char tmp[PATH_MAX], got_hex[65], want_hex[65];
	struct sha256 h = { 0 };
	uint64_t off = 0;
	int fd = -1, ret;

	ret = sharedtier_tmpname(final, tmp, sizeof(tmp));
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
		size_t len = f->size - off < SHAREDTIER_CHUNK
				     ? f->size - off
				     : SHAREDTIER_CHUNK;
		size_t got = 0;

		ret = objstore_get(p->os, f->key, off, len,
				   *f->etag ? f->etag : NULL, p->buf, &got);
		if (!ret && got == 0)
			ret = -EIO;
		if (!ret)
			ret = sharedtier_write_all(fd, p->buf, got);
		if (!ret)
			ret = sharedtier_lease_renew(&p->lease);
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
	ret = sharedtier_lease_renew(&p->lease);
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
	return sharedtier_fsync_dir_of(final);
err:
	close(fd);
	unlink(tmp);
out_h:
	sha256_release(&h);
	return ret ? ret : -ENOMEM;
}

static int sharedtier_one(struct sharedtier_pub *p, struct sharedtier_file *f)
{
	char final[PATH_MAX];
	struct stat st;
	int ret;

	ret = sharedtier_join(final, sizeof(final), p->data, f->key);
	if (ret)
		return ret;
	if (strchr(f->key, '/')) {
		*strrchr(final, '/') = '\0';
		ret = sharedtier_mkdirs(final, strlen(p->data));
		final[strlen(final)] = '/';
		if (ret)
			return ret;
	}
	/* a file found in place is kept only when it matches the reference
	 * hash: one the sums key does not list is fetched again */
	if (f->has_expected && !lstat(final, &st) && S_ISREG(st.st_mode) &&
	    (uint64_t)st.st_size == f->size) {
		/* published by an earlier holder: check it again */
		ret = sharedtier_hash_file(final, f->actual);
		if (!ret && !memcmp(f->actual, f->expected, 32)) {
			p->res->kept++;
			return 0;
		}
		log_warn("shared tier: %s: %s is damaged (%s): fetching it "
			 "again",
			 p->name, final, ret ? strerror(-ret) : "SHA-256");
	}
	return sharedtier_fetch(p, f, final);
}

/* The snapshot's empty directories, made under data/, each directory from
 * them up to data/ synced (the files' renames sync only their own). */
static int sharedtier_make_empty(struct sharedtier_pub *p,
				 const struct sharedtier_list *l)
{
	size_t dlen = strlen(p->data);
	char path[PATH_MAX];
	int ret = 0;

	for (size_t i = 0; !ret && i < l->nempty; i++) {
		ret = sharedtier_join(path, sizeof(path), p->data, l->empty[i]);
		if (!ret)
			ret = sharedtier_mkdirs(path, dlen);
		while (!ret && strlen(path) > dlen) {
			ret = sharedtier_fsync_dir_of(path);
			*strrchr(path, '/') = '\0';
		}
		if (ret)
			log_error("shared tier: %s: making the empty directory "
				  "%s under %s: %s",
				  p->name, l->empty[i], p->data,
				  strerror(-ret));
	}
	return ret;
}

static int sharedtier_write_manifest(struct sharedtier_pub *p, const char *dir,
				     const struct sharedtier_list *l)
{
	char path[PATH_MAX], tmp[PATH_MAX], hex[65];
	FILE *f = NULL;
	int fd = -1, ret;

	ret = sharedtier_join(path, sizeof(path), dir, SHAREDTIER_MANIFEST);
	if (!ret)
		ret = sharedtier_tmpname(path, tmp, sizeof(tmp));
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
	ret = sharedtier_lease_renew(&p->lease);
	if (ret)
		goto err;
	if (rename(tmp, path)) {
		ret = -errno;
		goto err;
	}
	fclose(f);
	return sharedtier_fsync_dir_of(path);
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
static int sharedtier_acquire(struct sharedtier_pub *p, const char *dir,
			      unsigned wait_ms)
{
	int64_t deadline = timeutil_mono_ms() + wait_ms, exp;
	char text[512], holder[200];
	struct timespec ts = { 0, SHAREDTIER_POLL_MS * 1000000L };
	int ret;

	for (;;) {
		ret = sharedtier_manifest_done(dir, p->res->snapshot);
		if (ret)
			return ret;
		ret = sharedtier_lease_try(&p->lease);
		if (ret != -EEXIST)
			break;
		ret = sharedtier_lease_read(p->lease.path, p->lease.ttl_ms,
					    text, sizeof(text), holder,
					    sizeof(holder), &exp);
		if (ret == -ENOENT)
			continue;
		if (ret)
			return ret;
		if (exp < timeutil_real_ms()) {
			ret = sharedtier_lease_take_over(&p->lease, text,
							 holder, exp);
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
	ret = sharedtier_manifest_done(dir, p->res->snapshot);
	if (ret)
		sharedtier_lease_release(&p->lease);
	return ret;
}

int sharedtier_publish(struct catalog *cat, const struct dstage_config *cfg,
		       const char *name, unsigned wait_ms,
		       struct sharedtier_result *res)
{
	struct sharedtier_pub p = { .res = res, .name = name, .lease.fd = -1 };
	struct catalog_dataset ds;
	struct sharedtier_list l = { 0 };
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
	ret = sharedtier_base(cfg, &ds, base, sizeof(base));
	if (ret == -ENOENT)
		log_error("shared tier: dataset %s has none: set one with "
			  "stager add --shared-tier DIR or "
			  "sources.shared_tier_root",
			  name);
	if (!ret)
		ret = sharedtier_load(cat, name, &l, res->snapshot);
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
	rootlen = sharedtier_rootlen(&ds, base);
	base[rootlen] = '\0';
	if (stat(base, &st) || !S_ISDIR(st.st_mode)) {
		ret = -ENOENT;
		log_error("shared tier: %s: %s is not a directory (is the "
			  "parallel file system mounted?)",
			  name, base);
		goto out;
	}
	/* every node trusts what is published there: only the service
	 * uid may write the tier (docs/security.md) */
	ret = sharedtier_trusted(base);
	if (ret)
		goto out;
	if (!(ds.shared_tier && *ds.shared_tier))
		base[rootlen] = '/';
	ret = sharedtier_join(res->dir, sizeof(res->dir), base, res->snapshot);
	if (!ret)
		ret = sharedtier_join(p.data, sizeof(p.data), res->dir,
				      SHAREDTIER_DATA);
	if (!ret)
		ret = sharedtier_join(p.lease.path, sizeof(p.lease.path),
				      res->dir, SHAREDTIER_LEASE);
	if (!ret)
		ret = sharedtier_mkdirs(p.data, rootlen);
	if (!ret) {
		base[rootlen] = '\0';
		ret = sharedtier_trusted_tree(base, res->dir);
	}
	if (ret)
		goto out;
	gethostname(host, sizeof(host) - 1);
	snprintf(p.lease.holder, sizeof(p.lease.holder), "%s pid %d", host,
		 (int)getpid());
	p.lease.ttl_ms = cfg->sources_shared_tier_lease_ms;
	ret = sharedtier_acquire(&p, res->dir, wait_ms);
	if (ret == 1) {
		res->already = true;
		ret = 0;
		goto out;
	}
	if (ret)
		goto out;
	p.buf = malloc(SHAREDTIER_CHUNK);
	ret = p.buf ? objstore_open(ds.source, cfg, &p.os) : -ENOMEM;
	for (size_t i = 0; !ret && i < l.n; i++)
		ret = sharedtier_one(&p, &l.v[i]);
	if (!ret)
		ret = sharedtier_make_empty(&p, &l);
	if (!ret)
		ret = sharedtier_write_manifest(&p, res->dir, &l);
	if (!ret)
		log_info(
			"shared tier: %s: snapshot %s published in %s: %" PRIu64
			" files fetched, %" PRIu64 " kept",
			name, res->snapshot, res->dir, res->copied, res->kept);
out:
	sharedtier_lease_release(&p.lease);
	objstore_free(p.os);
	free(p.buf);
	sharedtier_list_free(&l);
	catalog_dataset_release(&ds);
	return ret;
}
