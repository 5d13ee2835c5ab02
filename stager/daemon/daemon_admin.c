// SPDX-License-Identifier: MIT
/*
 * daemon_admin: the daemon's requests for cachectl (docs/cachectl.md), rows
 * of daemon_req.c's table: cache status, a dataset's pin, quota and
 * priority, the cache policy (capacity and watermarks kept in the catalog's
 * policy table), eviction, garbage collection (lib/glue/cachegc.c) and the
 * audit trail. daemon_admin_audit is the
 * one writer of audit records, for these requests and stager's.
 *
 * Stateless: a handler works on its connection (c->cat, c->jq, c->out) and
 * reads the daemon's cache through d->env.cache, which is thread-safe.
 * daemon_req_run has checked, before a handler runs, that the peer is an
 * admin where the table says so and that name= is present where needed.
 * Each handler validates all of its input before it changes anything.
 */
#include <errno.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon_i.h"
#include "dstage/cache.h"
#include "dstage/cachegc.h"
#include "dstage/cachescrub.h"
#include "dstage/catalog.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define ADMIN_PRIORITY_MAX 1000 /* as stager add --priority */
#define ADMIN_GC_MIN_AGE 3600 /* gc: leftovers younger are kept, seconds */

void daemon_admin_audit(struct daemon_conn *c, const char *action,
			const char *target, const char *old_value,
			const char *new_value)
{
	struct catalog_audit a = {
		.uid = c->uid,
		.user = c->user[0] ? c->user : NULL,
		.action = action,
		.target = target,
		.old_value = old_value,
		.new_value = new_value,
	};
	int ret = catalog_audit_add(c->cat, &a);

	/* The change is made and stays made: undoing it could fail too.
	 * Both the log and the user who asked are told that the trail
	 * misses it. */
	if (ret) {
		log_warn("audit %s %s by uid %u: %s", action,
			 target ? target : "", (unsigned)c->uid,
			 strerror(-ret));
		snprintf(c->warn, sizeof(c->warn),
			 "%s %s was done, but its audit record could not be "
			 "written to the catalog: %s (see the daemon's log)",
			 action, target ? target : "", strerror(-ret));
	}
}

/* Parse a strictly decimal u64 (no sign, no suffix). 0 or -EINVAL. */
static int daemon_admin_u64(const char *s, uint64_t *v)
{
	char *end;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	*v = strtoull(s, &end, 10);
	return errno || *end ? -EINVAL : 0;
}

/* ---- the dataset's cached bytes ---- */

struct daemon_admin_walk {
	struct cache *cache;
	struct objstore *os;
	const char *dataset;
	bool drop, dry_run;
	int64_t cutoff; /* drop only files last accessed before; 0: all */
	uint64_t files, cached, dropped, busy_files, busy_bytes;
	uint64_t last_access; /* newest of its cached files, 0: none */
};

static int daemon_admin_walk_cb(void *arg, const char *path,
				const struct catalog_entry *e)
{
	struct daemon_admin_walk *w = arg;
	struct cache_object o = {
		.dataset = w->dataset,
		.os = w->os,
		.key = path,
		.etag = e->etag,
		.size = e->size,
	};
	uint64_t have = 0, atime = 0;
	int ret;

	w->files++;
	if (cache_object_present(w->cache, &o, &have) || !have)
		return 0;
	have = have < e->size ? have : e->size;
	w->cached += have;
	if (!cache_object_atime(w->cache, &o, &atime) && atime > w->last_access)
		w->last_access = atime;
	if (w->drop && w->cutoff && atime >= (uint64_t)w->cutoff)
		return 0; /* used since: kept */
	if (!w->drop || w->dry_run) {
		w->dropped += have;
		return 0;
	}
	/* A file a reader has open is left to it (-EBUSY): the reader's
	 * bytes stay right, and a later evict or the cache's own eviction
	 * takes it once it is closed. */
	ret = cache_object_drop(w->cache, &o);
	if (!ret) {
		w->dropped += have;
	} else if (ret == -EBUSY) {
		w->busy_files++;
		w->busy_bytes += have;
	} else if (ret != -ENOENT) {
		log_warn("evict %s: dropping %s: %s", w->dataset, path,
			 strerror(-ret));
	}
	return 0;
}

