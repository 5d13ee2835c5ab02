// SPDX-License-Identifier: MIT
/*
 * Fuzz keypath: every accepted key obeys the rules when checked a second,
 * independent way (by splitting on '/'), parent and basename stay inside the
 * key and agree with each other, and directory markers are exactly the
 * accepted keys plus one '/'.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/keypath.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The rules, written differently from lib/util/keypath.c. */
static int slow_check(const char *k, size_t len)
{
	size_t seg = 0;

	if (len == 0 || len >= KEYPATH_MAX)
		return -EINVAL;
	for (size_t i = 0; i <= len; i++) {
		if (i < len) {
			unsigned char c = (unsigned char)k[i];

			if (c < 0x20 || c == 0x7f)
				return -EINVAL;
			if (c != '/')
				continue;
		}
		size_t n = i - seg;

		if (n == 0 || n > KEYPATH_SEG_MAX)
			return -EINVAL;
		if (!strncmp(k + seg, ".", n) && n == 1)
			return -EINVAL;
		if (!strncmp(k + seg, "..", n) && n == 2)
			return -EINVAL;
		seg = i + 1;
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *k = (const char *)data;
	const char *why = NULL;
	int ret = keypath_check(k, size, &why);

	if (ret != slow_check(k, size))
		abort();
	if (ret && (!why || !*why))
		abort();
	if (!ret) {
		size_t plen = keypath_parent_len(k, size);
		const char *base = keypath_basename(k, size);

		if (plen >= size || base < k || base >= k + size)
			abort();
		if (plen && (k[plen] != '/' || base != k + plen + 1))
			abort();
		if (!plen && base != k && memchr(k, '/', size))
			abort();
		if (keypath_check_name(k, size, NULL) !=
		    (memchr(k, '/', size) ? -EINVAL : 0))
			abort();
	}
	if (size && keypath_dir_marker(k, size) !=
			    (k[size - 1] == '/' && size > 1 &&
			     keypath_check(k, size - 1, NULL) == 0))
		abort();
	return 0;
}
