// SPDX-License-Identifier: MIT
/*
 * dsfs_node: the node (inode) table of dstagefs (see dsfs_node.h).
 *
 * State machine of a dynamic node:
 *
 *   dsfs_node_new --> UNLINKED (the subtree fills priv)
 *   UNLINKED --dsfs_nodes_insert--> LIVE (nlookup >= 1, in by_ino; in
 *                                   by_name while it is the current child)
 *   LIVE --replaced by a newer child of the same name--> LIVE, unnamed
 *          (only by_ino finds it; the kernel still holds it)
 *   LIVE --dsfs_nodes_forget to 0--> UNLINKED, handed back to be freed
 *
 * Invariants (all under dsfs_nodes.lock): a dynamic node is in by_ino iff
 * nlookup > 0; at most one node per (parent, name) is in by_name; inode
 * numbers are never reused (next_ino only grows), so a stale (parent, name)
 * key never matches a new parent. Fixed nodes live in fixed_nodes only,
 * set before the session starts and read without the lock after that.
 */
#include <errno.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string.h>

#include "dsfs_node.h"

#define DSFS_NODES_MIN_BUCKETS 1024
/* Nodes a bucket (on average) before the tables double: 2 keeps chains
 * short and the two bucket arrays at 8-16 bytes a node, not 16-32. */
#define DSFS_NODES_LOAD 2
/* Nodes forgotten between two malloc_trim calls (see dsfs_nodes_trim). */
#define DSFS_NODES_TRIM_EVERY 65536

static size_t dsfs_node_hash_ino(fuse_ino_t ino, size_t n)
{
	uint64_t h = ino * 0x9e3779b97f4a7c15ULL;

	return (size_t)(h >> 32) & (n - 1);
}

static size_t dsfs_node_hash_name(fuse_ino_t parent, const char *name, size_t n)
{
	uint64_t h = 1469598103934665603ULL ^ parent;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		h ^= *p;
		h *= 1099511628211ULL;
	}
	return (size_t)(h ^ (h >> 29)) & (n - 1);
}

int dsfs_nodes_init(struct dsfs_nodes *t)
{
	memset(t, 0, sizeof(*t));
	t->nbuckets = DSFS_NODES_MIN_BUCKETS;
	t->by_ino = calloc(t->nbuckets, sizeof(*t->by_ino));
	t->by_name = calloc(t->nbuckets, sizeof(*t->by_name));
	t->next_ino = DSFS_INO_FIRST;
	if (!t->by_ino || !t->by_name || pthread_mutex_init(&t->lock, NULL)) {
		free(t->by_ino);
		free(t->by_name);
		t->by_ino = NULL;
		t->by_name = NULL;
		return -ENOMEM;
	}
	return 0;
}

struct dsfs_node *dsfs_node_new(const struct dsfs_subtree *sub,
				const char *name, void *priv)
{
	size_t len = strlen(name);
	struct dsfs_node *n;

	if (len >= SIZE_MAX - sizeof(*n))
		return NULL;
	/* Only the name's bytes past the header, not sizeof's padding. */
	n = malloc(offsetof(struct dsfs_node, name) + len + 1);
	if (!n)
		return NULL;
	memset(n, 0, offsetof(struct dsfs_node, name));
	memcpy(n->name, name, len + 1);
	n->sub = sub;
	n->priv = priv;
	return n;
}

void dsfs_node_free(struct dsfs_node *n)
{
	free(n);
}

void dsfs_nodes_release(struct dsfs_nodes *t,
			void (*drop)(struct dsfs_node *n, void *arg), void *arg)
{
	if (!t->by_ino)
		return;
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct dsfs_node *n = t->by_ino[i];

		while (n) {
			struct dsfs_node *next = n->next_ino;

			if (drop)
				drop(n, arg);
			dsfs_node_free(n);
			n = next;
		}
	}
	for (size_t i = 0; i < DSFS_INO_FIRST; i++) {
		if (t->fixed_nodes[i] && drop)
			drop(t->fixed_nodes[i], arg);
		dsfs_node_free(t->fixed_nodes[i]);
		t->fixed_nodes[i] = NULL;
	}
	free(t->by_ino);
	free(t->by_name);
	t->by_ino = NULL;
	t->by_name = NULL;
	pthread_mutex_destroy(&t->lock);
}

int dsfs_nodes_add_fixed(struct dsfs_nodes *t, fuse_ino_t ino,
			 fuse_ino_t parent, const struct dsfs_subtree *sub,
			 const char *name, void *priv)
{
	struct dsfs_node *n;

	if (ino == 0 || ino >= DSFS_INO_FIRST || t->fixed_nodes[ino])
		return -EINVAL;
	n = dsfs_node_new(sub, name, priv);
	if (!n)
		return -ENOMEM;
	n->ino = ino;
	n->parent = parent;
	n->fixed = true;
	n->nlookup = 1;
	t->fixed_nodes[ino] = n;
	return 0;
}

/* Double the buckets when the table is full (DSFS_NODES_LOAD). Called
 * with t->lock. */
static void dsfs_nodes_grow(struct dsfs_nodes *t)
{
	size_t n = t->nbuckets * 2;
	struct dsfs_node **bi = calloc(n, sizeof(*bi));
	struct dsfs_node **bn = calloc(n, sizeof(*bn));

	if (!bi || !bn) {
		/* Stay at the old size: slower chains, still correct. */
		free(bi);
		free(bn);
		return;
	}
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct dsfs_node *x = t->by_ino[i];

		while (x) {
			struct dsfs_node *next = x->next_ino;
			size_t h = dsfs_node_hash_ino(x->ino, n);

			x->next_ino = bi[h];
			bi[h] = x;
			x = next;
		}
		x = t->by_name[i];
		while (x) {
			struct dsfs_node *next = x->next_name;
			size_t h = dsfs_node_hash_name(x->parent, x->name, n);

			x->next_name = bn[h];
			bn[h] = x;
			x = next;
		}
	}
	free(t->by_ino);
	free(t->by_name);
	t->by_ino = bi;
	t->by_name = bn;
	t->nbuckets = n;
}

