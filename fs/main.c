// SPDX-License-Identifier: MIT
/*
 * dstagefs: mount the dstage namespace (datasets, checkpoints, control
 * files) with the FUSE low-level API. See dstagefs --help and
 * docs/dstagefs.md.
 *
 * Life of the process: parse options -> load config -> clear a stale mount
 * -> open the catalog and load the dataset table -> new session, signal
 * handlers (SIGTERM, SIGINT, SIGHUP end the loop), mount -> daemonize
 * unless -f -> open the cache -> start the poller -> multithreaded session
 * loop -> unmount -> stop the poller -> free everything.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsfs.h"
#include "dsfs_ops.h"
#include "dstage/cache.h"
#include "dstage/cachepol.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/metrics_cache.h"
#include "dstage/metrics_http.h"

/* Run fusermount3 -uz MOUNTPOINT (for a non-root user). */
static int dsfs_fusermount_lazy(const char *mp)
{
	pid_t pid = fork();
	int status;

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", "-uz", mp, (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0)
		return -errno;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

/*
 * A dstagefs killed by SIGKILL leaves its mount behind: every access fails
 * with ENOTCONN. Detach it (lazily, so processes still inside it do not
 * block us) and say so.
 */
static int dsfs_prepare_mountpoint(const char *mp, bool create)
{
	struct statfs sfs;
	struct stat st;

	/* statfs always reaches a FUSE daemon, where stat may be answered
	 * from cached attributes even on a dead connection. */
	if (statfs(mp, &sfs) == 0 && stat(mp, &st) == 0)
		goto check_dir;
	if (errno == ENOENT && !create) {
		log_error("overlay %s: no such directory", mp);
		return -ENOENT;
	}
	if (errno == ENOENT) {
		if (mkdir(mp, 0755) && errno != EEXIST) {
			log_error("mountpoint %s: cannot create it: %s", mp,
				  strerror(errno));
			return -errno;
		}
		log_info("mountpoint %s: created", mp);
		return 0;
	}
	if (errno != ENOTCONN) {
		log_error("mountpoint %s: %s", mp, strerror(errno));
		return -errno;
	}
	log_warn("mountpoint %s: stale FUSE mount (transport endpoint is not "
		 "connected), left by a file system that was killed; "
		 "detaching it (umount2 MNT_DETACH, as 'fusermount3 -uz %s')",
		 mp, mp);
	if (umount2(mp, MNT_DETACH) == 0) {
		log_info("mountpoint %s: stale mount detached", mp);
	} else {
		int err = errno;

		if (dsfs_fusermount_lazy(mp) == 0) {
			log_info("mountpoint %s: stale mount detached with "
				 "fusermount3 -uz",
				 mp);
		} else {
			log_error(
				"mountpoint %s: cannot detach the stale mount "
				"(%s); run 'fusermount3 -uz %s' (or 'umount "
				"-l %s' as root) and start again",
				mp, strerror(err), mp, mp);
			return -err;
		}
	}
	if (stat(mp, &st)) {
		log_error("mountpoint %s: still unusable after detaching: %s",
			  mp, strerror(errno));
		return -errno;
	}
check_dir:
	if (!S_ISDIR(st.st_mode)) {
		log_error("mountpoint %s: not a directory", mp);
		return -ENOTDIR;
	}
	return 0;
}

/* Whether a dstagefs is already mounted at mp (per /proc/self/mountinfo). */
static bool dsfs_already_mounted(const char *mp)
{
	char *real = realpath(mp, NULL), line[4096];
	bool found = false;
	FILE *f;

	if (!real)
		return false;
	f = fopen("/proc/self/mountinfo", "re");
	while (f && !found && fgets(line, sizeof(line), f)) {
		char point[4096], fstype[256];
		const char *sep = strstr(line, " - ");

		if (sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1 ||
		    !sep || sscanf(sep + 3, "%255s", fstype) != 1)
			continue;
		found = strcmp(point, real) == 0 &&
			strcmp(fstype, "fuse.dstagefs") == 0;
	}
	if (f)
		fclose(f);
	free(real);
	return found;
}

/*
 * The cache keeps a quarter of the process's descriptors as idle open
 * objects (a small file read again after its pages were dropped then
 * costs one disk read, not three): raise the soft RLIMIT_NOFILE towards
 * DSFS_MAIN_NOFILE within the hard limit, as a shell's 1024 would leave
 * room for only 256.
 */
#define DSFS_MAIN_NOFILE 65536

static void dsfs_main_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= DSFS_MAIN_NOFILE ||
	    rl.rlim_cur >= rl.rlim_max)
		return;
	rl.rlim_cur =
		rl.rlim_max < DSFS_MAIN_NOFILE ? rl.rlim_max : DSFS_MAIN_NOFILE;
	if (setrlimit(RLIMIT_NOFILE, &rl))
		log_warn("cannot raise RLIMIT_NOFILE to %llu: %s",
			 (unsigned long long)rl.rlim_cur, strerror(errno));
}

