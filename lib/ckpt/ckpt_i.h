/* SPDX-License-Identifier: MIT */
/*
 * ckpt_i: what the files of the ckpt module share. Not a public header.
 * The files, top to bottom (each calls only files below it):
 *   ckpt_rename.c   unlink and rename
 *   ckpt.c          open/free, listings, directories, truncate, statfs
 *   ckpt_recover.c  restart and retry: the journal's P and W records
 *   ckpt_file.c     open files, writes, the publish
 *   ckpt_upload.c   sending complete ranges while the file is written
 *   ckpt_stat.c     what a key is (local copy, store object, directory)
 *   ckpt_journal.c  the on-disk records, staging space, eviction
 *   ckpt_base.c     keys, errors, the clock
 *
 * Staging directory (checkpoints.staging_dir, 0700):
 *   tree/<key>        local copies, the checkpoint namespace mirrored
 *                     (0700 directories, 0600 files)
 *   journal/<ino>     one record per local file, named by its inode number
 *                     (stable across renames), two lines:
 *                       "<state> <sha256|-> <size> <etag|->\n<key>\n"
 *                     state W: being written (never published as is: a
 *                     writer that dies leaves W), P: closed or synced,
 *                     content final, to be published (a restart or a retry
 *                     publishes it), C: published, the store's ETag noted
 *                     (the local copy is a clean cache of it).
 *                     Optional third and fourth lines "u <upload id>\n
 *                     <key>\n": an upload in parts (ckpt_upload.c) that may
 *                     be open in the store; a restart aborts it.
 *
 * Locks, in order: ck->open_lock (opens: one at a time), an entry's lock
 * (its writes and publishes), ck->ns_lock (read: a publish; write: a
 * directory rename), ck->lock (the entry list, the counters below);
 * ck->upq_lock and ck->neg_lock are leaves.
 *
 * The caller's hooks (ck->hooks) run with the locks of the change they
 * report held, so that they see the changes of one key in the store's
 * order: published with the
 * entry's lock, ns_lock (read) and the local copy's publish OFD lock
 * (ckpt_lock_publish; ckpt_put), removed with open_lock and the entry's
 * lock if it is open (ckpt_unlink), a file's renamed and published with
 * the same (ckpt_rename_file); a directory's renamed with none. ck->lock
 * is never held. That is safe because a hook takes only leaf locks of its
 * own and calls into ck only for ckpt_url and ckpt_objstore, which take
 * none. dstagefs's: published, renamed and removed take catalog_ckpt_log's
 * lock and write on its SQLite connection under it (at most the busy
 * timeout). Under the same locks as published, before the bytes go up, a
 * publish stores the owner records still kept on this node
 * (ckpt_owner_publishing: each record's flock in owners/, a leaf, held
 * across the store's PUT of that record), so a publish may wait on the
 * store for them as it does for its own bytes.
 */
#ifndef DSTAGE_CKPT_I_H
#define DSTAGE_CKPT_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckpt_stage.h"
#include "dstage/ckpt.h"
#include "dstage/objstore.h"
#include "dstage/sha256.h"
#include "dstage/timeutil.h"

#define CKPT_SIDECAR ".dstage-sha256/"
#define CKPT_NEG_MAX 256 /* names remembered missing */
/* The longest key a store takes, its prefix included (S3: 1,024 bytes). */
#define CKPT_STORE_KEY_MAX 1024
/* The exit status of DSTAGE_TEST_CRASH_AT (ckpt_test_crash). */
#define CKPT_TEST_CRASH_STATUS 86
/* DSTAGE_TEST_CRASH_AT=mid-write: the size a write takes a local copy to
 * (from below it). More than one FUSE write (-o max_write, 1008 KiB at
 * most): the file has received earlier writes when it fires. */
#define CKPT_TEST_MID_WRITE (1u << 20)

/* One part of an overlapped upload (ckpt_upload.c); under the entry's lock. */
struct ckpt_part {
	uint32_t gen; /* bumped by every write or truncate touching it */
	uint32_t sent_gen; /* gen when its last successful send started */
	bool sent; /* the store has a send of it */
	bool busy; /* queued or being sent */
};

enum ckpt_up_state {
	CKPT_UP_IDLE,
	CKPT_UP_STARTING,
	CKPT_UP_OPEN,
	CKPT_UP_FAILED
};

/*
 * The overlapped upload of an entry (ckpt_upload.c), all under the entry's
 * lock: IDLE -> STARTING (begin queued) -> OPEN (parts queued as the writer
 * passes them) or FAILED (the close uploads the whole file) -> IDLE again
 * at the publish (committed) or the last close (aborted).
 */
