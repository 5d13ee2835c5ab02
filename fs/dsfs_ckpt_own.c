// SPDX-License-Identifier: MIT
/*
 * dsfs_ckpt_own: who owns each file and directory of checkpoints/, its
 * mode, and the POSIX access checks every hook of the subtree makes as
 * its caller. Below dsfs_ckpt.c and dsfs_ckpt_file.c, over
 * dsfs_ckpt_pn.c.
 *
 * The owner record of key is the store object
 * ".dstage-owner/<key>/.dstage-own" ("<uid> <gid> <mode in octal>\n"; no
 * name of the tree starts with ".dstage", so a directory's record and
 * those of the names in it never meet, in a directory store either).
 * A new file's or directory's record is kept on this node
 * (st->own_pending) and written just before the first publish of the file
 * or of the first file below the directory (dsfs_ckpt_own_publishing, a
 * ckpt hook); a published one is rewritten on chmod and chown, moved
 * with a rename (copied before the data moves, the old ones deleted
 * after) and deleted with it. So every node over the store enforces the
 * same owners and modes, directories included (the store has no
 * directory objects to carry metadata), on S3 and file:// stores alike.
 * An object without a record (published before owners existed, or by
 * another tool) gets dsfs_ckpt_own_default: the mount's -o uid, -o gid,
 * -o umask, as before. A record that does not parse gets root 0000 (only
 * root may use it, and fix it with chmod/chown), with a warning.
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
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/timeutil.h"

#define DSFS_CKPT_OWN_MAX 64 /* bytes of a record */
#define DSFS_CKPT_OWN_DEPTH 600 /* directories above a node: keys <= 1 KiB */

/* ".dstage-owner/<key>/.dstage-own" (leaf) or ".dstage-owner/<key>/"
 * (the prefix of every record at or below key), malloc'd, or NULL. */
static char *dsfs_ckpt_own_rkey(const char *key, bool leaf)
{
	size_t size = sizeof(CKPT_OWNER_PREFIX) + strlen(key) +
		      sizeof(CKPT_OWNER_LEAF);
	char *rk = malloc(size);

	if (rk)
		snprintf(rk, size, "%s%s%s", CKPT_OWNER_PREFIX, key,
			 leaf ? CKPT_OWNER_LEAF : "/");
	return rk;
}

static char *dsfs_ckpt_own_key(const char *key)
{
	return dsfs_ckpt_own_rkey(key, true);
}

static struct objstore *dsfs_ckpt_own_os(struct dsfs *fs)
{
	return ckpt_objstore(dsfs_ckpt_st(fs)->ck);
}

/* "<uid> <gid> <mode>\n", each in range. 0 or -EINVAL. */
static int dsfs_ckpt_own_parse(const char *s, struct dsfs_ckpt_own *o)
{
	unsigned long v[3];
	char *end;

	for (int i = 0; i < 3; i++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		errno = 0;
		v[i] = strtoul(s, &end, i == 2 ? 8 : 10);
		if (errno || end == s || *end != (i == 2 ? '\n' : ' '))
			return -EINVAL;
		s = end + 1;
	}
	if (*s || v[0] >= UINT32_MAX || v[1] >= UINT32_MAX || v[2] > 07777)
		return -EINVAL;
	o->uid = (uid_t)v[0];
	o->gid = (gid_t)v[1];
	o->mode = (mode_t)v[2];
	return 0;
}

static int dsfs_ckpt_own_store(struct dsfs *fs, const char *key,
			       const struct dsfs_ckpt_own *o);

/* Whether a is key or a directory above it. */
static bool dsfs_ckpt_own_at_or_above(const char *a, const char *key)
{
	size_t al = strlen(a);

	return !strncmp(a, key, al) && (key[al] == '\0' || key[al] == '/');
}

/* A record kept here until the store takes it (st->own_pending). */
struct dsfs_ckpt_own_pending {
	struct dsfs_ckpt_own_pending *next;
	struct dsfs_ckpt_own own;
	char key[];
};

/* Rename (to NULL: drop) the deferred records of from and below it
 * (st->lock held). */
