// SPDX-License-Identifier: MIT
/*
 * ckpt_quota: checkpoints.uid_store_size, the bytes of checkpoint files one
 * uid may hold in the store as this node knows them (part of the ckpt
 * module; see ckpt_i.h for the lock order). No store listing: a uid's
 * count is
 *   pub_bytes  the sizes of the files it published through this node and
 *              this node has not seen removed since (ck->pubs, one row a
 *              key: a file replacing another of the same key counts once)
 *   wip_bytes  what the files it writes now add: each open entry written
 *              or truncated since its last publish counts its size less
 *              the size of the published version it replaces (uid's own).
 * At open, ck->pubs is filled from the catalog's checkpoint_files (the
 * census hook: rows with an owner, schema 10). Not counted: files other
 * nodes published; files closed unpublished (waiting for a retry) until
 * they are published; the stager daemon's retry publishes until the next
 * open. Files removed from the store by anything but this node count
 * until this node unlinks or replaces them. uid 0 counts, with no bound
 * (as uid_staging_size). All under ck->lock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_i.h"
#include "dstage/grow.h"
#include "dstage/log.h"

/* Whether key is k or below the directory k. */
static bool ckpt_key_under(const char *key, const char *k)
{
	size_t n = strlen(k);

	return !strncmp(key, k, n) && (key[n] == '\0' || key[n] == '/');
}

static struct ckpt_pub *ckpt_pub_find_locked(struct ckpt *ck, const char *key)
{
	for (size_t i = 0; i < ck->n_pubs; i++)
		if (!strcmp(ck->pubs[i].key, key))
			return &ck->pubs[i];
	return NULL;
}

/* Drop ck->pubs[i] and its bytes from its owner's count. */
static void ckpt_pub_drop_locked(struct ckpt *ck, size_t i)
{
	struct ckpt_uid_use *u = ckpt_uid_locked(ck, ck->pubs[i].uid);
	uint64_t size = ck->pubs[i].size;

	if (u)
		u->pub_bytes -= size < u->pub_bytes ? size : u->pub_bytes;
	free(ck->pubs[i].key);
	ck->pubs[i] = ck->pubs[--ck->n_pubs];
}

/* The published size of key when it is uid's, else 0. */
static uint64_t ckpt_pub_base_locked(struct ckpt *ck, const char *key,
				     uid_t uid)
{
	struct ckpt_pub *p = ckpt_pub_find_locked(ck, key);

	return p && p->uid == uid ? p->size : 0;
}

int ckpt_store_charge(struct ckpt *ck, struct ckpt_ent *e, uint64_t old,
		      uint64_t size, bool check)
{
	struct ckpt_uid_use *u;
	int ret = 0;

	pthread_mutex_lock(&ck->lock);
	u = ckpt_uid_locked(ck, e->uid);
	if (!u)
		goto out;
	if (!e->store_on) {
		e->store_on = true;
		e->store_base =
			e->unlinked ? 0
				    : ckpt_pub_base_locked(ck, e->key, e->uid);
		e->store_size = old;
		u->wip_bytes += (int64_t)old - (int64_t)e->store_base;
	}
	if (check && size > e->store_size && e->uid != 0 && ck->uid_store) {
		int64_t held = (int64_t)u->pub_bytes + u->wip_bytes;

		if (held + (int64_t)(size - e->store_size) >
		    (int64_t)ck->uid_store) {
			ckpt_uid_log_what_locked(
				ck, e->uid, "uid_store_size", ck->uid_store,
				"bytes",
				"published through this node or "
				"being written",
				ckpt_url(ck));
			ret = -EDQUOT;
			goto out;
		}
	}
	u->wip_bytes += (int64_t)size - (int64_t)e->store_size;
	e->store_size = size;
out:
	pthread_mutex_unlock(&ck->lock);
	return ret;
}