struct ckpt_upstate {
	enum ckpt_up_state state;
	struct objstore_upload *up; /* OPEN */
	char *key; /* the key the upload was begun for */
	uint64_t ps; /* part size */
	uint64_t hi; /* highest end written since IDLE */
	unsigned next; /* parts [0, next) were queued at least once */
	struct ckpt_part *parts;
	size_t cap;
	unsigned busy; /* jobs queued or running for this entry */
	unsigned parts_out; /* of which parts (the writer's pace) */
	bool cancel; /* drop queued jobs */
	pthread_cond_t cond; /* with the entry's lock: busy fell */
};

/*
 * One file open through at least one handle, shared by all its handles.
 * State: clean (dirty false: the store has what the local copy holds, or
 * the file is only read from the store) -> dirty on a write, truncate or
 * create -> clean again once a publish succeeded. unlinked: removed or
 * replaced while open, never published again.
 */
struct ckpt_ent {
	struct ckpt_ent *next; /* ck->lock */
	char *key; /* ck->lock: a rename changes it */
	unsigned refs; /* ck->lock: handles */
	unsigned writers; /* ck->lock: of which open for writing and not yet
			   * through ckpt_file_writer_done */
	bool owed; /* ck->lock: a writer's close deferred its publish to the
		    * last writable handle's release (ckpt_file_writer_done);
		    * cleared by that release or by a publish */
	bool publishing; /* ck->lock: a publish of this entry runs */
	bool unlinked; /* ck->lock */
	bool space_at_close; /* ck->lock: unlinked while open; the last close
			      * gives the staging space back */
	pthread_mutex_t lock; /* see the order above */
	int fd; /* set at open: the local copy, -1 when read from the store */
	ino_t ino; /* the local copy's inode (its journal record's name) */
	uid_t uid; /* set at open: the local copy's owner, whose staging
		    * bounds its bytes count against */
	bool dirty; /* lock: changed since the last successful publish */
	uint64_t gen; /* lock: bumped by every change of the local copy
		       * (ckpt_file_gen, ckpt_file_pread_gen) */
	/* ck->lock (ckpt_quota.c): charged to uid's wip_bytes since the
	 * first write or truncate after a publish (store_on): its size then
	 * store_size, less store_base, the published size of the version it
	 * replaces (uid's own, else 0). */
	bool store_on;
	uint64_t store_size, store_base;
	bool journal_w; /* lock: the record says W */
	/* lock: SHA-256 of [0, hashed) fed as it was written in order, so a
	 * publish hashes only the rest; NULL once a write or truncate went
	 * below hash_end (then the publish hashes the whole file). [0,
	 * hash_end) was written in order; an uploader thread hashes [hashed,
	 * hash_end) from the local copy behind the writer (ckpt_upload.c):
	 * while hash_running, that job owns hctx and hashed, and a write or
	 * truncate below hash_end first waits for it (u.cond). */
	struct sha256 hctx;
	uint64_t hashed;
	uint64_t hash_end;
	bool hash_running; /* a hash job is queued or running */
	struct ckpt_upstate u; /* lock */
	/* Read from the store (fd -1): what was opened. */
	char etag[OBJSTORE_ETAG_MAX];
	uint64_t rsize;
	int64_t rmtime;
};

struct ckpt_file {
	struct ckpt *ck;
	struct ckpt_ent *e;
	bool write; /* opened for writing */
	bool writer_done; /* ckpt_file_writer_done ran: not in e->writers */
};

/* One uid's staging (checkpoints.uid_staging_size, uid_files), in
 * ck->uids under ck->lock. */
struct ckpt_uid_use {
	uid_t uid;
	uint64_t bytes; /* sizes of its local copies in tree/ */
	unsigned files; /* its local copies in tree/ */
	uint64_t ab_bytes; /* in abandoned/ (recounted each retry tick) */
	unsigned ab_files;
	/* checkpoints.uid_store_size (ckpt_quota.c): the sizes of the files
	 * it published through this node, and what the files it writes now
	 * add to them (their sizes less those of the versions they replace;
	 * may be negative). */
	uint64_t pub_bytes;
	int64_t wip_bytes;
};

/* A file this node published and has not seen removed since (ckpt_quota.c),
 * in ck->pubs under ck->lock. */
struct ckpt_pub {
	char *key;
	uid_t uid; /* its owner */
	uint64_t size;
};

#define CKPT_UIDS_MAX 65536 /* distinct uids tracked */