struct dsfs_node *dsfs_nodes_find(struct dsfs_nodes *t, fuse_ino_t ino)
{
	struct dsfs_node *n;

	if (ino < DSFS_INO_FIRST)
		return t->fixed_nodes[ino];
	pthread_mutex_lock(&t->lock);
	n = t->by_ino[dsfs_node_hash_ino(ino, t->nbuckets)];
	while (n && n->ino != ino)
		n = n->next_ino;
	pthread_mutex_unlock(&t->lock);
	return n;
}

void dsfs_nodes_ref(struct dsfs_nodes *t, struct dsfs_node *n)
{
	if (n->fixed)
		return;
	pthread_mutex_lock(&t->lock);
	n->nlookup++;
	pthread_mutex_unlock(&t->lock);
}

/* The named child (parent, name). Called with t->lock. */
static struct dsfs_node *dsfs_nodes_named(struct dsfs_nodes *t,
					  fuse_ino_t parent, const char *name)
{
	struct dsfs_node *n;

	n = t->by_name[dsfs_node_hash_name(parent, name, t->nbuckets)];
	while (n && (n->parent != parent || strcmp(n->name, name) != 0))
		n = n->next_name;
	return n;
}

/* Remove n from the name hash. Called with t->lock. */
static void dsfs_nodes_unname(struct dsfs_nodes *t, struct dsfs_node *n)
{
	struct dsfs_node **pp;

	if (!n->named)
		return;
	pp = &t->by_name[dsfs_node_hash_name(n->parent, n->name, t->nbuckets)];
	while (*pp && *pp != n)
		pp = &(*pp)->next_name;
	if (*pp)
		*pp = n->next_name;
	n->next_name = NULL;
	n->named = false;
}

struct dsfs_node *
dsfs_nodes_find_child(struct dsfs_nodes *t, fuse_ino_t parent, const char *name,
		      bool (*match)(const struct dsfs_node *n, void *arg),
		      void *arg)
{
	struct dsfs_node *n;

	pthread_mutex_lock(&t->lock);
	n = dsfs_nodes_named(t, parent, name);
	if (n && match(n, arg))
		n->nlookup++;
	else
		n = NULL;
	pthread_mutex_unlock(&t->lock);
	return n;
}

int dsfs_nodes_insert(struct dsfs_nodes *t, fuse_ino_t parent,
		      struct dsfs_node *n,
		      bool (*match)(const struct dsfs_node *n, void *arg),
		      void *arg, struct dsfs_node **out)
{
	struct dsfs_node *old;
	size_t h;

	pthread_mutex_lock(&t->lock);
	old = dsfs_nodes_named(t, parent, n->name);
	if (old && match(old, arg)) {
		/* Someone else inserted the same child meanwhile. */
		old->nlookup++;
		pthread_mutex_unlock(&t->lock);
		*out = old;
		return 1;
	}
	if (old)
		dsfs_nodes_unname(t, old);
	if (t->nnodes >= DSFS_NODES_LOAD * t->nbuckets)
		dsfs_nodes_grow(t);
	n->parent = parent;
	n->ino = t->next_ino++;
	n->nlookup = 1;
	h = dsfs_node_hash_ino(n->ino, t->nbuckets);
	n->next_ino = t->by_ino[h];
	t->by_ino[h] = n;
	h = dsfs_node_hash_name(parent, n->name, t->nbuckets);
	n->next_name = t->by_name[h];
	t->by_name[h] = n;
	n->named = true;
	t->nnodes++;
	pthread_mutex_unlock(&t->lock);
	*out = n;
	return 0;
}

struct dsfs_node *dsfs_nodes_forget(struct dsfs_nodes *t, fuse_ino_t ino,
				    uint64_t count)
{
	struct dsfs_node **pp, *n;

	if (ino < DSFS_INO_FIRST)
		return NULL;
	pthread_mutex_lock(&t->lock);
	pp = &t->by_ino[dsfs_node_hash_ino(ino, t->nbuckets)];
	while (*pp && (*pp)->ino != ino)
		pp = &(*pp)->next_ino;
	n = *pp;
	if (!n) {
		pthread_mutex_unlock(&t->lock);
		return NULL;
	}
	n->nlookup = count >= n->nlookup ? 0 : n->nlookup - count;
	if (n->nlookup) {
		pthread_mutex_unlock(&t->lock);
		return NULL;
	}
	*pp = n->next_ino;
	n->next_ino = NULL;
	dsfs_nodes_unname(t, n);
	t->nnodes--;
	t->nforgotten++;
	pthread_mutex_unlock(&t->lock);
	return n;
}

void dsfs_nodes_trim(struct dsfs_nodes *t)
{
	bool due;

	pthread_mutex_lock(&t->lock);
	due = t->nforgotten >= DSFS_NODES_TRIM_EVERY;
	if (due)
		t->nforgotten = 0;
	pthread_mutex_unlock(&t->lock);
#ifdef __GLIBC__
	/* Outside the lock: it walks every arena's free lists. */
	if (due)
		malloc_trim(0);
#endif
}
