// SPDX-License-Identifier: MIT
/*
 * dsfs_ckpt_pn: the place of each checkpoint node in the namespace, and
 * what the subtree's hooks share (keys, nodes, attributes; owners and
 * access checks are dsfs_ckpt_own.c's).
 * Below dsfs_ckpt.c and dsfs_ckpt_file.c, which call it.
 *
 * A node's priv is a struct dsfs_ckpt_pn (parent pn and name), from which
 * its key in the store is made. A rename moves the pn (the kernel keeps
 * the inode), so the keys of everything below a renamed directory follow.
 * A pn holds a reference on its parent; the node holds one on its pn
 * (dropped by dsfs_ckpt_pn_forget).
 *
 * Locks: st->lock guards every pn's parent, name, refs and gone. It is a
 * leaf, taken inside the node table's lock by the match callback, and
 * never held across a call into ckpt or the node table.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsfs_ckpt_i.h"
#include "dsfs_opts.h"
#include "dstage/ckpt.h"

static void dsfs_ckpt_pn_free(struct dsfs_ckpt_pn *pn)
{
	dsfs_pt_destroy(&pn->pt);
	free(pn->name);
	free(pn);
}

void dsfs_ckpt_pn_unref_locked(struct dsfs_ckpt *st, struct dsfs_ckpt_pn *pn)
{
	while (pn && pn != &st->top && --pn->refs == 0) {
		struct dsfs_ckpt_pn *parent = pn->parent;

		dsfs_ckpt_pn_free(pn);
		pn = parent;
	}
}

/* The key of pn (malloc'd), or NULL: its names from the top, joined. */
char *dsfs_ckpt_pn_key(struct dsfs_ckpt *st, struct dsfs_ckpt_pn *pn)
{
	size_t len = 0;
	char *key, *p;

	pthread_mutex_lock(&st->lock);
	for (struct dsfs_ckpt_pn *q = pn; q && q != &st->top; q = q->parent)
		len += strlen(q->name) + 1;
	len = len ? len - 1 : 0;
	key = malloc(len + 1);
	if (key) {
		p = key + len;
		*p = '\0';
		for (struct dsfs_ckpt_pn *q = pn; q && q != &st->top;
		     q = q->parent) {
			size_t l = strlen(q->name);

			p -= l;
			memcpy(p, q->name, l);
			if (p > key)
				*--p = '/';
		}
	}
	pthread_mutex_unlock(&st->lock);
	return key;
}

char *dsfs_ckpt_pn_child_key(struct dsfs_ckpt *st, struct dsfs_node *dir,
			     const char *name)
{
	char *dk = dsfs_ckpt_pn_key(st, dsfs_ckpt_pn_of(dir)), *k;
	size_t dl, size;

	if (!dk)
		return NULL;
	dl = strlen(dk);
	size = dl + strlen(name) + 2;
	k = malloc(size);
	if (k)
		snprintf(k, size, "%s%s%s", dk, dl ? "/" : "", name);
	free(dk);
	return k;
}

struct dsfs_ckpt_pn_match {
	struct dsfs_ckpt *st;
	struct dsfs_ckpt_pn *parent;
	const char *name;
	int dir; /* 0 file, 1 directory, -1 either */
};

/* Called under the node table's lock. */
static bool dsfs_ckpt_pn_match(const struct dsfs_node *n, void *arg)
{
	struct dsfs_ckpt_pn_match *m = arg;
	struct dsfs_ckpt_pn *pn = n->priv;
	bool ok;

	if (!pn) /* children of checkpoint nodes are all checkpoint nodes */
		return false;
	pthread_mutex_lock(&m->st->lock);
	ok = !pn->gone && pn->parent == m->parent &&
	     !strcmp(pn->name, m->name) && (m->dir < 0 || pn->dir == m->dir);
	pthread_mutex_unlock(&m->st->lock);
	return ok;
}

/* Drop the lookup reference dsfs_nodes_find_child gave. */
void dsfs_ckpt_pn_unref_node(struct dsfs *fs, struct dsfs_node *n)
{
	struct dsfs_node *gone = dsfs_nodes_forget(&fs->nodes, n->ino, 1);

	if (gone) {
		dsfs_ckpt_pn_forget(fs, gone);
		dsfs_node_free(gone);
	}
}

/* The node of name in dir (dir: is it a directory), made if needed, with
 * its nlookup raised. */
