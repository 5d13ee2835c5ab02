// SPDX-License-Identifier: MIT
/*
 * dsfs_ops: the FUSE low-level operations of dstagefs, the top of the
 * dispatcher. Each one finds the node, takes the caller from the request,
 * calls the node's subtree hook (struct dsfs_subtree, dsfs_subtree.h) and
 * turns its 0 / -errno into the one FUSE reply. A hook a subtree leaves
 * NULL gets the default written next to it in dsfs_subtree.h: EROFS for
 * every modification (the dataset view, the root and .dstage/ are
 * read-only; checkpoints/ and the overlay fill in their write hooks),
 * ENOTSUP for reading extended attributes, EISDIR/ENOTDIR where a file or
 * directory operation meets the other kind. A writable subtree fills in
 * its hooks; this file does not change.
 *
 * Stateless apart from the open handles. The fi->fh the kernel holds is a
 * struct dsfs_handle, kept on fs->handles (fs->handle_lock, a leaf lock)
 * from the OPEN/OPENDIR/CREATE reply until its last reference goes;
 * subtrees see their own fh only (dsfs_ops_fi). Whatever the kernel never
 * releases (the session ended first) dsfs_ops_release_handles releases at
 * teardown, so no subtree state outlives the mount.
 *
 * Life of a handle (refs: one for the kernel, one per request running on
 * it):
 *
 *   OPEN hook ok --dsfs_ops_handle_add--> OPEN (refs 1, on fs->handles,
 *   its node pinned: dsfs_nodes_ref)
 *   OPEN --a request with fi (read, readdir, write, ...)--> refs + 1 until
 *   that request has replied and its hook returned (dsfs_ops_leave)
 *   OPEN --RELEASE/RELEASEDIR, or its OPEN reply interrupted--> refs - 1
 *   refs 0 --> off fs->handles, the subtree's release(dir), the node's
 *   pin dropped, freed; run by whichever request dropped the last one.
 *
 * Why a request holds a reference: the kernel sends RELEASE only after
 * every request on the file was answered, but "answered" is the moment
 * its writev on /dev/fuse hands the kernel the reply, before that writev
 * returns here. The caller, woken, may close at once, and the RELEASE be
 * served by another thread while the replying one is still inside
 * fuse_reply_*() with a buffer the handle owns (.dstage texts; ASan's
 * writev checks the iovec after the call) or in the hook's code after
 * the reply. With the reference, the subtree's release runs only once
 * every such request is done, for every subtree at once.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "dsfs_conn.h"
#include "dsfs_ops.h"
#include "dsfs_opts.h"
#include "dstage/log.h"

struct dsfs_handle {
	struct dsfs_handle *prev, *next; /* fs->handle_lock */
	struct dsfs_node *n; /* pinned (dsfs_nodes_ref) until freed */
	uint64_t fh; /* the subtree's */
	int flags; /* open(2) flags, for the subtree's release */
	bool dir;
	/* Atomic: the kernel's (OPEN to RELEASE) and one per request using
	 * the handle. Raised only while the kernel's is held (a request on
	 * fh comes before its RELEASE), so it never rises from 0. */
	atomic_uint refs;
	/* The kernel's RELEASE came (set before it drops its reference):
	 * the last reference may then be another request's, dropped after
	 * its reply (a FLUSH's, racing the RELEASE its close sent). */
	atomic_bool released;
};

