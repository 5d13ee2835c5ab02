// SPDX-License-Identifier: MIT
/* grow: capacity doubles from the first size, keeps what was there, and
 * refuses a size that overflows without touching the array. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "dstage/grow.h"

struct item {
	int a, b;
};

int main(void)
{
	struct item *v = NULL;
	size_t n = 0, cap = 0;
	char *buf = NULL;
	size_t bcap = 0;

	/* One at a time: 4, 8, 16, 32 ... and the elements survive. */
	for (int i = 0; i < 100; i++) {
		CHECK_INT(GROW_ONE(v, n, cap, 4), 0);
		v[n].a = i;
		v[n++].b = -i;
	}
	CHECK_INT(cap, 128);
	for (int i = 0; i < 100; i++)
		CHECK(v[i].a == i && v[i].b == -i);

	/* Enough room already: nothing changes. */
	struct item *same = v;
	CHECK_INT(grow_array(&v, &cap, 128, sizeof(*v), 4), 0);
	CHECK(v == same && cap == 128);

	/* A need far past the capacity: the first doubling at or above it. */
	CHECK_INT(grow_array(&buf, &bcap, 1000, 1, 64), 0);
	CHECK_INT(bcap, 1024);
	CHECK_INT(grow_array(&buf, &bcap, 1025, 1, 64), 0);
	CHECK_INT(bcap, 2048);

	/* first 0 counts as 1. */
	char *one = NULL;
	size_t ocap = 0;
	CHECK_INT(grow_array(&one, &ocap, 3, 1, 0), 0);
	CHECK_INT(ocap, 4);
	free(one);

	/* Overflow of the element count or of the byte size: -ENOMEM, and
	 * the array and its capacity are as they were. */
	same = v;
	CHECK_INT(grow_array(&v, &cap, SIZE_MAX, sizeof(*v), 4), -ENOMEM);
	CHECK(v == same && cap == 128);
	CHECK_INT(grow_array(&v, &cap, SIZE_MAX / 4, sizeof(*v), 4), -ENOMEM);
	CHECK(v == same && cap == 128);
	CHECK(v[99].a == 99);

	free(v);
	free(buf);
	return check_result();
}