void ckpt_store_uncharge_locked(struct ckpt *ck, struct ckpt_ent *e)
{
	struct ckpt_uid_use *u;

	if (!e->store_on)
		return;
	e->store_on = false;
	u = ckpt_uid_locked(ck, e->uid);
	if (u)
		u->wip_bytes -= (int64_t)e->store_size - (int64_t)e->store_base;
}

void ckpt_store_published(struct ckpt *ck, struct ckpt_ent *e, const char *key,
			  uid_t uid, uint64_t size)
{
	struct ckpt_uid_use *u;
	struct ckpt_pub *p;
	char *k;

	pthread_mutex_lock(&ck->lock);
	if (e)
		ckpt_store_uncharge_locked(ck, e);
	p = ckpt_pub_find_locked(ck, key);
	if (p)
		ckpt_pub_drop_locked(ck, (size_t)(p - ck->pubs));
	if (GROW_ONE(ck->pubs, ck->n_pubs, ck->cap_pubs, 64))
		goto out;
	k = strdup(key);
	u = ckpt_uid_locked(ck, uid);
	if (!k || !u) { /* not counted (as past CKPT_UIDS_MAX) */
		free(k);
		goto out;
	}
	ck->pubs[ck->n_pubs++] = (struct ckpt_pub){ k, uid, size };
	u->pub_bytes += size;
out:
	pthread_mutex_unlock(&ck->lock);
}

void ckpt_store_forget(struct ckpt *ck, const char *key)
{
	pthread_mutex_lock(&ck->lock);
	for (size_t i = 0; i < ck->n_pubs;) {
		if (ckpt_key_under(ck->pubs[i].key, key))
			ckpt_pub_drop_locked(ck, i);
		else
			i++;
	}
	pthread_mutex_unlock(&ck->lock);
}

void ckpt_store_renamed(struct ckpt *ck, const char *from, const char *to)
{
	size_t nf = strlen(from), nt = strlen(to);

	if (!strcmp(from, to))
		return;
	ckpt_store_forget(ck, to);
	pthread_mutex_lock(&ck->lock);
	for (size_t i = 0; i < ck->n_pubs; i++) {
		struct ckpt_pub *p = &ck->pubs[i];
		size_t rest;
		char *k;

		if (!ckpt_key_under(p->key, from))
			continue;
		rest = strlen(p->key) - nf;
		k = malloc(nt + rest + 1);
		if (!k)
			continue; /* counted under its old name */
		memcpy(k, to, nt);
		memcpy(k + nt, p->key + nf, rest + 1);
		free(p->key);
		p->key = k;
	}
	pthread_mutex_unlock(&ck->lock);
}

/* One file of the census, appended (its rows are one a key). */
static void ckpt_store_census_add(void *ctx, const char *key, uid_t uid,
				  uint64_t size)
{
	struct ckpt *ck = ctx;
	struct ckpt_uid_use *u;
	char *k;

	if (GROW_ONE(ck->pubs, ck->n_pubs, ck->cap_pubs, 64))
		return;
	u = ckpt_uid_locked(ck, uid);
	k = u ? strdup(key) : NULL;
	if (!k)
		return;
	ck->pubs[ck->n_pubs++] = (struct ckpt_pub){ k, uid, size };
	u->pub_bytes += size;
}

void ckpt_store_census(struct ckpt *ck)
{
	int ret;

	if (!ck->hooks.census)
		return;
	pthread_mutex_lock(&ck->lock);
	ret = ck->hooks.census(ck->hooks.arg, ckpt_url(ck),
			       ckpt_store_census_add, ck);
	pthread_mutex_unlock(&ck->lock);
	if (ret)
		log_warn("checkpoints: cannot read the catalog's record of the "
			 "files this node published to %s: %s; "
			 "checkpoints.uid_store_size counts only what it "
			 "publishes from now on",
			 ckpt_url(ck), strerror(-ret));
}

void ckpt_store_free(struct ckpt *ck)
{
	for (size_t i = 0; i < ck->n_pubs; i++)
		free(ck->pubs[i].key);
	free(ck->pubs);
	ck->pubs = NULL;
	ck->n_pubs = ck->cap_pubs = 0;
}
