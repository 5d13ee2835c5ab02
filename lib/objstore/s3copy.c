// SPDX-License-Identifier: MIT
/*
 * s3copy: the s3:// backend's server-side copies (CopyObject): of one key
 * to another (objstore_copy), and of a key onto itself with new metadata
 * (objstore_set_sha256), which records the SHA-256 of an object uploaded
 * in parts, unknown when its upload began.
 *
 * A copy onto itself (x-amz-metadata-directive: REPLACE) replaces every
 * piece of metadata with what the request carries, so a HEAD first reads
 * what the object has (Content-Type and the other standard headers, the
 * storage class, every x-amz-meta-*), and the copy sends it again with
 * the new x-amz-meta-sha256. The copy is conditional on the ETag of the
 * version the caller published (x-amz-copy-source-if-match, and
 * x-amz-copy-if-match, the name radosgw reads): a version someone else
 * stored meanwhile is never stamped with a hash that is not its own.
 *
 * Above s3.copy_threshold (at most 5 GiB, what one CopyObject may copy)
 * both go in parts (s3copy_mp.c): the metadata a single copy would give
 * the new object goes with the CreateMultipartUpload instead. For a copy
 * onto itself that is what the HEAD found plus the new x-amz-meta-sha256;
 * for a copy to another key, the source's own metadata (which CopyObject's
 * default COPY directive keeps), its x-amz-meta-sha256 included.
 *
 * Stateless: each call builds its requests and runs them with s3req.c.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dstage/config.h"
#include "dstage/log.h"
#include "s3copy.h"
#include "s3copy_mp.h"
#include "s3mpu.h"
#include "s3store_i.h"
#include "sigv4.h"

/* Headers a REPLACE copy would drop and that we send again. Besides these,
 * every x-amz-meta-* but sha256. */
static const char *const s3copy_kept[] = {
	"content-type",	       "content-encoding", "content-disposition",
	"content-language",    "cache-control",	   "expires",
	"x-amz-storage-class",
};

/* Room in s3req.xhdrs for our own: directive, two if-match names. */
#define S3COPY_OWN 3
#define S3COPY_KEEP_MAX (S3REQ_XHDR_MAX - S3COPY_OWN)
#define S3COPY_VALUE_MAX 1024 /* longest header value carried over */

/* What a HEAD said that the copy carries over. */
struct s3copy_meta {
	char *hdrs[S3COPY_KEEP_MAX]; /* "name:value", lower-case names */
	size_t n;
	bool overflow; /* more, or longer, than we carry: refuse */
	/* A copy to another key (what COPY keeps): x-amz-meta-sha256 is
	 * carried, the storage class is not (a new object's is the
	 * handle's, or the store's default). Else a copy onto itself. */
	bool to_other;
};

static void s3copy_meta_release(struct s3copy_meta *m)
{
	for (size_t i = 0; i < m->n; i++)
		free(m->hdrs[i]);
	m->n = 0;
	m->overflow = false;
}

static bool s3copy_keeps(const struct s3copy_meta *m, const char *name,
			 size_t nlen)
{
	if (nlen > 11 && !strncasecmp(name, "x-amz-meta-", 11))
		return m->to_other ||
		       !(nlen == 17 &&
			 !strncasecmp(name, "x-amz-meta-sha256", 17));
	if (m->to_other && nlen == 19 &&
	    !strncasecmp(name, "x-amz-storage-class", 19))
		return false;
	for (size_t i = 0; i < sizeof(s3copy_kept) / sizeof(s3copy_kept[0]);
	     i++)
		if (strlen(s3copy_kept[i]) == nlen &&
		    !strncasecmp(name, s3copy_kept[i], nlen))
			return true;
	return false;
}

/* s3req.on_header of the HEAD. */
static void s3copy_on_header(void *arg, const char *name, size_t nlen,
			     const char *val, size_t vlen)
{
	struct s3copy_meta *m = arg;
	char *h;

	if (!name) {
		bool to_other = m->to_other;

		s3copy_meta_release(m);
		m->to_other = to_other;
		return;
	}
	if (!s3copy_keeps(m, name, nlen))
		return;
	if (m->n == S3COPY_KEEP_MAX || vlen > S3COPY_VALUE_MAX ||
	    memchr(val, '\n', vlen) || memchr(val, '\r', vlen)) {
		m->overflow = true;
		return;
	}
	h = malloc(nlen + vlen + 2);
	if (!h) {
		m->overflow = true;
		return;
	}
	for (size_t i = 0; i < nlen; i++)
		h[i] = (char)tolower((unsigned char)name[i]);
	h[nlen] = ':';
	memcpy(h + nlen + 1, val, vlen);
	h[nlen + 1 + vlen] = '\0';
	m->hdrs[m->n++] = h;
}

/* HEAD key: size and ETag into oi, what a copy keeps into m (may be
 * NULL). */
static int s3copy_head(struct s3store *st, const char *key,
		       struct objstore_info *oi, struct s3copy_meta *m)
{
	struct s3req rq;
	int ret = s3req_init(st, &rq, "HEAD", key, NULL, 0);

