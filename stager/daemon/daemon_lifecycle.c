// SPDX-License-Identifier: MIT
/*
 * daemon_lifecycle: the daemon's checkpoint work. Requests (rows of
 * daemon_req.c's table): lifecycle.list, .add, .remove, .run. One thread
 * (daemon_lifecycle_start/_stop) that
 *   - runs the publish-retry job: every checkpoints.retry_interval it
 *     scans the staging journal for closed files the store refused (P
 *     records) and publishes each (lib/lifecycle/lifecycle_stage.c), backing off
 *     from retry_interval to 64 times it per file while the store fails;
 *   - applies the lifecycle rules every checkpoints.lifecycle_interval.
 * `stager jobs` shows the retry entries and the abandoned files (rows
 * added by daemon_lifecycle_jobs); `stager unpublished` lists the files
 * not in the store yet, each with its cause (daemon_lifecycle_unpublished;
 * the Slurm epilog waits on it).
 *
 * Retry entry states: WAITING (seen, first try after one interval) ->
 * PUBLISHED (done; kept DL_KEEP_DONE s for `jobs`) or RETRYING (failed:
 * next try after the backoff) -> PUBLISHED; an entry whose record is no
 * longer P (dstagefs published or replaced it) is dropped at the next
 * scan.
 *
 * Locks: dl->lock protects ents, n, stop and the cond; taken alone (never
 * with d->lock), and never held over store or catalog calls. dl->run_lock
 * makes lifecycle passes (scheduled or requested) one at a time; it is
 * taken before dl->lock.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon_i.h"
#include "dstage/catalog.h"
#include "dstage/lifecycle.h"
#include "dstage/lifecycle_run.h"
#include "dstage/lifecycle_stage.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/timeutil.h"

#define DL_MAX_ENTS 256 /* retry entries shown and tracked */
#define DL_KEEP_DONE 3600 /* seconds a published entry stays listed */
#define DL_BACKOFF_MAX 64 /* times retry_interval */

enum daemon_lifecycle_state { DL_WAITING, DL_RETRYING, DL_PUBLISHED };

struct daemon_lifecycle_ent {
	char key[1024];
	ino_t ino;
	enum daemon_lifecycle_state state;
	unsigned attempts;
	int64_t next_ms; /* the next try, CLOCK_REALTIME ms */
	int64_t done; /* published at, seconds */
	char error[160];
	bool seen; /* in the last scan */
};

struct daemon_lifecycle {
	struct daemon *d;
	pthread_mutex_t run_lock;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;
	pthread_t thread;
	bool started;
	struct daemon_lifecycle_ent *ents;
	size_t n;
};

/* ---- the retry job ---- */

struct daemon_lifecycle_scan {
	struct daemon_lifecycle *dl;
	int64_t now;
	unsigned interval;
};

static int daemon_lifecycle_scan_cb(void *arg, const struct lifecycle_local *l)
{
	struct daemon_lifecycle_scan *s = arg;
	struct daemon_lifecycle *dl = s->dl;
	struct daemon_lifecycle_ent *e = NULL;

	if (l->state != 'P' || strlen(l->key) >= sizeof(e->key))
		return 0;
	pthread_mutex_lock(&dl->lock);
	for (size_t i = 0; i < dl->n && !e; i++)
		if (dl->ents[i].ino == l->ino &&
		    !strcmp(dl->ents[i].key, l->key))
			e = &dl->ents[i];
	if (!e && dl->n < DL_MAX_ENTS) {
		e = &dl->ents[dl->n++];
		memset(e, 0, sizeof(*e));
		snprintf(e->key, sizeof(e->key), "%s", l->key);
		e->ino = l->ino;
		e->state = DL_WAITING;
		e->next_ms = s->now + s->interval;
		log_info("checkpoints: %s is closed but not published: "
			 "queued for the retry job",
			 l->key);
	}
	if (e) {
		e->seen = true;
		if (e->state == DL_PUBLISHED) /* P again: a new version */
			e->state = DL_WAITING;
	}
	pthread_mutex_unlock(&dl->lock);
	return 0;
}