int dsfs_ckpt_pn_node(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		      bool isdir, struct dsfs_node **out)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct dsfs_ckpt_pn_match m = { st, dsfs_ckpt_pn_of(dir), name, isdir };
	struct dsfs_ckpt_pn *pn;
	struct dsfs_node *n;

	*out = dsfs_nodes_find_child(&fs->nodes, dir->ino, name,
				     dsfs_ckpt_pn_match, &m);
	if (*out)
		return 0;
	pn = calloc(1, sizeof(*pn));
	if (!pn)
		return -ENOMEM;
	dsfs_pt_init(&pn->pt);
	pn->name = strdup(name);
	n = pn->name ? dsfs_node_new(dir->sub, name, pn) : NULL;
	if (!n) {
		dsfs_ckpt_pn_free(pn);
		return -ENOMEM;
	}
	pn->dir = isdir;
	pn->refs = 1;
	pthread_mutex_lock(&st->lock);
	pn->parent = m.parent;
	if (m.parent != &st->top)
		m.parent->refs++;
	pthread_mutex_unlock(&st->lock);
	if (dsfs_nodes_insert(&fs->nodes, dir->ino, n, dsfs_ckpt_pn_match, &m,
			      out) == 1) {
		pthread_mutex_lock(&st->lock);
		dsfs_ckpt_pn_unref_locked(st, pn);
		pthread_mutex_unlock(&st->lock);
		dsfs_node_free(n);
	}
	return 0;
}

/* Mark the node name in dir (if the kernel has one) gone; with moveto,
 * move it there instead. */
void dsfs_ckpt_pn_mark(struct dsfs *fs, struct dsfs_node *dir, const char *name,
		       struct dsfs_node *newdir, const char *newname)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct dsfs_ckpt_pn_match m = { st, dsfs_ckpt_pn_of(dir), name, -1 };
	struct dsfs_node *n = dsfs_nodes_find_child(&fs->nodes, dir->ino, name,
						    dsfs_ckpt_pn_match, &m);
	struct dsfs_ckpt_pn *pn, *np, *old = NULL;
	char *nn = newname ? strdup(newname) : NULL;

	if (!n) {
		free(nn);
		return;
	}
	pn = dsfs_ckpt_pn_of(n);
	pthread_mutex_lock(&st->lock);
	if (newdir && nn) {
		np = dsfs_ckpt_pn_of(newdir);
		if (np != &st->top)
			np->refs++;
		old = pn->parent;
		pn->parent = np;
		free(pn->name);
		pn->name = nn;
		nn = NULL;
	} else {
		pn->gone = true;
	}
	dsfs_ckpt_pn_unref_locked(st, old);
	pthread_mutex_unlock(&st->lock);
	free(nn);
	dsfs_ckpt_pn_unref_node(fs, n);
}

void dsfs_ckpt_own_default(struct dsfs *fs, bool dir, struct ckpt_owner *o)
{
	o->uid = fs->opts->uid;
	o->gid = fs->opts->gid;
	/* Fail closed: owner-only at the most, whatever -o umask says. */
	o->mode = (dir ? 0700 : 0600) & ~fs->opts->umask & 0777;
}

void dsfs_ckpt_pn_attr(struct dsfs *fs, fuse_ino_t ino,
		       const struct ckpt_attr *a, const struct ckpt_owner *o,
		       struct stat *st)
{
	struct ckpt_owner def;

	if (!o) {
		dsfs_ckpt_own_default(fs, a->dir, &def);
		o = &def;
	}
	dsfs_reply_attr(fs->opts, st, ino, a->dir, a->size, a->mtime);
	st->st_uid = o->uid;
	st->st_gid = o->gid;
	st->st_mode = (a->dir ? S_IFDIR : S_IFREG) | (o->mode & 07777);
}

/* Refuse a change without a store: EROFS. */
int dsfs_ckpt_pn_check(struct dsfs *fs, struct dsfs_caller *who)
{
	(void)who;
	return dsfs_ckpt_st(fs)->ck ? 0 : -EROFS;
}

int dsfs_ckpt_pn_new_key(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *dir, const char *name, char **key)
{
	int ret = dsfs_ckpt_pn_check(fs, who);

	*key = NULL;
	if (ret)
		return ret;
	if (ckpt_name_ok("", name))
		return -EINVAL;
	*key = dsfs_ckpt_pn_child_key(dsfs_ckpt_st(fs), dir, name);
	if (!*key)
		return -ENOMEM;
	/* before anything of the name reaches the store (its owner) */
	ret = ckpt_key_check(dsfs_ckpt_st(fs)->ck, *key);
	if (ret) {
		free(*key);
		*key = NULL;
	}
	return ret;
}

int dsfs_ckpt_pn_perm(struct dsfs *fs, struct dsfs_caller *who,
		      struct dsfs_node *dir, const char *name)
{
	(void)who;
	(void)dir;
	(void)name;
	return dsfs_ckpt_st(fs)->ck ? -EPERM : -EROFS;
}

void dsfs_ckpt_pn_forget(struct dsfs *fs, struct dsfs_node *n)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);

	if (!st || !n->priv || n->priv == &st->top)
		return;
	pthread_mutex_lock(&st->lock);
	dsfs_ckpt_pn_unref_locked(st, n->priv);
	pthread_mutex_unlock(&st->lock);
}
