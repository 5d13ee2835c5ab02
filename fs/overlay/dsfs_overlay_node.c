// SPDX-License-Identifier: MIT
/*
 * dsfs_overlay_node: the overlay's nodes (see dsfs_overlay_i.h).
 *
 * A node names a place in the tree, not an inode: its path is rebuilt from
 * its parent chain for every call, so a rename through the mount moves the
 * node (and everything below it) by changing one parent and name. A
 * lookup finds the table's node for (dir, name) only while that node is
 * still at that place and of the same file type; otherwise it makes a new
 * one (a file replaced underneath by one of another type gets a new inode
 * number, which the kernel needs).
 *
 * Locks: st->lock guards every struct dsfs_overlay_node's parent, name, refs,
 * gone and etag; it is a leaf, also taken under the node table's lock (in
 * the match callback).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsfs_overlay_i.h"
#include "dstage/log.h"

static struct dsfs_overlay_node *dsfs_overlay_node_of(struct dsfs_node *n)
{
	return n->priv;
}

int dsfs_overlay_node_path(struct dsfs_overlay *st, struct dsfs_node *n,
			   const char *name, char *buf)
{
	const char *parts[PATH_MAX / 2];
	size_t np = 0, len = 0;
	int ret = 0;

	if (name)
		parts[np++] = name;
	pthread_mutex_lock(&st->lock);
	for (struct dsfs_overlay_node *p = dsfs_overlay_node_of(n);
	     p && p->parent; p = p->parent) {
		if (np == sizeof(parts) / sizeof(parts[0])) {
			ret = -ENAMETOOLONG;
			goto out;
		}
		parts[np++] = p->name;
	}
	if (!np) {
		memcpy(buf, ".", 2);
		goto out;
	}
	while (np--) {
		size_t l = strlen(parts[np]);

		if (len + l + 2 > PATH_MAX) {
			ret = -ENAMETOOLONG;
			goto out;
		}
		memcpy(buf + len, parts[np], l);
		len += l;
		buf[len++] = np ? '/' : '\0';
	}
out:
	pthread_mutex_unlock(&st->lock);
	return ret;
}

int dsfs_overlay_node_open(struct dsfs_overlay *st, struct dsfs_caller *who,
			   struct dsfs_node *n, const char *name, int flags,
			   mode_t mode, char *path)
{
	int fd, ret = dsfs_overlay_node_path(st, n, name, path);

	if (ret)
		return ret;
	/* A take that failed part-way still needs its drop. */
	ret = dsfs_overlay_cred_take(st, who);
	if (!ret) {
		fd = openat(st->root_fd, path, flags, mode);
		ret = fd < 0 ? -errno : fd;
	}
	dsfs_overlay_cred_drop(st);
	return ret;
}

/*
 * Nothing but a regular file is opened here: an open of a FIFO blocks until
 * its other end comes (a worker thread taken, for as long as it pleases
 * whoever swapped the FIFO in), one of a device runs its driver past the
 * mount's nodev. O_PATH opens neither and needs only search permission;
 * the reopen through /proc/self/fd (the same inode) checks the rest.
 */
