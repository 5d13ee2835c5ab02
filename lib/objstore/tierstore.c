// SPDX-License-Identifier: MIT
/*
 * tierstore: a dataset's source with its shared tier in front
 * (objstore_open_tiered, docs/objstore.md "The shared tier"), a backend of
 * the objstore interface over two other handles: the tier (a file:// store
 * on the copy's data/ directory) and the origin (the dataset's source).
 *
 * A read is served from the tier when the tier's MANIFEST lists the key
 * with the ETag the reader asks for (If-Match) and the tier's file passed
 * its check: on first use the whole file is read and its SHA-256 compared
 * with the MANIFEST's (which sharedtier_publish checked against the
 * dataset's sums key). Otherwise, or when the tier's read fails, it goes to
 * the origin, counted by cause and logged once per cause and handle.
 *
 * The handle's entries are immutable after open except each entry's state
 * and the logged flags (atomics); the totals are process-wide atomics.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/sha256.h"
#include "objstore_backend.h"

#define TIER_CHECK_CHUNK (4u << 20)

enum tier_state {
	TIER_UNCHECKED = 0,
	TIER_GOOD = 1,
	TIER_BAD_BASE = 2, /* + the cause */
};

struct tier_entry {
	char *key;
	uint64_t size;
	char etag[OBJSTORE_ETAG_MAX];
	unsigned char sha[32];
	_Atomic int state; /* enum tier_state */
};

struct tierstore {
	struct objstore base;
	struct objstore *tier, *origin; /* owned */
	void (*release)(struct objstore *); /* frees tier and origin */
	char *dir; /* the snapshot's directory, for messages */
	struct tier_entry *v; /* sorted by key */
	size_t n;
	int refused; /* -1, or the cause every read goes to the origin by */
	void (*report)(const struct dstage_config *, const char *, const char *,
		       int, const char *, int);
	char *tag; /* report's */
	int (*trusted)(const char *root, const char *dir); /* may be NULL */
	char *trust_root; /* trusted's */
	_Atomic bool logged[OBJSTORE_TIER_CAUSES];
};

static const char *const tier_cause_names[OBJSTORE_TIER_CAUSES] = {
	[OBJSTORE_TIER_MISSING] = "missing",
	[OBJSTORE_TIER_DAMAGED] = "damaged",
	[OBJSTORE_TIER_CHANGED] = "changed",
	[OBJSTORE_TIER_UNREACHABLE] = "unreachable",
	[OBJSTORE_TIER_UNTRUSTED] = "untrusted",
	[OBJSTORE_TIER_UNCHECKED] = "unchecked",
};

/* Process totals (objstore_get_tier_stats). */
static _Atomic uint64_t tier_reads, tier_bytes;
static _Atomic uint64_t tier_fallbacks[OBJSTORE_TIER_CAUSES];

const char *objstore_tier_cause_name(int cause)
{
	return cause >= 0 && cause < OBJSTORE_TIER_CAUSES
		       ? tier_cause_names[cause]
		       : "?";
}

void objstore_get_tier_stats(struct objstore_tier_stats *st)
{
	st->reads = atomic_load(&tier_reads);
	st->bytes = atomic_load(&tier_bytes);
	for (int i = 0; i < OBJSTORE_TIER_CAUSES; i++)
		st->fallbacks[i] = atomic_load(&tier_fallbacks[i]);
}

static struct tierstore *tierstore_of(struct objstore *os)
{
	return (struct tierstore *)os;
}

static void tier_fallback(struct tierstore *s, int cause, const char *key,
			  int err)
{
	atomic_fetch_add(&tier_fallbacks[cause], 1);
	if (atomic_exchange(&s->logged[cause], true))
		return;
	log_warn("shared tier %s: %s is %s there%s%s: reading it from %s "
		 "(logged once per cause; dstage_shared_tier_fallbacks_total "
		 "counts them)",
		 s->dir, key, tier_cause_names[cause], err ? ": " : "",
		 err ? strerror(-err) : "", s->origin->url);
	if (s->report)
		s->report(s->origin->cfg, s->tag, s->dir, cause, key, err);
}

