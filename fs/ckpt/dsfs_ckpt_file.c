// SPDX-License-Identifier: MIT
/*
 * dsfs_ckpt_file: the open files of the checkpoint subtree (its create,
 * mknod, open, read, write, flush, fsync, fallocate and release hooks;
 * the subtree itself is dsfs_ckpt.c).
 *
 * A handle (struct dsfs_ckpt_file_handle, fi->fh) wraps libdstage's
 * struct ckpt_file. A file is published when its last writer is done
 * (issue 42; docs/checkpoints.md, "When a file is published"):
 *
 *   - fsync or fdatasync of a handle open for writing publishes;
 *     of a read-only handle, nothing (a reader cannot publish);
 *   - a close (FLUSH) publishes when it is the writer's: the handle is
 *     open for writing, the closing process opened it or wrote through
 *     it, is not dying of a signal, holds the file through no other
 *     descriptor, no other handle is open for writing on the file
 *     (ckpt_file_writers), and no other process holds it open for
 *     writing (a forked or exec'd child's copy of the descriptor:
 *     dsfs_ckpt_proc_others_write). When only the last conditions fail
 *     the handle is marked deferred;
 *   - the kernel's RELEASE of a deferred handle (every copy of the
 *     descriptor closed) publishes when it is the last handle open for
 *     writing and no writer of it was killed;
 *   - otherwise the last writable handle's close or RELEASE publishes.
 *
 * Nothing else publishes: not a truncate, fallocate, rename or O_TRUNC
 * (issue 34). A file whose last writer was killed is never published:
 * its last handle's close moves it to abandoned/ (lib/ckpt).
 *
 * Each handle counts against its opener's uid (checkpoints.uid_open_files,
 * st->open_uids): an open or create past it fails with EDQUOT, so that one
 * user cannot take every descriptor and handle dstagefs has (root has no
 * per-uid bound, as for the staging bounds). dup(2) and fork(2) share one
 * handle; the kernel's RELEASE gives it back.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dsfs_cacheread.h"
#include "dsfs_ckpt_i.h"
#include "dsfs_opts.h"
#include "dstage/cache.h"
#include "dstage/ckpt.h"
#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/keypath.h"
#include "dstage/objstore.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"

/*
 * One open file of the subtree (fi->fh): the ckpt handle, and which
 * processes may publish it by closing it. The kernel sends FLUSH for every
 * close of every copy of the descriptor, also when a forked child execs or
 * exits (close-on-exec, exit): such a close must not publish a file the
 * parent is still writing. So a FLUSH publishes only when it comes from the
 * process that opened the file or one that wrote through it (see the rules
 * above). lock guards the pid fields and the flags; a leaf.
 */
#define DSFS_CKPT_FILE_WRITERS 8

struct dsfs_ckpt_file_handle {
	struct ckpt_file *f;
	pid_t opener; /* tgid that opened the file */
	uid_t uid; /* the opener's uid */
	bool held; /* counts against uid's open files (dsfs_ckpt_file_hold) */
	pthread_mutex_t lock;
	pid_t writers[DSFS_CKPT_FILE_WRITERS]; /* lock: tgids that wrote */
	unsigned nwriters; /* lock: above DSFS_CKPT_FILE_WRITERS: anyone */
	pid_t last_tid; /* lock: the last writing thread (a cache) */
	/* lock: a writer's close was not published because the file was
	 * still held (another descriptor of the process, another handle or
	 * process open for writing); a later close settles it, else the
	 * RELEASE publishes if this is the last writable handle */
	bool deferred;
	/* lock: a process that opened or wrote through this handle died of
	 * a signal while holding it: its RELEASE publishes nothing */
	bool killed;
	/* checkpoints.passthrough: the inode's opens this one counts in (NULL:
	 * off), and how it was answered */
	struct dsfs_pt *pt;
	enum dsfs_pt_kind kind;
	/* A read-only open of another uid's local copy with passthrough on
	 * (dsfs_ckpt_file_pt_read): read through dstagefs (direct I/O) at
	 * the version it opened (gen), -ESTALE once its owner changed it. */
	bool at_gen;
	uint64_t gen;
};

static struct dsfs_ckpt_file_handle *dsfs_ckpt_file_h(struct fuse_file_info *fi)
{
	return (struct dsfs_ckpt_file_handle *)(uintptr_t)fi->fh;
}

