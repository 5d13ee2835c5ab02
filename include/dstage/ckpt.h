/* SPDX-License-Identifier: MIT */
/*
 * ckpt: the checkpoint store of one node, written through to shared storage
 * (checkpoints.store: a file:// directory or an s3:// prefix) with local
 * copies in a staging directory (checkpoints.staging_dir, on the cache disk).
 *
 * Keys are paths relative to the store ("job/step-100/model.pt"; "" is the
 * top). A file being written lives in staging_dir/tree/<key>; publishing it
 * (ckpt_file_sync, ckpt_file_flush) computes its SHA-256, writes it to the
 * store under its final key in one atomic step (objstore_put_fd: temporary
 * file + fsync + rename, or one PUT / CompleteMultipartUpload), records the
 * SHA-256 next to it (the sidecar object ".dstage-sha256/<key>") and in the
 * local journal, and only then returns 0. Names starting with ".dstage" at
 * the top are the store's own and refused.
 *
 * The durability contract and the failure behaviour are in
 * docs/checkpoints.md. Used by dstagefs (fs/ckpt/dsfs_ckpt.c); every call is
 * thread-safe and may block on the store.
 *
 * Errors are -errno:
 *   -ENOENT     no such file or directory (neither local nor in the store)
 *   -EEXIST     O_EXCL on an existing file, mkdir of an existing directory
 *   -ENOTEMPTY  rmdir of a directory with files (locally or in the store)
 *   -EISDIR / -ENOTDIR   a file where a directory is needed, or the reverse
 *   -EINVAL     a bad key (empty segment, ".", "..", ".dstage*" at the top,
 *               a control byte 0x00-0x1f or 0x7f)
 *   -ENAMETOOLONG  a new name whose longest store key (the prefix and the
 *               owner record's ".dstage-owner/KEY/.dstage-own" included,
 *               CKPT_AUX_KEY_EXTRA) would pass 1,024 bytes
 *   -EIO        the store failed (logged with file and cause; retried later)
 *   -ENOSPC / -EDQUOT    the store or the staging directory is full
 *   -EBUSY      a directory rename while a file under it is being published
 *   -ENOMEM     out of memory
 */
#ifndef DSTAGE_CKPT_H
#define DSTAGE_CKPT_H

/* The keys the checkpoint tree keeps beside a file's KEY in the store: its
 * SHA-256 sidecar ".dstage-sha256/KEY" (lib/ckpt) and its owner record
 * ".dstage-owner/KEY/.dstage-own" (lib/ckpt/ckpt_owner.c). The longer of the
 * two decides how long a new name may be (CKPT_AUX_KEY_EXTRA bytes more
 * than KEY). */
#define CKPT_OWNER_PREFIX ".dstage-owner/"
#define CKPT_OWNER_LEAF "/.dstage-own"
#define CKPT_AUX_KEY_EXTRA \
	(sizeof(CKPT_OWNER_PREFIX) - 1 + sizeof(CKPT_OWNER_LEAF) - 1)

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/statvfs.h>
#include <sys/types.h>

struct dstage_config;
struct ckpt;
struct ckpt_file;
struct objstore;

struct ckpt_attr {
	bool dir;
	uint64_t size;
	int64_t mtime; /* seconds since the epoch */
	bool local; /* served from this node's local copy */
};

/*
 * Open the checkpoint store of cfg (checkpoints.store must be set): open the
 * store, make or check staging_dir (0700, owned by this user, writable by
 * nobody else: -EACCES otherwise, logged with the fix), and recover what a
 * previous run left: closed files not yet published are published now (or
 * logged with the reason and kept for the next retry); files whose writer
 * never closed them are logged and kept locally, never published.
 * Returns 0, -EINVAL (no or bad store URL), -EACCES, -ENOMEM, or the
 * store's or the file system's -errno.
 */
int ckpt_open(const struct dstage_config *cfg, struct ckpt **out);

/*
 * What the caller records of the store's contents as this node changes
 * them (lib/catalog/catalog_ckpt.c's table, through dstagefs). Each may be NULL.
 * Called from any thread once the store has the change, possibly with
 * ckpt's own locks held (lib/ckpt/ckpt_i.h says which): a hook may call
 * into ckpt only for ckpt_url and ckpt_objstore (they take no lock), and
 * any lock it takes must be a leaf. store is the store's URL (ckpt_url).
 *   published: key's whole content is in the store, its SHA-256 (hex) and
 *              size as written, the ETag the store gave it ("" unknown),
 *              its owner (the local copy's);
 *   renamed:   a file or a directory (and all below it) moved from -> to;
 *   removed:   a file unlinked.
 */
