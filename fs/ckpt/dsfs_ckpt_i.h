/* SPDX-License-Identifier: MIT */
/*
 * dsfs_ckpt_i: what the checkpoint subtree's files share: dsfs_ckpt.c (the
 * hook table, life, names, directories) calls dsfs_ckpt_file.c (open
 * files), both call dsfs_ckpt_own.c (owners, modes, access checks), which
 * calls dsfs_ckpt_pn.c (nodes, keys, attributes). dsfs_ckpt_file.c also
 * asks dsfs_ckpt_proc.c what /proc says of the processes that close a
 * file. The state and the locks are described in dsfs_ckpt.c and
 * dsfs_ckpt_pn.c.
 */
#ifndef DSFS_CKPT_I_H
#define DSFS_CKPT_I_H

#include "dsfs_pt.h"
#include "dsfs_subtree.h"
#include "dstage/ckpt.h" /* struct ckpt_owner: a record of lib/ckpt */

#define DSFS_CKPT_TIMEOUT 1.0 /* entries and attributes: others may write */

struct dsfs_ckpt_pn {
	struct dsfs_ckpt_pn *parent; /* st->lock; NULL for the top */
	char *name; /* st->lock */
	unsigned refs; /* st->lock */
	bool dir;
	bool gone; /* st->lock: removed or replaced */
	/* st->lock: the owner record as last read or written, and when
	 * (CLOCK_MONOTONIC ms; 0: never, INT64_MAX: fixed, the top) */
	struct ckpt_owner own;
	int64_t own_ms;
	/* st->lock: bumped by each change of own that this node makes
	 * (dsfs_ckpt_own_remember), so that a read of the record begun
	 * before the change does not overwrite it (dsfs_ckpt_own_get) */
	uint64_t own_gen;
	/* files: opens passed through to the local copy or not (dsfs_pt.h;
	 * checkpoints.passthrough); not for the top */
	struct dsfs_pt pt;
};

/* One uid's open files in the subtree (struct dsfs_ckpt's open_uids,
 * under its open_lock). */
struct dsfs_ckpt_uid_open {
	uid_t uid;
	unsigned handles; /* its counted handles, at least 1 */
};

struct dsfs_ckpt {
	struct ckpt *ck; /* NULL: no store configured (read-only) */
	/* The block cache's dataset for other nodes' files:
	 * "checkpoints:<store URL>" (no dataset name has a ':' and a '/',
	 * so it meets none of theirs, nor their pins and quotas). Immutable
	 * after init; NULL without a store. */
	char *cache_label;
	/* What this node publishes, recorded in the catalog through ckpt's
	 * hooks (its lock a leaf, taken inside ckpt's). Immutable after
	 * init; NULL without a store. */
	struct catalog_ckpt_log *record;
	pthread_mutex_t lock;
	struct dsfs_ckpt_pn top;
	/* The mount's device number (dsfs_ckpt_proc.c), read at the first
	 * writer's close; 0 until then. Atomic. */
	atomic_ullong mnt_dev;
	/* Open files per uid, bounded by checkpoints.uid_open_files
	 * (dsfs_ckpt_file.c; immutable after init, 0: no bound). */
	unsigned uid_open_max;
	pthread_mutex_t open_lock; /* a leaf: guards the fields below */
	/* open_lock: the uids holding at least one counted handle, n_open
	 * of cap_open (a uid leaves when its last handle goes) */
	struct dsfs_ckpt_uid_open *open_uids;
	size_t n_open, cap_open;
	int64_t open_logged_ms; /* open_lock: the last EDQUOT line */
};

static inline struct dsfs_ckpt *dsfs_ckpt_st(struct dsfs *fs)
{
	return fs->sub_state[DSFS_SUB_CKPT];
}

static inline struct dsfs_ckpt_pn *dsfs_ckpt_pn_of(struct dsfs_node *n)
{
	return n->priv;
}

/* dsfs_ckpt_pn.c */
/* The key of pn, or of name in dir (malloc'd), or NULL. */
char *dsfs_ckpt_pn_key(struct dsfs_ckpt *st, struct dsfs_ckpt_pn *pn);
char *dsfs_ckpt_pn_child_key(struct dsfs_ckpt *st, struct dsfs_node *dir,
			     const char *name);
/* Drop a reference of pn (st->lock held), freeing what reaches 0. */
void dsfs_ckpt_pn_unref_locked(struct dsfs_ckpt *st, struct dsfs_ckpt_pn *pn);
/* The forget hook: drop the node's reference on its pn. */
void dsfs_ckpt_pn_forget(struct dsfs *fs, struct dsfs_node *n);
/* After a remove (newdir NULL: the node of name in dir is gone) or a
 * rename (it moves to newname in newdir). */
