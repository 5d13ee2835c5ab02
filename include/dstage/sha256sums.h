/* SPDX-License-Identifier: MIT */
/*
 * sha256sums: a streaming parser for files in the format written by GNU
 * sha256sum (the SHA256SUMS file at a dataset's root).
 *
 * Accepted lines:
 *   <64 hex>  <name>        text mode marker (two spaces)
 *   <64 hex> *<name>        binary mode marker
 *   \<64 hex>  <name>       escaped name: "\\" is '\', "\n" is a newline,
 *                           "\r" is a carriage return (coreutils escapes
 *                           names holding those bytes this way)
 * Hex digits may be upper or lower case. Every leading "./" of a name is
 * removed. A line may end in LF or CRLF; the last line needs no newline.
 * Empty lines and lines starting with '#' are skipped.
 *
 * Anything else is a bad line: bad hex, a missing marker, an empty name, a
 * NUL byte, an unknown escape, or a line longer than SHA256SUMS_LINE_MAX.
 * Bad lines go to the bad-line callback with their 1-based number and a
 * reason; the parse goes on with the next line unless the callback returns
 * non-zero. Without a bad-line callback the first bad line stops the parse
 * with -EINVAL.
 *
 * State machine of a parser: init -> feed* -> finish -> (release). Between
 * feeds it holds at most one partial line (in its fixed buffer; the parser
 * allocates nothing). A parser is used by one thread at a time.
 */
#ifndef DSTAGE_SHA256SUMS_H
#define DSTAGE_SHA256SUMS_H

#include <stdbool.h>
#include <stddef.h>

/* Room for 64 hex digits, a marker and a fully escaped 4095-byte name. */
#define SHA256SUMS_LINE_MAX 8448

/* name is name_len bytes, NUL-terminated, valid only during the call. */
typedef int (*sha256sums_entry_cb)(void *arg, const char *name, size_t name_len,
				   const unsigned char hash[32], bool binary);
typedef int (*sha256sums_bad_cb)(void *arg, unsigned long line,
				 const char *why);

struct sha256sums_parser {
	sha256sums_entry_cb entry;
	sha256sums_bad_cb bad;
	void *arg;
	unsigned long line; /* number of the line being gathered */
	unsigned long entries; /* good lines passed to entry so far */
	unsigned long bad_lines; /* bad lines so far */
	size_t fill; /* bytes of the partial line in buf */
	bool overlong; /* the current line overflowed buf */
	char buf[SHA256SUMS_LINE_MAX];
	char name[SHA256SUMS_LINE_MAX];
};

/* Set up p. bad may be NULL (stop at the first bad line). Cannot fail. */
void sha256sums_init(struct sha256sums_parser *p, sha256sums_entry_cb entry,
		     sha256sums_bad_cb bad, void *arg);

/*
 * Parse len more bytes. Returns 0; -EINVAL on a bad line when there is no
 * bad-line callback; or the first non-zero value returned by a callback.
 * After an error the parser must not be fed again.
 */
int sha256sums_feed(struct sha256sums_parser *p, const char *buf, size_t len);

/* End of input: parse a last line that has no newline. Returns as feed. */
int sha256sums_finish(struct sha256sums_parser *p);

/* Nothing to free today; kept so callers are ready if that changes. */
void sha256sums_release(struct sha256sums_parser *p);

/*
 * One-shot: parse a whole buffer. Returns as feed, or -ENOMEM (the parser
 * is allocated on the heap).
 */
int sha256sums_parse(const char *buf, size_t len, sha256sums_entry_cb entry,
		     sha256sums_bad_cb bad, void *arg);

#endif
