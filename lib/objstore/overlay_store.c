// SPDX-License-Identifier: MIT
/*
 * overlay_store: the read-only object store of dstagefs's transparent mode
 * (see include/dstage/overlay.h), a backend of the objstore interface.
 *
 * Stateless but for the counters in the base handle (atomics): root_fd is
 * set at open and closed at free.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dstage/log.h"
#include "dstage/overlay.h"
#include "filestore_io.h"
#include "objstore_backend.h"

struct overlay_store {
	struct objstore base;
	int root_fd; /* O_PATH directory: the tree under the mount */
};

static struct overlay_store *overlay_store_of(struct objstore *os)
{
	return (struct overlay_store *)os;
}

void overlay_store_etag(const struct stat *st, char *out, size_t len)
{
	snprintf(out, len, "\"%llx-%llx-%llx-%llx.%lx-%llx.%lx\"",
		 (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
		 (unsigned long long)st->st_size,
		 (unsigned long long)st->st_mtim.tv_sec,
		 (unsigned long)st->st_mtim.tv_nsec,
		 (unsigned long long)st->st_ctim.tv_sec,
		 (unsigned long)st->st_ctim.tv_nsec);
}

/* Open key beneath the root, never through a symbolic link. */
static int overlay_store_resolve(struct overlay_store *s, const char *key,
				 int flags, int *out)
{
	struct open_how how = {
		.flags = (uint64_t)flags | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
			   RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, s->root_fd, key, &how, sizeof(how));

	*out = (int)fd; /* -1 on failure: callers never see it unset */
	return fd < 0 ? -errno : 0;
}

static int overlay_store_get_one(struct overlay_store *s,
				 struct objstore_get_req *rq)
{
	char etag[OVERLAY_ETAG_MAX];
	struct stat st;
	int fd, ret;

	objstore_count(&s->base.n_requests, 1);
	ret = overlay_store_resolve(s, rq->key, O_RDONLY | O_NONBLOCK, &fd);
	if (ret)
		return ret;
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = -EINVAL;
		goto out;
	}
	overlay_store_etag(&st, etag, sizeof(etag));
	if (rq->if_match && strcmp(etag, rq->if_match)) {
		/* Expected: the file changed since the reader opened it;
		 * the reader then reads it directly. */
		log_debug("%s: '%s' changed (version %s, expected %s)",
			  s->base.url, rq->key, etag, rq->if_match);
		ret = -ESTALE;
		goto out;
	}
	ret = filestore_io_read(&s->base, fd, rq);
out:
	close(fd);
	return ret;
}

static int overlay_store_get_fn(struct objstore *os,
				struct objstore_get_req *rq)
{
	return overlay_store_get_one(overlay_store_of(os), rq);
}

/* Ranged reads in parallel, s3.max_inflight threads at most (the cache
 * asks for a readahead window at once): a parallel file system's latency,
 * not its bandwidth, bounds a single reader. objstore_get_many counts the
 * failed ones. */
static int overlay_store_get_many(struct objstore *os,
				  struct objstore_get_req *reqs, size_t n)
{
	return filestore_io_get_parallel(os, reqs, n, overlay_store_get_fn);
}

static int overlay_store_head(struct objstore *os, const char *key,
			      struct objstore_info *info)
{
	struct stat st;
	int fd, ret;

	ret = overlay_store_resolve(overlay_store_of(os), key, O_PATH, &fd);
	if (ret)
		return ret;
	if (fstat(fd, &st))
		ret = -errno;
	else if (!S_ISREG(st.st_mode))
		ret = -ENOENT;
	close(fd);
	if (ret)
		return ret;
	info->key = key;
	info->size = (uint64_t)st.st_size;
	info->mtime = st.st_mtim.tv_sec;
	overlay_store_etag(&st, info->etag, sizeof(info->etag));
	return 0;
}

/* ---- what a read-only store refuses ---- */

static int overlay_store_list(struct objstore *os, const char *prefix,
			      objstore_list_cb cb, void *arg)
{
	(void)os;
	(void)prefix;
	(void)cb;
	(void)arg;
	return -ENOTSUP;
}

static int overlay_store_put_fd(struct objstore *os, const char *key, int fd,
				uint64_t size, const char *sha256)
{
	(void)os;
	(void)key;
	(void)fd;
	(void)size;
	(void)sha256;
	return -EROFS;
}

