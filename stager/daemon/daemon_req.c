// SPDX-License-Identifier: MIT
/*
 * daemon_req: the daemon's requests, one table (daemon_req_table) with each
 * request's handler and what it needs: admin-only (changes the node's
 * state), a dataset name, a job id. daemon_req_run checks those once, in
 * that order, and calls the handler with c->name / c->job set.
 *
 * Stateless: a handler works on its connection (its own catalog and jobs
 * connections) and reaches the daemon's job table only through
 * daemon_jobs.c (daemon_jobs_find, _wake, _cancel_dataset), which takes
 * d->lock.
 *
 * Read-only requests (ping, list, show, jobs, status, watch) are open to
 * every local user; the others only to admins (daemon_conn.c decides who
 * is one).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon_i.h"
#include "dstage/cache.h"
#include "dstage/catalog.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/sharedtier.h"
#include "dstage/timeutil.h"

#define DAEMON_REQ_WATCH_MS 500 /* between a watch's progress rows */

/* ---- read-only requests ---- */

static void daemon_req_ds_fields(struct proto_buf *b,
				 const struct catalog_dataset *ds)
{
	static const char *const states[] = { "new", "ready", "removing" };

	proto_add(b, "name", ds->name);
	proto_add(b, "source", ds->source);
	proto_add(b, "state", states[ds->state % 3]);
	proto_add_i64(b, "version", ds->version);
	proto_add_u64(b, "files", ds->objects);
	proto_add_u64(b, "bytes", ds->bytes);
	proto_add_u64(b, "pinned", ds->pinned);
	proto_add_i64(b, "priority", ds->priority);
	proto_add(b, "group", ds->group ? ds->group : "");
	proto_add_u64(b, "bad_keys", ds->bad_keys);
	proto_add_i64(b, "refreshed", ds->refreshed);
	proto_add(b, "manifest_key",
		  ds->sums_key ? ds->sums_key : CATALOG_SUMS_KEY_DEFAULT);
	proto_add(b, "shared_tier", ds->shared_tier ? ds->shared_tier : "");
}

static void daemon_req_label(struct daemon_conn *c, const char *name)
{
	char key[320], val[256];

	snprintf(key, sizeof(key), "stager.label.%s", name);
	if (!catalog_policy_get(c->cat, key, val, sizeof(val)))
		proto_add(&c->out, "label", val);
}

static int daemon_req_list_cb(void *arg, const struct catalog_dataset *ds)
{
	struct daemon_conn *c = arg;

	if (!daemon_peer_may_read(c, ds->group))
		return 0; /* not even its name to non-members */
	daemon_peer_row(c, "row");
	daemon_req_ds_fields(&c->out, ds);
	return proto_send(c->fd, &c->out);
}

static int daemon_req_list(struct daemon_conn *c)
{
	int ret = catalog_dataset_list(c->cat, daemon_req_list_cb, c);

	return daemon_peer_end(c, ret, NULL);
}

struct daemon_req_show {
	struct daemon_conn *c;
	struct objstore *os;
	const char *dataset;
	uint64_t files, bytes, cached, verified, mismatched, expected;
	int64_t last_verified;
};

static int daemon_req_show_cb(void *arg, const char *path,
			      const struct catalog_entry *e)
{
	struct daemon_req_show *s = arg;
	struct cache *cache = s->c->d->env.cache;

	s->files++;
	s->bytes += e->size;
	if (cache) {
		struct cache_object o = {
			.dataset = s->dataset,
			.os = s->os,
			.key = path,
			.etag = e->etag,
			.size = e->size,
		};
		uint64_t have = 0;

		if (!cache_object_present(cache, &o, &have))
			s->cached += have < e->size ? have : e->size;
	}
	if (e->has_expected)
		s->expected++;
	if (e->has_actual && e->verified_at) {
		if (e->has_expected &&
		    memcmp(e->expected_sha256, e->actual_sha256, 32))
			s->mismatched++;
		else
			s->verified++;
		if (e->verified_at > s->last_verified)
			s->last_verified = e->verified_at;
	}
	return 0;
}

