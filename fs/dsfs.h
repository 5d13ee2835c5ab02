/* SPDX-License-Identifier: MIT */
/*
 * dsfs: the internals of dstagefs, the FUSE file system (low-level API)
 * training jobs read datasets through.
 *
 * Namespace and inode numbers:
 *
 *   /                      DSFS_INO_ROOT        static
 *   /datasets              DSFS_INO_DATASETS    static, lists the catalog
 *   /datasets/<name>/...   dynamic (>= DSFS_INO_FIRST), dataset subtree
 *   /checkpoints           DSFS_INO_CHECKPOINTS static, checkpoint subtree
 *   /.dstage               DSFS_INO_CTL         static, control subtree
 *   /.dstage/prefetch      DSFS_INO_PREFETCH    static, writable
 *   /.dstage/stats         DSFS_INO_STATS       static
 *
 * Every node belongs to one subtree, and every operation is dispatched to
 * that subtree's struct dsfs_subtree (dsfs_ops.c). A hook left NULL answers
 * EROFS for modifying operations (and ENOSYS-like defaults otherwise), so a
 * writable subtree (checkpoints) slots in by filling in its own table.
 *
 * Lock order (outer first): dsfs.ds_lock, then dsfs.node_lock. No lock is
 * held across a call into the catalog, the cache or libfuse replies, except
 * that ds_lock may be held (read) while node_lock is taken.
 */
#ifndef DSFS_H
#define DSFS_H

#define FUSE_USE_VERSION 314

#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "dstage/catalog.h"

struct cache;
struct dstage_config;
struct dsfs;
struct dsfs_node;
struct dsfs_handle;

enum {
	DSFS_INO_ROOT = FUSE_ROOT_ID,
	DSFS_INO_DATASETS = 2,
	DSFS_INO_CHECKPOINTS = 3,
	DSFS_INO_CTL = 4,
	DSFS_INO_PREFETCH = 5,
	DSFS_INO_STATS = 6,
	DSFS_INO_FIRST = 16, /* first dynamic inode number */
};

/* Exit codes of dstagefs (documented in --help and docs/dstagefs.md). */
enum {
	DSFS_EXIT_OK = 0,
	DSFS_EXIT_RUNTIME = 1, /* the session loop failed */
	DSFS_EXIT_USAGE = 2, /* bad option or configuration */
	DSFS_EXIT_MOUNT = 3, /* mountpoint unusable, stale mount not cleared */
	DSFS_EXIT_STORE = 4, /* catalog or cache could not be opened */
};

/* Command-line settings (fs/dsfs_opts.c). Immutable once mounted. */
struct dsfs_opts {
	const char *mountpoint;
	const char *config_path; /* NULL: config_load's default search */
	const char *log_level; /* NULL: from the config */
	bool foreground, debug, allow_other, show_help, show_version;
	uid_t uid;
	gid_t gid;
	mode_t umask; /* applied to 0777 (dirs) and 0666 (files) */
	unsigned threads; /* max worker threads of the session loop */
	bool clone_fd;
	bool splice; /* reply with cache file descriptors (splice) */
	unsigned max_write_kb; /* request size: sets max_pages (<= 1024) */
	unsigned read_ahead_kb; /* the mount's bdi read_ahead_kb; 0: leave */
	double entry_timeout; /* seconds, dataset subtree and static nodes */
	unsigned poll_ms; /* catalog poll period for new/changed datasets */
	uint64_t prefetch_window; /* bytes in flight for .dstage/prefetch */
	char *fuse_opts; /* -o options passed on to libfuse, comma list */
};

int dsfs_opts_parse(int argc, char **argv, struct dsfs_opts *o);
void dsfs_opts_help(const char *prog);
void dsfs_opts_release(struct dsfs_opts *o);

/* Who is asking: from fuse_req_ctx plus the supplementary groups. */
struct dsfs_caller {
	uid_t uid;
	gid_t gid;
	pid_t pid;
	fuse_req_t req;
	int ngroups; /* -1: not fetched yet, -2: unknown */
	gid_t groups[64];
};

/* Fill who from req; the groups are fetched on first use. */
void dsfs_caller_get(fuse_req_t req, struct dsfs_caller *who);
bool dsfs_caller_in_group(struct dsfs_caller *who, gid_t gid);
/* Fetch the groups now (before the request is answered). */
void dsfs_caller_load_groups(struct dsfs_caller *who);