static int tier_cmp(const void *a, const void *b)
{
	return strcmp(((const struct tier_entry *)a)->key,
		      ((const struct tier_entry *)b)->key);
}

static struct tier_entry *tier_find(struct tierstore *s, const char *key)
{
	struct tier_entry k = { .key = (char *)key };

	if (!s->n) /* an empty list has no array (bsearch's base: not NULL) */
		return NULL;
	return bsearch(&k, s->v, s->n, sizeof(k), tier_cmp);
}

/* Read e's whole file from the tier and check it: its state. */
static int tier_check(struct tierstore *s, struct tier_entry *e, int *err)
{
	unsigned char *buf = malloc(TIER_CHECK_CHUNK), md[32];
	struct sha256 h = { 0 };
	uint64_t off = 0;
	int state = TIER_GOOD;

	*err = 0;
	if (!buf || sha256_init(&h)) {
		*err = -ENOMEM;
		state = TIER_UNCHECKED;
		goto out;
	}
	for (;;) {
		struct objstore_get_req g = { .key = e->key,
					      .off = off,
					      .len = TIER_CHECK_CHUNK,
					      .buf = buf };

		if (e->size == 0 && off == 0)
			g.len = 0;
		s->tier->ops->get_many(s->tier, &g, 1);
		if (g.result == -ERANGE || (!g.result && g.got == 0))
			break; /* at the end */
		if (g.result) {
			*err = g.result;
			state = g.result == -ENOENT
					? TIER_BAD_BASE + OBJSTORE_TIER_MISSING
					: TIER_UNCHECKED;
			goto out;
		}
		sha256_update(&h, buf, g.got);
		off += g.got;
		if (g.got < g.len)
			break;
	}
	if (sha256_final(&h, md)) {
		*err = -ENOMEM;
		state = TIER_UNCHECKED;
		goto out;
	}
	if (off != e->size || memcmp(md, e->sha, 32) != 0) {
		log_error("shared tier %s: %s: %s (%" PRIu64 " bytes there, "
			  "%" PRIu64 " in its MANIFEST)",
			  s->dir, e->key,
			  off != e->size ? "size mismatch" : "SHA-256 mismatch",
			  off, e->size);
		state = TIER_BAD_BASE + OBJSTORE_TIER_DAMAGED;
	}
out:
	sha256_release(&h);
	free(buf);
	return state;
}

/* -1: the tier serves r; else the cause of going to the origin. */
static int tier_route(struct tierstore *s, const struct objstore_get_req *r,
		      int *err)
{
	struct tier_entry *e = tier_find(s, r->key);
	int st;

	*err = 0;
	if (s->refused >= 0)
		return s->refused;
	if (!e)
		return OBJSTORE_TIER_MISSING;
	/* the rule held at open; a tier made writable by others since is
	 * not read (a file checked before could have been replaced) */
	if (s->trusted && s->trusted(s->trust_root, s->dir)) {
		*err = -EACCES; /* told from a tier refused at open (0) */
		return OBJSTORE_TIER_UNTRUSTED;
	}
	if (r->if_match && strcmp(r->if_match, e->etag) != 0)
		return OBJSTORE_TIER_CHANGED;
	st = atomic_load(&e->state);
	if (st == TIER_UNCHECKED) {
		st = tier_check(s, e, err);
		if (st == TIER_UNCHECKED)
			return OBJSTORE_TIER_UNREACHABLE;
		atomic_store(&e->state, st);
	}
	return st == TIER_GOOD ? -1 : st - TIER_BAD_BASE;
}

static int tierstore_get_many(struct objstore *os,
			      struct objstore_get_req *reqs, size_t n)
{
	struct tierstore *s = tierstore_of(os);
	struct objstore_get_req *t = calloc(n, sizeof(*t));
	size_t *idx = calloc(n, sizeof(*idx)), nt = 0, no = 0;
	bool *origin = calloc(n, sizeof(*origin));
	int ret = 0, err;

	if (!t || !idx || !origin) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		int cause = tier_route(s, &reqs[i], &err);