static struct dsfs *dsfs_ops_fs(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

#ifndef DSTAGE_HAVE_FUSE_URING
#define DSTAGE_HAVE_FUSE_URING 0
#endif

/* Count a request that came over io_uring (libfuse >= 3.18 mounted with
 * -o io_uring where the kernel offers it); the first one is logged. Every
 * request handler calls it (through dsfs_ops_node, or itself) but INIT's,
 * which always comes over /dev/fuse. */
static void dsfs_ops_transport(fuse_req_t req)
{
#if DSTAGE_HAVE_FUSE_URING
	if (fuse_req_is_uring(req) &&
	    atomic_fetch_add_explicit(&dsfs_ops_fs(req)->ctr.uring_requests, 1,
				      memory_order_relaxed) == 0)
		log_info("FUSE over io_uring: requests arrive on the "
			 "kernel's ring");
#else
	(void)req;
#endif
}

/* The node ino and the request's caller; replies ESTALE if there is no
 * such node (then returns NULL). */
static struct dsfs_node *dsfs_ops_node(fuse_req_t req, fuse_ino_t ino,
				       struct dsfs_caller *who)
{
	struct dsfs_node *n = dsfs_nodes_find(&dsfs_ops_fs(req)->nodes, ino);

	dsfs_ops_transport(req);
	if (!n)
		fuse_reply_err(req, ESTALE);
	else
		dsfs_caller_get(req, who);
	return n;
}

/* Reply 0 or -ret. */
static void dsfs_ops_reply_err(fuse_req_t req, int ret)
{
	fuse_reply_err(req, ret < 0 ? -ret : 0);
}

/* What an operation on a node starts from: the mount, the caller, the
 * node, and room for the subtree's view of the kernel's fi. */
struct dsfs_ops_ctx {
	struct dsfs *fs;
	struct dsfs_caller who;
	struct dsfs_node *n;
	struct fuse_file_info sfi;
	struct dsfs_handle *h; /* a reference taken by dsfs_ops_cfi, or NULL */
};

/* Fill c for node ino of req. false when there is no such node (ESTALE
 * has been replied). */
static bool dsfs_ops_enter(fuse_req_t req, fuse_ino_t ino,
			   struct dsfs_ops_ctx *c)
{
	c->fs = dsfs_ops_fs(req);
	c->h = NULL;
	c->n = dsfs_ops_node(req, ino, &c->who);
	return c->n != NULL;
}

/*
 * The value of hook op of c's node's subtree, called as
 * op(fs, who, node, ...), or dflt when the subtree leaves it NULL (the
 * defaults are those dsfs_subtree.h writes next to each hook).
 */
#define DSFS_OPS_CALL(c, op, dflt, ...)                                     \
	((c)->n->sub->op                                                    \
		 ? (c)->n->sub->op((c)->fs, &(c)->who, (c)->n, __VA_ARGS__) \
		 : (dflt))

/* Let the node's subtree release n->priv and free an unlinked node. */
static void dsfs_ops_free_node(struct dsfs *fs, struct dsfs_node *n)
{
	if (!n)
		return;
	if (n->sub->forget)
		n->sub->forget(fs, n);
	dsfs_node_free(n);
}

static void dsfs_ops_unref(struct dsfs *fs, struct dsfs_node *n, uint64_t count)
{
	dsfs_ops_free_node(fs, dsfs_nodes_forget(&fs->nodes, n->ino, count));
}

/* ---- open handles ---- */

/* Call the subtree's release for what it handed out (fh, with the open
 * flags it saw). */
static void dsfs_ops_sub_release(struct dsfs *fs, struct dsfs_caller *who,
				 struct dsfs_node *n, bool dir, uint64_t fh,
				 int flags)
{
	struct fuse_file_info fi = { .flags = flags, .fh = fh };

	if (dir && n->sub->releasedir)
		n->sub->releasedir(fs, who, n, &fi);
	else if (!dir && n->sub->release)
		n->sub->release(fs, who, n, &fi);
}

/* Wrap the subtree's fi->fh in a handle on fs->handles. On -ENOMEM the
 * subtree's handle is released here. */
static int dsfs_ops_handle_add(struct dsfs *fs, struct dsfs_caller *who,
			       struct dsfs_node *n, struct fuse_file_info *fi,
			       bool dir)
{
	struct dsfs_handle *h = calloc(1, sizeof(*h));

	if (!h) {
		dsfs_ops_sub_release(fs, who, n, dir, fi->fh, fi->flags);
		return -ENOMEM;
	}
	h->n = n;
	h->fh = fi->fh;
	h->flags = fi->flags;
	h->dir = dir;
	atomic_init(&h->refs, 1);
	atomic_init(&h->released, false);
	dsfs_nodes_ref(&fs->nodes, n);
	pthread_mutex_lock(&fs->handle_lock);
	h->next = fs->handles;
	if (h->next)
		h->next->prev = h;
	fs->handles = h;
	pthread_mutex_unlock(&fs->handle_lock);
	fi->fh = (uintptr_t)h;
	return 0;
}

/* The subtree's view of fi (its own fh). fi may be NULL. */
static struct fuse_file_info *dsfs_ops_fi(const struct fuse_file_info *fi,
					  struct fuse_file_info *sub)
{
	if (!fi)
		return NULL;
	*sub = *fi;
	sub->fh = ((struct dsfs_handle *)(uintptr_t)fi->fh)->fh;
	return sub;
}

/* The subtree's view of fi, kept in c, with a reference on its handle
 * that dsfs_ops_leave drops. */
static struct fuse_file_info *dsfs_ops_cfi(struct dsfs_ops_ctx *c,
					   const struct fuse_file_info *fi)
{
	if (fi && !c->h) {
		c->h = (struct dsfs_handle *)(uintptr_t)fi->fh;
		atomic_fetch_add_explicit(&c->h->refs, 1, memory_order_relaxed);
	}
	return dsfs_ops_fi(fi, &c->sfi);
}

/* Drop one reference of h; the last takes h off fs->handles, releases
 * what it wraps (as who: the caller of the request that dropped it, with
 * who->released telling whether the kernel's RELEASE came) and unpins its
 * node. */
static void dsfs_ops_handle_put(struct dsfs *fs, struct dsfs_caller *who,
				struct dsfs_handle *h)
{
	if (atomic_fetch_sub_explicit(&h->refs, 1, memory_order_acq_rel) != 1)
		return;
	who->released = atomic_load(&h->released);
	pthread_mutex_lock(&fs->handle_lock);
	if (h->prev)
		h->prev->next = h->next;
	else
		fs->handles = h->next;
	if (h->next)
		h->next->prev = h->prev;
	pthread_mutex_unlock(&fs->handle_lock);
	dsfs_ops_sub_release(fs, who, h->n, h->dir, h->fh, h->flags);
	dsfs_ops_unref(fs, h->n, 1);
	free(h);
}

/*
 * Tests only: DSTAGE_TEST_LEAVE_DELAY_MS (1-1000) holds every request that
 * used a handle for that long after its reply, before it drops its
 * reference, so that a RELEASE the reply let the kernel send is handled
 * first and the handle's last reference is this request's (the race that
 * made a writer's deferred publish look like teardown). Read once.
 */
static long dsfs_ops_test_leave_ms(void)
{
	static atomic_long cached = -1;
	long ms = atomic_load_explicit(&cached, memory_order_relaxed);
	const char *v;

	if (ms >= 0)
		return ms;
	v = getenv("DSTAGE_TEST_LEAVE_DELAY_MS");
	ms = v ? strtol(v, NULL, 10) : 0;
	if (ms < 0 || ms > 1000)
		ms = 0;
	atomic_store_explicit(&cached, ms, memory_order_relaxed);
	return ms;
}

/* The end of a request that used c->h: its reply is sent and its hook
 * returned. */
static void dsfs_ops_leave(struct dsfs_ops_ctx *c)
{
	long ms = c->h ? dsfs_ops_test_leave_ms() : 0;

	/* The request was answered: a release run from here has no
	 * request (its req is freed; dsfs_caller.h). */
	c->who.req = NULL;
	if (ms)
		nanosleep(&(struct timespec){ ms / 1000, ms % 1000 * 1000000 },
			  NULL);
	if (c->h)
		dsfs_ops_handle_put(c->fs, &c->who, c->h);
	c->h = NULL;
}

void dsfs_ops_release_handles(struct dsfs *fs)
{
	struct dsfs_caller who;
	struct dsfs_handle *h;
	size_t n = 0;

	dsfs_caller_none(&who);
	pthread_mutex_lock(&fs->handle_lock);
	h = fs->handles;
	fs->handles = NULL;
	pthread_mutex_unlock(&fs->handle_lock);
	while (h) {
		struct dsfs_handle *next = h->next;

		dsfs_ops_sub_release(fs, &who, h->n, h->dir, h->fh, h->flags);
		dsfs_ops_unref(fs, h->n, 1);
		free(h);
		h = next;
		n++;
	}
	if (n)
		log_info("released %zu handle(s) the kernel left open", n);
}

/* Answer an OPEN, OPENDIR (or CREATE, e set) whose hook returned ret. */
static void dsfs_ops_reply_open(fuse_req_t req, struct dsfs *fs,
				struct dsfs_caller *who, struct dsfs_node *n,
				int ret, struct fuse_file_info *fi, bool dir,
				struct dsfs_entry *e)
{
	struct fuse_entry_param ep;
	int sent;

	if (!ret)
		ret = dsfs_ops_handle_add(fs, who, e ? e->node : n, fi, dir);
	if (ret) {
		if (e)
			dsfs_ops_unref(fs, e->node, 1);
		dsfs_ops_reply_err(req, ret);
		return;
	}
	if (e) {
		memset(&ep, 0, sizeof(ep));
		ep.ino = e->node->ino;
		ep.generation = 1;
		ep.attr = e->attr;
		ep.attr.st_ino = e->node->ino;
		ep.attr_timeout = e->attr_timeout;
		ep.entry_timeout = e->entry_timeout;
		sent = fuse_reply_create(req, &ep, fi);
	} else {
		sent = fuse_reply_open(req, fi);
	}
	if (sent == -ENOENT) { /* interrupted: no RELEASE will come */
		who->req = NULL; /* answered (freed) */
		dsfs_ops_handle_put(fs, who,
				    (struct dsfs_handle *)(uintptr_t)fi->fh);
		if (e)
			dsfs_ops_unref(fs, e->node, 1);
	}
}

/* ---- lifecycle ---- */

static void dsfs_ops_init(void *userdata, struct fuse_conn_info *conn)
{
	struct dsfs *fs = userdata;
	unsigned max_write = fs->opts->max_write_kb * 1024;

	/*
	 * Request size: the kernel's max_pages follows max_write (libfuse
	 * 3.14 caps it at its buffer, 256 pages), and max_pages bounds READ
	 * requests too; max_read is unlimited unless -o max_read says so.
	 * conn->max_readahead cannot exceed what the kernel offered (its
	 * bdi's read_ahead_kb, 128 KiB by default): the poller raises the
	 * bdi's read_ahead_kb after mounting instead (opts.read_ahead_kb).
	 */
	conn->max_write = max_write;
	if (fs->opts->splice) {
		if (conn->capable & FUSE_CAP_SPLICE_WRITE)
			conn->want |= FUSE_CAP_SPLICE_WRITE;
		if (conn->capable & FUSE_CAP_SPLICE_MOVE)
			conn->want |= FUSE_CAP_SPLICE_MOVE;
	}
	if (conn->capable & FUSE_CAP_READDIRPLUS) {
		conn->want |= FUSE_CAP_READDIRPLUS;
		conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
	}
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	/* Snapshots never change: no invalidation on mtime changes. */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	if (conn->capable & FUSE_CAP_EXPLICIT_INVAL_DATA)
		conn->want |= FUSE_CAP_EXPLICIT_INVAL_DATA;
	if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
		conn->want |= FUSE_CAP_CACHE_SYMLINKS;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	dsfs_init_conn(fs, conn); /* passthrough: dsfs_conn.c */
	log_info("fuse: protocol %u.%u, max_write %u, max_readahead %u, "
		 "splice %s, readdirplus %s",
		 conn->proto_major, conn->proto_minor, conn->max_write,
		 conn->max_readahead,
		 (conn->want & FUSE_CAP_SPLICE_WRITE) ? "on" : "off",
		 (conn->want & FUSE_CAP_READDIRPLUS) ? "on" : "off");
}

/* ---- names ---- */

/* Answer an operation that found or made an entry (lookup, mknod, mkdir,
 * symlink, link). */
static void dsfs_ops_reply_entry(fuse_req_t req, struct dsfs *fs, int ret,
				 const struct dsfs_entry *e)
{
	struct fuse_entry_param ep;

	memset(&ep, 0, sizeof(ep));
	if (ret == -ENOENT && !e->node && e->entry_timeout > 0) {
		/* A negative entry: the kernel remembers the absence. */
		ep.entry_timeout = e->entry_timeout;
		fuse_reply_entry(req, &ep);
		return;
	}
	if (ret || !e->node) {
		dsfs_ops_reply_err(req, ret ? ret : -EIO);
		return;
	}
	ep.ino = e->node->ino;
	ep.generation = 1;
	ep.attr = e->attr;
	ep.attr.st_ino = e->node->ino;
	ep.attr_timeout = e->attr_timeout;
	ep.entry_timeout = e->entry_timeout;
	if (fuse_reply_entry(req, &ep) == -ENOENT)
		dsfs_ops_unref(fs, e->node, 1); /* request interrupted */
}

static void dsfs_ops_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct dsfs_entry e = { 0 };
	struct dsfs_ops_ctx c;

	if (dsfs_ops_enter(req, parent, &c))
		dsfs_ops_reply_entry(
			req, c.fs,
			DSFS_OPS_CALL(&c, lookup, -ENOTDIR, name, &e), &e);
}