static int dsfs_run(struct dsfs_opts *o, struct dstage_config *cfg)
{
	struct fuse_args *args = &o->fuse_args;
	struct fuse_loop_config *lcfg = NULL;
	struct fuse_session *se = NULL;
	struct cache *cache = NULL;
	struct cachepol *pol = NULL;
	struct metrics *metrics = NULL;
	struct metrics_http *mhttp = NULL;
	char *real_mp = NULL;
	bool mounted = false, handlers = false;
	sigset_t sigs, oldsigs;
	struct dsfs fs;
	int ret, code = DSFS_EXIT_OK;

	if (dsfs_prepare_mountpoint(o->mountpoint, !o->over_dir))
		return DSFS_EXIT_MOUNT;
	if (dsfs_already_mounted(o->mountpoint)) {
		log_error("mountpoint %s: a dstagefs is already mounted there; "
			  "unmount it first with 'fusermount3 -u %s'",
			  o->mountpoint, o->mountpoint);
		return DSFS_EXIT_MOUNT;
	}
	/* Absolute from here on: unmounting happens from another cwd. */
	real_mp = realpath(o->mountpoint, NULL);
	if (!real_mp) {
		log_error("mountpoint %s: %s", o->mountpoint, strerror(errno));
		return DSFS_EXIT_MOUNT;
	}
	o->mountpoint = real_mp;
	ret = dsfs_init(&fs, o, cfg);
	if (ret) {
		if (o->over_dir) { /* dsfs_overlay logged why */
			free(real_mp);
			return DSFS_EXIT_MOUNT;
		}
		log_error("cannot load the datasets from the catalog %s: %s",
			  cfg->catalog_path, strerror(-ret));
		free(real_mp);
		return DSFS_EXIT_STORE;
	}
	/* The -o options dsfs_opts_parse left for libfuse, and ours. */
	if (fuse_opt_add_arg(args, "-o") ||
	    fuse_opt_add_arg(args, "fsname=dstage,subtype=dstagefs") ||
	    (o->debug && fuse_opt_add_arg(args, "-d")) ||
	    /* overlay: the kernel checks the tree's modes too (also on
	     * cached directories), and as root every user may use it */
	    (o->over_dir &&
	     (fuse_opt_add_arg(args, "-o") ||
	      fuse_opt_add_arg(args, geteuid() == 0
					     ? "default_permissions,allow_other"
					     : "default_permissions")))) {
		code = DSFS_EXIT_RUNTIME;
		goto out;
	}
	se = fuse_session_new(args, &dsfs_ops_ll, sizeof(dsfs_ops_ll), &fs);
	if (!se) {
		log_error("libfuse refused the options (see the message "
			  "above); dstagefs --help lists its own");
		code = DSFS_EXIT_USAGE;
		goto out;
	}
	fs.se = se;
	/* libfuse leaves alone a signal that is not at its default, and a
	 * shell starts background jobs with SIGINT ignored: reset them. */
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGHUP, SIG_DFL);
	if (fuse_set_signal_handlers(se)) {
		code = DSFS_EXIT_RUNTIME;
		goto out;
	}
	handlers = true;
	if (fuse_session_mount(se, o->mountpoint)) {
		log_error("mountpoint %s: mount failed (see the message above)",
			  o->mountpoint);
		code = DSFS_EXIT_MOUNT;
		goto out;
	}
	mounted = true;
	if (fuse_daemonize(o->foreground)) {
		code = DSFS_EXIT_RUNTIME;
		goto out;
	}
	if (!o->foreground && !cfg->log_syslog)
		log_use_syslog("dstagefs");
	/*
	 * Threads started from here (the cache's, the poller) must not take
	 * SIGTERM/SIGINT/SIGHUP: libfuse's handler only ends the loop when
	 * the signal lands on the thread waiting in it (its own workers
	 * block all signals).
	 */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, &oldsigs);
	dsfs_main_fd_limit();
	ret = cachepol_open(cfg, &pol);
	if (!ret)
		ret = cache_open(cfg, cachepol_source(pol), &cache);
	if (ret) {
		pthread_sigmask(SIG_SETMASK, &oldsigs, NULL);
		log_error("cache %s: cannot open: %s", cfg->cache_dir,
			  strerror(-ret));
		code = DSFS_EXIT_STORE;
		goto out;
	}
	fs.cache = cache;
	/* Dataset files keep their pages in the mount (keep_cache): the
	 * cache files' copies of the bytes read would only double them. */
	cache_set_drop_behind(cache, true);
	ret = dsfs_poller_start(&fs);
	/* metrics.listen (off when unset): a bad address ends the mount. */
	if (!ret)
		ret = metrics_new(&metrics);
	if (!ret)
		ret = metrics_add_collector(metrics, metrics_cache_collect,
					    cache);
	if (!ret)
		ret = metrics_http_start(cfg->metrics_listen,
					 cfg->metrics_allow_remote, metrics,
					 &mhttp);
	pthread_sigmask(SIG_SETMASK, &oldsigs, NULL);
	if (ret) {
		code = DSFS_EXIT_RUNTIME;
		goto out;
	}
	lcfg = fuse_loop_cfg_create();
	if (!lcfg) {
		code = DSFS_EXIT_RUNTIME;
		goto out;
	}
	fuse_loop_cfg_set_clone_fd(lcfg, o->clone_fd);
	fuse_loop_cfg_set_max_threads(lcfg, o->threads);
	fuse_loop_cfg_set_idle_threads(lcfg, o->threads);
	if (o->over_dir)
		log_info("mounted over %s (overlay), cache %s, %u threads%s",
			 o->mountpoint, cfg->cache_dir, o->threads,
			 o->clone_fd ? ", clone_fd" : "");
	else
		log_info("mounted %s: %zu datasets from %s, cache %s, %u "
			 "threads%s",
			 o->mountpoint, dsfs_ndatasets(&fs), cfg->catalog_path,
			 cfg->cache_dir, o->threads,
			 o->clone_fd ? ", clone_fd" : "");
	ret = fuse_session_loop_mt(se, lcfg);
	if (ret > 0) /* 3.14: the number of the signal that ended it */
		log_info("signal %d: unmounting %s", ret, o->mountpoint);
	else if (ret < 0) {
		log_error("session loop failed: %s", strerror(-ret));
		code = DSFS_EXIT_RUNTIME;
	}