static struct ckpt_file *dsfs_ckpt_file_fh(struct fuse_file_info *fi)
{
	return dsfs_ckpt_file_h(fi)->f;
}

struct ckpt_file *dsfs_ckpt_file_of(struct fuse_file_info *fi)
{
	return dsfs_ckpt_file_fh(fi);
}

/* The EDQUOT line of checkpoints.uid_open_files, at most one each 10 s
 * (st->open_lock held). */
static void dsfs_ckpt_file_refused_locked(struct dsfs *fs, uid_t uid)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	int64_t now = timeutil_mono_ms();

	if (st->open_logged_ms && now - st->open_logged_ms < 10000)
		return;
	st->open_logged_ms = now;
	log_warn("checkpoints: uid %u reached checkpoints.uid_open_files (%u "
		 "open files) in %s/checkpoints: its opens and creates fail "
		 "with EDQUOT until it closes files",
		 (unsigned)uid, st->uid_open_max,
		 fs->opts && fs->opts->mountpoint ? fs->opts->mountpoint
						  : "the mount");
}

/*
 * Take one of uid's checkpoints.uid_open_files for a new handle. Returns
 * 0, with *held saying whether one was taken (none for root, nor on a
 * mount without the bound), -EDQUOT when uid holds them all (logged), or
 * -ENOMEM.
 */
static int dsfs_ckpt_file_hold(struct dsfs *fs, uid_t uid, bool *held)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct dsfs_ckpt_uid_open *u;
	int ret = 0;
	size_t i;

	*held = false;
	if (!st->uid_open_max || uid == 0)
		return 0;
	pthread_mutex_lock(&st->open_lock);
	for (i = 0; i < st->n_open && st->open_uids[i].uid != uid; i++)
		;
	if (i == st->n_open &&
	    GROW_ONE(st->open_uids, st->n_open, st->cap_open, 16)) {
		ret = -ENOMEM;
		goto out;
	}
	u = &st->open_uids[i];
	if (i == st->n_open) {
		u->uid = uid;
		u->handles = 0;
		st->n_open++;
	}
	if (u->handles >= st->uid_open_max) {
		dsfs_ckpt_file_refused_locked(fs, uid);
		ret = -EDQUOT;
		goto out;
	}
	u->handles++;
	*held = true;
out:
	pthread_mutex_unlock(&st->open_lock);
	return ret;
}

/* Give back one of uid's open files (dsfs_ckpt_file_hold set held). */
static void dsfs_ckpt_file_unhold(struct dsfs *fs, uid_t uid, bool held)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	size_t i;

	if (!held)
		return;
	pthread_mutex_lock(&st->open_lock);
	for (i = 0; i < st->n_open && st->open_uids[i].uid != uid; i++)
		;
	if (i < st->n_open && --st->open_uids[i].handles == 0)
		st->open_uids[i] = st->open_uids[--st->n_open];
	pthread_mutex_unlock(&st->open_lock);
}

/* Wrap f in a handle into fi->fh, with who's open file that
 * dsfs_ckpt_file_hold took (held). Returns 0 or -ENOMEM (f closed, the
 * open file given back). */
static int dsfs_ckpt_file_handle_new(struct dsfs *fs, struct dsfs_caller *who,
				     struct ckpt_file *f, bool held,
				     struct dsfs_pt *pt, enum dsfs_pt_kind kind,
				     struct fuse_file_info *fi)
{
	struct dsfs_ckpt_file_handle *h = calloc(1, sizeof(*h));

	if (!h) {
		if (pt)
			dsfs_pt_release(who, pt, kind);
		ckpt_file_close(f);
		dsfs_ckpt_file_unhold(fs, who->uid, held);
		return -ENOMEM;
	}
	h->f = f;
	h->pt = pt;
	h->kind = kind;
	h->opener = dsfs_ckpt_proc_tgid(who->pid);
	h->uid = who->uid;
	h->held = held;
	pthread_mutex_init(&h->lock, NULL);
	fi->fh = (uintptr_t)h;
	fi->keep_cache = 0; /* also what a passthrough open needs */
	fi->noflush = 0;
	return 0;
}

