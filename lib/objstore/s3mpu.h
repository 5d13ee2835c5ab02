/* SPDX-License-Identifier: MIT */
/*
 * s3mpu: the requests that begin, complete and abort an S3 multipart
 * upload (lib/objstore/s3mpu.c), shared by the uploads in parts of s3store.c and
 * the copies in parts of s3copy_mp.c. Not a public header.
 */
#ifndef DSTAGE_S3MPU_H
#define DSTAGE_S3MPU_H

#include <stddef.h>
#include <stdint.h>

#include "objstore_backend.h"
#include "s3store_i.h"

/*
 * CreateMultipartUpload of key (relative to the prefix): x-amz-meta-sha256
 * from sha (may be NULL), and the headers xhdrs[0..nxhdrs) ("name:value",
 * lower-case names; the metadata the object will have). *upload_id is
 * malloc'd. Returns 0 or -errno (logged).
 */
int s3mpu_create(struct s3store *st, const char *key, const char *sha,
		 const char *const *xhdrs, size_t nxhdrs, char **upload_id);

/*
 * CompleteMultipartUpload of upload id of key from parts[0..n) (their
 * ETags), size bytes in all; if_match (may be NULL): only over the version
 * of key with that ETag (If-Match, which AWS honours and radosgw 16
 * ignores; -ESTALE). etag (may be NULL) gets the ETag the answer
 * names, quoted, or "" (radosgw names none). When a retry finds the upload
 * gone (the first attempt may have completed it and lost the answer), a
 * HEAD decides: the object must have size bytes and, when want_etag is not
 * NULL, that ETag (a copy onto itself has the size already). Returns 0 or
 * -errno (logged).
 */
int s3mpu_complete(struct s3store *st, const char *key, const char *id,
		   const struct objstore_part *parts, size_t n, uint64_t size,
		   const char *if_match, const char *want_etag,
		   char etag[OBJSTORE_ETAG_MAX]);

/*
 * AbortMultipartUpload of upload id of key. An upload already gone is
 * success. Returns 0 or -errno (logged: its parts linger).
 */
int s3mpu_abort(struct s3store *st, const char *key, const char *id);

/*
 * The <ETag> of a CopyObjectResult, CopyPartResult or
 * CompleteMultipartUploadResult in body, quoted as a HEAD gives it, into
 * etag ("" when it names none). Returns 0, -EIO (an <Error>: logged),
 * -EINVAL (another document: logged) or -ENOMEM.
 */
int s3mpu_result_etag(const char *body, size_t len,
		      char etag[OBJSTORE_ETAG_MAX]);

#endif
