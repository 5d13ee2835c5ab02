// SPDX-License-Identifier: MIT
/*
 * daemon: `stager daemon`, the node's staging service.
 *
 * Threads: the main thread waits for SIGTERM/SIGINT; one thread accepts
 * connections on the Unix socket (daemon.socket, daemon_conn.c) and starts
 * a detached thread per connection (requests: daemon_req.c); one
 * dispatcher (daemon_jobs.c) claims queued jobs and starts a thread per
 * job (runner.c); one thread scrubs the cache (lib/glue/cachescrub.c,
 * cache.scrub_rate 0: none).
 *
 * Daemon state machine: starting (catalog opened and migrated, running jobs
 * of a crashed daemon re-queued, socket bound under an exclusive lock on
 * "<socket>.lock") -> serving -> stopping (signal: no new jobs, running jobs
 * told to stop and left `running` in the catalog so the next daemon resumes
 * them) -> exit.
 *
 * Invariants:
 *   - one daemon per socket: the flock on "<socket>.lock" is held for the
 *     process lifetime;
 *   - the jobs' invariants: daemon_jobs.c.
 *
 * Locks: see daemon_i.h (d->lock: daemon_jobs.c; d->conn_lock:
 * daemon_conn.c). This file only starts and joins the threads.
 *
 * Authorization: daemon_conn.c (who is an admin), daemon_req.c (which
 * requests need one).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon_i.h"
#include "dstage/cache.h"
#include "dstage/cachepol.h"
#include "dstage/cachescrub.h"
#include "dstage/catalog.h"
#include "dstage/log.h"
#include "dstage/metrics_cache.h"
#include "dstage/metrics_http.h"
/* Resolve daemon.admin_group once: getgrnam is not thread-safe, and the
 * connection threads only compare gids. */
static void daemon_admin_group(struct daemon *d)
{
	const char *name = d->cfg->daemon_admin_group;

	if (!name || !*name)
		return;
	if (daemon_peer_gid(name, &d->admin_gid)) {
		log_warn("daemon.admin_group '%s' is not a group on this node: "
			 "only root may change datasets and jobs (create the "
			 "group, then restart the daemon)",
			 name);
		return;
	}
	d->has_admin_gid = true;
}

/* Metrics: jobs by state, and the running stage jobs' progress (for the
 * "staging stalled" alert), read at each scrape through a jobs handle only
 * the metrics thread uses (a struct jobs is one connection, no lock). */
struct daemon_metrics {
	struct jobs *jq;
	uint64_t n[JOBS_CANCELLED + 1], done, total, seen;
};

static int daemon_metrics_job(void *arg, const struct jobs_job *j)
{
	struct daemon_metrics *dm = arg;

	if ((unsigned)j->state <= JOBS_CANCELLED)
		dm->n[j->state]++;
	if (j->state == JOBS_RUNNING) {
		dm->done += j->done;
		dm->total += j->total;
	}
	return ++dm->seen >= 1000000; /* bound one scrape's work */
}

/*
 * What each dataset's last finished verify job found (jobs_verify_counts):
 * the first METRICS_MAX_DATASETS datasets get a series each, the rest are
 * summed into dataset="/other", and a restricted dataset (one with a group)
 * is never named: it is summed into dataset="/restricted" (the page is open
 * to every local user; see metrics_cache.c).
 */
struct daemon_metrics_verify {
	struct metrics_ds ds;
	unsigned f; /* which family is being written */
};

static const char *const daemon_metrics_verify_names[3][2] = {
	{ "dstage_verify_damaged_blocks",
	  "Blocks the last verify of the dataset found damaged in the cache "
	  "and did not repair" },
	{ "dstage_verify_missing_blocks",
	  "Blocks the last verify of the dataset found missing from the "
	  "cache and did not fetch" },
	{ "dstage_verify_mismatched_files",
	  "Files whose SHA-256 differed in the last verify of the dataset" },
};