static int overlay_store_put_buf(struct objstore *os, const char *key,
				 const void *buf, size_t len,
				 const struct objstore_digests *dig)
{
	(void)os;
	(void)key;
	(void)buf;
	(void)len;
	(void)dig;
	return -EROFS;
}

static int overlay_store_del(struct objstore *os, const char *key)
{
	(void)os;
	(void)key;
	return -EROFS;
}

static int overlay_store_copy(struct objstore *os, const char *src,
			      const char *dst)
{
	(void)os;
	(void)src;
	(void)dst;
	return -EROFS;
}

static int overlay_store_up_begin(struct objstore *os, const char *key,
				  const char *sha256,
				  struct objstore_upload **out)
{
	(void)os;
	(void)key;
	(void)sha256;
	*out = NULL;
	return -EROFS;
}

static int overlay_store_up_part(struct objstore_upload *up, unsigned partno,
				 const void *buf, int fd, uint64_t off,
				 uint64_t len,
				 const struct objstore_digests *dig,
				 char etag[OBJSTORE_ETAG_MAX])
{
	(void)dig;
	(void)up;
	(void)partno;
	(void)buf;
	(void)fd;
	(void)off;
	(void)len;
	(void)etag;
	return -EROFS;
}

static int overlay_store_up_commit(struct objstore_upload *up, unsigned nparts,
				   uint64_t size, char etag[OBJSTORE_ETAG_MAX])
{
	(void)etag;
	(void)up;
	(void)nparts;
	(void)size;
	return -EROFS;
}

/* The overlay's source is read-only. */
static int overlay_store_set_sha256(struct objstore *os, const char *key,
				    const char *etag, const char *sha256,
				    char new_etag[OBJSTORE_ETAG_MAX])
{
	(void)os;
	(void)key;
	(void)etag;
	(void)sha256;
	(void)new_etag;
	return -EROFS;
}

static void overlay_store_up_abort(struct objstore_upload *up)
{
	(void)up;
}

static int overlay_store_up_abort_id(struct objstore *os, const char *key,
				     const char *id)
{
	(void)os;
	(void)key;
	(void)id;
	return 0;
}

static int overlay_store_up_list(struct objstore *os, const char *prefix,
				 objstore_upload_list_cb cb, void *arg)
{
	(void)os;
	(void)prefix;
	(void)cb;
	(void)arg;
	return 0;
}

static void overlay_store_free_ops(struct objstore *os)
{
	overlay_store_free(os);
}

static const struct objstore_ops overlay_store_ops = {
	.list = overlay_store_list,
	.head = overlay_store_head,
	.get_many = overlay_store_get_many,
	.put_fd = overlay_store_put_fd,
	.put_buf = overlay_store_put_buf,
	.del = overlay_store_del,
	.copy = overlay_store_copy,
	.set_sha256 = overlay_store_set_sha256,
	.free = overlay_store_free_ops,
	.up_begin = overlay_store_up_begin,
	.up_part = overlay_store_up_part,
	.up_commit = overlay_store_up_commit,
	.up_abort = overlay_store_up_abort,
	.up_abort_id = overlay_store_up_abort_id,
	.up_list = overlay_store_up_list,
};

int overlay_store_open(int dirfd, const char *name,
		       const struct dstage_config *cfg, struct objstore **out)
{
	struct overlay_store *s;
	struct stat st;
	int fd, ret;

	*out = NULL;
	if (fstat(dirfd, &st) || !S_ISDIR(st.st_mode))
		return -EBADF;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->root_fd = -1;
	s->base.ops = &overlay_store_ops;
	s->base.cfg = cfg;
	s->base.url = strdup(name);
	s->root_fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 3);
	if (!s->base.url || s->root_fd < 0) {
		ret = s->base.url ? -errno : -ENOMEM;
		goto err;
	}
	/* RESOLVE_BENEATH is what keeps reads inside the tree. */
	ret = overlay_store_resolve(s, ".", O_PATH, &fd);
	if (ret) {
		log_error("%s: openat2 with RESOLVE_BENEATH failed (%s): the "
			  "overlay needs Linux 5.6 or later",
			  name, strerror(-ret));
		ret = -ENOSYS;
		goto err;
	}
	close(fd);
	*out = &s->base;
	return 0;
err:
	overlay_store_free(&s->base);
	return ret;
}

void overlay_store_free(struct objstore *os)
{
	struct overlay_store *s = overlay_store_of(os);

	if (!s)
		return;
	if (s->root_fd >= 0)
		close(s->root_fd);
	free(s->base.url);
	free(s);
}