/*
 * One version of one dataset. Immutable after creation; shared by the
 * nodes and open files made from it, freed with the last reference.
 */
struct dsfs_dataset {
	atomic_int refs;
	char *name;
	char *source;
	int64_t version;
	int64_t mtime; /* registration time: the root's mtime */
	struct objstore *os; /* owned by the dataset table (dsfs.stores) */
	bool restricted; /* catalog group set */
	bool group_known; /* the group resolved to gid on this node */
	gid_t gid;
	char *group;
};

void dsfs_dataset_get(struct dsfs_dataset *d);
void dsfs_dataset_put(struct dsfs_dataset *d);
/* Whether who may read d (always true for unrestricted datasets). */
bool dsfs_dataset_allowed(const struct dsfs_dataset *d,
			  struct dsfs_caller *who);

/* A directory being listed: wraps the reply buffer of one readdir call. */
struct dsfs_dirbuf {
	fuse_req_t req;
	struct dsfs *fs;
	bool plus;
	char *buf;
	size_t size, used;
};

/*
 * Append one entry at cookie off (the offset of the next entry). For plus
 * listings, n is counted as looked up (its nlookup raised) only when the
 * entry fits. Returns 1 when the buffer is full (nothing added), else 0.
 * Either n or (ino, mode) describes the entry.
 */
int dsfs_dirbuf_add(struct dsfs_dirbuf *db, const char *name,
		    struct dsfs_node *n, fuse_ino_t ino, mode_t mode,
		    off_t off);
/* Whether an entry named name still fits (to avoid creating nodes). */
bool dsfs_dirbuf_fits(const struct dsfs_dirbuf *db, const char *name);

/*
 * A subtree's operations. Each returns 0 or -errno; the dispatcher in
 * dsfs_ops.c converts to the FUSE reply once. Hooks that modify the tree
 * (create..setattr) may be NULL: the dispatcher answers EROFS.
 */
struct dsfs_subtree {
	const char *name;
	/* Find name in dir; on success *out has its nlookup raised by one. */
	int (*lookup)(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		      struct dsfs_caller *who, struct dsfs_node **out);
	void (*stat)(struct dsfs *fs, const struct dsfs_node *n,
		     struct stat *st);
	int (*opendir)(struct dsfs *fs, struct dsfs_node *n,
		       struct dsfs_caller *who, struct fuse_file_info *fi);
	int (*readdir)(struct dsfs *fs, struct dsfs_node *n,
		       struct fuse_file_info *fi, off_t off,
		       struct dsfs_dirbuf *db);
	void (*releasedir)(struct dsfs *fs, struct dsfs_node *n,
			   struct fuse_file_info *fi);
	int (*open)(struct dsfs *fs, struct dsfs_node *n,
		    struct dsfs_caller *who, struct fuse_file_info *fi);
	/* Replies itself (data may go out as a file-descriptor buffer). */
	void (*read)(fuse_req_t req, struct dsfs *fs, struct dsfs_node *n,
		     struct fuse_file_info *fi, size_t size, off_t off);
	ssize_t (*write)(struct dsfs *fs, struct dsfs_node *n,
			 struct fuse_file_info *fi, const char *buf,
			 size_t size, off_t off);
	int (*flush)(struct dsfs *fs, struct dsfs_node *n,
		     struct fuse_file_info *fi);
	void (*release)(struct dsfs *fs, struct dsfs_node *n,
			struct fuse_file_info *fi);
	int (*setattr)(struct dsfs *fs, struct dsfs_node *n,
		       const struct stat *attr, int to_set,
		       struct fuse_file_info *fi);
	int (*create)(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		      mode_t mode, struct dsfs_caller *who,
		      struct fuse_file_info *fi, struct dsfs_node **out);
	int (*mkdir)(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		     mode_t mode, struct dsfs_caller *who,
		     struct dsfs_node **out);
	int (*unlink)(struct dsfs *fs, struct dsfs_node *dir, const char *name);
	int (*rmdir)(struct dsfs *fs, struct dsfs_node *dir, const char *name);
	int (*rename)(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		      struct dsfs_node *newdir, const char *newname,
		      unsigned flags);
	int (*fsync)(struct dsfs *fs, struct dsfs_node *n, int datasync,
		     struct fuse_file_info *fi);
	/*
	 * May who use n? mask: 0 (see its attributes), or R_OK, W_OK, X_OK
	 * as in access(2). Returns 0, -EACCES or -EROFS. NULL: all allowed
	 * but W_OK, which is EROFS.
	 */
	int (*access)(struct dsfs *fs, struct dsfs_node *n,
		      struct dsfs_caller *who, int mask);
	/* Entry and attribute timeout for nodes of this subtree, seconds. */
	double (*timeout)(struct dsfs *fs, const struct dsfs_node *n);
	/* How long the kernel may remember that a name is absent in dir. */
	double (*neg_timeout)(struct dsfs *fs, const struct dsfs_node *dir);
};

