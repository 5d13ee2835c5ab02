/* SPDX-License-Identifier: MIT */
/*
 * dsfs_ctl_i: private to the control subtree (.dstage/): dsfs_ctl.c (the
 * subtree: names, attributes, the stats and summary texts, open files)
 * calls dsfs_ctl_prefetch.c (prefetch lists and the per-uid limits), never
 * the other way round. See those files for the state and locks.
 */
#ifndef DSFS_CTL_I_H
#define DSFS_CTL_I_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "dsfs_subtree.h"

#define DSFS_CTL_PF_LINE_MAX 8192
/* Memory charged per entry beyond its strings (struct, hash slots, the
 * allocator's headers), bytes. */
#define DSFS_CTL_PF_ENTRY_COST 96
/* Least seconds between two refusal lines, and two list lines at info
 * level, of one uid. */
#define DSFS_CTL_REFUSE_LOG_S 60
#define DSFS_CTL_LIST_LOG_S 10
/* Summaries kept (one per uid, the uids that submitted last), and the
 * size of one. */
#define DSFS_CTL_STATUS_MAX 1024
#define DSFS_CTL_STATUS_LEN 512

/* One uid's use of .dstage (ctl.lock). Freed once idle and quiet. */
struct dsfs_ctl_uid {
	struct dsfs_ctl_uid *next;
	uid_t uid;
	unsigned handles; /* open .dstage files */
	uint64_t entries, bytes; /* in its open lists */
	int64_t refuse_logged; /* monotonic s of the last refusal line */
	uint64_t refused; /* refusals since that line */
	int64_t list_logged; /* monotonic s of the last list line */
};

/* The summary of the last list one uid submitted (ctl.lock). Kept apart
 * from struct dsfs_ctl_uid, which goes once idle: a summary stays until
 * DSFS_CTL_STATUS_MAX other uids have submitted since. */
struct dsfs_ctl_status {
	struct dsfs_ctl_status *next;
	uid_t uid;
	char text[DSFS_CTL_STATUS_LEN];
};

/* The subtree's state: fs->sub_state[DSFS_SUB_CTL]. */
struct dsfs_ctl {
	pthread_mutex_t lock; /* leaf; protects everything below */
	struct dsfs_ctl_uid *uids;
	/* Per uid, the most recently written first; at most
	 * DSFS_CTL_STATUS_MAX. A uid reads only its own. */
	struct dsfs_ctl_status *statuses;
	size_t nstatuses;
};

struct dsfs_ctl_pf;

/* An open .dstage file: a text made at open, or a list being written. */
struct dsfs_ctl_fh {
	uid_t uid;
	struct dsfs_ctl_pf *pf; /* NULL: a text */
	size_t len;
	char text[];
};

static inline struct dsfs_ctl *dsfs_ctl_of(struct dsfs *fs)
{
	return fs->sub_state[DSFS_SUB_CTL];
}

/* Free every per-uid record and summary (the subtree's destroy). */
void dsfs_ctl_uids_free(struct dsfs_ctl *c);

/* The summary of uid's last list, or NULL (none yet). ctl.lock held. */
const char *dsfs_ctl_status_find(struct dsfs_ctl *c, uid_t uid);

/* Count an open file against uid's limit. Returns 0, -EDQUOT, -ENOMEM. */
int dsfs_ctl_hold(struct dsfs *fs, uid_t uid);
void dsfs_ctl_unhold(struct dsfs *fs, uid_t uid);

/* A handle with an empty list written by who (groups loaded), or NULL. */
struct dsfs_ctl_fh *dsfs_ctl_fh_pf(struct dsfs_caller *who);
/* Submit what the list still holds (written without a flush) and free
 * it. */
void dsfs_ctl_pf_free(struct dsfs *fs, struct dsfs_ctl_pf *pf);

/* The write and flush hooks of .dstage/prefetch. */
ssize_t dsfs_ctl_write(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_node *n, struct fuse_file_info *fi,
		       const char *buf, size_t size, off_t off);
int dsfs_ctl_flush(struct dsfs *fs, struct dsfs_caller *who,
		   struct dsfs_node *n, struct fuse_file_info *fi);

#endif