static void dsfs_ops_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct dsfs *fs = dsfs_ops_fs(req);

	dsfs_ops_transport(req);
	dsfs_ops_free_node(fs, dsfs_nodes_forget(&fs->nodes, ino, nlookup));
	dsfs_nodes_trim(&fs->nodes);
	fuse_reply_none(req);
}

static void dsfs_ops_forget_multi(fuse_req_t req, size_t count,
				  struct fuse_forget_data *forgets)
{
	struct dsfs *fs = dsfs_ops_fs(req);

	dsfs_ops_transport(req);
	for (size_t i = 0; i < count; i++)
		dsfs_ops_free_node(fs,
				   dsfs_nodes_forget(&fs->nodes, forgets[i].ino,
						     forgets[i].nlookup));
	dsfs_nodes_trim(&fs->nodes);
	fuse_reply_none(req);
}

static void dsfs_ops_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
			   mode_t mode, dev_t rdev)
{
	struct dsfs_entry e = { 0 };
	struct dsfs_ops_ctx c;

	if (dsfs_ops_enter(req, parent, &c))
		dsfs_ops_reply_entry(
			req, c.fs,
			DSFS_OPS_CALL(&c, mknod, -EROFS, name, mode, rdev, &e),
			&e);
}

static void dsfs_ops_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
			   mode_t mode)
{
	struct dsfs_entry e = { 0 };
	struct dsfs_ops_ctx c;

	if (dsfs_ops_enter(req, parent, &c))
		dsfs_ops_reply_entry(
			req, c.fs,
			DSFS_OPS_CALL(&c, mkdir, -EROFS, name, mode, &e), &e);
}