/* One pass: scan, drop entries that are gone, try those that are due. */
static void daemon_lifecycle_retry_pass(struct daemon_lifecycle *dl,
					struct lifecycle_staging *stg,
					struct objstore *os,
					struct catalog *cat)
{
	unsigned interval = dl->d->cfg->ckpt_retry_ms;
	struct daemon_lifecycle_scan s = { .dl = dl,
					   .now = timeutil_real_ms(),
					   .interval = interval };
	size_t i;

	pthread_mutex_lock(&dl->lock);
	for (i = 0; i < dl->n; i++)
		dl->ents[i].seen = false;
	pthread_mutex_unlock(&dl->lock);
	if (lifecycle_staging_scan(stg, daemon_lifecycle_scan_cb, &s))
		return;
	pthread_mutex_lock(&dl->lock);
	for (i = 0; i < dl->n;) {
		struct daemon_lifecycle_ent *e = &dl->ents[i];
		bool gone = e->state == DL_PUBLISHED
				    ? s.now / 1000 - e->done > DL_KEEP_DONE
				    : !e->seen;

		if (gone)
			dl->ents[i] = dl->ents[--dl->n];
		else
			i++;
	}
	for (i = 0; i < dl->n && !dl->stop; i++) {
		struct daemon_lifecycle_ent *e = &dl->ents[i], copy;
		int ret;

		if (e->state == DL_PUBLISHED || e->next_ms > s.now)
			continue;
		copy = *e;
		pthread_mutex_unlock(&dl->lock);
		ret = os ? lifecycle_staging_publish(stg, os, cat, copy.key,
						     copy.ino)
			 : -ENOENT;
		pthread_mutex_lock(&dl->lock);
		/* the table may have changed: find the entry again */
		e = NULL;
		for (size_t k = 0; k < dl->n && !e; k++)
			if (dl->ents[k].ino == copy.ino &&
			    !strcmp(dl->ents[k].key, copy.key))
				e = &dl->ents[k];
		if (!e)
			continue;
		e->attempts++;
		if (!ret || ret == -ESTALE) {
			e->state = DL_PUBLISHED;
			e->done = s.now / 1000;
			e->error[0] = '\0';
			if (!ret)
				log_info("checkpoints: %s published to %s by "
					 "the retry job (attempt %u)",
					 e->key, objstore_url(os), e->attempts);
		} else {
			unsigned mult = 1u
					<< (e->attempts < 7 ? e->attempts : 6);

			if (mult > DL_BACKOFF_MAX)
				mult = DL_BACKOFF_MAX;
			e->state = DL_RETRYING;
			e->next_ms =
				timeutil_real_ms() + (int64_t)interval * mult;
			snprintf(e->error, sizeof(e->error), "%s",
				 strerror(-ret));
			log_warn("checkpoints: the retry job cannot publish %s "
				 "to %s (attempt %u): %s; next try in %u s",
				 e->key,
				 os ? objstore_url(os) : "checkpoints.store",
				 e->attempts, strerror(-ret),
				 interval * mult / 1000);
		}
	}
	pthread_mutex_unlock(&dl->lock);
}

/* ---- lifecycle passes ---- */

struct daemon_lifecycle_run {
	struct daemon_conn *c; /* NULL: the schedule */
};

static void daemon_lifecycle_event(void *arg, const struct lifecycle_event *ev)
{
	struct daemon_lifecycle_run *r = arg;
	char target[600], rule[32] = "";

	if (!r->c)
		return;
	snprintf(target, sizeof(target), "%s%s%s", ev->job,
		 ev->job[0] ? "/" : "", ev->name);
	if (ev->rule)
		snprintf(rule, sizeof(rule), "rule %" PRId64, ev->rule->id);
	daemon_peer_row(r->c, "action");
	proto_add(&r->c->out, "action",
		  ev->action == LIFECYCLE_ABANDONED_RM
			  ? "remove-abandoned"
			  : lifecycle_action_name(ev->action));
	proto_add(&r->c->out, "target", target);
	proto_add(&r->c->out, "from", ev->from);
	proto_add(&r->c->out, "to", ev->to);
	proto_add(&r->c->out, "rule", rule);
	proto_add(&r->c->out, "pattern", ev->rule ? ev->rule->pattern : "");
	proto_add_i64(&r->c->out, "step", ev->step);
	proto_add_i64(&r->c->out, "age_days", ev->age / LIFECYCLE_DAY);
	proto_add(&r->c->out, "result",
		  ev->result ? strerror(-ev->result) : "ok");
	proto_send(r->c->fd, &r->c->out); /* a gone client stops nothing */
}

