// SPDX-License-Identifier: MIT
/*
 * dsfs_ckpt_own: who owns each file and directory of checkpoints/, its
 * mode, and the POSIX access checks every hook of the subtree makes as
 * its caller. Below dsfs_ckpt.c and dsfs_ckpt_file.c, over
 * dsfs_ckpt_pn.c.
 *
 * The owner records themselves (their format in the store, the records
 * a create keeps on this node until the first publish, their moves with a
 * rename) are lib/ckpt's (ckpt_owner.c, include/dstage/ckpt.h): this file
 * decides who may, from what they say. An object without a record
 * (published before owners existed, or by another tool) gets
 * dsfs_ckpt_own_default: the mount's -o uid, -o gid, -o umask, as before.
 * A directory's name is claimed in the store by its mkdir
 * (dsfs_ckpt_own_claim), so every node agrees on one owner: the first.
 *
 * The top, checkpoints/ itself, is the mount owner's and 1777, as /tmp:
 * anyone makes a job directory there; only its owner or root removes or
 * renames it.
 *
 * Each pn remembers its owner for DSFS_CKPT_TIMEOUT (as the kernel its
 * attributes), so a walk asks the store again at most once a second per
 * directory; a change made on another node is in force here within it.
 *
 * Locks: only st->lock (a leaf, see dsfs_ckpt.c), never held across a
 * call to the store.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsfs_ckpt_i.h"
#include "dsfs_opts.h"
#include "dstage/ckpt.h"
#include "dstage/timeutil.h"

#define DSFS_CKPT_OWN_DEPTH 600 /* directories above a node: keys <= 1 KiB */

int dsfs_ckpt_own_read(struct dsfs *fs, const char *key, bool dir,
		       struct ckpt_owner *o)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	int ret;

	if (!*key) {
		*o = st->top.own;
		return 0;
	}
	ret = ckpt_owner_read(st->ck, key, o);
	if (ret == -ENOENT) {
		dsfs_ckpt_own_default(fs, dir, o);
		ret = 0;
	}
	return ret;
}

int dsfs_ckpt_own_write(struct dsfs *fs, struct dsfs_ckpt_pn *pn,
			const char *key, const struct ckpt_owner *o)
{
	int ret = ckpt_owner_write(dsfs_ckpt_st(fs)->ck, key, o);

	if (!ret && pn)
		dsfs_ckpt_own_remember(fs, pn, o);
	return ret;
}

int dsfs_ckpt_own_claim(struct dsfs *fs, const char *key, struct ckpt_owner *o)
{
	struct ckpt *ck = dsfs_ckpt_st(fs)->ck;
	struct ckpt_owner theirs;
	int ret = ckpt_owner_claim(ck, key, o, &theirs);

	if (!ret || ret == -EEXIST) {
		*o = theirs;
		return ret;
	}
	if (ret == -ENOMEM)
		return ret;
	/* the store is away: kept here, claimed by the first publish below */
	return ckpt_owner_keep(ck, key, o);
}

void dsfs_ckpt_own_remember(struct dsfs *fs, struct dsfs_ckpt_pn *pn,
			    const struct ckpt_owner *o)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);

	pthread_mutex_lock(&st->lock);
	pn->own = *o;
	pn->own_ms = timeutil_mono_ms();
	pn->own_gen++;
	pthread_mutex_unlock(&st->lock);
}

int dsfs_ckpt_own_get(struct dsfs *fs, struct dsfs_ckpt_pn *pn, bool fresh,
		      struct ckpt_owner *o)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	int64_t now = timeutil_mono_ms();
	uint64_t gen;
	bool known;
	char *key;
	int ret;

	pthread_mutex_lock(&st->lock);
	known = pn->own_ms == INT64_MAX ||
		(!fresh && pn->own_ms &&
		 now - pn->own_ms < (int64_t)(DSFS_CKPT_TIMEOUT * 1000));
	if (known)
		*o = pn->own;
	gen = pn->own_gen;
	pthread_mutex_unlock(&st->lock);
	if (known)
		return 0;
	key = dsfs_ckpt_pn_key(st, pn);
	if (!key)
		return -ENOMEM;
	ret = dsfs_ckpt_own_read(fs, key, pn->dir, o);
	free(key);
	if (ret)
		return ret;
	pthread_mutex_lock(&st->lock);
	if (pn->own_gen == gen) {
		pn->own = *o;
		pn->own_ms = now;
	} else {
		/* changed here while the record was read: the change wins */
		*o = pn->own;
	}
	pthread_mutex_unlock(&st->lock);
	return 0;
}

int dsfs_ckpt_may(struct dsfs_caller *who, const struct ckpt_owner *o, int mask)
{
	mode_t bits;

	if (who->uid == 0)
		return 0;
	if (who->uid == o->uid)
		bits = o->mode >> 6;
	else if (dsfs_caller_in_group(who, o->gid))
		bits = o->mode >> 3;
	else
		bits = o->mode;
	mask &= R_OK | W_OK | X_OK;
	return ((int)bits & mask) == mask ? 0 : -EACCES;
}

