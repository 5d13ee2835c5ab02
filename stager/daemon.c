// SPDX-License-Identifier: MIT
/*
 * daemon: `stager daemon`, the node's staging service.
 *
 * Threads: the main thread waits for SIGTERM/SIGINT; one thread accepts
 * connections on the Unix socket (daemon.socket, daemon_conn.c) and starts
 * a detached thread per connection (requests: daemon_req.c); one
 * dispatcher claims queued jobs from the catalog
 * (jobs.c) and starts a thread per job (runner.c), at most DAEMON_MAX_JOBS
 * at once.
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
 *   - a job is run by at most one thread: only the dispatcher claims, and a
 *     claim is one catalog transaction;
 *   - a runner_job is freed only when its last reference goes: the running
 *     list holds one (then the ring of recent jobs), each watcher one.
 *
 * Locks: d->lock protects running[], recent[], n_running and the wake-up
 * (cond). Order: d->lock, then a runner_job's lock. Connection threads own
 * their catalog and jobs connections.
 *
 * Authorization: daemon_conn.c (who is an admin), daemon_req.c (which
 * requests need one).
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon_i.h"
#include "dstage/cache.h"
#include "dstage/catalog.h"
#include "dstage/log.h"

struct daemon_jobarg {
	struct daemon *d;
	struct runner_job *rj;
	struct jobs_job j;
	unsigned slot;
};

/* Resolve daemon.admin_group once: getgrnam is not thread-safe, and the
 * connection threads only compare gids. */
static void daemon_admin_group(struct daemon *d)
{
	const char *name = d->cfg->daemon_admin_group;
	struct group gr, *res = NULL;
	char buf[16384];

	if (!name || !*name)
		return;
	if (getgrnam_r(name, &gr, buf, sizeof(buf), &res) || !res) {
		log_warn("daemon.admin_group '%s' is not a group on this node: "
			 "only root may change datasets and jobs (create the "
			 "group, then restart the daemon)",
			 name);
		return;
	}
	d->admin_gid = res->gr_gid;
	d->has_admin_gid = true;
}

