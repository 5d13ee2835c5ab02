// SPDX-License-Identifier: MIT
/*
 * proto: tab-separated key=value lines. See include/dstage/proto.h.
 *
 * Stateless apart from the caller's buffers: a proto_buf grows as fields
 * are added and remembers its first error; a proto_reader keeps the bytes
 * read past the current line for the next call. Neither is locked: each
 * belongs to one thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dstage/grow.h"
#include "dstage/proto.h"
#include "dstage/timeutil.h"
#include "util/strutil.h"

static bool proto_key_byte(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
	       c == '.' || c == '-';
}

bool proto_key_ok(const char *key)
{
	size_t n = 0;

	for (; key[n]; n++)
		if (!proto_key_byte((unsigned char)key[n]) ||
		    n >= PROTO_KEY_MAX)
			return false;
	return n > 0;
}

/* Unescape src[0..len) into dst (room for len + 1); *out: the length. */
static int proto_unescape(char *dst, const char *src, size_t len, size_t *out)
{
	size_t o = 0;

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)src[i];

		if (c != '\\') {
			if (c == '\0' || c == '\n')
				return -EINVAL;
			dst[o++] = (char)c;
			continue;
		}
		if (++i >= len)
			return -EINVAL;
		switch (src[i]) {
		case '\\':
			dst[o++] = '\\';
			break;
		case 't':
			dst[o++] = '\t';
			break;
		case 'n':
			dst[o++] = '\n';
			break;
		case 'r':
			dst[o++] = '\r';
			break;
		case 'x': {
			int hi, lo;

			if (len - i < 3)
				return -EINVAL;
			hi = strutil_hexval((unsigned char)src[i + 1]);
			lo = strutil_hexval((unsigned char)src[i + 2]);
			if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
				return -EINVAL;
			dst[o++] = (char)(hi << 4 | lo);
			i += 2;
			break;
		}
		default:
			return -EINVAL;
		}
	}
	dst[o] = '\0';
	*out = o;
	return 0;
}

int proto_parse(struct proto_msg *m, const char *line, size_t len)
{
	size_t pos = 0, o = 0;
	int ret;

	m->n = 0;
	if (len >= PROTO_LINE_MAX)
		return -E2BIG;
	while (pos < len) {
		const char *f = line + pos;
		const char *end = memchr(f, '\t', len - pos);
		size_t flen = end ? (size_t)(end - f) : len - pos;
		const char *eq = memchr(f, '=', flen);
		size_t klen, vlen;

		if (!eq)
			return -EINVAL;
		klen = (size_t)(eq - f);
		if (klen == 0 || klen > PROTO_KEY_MAX)
			return -EINVAL;
		for (size_t i = 0; i < klen; i++)
			if (!proto_key_byte((unsigned char)f[i]))
				return -EINVAL;
		if (m->n >= PROTO_FIELDS_MAX)
			return -E2BIG;
		/* key + NUL + value (never longer unescaped) + NUL fits:
		 * the line is shorter than buf and each field adds at most
		 * two NULs for its '=' and separator. */
		memcpy(m->buf + o, f, klen);
		m->buf[o + klen] = '\0';
		m->f[m->n].key = m->buf + o;
		o += klen + 1;
		ret = proto_unescape(m->buf + o, eq + 1, flen - klen - 1,
				     &vlen);
		if (ret < 0)
			return ret;
		m->f[m->n].val = m->buf + o;
		m->f[m->n].len = vlen;
		o += vlen + 1;
		m->n++;
		pos += flen + (end ? 1 : 0);
		if (end && pos == len)
			return -EINVAL; /* a trailing TAB: an empty field */
	}
	return 0;
}

const char *proto_get(const struct proto_msg *m, const char *key)
{
	for (unsigned i = 0; i < m->n; i++)
		if (strcmp(m->f[i].key, key) == 0)
			return m->f[i].val;
	return NULL;
}

