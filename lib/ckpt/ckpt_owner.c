// SPDX-License-Identifier: MIT
/*
 * ckpt_owner: the owner records of the checkpoint tree (include/dstage/
 * ckpt.h): their format, their store I/O, and the records kept on this
 * node until a publish takes them to the store. dstagefs decides who may
 * do what with them (fs/ckpt/dsfs_ckpt_own.c); this file decides what they
 * mean for the store.
 *
 * The owner record of key is the store object
 * ".dstage-owner/<key>/.dstage-own" ("<uid> <gid> <mode in octal>\n"; no
 * name of the tree starts with ".dstage", so a directory's record and
 * those of the names in it never meet, in a directory store either).
 *
 * A record's states:
 *   kept     made by a create on this node (ckpt_owner_keep), in
 *            ck->owners only: this node's truth for the key;
 *   stored   PUT to the store: just before the first publish of the file,
 *            or of the first file below the directory
 *            (ckpt_owner_publishing, shallowest first, on the publishing
 *            thread), or at once by ckpt_owner_write for a key not kept;
 *   moved    with a rename (ckpt_owner_copy before the data moves, with
 *            drop after; ckpt_owner_move_kept for the kept ones);
 *   gone     with its key (ckpt_owner_remove, ckpt_owner_move_kept to
 *            NULL).
 *
 * Locks: ck->owner_lock, a leaf, protects ck->owners; it is never held
 * across a call to the store.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_i.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define CKPT_OWNER_MAX 64 /* bytes of a record */

/* A record kept here until the store takes it (ck->owners). */
struct ckpt_owner_kept {
	struct ckpt_owner_kept *next;
	struct ckpt_owner own;
	char key[];
};

/* ".dstage-owner/<key>/.dstage-own" (leaf) or ".dstage-owner/<key>/"
 * (the prefix of every record at or below key), malloc'd, or NULL. */
static char *ckpt_owner_rkey(const char *key, bool leaf)
{
	size_t size = sizeof(CKPT_OWNER_PREFIX) + strlen(key) +
		      sizeof(CKPT_OWNER_LEAF);
	char *rk = malloc(size);

	if (rk)
		snprintf(rk, size, "%s%s%s", CKPT_OWNER_PREFIX, key,
			 leaf ? CKPT_OWNER_LEAF : "/");
	return rk;
}

/* "<uid> <gid> <mode>\n", each in range. 0 or -EINVAL. */
static int ckpt_owner_parse(const char *s, struct ckpt_owner *o)
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

/* Whether a is key or a directory above it. */
static bool ckpt_owner_at_or_above(const char *a, const char *key)
{
	size_t al = strlen(a);

	return !strncmp(a, key, al) && (key[al] == '\0' || key[al] == '/');
}

/* Rename (to NULL: drop) the kept records of from and below it
 * (owner_lock held). */