struct ckpt {
	const struct dstage_config *cfg;
	struct objstore *os;
	struct ckpt_hooks hooks; /* immutable after open */
	struct ckpt_dirs dirs; /* the store's staging directory */
	uint64_t limit; /* checkpoints.staging_size */
	/* The longest key a new name may make: the store's limit less its
	 * prefix and CKPT_AUX_KEY_EXTRA (the owner record's key, the longest
	 * of the keys every file has). Immutable after open. */
	size_t key_max;
	pthread_mutex_t open_lock;
	pthread_rwlock_t ns_lock;
	pthread_mutex_t lock;
	struct ckpt_ent *ents; /* lock */
	uint64_t used; /* lock: bytes of local copies */
	uint64_t ab_used; /* lock: bytes in abandoned/ (they count too) */
	/* checkpoints.uid_staging_size (0: only the share,
	 * ckpt_uid_share_locked);
	 * immutable */
	uint64_t uid_limit;
	unsigned uid_files; /* checkpoints.uid_files (0: none); immutable */
	struct ckpt_uid_use *uids; /* lock: n_uids of cap_uids */
	size_t n_uids, cap_uids;
	int64_t uid_logged_ms; /* lock: the last EDQUOT line (rate limit) */
	uint64_t uid_store; /* checkpoints.uid_store_size; immutable */
	struct ckpt_pub *pubs; /* lock: n_pubs of cap_pubs */
	size_t n_pubs, cap_pubs;
	unsigned pending; /* lock: P records found by the last scan */
	int64_t last_retry_ms; /* lock */
	pthread_cond_t cond; /* with lock: wakes the retry thread */
	pthread_t retry_thread;
	bool retry_running;
	bool stop; /* lock */
	/* Uploader threads (ckpt_upload.c): upq_lock is a leaf lock; it
	 * protects the queue and up_stop. */
	pthread_mutex_t upq_lock;
	pthread_cond_t upq_cond;
	struct ckpt_upjob *upq_head, *upq_tail;
	bool up_stop;
	unsigned n_uploaders;
	pthread_t uploaders[8];
	/* Negative lookups (ckpt_stat.c); neg_lock is a leaf lock. */
	pthread_mutex_t neg_lock;
	struct ckpt_neg {
		char *key; /* NULL: free */
		int64_t until_ms; /* missing until then (monotonic ms) */
	} neg[CKPT_NEG_MAX];
	unsigned neg_next; /* neg_lock: the slot replaced next */
	uint64_t neg_gen; /* neg_lock: bumped when this node adds a name */
};

/* ckpt_base.c */
/* A valid segment of a key (not empty, ".", "..", over NAME_MAX or
 * starting with ".dstage"): 0 or -EINVAL. */
int ckpt_seg_ok(const char *s, size_t len);
/* For a name this node makes (create, mkdir, rename's target): key is
 * valid (else -EINVAL) and the store can take it and its sidecar (else
 * -ENAMETOOLONG). */
int ckpt_key_new_ok(const struct ckpt *ck, const char *key);
/* key_max for the store at url (0: its prefix leaves no room). */
size_t ckpt_key_max_of(const char *url);
/* "a/b" + "c" -> "a/b/c" (malloc'd) or NULL. */
char *ckpt_key_join(const char *dir, const char *name);
/* The tree path of key for the *at calls ("." for the top). */
const char *ckpt_tpath(const char *key);
/* mkdir -p of key's parent in the tree. */
int ckpt_tree_mkparents(struct ckpt *ck, const char *key);
/* "stores/<hash of url>", the store's subdirectory of staging_dir (the
 * URL without trailing '/'), into out. 0 or -errno. */
int ckpt_store_subdir(const char *url, char *out, size_t size);
/* Store errors as the contract gives them: ENOSPC/EDQUOT stay, the rest is
 * EIO (ENOMEM stays). */
int ckpt_store_errno(int ret);

/* ckpt_stat.c */
/* This node adds a name (create, mkdir, rename): forget every name
 * remembered missing. */
void ckpt_neg_clear(struct ckpt *ck);
/* 0 when key's parent is a directory, else -ENOENT / -ENOTDIR. */
int ckpt_parent_dir(struct ckpt *ck, const char *key);
/* Whether the store has keys under "key/": 1, 0 or -errno. */
int ckpt_store_has_dir(struct ckpt *ck, const char *key);

