// SPDX-License-Identifier: MIT
/*
 * keypath: object keys as paths. Stateless; see include/dstage/keypath.h for
 * the rules and why each exists.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dstage/keypath.h"

static int keypath_fail(const char **why, const char *reason)
{
	if (why)
		*why = reason;
	return -EINVAL;
}

/* Check one segment [s, s + n). */
static int keypath_check_seg(const char *s, size_t n, const char **why)
{
	if (n == 0)
		return keypath_fail(why, "empty path segment");
	if (n > KEYPATH_SEG_MAX)
		return keypath_fail(why, "path segment longer than 255 bytes");
	if (n == 1 && s[0] == '.')
		return keypath_fail(why, "'.' path segment");
	if (n == 2 && s[0] == '.' && s[1] == '.')
		return keypath_fail(why, "'..' path segment");
	return 0;
}

int keypath_check(const char *key, size_t len, const char **why)
{
	size_t start = 0;
	int ret;

	if (len == 0)
		return keypath_fail(why, "empty key");
	if (len > KEYPATH_KEY_MAX)
		return keypath_fail(why, "key longer than 1024 bytes (the S3 "
					 "limit, kept for every source)");
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)key[i];

		if (c == 0)
			return keypath_fail(why, "NUL byte in key");
		if (c < 0x20 || c == 0x7f)
			return keypath_fail(why, "control character in key");
	}
	if (key[0] == '/')
		return keypath_fail(why, "leading '/'");
	if (key[len - 1] == '/')
		return keypath_fail(why, "trailing '/'");
	for (size_t i = 0; i <= len; i++) {
		if (i < len && key[i] != '/')
			continue;
		ret = keypath_check_seg(key + start, i - start, why);
		if (ret)
			return ret;
		start = i + 1;
	}
	return 0;
}

int keypath_check_name(const char *name, size_t len, const char **why)
{
	if (len && memchr(name, '/', len))
		return keypath_fail(why, "'/' in name");
	return keypath_check(name, len, why);
}

bool keypath_dir_marker(const char *key, size_t len)
{
	if (len < 2 || key[len - 1] != '/')
		return false;
	return keypath_check(key, len - 1, NULL) == 0;
}

size_t keypath_parent_len(const char *path, size_t len)
{
	while (len > 0 && path[len - 1] != '/')
		len--;
	return len ? len - 1 : 0;
}

const char *keypath_basename(const char *path, size_t len)
{
	size_t i = len;

	while (i > 0 && path[i - 1] != '/')
		i--;
	return path + i;
}

const char *keypath_printable(const char *s, size_t len, char *buf, size_t size)
{
	size_t o = 0, i;

	for (i = 0; i < len && o + 8 < size; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c < 0x20 || c == 0x7f || c == '\\')
			o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
		else
			buf[o++] = (char)c;
	}
	if (i < len)
		o += (size_t)snprintf(buf + o, size - o, "...");
	buf[o] = '\0';
	return buf;
}