/*
 * Passthrough of checkpoint files (checkpoints.passthrough, off by
 * default; docs/checkpoints.md, "Reading back"): a read-only open of a file
 * this node holds a local copy of, opened read-only itself, is answered
 * with that copy as the backing file, and the kernel reads it. Every open
 * of the subtree's files is then counted per inode (dsfs_pt.h): one that
 * writes is counted before the file is opened, so that an O_TRUNC never
 * cuts the copy under a reader the kernel serves (it is refused with
 * ETXTBSY while one is there). Only the copy's owner's opens are passed
 * through (issue 42): another uid's reader would block the owner's
 * writes as long as it held the file. Another uid's read-only open reads
 * through dstagefs with direct I/O (no page cache the owner's writes
 * would change under it), at the version it opened: -ESTALE once the
 * owner wrote or truncated the copy, so it reads that version whole or
 * an error, never a mix (h->at_gen).
 */
static bool dsfs_ckpt_file_pt_on(struct dsfs *fs)
{
	return fs->cfg->ckpt_passthrough && fs->passthrough;
}

/* The backing file of a passthrough open: a read-only descriptor of f's
 * local copy of its own (the kernel keeps it). */
static int dsfs_ckpt_file_backing(void *arg, int *fd)
{
	*fd = ckpt_file_reopen(arg);
	return *fd < 0 ? *fd : 0;
}

/* Count a read-only open of f (opened) in pt, passed through when f reads
 * a local copy of who's own: 0, or -ETXTBSY (dsfs_pt_open). *kind: how;
 * *foreign: f reads a local copy of another uid's. */
static int dsfs_ckpt_file_pt_read(struct dsfs *fs, struct dsfs_caller *who,
				  struct dsfs_pt *pt, struct ckpt_file *f,
				  const char *key, struct fuse_file_info *fi,
				  enum dsfs_pt_kind *kind, bool *foreign)
{
	char tag[64] = "";
	struct stat sb;
	int local = ckpt_file_fd(f);
	bool may = local >= 0 && !ckpt_file_writable(f) && !fstat(local, &sb);

	*foreign = may && sb.st_uid != who->uid;
	may = may && !*foreign;

	/* The version the kernel's backing file is: the copy's inode. */
	if (may)
		snprintf(tag, sizeof(tag), "%llu:%llu",
			 (unsigned long long)sb.st_dev,
			 (unsigned long long)sb.st_ino);
	return dsfs_pt_open(fs, who, pt, may, dsfs_ckpt_file_backing, f, tag,
			    fi, "checkpoints", key, kind);
}

static void dsfs_ckpt_file_handle_free(struct dsfs *fs,
				       struct dsfs_ckpt_file_handle *h)
{
	if (!h)
		return;
	ckpt_file_close(h->f);
	dsfs_ckpt_file_unhold(fs, h->uid, h->held);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

/* ---- files ---- */

/* Note who as a writer of h. */
static void dsfs_ckpt_file_wrote(struct dsfs_ckpt_file_handle *h,
				 struct dsfs_caller *who)
{
	pid_t tg;

	pthread_mutex_lock(&h->lock);
	if (who->pid == h->last_tid || h->nwriters > DSFS_CKPT_FILE_WRITERS) {
		pthread_mutex_unlock(&h->lock);
		return;
	}
	h->last_tid = who->pid;
	pthread_mutex_unlock(&h->lock);
	tg = dsfs_ckpt_proc_tgid(who->pid);
	pthread_mutex_lock(&h->lock);
	for (unsigned i = 0; i < h->nwriters && i < DSFS_CKPT_FILE_WRITERS; i++)
		if (h->writers[i] == tg)
			goto out;
	if (h->nwriters < DSFS_CKPT_FILE_WRITERS)
		h->writers[h->nwriters] = tg;
	h->nwriters++;
out:
	pthread_mutex_unlock(&h->lock);
}

/* Whether a close by process tg may publish h (see struct
 * dsfs_ckpt_file_handle). */
static bool dsfs_ckpt_file_owner(struct dsfs_ckpt_file_handle *h, pid_t tg)
{
	bool ok = tg == h->opener;

	pthread_mutex_lock(&h->lock);
	ok = ok || h->nwriters > DSFS_CKPT_FILE_WRITERS;
	for (unsigned i = 0; !ok && i < h->nwriters; i++)
		ok = h->writers[i] == tg;
	pthread_mutex_unlock(&h->lock);
	return ok;
}

int dsfs_ckpt_file_create(struct dsfs *fs, struct dsfs_caller *who,
			  struct dsfs_node *dir, const char *name, mode_t mode,
			  struct fuse_file_info *fi, struct dsfs_entry *e)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct ckpt_file *f = NULL;
	struct ckpt_owner o = { 0 };
	struct ckpt_attr a;
	bool created, isnew = false, held = false;
	enum dsfs_pt_kind kind = DSFS_PT_PLAIN;
	struct dsfs_pt *pt = NULL;
	char *key;
	int ret = dsfs_ckpt_pn_new_key(fs, who, dir, name, &key);

