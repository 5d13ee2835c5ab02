// SPDX-License-Identifier: MIT
/*
 * dsfs_pt: FUSE passthrough of one inode's opens (see dsfs_pt.h for the
 * state of an inode's backing id and its lock).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsfs_caller.h"
#include "dsfs_pt.h"
#include "dsfs_subtree.h"
#include "dstage/log.h"

void dsfs_pt_init(struct dsfs_pt *pt)
{
	pthread_condattr_t ca;

	pthread_mutex_init(&pt->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pt->released, &ca);
	pthread_condattr_destroy(&ca);
	pt->id = 0;
	pt->pt_opens = pt->plain_opens = 0;
	pt->tag[0] = '\0';
}

void dsfs_pt_destroy(struct dsfs_pt *pt)
{
	pthread_cond_destroy(&pt->released);
	pthread_mutex_destroy(&pt->lock);
}

/* Whether an open with these arguments would join the passed-through
 * opens there (pt_opens > 0). Called with pt->lock held. */
static bool dsfs_pt_joins(struct dsfs *fs, struct dsfs_caller *who,
			  const struct dsfs_pt *pt, bool may_pass,
			  const char *tag)
{
	return may_pass && fs->passthrough && who->req && pt->id &&
	       !strcmp(pt->tag, tag);
}

/* Wait, bounded, for the passed-through opens of pt to be released when
 * this open could not join them. Called with pt->lock held. */
static void dsfs_pt_wait_released(struct dsfs *fs, struct dsfs_caller *who,
				  struct dsfs_pt *pt, bool may_pass,
				  const char *tag)
{
	struct timespec end;
	uint64_t ns;

	if (!pt->pt_opens || dsfs_pt_joins(fs, who, pt, may_pass, tag))
		return;
	clock_gettime(CLOCK_MONOTONIC, &end);
	ns = (uint64_t)end.tv_nsec + DSFS_PT_RELEASE_WAIT_MS * 1000000ull;
	end.tv_sec += (time_t)(ns / 1000000000ull);
	end.tv_nsec = (long)(ns % 1000000000ull);
	while (pt->pt_opens &&
	       pthread_cond_timedwait(&pt->released, &pt->lock, &end) == 0)
		;
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
	dsfs_pt_wait_released(fs, who, pt, may_pass, tag);
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
	} else if (kind == DSFS_PT_PASSED && !--pt->pt_opens) {
		pthread_cond_broadcast(&pt->released);
#if DSTAGE_HAVE_FUSE_PASSTHROUGH
		/* The kernel keeps the file while its own users remain. */
		if (who->req) {
			fuse_passthrough_close(who->req, pt->id);
			pt->id = 0;
		}
#else
		(void)who;
#endif
	}
	pthread_mutex_unlock(&pt->lock);
}
