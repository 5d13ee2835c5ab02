// SPDX-License-Identifier: MIT
/*
 * cache_whole.c, layer 3 of the cache beside cache_obj.c (lib/cache/
 * cache_i.h draws the layers): the objects this process found whole,
 * remembered without their descriptors. A passthrough open of an object
 * that is no longer in the open-object table (a dataset of more small
 * files than c->max_open: the common case) then opens the data file and
 * hands it over without the sidecar's header check and records, which
 * after the page cache was dropped are a disk read of their own (an open
 * took ~180 us that way here, against ~65 us for an object still open).
 * Calls layer 1 only.
 *
 * An entry (struct cache_whole_ent) says: the data file with this device,
 * inode and change time had every block's record valid while the damage
 * generation was gen; its sidecar (inode mino) holds a version 3 header
 * with these flags; this process last wrote its access time at atime.
 *
 *   (none) --cache_whole_note (the long way found the object whole)-->
 *            KNOWN
 *   KNOWN  --cache_whole_note of another name hashed to the same slot-->
 *            (none): the newer one takes the slot
 *   KNOWN  --cache_whole_open finds the file or its sidecar is not the
 *            one noted--> (none)
 *   KNOWN  --the table is freed (cache_close)--> (none)
 *
 * Invariant (what makes an entry safe to trust): cache_whole_open hands a
 * descriptor over only when the file opened by the object's name, under
 * its shared in-use lock (so no evictor unlinks it meanwhile), is linked,
 * has the object's size and the entry's device, inode and change time
 * (the same file, not one made after an eviction, and not written since:
 * a fill, a truncate or a change of its links moves the change time), and
 * the caller's damage generation is the entry's (a record made invalid in
 * any process bumps it: cache_rec_replace). Anything else is "not known":
 * the caller goes the long way (cache_obj_get, the records read), which
 * notes the object again when it is whole. An entry is never the only
 * thing that keeps a damaged or evicted object in passthrough.
 *
 * The table: open addressing on the name (its first 16 hex digits are a
 * hash already), an entry in one of the CACHE_WHOLE_PROBE slots from its
 * home slot (a lookup looks at all of them: an emptied slot breaks no
 * chain), CACHE_WHOLE_MIN slots at the first note, doubled while more
 * than half are in use up to CACHE_WHOLE_MAX (56 bytes a slot: at most
 * 56 MiB); with all its slots taken a new entry replaces the one in its
 * home slot. (Direct-mapped, 6,000 objects lost a sixth of their entries
 * to collisions, and two names sharing a slot pushed each other out on
 * every pass: a third of the opens went the long way.) A process that never
 * passes a file through (the stager) allocates none.
 *
 * Access times (eviction's recency): the long way records one at each
 * passthrough open, at most once per CACHE_ATIME_STEP (cache_obj_touch);
 * so does cache_whole_open, writing the header's page into the sidecar
 * after checking it is still the one noted (its inode), as the long way
 * writes it.
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
#include <time.h>
#include <unistd.h>

#include "cache_i.h"
#include "dstage/log.h"

struct cache_whole_ent {
	uint64_t key; /* the name's first 16 hex digits; 0: an empty slot */
	uint64_t dev, ino, mino; /* the data file's; its sidecar's inode */
	int64_t ctime_ns; /* the data file's change time */
	uint64_t gen; /* the damage generation it was found whole under */
	uint32_t atime; /* seconds: the access time last written here */
	uint32_t flags; /* the sidecar header's */
};

_Static_assert(sizeof(struct cache_whole_ent) == 56, "see CACHE_WHOLE_MAX");