static void dsfs_ops_symlink(fuse_req_t req, const char *link,
			     fuse_ino_t parent, const char *name)
{
	struct dsfs_entry e = { 0 };
	struct dsfs_ops_ctx c;

	/* The one hook whose node (the directory) is not its third argument. */
	if (dsfs_ops_enter(req, parent, &c))
		dsfs_ops_reply_entry(req, c.fs,
				     c.n->sub->symlink
					     ? c.n->sub->symlink(c.fs, &c.who,
								 link, c.n,
								 name, &e)
					     : -EROFS,
				     &e);
}

static void dsfs_ops_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
			  const char *newname)
{
	struct dsfs_entry e = { 0 };
	struct dsfs_ops_ctx c;
	struct dsfs_node *dir;
	int ret;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	dir = dsfs_nodes_find(&c.fs->nodes, newparent);
	if (!dir)
		ret = -ESTALE;
	else if (c.n->sub->link && dir->sub != c.n->sub)
		ret = -EXDEV;
	else
		ret = DSFS_OPS_CALL(&c, link, -EROFS, dir, newname, &e);
	dsfs_ops_reply_entry(req, c.fs, ret, &e);
}

static void dsfs_ops_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct dsfs_ops_ctx c;

	if (dsfs_ops_enter(req, parent, &c))
		dsfs_ops_reply_err(req,
				   DSFS_OPS_CALL(&c, unlink, -EROFS, name));
}

