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
 *   put    temporary file ".dstage-tmp.<host>.<pid>.<random>" in the target
 *          directory, fsync, rename over the key, fsync of the directory:
 *          whole or not at all. Temporaries a dead writer left are removed
 *          by the first write of a handle, then every so often, once
 *          older than store.tmp_max_age (filestore_sweep.c).
 *
 * Confinement: the source tree is not trusted (any user who can write in it
 * may plant links, FIFOs or devices). Every path is resolved beneath the
 * root: with openat2(RESOLVE_BENEATH) where the kernel has it, else one
 * component at a time with O_NOFOLLOW. Symbolic links are skipped at listing
 * and refused at reads (-ELOOP), each with a log line naming the key, unless
 * sources.follow_symlinks = inside: then a link is followed when its target
 * stays inside the root (a link leading out is -EXDEV). Links to directories
 * are never followed (no loops). Only regular files are opened: opens use
 * O_NONBLOCK (a FIFO cannot hang them) and fstat decides; anything else is
 * -EINVAL (a directory -ENOENT), logged with its key. Writes (put, delete)
 * never pass through a symlink at all. Temporary files of interrupted puts
 * are never listed (objstore_upload_list lists only them). The resolution
 * itself is in filestore_path.c.
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
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/metrics.h"
#include "filestore_i.h"
#include "filestore_io.h"
#include "util/fdutil.h"

static struct filestore *fs_of(struct objstore *os)
{
	return (struct filestore *)os;
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

enum fs_dirent_type { FS_DT_REG, FS_DT_DIR, FS_DT_LNK, FS_DT_OTHER };

struct fs_dirent {
	char *name;
	enum fs_dirent_type type;
	mode_t mode; /* FS_DT_OTHER: what it is, for the message */
};

/* The i-th byte of an entry's key form: a directory ends in "/". -1 past
 * the end, which sorts first. */
static int fs_dirent_byte(const struct fs_dirent *e, size_t i, size_t len)
{
	if (i < len)
		return (unsigned char)e->name[i];
	if (i == len && e->type == FS_DT_DIR)
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
	/* objstore_upload_list: only temporary files, through ucb */
	objstore_upload_list_cb ucb;
	void *arg;
	char key[PATH_MAX];
	unsigned depth;
};

/* Could a key starting with key[0..keylen) match the prefix? */
static bool fs_may_match(const struct fs_walk *w, size_t keylen)
{
	size_t n = keylen < w->prefix_len ? keylen : w->prefix_len;

	return memcmp(w->key, w->prefix, n) == 0;
}

/* Read the entries of directory d, unsorted, classified without following
 * anything. */
static int fs_read_dir(DIR *d, bool tmp, struct fs_dirent **out, size_t *nout)
{
	struct fs_dirent *ents = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int ret = 0;

	while ((errno = 0, de = readdir(d))) {
		enum fs_dirent_type type = FS_DT_OTHER;
		mode_t mode = 0;
		struct stat st;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (!tmp && !strncmp(de->d_name, FILESTORE_TMP_PREFIX,
				     sizeof(FILESTORE_TMP_PREFIX) - 1))
			continue;
		if (de->d_type == DT_UNKNOWN) {
			if (fstatat(dirfd(d), de->d_name, &st,
				    AT_SYMLINK_NOFOLLOW))
				continue; /* vanished */
			mode = st.st_mode;
		} else {
			mode = (mode_t)DTTOIF(de->d_type);
		}
		if (S_ISREG(mode))
			type = FS_DT_REG;
		else if (S_ISDIR(mode))
			type = FS_DT_DIR;
		else if (S_ISLNK(mode))
			type = FS_DT_LNK;
		if (GROW_ONE(ents, n, cap, 64)) {
			ret = -ENOMEM;
			goto out;
		}
		ents[n].name = strdup(de->d_name);
		if (!ents[n].name) {
			ret = -ENOMEM;
			goto out;
		}
		ents[n].type = type;
		ents[n++].mode = mode;
	}
	if (errno)
		ret = -errno;
out:
	*out = ents;
	*nout = n;
	return ret;
}

/*
 * The stat of a listed non-directory entry w->key (name in directory dfd),
 * or non-zero when it is skipped (each skip of a link or special file is
 * logged with its key).
 */
static int fs_walk_stat(struct fs_walk *w, int dfd, const struct fs_dirent *e,
			struct stat *st)
{
	struct filestore *fs = w->fs;
	int fd = -1, ret;

