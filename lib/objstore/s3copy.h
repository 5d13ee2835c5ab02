/* SPDX-License-Identifier: MIT */
/*
 * s3copy: the s3:// backend's server-side copies (lib/objstore/s3copy.c), its ops
 * copy and set_sha256. Not a public header.
 */
#ifndef DSTAGE_S3COPY_H
#define DSTAGE_S3COPY_H

#include "objstore_backend.h"

/* objstore_copy on an s3:// store: CopyObject of src to dst, or above
 * s3.copy_threshold a copy in parts (s3copy_mp.c) carrying src's
 * metadata; -ESTALE when src was replaced during a copy in parts, -EFBIG
 * beyond 10,000 parts of 5 GiB, -EOVERFLOW when src has more metadata
 * than a copy in parts carries (each logged). */
int s3copy_object(struct objstore *os, const char *src, const char *dst);

/* objstore_set_sha256 on an s3:// store (see include/dstage/objstore.h):
 * HEAD, then a copy of key onto itself if it still has etag (in parts above
 * s3.copy_threshold). */
int s3copy_set_sha256(struct objstore *os, const char *key, const char *etag,
		      const char *sha256, char new_etag[OBJSTORE_ETAG_MAX]);

#endif
