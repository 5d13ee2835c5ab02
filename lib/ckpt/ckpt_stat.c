// SPDX-License-Identifier: MIT
/*
 * ckpt_stat: what a key is (part of the ckpt module, see ckpt_i.h).
 *
 * The local copy (staging_dir/tree/<key>) when this node has one it should
 * serve (being written, waiting to be published, or a clean copy whose ETag
 * still matches the store's), else the store's object, else a directory
 * when the store has keys under "<key>/" or the tree has the directory. A
 * clean local copy the store replaced or removed (another node wrote the
 * name) is dropped when met. Stateless apart from what it drops, and the
 * negative lookups: up to CKPT_NEG_MAX keys found missing, each with its
 * expiry, under ck->neg_lock (a leaf); neg_gen counts the names this node
 * added, so a miss seen before one is never remembered after it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/log.h"

/* Drop key's clean local copy (the store has another or none). */
static void ckpt_drop_local(struct ckpt *ck, const char *key,
			    const struct stat *st)
{
	struct ckpt_ent *e;

	pthread_mutex_lock(&ck->open_lock);
	pthread_mutex_lock(&ck->lock);
	e = ckpt_ent_find_locked(ck, key);
	if (e)
		e->refs--;
	pthread_mutex_unlock(&ck->lock);
	if (!e && !unlinkat(ck->dirs.tree_fd, key, 0)) {
		ckpt_journal_remove(&ck->dirs, st->st_ino);
		ckpt_space(ck, st->st_uid, -(int64_t)st->st_size);
		ckpt_files(ck, st->st_uid, -1);
		log_debug("checkpoints: %s changed in the store: local copy "
			  "dropped",
			  key);
	}
	pthread_mutex_unlock(&ck->open_lock);
}

/*
 * Whether key's local copy is what to serve: 1 (st is it), or 0 (none, or
 * a stale clean copy, dropped). *head is 1 when no HEAD was sent, else its
 * result with *oi filled on 0.
 */
static int ckpt_local(struct ckpt *ck, const char *key, struct stat *st,
		      struct objstore_info *oi, int *head)
{
	struct ckpt_rec rec;
	struct ckpt_ent *e;

	*head = 1;
	if (fstatat(ck->dirs.tree_fd, ckpt_tpath(key), st, AT_SYMLINK_NOFOLLOW))
		return 0;
	if (S_ISDIR(st->st_mode))
		return 1;
	if (!S_ISREG(st->st_mode))
		return 0;
	pthread_mutex_lock(&ck->lock);
	e = ckpt_ent_find_locked(ck, key);
	if (e)
		e->refs--; /* only asking: no reference kept */
	pthread_mutex_unlock(&ck->lock);
	if (e)
		return 1;
	if (ckpt_journal_read(&ck->dirs, st->st_ino, &rec) || rec.state != 'C')
		return 1; /* written here, not published yet */
	*head = objstore_head(ck->os, key, oi);
	if (!*head && strcmp(oi->etag, rec.etag) == 0)
		return 1;
	if (!*head || *head == -ENOENT) {
		ckpt_drop_local(ck, key, st);
		return 0;
	}
	return 1; /* the store cannot say: the local copy stands */
}

static int ckpt_first_cb(void *arg, const struct objstore_info *oi)
{
	(void)arg;
	(void)oi;
	return 1;
}

/* Whether the store has keys under "key/": 1, 0 or -errno. */
int ckpt_store_has_dir(struct ckpt *ck, const char *key)
{
	char *prefix = ckpt_key_join(key, "");
	int ret;

	if (!prefix)
		return -ENOMEM;
	ret = objstore_list(ck->os, prefix, ckpt_first_cb, NULL);
	free(prefix);
	if (ret == 1)
		return 1;
	if (ret == 0 || ret == -ENOENT || ret == -ENOTDIR)
		return 0;
	return ckpt_store_errno(ret);
}

