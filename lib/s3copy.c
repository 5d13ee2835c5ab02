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

#include "dstage/log.h"
#include "s3copy.h"
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
};

static void s3copy_meta_release(struct s3copy_meta *m)
{
	for (size_t i = 0; i < m->n; i++)
		free(m->hdrs[i]);
	m->n = 0;
	m->overflow = false;
}

static bool s3copy_keeps(const char *name, size_t nlen)
{
	if (nlen > 11 && !strncasecmp(name, "x-amz-meta-", 11))
		return !(nlen == 17 &&
			 !strncasecmp(name, "x-amz-meta-sha256", 17));
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
		s3copy_meta_release(m);
		return;
	}
	if (!s3copy_keeps(name, nlen))
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
	struct objstore_info oi = { 0 };
	struct s3req rq;
	int ret;

	ret = s3copy_head(st, src, &oi, NULL);
	if (ret)
		return ret;
	if (oi.size > S3_MAX_COPY) {
		log_error("s3: copy of '%s%s' (%" PRIu64 " bytes) exceeds the "
			  "5 GiB single-request copy limit",
			  st->prefix, src, oi.size);
		return -EFBIG;
	}
	ret = s3copy_init(st, src, dst, &rq);
	if (ret)
		return ret;
	ret = s3req_run(st, &rq, 1);
	s3req_release(&rq);
	return ret;
}

/* The <ETag> of a CopyObjectResult, quoted as a HEAD gives it ("" when
 * there is none). AWS sends it as &quot;...&quot;, radosgw bare. */
static void s3copy_result_etag(const char *xml, size_t len,
			       char etag[OBJSTORE_ETAG_MAX])
{
	const char *a, *b;
	char v[OBJSTORE_ETAG_MAX - 2]; /* room for the quotes */
	size_t n = 0;

	etag[0] = '\0';
	a = xml ? strstr(xml, "<ETag>") : NULL;
	b = a ? strstr(a, "</ETag>") : NULL;
	if (!b || b > xml + len)
		return;
	for (a += 6; a < b && n + 1 < sizeof(v); a++) {
		if (*a == '&' && !strncmp(a, "&quot;", 6)) {
			a += 5;
			continue;
		}
		if (*a == '"')
			continue;
		v[n++] = *a;
	}
	v[n] = '\0';
	if (n)
		snprintf(etag, OBJSTORE_ETAG_MAX, "\"%.*s\"",
			 OBJSTORE_ETAG_MAX - 3, v);
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
	if (oi.size > S3_MAX_COPY) {
		ret = -EFBIG;
		goto out;
	}
	if (m.overflow) {
		log_error("s3: '%s%s' has more metadata than a copy onto "
			  "itself carries over (%d headers of up to %d bytes)",
			  st->prefix, key, S3COPY_KEEP_MAX, S3COPY_VALUE_MAX);
		ret = -EOVERFLOW;
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
	for (size_t i = 0; i < m.n; i++)
		/* the handle's class is sent by s3req when it has one */
		if (!(st->base.storage_class &&
		      !strncmp(m.hdrs[i], "x-amz-storage-class:", 20)))
			hv[nh++] = m.hdrs[i];
	rq.xhdrs = hv;
	rq.nxhdrs = nh;
	rq.meta_sha256 = sha256;
	rq.flags |= REQ_QUIET_412;
	ret = s3req_run(st, &rq, 1);
	if (!ret && new_etag) {
		s3copy_result_etag(rq.resp, rq.resp_len, new_etag);
		if (!new_etag[0])
			snprintf(new_etag, OBJSTORE_ETAG_MAX, "%s", oi.etag);
	}
	s3req_release(&rq);
out:
	s3copy_meta_release(&m);
	return ret;
}
