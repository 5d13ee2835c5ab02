// SPDX-License-Identifier: MIT
/*
 * dsfs_node: the node (inode) table of dstagefs.
 *
 * State machine of a dynamic node:
 *
 *   made by lookup/readdirplus --> LIVE (nlookup >= 1, in by_ino;
 *                                  in by_name while it is the current child)
 *   LIVE --FORGET to 0--> freed (removed from both hashes)
 *   LIVE --replaced by a newer child of the same name--> LIVE, unnamed
 *          (only by_ino finds it; the kernel still holds it)
 *
 * Invariants (all under dsfs.node_lock): a node is in by_ino iff nlookup > 0;
 * at most one node per (parent, name) is in by_name; inode numbers are never
 * reused (next_ino only grows), so a stale (parent, name) key never matches
 * a new parent. Static nodes are never in the table.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dsfs.h"

#define DSFS_NODES_MIN_BUCKETS 1024

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

int dsfs_nodes_init(struct dsfs *fs)
{
	fs->nbuckets = DSFS_NODES_MIN_BUCKETS;
	fs->by_ino = calloc(fs->nbuckets, sizeof(*fs->by_ino));
	fs->by_name = calloc(fs->nbuckets, sizeof(*fs->by_name));
	fs->next_ino = DSFS_INO_FIRST;
	if (!fs->by_ino || !fs->by_name) {
		free(fs->by_ino);
		free(fs->by_name);
		fs->by_ino = NULL;
		fs->by_name = NULL;
		return -ENOMEM;
	}
	return pthread_mutex_init(&fs->node_lock, NULL) ? -ENOMEM : 0;
}

void dsfs_node_free(struct dsfs_node *n)
{
	if (!n)
		return;
	if (n->ds)
		dsfs_dataset_put(n->ds);
	free(n->name);
	free(n->path);
	free(n->etag);
	free(n);
}

void dsfs_nodes_destroy(struct dsfs *fs)
{
	if (!fs->by_ino)
		return;
	for (size_t i = 0; i < fs->nbuckets; i++) {
		struct dsfs_node *n = fs->by_ino[i];

		while (n) {
			struct dsfs_node *next = n->next_ino;

			dsfs_node_free(n);
			n = next;
		}
	}
	free(fs->by_ino);
	free(fs->by_name);
	fs->by_ino = NULL;
	fs->by_name = NULL;
	pthread_mutex_destroy(&fs->node_lock);
}

/* Double the buckets when the table is full. Called with node_lock. */
static void dsfs_nodes_grow(struct dsfs *fs)
{
	size_t n = fs->nbuckets * 2;
	struct dsfs_node **bi = calloc(n, sizeof(*bi));
	struct dsfs_node **bn = calloc(n, sizeof(*bn));

	if (!bi || !bn) {
		/* Stay at the old size: slower chains, still correct. */
		free(bi);
		free(bn);
		return;
	}
	for (size_t i = 0; i < fs->nbuckets; i++) {
		struct dsfs_node *x = fs->by_ino[i];

		while (x) {
			struct dsfs_node *next = x->next_ino;
			size_t h = dsfs_node_hash_ino(x->ino, n);

			x->next_ino = bi[h];
			bi[h] = x;
			x = next;
		}
		x = fs->by_name[i];
		while (x) {
			struct dsfs_node *next = x->next_name;
			size_t h = dsfs_node_hash_name(x->parent, x->name, n);

			x->next_name = bn[h];
			bn[h] = x;
			x = next;
		}
	}
	free(fs->by_ino);
	free(fs->by_name);
	fs->by_ino = bi;
	fs->by_name = bn;
	fs->nbuckets = n;
}

static struct dsfs_node *dsfs_node_static(struct dsfs *fs, fuse_ino_t ino)
{
	switch (ino) {
	case DSFS_INO_ROOT:
		return &fs->root;
	case DSFS_INO_DATASETS:
		return &fs->datasets;
	case DSFS_INO_CHECKPOINTS:
		return &fs->checkpoints;
	case DSFS_INO_CTL:
		return &fs->ctl;
	case DSFS_INO_PREFETCH:
		return &fs->prefetch;
	case DSFS_INO_STATS:
		return &fs->stats;
	default:
		return NULL;
	}
}

struct dsfs_node *dsfs_node_find(struct dsfs *fs, fuse_ino_t ino)
{
	struct dsfs_node *n;