int dsfs_ckpt_may_walk(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_ckpt_pn *pn)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct dsfs_ckpt_pn *up[DSFS_CKPT_OWN_DEPTH];
	struct ckpt_owner o;
	size_t n = 0;
	int ret = 0;

	if (who && who->uid == 0)
		return 0;
	/* the directories above pn, each held while it is checked */
	pthread_mutex_lock(&st->lock);
	for (struct dsfs_ckpt_pn *q = pn->parent; q && n < DSFS_CKPT_OWN_DEPTH;
	     q = q->parent) {
		if (q != &st->top)
			q->refs++;
		up[n++] = q;
		if (q == &st->top)
			break;
	}
	pthread_mutex_unlock(&st->lock);
	if (pn != &st->top && (!n || up[n - 1] != &st->top))
		ret = -ENAMETOOLONG;
	for (size_t i = n; !ret && i-- > 0;) {
		ret = dsfs_ckpt_own_get(fs, up[i], false, &o);
		if (!ret && who)
			ret = dsfs_ckpt_may(who, &o, X_OK);
		else if (!ret && (o.mode & 0111) != 0111)
			ret = -EACCES;
	}
	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < n; i++)
		dsfs_ckpt_pn_unref_locked(st, up[i]);
	pthread_mutex_unlock(&st->lock);
	return ret;
}

double dsfs_ckpt_attr_timeout(struct dsfs *fs, struct dsfs_ckpt_pn *pn)
{
	return dsfs_ckpt_may_walk(fs, NULL, pn) ? 0 : DSFS_CKPT_TIMEOUT;
}

void dsfs_ckpt_own_entry(struct dsfs *fs, const struct ckpt_attr *a,
			 const struct ckpt_owner *o, struct dsfs_entry *e)
{
	dsfs_ckpt_pn_attr(fs, e->node->ino, a, o, &e->attr);
	e->entry_timeout = DSFS_CKPT_TIMEOUT;
	e->attr_timeout = dsfs_ckpt_attr_timeout(fs, dsfs_ckpt_pn_of(e->node));
}

int dsfs_ckpt_may_dir(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, int mask,
		      struct ckpt_owner *downer)
{
	struct dsfs_ckpt_pn *pn = dsfs_ckpt_pn_of(dir);
	struct ckpt_owner o;
	int ret = dsfs_ckpt_may_walk(fs, who, pn);

	if (!ret)
		ret = dsfs_ckpt_own_get(fs, pn, false, &o);
	if (!ret)
		ret = dsfs_ckpt_may(who, &o, mask);
	if (!ret && downer)
		*downer = o;
	return ret;
}

int dsfs_ckpt_may_remove(struct dsfs *fs, struct dsfs_caller *who,
			 const struct ckpt_owner *downer, const char *key,
			 bool isdir, struct ckpt_owner *owner)
{
	struct ckpt_owner o;
	int ret = dsfs_ckpt_may(who, downer, W_OK | X_OK);

	if (!ret)
		ret = dsfs_ckpt_own_read(fs, key, isdir, &o);
	if (ret)
		return ret;
	if ((downer->mode & S_ISVTX) && who->uid != 0 &&
	    who->uid != downer->uid && who->uid != o.uid)
		return -EPERM;
	if (owner)
		*owner = o;
	return 0;
}

void dsfs_ckpt_own_new(struct dsfs_caller *who, const struct ckpt_owner *downer,
		       bool dir, mode_t mode, struct ckpt_owner *o)
{
	o->uid = who->uid;
	o->gid = who->gid;
	o->mode = mode & 07777;
	if (downer->mode & S_ISGID) {
		o->gid = downer->gid;
		if (dir)
			o->mode |= S_ISGID;
	}
	/* as Linux: a file's set-group-ID bit only for a member */
	if (!dir && (o->mode & S_ISGID) && who->uid != 0 &&
	    !dsfs_caller_in_group(who, o->gid))
		o->mode &= ~(mode_t)S_ISGID;
}

/* The permission bits open flags need. */
static int dsfs_ckpt_open_mask(int flags)
{
	int mask = 0;

	if ((flags & O_ACCMODE) != O_WRONLY)
		mask |= R_OK;
	if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC))
		mask |= W_OK;
	return mask;
}

int dsfs_ckpt_may_open(struct dsfs *fs, struct dsfs_caller *who,
		       struct dsfs_node *n, int flags)
{
	struct dsfs_ckpt_pn *pn = dsfs_ckpt_pn_of(n);
	struct ckpt_owner o;
	int mask = dsfs_ckpt_open_mask(flags);
	int ret = (mask & W_OK) ? dsfs_ckpt_pn_check(fs, who) : 0;

	if (!ret)
		ret = dsfs_ckpt_may_walk(fs, who, pn);
	if (!ret)
		ret = dsfs_ckpt_own_get(fs, pn, true, &o);
	if (!ret)
		ret = dsfs_ckpt_may(who, &o, mask);
	return ret;
}

int dsfs_ckpt_may_create(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *dir, const char *key, int flags,
			 mode_t mode, struct ckpt_owner *o, bool *isnew)
{
	struct ckpt_owner downer;
	struct ckpt_attr a;
	int ret = dsfs_ckpt_may_dir(fs, who, dir, X_OK, &downer);

	*isnew = false;
	if (ret)
		return ret;
	ret = ckpt_stat(dsfs_ckpt_st(fs)->ck, key, &a);
	if (!ret) { /* there already: opened, as open(2) does */
		if (flags & O_EXCL)
			return -EEXIST;
		if (a.dir)
			return -EISDIR;
		ret = dsfs_ckpt_own_read(fs, key, false, o);
		return ret ? ret
			   : dsfs_ckpt_may(who, o, dsfs_ckpt_open_mask(flags));
	}
	if (ret != -ENOENT)
		return ret;
	ret = dsfs_ckpt_may(who, &downer, W_OK | X_OK);
	if (ret)
		return ret;
	dsfs_ckpt_own_new(who, &downer, false, mode, o);
	*isnew = true;
	return 0;
}
