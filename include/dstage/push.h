/* SPDX-License-Identifier: MIT */
/*
 * push: upload a local directory into an object store, hashing every file
 * (SHA-256) as it is read, check what the store holds afterwards, write
 * SHA256SUMS last, and resume an interrupted push without uploading again
 * what is already there (docs/stager.md, "push").
 *
 * A push is prepared (the local tree walked, the destination listed once,
 * the resume journal read, the plan made), then either described (dry run)
 * or executed by a pool of workers. The caller decides in between, from
 * push_plan(), whether the plan may go ahead (the stager refuses to
 * overwrite a registered dataset's objects without --new-version).
 *
 *   push_prepare -> [push_dry_run] -> [push_execute] -> push_free
 *
 * Keys are the paths relative to the directory, '/'-separated; each must
 * pass keypath_check (1 to 1,024 bytes, segments of at most 255, no control
 * byte); a file whose name does not is reported (PUSH_EV_BADNAME) and not
 * uploaded, and the push fails. Only regular files are pushed: symbolic
 * links, FIFOs, sockets and devices are reported (PUSH_EV_IGNORED) and left
 * out; directories are never followed through a link.
 *
 * Integrity: every file is read once, in order, into SHA-256 and MD5.
 * Files below s3.multipart_threshold are read into memory and sent from
 * that buffer, so the bytes sent are the bytes hashed; a file whose size,
 * mtime or ctime moved during the read, or whose recent mtime makes the
 * stat check unreliable and whose second hash differs, is reported
 * (PUSH_EV_CHANGED) and not sent. Larger files go up with objstore_put_fd
 * (parallel multipart parts) while the hash is taken; afterwards the
 * object's size and ETag (s3://: the MD5 or multipart MD5 of the bytes
 * hashed) or, for file://, its size and a re-read SHA-256 must match, and
 * the file's stat must not have moved, else the object is deleted again and
 * the file reported as changed. SHA256SUMS lists the hashes taken while
 * reading, and is written only when every file was pushed.
 *
 * Resume: a journal (one line per file stored and checked: hash, size,
 * mtime, inode, ETag, key) lives under <cache.dir>/push/ (when cache.dir
 * exists and belongs to this uid; else ~/.cache/dstage/push/), one file per
 * (URL, directory), mode 0600 in a 0700 directory. A file is skipped when
 * the store's listing shows its key with the size and ETag the journal
 * recorded and the local file has the journal's size, mtime and inode:
 * no object is read back. Uploads in parts left open by a run that died
 * (kill -9, a lost node) are aborted when the push executes: those on a
 * key of this push (file://: a temporary file in a directory of this
 * push's keys), and any under the destination older than
 * PUSH_STALE_UPLOAD_S (PUSH_EV_ABORTED for each).
 *
 * Threads: push_execute runs `parallel` workers and returns when they are
 * done. push_stop (async-signal-safe) makes workers take no new file.
 * push_progress may be called from any thread at any time. Events are
 * delivered one at a time (under the push's event lock), from any worker.
 */
#ifndef DSTAGE_PUSH_H
#define DSTAGE_PUSH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dstage_config;
struct push;

#define PUSH_FILES_MAX 10000000u /* files in one push */
#define PUSH_EXCLUDES_MAX 256 /* --exclude patterns */
#define PUSH_SUMS_KEY "SHA256SUMS"
/* An upload under the destination open longer than this is abandoned. */
#define PUSH_STALE_UPLOAD_S (24 * 3600)

enum push_event {
	PUSH_EV_UPLOADED, /* stored and checked */
	PUSH_EV_SKIPPED, /* already in the store (journal and listing) */
	PUSH_EV_CHANGED, /* changed while read or uploaded: not published */
	PUSH_EV_FAILED, /* the upload or its check failed; msg says why */
	PUSH_EV_BADNAME, /* a name that cannot be a key; msg says why */
	PUSH_EV_IGNORED, /* not a regular file (link, FIFO, ...) */
	PUSH_EV_DELETED, /* --delete: removed from the store */
	PUSH_EV_PLAN_UPLOAD, /* dry run: would be uploaded */
	PUSH_EV_PLAN_DELETE, /* dry run: would be deleted */
	PUSH_EV_SUMS, /* SHA256SUMS written (size: its length) */
	PUSH_EV_ABORTED, /* an upload left open was aborted; msg says why */
};