static void dsfs_ckpt_own_pending_move_locked(struct dsfs_ckpt *st,
					      const char *from, const char *to)
{
	struct dsfs_ckpt_own_pending **pp = &st->own_pending, *p;
	size_t fl = strlen(from);

	while ((p = *pp)) {
		struct dsfs_ckpt_own_pending *q;
		size_t rest;

		if (!dsfs_ckpt_own_at_or_above(from, p->key)) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		rest = strlen(p->key + fl);
		q = to ? malloc(sizeof(*q) + strlen(to) + rest + 1) : NULL;
		if (q) { /* out of memory: the record goes, logged below */
			q->own = p->own;
			memcpy(q->key, to, strlen(to));
			memcpy(q->key + strlen(to), p->key + fl, rest + 1);
			q->next = *pp;
			*pp = q;
			pp = &q->next;
		} else if (to) {
			log_warn("checkpoints: out of memory: the owner of %s "
				 "is not kept",
				 p->key);
		}
		free(p);
	}
}

void dsfs_ckpt_own_pending_move(struct dsfs *fs, const char *from,
				const char *to)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);

	pthread_mutex_lock(&st->lock);
	dsfs_ckpt_own_pending_move_locked(st, from, to);
	pthread_mutex_unlock(&st->lock);
}

void dsfs_ckpt_own_pending_free(struct dsfs_ckpt *st)
{
	while (st && st->own_pending) {
		struct dsfs_ckpt_own_pending *p = st->own_pending;

		st->own_pending = p->next;
		free(p);
	}
}

/* key's deferred record into *o (st->lock held); false when none. */
static bool dsfs_ckpt_own_pending_find(struct dsfs_ckpt *st, const char *key,
				       struct dsfs_ckpt_own *o)
{
	for (struct dsfs_ckpt_own_pending *p = st->own_pending; p; p = p->next)
		if (!strcmp(p->key, key)) {
			*o = p->own;
			return true;
		}
	return false;
}

int dsfs_ckpt_own_defer(struct dsfs *fs, const char *key,
			const struct dsfs_ckpt_own *o)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	size_t len = strlen(key) + 1;
	struct dsfs_ckpt_own_pending *p = malloc(sizeof(*p) + len);

	if (!p)
		return -ENOMEM;
	p->own = *o;
	memcpy(p->key, key, len);
	pthread_mutex_lock(&st->lock);
	dsfs_ckpt_own_pending_move_locked(st, key, NULL);
	p->next = st->own_pending;
	st->own_pending = p;
	pthread_mutex_unlock(&st->lock);
	return 0;
}

int dsfs_ckpt_own_publishing(void *arg, const char *store, const char *key)
{
	struct dsfs *fs = arg;
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	int ret = 0;

	(void)store;
	for (;;) {
		struct dsfs_ckpt_own_pending *p, **pp;
		struct dsfs_ckpt_own o;
		char *k = NULL;

		/* the shallowest first: a directory's before its files' */
		pthread_mutex_lock(&st->lock);
		for (p = st->own_pending; p; p = p->next)
			if (dsfs_ckpt_own_at_or_above(p->key, key) &&
			    (!k || strlen(p->key) < strlen(k))) {
				k = p->key;
				o = p->own;
			}
		k = k ? strdup(k) : NULL;
		pthread_mutex_unlock(&st->lock);
		if (!k)
			return ret;
		ret = dsfs_ckpt_own_store(fs, k, &o);
		pthread_mutex_lock(&st->lock);
		for (pp = &st->own_pending; !ret && (p = *pp); pp = &p->next)
			if (!strcmp(p->key, k)) {
				*pp = p->next;
				free(p);
				break;
			}
		pthread_mutex_unlock(&st->lock);
		free(k);
		if (ret)
			return ret;
	}
}

int dsfs_ckpt_own_read(struct dsfs *fs, const char *key, bool dir,
		       struct dsfs_ckpt_own *o)
{
	char buf[DSFS_CKPT_OWN_MAX + 1], *rk;
	size_t got = 0;
	int ret;

