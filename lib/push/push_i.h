/* SPDX-License-Identifier: MIT */
/*
 * push_i: the state shared by push.c (walk, plan, deletions, SHA256SUMS),
 * push_exec.c (the workers and the checks of what the store holds) and
 * push_journal.c (the resume journal). Calls go push.c -> push_exec.c ->
 * push_journal.c.
 */
#ifndef DSTAGE_PUSH_I_H
#define DSTAGE_PUSH_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "dstage/push.h"

struct objstore;

/* A push_file's state; only the worker that took the file changes it. */
enum push_state {
	PF_UPLOAD, /* planned: to upload */
	PF_SKIP, /* planned: in the store already; hash from the journal */
	PF_DONE, /* uploaded (and, file://, checked) this run */
	PF_CHANGED, /* changed while read or uploaded; not published */
	PF_FAILED, /* the upload or its check failed */
};

struct push_file {
	char *key; /* relative path, also the key */
	uint64_t size;
	int64_t mtime_ns;
	uint64_t ino, dev;
	unsigned char sha[32]; /* valid in PF_SKIP and PF_DONE */
	char *etag; /* expected (s3) or observed (file) ETag, or NULL */
	bool in_store; /* the listing at prepare held the key */
	enum push_state state;
};

/* One object of the destination's listing. */
struct push_obj {
	char *key;
	uint64_t size;
	char *etag;
	bool matched; /* a local file has this key */
};

/* A journal record: a file stored and checked. */
struct push_jent {
	char *key;
	unsigned char sha[32];
	uint64_t size;
	int64_t mtime_ns;
	uint64_t ino;
	char *etag;
	size_t seq; /* the record's place in the file (loading only) */
	bool tomb; /* a tombstone (loading only) */
};

/*
 * The journal: records read at open (sorted by key, the last record of a
 * key wins, tombstones applied), then appended to by the workers.
 * lock protects fd and the appends; ents is read-only after open.
 */
struct push_journal {
	char path[4096];
	int fd; /* O_APPEND, -1 when closed */
	pthread_mutex_t lock; /* a leaf */
	struct push_jent *ents;
	size_t n;
};

struct push {
	const struct dstage_config *cfg;
	const struct push_opts *o;
	struct objstore *os;
	bool s3; /* the destination is s3:// (ETags are MD5s) */
	int rootfd; /* the local directory, O_PATH-free O_RDONLY */
	struct push_file *files; /* sorted by key; read-only layout */
	size_t n_files, cap_files;
	struct push_obj *objs; /* the listing, sorted by key */
	size_t n_objs, cap_objs;
	char **protect; /* local names that are not files: never deleted */
	size_t n_protect, cap_protect;
	size_t *order; /* indices of PF_UPLOAD files, largest first */
	size_t n_order;
	struct push_plan plan;
	struct push_journal j;
	/* workers */
	_Atomic size_t next; /* next index into order */
	_Atomic bool stop;
	_Atomic uint64_t files_done, bytes_done, sent, changed, failed;
	uint64_t aborted; /* leftover uploads aborted (before the workers) */
	_Atomic int err; /* the first local error (journal) */
	pthread_mutex_t ev_lock; /* serializes o->event; a leaf */
	/* helper threads (each with a part buffer) push_part.c may still
	 * start, shared by all large files: s3.max_inflight at the start */
	_Atomic unsigned part_helpers;
	pthread_mutex_t bw_lock; /* protects bw_next; a leaf */
	double bw_next; /* monotonic seconds the next upload may start */
};

/* push_exec.c */
void push_emit(struct push *p, enum push_event ev, const char *key,
	       uint64_t size, const char *msg);
/* Run the workers over p->order; then, for s3://, check every uploaded
 * object's size and ETag in one listing. Returns 0 or a local -errno. */
int push_exec_run(struct push *p);

/* Abort the uploads in parts that earlier runs left open (push.h,
 * "Resume"). Returns 0; failures to abort are logged, not fatal. */
int push_exec_abort_leftovers(struct push *p);

/* push_part.c: s3://, upload f (open as fd, fstat'd as st1) in parts,
 * each byte read once into the SHA-256 (into f->sha), the parts' MD5s and
 * the send. etag gets the ETag expected of the object. Returns 0, -EAGAIN
 * (the file changed while read: aborted, nothing published), -EBADMSG (a
 * part's ETag is not its MD5: aborted), or -errno with *what naming the
 * step (read, upload, commit, buffer). */
int push_part_upload(struct push *p, struct push_file *f, int fd,
		     const struct stat *st1, char *etag, size_t etag_cap,
		     const char **what);
/* Whether the file moved between two fstats (size, inode, mtime, ctime). */
bool push_moved(const struct stat *a, const struct stat *b);

/* push_journal.c */
int push_journal_open(struct push_journal *j, const struct dstage_config *cfg,
		      const char *dir, const char *url, const char *localdir);
const struct push_jent *push_journal_find(const struct push_journal *j,
					  const char *key);
/* Append a record (or, with f->state not PF_DONE, a tombstone). */
int push_journal_put(struct push_journal *j, const struct push_file *f);
/* Rewrite the journal holding exactly the done and skipped files. */
int push_journal_compact(struct push_journal *j, const struct push_file *files,
			 size_t n);
void push_journal_release(struct push_journal *j);

#endif
