// SPDX-License-Identifier: MIT
/*
 * dsfs: the dispatcher's life cycle (see dsfs.h): the mount context, the
 * subtrees' init/destroy, and the poller thread that calls their poll
 * hooks.
 *
 * Poller state machine: STOPPED --dsfs_poller_start--> RUNNING (first:
 * wait for the mount to answer, raise the bdi's read_ahead_kb; then every
 * opts.poll_ms: each subtree's poll hook) --dsfs_poller_request_stop-->
 * STOPPING (fs->stopping set: subtrees send no more notifications)
 * --dsfs_poller_stop--> STOPPED (joined). poll_stop is guarded by
 * poll_lock, a leaf lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/dsfs_ckpt.h"
#include "dsfs.h"
#include "dsfs_ctl.h"
#include "dsfs_dataset.h"
#include "dsfs_datasets.h"
#include "dsfs_ops.h"
#include "dsfs_root.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"
#include "overlay/dsfs_overlay.h"

int dsfs_init(struct dsfs *fs, const struct dsfs_opts *o,
	      const struct dstage_config *cfg)
{
	int ret;

	memset(fs, 0, sizeof(*fs));
	fs->opts = o;
	fs->cfg = cfg;
	fs->mount_time = time(NULL);
	atomic_init(&fs->stopping, false);
	pthread_mutex_init(&fs->poll_lock, NULL);
	pthread_cond_init(&fs->poll_cond, NULL);
	pthread_mutex_init(&fs->handle_lock, NULL);
	fs->subs[DSFS_SUB_ROOT] = &dsfs_root_subtree;
	fs->subs[DSFS_SUB_DATASETS] = &dsfs_datasets_subtree;
	fs->subs[DSFS_SUB_CKPT] = &dsfs_ckpt_subtree;
	fs->subs[DSFS_SUB_CTL] = &dsfs_ctl_subtree;
	if (o->over_dir) { /* transparent mode: the tree under DIR only */
		fs->subs[DSFS_SUB_ROOT] = &dsfs_overlay_subtree;
		for (int i = DSFS_SUB_ROOT + 1; i < DSFS_SUB_COUNT; i++)
			fs->subs[i] = &dsfs_overlay_off_subtree;
	}
	ret = dsfs_nodes_init(&fs->nodes);
	for (int i = 0; !ret && i < DSFS_SUB_COUNT; i++)
		if (fs->subs[i]->init)
			ret = fs->subs[i]->init(fs);
	if (ret)
		dsfs_destroy(fs);
	return ret;
}

int dsfs_start(struct dsfs *fs)
{
	int ret = 0;

	for (int i = 0; !ret && i < DSFS_SUB_COUNT; i++)
		if (fs->subs[i]->start)
			ret = fs->subs[i]->start(fs);
	return ret;
}

/* dsfs_nodes_release's drop: the subtree lets go of the node's priv. */
static void dsfs_drop_node(struct dsfs_node *n, void *arg)
{
	if (n->sub && n->sub->forget)
		n->sub->forget(arg, n);
}

void dsfs_destroy(struct dsfs *fs)
{
	dsfs_poller_stop(fs);
	dsfs_release_handles(fs);
	dsfs_nodes_release(&fs->nodes, dsfs_drop_node, fs);
	for (int i = DSFS_SUB_COUNT - 1; i >= 0; i--)
		if (fs->subs[i] && fs->subs[i]->destroy)
			fs->subs[i]->destroy(fs);
	pthread_mutex_destroy(&fs->poll_lock);
	pthread_cond_destroy(&fs->poll_cond);
	pthread_mutex_destroy(&fs->handle_lock);
	memset(fs->subs, 0, sizeof(fs->subs));
}

void dsfs_release_handles(struct dsfs *fs)
{
	dsfs_ops_release_handles(fs);
}

size_t dsfs_ndatasets(struct dsfs *fs)
{
	return fs->datasets ? dsfs_dataset_table_count(fs->datasets) : 0;
}

/* Raise the mount's readahead window (the kernel only lets the FUSE init
 * reply lower it). The sysfs name is the bdi's "major:minor". */
static void dsfs_set_read_ahead(struct dsfs *fs)
{
	char path[128], val[32];
	struct stat st;
	int fd, len;

	if (!fs->opts->read_ahead_kb)
		return;
	/* A lookup (unlike a stat of the root, which the kernel answers by
	 * itself) waits for the INIT reply, which sets the bdi's readahead
	 * to min(current, max_readahead): raise it only after that. */
	snprintf(path, sizeof(path), "%s/.dstage", fs->opts->mountpoint);
	if ((stat(path, &st) && errno != ENOENT) || /* ENOENT: overlay */
	    stat(fs->opts->mountpoint, &st)) {
		log_warn("read_ahead_kb: stat %s: %s", fs->opts->mountpoint,
			 strerror(errno));
		return;
	}
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb",
		 major(st.st_dev), minor(st.st_dev));
	len = snprintf(val, sizeof(val), "%u\n", fs->opts->read_ahead_kb);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, val, (size_t)len) != len)
		log_warn("cannot set %s to %u (%s): reads keep the kernel's "
			 "default readahead",
			 path, fs->opts->read_ahead_kb, strerror(errno));
	else
		log_info("%s = %u", path, fs->opts->read_ahead_kb);
	if (fd >= 0)
		close(fd);
}

static bool dsfs_poller_wait(struct dsfs *fs, unsigned ms)
{
	struct timespec ts;
	bool stop;

	timeutil_real_after_ms(&ts, ms);
	pthread_mutex_lock(&fs->poll_lock);
	if (!fs->poll_stop)
		pthread_cond_timedwait(&fs->poll_cond, &fs->poll_lock, &ts);
	stop = fs->poll_stop;
	pthread_mutex_unlock(&fs->poll_lock);
	return stop;
}

static void *dsfs_poller_main(void *arg)
{
	struct dsfs *fs = arg;

	dsfs_set_read_ahead(fs);
	while (!dsfs_poller_wait(fs, fs->opts->poll_ms))
		for (int i = 0; i < DSFS_SUB_COUNT; i++)
			if (fs->subs[i]->poll)
				fs->subs[i]->poll(fs);
	return NULL;
}

int dsfs_poller_start(struct dsfs *fs)
{
	int ret;

	fs->poll_stop = false;
	ret = pthread_create(&fs->poller, NULL, dsfs_poller_main, fs);
	if (ret)
		return -ret;
	fs->poller_running = true;
	return 0;
}

void dsfs_poller_request_stop(struct dsfs *fs)
{
	atomic_store(&fs->stopping, true);
	pthread_mutex_lock(&fs->poll_lock);
	fs->poll_stop = true;
	pthread_cond_signal(&fs->poll_cond);
	pthread_mutex_unlock(&fs->poll_lock);
}

void dsfs_poller_stop(struct dsfs *fs)
{
	if (!fs->poller_running)
		return;
	dsfs_poller_request_stop(fs);
	pthread_join(fs->poller, NULL);
	fs->poller_running = false;
}
