/* SPDX-License-Identifier: MIT */
/*
 * s3xml: the S3 XML documents dstage reads and writes, on libxml2.
 *
 * Parsing never touches the network (XML_PARSE_NONET), never expands
 * entities, and refuses any document with a DTD (<!DOCTYPE>), so "billion
 * laughs" and external-entity documents are -EINVAL. Bodies are bounded
 * (S3XML_MAX_BODY), and so are keys and numbers. Element names are matched
 * without regard to their namespace: AWS, radosgw and MinIO all send the S3
 * xmlns, some proxies none.
 *
 * Every string handed out is malloc'd: free() it (or use the release call).
 */
#ifndef DSTAGE_S3XML_H
#define DSTAGE_S3XML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest response body parsed; S3 lists are about 1 MiB a page. */
#define S3XML_MAX_BODY (32u * 1024 * 1024)
/* The longest key accepted (S3 allows 1024 bytes of UTF-8). */
#define S3XML_MAX_KEY 4096

struct s3xml_object {
	char *key; /* decoded when the listing was EncodingType=url */
	uint64_t size; /* at most INT64_MAX */
	char *etag; /* as sent, quotes included; "" when absent */
	int64_t mtime; /* LastModified, epoch seconds; 0 when absent */
};

struct s3xml_list {
	struct s3xml_object *objects;
	size_t nobjects;
	bool truncated; /* IsTruncated */
	char *next_token; /* NextContinuationToken, NULL when absent */
};

/*
 * Parse a ListObjectsV2 result (ListBucketResult) into *out (zeroed first).
 * When the response says <EncodingType>url</EncodingType>, keys are decoded
 * ('+' is a space, %XX a byte). Contents without a Key or Size, a Size that
 * is not a plain decimal up to INT64_MAX, a bad LastModified, a decoded key
 * holding NUL or longer than S3XML_MAX_KEY make the whole page invalid.
 * Returns 0, -EINVAL (malformed, or not a ListBucketResult; logged) or
 * -ENOMEM. On error *out is left empty.
 */
int s3xml_parse_list(const char *body, size_t len, struct s3xml_list *out);

/* Free everything in *l and zero it. Accepts NULL. */
void s3xml_list_release(struct s3xml_list *l);

struct s3xml_mpu {
	char *key;
	char *upload_id;
	int64_t initiated; /* Initiated, epoch seconds; 0 when absent */
};

struct s3xml_mpu_list {
	struct s3xml_mpu *uploads;
	size_t nuploads;
	bool truncated; /* IsTruncated */
	char *next_key; /* NextKeyMarker, NULL when absent */
	char *next_id; /* NextUploadIdMarker, NULL when absent */
};

/*
 * Parse a ListMultipartUploadsResult into *out (zeroed first). Keys are
 * decoded as in s3xml_parse_list when EncodingType is url. An <Upload>
 * without a Key or UploadId, a bad Initiated, or a bad key makes the whole
 * page invalid. Returns 0, -EINVAL (logged) or -ENOMEM; on error *out is
 * left empty.
 */
int s3xml_parse_mpu_list(const char *body, size_t len,
			 struct s3xml_mpu_list *out);

/* Free everything in *l and zero it. Accepts NULL. */
void s3xml_mpu_list_release(struct s3xml_mpu_list *l);

/* Empty strings when absent; radosgw sends an empty <Message/>. */
struct s3xml_error {
	char code[64];
	char message[256]; /* truncated to fit */
};

/*
 * Parse <Error><Code>..</Code><Message>..</Message>...</Error>. Returns 0 if
 * body is an Error document (out filled), -EINVAL otherwise (out zeroed; not
 * logged at error level: a body that is not S3 XML is common, e.g. from a
 * proxy).
 */
int s3xml_parse_error(const char *body, size_t len, struct s3xml_error *out);

/*
 * The UploadId of an InitiateMultipartUploadResult, malloc'd into
 * *upload_id. Returns 0, -EINVAL (malformed, another document, or an empty
 * UploadId; logged) or -ENOMEM.
 */
int s3xml_parse_upload_id(const char *body, size_t len, char **upload_id);

/*
 * A CompleteMultipartUploadResult, CopyObjectResult or CopyPartResult (the
 * answer to UploadPartCopy), which S3 may answer with status 200 and an
 * <Error> body instead. Returns:
 *   0        *etag malloc'd: the ETag as sent, possibly "" (radosgw may
 *            answer an empty <ETag>; an absent one is "" too)
 *   -EIO     the body is an <Error>; err (may be NULL) filled, logged
 *   -EINVAL  malformed or another document (logged)
 *   -ENOMEM  out of memory
 */
int s3xml_parse_complete(const char *body, size_t len, char **etag,
			 struct s3xml_error *err);

/*
 * The CompleteMultipartUpload request body for parts 1..n whose ETags are
 * etags[0..n-1] (XML-escaped here). Returns a malloc'd string, or NULL with
 * errno ENOMEM (EINVAL when an etag is NULL or n is 0 or above 10000).
 */
char *s3xml_build_complete(const char *const *etags, size_t n);

/*
 * ISO 8601 UTC time "2009-10-12T17:50:30.000Z" (fraction optional, 'Z' or a
 * "+HH:MM"/"-HH:MM" offset) to epoch seconds; the fraction is dropped.
 * Returns 0 or -EINVAL (any other shape or an impossible date).
 */
int s3xml_parse_iso8601(const char *s, int64_t *out);

#endif