void dsfs_ckpt_pn_mark(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		       struct dsfs_node *newdir, const char *newname);
/* The node of name in dir, made if needed, its nlookup raised. */
int dsfs_ckpt_pn_node(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		      bool isdir, struct dsfs_node **out);
/* Drop one lookup reference of n (freeing it at 0). */
void dsfs_ckpt_pn_unref_node(struct dsfs *fs, struct dsfs_node *n);
/* The owner of an object without an owner record (fail closed): the
 * mount's -o uid, -o gid, modes 0600 / 0700 less -o umask. */
void dsfs_ckpt_own_default(struct dsfs *fs, bool dir, struct ckpt_owner *o);
/* The attributes the kernel sees for a owned as o (NULL: the default of
 * an object without an owner record, dsfs_ckpt_own_default). */
void dsfs_ckpt_pn_attr(struct dsfs *fs, fuse_ino_t ino,
		       const struct ckpt_attr *a, const struct ckpt_owner *o,
		       struct stat *st);
/* 0 when the subtree can be changed at all, else -EROFS (no store). Who
 * may change what is dsfs_ckpt_own.c's. */
int dsfs_ckpt_pn_check(struct dsfs *fs, struct dsfs_caller *who);
/* For a call that makes name in dir: 0 and *key (malloc'd) its key, or
 * what dsfs_ckpt_pn_check refuses, -EINVAL (a name ckpt_name_ok refuses)
 * or -ENOMEM, *key NULL. The caller checks dir's permissions. */
int dsfs_ckpt_pn_new_key(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *dir, const char *name, char **key);
/* What links and special files get: -EPERM (-EROFS without a store). */
int dsfs_ckpt_pn_perm(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, const char *name);

/* dsfs_ckpt_own.c: owners, modes and POSIX access checks (the trust
 * model: docs/security.md, "Checkpoints: owners and modes"). Each
 * returns 0 or -errno. */
/* The owner of key from the store (its record, else the default). */
int dsfs_ckpt_own_read(struct dsfs *fs, const char *key, bool dir,
		       struct ckpt_owner *o);
/* Store o as key's owner record, and remember it on pn (may be NULL). */
int dsfs_ckpt_own_write(struct dsfs *fs, struct dsfs_ckpt_pn *pn,
			const char *key, const struct ckpt_owner *o);
/* A new directory key made on this node for o: claim its name in the
 * store (ckpt_owner_claim), or keep o on the node while the store is
 * away. *o becomes the store's record: 0 (claimed, or already the same
 * uid's) or -EEXIST (another uid's: the directory exists elsewhere). */
int dsfs_ckpt_own_claim(struct dsfs *fs, const char *key, struct ckpt_owner *o);
/* Remember o as pn's owner (just written to the store). */
void dsfs_ckpt_own_remember(struct dsfs *fs, struct dsfs_ckpt_pn *pn,
			    const struct ckpt_owner *o);
/* The owner of pn: remembered if read less than a second ago (fresh:
 * always read again), else read from the store and remembered. */
int dsfs_ckpt_own_get(struct dsfs *fs, struct dsfs_ckpt_pn *pn, bool fresh,
		      struct ckpt_owner *o);
/* POSIX: may who access an object owned as o for mask (R_OK, W_OK, X_OK)?
 * Root may do anything. 0 or -EACCES. */
int dsfs_ckpt_may(struct dsfs_caller *who, const struct ckpt_owner *o,
		  int mask);
/* Search (X) permission on every directory above pn: 0, -EACCES, or the
 * store's error reading an owner. who NULL: search for everyone (owner,
 * group and others) on every directory above. */
int dsfs_ckpt_may_walk(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_ckpt_pn *pn);
/* How long the kernel may keep pn's attributes: DSFS_CKPT_TIMEOUT when
 * everyone may search every directory above it, else 0. The kernel
 * answers stat(2) from its cache for any caller, without asking
 * dstagefs: a 0700 directory's entries looked up by its owner (or root)
 * would show another user their size, owner and mode until it expires. */
double dsfs_ckpt_attr_timeout(struct dsfs *fs, struct dsfs_ckpt_pn *pn);
/* The entry the kernel is given for e->node, a owned as o: its attributes
 * (dsfs_ckpt_pn_attr) and timeouts (dsfs_ckpt_attr_timeout). */
void dsfs_ckpt_own_entry(struct dsfs *fs, const struct ckpt_attr *a,
			 const struct ckpt_owner *o, struct dsfs_entry *e);
/* may_walk to dir, then mask on dir itself; *downer (may be NULL) is
 * dir's owner. */
int dsfs_ckpt_may_dir(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, int mask,
		      struct ckpt_owner *downer);
/* May who remove or rename away name (key) from dir, owned as downer?
 * W and X on dir, then the sticky bit: only the entry's owner, the
 * directory's owner or root (-EPERM). *owner (may be NULL) is the
 * entry's owner. */