static int daemon_lifecycle_pass(struct daemon_lifecycle *dl,
				 struct catalog *cat,
				 const struct lifecycle_run_opts *o,
				 struct daemon_conn *c,
				 struct lifecycle_run_stats *st)
{
	struct daemon_lifecycle_run r = { .c = c };
	int ret;

	pthread_mutex_lock(&dl->run_lock);
	ret = lifecycle_run(dl->d->cfg, cat, o, daemon_lifecycle_event, &r, st);
	pthread_mutex_unlock(&dl->run_lock);
	return ret;
}

/* ---- the thread ---- */

static void *daemon_lifecycle_thread(void *arg)
{
	struct daemon_lifecycle *dl = arg;
	const struct dstage_config *cfg = dl->d->cfg;
	struct lifecycle_staging *stg = NULL;
	struct objstore *os = NULL;
	struct catalog *cat = NULL;
	int64_t next_retry = 0,
		next_lc = timeutil_real_ms() + cfg->ckpt_lifecycle_ms;

	pthread_mutex_lock(&dl->lock);
	while (!dl->stop) {
		int64_t now = timeutil_real_ms(), wake;
		struct timespec ts;

		pthread_mutex_unlock(&dl->lock);
		if (now >= next_retry) {
			next_retry = now + cfg->ckpt_retry_ms;
			if (!stg)
				lifecycle_staging_open(cfg, &stg);
			if (stg && !os &&
			    objstore_open(cfg->ckpt_store, cfg, &os))
				os = NULL;
			if (stg && !cat &&
			    catalog_open(cfg->catalog_path, 0, &cat))
				cat = NULL;
			if (stg)
				daemon_lifecycle_retry_pass(dl, stg, os, cat);
		}
		if (cfg->ckpt_lifecycle_ms && now >= next_lc) {
			struct lifecycle_run_opts o = {
				.now = now / 1000,
				.user = "lifecycle schedule",
				.abandoned_keep =
					cfg->ckpt_abandoned_keep_ms / 1000,
			};

			next_lc = now + cfg->ckpt_lifecycle_ms;
			if (cat || !catalog_open(cfg->catalog_path, 0, &cat))
				daemon_lifecycle_pass(dl, cat, &o, NULL, NULL);
		}
		wake = next_retry;
		if (cfg->ckpt_lifecycle_ms && next_lc < wake)
			wake = next_lc;
		ts.tv_sec = wake / 1000;
		ts.tv_nsec = (wake % 1000) * 1000000;
		pthread_mutex_lock(&dl->lock);
		if (!dl->stop)
			pthread_cond_timedwait(&dl->cond, &dl->lock, &ts);
	}
	pthread_mutex_unlock(&dl->lock);
	lifecycle_staging_free(stg);
	objstore_free(os);
	catalog_close(cat);
	return NULL;
}

int daemon_lifecycle_start(struct daemon *d)
{
	struct daemon_lifecycle *dl;

	if (!d->cfg->ckpt_store || !*d->cfg->ckpt_store)
		return 0; /* no checkpoints on this node */
	dl = calloc(1, sizeof(*dl));
	if (!dl)
		return -ENOMEM;
	dl->d = d;
	pthread_mutex_init(&dl->run_lock, NULL);
	pthread_mutex_init(&dl->lock, NULL);
	pthread_cond_init(&dl->cond, NULL);
	dl->ents = calloc(DL_MAX_ENTS, sizeof(*dl->ents));
	if (!dl->ents ||
	    pthread_create(&dl->thread, NULL, daemon_lifecycle_thread, dl)) {
		free(dl->ents);
		free(dl);
		return -EAGAIN;
	}
	dl->started = true;
	d->lifecycle = dl;
	return 0;
}