	if (ret)
		return ret;
	rq.flags = REQ_HEAD;
	if (m) {
		rq.on_header = s3copy_on_header;
		rq.on_header_arg = m;
	}
	ret = s3req_run(st, &rq, 1);
	if (!ret) {
		oi->size = rq.have_cl ? rq.content_length : 0;
		oi->mtime = rq.last_modified;
		snprintf(oi->etag, sizeof(oi->etag), "%s", rq.etag);
	}
	s3req_release(&rq);
	return ret;
}

/* Set rq up as a CopyObject of src onto dst (both relative to the
 * prefix). */
static int s3copy_init(struct s3store *st, const char *src, const char *dst,
		       struct s3req *rq)
{
	char *full;
	int ret = s3req_init(st, rq, "PUT", dst, NULL, 0);

	if (ret)
		return ret;
	full = s3req_strdupf("%s/%s%s", st->bucket, st->prefix, src);
	rq->copy_source = full ? sigv4_uri_encode(full, true) : NULL;
	free(full);
	if (!rq->copy_source) {
		s3req_release(rq);
		return -ENOMEM;
	}
	/* A 200 may still carry <Error>. */
	rq->flags = REQ_COLLECT | REQ_RESULT_XML;
	return 0;
}

int s3copy_object(struct objstore *os, const char *src, const char *dst)
{
	struct s3store *st = (struct s3store *)os;
	struct s3copy_meta m = { .to_other = true };
	struct objstore_info oi = { 0 };
	struct s3req rq;
	int ret;

	ret = s3copy_head(st, src, &oi, &m);
	if (ret)
		goto out;
	if (oi.size > os->cfg->s3_copy_threshold) {
		if (m.overflow) {
			log_error("s3: '%s%s' has more metadata than a copy "
				  "in parts carries over (%d headers of up to "
				  "%d bytes)",
				  st->prefix, src, S3COPY_KEEP_MAX,
				  S3COPY_VALUE_MAX);
			ret = -EOVERFLOW;
			goto out;
		}
		ret = s3copy_mp_run(st, src, dst, oi.size, oi.etag, NULL,
				    (const char *const *)m.hdrs, m.n, NULL);
		if (ret == -ESTALE)
			log_error("s3: copy of '%s%s' to '%s%s' in parts: the "
				  "source was replaced during the copy (it no "
				  "longer has ETag %s); '%s%s' is unchanged",
				  st->prefix, src, st->prefix, dst, oi.etag,
				  st->prefix, dst);
		goto out;
	}
	ret = s3copy_init(st, src, dst, &rq);
	if (ret)
		goto out;
	ret = s3req_run(st, &rq, 1);
	s3req_release(&rq);
out:
	s3copy_meta_release(&m);
	return ret;
}

int s3copy_set_sha256(struct objstore *os, const char *key, const char *etag,
		      const char *sha256, char new_etag[OBJSTORE_ETAG_MAX])
{
	struct s3store *st = (struct s3store *)os;
	struct s3copy_meta m = { 0 };
	struct objstore_info oi = { 0 };
	const char *hv[S3REQ_XHDR_MAX];
	char im1[OBJSTORE_ETAG_MAX + 32], im2[OBJSTORE_ETAG_MAX + 32];
	struct s3req rq;
	size_t nh = 0;
	int ret;

	ret = s3copy_head(st, key, &oi, &m);
	if (ret)
		goto out;
	if (etag && *etag && strcmp(etag, oi.etag)) {
		/* replaced since it was published: not ours to stamp */
		ret = -ESTALE;
		goto out;
	}
	if (m.overflow) {
		log_error("s3: '%s%s' has more metadata than a copy onto "
			  "itself carries over (%d headers of up to %d bytes)",
			  st->prefix, key, S3COPY_KEEP_MAX, S3COPY_VALUE_MAX);
		ret = -EOVERFLOW;
		goto out;
	}
	/* the handle's class is sent by s3req when it has one */
	for (size_t i = 0; i < m.n; i++)
		if (!(st->base.storage_class &&
		      !strncmp(m.hdrs[i], "x-amz-storage-class:", 20)))
			hv[nh++] = m.hdrs[i];
	if (oi.size > os->cfg->s3_copy_threshold) {
		/* the metadata goes with the upload's create */
		ret = s3copy_mp_run(st, key, key, oi.size, oi.etag, sha256, hv,
				    nh, new_etag);
		goto out;
	}
	ret = s3copy_init(st, key, key, &rq);
	if (ret)
		goto out;
	snprintf(im1, sizeof(im1), "x-amz-copy-source-if-match:%s", oi.etag);
	snprintf(im2, sizeof(im2), "x-amz-copy-if-match:%s", oi.etag);
	hv[nh++] = "x-amz-metadata-directive:REPLACE";
	hv[nh++] = im1;
	hv[nh++] = im2;
	rq.xhdrs = hv;
	rq.nxhdrs = nh;
	rq.meta_sha256 = sha256;
	rq.flags |= REQ_QUIET_412;
	ret = s3req_run(st, &rq, 1);
	if (!ret && new_etag) {
		/* radosgw keeps the ETag and may name none */
		if (s3mpu_result_etag(rq.resp, rq.resp_len, new_etag))
			new_etag[0] = '\0';
		if (!new_etag[0])
			snprintf(new_etag, OBJSTORE_ETAG_MAX, "%s", oi.etag);
	}
	s3req_release(&rq);
out:
	s3copy_meta_release(&m);
	return ret;
}
