/* SPDX-License-Identifier: MIT */
/*
 * s3copy_mp: the s3:// backend's server-side copies in parts
 * (lib/objstore/s3copy_mp.c), for objects above s3.copy_threshold. Not a public
 * header.
 */
#ifndef DSTAGE_S3COPY_MP_H
#define DSTAGE_S3COPY_MP_H

#include <stddef.h>
#include <stdint.h>

#include "objstore_backend.h"
#include "s3store_i.h"

/*
 * Copy src, size bytes whose ETag is etag (a HEAD's), onto dst (may be src)
 * in parts: CreateMultipartUpload of dst with the metadata the copy is to
 * have (hdrs[0..nh), "name:value" with lower-case names, and
 * x-amz-meta-sha256 from sha, may be NULL), UploadPartCopy of each range of
 * s3.copy_part_size bytes (grown to fit 10,000 parts), each conditional on
 * etag, several at once, then CompleteMultipartUpload. Any failure aborts
 * the upload: dst is then unchanged. new_etag (may be NULL) gets dst's new
 * ETag, "" when the store names none and the parts' ETags cannot form it.
 * Returns 0, -ESTALE (src no longer has etag: not logged, the caller
 * says what it means), -EFBIG (over 10,000 parts of 5 GiB), -EINVAL (more
 * than S3REQ_XHDR_MAX headers), or the errors of dstage/objstore.h, each
 * logged once.
 */
int s3copy_mp_run(struct s3store *st, const char *src, const char *dst,
		  uint64_t size, const char *etag, const char *sha,
		  const char *const *hdrs, size_t nh,
		  char new_etag[OBJSTORE_ETAG_MAX]);

#endif