typedef void (*ckpt_census_cb)(void *ctx, const char *key, uid_t uid,
			       uint64_t size);
struct ckpt_hooks {
	void (*published)(void *arg, const char *store, const char *key,
			  const char *sha256, uint64_t size, const char *etag,
			  uid_t uid);
	void (*renamed)(void *arg, const char *store, const char *from,
			const char *to);
	void (*removed)(void *arg, const char *store, const char *key);
	void *arg;
	/* At open, before the recovery (arg): cb(ctx, ...) for each file of
	 * store recorded as published with its owner and size, the count
	 * checkpoints.uid_store_size starts from. A -errno is logged and
	 * the count starts empty. NULL: none. */
	int (*census)(void *arg, const char *store, ckpt_census_cb cb,
		      void *ctx);
	/* true: ckpt_open_ex starts no thread; the caller calls ckpt_start
	 * (dstagefs, after it forks into the background: a fork keeps only
	 * the thread that called it). */
	bool threads_later;
};

/* ckpt_open with hooks (copied; NULL: none), in force from the recovery
 * at open on. Errors as ckpt_open. */
int ckpt_open_ex(const struct dstage_config *cfg, const struct ckpt_hooks *h,
		 struct ckpt **out);

/* Start ck's uploader and retry threads, once (ckpt_open_ex does, unless
 * its hooks said threads_later). 0, or the retry thread's -errno (no
 * uploader thread is only logged: files then upload when closed). */
int ckpt_start(struct ckpt *ck);

/* Accepts NULL. Open files must have been closed. */
void ckpt_free(struct ckpt *ck);

/* The store's URL. */
const char *ckpt_url(const struct ckpt *ck);

/* The store's handle (thread-safe, owned by ck), for the lifecycle's
 * recall of an archived checkpoint. */
struct objstore *ckpt_objstore(const struct ckpt *ck);

/*
 * Owner records (lib/ckpt/ckpt_owner.c): who owns each file and directory
 * of the tree and its mode, kept in the store beside the data as
 * ".dstage-owner/<key>/.dstage-own" ("<uid> <gid> <mode in octal>\n"), so
 * every node over the store enforces the same owners and modes, on S3 and
 * file:// stores alike. Who may do what with them is the caller's
 * (dstagefs) to decide. Thread-safe.
 */
struct ckpt_owner {
	uid_t uid;
	gid_t gid;
	mode_t mode; /* permission bits only (07777) */
};

/* key's record: the one kept on this node (ckpt_owner_keep) if any and
 * the store holds none of another uid's (a record kept here never
 * overrides another owner's in the store), else the store's. A record that does not parse reads as root's with mode 0000
 * (only root may use the key, and fix it), with a warning. Returns 0,
 * -ENOENT (no record: published before owners existed, or by another
 * tool), -ENOMEM or the store's -errno. */
int ckpt_owner_read(struct ckpt *ck, const char *key, struct ckpt_owner *o);

/* Keep o as the record of key, made new on this node, until the first
 * publish of key or of a file below it stores it (before that file's
 * bytes go up, shallowest first; a directory's is claimed then, as
 * ckpt_owner_claim: never stored over another uid's record, the publish
 * fails instead with -EEXIST). Replaces the kept records of key and
 * below. Returns 0, or -errno (logged, naming key and owners/: full or
 * not writable, say; nothing of the record stays, and the caller does not
 * make key). */
int ckpt_owner_keep(struct ckpt *ck, const char *key,
		    const struct ckpt_owner *o);

/* Claim key, a directory made on this node, for o in the store: its
 * record is created only if the store has none, atomically against other
 * nodes. *theirs: the store's record after the call. Returns 0 (claimed,
 * or the store's record is o's uid's already: the same user made it on
 * another node), -EEXIST (another uid's: the directory exists elsewhere),
 * -ENOMEM or the store's -errno (logged: the caller keeps o with
 * ckpt_owner_keep, and the first publish below key claims it). */
int ckpt_owner_claim(struct ckpt *ck, const char *key,
		     const struct ckpt_owner *o, struct ckpt_owner *theirs);

/* Set key's record: the kept one when there is one, else the store's.
 * Returns 0, -ENOMEM or the store's -errno (logged). */
int ckpt_owner_write(struct ckpt *ck, const char *key,
		     const struct ckpt_owner *o);