extern const struct dsfs_subtree dsfs_root_subtree;
extern const struct dsfs_subtree dsfs_datasets_subtree;
extern const struct dsfs_subtree dsfs_ckpt_subtree;
extern const struct dsfs_subtree dsfs_ctl_subtree;

enum dsfs_kind {
	DSFS_STATIC_DIR, /* root, datasets, checkpoints, .dstage */
	DSFS_CTL_FILE, /* .dstage/<file> */
	DSFS_DS_DIR, /* a directory of a dataset (its root: path "") */
	DSFS_DS_FILE, /* an object of a dataset */
};

/*
 * A node (inode). Static nodes live in struct dsfs and are never freed.
 * Dynamic ones are created by lookup/readdirplus with nlookup 1 and freed
 * when FORGET brings nlookup to 0. Every field but nlookup and the hash
 * links is immutable after creation, so a request may use the node without
 * a lock: the kernel keeps an inode alive while a request on it is running.
 */
struct dsfs_node {
	fuse_ino_t ino;
	fuse_ino_t parent; /* inode number of the parent (hash key) */
	const struct dsfs_subtree *sub;
	enum dsfs_kind kind;
	char *name; /* in the parent */
	uint64_t nlookup; /* dsfs.node_lock */
	struct dsfs_node *next_ino; /* dsfs.node_lock: ino hash chain */
	struct dsfs_node *next_name; /* dsfs.node_lock: (parent, name) chain */
	bool named; /* dsfs.node_lock: in the (parent, name) hash */

	/* Dataset subtree. */
	struct dsfs_dataset *ds; /* a reference */
	char *path; /* key of a file, path of a dir ("" for the root) */
	uint64_t size;
	int64_t mtime;
	char *etag; /* "" when the source gave none */
	atomic_bool error_logged; /* read errors are logged once per node */
};

/* Counters shown in .dstage/stats; relaxed atomics. */
struct dsfs_counters {
	atomic_ullong reads, read_bytes, splice_replies, copy_replies;
	atomic_ullong read_errors, lookups, readdirs, prefetch_lists;
	atomic_ullong prefetch_objects;
};

struct dsfs_store; /* an opened source, see dsfs_datasets.c */
struct dsfs_dsent; /* a dataset table entry, see dsfs_datasets.c */

struct dsfs {
	struct dsfs_opts *opts;
	const struct dstage_config *cfg;
	struct cache *cache;
	struct fuse_session *se;
	struct dsfs_counters ctr;

	/* Static nodes. */
	struct dsfs_node root, datasets, checkpoints, ctl, prefetch, stats;

	/*
	 * The node table: ino -> node and (parent, name) -> node, chained
	 * hashes sized to powers of two. Lock order: after ds_lock.
	 */
	pthread_mutex_t node_lock;
	struct dsfs_node **by_ino; /* node_lock */
	struct dsfs_node **by_name; /* node_lock */
	size_t nbuckets; /* node_lock */
	size_t nnodes; /* node_lock */
	fuse_ino_t next_ino; /* node_lock */

	/*
	 * The dataset table: the catalog's READY datasets, sorted by name,
	 * each with its current version. Refreshed by the poller thread
	 * every opts->poll_ms and on demand by a lookup of an unknown name.
	 * Lock order: before node_lock.
	 */
	pthread_rwlock_t ds_lock;
	struct dsfs_dsent *dsents; /* ds_lock */
	size_t ndsents; /* ds_lock */
	struct dsfs_store *stores; /* ds_lock: opened sources, by URL */
	uint64_t ds_polled_ms; /* ds_lock: last refresh, CLOCK_MONOTONIC */
	char **pending_inval; /* ds_lock: names whose entry changed */
	size_t npending; /* ds_lock */

