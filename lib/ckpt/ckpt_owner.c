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
 *   kept     made by a create on this node (ckpt_owner_keep), or a
 *            mkdir while the store was away, in the staging directory's
 *            owners/ only (ckpt_ownrec.c, which says how it is locked):
 *            this node's truth for the key unless the store holds
 *            another uid's, and what any publisher of the key (dstagefs,
 *            its restart, the stager daemon's retry job) stores before
 *            the key's bytes;
 *   claimed  a directory's, created in the store only if absent, so the
 *            first of several nodes making the name owns it
 *            (ckpt_owner_claim at mkdir; a kept one at its first publish,
 *            which refuses rather than store over another uid's);
 *   stored   PUT to the store: just before the first publish of the file,
 *            or of the first file below the directory
 *            (ckpt_owner_store_kept, shallowest first, on the publishing
 *            thread, each fsynced first in the same pass: one open a
 *            level), or at once by ckpt_owner_write for a key not kept;
 *   moved    with a rename (ckpt_owner_copy before the data moves, with
 *            drop after; ckpt_owner_move_kept for the kept ones);
 *   gone     with its key (ckpt_owner_remove, ckpt_owner_move_kept to
 *            NULL).
 *
 * No lock of its own: a kept record's flock orders a change of it after a
 * publisher storing it (the change then finds it gone and stores itself).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define CKPT_OWNER_MAX 64 /* bytes of a record */

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

static bool ckpt_owner_at_or_above(const char *a, const char *key)
{
	size_t al = strlen(a);

	return !strncmp(a, key, al) && (key[al] == '\0' || key[al] == '/');
}

struct ckpt_owner_moves {
	const char *from;
	size_t n, cap;
	char **v;
};

static int ckpt_owner_moves_add(void *arg, const char *key)
{
	struct ckpt_owner_moves *m = arg;

	if (!ckpt_owner_at_or_above(m->from, key))
		return 0;
	if (GROW_ONE(m->v, m->n, m->cap, 16))
		return -ENOMEM;
	m->v[m->n] = strdup(key);
	return m->v[m->n++] ? 0 : -ENOMEM;
}

/* One kept record: to key to (NULL: dropped). */
static void ckpt_owner_move1_kept(struct ckpt *ck, const char *key,
				  const char *to)
{
	struct ckpt_owner o;
	int fd, nfd, ret;

	if (ckpt_ownrec_open(&ck->dirs, key, false, &fd))
		return;
	ret = to ? ckpt_ownrec_read(fd, key, &o) : 0;
	if (!ret && to) {
		ret = ckpt_ownrec_open(&ck->dirs, to, true, &nfd);
		if (!ret) {
			ret = ckpt_ownrec_write(nfd, to, &o);
			close(nfd);
		}
		if (ret)
			log_warn("checkpoints: the kept owner of %s is not "
				 "moved to %s: %s",
				 key, to, strerror(-ret));
	}
	ckpt_ownrec_unlink(&ck->dirs, key);
	close(fd);
}

void ckpt_owner_move_kept(struct ckpt *ck, const char *from, const char *to)
{
	struct ckpt_owner_moves m = { .from = from };
	size_t fl = strlen(from);
	int ret = ckpt_ownrec_each(&ck->dirs, ckpt_owner_moves_add, &m);

	if (ret)
		log_warn("checkpoints: reading the kept owners of %s in %s/%s: "
			 "%s",
			 from, ck->dirs.staging, CKPT_OWNERS, strerror(-ret));
	for (size_t i = 0; i < m.n; i++) {
		char *dst = NULL;

		if (to && asprintf(&dst, "%s%s", to, m.v[i] + fl) < 0)
			dst = NULL;
		if (!to || dst)
			ckpt_owner_move1_kept(ck, m.v[i], dst);
		free(dst);
		free(m.v[i]);
	}
	free(m.v);
}

int ckpt_owner_keep(struct ckpt *ck, const char *key,
		    const struct ckpt_owner *o)
{
	int fd, ret = ckpt_ownrec_open(&ck->dirs, key, true, &fd);

	if (!ret) {
		ret = ckpt_ownrec_write(fd, key, o);
		/* owners/ full: none half-made (emptied, or a line cut short)
		 * stays for a key the caller does not make; a later publish
		 * would store it as root's 0000. Still locked: unlinked before
		 * anyone reads it. */
		if (ret)
			ckpt_ownrec_unlink(&ck->dirs, key);
		close(fd);
	}
	if (ret)
		log_error("checkpoints: cannot keep the owner of %s in %s/%s: "
			  "%s",
			  key, ck->dirs.staging, CKPT_OWNERS, strerror(-ret));
	return ret;
}

/* Put o as key's record in os (logged when it cannot). */
static int ckpt_owner_put(struct objstore *os, const char *key,
			  const struct ckpt_owner *o)
{
	char buf[CKPT_OWNER_MAX], *rk = ckpt_owner_rkey(key, true);
	int len, ret;

	if (!rk)
		return -ENOMEM;
	len = ckpt_ownrec_format(o, buf, sizeof(buf));
	ret = len < 0 ? len : objstore_put_buf(os, rk, buf, (size_t)len);
	if (ret)
		log_warn("checkpoints: cannot store the owner of %s in %s: %s",
			 key, objstore_url(os), strerror(-ret));
	free(rk);
	return ret;
}

/* key's record in os: 0, -ENOENT (none), -ENOMEM or the store's -errno.
 * One that does not parse reads as root's with mode 0000 (a warning). */
static int ckpt_owner_get(struct objstore *os, const char *key,
			  struct ckpt_owner *o)
{
	char buf[CKPT_OWNER_MAX + 1], *rk = ckpt_owner_rkey(key, true);
	struct objstore_get_req rq = {
		.len = CKPT_OWNER_MAX,
		.buf = buf,
		.missing_ok = true,
	};
	int ret;

	if (!rk)
		return -ENOMEM;
	rq.key = rk;
	/* most objects made through a mount have one; those that do not
	 * (other tools) would fill the log with a line per lookup */
	ret = objstore_get_many(os, &rq, 1);
	if (ret == -ERANGE) /* an empty record */
		rq.got = 0, ret = 0;
	if (!ret) {
		buf[rq.got] = '\0';
		if (ckpt_ownrec_parse(buf, o)) {
			log_warn(
				"checkpoints: the owner record %s in %s is not "
				"\"UID GID MODE\"; %s is root's with mode 0000 "
				"until root sets its owner and mode",
				rk, objstore_url(os), key);
			*o = (struct ckpt_owner){ 0 };
		}
	}
	free(rk);
	return ret;
}

/*
 * Claim key, a directory, for o: create its record in os only if there is
 * none (objstore_put_buf_new: atomic on both kinds of store), so that two
 * nodes making or publishing the same name agree on one owner, the first.
 * *theirs: the record the store holds after the call. 0 when it is o's
 * uid's (claimed now, or already: the same user's directory made on
 * another node, or this claim's own PUT retried after a lost answer);
 * -EEXIST when it is another uid's; else the store's -errno.
 */
static int ckpt_owner_put_new(struct objstore *os, const char *key,
			      const struct ckpt_owner *o,
			      struct ckpt_owner *theirs)
{
	char buf[CKPT_OWNER_MAX], *rk = ckpt_owner_rkey(key, true);
	int len = ckpt_ownrec_format(o, buf, sizeof(buf));
	int ret = !rk ? -ENOMEM : len < 0 ? len : -EAGAIN;

	/* a record found and then deleted (an rmdir between): again */
	for (int tries = 0; ret == -EAGAIN && tries < 3; tries++) {
		ret = objstore_put_buf_new(os, rk, buf, (size_t)len);
		if (ret == -EOPNOTSUPP) {
			/* a store without create-if-absent (tiered, overlay):
			 * read, then put; two claims at the same instant may
			 * both see none (docs/checkpoints.md) */
			ret = ckpt_owner_get(os, key, theirs);
			if (ret == -ENOENT)
				ret = objstore_put_buf(os, rk, buf,
						       (size_t)len);
			else if (!ret)
				ret = -EEXIST;
		}
		if (!ret) {
			*theirs = *o;
			break;
		}
		if (ret != -EEXIST)
			break;
		ret = ckpt_owner_get(os, key, theirs);
		if (!ret)
			ret = theirs->uid == o->uid ? 0 : -EEXIST;
		else if (ret == -ENOENT)
			ret = -EAGAIN;
	}
	if (ret && ret != -EEXIST)
		log_warn(
			"checkpoints: cannot claim %s (store its owner record) "
			"in %s: %s",
			key, objstore_url(os), strerror(-ret));
	free(rk);
	return ret == -EAGAIN ? -EBUSY : ret;
}

int ckpt_owner_claim(struct ckpt *ck, const char *key,
		     const struct ckpt_owner *o, struct ckpt_owner *theirs)
{
	return ckpt_owner_put_new(ck->os, key, o, theirs);
}

static int ckpt_owner_store(struct ckpt *ck, const char *key,
			    const struct ckpt_owner *o)
{
	return ckpt_owner_put(ck->os, key, o);
}

/*
 * One level of a publish's pass: key's kept record, if there is one, made
 * durable (fsync, before anything else: a record that stays must outlive a
 * crash as the P record that follows does), then, with store, stored and
 * removed. *found: set when there is one. A directory's (dir) is claimed:
 * never stored over another uid's record (-EEXIST, *mine the kept one and
 * *theirs the store's; the kept one stays). The record's lock is held
 * from the open to the close: a chmod waits for the whole level.
 */
static int ckpt_owner_store_one(const struct ckpt_dirs *d, struct objstore *os,
				const char *key, bool dir, bool store,
				bool *found, struct ckpt_owner *mine,
				struct ckpt_owner *theirs)
{
	struct ckpt_owner o;
	int fd, ret = ckpt_ownrec_open(d, key, false, &fd);

	if (ret == -ENOENT)
		return 0;
	if (ret)
		return ret;
	*found = true;
	if (fsync(fd)) {
		ret = -errno;
		log_warn("checkpoints: %s/%s: the kept owner of %s cannot be "
			 "made durable: %s",
			 d->staging, CKPT_OWNERS, key, strerror(-ret));
		goto out;
	}
	if (!store)
		goto out;
	ret = ckpt_ownrec_read(fd, key, &o);
	if (ret) {
		/* torn by a crash while written: fail closed, root's 0000
		 * (ckpt_owner_read's rule for a record it cannot read) */
		log_warn("checkpoints: %s/%s: the kept owner of %s cannot be "
			 "read; it is stored as root's with mode 0000",
			 d->staging, CKPT_OWNERS, key);
		o = (struct ckpt_owner){ 0 };
	}
	*mine = o;
	ret = dir ? ckpt_owner_put_new(os, key, &o, theirs) : 0;
	/* the same user's: this node's record (its chmod) is the newer */
	if (!ret && (!dir || o.gid != theirs->gid || o.mode != theirs->mode))
		ret = ckpt_owner_put(os, key, &o);
	if (!ret)
		ckpt_ownrec_unlink(d, key); /* still locked: no change lost */
out:
	close(fd);
	return ret;
}

/*
 * The directory dkey above file was made on this node while the store was
 * away, and claimed meanwhile by another uid on another node (theirs). The
 * file is published only if it is that owner's (or root's): this node
 * checked every other file made there against its own record, which
 * loses. The kept record stays, so that the others never are.
 */
static int ckpt_owner_conflict(const struct ckpt_dirs *d, struct objstore *os,
			       const char *dkey, const char *file,
			       const struct ckpt_owner *mine,
			       const struct ckpt_owner *theirs)
{
	struct ckpt_owner f;
	int fd, ret = ckpt_ownrec_open(d, file, false, &fd);

	if (!ret) {
		ret = ckpt_ownrec_read(fd, file, &f);
		close(fd);
	}
	if (!ret && (f.uid == theirs->uid || f.uid == 0))
		return 0;
	log_error("checkpoints: %s is not published: its directory %s is uid "
		  "%u's in %s (claimed on another node first), not uid %u's "
		  "as this node kept it while the store was away; nothing "
		  "but uid %u's goes there from here (root may move it out)",
		  file, dkey, (unsigned)theirs->uid, objstore_url(os),
		  (unsigned)mine->uid, (unsigned)theirs->uid);
	return -EEXIST;
}

int ckpt_owner_store_kept(const struct ckpt_dirs *d, struct objstore *os,
			  const char *key)
{
	struct ckpt_owner mine = { 0 }, theirs = { 0 };
	size_t len = strlen(key);
	char *k = strdup(key);
	bool found = false;
	int ret = 0;

	if (!k)
		return -ENOMEM;
	/*
	 * One pass, one open a level (ckpt_stage.h): the shallowest first,
	 * a directory's before its files'. Past a level that failed, the
	 * rest are only made durable (the publish fails; its P record, and
	 * these, are what the retry starts from).
	 */
	for (size_t i = 1; i <= len; i++) {
		int r;

		if (i < len && key[i] != '/')
			continue;
		k[i] = '\0';
		r = ckpt_owner_store_one(d, os, k, i < len, !ret, &found, &mine,
					 &theirs);
		if (r == -EEXIST)
			r = ckpt_owner_conflict(d, os, k, key, &mine, &theirs);
		if (r && !ret)
			ret = r;
		if (i < len)
			k[i] = '/';
	}
	/* the names of the records that stay, and the removal of the others */
	if (found && fsync(d->owners_fd) && !ret)
		ret = -errno;
	free(k);
	return ret;
}

int ckpt_owner_publishing(struct ckpt *ck, const char *key)
{
	return ckpt_owner_store_kept(&ck->dirs, ck->os, key);
}

int ckpt_owner_read(struct ckpt *ck, const char *key, struct ckpt_owner *o)
{
	struct ckpt_owner kept;
	int fd, ret, kret = -ENOENT;

	if (!ckpt_ownrec_open(&ck->dirs, key, false, &fd)) {
		kret = ckpt_ownrec_read(fd, key, &kept);
		close(fd);
	}
	ret = ckpt_owner_get(ck->os, key, o);
	/* Kept here and not yet stored: this node's truth, unless the store
	 * holds another uid's (a name claimed on another node while this
	 * one's store was away): never overrides the store's. */
	if (!kret && (ret || o->uid == kept.uid))
		*o = kept, ret = 0;
	return ret;
}

int ckpt_owner_write(struct ckpt *ck, const char *key,
		     const struct ckpt_owner *o)
{
	int fd, ret;

	/* A record kept here (the store was away) is changed here: the
	 * first publish stores it. One a publisher stored meanwhile is gone
	 * by the time its lock is ours: then this change goes to the store
	 * itself, after the publisher's. */
	ret = ckpt_ownrec_open(&ck->dirs, key, false, &fd);
	if (ret)
		return ckpt_owner_store(ck, key, o);
	ret = ckpt_ownrec_write(fd, key, o);
	close(fd);
	return ret;
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