int dsfs_overlay_node_reopen(struct dsfs_overlay *st, const char *path,
			     int flags)
{
	char proc[64];
	struct stat sb;
	int pfd, ret;

	pfd = openat(st->root_fd, path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (pfd < 0)
		return -errno;
	if (fstat(pfd, &sb)) {
		ret = -errno;
		goto out;
	}
	if (!S_ISREG(sb.st_mode)) {
		ret = -ESTALE;
		goto out;
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", pfd);
	/* the magic link is followed: O_NOFOLLOW would refuse it */
	ret = open(proc, flags & ~(O_CREAT | O_EXCL | O_NOFOLLOW));
	if (ret < 0)
		ret = -errno;
out:
	close(pfd);
	return ret;
}

/*
 * A create's open of the file already at path (the kernel thought the name
 * free): its type checked first (fstatat, opening nothing), then opened with
 * O_CREAT kept, so that the kernel's own rules for it (protected_regular
 * in sticky directories) apply as on the tree, and O_NONBLOCK, so that a
 * FIFO swapped in since the check cannot block (it is refused after);
 * O_NONBLOCK is cleared again unless asked. A file leased elsewhere
 * (EWOULDBLOCK: no FIFO answers so) is opened again waiting for the lease.
 */
static int dsfs_overlay_node_open_there(struct dsfs_overlay *st,
					const char *path, int flags)
{
	struct stat sb;
	int fd, fl, ret;

	if (fstatat(st->root_fd, path, &sb, AT_SYMLINK_NOFOLLOW))
		return -errno;
	if (!S_ISREG(sb.st_mode))
		return -ESTALE;
	fd = openat(st->root_fd, path, (flags & ~O_EXCL) | O_NONBLOCK, 0);
	if (fd < 0 && errno == EWOULDBLOCK && !(flags & O_NONBLOCK))
		fd = openat(st->root_fd, path, flags & ~O_EXCL, 0);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) || (fl = fcntl(fd, F_GETFL)) < 0) {
		ret = -errno;
		goto out;
	}
	if (!S_ISREG(sb.st_mode)) {
		ret = -ESTALE;
		goto out;
	}
	if (!(flags & O_NONBLOCK) && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)) {
		ret = -errno;
		goto out;
	}
	ret = fd;
	fd = -1;
out:
	if (fd >= 0)
		close(fd);
	return ret;
}

/* Creates try a new file first, then the one there (bounded: a name
 * removed and made again between the two each time). */
#define DSFS_OVERLAY_CREATE_TRIES 4

int dsfs_overlay_node_open_file(struct dsfs_overlay *st,
				struct dsfs_caller *who, struct dsfs_node *n,
				const char *name, int flags, mode_t mode,
				char *path)
{
	int ret = dsfs_overlay_node_path(st, n, name, path);

	if (ret)
		return ret;
	/* A take that failed part-way still needs its drop. */
	ret = dsfs_overlay_cred_take(st, who);
	if (ret)
		goto out;
	if (!(flags & O_CREAT)) {
		ret = dsfs_overlay_node_reopen(st, path, flags);
		goto out;
	}
	for (int i = 0; i < DSFS_OVERLAY_CREATE_TRIES; i++) {
		ret = openat(st->root_fd, path, flags | O_EXCL, mode);
		if (ret >= 0)
			goto out;
		ret = -errno;
		if (ret != -EEXIST || (flags & O_EXCL))
			goto out;
		ret = dsfs_overlay_node_open_there(st, path, flags);
		if (ret != -ENOENT)
			goto out;
	}
	ret = -ESTALE;
out:
	dsfs_overlay_cred_drop(st);
	return ret;
}

void dsfs_overlay_node_parent_path(const char *path, char *buf)
{
	const char *slash = strrchr(path, '/');

	if (!slash) {
		memcpy(buf, ".", 2);
		return;
	}
	memcpy(buf, path, (size_t)(slash - path));
	buf[slash - path] = '\0';
}

void dsfs_overlay_node_sync_dir(struct dsfs_overlay *st, const char *path)
{
	int fd = openat(st->root_fd, path,
			O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0 || fsync(fd))
		log_debug("overlay %s: fsync of directory %s: %s", st->dir,
			  path, strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* Drop one reference of p and up its chain. Under st->lock. */
static void dsfs_overlay_node_unref_locked(struct dsfs_overlay *st,
					   struct dsfs_overlay_node *p)
{
	while (p && p != &st->top && --p->refs == 0) {
		struct dsfs_overlay_node *parent = p->parent;

		dsfs_pt_destroy(&p->pt);
		free(p->name);
		free(p);
		p = parent;
	}
}

void dsfs_overlay_node_forget(struct dsfs *fs, struct dsfs_node *n)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);

	if (!st || n->priv == &st->top)
		return;
	pthread_mutex_lock(&st->lock);
	dsfs_overlay_node_unref_locked(st, n->priv);
	pthread_mutex_unlock(&st->lock);
	n->priv = NULL;
}

struct dsfs_overlay_node_match {
	struct dsfs_overlay *st;
	struct dsfs_overlay_node *parent;
	const char *name;
	mode_t type; /* 0: any */
};

