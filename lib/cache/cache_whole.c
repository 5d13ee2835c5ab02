// SPDX-License-Identifier: MIT
/*
 * cache_whole.c, layer 3 of the cache beside cache_obj.c (lib/cache/
 * cache_i.h draws the layers): the objects found whole, remembered
 * without their descriptors. A passthrough open of an object that this
 * process no longer holds open (a dataset of more small files than
 * c->max_open: the common case), or has never opened (the first epoch
 * after a stage), then opens the data file and hands it over without the
 * sidecar's header check and records, which after the page cache was
 * dropped are a disk read of their own (an open took ~180 us that way
 * here, against ~65 us for an object still open). Calls layer 1 only.
 *
 * What is remembered, twice over:
 *   - in this process, an entry (struct cache_whole_ent): the data file's
 *     device, inode and modification time, the damage generation it was
 *     found whole under, its header flags, the access time last written;
 *   - in the data file, for every process (a later dstagefs, after the
 *     stager's stage marked it): the extended attribute CACHE_WHOLE_XATTR
 *     (struct cache_whole_mark: the generation's nonce and value, the
 *     modification time, the flags), kept in the inode by ext4 and xfs,
 *     so reading it is no disk read. A file system that refuses it
 *     (c->whole_xattr_off, logged once) leaves the memory alone.
 *
 *   (none) --cache_whole_note (the long way found the object whole, or
 *            cache_object_mark_whole)--> KNOWN (entry and mark)
 *   (none) --cache_whole_open finds a current mark--> KNOWN (entry)
 *   KNOWN  --another name takes the entry's slot--> the mark alone
 *   KNOWN  --cache_whole_open finds the file is not the one known-->
 *            (none): the entry dropped, the mark left stale
 *
 * Invariant (what makes either safe to trust): cache_whole_open hands a
 * descriptor over only when the file opened by the object's name, under
 * its shared in-use lock (so no evictor unlinks it meanwhile), is linked,
 * has the object's size and the entry's (or mark's) modification time (a
 * fill, a truncate, any write moves it; a file made again after an
 * eviction has its own), the entry's device and inode or the mark on the
 * file itself, and the damage generation (with its nonce) is the caller's
 * (a record made invalid in any process bumps it once the record is
 * written: cache_rec_replace; the generation is read before the records,
 * so a mark made from records read before that write is stale). Anything
 * else is "not known": the caller goes the long way (cache_obj_get, the
 * records read), which notes the object again when it is whole. A damage.gen made anew starts from generation 0 with another
 * nonce, so no older mark comes back into force.
 *
 * The table: open addressing on the name (its first 16 hex digits are a
 * hash already), an entry in one of the CACHE_WHOLE_PROBE slots from its
 * home slot (a lookup looks at all of them: an emptied slot breaks no
 * chain), CACHE_WHOLE_MIN slots at the first note, doubled while more
 * than half are in use up to CACHE_WHOLE_MAX (48 bytes a slot: at most
 * 48 MiB); with all its slots taken a new entry replaces the one in its
 * home slot. (Direct-mapped, 6,000 objects lost a sixth of their entries
 * to collisions, and two names sharing a slot pushed each other out on
 * every pass: a third of the opens went the long way.) A process that
 * never passes a file through (the stager) allocates none.
 *
 * Access times (eviction's recency): the long way records one at each
 * passthrough open, at most once per CACHE_ATIME_STEP (cache_obj_touch);
 * so does cache_whole_open, writing the header's page into the sidecar as
 * the long way writes it. The sidecar is the data file's: it is linked,
 * replaced or unlinked only under the data file's exclusive in-use lock,
 * and the shared one is held.
 *
 * Lock: c->whole_lock (a leaf: nothing is taken while holding it) over
 * c->whole, c->nwhole and c->whole_used; no I/O under it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "cache_i.h"
#include "dstage/config.h"
#include "dstage/log.h"

struct cache_whole_ent {
	uint64_t key; /* the name's first 16 hex digits; 0: an empty slot */
	uint64_t dev, ino; /* the data file's */
	int64_t mtime_ns; /* the data file's modification time */
	uint64_t gen; /* the damage generation it was found whole under */
	uint32_t atime; /* seconds: the access time last written here */
	uint32_t flags; /* the sidecar header's */
};

_Static_assert(sizeof(struct cache_whole_ent) == 48, "see CACHE_WHOLE_MAX");

#define CACHE_WHOLE_MAGIC 0x4c485731u /* "1WHL" */

/* CACHE_WHOLE_XATTR's value (host byte order: caches are node-local). */
struct cache_whole_mark {
	uint32_t magic; /* CACHE_WHOLE_MAGIC */
	uint32_t flags; /* the sidecar header's */
	uint64_t nonce, gen; /* the damage generation's (c->gen_nonce) */
	int64_t mtime_ns; /* the data file's when it was found whole */
};