/* ckpt_file.c */
/* A new entry (refs 1, not listed) for key's local copy fd (or -1). */
struct ckpt_ent *ckpt_ent_new(const char *key, int fd);
/* Publish e if dirty (want_sha: see ckpt_put). */
int ckpt_ent_publish(struct ckpt *ck, struct ckpt_ent *e, const char *want_sha);
/* Drop one reference (takes ck->lock), one open for writing when write;
 * the last frees the entry. */
void ckpt_ent_put(struct ckpt *ck, struct ckpt_ent *e, bool write);
/*
 * Publish the local file fd (inode ino) as key: SHA-256 (hctx, when not
 * NULL, already holds that of [0, hashed)), a P record, the object, its
 * sidecar, then a C record. want_sha (may be NULL or "") must match the
 * content. Returns 0 or -errno (logged once, the record
 * stays P, fd and record are fsynced).
 */
int ckpt_put(struct ckpt *ck, struct ckpt_ent *e, int fd, ino_t ino,
	     const char *key, const char *want_sha, const struct sha256 *hctx,
	     uint64_t hashed);

/* ckpt_upload.c (the entry's lock held where it says e) */
/* Start the uploader threads (upq_lock and upq_cond initialised by
 * ckpt_open); stop joins them and drops the jobs left. */
int ckpt_upload_start(struct ckpt *ck);
void ckpt_upload_stop(struct ckpt *ck);
/* e: after a write of [off, off + len): marks rewritten parts, queues the
 * parts the writer has passed (past s3.multipart_threshold). */
void ckpt_upload_wrote(struct ckpt *ck, struct ckpt_ent *e, uint64_t off,
		       uint64_t len);
/* e (its lock held, released while waiting): wait while more than
 * CKPT_PACE_PARTS of e's parts are queued or in flight (a writer ahead of
 * the store is held to its speed; ckpt_upload.c). */
void ckpt_upload_pace(struct ckpt_ent *e);
/* e: after a truncate from old to size bytes. */
void ckpt_upload_truncated(struct ckpt_ent *e, uint64_t old, uint64_t size);
/* e: hash [hashed, hash_end) behind the writer: queues a job when a
 * whole chunk (4 MiB) waits and no job is queued (ck->n_uploaders > 0). */
void ckpt_upload_hash(struct ckpt *ck, struct ckpt_ent *e);
/* e: wait until e's hash job (if any) is over. */
void ckpt_upload_hash_wait(struct ckpt_ent *e);
/* e: wait until no job of e is queued or running. */
void ckpt_upload_quiesce(struct ckpt_ent *e);
/* e, quiesced: the open upload's id and key into rec (or ""). */
void ckpt_upload_note(struct ckpt_ent *e, struct ckpt_rec *rec);
/* e, quiesced: send what is missing or changed of the size bytes of
 * e->fd, then commit as key. 1: no usable upload (the caller uploads the
 * whole file), 0, or -errno. The upload is over either way. */
int ckpt_upload_finish(struct ckpt *ck, struct ckpt_ent *e, const char *key,
		       uint64_t size, const char *sha);
/* e: drop queued jobs, wait for running ones, abort an open upload. */
void ckpt_upload_drain(struct ckpt *ck, struct ckpt_ent *e);

/* ckpt_owner.c */

/* Store the records kept on this node for key and the directories above
 * it, shallowest first, before key's bytes go up (a publish or a retry):
 * ckpt_owner_store_kept. 0, -EEXIST (a directory above key is another
 * uid's in the store, logged: refused, and so is every retry) or the
 * store's -errno (logged): the publish fails and is retried. */
int ckpt_owner_publishing(struct ckpt *ck, const char *key);

/* ckpt_journal.c */
/* The open entry for key, with refs raised, or NULL (ck->lock held). */
struct ckpt_ent *ckpt_ent_find_locked(struct ckpt *ck, const char *key);
/* Account growth bytes of uid's local copies (negative: freed); when over
 * the limit, evicts clean copies, then removes abandoned files (oldest
 * first). Returns 0, -EDQUOT (uid's share, ckpt_uid_share_locked, logged)
 * or -ENOSPC. uid 0 has no per-uid bound. */
int ckpt_space(struct ckpt *ck, uid_t uid, int64_t growth);
/* One local copy more (delta 1: -EDQUOT past uid_files, logged) or less
 * (-1) for uid. 0 or -EDQUOT. */
int ckpt_files(struct ckpt *ck, uid_t uid, int delta);
/* The same with ck->lock held. */
int ckpt_files_locked(struct ckpt *ck, uid_t uid, int delta);
/* uid's usage (ck->lock held), added when new; NULL past CKPT_UIDS_MAX
 * uids or out of memory (then uid has no per-uid bound). */
