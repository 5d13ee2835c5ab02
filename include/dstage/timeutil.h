/* SPDX-License-Identifier: MIT */
/*
 * timeutil: the process's clock readings, one function a unit, so that no
 * module keeps its own copy. Monotonic readings (CLOCK_MONOTONIC) measure
 * intervals and deadlines and never go back; real-time readings
 * (CLOCK_REALTIME, time()) are wall-clock dates, stored or shown, and
 * what pthread_cond_timedwait's default clock waits on. Stateless; safe
 * from any thread. None of these fail.
 */
#ifndef DSTAGE_TIMEUTIL_H
#define DSTAGE_TIMEUTIL_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t timeutil_mono_ns(void);

/* CLOCK_MONOTONIC in whole milliseconds (nanoseconds truncated). */
int64_t timeutil_mono_ms(void);

/* CLOCK_MONOTONIC in seconds, with the fraction: for rates and progress. */
double timeutil_mono_s(void);

/* CLOCK_REALTIME in whole milliseconds since the epoch. */
int64_t timeutil_real_ms(void);

/* time(NULL): whole seconds since the epoch, as the catalogs store them. */
int64_t timeutil_real_s(void);

/* *ts = CLOCK_REALTIME now plus ms, normalised: the absolute deadline of a
 * pthread_cond_timedwait on a condition variable of the default clock. */
void timeutil_real_after_ms(struct timespec *ts, unsigned ms);

#endif