/* The slot key of name (0 is kept for empty slots). */
static uint64_t cache_whole_key(const char *name)
{
	uint64_t h = cache_name_key(name);

	return h ? h : 1;
}

static int64_t cache_whole_mtime(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

static struct cache_whole_ent *cache_whole_at(struct cache *c, uint64_t key,
					      unsigned i)
{
	return &c->whole[(key + i) & (c->nwhole - 1)];
}

/* key's entry (c->whole_lock held), or NULL. */
static struct cache_whole_ent *cache_whole_lookup(struct cache *c, uint64_t key)
{
	for (unsigned i = 0; c->nwhole && i < CACHE_WHOLE_PROBE; i++) {
		struct cache_whole_ent *s = cache_whole_at(c, key, i);

		if (s->key == key)
			return s;
	}
	return NULL;
}

/* Where key's entry goes (c->whole_lock held; the table allocated): its
 * own slot, the first empty one, or its home slot; c->whole_used counts
 * an empty one taken. */
static struct cache_whole_ent *cache_whole_place(struct cache *c, uint64_t key)
{
	struct cache_whole_ent *s = cache_whole_lookup(c, key);

	for (unsigned i = 0; !s && i < CACHE_WHOLE_PROBE; i++) {
		struct cache_whole_ent *t = cache_whole_at(c, key, i);

		if (!t->key) {
			c->whole_used++;
			s = t;
		}
	}
	return s ? s : cache_whole_at(c, key, 0);
}

/* Double the table (c->whole_lock held); on failure it stays as it is. */
static void cache_whole_grow(struct cache *c)
{
	size_t n = c->nwhole ? 2 * c->nwhole : CACHE_WHOLE_MIN;
	struct cache_whole_ent *old = c->whole, *t = calloc(n, sizeof(*t));
	size_t nold = c->nwhole;

	if (!t)
		return;
	c->whole = t;
	c->nwhole = n;
	c->whole_used = 0;
	for (size_t i = 0; i < nold; i++)
		if (old[i].key)
			*cache_whole_place(c, old[i].key) = old[i];
	free(old);
}

/* Put e in the table (grown first when due). */
static void cache_whole_put(struct cache *c, const struct cache_whole_ent *e)
{
	pthread_mutex_lock(&c->whole_lock);
	if (c->nwhole < CACHE_WHOLE_MAX &&
	    (!c->nwhole || c->whole_used > c->nwhole / 2))
		cache_whole_grow(c);
	if (c->nwhole)
		*cache_whole_place(c, e->key) = *e;
	pthread_mutex_unlock(&c->whole_lock);
}

/* A file system that refuses the mark: said once, then not asked again. */
static void cache_whole_xattr_refused(struct cache *c, int err)
{
	if (atomic_exchange(&c->whole_xattr_off, true))
		return;
	log_info("cache: %s: data files take no %s (%s): a passthrough open "
		 "reads the records of an object at its first open in each "
		 "process",
		 c->cfg->cache_dir, CACHE_WHOLE_XATTR, strerror(err));
}

void cache_whole_note(struct cache *c, const char *name, const struct stat *st,
		      int fd, uint64_t gen, uint32_t flags, time_t atime)
{
	struct cache_whole_ent e = { .key = cache_whole_key(name),
				     .dev = st->st_dev,
				     .ino = st->st_ino,
				     .mtime_ns = cache_whole_mtime(st),
				     .gen = gen,
				     .atime = (uint32_t)atime,
				     .flags = flags };
	struct cache_whole_mark m = { .magic = CACHE_WHOLE_MAGIC,
				      .flags = flags,
				      .nonce = c->gen_nonce,
				      .gen = gen,
				      .mtime_ns = e.mtime_ns };
	struct cache_whole_ent *s;
	bool same;

	pthread_mutex_lock(&c->whole_lock);
	s = cache_whole_lookup(c, e.key);
	same = s && s->dev == e.dev && s->ino == e.ino &&
	       s->mtime_ns == e.mtime_ns && s->gen == gen && s->flags == flags;
	if (same)
		s->atime = e.atime;
	pthread_mutex_unlock(&c->whole_lock);
	if (same) /* noted here before, the mark with it */
		return;
	cache_whole_put(c, &e);
	if (!atomic_load(&c->whole_xattr_off) &&
	    fsetxattr(fd, CACHE_WHOLE_XATTR, &m, sizeof(m), 0)) {
		if (errno == ENOTSUP || errno == EPERM)
			cache_whole_xattr_refused(c, errno);
		else
			log_debug("cache: %s: %s not set: %s", name,
				  CACHE_WHOLE_XATTR, strerror(errno));
	}
}

/* Copy out name's entry; false when there is none. */
static bool cache_whole_find(struct cache *c, uint64_t key,
			     struct cache_whole_ent *out)
{
	struct cache_whole_ent *s;

	pthread_mutex_lock(&c->whole_lock);
	s = cache_whole_lookup(c, key);
	if (s)
		*out = *s;
	pthread_mutex_unlock(&c->whole_lock);
	return s != NULL;
}

/* Forget key's entry (found stale), unless the slot was noted anew. */
static void cache_whole_drop(struct cache *c, uint64_t key, uint64_t ino)
{
	struct cache_whole_ent *s;

	pthread_mutex_lock(&c->whole_lock);
	s = cache_whole_lookup(c, key);
	if (s && s->ino == ino) {
		memset(s, 0, sizeof(*s));
		c->whole_used--;
	}
	pthread_mutex_unlock(&c->whole_lock);
}

/* Whether fd (stat st) carries a mark current under generation gen; if
 * so, *e is made from it. */
static bool cache_whole_marked(struct cache *c, int fd, const struct stat *st,
			       uint64_t gen, struct cache_whole_ent *e)
{
	struct cache_whole_mark m;
	ssize_t n;

	if (atomic_load(&c->whole_xattr_off))
		return false;
	n = fgetxattr(fd, CACHE_WHOLE_XATTR, &m, sizeof(m));
	if (n < 0 && (errno == ENOTSUP || errno == EPERM))
		cache_whole_xattr_refused(c, errno);
	if (n != (ssize_t)sizeof(m) || m.magic != CACHE_WHOLE_MAGIC ||
	    m.nonce != c->gen_nonce || m.gen != gen ||
	    m.mtime_ns != cache_whole_mtime(st))
		return false;
	e->dev = st->st_dev;
	e->ino = st->st_ino;
	e->mtime_ns = m.mtime_ns;
	e->gen = gen;
	e->atime = 0; /* not written by this process yet */
	e->flags = m.flags;
	return true;
}

/* The access time, as cache_obj_touch writes it, into the sidecar of the
 * data file held (see "Access times"); -EAGAIN: go the long way. */
static int cache_whole_touch(struct cache *c, const struct cache_object *obj,
			     const char *mpath, const struct cache_whole_ent *e,
			     time_t now)
{
	struct cache_whole_ent *s;
	int ret, mfd = openat(c->objects_fd, mpath,
			      O_WRONLY | O_NOFOLLOW | O_CLOEXEC);

	if (mfd < 0)
		return -EAGAIN;
	ret = cache_hdr_write_atime(c, obj, CACHE_OBJ_VERSION, e->flags, 0, mfd,
				    (uint64_t)now);
	close(mfd);
	if (ret) {
		log_debug("cache: %s/%s: access time not recorded: %s",
			  cache_ds_or(obj->dataset), obj->key, strerror(-ret));
		return ret == -EUCLEAN ? -EAGAIN : 0;
	}
	pthread_mutex_lock(&c->whole_lock);
	s = cache_whole_lookup(c, e->key);
	if (s && s->ino == e->ino)
		s->atime = (uint32_t)now;
	pthread_mutex_unlock(&c->whole_lock);
	return 0;
}

int cache_whole_open(struct cache *c, const struct cache_object *obj,
		     const char *name, uint64_t gen, int *fdp)
{
	struct cache_whole_ent e = { .key = cache_whole_key(name) };
	char path[CACHE_PATH_MAX], mpath[48];
	bool known;
	struct stat st;
	time_t now;
	int fd, ret;

	*fdp = -1;
	known = cache_whole_find(c, e.key, &e) && e.gen == gen;
	if (!known && atomic_load(&c->whole_xattr_off))
		return -EAGAIN;
	cache_name_path(name, path);
	cache_meta_path(path, mpath, sizeof(mpath));
	fd = openat(c->objects_fd, path,
		    O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOATIME);
	if (fd < 0 && errno == EPERM) /* a file another user owns */
		fd = openat(c->objects_fd, path,
			    O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		ret = -EAGAIN; /* gone: the long way says what to do */
		goto stale;
	}
	ret = cache_inuse_hold(c, fd, cache_ds_or(obj->dataset), obj->key, name,
			       &st);
	if (ret)
		goto out;
	ret = -EAGAIN;
	if (st.st_nlink == 0 || (uint64_t)st.st_size != obj->size)
		goto stale;
	if (known && (st.st_dev != e.dev || st.st_ino != e.ino ||
		      cache_whole_mtime(&st) != e.mtime_ns))
		known = false;
	if (!known) {
		if (!cache_whole_marked(c, fd, &st, gen, &e))
			goto stale;
		cache_whole_put(c, &e);
	}
	/* The data's read starts now, under the sidecar's write below. */
	cache_small_ahead(c, fd, &st);
	now = time(NULL);
	if (now - (time_t)e.atime >= CACHE_ATIME_STEP &&
	    cache_whole_touch(c, obj, mpath, &e, now))
		goto stale;
	*fdp = fd;
	return 0;
stale:
	cache_whole_drop(c, e.key, e.ino);
out:
	if (fd >= 0)
		close(fd);
	return ret;
}

void cache_whole_free(struct cache *c)
{
	free(c->whole);
	c->whole = NULL;
	c->nwhole = c->whole_used = 0;
}
