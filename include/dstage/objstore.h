/* SPDX-License-Identifier: MIT */
/*
 * objstore: one interface to the object stores dstage reads datasets from and
 * writes checkpoints to.
 *
 *   s3://bucket/prefix/   any S3-compatible endpoint (Signature V4, libcurl)
 *   file:///dir/          a POSIX directory (parallel FS, NFS, local disk)
 *
 * Keys passed to every call are relative to the URL's prefix ("a/b.tar" under
 * s3://bkt/ds/ is object "ds/a/b.tar"). A handle is safe to use from many
 * threads at once; each call blocks until done, retries included.
 *
 * Errors are -errno, each logged once with the URL, HTTP status and S3 code:
 *   -ENOENT     no such key or bucket
 *   -EACCES     credentials refused (InvalidAccessKeyId, SignatureDoesNotMatch,
 *               AccessDenied)
 *   -ESTALE     If-Match failed: the object changed under a snapshot
 *   -ETIMEDOUT  connect/low-speed timeout or the deadline passed while retrying
 *   -EIO        5xx after the retry budget, short or corrupt bodies, resets
 *   -EINVAL     a bad URL, key or argument
 *   -ENOMEM     out of memory
 *   -ERANGE     a range past the end of the object
 * file:// sources only (docs/objstore.md, "Confinement"):
 *   -ELOOP      the key is or passes through a symlink not followed
 *               (sources.follow_symlinks = no)
 *   -EXDEV      the key is a symlink leading outside the source
 *   -EINVAL     the key names a FIFO, socket or device (never opened)
 * Keys are 1 to 1,024 bytes (KEYPATH_KEY_MAX); others are -EINVAL.
 */
#ifndef DSTAGE_OBJSTORE_H
#define DSTAGE_OBJSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct dstage_config;
struct objstore;
struct objstore_upload;

#define OBJSTORE_ETAG_MAX 128

struct objstore_info {
	const char *key; /* relative to the store's prefix */
	uint64_t size;
	char etag[OBJSTORE_ETAG_MAX]; /* quoted as the server sends it */
	int64_t mtime; /* seconds since the epoch */
	/* objstore_head only: the object's x-amz-meta-sha256 (64 lowercase
	 * hex digits), "" when it has none (always for file://). */
	char sha256[65];
	/* objstore_list_tree only: NULL for an object or a directory;
	 * else the key names an entry that cannot be an object (a symbolic
	 * link not followed, a FIFO, a directory the process may not
	 * read...) and this says why (static text, or valid during the
	 * call); size, etag and mtime are 0. */
	const char *skipped;
};

/* One ranged GET of objstore_get_many. len bytes from off into buf;
 * if_match may be NULL. */
struct objstore_get_req {
	const char *key;
	uint64_t off;
	size_t len;
	const char *if_match;
	void *buf;
	size_t got; /* out: bytes stored; == len unless at EOF */
	int result; /* out: 0 or -errno */
	/* A missing key (-ENOENT) is an answer the caller expects, not a
	 * failure: logged at debug level, not as an error (a lookup of an
	 * optional record, such as a checkpoint's owner record). */
	bool missing_ok;
	/*
	 * Optional (NULL: none): called as the body lands in buf, in order,
	 * with each piece just stored at buf + at (n bytes), while it is
	 * still in the CPU's cache. A retry that starts over calls it again
	 * from at == 0. Must not fail or block.
	 */
	void (*on_data)(void *arg, size_t at, const void *p, size_t n);
	void *on_data_arg;
};

/* Counters since objstore_open; all monotonic. */
struct objstore_stats {
	uint64_t requests; /* HTTP requests or file operations sent */
	uint64_t retries; /* of those, retries */
	uint64_t bytes_in; /* body bytes received */
	uint64_t bytes_out; /* body bytes sent */
	uint64_t errors; /* operations that ended in an error */
};

/*
 * Open a store for url (s3://... or file://...). cfg supplies the endpoint,
 * region, credentials, timeouts and retry policy; it must outlive the handle.
 * Returns 0, -EINVAL (bad URL, message logged), -EACCES (credentials file
 * readable by group or others; a session token over plain http without
 * s3.allow_insecure_token), -ENOENT (file:// dir missing), -ENOMEM.
 */
int objstore_open(const char *url, const struct dstage_config *cfg,
		  struct objstore **out);

/* Accepts NULL. */
void objstore_free(struct objstore *os);

