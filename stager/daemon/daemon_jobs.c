// SPDX-License-Identifier: MIT
/*
 * daemon_jobs: the daemon's running jobs. One dispatcher thread claims
 * queued jobs from the catalog (lib/catalog/jobs.c) and starts a thread per job
 * (runner.c), at most DAEMON_MAX_JOBS at once; a finished job moves to a
 * ring of DAEMON_RECENT recent ones for late watchers.
 *
 * Job slot states: free -> running (claimed, its thread started) -> free
 * (the thread ended; the job is in the recent ring until pushed out).
 *
 * Invariants:
 *   - a job is run by at most one thread: only the dispatcher claims, and a
 *     claim is one catalog transaction;
 *   - a runner_job is freed only when its last reference goes: the running
 *     list holds one (then the ring of recent jobs, until pushed out or
 *     the dispatcher stops), its job thread one (until it ends), each
 *     watcher one.
 *
 * Locks: d->lock protects running[], used[], threads[], n_running,
 * recent[], recent_next and the wake-up (cond). Order: d->lock, then a
 * runner_job's lock.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon_i.h"
#include "dstage/log.h"

struct daemon_jobs_arg {
	struct daemon *d;
	struct runner_job *rj;
	struct jobs_job j;
	unsigned slot;
};

void daemon_jobs_wake(struct daemon *d)
{
	pthread_mutex_lock(&d->lock);
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

struct runner_job *daemon_jobs_find(struct daemon *d, int64_t id)
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

void daemon_jobs_cancel_dataset(struct daemon *d, struct jobs *jq,
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

static void *daemon_jobs_run_thread(void *arg)
{
	struct daemon_jobs_arg *a = arg;
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
	runner_put(a->rj); /* this thread's own reference */
	jobs_job_release(&a->j);
	free(a);
	return NULL;
}

void *daemon_jobs_dispatch_thread(void *arg)
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
		struct daemon_jobs_arg *a;
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
				rj->started = timeutil_mono_s();
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
						   daemon_jobs_run_thread, a)) {
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
		timeutil_real_after_ms(&ts, 1000);
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
	/* the ring's references go; a watcher still holding one frees its
	 * job when it lets go */
	for (unsigned i = 0; i < DAEMON_RECENT; i++) {
		runner_put(d->recent[i]);
		d->recent[i] = NULL;
	}
	pthread_mutex_unlock(&d->lock);
	jobs_close(jq);
	return NULL;
}