void daemon_lifecycle_stop(struct daemon *d)
{
	struct daemon_lifecycle *dl = d->lifecycle;

	if (!dl)
		return;
	pthread_mutex_lock(&dl->lock);
	dl->stop = true;
	pthread_cond_signal(&dl->cond);
	pthread_mutex_unlock(&dl->lock);
	pthread_join(dl->thread, NULL);
	/* connection threads may still be in a request: d->lifecycle and
	 * its locks stay until daemon_lifecycle_free */
}

void daemon_lifecycle_free(struct daemon *d)
{
	struct daemon_lifecycle *dl = d->lifecycle;

	if (!dl)
		return;
	d->lifecycle = NULL;
	pthread_mutex_destroy(&dl->run_lock);
	pthread_mutex_destroy(&dl->lock);
	pthread_cond_destroy(&dl->cond);
	free(dl->ents);
	free(dl);
}

/* ---- `stager jobs` rows ---- */

struct daemon_lifecycle_jobs {
	struct daemon_conn *c;
	int ret;
};

static int daemon_lifecycle_abandoned_row(void *arg,
					  const struct lifecycle_abandoned *a)
{
	struct daemon_lifecycle_jobs *j = arg;

	daemon_peer_row(j->c, "row");
	proto_add(&j->c->out, "job", "-");
	proto_add(&j->c->out, "kind", "abandoned");
	proto_add(&j->c->out, "dataset", a->name);
	proto_add(&j->c->out, "state", "kept");
	proto_add_u64(&j->c->out, "done", 0);
	proto_add_u64(&j->c->out, "total", a->size);
	proto_add_i64(&j->c->out, "mtime", a->mtime);
	proto_add(&j->c->out, "error",
		  "never closed by its writer: not published; removed by "
		  "lifecycle after checkpoints.abandoned_keep");
	j->ret = proto_send(j->c->fd, &j->c->out);
	return j->ret;
}

int daemon_lifecycle_jobs(struct daemon_conn *c)
{
	struct daemon_lifecycle *dl = c->d->lifecycle;
	static const char *const states[] = { "waiting", "retrying",
					      "published" };
	struct lifecycle_staging *stg = NULL;
	struct daemon_lifecycle_jobs j = { .c = c };
	struct daemon_lifecycle_ent *copy;
	size_t n;

	if (!dl || !c->admin)
		return 0; /* checkpoint rows: admins only */
	copy = calloc(DL_MAX_ENTS, sizeof(*copy));
	if (!copy)
		return -ENOMEM;
	pthread_mutex_lock(&dl->lock);
	n = dl->n;
	memcpy(copy, dl->ents, n * sizeof(*copy));
	pthread_mutex_unlock(&dl->lock);
	for (size_t i = 0; i < n && !j.ret; i++) {
		daemon_peer_row(c, "row");
		proto_add(&c->out, "job", "-");
		proto_add(&c->out, "kind", "publish");
		proto_add(&c->out, "dataset", copy[i].key);
		proto_add(&c->out, "state", states[copy[i].state]);
		proto_add_u64(&c->out, "done", copy[i].state == DL_PUBLISHED);
		proto_add_u64(&c->out, "total", 1);
		proto_add_u64(&c->out, "attempts", copy[i].attempts);
		proto_add_i64(&c->out, "next", copy[i].next_ms / 1000);
		proto_add(&c->out, "error", copy[i].error);
		j.ret = proto_send(c->fd, &c->out);
	}
	free(copy);
	if (!j.ret && !lifecycle_staging_open(c->d->cfg, &stg))
		lifecycle_abandoned_list(stg, daemon_lifecycle_abandoned_row,
					 &j);
	lifecycle_staging_free(stg);
	return j.ret;
}

/* ---- `stager unpublished` ---- */

struct daemon_lifecycle_unpub {
	struct daemon_conn *c;
	const struct daemon_lifecycle_ent
		*ents; /* a copy of the retry entries */
	size_t n;
	int64_t since; /* only files changed at or after (seconds) */
	const char *staging;
	int ret;
};