/* Why a read of a tiered store (objstore_open_tiered) went to the origin. */
enum {
	OBJSTORE_TIER_MISSING, /* not in the tier's MANIFEST, or its file
				* is gone */
	OBJSTORE_TIER_DAMAGED, /* its file's size or SHA-256 differs from
				* the MANIFEST's */
	OBJSTORE_TIER_CHANGED, /* the reader's If-Match is another ETag (a
				* snapshot the copy is not of) */
	OBJSTORE_TIER_UNREACHABLE, /* the tier's read failed otherwise */
	OBJSTORE_TIER_UNTRUSTED, /* the tier fails the trust rule (others
				  * may write it; docs/security.md) */
	OBJSTORE_TIER_UNCHECKED, /* no reference hash for the key: the
				  * copy's own MANIFEST is not enough */
	OBJSTORE_TIER_CAUSES
};

/* Process totals of the tiered stores; all monotonic. */
struct objstore_tier_stats {
	uint64_t reads; /* ranged reads served by a shared tier */
	uint64_t bytes; /* their bytes */
	uint64_t fallbacks[OBJSTORE_TIER_CAUSES]; /* reads sent to the origin */
};

/* A key's reference hash (the dataset's sums key), for a tiered store. */
struct objstore_tier_ref {
	const char *key;
	unsigned char sha256[32];
};

/* How a tiered store is opened. */
struct objstore_tier_opts {
	const struct objstore_tier_ref *refs; /* any order; copied */
	size_t nrefs;
	int refused; /* -1, or a cause: every read goes to the origin,
		      * counted under it, and dir is not read at all */
	/* Called (from any thread) when a cause is first logged for the
	 * handle, with report_tag (copied at open), dir and the key; NULL:
	 * nothing called. */
	void (*report)(const struct dstage_config *cfg, const char *tag,
		       const char *dir, int cause, const char *key, int err);
	const char *report_tag;
	/* Asked (from any thread) before each read the tier would serve,
	 * with trust_root (copied at open) and dir: non-zero when the tier no
	 * longer keeps its trust rule (a tier made writable by others after
	 * the open), and the read goes to the origin, counted untrusted. NULL:
	 * asked at open only (refused). Must be cheap: a memo of the walk. */
	int (*trusted)(const char *root, const char *dir);
	const char *trust_root;
};

/*
 * A dataset's source with its shared tier in front (docs/objstore.md,
 * "The shared tier"): dir is a snapshot's copy (DIR/MANIFEST,
 * DIR/data/KEY; include/dstage/sharedtier.h). Reads come from the copy
 * when its MANIFEST lists the key with the reader's If-Match ETag, o lists
 * the key's reference hash, the MANIFEST agrees with it and the file passed
 * its check (the whole file's SHA-256 against the reference, on first
 * use); else, and when the copy's read fails, from origin, each
 * counted (objstore_get_tier_stats) and logged once per cause. list and
 * head are origin's; writes are -EROFS. On success the handle owns origin.
 * The MANIFEST is opened with O_NOFOLLOW | O_NONBLOCK, a regular file only.
 * Returns 0, -ENOENT (no MANIFEST in dir: not published), -EINVAL (a
 * MANIFEST line that cannot be parsed, or not a regular file; logged),
 * -ENOMEM, or an error of objstore_open on dir/data/. On failure origin
 * stays the caller's.
 */
int objstore_open_tiered(const char *dir, const struct objstore_tier_opts *o,
			 struct objstore *origin, struct objstore **out);

/* The tiered stores' totals, and the name of a cause ("missing",
 * "damaged", "changed", "unreachable", "untrusted", "unchecked"). */
void objstore_get_tier_stats(struct objstore_tier_stats *st);
const char *objstore_tier_cause_name(int cause);

/* The URL the store was opened with (for messages: checkpoints name it). */
const char *objstore_url(const struct objstore *os);

/*
 * List every object whose key starts with prefix (may be "" for all), in key
 * order, page by page: cb is called once per object and may stop the listing
 * by returning non-zero, which objstore_list then returns. The info passed to
 * cb is valid only during the call.
 */
typedef int (*objstore_list_cb)(void *arg, const struct objstore_info *oi);
int objstore_list(struct objstore *os, const char *prefix, objstore_list_cb cb,
		  void *arg);

/*
 * objstore_list for a snapshot of a tree (the catalog's registration): as
 * objstore_list, and, from a file:// store, also every directory under the
 * prefix as its key and a '/' (the form of an S3 folder marker) before what
 * it holds, so that an empty directory is seen, and every entry that cannot
 * be an object with oi->skipped set to why (in place of the store's own log
 * line: the caller logs and counts it). Other stores list as
 * objstore_list: their folder markers are keys already.
 */