int dsfs_ckpt_may_remove(struct dsfs *fs, struct dsfs_caller *who,
			 const struct ckpt_owner *downer, const char *key,
			 bool isdir, struct ckpt_owner *owner);
/* May who open n with flags? Search above, then read and/or write as
 * flags ask (O_TRUNC: write). */
int dsfs_ckpt_may_open(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_node *n, int flags);
/* May who create key in dir with flags? An existing file (made
 * meanwhile, or a stale negative entry): -EEXIST with O_EXCL, else as
 * open(2), *o its owner. A new one: write and search on dir, *o its
 * owner (dsfs_ckpt_own_new) and *isnew set. */
int dsfs_ckpt_may_create(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *dir, const char *key, int flags,
			 mode_t mode, struct ckpt_owner *o, bool *isnew);
/* The owner a new entry of dir (owned as downer) gets from who and the
 * requested mode (the kernel has applied the creator's umask): who's
 * uid, and its gid unless dir is set-group-ID (then dir's gid, and a
 * new directory inherits the bit). */
void dsfs_ckpt_own_new(struct dsfs_caller *who, const struct ckpt_owner *downer,
		       bool dir, mode_t mode, struct ckpt_owner *o);
/* dsfs_ckpt_arch.c: checkpoints the lifecycle moved to their archive */
/* key's attributes in the archive, nothing recalled: 0, -ENOENT (not
 * archived) or a store error. */
int dsfs_ckpt_arch_stat(struct dsfs *fs, const char *key, struct ckpt_attr *a);
/* Recall the checkpoint of key (NULL: -ENOMEM) for a read by who,
 * audited as who's uid: 0, -ENOENT (not archived) or a store error. */
int dsfs_ckpt_arch_recall(struct dsfs *fs, struct dsfs_caller *who,
			  const char *key);

/* dsfs_ckpt_file.c: the subtree's hooks for files (dsfs_subtree.h) */
int dsfs_ckpt_file_create(struct dsfs *fs, struct dsfs_caller *who,
			  struct dsfs_node *dir, const char *name, mode_t mode,
			  struct fuse_file_info *fi, struct dsfs_entry *e);
int dsfs_ckpt_file_mknod(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *dir, const char *name, mode_t mode,
			 dev_t rdev, struct dsfs_entry *e);
int dsfs_ckpt_file_open(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, struct fuse_file_info *fi);
int dsfs_ckpt_file_read(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, struct fuse_file_info *fi,
			size_t size, off_t off, struct dsfs_reply_read *r);
ssize_t dsfs_ckpt_file_write(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi,
			     const char *buf, size_t size, off_t off);
int dsfs_ckpt_file_flush(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, struct fuse_file_info *fi);
int dsfs_ckpt_file_fsync(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, int datasync,
			 struct fuse_file_info *fi);
int dsfs_ckpt_file_fallocate(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, int mode, off_t off,
			     off_t len, struct fuse_file_info *fi);
void dsfs_ckpt_file_release(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, struct fuse_file_info *fi);
/* The file behind fi->fh (getattr of an open file). */
struct ckpt_file *dsfs_ckpt_file_of(struct fuse_file_info *fi);

/* dsfs_ckpt_proc.c: what /proc says of the processes closing a file. */

/* The start of /proc/<pid>/<what> in buf (size bytes), NUL-terminated;
 * false when it cannot be read or is empty. */
bool dsfs_ckpt_proc_read(pid_t pid, const char *what, char *buf, size_t size);
/* The process (thread group) of thread tid; tid when it cannot be read. */
pid_t dsfs_ckpt_proc_tgid(pid_t tid);
/* Whether the task is exiting because a signal killed it (its FLUSH comes
 * from do_exit: PF_EXITING, its exit code a signal number, put in *sig). */
bool dsfs_ckpt_proc_killed(pid_t pid, int *sig);
/* Whether thread tid still has node ino of the mount open through another
 * descriptor (the one being closed is already out of its table): a
 * shell's redirection or dd opens the file, dup2()s it onto 1 and closes
 * the first descriptor before writing anything. */
bool dsfs_ckpt_proc_held(struct dsfs *fs, pid_t tid, fuse_ino_t ino);
/* Whether a process other than tgid (and dstagefs) has node ino of the
 * mount open for writing, among the processes known[0..nknown) (those that
 * opened or wrote the handle) and every descendant of theirs and of tgid:
 * a forked or exec'd child's copy of a writer's descriptor. Every process
 * when the kernel lists no children or the tree passes 1,024 processes;
 * bounded (1 Mi descriptors in all): past the bound, true. */
bool dsfs_ckpt_proc_others_write(struct dsfs *fs, pid_t tgid, fuse_ino_t ino,
				 const pid_t *known, size_t nknown);

#endif