static void dsfs_ops_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct dsfs_ops_ctx c;

	if (dsfs_ops_enter(req, parent, &c))
		dsfs_ops_reply_err(req, DSFS_OPS_CALL(&c, rmdir, -EROFS, name));
}

static void dsfs_ops_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
			    fuse_ino_t newparent, const char *newname,
			    unsigned int flags)
{
	struct dsfs_ops_ctx c;
	struct dsfs_node *ndir;
	int ret;

	if (!dsfs_ops_enter(req, parent, &c))
		return;
	ndir = dsfs_nodes_find(&c.fs->nodes, newparent);
	/* Only within one subtree; across subtrees is another device. */
	if (!ndir)
		ret = -ESTALE;
	else if (c.n->sub->rename && c.n->sub != ndir->sub)
		ret = -EXDEV;
	else
		ret = DSFS_OPS_CALL(&c, rename, -EROFS, name, ndir, newname,
				    flags);
	dsfs_ops_reply_err(req, ret);
}

static void dsfs_ops_create(fuse_req_t req, fuse_ino_t parent, const char *name,
			    mode_t mode, struct fuse_file_info *fi)
{
	struct dsfs_entry e = { 0 };
	struct dsfs_ops_ctx c;
	int ret;

	if (!dsfs_ops_enter(req, parent, &c))
		return;
	ret = DSFS_OPS_CALL(&c, create, -EROFS, name, mode, fi, &e);
	if (ret || !e.node) {
		dsfs_ops_reply_err(req, ret ? ret : -EIO);
		return;
	}
	dsfs_ops_reply_open(req, c.fs, &c.who, c.n, 0, fi, false, &e);
}

