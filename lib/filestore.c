// SPDX-License-Identifier: MIT
/*
 * filestore: the file:///dir/ backend, an object store on a POSIX directory
 * (a parallel filesystem, NFS, or a local directory).
 *
 * Keys map to paths under the root. Objects are regular files; directories
 * exist only as key prefixes (listing never reports them, deleting the last
 * object of a directory removes the directory). Semantics match s3store:
 *
 *   list   all regular files under the root whose key starts with the prefix,
 *          in byte order of the key (a directory sorts as "name/", so the
 *          walk yields keys in exactly the order S3 would).
 *   ETag   "<size>-<mtime ns>-<inode>" in hex, quoted: it changes whenever the
 *          file is replaced or rewritten.
 *   get    pread; If-Match is compared with the ETag of the opened file, so a
 *          file replaced between check and read cannot mix versions.
 *   put    temporary file ".dstage-tmp.*" in the target directory, fsync,
 *          rename over the key, fsync of the directory: whole or not at all.
 *
 * Symbolic links to regular files are followed; links to directories are not
 * (no loops). Temporary files of interrupted puts are never listed.
 *
 * The handle is immutable after open; every call is independent and
 * thread-safe.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/config.h"
#include "dstage/log.h"
#include "objstore_backend.h"

#define FILESTORE_TMP_PREFIX ".dstage-tmp."

struct filestore {
	struct objstore base;
	char *root; /* absolute, no trailing slash ("" for "/") */
	int root_fd; /* O_PATH directory of root */
};

static struct filestore *fs_of(struct objstore *os)
{
	return (struct filestore *)os;
}

/*
 * A key is safe as a path when it has no empty, "." or ".." segment, does not
 * start with "/", and no segment is longer than NAME_MAX. This is the only
 * thing that keeps a malicious key inside the root.
 */
static int filestore_check_key(const char *key, bool allow_trailing_slash)
{
	const char *seg = key;

	if (!*key || *key == '/')
		return -EINVAL;
	for (;;) {
		const char *end = strchr(seg, '/');
		size_t len = end ? (size_t)(end - seg) : strlen(seg);

		if (len == 0)
			return (!end && allow_trailing_slash) ? 0 : -EINVAL;
		if (len > NAME_MAX)
			return -ENAMETOOLONG;
		if ((len == 1 && seg[0] == '.') ||
		    (len == 2 && seg[0] == '.' && seg[1] == '.'))
			return -EINVAL;
		if (len >= sizeof(FILESTORE_TMP_PREFIX) - 1 &&
		    !strncmp(seg, FILESTORE_TMP_PREFIX,
			     sizeof(FILESTORE_TMP_PREFIX) - 1))
			return -EINVAL;
		if (!end)
			return 0;
		seg = end + 1;
	}
}

static int filestore_key_ok(struct filestore *fs, const char *key)
{
	int ret = filestore_check_key(key, false);

	if (ret)
		log_error("%s: key '%s' cannot be a path under %s: %s",
			  fs->base.url, key, fs->root[0] ? fs->root : "/",
			  ret == -ENAMETOOLONG ? "a segment is too long"
					       : "empty, '.' or '..' segment");
	return ret;
}

static void filestore_etag(const struct stat *st, char *out, size_t len)
{
	snprintf(out, len, "\"%llx-%llx-%llx\"",
		 (unsigned long long)st->st_size,
		 (unsigned long long)st->st_mtim.tv_sec * 1000000000ULL +
			 (unsigned long long)st->st_mtim.tv_nsec,
		 (unsigned long long)st->st_ino);
}

static void filestore_fill_info(const struct stat *st,
				struct objstore_info *info)
{
	info->size = (uint64_t)st->st_size;
	info->mtime = st->st_mtim.tv_sec;
	filestore_etag(st, info->etag, sizeof(info->etag));
}

/* ---- list ---- */

struct fs_dirent {
	char *name;
	bool is_dir;
};

/* The i-th byte of an entry's key form: a directory ends in "/". -1 past
 * the end, which sorts first. */
