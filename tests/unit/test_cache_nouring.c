// SPDX-License-Identifier: MIT
/*
 * test_cache_nouring: every test_cache test with io_uring disabled
 * (DSTAGE_NO_URING=1), so the pread/pwrite fallback path carries all cache
 * I/O, and with direct writes off (DSTAGE_NO_DIRECT=1), so fills go through
 * the page cache as on filesystems that refuse O_DIRECT. test_cache itself
 * runs with both on.
 */
#include <stdlib.h>

int test_cache_main(void);
#define main test_cache_main
#include "test_cache.c"
#undef main

int main(void)
{
	setenv("DSTAGE_NO_URING", "1", 1);
	setenv("DSTAGE_NO_DIRECT", "1", 1);
	if (uring_available()) {
		fprintf(stderr, "DSTAGE_NO_URING=1 did not disable io_uring\n");
		return 1;
	}
	return test_cache_main();
}
