// SPDX-License-Identifier: MIT
/*
 * lifecycle_run: one pass of the lifecycle rules over the checkpoint store,
 * the archive tiers and this node's local copies, and the recall of an
 * archived checkpoint (include/dstage/lifecycle_run.h).
 *
 * A pass: read the rules (catalog), list the store (objects and archive
 * markers) and the local journal into jobs and their checkpoints, ask
 * lifecycle_plan what to do with each job that has a rule, then do it,
 * one checkpoint at a time, in this order: delete, archive, drop local
 * copies. Stateless between calls; a pass owns everything it allocates.
 *
 * Crash safety of a move: the archive has every object before the marker
 * is written, and the marker is in the store before any object is deleted
 * from it; a recall copies back before it removes the marker. A pass cut
 * short leaves objects in both places, which the next pass finishes.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/lifecycle.h"
#include "dstage/lifecycle_run.h"
#include "dstage/lifecycle_stage.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define LIFECYCLE_CHUNK (8u << 20)
#define LIFECYCLE_SIDECAR ".dstage-sha256/"
#define LIFECYCLE_MARKER_MAX 4096

struct lifecycle_scan_local {
	char *key;
	ino_t ino;
};

struct lifecycle_scan_ckpt {
	char *name;
	int64_t mtime;
	bool in_store; /* has objects in the store */
	bool archived; /* has a marker */
	bool incomplete; /* a local file being written or to publish */
	char *archive; /* the marker's URL */
	struct lifecycle_scan_local *locals; /* published local copies */
	size_t nlocal, local_cap;
};

struct lifecycle_scan_job {
	char *name;
	struct lifecycle_scan_ckpt *v;
	size_t n, cap;
};

struct lifecycle_scan {
	struct lifecycle_scan_job *jobs;
	size_t n, cap;
	struct objstore *store;
	int err;
};

/* ---- the scan ---- */

/* The checkpoint "<job>/<name>" of the scan (made when missing), or NULL
 * (ENOMEM, recorded in s->err). */
static struct lifecycle_scan_ckpt *lifecycle_find(struct lifecycle_scan *s,
						  const char *job, size_t jl,
						  const char *name, size_t nl)
{
	struct lifecycle_scan_job *j = NULL;
	struct lifecycle_scan_ckpt *c;

	for (size_t i = 0; i < s->n && !j; i++)
		if (strlen(s->jobs[i].name) == jl &&
		    !memcmp(s->jobs[i].name, job, jl))
			j = &s->jobs[i];
	if (!j) {
		if (GROW_ONE(s->jobs, s->n, s->cap, 8))
			goto nomem;
		j = &s->jobs[s->n];
		memset(j, 0, sizeof(*j));
		j->name = strndup(job, jl);
		if (!j->name)
			goto nomem;
		s->n++;
	}
	for (size_t i = 0; i < j->n; i++)
		if (strlen(j->v[i].name) == nl &&
		    !memcmp(j->v[i].name, name, nl))
			return &j->v[i];
	if (GROW_ONE(j->v, j->n, j->cap, 8))
		goto nomem;
	c = &j->v[j->n];
	memset(c, 0, sizeof(*c));
	c->name = strndup(name, nl);
	if (!c->name)
		goto nomem;
	j->n++;
	return c;
nomem:
	s->err = -ENOMEM;
	return NULL;
}

/* Split "<job>/<name>[/...]" at its first two segments; false when the
 * key has fewer or is the store's own (a segment starting ".dstage"). */
static bool lifecycle_split(const char *key, size_t *jl, const char **name,
			    size_t *nl)
{
	const char *slash = strchr(key, '/'), *end;

	if (!slash || slash == key || !slash[1])
		return false;
	for (const char *p = key; p; p = strchr(p, '/')) {
		if (*p == '/')
			p++;
		if (!strncmp(p, ".dstage", 7))
			return false;
	}
	*jl = (size_t)(slash - key);
	*name = slash + 1;
	end = strchr(*name, '/');
	*nl = end ? (size_t)(end - *name) : strlen(*name);
	return true;
}