static void daemon_req_job_fields(struct proto_buf *b, const struct jobs_job *j,
				  struct runner_job *rj)
{
	proto_add_i64(b, "job", j->id);
	proto_add(b, "kind", j->kind);
	proto_add(b, "dataset", j->dataset);
	proto_add(b, "state", jobs_state_name(j->state));
	proto_add_u64(b, "done", rj ? atomic_load(&rj->bytes_done) : j->done);
	proto_add_u64(b, "total",
		      rj ? atomic_load(&rj->bytes_total) : j->total);
	if (rj) {
		proto_add_u64(b, "files_done", atomic_load(&rj->files_done));
		proto_add_u64(b, "files_total", atomic_load(&rj->files_total));
	}
	proto_add(b, "error", j->error);
	if (j->has_counts) {
		proto_add_u64(b, "damaged_blocks", j->counts.damaged);
		proto_add_u64(b, "missing_blocks", j->counts.missing);
		proto_add_u64(b, "mismatched_files", j->counts.mismatched);
		proto_add_u64(b, "repaired_blocks", j->counts.repaired);
	}
	proto_add_i64(b, "created", j->created);
	proto_add_i64(b, "updated", j->updated);
	proto_add(b, "args", j->args ? j->args : "");
}

/*
 * show's fields for what dstage-csi decides on: the queued or running stage
 * and verify jobs (active_stage=, active_verify=: their ids, 0 when none),
 * the newest stage and verify jobs in any state (seen_stage=, seen_verify=:
 * what a later stage or verify with join=1 after=ID compares with) and the
 * namespaces allowed a restricted dataset (csi_namespaces=, set by
 * `cachectl csi-allow`). The job ids are read before anything else of the
 * answer: a job that ends after that shows in the cache and in the last_*
 * fields read later, and one queued after it is newer than seen_*, so a
 * caller that starts a job when it sees "nothing running, nothing done"
 * joins any job queued since instead of queueing a second.
 */
struct daemon_req_jobids {
	int64_t active[2], seen[2];
};

static void daemon_req_active(struct daemon_conn *c, const char *name,
			      struct daemon_req_jobids *ids)
{
	static const char *const kinds[] = { "stage", "verify" };
	struct jobs_job j = { 0 };

	/* the newest first: a job queued between the two reads is newer
	 * than seen and active, so it is joined or waited for */
	for (size_t i = 0; i < 2; i++) {
		ids->active[i] = ids->seen[i] = 0;
		if (!jobs_newest(c->jq, name, kinds[i], &j)) {
			ids->seen[i] = j.id;
			jobs_job_release(&j);
		}
		if (!jobs_active(c->jq, name, kinds[i], &j)) {
			ids->active[i] = j.id;
			jobs_job_release(&j);
		}
	}
}

static void daemon_req_show_csi(struct daemon_conn *c, const char *name,
				const struct daemon_req_jobids *ids)
{
	char key[320], val[1024];

	proto_add_i64(&c->out, "active_stage", ids->active[0]);
	proto_add_i64(&c->out, "active_verify", ids->active[1]);
	proto_add_i64(&c->out, "seen_stage", ids->seen[0]);
	proto_add_i64(&c->out, "seen_verify", ids->seen[1]);
	snprintf(key, sizeof(key), "csi.namespaces.%s", name);
	if (!catalog_policy_get(c->cat, key, val, sizeof(val)))
		proto_add(&c->out, "csi_namespaces", val);
}