	/* The poller thread (notifications, bdi read-ahead). */
	pthread_t poller;
	bool poller_running;
	pthread_mutex_t poll_lock; /* protects poll_stop; leaf lock */
	pthread_cond_t poll_cond;
	bool poll_stop; /* poll_lock */

	/* .dstage/prefetch: the summary of the last list; leaf lock. */
	pthread_mutex_t ctl_lock;
	char ctl_status[512]; /* ctl_lock */

	/*
	 * Every open file and directory handle a subtree handed out and the
	 * kernel has not released (dsfs_ops.c). Leaf lock.
	 */
	pthread_mutex_t handle_lock;
	struct dsfs_handle *handles; /* handle_lock: doubly linked */
};

/* fs/dsfs.c: set up and tear down struct dsfs. */
int dsfs_init(struct dsfs *fs, struct dsfs_opts *o,
	      const struct dstage_config *cfg);
void dsfs_destroy(struct dsfs *fs);

/*
 * Release what subtrees still hold for open files and directories, as
 * RELEASE and RELEASEDIR would have: the kernel sends none once the session
 * has ended (an unmount with files open, or a RELEASE still queued when a
 * signal stopped the loop). Call after the session loop, while the cache is
 * still open.
 */
void dsfs_handles_release(struct dsfs *fs);
/* Start/stop the poller; start only after the session is mounted. Stop
 * in two steps around fuse_session_unmount: request (no more kernel
 * notifications), unmount, then stop (join). */
int dsfs_poller_start(struct dsfs *fs);
void dsfs_poller_request_stop(struct dsfs *fs);
bool dsfs_poller_stopping(struct dsfs *fs);
void dsfs_poller_stop(struct dsfs *fs);

/* The calling thread's catalog connection (opened read-only on first
 * use, closed when the thread exits). NULL and *err set on failure. */
struct catalog *dsfs_catalog(struct dsfs *fs, int *err);

uint64_t dsfs_now_ms(void);

/* fs/dsfs_node.c: the node table. */
int dsfs_nodes_init(struct dsfs *fs);
void dsfs_nodes_destroy(struct dsfs *fs);
/* The node for ino, or NULL. No reference is taken (see struct). */
struct dsfs_node *dsfs_node_find(struct dsfs *fs, fuse_ino_t ino);
/*
 * Find the child (parent, name) accepted by match(), raising its nlookup,
 * or insert the node made by make() with nlookup 1 (replacing a child that
 * match() rejected in the name hash). Returns 0 or -ENOMEM.
 */
typedef bool (*dsfs_node_match_fn)(const struct dsfs_node *n, void *arg);
typedef struct dsfs_node *(*dsfs_node_make_fn)(void *arg);
int dsfs_node_get_child(struct dsfs *fs, fuse_ino_t parent, const char *name,
			dsfs_node_match_fn match, dsfs_node_make_fn make,
			void *arg, struct dsfs_node **out);
/* Raise nlookup of n (static nodes: no-op). */
void dsfs_node_ref(struct dsfs *fs, struct dsfs_node *n);
/* FORGET: drop nlookup by count; frees dynamic nodes that reach 0. */
void dsfs_node_forget(struct dsfs *fs, fuse_ino_t ino, uint64_t count);
void dsfs_node_free(struct dsfs_node *n);

/* fs/dsfs_datasets.c */
int dsfs_datasets_refresh(struct dsfs *fs);
/* Send the pending kernel invalidations (poller thread only). */
void dsfs_datasets_flush_inval(struct dsfs *fs);
void dsfs_datasets_destroy(struct dsfs *fs);
/* Current version of dataset name (a reference) or NULL. */
struct dsfs_dataset *dsfs_datasets_current(struct dsfs *fs, const char *name);
/* Attributes of a dataset-subtree entry (ds may be NULL). */
void dsfs_stat_fill(struct dsfs *fs, struct stat *st, fuse_ino_t ino, bool dir,
		    uint64_t size, int64_t mtime,
		    const struct dsfs_dataset *ds);

/* fs/dsfs_ops.c */
extern const struct fuse_lowlevel_ops dsfs_ll_ops;

#endif
