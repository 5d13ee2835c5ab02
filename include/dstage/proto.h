/* SPDX-License-Identifier: MIT */
/*
 * proto: the line protocol of the stager daemon's Unix socket (and of any
 * other dstage tool that wants one). docs/stager.md describes the messages.
 *
 * A message is one line ending in '\n': fields separated by TAB, each field
 * "key=value". Keys are 1 to PROTO_KEY_MAX bytes of [a-z0-9_.-]. Values are
 * any bytes except NUL, with '\\', TAB, LF and CR written as "\\\\", "\\t",
 * "\\n", "\\r" and every other control byte (below 0x20, and 0x7f) as
 * "\\xHH". A line is at most PROTO_LINE_MAX bytes with its '\n', and holds
 * at most PROTO_FIELDS_MAX fields. The same key may appear more than once;
 * proto_get returns the first.
 *
 * Errors are -errno:
 *   -EINVAL   a malformed line (bad key, no '=', bad escape)
 *   -E2BIG    too many fields, or a line longer than PROTO_LINE_MAX
 *   -ENOMEM   out of memory
 *   -EPIPE    (proto_read) the peer closed the connection
 *   -errno    of read(2) / send(2)
 */
#ifndef DSTAGE_PROTO_H
#define DSTAGE_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROTO_LINE_MAX (256 * 1024)
#define PROTO_FIELDS_MAX 64
#define PROTO_KEY_MAX 64

struct proto_field {
	const char *key;
	const char *val; /* unescaped, NUL-terminated */
	size_t len; /* of val */
};

/* A parsed line. The strings point into buf. */
struct proto_msg {
	unsigned n;
	struct proto_field f[PROTO_FIELDS_MAX];
	char buf[PROTO_LINE_MAX];
};

/*
 * Parse one line (len bytes, without its '\n'; a trailing '\r' is not
 * special) into m. An empty line is a message with no fields. A value
 * holding NUL ("\\x00") is -EINVAL. Returns 0, -EINVAL or -E2BIG.
 */
int proto_parse(struct proto_msg *m, const char *line, size_t len);

/* The value of the first field named key, or NULL. */
const char *proto_get(const struct proto_msg *m, const char *key);

/* Parse key's value as an unsigned / signed decimal. Returns 0, -ENOENT
 * (no such field) or -EINVAL (not a number, or out of range). */
int proto_get_u64(const struct proto_msg *m, const char *key, uint64_t *v);
int proto_get_i64(const struct proto_msg *m, const char *key, int64_t *v);

/* true when key is a valid key. */
bool proto_key_ok(const char *key);

/*
 * A growing output line. Adding never fails at the call: the first error
 * (-ENOMEM, -EINVAL for a bad key, -E2BIG past PROTO_LINE_MAX) is kept in
 * err and returned by proto_end. A zeroed struct is a valid empty buffer.
 */
struct proto_buf {
	char *data;
	size_t len, cap;
	int err;
};

void proto_add(struct proto_buf *b, const char *key, const char *val);
void proto_add_mem(struct proto_buf *b, const char *key, const char *val,
		   size_t len);
void proto_add_u64(struct proto_buf *b, const char *key, uint64_t v);
void proto_add_i64(struct proto_buf *b, const char *key, int64_t v);

/* Finish the line with '\n'. Returns 0 or the first error. */
int proto_end(struct proto_buf *b);

/* Empty the buffer (keeping its memory) and clear err. */
void proto_reset(struct proto_buf *b);

/* Free the memory. Accepts a zeroed buffer. */
void proto_free(struct proto_buf *b);

/*
 * proto_end, write the whole line to fd (send with MSG_NOSIGNAL on sockets,
 * write otherwise), then proto_reset. Returns 0 or -errno.
 */
int proto_send(int fd, struct proto_buf *b);

/* Buffered reading of lines from fd. */
struct proto_reader {
	int fd;
	/* 0 (proto_reader_init's default): wait for a line as long as it
	 * takes; else a whole line must arrive within this many ms of the
	 * proto_read call, or it returns -ETIMEDOUT. */
	unsigned timeout_ms;
	size_t len, off;
	char buf[PROTO_LINE_MAX];
};

void proto_reader_init(struct proto_reader *r, int fd);

/*
 * Read the next line from r and parse it into m. Blocks (at most
 * r->timeout_ms when set). Returns 0, -EPIPE at end of file (a partial last
 * line is dropped), -E2BIG for an overlong line, -EINVAL for a malformed
 * one (the line is consumed), -ETIMEDOUT when r->timeout_ms passed without
 * a whole line (bytes read so far are kept), or -errno.
 */
int proto_read(struct proto_reader *r, struct proto_msg *m);

#endif