static int daemon_lifecycle_unpub_send(struct daemon_lifecycle_unpub *u,
				       const char *key, const char *state,
				       uint64_t size, int64_t mtime,
				       unsigned attempts, const char *cause)
{
	daemon_peer_row(u->c, "row");
	proto_add(&u->c->out, "key", key);
	proto_add(&u->c->out, "state", state);
	proto_add_u64(&u->c->out, "size", size);
	proto_add_i64(&u->c->out, "mtime", mtime);
	proto_add_u64(&u->c->out, "attempts", attempts);
	proto_add(&u->c->out, "error", cause);
	u->ret = proto_send(u->c->fd, &u->c->out);
	return u->ret;
}

/* A local copy whose record is not C: being written, or closed and not
 * in the store (with the retry job's last error when it tried). */
static int daemon_lifecycle_unpub_local(void *arg,
					const struct lifecycle_local *l)
{
	struct daemon_lifecycle_unpub *u = arg;
	const struct daemon_lifecycle_ent *e = NULL;
	char cause[320];

	if (l->state == 'C' || l->mtime < u->since)
		return 0;
	if (l->state == 'W')
		return daemon_lifecycle_unpub_send(
			u, l->key, "open", l->size, l->mtime, 0,
			"still open by a writer: not closed or "
			"fsynced, so this version is not in the "
			"store");
	for (size_t i = 0; i < u->n && !e; i++)
		if (u->ents[i].ino == l->ino && !strcmp(u->ents[i].key, l->key))
			e = &u->ents[i];
	if (e && e->error[0])
		snprintf(cause, sizeof(cause),
			 "closed, not in the store: the store refused it "
			 "(%s; the retry job tried %u time%s)",
			 e->error, e->attempts, e->attempts == 1 ? "" : "s");
	else
		snprintf(cause, sizeof(cause),
			 "closed, not in the store yet: its publish at close "
			 "failed or is under way, and the retry job has not "
			 "tried it yet");
	return daemon_lifecycle_unpub_send(u, l->key, "unpublished", l->size,
					   l->mtime, e ? e->attempts : 0,
					   cause);
}

static int daemon_lifecycle_unpub_abandoned(void *arg,
					    const struct lifecycle_abandoned *a)
{
	struct daemon_lifecycle_unpub *u = arg;
	char key[600], cause[700];

	if (a->mtime < u->since)
		return 0;
	snprintf(key, sizeof(key), "abandoned/%s", a->name);
	snprintf(cause, sizeof(cause),
		 "abandoned: its writer was killed (or dstagefs stopped) "
		 "before closing it, so it is never published; the partial "
		 "file is %s/abandoned/%s",
		 u->staging, a->name);
	return daemon_lifecycle_unpub_send(u, key, "abandoned", a->size,
					   a->mtime, 0, cause);
}

int daemon_lifecycle_unpublished(struct daemon_conn *c)
{
	struct daemon_lifecycle *dl = c->d->lifecycle;
	struct lifecycle_staging *stg = NULL;
	struct daemon_lifecycle_unpub u = { .c = c };
	const char *since = proto_get(&c->msg, "since");
	struct daemon_lifecycle_ent *copy = NULL;
	int ret;

	/* Admins only (every user's file names): the table's check. */
	if (since && (*since < '0' || *since > '9' ||
		      proto_get_i64(&c->msg, "since", &u.since) || u.since < 0))
		return daemon_peer_end(c, -EINVAL,
				       "unpublished: since=%.40s: expected "
				       "seconds since the epoch",
				       since);
	if (!dl) {
		snprintf(c->warn, sizeof(c->warn),
			 "this node has no checkpoints.store: it writes no "
			 "checkpoints");
		return daemon_peer_end(c, 0, NULL);
	}
	ret = lifecycle_staging_open(c->d->cfg, &stg);
	if (ret == -ENOENT) /* dstagefs never wrote a checkpoint here */
		return daemon_peer_end(c, 0, NULL);
	if (ret)
		return daemon_peer_end(c, ret,
				       "cannot read checkpoints.staging_dir "
				       "%s: %s (the daemon's log says why)",
				       c->d->cfg->ckpt_staging_dir,
				       strerror(-ret));
	copy = calloc(DL_MAX_ENTS, sizeof(*copy));
	if (!copy) {
		lifecycle_staging_free(stg);
		return daemon_peer_end(c, -ENOMEM, NULL);
	}
	pthread_mutex_lock(&dl->lock);
	u.n = dl->n;
	memcpy(copy, dl->ents, u.n * sizeof(*copy));
	pthread_mutex_unlock(&dl->lock);
	u.ents = copy;
	u.staging = lifecycle_staging_path(stg);
	ret = lifecycle_staging_scan(stg, daemon_lifecycle_unpub_local, &u);
	if (!ret && !u.ret)
		ret = lifecycle_abandoned_list(
			stg, daemon_lifecycle_unpub_abandoned, &u);
	free(copy);
	lifecycle_staging_free(stg);
	if (u.ret)
		return u.ret; /* the client is gone */
	if (ret)
		return daemon_peer_end(c, ret,
				       "cannot list checkpoints.staging_dir "
				       "%s: %s",
				       c->d->cfg->ckpt_staging_dir,
				       strerror(-ret));
	return daemon_peer_end(c, 0, NULL);
}

