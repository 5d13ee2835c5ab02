/* SPDX-License-Identifier: MIT */
/*
 * check.h: the smallest test harness. CHECK() records a failure and goes on;
 * a test's main returns check_result(): 0 pass, 1 fail. Return 77 to skip.
 */
#ifndef DSTAGE_TEST_CHECK_H
#define DSTAGE_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures;

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, \
				__LINE__, #cond);                              \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_INT(a, b)                                                     \
	do {                                                                \
		long long check_a_ = (long long)(a),                        \
			  check_b_ = (long long)(b);                        \
		if (check_a_ != check_b_) {                                 \
			fprintf(stderr,                                     \
				"%s:%d: %s == %lld, expected %s == %lld\n", \
				__FILE__, __LINE__, #a, check_a_, #b,       \
				check_b_);                                  \
			check_failures++;                                   \
		}                                                           \
	} while (0)

#define CHECK_STR(a, b)                                                     \
	do {                                                                \
		const char *check_a_ = (a), *check_b_ = (b);                \
		if (!check_a_ || !check_b_ || strcmp(check_a_, check_b_)) { \
			fprintf(stderr,                                     \
				"%s:%d: %s == \"%s\", expected \"%s\"\n",   \
				__FILE__, __LINE__, #a,                     \
				check_a_ ? check_a_ : "(null)",             \
				check_b_ ? check_b_ : "(null)");            \
			check_failures++;                                   \
		}                                                           \
	} while (0)

static inline int check_result(void)
{
	if (check_failures)
		fprintf(stderr, "%d check(s) failed\n", check_failures);
	return check_failures ? 1 : 0;
}

#endif
