// SPDX-License-Identifier: MIT
/* sha256: SHA-256 over OpenSSL's EVP (include/dstage/sha256.h). */
#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <unistd.h>

#include "dstage/sha256.h"
#include "util/sslutil.h"
#include "util/strutil.h"

#define SHA256_FD_CHUNK (1u << 20)

int sha256_init(struct sha256 *h)
{
	h->ctx = EVP_MD_CTX_new();
	if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
		sha256_release(h);
		return sslutil_fail("sha256: init", -ENOMEM);
	}
	return 0;
}

int sha256_copy(struct sha256 *dst, const struct sha256 *src)
{
	dst->ctx = EVP_MD_CTX_new();
	if (!dst->ctx || EVP_MD_CTX_copy_ex(dst->ctx, src->ctx) != 1) {
		sha256_release(dst);
		return sslutil_fail("sha256: copy", -ENOMEM);
	}
	return 0;
}

int sha256_update(struct sha256 *h, const void *p, size_t n)
{
	if (EVP_DigestUpdate(h->ctx, p, n) != 1)
		return sslutil_fail("sha256: update", -ENOMEM);
	return 0;
}

int sha256_final(struct sha256 *h, unsigned char md[SHA256_LEN])
{
	unsigned len = 0;

	if (EVP_DigestFinal_ex(h->ctx, md, &len) != 1 || len != SHA256_LEN)
		return sslutil_fail("sha256: final", -ENOMEM);
	return 0;
}

void sha256_release(struct sha256 *h)
{
	EVP_MD_CTX_free(h->ctx);
	h->ctx = NULL;
}

int sha256_buf(const void *p, size_t n, unsigned char md[SHA256_LEN])
{
	unsigned len = 0;

	if (EVP_Digest(p, n, md, &len, EVP_sha256(), NULL) != 1 ||
	    len != SHA256_LEN)
		return sslutil_fail("sha256: digest", -ENOMEM);
	return 0;
}

int sha256_fd(int fd, unsigned char md[SHA256_LEN])
{
	struct sha256 h = { 0 };
	char *buf = malloc(SHA256_FD_CHUNK);
	ssize_t n;
	int ret;

	if (!buf)
		return -ENOMEM;
	ret = sha256_init(&h);
	while (!ret) {
		n = read(fd, buf, SHA256_FD_CHUNK);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : sha256_final(&h, md);
			break;
		}
		ret = sha256_update(&h, buf, (size_t)n);
	}
	sha256_release(&h);
	free(buf);
	return ret;
}

void sha256_hex(const unsigned char md[SHA256_LEN], char out[SHA256_HEX_LEN])
{
	strutil_hex(md, SHA256_LEN, out);
}
