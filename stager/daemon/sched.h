/* SPDX-License-Identifier: MIT */
/*
 * sched: how the daemon's running jobs share the source (request slots
 * shared by priority, per-job bandwidth caps). Used by daemon.c, which
 * makes one, and runner.c, whose workers take its slots; private to
 * stager/daemon/.
 */
#ifndef DSTAGE_STAGER_SCHED_H
#define DSTAGE_STAGER_SCHED_H

#include <stdint.h>

/* sched.c: see there for the rules. */
struct sched;
struct sched_job;
int sched_create(unsigned slots, struct sched **out);
void sched_destroy(struct sched *s); /* accepts NULL */
/* Register a job with weight (>= 1) and a cap in bytes/s (0: none). */
int sched_join(struct sched *s, unsigned weight, uint64_t rate,
	       struct sched_job **out);
void sched_leave(struct sched *s, struct sched_job *j); /* accepts NULL */
/* Wait for a slot and for the cap to allow len bytes. */
void sched_acquire(struct sched *s, struct sched_job *j, uint64_t len);
void sched_release(struct sched *s);

#endif