/* ---- attributes ---- */

/* Answer GETATTR or SETATTR whose hook returned ret and filled st. */
static void dsfs_ops_reply_attr(fuse_req_t req, const struct dsfs_ops_ctx *c,
				int ret, struct stat *st, double timeout)
{
	if (ret) {
		dsfs_ops_reply_err(req, ret);
		return;
	}
	st->st_ino = c->n->ino;
	fuse_reply_attr(req, st, timeout);
}

static void dsfs_ops_getattr(fuse_req_t req, fuse_ino_t ino,
			     struct fuse_file_info *fi)
{
	struct dsfs_ops_ctx c;
	double timeout = 0;
	struct stat st;
	int ret;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	/* Not one expression: the hook sets timeout, read after it. */
	ret = DSFS_OPS_CALL(&c, getattr, -ENOSYS, dsfs_ops_cfi(&c, fi), &st,
			    &timeout);
	dsfs_ops_reply_attr(req, &c, ret, &st, timeout);
	dsfs_ops_leave(&c);
}

static void dsfs_ops_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
			     int to_set, struct fuse_file_info *fi)
{
	struct dsfs_ops_ctx c;
	double timeout = 0;
	struct stat st;
	int ret;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	ret = DSFS_OPS_CALL(&c, setattr, -EROFS, attr, to_set,
			    dsfs_ops_cfi(&c, fi), &st, &timeout);
	dsfs_ops_reply_attr(req, &c, ret, &st, timeout);
	dsfs_ops_leave(&c);
}

static void dsfs_ops_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct dsfs_ops_ctx c;

	if (dsfs_ops_enter(req, ino, &c))
		dsfs_ops_reply_err(
			req, DSFS_OPS_CALL(&c, access,
					   (mask & W_OK) ? -EROFS : 0, mask));
}

static void dsfs_ops_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct dsfs_ops_ctx c;
	char buf[PATH_MAX];
	int ret;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	ret = DSFS_OPS_CALL(&c, readlink, -EINVAL, buf, sizeof(buf));
	if (ret) {
		dsfs_ops_reply_err(req, ret);
		return;
	}
	buf[sizeof(buf) - 1] = '\0';
	fuse_reply_readlink(req, buf);
}

static void dsfs_ops_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct dsfs *fs = dsfs_ops_fs(req);
	struct dsfs_node *n = dsfs_nodes_find(&fs->nodes, ino);
	struct dsfs_node *root = dsfs_nodes_find(&fs->nodes, DSFS_INO_ROOT);
	struct dsfs_caller who;
	struct statvfs sv;
	int ret = 0;

	dsfs_ops_transport(req);
	dsfs_caller_get(req, &who);
	memset(&sv, 0, sizeof(sv));
	sv.f_namemax = 255;
	if (n && n->sub->statfs)
		ret = n->sub->statfs(fs, &who, n, &sv);
	else if (root && root->sub->statfs)
		ret = root->sub->statfs(fs, &who, root, &sv);
	if (ret)
		dsfs_ops_reply_err(req, ret);
	else
		fuse_reply_statfs(req, &sv);
}

/* ---- files ---- */

static void dsfs_ops_open(fuse_req_t req, fuse_ino_t ino,
			  struct fuse_file_info *fi)
{
	struct dsfs_ops_ctx c;

	if (dsfs_ops_enter(req, ino, &c))
		dsfs_ops_reply_open(req, c.fs, &c.who, c.n,
				    DSFS_OPS_CALL(&c, open, -EISDIR, fi), fi,
				    false, NULL);
}

static void dsfs_ops_read(fuse_req_t req, fuse_ino_t ino, size_t size,
			  off_t off, struct fuse_file_info *fi)
{
	struct dsfs_reply_read r = { .req = req };
	struct dsfs_ops_ctx c;
	int ret;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	ret = DSFS_OPS_CALL(&c, read, -EISDIR, dsfs_ops_cfi(&c, fi), size, off,
			    &r);
	if (!r.sent && ret)
		dsfs_ops_reply_err(req, ret);
	else if (!r.sent)
		fuse_reply_buf(req, NULL, 0);
	dsfs_ops_leave(&c);
}