static int daemon_req_show(struct daemon_conn *c)
{
	const char *name = c->name;
	struct daemon_req_show s = { .c = c, .dataset = name };
	struct catalog_dataset ds = { 0 };
	struct jobs_job j = { 0 };
	struct daemon_req_jobids ids;
	int ret;

	ret = catalog_dataset_get(c->cat, name, &ds);
	if (!ret && !daemon_peer_may_read(c, ds.group)) {
		catalog_dataset_release(&ds);
		ret = -ENOENT; /* its existence is not shown to non-members */
	}
	if (ret == -ENOENT)
		return daemon_peer_end(c, ret, "no dataset named %s", name);
	if (ret)
		return daemon_peer_end(c, ret, NULL);
	daemon_req_active(c, name, &ids);
	if (objstore_open(ds.source, c->d->cfg, &s.os))
		s.os = NULL;
	ret = runner_walk(c->cat, name, daemon_req_show_cb, &s);
	if (ret && ret != -ENOENT)
		goto out;
	daemon_peer_row(c, "row");
	daemon_req_ds_fields(&c->out, &ds);
	daemon_req_label(c, name);
	proto_add_u64(&c->out, "cached", s.cached);
	proto_add_u64(&c->out, "cache_available", c->d->env.cache != NULL);
	proto_add_u64(&c->out, "verified_files", s.verified);
	proto_add_u64(&c->out, "mismatched_files", s.mismatched);
	proto_add_u64(&c->out, "expected_files", s.expected);
	proto_add_i64(&c->out, "last_hash_at", s.last_verified);
	if (!jobs_last(c->jq, name, "verify", &j)) {
		proto_add(&c->out, "last_verify", jobs_state_name(j.state));
		proto_add_i64(&c->out, "last_verify_at", j.updated);
		proto_add(&c->out, "last_verify_msg", j.error);
		if (j.has_counts) {
			proto_add_u64(&c->out, "last_verify_damaged",
				      j.counts.damaged);
			proto_add_u64(&c->out, "last_verify_missing",
				      j.counts.missing);
			proto_add_u64(&c->out, "last_verify_mismatched",
				      j.counts.mismatched);
			proto_add_u64(&c->out, "last_verify_repaired",
				      j.counts.repaired);
		}
		jobs_job_release(&j);
	}
	if (!jobs_last(c->jq, name, "stage", &j)) {
		proto_add(&c->out, "last_stage", jobs_state_name(j.state));
		proto_add_i64(&c->out, "last_stage_at", j.updated);
		proto_add_i64(&c->out, "last_stage_job", j.id);
		proto_add(&c->out, "last_stage_msg", j.error);
		jobs_job_release(&j);
	}
	daemon_req_show_csi(c, name, &ids);
	daemon_peer_tier_fields(c, name);
	ret = proto_send(c->fd, &c->out);
	if (!ret)
		ret = daemon_peer_end(c, 0, NULL);
out:
	objstore_free(s.os);
	catalog_dataset_release(&ds);
	return ret ? daemon_peer_end(c, ret, NULL) : 0;
}

/*
 * May the peer see the jobs of dataset? Admins see all; others the jobs of
 * datasets they may read, and not those of removed datasets (whose group
 * is gone with them). vis caches the last answer for a run of rows.
 */
struct daemon_req_vis {
	char dataset[JOBS_NAME_MAX];
	bool known, visible;
};

static bool daemon_req_job_visible(struct daemon_conn *c, const char *dataset,
				   struct daemon_req_vis *vis)
{
	struct catalog_dataset ds = { 0 };

	if (c->admin)
		return true;
	if (vis->known && !strcmp(vis->dataset, dataset))
		return vis->visible;
	vis->visible = !catalog_dataset_get(c->cat, dataset, &ds) &&
		       daemon_peer_may_read(c, ds.group);
	catalog_dataset_release(&ds);
	snprintf(vis->dataset, sizeof(vis->dataset), "%s", dataset);
	vis->known = true;
	return vis->visible;
}

/* jobs_get, with a job the peer may not see reported as -ENOENT. */
static int daemon_req_get_job(struct daemon_conn *c, int64_t id,
			      struct jobs_job *j, struct daemon_req_vis *vis)
{
	int ret = jobs_get(c->jq, id, j);

	if (!ret && !daemon_req_job_visible(c, j->dataset, vis)) {
		jobs_job_release(j);
		ret = -ENOENT; /* as if there were none */
	}
	return ret;
}

/* The end line for daemon_req_get_job's error. */
static int daemon_req_no_job(struct daemon_conn *c, int err, int64_t id)
{
	if (err == -ENOENT)
		return daemon_peer_end(c, err, "no job %" PRId64, id);
	return daemon_peer_end(c, err, NULL);
}

