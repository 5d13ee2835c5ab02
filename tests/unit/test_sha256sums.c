// SPDX-License-Identifier: MIT
/* sha256sums: formats, escapes, chunking, bad lines. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dstage/sha256sums.h"

#define H0 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define H1 "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"

struct seen {
	char names[16][64];
	unsigned char first[16];
	int binary[16];
	int n;
	unsigned long bad_line[16];
	char bad_why[16][64];
	int nbad;
};

static int on_entry(void *arg, const char *name, size_t len,
		    const unsigned char hash[32], bool binary)
{
	struct seen *s = arg;

	if (s->n == 16 || len >= 64 || strlen(name) != len)
		return -E2BIG;
	memcpy(s->names[s->n], name, len + 1);
	s->first[s->n] = hash[0];
	s->binary[s->n] = binary;
	s->n++;
	return 0;
}

static int on_bad(void *arg, unsigned long line, const char *why)
{
	struct seen *s = arg;

	if (s->nbad < 16) {
		s->bad_line[s->nbad] = line;
		snprintf(s->bad_why[s->nbad], 64, "%s", why);
	}
	s->nbad++;
	return 0;
}

static const char sample[] = H0 "  a.txt\n" H1 " *./dir/b.bin\r\n"
				"\n"
				"# comment\n"
				"\\" H0 "  new\\nline\\\\x\n"
				"zz" H0 "  badhex\n" H0 "\tnotab\n" H0 "  \n"
				"\\" H0 "  bad\\qescape\n" H0
				"  name with  spaces "; /* no final newline */

static void check_sample(const struct seen *s)
{
	CHECK_INT(s->n, 4);
	CHECK_STR(s->names[0], "a.txt");
	CHECK_INT(s->first[0], 0xe3);
	CHECK_INT(s->binary[0], 0);
	CHECK_STR(s->names[1], "dir/b.bin");
	CHECK_INT(s->first[1], 0xba);
	CHECK_INT(s->binary[1], 1);
	CHECK_STR(s->names[2], "new\nline\\x");
	CHECK_STR(s->names[3], "name with  spaces ");
	CHECK_INT(s->nbad, 4);
	CHECK_INT(s->bad_line[0], 6);
	CHECK_INT(s->bad_line[1], 7);
	CHECK_INT(s->bad_line[2], 8);
	CHECK_STR(s->bad_why[2], "empty name");
	CHECK_INT(s->bad_line[3], 9);
	CHECK_STR(s->bad_why[3], "unknown escape");
}

int main(void)
{
	struct sha256sums_parser *p = malloc(sizeof(*p));
	struct seen s;
	char *longline;
	size_t ll = SHA256SUMS_LINE_MAX + 100;

	if (!p)
		return 1;

	/* Whole buffer. */
	memset(&s, 0, sizeof(s));
	CHECK_INT(
		sha256sums_parse(sample, strlen(sample), on_entry, on_bad, &s),
		0);
	check_sample(&s);

	/* Every split point, and byte by byte, give the same result. */
	for (size_t step = 1; step < 9; step++) {
		memset(&s, 0, sizeof(s));
		sha256sums_init(p, on_entry, on_bad, &s);
		for (size_t off = 0; off < strlen(sample); off += step) {
			size_t n = strlen(sample) - off;

			CHECK_INT(sha256sums_feed(p, sample + off,
						  n < step ? n : step),
				  0);
		}
		CHECK_INT(sha256sums_finish(p), 0);
		check_sample(&s);
	}

	/* Without a bad-line callback the first bad line stops the parse. */
	memset(&s, 0, sizeof(s));
	CHECK_INT(sha256sums_parse(sample, strlen(sample), on_entry, NULL, &s),
		  -EINVAL);
	CHECK_INT(s.n, 3);

	/* A line longer than the buffer is bad, the next one still parses. */
	longline = malloc(ll + 100);
	if (!longline)
		return 1;
	memset(longline, 'a', ll);
	memcpy(longline, H0 "  ", 66);
	longline[ll] = '\n';
	memcpy(longline + ll + 1, H0 "  ok\n", 70);
	memset(&s, 0, sizeof(s));
	sha256sums_init(p, on_entry, on_bad, &s);
	for (size_t off = 0; off < ll + 70; off += 1000) {
		size_t n = ll + 70 - off;

		CHECK_INT(
			sha256sums_feed(p, longline + off, n < 1000 ? n : 1000),
			0);
	}
	CHECK_INT(sha256sums_finish(p), 0);
	CHECK_INT(s.nbad, 1);
	CHECK_STR(s.bad_why[0], "line too long");
	CHECK_INT(s.n, 1);
	CHECK_STR(s.names[0], "ok");

	/* A callback's error stops the parse and is returned. */
	memset(&s, 0, sizeof(s));
	s.n = 16;
	CHECK_INT(
		sha256sums_parse(sample, strlen(sample), on_entry, on_bad, &s),
		-E2BIG);

	/* Empty input, NUL byte. */
	memset(&s, 0, sizeof(s));
	CHECK_INT(sha256sums_parse("", 0, on_entry, on_bad, &s), 0);
	CHECK_INT(sha256sums_parse(H0 "  a\0b\n", 70, on_entry, on_bad, &s), 0);
	CHECK_INT(s.nbad, 1);
	CHECK_INT(s.n, 0);

	free(longline);
	free(p);
	return check_result();
}