		if (cause >= 0) {
			tier_fallback(s, cause, reqs[i].key, err);
			origin[i] = true;
			continue;
		}
		t[nt] = reqs[i];
		t[nt].if_match = NULL; /* checked against the MANIFEST */
		idx[nt++] = i;
	}
	if (nt)
		s->tier->ops->get_many(s->tier, t, nt);
	for (size_t j = 0; j < nt; j++) {
		struct objstore_get_req *r = &reqs[idx[j]];
		struct tier_entry *e = tier_find(s, r->key);
		uint64_t want = r->off >= e->size	    ? 0
				: e->size - r->off < r->len ? e->size - r->off
							    : r->len;

		if (!t[j].result && t[j].got == want) {
			r->got = t[j].got;
			r->result = 0;
			atomic_fetch_add(&tier_reads, 1);
			atomic_fetch_add(&tier_bytes, t[j].got);
			continue;
		}
		err = t[j].result;
		if (err == -ERANGE && r->off >= e->size && e->size) {
			/* past the end: the origin would say the same */
			r->got = 0;
			r->result = err;
			continue;
		}
		if (err == -ENOENT || !err)
			atomic_store(&e->state,
				     TIER_BAD_BASE +
					     (err ? OBJSTORE_TIER_MISSING
						  : OBJSTORE_TIER_DAMAGED));
		tier_fallback(s,
			      err == -ENOENT ? OBJSTORE_TIER_MISSING
			      : err	     ? OBJSTORE_TIER_UNREACHABLE
					     : OBJSTORE_TIER_DAMAGED,
			      r->key, err);
		origin[idx[j]] = true;
	}
	/* the rest from the origin, in one batch */
	for (size_t i = 0; i < n; i++)
		if (origin[i])
			t[no++] = reqs[i];
	if (no)
		s->origin->ops->get_many(s->origin, t, no);
	no = 0;
	for (size_t i = 0; i < n; i++) {
		if (origin[i]) {
			reqs[i].got = t[no].got;
			reqs[i].result = t[no].result;
			no++;
		}
		if (!ret && reqs[i].result)
			ret = reqs[i].result;
	}
out:
	free(t);
	free(idx);
	free(origin);
	return ret;
}

static int tierstore_list(struct objstore *os, const char *prefix,
			  objstore_list_cb cb, void *arg)
{
	struct objstore *o = tierstore_of(os)->origin;

	return o->ops->list(o, prefix, cb, arg);
}

static int tierstore_head(struct objstore *os, const char *key,
			  struct objstore_info *info)
{
	struct objstore *o = tierstore_of(os)->origin;

	return o->ops->head(o, key, info);
}

/* Read-only: a dataset's source is never written through this handle. */
static int tierstore_put_fd(struct objstore *os, const char *key, int fd,
			    uint64_t size, const char *sha256)
{
	(void)os, (void)key, (void)fd, (void)size, (void)sha256;
	return -EROFS;
}

static int tierstore_put_buf(struct objstore *os, const char *key,
			     const void *buf, size_t len,
			     const struct objstore_digests *dig)
{
	(void)os, (void)key, (void)buf, (void)len, (void)dig;
	return -EROFS;
}

static int tierstore_del(struct objstore *os, const char *key)
{
	(void)os, (void)key;
	return -EROFS;
}

static int tierstore_copy(struct objstore *os, const char *src, const char *dst)
{
	(void)os, (void)src, (void)dst;
	return -EROFS;
}

static int tierstore_set_sha256(struct objstore *os, const char *key,
				const char *etag, const char *sha256,
				char new_etag[OBJSTORE_ETAG_MAX])
{
	(void)os, (void)key, (void)etag, (void)sha256, (void)new_etag;
	return -EROFS;
}

static int tierstore_up_begin(struct objstore *os, const char *key,
			      const char *sha256, struct objstore_upload **out)
{
	(void)os, (void)key, (void)sha256;
	*out = NULL;
	return -EROFS;
}

static int tierstore_up_part(struct objstore_upload *up, unsigned partno,
			     const void *buf, int fd, uint64_t off,
			     uint64_t len, const struct objstore_digests *dig,
			     char etag[OBJSTORE_ETAG_MAX])
{
	(void)up, (void)partno, (void)buf, (void)fd, (void)off, (void)len;
	(void)dig, (void)etag;
	return -EROFS;
}