	if (e->type == FS_DT_REG) {
		/* Not following: a file swapped for a link since readdir
		 * is skipped, never followed. */
		if (fstatat(dfd, e->name, st, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISREG(st->st_mode))
			return -ENOENT;
		return 0;
	}
	if (e->type == FS_DT_OTHER) {
		log_warn("%s: '%s' is %s, not a regular file: skipped",
			 fs->base.url, w->key,
			 filestore_path_type_name(e->mode));
		return -EINVAL;
	}
	/* A symbolic link. */
	if (!fs->follow_inside) {
		filestore_path_msg(fs, w->key, -ELOOP, "skipped");
		return -ELOOP;
	}
	ret = filestore_path_resolve(fs, w->key, O_PATH, &fd);
	if (ret == -ELOOP || ret == -EXDEV) {
		filestore_path_msg(fs, w->key, ret, "skipped");
		return ret;
	}
	if (ret)
		return ret; /* dangling or vanished */
	if (fstat(fd, st))
		ret = -errno;
	else if (S_ISDIR(st->st_mode))
		ret = -EISDIR; /* links to directories: never (no loops) */
	else if (!S_ISREG(st->st_mode))
		ret = -EINVAL;
	if (ret == -EISDIR || ret == -EINVAL)
		log_warn("%s: '%s' is a symbolic link to %s: skipped",
			 fs->base.url, w->key,
			 filestore_path_type_name(st->st_mode));
	close(fd);
	return ret;
}

/* objstore_upload_list: report e (named w->key, in directory dfd) when it
 * is a temporary file, never following a link. */
static int fs_walk_tmp(struct fs_walk *w, int dfd, const struct fs_dirent *e)
{
	struct objstore_upload_info ui = { .key = w->key, .id = e->name };
	struct stat st;

	if (strncmp(e->name, FILESTORE_TMP_PREFIX,
		    sizeof(FILESTORE_TMP_PREFIX) - 1) ||
	    e->type != FS_DT_REG ||
	    fstatat(dfd, e->name, &st, AT_SYMLINK_NOFOLLOW) ||
	    !S_ISREG(st.st_mode))
		return 0;
	ui.initiated = st.st_mtim.tv_sec;
	return w->ucb(w->arg, &ui);
}

/* List directory dfd (opened by the caller, closed here), whose key form is
 * w->key[0..keylen). */
static int fs_walk_dir(struct fs_walk *w, int dfd, size_t keylen)
{
	struct fs_dirent *ents = NULL;
	size_t n = 0;
	DIR *d = NULL;
	int ret = 0;

	if (++w->depth > 256) {
		log_warn("%s: directory nesting deeper than 256 under '%.*s', "
			 "skipped",
			 w->fs->base.url, (int)keylen, w->key);
		close(dfd);
		goto out;
	}
	ret = fdutil_fdopendir(dfd, &d);
	if (ret)
		goto out;
	ret = fs_read_dir(d, w->ucb != NULL, &ents, &n);
	if (ret)
		goto out;
	if (n)
		qsort(ents, n, sizeof(*ents), fs_dirent_cmp);
	for (size_t i = 0; i < n && !ret; i++) {
		size_t nl = strlen(ents[i].name);
		size_t klen = keylen + nl;
		struct objstore_info oi = { .key = w->key };
		struct stat st;

		if (klen + 2 > sizeof(w->key)) {
			log_warn("%s: path under '%.*s' too long, skipped",
				 w->fs->base.url, (int)keylen, w->key);
			continue;
		}
		memcpy(w->key + keylen, ents[i].name, nl + 1);
		if (ents[i].type == FS_DT_DIR) {
			int sub;

			w->key[klen] = '/';
			w->key[klen + 1] = '\0';
			if (!fs_may_match(w, klen + 1))
				continue;
			sub = openat(dirfd(d), ents[i].name,
				     O_RDONLY | O_DIRECTORY | O_CLOEXEC |
					     O_NOFOLLOW);
			if (sub < 0) {
				ret = -errno;
				log_error("%s: cannot open directory '%s': %s",
					  w->fs->base.url, w->key,
					  strerror(-ret));
				continue;
			}
			ret = fs_walk_dir(w, sub, klen + 1);
			continue;
		}
		if (klen < w->prefix_len ||
		    memcmp(w->key, w->prefix, w->prefix_len))
			continue;
		if (w->ucb) {
			ret = fs_walk_tmp(w, dirfd(d), &ents[i]);
			continue;
		}
		if (fs_walk_stat(w, dirfd(d), &ents[i], &st))
			continue;
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

static int filestore_walk(struct objstore *os, const char *prefix,
			  objstore_list_cb cb, objstore_upload_list_cb ucb,
			  void *arg)
{
	struct fs_walk *w = calloc(1, sizeof(*w));
	int dfd, ret;

	if (!w)
		return -ENOMEM;
	w->fs = fs_of(os);
	w->prefix = prefix;
	w->prefix_len = strlen(prefix);
	w->cb = cb;
	w->ucb = ucb;
	w->arg = arg;
	objstore_count(&os->n_requests, 1);
	dfd = openat(w->fs->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		ret = -errno;
		log_error("%s: cannot open directory %s: %s", os->url,
			  w->fs->root[0] ? w->fs->root : "/", strerror(errno));
	} else {
		ret = fs_walk_dir(w, dfd, 0);
	}
	free(w);
	return ret;
}

static int filestore_list(struct objstore *os, const char *prefix,
			  objstore_list_cb cb, void *arg)
{
	return filestore_walk(os, prefix, cb, NULL, arg);
}

/* The temporary files (an upload's, or a put's) under prefix: the
 * uploads a process that died left open. */
static int filestore_up_list(struct objstore *os, const char *prefix,
			     objstore_upload_list_cb cb, void *arg)
{
	return filestore_walk(os, prefix, NULL, cb, arg);
}

/* ---- head, get ---- */

static int filestore_head(struct objstore *os, const char *key,
			  struct objstore_info *info)
{
	struct filestore *fs = fs_of(os);
	struct stat st;
	int fd, ret = filestore_path_key_ok(fs, key);

	if (ret)
		return ret;
	objstore_count(&os->n_requests, 1);
	ret = filestore_path_open_file(fs, key, O_PATH, &fd, &st);
	if (ret)
		return ret;
	close(fd);
	filestore_fill_info(&st, info);
	return 0;
}

static int filestore_get_one(struct filestore *fs, struct objstore_get_req *rq)
{
	char etag[OBJSTORE_ETAG_MAX];
	struct stat st;
	int fd, ret = filestore_path_key_ok(fs, rq->key);

	if (ret)
		return ret;
	objstore_count(&fs->base.n_requests, 1);
	/* O_NONBLOCK: a FIFO swapped in cannot hang the open; fstat then
	 * refuses anything but a regular file. */
	ret = filestore_path_open_file(fs, rq->key, O_RDONLY | O_NONBLOCK, &fd,
				       &st);
	if (ret)
		return ret;
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
	ret = filestore_io_read(&fs->base, fd, rq);
out:
	close(fd);
	return ret;
}

/* One read of a batch, counted in the source request metrics (0 "ok" or
 * its errno). */
static int filestore_get_counted(struct objstore *os,
				 struct objstore_get_req *rq)
{
	int ret = filestore_get_one(fs_of(os), rq);

	metrics_source_request("GET", ret);
	return ret;
}

/* Ranged reads in parallel, s3.max_inflight threads at most: on a parallel
 * filesystem latency, not bandwidth, bounds a single reader. */
static int filestore_get_many(struct objstore *os,
			      struct objstore_get_req *reqs, size_t n)
{
	return filestore_io_get_parallel(os, reqs, n, filestore_get_counted);
}

/* ---- put, delete, copy ---- */
/* Copy size bytes to fd, from buf or (buf NULL) from src_fd at offset 0. */
static int filestore_write_all(int fd, int src_fd, const void *buf,
			       uint64_t size)
{
	uint64_t done = 0;
	char *chunk = NULL;
	int ret = 0;

	if (!buf) {
		chunk = malloc(1 << 20);
		if (!chunk)
			return -ENOMEM;
	}
	while (done < size) {
		const char *p;
		ssize_t r;

		if (buf) {
			p = (const char *)buf + done;
			r = (ssize_t)(size - done > (1u << 30) ? (1u << 30)
							       : size - done);
		} else {
			size_t want = size - done > (1 << 20) ? (1 << 20)
							      : size - done;

			r = pread(src_fd, chunk, want, (off_t)done);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				ret = r < 0 ? -errno : -EIO;
				goto out;
			}
			p = chunk;
		}
		for (ssize_t off = 0; off < r;) {
			ssize_t w = write(fd, p + off, (size_t)(r - off));

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
out:
	free(chunk);
	return ret;
}

/* Create a temporary file in key's directory (made when missing): *dfd the
 * directory, *fd the file, tmp its name (filestore_tmp_name), after a sweep
 * of stale ones when due. Returns 0 or -errno (-EIO: no random bytes). */
static int filestore_tmp_open(struct filestore *fs, const char *key, int *dfd,
			      int *fd, char tmp[NAME_MAX + 1])
{
	const char *slash = strrchr(key, '/');
	int ret;

	*fd = -1;
	tmp[0] = '\0';
	filestore_sweep_maybe(fs);
	ret = filestore_path_open_dir(
		fs, key, slash ? (size_t)(slash - key) : 0, true, dfd);
	if (ret)
		return ret;
	ret = filestore_tmp_name(fs, tmp);
	if (ret) {
		tmp[0] = '\0';
		close(*dfd);
		*dfd = -1;
		return ret;
	}
	*fd = openat(*dfd, tmp,
		     O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		     0644);
	if (*fd < 0) {
		ret = -errno;
		tmp[0] = '\0';
		close(*dfd);
		*dfd = -1;
	}
	return ret;
}

/* fsync the temporary file fd, rename it over key, fsync the directory. fd
 * is closed; on failure tmp stays for the caller to unlink. */
static int filestore_tmp_publish(const char *key, int dfd, int fd,
				 const char *tmp)
{
	const char *slash = strrchr(key, '/');
	int ret = 0;

	if (fsync(fd))
		ret = -errno;
	if (close(fd) && !ret)
		ret = -errno;
	if (!ret && renameat(dfd, tmp, dfd, slash ? slash + 1 : key))
		ret = -errno;
	if (!ret && fsync(dfd))
		ret = -errno;
	return ret;
}

/*
 * Write an object through a temporary file. Exactly one of src_fd (read from
 * offset 0 with pread) and buf is used. size bytes are written.
 */
static int filestore_put(struct filestore *fs, const char *key, int src_fd,
			 const void *buf, uint64_t size)
{
	char tmp[NAME_MAX + 1] = "";
	int dfd = -1, fd = -1, ret;

	ret = filestore_path_key_ok(fs, key);
	if (ret)
		return ret;
	objstore_count(&fs->base.n_requests, 1);
	ret = filestore_tmp_open(fs, key, &dfd, &fd, tmp);
	if (ret)
		goto out;
	ret = filestore_write_all(fd, src_fd, buf, size);
	if (ret)
		goto out;
	ret = filestore_tmp_publish(key, dfd, fd, tmp);
	fd = -1;
	if (!ret)
		tmp[0] = '\0';
	objstore_count(&fs->base.n_bytes_out, size);
out:
	if (fd >= 0)
		close(fd);
	if (ret && tmp[0])
		unlinkat(dfd, tmp, 0);
	if (dfd >= 0)
		close(dfd);
	if (ret)
		log_error("%s: cannot store '%s': %s", fs->base.url, key,
			  strerror(-ret));
	return ret;
}

/* ---- uploads in parts: a temporary file written at the parts' offsets */

struct filestore_upload {
	struct objstore_upload base;
	int dfd, fd; /* the key's directory, the temporary file (base.id) */
};

static void filestore_up_free(struct filestore_upload *fu)
{
	if (fu->fd >= 0)
		close(fu->fd);
	if (fu->base.id && fu->dfd >= 0)
		unlinkat(fu->dfd, fu->base.id, 0);
	if (fu->dfd >= 0)
		close(fu->dfd);
	objstore_upload_release(&fu->base);
	free(fu);
}

static int filestore_up_begin(struct objstore *os, const char *key,
			      const char *sha256, struct objstore_upload **out)
{
	struct filestore *fs = fs_of(os);
	struct filestore_upload *fu;
	char tmp[NAME_MAX + 1];
	int ret = filestore_path_key_ok(fs, key);

	(void)sha256; /* the checkpoint code keeps its sidecar line */
	if (ret)
		return ret;
	fu = calloc(1, sizeof(*fu));
	if (!fu)
		return -ENOMEM;
	fu->dfd = fu->fd = -1;
	objstore_count(&os->n_requests, 1);
	fu->base.key = strdup(key);
	ret = fu->base.key ? filestore_tmp_open(fs, key, &fu->dfd, &fu->fd, tmp)
			   : -ENOMEM;
	if (!ret && !(fu->base.id = strdup(tmp)))
		ret = -ENOMEM;
	if (ret) {
		if (fu->fd >= 0)
			unlinkat(fu->dfd, tmp, 0);
		filestore_up_free(fu);
		log_error("%s: cannot start storing '%s': %s", os->url, key,
			  strerror(-ret));
		return ret;
	}
	*out = &fu->base;
	return 0;
}

static int filestore_up_part(struct objstore_upload *up, unsigned partno,
			     const void *buf, int fd, uint64_t off,
			     uint64_t len, const struct objstore_digests *dig,
			     char etag[OBJSTORE_ETAG_MAX])
{
	struct filestore_upload *fu = (struct filestore_upload *)up;
	uint64_t at = (uint64_t)(partno - 1) * up->part_size, done = 0;
	char *chunk = buf ? NULL : malloc(1 << 20);
	int ret = 0;

	(void)dig; /* written as given */
	if (!buf && !chunk)
		return -ENOMEM;
	objstore_count(&up->os->n_requests, 1);
	/* From a file: in the kernel where it can (no copy through here). */
	while (!buf && done < len) {
		loff_t so = (loff_t)(off + done), dof = (loff_t)(at + done);
		ssize_t c = copy_file_range(fd, &so, fu->fd, &dof,
					    (size_t)(len - done), 0);

		if (c < 0 && errno == EINTR)
			continue;
		if (c <= 0)
			break; /* EXDEV, EINVAL, ENOSYS...: sendfile, by hand */
		done += (uint64_t)c;
	}
	/* Across file systems (the local copy on another disk or tmpfs)
	 * copy_file_range is refused; sendfile copies in the kernel too, at
	 * the file offset of a descriptor of its own (parts run at once). */
	if (!buf && done < len) {
		int ofd = openat(fu->dfd, up->id,
				 O_WRONLY | O_NOFOLLOW | O_CLOEXEC);

		while (ofd >= 0 && done < len &&
		       lseek(ofd, (off_t)(at + done), SEEK_SET) >= 0) {
			off_t so = (off_t)(off + done);
			ssize_t c =
				sendfile(ofd, fd, &so, (size_t)(len - done));

			if (c < 0 && errno == EINTR)
				continue;
			if (c <= 0)
				break;
			done += (uint64_t)c;
		}
		if (ofd >= 0)
			close(ofd);
	}
	while (!ret && done < len) {
		size_t want = len - done > (1 << 20) ? (1 << 20) : len - done;
		const char *p = (const char *)buf + done;
		ssize_t r = (ssize_t)want, w;

		if (!buf) {
			r = pread(fd, chunk, want, (off_t)(off + done));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				ret = r < 0 ? -errno : -EIO;
				break;
			}
			p = chunk;
		}
		for (ssize_t o = 0; o < r; o += w) {
			w = pwrite(fu->fd, p + o, (size_t)(r - o),
				   (off_t)(at + done + (uint64_t)o));
			if (w < 0 && errno == EINTR) {
				w = 0;
				continue;
			}
			if (w <= 0) {
				ret = w < 0 ? -errno : -EIO;
				break;
			}
		}
		done += (uint64_t)r;
	}
	free(chunk);
	if (ret) {
		log_error("%s: cannot store part %u of '%s': %s", up->os->url,
			  partno, up->key, strerror(-ret));
		return ret;
	}
	/* Start writing it to the disk now, so that the commit's fsync
	 * waits only for the last parts (errors: the fsync reports them). */
	sync_file_range(fu->fd, (off64_t)at, (off64_t)len,
			SYNC_FILE_RANGE_WRITE);
	objstore_count(&up->os->n_bytes_out, len);
	snprintf(etag, OBJSTORE_ETAG_MAX, "%u", partno);
	return 0;
}

static void filestore_up_abort(struct objstore_upload *up)
{
	filestore_up_free((struct filestore_upload *)up);
}

static int filestore_up_commit(struct objstore_upload *up, unsigned nparts,
			       uint64_t size, char etag[OBJSTORE_ETAG_MAX])
{
	struct filestore_upload *fu = (struct filestore_upload *)up;
	int ret = 0;

	(void)nparts;
	(void)etag; /* "": the caller HEADs when it needs one */
	objstore_count(&up->os->n_requests, 1);
	if (ftruncate(fu->fd, (off_t)size))
		ret = -errno;
	if (!ret) {
		ret = filestore_tmp_publish(up->key, fu->dfd, fu->fd, up->id);
		fu->fd = -1;
	}
	if (!ret) {
		free(up->id); /* renamed: nothing to unlink */
		up->id = NULL;
	} else {
		log_error("%s: cannot store '%s': %s", up->os->url, up->key,
			  strerror(-ret));
	}
	filestore_up_free(fu);
	return ret;
}

static int filestore_up_abort_id(struct objstore *os, const char *key,
				 const char *id)
{
	struct filestore *fs = fs_of(os);
	const char *slash = strrchr(key, '/');
	size_t dlen = slash ? (size_t)(slash - key) + 1 : 0;
	char *dkey = malloc(dlen + 2);
	int dfd, ret;

	/* key may be the temporary file's own path (objstore_upload_list):
	 * only its directory is used, so only that is checked */
	if (!dkey)
		return -ENOMEM;
	memcpy(dkey, key, dlen);
	memcpy(dkey + dlen, "x", 2);
	ret = filestore_path_key_ok(fs, dkey);
	free(dkey);
	if (ret)
		return ret;
	if (strncmp(id, FILESTORE_TMP_PREFIX, strlen(FILESTORE_TMP_PREFIX)) ||
	    strchr(id, '/') || strlen(id) > NAME_MAX) {
		log_error("%s: '%s' is not a temporary file of an upload",
			  os->url, id);
		return -EINVAL;
	}
	objstore_count(&os->n_requests, 1);
	ret = filestore_path_open_dir(
		fs, key, slash ? (size_t)(slash - key) : 0, false, &dfd);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	ret = unlinkat(dfd, id, 0) && errno != ENOENT ? -errno : 0;
	close(dfd);
	return ret;
}

static int filestore_put_fd(struct objstore *os, const char *key, int fd,
			    uint64_t size, const char *sha256)
{
	(void)sha256; /* the checkpoint code keeps its sidecar line */
	return filestore_put(fs_of(os), key, fd, NULL, size);
}

static int filestore_put_buf(struct objstore *os, const char *key,
			     const void *buf, size_t len,
			     const struct objstore_digests *dig)
{
	static const char empty[1];

	(void)dig; /* a file is written as given: nothing to send them with */
	return filestore_put(fs_of(os), key, -1, buf ? buf : empty, len);
}

static int filestore_delete(struct objstore *os, const char *key)
{
	struct filestore *fs = fs_of(os);
	size_t len = strlen(key);
	int dfd, ret = filestore_path_key_ok(fs, key);

	if (ret)
		return ret;
	objstore_count(&os->n_requests, 1);
	/* Directories are only prefixes: drop the ones now empty, deepest
	 * first, each through its parent opened beneath the root. */
	for (bool first = true; len > 0; first = false) {
		size_t plen = keypath_parent_len(key, len);
		const char *name = keypath_basename(key, len);
		char seg[NAME_MAX + 1];

		ret = filestore_path_open_dir(fs, key, plen, false, &dfd);
		if (ret && first)
			return ret == -ENOENT ? 0 : ret;
		if (ret)
			break;
		snprintf(seg, sizeof(seg), "%.*s", (int)(key + len - name),
			 name);
		ret = unlinkat(dfd, seg, first ? 0 : AT_REMOVEDIR) ? -errno : 0;
		close(dfd);
		if (first && ret && ret != -ENOENT)
			return ret;
		if (!first && ret)
			break;
		len = plen;
	}
	return 0;
}

static int filestore_copy(struct objstore *os, const char *src, const char *dst)
{
	struct filestore *fs = fs_of(os);
	struct stat st;
	int fd, ret = filestore_path_key_ok(fs, src);

	if (ret)
		return ret;
	ret = filestore_path_open_file(fs, src, O_RDONLY | O_NONBLOCK, &fd,
				       &st);
	if (ret)
		return ret;
	ret = filestore_put(fs, dst, fd, NULL, (uint64_t)st.st_size);
	close(fd);
	return ret;
}

/* A directory has no object metadata to hold a SHA-256 (the callers keep
 * it in their sidecars and SHA256SUMS): only check that key still holds
 * etag, as the s3:// form does before it stamps. */
static int filestore_set_sha256(struct objstore *os, const char *key,
				const char *etag, const char *sha256,
				char new_etag[OBJSTORE_ETAG_MAX])
{
	struct objstore_info oi = { .key = key };
	int ret = filestore_head(os, key, &oi);

	(void)sha256;
	if (!ret && etag && *etag && strcmp(etag, oi.etag))
		ret = -ESTALE;
	if (!ret)
		snprintf(new_etag, OBJSTORE_ETAG_MAX, "%s", oi.etag);
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
	free(fs->root_real);
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
	.set_sha256 = filestore_set_sha256,
	.free = filestore_free,
	.up_begin = filestore_up_begin,
	.up_part = filestore_up_part,
	.up_commit = filestore_up_commit,
	.up_abort = filestore_up_abort,
	.up_abort_id = filestore_up_abort_id,
	.up_list = filestore_up_list,
};

int filestore_open(const char *url, const char *rest,
		   const struct dstage_config *cfg, struct objstore **out)
{
	struct filestore *fs;
	char host[256];
	size_t len;
	int ret;

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
	fs->root_real = realpath(len ? fs->root : "/", NULL);
	if (!fs->root_real) {
		ret = -errno;
		log_error("%s: cannot resolve %s: %s", url,
			  len ? fs->root : "/", strerror(errno));
		goto err;
	}
	fs->follow_inside =
		cfg->sources_follow_symlinks == CONFIG_SYMLINKS_INSIDE;
	fs->no_openat2 = !filestore_path_has_openat2(fs->root_fd);
	fs->tmp_max_age_ms = cfg->store_tmp_max_age_ms;
	fs->host_hash = 2166136261u; /* FNV-1a */
	if (gethostname(host, sizeof(host)))
		host[0] = '\0';
	host[sizeof(host) - 1] = '\0';
	for (const char *c = host; *c; c++)
		fs->host_hash = (fs->host_hash ^ (unsigned char)*c) * 16777619u;
	if (fs->no_openat2)
		log_info("%s: openat2 not available: paths are resolved one "
			 "component at a time",
			 url);
	*out = &fs->base;
	return 0;
err:
	filestore_free(&fs->base);
	return ret;
}