static void ckpt_owner_move_locked(struct ckpt *ck, const char *from,
				   const char *to)
{
	struct ckpt_owner_kept **pp = &ck->owners, *p;
	size_t fl = strlen(from);

	while ((p = *pp)) {
		struct ckpt_owner_kept *q;
		size_t rest;

		if (!ckpt_owner_at_or_above(from, p->key)) {
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

void ckpt_owner_move_kept(struct ckpt *ck, const char *from, const char *to)
{
	pthread_mutex_lock(&ck->owner_lock);
	ckpt_owner_move_locked(ck, from, to);
	pthread_mutex_unlock(&ck->owner_lock);
}

void ckpt_owner_free_kept(struct ckpt *ck)
{
	while (ck->owners) {
		struct ckpt_owner_kept *p = ck->owners;

		ck->owners = p->next;
		free(p);
	}
}

int ckpt_owner_keep(struct ckpt *ck, const char *key,
		    const struct ckpt_owner *o)
{
	size_t len = strlen(key) + 1;
	struct ckpt_owner_kept *p = malloc(sizeof(*p) + len);

	if (!p)
		return -ENOMEM;
	p->own = *o;
	memcpy(p->key, key, len);
	pthread_mutex_lock(&ck->owner_lock);
	ckpt_owner_move_locked(ck, key, NULL);
	p->next = ck->owners;
	ck->owners = p;
	pthread_mutex_unlock(&ck->owner_lock);
	return 0;
}

/* Put o as key's record in the store (logged when it cannot). */
static int ckpt_owner_store(struct ckpt *ck, const char *key,
			    const struct ckpt_owner *o)
{
	char buf[CKPT_OWNER_MAX], *rk = ckpt_owner_rkey(key, true);
	int len, ret;

	if (!rk)
		return -ENOMEM;
	len = snprintf(buf, sizeof(buf), "%u %u %04o\n", (unsigned)o->uid,
		       (unsigned)o->gid, (unsigned)(o->mode & 07777));
	ret = objstore_put_buf(ck->os, rk, buf, (size_t)len);
	if (ret)
		log_warn("checkpoints: cannot store the owner of %s in %s: %s",
			 key, ckpt_url(ck), strerror(-ret));
	free(rk);
	return ret;
}

int ckpt_owner_publishing(struct ckpt *ck, const char *key)
{
	for (;;) {
		struct ckpt_owner_kept *p, **pp;
		struct ckpt_owner o;
		char *k = NULL;
		int ret;

		/* the shallowest first: a directory's before its files' */
		pthread_mutex_lock(&ck->owner_lock);
		for (p = ck->owners; p; p = p->next)
			if (ckpt_owner_at_or_above(p->key, key) &&
			    (!k || strlen(p->key) < strlen(k))) {
				k = p->key;
				o = p->own;
			}
		k = k ? strdup(k) : NULL;
		pthread_mutex_unlock(&ck->owner_lock);
		if (!k)
			return 0;
		ret = ckpt_owner_store(ck, k, &o);
		pthread_mutex_lock(&ck->owner_lock);
		for (pp = &ck->owners; !ret && (p = *pp); pp = &p->next)
			if (!strcmp(p->key, k)) {
				*pp = p->next;
				free(p);
				break;
			}
		pthread_mutex_unlock(&ck->owner_lock);
		free(k);
		if (ret)
			return ret;
	}
}

int ckpt_owner_read(struct ckpt *ck, const char *key, struct ckpt_owner *o)
{
	char buf[CKPT_OWNER_MAX + 1], *rk;
	struct objstore_get_req rq = {
		.len = CKPT_OWNER_MAX,
		.buf = buf,
		.missing_ok = true,
	};
	size_t got = 0;
	int ret;

	pthread_mutex_lock(&ck->owner_lock);
	for (struct ckpt_owner_kept *p = ck->owners; p; p = p->next)
		if (!strcmp(p->key, key)) {
			/* not in the store yet: this node's is the truth */
			*o = p->own;
			pthread_mutex_unlock(&ck->owner_lock);
			return 0;
		}
	pthread_mutex_unlock(&ck->owner_lock);
	rk = ckpt_owner_rkey(key, true);
	if (!rk)
		return -ENOMEM;
	rq.key = rk;
	/* most objects made through a mount have one; those that do not
	 * (other tools) would fill the log with a line per lookup */
	ret = objstore_get_many(ck->os, &rq, 1);
	got = rq.got;
	if (ret == -ERANGE) /* an empty record */
		got = 0, ret = 0;
	if (ret)
		goto out;
	buf[got] = '\0';
	if (ckpt_owner_parse(buf, o)) {
		log_warn("checkpoints: the owner record %s in %s is not "
			 "\"UID GID MODE\"; %s is root's with mode 0000 until "
			 "root sets its owner and mode",
			 rk, ckpt_url(ck), key);
		o->uid = 0;
		o->gid = 0;
		o->mode = 0;
	}
out:
	free(rk);
	return ret;
}

int ckpt_owner_write(struct ckpt *ck, const char *key,
		     const struct ckpt_owner *o)
{
	bool kept = false;

	/* A record kept here (the store was away) is changed here: the
	 * first publish stores it. */
	pthread_mutex_lock(&ck->owner_lock);
	for (struct ckpt_owner_kept *p = ck->owners; p; p = p->next)
		if (!strcmp(p->key, key)) {
			p->own = *o;
			kept = true;
			break;
		}
	pthread_mutex_unlock(&ck->owner_lock);
	return kept ? 0 : ckpt_owner_store(ck, key, o);
}

void ckpt_owner_remove(struct ckpt *ck, const char *key)
{
	char *rk = ckpt_owner_rkey(key, true);
	int ret = rk ? objstore_delete(ck->os, rk) : -ENOMEM;

	if (ret && ret != -ENOENT) /* ENOENT: never published */
		log_warn("checkpoints: cannot delete the owner record of %s "
			 "in %s: %s",
			 key, ckpt_url(ck), strerror(-ret));
	free(rk);
}

/* The record keys under a directory's, collected before they change. */
struct ckpt_owner_keys {
	size_t n, cap;
	char **v;
};

static int ckpt_owner_keys_add(void *arg, const struct objstore_info *oi)
{
	struct ckpt_owner_keys *k = arg;

	if (GROW_ONE(k->v, k->n, k->cap, 16))
		return -ENOMEM;
	k->v[k->n] = strdup(oi->key);
	return k->v[k->n++] ? 0 : -ENOMEM;
}

static void ckpt_owner_keys_free(struct ckpt_owner_keys *k)
{
	for (size_t i = 0; i < k->n; i++)
		free(k->v[i]);
	free(k->v);
}

/* One record: copy rfrom's to rto (none: delete rto's), or delete
 * rfrom's (rto NULL). */
static int ckpt_owner_move1(struct objstore *os, const char *rfrom,
			    const char *rto)
{
	int ret;

	if (!rto)
		return objstore_delete(os, rfrom);
	ret = objstore_copy(os, rfrom, rto);
	return ret == -ENOENT ? objstore_delete(os, rto) : ret;
}

int ckpt_owner_copy(struct ckpt *ck, const char *from, const char *to, bool dir,
		    bool drop)
{
	struct ckpt_owner_keys k = { 0 };
	char *pfrom = ckpt_owner_rkey(from, !dir);
	char *pto = drop ? NULL : ckpt_owner_rkey(to, !dir);
	size_t plen;
	int ret = -ENOMEM;

	if (!pfrom || (!drop && !pto))
		goto out;
	if (!dir) { /* one record */
		ret = ckpt_owner_move1(ck->os, pfrom, pto);
		goto out;
	}
	/* a directory's own record and every record below it */
	plen = strlen(pfrom);
	ret = objstore_list(ck->os, pfrom, ckpt_owner_keys_add, &k);
	for (size_t i = 0; !ret && i < k.n; i++) {
		size_t size = (pto ? strlen(pto) : 0) + strlen(k.v[i]) + 1;
		char *dst = drop ? NULL : malloc(size);

		if (!drop && !dst) {
			ret = -ENOMEM;
			break;
		}
		if (dst)
			snprintf(dst, size, "%s%s", pto, k.v[i] + plen);
		ret = ckpt_owner_move1(ck->os, k.v[i], dst);
		free(dst);
	}
	/* a directory without a record: so is the new one */
	if (!ret && !drop && !k.n) {
		char *rto = ckpt_owner_rkey(to, true);

		ret = rto ? objstore_delete(ck->os, rto) : -ENOMEM;
		free(rto);
	}
out:
	if (ret)
		log_warn("checkpoints: cannot %s the owner records of %s%s%s "
			 "in %s: %s",
			 drop ? "delete" : "copy", from, drop ? "" : " to",
			 drop ? "" : to, ckpt_url(ck), strerror(-ret));
	ckpt_owner_keys_free(&k);
	free(pfrom);
	free(pto);
	return ret;
}
