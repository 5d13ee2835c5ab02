// SPDX-License-Identifier: MIT
/*
 * dstagefs: mount the dstage namespace (datasets, checkpoints, control
 * files) with the FUSE low-level API. See dstagefs --help and
 * docs/dstagefs.md.
 *
 * Life of the process: parse options -> load config -> clear a stale mount
 * -> open the catalog and load the dataset table -> new session, signal
 * handlers (SIGTERM, SIGINT, SIGHUP end the loop), mount -> daemonize
 * unless -f -> open the cache -> start the subtrees' threads (checkpoint
 * uploaders and retry: none may run across the fork) -> start the poller
 * -> multithreaded session
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

/* What a mount holds while it runs, for dsfs_main_stop to release. */
struct dsfs_main {
	struct dsfs fs;
	struct fuse_session *se;
	struct fuse_loop_config *lcfg;
	struct cache *cache;
	struct cachepol *pol;
	struct metrics *metrics;
	struct metrics_http *mhttp;
	char *real_mp;
	bool mounted, handlers;
};

/* Check the mountpoint (made when missing, unless --over) and that no
 * dstagefs is mounted there; make o->mountpoint absolute. Returns
 * DSFS_EXIT_OK or DSFS_EXIT_MOUNT (logged). */
static int dsfs_main_mountpoint(struct dsfs_main *m, struct dsfs_opts *o)
{
	if (dsfs_prepare_mountpoint(o->mountpoint, !o->over_dir))
		return DSFS_EXIT_MOUNT;
	if (dsfs_already_mounted(o->mountpoint)) {
		log_error("mountpoint %s: a dstagefs is already mounted there; "
			  "unmount it first with 'fusermount3 -u %s'",
			  o->mountpoint, o->mountpoint);
		return DSFS_EXIT_MOUNT;
	}
	/* Absolute from here on: unmounting happens from another cwd. */
	m->real_mp = realpath(o->mountpoint, NULL);
	if (!m->real_mp) {
		log_error("mountpoint %s: %s", o->mountpoint, strerror(errno));
		return DSFS_EXIT_MOUNT;
	}
	o->mountpoint = m->real_mp;
	return DSFS_EXIT_OK;
}

/* The -o options dsfs_opts_parse left for libfuse, and ours. Returns 0 or
 * -1 (no memory). */
static int dsfs_main_fuse_args(struct dsfs_opts *o)
{
	struct fuse_args *args = &o->fuse_args;

	if (fuse_opt_add_arg(args, "-o") ||
	    fuse_opt_add_arg(args, "fsname=dstage,subtype=dstagefs") ||
	    (o->debug && fuse_opt_add_arg(args, "-d")) ||
	    /* overlay: the kernel checks the tree's modes too (also on
	     * cached directories), and as root every user may use it */
	    (o->over_dir &&
	     (fuse_opt_add_arg(args, "-o") ||
	      fuse_opt_add_arg(args, geteuid() == 0
					     ? "default_permissions,allow_other"
					     : "default_permissions"))))
		return -1;
	return 0;
}

/* Create the FUSE session, take the signals, mount and (without -f) go to
 * the background. Returns DSFS_EXIT_OK or the exit code (logged). */
static int dsfs_main_mount(struct dsfs_main *m, struct dsfs_opts *o,
			   const struct dstage_config *cfg)
{
	m->se = fuse_session_new(&o->fuse_args, &dsfs_ops_ll,
				 sizeof(dsfs_ops_ll), &m->fs);
	if (!m->se) {
		log_error("libfuse refused the options (see the message "
			  "above); dstagefs --help lists its own");
		return DSFS_EXIT_USAGE;
	}
	m->fs.se = m->se;
	/* libfuse leaves alone a signal that is not at its default, and a
	 * shell starts background jobs with SIGINT ignored: reset them. */
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGHUP, SIG_DFL);
	if (fuse_set_signal_handlers(m->se))
		return DSFS_EXIT_RUNTIME;
	m->handlers = true;
	if (fuse_session_mount(m->se, o->mountpoint)) {
		log_error("mountpoint %s: mount failed (see the message above)",
			  o->mountpoint);
		return DSFS_EXIT_MOUNT;
	}
	m->mounted = true;
	if (fuse_daemonize(o->foreground))
		return DSFS_EXIT_RUNTIME;
	if (!o->foreground && !cfg->log_syslog)
		log_use_syslog("dstagefs");
	return DSFS_EXIT_OK;
}

/* Open the cache and start the poller and the metrics endpoint, their
 * threads blocking the signals that end the loop. Returns DSFS_EXIT_OK or
 * the exit code. */
