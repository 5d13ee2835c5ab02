// SPDX-License-Identifier: MIT
/*
 * bench/xxh3_speed: the block checksum's speed here, libxxhash's baseline
 * XXH3_64bits against the library's dispatching entry point, which the
 * cache uses (XXH3_64bits_dispatch, AVX2/AVX-512 where the CPU has them),
 * on 256 KiB pieces (what arrives from the network, hot in the CPU's cache)
 * and on a 1 GiB buffer (read from memory). docs/cache.md quotes it.
 *
 *   build/bench/xxh3_speed
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>
#ifdef DSTAGE_XXH_DISPATCH
/* Without this the header turns XXH3_64bits into the dispatch too. */
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#endif

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* GB/s of fn over rounds passes of len bytes at p (one byte changed per
 * pass, so no pass can be skipped). */
static double speed(XXH64_hash_t (*fn)(const void *, size_t), char *p,
		    size_t len, int rounds, uint64_t *sink)
{
	double t = now();

	for (int i = 0; i < rounds; i++) {
		p[(size_t)i % len] = (char)*sink;
		*sink += fn(p, len);
	}
	return (double)rounds * (double)len / (now() - t) / 1e9;
}

int main(void)
{
	size_t hot = 256u << 10, cold = 1u << 30;
	char *h = malloc(hot), *c = malloc(cold);
	uint64_t sink = 0;

	if (!h || !c) {
		fprintf(stderr, "xxh3_speed: out of memory\n");
		return 1;
	}
	memset(h, 7, hot);
	memset(c, 3, cold);
	printf("baseline  hot %5.1f GB/s  memory %5.1f GB/s\n",
	       speed(XXH3_64bits, h, hot, 20000, &sink),
	       speed(XXH3_64bits, c, cold, 3, &sink));
#ifdef DSTAGE_XXH_DISPATCH
	printf("dispatch  hot %5.1f GB/s  memory %5.1f GB/s\n",
	       speed(XXH3_64bits_dispatch, h, hot, 20000, &sink),
	       speed(XXH3_64bits_dispatch, c, cold, 3, &sink));
#else
	printf("dispatch  not in this libxxhash\n");
#endif
	fprintf(stderr, "(%llu)\n", (unsigned long long)sink);
	free(h);
	free(c);
	return 0;
}