static int tierstore_up_commit(struct objstore_upload *up, unsigned nparts,
			       uint64_t size, char etag[OBJSTORE_ETAG_MAX])
{
	(void)up, (void)nparts, (void)size, (void)etag;
	return -EROFS;
}

static void tierstore_up_abort(struct objstore_upload *up)
{
	(void)up;
}

static int tierstore_up_abort_id(struct objstore *os, const char *key,
				 const char *id)
{
	(void)os, (void)key, (void)id;
	return 0;
}

static int tierstore_up_list(struct objstore *os, const char *prefix,
			     objstore_upload_list_cb cb, void *arg)
{
	(void)os, (void)prefix, (void)cb, (void)arg;
	return 0;
}

static void tierstore_free(struct objstore *os)
{
	struct tierstore *s = tierstore_of(os);

	s->release(s->tier);
	s->release(s->origin);
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i].key);
	free(s->v);
	free(s->dir);
	free(s->tag);
	free(s->trust_root);
	free(s);
}

static const struct objstore_ops tierstore_ops = {
	.list = tierstore_list,
	.head = tierstore_head,
	.get_many = tierstore_get_many,
	.put_fd = tierstore_put_fd,
	.put_buf = tierstore_put_buf,
	.del = tierstore_del,
	.copy = tierstore_copy,
	.set_sha256 = tierstore_set_sha256,
	.free = tierstore_free,
	.up_begin = tierstore_up_begin,
	.up_part = tierstore_up_part,
	.up_commit = tierstore_up_commit,
	.up_abort = tierstore_up_abort,
	.up_abort_id = tierstore_up_abort_id,
	.up_list = tierstore_up_list,
};

static int tier_hexval(int c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
				      : -1;
}

/* One MANIFEST line: "SHA256 SIZE ETAG KEY". */
static int tier_parse_line(char *line, struct tier_entry *e)
{
	char *p = line, *end;

	for (int i = 0; i < 32; i++) {
		int hi = tier_hexval(p[2 * i]), lo;

		if (hi < 0 || (lo = tier_hexval(p[2 * i + 1])) < 0)
			return -EINVAL;
		e->sha[i] = (unsigned char)(hi << 4 | lo);
	}
	p += 64;
	if (*p++ != ' ')
		return -EINVAL;
	e->size = strtoull(p, &end, 10);
	if (end == p || *end != ' ')
		return -EINVAL;
	p = end + 1;
	end = strchr(p, ' ');
	if (!end || end == p || (size_t)(end - p) >= sizeof(e->etag))
		return -EINVAL;
	if (!(end - p == 1 && *p == '-'))
		memcpy(e->etag, p, (size_t)(end - p));
	e->key = strdup(end + 1);
	return e->key ? 0 : -ENOMEM;
}

/* path, opened without following a link or blocking on a FIFO: a regular
 * file only. NULL with errno set (EINVAL: another type, logged). */
static FILE *tier_open_manifest(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	struct stat st;
	FILE *f;

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || fcntl(fd, F_SETFL, 0)) {
		if (!errno || !S_ISREG(st.st_mode)) {
			log_error("shared tier: %s is not a regular file: not "
				  "using the tier",
				  path);
			errno = EINVAL;
		}
		close(fd);
		return NULL;
	}
	f = fdopen(fd, "r");
	if (!f)
		close(fd);
	return f;
}

static int tier_ref_cmp_refs(const void *a, const void *b)
{
	return strcmp(((const struct objstore_tier_ref *)a)->key,
		      ((const struct objstore_tier_ref *)b)->key);
}

/* bsearch: an entry (the key) against a reference */
static int tier_entry_ref_cmp(const void *a, const void *b)
{
	return strcmp(((const struct tier_entry *)a)->key,
		      ((const struct objstore_tier_ref *)b)->key);
}

/* Hold each MANIFEST entry to its reference hash: an entry without one is
 * not read from the tier, one whose MANIFEST line differs is damaged. */