static int daemon_metrics_verify_row(void *arg, const char *name,
				     bool restricted,
				     const struct jobs_counts *k)
{
	struct daemon_metrics_verify *a = arg;
	uint64_t v = a->f == 0	 ? k->damaged
		     : a->f == 1 ? k->missing
				 : k->mismatched;

	metrics_ds_add(&a->ds, name, restricted, (double)v);
	return 0;
}

static void daemon_metrics_verify(struct jobs *jq, struct metrics_buf *b)
{
	for (unsigned f = 0; f < 3; f++) {
		struct daemon_metrics_verify a = { .f = f };
		const char *name = daemon_metrics_verify_names[f][0];

		metrics_family(b, name, "gauge",
			       daemon_metrics_verify_names[f][1]);
		metrics_ds_begin(&a.ds, b, name);
		/* bounded: at most a million datasets read per scrape */
		if (jobs_verify_counts(jq, 1000000, daemon_metrics_verify_row,
				       &a) < 0)
			return; /* logged */
		metrics_ds_end(&a.ds);
	}
}

static void daemon_metrics_collect(void *arg, struct metrics_buf *b)
{
	struct daemon_metrics *dm = arg;
	char labels[32];

	memset(dm->n, 0, sizeof(dm->n));
	dm->done = dm->total = dm->seen = 0;
	if (jobs_list(dm->jq, UINT32_MAX, daemon_metrics_job, dm) < 0)
		return; /* logged; the families are left out */
	metrics_family(b, "dstage_stager_jobs", "gauge",
		       "Jobs in the catalog by state");
	for (unsigned st = 0; st <= JOBS_CANCELLED; st++) {
		snprintf(labels, sizeof(labels), "state=\"%s\"",
			 jobs_state_name(st));
		metrics_sample(b, "dstage_stager_jobs", labels,
			       (double)dm->n[st]);
	}
	metrics_gauge(b, "dstage_stager_running_done_bytes",
		      "Bytes done of the running jobs", (double)dm->done);
	metrics_gauge(b, "dstage_stager_running_total_bytes",
		      "Bytes to do of the running jobs", (double)dm->total);
	daemon_metrics_verify(dm->jq, b);
}

