// SPDX-License-Identifier: MIT
/*
 * ckpt_rename: removing and renaming checkpoint files and directories, in
 * the store and in the local tree (part of the ckpt module; see ckpt_i.h
 * for the staging layout and the lock order).
 *
 * In the store a rename is a copy onto the new key (atomic there: a
 * server-side copy, or filestore's temporary file and rename) followed by
 * the deletion of the old key, so readers see the old or the new name with
 * the whole content. A file not yet published is only renamed locally (an
 * older version under the old name is deleted from the store); it goes up
 * under its new name when it is synced or closed. A directory rename holds
 * ns_lock for writing, so that no publish runs meanwhile; it copies every
 * object under the old prefix, then deletes them: a failure half way
 * leaves both names in the store, never a partial object.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/grow.h"
#include "dstage/log.h"

/* Delete key and its sidecar from the store. */
static int ckpt_store_delete(struct ckpt *ck, const char *key)
{
	char *side = ckpt_sidecar_key(key);
	int ret, r2;

	if (!side)
		return -ENOMEM;
	ret = objstore_delete(ck->os, key);
	r2 = objstore_delete(ck->os, side);
	free(side);
	if (ret && ret != -ENOENT) {
		log_error("checkpoints: cannot delete %s from %s: %s", key,
			  ckpt_url(ck), strerror(-ret));
		return ckpt_store_errno(ret);
	}
	return r2 && r2 != -ENOENT ? ckpt_store_errno(r2) : 0;
}

/* Take the open entry of key out of the list: it is never published again.
 * ck->lock held. */
static bool ckpt_ent_detach_locked(struct ckpt *ck, const char *key)
{
	for (struct ckpt_ent **pp = &ck->ents; *pp; pp = &(*pp)->next) {
		if (strcmp((*pp)->key, key) == 0) {
			/* Its bytes stay on disk until its last close, which
			 * gives their staging space back. */
			(*pp)->unlinked = true;
			(*pp)->space_at_close = true;
			*pp = (*pp)->next;
			return true;
		}
	}
	return false;
}

/* Remove key's local copy and its record. */
static void ckpt_local_remove(struct ckpt *ck, const char *key, bool open)
{
	struct stat st;

	if (fstatat(ck->dirs.tree_fd, key, &st, AT_SYMLINK_NOFOLLOW) ||
	    !S_ISREG(st.st_mode))
		return;
	if (!unlinkat(ck->dirs.tree_fd, key, 0)) {
		ckpt_journal_remove(&ck->dirs, st.st_ino);
		if (!open) {
			ckpt_space(ck, st.st_uid, -(int64_t)st.st_size);
			ckpt_files(ck, st.st_uid, -1);
		}
	}
}

int ckpt_unlink(struct ckpt *ck, const char *key)
{
	struct ckpt_ent *e;
	bool open;
	struct ckpt_attr a;
	int ret = ckpt_stat(ck, key, &a);

	if (ret)
		return ret;
	if (a.dir)
		return -EISDIR;
	pthread_mutex_lock(&ck->open_lock);
	pthread_mutex_lock(&ck->lock);
	e = ckpt_ent_find_locked(ck, key);
	pthread_mutex_unlock(&ck->lock);
	if (e)
		pthread_mutex_lock(&e->lock); /* a publish ends first */
	pthread_mutex_lock(&ck->lock);
	open = ckpt_ent_detach_locked(ck, key);
	pthread_mutex_unlock(&ck->lock);
	ckpt_local_remove(ck, key, open);
	ret = ckpt_store_delete(ck, key);
	if (!ret)
		ckpt_store_forget(ck, key);
	if (!ret && ck->hooks.removed)
		ck->hooks.removed(ck->hooks.arg, ckpt_url(ck), key);
	if (e) {
		pthread_mutex_unlock(&e->lock);
		ckpt_ent_put(ck, e, false);
	}
	pthread_mutex_unlock(&ck->open_lock);
	return ret;
}

/* Copy from's SHA-256 record to to's (or drop to's when from has none). */
static int ckpt_sidecar_copy(struct ckpt *ck, const char *from, const char *to)
{
	char *fs = ckpt_sidecar_key(from), *ts = ckpt_sidecar_key(to);
	char buf[256];
	size_t got = 0;
	int ret = -ENOMEM;

	if (!fs || !ts)
		goto out;
	ret = objstore_get(ck->os, fs, 0, sizeof(buf), NULL, buf, &got);
	if (!ret)
		ret = objstore_put_buf(ck->os, ts, buf, got);
	else if (ret == -ENOENT || ret == -ERANGE)
		ret = objstore_delete(ck->os, ts);
out:
	free(fs);
	free(ts);
	return ret == -ENOENT ? 0 : ret;
}