	e->node = NULL;

	if (!ret)
		ret = dsfs_ckpt_may_create(fs, who, dir, key, fi->flags, mode,
					   &o, &isnew);
	/* before anything is made: a create past the bound leaves nothing */
	if (!ret)
		ret = dsfs_ckpt_file_hold(fs, who->uid, &held);
	/* checkpoints.passthrough: the inode's opens are counted, this one
	 * (a writer) before the file is opened or cut (dsfs_pt_open) */
	if (!ret && dsfs_ckpt_file_pt_on(fs)) {
		ret = dsfs_ckpt_pn_node(fs, dir, name, false, &e->node);
		if (!ret) {
			ret = dsfs_pt_open(
				fs, who, &dsfs_ckpt_pn_of(e->node)->pt, false,
				NULL, NULL, "", fi, "checkpoints", name, &kind);
			if (ret) {
				dsfs_ckpt_pn_unref_node(fs, e->node);
				e->node = NULL;
			} else {
				pt = &dsfs_ckpt_pn_of(e->node)->pt;
			}
		}
	}
	/* the owner before anything of the file reaches the store */
	/* the owner goes to the store just before the file's first
	 * publish (a writer killed first leaves nothing there) */
	if (!ret && isnew)
		ret = ckpt_owner_keep(dsfs_ckpt_st(fs)->ck, key, &o);
	if (!ret) {
		ret = ckpt_file_open_as(st->ck, key, fi->flags | O_CREAT,
					who->uid, &f, &created);
		if (ret && isnew) {
			ckpt_owner_remove(dsfs_ckpt_st(fs)->ck, key);
			ckpt_owner_move_kept(dsfs_ckpt_st(fs)->ck, key, NULL);
		}
	}
	free(key);
	if (!ret)
		ret = ckpt_file_attr(f, &a);
	if (!ret && !e->node)
		ret = dsfs_ckpt_pn_node(fs, dir, name, false, &e->node);
	if (ret) {
		if (pt)
			dsfs_pt_release(who, pt, kind);
		if (e->node) {
			dsfs_ckpt_pn_unref_node(fs, e->node);
			e->node = NULL;
		}
		ckpt_file_close(f);
		dsfs_ckpt_file_unhold(fs, who->uid, held);
		return ret;
	}
	ret = dsfs_ckpt_file_handle_new(fs, who, f, held, pt, kind, fi);
	if (ret) {
		dsfs_ckpt_pn_unref_node(fs, e->node);
		e->node = NULL;
		return ret;
	}
	dsfs_ckpt_own_remember(fs, dsfs_ckpt_pn_of(e->node), &o);
	dsfs_ckpt_own_entry(fs, &a, &o, e);
	return 0;
}

int dsfs_ckpt_file_mknod(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *dir, const char *name, mode_t mode,
			 dev_t rdev, struct dsfs_entry *e)
{
	struct fuse_file_info fi = { .flags = O_WRONLY | O_EXCL };
	int ret;

	(void)rdev;
	if (!S_ISREG(mode))
		return dsfs_ckpt_pn_perm(fs, who, dir, name);
	ret = dsfs_ckpt_file_create(fs, who, dir, name, mode, &fi, e);
	if (ret)
		return ret;
	ret = ckpt_file_sync(dsfs_ckpt_file_fh(&fi));
	dsfs_ckpt_file_handle_free(fs, dsfs_ckpt_file_h(&fi));
	if (ret) {
		dsfs_ckpt_pn_unref_node(fs, e->node);
		e->node = NULL;
	}
	return ret;
}