struct ckpt_uid_use *ckpt_uid_locked(struct ckpt *ck, uid_t uid);
/* The EDQUOT line (ck->lock held): uid, option and value, at most one each
 * 10 s; the staging bounds' (abandoned files included, staging_dir) or
 * what and where of another. */
void ckpt_uid_log_locked(struct ckpt *ck, uid_t uid, const char *opt,
			 uint64_t value, const char *unit);
void ckpt_uid_log_what_locked(struct ckpt *ck, uid_t uid, const char *opt,
			      uint64_t value, const char *unit,
			      const char *what, const char *where);
/* ckpt_quota.c: checkpoints.uid_store_size. */
/* e (e->lock held), now of size old, is to be size bytes: -EDQUOT (logged)
 * when that takes its uid's published and in-progress bytes past
 * uid_store_size (check; a shrink never fails), else 0 and e charged at
 * size. */
int ckpt_store_charge(struct ckpt *ck, struct ckpt_ent *e, uint64_t old,
		      uint64_t size, bool check);
/* e's charge dropped (its last close, or it was published). */
void ckpt_store_uncharge_locked(struct ckpt *ck, struct ckpt_ent *e);
/* key was published with size bytes, uid's (e: its open entry or NULL). */
void ckpt_store_published(struct ckpt *ck, struct ckpt_ent *e, const char *key,
			  uid_t uid, uint64_t size);
/* key (a file, or a directory and all below it) left the store. */
void ckpt_store_forget(struct ckpt *ck, const char *key);
/* key (a file or a directory) became to; what to had is replaced. */
void ckpt_store_renamed(struct ckpt *ck, const char *from, const char *to);
/* Fill ck->pubs from the hooks' census (ckpt_open, before the recovery). */
void ckpt_store_census(struct ckpt *ck);
/* Free ck->pubs (ckpt_free). */
void ckpt_store_free(struct ckpt *ck);
/* ckpt_journal.c: checkpoints.staging_size shared between uids
 * (docs/checkpoints.md, "Staging bounds per uid"). */
/* The most staging bytes u may hold: staging_size / (N + 1), N the
 * unprivileged uids holding bytes there (local copies or abandoned files),
 * u counted whether it holds any or not (*holders: N); at most
 * checkpoints.uid_staging_size when that is set. ck->lock held. */
uint64_t ckpt_uid_share_locked(struct ckpt *ck, const struct ckpt_uid_use *u,
			       unsigned *holders);
/* The EDQUOT line of uid at its share (ckpt_uid_log_what_locked). */
void ckpt_uid_share_log_locked(struct ckpt *ck, uid_t uid, uint64_t share,
			       unsigned holders);
/* Remove files of abandoned/, oldest first, until need bytes are freed or
 * none is left; each logged (its name, its uid, the uid whose write (uid)
 * needed the room), and uncounted. ck->lock held. */
void ckpt_abandoned_reclaim_locked(struct ckpt *ck, uid_t uid, uint64_t need);

/* Recount abandoned/ per uid into ck->uids and ck->ab_used (files there
 * count until removed, by the stager's gc or an operator). */
void ckpt_abandoned_count(struct ckpt *ck);
/* Recount the local copies the journal names per uid into ck->uids and
 * ck->used (at open, after the recovery scan). */
void ckpt_live_count(struct ckpt *ck);
/* Whether key has a listed entry (ck->lock held). */
bool ckpt_is_open_locked(struct ckpt *ck, const char *key);
/* Move key's local copy (inode ino, never closed by its writer) to
 * abandoned/ and drop its record; why goes in the log line. */
void ckpt_journal_abandon(struct ckpt *ck, ino_t ino, const char *key,
			  const char *why);
/* Set the key in the records of every file under the local directory key
 * (after a directory rename). */
void ckpt_journal_rekey(struct ckpt *ck, const char *key);
/* ckpt_recover.c */
/* Scan the journal: sum the local bytes into ck->used, drop records
 * without a file, count P records into ck->pending; recovery: log each W
 * record (never published). publish: publish the P records of files not
 * open. */
int ckpt_journal_scan(struct ckpt *ck, bool recovery, bool publish);
/* The retry thread (started by ckpt_open, stopped by ckpt_free). */
int ckpt_retry_start(struct ckpt *ck);
void ckpt_retry_stop(struct ckpt *ck);
/* Drop clean local copies (C, not open), oldest first, until need bytes
 * are free under the limit. Called with ck->lock held. */
void ckpt_journal_evict_locked(struct ckpt *ck, uint64_t need);

#endif
