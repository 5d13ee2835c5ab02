// SPDX-License-Identifier: MIT
/*
 * s3hash: the digests the s3:// backend puts in its requests' headers
 * (x-amz-content-sha256, Content-MD5), taken in one pass over an upload
 * body, and the ETag S3 gives an object completed from parts. Stateless.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "dstage/log.h"
#include "dstage/sha256.h"
#include "s3hash.h"
#include "util/strutil.h"

struct s3hash_digest {
	struct sha256 sha; /* .ctx NULL: not taken */
	EVP_MD_CTX *md5;
};

static int s3hash_digest_init(struct s3hash_digest *d, bool sha, bool md5)
{
	d->sha.ctx = NULL;
	d->md5 = md5 ? EVP_MD_CTX_new() : NULL;
	if ((sha && sha256_init(&d->sha)) ||
	    (md5 &&
	     (!d->md5 || EVP_DigestInit_ex(d->md5, EVP_md5(), NULL) != 1)))
		return -ENOMEM;
	return 0;
}

static int s3hash_digest_update(struct s3hash_digest *d, const void *p,
				size_t n)
{
	if (d->sha.ctx && sha256_update(&d->sha, p, n))
		return -ENOMEM;
	if (d->md5 && EVP_DigestUpdate(d->md5, p, n) != 1)
		return -ENOMEM;
	return 0;
}

static int s3hash_digest_final(struct s3hash_digest *d, char sha[65],
			       char md5[32])
{
	unsigned char md[32];

	if (d->sha.ctx) {
		if (sha256_final(&d->sha, md))
			return -ENOMEM;
		strutil_hex(md, 32, sha);
	}
	if (d->md5) {
		if (EVP_DigestFinal_ex(d->md5, md, NULL) != 1)
			return -ENOMEM;
		EVP_EncodeBlock((unsigned char *)md5, md, 16); /* 24 + NUL */
	}
	return 0;
}

static void s3hash_digest_release(struct s3hash_digest *d)
{
	sha256_release(&d->sha);
	EVP_MD_CTX_free(d->md5);
}

int s3hash_buf(const void *buf, size_t len, char sha[65], char md5[32])
{
	struct s3hash_digest d;
	int ret = s3hash_digest_init(&d, sha, md5);

	if (!ret)
		ret = s3hash_digest_update(&d, buf, len);
	if (!ret)
		ret = s3hash_digest_final(&d, sha, md5);
	s3hash_digest_release(&d);
	return ret;
}

int s3hash_fd(int fd, uint64_t off, uint64_t len, char sha[65], char md5[32])
{
	struct s3hash_digest d;
	char *buf = malloc(1 << 20);
	int ret = s3hash_digest_init(&d, sha, md5);

	if (!ret && !buf)
		ret = -ENOMEM;
	while (!ret && len) {
		size_t want = len > (1 << 20) ? (1 << 20) : (size_t)len;
		ssize_t r = pread(fd, buf, want, (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			ret = r < 0 ? -errno : -EIO;
			log_error("s3: reading the upload source failed: %s",
				  r < 0 ? strerror(errno) : "file shrank");
			break;
		}
		ret = s3hash_digest_update(&d, buf, (size_t)r);
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
	if (!ret)
		ret = s3hash_digest_final(&d, sha, md5);
	s3hash_digest_release(&d);
	free(buf);
	return ret;
}

/* The 16 bytes of an MD5 ETag ("<32 hex>", quoted or not), or -EINVAL. */
static int s3hash_md5_of_etag(const char *etag, unsigned char md[16])
{
	size_t len = strlen(etag);

	if (len == 34 && etag[0] == '"' && etag[33] == '"') {
		etag++;
		len -= 2;
	}
	if (len != 32)
		return -EINVAL;
	for (size_t i = 0; i < 16; i++) {
		int hi = strutil_hexval(etag[2 * i]);
		int lo = strutil_hexval(etag[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		md[i] = (unsigned char)(hi << 4 | lo);
	}
	return 0;
}

int s3hash_multipart_etag(const struct objstore_part *parts, size_t n,
			  char etag[OBJSTORE_ETAG_MAX])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned char md[16];
	char hex[33];
	int ret = ctx && EVP_DigestInit_ex(ctx, EVP_md5(), NULL) == 1 ? 0
								      : -ENOMEM;

	etag[0] = '\0';
	for (size_t i = 0; i < n && !ret; i++) {
		ret = s3hash_md5_of_etag(parts[i].etag, md);
		if (!ret && EVP_DigestUpdate(ctx, md, 16) != 1)
			ret = -ENOMEM;
	}
	if (!ret && (!n || EVP_DigestFinal_ex(ctx, md, NULL) != 1))
		ret = -EINVAL;
	if (!ret) {
		strutil_hex(md, 16, hex);
		snprintf(etag, OBJSTORE_ETAG_MAX, "\"%s-%zu\"", hex, n);
	}
	EVP_MD_CTX_free(ctx);
	return ret;
}
