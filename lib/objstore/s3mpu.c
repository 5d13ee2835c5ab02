// SPDX-License-Identifier: MIT
/*
 * s3mpu: the requests around an S3 multipart upload that do not carry its
 * data: CreateMultipartUpload, CompleteMultipartUpload and
 * AbortMultipartUpload, and reading the ETag of the XML results. The
 * uploads in parts of s3store.c (objstore_upload_*, put_fd) and the copies
 * in parts of s3copy_mp.c both build on them; each builds its own part
 * requests (UploadPart from a body, UploadPartCopy from an object).
 *
 * Stateless: each call builds its requests and runs them with s3req.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/log.h"
#include "s3hash.h"
#include "s3mpu.h"
#include "s3xml.h"

int s3mpu_abort(struct s3store *st, const char *key, const char *id)
{
	const char *kv[2] = { "uploadId", id };
	int ret = s3req_once(st, NULL, "DELETE", key, kv, 1, REQ_QUIET_404);

	if (ret && ret != -ENOENT)
		log_error("s3: could not abort multipart upload of '%s%s' "
			  "(upload %s): parts may linger until a lifecycle "
			  "rule removes them",
			  st->prefix, key, id);
	return ret == -ENOENT ? 0 : ret;
}

int s3mpu_create(struct s3store *st, const char *key, const char *sha,
		 const char *const *xhdrs, size_t nxhdrs, char **upload_id)
{
	const char *kv[2] = { "uploads", "" };
	struct s3req rq;
	int ret;

	if (nxhdrs > S3REQ_XHDR_MAX)
		return -EINVAL;
	ret = s3req_init(st, &rq, "POST", key, kv, 1);
	if (ret)
		return ret;
	rq.flags = REQ_COLLECT;
	rq.meta_sha256 = sha;
	rq.xhdrs = xhdrs;
	rq.nxhdrs = nxhdrs;
	ret = s3req_run(st, &rq, 1);
	if (!ret && s3xml_parse_upload_id(rq.resp ? rq.resp : "", rq.resp_len,
					  upload_id)) {
		log_error("s3: no UploadId in the answer to initiating a "
			  "multipart upload of '%s%s'",
			  st->prefix, key);
		ret = -EIO;
	}
	s3req_release(&rq);
	return ret;
}

int s3mpu_result_etag(const char *body, size_t len,
		      char etag[OBJSTORE_ETAG_MAX])
{
	char *v = NULL;
	size_t n;
	int ret;

	etag[0] = '\0';
	ret = s3xml_parse_complete(body ? body : "", len, &v, NULL);
	if (ret)
		return ret;
	/* AWS sends it quoted (&quot;, decoded by the parser), radosgw
	 * bare: quoted as a HEAD answers it. */
	n = strlen(v);
	if (n >= 2 && v[0] == '"' && v[n - 1] == '"')
		snprintf(etag, OBJSTORE_ETAG_MAX, "%.*s", (int)n, v);
	else if (n)
		snprintf(etag, OBJSTORE_ETAG_MAX, "\"%.*s\"",
			 OBJSTORE_ETAG_MAX - 3, v);
	free(v);
	return 0;
}

int s3mpu_complete(struct s3store *st, const char *key, const char *id,
		   const struct objstore_part *parts, size_t n, uint64_t size,
		   const char *if_match, const char *want_etag,
		   char etag[OBJSTORE_ETAG_MAX])
{
	const char *kv[2] = { "uploadId", id };
	const char **etags = calloc(n ? n : 1, sizeof(*etags));
	char *body = NULL;
	struct s3req rq;
	int ret;

	if (etag)
		etag[0] = '\0';
	if (!etags)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		etags[i] = parts[i].etag;
	body = s3xml_build_complete(etags, n);
	free(etags);
	if (!body)
		return errno == EINVAL ? -EINVAL : -ENOMEM;
	ret = s3req_init(st, &rq, "POST", key, kv, 1);
	if (ret)
		goto out;
	/* A 200 may still carry <Error>. */
	rq.flags = REQ_COLLECT | REQ_RESULT_XML;
	rq.if_match = if_match;
	rq.body = body;
	rq.body_len = strlen(body);
	s3hash_buf(body, rq.body_len, rq.payload_hash, rq.content_md5);
	ret = s3req_run(st, &rq, 1);
	if (!ret && etag && s3mpu_result_etag(rq.resp, rq.resp_len, etag))
		etag[0] = '\0'; /* completed: the caller forms the ETag */
	if (ret == -ENOENT && rq.attempt > 1) {
		/* NoSuchUpload on a retry: the first attempt may have
		 * completed it and lost the answer. Trust the size (and the
		 * ETag the parts make, when the caller knows it). */
		struct s3req hd;

		if (!s3req_once(st, &hd, "HEAD", key, NULL, 0,
				REQ_HEAD | REQ_QUIET_404) &&
		    hd.have_cl && hd.content_length == size &&
		    (!want_etag || !strcmp(want_etag, hd.etag))) {
			log_warn("s3: '%s%s': upload completed by an earlier "
				 "attempt",
				 st->prefix, key);
			if (etag)
				snprintf(etag, OBJSTORE_ETAG_MAX, "%s",
					 hd.etag);
			ret = 0;
		}
		s3req_release(&hd);
	}
	s3req_release(&rq);
out:
	free(body);
	return ret;
}