static int ckpt_rename_file(struct ckpt *ck, const char *from, const char *to)
{
	struct objstore_info oi;
	struct ckpt_ent *e;
	struct ckpt_rec rec = { 0 };
	struct stat st;
	bool local, open, in_store = true;
	int ret = 0;

	pthread_mutex_lock(&ck->open_lock);
	pthread_mutex_lock(&ck->lock);
	e = ckpt_ent_find_locked(ck, from);
	pthread_mutex_unlock(&ck->lock);
	if (e)
		pthread_mutex_lock(&e->lock); /* no publish meanwhile */
	local = !fstatat(ck->dirs.tree_fd, from, &st, AT_SYMLINK_NOFOLLOW) &&
		S_ISREG(st.st_mode);
	rec.state = 'W';
	if (local) {
		if (ckpt_journal_read(&ck->dirs, st.st_ino, &rec))
			rec.state = 'W';
		in_store = rec.state == 'C' && !(e && e->dirty);
	}
	if (in_store) {
		/* Server-side copy onto the final name (atomic there), then
		 * the old name goes. */
		ret = objstore_copy(ck->os, from, to);
		if (!ret)
			ret = ckpt_sidecar_copy(ck, from, to);
		if (ret) {
			log_error("checkpoints: cannot rename %s to %s in %s: "
				  "%s",
				  from, to, ckpt_url(ck), strerror(-ret));
			ret = ckpt_store_errno(ret);
			goto out;
		}
		ret = ckpt_store_delete(ck, from);
		if (ret)
			goto out;
	} else {
		/* Not published: an older version under from must go. */
		ret = ckpt_store_delete(ck, from);
		if (ret)
			goto out;
	}
	pthread_mutex_lock(&ck->lock);
	open = ckpt_ent_detach_locked(ck, to);
	pthread_mutex_unlock(&ck->lock);
	ckpt_local_remove(ck, to, open);
	if (local) {
		ret = ckpt_tree_mkparents(ck, to);
		if (!ret &&
		    renameat(ck->dirs.tree_fd, from, ck->dirs.tree_fd, to))
			ret = -errno;
		if (ret) {
			log_error("checkpoints: cannot rename the local copy "
				  "%s/%s/%s: %s",
				  ck->dirs.staging, CKPT_TREE, from,
				  strerror(-ret));
			goto out;
		}
		snprintf(rec.key, sizeof(rec.key), "%s", to);
		if (rec.state == 'C' && !objstore_head(ck->os, to, &oi))
			snprintf(rec.etag, sizeof(rec.etag), "%s", oi.etag);
		ckpt_journal_write(&ck->dirs, st.st_ino, &rec, false);
	}
	ckpt_store_renamed(ck, from, to);
	if (ck->hooks.renamed)
		ck->hooks.renamed(ck->hooks.arg, ckpt_url(ck), from, to);
	/* The copy is another version in the store (its own ETag). */
	if (local && rec.state == 'C' && ck->hooks.published)
		ck->hooks.published(ck->hooks.arg, ckpt_url(ck), to, rec.sha,
				    rec.size, rec.etag, st.st_uid);
	pthread_mutex_lock(&ck->lock);
	if (e) {
		char *k = strdup(to);

		if (k) {
			free(e->key);
			e->key = k;
		} else {
			ret = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&ck->lock);
out:
	if (e) {
		pthread_mutex_unlock(&e->lock);
		ckpt_ent_put(ck, e, false);
	}
	pthread_mutex_unlock(&ck->open_lock);
	return ret;
}

struct ckpt_keys {
	char **v;
	size_t n, cap;
	int err;
};

static int ckpt_keys_cb(void *arg, const struct objstore_info *oi)
{
	struct ckpt_keys *k = arg;

	if (GROW_ONE(k->v, k->n, k->cap, 64)) {
		k->err = -ENOMEM;
		return 1;
	}
	k->v[k->n] = strdup(oi->key);
	if (!k->v[k->n]) {
		k->err = -ENOMEM;
		return 1;
	}
	k->n++;
	return 0;
}

/* Copy every object under prefix "from/" to "to/" and then delete the
 * old ones (sidecars too). A failure leaves both names in the store. */
static int ckpt_store_rename_prefix(struct ckpt *ck, const char *from,
				    const char *to)
{
	struct ckpt_keys k = { 0 };
	char *pf = ckpt_key_join(from, "");
	size_t fl = strlen(from);
	int ret = pf ? 0 : -ENOMEM;

	if (!ret)
		ret = objstore_list(ck->os, pf, ckpt_keys_cb, &k);
	if (k.err)
		ret = k.err;
	if (ret == -ENOENT)
		ret = 0;
	/* Every new name must fit in the store, or none moves. */
	for (size_t i = 0; i < k.n && !ret; i++)
		if (strlen(k.v[i]) - fl + strlen(to) > ck->key_max)
			ret = -ENAMETOOLONG;
	for (size_t i = 0; i < k.n && !ret; i++) {
		char *nk = ckpt_key_join(to, k.v[i] + fl + 1);

		ret = nk ? objstore_copy(ck->os, k.v[i], nk) : -ENOMEM;
		if (!ret)
			ret = ckpt_sidecar_copy(ck, k.v[i], nk);
		free(nk);
	}
	for (size_t i = 0; i < k.n && !ret; i++)
		ret = ckpt_store_delete(ck, k.v[i]);
	for (size_t i = 0; i < k.n; i++)
		free(k.v[i]);
	free(k.v);
	free(pf);
	if (ret == -ENAMETOOLONG)
		return ret;
	if (ret)
		log_error("checkpoints: cannot rename directory %s to %s in "
			  "%s: %s",
			  from, to, ckpt_url(ck), strerror(-ret));
	return ckpt_store_errno(ret);
}

static int ckpt_rename_dir(struct ckpt *ck, const char *from, const char *to)
{
	size_t fl = strlen(from);
	struct stat st;
	int ret;

	pthread_mutex_lock(&ck->open_lock);
	pthread_rwlock_wrlock(&ck->ns_lock); /* no publish runs */
	ret = ckpt_store_rename_prefix(ck, from, to);
	if (ret)
		goto out;
	if (!fstatat(ck->dirs.tree_fd, from, &st, AT_SYMLINK_NOFOLLOW)) {
		unlinkat(ck->dirs.tree_fd, to,
			 AT_REMOVEDIR); /* an empty target */
		ret = ckpt_tree_mkparents(ck, to);
		if (!ret &&
		    renameat(ck->dirs.tree_fd, from, ck->dirs.tree_fd, to))
			ret = -errno;
		if (ret)
			goto out;
		ckpt_journal_rekey(ck, to);
	}
	pthread_mutex_lock(&ck->lock);
	for (struct ckpt_ent *e = ck->ents; e; e = e->next) {
		char *k;

		if (strncmp(e->key, from, fl) || e->key[fl] != '/')
			continue;
		k = ckpt_key_join(to, e->key + fl + 1);
		if (!k) {
			ret = -ENOMEM;
			break;
		}
		free(e->key);
		e->key = k;
	}
	pthread_mutex_unlock(&ck->lock);
out:
	pthread_rwlock_unlock(&ck->ns_lock);
	pthread_mutex_unlock(&ck->open_lock);
	return ret;
}

static int ckpt_dir_empty_cb(void *arg, const char *name,
			     const struct ckpt_attr *a)
{
	(void)arg;
	(void)name;
	(void)a;
	return -ENOTEMPTY;
}

int ckpt_rename(struct ckpt *ck, const char *from, const char *to,
		bool noreplace)
{
	struct ckpt_attr fa, ta;
	size_t fl = strlen(from);
	int ret, tr;

	if (ckpt_key_ok(from) || !*from || !*to)
		return -EINVAL;
	ret = ckpt_key_new_ok(ck, to);
	if (ret)
		return ret;
	if (strcmp(from, to) == 0)
		return 0;
	if (strncmp(to, from, fl) == 0 && to[fl] == '/')
		return -EINVAL;
	ret = ckpt_stat(ck, from, &fa);
	if (ret)
		return ret;
	ret = ckpt_parent_dir(ck, to);
	if (ret)
		return ret;
	tr = ckpt_stat(ck, to, &ta);
	if (tr && tr != -ENOENT)
		return tr;
	if (!tr) {
		if (noreplace)
			return -EEXIST;
		if (fa.dir && !ta.dir)
			return -ENOTDIR;
		if (!fa.dir && ta.dir)
			return -EISDIR;
		if (ta.dir) {
			ret = ckpt_list(ck, to, ckpt_dir_empty_cb, NULL);
			if (ret)
				return ret;
		}
	}
	ckpt_neg_clear(ck);
	if (!fa.dir)
		return ckpt_rename_file(ck, from, to);
	ret = ckpt_rename_dir(ck, from, to);
	if (!ret)
		ckpt_store_renamed(ck, from, to);
	if (!ret && ck->hooks.renamed)
		ck->hooks.renamed(ck->hooks.arg, ckpt_url(ck), from, to);
	return ret;
}
