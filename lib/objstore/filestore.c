// SPDX-License-Identifier: MIT
/*
 * filestore: the file:///dir/ backend, an object store on a POSIX directory
 * (a parallel filesystem, NFS, or a local directory).
 *
 * Keys map to paths under the root. Objects are regular files; directories
 * exist as key prefixes (objstore_list never reports them; objstore_list_tree
 * reports each as "KEY/", an S3 folder marker's form, so that a snapshot
 * keeps empty ones; deleting the last object of a directory removes the
 * directory). Semantics match s3store:
 *
 *   list   all regular files under the root whose key starts with the prefix,
 *          in byte order of the key (a directory sorts as "name/", so the
 *          walk yields keys in exactly the order S3 would); the walk is in
 *          filestore_list.c.
 *   ETag   "<size>-<mtime ns>-<inode>" in hex, quoted: it changes whenever the
 *          file is replaced or rewritten.
 *   get    pread; If-Match is compared with the ETag of the opened file, so a
 *          file replaced between check and read cannot mix versions.
 *   put    temporary file ".dstage-tmp.<host>.<pid>.<random>" in the target
 *          directory, fsync, rename over the key, fsync of the directory:
 *          whole or not at all. Temporaries a dead writer left are removed
 *          by the first write of a handle, then every so often, once
 *          older than store.tmp_max_age (filestore_sweep.c). put_new
 *          links the temporary file as the key instead (link() fails if
 *          the key exists, atomically, NFS included) and unlinks it.
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
 * itself is in filestore_path.c; what a snapshot shows of each kind of
 * entry is in docs/catalog.md ("What a POSIX source's snapshot shows").
 *
 * The handle is immutable after open; every call is independent and
 * thread-safe.
 */
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
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/metrics.h"
#include "filestore_i.h"
#include "filestore_io.h"

static struct filestore *fs_of(struct objstore *os)
{
	return (struct filestore *)os;
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
	filestore_list_info(&st, info);
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
		filestore_list_etag(&st, etag, sizeof(etag));
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

/* fsync the temporary file fd, rename it over key (excl: link it as key
 * only if key is absent, -EEXIST if not, and unlink tmp), fsync the
 * directory. fd is closed; on failure tmp stays for the caller to unlink. */
static int filestore_tmp_publish(const char *key, int dfd, int fd,
				 const char *tmp, bool excl)
{
	const char *slash = strrchr(key, '/');
	const char *name = slash ? slash + 1 : key;
	int ret = 0;

	if (fsync(fd))
		ret = -errno;
	if (close(fd) && !ret)
		ret = -errno;
	if (!ret && excl && linkat(dfd, tmp, dfd, name, 0))
		ret = -errno;
	else if (!ret && excl)
		unlinkat(dfd, tmp, 0); /* a leftover is swept */
	else if (!ret && renameat(dfd, tmp, dfd, name))
		ret = -errno;
	if (!ret && fsync(dfd))
		ret = -errno;
	return ret;
}

/*
 * Write an object through a temporary file. Exactly one of src_fd (read from
 * offset 0 with pread) and buf is used. size bytes are written. excl: only
 * if key is absent (-EEXIST, not logged, when it is there).
 */
static int filestore_put(struct filestore *fs, const char *key, int src_fd,
			 const void *buf, uint64_t size, bool excl)
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
	ret = filestore_tmp_publish(key, dfd, fd, tmp, excl);
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
	if (ret && !(excl && ret == -EEXIST))
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
		ret = filestore_tmp_publish(up->key, fu->dfd, fu->fd, up->id,
					    false);
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
	return filestore_put(fs_of(os), key, fd, NULL, size, false);
}

static int filestore_put_buf(struct objstore *os, const char *key,
			     const void *buf, size_t len,
			     const struct objstore_digests *dig)
{
	static const char empty[1];

	(void)dig; /* a file is written as given: nothing to send them with */
	return filestore_put(fs_of(os), key, -1, buf ? buf : empty, len, false);
}

static int filestore_put_new(struct objstore *os, const char *key,
			     const void *buf, size_t len)
{
	static const char empty[1];

	return filestore_put(fs_of(os), key, -1, buf ? buf : empty, len, true);
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
	ret = filestore_put(fs, dst, fd, NULL, (uint64_t)st.st_size, false);
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
	.list_tree = filestore_list_tree,
	.head = filestore_head,
	.get_many = filestore_get_many,
	.put_fd = filestore_put_fd,
	.put_buf = filestore_put_buf,
	.put_new = filestore_put_new,
	.del = filestore_delete,
	.copy = filestore_copy,
	.set_sha256 = filestore_set_sha256,
	.free = filestore_free,
	.up_begin = filestore_up_begin,
	.up_part = filestore_up_part,
	.up_commit = filestore_up_commit,
	.up_abort = filestore_up_abort,
	.up_abort_id = filestore_up_abort_id,
	.up_list = filestore_list_uploads,
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