	if (ino < DSFS_INO_FIRST)
		return dsfs_node_static(fs, ino);
	pthread_mutex_lock(&fs->node_lock);
	n = fs->by_ino[dsfs_node_hash_ino(ino, fs->nbuckets)];
	while (n && n->ino != ino)
		n = n->next_ino;
	pthread_mutex_unlock(&fs->node_lock);
	return n;
}

/* Remove n from the name hash. Called with node_lock. */
static void dsfs_node_unname(struct dsfs *fs, struct dsfs_node *n)
{
	struct dsfs_node **pp;

	if (!n->named)
		return;
	pp = &fs->by_name[dsfs_node_hash_name(n->parent, n->name,
					      fs->nbuckets)];
	while (*pp && *pp != n)
		pp = &(*pp)->next_name;
	if (*pp)
		*pp = n->next_name;
	n->next_name = NULL;
	n->named = false;
}

int dsfs_node_get_child(struct dsfs *fs, fuse_ino_t parent, const char *name,
			dsfs_node_match_fn match, dsfs_node_make_fn make,
			void *arg, struct dsfs_node **out)
{
	struct dsfs_node *n, *old = NULL;
	size_t h;

	pthread_mutex_lock(&fs->node_lock);
	h = dsfs_node_hash_name(parent, name, fs->nbuckets);
	for (n = fs->by_name[h]; n; n = n->next_name)
		if (n->parent == parent && strcmp(n->name, name) == 0)
			break;
	if (n && match(n, arg)) {
		n->nlookup++;
		pthread_mutex_unlock(&fs->node_lock);
		*out = n;
		return 0;
	}
	old = n;
	pthread_mutex_unlock(&fs->node_lock);

	/* Build outside the lock; another thread may race us, see below. */
	n = make(arg);
	if (!n)
		return -ENOMEM;
	n->parent = parent;

	pthread_mutex_lock(&fs->node_lock);
	h = dsfs_node_hash_name(parent, name, fs->nbuckets);
	for (old = fs->by_name[h]; old; old = old->next_name)
		if (old->parent == parent && strcmp(old->name, name) == 0)
			break;
	if (old && match(old, arg)) {
		/* Someone else inserted the same child meanwhile. */
		old->nlookup++;
		pthread_mutex_unlock(&fs->node_lock);
		dsfs_node_free(n);
		*out = old;
		return 0;
	}
	if (old)
		dsfs_node_unname(fs, old);
	if (fs->nnodes >= fs->nbuckets)
		dsfs_nodes_grow(fs);
	n->ino = fs->next_ino++;
	n->nlookup = 1;
	h = dsfs_node_hash_ino(n->ino, fs->nbuckets);
	n->next_ino = fs->by_ino[h];
	fs->by_ino[h] = n;
	h = dsfs_node_hash_name(parent, n->name, fs->nbuckets);
	n->next_name = fs->by_name[h];
	fs->by_name[h] = n;
	n->named = true;
	fs->nnodes++;
	pthread_mutex_unlock(&fs->node_lock);
	*out = n;
	return 0;
}

void dsfs_node_ref(struct dsfs *fs, struct dsfs_node *n)
{
	if (n->ino < DSFS_INO_FIRST)
		return;
	pthread_mutex_lock(&fs->node_lock);
	n->nlookup++;
	pthread_mutex_unlock(&fs->node_lock);
}

void dsfs_node_forget(struct dsfs *fs, fuse_ino_t ino, uint64_t count)
{
	struct dsfs_node **pp, *n;

	if (ino < DSFS_INO_FIRST)
		return;
	pthread_mutex_lock(&fs->node_lock);
	pp = &fs->by_ino[dsfs_node_hash_ino(ino, fs->nbuckets)];
	while (*pp && (*pp)->ino != ino)
		pp = &(*pp)->next_ino;
	n = *pp;
	if (!n) {
		pthread_mutex_unlock(&fs->node_lock);
		return;
	}
	n->nlookup = count >= n->nlookup ? 0 : n->nlookup - count;
	if (n->nlookup) {
		pthread_mutex_unlock(&fs->node_lock);
		return;
	}
	*pp = n->next_ino;
	dsfs_node_unname(fs, n);
	fs->nnodes--;
	pthread_mutex_unlock(&fs->node_lock);
	dsfs_node_free(n);
}