/* The slot key of name (32 hex digits; 0 is kept for empty slots). */
static uint64_t cache_whole_key(const char *name)
{
	uint64_t h = 0;

	for (int i = 0; i < 16 && name[i]; i++) {
		char ch = name[i];

		h = h << 4 |
		    (uint64_t)(ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
	}
	return h ? h : 1;
}

static int64_t cache_whole_ctime(const struct stat *st)
{
	return (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
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

void cache_whole_note(struct cache *c, const char *name, const struct stat *st,
		      int mfd, uint64_t gen, uint32_t flags, time_t atime)
{
	uint64_t key = cache_whole_key(name);
	struct cache_whole_ent e = { .key = key,
				     .dev = st->st_dev,
				     .ino = st->st_ino,
				     .ctime_ns = cache_whole_ctime(st),
				     .gen = gen,
				     .atime = (uint32_t)atime,
				     .flags = flags };
	struct cache_whole_ent *s;
	struct stat mst;
	bool same;

	pthread_mutex_lock(&c->whole_lock);
	s = cache_whole_lookup(c, key);
	same = s && s->dev == e.dev && s->ino == e.ino &&
	       s->ctime_ns == e.ctime_ns && s->flags == flags;
	if (same) { /* noted before: the sidecar's inode is known */
		s->gen = gen;
		s->atime = e.atime;
	}
	pthread_mutex_unlock(&c->whole_lock);
	if (same || fstat(mfd, &mst) || mst.st_dev != st->st_dev)
		return;
	e.mino = mst.st_ino;

	pthread_mutex_lock(&c->whole_lock);
	if (c->nwhole < CACHE_WHOLE_MAX &&
	    (!c->nwhole || c->whole_used > c->nwhole / 2))
		cache_whole_grow(c);
	if (c->nwhole)
		*cache_whole_place(c, key) = e;
	pthread_mutex_unlock(&c->whole_lock);
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

/* Forget key's entry e (found stale), unless the slot was noted anew. */
static void cache_whole_drop(struct cache *c, const struct cache_whole_ent *e)
{
	struct cache_whole_ent *s;

	pthread_mutex_lock(&c->whole_lock);
	s = cache_whole_lookup(c, e->key);
	if (s && s->ino == e->ino && s->ctime_ns == e->ctime_ns) {
		memset(s, 0, sizeof(*s));
		c->whole_used--;
	}
	pthread_mutex_unlock(&c->whole_lock);
}

/* The access time, as cache_obj_touch writes it: into the sidecar noted
 * (e->mino), or not at all (-EAGAIN: go the long way). */
static int cache_whole_touch(struct cache *c, const struct cache_object *obj,
			     const char *mpath, struct cache_whole_ent *e,
			     time_t now)
{
	struct cache_whole_ent *s;
	struct stat mst;
	int ret, mfd = openat(c->objects_fd, mpath,
			      O_WRONLY | O_NOFOLLOW | O_CLOEXEC);

	if (mfd < 0)
		return -EAGAIN;
	if (fstat(mfd, &mst) || mst.st_ino != e->mino || mst.st_dev != e->dev) {
		close(mfd);
		return -EAGAIN;
	}
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
	struct cache_whole_ent e;
	char path[40], mpath[48];
	struct stat st;
	time_t now;
	int fd, ret;

	*fdp = -1;
	if (!cache_whole_find(c, cache_whole_key(name), &e) || e.gen != gen)
		return -EAGAIN;
	snprintf(path, sizeof(path), "%.2s/%s", name, name + 2);
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
	if (st.st_nlink == 0 || (uint64_t)st.st_size != obj->size ||
	    st.st_dev != e.dev || st.st_ino != e.ino ||
	    cache_whole_ctime(&st) != e.ctime_ns) {
		ret = -EAGAIN;
		goto stale;
	}
	/* The data's read starts now, under the sidecar's write below. */
	cache_small_ahead(c, fd, &st);
	now = time(NULL);
	if (now - (time_t)e.atime >= CACHE_ATIME_STEP &&
	    cache_whole_touch(c, obj, mpath, &e, now)) {
		ret = -EAGAIN;
		goto stale;
	}
	*fdp = fd;
	return 0;
stale:
	cache_whole_drop(c, &e);
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