int objstore_list_tree(struct objstore *os, const char *prefix,
		       objstore_list_cb cb, void *arg);

/* Size, ETag and mtime of one object. info->key points at key. */
int objstore_head(struct objstore *os, const char *key,
		  struct objstore_info *info);

/*
 * Read len bytes at off into buf. *got is set to the bytes stored, fewer than
 * len only when the object ends first. A body shorter than promised is retried,
 * never returned. if_match (may be NULL) is sent as If-Match; a mismatch is
 * -ESTALE. off at or past the end of a non-empty object is -ERANGE.
 */
int objstore_get(struct objstore *os, const char *key, uint64_t off, size_t len,
		 const char *if_match, void *buf, size_t *got);

/*
 * Run n ranged GETs with up to s3.max_inflight in flight at once over reused
 * connections. Each request's result lands in its own result/got fields.
 * Returns 0 when all succeeded, else the first failing request's -errno;
 * -ENXIO when os is NULL (no store: a reader of the cache alone, such as
 * `stager verify --cache` with its source unreachable, that reached a block
 * the cache must fetch). objstore_get likewise.
 */
int objstore_get_many(struct objstore *os, struct objstore_get_req *reqs,
		      size_t n);

/*
 * Store size bytes read from fd (from its offset 0, with pread) as key.
 * Objects at or above s3.multipart_threshold go up as a multipart upload
 * (objstore_upload_* below) with up to s3.max_inflight parts in flight on
 * the store's connection pool, each part retried on its own; a failed
 * multipart upload is aborted. The object appears atomically: whole or not
 * at all. S3: every body carries Content-MD5 (the store refuses a body
 * changed on the way: BadDigest, retried) and the object gets
 * x-amz-meta-sha256 with its SHA-256 (computed here in one extra read of
 * fd when the upload is multipart; objstore_put_fd_sha takes it from the
 * caller). Errors: those at the top, and -EBADF (fd < 0), -EFBIG (the
 * store's object size limit).
 */
int objstore_put_fd(struct objstore *os, const char *key, int fd,
		    uint64_t size);

/* objstore_put_fd with the caller's SHA-256 of the content (64 lowercase
 * hex digits, or NULL: as objstore_put_fd) for x-amz-meta-sha256. A wrong
 * one is stored as given: the caller vouches for it. */
int objstore_put_fd_sha(struct objstore *os, const char *key, int fd,
			uint64_t size, const char *sha256);

/*
 * Uploads in parts: an object sent piece by piece, possibly while its
 * source is still being written, that appears under key only at commit,
 * whole, or never (an upload never committed leaves nothing under key).
 *
 *   S3        CreateMultipartUpload at begin (with x-amz-meta-sha256 when
 *             sha256 is given), UploadPart per part (Content-MD5 on each),
 *             CompleteMultipartUpload at commit, AbortMultipartUpload.
 *   file://   a temporary file ".dstage-tmp.*" in the key's directory;
 *             a part is a pwrite at its offset; commit truncates to size,
 *             fsyncs, renames over key and fsyncs the directory; abort
 *             unlinks the temporary file.
 *
 * Part n (from 1) covers bytes [(n-1) * part_size, n * part_size) of the
 * object; every part but the last is exactly part_size bytes (S3's
 * minimum is 5 MiB), the last 1 to part_size. A part may be sent again
 * (the later send replaces it). Parts of one upload may be sent from many
 * threads at once; begin, commit and abort must not race with them.
 *
 * objstore_upload_begin: size_hint (0: unknown) picks the part size
 * (s3.part_size, doubled until size_hint fits in 10,000 parts).
 * Returns 0, the errors at the top, -ENOMEM.
 */
int objstore_upload_begin(struct objstore *os, const char *key,
			  uint64_t size_hint, const char *sha256,
			  struct objstore_upload **out);

/* The part size of up, fixed at begin. */
uint64_t objstore_upload_part_size(const struct objstore_upload *up);

/* The store's name for the upload (S3 UploadId, file:// temporary file
 * name), to abort it after a crash with objstore_upload_abort_id. */
const char *objstore_upload_id(const struct objstore_upload *up);

/*
 * Send part partno: len bytes from buf (objstore_upload_part) or read from
 * fd at off with pread (objstore_upload_part_fd). Returns 0, the errors at
 * the top, -EINVAL (partno 0 or past 10,000, len 0 or over the part size),
 * -EIO (the store refused the body: BadDigest after the retries).
 */
int objstore_upload_part(struct objstore_upload *up, unsigned partno,
			 const void *buf, size_t len);
