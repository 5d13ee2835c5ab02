// SPDX-License-Identifier: MIT
/* sha256: the known digests (FIPS 180-2's "abc", the empty string) one-shot,
 * streamed in pieces, from a copy taken midway, and read from a file;
 * a read error comes back as read's -errno. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dstage/sha256.h"

#define ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static const char *hex(const unsigned char md[SHA256_LEN])
{
	static char out[SHA256_HEX_LEN];

	sha256_hex(md, out);
	return out;
}

int main(void)
{
	unsigned char md[SHA256_LEN];
	struct sha256 h = { 0 }, c = { 0 };
	char path[] = "/tmp/test_sha256.XXXXXX";
	int fd;

	/* One-shot. */
	CHECK_INT(sha256_buf("abc", 3, md), 0);
	CHECK_STR(hex(md), ABC);
	CHECK_INT(sha256_buf("", 0, md), 0);
	CHECK_STR(hex(md), EMPTY);

	/* Streamed, and a copy taken after "a" finishes the same. */
	CHECK_INT(sha256_init(&h), 0);
	CHECK_INT(sha256_update(&h, "a", 1), 0);
	CHECK_INT(sha256_copy(&c, &h), 0);
	CHECK_INT(sha256_update(&h, "bc", 2), 0);
	CHECK_INT(sha256_final(&h, md), 0);
	CHECK_STR(hex(md), ABC);
	CHECK_INT(sha256_update(&c, "b", 1), 0);
	CHECK_INT(sha256_update(&c, "c", 1), 0);
	CHECK_INT(sha256_final(&c, md), 0);
	CHECK_STR(hex(md), ABC);
	sha256_release(&h);
	sha256_release(&c);
	CHECK(h.ctx == NULL && c.ctx == NULL);
	sha256_release(&h); /* again: nothing */

	/* From a file, from its offset to its end. */
	fd = mkstemp(path);
	CHECK(fd >= 0);
	unlink(path);
	CHECK_INT(sha256_fd(fd, md), 0);
	CHECK_STR(hex(md), EMPTY);
	CHECK(write(fd, "xxabc", 5) == 5);
	CHECK(lseek(fd, 2, SEEK_SET) == 2);
	CHECK_INT(sha256_fd(fd, md), 0);
	CHECK_STR(hex(md), ABC);
	close(fd);

	/* A descriptor that cannot be read: read's errno. */
	CHECK_INT(sha256_fd(fd, md), -EBADF);
	fd = open("/tmp", O_RDONLY | O_DIRECTORY);
	CHECK(fd >= 0);
	CHECK_INT(sha256_fd(fd, md), -EISDIR);
	close(fd);

	return check_result();
}