static int tier_apply_refs(struct tierstore *s,
			   const struct objstore_tier_opts *o)
{
	struct objstore_tier_ref *r = NULL;

	if (o->nrefs && !(r = malloc(o->nrefs * sizeof(*r))))
		return -ENOMEM;
	if (o->nrefs) { /* qsort's and memcpy's base: never NULL */
		memcpy(r, o->refs, o->nrefs * sizeof(*r));
		qsort(r, o->nrefs, sizeof(*r), tier_ref_cmp_refs);
	}
	for (size_t i = 0; i < s->n; i++) {
		struct tier_entry *e = &s->v[i];
		const struct objstore_tier_ref *ref =
			o->nrefs ? bsearch(e, r, o->nrefs, sizeof(*r),
					   tier_entry_ref_cmp)
				 : NULL;

		if (!ref) {
			atomic_init(&e->state,
				    TIER_BAD_BASE + OBJSTORE_TIER_UNCHECKED);
		} else if (memcmp(ref->sha256, e->sha, 32) != 0) {
			log_error("shared tier %s: %s: SHA-256 mismatch (its "
				  "MANIFEST line is not the reference hash)",
				  s->dir, e->key);
			atomic_init(&e->state,
				    TIER_BAD_BASE + OBJSTORE_TIER_DAMAGED);
		}
	}
	free(r);
	return 0;
}

static int tier_load(struct tierstore *s, const char *path)
{
	FILE *f = tier_open_manifest(path);
	char *line = NULL;
	size_t cap = 0, lineno = 0, vcap = 0;
	ssize_t len;
	int ret = 0;

	if (!f)
		return errno == EINVAL ? -EINVAL : -errno;
	while ((len = getline(&line, &cap, f)) > 0) {
		lineno++;
		if (line[len - 1] == '\n')
			line[--len] = '\0';
		if (lineno == 1 && strcmp(line, "dstage-shared-tier 1") != 0)
			ret = -EINVAL;
		if (ret)
			break;
		if (lineno <= 5)
			continue;
		if (GROW_ONE(s->v, s->n, vcap, 64)) {
			ret = -ENOMEM;
			break;
		}
		memset(&s->v[s->n], 0, sizeof(s->v[0]));
		ret = tier_parse_line(line, &s->v[s->n]);
		if (ret)
			break;
		s->n++;
	}
	if (ret == -EINVAL)
		log_error("shared tier: %s:%zu: not a shared-tier MANIFEST "
			  "line: not using the tier",
			  path, lineno);
	free(line);
	fclose(f);
	if (!ret && s->n)
		qsort(s->v, s->n, sizeof(s->v[0]), tier_cmp);
	return ret;
}

int tierstore_open(const char *dir, const struct objstore_tier_opts *o,
		   struct objstore *tier, struct objstore *origin,
		   void (*release)(struct objstore *), struct objstore **out)
{
	struct tierstore *s = calloc(1, sizeof(*s));
	char path[4200];
	int ret;

	*out = NULL;
	if (!s)
		return -ENOMEM;
	s->base.ops = &tierstore_ops;
	s->dir = strdup(dir);
	s->report = o->report;
	if (o->report_tag)
		s->tag = strdup(o->report_tag);
	s->trusted = o->trust_root ? o->trusted : NULL;
	if (s->trusted)
		s->trust_root = strdup(o->trust_root);
	if (!s->dir || (o->report_tag && !s->tag) ||
	    (s->trusted && !s->trust_root)) {
		ret = -ENOMEM;
		goto err;
	}
	s->refused = o->refused;
	if (o->refused < 0) {
		snprintf(path, sizeof(path), "%s/MANIFEST", dir);
		ret = tier_load(s, path);
		if (!ret)
			ret = tier_apply_refs(s, o);
		if (ret)
			goto err;
	}
	s->tier = tier;
	s->origin = origin;
	s->release = release;
	*out = &s->base;
	return 0;
err:
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i].key);
	free(s->v);
	free(s->dir);
	free(s->tag);
	free(s->trust_root);
	free(s);
	return ret;
}