/* Called under the node table's lock. */
static bool dsfs_overlay_node_match(const struct dsfs_node *n, void *arg)
{
	struct dsfs_overlay_node_match *m = arg;
	struct dsfs_overlay_node *p = n->priv;
	bool ok;

	if (!p)
		return false;
	pthread_mutex_lock(&m->st->lock);
	ok = !p->gone && p->parent == m->parent && !strcmp(p->name, m->name) &&
	     (!m->type || p->type == m->type);
	pthread_mutex_unlock(&m->st->lock);
	return ok;
}

int dsfs_overlay_node_entry(struct dsfs *fs, struct dsfs_node *dir,
			    const char *name, const struct stat *sb,
			    struct dsfs_entry *e)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	struct dsfs_overlay_node_match m = { st, dsfs_overlay_node_of(dir),
					     name, sb->st_mode & S_IFMT };
	struct dsfs_overlay_node *p;
	struct dsfs_node *n;

	memset(e, 0, sizeof(*e));
	e->attr = *sb;
	e->attr_timeout = e->entry_timeout = st->timeout;
	e->node = dsfs_nodes_find_child(&fs->nodes, dir->ino, name,
					dsfs_overlay_node_match, &m);
	if (e->node)
		return 0;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->name = strdup(name);
	n = p->name ? dsfs_node_new(dir->sub, name, p) : NULL;
	if (!n) {
		free(p->name);
		free(p);
		return -ENOMEM;
	}
	dsfs_pt_init(&p->pt);
	p->type = sb->st_mode & S_IFMT;
	p->refs = 1;
	pthread_mutex_lock(&st->lock);
	p->parent = m.parent;
	if (m.parent != &st->top)
		m.parent->refs++;
	pthread_mutex_unlock(&st->lock);
	if (dsfs_nodes_insert(&fs->nodes, dir->ino, n, dsfs_overlay_node_match,
			      &m, &e->node) == 1) {
		pthread_mutex_lock(&st->lock);
		dsfs_overlay_node_unref_locked(st, p);
		pthread_mutex_unlock(&st->lock);
		dsfs_node_free(n);
	}
	return 0;
}

void dsfs_overlay_node_moved(struct dsfs *fs, struct dsfs_node *dir,
			     const char *name, struct dsfs_node *newdir,
			     const char *newname)
{
	struct dsfs_overlay *st = dsfs_overlay_st(fs);
	struct dsfs_overlay_node_match m = { st, dsfs_overlay_node_of(dir),
					     name, 0 };
	struct dsfs_overlay_node_match t = { st, NULL, newname, 0 };
	struct dsfs_node *n, *old = NULL;
	char *nn = newname ? strdup(newname) : NULL;
	struct dsfs_node *gone;

	/* A node at the target is replaced: it is gone. */
	if (newdir) {
		t.parent = dsfs_overlay_node_of(newdir);
		old = dsfs_nodes_find_child(&fs->nodes, newdir->ino, newname,
					    dsfs_overlay_node_match, &t);
	}
	n = dsfs_nodes_find_child(&fs->nodes, dir->ino, name,
				  dsfs_overlay_node_match, &m);
	pthread_mutex_lock(&st->lock);
	if (old && old != n)
		dsfs_overlay_node_of(old)->gone = true;
	if (n) {
		struct dsfs_overlay_node *p = dsfs_overlay_node_of(n);

		if (!newdir || !nn) {
			p->gone = true;
		} else {
			struct dsfs_overlay_node *np =
				dsfs_overlay_node_of(newdir);

			if (np != &st->top)
				np->refs++;
			dsfs_overlay_node_unref_locked(st, p->parent);
			p->parent = np;
			free(p->name);
			p->name = nn;
			nn = NULL;
		}
	}
	pthread_mutex_unlock(&st->lock);
	free(nn);
	/* Drop the references the finds took. */
	for (int i = 0; i < 2; i++) {
		struct dsfs_node *x = i ? old : n;

		if (!x)
			continue;
		gone = dsfs_nodes_forget(&fs->nodes, x->ino, 1);
		if (gone) {
			dsfs_overlay_node_forget(fs, gone);
			dsfs_node_free(gone);
		}
	}
}