static int dsfs_main_services(struct dsfs_main *m,
			      const struct dstage_config *cfg)
{
	sigset_t sigs, oldsigs;
	int ret;

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
	ret = cachepol_open(cfg, &m->pol);
	if (!ret)
		ret = cache_open(cfg, cachepol_source(m->pol), &m->cache);
	if (ret) {
		pthread_sigmask(SIG_SETMASK, &oldsigs, NULL);
		log_error("cache %s: cannot open: %s", cfg->cache_dir,
			  strerror(-ret));
		return DSFS_EXIT_STORE;
	}
	m->fs.cache = m->cache;
	/* the subtrees' threads: only now, after the fork into the
	 * background (fuse_daemonize), which keeps only its caller */
	ret = dsfs_start(&m->fs);
	if (ret) {
		pthread_sigmask(SIG_SETMASK, &oldsigs, NULL);
		log_error("cannot start the checkpoint threads: %s",
			  strerror(-ret));
		return DSFS_EXIT_RUNTIME;
	}
	/* Dataset files keep their pages in the mount (keep_cache): the
	 * cache files' copies of the bytes read would only double them. */
	cache_set_drop_behind(m->cache, true);
	ret = dsfs_poller_start(&m->fs);
	/* metrics.listen (off when unset): a bad address ends the mount. */
	if (!ret)
		ret = metrics_new(&m->metrics);
	if (!ret)
		ret = metrics_add_collector(m->metrics, metrics_cache_collect,
					    m->cache);
	if (!ret)
		ret = metrics_http_start(cfg->metrics_listen,
					 cfg->metrics_allow_remote, m->metrics,
					 &m->mhttp);
	pthread_sigmask(SIG_SETMASK, &oldsigs, NULL);
	return ret ? DSFS_EXIT_RUNTIME : DSFS_EXIT_OK;
}

/* Serve requests until a signal or an unmount ends the session. Returns
 * the exit code. */
static int dsfs_main_loop(struct dsfs_main *m, const struct dsfs_opts *o,
			  const struct dstage_config *cfg)
{
	int ret;

	m->lcfg = fuse_loop_cfg_create();
	if (!m->lcfg)
		return DSFS_EXIT_RUNTIME;
	fuse_loop_cfg_set_clone_fd(m->lcfg, o->clone_fd);
	fuse_loop_cfg_set_max_threads(m->lcfg, o->threads);
	fuse_loop_cfg_set_idle_threads(m->lcfg, o->threads);
	if (o->over_dir)
		log_info("mounted over %s (overlay), cache %s, %u threads%s",
			 o->mountpoint, cfg->cache_dir, o->threads,
			 o->clone_fd ? ", clone_fd" : "");
	else
		log_info("mounted %s: %zu datasets from %s, cache %s, %u "
			 "threads%s",
			 o->mountpoint, dsfs_ndatasets(&m->fs),
			 cfg->catalog_path, cfg->cache_dir, o->threads,
			 o->clone_fd ? ", clone_fd" : "");
	ret = fuse_session_loop_mt(m->se, m->lcfg);
	if (ret > 0) /* 3.14: the number of the signal that ended it */
		log_info("signal %d: unmounting %s", ret, o->mountpoint);
	else if (ret < 0) {
		log_error("session loop failed: %s", strerror(-ret));
		return DSFS_EXIT_RUNTIME;
	}
	return DSFS_EXIT_OK;
}

/* Unmount and release what the mount holds, in order. */
static void dsfs_main_stop(struct dsfs_main *m, const struct dsfs_opts *o)
{
	/* Unmount first: it ends any request the poller waits on. */
	if (m->mounted) {
		dsfs_poller_request_stop(&m->fs);
		fuse_session_unmount(m->se);
		log_info("unmounted %s", o->mountpoint);
	}
	dsfs_poller_stop(&m->fs);
	metrics_http_stop(m->mhttp); /* before the cache it reads */
	metrics_free(m->metrics);
	if (m->handlers)
		fuse_remove_signal_handlers(m->se);
	if (m->se)
		fuse_session_destroy(m->se);
	fuse_loop_cfg_destroy(m->lcfg);
	dsfs_release_handles(&m->fs); /* no RELEASE comes any more */
	cache_close(m->cache);
	cachepol_close(m->pol);
	m->fs.cache = NULL;
	dsfs_destroy(&m->fs);
}

/* Mount, serve until unmounted or signalled, unmount. Returns the exit
 * code. */
static int dsfs_run(struct dsfs_opts *o, struct dstage_config *cfg)
{
	struct dsfs_main m = { 0 };
	int ret, code;

	code = dsfs_main_mountpoint(&m, o);
	if (code) {
		free(m.real_mp);
		return code;
	}
	ret = dsfs_init(&m.fs, o, cfg);
	if (ret) {
		free(m.real_mp);
		if (o->over_dir) /* dsfs_overlay logged why */
			return DSFS_EXIT_MOUNT;
		log_error("cannot load the datasets from the catalog %s: %s",
			  cfg->catalog_path, strerror(-ret));
		return DSFS_EXIT_STORE;
	}
	code = dsfs_main_fuse_args(o) ? DSFS_EXIT_RUNTIME : DSFS_EXIT_OK;
	if (!code)
		code = dsfs_main_mount(&m, o, cfg);
	if (!code)
		code = dsfs_main_services(&m, cfg);
	if (!code)
		code = dsfs_main_loop(&m, o, cfg);
	dsfs_main_stop(&m, o);
	free(m.real_mp);
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
