// SPDX-License-Identifier: MIT
/*
 * dsfs_reply: reply helpers for subtrees (see dsfs_reply.h). Stateless.
 */
#include <string.h>

#include "dsfs_node.h"
#include "dsfs_opts.h"
#include "dsfs_reply.h"

bool dsfs_reply_dir_fits(const struct dsfs_reply_dir *d, const char *name)
{
	size_t need =
		d->plus ? fuse_add_direntry_plus(d->req, NULL, 0, name, NULL, 0)
			: fuse_add_direntry(d->req, NULL, 0, name, NULL, 0);

	return d->used + need <= d->size;
}

int dsfs_reply_dir_add(struct dsfs_reply_dir *d, const char *name,
		       const struct dsfs_entry *e, off_t off)
{
	char *p = d->buf + d->used;
	size_t left = d->size - d->used, need;

	if (!dsfs_reply_dir_fits(d, name))
		return 1;
	if (d->plus) {
		struct fuse_entry_param ep;

		memset(&ep, 0, sizeof(ep));
		ep.attr = e->attr;
		if (e->node) {
			ep.ino = e->node->ino;
			ep.generation = 1;
			ep.attr.st_ino = e->node->ino;
			ep.attr_timeout = e->attr_timeout;
			ep.entry_timeout = e->entry_timeout;
		}
		/* Without a node id ("." and ".."), the kernel takes no
		 * lookup reference. */
		need = fuse_add_direntry_plus(d->req, p, left, name, &ep, off);
	} else {
		struct stat st = { 0 };

		st.st_mode = e->attr.st_mode;
		st.st_ino = e->node ? e->node->ino : e->attr.st_ino;
		need = fuse_add_direntry(d->req, p, left, name, &st, off);
	}
	d->used += need;
	return 0;
}

int dsfs_reply_read_buf(struct dsfs_reply_read *r, const void *buf, size_t len)
{
	r->sent = true;
	fuse_reply_buf(r->req, buf, len);
	return 0;
}

int dsfs_reply_read_iov(struct dsfs_reply_read *r, const struct iovec *iov,
			int n)
{
	r->sent = true;
	if (n)
		fuse_reply_iov(r->req, iov, n);
	else
		fuse_reply_buf(r->req, NULL, 0);
	return 0;
}

int dsfs_reply_read_fd(struct dsfs_reply_read *r, int fd, off_t pos, size_t len,
		       enum fuse_buf_copy_flags flags)
{
	struct fuse_bufvec bv = FUSE_BUFVEC_INIT(len);

	bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	bv.buf[0].fd = fd;
	bv.buf[0].pos = pos;
	r->sent = true;
	fuse_reply_data(r->req, &bv, flags);
	return 0;
}

void dsfs_reply_attr(const struct dsfs_opts *o, struct stat *st, fuse_ino_t ino,
		     bool dir, uint64_t size, int64_t mtime)
{
	mode_t mode = (dir ? 0777 : 0666) & ~o->umask & ~0222;

	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = o->uid;
	st->st_gid = o->gid;
	st->st_mode = (dir ? S_IFDIR : S_IFREG) | mode;
	st->st_nlink = dir ? 2 : 1;
	st->st_size = (off_t)size;
	st->st_blksize = 1 << 20;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	st->st_mtime = mtime;
	st->st_ctime = mtime;
	st->st_atime = mtime;
}