static void dsfs_ops_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
			   size_t size, off_t off, struct fuse_file_info *fi)
{
	struct dsfs_ops_ctx c;
	ssize_t w;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	w = DSFS_OPS_CALL(&c, write, -EROFS, dsfs_ops_cfi(&c, fi), buf, size,
			  off);
	if (w < 0)
		dsfs_ops_reply_err(req, (int)w);
	else
		fuse_reply_write(req, (size_t)w);
	dsfs_ops_leave(&c);
}

static void dsfs_ops_flush(fuse_req_t req, fuse_ino_t ino,
			   struct fuse_file_info *fi)
{
	struct dsfs_ops_ctx c;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	dsfs_ops_reply_err(req,
			   DSFS_OPS_CALL(&c, flush, 0, dsfs_ops_cfi(&c, fi)));
	dsfs_ops_leave(&c);
}

static void dsfs_ops_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
			   struct fuse_file_info *fi)
{
	struct dsfs_ops_ctx c;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	dsfs_ops_reply_err(req, DSFS_OPS_CALL(&c, fsync, 0, datasync,
					      dsfs_ops_cfi(&c, fi)));
	dsfs_ops_leave(&c);
}

static void dsfs_ops_fallocate(fuse_req_t req, fuse_ino_t ino, int mode,
			       off_t off, off_t len, struct fuse_file_info *fi)
{
	struct dsfs_ops_ctx c;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	dsfs_ops_reply_err(req, DSFS_OPS_CALL(&c, fallocate, -EROFS, mode, off,
					      len, dsfs_ops_cfi(&c, fi)));
	dsfs_ops_leave(&c);
}

/* release and releasedir: the handle is put, whatever it holds. */
static void dsfs_ops_release(fuse_req_t req, fuse_ino_t ino,
			     struct fuse_file_info *fi)
{
	struct dsfs_caller who;

	struct dsfs_handle *h = (struct dsfs_handle *)(uintptr_t)fi->fh;

	(void)ino;
	dsfs_caller_get(req, &who);
	atomic_store(&h->released, true);
	dsfs_ops_handle_put(dsfs_ops_fs(req), &who, h);
	fuse_reply_err(req, 0);
}

/* ---- directories ---- */

static void dsfs_ops_opendir(fuse_req_t req, fuse_ino_t ino,
			     struct fuse_file_info *fi)
{
	struct dsfs_ops_ctx c;
	int ret;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	if (!c.n->sub->readdir)
		ret = -ENOTDIR;
	else
		ret = DSFS_OPS_CALL(&c, opendir, 0, fi);
	dsfs_ops_reply_open(req, c.fs, &c.who, c.n, ret, fi, true, NULL);
}

static void dsfs_ops_readdir_any(fuse_req_t req, fuse_ino_t ino, size_t size,
				 off_t off, struct fuse_file_info *fi,
				 bool plus)
{
	struct dsfs_reply_dir d = { .req = req, .plus = plus, .size = size };
	struct dsfs_ops_ctx c;
	int ret;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	if (!c.n->sub->readdir) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	d.buf = malloc(size ? size : 1);
	if (!d.buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ret = DSFS_OPS_CALL(&c, readdir, -ENOTDIR, dsfs_ops_cfi(&c, fi), off,
			    &d);
	/* Entries already added were counted as looked up (plus): they
	 * must go out even if a later one failed. */
	if (ret && !d.used)
		dsfs_ops_reply_err(req, ret);
	else
		fuse_reply_buf(req, d.buf, d.used);
	free(d.buf);
	dsfs_ops_leave(&c);
}

static void dsfs_ops_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
			     off_t off, struct fuse_file_info *fi)
{
	dsfs_ops_readdir_any(req, ino, size, off, fi, false);
}

static void dsfs_ops_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
				 off_t off, struct fuse_file_info *fi)
{
	dsfs_ops_readdir_any(req, ino, size, off, fi, true);
}