void daemon_wake(struct daemon *d)
{
	pthread_mutex_lock(&d->lock);
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

struct runner_job *daemon_find(struct daemon *d, int64_t id)
{
	struct runner_job *rj = NULL;

	pthread_mutex_lock(&d->lock);
	for (unsigned i = 0; i < DAEMON_MAX_JOBS; i++)
		if (d->used[i] && d->running[i]->id == id) {
			rj = d->running[i];
			break;
		}
	for (unsigned i = 0; !rj && i < DAEMON_RECENT; i++)
		if (d->recent[i] && d->recent[i]->id == id)
			rj = d->recent[i];
	if (rj)
		atomic_fetch_add(&rj->refs, 1);
	pthread_mutex_unlock(&d->lock);
	return rj;
}

void daemon_cancel_dataset(struct daemon *d, struct jobs *jq,
			   const char *dataset)
{
	pthread_mutex_lock(&d->lock);
	for (unsigned i = 0; i < DAEMON_MAX_JOBS; i++)
		if (d->used[i] && !strcmp(d->running[i]->dataset, dataset)) {
			jobs_cancel(jq, d->running[i]->id, NULL);
			atomic_store(&d->running[i]->cancel, true);
		}
	pthread_mutex_unlock(&d->lock);
}

static void *daemon_job_thread(void *arg)
{
	struct daemon_jobarg *a = arg;
	struct daemon *d = a->d;

	struct runner_job *old;

	runner_run(&d->env, a->rj, &a->j);
	pthread_mutex_lock(&d->lock);
	d->used[a->slot] = false;
	d->running[a->slot] = NULL;
	d->n_running--;
	/* the running list's reference moves to the recent ring */
	old = d->recent[d->recent_next];
	d->recent[d->recent_next] = a->rj;
	d->recent_next = (d->recent_next + 1) % DAEMON_RECENT;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	runner_put(old);
	jobs_job_release(&a->j);
	free(a);
	return NULL;
}

static void *daemon_dispatch_thread(void *arg)
{
	struct daemon *d = arg;
	struct jobs *jq = NULL;
	int ret = jobs_open(d->cfg->catalog_path, &jq);

	if (ret) {
		log_error("dispatcher: cannot open the catalog: %s",
			  strerror(-ret));
		return NULL;
	}
	pthread_mutex_lock(&d->lock);
	while (!atomic_load(&d->stop)) {
		struct daemon_jobarg *a;
		struct timespec ts;
		unsigned slot = 0;

		if (d->n_running < DAEMON_MAX_JOBS) {
			a = calloc(1, sizeof(*a));
			pthread_mutex_unlock(&d->lock);
			ret = a ? jobs_claim(jq, &a->j) : -ENOMEM;
			pthread_mutex_lock(&d->lock);
			if (!ret) {
				a->d = d;
				a->rj = calloc(1, sizeof(*a->rj));
				ret = a->rj ? 0 : -ENOMEM;
			}
			if (!ret) {
				struct runner_job *rj = a->rj;

				rj->id = a->j.id;
				snprintf(rj->kind, sizeof(rj->kind), "%s",
					 a->j.kind);
				snprintf(rj->dataset, sizeof(rj->dataset), "%s",
					 a->j.dataset);
				rj->created = a->j.created;
				rj->started = stager_now();
				pthread_mutex_init(&rj->lock, NULL);
				pthread_cond_init(&rj->cond, NULL);
				atomic_store(&rj->refs, 2);
				while (d->used[slot])
					slot++;
				a->slot = slot;
				d->used[slot] = true;
				d->running[slot] = rj;
				d->n_running++;
				if (pthread_create(&d->threads[slot], NULL,
						   daemon_job_thread, a)) {
					log_error("cannot start job %" PRId64,
						  rj->id);
					d->used[slot] = false;
					d->n_running--;
					runner_put(rj);
					runner_put(rj);
					jobs_job_release(&a->j);
					free(a);
				}
				continue;
			}
			if (a) {
				if (ret != -ENOENT)
					jobs_job_release(&a->j);
				free(a);
			}
			if (ret && ret != -ENOENT && ret != -EBUSY)
				log_error("claiming a job: %s", strerror(-ret));
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&d->cond, &d->lock, &ts);
	}
	/* stopping: tell the jobs, wait for them */
	for (unsigned i = 0; i < DAEMON_MAX_JOBS; i++)
		if (d->used[i])
			atomic_store(&d->running[i]->cancel, true);
	for (unsigned i = 0; i < DAEMON_MAX_JOBS; i++) {
		pthread_t t;

		if (!d->used[i])
			continue;
		t = d->threads[i];
		pthread_mutex_unlock(&d->lock);
		pthread_join(t, NULL);
		pthread_mutex_lock(&d->lock);
	}
	pthread_mutex_unlock(&d->lock);
	jobs_close(jq);
	return NULL;
}

int daemon_main(const struct dstage_config *cfg, const struct stager_opts *o)
{
	struct daemon d = { .cfg = cfg, .lfd = -1, .lockfd = -1 };
	struct catalog *cat = NULL;
	struct jobs *jq = NULL;
	pthread_t acc, disp;
	bool acc_started = false, disp_started = false;
	unsigned requeued = 0;
	sigset_t set;
	int sig, ret;

	pthread_mutex_init(&d.lock, NULL);
	pthread_cond_init(&d.cond, NULL);
	pthread_mutex_init(&d.conn_lock, NULL);
	d.lim = o->lim;
	d.n_uids = d.lim.max_conns + 1; /* + root, not counted */
	d.uids = calloc(d.n_uids, sizeof(*d.uids));
	if (!d.uids)
		return STAGER_EXIT_FAIL;
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
	ret = cache_open(cfg, &d.env.cache);
	if (ret) {
		log_error("the cache %s cannot be opened (%s): stage and "
			  "verify --cache will fail until it can",
			  cfg->cache_dir, strerror(-ret));
		d.env.cache = NULL;
	}
	ret = sched_create(cfg->s3_max_inflight, &d.env.sched);
	if (ret)
		goto out;
	if (pthread_create(&acc, NULL, daemon_conn_accept_thread, &d)) {
		ret = -EAGAIN;
		goto out;
	}
	acc_started = true;
	if (pthread_create(&disp, NULL, daemon_dispatch_thread, &d)) {
		ret = -EAGAIN;
		goto out;
	}
	disp_started = true;
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
	daemon_wake(&d);
	if (acc_started)
		pthread_join(acc, NULL);
	if (disp_started)
		pthread_join(disp, NULL);
	if (d.lfd >= 0) {
		close(d.lfd);
		unlink(cfg->daemon_socket);
	}
	if (d.lockfd >= 0)
		close(d.lockfd);
	/* connection threads may still use the cache: exit without closing
	 * it; the kernel releases its locks and files. */
	sched_destroy(ret ? d.env.sched : NULL);
	jobs_close(jq);
	catalog_close(cat);
	return ret ? STAGER_EXIT_FAIL : STAGER_EXIT_OK;
}
