/* SPDX-License-Identifier: MIT */
/*
 * ckpt_stage: lib/ckpt's staging directory as other rooms of lib/ may use
 * it (the stager daemon's retry job, lib/lifecycle/lifecycle_stage.c;
 * tests/fuzz): its layout, the journal's records, the locks on a local
 * copy, and the keys and test points a publish shares with dstagefs's.
 * Everything here works on a struct ckpt_dirs (the directory's
 * descriptors), never on a struct ckpt: the rest of ckpt_i.h (entries,
 * counters, the retry thread, the store) stays private to lib/ckpt.
 * Sharing a staging directory between processes: a record is replaced
 * atomically (rename), so each read sees a whole one; a local copy's
 * locks are OFD locks (below).
 */
#ifndef DSTAGE_CKPT_STAGE_H
#define DSTAGE_CKPT_STAGE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "dstage/objstore.h"

struct ckpt_owner; /* dstage/ckpt.h */

#define CKPT_SHA_HEX 65 /* 64 hex digits and a NUL */
#define CKPT_TREE "tree"
#define CKPT_JOURNAL "journal"
#define CKPT_ABANDONED "abandoned"
#define CKPT_OWNERS "owners" /* the kept owner records (ckpt_ownrec.c) */
#define CKPT_DIR_MODE 0700
/* One subdirectory of staging_dir per store (issue 34): stores/<the first
 * CKPT_STORE_HASH_BYTES of the SHA-256 of the store's URL, in hex>/ holds
 * that store's tree/, journal/ and abandoned/, and the file "store" naming
 * the URL (checked at every open). */
#define CKPT_STORES "stores"
#define CKPT_STORE_FILE "store"
#define CKPT_STORE_HASH_BYTES 16

/* One store's staging directory: stores/<hash>/ of staging_dir, and its
 * subdirectories (O_DIRECTORY descriptors for the *at calls; -1 when not
 * open). Owned by whoever opened them (ckpt_open, lifecycle_staging_open). */
struct ckpt_dirs {
	char *staging; /* the store's subdirectory's path (messages) */
	int tree_fd; /* tree/: the local copies, by key */
	int journal_fd; /* journal/: one record per local copy, by inode */
	int abandoned_fd; /* abandoned/: copies their writers never closed */
	int owners_fd; /* owners/: owner records not in the store yet */
};

/* Close d's descriptors (those not -1) and free its path; d is left
 * closed (-1, NULL). Accepts one never opened. */
void ckpt_dirs_close(struct ckpt_dirs *d);

/* A journal record. */
struct ckpt_rec {
	char state; /* 'W', 'P', 'C' */
	char sha[CKPT_SHA_HEX]; /* "" when unknown */
	uint64_t size;
	char etag[OBJSTORE_ETAG_MAX]; /* "" when unknown */
	char key[4096];
	/* An upload in parts that may be open in the store ("" for none):
	 * its id and the key it was begun for (a third and fourth line). */
	char upload_id[256];
	char upload_key[4096];
};

/* A valid key of the tree (segments as ckpt_seg_ok, ckpt_i.h): 0 or
 * -EINVAL. */
int ckpt_key_ok(const char *key);
/*
 * Tests: when the environment's DSTAGE_TEST_CRASH_AT (read once, at the
 * first call) names point, log it and _exit(CKPT_TEST_CRASH_STATUS) at
 * once, as a crash there would (no cleanup, nothing flushed). The points:
 * "create" (a new or O_TRUNC file, its W record written), "truncate" (a
 * truncate done), "mid-write" (a write took the local copy from below
 * CKPT_TEST_MID_WRITE to it or past it: earlier writes are in, the
 * writer has more to write), "upload" (a closed file's P record written,
 * nothing stored yet but the parts sent while it was written),
 * "mid-upload" (a publish in parts: some parts in the store, not all,
 * the upload not committed: S3 holds an open multipart upload, a
 * directory store its partly written temporary file), "sidecar" (the
 * object stored under its final key, its sidecar not yet). The stager
 * daemon's retry job stops at "upload" and "sidecar" of its own publish
 * too (lib/lifecycle/lifecycle_stage.c).
 */
void ckpt_test_crash(const char *point);
/* The store's key of key's SHA-256 record (malloc'd) or NULL. */
char *ckpt_sidecar_key(const char *key);
/* Open url's subdirectory of the staging directory sdfd (path staging)
 * into *out (O_DIRECTORY), making it and its "store" file when create;
 * *path_out (may be NULL) gets its path (malloc'd). -EINVAL (logged) when
 * its "store" file names another URL, -ENOENT when it is not there. */
int ckpt_store_dir_open(int sdfd, const char *staging, const char *url,
			bool create, int *out, char **path_out);

