// SPDX-License-Identifier: MIT
/*
 * ratelimit with an injected clock: request and byte rates over simulated
 * seconds, bursts, Retry-After holds and AIMD (halve on throttle, at most
 * once per gap, floor, additive recovery). No real time is used.
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "dstage/ratelimit.h"

/* Grants in [t0, t0 + ms) when asking every step ms for bytes each. */
static unsigned grants(struct ratelimit *rl, uint64_t t0, uint64_t ms,
		       uint64_t step, uint64_t bytes)
{
	unsigned n = 0;

	for (uint64_t t = t0; t < t0 + ms; t += step)
		while (!ratelimit_acquire(rl, t, bytes) && n < 1000000)
			n++;
	return n;
}

static void test_unlimited(void)
{
	struct ratelimit rl;

	CHECK_INT(ratelimit_init(&rl), 0);
	for (int i = 0; i < 1000; i++)
		CHECK_INT(ratelimit_acquire(&rl, 5, 1 << 20), 0);
	CHECK(ratelimit_rate(&rl) == 0);
	ratelimit_release(&rl);
}

static void test_request_rate(void)
{
	struct ratelimit rl;
	unsigned n;

	CHECK_INT(ratelimit_init(&rl), 0);
	ratelimit_configure(&rl, 10, 0);
	/* the burst: one second's worth at once, then a wait of 100 ms */
	n = grants(&rl, 1000, 1, 1, 0);
	CHECK_INT(n, 10);
	CHECK_INT(ratelimit_acquire(&rl, 1000, 0), 100);
	CHECK_INT(ratelimit_acquire(&rl, 1050, 0), 50);
	/* then 10 a second over 10 s */
	n = grants(&rl, 1001, 10000, 10, 0);
	CHECK(n >= 99 && n <= 101);
	/* an idle minute refills only one second's worth */
	n = grants(&rl, 70000, 1, 1, 0);
	CHECK_INT(n, 10);
	/* a rate under one a second still grants one, then waits */
	ratelimit_configure(&rl, 0.5, 0);
	CHECK_INT(ratelimit_acquire(&rl, 80000, 0), 0);
	CHECK_INT(ratelimit_acquire(&rl, 80000, 0), 2000);
	ratelimit_release(&rl);
}

static void test_byte_rate(void)
{
	struct ratelimit rl;
	unsigned n;

	CHECK_INT(ratelimit_init(&rl), 0);
	ratelimit_configure(&rl, 0, 1000000); /* 1 MB/s */
	n = grants(&rl, 0, 1, 1, 100000);
	CHECK_INT(n, 10);
	n = grants(&rl, 1, 5000, 10, 100000);
	CHECK(n >= 49 && n <= 51);
	/* a request larger than the bucket: waits for it full, leaves debt */
	CHECK(ratelimit_acquire(&rl, 20000, 3000000) == 0);
	CHECK_INT(ratelimit_acquire(&rl, 20000, 1), 2001);
	CHECK_INT(ratelimit_acquire(&rl, 22001, 1), 0);
	ratelimit_release(&rl);
}

static void test_both_limits(void)
{
	struct ratelimit rl;
	unsigned n;

	/* 100 requests/s but 10 of 1 MB fit in a second: bytes win */
	CHECK_INT(ratelimit_init(&rl), 0);
	ratelimit_configure(&rl, 100, 10 << 20);
	n = grants(&rl, 1000, 10000, 10, 1 << 20);
	CHECK(n >= 100 && n <= 111);
	ratelimit_release(&rl);
}

static void test_retry_after_hold(void)
{
	struct ratelimit rl;

	CHECK_INT(ratelimit_init(&rl), 0);
	/* unlimited, but a Retry-After holds every grant */
	ratelimit_throttled(&rl, 1000, 2000);
	CHECK_INT(ratelimit_acquire(&rl, 1000, 0), 2000);
	CHECK_INT(ratelimit_acquire(&rl, 2500, 0), 500);
	CHECK_INT(ratelimit_acquire(&rl, 3000, 0), 0);
	CHECK(ratelimit_rate(&rl) == 0); /* nothing to halve */
	/* bounded */
	ratelimit_throttled(&rl, 5000, 3600000);
	CHECK_INT(ratelimit_acquire(&rl, 5000, 0), RATELIMIT_HOLD_MAX_MS);
	/* a shorter hold never shortens a longer one */
	ratelimit_throttled(&rl, 6000, 1000);
	CHECK_INT(ratelimit_acquire(&rl, 6000, 0),
		  RATELIMIT_HOLD_MAX_MS - 1000);
	ratelimit_release(&rl);
}

static void test_aimd(void)
{
	struct ratelimit rl;
	unsigned n;

	CHECK_INT(ratelimit_init(&rl), 0);
	ratelimit_configure(&rl, 64, 0);
	CHECK(ratelimit_rate(&rl) == 64);
	ratelimit_throttled(&rl, 1000, 0);
	CHECK(ratelimit_rate(&rl) == 32);
	/* a burst of throttled answers within the gap: one cut */
	ratelimit_throttled(&rl, 1000, 0);
	ratelimit_throttled(&rl, 1999, 0);
	CHECK(fabs(ratelimit_rate(&rl) -
		   (32 + 64 / RATELIMIT_RECOVER_S * 0.999)) < 1e-6);
	/* after the gap: cut again; keep cutting down to the floor */
	for (uint64_t t = 2000; t < 20000; t += RATELIMIT_CUT_GAP_MS)
		ratelimit_throttled(&rl, t, 0);
	CHECK(ratelimit_rate(&rl) >= 64 / RATELIMIT_FLOOR_DIV);
	CHECK(ratelimit_rate(&rl) < 64 / RATELIMIT_FLOOR_DIV + 64 / 8.0);
	/* the cut rate is what grants see: about 4 + recovery, not 64 */
	n = grants(&rl, 19001, 1000, 1, 0);
	CHECK(n >= 4 && n <= 24);
	/* additive recovery: back at the maximum RECOVER_S s later */
	ratelimit_acquire(&rl, 19000 + (uint64_t)(RATELIMIT_RECOVER_S * 1000),
			  0);
	CHECK(ratelimit_rate(&rl) == 64);
	/* the floor of a slow maximum is the maximum */
	ratelimit_configure(&rl, 0.25, 0);
	ratelimit_throttled(&rl, 40000, 0);
	CHECK(ratelimit_rate(&rl) == 0.25);
	ratelimit_release(&rl);
}

static void test_retry_after_parse(void)
{
	/* 1445412480 is Wed, 21 Oct 2015 07:28:00 GMT */
	CHECK_INT(ratelimit_retry_after_ms("2", 0), 2000);
	CHECK_INT(ratelimit_retry_after_ms("0", 0), 0);
	CHECK_INT(ratelimit_retry_after_ms("3600", 0), RATELIMIT_HOLD_MAX_MS);
	CHECK_INT(ratelimit_retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT",
					   1445412480 - 5),
		  5000);
	CHECK_INT(ratelimit_retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT",
					   1445412480 + 5),
		  0);
	CHECK_INT(ratelimit_retry_after_ms("soon", 0), 0);
	CHECK_INT(ratelimit_retry_after_ms("-5", 0), 0);
	CHECK_INT(ratelimit_retry_after_ms("2x", 0), 0);
	CHECK_INT(ratelimit_retry_after_ms(NULL, 0), 0);
}

int main(void)
{
	test_retry_after_parse();
	test_unlimited();
	test_request_rate();
	test_byte_rate();
	test_both_limits();
	test_retry_after_hold();
	test_aimd();
	return check_result();
}
