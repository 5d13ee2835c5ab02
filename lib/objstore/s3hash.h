/* SPDX-License-Identifier: MIT */
/*
 * s3hash: digests for the s3:// backend's requests (lib/objstore/s3hash.c). Not a
 * public header.
 */
#ifndef DSTAGE_S3HASH_H
#define DSTAGE_S3HASH_H

#include <stddef.h>
#include <stdint.h>

#include "objstore_backend.h"

/*
 * Digests of an upload body for its headers, in one pass: sha (may be NULL)
 * gets the SHA-256 in lowercase hex (x-amz-content-sha256), md5 (may be
 * NULL) the MD5 in base64 (Content-MD5). The body is len bytes of fd at off
 * (s3hash_fd) or of buf (s3hash_buf). Returns 0, -EIO (read failed or file
 * shrank; logged), -ENOMEM.
 */
int s3hash_fd(int fd, uint64_t off, uint64_t len, char sha[65], char md5[32]);
int s3hash_buf(const void *buf, size_t len, char sha[65], char md5[32]);

/*
 * The ETag S3 gives the object completed from parts[0..n): the MD5 of the
 * parts' MD5s, "-" and n, quoted ("\"<32 hex>-<n>\""), into etag. Returns
 * 0, or -EINVAL when a part's ETag is not an MD5 (32 hex digits, quoted or
 * not: server-side encryption, another store's form): then etag is "".
 */
int s3hash_multipart_etag(const struct objstore_part *parts, size_t n,
			  char etag[OBJSTORE_ETAG_MAX]);

#endif