static int fs_dirent_byte(const struct fs_dirent *e, size_t i, size_t len)
{
	if (i < len)
		return (unsigned char)e->name[i];
	if (i == len && e->is_dir)
		return '/';
	return -1;
}

/* Byte order of keys, so that the walk lists in the order S3 does. */
static int fs_dirent_cmp(const void *a, const void *b)
{
	const struct fs_dirent *x = a, *y = b;
	size_t lx = strlen(x->name), ly = strlen(y->name);

	for (size_t i = 0;; i++) {
		int c1 = fs_dirent_byte(x, i, lx);
		int c2 = fs_dirent_byte(y, i, ly);

		if (c1 != c2)
			return c1 < c2 ? -1 : 1;
		if (c1 < 0)
			return 0;
	}
}

struct fs_walk {
	struct filestore *fs;
	const char *prefix;
	size_t prefix_len;
	objstore_list_cb cb;
	void *arg;
	char key[PATH_MAX];
	unsigned depth;
};

static int fs_walk_dir(struct fs_walk *w, size_t keylen);

/* Could a key starting with key[0..keylen) match the prefix? */
static bool fs_may_match(const struct fs_walk *w, size_t keylen)
{
	size_t n = keylen < w->prefix_len ? keylen : w->prefix_len;

	return memcmp(w->key, w->prefix, n) == 0;
}

static int fs_walk_dir(struct fs_walk *w, size_t keylen)
{
	struct fs_dirent *ents = NULL;
	size_t n = 0, cap = 0;
	DIR *d = NULL;
	int dfd, ret = 0;
	struct dirent *de;

	if (++w->depth > 256) {
		log_warn("%s: directory nesting deeper than 256 under '%.*s', "
			 "skipped",
			 w->fs->base.url, (int)keylen, w->key);
		goto out;
	}
	dfd = openat(w->fs->root_fd, keylen ? w->key : ".",
		     O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (dfd < 0) {
		ret = -errno;
		log_error("%s: cannot open directory '%.*s': %s",
			  w->fs->base.url, (int)keylen, w->key,
			  strerror(errno));
		goto out;
	}
	d = fdopendir(dfd);
	if (!d) {
		ret = -errno;
		close(dfd);
		goto out;
	}
	while ((errno = 0, de = readdir(d))) {
		struct stat st;
		bool is_dir;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (!strncmp(de->d_name, FILESTORE_TMP_PREFIX,
			     sizeof(FILESTORE_TMP_PREFIX) - 1))
			continue;
		if (de->d_type == DT_DIR) {
			is_dir = true;
		} else if (de->d_type == DT_REG) {
			is_dir = false;
		} else {
			/* Unknown type or a link: ask, following file links
			 * only. */
			if (fstatat(dirfd(d), de->d_name, &st,
				    AT_SYMLINK_NOFOLLOW))
				continue;
			if (S_ISLNK(st.st_mode)) {
				if (fstatat(dirfd(d), de->d_name, &st, 0) ||
				    !S_ISREG(st.st_mode))
					continue;
			} else if (!S_ISREG(st.st_mode) &&
				   !S_ISDIR(st.st_mode)) {
				continue;
			}
			is_dir = S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode);
		}
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 64;
			struct fs_dirent *ne =
				realloc(ents, ncap * sizeof(*ents));

			if (!ne) {
				ret = -ENOMEM;
				goto out;
			}
			ents = ne;
			cap = ncap;
		}
		ents[n].name = strdup(de->d_name);
		if (!ents[n].name) {
			ret = -ENOMEM;
			goto out;
		}
		ents[n++].is_dir = is_dir;
	}
	if (errno) {
		ret = -errno;
		goto out;
	}
	if (n)
		qsort(ents, n, sizeof(*ents), fs_dirent_cmp);
	for (size_t i = 0; i < n && !ret; i++) {
		size_t nl = strlen(ents[i].name);
		size_t klen = keylen + nl;

		if (klen + 2 > sizeof(w->key)) {
			log_warn("%s: path under '%.*s' too long, skipped",
				 w->fs->base.url, (int)keylen, w->key);
			continue;
		}
		memcpy(w->key + keylen, ents[i].name, nl + 1);
		if (ents[i].is_dir) {
			w->key[klen] = '/';
			w->key[klen + 1] = '\0';
			if (fs_may_match(w, klen + 1))
				ret = fs_walk_dir(w, klen + 1);
			continue;
		}
		if (klen < w->prefix_len ||
		    memcmp(w->key, w->prefix, w->prefix_len))
			continue;
		struct stat st;
		struct objstore_info oi = { .key = w->key };

		if (fstatat(w->fs->root_fd, w->key, &st, 0))
			continue; /* vanished while listing */
		filestore_fill_info(&st, &oi);
		ret = w->cb(w->arg, &oi);
	}