/* ---- requests ---- */

static void daemon_lifecycle_rule_fields(struct proto_buf *b,
					 const struct lifecycle_rule *r)
{
	proto_add_i64(b, "id", r->id);
	proto_add(b, "pattern", r->pattern);
	proto_add_u64(b, "keep_local", r->keep_local);
	proto_add_u64(b, "shared_days", r->shared_days);
	proto_add_u64(b, "delete_days", r->delete_days);
	proto_add_u64(b, "keep_every", r->keep_every);
	proto_add(b, "archive", r->archive);
	proto_add(b, "storage_class", r->storage_class);
}

int daemon_lifecycle_list(struct daemon_conn *c)
{
	struct lifecycle_rule *v = NULL;
	size_t n = 0;
	int ret = catalog_lifecycle_list(c->cat, &v, &n);

	for (size_t i = 0; !ret && i < n; i++) {
		daemon_peer_row(c, "rule");
		daemon_lifecycle_rule_fields(&c->out, &v[i]);
		ret = proto_send(c->fd, &c->out);
	}
	free(v);
	return daemon_peer_end(c, ret, NULL);
}

/* An unsigned field of the request, 0 when absent. */
static int daemon_lifecycle_uint(struct daemon_conn *c, const char *k,
				 unsigned *v)
{
	const char *s = proto_get(&c->msg, k);
	uint64_t u;

	*v = 0;
	if (!s)
		return 0;
	if (*s < '0' || *s > '9' || proto_get_u64(&c->msg, k, &u) ||
	    u > 999999999) {
		int ret = daemon_peer_end(c, -EINVAL,
					  "lifecycle add: %s=%.40s: expected a "
					  "whole number from 0 to 999999999",
					  k, s);

		return ret ? ret : -EINVAL;
	}
	*v = (unsigned)u;
	return 0;
}

static int daemon_lifecycle_str(struct daemon_conn *c, const char *k, char *buf,
				size_t len)
{
	const char *s = proto_get(&c->msg, k);

	if (!s)
		s = "";
	if (strlen(s) >= len) {
		int ret = daemon_peer_end(c, -EINVAL,
					  "lifecycle add: %s is too long (at "
					  "most %zu bytes)",
					  k, len - 1);

		return ret ? ret : -EINVAL;
	}
	snprintf(buf, len, "%s", s);
	return 0;
}