/* Called for each event; key is the key (or the local relative path of a
 * bad name), size the file's size, msg a reason or NULL. */
typedef void (*push_event_fn)(void *arg, enum push_event ev, const char *key,
			      uint64_t size, const char *msg);

/* An extra rule for keys (the stager: S3 keys must be UTF-8). Returns true
 * when len bytes of key may be a key; else sets *why. */
typedef bool (*push_key_fn)(void *arg, const char *key, size_t len,
			    const char **why);

struct push_opts {
	const char *dir; /* the local directory */
	const char *url; /* s3://bucket/prefix/ or file:///dir/ */
	unsigned parallel; /* files in flight; 0: s3.max_inflight */
	uint64_t bandwidth; /* bytes/s over all files; 0: no cap */
	/* fnmatch patterns: one without '/' is matched against every name
	 * (a directory's too: its subtree is left out), one with '/' against
	 * the whole relative path. Excluded keys are never deleted. */
	const char *const *excludes;
	size_t n_excludes;
	bool delete_extra; /* --delete: remove keys absent locally */
	const char *journal_dir; /* NULL: the default (above) */
	push_key_fn key_ok; /* may be NULL */
	void *key_ok_arg;
	push_event_fn event; /* may be NULL */
	void *event_arg;
};

/* What push_prepare found. */
struct push_plan {
	uint64_t files, bytes; /* local regular files pushed, their bytes */
	uint64_t upload, upload_bytes; /* to upload */
	uint64_t overwrite; /* of those, keys the store already holds */
	uint64_t skip, skip_bytes; /* in the store already (resume) */
	uint64_t remove; /* --delete: keys to delete */
	uint64_t bad; /* bad names (reported; the push will fail) */
	uint64_t ignored; /* not regular files */
	bool sums_exist; /* the store holds SHA256SUMS already */
	bool sums_current; /* ...with exactly the bytes this push writes
			      (known only when nothing is to upload) */
};

/* Live counters (each read atomically). */
struct push_progress {
	uint64_t files_done, files_total; /* uploaded or skipped */
	uint64_t bytes_done, bytes_total; /* bytes of files_done */
	uint64_t sent; /* bytes sent to the store */
	uint64_t changed, failed; /* files */
};

/*
 * Walk o->dir, open the store, list its prefix, read the journal and make
 * the plan. The opts and their strings must outlive the push.
 * Returns 0; -EINVAL (a bad URL or option, logged); -ENOENT (dir missing);
 * -ENOTDIR; -EACCES; -E2BIG (more than PUSH_FILES_MAX files); -ENOMEM; or
 * the store's -errno (objstore.h) from opening or listing it.
 */
int push_prepare(const struct dstage_config *cfg, const struct push_opts *o,
		 struct push **out);

/* The plan (valid after push_prepare). */
void push_plan(const struct push *p, struct push_plan *plan);

/* Report every planned upload and deletion as PUSH_EV_PLAN_* events, in
 * key order. Changes nothing. */
void push_dry_run(struct push *p);

/*
 * Upload, check, delete (--delete), then write SHA256SUMS; record every
 * checked file in the journal as it lands. Returns 0 when every file is in
 * the store and SHA256SUMS is written; -EAGAIN when some file changed
 * during the push or had a bad name (reported; run again); -ECANCELED
 * after push_stop; -EIO when an upload or check failed (reported); or
 * another -errno (the journal could not be written: -EACCES, -ENOSPC...).
 */
int push_execute(struct push *p);

/* Take no new file; files in flight finish. Async-signal-safe. */
void push_stop(struct push *p);

void push_progress(const struct push *p, struct push_progress *pr);

/* The journal's path (for messages), "" before push_prepare found one. */
const char *push_journal_path(const struct push *p);

/* Accepts NULL. */
void push_free(struct push *p);

#endif