/* "<job>/.dstage-archived/<name>" into buf from prefix "<job>/<name>". */
static void lifecycle_mkey(char *buf, size_t len, const char *prefix)
{
	const char *slash = strchr(prefix, '/');

	snprintf(buf, len, "%.*s/%s%s", (int)(slash - prefix), prefix,
		 LIFECYCLE_MARKER, slash + 1);
}

/* Whether key is a marker "<job>/.dstage-archived/<name>". */
static bool lifecycle_is_marker(const char *key, size_t *jl, const char **name)
{
	const char *slash = strchr(key, '/');
	size_t ml = strlen(LIFECYCLE_MARKER);

	if (!slash || slash == key || strncmp(slash + 1, LIFECYCLE_MARKER, ml))
		return false;
	*jl = (size_t)(slash - key);
	*name = slash + 1 + ml;
	return **name && !strchr(*name, '/') && strncmp(*name, ".dstage", 7);
}

static int lifecycle_store_cb(void *arg, const struct objstore_info *oi)
{
	struct lifecycle_scan *s = arg;
	struct lifecycle_scan_ckpt *c;
	const char *name;
	size_t jl, nl;

	if (lifecycle_is_marker(oi->key, &jl, &name)) {
		c = lifecycle_find(s, oi->key, jl, name, strlen(name));
		if (!c)
			return s->err;
		/* its URL and mtime: lifecycle_scan_markers */
		c->archived = true;
		return 0;
	}
	if (!lifecycle_split(oi->key, &jl, &name, &nl))
		return 0;
	c = lifecycle_find(s, oi->key, jl, name, nl);
	if (!c)
		return s->err;
	c->in_store = true;
	if (oi->mtime > c->mtime)
		c->mtime = oi->mtime;
	return 0;
}

/* Read the marker of "<job>/<name>": its archive URL and mtime. */
static int lifecycle_marker_read(struct objstore *store, const char *mkey,
				 char **url, char *cls, size_t clen,
				 int64_t *mtime)
{
	char buf[LIFECYCLE_MARKER_MAX + 1], *p;
	size_t got = 0;
	int ret;

	*url = NULL;
	ret = objstore_get(store, mkey, 0, LIFECYCLE_MARKER_MAX, NULL, buf,
			   &got);
	if (ret)
		return ret;
	buf[got] = '\0';
	if (strncmp(buf, "dstage-archived 1\n", 18))
		return -EINVAL;
	for (p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
		char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);

		if (!strncmp(p, "url ", 4) && !*url)
			*url = strndup(p + 4, len - 4);
		else if (!strncmp(p, "class ", 6) && cls)
			snprintf(cls, clen, "%.*s", (int)(len - 6), p + 6);
		else if (!strncmp(p, "mtime ", 6) && mtime)
			*mtime = strtoll(p + 6, NULL, 10);
	}
	return *url ? 0 : -EINVAL;
}

/* Read the markers found by the listing: archive URL and mtime. */
static void lifecycle_scan_markers(struct lifecycle_scan *s)
{
	char prefix[2048], mkey[2200];

	for (size_t i = 0; i < s->n; i++)
		for (size_t k = 0; k < s->jobs[i].n; k++) {
			struct lifecycle_scan_ckpt *c = &s->jobs[i].v[k];
			int64_t mtime = 0;

			if (!c->archived)
				continue;
			snprintf(prefix, sizeof(prefix), "%s/%s",
				 s->jobs[i].name, c->name);
			lifecycle_mkey(mkey, sizeof(mkey), prefix);
			if (lifecycle_marker_read(s->store, mkey, &c->archive,
						  NULL, 0, &mtime)) {
				log_warn("lifecycle: unreadable archive marker "
					 "%s in %s: ignored",
					 mkey, objstore_url(s->store));
				c->archived = false;
				continue;
			}
			if (!c->in_store || mtime > c->mtime)
				c->mtime = mtime;
		}
}

