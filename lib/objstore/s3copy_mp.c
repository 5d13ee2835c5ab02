// SPDX-License-Identifier: MIT
/*
 * s3copy_mp: server-side copies in parts, for objects larger than one
 * CopyObject may copy (5 GiB, or s3.copy_threshold): the copies of
 * objstore_copy (checkpoint renames) and objstore_set_sha256 (a copy onto
 * itself with new metadata) above the threshold.
 *
 *   CreateMultipartUpload dst  (the metadata the copy is to have)
 *   UploadPartCopy 1..n         PUT dst?partNumber=N&uploadId=ID with
 *                               x-amz-copy-source and
 *                               x-amz-copy-source-range: bytes=A-B,
 *                               several in flight at once (s3req_run)
 *   CompleteMultipartUpload dst (the parts' ETags)
 *   AbortMultipartUpload dst    on any failure after the create
 *
 * Invariants: every part copies from the version of src whose ETag the
 * caller's HEAD found, so the object completed is one version's bytes,
 * never a mix. Each part is conditional on that ETag
 * (x-amz-copy-source-if-match, and x-amz-copy-if-match, the name radosgw
 * reads on CopyObject), but radosgw 16 ignores both on UploadPartCopy
 * (measured), so a second HEAD after the last part must find the same
 * ETag: every part was copied between two HEADs that saw one version.
 * dst changes only at the complete, all or nothing; a copy onto itself
 * completes with If-Match on the version it copied (AWS honours it;
 * radosgw 16 does not, so there a version stored between the second HEAD
 * and the complete, a window of one request, is overwritten). No upload is
 * left open by a failure (the abort is logged when it fails itself). The
 * begin, complete and abort requests are s3mpu.c's, shared with the
 * uploads in parts.
 *
 * Stateless: each call builds its requests and runs them with s3req.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/config.h"
#include "dstage/log.h"
#include "s3copy_mp.h"
#include "s3hash.h"
#include "s3mpu.h"
#include "sigv4.h"

/* Parts copied per batch: s3req_run keeps s3.max_inflight of them in
 * flight; a failed batch ends the copy without starting the rest. Bounds
 * the requests held at once. */
#define S3COPY_MP_BATCH 64

/* The headers of one UploadPartCopy besides x-amz-copy-source: its range
 * and the two names of the if-match. */
#define S3COPY_MP_NHDR 3

/* The part size for size bytes: s3.copy_part_size (5 MiB..5 GiB), doubled
 * until size fits in S3_MAX_PARTS parts and capped at S3_MAX_COPY. 0 when
 * even parts of S3_MAX_COPY do not fit. */
static uint64_t s3copy_mp_part_size(const struct s3store *st, uint64_t size)
{
	uint64_t part = st->base.cfg->s3_copy_part_size;

	if (part < (5u << 20))
		part = 5u << 20;
	if (part > S3_MAX_COPY)
		part = S3_MAX_COPY;
	while ((size + part - 1) / part > S3_MAX_PARTS && part < S3_MAX_COPY)
		part = part * 2 < S3_MAX_COPY ? part * 2 : S3_MAX_COPY;
	return (size + part - 1) / part > S3_MAX_PARTS ? 0 : part;
}

/* One batch's requests (on the heap: a FUSE thread's stack is small). */
struct s3copy_mp_bufs {
	struct s3req reqs[S3COPY_MP_BATCH];
	char ranges[S3COPY_MP_BATCH][80];
	const char *hv[S3COPY_MP_BATCH][S3COPY_MP_NHDR];
};

/* Copy parts first..first+n (0-based, n <= S3COPY_MP_BATCH) of src into
 * upload id of dst, part bytes each (the last one shorter), and note their
 * ETags in done[]. */
static int s3copy_mp_batch(struct s3store *st, const char *src, const char *dst,
			   const char *id, const char *source,
			   const char *const im[2], uint64_t size,
			   uint64_t part, size_t first, size_t n,
			   struct s3copy_mp_bufs *b, struct objstore_part *done)
{
	struct s3req *reqs = b->reqs;
	size_t ready = 0;
	int ret = 0;

