// SPDX-License-Identifier: MIT
/* keypath: which keys are paths, and why not. */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "dstage/keypath.h"

static int ok(const char *k)
{
	const char *why = NULL;
	int ret = keypath_check(k, strlen(k), &why);

	if (ret)
		fprintf(stderr, "rejected '%s': %s\n", k, why);
	return ret == 0;
}

static const char *bad(const char *k, size_t len)
{
	const char *why = NULL;

	if (keypath_check(k, len, &why) != -EINVAL)
		return NULL;
	return why;
}

int main(void)
{
	char big[4096 + 8];
	char pbuf[64];
	const char *why;

	CHECK(ok("a"));
	CHECK(ok("a/b/c.tar"));
	CHECK(ok("...") && ok(".hidden") && ok("a/..b") && ok("a/b.."));
	CHECK(ok("caf\xc3\xa9/\xe6\x97\xa5\xe6\x9c\xac.txt"));
	CHECK(ok("latin1-\xe9")); /* not UTF-8: accepted, documented */
	CHECK(ok("with space/and\\backslash"));

	CHECK_STR(bad("", 0), "empty key");
	CHECK_STR(bad("/a", 2), "leading '/'");
	CHECK_STR(bad("a/", 2), "trailing '/'");
	CHECK_STR(bad("a//b", 4), "empty path segment");
	CHECK_STR(bad("a/./b", 5), "'.' path segment");
	CHECK_STR(bad(".", 1), "'.' path segment");
	CHECK_STR(bad("a/..", 4), "'..' path segment");
	CHECK_STR(bad("../x", 4), "'..' path segment");
	CHECK_STR(bad("a\0b", 3), "NUL byte in key");
	CHECK_STR(bad("a\nb", 3), "control character in key");
	CHECK_STR(bad("a\x7f", 2), "control character in key");

	memset(big, 'x', sizeof(big));
	CHECK(keypath_check(big, 255, NULL) == 0);
	CHECK_STR(bad(big, 256), "path segment longer than 255 bytes");
	for (size_t i = 255; i < sizeof(big); i += 256)
		big[i] = '/';
	/* One limit, S3's: 1,024 bytes (objstore refuses longer keys). */
	CHECK_INT(KEYPATH_KEY_MAX, 1024);
	big[KEYPATH_KEY_MAX - 1] = 'x'; /* no trailing '/' */
	big[1000] = '/';
	CHECK(keypath_check(big, KEYPATH_KEY_MAX, NULL) == 0);
	CHECK_STR(bad(big, KEYPATH_KEY_MAX + 1),
		  "key longer than 1024 bytes (the S3 limit, kept for every "
		  "source)");
	CHECK_STR(bad(big, 4095), "key longer than 1024 bytes (the S3 limit, "
				  "kept for every source)");

	CHECK(keypath_check_name("imagenet", 8, NULL) == 0);
	CHECK(keypath_check_name("a/b", 3, &why) == -EINVAL);
	CHECK(keypath_check_name("..", 2, NULL) == -EINVAL);

	CHECK(keypath_dir_marker("a/b/", 4));
	CHECK(!keypath_dir_marker("a/b", 3));
	CHECK(!keypath_dir_marker("a//", 3));
	CHECK(!keypath_dir_marker("/", 1));

	CHECK_INT(keypath_parent_len("a/b/c", 5), 3);
	CHECK_INT(keypath_parent_len("abc", 3), 0);
	CHECK_STR(keypath_basename("a/b/c", 5), "c");
	CHECK_STR(keypath_basename("abc", 3), "abc");

	CHECK_STR(keypath_printable("a/b", 3, pbuf, sizeof(pbuf)), "a/b");
	CHECK_STR(keypath_printable("a\0b\n\\\x7f\xc3\xa9", 8, pbuf,
				    sizeof(pbuf)),
		  "a\\x00b\\x0a\\x5c\\x7f\xc3\xa9");
	memset(big, 'x', 40);
	CHECK_STR(keypath_printable(big, 40, pbuf, 16), "xxxxxxxx...");
	CHECK_STR(keypath_printable(big, 7, pbuf, 16), "xxxxxxx");
	return check_result();
}