static void dsfs_ops_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
			      struct fuse_file_info *fi)
{
	struct dsfs_ops_ctx c;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	dsfs_ops_reply_err(req, DSFS_OPS_CALL(&c, fsyncdir, 0, datasync,
					      dsfs_ops_cfi(&c, fi)));
	dsfs_ops_leave(&c);
}

/* ---- extended attributes ---- */

static void dsfs_ops_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			      const char *value, size_t size, int flags)
{
	struct dsfs_ops_ctx c;

	if (dsfs_ops_enter(req, ino, &c))
		dsfs_ops_reply_err(req,
				   DSFS_OPS_CALL(&c, setxattr, -EROFS, name,
						 value, size, flags));
}

static void dsfs_ops_removexattr(fuse_req_t req, fuse_ino_t ino,
				 const char *name)
{
	struct dsfs_ops_ctx c;

	if (dsfs_ops_enter(req, ino, &c))
		dsfs_ops_reply_err(
			req, DSFS_OPS_CALL(&c, removexattr, -EROFS, name));
}

/*
 * The answer to GETXATTR/LISTXATTR on a subtree without the hook: ENOTSUP.
 * While no subtree has them, ENOSYS instead: the kernel then stops asking
 * (ls -l asks per file) and gives callers the same EOPNOTSUPP.
 */
static int dsfs_ops_no_xattr(struct dsfs *fs)
{
	for (int i = 0; i < DSFS_SUB_COUNT; i++)
		if (fs->subs[i]->getxattr || fs->subs[i]->listxattr)
			return ENOTSUP;
	return ENOSYS;
}

/* GETXATTR (name) and LISTXATTR (name NULL): size 0 asks for the length
 * only. */
static void dsfs_ops_xattr_get(fuse_req_t req, fuse_ino_t ino, const char *name,
			       size_t size)
{
	struct dsfs_ops_ctx c;
	char *buf = NULL;
	ssize_t len;

	if (!dsfs_ops_enter(req, ino, &c))
		return;
	if (!(name ? c.n->sub->getxattr != NULL
		   : c.n->sub->listxattr != NULL)) {
		fuse_reply_err(req, dsfs_ops_no_xattr(c.fs));
		return;
	}
	if (size && !(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	len = name ? c.n->sub->getxattr(c.fs, &c.who, c.n, name, buf, size)
		   : c.n->sub->listxattr(c.fs, &c.who, c.n, buf, size);
	if (len < 0)
		dsfs_ops_reply_err(req, (int)len);
	else if (!size)
		fuse_reply_xattr(req, (size_t)len);
	else
		fuse_reply_buf(req, buf, (size_t)len);
	free(buf);
}

static void dsfs_ops_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			      size_t size)
{
	dsfs_ops_xattr_get(req, ino, name, size);
}

static void dsfs_ops_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	dsfs_ops_xattr_get(req, ino, NULL, size);
}

const struct fuse_lowlevel_ops dsfs_ops_ll = {
	.init = dsfs_ops_init,
	.lookup = dsfs_ops_lookup,
	.forget = dsfs_ops_forget,
	.forget_multi = dsfs_ops_forget_multi,
	.getattr = dsfs_ops_getattr,
	.setattr = dsfs_ops_setattr,
	.readlink = dsfs_ops_readlink,
	.mknod = dsfs_ops_mknod,
	.mkdir = dsfs_ops_mkdir,
	.unlink = dsfs_ops_unlink,
	.rmdir = dsfs_ops_rmdir,
	.symlink = dsfs_ops_symlink,
	.rename = dsfs_ops_rename,
	.link = dsfs_ops_link,
	.open = dsfs_ops_open,
	.read = dsfs_ops_read,
	.write = dsfs_ops_write,
	.flush = dsfs_ops_flush,
	.release = dsfs_ops_release,
	.fsync = dsfs_ops_fsync,
	.opendir = dsfs_ops_opendir,
	.readdir = dsfs_ops_readdir,
	.releasedir = dsfs_ops_release,
	.fsyncdir = dsfs_ops_fsyncdir,
	.statfs = dsfs_ops_statfs,
	.setxattr = dsfs_ops_setxattr,
	.getxattr = dsfs_ops_getxattr,
	.listxattr = dsfs_ops_listxattr,
	.removexattr = dsfs_ops_removexattr,
	.access = dsfs_ops_access,
	.create = dsfs_ops_create,
	.fallocate = dsfs_ops_fallocate,
	.readdirplus = dsfs_ops_readdirplus,
};