	for (size_t j = 0; j < n; j++) {
		uint64_t off = (first + j) * part;
		uint64_t len = size - off < part ? size - off : part;
		char num[16];
		const char *kv[4] = { "partNumber", num, "uploadId", id };

		snprintf(num, sizeof(num), "%zu", first + j + 1);
		ret = s3req_init(st, &reqs[j], "PUT", dst, kv, 2);
		if (ret)
			goto out;
		ready++;
		reqs[j].copy_source = strdup(source);
		if (!reqs[j].copy_source) {
			ret = -ENOMEM;
			goto out;
		}
		snprintf(b->ranges[j], sizeof(b->ranges[j]),
			 "x-amz-copy-source-range:bytes=%" PRIu64 "-%" PRIu64,
			 off, off + len - 1);
		b->hv[j][0] = b->ranges[j];
		b->hv[j][1] = im[0];
		b->hv[j][2] = im[1];
		reqs[j].xhdrs = b->hv[j];
		reqs[j].nxhdrs = S3COPY_MP_NHDR;
		/* A 200 may carry <Error>; a failed if-match is ours to
		 * report, once for the copy. */
		reqs[j].flags = REQ_COLLECT | REQ_RESULT_XML | REQ_QUIET_412;
		done[first + j].len = len;
	}
	/* -ESTALE (quiet here): the caller's to report */
	ret = s3req_run(st, reqs, n);
	for (size_t j = 0; j < n && !ret; j++) {
		char *etag = done[first + j].etag;

		ret = s3mpu_result_etag(reqs[j].resp, reqs[j].resp_len, etag);
		if (!ret && !etag[0]) {
			log_error("s3: part %zu of the copy of '%s%s' to "
				  "'%s%s' answered without an ETag",
				  first + j + 1, st->prefix, src, st->prefix,
				  dst);
			ret = -EIO;
		} else if (ret) {
			log_error("s3: part %zu of the copy of '%s%s' to "
				  "'%s%s': unreadable answer",
				  first + j + 1, st->prefix, src, st->prefix,
				  dst);
			ret = ret == -ENOMEM ? ret : -EIO;
		}
	}
out:
	for (size_t j = 0; j < ready; j++)
		s3req_release(&reqs[j]);
	return ret;
}

/* Whether src still has etag after the parts: -ESTALE when not (or gone),
 * quiet; other errors logged by s3req. */
static int s3copy_mp_recheck(struct s3store *st, const char *src,
			     const char *etag)
{
	struct s3req rq;
	int ret = s3req_once(st, &rq, "HEAD", src, NULL, 0,
			     REQ_HEAD | REQ_QUIET_404);

	if (ret == -ENOENT || (!ret && strcmp(rq.etag, etag)))
		ret = -ESTALE;
	s3req_release(&rq);
	return ret;
}

int s3copy_mp_run(struct s3store *st, const char *src, const char *dst,
		  uint64_t size, const char *etag, const char *sha,
		  const char *const *hdrs, size_t nh,
		  char new_etag[OBJSTORE_ETAG_MAX])
{
	uint64_t part = s3copy_mp_part_size(st, size);
	size_t nparts = part ? (size_t)((size + part - 1) / part) : 0;
	char im1[OBJSTORE_ETAG_MAX + 32], im2[OBJSTORE_ETAG_MAX + 32];
	const char *const im[2] = { im1, im2 };
	char want[OBJSTORE_ETAG_MAX], got[OBJSTORE_ETAG_MAX];
	struct objstore_part *done = NULL;
	struct s3copy_mp_bufs *b = NULL;
	char *full, *source = NULL, *id = NULL;
	int ret;

	if (new_etag)
		new_etag[0] = '\0';
	if (!part) {
		log_error("s3: copy of '%s%s' (%" PRIu64 " bytes) exceeds "
			  "what a copy in parts can copy (%d parts of 5 GiB)",
			  st->prefix, src, size, S3_MAX_PARTS);
		return -EFBIG;
	}
	if (!size || !etag || !*etag || nh > S3REQ_XHDR_MAX)
		return -EINVAL;
	snprintf(im1, sizeof(im1), "x-amz-copy-source-if-match:%s", etag);
	snprintf(im2, sizeof(im2), "x-amz-copy-if-match:%s", etag);
	full = s3req_strdupf("%s/%s%s", st->bucket, st->prefix, src);
	source = full ? sigv4_uri_encode(full, true) : NULL;
	free(full);
	done = calloc(nparts, sizeof(*done));
	b = calloc(1, sizeof(*b));
	if (!source || !done || !b) {
		ret = -ENOMEM;
		goto out;
	}
	ret = s3mpu_create(st, dst, sha, hdrs, nh, &id);
	if (ret)
		goto out;
	for (size_t first = 0; first < nparts && !ret;
	     first += S3COPY_MP_BATCH) {
		size_t n = nparts - first < S3COPY_MP_BATCH ? nparts - first
							    : S3COPY_MP_BATCH;

		ret = s3copy_mp_batch(st, src, dst, id, source, im, size, part,
				      first, n, b, done);
	}
	if (!ret)
		ret = s3copy_mp_recheck(st, src, etag);
	if (ret)
		goto abort;
	/* The ETag S3 forms from the parts: what a retried complete whose
	 * first answer was lost must find (dst may be src, same size). */
	if (s3hash_multipart_etag(done, nparts, want))
		want[0] = '\0';
	ret = s3mpu_complete(st, dst, id, done, nparts, size,
			     strcmp(src, dst) ? NULL : etag,
			     want[0] ? want : NULL, got);
	if (ret)
		goto abort;
	if (new_etag)
		snprintf(new_etag, OBJSTORE_ETAG_MAX, "%s",
			 got[0] ? got : want);
	log_debug("s3: copied '%s%s' to '%s%s' in %zu parts of %" PRIu64
		  " bytes",
		  st->prefix, src, st->prefix, dst, nparts, part);
	goto out;
abort:
	s3mpu_abort(st, dst, id);
out:
	free(id);
	free(b);
	free(done);
	free(source);
	return ret;
}