/*
 * Sharing a local copy with the stager daemon's lifecycle and retry job
 * (lifecycle_stage.c), which act on the staging directory from another
 * process. Two independent kinds of lock on the local copy's file:
 *   use:     flock LOCK_SH, held by dstagefs on every open entry's
 *            descriptor from open to the last close; the lifecycle's drop
 *            of a published copy takes LOCK_EX without waiting and skips
 *            a copy in use (-EBUSY).
 *   publish: an OFD write lock (fcntl F_OFD_SETLK) on the whole file, held
 *            while one version of it goes to the store; dstagefs's publish
 *            waits for it (so the newer version lands last), the retry
 *            job's does not (-EBUSY: it tries again later). fd must be
 *            open for writing.
 * Both are released by closing the descriptor, or by the unlock calls.
 * Each returns 0, -EBUSY (held elsewhere, wait false) or -errno.
 */
int ckpt_lock_use(int fd);
int ckpt_lock_drop(int fd);
int ckpt_lock_publish(int fd, bool wait);
void ckpt_unlock_publish(int fd);

/*
 * The owner records kept on this node until a publish stores them
 * (ckpt_ownrec.c: the journal's format, states and locks). A record is a
 * file of owners/ locked (flock LOCK_EX) by whoever holds it open.
 */
/* "<uid> <gid> <mode in octal>\n" into buf: its length, or -ENAMETOOLONG. */
int ckpt_ownrec_format(const struct ckpt_owner *o, char *buf, size_t size);
/* Exactly that text, each field in range: 0 or -EINVAL. */
int ckpt_ownrec_parse(const char *s, struct ckpt_owner *o);
/* Open and lock key's kept record into *out (create: making it empty if
 * absent). 0, -ENOENT (absent, or stored and removed while we waited for
 * its lock; no owners/ directory) or -errno. Close *out to unlock. */
int ckpt_ownrec_open(const struct ckpt_dirs *d, const char *key, bool create,
		     int *out);
/* The record in fd: 0, or -EINVAL (not a record, or key's when key is not
 * NULL: another key's). */
int ckpt_ownrec_read(int fd, const char *key, struct ckpt_owner *o);
/* Replace the record in fd with o for key. 0 or -errno. */
int ckpt_ownrec_write(int fd, const char *key, const struct ckpt_owner *o);
/* Remove key's record (held locked by the caller, or not there). */
void ckpt_ownrec_unlink(const struct ckpt_dirs *d, const char *key);
/* fn(arg, key) for each kept record (at most 1 Mi), stopping at a
 * non-zero return, which is returned. */
typedef int (*ckpt_ownrec_fn)(void *arg, const char *key);
int ckpt_ownrec_each(const struct ckpt_dirs *d, ckpt_ownrec_fn fn, void *arg);
/* Store the kept records of key and of the directories above it in os,
 * shallowest first, each removed once stored (ckpt_owner.c): what every
 * publisher of key does before key's bytes go up; a directory's is
 * claimed (ckpt_owner_claim). One pass, one open of owners/ a level: each
 * record found is fsynced (under its lock) before it is stored, and
 * owners/ after the last, so that those that stay are durable before the
 * caller writes key's P record; past a level that fails, the rest are only
 * fsynced. 0, -EEXIST (a directory above key is another uid's in the
 * store), the store's -errno (logged; the records stay) or fsync's. */
int ckpt_owner_store_kept(const struct ckpt_dirs *d, struct objstore *os,
			  const char *key);

/* Write (durable: and fsync) the record of the local copy ino, replacing
 * the one there atomically. 0 or -errno (logged). */
int ckpt_journal_write(const struct ckpt_dirs *d, ino_t ino,
		       const struct ckpt_rec *r, bool durable);
/* 0, -ENOENT (no record) or -EINVAL (unreadable, logged). */
int ckpt_journal_read(const struct ckpt_dirs *d, ino_t ino, struct ckpt_rec *r);
/* A journal entry's name as the inode number of its local copy: 0 and
 * *ino, or -EINVAL (not a record's name: ".", a temporary, a stray). */
int ckpt_journal_name(const char *name, ino_t *ino);
/* The record of ino and its live local copy: 0 with *rec and *st (the
 * tree's file at rec->key, a regular file that is inode ino), or -ENOENT
 * (no record, an unreadable one, a key that is not valid, a copy gone or
 * replaced: the record is stale). */
int ckpt_journal_live(const struct ckpt_dirs *d, ino_t ino,
		      struct ckpt_rec *rec, struct stat *st);
/* Remove the record of ino (none there: nothing). */
void ckpt_journal_remove(const struct ckpt_dirs *d, ino_t ino);

#endif