int daemon_main(const struct dstage_config *cfg, const struct stager_opts *o)
{
	struct daemon_metrics dm = { 0 };
	struct metrics *metrics = NULL;
	struct metrics_http *mhttp = NULL;
	struct daemon d = { .cfg = cfg, .lfd = -1, .lockfd = -1 };
	struct catalog *cat = NULL;
	struct jobs *jq = NULL;
	struct cachepol *pol = NULL; /* kept with the cache: see out */
	pthread_t acc, disp;
	bool acc_started = false, disp_started = false;
	unsigned requeued = 0;
	sigset_t set;
	int sig, ret;

	pthread_mutex_init(&d.lock, NULL);
	pthread_cond_init(&d.cond, NULL);
	pthread_mutex_init(&d.conn_lock, NULL);
	pthread_cond_init(&d.conn_cond, NULL);
	d.lim = o->lim;
	d.n_uids = d.lim.max_conns + 1; /* + root, not counted */
	d.uids = calloc(d.n_uids, sizeof(*d.uids));
	if (!d.uids)
		return CLI_EXIT_FAIL;
	daemon_admin_group(&d);
	daemon_conn_fd_limit(&d);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	d.env.cfg = cfg;
	ret = catalog_open(cfg->catalog_path, CATALOG_CREATE, &cat);
	if (ret) {
		log_error("cannot open the catalog %s: %s", cfg->catalog_path,
			  strerror(-ret));
		goto out;
	}
	ret = jobs_open(cfg->catalog_path, &jq);
	if (!ret)
		ret = daemon_conn_listen(&d);
	if (!ret)
		ret = jobs_recover(jq, &requeued);
	if (ret)
		goto out;
	if (requeued)
		log_info("resuming %u job(s) interrupted by a crash or stop",
			 requeued);
	ret = cachepol_open(cfg, &pol);
	if (!ret)
		ret = cache_open(cfg, cachepol_source(pol), &d.env.cache);
	if (ret == -EACCES || ret == -EPERM) {
		/* An unsafe cache.dir (writable by others, another owner):
		 * cache_open said which and how to fix it. Not served. */
		log_error("refusing to start: the cache %s is not safe to use",
			  cfg->cache_dir);
		goto out;
	}
	if (ret) {
		log_error("the cache %s cannot be opened (%s): stage and "
			  "verify --cache will fail until it can",
			  cfg->cache_dir, strerror(-ret));
		d.env.cache = NULL;
	}
	ret = sched_create(cfg->s3_max_inflight, &d.env.sched);
	if (!ret)
		ret = metrics_new(&metrics);
	if (!ret)
		ret = metrics_add_collector(metrics, metrics_cache_collect,
					    d.env.cache);
	if (!ret && d.env.cache)
		ret = cachescrub_start(cfg, d.env.cache, &d.scrub);
	if (!ret && d.scrub)
		ret = metrics_add_collector(metrics, cachescrub_collect,
					    d.scrub);
	if (!ret && cfg->metrics_listen)
		ret = jobs_open(cfg->catalog_path, &dm.jq);
	if (!ret && dm.jq)
		ret = metrics_add_collector(metrics, daemon_metrics_collect,
					    &dm);
	if (!ret)
		ret = metrics_http_start(cfg->metrics_listen,
					 cfg->metrics_allow_remote, metrics,
					 &mhttp);
	if (ret)
		goto out;
	if (pthread_create(&acc, NULL, daemon_conn_accept_thread, &d)) {
		ret = -EAGAIN;
		goto out;
	}
	acc_started = true;
	if (pthread_create(&disp, NULL, daemon_jobs_dispatch_thread, &d)) {
		ret = -EAGAIN;
		goto out;
	}
	disp_started = true;
	if (daemon_lifecycle_start(&d))
		log_warn("checkpoints: the retry and lifecycle thread did not "
			 "start");
	log_info("stager daemon listening on %s (catalog %s, cache %s)",
		 cfg->daemon_socket, cfg->catalog_path, cfg->cache_dir);
	do {
		sig = 0;
		sigwait(&set, &sig);
	} while (sig == SIGHUP);
	log_info("signal %d: stopping; running jobs resume at the next start",
		 sig);
	ret = 0;
out:
	atomic_store(&d.stop, true);
	if (d.lfd >= 0)
		shutdown(d.lfd, SHUT_RDWR);
	daemon_jobs_wake(&d);
	if (acc_started)
		pthread_join(acc, NULL);
	if (disp_started)
		pthread_join(disp, NULL);
	daemon_lifecycle_stop(&d);
	if (d.lfd >= 0) {
		close(d.lfd);
		unlink(cfg->daemon_socket);
	}
	if (d.lockfd >= 0)
		close(d.lockfd);
	/* connection threads may still use the cache: exit without closing
	 * it; the kernel releases its locks and files. Only jobs use the
	 * scheduler, and the dispatcher has joined them. */
	sched_destroy(d.env.sched);
	metrics_http_stop(mhttp);
	metrics_free(metrics);
	jobs_close(dm.jq);
	/* the accept thread is joined: end the connections, whose threads
	 * use d; should one not end in time, d's connection state and the
	 * cache stay for it and the process exits under it */
	if (!daemon_conn_stop(&d)) {
		/* after the jobs (an idle open object may point at one of
		 * its stores), the metrics and the connections (they read
		 * its progress) */
		cachescrub_stop(d.scrub);
		free(d.uids);
		daemon_lifecycle_free(&d);
	}
	jobs_close(jq);
	catalog_close(cat);
	return ret ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