out:
	/* Unmount first: it ends any request the poller waits on. */
	if (mounted) {
		dsfs_poller_request_stop(&fs);
		fuse_session_unmount(se);
		log_info("unmounted %s", o->mountpoint);
	}
	dsfs_poller_stop(&fs);
	metrics_http_stop(mhttp); /* before the cache it reads */
	metrics_free(metrics);
	if (handlers)
		fuse_remove_signal_handlers(se);
	if (se)
		fuse_session_destroy(se);
	fuse_loop_cfg_destroy(lcfg);
	dsfs_release_handles(&fs); /* no RELEASE comes any more */
	cache_close(cache);
	cachepol_close(pol);
	fs.cache = NULL;
	dsfs_destroy(&fs);
	free(real_mp);
	return code;
}

int main(int argc, char **argv)
{
	struct dstage_config *cfg = NULL;
	struct dsfs_opts o;
	char err[1024];
	int ret, code;

	ret = dsfs_opts_parse(argc, argv, &o);
	if (ret) {
		fprintf(stderr, "Try 'dstagefs --help'.\n");
		dsfs_opts_release(&o);
		return DSFS_EXIT_USAGE;
	}
	if (o.show_help || o.show_version) {
		if (o.show_help)
			dsfs_opts_help(argv[0]);
		else
			printf("dstagefs 0.1.0 (libfuse %s)\n",
			       fuse_pkgversion());
		dsfs_opts_release(&o);
		return DSFS_EXIT_OK;
	}
	ret = config_load(o.config_path, &cfg, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "dstagefs: %s\n", err);
		dsfs_opts_release(&o);
		return DSFS_EXIT_USAGE;
	}
	log_set_level(cfg->log_level);
	/* overlay.dir: the transparent mode unless the command line names
	 * a mount point. */
	if (!o.over_dir && !o.mountpoint_given && cfg->overlay_dir)
		o.over_dir = o.mountpoint = cfg->overlay_dir;
	if (o.log_level) {
		int lvl = log_level_parse(o.log_level);

		if (lvl < 0) {
			fprintf(stderr,
				"dstagefs: bad log level '%s': expected "
				"error, warn, info or debug\n",
				o.log_level);
			config_free(cfg);
			dsfs_opts_release(&o);
			return DSFS_EXIT_USAGE;
		}
		log_set_level(lvl);
	}
	if (cfg->log_syslog)
		log_use_syslog("dstagefs");
	/* Writes to a dead pipe (a reader gone) must not kill the mount. */
	signal(SIGPIPE, SIG_IGN);
	code = dsfs_run(&o, cfg);
	config_free(cfg);
	dsfs_opts_release(&o);
	return code;
}
