// SPDX-License-Identifier: MIT
/*
 * dsfs: set-up and tear-down of struct dsfs, the per-thread catalog
 * connections, and the poller thread.
 *
 * Poller state machine: STOPPED --dsfs_poller_start--> RUNNING (first:
 * wait for the mount to answer, raise the bdi's read_ahead_kb; then every
 * opts.poll_ms: refresh the dataset table, send queued invalidations)
 * --dsfs_poller_stop--> STOPPED (joined). poll_stop is guarded by
 * poll_lock, a leaf lock.
 *
 * Catalog connections: a struct catalog serves one thread at a time, so
 * each thread (the session loop's workers, the poller) opens its own on
 * first use, read-only; a thread-specific-data destructor closes it when
 * the thread exits.
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

#include "dsfs.h"
#include "dstage/config.h"
#include "dstage/log.h"

static pthread_key_t dsfs_cat_key;
static pthread_once_t dsfs_cat_once = PTHREAD_ONCE_INIT;

static void dsfs_cat_close(void *p)
{
	catalog_close(p);
}

static void dsfs_cat_key_make(void)
{
	pthread_key_create(&dsfs_cat_key, dsfs_cat_close);
}

struct catalog *dsfs_catalog(struct dsfs *fs, int *err)
{
	struct catalog *cat;

	pthread_once(&dsfs_cat_once, dsfs_cat_key_make);
	cat = pthread_getspecific(dsfs_cat_key);
	if (cat)
		return cat;
	*err = catalog_open(fs->cfg->catalog_path, CATALOG_READONLY, &cat);
	if (*err) {
		/* A catalog nobody created yet is an empty one (polled). */
		if (*err != -ENOENT)
			log_error("catalog %s: cannot open: %s",
				  fs->cfg->catalog_path, strerror(-*err));
		return NULL;
	}
	pthread_setspecific(dsfs_cat_key, cat);
	return cat;
}

uint64_t dsfs_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void dsfs_static_node(struct dsfs_node *n, fuse_ino_t ino,
			     fuse_ino_t parent, const struct dsfs_subtree *sub,
			     enum dsfs_kind kind, const char *name, time_t now)
{
	memset(n, 0, sizeof(*n));
	n->ino = ino;
	n->parent = parent;
	n->sub = sub;
	n->kind = kind;
	n->name = (char *)name;
	n->nlookup = 1;
	n->mtime = now;
}

int dsfs_init(struct dsfs *fs, struct dsfs_opts *o,
	      const struct dstage_config *cfg)
{
	time_t now = time(NULL);
	int ret;

	memset(fs, 0, sizeof(*fs));
	fs->opts = o;
	fs->cfg = cfg;
	dsfs_static_node(&fs->root, DSFS_INO_ROOT, DSFS_INO_ROOT,
			 &dsfs_root_subtree, DSFS_STATIC_DIR, "", now);
	dsfs_static_node(&fs->datasets, DSFS_INO_DATASETS, DSFS_INO_ROOT,
			 &dsfs_datasets_subtree, DSFS_STATIC_DIR, "datasets",
			 now);
	dsfs_static_node(&fs->checkpoints, DSFS_INO_CHECKPOINTS, DSFS_INO_ROOT,
			 &dsfs_ckpt_subtree, DSFS_STATIC_DIR, "checkpoints",
			 now);
	dsfs_static_node(&fs->ctl, DSFS_INO_CTL, DSFS_INO_ROOT,
			 &dsfs_ctl_subtree, DSFS_STATIC_DIR, ".dstage", now);
	dsfs_static_node(&fs->prefetch, DSFS_INO_PREFETCH, DSFS_INO_CTL,
			 &dsfs_ctl_subtree, DSFS_CTL_FILE, "prefetch", now);
	dsfs_static_node(&fs->stats, DSFS_INO_STATS, DSFS_INO_CTL,
			 &dsfs_ctl_subtree, DSFS_CTL_FILE, "stats", now);
	snprintf(fs->ctl_status, sizeof(fs->ctl_status), "no list yet\n");
	ret = dsfs_nodes_init(fs);
	if (ret)
		return ret;
	pthread_rwlock_init(&fs->ds_lock, NULL);
	pthread_mutex_init(&fs->poll_lock, NULL);
	pthread_cond_init(&fs->poll_cond, NULL);
	pthread_mutex_init(&fs->ctl_lock, NULL);
	pthread_mutex_init(&fs->handle_lock, NULL);
	ret = dsfs_datasets_refresh(fs);
	if (ret) {
		dsfs_destroy(fs);
		return ret;
	}
	return 0;
}

void dsfs_destroy(struct dsfs *fs)
{
	dsfs_poller_stop(fs);
	dsfs_handles_release(fs);
	dsfs_datasets_destroy(fs);
	dsfs_nodes_destroy(fs);
	pthread_rwlock_destroy(&fs->ds_lock);
	pthread_mutex_destroy(&fs->poll_lock);
	pthread_cond_destroy(&fs->poll_cond);
	pthread_mutex_destroy(&fs->ctl_lock);
	pthread_mutex_destroy(&fs->handle_lock);
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
	if (stat(path, &st) || stat(fs->opts->mountpoint, &st)) {
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

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
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
	while (!dsfs_poller_wait(fs, fs->opts->poll_ms)) {
		int ret = dsfs_datasets_refresh(fs);

		if (ret)
			log_warn("catalog poll failed: %s (keeping the "
				 "current datasets)",
				 strerror(-ret));
		dsfs_datasets_flush_inval(fs);
	}
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
	pthread_mutex_lock(&fs->poll_lock);
	fs->poll_stop = true;
	pthread_cond_signal(&fs->poll_cond);
	pthread_mutex_unlock(&fs->poll_lock);
}

bool dsfs_poller_stopping(struct dsfs *fs)
{
	bool stop;

	pthread_mutex_lock(&fs->poll_lock);
	stop = fs->poll_stop;
	pthread_mutex_unlock(&fs->poll_lock);
	return stop;
}

void dsfs_poller_stop(struct dsfs *fs)
{
	if (!fs->poller_running)
		return;
	dsfs_poller_request_stop(fs);
	pthread_join(fs->poller, NULL);
	fs->poller_running = false;
}
