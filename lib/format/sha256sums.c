// SPDX-License-Identifier: MIT
/*
 * sha256sums: streaming parser of sha256sum(1) output.
 *
 * State: p->buf holds the bytes of the current line seen so far (p->fill of
 * them, never a newline). When a line outgrows the buffer p->overlong is set
 * and its remaining bytes are dropped up to the newline, where the line is
 * reported bad. p->line is always the number of the line being gathered.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/sha256sums.h"
#include "util/strutil.h"

void sha256sums_init(struct sha256sums_parser *p, sha256sums_entry_cb entry,
		     sha256sums_bad_cb bad, void *arg)
{
	p->entry = entry;
	p->bad = bad;
	p->arg = arg;
	p->line = 1;
	p->entries = 0;
	p->bad_lines = 0;
	p->fill = 0;
	p->overlong = false;
}

void sha256sums_release(struct sha256sums_parser *p)
{
	(void)p;
}

static int sha256sums_report(struct sha256sums_parser *p, const char *why)
{
	p->bad_lines++;
	if (!p->bad)
		return -EINVAL;
	return p->bad(p->arg, p->line, why);
}

/* Parse one complete line of n bytes (no newline, CR already removed). */
static int sha256sums_line(struct sha256sums_parser *p, const char *s, size_t n)
{
	unsigned char hash[32];
	bool escaped = false, binary;
	size_t nlen = 0;

	if (n == 0 || s[0] == '#')
		return 0;
	if (memchr(s, '\0', n))
		return sha256sums_report(p, "NUL byte in line");
	if (s[0] == '\\') {
		escaped = true;
		s++;
		n--;
	}
	if (n < 64 + 2)
		return sha256sums_report(p, "line too short");
	for (int i = 0; i < 32; i++) {
		int hi = strutil_hexval(s[2 * i]);
		int lo = strutil_hexval(s[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return sha256sums_report(p, "bad hex digit in hash");
		hash[i] = (unsigned char)(hi << 4 | lo);
	}
	if (s[64] != ' ')
		return sha256sums_report(p, "no space after the hash");
	if (s[65] == '*')
		binary = true;
	else if (s[65] == ' ')
		binary = false;
	else
		return sha256sums_report(p, "no ' ' or '*' mode marker");
	s += 66;
	n -= 66;
	while (n >= 2 && s[0] == '.' && s[1] == '/') {
		s += 2;
		n -= 2;
	}
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (escaped && c == '\\') {
			if (++i == n)
				return sha256sums_report(p, "'\\' at line end");
			switch (s[i]) {
			case '\\':
				c = '\\';
				break;
			case 'n':
				c = '\n';
				break;
			case 'r':
				c = '\r';
				break;
			default:
				return sha256sums_report(p, "unknown escape");
			}
		}
		p->name[nlen++] = c;
	}
	if (nlen == 0)
		return sha256sums_report(p, "empty name");
	p->name[nlen] = '\0';
	p->entries++;
	return p->entry(p->arg, p->name, nlen, hash, binary);
}

/* The line in p->buf is complete: parse it and start the next one. */
static int sha256sums_end_line(struct sha256sums_parser *p)
{
	size_t n = p->fill;
	int ret;

	if (p->overlong) {
		ret = sha256sums_report(p, "line too long");
	} else {
		if (n > 0 && p->buf[n - 1] == '\r')
			n--;
		ret = sha256sums_line(p, p->buf, n);
	}
	p->fill = 0;
	p->overlong = false;
	p->line++;
	return ret;
}

int sha256sums_feed(struct sha256sums_parser *p, const char *buf, size_t len)
{
	while (len > 0) {
		const char *nl = memchr(buf, '\n', len);
		size_t n = nl ? (size_t)(nl - buf) : len;
		int ret;

		if (!p->overlong) {
			/* Keep one byte spare for a name's terminating NUL. */
			if (n > sizeof(p->buf) - 1 - p->fill) {
				p->overlong = true;
			} else {
				memcpy(p->buf + p->fill, buf, n);
				p->fill += n;
			}
		}
		if (!nl)
			return 0;
		ret = sha256sums_end_line(p);
		if (ret)
			return ret;
		buf += n + 1;
		len -= n + 1;
	}
	return 0;
}

int sha256sums_finish(struct sha256sums_parser *p)
{
	if (p->fill == 0 && !p->overlong)
		return 0;
	return sha256sums_end_line(p);
}

int sha256sums_parse(const char *buf, size_t len, sha256sums_entry_cb entry,
		     sha256sums_bad_cb bad, void *arg)
{
	struct sha256sums_parser *p;
	int ret;

	p = malloc(sizeof(*p));
	if (!p)
		return -ENOMEM;
	sha256sums_init(p, entry, bad, arg);
	ret = sha256sums_feed(p, buf, len);
	if (!ret)
		ret = sha256sums_finish(p);
	sha256sums_release(p);
	free(p);
	return ret;
}