static int lifecycle_scan_local_cb(void *arg, const struct lifecycle_local *l)
{
	struct lifecycle_scan *s = arg;
	struct lifecycle_scan_ckpt *c;
	const char *name;
	size_t jl, nl;

	if (!lifecycle_split(l->key, &jl, &name, &nl))
		return 0;
	c = lifecycle_find(s, l->key, jl, name, nl);
	if (!c)
		return s->err;
	if (l->state != 'C') {
		c->incomplete = true;
		if (l->mtime > c->mtime)
			c->mtime = l->mtime;
		return 0;
	}
	if (GROW_ONE(c->locals, c->nlocal, c->local_cap, 4))
		return s->err = -ENOMEM;
	c->locals[c->nlocal].key = strdup(l->key);
	if (!c->locals[c->nlocal].key)
		return s->err = -ENOMEM;
	c->locals[c->nlocal++].ino = l->ino;
	return 0;
}

static void lifecycle_scan_release(struct lifecycle_scan *s)
{
	for (size_t i = 0; i < s->n; i++) {
		for (size_t k = 0; k < s->jobs[i].n; k++) {
			struct lifecycle_scan_ckpt *c = &s->jobs[i].v[k];

			for (size_t l = 0; l < c->nlocal; l++)
				free(c->locals[l].key);
			free(c->locals);
			free(c->name);
			free(c->archive);
		}
		free(s->jobs[i].v);
		free(s->jobs[i].name);
	}
	free(s->jobs);
}

/* ---- moving objects ---- */

/* "<prefix>" is key itself or a directory above it. */
static bool lifecycle_under(const char *key, const char *prefix)
{
	size_t pl = strlen(prefix);

	return !strncmp(key, prefix, pl) && (!key[pl] || key[pl] == '/');
}

struct lifecycle_keys {
	const char *prefix;
	char **v;
	uint64_t *sizes;
	size_t n, cap;
	int err;
};

static int lifecycle_keys_cb(void *arg, const struct objstore_info *oi)
{
	struct lifecycle_keys *k = arg;
	size_t scap = k->cap; /* sizes[] has v[]'s capacity */

	if (!lifecycle_under(oi->key, k->prefix))
		return 0;
	if (GROW_ONE(k->v, k->n, k->cap, 8) ||
	    grow_array(&k->sizes, &scap, k->cap, sizeof(*k->sizes), 8))
		return k->err = -ENOMEM;
	k->v[k->n] = strdup(oi->key);
	if (!k->v[k->n])
		return k->err = -ENOMEM;
	k->sizes[k->n++] = oi->size;
	return 0;
}

static void lifecycle_keys_release(struct lifecycle_keys *k)
{
	for (size_t i = 0; i < k->n; i++)
		free(k->v[i]);
	free(k->v);
	free(k->sizes);
}

/* The objects of checkpoint prefix ("<job>/<name>") in os. */
static int lifecycle_keys_list(struct objstore *os, const char *prefix,
			       struct lifecycle_keys *k)
{
	int ret;

	memset(k, 0, sizeof(*k));
	k->prefix = prefix;
	ret = objstore_list(os, prefix, lifecycle_keys_cb, k);
	return ret ? ret : k->err;
}

/* Copy object key (size bytes) from one store to another through an
 * unnamed temporary file in tmpdir. */