/* Walk dataset ds's files in the cache (w->drop: dropping them). */
static int daemon_admin_walk(struct daemon_conn *c,
			     const struct catalog_dataset *ds,
			     struct daemon_admin_walk *w)
{
	int ret;

	w->cache = c->d->env.cache;
	w->dataset = ds->name;
	if (!w->cache || ds->state != CATALOG_DS_READY)
		return 0;
	if (objstore_open(ds->source, c->d->cfg, &w->os))
		w->os = NULL;
	ret = runner_walk(c->cat, ds->name, daemon_admin_walk_cb, w);
	objstore_free(w->os);
	w->os = NULL;
	return ret == -ENOENT ? 0 : ret;
}

/* ---- the cache policy: capacity and watermarks ---- */

/* The effective capacity and watermarks: the catalog's, where set, else
 * the configuration's. from_cat[i] tells which. */
struct daemon_admin_pol {
	uint64_t capacity;
	unsigned high, low; /* percent */
	bool cat_capacity, cat_high, cat_low;
};

static const char *const daemon_admin_pol_keys[] = {
	CATALOG_POLICY_CACHE_SIZE,
	CATALOG_POLICY_CACHE_HIGH,
	CATALOG_POLICY_CACHE_LOW,
};

static int daemon_admin_pol_get(struct daemon_conn *c,
				struct daemon_admin_pol *p)
{
	const struct dstage_config *cfg = c->d->cfg;
	char buf[64];
	uint64_t v;
	int ret;

	p->capacity = cfg->cache_size;
	p->high = cfg->cache_high_watermark;
	p->low = cfg->cache_low_watermark;
	p->cat_capacity = p->cat_high = p->cat_low = false;
	for (int i = 0; i < 3; i++) {
		ret = catalog_policy_get(c->cat, daemon_admin_pol_keys[i], buf,
					 sizeof(buf));
		if (ret == -ENOENT)
			continue;
		if (!ret)
			ret = daemon_admin_u64(buf, &v);
		if (ret) {
			log_warn("catalog policy %s = '%s': %s; using the "
				 "configuration's",
				 daemon_admin_pol_keys[i], buf, strerror(-ret));
			continue;
		}
		if (i == 0) {
			p->capacity = v;
			p->cat_capacity = true;
		} else if (i == 1 && v >= 1 && v <= 100) {
			p->high = (unsigned)v;
			p->cat_high = true;
		} else if (i == 2 && v >= 1 && v <= 100) {
			p->low = (unsigned)v;
			p->cat_low = true;
		}
	}
	return 0;
}

uint64_t daemon_admin_capacity(struct daemon_conn *c, bool *from_catalog)
{
	struct daemon_admin_pol p;

	daemon_admin_pol_get(c, &p);
	*from_catalog = p.cat_capacity;
	return p.capacity;
}

static void daemon_admin_pol_fields(struct daemon_conn *c,
				    const struct daemon_admin_pol *p)
{
	proto_add_u64(&c->out, "capacity", p->capacity);
	proto_add_u64(&c->out, "high_watermark", p->high);
	proto_add_u64(&c->out, "low_watermark", p->low);
	proto_add_u64(&c->out, "high_bytes", p->capacity / 100 * p->high);
	proto_add_u64(&c->out, "low_bytes", p->capacity / 100 * p->low);
	proto_add(&c->out, "capacity_from",
		  p->cat_capacity ? "catalog" : "config");
	proto_add(&c->out, "high_from", p->cat_high ? "catalog" : "config");
	proto_add(&c->out, "low_from", p->cat_low ? "catalog" : "config");
}

