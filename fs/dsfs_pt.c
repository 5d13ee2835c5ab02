// SPDX-License-Identifier: MIT
/*
 * dsfs_pt: FUSE passthrough of one inode's opens (see dsfs_pt.h for the
 * state of an inode's backing id and its lock).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dsfs.h"
#include "dsfs_caller.h"
#include "dsfs_pt.h"
#include "dstage/log.h"

void dsfs_pt_init(struct dsfs_pt *pt)
{
	pthread_mutex_init(&pt->lock, NULL);
	pt->id = 0;
	pt->pt_opens = pt->plain_opens = 0;
	pt->tag[0] = '\0';
}

void dsfs_pt_destroy(struct dsfs_pt *pt)
{
	pthread_mutex_destroy(&pt->lock);
}

#if DSTAGE_HAVE_FUSE_PASSTHROUGH
/* A backing id for the inode, or 0 (then the open reads through
 * dstagefs). Called with pt->lock held. */
static int dsfs_pt_backing(struct dsfs_caller *who, struct dsfs_pt *pt,
			   int (*backing)(void *arg, int *fd), void *arg,
			   const char *tag, const char *label, const char *key)
{
	static atomic_bool failure_logged;
	int fd = -1, id;

	if (pt->id && !pt->pt_opens) {
		/* Left by a release that had no request to close it with. */
		fuse_passthrough_close(who->req, pt->id);
		pt->id = 0;
	}
	if (pt->id)
		return strcmp(pt->tag, tag) ? 0 : pt->id;
	if (pt->plain_opens || backing(arg, &fd))
		return 0; /* a mix the kernel refuses; or partial, ... */
	/* The kernel holds the file from here on (and whatever the
	 * descriptor holds, such as the cache's in-use lock): ours is
	 * closed. */
	id = fuse_passthrough_open(who->req, fd);
	close(fd);
	if (id <= 0) {
		if (!atomic_exchange(&failure_logged, true))
			log_warn("passthrough: the kernel refused a backing "
				 "file (%s %s); such opens read through "
				 "dstagefs (logged once)",
				 label, key);
		return 0;
	}
	pt->id = id;
	snprintf(pt->tag, sizeof(pt->tag), "%s", tag);
	return id;
}
#endif

int dsfs_pt_open(struct dsfs *fs, struct dsfs_caller *who, struct dsfs_pt *pt,
		 bool may_pass, int (*backing)(void *arg, int *fd), void *arg,
		 const char *tag, struct fuse_file_info *fi, const char *label,
		 const char *key, enum dsfs_pt_kind *kind)
{
	int ret = 0;

	*kind = DSFS_PT_PLAIN;
	pthread_mutex_lock(&pt->lock);
#if DSTAGE_HAVE_FUSE_PASSTHROUGH
	if (may_pass && fs->passthrough && who->req) {
		int id =
			dsfs_pt_backing(who, pt, backing, arg, tag, label, key);

		if (id) {
			pt->pt_opens++;
			fi->backing_id = id;
			/* The FUSE inode's page cache is not used (the
			 * backing file's is), and the kernel fails an open
			 * that asks for both with EIO (seen on 6.18). */
			fi->keep_cache = 0;
			atomic_fetch_add_explicit(&fs->ctr.passthrough_opens, 1,
						  memory_order_relaxed);
			*kind = DSFS_PT_PASSED;
		}
	}
#else
	(void)fs;
	(void)who;
	(void)may_pass;
	(void)backing;
	(void)arg;
	(void)tag;
	(void)fi;
	(void)label;
	(void)key;
#endif
	if (*kind == DSFS_PT_PLAIN && pt->pt_opens)
		ret = -ETXTBSY; /* the kernel allows no other open beside */
	else if (*kind == DSFS_PT_PLAIN)
		pt->plain_opens++;
	pthread_mutex_unlock(&pt->lock);
	return ret;
}

void dsfs_pt_release(struct dsfs_caller *who, struct dsfs_pt *pt,
		     enum dsfs_pt_kind kind)
{
	pthread_mutex_lock(&pt->lock);
	if (kind == DSFS_PT_PLAIN) {
		pt->plain_opens--;
	} else if (kind == DSFS_PT_PASSED && !--pt->pt_opens && who->req) {
#if DSTAGE_HAVE_FUSE_PASSTHROUGH
		/* The kernel keeps the file while its own users remain. */
		fuse_passthrough_close(who->req, pt->id);
		pt->id = 0;
#endif
	}
	pthread_mutex_unlock(&pt->lock);
}
