// SPDX-License-Identifier: MIT
/*
 * The scrub's rate bound and schedule (lib/glue/cachescrub.c), with an
 * injected clock: no real time is read or slept. A simulated reader reads
 * objects back to back, each taking no time, and sleeps what
 * cachescrub_pace_wait says; the bytes read over every window must stay
 * within the rate plus the credit and one object.
 */
#include <stdint.h>

#include "check.h"
#include "dstage/cachescrub.h"

#define NS 1000000000ull
#define MB 1000000ull

static void test_unbounded(void)
{
	struct cachescrub_pace p = { .rate = 0 };

	for (int i = 0; i < 100; i++)
		CHECK_INT(cachescrub_pace_wait(&p, 5, 1ull << 40), 0);
}

/* One object of 50 MB at 50 MB/s: a second's wait; the first second's
 * credit is there only after a second of history. */
static void test_one_object(void)
{
	struct cachescrub_pace p = { .rate = 50 * MB };

	/* at time 0 there is no credit yet (floor 0): a full second */
	CHECK_INT(cachescrub_pace_wait(&p, 0, 50 * MB), NS);
	/* read at once again: a second more, from where the pace was */
	CHECK_INT(cachescrub_pace_wait(&p, 0, 50 * MB), 2 * NS);
	/* half a block's worth, after waiting: */
	CHECK_INT(cachescrub_pace_wait(&p, 2 * NS, 25 * MB), NS / 2);
}

/* After a long idle only one second's credit is left: a burst of at most
 * rate bytes goes without a wait, the next byte waits. */
static void test_idle_credit_capped(void)
{
	struct cachescrub_pace p = { .rate = 10 * MB };
	uint64_t t = 3600 * NS;

	CHECK_INT(cachescrub_pace_wait(&p, t, 10 * MB), 0);
	CHECK_INT(cachescrub_pace_wait(&p, t, 10 * MB), NS);
}

/* Back-to-back reads of uneven objects over a simulated hour: in every
 * window between two read starts, bytes <= rate * span + credit + the
 * largest object, and the total is within one object of rate * time. */
static void test_average_bound(void)
{
	const uint64_t rate = 7 * MB, big = 64 * MB;
	struct cachescrub_pace p = { .rate = rate };
	static uint64_t start[4096], before[4097];
	uint64_t t = 1000 * NS, seed = 12345, total = 0;
	unsigned n = 0;

	while (n < 4096 && t < 1000 * NS + 3600 * NS) {
		uint64_t b;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		b = (seed >> 33) % big + 1;
		start[n] = t;
		before[n] = total;
		n++;
		total += b;
		t += cachescrub_pace_wait(&p, t, b);
	}
	CHECK(n > 100);
	before[n] = total;
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = i; j < n; j += 1 + j % 5) {
			unsigned __int128 sum = before[j + 1] - before[i], cap;

			cap = (unsigned __int128)rate * (start[j] - start[i]) /
				      NS +
			      rate + big;
			CHECK(sum <= cap);
		}
	/* and it is not slower than the rate either (no lost time) */
	CHECK((unsigned __int128)total * NS >=
	      (unsigned __int128)rate * (t - 1000 * NS));
}

/* Huge objects and rates neither overflow nor wrap. */
static void test_no_overflow(void)
{
	struct cachescrub_pace p = { .rate = 1 };

	CHECK(cachescrub_pace_wait(&p, NS, UINT64_MAX) == UINT64_MAX - NS);
	p = (struct cachescrub_pace){ .rate = UINT64_MAX };
	CHECK_INT(cachescrub_pace_wait(&p, 2 * NS, 1ull << 40), 0);
}

static void test_next_start(void)
{
	const uint64_t week = 7ull * 24 * 3600 * 1000;

	/* a pass that started at 1000 and took less than its interval */
	CHECK_INT(cachescrub_next_start(1000, week, 5000), 1000 + 604800);
	/* one that took longer: the next starts now */
	CHECK_INT(cachescrub_next_start(1000, week, 1000 + 700000),
		  1000 + 700000);
	/* sub-second intervals count as 0 s: at once */
	CHECK_INT(cachescrub_next_start(1000, 500, 1000), 1000);
}

int main(void)
{
	test_unbounded();
	test_one_object();
	test_idle_credit_capped();
	test_average_bound();
	test_no_overflow();
	test_next_start();
	return check_result();
}
