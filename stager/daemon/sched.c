// SPDX-License-Identifier: MIT
/*
 * sched: how the daemon's running jobs share the source.
 *
 * The daemon has a fixed number of request slots (s3.max_inflight): a worker
 * holds one while it reads one chunk. When workers of several jobs wait,
 * the slot goes to the job with the smallest virtual time, where a job's
 * virtual time grows by bytes / weight for every chunk it is granted
 * (weighted fair queueing): a job of weight 4 gets four times the bytes of
 * a job of weight 1 while both are busy, and all of the source when alone.
 * A job joining starts at the smallest virtual time of the jobs present,
 * so it neither starves the others nor gets credit for time it was absent.
 *
 * A job may also have a cap in bytes per second: grants are spaced so that
 * chunk k starts no earlier than (bytes granted before it) / rate after the
 * job's first grant, which holds the average to the cap whatever the number
 * of workers.
 *
 * State: the list of joined jobs and the free slot count, under s->lock
 * (a leaf lock: nothing else is taken while holding it). Waiters sleep on
 * s->cond; every release and leave broadcasts.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "dstage/timeutil.h"
#include "sched.h"

struct sched_job {
	struct sched_job *next; /* s->jobs list; s->lock */
	double weight; /* fixed at join */
	double vtime; /* s->lock */
	unsigned waiting; /* workers waiting in sched_acquire; s->lock */
	uint64_t rate; /* bytes/s, 0: none; fixed */
	double t0; /* monotonic time of the first grant; s->lock */
	uint64_t granted; /* bytes granted; s->lock */
};

struct sched {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned free_slots; /* lock */
	struct sched_job *jobs; /* lock */
};

int sched_create(unsigned slots, struct sched **out)
{
	struct sched *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	s->free_slots = slots ? slots : 1;
	*out = s;
	return 0;
}

void sched_destroy(struct sched *s)
{
	if (!s)
		return;
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	free(s);
}

int sched_join(struct sched *s, unsigned weight, uint64_t rate,
	       struct sched_job **out)
{
	struct sched_job *j = calloc(1, sizeof(*j));
	bool any = false;
	double vmin = 0;

	if (!j)
		return -ENOMEM;
	j->weight = weight ? weight : 1;
	j->rate = rate;
	pthread_mutex_lock(&s->lock);
	for (struct sched_job *o = s->jobs; o; o = o->next)
		if (!any || o->vtime < vmin) {
			vmin = o->vtime;
			any = true;
		}
	j->vtime = vmin;
	j->next = s->jobs;
	s->jobs = j;
	pthread_mutex_unlock(&s->lock);
	*out = j;
	return 0;
}

void sched_leave(struct sched *s, struct sched_job *j)
{
	if (!j)
		return;
	pthread_mutex_lock(&s->lock);
	for (struct sched_job **p = &s->jobs; *p; p = &(*p)->next)
		if (*p == j) {
			*p = j->next;
			break;
		}
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	free(j);
}

/* true when no other job with waiters is further behind than j. */
static bool sched_turn(const struct sched *s, const struct sched_job *j)
{
	for (const struct sched_job *o = s->jobs; o; o = o->next)
		if (o != j && o->waiting && o->vtime < j->vtime)
			return false;
	return true;
}

/* Sleep until monotonic time t. */
static void sched_sleep_until(double t)
{
	double wait = t - timeutil_mono_s();
	struct timespec ts;

	if (wait <= 0)
		return;
	ts.tv_sec = (time_t)wait;
	ts.tv_nsec = (long)((wait - (double)ts.tv_sec) * 1e9);
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

void sched_acquire(struct sched *s, struct sched_job *j, uint64_t len)
{
	double start = 0;

	/* The cap first, without holding a slot while sleeping. */
	pthread_mutex_lock(&s->lock);
	if (j->rate) {
		if (!j->t0)
			j->t0 = timeutil_mono_s();
		start = j->t0 + (double)j->granted / (double)j->rate;
		j->granted += len;
	}
	pthread_mutex_unlock(&s->lock);
	if (start)
		sched_sleep_until(start);

	pthread_mutex_lock(&s->lock);
	j->waiting++;
	while (!s->free_slots || !sched_turn(s, j))
		pthread_cond_wait(&s->cond, &s->lock);
	j->waiting--;
	s->free_slots--;
	j->vtime += (double)len / j->weight;
	pthread_mutex_unlock(&s->lock);
}

void sched_release(struct sched *s)
{
	pthread_mutex_lock(&s->lock);
	s->free_slots++;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}