int objstore_upload_part_fd(struct objstore_upload *up, unsigned partno, int fd,
			    uint64_t off, uint64_t len);

/*
 * Publish the parts as the object of size bytes, atomically, and free up
 * (always: after a failure the upload was aborted). Returns 0, the errors
 * at the top, -EINVAL (a part missing, or of the wrong length, for size;
 * logged), -ENOSPC/-EDQUOT (file://: the store is full).
 */
int objstore_upload_commit(struct objstore_upload *up, uint64_t size);

/*
 * objstore_upload_commit, and etag (may be NULL) receives the ETag of the
 * object just published as the store forms it: S3, "\"<MD5 of the parts'
 * MD5s>-<parts>\"" (radosgw's CompleteMultipartUpload answers none); ""
 * when it is not known (parts whose ETags are not MD5s; file://). For
 * objstore_set_sha256's if-match.
 */
int objstore_upload_commit_etag(struct objstore_upload *up, uint64_t size,
				char etag[OBJSTORE_ETAG_MAX]);

/* Abort the upload (the store drops its parts) and free up. NULL ok. */
void objstore_upload_abort(struct objstore_upload *up);

/* Abort the upload of key named id (objstore_upload_id) left by a process
 * that died. file://: key may also be the temporary file's own path (as
 * objstore_upload_list gives it); only its directory is used. An upload
 * already gone is 0. Returns 0 or the errors at the top. */
int objstore_upload_abort_id(struct objstore *os, const char *key,
			     const char *id);

/* An upload in parts left open (objstore_upload_list). */
struct objstore_upload_info {
	/* S3: the key the upload would create, relative to the store's
	 * prefix. file://: the temporary file's own path (its directory is
	 * the target's; the target's name is not recorded). */
	const char *key;
	const char *id; /* for objstore_upload_abort_id(key, id) */
	int64_t initiated; /* seconds since the epoch; 0: unknown */
};

/*
 * List the uploads in parts open under prefix ("" for all): S3
 * ListMultipartUploads (every page); file:// the temporary files
 * ".dstage-tmp.*" of puts and uploads never finished, whose key (their own
 * path) starts with prefix. cb is called once per upload, with info valid
 * only during the call, and may stop the listing by returning non-zero,
 * which objstore_upload_list then returns. An upload still in progress in
 * another process is listed too: abort only what is known to be dead.
 * Returns 0, the cb's value, or the errors at the top (-EIO: an unreadable
 * answer).
 */
typedef int (*objstore_upload_list_cb)(void *arg,
				       const struct objstore_upload_info *ui);
int objstore_upload_list(struct objstore *os, const char *prefix,
			 objstore_upload_list_cb cb, void *arg);

/* Store len bytes from buf as key (single request). */
int objstore_put_buf(struct objstore *os, const char *key, const void *buf,
		     size_t len);

/*
 * Digests of a body the caller has already taken (in its own pass over the
 * bytes), so that the store does not read and hash them again. flags says
 * which fields hold a digest.
 *
 *   OBJSTORE_DIG_MD5     md5 is the body's MD5: sent as Content-MD5 (the
 *                        store refuses a body that does not match), and
 *                        the ETag the store answers is checked against it
 *                        (see -EBADMSG below).
 *   OBJSTORE_DIG_SHA256  sha256 is the body's SHA-256: the SigV4 payload
 *                        hash of a single PUT and its x-amz-meta-sha256
 *                        (not used for a part: parts are signed
 *                        UNSIGNED-PAYLOAD and guarded by Content-MD5).
 *
 * A wrong digest is the caller's bug: the store refuses the body (MD5:
 * BadDigest; SHA-256: XAmzContentSHA256Mismatch), -EIO after the retries.
 * file:// stores ignore the digests (they write what they are given).
 */
#define OBJSTORE_DIG_MD5 0x1u
#define OBJSTORE_DIG_SHA256 0x2u

struct objstore_digests {
	unsigned char md5[16];
	unsigned char sha256[32];
	unsigned flags; /* OBJSTORE_DIG_* */
};

/*
 * objstore_put_buf and objstore_upload_part with the body's digests (dig
 * NULL: as the plain calls, which hash the body themselves). Besides their
 * errors: -EBADMSG (S3, OBJSTORE_DIG_MD5 given) the store answered an ETag
 * of MD5 form (32 hex digits) other than the MD5 sent: it holds other bytes
 * than were sent (a store that ignores Content-MD5, or a proxy that alters
 * bodies); logged with the key (and part). For a single PUT the object was
 * written: the caller decides whether to delete it; a part is not recorded
 * (commit will fail until it is sent again). An ETag not of MD5 form (some
 * server-side encryption) is not compared.
 */