out:
	for (size_t i = 0; i < n; i++)
		free(ents[i].name);
	free(ents);
	if (d)
		closedir(d);
	w->key[keylen] = '\0';
	w->depth--;
	return ret;
}

static int filestore_list(struct objstore *os, const char *prefix,
			  objstore_list_cb cb, void *arg)
{
	struct fs_walk *w = calloc(1, sizeof(*w));
	int ret;

	if (!w)
		return -ENOMEM;
	w->fs = fs_of(os);
	w->prefix = prefix;
	w->prefix_len = strlen(prefix);
	w->cb = cb;
	w->arg = arg;
	objstore_count(&os->n_requests, 1);
	ret = fs_walk_dir(w, 0);
	free(w);
	return ret;
}

/* ---- head, get ---- */

static int filestore_head(struct objstore *os, const char *key,
			  struct objstore_info *info)
{
	struct filestore *fs = fs_of(os);
	struct stat st;
	int ret = filestore_key_ok(fs, key);

	if (ret)
		return ret;
	objstore_count(&os->n_requests, 1);
	if (fstatat(fs->root_fd, key, &st, 0))
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -ENOENT;
	filestore_fill_info(&st, info);
	return 0;
}

static int filestore_get_one(struct filestore *fs, struct objstore_get *rq)
{
	char etag[OBJSTORE_ETAG_MAX];
	struct stat st;
	size_t done = 0;
	int fd, ret = filestore_key_ok(fs, rq->key);

	if (ret)
		return ret;
	objstore_count(&fs->base.n_requests, 1);
	fd = openat(fs->root_fd, rq->key, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = -ENOENT;
		goto out;
	}
	if (rq->if_match) {
		filestore_etag(&st, etag, sizeof(etag));
		if (strcmp(etag, rq->if_match)) {
			log_error("%s: '%s' changed under the snapshot "
				  "(ETag %s, expected %s)",
				  fs->base.url, rq->key, etag, rq->if_match);
			ret = -ESTALE;
			goto out;
		}
	}
	if (rq->off >= (uint64_t)st.st_size && st.st_size > 0) {
		ret = -ERANGE;
		goto out;
	}
	while (done < rq->len) {
		ssize_t r = pread(fd, (char *)rq->buf + done, rq->len - done,
				  (off_t)(rq->off + done));

		if (r < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			log_error("%s: read of '%s' at %llu failed: %s",
				  fs->base.url, rq->key,
				  (unsigned long long)(rq->off + done),
				  strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		if (rq->on_data)
			rq->on_data(rq->on_data_arg, done,
				    (char *)rq->buf + done, (size_t)r);
		done += (size_t)r;
	}
	rq->got = done;
	objstore_count(&fs->base.n_bytes_in, done);
out:
	close(fd);
	return ret;
}

struct fs_batch {
	struct filestore *fs;
	struct objstore_get *reqs;
	size_t n;
	_Atomic size_t next;
};

static void *fs_batch_worker(void *arg)
{
	struct fs_batch *b = arg;
	size_t i;

	while ((i = atomic_fetch_add(&b->next, 1)) < b->n)
		b->reqs[i].result = filestore_get_one(b->fs, &b->reqs[i]);
	return NULL;
}

/* Ranged reads in parallel, s3.max_inflight threads at most: on a parallel
 * filesystem latency, not bandwidth, bounds a single reader. */
static int filestore_get_many(struct objstore *os, struct objstore_get *reqs,
			      size_t n)
{
	struct fs_batch b = { .fs = fs_of(os), .reqs = reqs, .n = n };
	size_t nthreads = os->cfg->s3_max_inflight;
	pthread_t tids[64];
	size_t started = 0;

	if (nthreads > n)
		nthreads = n;
	if (nthreads > 64)
		nthreads = 64;
	for (size_t i = 1; i < nthreads; i++) {
		if (pthread_create(&tids[started], NULL, fs_batch_worker, &b))
			break;
		started++;
	}
	fs_batch_worker(&b);
	for (size_t i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	for (size_t i = 0; i < n; i++)
		if (reqs[i].result)
			return reqs[i].result;
	return 0;
}

/* ---- put, delete, copy ---- */

/* Create the parent directories of key. */
static int filestore_mkparents(struct filestore *fs, const char *key)
{
	char path[PATH_MAX];
	size_t len = strlen(key);

	if (len >= sizeof(path))
		return -ENAMETOOLONG;
	memcpy(path, key, len + 1);
	for (char *p = strchr(path, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		if (mkdirat(fs->root_fd, path, 0755) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

static int filestore_fsync_parent(struct filestore *fs, const char *key)
{
	char path[PATH_MAX];
	const char *slash = strrchr(key, '/');
	int dfd, ret = 0;

	if (slash) {
		snprintf(path, sizeof(path), "%.*s", (int)(slash - key), key);
		dfd = openat(fs->root_fd, path, O_RDONLY | O_DIRECTORY);
	} else {
		dfd = openat(fs->root_fd, ".", O_RDONLY | O_DIRECTORY);
	}
	if (dfd < 0)
		return -errno;
	if (fsync(dfd))
		ret = -errno;
	close(dfd);
	return ret;
}

/*
 * Write an object through a temporary file. Exactly one of src_fd (read from
 * offset 0 with pread) and buf is used. size bytes are written.
 */
static int filestore_put(struct filestore *fs, const char *key, int src_fd,
			 const void *buf, uint64_t size)
{
	char tmp[PATH_MAX] = "";
	const char *slash = strrchr(key, '/');
	uint64_t done = 0, rnd = 0;
	char *chunk = NULL;
	int fd = -1, ret;

	ret = filestore_key_ok(fs, key);
	if (ret)
		return ret;
	objstore_count(&fs->base.n_requests, 1);
	ret = filestore_mkparents(fs, key);
	if (ret)
		goto out;
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&rnd;
	if (snprintf(tmp, sizeof(tmp), "%.*s%s%016llx",
		     slash ? (int)(slash - key + 1) : 0, key,
		     FILESTORE_TMP_PREFIX,
		     (unsigned long long)rnd) >= (int)sizeof(tmp)) {
		ret = -ENAMETOOLONG;
		goto out;
	}
	fd = openat(fs->root_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
		    0644);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	if (buf) {
		while (done < size) {
			ssize_t w = write(fd, (const char *)buf + done,
					  size - done);
			if (w < 0) {
				if (errno == EINTR)
					continue;
				ret = -errno;
				goto out;
			}
			done += (uint64_t)w;
		}
	} else {
		chunk = malloc(1 << 20);
		if (!chunk) {
			ret = -ENOMEM;
			goto out;
		}
		while (done < size) {
			size_t want = size - done > (1 << 20) ? (1 << 20)
							      : size - done;
			ssize_t r = pread(src_fd, chunk, want, (off_t)done);

			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				ret = r < 0 ? -errno : -EIO;
				goto out;
			}
			for (ssize_t off = 0; off < r;) {
				ssize_t w = write(fd, chunk + off,
						  (size_t)(r - off));
				if (w < 0) {
					if (errno == EINTR)
						continue;
					ret = -errno;
					goto out;
				}
				off += w;
			}
			done += (uint64_t)r;
		}
	}
	if (fsync(fd)) {
		ret = -errno;
		goto out;
	}
	if (close(fd)) {
		fd = -1;
		ret = -errno;
		goto out;
	}
	fd = -1;
	if (renameat(fs->root_fd, tmp, fs->root_fd, key)) {
		ret = -errno;
		goto out;
	}
	tmp[0] = '\0';
	ret = filestore_fsync_parent(fs, key);
	objstore_count(&fs->base.n_bytes_out, size);
out:
	if (fd >= 0)
		close(fd);
	if (ret && tmp[0])
		unlinkat(fs->root_fd, tmp, 0);
	if (ret)
		log_error("%s: cannot store '%s': %s", fs->base.url, key,
			  strerror(-ret));
	free(chunk);
	return ret;
}

static int filestore_put_fd(struct objstore *os, const char *key, int fd,
			    uint64_t size)
{
	return filestore_put(fs_of(os), key, fd, NULL, size);
}

static int filestore_put_buf(struct objstore *os, const char *key,
			     const void *buf, size_t len)
{
	static const char empty[1];

	return filestore_put(fs_of(os), key, -1, buf ? buf : empty, len);
}

static int filestore_delete(struct objstore *os, const char *key)
{
	struct filestore *fs = fs_of(os);
	char path[PATH_MAX];
	char *slash;
	int ret = filestore_key_ok(fs, key);

	if (ret)
		return ret;
	objstore_count(&os->n_requests, 1);
	if (unlinkat(fs->root_fd, key, 0) && errno != ENOENT)
		return -errno;
	/* Directories are only prefixes: drop the ones now empty. */
	snprintf(path, sizeof(path), "%s", key);
	while ((slash = strrchr(path, '/'))) {
		*slash = '\0';
		if (unlinkat(fs->root_fd, path, AT_REMOVEDIR))
			break;
	}
	return 0;
}

static int filestore_copy(struct objstore *os, const char *src, const char *dst)
{
	struct filestore *fs = fs_of(os);
	struct stat st;
	int fd, ret = filestore_key_ok(fs, src);

	if (ret)
		return ret;
	fd = openat(fs->root_fd, src, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st))
		ret = -errno;
	else
		ret = filestore_put(fs, dst, fd, NULL, (uint64_t)st.st_size);
	close(fd);
	return ret;
}

static void filestore_free(struct objstore *os)
{
	struct filestore *fs = fs_of(os);

	if (!fs)
		return;
	if (fs->root_fd >= 0)
		close(fs->root_fd);
	free(fs->root);
	free(fs);
}

static const struct objstore_ops filestore_ops = {
	.list = filestore_list,
	.head = filestore_head,
	.get_many = filestore_get_many,
	.put_fd = filestore_put_fd,
	.put_buf = filestore_put_buf,
	.del = filestore_delete,
	.copy = filestore_copy,
	.free = filestore_free,
};

int filestore_open(const char *url, const char *rest,
		   const struct dstage_config *cfg, struct objstore **out)
{
	struct filestore *fs;
	size_t len;
	int ret;

	(void)cfg;
	if (rest[0] != '/') {
		log_error("bad URL '%s': expected file:///ABSOLUTE/DIR/", url);
		return -EINVAL;
	}
	fs = calloc(1, sizeof(*fs));
	if (!fs)
		return -ENOMEM;
	fs->root_fd = -1;
	fs->base.ops = &filestore_ops;
	fs->root = strdup(rest);
	if (!fs->root) {
		ret = -ENOMEM;
		goto err;
	}
	len = strlen(fs->root);
	while (len > 0 && fs->root[len - 1] == '/')
		fs->root[--len] = '\0';
	fs->root_fd =
		open(len ? fs->root : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fs->root_fd < 0) {
		ret = -errno;
		log_error("%s: cannot open directory %s: %s", url,
			  len ? fs->root : "/", strerror(errno));
		goto err;
	}
	*out = &fs->base;
	return 0;
err:
	filestore_free(&fs->base);
	return ret;
}