	if (!*key) {
		*o = dsfs_ckpt_st(fs)->top.own;
		return 0;
	}
	pthread_mutex_lock(&dsfs_ckpt_st(fs)->lock);
	if (dsfs_ckpt_own_pending_find(dsfs_ckpt_st(fs), key, o)) {
		pthread_mutex_unlock(&dsfs_ckpt_st(fs)->lock);
		return 0; /* not in the store yet: this node's is the truth */
	}
	pthread_mutex_unlock(&dsfs_ckpt_st(fs)->lock);
	rk = dsfs_ckpt_own_key(key);
	if (!rk)
		return -ENOMEM;
	ret = objstore_get(dsfs_ckpt_own_os(fs), rk, 0, DSFS_CKPT_OWN_MAX, NULL,
			   buf, &got);
	if (ret == -ENOENT) {
		dsfs_ckpt_own_default(fs, dir, o);
		ret = 0;
		goto out;
	}
	if (ret == -ERANGE) /* an empty record */
		got = 0, ret = 0;
	if (ret)
		goto out;
	buf[got] = '\0';
	if (dsfs_ckpt_own_parse(buf, o)) {
		log_warn("checkpoints: the owner record %s in %s is not "
			 "\"UID GID MODE\"; %s is root's with mode 0000 until "
			 "root sets its owner and mode",
			 rk, ckpt_url(dsfs_ckpt_st(fs)->ck), key);
		o->uid = 0;
		o->gid = 0;
		o->mode = 0;
	}
out:
	free(rk);
	return ret;
}

/* Put o as key's record in the store (logged when it cannot). */
static int dsfs_ckpt_own_store(struct dsfs *fs, const char *key,
			       const struct dsfs_ckpt_own *o)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	char buf[DSFS_CKPT_OWN_MAX], *rk = dsfs_ckpt_own_key(key);
	int len, ret;

	if (!rk)
		return -ENOMEM;
	len = snprintf(buf, sizeof(buf), "%u %u %04o\n", (unsigned)o->uid,
		       (unsigned)o->gid, (unsigned)(o->mode & 07777));
	ret = objstore_put_buf(st->ck ? ckpt_objstore(st->ck) : NULL, rk, buf,
			       (size_t)len);
	if (ret)
		log_warn("checkpoints: cannot store the owner of %s in %s: %s",
			 key, ckpt_url(st->ck), strerror(-ret));
	free(rk);
	return ret;
}

int dsfs_ckpt_own_write(struct dsfs *fs, struct dsfs_ckpt_pn *pn,
			const char *key, const struct dsfs_ckpt_own *o)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	bool kept = false;
	int ret = 0;

	/* A record kept here (the store was away) is changed here: the
	 * first publish stores it. */
	pthread_mutex_lock(&st->lock);
	for (struct dsfs_ckpt_own_pending *p = st->own_pending; p; p = p->next)
		if (!strcmp(p->key, key)) {
			p->own = *o;
			kept = true;
			break;
		}
	pthread_mutex_unlock(&st->lock);
	if (!kept)
		ret = dsfs_ckpt_own_store(fs, key, o);
	if (!ret && pn)
		dsfs_ckpt_own_remember(fs, pn, o);
	return ret;
}

void dsfs_ckpt_own_remember(struct dsfs *fs, struct dsfs_ckpt_pn *pn,
			    const struct dsfs_ckpt_own *o)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);

	pthread_mutex_lock(&st->lock);
	pn->own = *o;
	pn->own_ms = timeutil_mono_ms();
	pn->own_gen++;
	pthread_mutex_unlock(&st->lock);
}

int dsfs_ckpt_own_get(struct dsfs *fs, struct dsfs_ckpt_pn *pn, bool fresh,
		      struct dsfs_ckpt_own *o)
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

void dsfs_ckpt_own_remove(struct dsfs *fs, const char *key)
{
	char *rk = dsfs_ckpt_own_key(key);
	int ret = rk ? objstore_delete(dsfs_ckpt_own_os(fs), rk) : -ENOMEM;

	if (ret && ret != -ENOENT) /* ENOENT: never published */
		log_warn("checkpoints: cannot delete the owner record of %s "
			 "in %s: %s",
			 key, ckpt_url(dsfs_ckpt_st(fs)->ck), strerror(-ret));
	free(rk);
}