int daemon_lifecycle_add(struct daemon_conn *c)
{
	struct catalog_audit who = { .uid = c->uid,
				     .user = c->user[0] ? c->user : NULL };
	struct lifecycle_rule r;
	char msg[512] = "";
	int ret;

	memset(&r, 0, sizeof(r));
	if (strlen(c->name) >= sizeof(r.pattern))
		return daemon_peer_end(c, -EINVAL,
				       "lifecycle add: the pattern is longer "
				       "than %d bytes",
				       LIFECYCLE_PATTERN_MAX - 1);
	snprintf(r.pattern, sizeof(r.pattern), "%s", c->name);
	if (proto_get(&c->msg, "keep_local") == NULL)
		r.keep_local = 1;
	else if ((ret = daemon_lifecycle_uint(c, "keep_local", &r.keep_local)))
		return ret == -EINVAL ? 0 : ret;
	if ((ret = daemon_lifecycle_uint(c, "shared_days", &r.shared_days)) ||
	    (ret = daemon_lifecycle_uint(c, "delete_days", &r.delete_days)) ||
	    (ret = daemon_lifecycle_uint(c, "keep_every", &r.keep_every)) ||
	    (ret = daemon_lifecycle_str(c, "archive", r.archive,
					sizeof(r.archive))) ||
	    (ret = daemon_lifecycle_str(c, "storage_class", r.storage_class,
					sizeof(r.storage_class))))
		return ret == -EINVAL ? 0 : ret;
	ret = catalog_lifecycle_add(c->cat, &r, &who, msg, sizeof(msg));
	if (ret)
		return daemon_peer_end(c, ret, "%s",
				       msg[0] ? msg : strerror(-ret));
	daemon_peer_row(c, "rule");
	daemon_lifecycle_rule_fields(&c->out, &r);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

int daemon_lifecycle_remove(struct daemon_conn *c)
{
	struct catalog_audit who = { .uid = c->uid,
				     .user = c->user[0] ? c->user : NULL };
	struct lifecycle_rule r;
	int64_t id = 0;
	int ret;

	if (proto_get(&c->msg, "id") && proto_get_i64(&c->msg, "id", &id))
		return daemon_peer_end(c, -EINVAL,
				       "lifecycle remove: id=%.40s is not a "
				       "rule id",
				       proto_get(&c->msg, "id"));
	ret = catalog_lifecycle_remove(c->cat, id, c->name, &who, &r);
	if (ret == -ENOENT)
		return daemon_peer_end(c, ret,
				       "lifecycle remove: no rule '%.300s' "
				       "(stager lifecycle list shows them)",
				       c->name);
	if (ret)
		return daemon_peer_end(c, ret, NULL);
	daemon_peer_row(c, "rule");
	daemon_lifecycle_rule_fields(&c->out, &r);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

int daemon_lifecycle_run(struct daemon_conn *c)
{
	struct daemon_lifecycle *dl = c->d->lifecycle;
	struct lifecycle_run_stats st = { 0 };
	struct lifecycle_run_opts o = {
		.now = time(NULL),
		.dry_run = proto_get(&c->msg, "dry_run") != NULL,
		.uid = c->uid,
		.user = c->user[0] ? c->user : NULL,
		.abandoned_keep = c->d->cfg->ckpt_abandoned_keep_ms / 1000,
	};
	int ret;

	if (!dl)
		return daemon_peer_end(c, -ENOENT,
				       "lifecycle run: checkpoints.store is "
				       "not set in the daemon's "
				       "configuration");
	if (proto_get(&c->msg, "as_of") &&
	    (proto_get_i64(&c->msg, "as_of", &o.now) || o.now < 0))
		return daemon_peer_end(c, -EINVAL,
				       "lifecycle run: as_of=%.40s: expected "
				       "seconds since the epoch",
				       proto_get(&c->msg, "as_of"));
	ret = daemon_lifecycle_pass(dl, c->cat, &o, c, &st);
	if (ret)
		return daemon_peer_end(c, ret, "lifecycle run: %s",
				       strerror(-ret));
	daemon_peer_row(c, "summary");
	proto_add_u64(&c->out, "dry_run", o.dry_run);
	proto_add_i64(&c->out, "as_of", o.now);
	proto_add_u64(&c->out, "jobs", st.jobs);
	proto_add_u64(&c->out, "checkpoints", st.checkpoints);
	proto_add_u64(&c->out, "archived", st.archived);
	proto_add_u64(&c->out, "deleted", st.deleted);
	proto_add_u64(&c->out, "dropped", st.dropped);
	proto_add_u64(&c->out, "abandoned", st.abandoned);
	proto_add_u64(&c->out, "errors", st.errors);
	ret = proto_send(c->fd, &c->out);
	if (ret)
		return ret;
	return st.errors ? daemon_peer_end(c, -EIO,
					   "%u action(s) failed (see above "
					   "and the daemon's log)",
					   st.errors)
			 : daemon_peer_end(c, 0, NULL);
}
