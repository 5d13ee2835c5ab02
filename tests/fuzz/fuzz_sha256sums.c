// SPDX-License-Identifier: MIT
/*
 * Fuzz sha256sums: parse the input whole and again in chunks whose sizes
 * come from the input's first byte; both must report the same entries
 * (names, hashes, modes) and the same bad lines, and every name must be
 * non-empty, NUL-free and as long as reported.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/sha256sums.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A running digest of what the parser reported. */
struct tally {
	uint64_t h;
	unsigned long entries;
	unsigned long bad;
};

static void mix(struct tally *t, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		t->h = (t->h ^ b[i]) * 1099511628211ull;
}

static int on_entry(void *arg, const char *name, size_t len,
		    const unsigned char hash[32], bool binary)
{
	struct tally *t = arg;

	if (len == 0 || strlen(name) != len || len >= SHA256SUMS_LINE_MAX)
		abort();
	mix(t, name, len + 1);
	mix(t, hash, 32);
	mix(t, &binary, sizeof(binary));
	t->entries++;
	return 0;
}

static int on_bad(void *arg, unsigned long line, const char *why)
{
	struct tally *t = arg;

	if (!why || !*why || line == 0)
		abort();
	mix(t, &line, sizeof(line));
	t->bad++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct sha256sums_parser p;
	struct tally whole = { 14695981039346656037ull, 0, 0 };
	struct tally parts = whole;
	const char *buf = (const char *)data;
	size_t step;

	if (size == 0)
		return 0;
	step = (size_t)data[0] % 64 + 1;
	buf++;
	size--;

	if (sha256sums_parse(buf, size, on_entry, on_bad, &whole))
		abort();
	sha256sums_init(&p, on_entry, on_bad, &parts);
	for (size_t off = 0; off < size; off += step)
		if (sha256sums_feed(&p, buf + off,
				    size - off < step ? size - off : step))
			abort();
	if (sha256sums_finish(&p))
		abort();
	if (p.entries != parts.entries || p.bad_lines != parts.bad)
		abort();
	sha256sums_release(&p);
	if (whole.h != parts.h || whole.entries != parts.entries ||
	    whole.bad != parts.bad)
		abort();
	return 0;
}
