// SPDX-License-Identifier: MIT
/*
 * dsfs_cacheread: READ replies through the block cache (dsfs_cacheread.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "dsfs_cacheread.h"
#include "dsfs_opts.h"
#include "dsfs_subtree.h"
#include "dstage/cache.h"

static pthread_key_t dsfs_cacheread_key;
static pthread_once_t dsfs_cacheread_once = PTHREAD_ONCE_INIT;

struct dsfs_cacheread_tbuf {
	size_t len;
	char data[];
};

static void dsfs_cacheread_key_make(void)
{
	pthread_key_create(&dsfs_cacheread_key, free);
}

void *dsfs_cacheread_buf(size_t len)
{
	struct dsfs_cacheread_tbuf *b;

	pthread_once(&dsfs_cacheread_once, dsfs_cacheread_key_make);
	b = pthread_getspecific(dsfs_cacheread_key);
	if (b && b->len >= len)
		return b->data;
	free(b);
	pthread_setspecific(dsfs_cacheread_key, NULL);
	b = malloc(sizeof(*b) + (len ? len : 1));
	if (!b)
		return NULL;
	b->len = len;
	pthread_setspecific(dsfs_cacheread_key, b);
	return b->data;
}

/* cache_read_iov's receiver: the bytes go out as they are (no copy when
 * they are in memory already). */
struct dsfs_cacheread_rd {
	struct dsfs_reply_read *r;
	size_t bytes;
};

static int dsfs_cacheread_iov(void *arg, const struct iovec *iov, int n)
{
	struct dsfs_cacheread_rd *rd = arg;

	for (int i = 0; i < n; i++)
		rd->bytes += iov[i].iov_len;
	return dsfs_reply_read_iov(rd->r, iov, n);
}

int dsfs_cacheread_reply(struct dsfs *fs, const struct cache_object *obj,
			 uint64_t off, size_t size, struct dsfs_reply_read *r)
{
	struct dsfs_cacheread_rd rd = { .r = r };
	void *buf;
	int ret;

	if (fs->opts->splice) {
		uint64_t fd_off, obj_size = obj->size;
		int fd;

		if (cache_read_fd(fs->cache, obj, off, size, &fd, &fd_off) ==
		    0) {
			dsfs_reply_read_fd(r, fd, (off_t)fd_off, size,
					   FUSE_BUF_SPLICE_MOVE);
			/* The mount's page cache has them now (keep_cache):
			 * drop the cache file's copy (cache_set_drop_behind). */
			cache_read_fd_done(fs->cache, obj_size, fd, fd_off, off,
					   size);
			close(fd);
			atomic_fetch_add_explicit(&fs->ctr.splice_replies, 1,
						  memory_order_relaxed);
			atomic_fetch_add_explicit(&fs->ctr.read_bytes, size,
						  memory_order_relaxed);
			return 0;
		}
	}
	buf = dsfs_cacheread_buf(size);
	if (!buf)
		return -ENOMEM;
	ret = cache_read_iov(fs->cache, obj, off, size, buf, 0,
			     dsfs_cacheread_iov, &rd);
	if (!r->sent)
		return ret ? ret : -EIO;
	atomic_fetch_add_explicit(&fs->ctr.copy_replies, 1,
				  memory_order_relaxed);
	atomic_fetch_add_explicit(&fs->ctr.read_bytes, rd.bytes,
				  memory_order_relaxed);
	return 0;
}
