/* SPDX-License-Identifier: MIT */
/*
 * dsfs_node: the generic node (inode) of dstagefs and the node table
 * (a service: it calls nothing else in fs/).
 *
 * A node says which subtree serves it (sub) and carries that subtree's
 * private data (priv); the node table knows nothing about either. Fixed
 * nodes (inode numbers below DSFS_INO_FIRST: the tops of the subtrees and
 * the control files) are registered once by their subtree's init and freed
 * with the table. Dynamic nodes are made by a subtree's lookup (or
 * readdirplus, create, mkdir...) with nlookup 1 and unlinked from the table
 * when FORGET brings nlookup to 0; the caller of dsfs_nodes_forget then
 * lets the subtree release priv and frees the node.
 *
 * What may change in a node, and what protects it:
 *   ino, parent, name, sub, fixed   never change after the node is made
 *   priv (the pointer)              never changes; what it points to is the
 *                                   subtree's, which documents its locks
 *                                   (a growing file keeps its size there)
 *   nlookup, next_ino, next_name,   dsfs_nodes.lock
 *   named
 * A request may use a node without a lock until it has replied: the
 * kernel keeps an inode alive (does not FORGET it) until then. Past its
 * reply a request may still be running (the writev that sends it returns
 * after the kernel has woken the caller, who may close and drop the
 * inode): an open handle pins its node (dsfs_nodes_ref, one nlookup of
 * its own, dropped like a FORGET of 1), so what runs on a handle may use
 * its node until it lets the handle go (dsfs_ops.c).
 */
#ifndef DSFS_NODE_H
#define DSFS_NODE_H

#define FUSE_USE_VERSION 314

#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dsfs_subtree;

enum {
	DSFS_INO_ROOT = FUSE_ROOT_ID,
	DSFS_INO_DATASETS = 2,
	DSFS_INO_CHECKPOINTS = 3,
	DSFS_INO_CTL = 4,
	DSFS_INO_PREFETCH = 5,
	DSFS_INO_STATS = 6,
	DSFS_INO_FIRST = 16, /* first dynamic inode number */
};

struct dsfs_node {
	fuse_ino_t ino;
	fuse_ino_t parent; /* inode number of the parent (hash key) */
	const struct dsfs_subtree *sub;
	void *priv; /* the subtree's */
	uint64_t nlookup; /* nodes.lock */
	struct dsfs_node *next_ino; /* nodes.lock: ino hash chain */
	struct dsfs_node *next_name; /* nodes.lock: (parent, name) chain */
	bool fixed; /* registered with dsfs_nodes_add_fixed */
	bool named; /* nodes.lock: in the (parent, name) hash */
	/* In the parent, stored in the node's own allocation: one malloc a
	 * node, about 60 bytes plus the name (a million looked-up names
	 * are held until the kernel forgets them). */
	char name[];
};

/*
 * The table: ino -> node and (parent, name) -> node, chained hashes sized
 * to powers of two. lock is taken after the dataset table's lock and
 * before nothing else; it is never held across a call out of this module.
 */
struct dsfs_nodes {
	pthread_mutex_t lock;
	struct dsfs_node *fixed_nodes[DSFS_INO_FIRST]; /* set at init only */
	struct dsfs_node **by_ino; /* lock */
	struct dsfs_node **by_name; /* lock */
	size_t nbuckets; /* lock */
	size_t nnodes; /* lock */
	fuse_ino_t next_ino; /* lock: only grows, numbers are never reused */
	size_t nforgotten; /* lock: nodes forgotten since the last trim */
};

/* Returns 0 or -ENOMEM. */
int dsfs_nodes_init(struct dsfs_nodes *t);
/* Free every node, calling drop(n, arg) first for each (may be NULL).
 * Accepts a table that was never initialised (zeroed). */
void dsfs_nodes_release(struct dsfs_nodes *t,
			void (*drop)(struct dsfs_node *n, void *arg),
			void *arg);

/* A new, unlinked node of sub named name (copied). NULL: out of memory. */
struct dsfs_node *dsfs_node_new(const struct dsfs_subtree *sub,
				const char *name, void *priv);
/* Free a node that is not in the table (or was unlinked from it); the
 * subtree has released priv. Accepts NULL. */
void dsfs_node_free(struct dsfs_node *n);

/* Register a fixed node at ino (< DSFS_INO_FIRST). Returns 0, -EINVAL
 * (bad or taken number) or -ENOMEM. */
int dsfs_nodes_add_fixed(struct dsfs_nodes *t, fuse_ino_t ino,
			 fuse_ino_t parent, const struct dsfs_subtree *sub,
			 const char *name, void *priv);

/* Raise n's nlookup by one (a pin that an unref of 1 drops); no-op on
 * fixed nodes. n must be live (nlookup > 0). */
void dsfs_nodes_ref(struct dsfs_nodes *t, struct dsfs_node *n);

/* The node for ino, or NULL. No reference is taken (see above). */
struct dsfs_node *dsfs_nodes_find(struct dsfs_nodes *t, fuse_ino_t ino);

/*
 * The current child (parent, name) if match(n, arg) accepts it, with its
 * nlookup raised by one; else NULL.
 */
struct dsfs_node *
dsfs_nodes_find_child(struct dsfs_nodes *t, fuse_ino_t parent, const char *name,
		      bool (*match)(const struct dsfs_node *n, void *arg),
		      void *arg);

/*
 * Insert n (from dsfs_node_new) as the child (parent, n->name) with
 * nlookup 1 and a new inode number, replacing in the name hash a child
 * that match() rejects. If another thread inserted a child match() accepts
 * meanwhile, that one is returned in *out with nlookup raised, and the
 * function returns 1: the caller frees n (and its priv). Else *out = n and
 * 0.
 */
int dsfs_nodes_insert(struct dsfs_nodes *t, fuse_ino_t parent,
		      struct dsfs_node *n,
		      bool (*match)(const struct dsfs_node *n, void *arg),
		      void *arg, struct dsfs_node **out);

/*
 * FORGET: drop nlookup of ino by count. A dynamic node that reaches 0 is
 * unlinked and returned: the caller lets its subtree release priv and
 * frees it. Otherwise (fixed, unknown or still referenced) NULL.
 */
struct dsfs_node *dsfs_nodes_forget(struct dsfs_nodes *t, fuse_ino_t ino,
				    uint64_t count);

/*
 * After the caller has freed what FORGETs handed back: once
 * DSFS_NODES_TRIM_EVERY nodes have been forgotten since the last time,
 * give the heap's free pages back to the system (malloc_trim; glibc keeps
 * them otherwise, so the resident set never shrank after the kernel
 * dropped its inodes). Cheap otherwise: call it after every FORGET.
 */
void dsfs_nodes_trim(struct dsfs_nodes *t);

#endif