int daemon_admin_policy_show(struct daemon_conn *c)
{
	struct daemon_admin_pol p;
	int ret = daemon_admin_pol_get(c, &p);

	if (ret)
		return daemon_peer_end(c, ret, NULL);
	daemon_peer_row(c, "row");
	daemon_admin_pol_fields(c, &p);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

int daemon_admin_policy_set(struct daemon_conn *c)
{
	static const char *const keys[] = { "capacity", "high", "low" };
	struct daemon_admin_pol p, was;
	const char *val[3];
	uint64_t v[3] = { 0 };
	bool any = false;
	int ret = daemon_admin_pol_get(c, &p);

	if (ret)
		return daemon_peer_end(c, ret, NULL);
	was = p;
	for (int i = 0; i < 3; i++) {
		val[i] = proto_get(&c->msg, keys[i]);
		if (!val[i])
			continue;
		any = true;
		if (daemon_admin_u64(val[i], &v[i]) ||
		    (i == 0 && v[i] < 1024 * 1024) ||
		    (i > 0 && (v[i] < 1 || v[i] > 100)))
			return daemon_peer_end(
				c, -EINVAL, "policy set: %s=%.40s: expected %s",
				keys[i], val[i],
				i == 0 ? "a size of at least 1 MiB (bytes, or "
					 "with K, M, G, T)"
				       : "a percentage from 1 to 100");
	}
	if (!any)
		return daemon_peer_end(c, -EINVAL,
				       "policy set: nothing to set (capacity=, "
				       "high= or low=)");
	if (val[0]) {
		p.capacity = v[0];
		p.cat_capacity = true;
	}
	if (val[1]) {
		p.high = (unsigned)v[1];
		p.cat_high = true;
	}
	if (val[2]) {
		p.low = (unsigned)v[2];
		p.cat_low = true;
	}
	if (p.low >= p.high)
		return daemon_peer_end(
			c, -EINVAL,
			"policy set: low watermark %u%% is not below the high "
			"watermark %u%%: the low watermark must be below the "
			"high one",
			p.low, p.high);
	for (int i = 0; i < 3; i++) {
		char old[32], new[32];
		uint64_t o = i == 0   ? was.capacity
			     : i == 1 ? was.high
				      : was.low;

		if (!val[i])
			continue;
		snprintf(old, sizeof(old), "%" PRIu64, o);
		snprintf(new, sizeof(new), "%" PRIu64, v[i]);
		ret = catalog_policy_set(c->cat, daemon_admin_pol_keys[i], new);
		if (ret)
			return daemon_peer_end(c, ret, "policy set %s: %s",
					       daemon_admin_pol_keys[i],
					       strerror(-ret));
		daemon_admin_audit(c, "policy.set", daemon_admin_pol_keys[i],
				   old, new);
	}
	daemon_peer_row(c, "row");
	daemon_admin_pol_fields(c, &p);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

/* ---- status ---- */

static int daemon_admin_status_ds(void *arg, const struct catalog_dataset *ds)
{
	struct daemon_conn *c = arg;
	struct daemon_admin_walk w = { 0 };
	int ret;

	if (!daemon_peer_may_read(c, ds->group))
		return 0; /* not even its name to non-members */
	ret = daemon_admin_walk(c, ds, &w);
	if (ret)
		log_warn("status: the cached bytes of %s: %s", ds->name,
			 strerror(-ret));
	daemon_peer_row(c, "dataset");
	proto_add(&c->out, "name", ds->name);
	proto_add_u64(&c->out, "bytes", ds->bytes);
	proto_add_u64(&c->out, "files", ds->objects);
	proto_add_u64(&c->out, "cached", w.cached);
	proto_add_u64(&c->out, "pinned", ds->pinned);
	proto_add_u64(&c->out, "quota", ds->quota);
	proto_add_i64(&c->out, "priority", ds->priority);
	proto_add(&c->out, "group", ds->group ? ds->group : "");
	proto_add_u64(&c->out, "last_access", w.last_access);
	daemon_peer_tier_fields(c, ds->name);
	return proto_send(c->fd, &c->out);
}

struct daemon_admin_jobs {
	struct daemon_conn *c;
	uint64_t running, queued;
};

static int daemon_admin_status_job(void *arg, const struct jobs_job *j)
{
	struct daemon_admin_jobs *a = arg;
	struct daemon_conn *c = a->c;
	struct catalog_dataset ds = { 0 };
	bool visible = c->admin;

	if (jobs_state_final(j->state))
		return 0;
	if (!visible) {
		visible = !catalog_dataset_get(c->cat, j->dataset, &ds) &&
			  daemon_peer_may_read(c, ds.group);
		catalog_dataset_release(&ds);
	}
	if (!visible)
		return 0;
	if (j->state == JOBS_RUNNING)
		a->running++;
	else
		a->queued++;
	daemon_peer_row(c, "job");
	proto_add_i64(&c->out, "job", j->id);
	proto_add(&c->out, "kind", j->kind);
	proto_add(&c->out, "dataset", j->dataset);
	proto_add(&c->out, "state", jobs_state_name(j->state));
	proto_add_u64(&c->out, "done", j->done);
	proto_add_u64(&c->out, "total", j->total);
	return proto_send(c->fd, &c->out);
}

/* The scrub's progress (lib/glue/cachescrub.c) and cache.verify_reads,
 * as scrub_* fields of the cache row (docs/cachectl.md). */
static void daemon_admin_scrub_fields(struct daemon_conn *c)
{
	struct cachescrub_progress p;

	cachescrub_get(c->d->scrub, &p);
	proto_add(&c->out, "verify_reads",
		  c->d->cfg->cache_verify_reads == CONFIG_VERIFY_ALWAYS
			  ? "always"
			  : "fill");
	proto_add_u64(&c->out, "scrub_enabled", p.enabled);
	proto_add_u64(&c->out, "scrub_running", p.running);
	proto_add_u64(&c->out, "scrub_waiting_lock", p.waiting_lock);
	proto_add_u64(&c->out, "scrub_rate", p.rate);
	proto_add_u64(&c->out, "scrub_interval_ms", p.interval_ms);
	proto_add_u64(&c->out, "scrub_passes", p.passes);
	proto_add_i64(&c->out, "scrub_pass_start", p.pass_start);
	proto_add_i64(&c->out, "scrub_pass_end", p.pass_end);
	proto_add_i64(&c->out, "scrub_next_start", p.next_start);
	proto_add_u64(&c->out, "scrub_objects", p.objects);
	proto_add_u64(&c->out, "scrub_objects_total", p.objects_total);
	proto_add_u64(&c->out, "scrub_bytes", p.bytes);
	proto_add_u64(&c->out, "scrub_bytes_total", p.bytes_total);
	proto_add_u64(&c->out, "scrub_bytes_all", p.bytes_all);
	proto_add_u64(&c->out, "scrub_damaged", p.damaged);
	proto_add_u64(&c->out, "scrub_repaired", p.repaired);
	proto_add_u64(&c->out, "scrub_unrepaired", p.unrepaired);
}

int daemon_admin_status(struct daemon_conn *c)
{
	struct daemon_admin_jobs a = { .c = c };
	struct cache *cache = c->d->env.cache;
	struct cache_stats st = { 0 };
	struct daemon_admin_pol p;
	int ret = daemon_admin_pol_get(c, &p);

	if (ret)
		return daemon_peer_end(c, ret, NULL);
	ret = catalog_dataset_list(c->cat, daemon_admin_status_ds, c);
	if (!ret)
		ret = jobs_list(c->jq, 0, daemon_admin_status_job, &a);
	if (ret)
		return daemon_peer_end(c, ret, "status: %s", strerror(-ret));
	if (cache)
		cache_get_stats(cache, &st);
	daemon_peer_row(c, "cache");
	daemon_admin_pol_fields(c, &p);
	proto_add_u64(&c->out, "cache_available", cache != NULL);
	proto_add_u64(&c->out, "used", st.used);
	proto_add_u64(&c->out, "free",
		      st.used < p.capacity ? p.capacity - st.used : 0);
	proto_add_u64(&c->out, "pinned_bytes", st.pinned);
	proto_add_u64(&c->out, "hits", st.hits);
	proto_add_u64(&c->out, "misses", st.misses);
	proto_add_u64(&c->out, "bytes_from_cache", st.bytes_from_cache);
	proto_add_u64(&c->out, "bytes_from_source", st.bytes_from_source);
	proto_add_u64(&c->out, "evictions", st.evictions);
	proto_add_u64(&c->out, "checksum_failures", st.checksum_failures);
	proto_add_u64(&c->out, "jobs_running", a.running);
	proto_add_u64(&c->out, "jobs_queued", a.queued);
	daemon_admin_scrub_fields(c);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

/* ---- a dataset's pin, quota and priority ---- */

/* Fill ds for c->name and return true; or answer "no dataset" (or the
 * catalog's error) and return false, with the send's result in *sent. */
static bool daemon_admin_ds(struct daemon_conn *c, struct catalog_dataset *ds,
			    int *sent)
{
	int ret = catalog_dataset_get(c->cat, c->name, ds);

	if (ret == -ENOENT || (!ret && !daemon_peer_may_read(c, ds->group))) {
		if (!ret)
			catalog_dataset_release(ds);
		*sent = daemon_peer_end(c, -ENOENT, "no dataset named %s",
					c->name);
		return false;
	}
	if (ret) {
		*sent = daemon_peer_end(c, ret, "%s: %s", c->name,
					strerror(-ret));
		return false;
	}
	return true;
}

int daemon_admin_pin(struct daemon_conn *c)
{
	bool pin = !strcmp(c->cmd, "cache.pin");
	struct catalog_dataset ds = { 0 };
	int ret;

	if (!daemon_admin_ds(c, &ds, &ret))
		return ret;
	ret = catalog_dataset_set_pinned(c->cat, c->name, pin);
	if (!ret)
		daemon_admin_audit(c, pin ? "pin" : "unpin", c->name,
				   ds.pinned ? "pinned" : "unpinned",
				   pin ? "pinned" : "unpinned");
	catalog_dataset_release(&ds);
	if (ret)
		return daemon_peer_end(c, ret, "%s %s: %s", c->cmd + 6, c->name,
				       strerror(-ret));
	return daemon_peer_end(c, 0, NULL);
}

/*
 * cache.csi-allow name= namespaces=: the Kubernetes namespaces whose pods
 * dstage-csi may give a restricted dataset (comma-separated, "*" for all,
 * "none" or "" for none). Kept as the catalog policy key
 * csi.namespaces.NAME, shown by `show` as csi_namespaces=, audited.
 */
int daemon_admin_csi_allow(struct daemon_conn *c)
{
	const char *v = proto_get(&c->msg, "namespaces");
	struct catalog_dataset ds = { 0 };
	char key[320], old[1024] = "";
	int ret;

	if (v && !strcmp(v, "none"))
		v = "";
	if (!v || strlen(v) >= sizeof(old) ||
	    strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789-,*") != strlen(v))
		return daemon_peer_end(c, -EINVAL,
				       "csi-allow %s: '%.80s' is not a list "
				       "of namespaces (NS[,NS...], '*' or "
				       "none)",
				       c->name, v ? v : "");
	if (!daemon_admin_ds(c, &ds, &ret))
		return ret;
	snprintf(key, sizeof(key), "csi.namespaces.%s", c->name);
	if (catalog_policy_get(c->cat, key, old, sizeof(old)))
		old[0] = '\0';
	ret = catalog_policy_set(c->cat, key, v);
	if (!ret)
		daemon_admin_audit(c, "csi.allow", c->name,
				   old[0] ? old : "none", *v ? v : "none");
	catalog_dataset_release(&ds);
	if (ret)
		return daemon_peer_end(c, ret, "csi-allow %s: %s", c->name,
				       strerror(-ret));
	return daemon_peer_end(c, 0, NULL);
}

int daemon_admin_quota(struct daemon_conn *c)
{
	const char *v = proto_get(&c->msg, "quota");
	struct catalog_dataset ds = { 0 };
	struct daemon_admin_walk w = { 0 };
	char old[32], new[32];
	uint64_t q;
	int ret;

	if (daemon_admin_u64(v, &q))
		return daemon_peer_end(c, -EINVAL,
				       "quota %s: '%.40s' is not a size: "
				       "expected bytes (0 for none)",
				       c->name, v ? v : "");
	if (!daemon_admin_ds(c, &ds, &ret))
		return ret;
	if (q && ds.pinned) {
		ret = daemon_admin_walk(c, &ds, &w);
		if (!ret && w.cached > q) {
			ret = daemon_peer_end(
				c, -EINVAL,
				"quota %s: %" PRIu64 " bytes is below the "
				"%" PRIu64 " bytes it has pinned in the "
				"cache: give at least %" PRIu64
				" bytes, or unpin it first",
				c->name, q, w.cached, w.cached);
			catalog_dataset_release(&ds);
			return ret;
		}
	}
	snprintf(old, sizeof(old), "%" PRIu64, ds.quota);
	snprintf(new, sizeof(new), "%" PRIu64, q);
	catalog_dataset_release(&ds);
	ret = catalog_dataset_set_quota(c->cat, c->name, q);
	if (ret)
		return daemon_peer_end(c, ret, "quota %s: %s", c->name,
				       strerror(-ret));
	daemon_admin_audit(c, "quota", c->name, old, new);
	return daemon_peer_end(c, 0, NULL);
}

int daemon_admin_priority(struct daemon_conn *c)
{
	struct catalog_dataset ds = { 0 };
	const char *v = proto_get(&c->msg, "priority");
	char old[24], new[24];
	int64_t n;
	int ret;

	if (proto_get_i64(&c->msg, "priority", &n) || n < -ADMIN_PRIORITY_MAX ||
	    n > ADMIN_PRIORITY_MAX)
		return daemon_peer_end(c, -EINVAL,
				       "priority %s: '%.40s': expected a "
				       "whole number from %d to %d",
				       c->name, v ? v : "", -ADMIN_PRIORITY_MAX,
				       ADMIN_PRIORITY_MAX);
	if (!daemon_admin_ds(c, &ds, &ret))
		return ret;
	snprintf(old, sizeof(old), "%d", ds.priority);
	snprintf(new, sizeof(new), "%" PRId64, n);
	catalog_dataset_release(&ds);
	ret = catalog_dataset_set_priority(c->cat, c->name, (int)n);
	if (ret)
		return daemon_peer_end(c, ret, "priority %s: %s", c->name,
				       strerror(-ret));
	daemon_admin_audit(c, "priority", c->name, old, new);
	return daemon_peer_end(c, 0, NULL);
}

/* ---- eviction ---- */

struct daemon_admin_old {
	struct daemon_conn *c;
	struct daemon_admin_walk w;
	int ret;
};

static int daemon_admin_old_ds(void *arg, const struct catalog_dataset *ds)
{
	struct daemon_admin_old *a = arg;

	a->ret = daemon_admin_walk(a->c, ds, &a->w);
	return 0;
}

/* evict --older-than: every dataset's files last accessed age seconds ago
 * or earlier. */
static int daemon_admin_evict_older(struct daemon_conn *c, int64_t age,
				    bool dry)
{
	struct daemon_admin_old a = {
		.c = c,
		.w = { .drop = true,
		       .dry_run = dry,
		       .cutoff = time(NULL) - age },
	};
	char what[64], target[48];
	int ret = catalog_dataset_list(c->cat, daemon_admin_old_ds, &a);

	if (ret)
		return daemon_peer_end(c, ret, "evict: %s", strerror(-ret));
	daemon_peer_row(c, "row");
	proto_add_u64(&c->out, "freed", a.w.dropped);
	proto_add_u64(&c->out, "busy_files", a.w.busy_files);
	proto_add_u64(&c->out, "busy_bytes", a.w.busy_bytes);
	proto_add_u64(&c->out, "dry_run", dry);
	snprintf(what, sizeof(what), "%" PRIu64, a.w.dropped);
	snprintf(target, sizeof(target), "older-than %" PRId64 "s", age);
	if (!dry)
		daemon_admin_audit(c, "evict", target, NULL, what);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

int daemon_admin_evict(struct daemon_conn *c)
{
	bool dry = proto_get(&c->msg, "dry_run") != NULL;
	bool to_low = proto_get(&c->msg, "to_low") != NULL;
	const char *older = proto_get(&c->msg, "older_than");
	uint64_t age = 0;
	struct cache *cache = c->d->env.cache;
	struct catalog_dataset ds = { 0 };
	struct daemon_admin_walk w = { .drop = true, .dry_run = dry };
	char what[64];
	int ret;

	if (!cache)
		return daemon_peer_end(c, -ENODEV,
				       "evict: the daemon has no cache (see "
				       "its log for why cache.dir did not "
				       "open)");
	if (older && (daemon_admin_u64(older, &age) || !age ||
		      age > (uint64_t)INT32_MAX))
		return daemon_peer_end(c, -EINVAL,
				       "evict: older_than=%.40s: expected "
				       "seconds, 1 or more",
				       older);
	if ((int)to_low + (c->name != NULL) + (older != NULL) != 1)
		return daemon_peer_end(c, -EINVAL,
				       "evict: give a dataset, "
				       "--to-low-watermark or --older-than "
				       "(one of them)");
	if (older)
		return daemon_admin_evict_older(c, (int64_t)age, dry);
	if (to_low) {
		struct cache_stats st;
		struct daemon_admin_pol p;
		uint64_t freed = 0, low;

		daemon_admin_pol_get(c, &p);
		low = p.capacity / 100 * p.low;
		cache_get_stats(cache, &st);
		if (dry) {
			freed = st.used > low ? st.used - low : 0;
		} else {
			ret = cache_evict(cache, &freed);
			if (ret)
				return daemon_peer_end(c, ret, "evict: %s",
						       strerror(-ret));
		}
		daemon_peer_row(c, "row");
		proto_add_u64(&c->out, "freed", freed);
		snprintf(what, sizeof(what), "%" PRIu64, freed);
		if (!dry)
			daemon_admin_audit(c, "evict", "low-watermark", NULL,
					   what);
	} else {
		if (!daemon_admin_ds(c, &ds, &ret))
			return ret;
		ret = daemon_admin_walk(c, &ds, &w);
		catalog_dataset_release(&ds);
		if (ret)
			return daemon_peer_end(c, ret, "evict %s: %s", c->name,
					       strerror(-ret));
		daemon_peer_row(c, "row");
		proto_add(&c->out, "name", c->name);
		proto_add_u64(&c->out, "freed", w.dropped);
		proto_add_u64(&c->out, "busy_files", w.busy_files);
		proto_add_u64(&c->out, "busy_bytes", w.busy_bytes);
		snprintf(what, sizeof(what), "%" PRIu64, w.dropped);
		if (!dry)
			daemon_admin_audit(c, "evict", c->name, NULL, what);
	}
	proto_add_u64(&c->out, "dry_run", dry);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

/* ---- garbage collection ---- */

int daemon_admin_gc(struct daemon_conn *c)
{
	bool dry = proto_get(&c->msg, "dry_run") != NULL;
	const char *age = proto_get(&c->msg, "min_age");
	struct cache *cache = c->d->env.cache;
	struct cachegc_opts o = {
		.dry_run = dry,
		.min_age = ADMIN_GC_MIN_AGE,
		.staging_dir = c->d->cfg->ckpt_staging_dir,
	};
	struct cachegc_result r;
	uint64_t v;
	char what[160];
	int ret;

	if (!cache)
		return daemon_peer_end(c, -ENODEV,
				       "gc: the daemon has no cache (see its "
				       "log for why cache.dir did not open)");
	if (age) {
		if (daemon_admin_u64(age, &v) || v > (uint64_t)INT32_MAX)
			return daemon_peer_end(c, -EINVAL,
					       "gc: min_age=%.40s: expected "
					       "seconds, 0 or more",
					       age);
		o.min_age = (int64_t)v;
	}
	ret = cachegc_run(cache, c->cat, &o, &r);
	if (ret)
		return daemon_peer_end(c, ret, "gc: %s", strerror(-ret));
	daemon_peer_row(c, "row");
	proto_add_u64(&c->out, "orphan_files", r.orphan_files);
	proto_add_u64(&c->out, "orphan_bytes", r.orphan_bytes);
	proto_add_u64(&c->out, "stale_objects", r.stale_objects);
	proto_add_u64(&c->out, "stale_rows", r.stale_rows);
	proto_add_u64(&c->out, "leftover_files", r.leftover_files);
	proto_add_u64(&c->out, "leftover_bytes", r.leftover_bytes);
	proto_add_u64(&c->out, "busy_files", r.busy_files);
	proto_add_u64(&c->out, "busy_bytes", r.busy_bytes);
	proto_add_u64(&c->out, "min_age", (uint64_t)o.min_age);
	proto_add_u64(&c->out, "dry_run", dry);
	if (!dry) {
		snprintf(what, sizeof(what),
			 "orphans %" PRIu64 " (%" PRIu64 " bytes), stale rows "
			 "%" PRIu64 ", leftovers %" PRIu64 " (%" PRIu64
			 " bytes)",
			 r.orphan_files, r.orphan_bytes, r.stale_rows,
			 r.leftover_files, r.leftover_bytes);
		daemon_admin_audit(c, "gc", "cache", NULL, what);
	}
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

/* ---- audit ---- */

struct daemon_admin_aud {
	struct daemon_conn *c;
	int64_t since;
	const char *user; /* name or uid; NULL: all */
};

static int daemon_admin_audit_row(void *arg, const struct catalog_audit *a)
{
	struct daemon_admin_aud *f = arg;
	struct daemon_conn *c = f->c;
	char uid[16];

	if (a->when < f->since)
		return 0;
	snprintf(uid, sizeof(uid), "%u", (unsigned)a->uid);
	if (f->user && strcmp(f->user, uid) &&
	    (!a->user || strcmp(f->user, a->user)))
		return 0;
	daemon_peer_row(c, "row");
	proto_add_i64(&c->out, "id", a->id);
	proto_add_i64(&c->out, "time", a->when);
	proto_add_u64(&c->out, "uid", a->uid);
	proto_add(&c->out, "user", a->user ? a->user : "");
	proto_add(&c->out, "action", a->action);
	proto_add(&c->out, "target", a->target ? a->target : "");
	proto_add(&c->out, "old", a->old_value ? a->old_value : "");
	proto_add(&c->out, "new", a->new_value ? a->new_value : "");
	return proto_send(c->fd, &c->out);
}

int daemon_admin_audit_list(struct daemon_conn *c)
{
	struct daemon_admin_aud f = { .c = c };
	const char *since = proto_get(&c->msg, "since");
	int ret;

	if (since && proto_get_i64(&c->msg, "since", &f.since))
		return daemon_peer_end(c, -EINVAL,
				       "audit: since=%.40s: expected seconds "
				       "since the epoch",
				       since);
	f.user = proto_get(&c->msg, "user");
	ret = catalog_audit_list(c->cat, 0, daemon_admin_audit_row, &f);
	return daemon_peer_end(c, ret, NULL);
}