int dsfs_ckpt_file_open(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	bool rdonly =
		(fi->flags & O_ACCMODE) == O_RDONLY && !(fi->flags & O_TRUNC);
	enum dsfs_pt_kind kind = DSFS_PT_PLAIN;
	bool created, held = false, counted = false, foreign = false;
	struct dsfs_pt *pt = NULL;
	struct ckpt_file *f;
	char *key;
	int ret;

	if (!st->ck || dsfs_ckpt_pn_of(n)->dir)
		return -EISDIR;
	if (dsfs_ckpt_file_pt_on(fs))
		pt = &dsfs_ckpt_pn_of(n)->pt;
	ret = dsfs_ckpt_may_open(fs, who, n, fi->flags);
	if (!ret)
		ret = dsfs_ckpt_file_hold(fs, who->uid, &held);
	if (ret)
		return ret;
	key = dsfs_ckpt_pn_key(st, dsfs_ckpt_pn_of(n));
	ret = key ? 0 : -ENOMEM;
	/* a writer: counted (or refused) before anything is opened */
	if (!ret && pt && !rdonly) {
		ret = dsfs_pt_open(fs, who, pt, false, NULL, NULL, "", fi,
				   "checkpoints", key, &kind);
		counted = !ret;
	}
	if (!ret)
		ret = ckpt_file_open_as(st->ck, key, fi->flags & ~O_CREAT,
					who->uid, &f, &created);
	/* Archived: an open for reading by a caller the checks above (and
	 * the kernel's default_permissions) let through recalls it,
	 * audited; one for writing only does not. */
	if (ret == -ENOENT && (fi->flags & O_ACCMODE) != O_WRONLY &&
	    !dsfs_ckpt_arch_recall(fs, who, key))
		ret = ckpt_file_open_as(st->ck, key, fi->flags & ~O_CREAT,
					who->uid, &f, &created);
	if (!ret && pt && rdonly) {
		ret = dsfs_ckpt_file_pt_read(fs, who, pt, f, key, fi, &kind,
					     &foreign);
		counted = !ret;
		if (ret)
			ckpt_file_close(f);
	}
	free(key);
	if (ret) {
		if (counted)
			dsfs_pt_release(who, pt, kind);
		dsfs_ckpt_file_unhold(fs, who->uid, held);
		return ret;
	}
	ret = dsfs_ckpt_file_handle_new(fs, who, f, held, pt, kind, fi);
	if (!ret && foreign) {
		dsfs_ckpt_file_h(fi)->at_gen = true;
		dsfs_ckpt_file_h(fi)->gen = ckpt_file_gen(f);
		fi->direct_io = 1;
	}
	return ret;
}

/*
 * A file only the store has (another node's): through the block cache,
 * as datasets are, under st->cache_label. Each version (ETag) is fetched
 * once per node, checked block by block on every later read, and kept
 * for the next reader until evicted. 1 when the caller must read it
 * another way (no cache, or a version without an ETag), else 0 (r
 * answered) or -EIO / -ENOMEM.
 */
static int dsfs_ckpt_file_read_cached(struct dsfs *fs, struct ckpt_file *f,
				      size_t size, off_t off,
				      struct dsfs_reply_read *r)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct ckpt_remote rem;
	/* Copies: f may be closed (RELEASE) as soon as the reply is out. */
	char key[KEYPATH_MAX], etag[OBJSTORE_ETAG_MAX];
	struct cache_object obj = { .key = key, .etag = etag };
	int ret;

	if (!fs->cache || !st->cache_label || ckpt_file_remote(f, &rem))
		return 1;
	if ((uint64_t)off >= rem.size || !size)
		return 0; /* the dispatcher answers an empty read */
	if (size > rem.size - (uint64_t)off)
		size = (size_t)(rem.size - (uint64_t)off);
	snprintf(key, sizeof(key), "%s", rem.key);
	snprintf(etag, sizeof(etag), "%s", rem.etag);
	obj.dataset = st->cache_label;
	obj.os = rem.os;
	obj.size = rem.size;
	atomic_fetch_add_explicit(&fs->ctr.reads, 1, memory_order_relaxed);
	ret = dsfs_cacheread_reply(fs, &obj, (uint64_t)off, size, r);
	if (!ret)
		return 0;
	atomic_fetch_add_explicit(&fs->ctr.read_errors, 1,
				  memory_order_relaxed);
	log_error("checkpoints: cannot read %s at %lld from %s: %s%s", key,
		  (long long)off, ckpt_url(st->ck), strerror(-ret),
		  ret == -ESTALE ? " (replaced in the store since it was "
				   "opened: open it again)"
				 : "");
	return ret == -ENOMEM ? -ENOMEM : -EIO;
}