/* Delete key's record from the store (none there is no error; a failure
 * is logged). The kept one is the caller's to drop (ckpt_owner_move_kept
 * to NULL). */
void ckpt_owner_remove(struct ckpt *ck, const char *key);

/* Rename the kept records of from and below it to to (NULL: drop them). */
void ckpt_owner_move_kept(struct ckpt *ck, const char *from, const char *to);

/* In the store, copy from's record to to's (dir: every record at or below
 * from, to the same place below to; a directory without a record leaves
 * none at to), or with drop delete from's (to unused). For a rename: copy
 * before the data moves, drop after. Returns 0, -ENOMEM or the store's
 * -errno (logged). */
int ckpt_owner_copy(struct ckpt *ck, const char *from, const char *to, bool dir,
		    bool drop);

/* Whether name may be created in the directory dirkey ("" for the top).
 * Returns 0 or -EINVAL. */
int ckpt_name_ok(const char *dirkey, const char *name);

/* Whether key may be made new in ck's store: a valid key (else -EINVAL)
 * whose longest store key fits (else -ENAMETOOLONG; CKPT_AUX_KEY_EXTRA).
 * For a caller that stores something of key's before ckpt_file_open,
 * ckpt_mkdir or ckpt_rename would check it (the owner record). */
int ckpt_key_check(const struct ckpt *ck, const char *key);

/*
 * Negative lookups: a name found missing (by ckpt_stat and, for a
 * checkpoint, the lifecycle's archive marker) is remembered for ttl_ms,
 * so that repeated misses (imports, exists() loops) do not each ask the
 * store. At most 256 names (the oldest is replaced); every name this node
 * adds (create, mkdir, rename) forgets them all; other nodes' new names
 * show once ttl_ms has passed (use the entry timeout).
 *   gen = ckpt_neg_gen(ck);            before asking the store
 *   ... the store says -ENOENT ...
 *   ckpt_neg_add(ck, key, ttl_ms, gen); ignored if a name was added since
 *   ckpt_neg_find(ck, key)             true: still remembered missing
 */
uint64_t ckpt_neg_gen(struct ckpt *ck);
void ckpt_neg_add(struct ckpt *ck, const char *key, unsigned ttl_ms,
		  uint64_t gen);
bool ckpt_neg_find(struct ckpt *ck, const char *key);

/* Attributes of key: the local copy when this node wrote it (and the store
 * has not replaced it since), else the store's object or prefix. */
int ckpt_stat(struct ckpt *ck, const char *key, struct ckpt_attr *a);

/*
 * The directory dirkey's entries: local ones and the store's, each name
 * once, in byte order; cb may stop the walk by returning non-zero, which
 * ckpt_list returns. -ENOENT when the directory exists nowhere.
 */
typedef int (*ckpt_list_cb)(void *arg, const char *name,
			    const struct ckpt_attr *a);
int ckpt_list(struct ckpt *ck, const char *dirkey, ckpt_list_cb cb, void *arg);

/* A local directory (the store has none until a file lands in it). */
int ckpt_mkdir(struct ckpt *ck, const char *key);
/* -ENOTEMPTY when the store or the local tree has anything under key. */
int ckpt_rmdir(struct ckpt *ck, const char *key);
/* Remove the file from the store (and its SHA-256 record) and locally. A
 * file still open is never published afterwards. */
int ckpt_unlink(struct ckpt *ck, const char *key);
/*
 * Rename a file or a directory (every object under it), replacing an
 * existing file at to. In the store: copy, then delete the old name, so
 * readers see the old or the new name with the whole content. noreplace:
 * -EEXIST when to exists.
 */
int ckpt_rename(struct ckpt *ck, const char *from, const char *to,
		bool noreplace);

/*
 * Open key. flags: O_RDONLY / O_WRONLY / O_RDWR with O_CREAT, O_EXCL,
 * O_TRUNC. Opening for writing a file only the store has copies it here
 * first (unless O_TRUNC). *created is set when the file was made.
 */
int ckpt_file_open(struct ckpt *ck, const char *key, int flags,
		   struct ckpt_file **out, bool *created);
/* ckpt_file_open for uid (ckpt_file_open: this process's): a local copy
 * this open makes is uid's, and its bytes and the file count against
 * uid's checkpoints.uid_staging_size and uid_files (-EDQUOT past them;
 * uid 0 has no per-uid bound). An existing local copy counts against its
 * owner, whoever writes it. */
int ckpt_file_open_as(struct ckpt *ck, const char *key, int flags, uid_t uid,
		      struct ckpt_file **out, bool *created);