int ckpt_stat(struct ckpt *ck, const char *key, struct ckpt_attr *a)
{
	struct objstore_info oi;
	struct stat st;
	int head, ret;

	memset(a, 0, sizeof(*a));
	ret = ckpt_key_ok(key);
	if (ret)
		return ret;
	if (!*key) {
		a->dir = true;
		a->local = true;
		if (!fstat(ck->dirs.tree_fd, &st))
			a->mtime = st.st_mtim.tv_sec;
		return 0;
	}
	if (ckpt_local(ck, key, &st, &oi, &head)) {
		a->dir = S_ISDIR(st.st_mode);
		a->size = a->dir ? 0 : (uint64_t)st.st_size;
		a->mtime = st.st_mtim.tv_sec;
		a->local = true;
		return 0;
	}
	if (head == 1)
		head = objstore_head(ck->os, key, &oi);
	if (!head) {
		a->size = oi.size;
		a->mtime = oi.mtime;
		return 0;
	}
	if (head != -ENOENT && head != -ENOTDIR && head != -EISDIR &&
	    head != -EINVAL)
		return ckpt_store_errno(head);
	ret = ckpt_store_has_dir(ck, key);
	if (ret < 0)
		return ret;
	if (!ret)
		return -ENOENT;
	a->dir = true;
	return 0;
}

/* The parent of key (malloc'd: "" for a top-level name). */
static char *ckpt_parent(const char *key)
{
	const char *slash = strrchr(key, '/');

	return strndup(key, slash ? (size_t)(slash - key) : 0);
}

int ckpt_parent_dir(struct ckpt *ck, const char *key)
{
	struct ckpt_attr a;
	char *parent = ckpt_parent(key);
	int ret;

	if (!parent)
		return -ENOMEM;
	ret = ckpt_stat(ck, parent, &a);
	free(parent);
	if (!ret && !a.dir)
		ret = -ENOTDIR;
	return ret;
}

/* ---- negative lookups ---- */

uint64_t ckpt_neg_gen(struct ckpt *ck)
{
	uint64_t g;

	pthread_mutex_lock(&ck->neg_lock);
	g = ck->neg_gen;
	pthread_mutex_unlock(&ck->neg_lock);
	return g;
}

void ckpt_neg_add(struct ckpt *ck, const char *key, unsigned ttl_ms,
		  uint64_t gen)
{
	int64_t now = timeutil_mono_ms();
	struct ckpt_neg *slot = NULL;
	char *copy;

	if (!ttl_ms)
		return;
	copy = strdup(key);
	if (!copy)
		return;
	pthread_mutex_lock(&ck->neg_lock);
	if (gen != ck->neg_gen) {
		pthread_mutex_unlock(&ck->neg_lock);
		free(copy);
		return;
	}
	for (unsigned i = 0; i < CKPT_NEG_MAX && !slot; i++) {
		struct ckpt_neg *n = &ck->neg[i];

		if (!n->key || n->until_ms <= now || !strcmp(n->key, key))
			slot = n;
	}
	if (!slot)
		slot = &ck->neg[ck->neg_next++ % CKPT_NEG_MAX];
	free(slot->key);
	slot->key = copy;
	slot->until_ms = now + ttl_ms;
	pthread_mutex_unlock(&ck->neg_lock);
}

bool ckpt_neg_find(struct ckpt *ck, const char *key)
{
	int64_t now = timeutil_mono_ms();
	bool found = false;

	pthread_mutex_lock(&ck->neg_lock);
	for (unsigned i = 0; i < CKPT_NEG_MAX && !found; i++) {
		struct ckpt_neg *n = &ck->neg[i];

		found = n->key && n->until_ms > now && !strcmp(n->key, key);
	}
	pthread_mutex_unlock(&ck->neg_lock);
	return found;
}

void ckpt_neg_clear(struct ckpt *ck)
{
	pthread_mutex_lock(&ck->neg_lock);
	ck->neg_gen++;
	for (unsigned i = 0; i < CKPT_NEG_MAX; i++) {
		free(ck->neg[i].key);
		ck->neg[i].key = NULL;
	}
	pthread_mutex_unlock(&ck->neg_lock);
}