/* A read of h->at_gen (another uid's local copy): the version it opened,
 * or -ESTALE (ckpt_file_pread_gen). */
static int dsfs_ckpt_file_read_at_gen(struct dsfs_ckpt_file_handle *h,
				      size_t size, off_t off,
				      struct dsfs_reply_read *r)
{
	char *buf = malloc(size ? size : 1);
	ssize_t got;

	if (!buf)
		return -ENOMEM;
	got = ckpt_file_pread_gen(h->f, buf, size, off, h->gen);
	if (got >= 0)
		dsfs_reply_read_buf(r, buf, (size_t)got);
	free(buf);
	return got < 0 ? (int)got : 0;
}

int dsfs_ckpt_file_read(struct dsfs *fs, struct dsfs_caller *who,
			struct dsfs_node *n, struct fuse_file_info *fi,
			size_t size, off_t off, struct dsfs_reply_read *r)
{
	struct ckpt_file *f = dsfs_ckpt_file_fh(fi);
	int fd = ckpt_file_fd(f);
	struct ckpt_attr a;
	ssize_t got;
	char *buf;
	int ret;

	(void)who;
	(void)n;
	if (dsfs_ckpt_file_h(fi)->at_gen)
		return dsfs_ckpt_file_read_at_gen(dsfs_ckpt_file_h(fi), size,
						  off, r);
	if (fd >= 0 && !ckpt_file_attr(f, &a)) {
		/* A local copy: spliced from it, never past its end. */
		if ((uint64_t)off >= a.size)
			return 0;
		if (size > a.size - (uint64_t)off)
			size = (size_t)(a.size - (uint64_t)off);
		return dsfs_reply_read_fd(r, fd, off, size, 0);
	}
	if (off < 0)
		return -EINVAL;
	ret = dsfs_ckpt_file_read_cached(fs, f, size, off, r);
	if (ret <= 0)
		return ret;
	buf = malloc(size ? size : 1);
	if (!buf)
		return -ENOMEM;
	got = ckpt_file_pread(f, buf, size, off);
	if (got >= 0)
		dsfs_reply_read_buf(r, buf, (size_t)got);
	free(buf);
	return got < 0 ? (int)got : 0;
}

ssize_t dsfs_ckpt_file_write(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, struct fuse_file_info *fi,
			     const char *buf, size_t size, off_t off)
{
	(void)fs;
	(void)n;
	dsfs_ckpt_file_wrote(dsfs_ckpt_file_h(fi), who);
	return ckpt_file_pwrite(dsfs_ckpt_file_fh(fi), buf, size, off);
}

/* Set h->deferred to v; returns what it was. */
static bool dsfs_ckpt_file_defer(struct dsfs_ckpt_file_handle *h, bool v)
{
	bool was;

	pthread_mutex_lock(&h->lock);
	was = h->deferred;
	h->deferred = v;
	pthread_mutex_unlock(&h->lock);
	return was;
}

/* Set h->killed (the handle's writer died of a signal). */
static void dsfs_ckpt_file_kill(struct dsfs_ckpt_file_handle *h)
{
	pthread_mutex_lock(&h->lock);
	h->killed = true;
	h->deferred = false;
	pthread_mutex_unlock(&h->lock);
}

/* Whether the file is still held open for writing by someone other than
 * the closing process (tid), beside h itself. */
static bool dsfs_ckpt_file_others(struct dsfs *fs,
				  struct dsfs_ckpt_file_handle *h, pid_t tid,
				  pid_t tg, fuse_ino_t ino)
{
	pid_t known[DSFS_CKPT_FILE_WRITERS + 1];
	size_t n = 0;

	if (dsfs_ckpt_proc_held(fs, tid, ino))
		return true; /* its last descriptor's close publishes */
	if (ckpt_file_writers(h->f) > 1)
		return true; /* the last writable handle's close publishes */
	pthread_mutex_lock(&h->lock);
	known[n++] = h->opener;
	for (unsigned i = 0; i < h->nwriters && i < DSFS_CKPT_FILE_WRITERS; i++)
		known[n++] = h->writers[i];
	pthread_mutex_unlock(&h->lock);
	return dsfs_ckpt_proc_others_write(fs, tg, ino, known, n);
}