/* Bytes read (0 at the end), or -errno. */
ssize_t ckpt_file_pread(struct ckpt_file *f, void *buf, size_t len, off_t off);
/* Bytes written, or -errno (-ENOSPC: staging_size reached with nothing
 * evictable, -EBADF: not open for writing). */
ssize_t ckpt_file_pwrite(struct ckpt_file *f, const void *buf, size_t len,
			 off_t off);
int ckpt_file_truncate(struct ckpt_file *f, uint64_t size);
/* Set the local copy's mtime (utimens); published content is unchanged. */
int ckpt_file_set_mtime(struct ckpt_file *f, const struct timespec *mtime);
int ckpt_file_attr(struct ckpt_file *f, struct ckpt_attr *a);
/* The local copy's descriptor (to splice reads from; stays f's), or -1
 * when f is read from the store. */
int ckpt_file_fd(const struct ckpt_file *f);
/* A read-only descriptor of f's local copy of its own (a new open file
 * description, close-on-exec, O_NOATIME where the copy's owner allows: a
 * passthrough open's backing file), or -EAGAIN when f is read from the
 * store, or -errno. */
int ckpt_file_reopen(const struct ckpt_file *f);
/* Whether f was opened for writing. */
bool ckpt_file_writable(const struct ckpt_file *f);
/* How many handles of f's file are open for writing now, f's included,
 * less those through ckpt_file_writer_done (0 for a file read from the
 * store). */
unsigned ckpt_file_writers(const struct ckpt_file *f);
/* f's writer is done (the kernel's RELEASE of its handle; before
 * ckpt_file_close): f no longer counts in ckpt_file_writers. owe: its
 * close deferred a publish, which the file owes now. Returns true when f
 * was the last writable handle and a publish is owed, by f or by another
 * handle released before it (then no longer owed): the caller publishes
 * (ckpt_file_sync). A deferred publish is so never lost to another
 * writable handle that had closed but not yet been released. False for a
 * read-only f or a second call. */
bool ckpt_file_writer_done(struct ckpt_file *f, bool owe);
/* The version of f's local copy: it changes with every write or truncate
 * of the copy, through any handle (0 when f is read from the store). */
uint64_t ckpt_file_gen(struct ckpt_file *f);
/* ckpt_file_pread of f's local copy as it was at gen (ckpt_file_gen):
 * -ESTALE once the copy changed, so what a reader gets is all of that
 * version or an error, never a mix; -EBADF when f is read from the
 * store. */
ssize_t ckpt_file_pread_gen(struct ckpt_file *f, void *buf, size_t len,
			    off_t off, uint64_t gen);

/* A file read from the store (another node's, or one this node no longer
 * holds a copy of): the version it was opened at. The strings are f's:
 * valid until f is closed. */
struct ckpt_remote {
	struct objstore *os; /* ckpt_objstore() */
	const char *key; /* its key in os */
	const char *etag; /* the version opened (never "") */
	uint64_t size;
};

/*
 * Where f's bytes come from when it has no local copy, for a reader that
 * serves them through the block cache (dstagefs: each version is fetched
 * once, checked block by block, and kept for the next reader). Returns 0,
 * or -ENOENT when f is read from its local copy (ckpt_file_fd) or the
 * store gave the version no ETag (then ckpt_file_pread reads it, with no
 * cache: a version that cannot be named cannot be cached).
 */
int ckpt_file_remote(const struct ckpt_file *f, struct ckpt_remote *r);
/*
 * Publish what was written, if anything changed since the last publish:
 * returns 0 only once the whole content is in the store under the file's
 * current name with its SHA-256 recorded. On failure the local copy stays,
 * one line is logged naming the file and the cause, and a later sync, flush,
 * retry or restart publishes it: -EIO, -ENOSPC or -EDQUOT (full store).
 */
int ckpt_file_sync(struct ckpt_file *f);
/* Close one handle (no publish: the caller syncs first where it must).
 * Accepts NULL. */
void ckpt_file_close(struct ckpt_file *f);

/* Truncate key without a handle (truncate(2)), then publish, unless a
 * handle has it open for writing: then that writer's close publishes. */
int ckpt_truncate(struct ckpt *ck, const char *key, uint64_t size);

/* Retry publishing closed files the store refused now (the retry thread
 * does it by itself every checkpoints.retry_interval). */
void ckpt_retry(struct ckpt *ck);

/* Staging space as statfs reports it (bounded by staging_size). */
int ckpt_statfs(struct ckpt *ck, struct statvfs *sv);

#endif