struct daemon_req_jobs {
	struct daemon_conn *c;
	struct daemon_req_vis vis;
};

static int daemon_req_jobs_cb(void *arg, const struct jobs_job *j)
{
	struct daemon_req_jobs *a = arg;
	struct daemon_conn *c = a->c;
	struct runner_job *rj;
	int ret;

	if (!daemon_req_job_visible(c, j->dataset, &a->vis))
		return 0;
	rj = j->state == JOBS_RUNNING ? daemon_jobs_find(c->d, j->id) : NULL;
	daemon_peer_row(c, "row");
	daemon_req_job_fields(&c->out, j, rj);
	runner_put(rj);
	ret = proto_send(c->fd, &c->out);
	return ret;
}

static int daemon_req_jobs(struct daemon_conn *c)
{
	bool all = proto_get(&c->msg, "all") != NULL;
	struct daemon_req_jobs a = { .c = c };
	int ret =
		jobs_list(c->jq, all ? UINT32_MAX : 20, daemon_req_jobs_cb, &a);

	if (!ret)
		ret = daemon_lifecycle_jobs(c); /* checkpoint retries */
	return daemon_peer_end(c, ret, NULL);
}

static int daemon_req_status(struct daemon_conn *c)
{
	int64_t id = c->job;
	struct jobs_job j = { 0 };
	struct daemon_req_vis vis = { 0 };
	struct runner_job *rj;
	int ret = daemon_req_get_job(c, id, &j, &vis);

	if (ret)
		return daemon_req_no_job(c, ret, id);
	rj = j.state == JOBS_RUNNING ? daemon_jobs_find(c->d, id) : NULL;
	daemon_peer_row(c, "row");
	daemon_req_job_fields(&c->out, &j, rj);
	runner_put(rj);
	jobs_job_release(&j);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

/* A copy of rj's mismatches, taken under its lock. 0 or -ENOMEM. */
static int daemon_req_copy_mm(struct runner_job *rj,
			      struct runner_mismatch **out, size_t *n)
{
	struct runner_mismatch *mm = NULL;
	size_t i = 0;
	int ret = 0;

	pthread_mutex_lock(&rj->lock);
	if (rj->n_mm) {
		mm = calloc(rj->n_mm, sizeof(*mm));
		ret = mm ? 0 : -ENOMEM;
	}
	for (; !ret && i < rj->n_mm; i++) {
		mm[i] = rj->mm[i];
		mm[i].key = strdup(rj->mm[i].key);
		if (!mm[i].key)
			ret = -ENOMEM;
	}
	pthread_mutex_unlock(&rj->lock);
	if (ret) {
		for (size_t k = 0; mm && k < i; k++)
			free(mm[k].key);
		free(mm);
		return ret;
	}
	*out = mm;
	*n = i;
	return 0;
}

/* Stream progress of job id until it is final. */
static int daemon_req_watch(struct daemon_conn *c)
{
	int64_t id = c->job;
	struct runner_job *rj = NULL;
	struct jobs_job j = { 0 };
	struct daemon_req_vis vis = { 0 };
	struct runner_mismatch *mm = NULL;
	size_t n_mm = 0;
	int ret;

	for (;;) {
		struct timespec ts = { 0, DAEMON_REQ_WATCH_MS * 1000 * 1000 };

		ret = daemon_req_get_job(c, id, &j, &vis);
		if (ret) {
			ret = daemon_req_no_job(c, ret, id);
			goto out; /* a reference taken before goes */
		}
		if (jobs_state_final(j.state)) {
			if (!rj)
				rj = daemon_jobs_find(c->d, id);
			break;
		}
		if (j.state == JOBS_RUNNING && !rj)
			rj = daemon_jobs_find(c->d, id);
		if (rj && atomic_load(&rj->finished)) {
			struct timespec soon = { 0, 10 * 1000 * 1000 };

			jobs_job_release(&j);
			nanosleep(&soon, NULL);
			continue; /* its final state is in the catalog */
		}
		daemon_peer_row(c, "progress");
		daemon_req_job_fields(&c->out, &j, rj);
		jobs_job_release(&j);
		ret = proto_send(c->fd, &c->out);
		if (ret)
			goto out;
		if (rj) {
			/* Next row in half a second, or at once when the job
			 * ends. */
			struct timespec dl;

			timeutil_real_after_ms(&dl, DAEMON_REQ_WATCH_MS);
			pthread_mutex_lock(&rj->lock);
			if (!atomic_load(&rj->finished))
				pthread_cond_timedwait(&rj->cond, &rj->lock,
						       &dl);
			pthread_mutex_unlock(&rj->lock);
		} else {
			nanosleep(&ts, NULL);
		}
	}
	/* Copy the mismatches under the job's lock, send them without it:
	 * a peer that reads slowly must not hold the job up. */
	if (rj)
		ret = daemon_req_copy_mm(rj, &mm, &n_mm);
	for (size_t i = 0; i < n_mm && !ret; i++) {
		daemon_peer_row(c, "mismatch");
		proto_add(&c->out, "key", mm[i].key);
		proto_add(&c->out, "expected", mm[i].expected);
		proto_add(&c->out, "actual", mm[i].actual);
		if (mm[i].kind) { /* what verify found in the cache */
			proto_add(&c->out, "kind", mm[i].kind);
			proto_add_u64(&c->out, "block", mm[i].block);
			proto_add_u64(&c->out, "count", mm[i].count);
			proto_add(&c->out, "path", mm[i].path ?: "");
		}
		ret = proto_send(c->fd, &c->out);
	}
	for (size_t i = 0; i < n_mm; i++)
		free(mm[i].key);
	free(mm);
	daemon_peer_row(c, "row");
	daemon_req_job_fields(&c->out, &j, NULL);
	if (rj) {
		proto_add_u64(&c->out, "files_done",
			      atomic_load(&rj->files_done));
		proto_add_u64(&c->out, "files_total",
			      atomic_load(&rj->files_total));
	}
	jobs_job_release(&j);
	if (!ret)
		ret = proto_send(c->fd, &c->out);
	if (!ret)
		ret = daemon_peer_end(c, 0, NULL);
out:
	runner_put(rj);
	return ret;
}

/* ---- mutations ---- */

static int daemon_req_register(struct daemon_conn *c, const char *name,
			       const char *source)
{
	struct objstore *os = NULL;
	int ret = objstore_open(source, c->d->cfg, &os);

	if (ret)
		return ret;
	ret = catalog_register(c->cat, name, os);
	objstore_free(os);
	return ret;
}

/* The end line of a failed registration of name from url. */
static int daemon_req_register_failed(struct daemon_conn *c, const char *what,
				      const char *name, const char *url,
				      const char *sums_key, int err)
{
	if (err == -ENODATA)
		return daemon_peer_end(
			c, err,
			"%s %s: manifest key %s not found at %s "
			"(--manifest names a key relative to the "
			"dataset's URL)",
			what, name, sums_key, url);
	return daemon_peer_end(c, err, "%s %s from %s: %s", what, name, url,
			       strerror(-err));
}

static int daemon_req_add(struct daemon_conn *c)
{
	const char *name = c->name;
	const char *url = proto_get(&c->msg, "url");
	const char *group = proto_get(&c->msg, "group");
	const char *manifest = proto_get(&c->msg, "manifest");
	const char *label = proto_get(&c->msg, "label");
	struct catalog_dataset ds = { 0 };
	const char *why;
	char buf[512];
	int64_t prio;
	int ret;

	if (!url || !*url)
		return daemon_peer_end(c, -EINVAL, "add: no URL");
	if (manifest && keypath_check(manifest, strlen(manifest), &why))
		return daemon_peer_end(c, -EINVAL,
				       "--manifest '%s': not a key under the "
				       "dataset's URL: %s",
				       keypath_printable(manifest,
							 strlen(manifest), buf,
							 sizeof(buf)),
				       why);
	ret = catalog_dataset_add(c->cat, name, url,
				  group && *group ? group : NULL);
	if (ret == -EEXIST)
		return daemon_peer_end(c, ret, "a dataset named %s exists",
				       name);
	if (ret == -EINVAL)
		return daemon_peer_end(c, ret, "bad dataset name '%s'", name);
	if (ret)
		return daemon_peer_end(c, ret, NULL);
	if (manifest)
		ret = catalog_dataset_set_sums_key(c->cat, name, manifest);
	if (!ret && proto_get(&c->msg, "shared_tier"))
		ret = catalog_dataset_set_shared_tier(
			c->cat, name, proto_get(&c->msg, "shared_tier"));
	if (!ret && proto_get(&c->msg, "pin"))
		ret = catalog_dataset_set_pinned(c->cat, name, true);
	if (!ret && !proto_get_i64(&c->msg, "priority", &prio))
		ret = catalog_dataset_set_priority(c->cat, name, (int)prio);
	if (!ret && label && *label) {
		char key[320];

		snprintf(key, sizeof(key), "stager.label.%s", name);
		ret = catalog_policy_set(c->cat, key, label);
	}
	if (!ret)
		ret = daemon_req_register(c, name, url);
	if (ret) {
		int r2 = catalog_dataset_remove(c->cat, name);

		if (r2)
			log_warn("add %s: removing it again: %s", name,
				 strerror(-r2));
		return daemon_req_register_failed(
			c, "registering", name, url,
			manifest ? manifest : CATALOG_SUMS_KEY_DEFAULT, ret);
	}
	daemon_admin_audit(c, "dataset.add", name, NULL, url);
	ret = catalog_dataset_get(c->cat, name, &ds);
	if (!ret) {
		daemon_peer_row(c, "row");
		daemon_req_ds_fields(&c->out, &ds);
		catalog_dataset_release(&ds);
		ret = proto_send(c->fd, &c->out);
	}
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

/* stage --shared: the snapshot's copy in the shared tier, made here (in
 * this connection's thread) unless it is there or another node makes it. */
static int daemon_req_stage_shared(struct daemon_conn *c)
{
	struct sharedtier_result *r = calloc(1, sizeof(*r));
	uint64_t wait_ms = 0;
	int ret;

	if (!r)
		return daemon_peer_end(c, -ENOMEM, NULL);
	proto_get_u64(&c->msg, "wait_ms", &wait_ms);
	ret = sharedtier_publish(
		c->cat, c->d->cfg, c->name,
		wait_ms > 86400000 ? 86400000 : (unsigned)wait_ms, r);
	if (ret == -EBUSY && r->holder[0])
		ret = daemon_peer_end(c, ret,
				      "%s: the shared tier's copy %s is being "
				      "made by %s (wait with --wait)",
				      c->name, r->dir, r->holder);
	else if (ret)
		ret = daemon_peer_end(c, ret,
				      "%s: shared tier: %s (the daemon's log "
				      "names the file at fault)",
				      c->name, strerror(-ret));
	else {
		daemon_peer_row(c, "row");
		proto_add(&c->out, "name", c->name);
		proto_add(&c->out, "dir", r->dir);
		proto_add(&c->out, "snapshot", r->snapshot);
		proto_add(&c->out, "state",
			  r->already ? "already published" : "published");
		proto_add_u64(&c->out, "files", r->files);
		proto_add_u64(&c->out, "bytes", r->bytes);
		proto_add_u64(&c->out, "copied", r->copied);
		proto_add_u64(&c->out, "copied_bytes", r->copied_bytes);
		proto_add_u64(&c->out, "kept", r->kept);
		proto_add_u64(&c->out, "unchecked", r->unchecked);
		proto_add(&c->out, "waited", r->waited ? "1" : "0");
		proto_add(&c->out, "took_over", r->took_over ? "1" : "0");
		ret = proto_send(c->fd, &c->out);
		if (!ret)
			ret = daemon_peer_end(c, 0, NULL);
	}
	free(r);
	return ret;
}

static int daemon_req_refresh(struct daemon_conn *c)
{
	const char *name = c->name;
	struct catalog_dataset ds = { 0 };
	int ret = catalog_dataset_get(c->cat, name, &ds);

	if (ret == -ENOENT)
		return daemon_peer_end(c, ret, "no dataset named %s", name);
	if (ret)
		return daemon_peer_end(c, ret, "refreshing %s: %s", name,
				       strerror(-ret));
	ret = daemon_req_register(c, name, ds.source);
	if (ret) {
		ret = daemon_req_register_failed(c, "refreshing", name,
						 ds.source, ds.sums_key, ret);
		goto out;
	}
	daemon_admin_audit(c, "dataset.refresh", name, NULL, NULL);
	catalog_dataset_release(&ds);
	ret = catalog_dataset_get(c->cat, name, &ds);
	if (!ret) {
		daemon_peer_row(c, "row");
		daemon_req_ds_fields(&c->out, &ds);
		ret = proto_send(c->fd, &c->out);
	}
	if (!ret)
		ret = daemon_peer_end(c, 0, NULL);
out:
	catalog_dataset_release(&ds);
	return ret;
}

struct daemon_req_drop {
	struct cache *cache;
	struct objstore *os;
	const char *dataset;
};

static int daemon_req_drop_cb(void *arg, const char *path,
			      const struct catalog_entry *e)
{
	struct daemon_req_drop *dr = arg;
	struct cache_object o = {
		.dataset = dr->dataset,
		.os = dr->os,
		.key = path,
		.etag = e->etag,
		.size = e->size,
	};
	int ret = cache_object_drop(dr->cache, &o);

	if (ret && ret != -ENOENT)
		log_warn("remove %s: dropping %s from the cache: %s",
			 dr->dataset, path, strerror(-ret));
	return 0;
}

static int daemon_req_remove(struct daemon_conn *c)
{
	const char *name = c->name;
	struct daemon *d = c->d;
	struct catalog_dataset ds = { 0 };
	struct daemon_req_drop dr = { .cache = d->env.cache, .dataset = name };
	int ret = catalog_dataset_get(c->cat, name, &ds);

	if (ret == -ENOENT)
		return daemon_peer_end(c, ret, "no dataset named %s", name);
	if (ret)
		return daemon_peer_end(c, ret, NULL);
	/* stop its running jobs; queued ones fail when claimed */
	daemon_jobs_cancel_dataset(d, c->jq, name);
	if (dr.cache) {
		if (objstore_open(ds.source, d->cfg, &dr.os))
			dr.os = NULL;
		runner_walk(c->cat, name, daemon_req_drop_cb, &dr);
		objstore_free(dr.os);
	}
	catalog_dataset_release(&ds);
	ret = catalog_dataset_remove(c->cat, name);
	if (ret)
		return daemon_peer_end(c, ret, "removing %s: %s", name,
				       strerror(-ret));
	daemon_admin_audit(c, "dataset.remove", name, NULL, NULL);
	return daemon_peer_end(c, 0, NULL);
}

/* ---- the table ---- */

enum {
	DAEMON_REQ_ADMIN = 1u << 0, /* changes the node: root or admin group */
	DAEMON_REQ_NAME = 1u << 1, /* needs name= */
	DAEMON_REQ_JOB = 1u << 2, /* needs job= */
	DAEMON_REQ_JOB_OPT = 1u << 3, /* takes job= (strictly parsed) */
};

struct daemon_req {
	const char *cmd;
	int (*run)(struct daemon_conn *c);
	unsigned flags;
};

static int daemon_req_ping(struct daemon_conn *c)
{
	return daemon_peer_end(c, 0, "stager daemon, pid %d", (int)getpid());
}

/* status without a job is jobs */
static int daemon_req_status_or_jobs(struct daemon_conn *c)
{
	return c->job ? daemon_req_status(c) : daemon_req_jobs(c);
}

static const struct daemon_req daemon_req_table[] = {
	{ "ping", daemon_req_ping, 0 },
	{ "list", daemon_req_list, 0 },
	{ "show", daemon_req_show, DAEMON_REQ_NAME },
	{ "jobs", daemon_req_jobs, 0 },
	{ "status", daemon_req_status_or_jobs, DAEMON_REQ_JOB_OPT },
	{ "watch", daemon_req_watch, DAEMON_REQ_JOB },
	{ "add", daemon_req_add, DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "refresh", daemon_req_refresh, DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "remove", daemon_req_remove, DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "stage", daemon_submit_job, DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "stage.shared", daemon_req_stage_shared,
	  DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "verify", daemon_submit_job, DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "cancel", daemon_submit_cancel, DAEMON_REQ_ADMIN | DAEMON_REQ_JOB },
	/* cachectl (daemon_admin.c) */
	{ "cache.status", daemon_admin_status, 0 },
	{ "cache.policy", daemon_admin_policy_show, 0 },
	{ "cache.policy.set", daemon_admin_policy_set, DAEMON_REQ_ADMIN },
	{ "cache.pin", daemon_admin_pin, DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "cache.unpin", daemon_admin_pin, DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "cache.quota", daemon_admin_quota,
	  DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "cache.priority", daemon_admin_priority,
	  DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "cache.csi-allow", daemon_admin_csi_allow,
	  DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "cache.evict", daemon_admin_evict, DAEMON_REQ_ADMIN },
	{ "cache.gc", daemon_admin_gc, DAEMON_REQ_ADMIN },
	{ "audit", daemon_admin_audit_list, DAEMON_REQ_ADMIN },
	/* checkpoint lifecycle (daemon_lifecycle.c; stager and cachectl) */
	{ "lifecycle.list", daemon_lifecycle_list, 0 },
	{ "lifecycle.add", daemon_lifecycle_add,
	  DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "lifecycle.remove", daemon_lifecycle_remove,
	  DAEMON_REQ_ADMIN | DAEMON_REQ_NAME },
	{ "lifecycle.run", daemon_lifecycle_run, DAEMON_REQ_ADMIN },
	/* checks its peer itself, to say why */
	{ "unpublished", daemon_lifecycle_unpublished, DAEMON_REQ_ADMIN },
};

int daemon_req_run(struct daemon_conn *c)
{
	const char *cmd = proto_get(&c->msg, "cmd");
	const struct daemon_req *r = NULL;
	const char *jobstr;
	int64_t id = 0;

	if (!cmd)
		return daemon_peer_end(c, -EINVAL, "no cmd in the request");
	for (size_t i = 0;
	     i < sizeof(daemon_req_table) / sizeof(daemon_req_table[0]); i++)
		if (!strcmp(cmd, daemon_req_table[i].cmd)) {
			r = &daemon_req_table[i];
			break;
		}
	if ((!r || (r->flags & DAEMON_REQ_ADMIN)) && !c->admin)
		return daemon_peer_end(
			c, -EPERM,
			"permission denied: '%s' changes the node's "
			"state or shows every user's files, and is "
			"allowed only to root and to "
			"members of group '%s' (you are uid %u%s%s%s)",
			cmd, c->d->cfg->daemon_admin_group, (unsigned)c->uid,
			c->user[0] ? " (" : "", c->user, c->user[0] ? ")" : "");
	if (!r)
		return daemon_peer_end(c, -EINVAL, "unknown request '%s'", cmd);
	c->cmd = r->cmd;
	c->name = proto_get(&c->msg, "name");
	c->job = 0;
	jobstr = proto_get(&c->msg, "job");
	if (jobstr && (r->flags & (DAEMON_REQ_JOB | DAEMON_REQ_JOB_OPT))) {
		/* strictly: a bad id is an error, never "no id" (which would
		 * make status list every job) */
		if (jobs_parse_id(jobstr, &id))
			return daemon_peer_end(
				c, -EINVAL,
				"%s: job=%.40s is not a job id (1 to %" PRId64
				")",
				cmd, jobstr, (int64_t)JOBS_ID_MAX);
		c->job = id;
	}
	if ((r->flags & DAEMON_REQ_JOB) && !c->job)
		return daemon_peer_end(c, -EINVAL, "%s: no name or job", cmd);
	if ((r->flags & DAEMON_REQ_NAME) && !c->name)
		return daemon_peer_end(c, -EINVAL, "%s: no name or job", cmd);
	return r->run(c);
}