int dsfs_ckpt_file_flush(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct dsfs_ckpt_file_handle *h = dsfs_ckpt_file_h(fi);
	pid_t tg;
	int sig;

	/* FLUSH carries no open flags: the handle knows. Only a writer's
	 * close publishes (a reader's close must not publish what a writer
	 * is still writing). */
	if (!ckpt_file_writable(h->f))
		return 0;
	tg = dsfs_ckpt_proc_tgid(who->pid); /* read once: /proc */
	if (!dsfs_ckpt_file_owner(h, tg))
		return 0; /* a forked child's copy closing */
	if (dsfs_ckpt_proc_killed(who->pid, &sig)) {
		dsfs_ckpt_file_kill(h);
		log_warn("checkpoints: the writer (pid %d) of a file was "
			 "killed by signal %d before closing it: not "
			 "published",
			 (int)who->pid, sig);
		return 0;
	}
	if (dsfs_ckpt_file_others(fs, h, who->pid, tg, n->ino)) {
		dsfs_ckpt_file_defer(h, true);
		return 0;
	}
	dsfs_ckpt_file_defer(h, false);
	return ckpt_file_sync(h->f);
}

int dsfs_ckpt_file_fsync(struct dsfs *fs, struct dsfs_caller *who,
			 struct dsfs_node *n, int datasync,
			 struct fuse_file_info *fi)
{
	(void)fs;
	(void)who;
	(void)n;
	(void)datasync;
	/* a reader's fsync (any uid's) publishes nothing: only a process
	 * holding the file open for writing says it is durable now */
	if (!ckpt_file_writable(dsfs_ckpt_file_fh(fi)))
		return 0;
	return ckpt_file_sync(dsfs_ckpt_file_fh(fi));
}

int dsfs_ckpt_file_fallocate(struct dsfs *fs, struct dsfs_caller *who,
			     struct dsfs_node *n, int mode, off_t off,
			     off_t len, struct fuse_file_info *fi)
{
	struct ckpt_attr a;
	int ret;

	(void)fs;
	(void)who;
	(void)n;
	if (mode)
		return -EOPNOTSUPP;
	ret = ckpt_file_attr(dsfs_ckpt_file_fh(fi), &a);
	if (!ret && (uint64_t)(off + len) > a.size)
		ret = ckpt_file_truncate(dsfs_ckpt_file_fh(fi),
					 (uint64_t)(off + len));
	return ret;
}

void dsfs_ckpt_file_release(struct dsfs *fs, struct dsfs_caller *who,
			    struct dsfs_node *n, struct fuse_file_info *fi)
{
	struct dsfs_ckpt_file_handle *h = dsfs_ckpt_file_h(fi);
	bool killed, ok;
	int ret;

	(void)n;
	if (h->pt)
		dsfs_pt_release(who, h->pt, h->kind);
	/* A writer's close deferred while the file was held otherwise:
	 * every copy of this descriptor is closed now. Publish, as that
	 * close would have, when no other handle is open for writing (its
	 * close publishes) and no writer of this one was killed. Only on
	 * the kernel's RELEASE, which this may run after on another
	 * request's thread (a FLUSH answered just before: then without a
	 * request); never at teardown (dstagefs is stopping under a writer
	 * that may still be writing). */
	pthread_mutex_lock(&h->lock);
	killed = h->killed;
	pthread_mutex_unlock(&h->lock);
	ok = who->released && !killed;
	/* the last writable handle released pays a deferred publish: its
	 * own, or one another handle released first left owed (that one's
	 * close deferred while this handle, closed already but not yet
	 * released, still counted as a writer) */
	if (ckpt_file_writer_done(h->f, dsfs_ckpt_file_defer(h, false) && ok) &&
	    ok) {
		ret = ckpt_file_sync(h->f);
		if (ret)
			log_warn("checkpoints: a file closed by its writer "
				 "could not be published yet: %s (retried)",
				 strerror(-ret));
	}
	dsfs_ckpt_file_handle_free(fs, h);
}