int objstore_put_buf_ex(struct objstore *os, const char *key, const void *buf,
			size_t len, const struct objstore_digests *dig);
int objstore_upload_part_ex(struct objstore_upload *up, unsigned partno,
			    const void *buf, size_t len,
			    const struct objstore_digests *dig);

/*
 * Store len bytes from buf as key only if key does not exist, atomically
 * against every other writer of the store: a directory store links a
 * temporary file as key (link() fails on an existing name), S3 sends
 * If-None-Match: * (radosgw and AWS answer 412 over an existing key).
 * Returns 0, -EEXIST (key exists: another writer's, or this call's own
 * when a retry followed an answer that was lost: read it back to tell),
 * -EOPNOTSUPP (a backend without it: tiered and overlay stores), or
 * objstore_put_buf's errors.
 */
int objstore_put_buf_new(struct objstore *os, const char *key, const void *buf,
			 size_t len);

/* Delete key. Deleting a missing key succeeds (as S3 does). */
int objstore_delete(struct objstore *os, const char *key);

/*
 * Server-side copy of src_key to dst_key within the store, with src_key's
 * metadata (x-amz-meta-sha256 included). S3: CopyObject; above
 * s3.copy_threshold (at most 5 GiB, CopyObject's limit) a copy in parts
 * (CreateMultipartUpload with the metadata a HEAD found, UploadPartCopy
 * of s3.copy_part_size ranges several at once, CompleteMultipartUpload;
 * aborted on any failure, dst_key unchanged). Returns 0, the errors at
 * the top, -ESTALE (S3: src_key was replaced during a copy in parts),
 * -EFBIG (S3: more than 10,000 parts of 5 GiB), -EOVERFLOW (S3: src_key
 * has more metadata than a copy in parts carries over, 13 headers of up
 * to 1 KiB), -EROFS (a read-only store).
 */
int objstore_copy(struct objstore *os, const char *src_key,
		  const char *dst_key);

/*
 * Record sha256 (64 lowercase hex digits) with key, an object already in
 * the store, as its x-amz-meta-sha256: for an object uploaded in parts
 * whose SHA-256 was not known when its upload began. Only while key still
 * holds the version whose ETag is etag (NULL or "": whatever version a HEAD
 * finds), so that a version stored by someone else meanwhile never gets a
 * hash that is not its own.
 *
 *   S3        HEAD, then CopyObject of key onto itself with
 *             x-amz-metadata-directive: REPLACE, conditional on the ETag
 *             (x-amz-copy-source-if-match, and x-amz-copy-if-match, the
 *             name radosgw reads), sending again the Content-Type,
 *             Content-Encoding, Content-Disposition, Content-Language,
 *             Cache-Control, Expires, storage class and x-amz-meta-* the
 *             HEAD found. radosgw does it without copying the data and
 *             keeps the ETag; AWS rewrites the data and the copy may have
 *             a new ETag. Above s3.copy_threshold (at most 5 GiB) a copy
 *             in parts onto itself, as objstore_copy: the new object has
 *             a new ETag ("...-N", N the parts).
 *   file://   a directory has no object metadata (callers keep the hash in
 *             their sidecar or SHA256SUMS): only checks that key holds etag.
 *
 * new_etag (may be NULL) receives the object's ETag afterwards. Returns 0,
 * the errors at the top, -ESTALE (key holds another version: unchanged),
 * -EFBIG (S3: more than 10,000 parts of 5 GiB: unchanged), -EOVERFLOW (S3:
 * more metadata than a copy carries over, 13 headers of up to 1 KiB:
 * unchanged), -EROFS (a read-only store). The object's bytes are never
 * at stake: callers treat a failure as "not recorded with the object".
 */
int objstore_set_sha256(struct objstore *os, const char *key, const char *etag,
			const char *sha256, char new_etag[OBJSTORE_ETAG_MAX]);

/*
 * The S3 storage class (x-amz-storage-class, e.g. GLACIER, STANDARD_IA) of
 * objects this handle creates from now on; NULL or "": the store's
 * default. Ignored by file:// stores. Call it before the handle is shared
 * between threads. Returns 0, -EINVAL (not upper-case letters, digits and
 * '_'), -ENOMEM.
 */
int objstore_set_storage_class(struct objstore *os, const char *cls);

void objstore_get_stats(const struct objstore *os, struct objstore_stats *st);

/* The sums over every handle of this process, open or freed since it
 * started (for the metrics endpoint). */
void objstore_get_total_stats(struct objstore_stats *st);

#endif