/* The record keys under a directory's, collected before they change. */
struct dsfs_ckpt_own_keys {
	size_t n, cap;
	char **v;
};

static int dsfs_ckpt_own_keys_add(void *arg, const struct objstore_info *oi)
{
	struct dsfs_ckpt_own_keys *k = arg;

	if (GROW_ONE(k->v, k->n, k->cap, 16))
		return -ENOMEM;
	k->v[k->n] = strdup(oi->key);
	return k->v[k->n++] ? 0 : -ENOMEM;
}

static void dsfs_ckpt_own_keys_free(struct dsfs_ckpt_own_keys *k)
{
	for (size_t i = 0; i < k->n; i++)
		free(k->v[i]);
	free(k->v);
}

/* One record: copy rfrom's to rto (none: delete rto's), or delete
 * rfrom's (rto NULL). */
static int dsfs_ckpt_own_move1(struct objstore *os, const char *rfrom,
			       const char *rto)
{
	int ret;

	if (!rto)
		return objstore_delete(os, rfrom);
	ret = objstore_copy(os, rfrom, rto);
	return ret == -ENOENT ? objstore_delete(os, rto) : ret;
}

int dsfs_ckpt_own_copy(struct dsfs *fs, const char *from, const char *to,
		       bool dir, bool drop)
{
	struct objstore *os = dsfs_ckpt_own_os(fs);
	struct dsfs_ckpt_own_keys k = { 0 };
	char *pfrom = dsfs_ckpt_own_rkey(from, dir ? false : true);
	char *pto = drop ? NULL : dsfs_ckpt_own_rkey(to, dir ? false : true);
	size_t plen;
	int ret = -ENOMEM;

	if (!pfrom || (!drop && !pto))
		goto out;
	if (!dir) { /* one record */
		ret = dsfs_ckpt_own_move1(os, pfrom, pto);
		goto out;
	}
	/* a directory's own record and every record below it */
	plen = strlen(pfrom);
	ret = objstore_list(os, pfrom, dsfs_ckpt_own_keys_add, &k);
	for (size_t i = 0; !ret && i < k.n; i++) {
		size_t size = (pto ? strlen(pto) : 0) + strlen(k.v[i]) + 1;
		char *dst = drop ? NULL : malloc(size);

		if (!drop && !dst) {
			ret = -ENOMEM;
			break;
		}
		if (dst)
			snprintf(dst, size, "%s%s", pto, k.v[i] + plen);
		ret = dsfs_ckpt_own_move1(os, k.v[i], dst);
		free(dst);
	}
	/* a directory without a record: so is the new one */
	if (!ret && !drop && !k.n) {
		char *rto = dsfs_ckpt_own_key(to);

		ret = rto ? objstore_delete(os, rto) : -ENOMEM;
		free(rto);
	}
out:
	if (ret)
		log_warn("checkpoints: cannot %s the owner records of %s%s%s "
			 "in %s: %s",
			 drop ? "delete" : "copy", from, drop ? "" : " to",
			 drop ? "" : to, ckpt_url(dsfs_ckpt_st(fs)->ck),
			 strerror(-ret));
	dsfs_ckpt_own_keys_free(&k);
	free(pfrom);
	free(pto);
	return ret;
}

int dsfs_ckpt_may(struct dsfs_caller *who, const struct dsfs_ckpt_own *o,
		  int mask)
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
	struct dsfs_ckpt_own o;
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

int dsfs_ckpt_may_dir(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, int mask,
		      struct dsfs_ckpt_own *downer)
{
	struct dsfs_ckpt_pn *pn = dsfs_ckpt_pn_of(dir);
	struct dsfs_ckpt_own o;
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
			 const struct dsfs_ckpt_own *downer, const char *key,
			 bool isdir, struct dsfs_ckpt_own *owner)
{
	struct dsfs_ckpt_own o;
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

void dsfs_ckpt_own_new(struct dsfs_caller *who,
		       const struct dsfs_ckpt_own *downer, bool dir,
		       mode_t mode, struct dsfs_ckpt_own *o)
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
	struct dsfs_ckpt_own o;
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
			 mode_t mode, struct dsfs_ckpt_own *o, bool *isnew)
{
	struct dsfs_ckpt_own downer;
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