int proto_get_u64(const struct proto_msg *m, const char *key, uint64_t *v)
{
	const char *s = proto_get(m, key);
	char *end;
	unsigned long long x;

	if (!s)
		return -ENOENT;
	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	x = strtoull(s, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*v = x;
	return 0;
}

int proto_get_i64(const struct proto_msg *m, const char *key, int64_t *v)
{
	const char *s = proto_get(m, key);
	char *end;
	long long x;

	if (!s)
		return -ENOENT;
	if (!((*s >= '0' && *s <= '9') || *s == '-'))
		return -EINVAL;
	errno = 0;
	x = strtoll(s, &end, 10);
	if (errno || *end || end == s)
		return -EINVAL;
	*v = x;
	return 0;
}

static int proto_reserve(struct proto_buf *b, size_t more)
{
	if (b->err)
		return b->err;
	if (b->len + more + 1 > PROTO_LINE_MAX) {
		b->err = -E2BIG;
		return b->err;
	}
	if (grow_array(&b->data, &b->cap, b->len + more + 1, 1, 256))
		b->err = -ENOMEM;
	return b->err;
}

void proto_add_mem(struct proto_buf *b, const char *key, const char *val,
		   size_t len)
{
	size_t klen = strlen(key);
	char *p;

	if (!proto_key_ok(key)) {
		if (!b->err)
			b->err = -EINVAL;
		return;
	}
	/* worst case: every byte becomes \xHH */
	if (proto_reserve(b, 1 + klen + 1 + 4 * len))
		return;
	p = b->data + b->len;
	if (b->len)
		*p++ = '\t';
	memcpy(p, key, klen);
	p += klen;
	*p++ = '=';
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)val[i];

		switch (c) {
		case '\\':
			*p++ = '\\';
			*p++ = '\\';
			break;
		case '\t':
			*p++ = '\\';
			*p++ = 't';
			break;
		case '\n':
			*p++ = '\\';
			*p++ = 'n';
			break;
		case '\r':
			*p++ = '\\';
			*p++ = 'r';
			break;
		default:
			if (c < 0x20 || c == 0x7f) {
				if (c == 0) {
					b->err = -EINVAL;
					return;
				}
				/* room reserved above: 4 bytes and the NUL */
				p += snprintf(p, 5, "\\x%02x", c);
			} else {
				*p++ = (char)c;
			}
		}
	}
	b->len = (size_t)(p - b->data);
	if (b->len + 1 > PROTO_LINE_MAX)
		b->err = -E2BIG;
}

void proto_add(struct proto_buf *b, const char *key, const char *val)
{
	proto_add_mem(b, key, val ? val : "", val ? strlen(val) : 0);
}

void proto_add_u64(struct proto_buf *b, const char *key, uint64_t v)
{
	char s[24];

	snprintf(s, sizeof(s), "%" PRIu64, v);
	proto_add(b, key, s);
}

void proto_add_i64(struct proto_buf *b, const char *key, int64_t v)
{
	char s[24];

	snprintf(s, sizeof(s), "%" PRId64, v);
	proto_add(b, key, s);
}

int proto_end(struct proto_buf *b)
{
	if (proto_reserve(b, 1))
		return b->err;
	b->data[b->len++] = '\n';
	return 0;
}

void proto_reset(struct proto_buf *b)
{
	b->len = 0;
	b->err = 0;
}

void proto_free(struct proto_buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
	b->err = 0;
}

int proto_send(int fd, struct proto_buf *b)
{
	size_t off = 0;
	int ret;

	ret = proto_end(b);
	if (ret)
		goto out;
	while (off < b->len) {
		ssize_t n = send(fd, b->data + off, b->len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == ENOTSOCK)
			n = write(fd, b->data + off, b->len - off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			goto out;
		}
		off += (size_t)n;
	}
out:
	proto_reset(b);
	return ret;
}

void proto_reader_init(struct proto_reader *r, int fd)
{
	r->fd = fd;
	r->len = 0;
	r->off = 0;
	r->timeout_ms = 0;
}

/* Wait until r->fd is readable or the deadline (ms) passes.  The fd is
 * polled at least once even when the deadline has already passed, so bytes
 * (or an end of file) that are there already are never reported as a
 * timeout because the millisecond clock ticked since the deadline was set. */
static int proto_wait(const struct proto_reader *r, int64_t deadline)
{
	struct pollfd pfd = { .fd = r->fd, .events = POLLIN };

	for (;;) {
		int64_t left = deadline - timeutil_mono_ms();
		int n;

		if (left < 0)
			left = 0;
		n = poll(&pfd, 1, left > INT32_MAX ? INT32_MAX : (int)left);
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
		if (n == 0 && left == 0)
			return -ETIMEDOUT;
	}
}

int proto_read(struct proto_reader *r, struct proto_msg *m)
{
	int64_t deadline =
		r->timeout_ms ? timeutil_mono_ms() + r->timeout_ms : 0;

	for (;;) {
		char *nl = memchr(r->buf + r->off, '\n', r->len - r->off);
		ssize_t n;

		if (nl) {
			size_t ll = (size_t)(nl - (r->buf + r->off));
			int ret = proto_parse(m, r->buf + r->off, ll);

			r->off += ll + 1;
			return ret;
		}
		if (r->off > 0) {
			memmove(r->buf, r->buf + r->off, r->len - r->off);
			r->len -= r->off;
			r->off = 0;
		}
		if (r->len == sizeof(r->buf)) {
			r->len = 0; /* drop the overlong line's start */
			return -E2BIG;
		}
		if (deadline) {
			int ret = proto_wait(r, deadline);

			if (ret)
				return ret;
		}
		n = read(r->fd, r->buf + r->len, sizeof(r->buf) - r->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EPIPE;
		r->len += (size_t)n;
	}
}