static int lifecycle_copy(struct objstore *from, struct objstore *to,
			  const char *key, uint64_t size, const char *tmpdir)
{
	char *buf = NULL;
	uint64_t off = 0;
	int fd, ret = 0;

	fd = open(tmpdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		fd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	buf = size ? malloc(LIFECYCLE_CHUNK) : NULL;
	if (size && !buf) {
		ret = -ENOMEM;
		goto out;
	}
	while (off < size) {
		size_t want = size - off < LIFECYCLE_CHUNK ? size - off
							   : LIFECYCLE_CHUNK;
		size_t got = 0;

		ret = objstore_get(from, key, off, want, NULL, buf, &got);
		if (!ret && !got)
			ret = -EIO;
		if (!ret && pwrite(fd, buf, got, (off_t)off) != (ssize_t)got)
			ret = errno ? -errno : -EIO;
		if (ret)
			goto out;
		off += got;
	}
	ret = objstore_put_fd(to, key, fd, size);
out:
	free(buf);
	close(fd);
	return ret;
}

/* Copy key's sidecar, when it has one. */
static int lifecycle_copy_sidecar(struct objstore *from, struct objstore *to,
				  const char *key, const char *tmpdir)
{
	char side[4200];
	struct objstore_info oi;
	int ret;

	snprintf(side, sizeof(side), "%s%s", LIFECYCLE_SIDECAR, key);
	ret = objstore_head(from, side, &oi);
	if (ret == -ENOENT)
		return 0;
	return ret ? ret : lifecycle_copy(from, to, side, oi.size, tmpdir);
}

static int lifecycle_delete_with_sidecar(struct objstore *os, const char *key)
{
	char side[4200];
	int ret = objstore_delete(os, key);

	snprintf(side, sizeof(side), "%s%s", LIFECYCLE_SIDECAR, key);
	if (!ret)
		ret = objstore_delete(os, side);
	return ret;
}

static int lifecycle_open_archive(const struct dstage_config *cfg,
				  const char *url, const char *cls,
				  struct objstore **out)
{
	int ret = objstore_open(url, cfg, out);

	if (ret) {
		log_error("lifecycle: cannot open the archive %s: %s", url,
			  strerror(-ret));
		return ret;
	}
	ret = objstore_set_storage_class(*out, cls);
	if (ret) {
		objstore_free(*out);
		*out = NULL;
	}
	return ret;
}

/* Move checkpoint prefix from store to the rule's archive (see the top). */
static int lifecycle_archive(const struct dstage_config *cfg,
			     struct objstore *store,
			     const struct lifecycle_rule *r, const char *prefix,
			     int64_t mtime)
{
	struct objstore *arch = NULL;
	struct lifecycle_keys k;
	char mkey[4200], body[LIFECYCLE_URL_MAX + 200];
	const char *tmp =
		cfg->ckpt_staging_dir ? cfg->ckpt_staging_dir : "/tmp";
	int ret = lifecycle_keys_list(store, prefix, &k);

	if (!ret && !k.n)
		ret = -ENOENT; /* gone meanwhile: no marker for nothing */
	if (!ret)
		ret = lifecycle_open_archive(cfg, r->archive, r->storage_class,
					     &arch);
	for (size_t i = 0; !ret && i < k.n; i++) {
		ret = lifecycle_copy(store, arch, k.v[i], k.sizes[i], tmp);
		if (!ret)
			ret = lifecycle_copy_sidecar(store, arch, k.v[i], tmp);
	}
	if (ret)
		goto out;
	lifecycle_mkey(mkey, sizeof(mkey), prefix);
	snprintf(body, sizeof(body),
		 "dstage-archived 1\nurl %s\nclass %s\nmtime %" PRId64
		 "\nfiles %zu\n",
		 r->archive, r->storage_class, mtime, k.n);
	ret = objstore_put_buf(store, mkey, body, strlen(body));
	for (size_t i = 0; !ret && i < k.n; i++)
		ret = lifecycle_delete_with_sidecar(store, k.v[i]);
out:
	objstore_free(arch);
	lifecycle_keys_release(&k);
	return ret;
}

/* Delete checkpoint prefix from the store and from archive (may be NULL),
 * marker last. */
static int lifecycle_delete(const struct dstage_config *cfg,
			    struct objstore *store, const char *archive,
			    const char *prefix)
{
	struct objstore *arch = NULL;
	struct lifecycle_keys k;
	char mkey[4200];
	int ret = lifecycle_keys_list(store, prefix, &k);

	for (size_t i = 0; !ret && i < k.n; i++)
		ret = lifecycle_delete_with_sidecar(store, k.v[i]);
	lifecycle_keys_release(&k);
	if (!ret && archive && *archive) {
		ret = lifecycle_open_archive(cfg, archive, NULL, &arch);
		if (!ret)
			ret = lifecycle_keys_list(arch, prefix, &k);
		for (size_t i = 0; !ret && i < k.n; i++)
			ret = lifecycle_delete_with_sidecar(arch, k.v[i]);
		if (arch)
			lifecycle_keys_release(&k);
		objstore_free(arch);
	}
	lifecycle_mkey(mkey, sizeof(mkey), prefix);
	if (!ret)
		ret = objstore_delete(store, mkey);
	return ret;
}

/* The audit record of a recall (catalog at cfg's catalog.path): action
 * "lifecycle.recall", target the checkpoint, from the archive, for the
 * key opened. A failure is logged: the recall stands. */
static void lifecycle_audit_recall(const struct dstage_config *cfg,
				   const struct catalog_audit *who,
				   const char *prefix, const char *url,
				   const char *key)
{
	struct catalog_audit a = *who;
	struct catalog *cat = NULL;
	char from[LIFECYCLE_URL_MAX + 8], why[2100];
	int ret;

	snprintf(from, sizeof(from), "from %s", url);
	snprintf(why, sizeof(why), "read of %s", key);
	a.action = "lifecycle.recall";
	a.target = prefix;
	a.old_value = from;
	a.new_value = why;
	ret = cfg->catalog_path ? catalog_open(cfg->catalog_path, 0, &cat)
				: -ENOENT;
	if (!ret)
		ret = catalog_audit_add(cat, &a);
	catalog_close(cat);
	if (ret)
		log_error("lifecycle: recalled %s for uid %u but cannot audit "
			  "it in %s: %s",
			  prefix, (unsigned)a.uid,
			  cfg->catalog_path ? cfg->catalog_path : "(none)",
			  strerror(-ret));
}

/* The checkpoint prefix "<job>/<checkpoint>" of key and its marker's key.
 * false: key belongs to no checkpoint (or is too long). */
static bool lifecycle_prefix(const char *key, char *prefix, size_t plen,
			     char *mkey, size_t mlen)
{
	const char *name;
	size_t jl, nl;

	if (!lifecycle_split(key, &jl, &name, &nl) || jl + 1 + nl >= plen)
		return false;
	snprintf(prefix, plen, "%.*s/%.*s", (int)jl, key, (int)nl, name);
	lifecycle_mkey(mkey, mlen, prefix);
	return true;
}

static int lifecycle_has_any(void *arg, const struct objstore_info *oi)
{
	(void)oi;
	*(bool *)arg = true;
	return 1; /* one is enough */
}

int lifecycle_archived_stat(const struct dstage_config *cfg,
			    struct objstore *store, const char *key,
			    struct lifecycle_archived *a)
{
	struct objstore *arch = NULL;
	struct objstore_info oi;
	char prefix[2048], mkey[2200], *url = NULL, *sub = NULL;
	int64_t mtime = 0;
	bool any = false;
	int ret;

	memset(a, 0, sizeof(*a));
	if (!lifecycle_prefix(key, prefix, sizeof(prefix), mkey, sizeof(mkey)))
		return -ENOENT;
	/* No marker that can be read (missing, unreadable, or a path the
	 * store cannot hold: a file "<job>" gives ENOTDIR): not archived, as
	 * for a name that does not exist. Past it, the archive's errors. */
	ret = objstore_head(store, mkey, &oi); /* quiet when missing */
	if (!ret)
		ret = lifecycle_marker_read(store, mkey, &url, NULL, 0, &mtime);
	if (ret)
		ret = -ENOENT;
	if (!ret)
		ret = lifecycle_open_archive(cfg, url, NULL, &arch);
	if (ret)
		goto out;
	a->mtime = mtime;
	ret = objstore_head(arch, key, &oi);
	if (!ret) {
		a->size = oi.size;
		goto out;
	}
	if (ret != -ENOENT)
		goto out;
	/* a directory: something in the archive below it */
	if (asprintf(&sub, "%s/", key) < 0) {
		sub = NULL;
		ret = -ENOMEM;
		goto out;
	}
	ret = objstore_list(arch, sub, lifecycle_has_any, &any);
	if (ret == 1)
		ret = 0;
	if (!ret && !any)
		ret = -ENOENT;
	a->dir = !ret;
out:
	free(sub);
	free(url);
	objstore_free(arch);
	return ret;
}

int lifecycle_recall(const struct dstage_config *cfg, struct objstore *store,
		     const char *key, const struct catalog_audit *who)
{
	struct objstore *arch = NULL, *own = NULL;
	struct objstore_info oi;
	struct lifecycle_keys k = { 0 };
	char prefix[2048], mkey[2200], cls[LIFECYCLE_CLASS_MAX] = "";
	const char *tmp =
		cfg->ckpt_staging_dir ? cfg->ckpt_staging_dir : "/tmp";
	char *url = NULL;
	int ret;

	if (!lifecycle_prefix(key, prefix, sizeof(prefix), mkey, sizeof(mkey)))
		return -ENOENT;
	if (!store) {
		if (!cfg->ckpt_store ||
		    objstore_open(cfg->ckpt_store, cfg, &own))
			return -ENOENT;
		store = own;
	}
	ret = objstore_head(store, mkey, &oi); /* quiet when missing */
	if (!ret)
		ret = lifecycle_marker_read(store, mkey, &url, cls, sizeof(cls),
					    NULL);
	if (ret == -ERANGE || ret == -EINVAL)
		ret = -ENOENT;
	if (ret)
		goto out;
	log_info("lifecycle: recalling %s from the archive %s into %s", prefix,
		 url, objstore_url(store));
	ret = lifecycle_open_archive(cfg, url, NULL, &arch);
	if (!ret)
		ret = lifecycle_keys_list(arch, prefix, &k);
	for (size_t i = 0; !ret && i < k.n; i++) {
		ret = lifecycle_copy(arch, store, k.v[i], k.sizes[i], tmp);
		if (!ret)
			ret = lifecycle_copy_sidecar(arch, store, k.v[i], tmp);
	}
	if (!ret && !k.n)
		ret = -ENOENT;
	if (!ret)
		ret = objstore_delete(store, mkey);
	if (ret)
		log_error("lifecycle: cannot recall %s from the archive %s: %s",
			  prefix, url, strerror(-ret));
	else
		log_info("lifecycle: recalled %s (%zu files) from %s for uid "
			 "%u",
			 prefix, k.n, url, who ? (unsigned)who->uid : 0u);
	if (!ret && who)
		lifecycle_audit_recall(cfg, who, prefix, url, key);
out:
	lifecycle_keys_release(&k);
	objstore_free(arch);
	objstore_free(own);
	free(url);
	return ret;
}

/* ---- the pass ---- */

struct lifecycle_pass {
	const struct dstage_config *cfg;
	struct catalog *cat;
	const struct lifecycle_run_opts *o;
	struct objstore *store;
	struct lifecycle_staging *stg;
	lifecycle_event_cb cb;
	void *arg;
	struct lifecycle_run_stats *st;
};

static void lifecycle_report(struct lifecycle_pass *p,
			     struct lifecycle_event *ev)
{
	char target[600], desc[LIFECYCLE_PATTERN_MAX + LIFECYCLE_URL_MAX + 300];
	struct catalog_audit a = { .uid = p->o->uid, .user = p->o->user };
	char action[40];

	if (ev->result)
		p->st->errors++;
	if (p->cb)
		p->cb(p->arg, ev);
	if (p->o->dry_run || ev->result)
		return;
	snprintf(action, sizeof(action), "lifecycle.%s",
		 ev->action == LIFECYCLE_ABANDONED_RM
			 ? "abandoned"
			 : lifecycle_action_name(ev->action));
	snprintf(target, sizeof(target), "%s%s%s", ev->job,
		 ev->job[0] ? "/" : "", ev->name);
	if (ev->rule) {
		char rs[LIFECYCLE_PATTERN_MAX + LIFECYCLE_URL_MAX + 200];

		snprintf(desc, sizeof(desc), "%s%s (rule %" PRId64 ": %s)",
			 ev->to[0] ? "to " : "removed", ev->to, ev->rule->id,
			 lifecycle_rule_str(ev->rule, rs, sizeof(rs)));
	} else {
		snprintf(desc, sizeof(desc),
			 "removed (abandoned by its writer, older than %" PRId64
			 " s)",
			 p->o->abandoned_keep);
	}
	a.action = action;
	a.target = target;
	a.old_value = ev->from;
	a.new_value = desc;
	log_info("lifecycle: %s %s: from %s %s", action, target, ev->from,
		 desc);
	if (p->cat && catalog_audit_add(p->cat, &a))
		log_error("lifecycle: %s %s done but not audited", action,
			  target);
}

static void lifecycle_apply(struct lifecycle_pass *p,
			    const struct lifecycle_rule *r, const char *job,
			    struct lifecycle_ckpt *k,
			    struct lifecycle_scan_ckpt *c)
{
	char prefix[2048], staging[4300];
	struct lifecycle_event ev = {
		.job = job,
		.name = k->name,
		.rule = r,
		.step = k->step,
		.age = p->o->now - k->mtime,
	};
	const char *where = c->archived && !c->in_store
				    ? c->archive
				    : objstore_url(p->store);

	snprintf(prefix, sizeof(prefix), "%s/%s", job, k->name);
	snprintf(staging, sizeof(staging), "%s (local copies)",
		 p->stg ? lifecycle_staging_path(p->stg) : "staging");
	if (k->actions & LIFECYCLE_DELETE) {
		ev.action = LIFECYCLE_DELETE;
		ev.from = where;
		ev.to = "";
		if (!p->o->dry_run)
			ev.result = lifecycle_delete(
				p->cfg, p->store,
				c->archive ? c->archive : r->archive, prefix);
		p->st->deleted += !ev.result;
		lifecycle_report(p, &ev);
	}
	if (k->actions & LIFECYCLE_ARCHIVE_IT) {
		ev.action = LIFECYCLE_ARCHIVE_IT;
		ev.from = objstore_url(p->store);
		ev.to = r->archive;
		ev.result = 0;
		if (!p->o->dry_run)
			ev.result = lifecycle_archive(p->cfg, p->store, r,
						      prefix, k->mtime);
		p->st->archived += !ev.result;
		lifecycle_report(p, &ev);
	}
	if ((k->actions & LIFECYCLE_DROP_LOCAL) && c->nlocal) {
		ev.action = LIFECYCLE_DROP_LOCAL;
		ev.from = staging;
		ev.to = "";
		ev.result = 0;
		for (size_t i = 0; !p->o->dry_run && i < c->nlocal; i++) {
			int ret = lifecycle_staging_drop(
				p->stg, c->locals[i].key, c->locals[i].ino);

			/* -EBUSY: open in dstagefs, kept for now */
			if (ret && ret != -ESTALE && ret != -EBUSY &&
			    !ev.result)
				ev.result = ret;
		}
		p->st->dropped += !ev.result;
		lifecycle_report(p, &ev);
	}
}

static void lifecycle_job(struct lifecycle_pass *p,
			  const struct lifecycle_rule *r,
			  struct lifecycle_scan_job *j)
{
	struct lifecycle_ckpt *k = calloc(j->n, sizeof(*k));

	if (!k) {
		p->st->errors++;
		return;
	}
	for (size_t i = 0; i < j->n; i++) {
		struct lifecycle_scan_ckpt *c = &j->v[i];

		k[i].name = c->name;
		k[i].mtime = c->mtime;
		k[i].tier = c->in_store ? LIFECYCLE_SHARED : LIFECYCLE_ARCHIVE;
		k[i].local = c->nlocal > 0;
		k[i].complete = !c->incomplete && (c->in_store || c->archived);
	}
	lifecycle_plan(r, k, j->n, p->o->now);
	p->st->jobs++;
	p->st->checkpoints += (unsigned)j->n;
	for (size_t i = 0; i < j->n; i++) {
		struct lifecycle_scan_ckpt *c = NULL;

		for (size_t m = 0; m < j->n && !c; m++)
			if (j->v[m].name == k[i].name)
				c = &j->v[m];
		if (k[i].actions && c)
			lifecycle_apply(p, r, j->name, &k[i], c);
	}
	free(k);
}

struct lifecycle_abandoned_arg {
	struct lifecycle_pass *p;
	char **names;
	size_t n, cap;
};

static int lifecycle_abandoned_one(void *arg,
				   const struct lifecycle_abandoned *a)
{
	struct lifecycle_abandoned_arg *x = arg;

	if (x->p->o->now - a->mtime < x->p->o->abandoned_keep)
		return 0;
	if (GROW_ONE(x->names, x->n, x->cap, 16))
		return -ENOMEM;
	x->names[x->n] = strdup(a->name);
	return x->names[x->n++] ? 0 : -ENOMEM;
}

static void lifecycle_sweep_abandoned(struct lifecycle_pass *p)
{
	struct lifecycle_abandoned_arg x = { .p = p };
	char from[4200];

	if (!p->stg)
		return;
	lifecycle_abandoned_list(p->stg, lifecycle_abandoned_one, &x);
	snprintf(from, sizeof(from), "%s/abandoned",
		 lifecycle_staging_path(p->stg));
	for (size_t i = 0; i < x.n; i++) {
		struct lifecycle_event ev = {
			.job = "",
			.name = x.names[i],
			.action = LIFECYCLE_ABANDONED_RM,
			.from = from,
			.to = "",
			.step = -1,
		};

		if (!p->o->dry_run)
			ev.result =
				lifecycle_abandoned_remove(p->stg, x.names[i]);
		p->st->abandoned += !ev.result;
		lifecycle_report(p, &ev);
		free(x.names[i]);
	}
	free(x.names);
}

int lifecycle_run(const struct dstage_config *cfg, struct catalog *cat,
		  const struct lifecycle_run_opts *o, lifecycle_event_cb cb,
		  void *arg, struct lifecycle_run_stats *stats)
{
	struct lifecycle_run_stats st0 = { 0 };
	struct lifecycle_rule *rules = NULL;
	struct lifecycle_scan s = { 0 };
	struct lifecycle_pass p = { .cfg = cfg,
				    .cat = cat,
				    .o = o,
				    .cb = cb,
				    .arg = arg,
				    .st = stats ? stats : &st0 };
	size_t nrules = 0;
	int ret;

	memset(p.st, 0, sizeof(*p.st));
	if (!cfg->ckpt_store || !*cfg->ckpt_store)
		return -ENOENT;
	ret = catalog_lifecycle_list(cat, &rules, &nrules);
	if (ret)
		return ret;
	ret = objstore_open(cfg->ckpt_store, cfg, &p.store);
	if (ret) {
		log_error("lifecycle: cannot open checkpoints.store %s: %s",
			  cfg->ckpt_store, strerror(-ret));
		goto out;
	}
	ret = lifecycle_staging_open(cfg, &p.stg);
	if (ret && ret != -ENOENT)
		log_warn("lifecycle: no local copies handled: %s",
			 strerror(-ret));
	s.store = p.store;
	ret = objstore_list(p.store, "", lifecycle_store_cb, &s);
	if (!ret)
		lifecycle_scan_markers(&s);
	if (!ret && p.stg)
		ret = lifecycle_staging_scan(p.stg, lifecycle_scan_local_cb,
					     &s);
	if (!ret)
		ret = s.err;
	if (ret) {
		log_error("lifecycle: cannot list the checkpoints of %s: %s",
			  cfg->ckpt_store, strerror(-ret));
		goto out;
	}
	for (size_t i = 0; i < s.n; i++) {
		const struct lifecycle_rule *r =
			lifecycle_rule_find(rules, nrules, s.jobs[i].name);

		if (r)
			lifecycle_job(&p, r, &s.jobs[i]);
	}
	lifecycle_sweep_abandoned(&p);
	log_info("lifecycle: %s%u job(s), %u checkpoint(s) with a rule: %u "
		 "archived, %u deleted, %u local copies dropped, %u abandoned "
		 "file(s) removed, %u error(s)",
		 o->dry_run ? "(dry run) " : "", p.st->jobs, p.st->checkpoints,
		 p.st->archived, p.st->deleted, p.st->dropped, p.st->abandoned,
		 p.st->errors);
out:
	lifecycle_scan_release(&s);
	lifecycle_staging_free(p.stg);
	objstore_free(p.store);
	free(rules);
	return ret;
}
