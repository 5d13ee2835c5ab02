// SPDX-License-Identifier: MIT
/*
 * daemon: `stager daemon`, the node's staging service.
 *
 * Threads: the main thread waits for SIGTERM/SIGINT; one thread accepts
 * connections on the Unix socket (daemon.socket) and starts a detached
 * thread per connection; one dispatcher claims queued jobs from the catalog
 * (jobs.c) and starts a thread per job (runner.c), at most DAEMON_MAX_JOBS
 * at once.
 *
 * Daemon state machine: starting (catalog opened and migrated, running jobs
 * of a crashed daemon re-queued, socket bound under an exclusive lock on
 * "<socket>.lock") -> serving -> stopping (signal: no new jobs, running jobs
 * told to stop and left `running` in the catalog so the next daemon resumes
 * them) -> exit.
 *
 * Invariants:
 *   - one daemon per socket: the flock on "<socket>.lock" is held for the
 *     process lifetime;
 *   - a job is run by at most one thread: only the dispatcher claims, and a
 *     claim is one catalog transaction;
 *   - a runner_job is freed only when its last reference goes: the running
 *     list holds one (then the ring of recent jobs), each watcher one.
 *
 * Locks: d->lock protects running[], recent[], n_running and the wake-up
 * (cond). Order: d->lock, then a runner_job's lock. Connection threads own
 * their catalog and jobs connections.
 *
 * Authorization: the peer's uid and gid come from SO_PEERCRED. Read-only
 * requests (ping, list, show, jobs, status, watch) are open to every local
 * user; the others only to uid 0 and to members of daemon.admin_group
 * (primary group or, via getgrouplist, a supplementary one).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dstage/cache.h"
#include "dstage/cachepol.h"
#include "dstage/catalog.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "stager.h"

#define DAEMON_MAX_JOBS 4
#define DAEMON_RECENT 32 /* finished jobs kept for late watchers */

struct daemon {
	const struct dstage_config *cfg;
	struct runner_env env;
	int lfd; /* listening socket */
	int lockfd;
	_Atomic bool stop;
	pthread_mutex_t lock; /* protects the fields below; before rj->lock */
	pthread_cond_t cond; /* dispatcher wake-up: submit, job end, stop */
	struct runner_job *running[DAEMON_MAX_JOBS];
	pthread_t threads[DAEMON_MAX_JOBS];
	bool used[DAEMON_MAX_JOBS];
	unsigned n_running;
	struct runner_job *recent[DAEMON_RECENT]; /* each holds a ref */
	unsigned recent_next;
};

/* One client connection, owned by its thread. */
struct daemon_conn {
	struct daemon *d;
	int fd;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	char user[64];
	bool admin;
	struct catalog *cat;
	struct jobs *jq;
	struct proto_buf out;
	struct proto_reader in;
	struct proto_msg msg;
};

struct daemon_jobarg {
	struct daemon *d;
	struct runner_job *rj;
	struct jobs_job j;
	unsigned slot;
};

static bool daemon_in_group(const struct daemon_conn *c)
{
	const char *name = c->d->cfg->daemon_admin_group;
	struct group *gr;
	gid_t groups[256];
	int n = 256;
	gid_t admin;

	if (c->uid == 0)
		return true;
	if (!name || !*name)
		return false;
	gr = getgrnam(name);
	if (!gr)
		return false;
	admin = gr->gr_gid;
	if (c->gid == admin)
		return true;
	if (!c->user[0] || c->user[0] == '#')
		return false;
	if (getgrouplist(c->user, c->gid, groups, &n) < 0)
		n = 256;
	for (int i = 0; i < n; i++)
		if (groups[i] == admin)
			return true;
	return false;
}

/* Send `type=end rc=... msg=...`. Returns 0 or -errno of the send. */
static int daemon_end(struct daemon_conn *c, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int daemon_end(struct daemon_conn *c, int rc, const char *fmt, ...)
{
	char msg[1024] = "";
	va_list ap;

	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
	}
	proto_reset(&c->out);
	proto_add(&c->out, "type", "end");
	proto_add_i64(&c->out, "rc", rc);
	if (msg[0])
		proto_add(&c->out, "msg", msg);
	else if (rc)
		proto_add(&c->out, "msg", strerror(-rc));
	return proto_send(c->fd, &c->out);
}

static void daemon_row(struct daemon_conn *c, const char *type)
{
	proto_reset(&c->out);
	proto_add(&c->out, "type", type);
}

static void daemon_audit(struct daemon_conn *c, const char *action,
			 const char *target, const char *value)
{
	struct catalog_audit a = {
		.uid = c->uid,
		.user = c->user,
		.action = action,
		.target = target,
		.new_value = value,
	};
	int ret = catalog_audit_add(c->cat, &a);

	if (ret)
		log_warn("audit %s %s: %s", action, target ? target : "",
			 strerror(-ret));
}

static void daemon_wake(struct daemon *d)
{
	pthread_mutex_lock(&d->lock);
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

/* A reference to the running job id, or NULL. */
static struct runner_job *daemon_find(struct daemon *d, int64_t id)
{
	struct runner_job *rj = NULL;

	pthread_mutex_lock(&d->lock);
	for (unsigned i = 0; i < DAEMON_MAX_JOBS; i++)
		if (d->used[i] && d->running[i]->id == id) {
			rj = d->running[i];
			break;
		}
	for (unsigned i = 0; !rj && i < DAEMON_RECENT; i++)
		if (d->recent[i] && d->recent[i]->id == id)
			rj = d->recent[i];
	if (rj)
		atomic_fetch_add(&rj->refs, 1);
	pthread_mutex_unlock(&d->lock);
	return rj;
}

/* ---- read-only requests ---- */

static void daemon_ds_fields(struct proto_buf *b,
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
}

static void daemon_label(struct daemon_conn *c, const char *name)
{
	char key[320], val[256];

	snprintf(key, sizeof(key), "stager.label.%s", name);
	if (!catalog_policy_get(c->cat, key, val, sizeof(val)))
		proto_add(&c->out, "label", val);
}

static int daemon_list_cb(void *arg, const struct catalog_dataset *ds)
{
	struct daemon_conn *c = arg;

	daemon_row(c, "row");
	daemon_ds_fields(&c->out, ds);
	return proto_send(c->fd, &c->out);
}

static int daemon_list(struct daemon_conn *c)
{
	int ret = catalog_dataset_list(c->cat, daemon_list_cb, c);

	return daemon_end(c, ret, NULL);
}

struct daemon_show {
	struct daemon_conn *c;
	struct objstore *os;
	const char *dataset;
	uint64_t files, bytes, cached, verified, mismatched, expected;
	int64_t last_verified;
};

static int daemon_show_cb(void *arg, const char *path,
			  const struct catalog_entry *e)
{
	struct daemon_show *s = arg;
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

static void daemon_job_fields(struct proto_buf *b, const struct jobs_job *j,
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
	proto_add_i64(b, "created", j->created);
	proto_add_i64(b, "updated", j->updated);
	proto_add(b, "args", j->args ? j->args : "");
}

static int daemon_show(struct daemon_conn *c, const char *name)
{
	struct daemon_show s = { .c = c, .dataset = name };
	struct catalog_dataset ds = { 0 };
	struct jobs_job j = { 0 };
	int ret;

	ret = catalog_dataset_get(c->cat, name, &ds);
	if (ret == -ENOENT)
		return daemon_end(c, ret, "no dataset named %s", name);
	if (ret)
		return daemon_end(c, ret, NULL);
	if (objstore_open(ds.source, c->d->cfg, &s.os))
		s.os = NULL;
	ret = runner_walk(c->cat, name, daemon_show_cb, &s);
	if (ret && ret != -ENOENT)
		goto out;
	daemon_row(c, "row");
	daemon_ds_fields(&c->out, &ds);
	daemon_label(c, name);
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
		jobs_job_release(&j);
	}
	if (!jobs_last(c->jq, name, "stage", &j)) {
		proto_add(&c->out, "last_stage", jobs_state_name(j.state));
		proto_add_i64(&c->out, "last_stage_at", j.updated);
		jobs_job_release(&j);
	}
	ret = proto_send(c->fd, &c->out);
	if (!ret)
		ret = daemon_end(c, 0, NULL);
out:
	objstore_free(s.os);
	catalog_dataset_release(&ds);
	return ret ? daemon_end(c, ret, NULL) : 0;
}

static int daemon_jobs_cb(void *arg, const struct jobs_job *j)
{
	struct daemon_conn *c = arg;
	struct runner_job *rj =
		j->state == JOBS_RUNNING ? daemon_find(c->d, j->id) : NULL;
	int ret;

	daemon_row(c, "row");
	daemon_job_fields(&c->out, j, rj);
	runner_put(rj);
	ret = proto_send(c->fd, &c->out);
	return ret;
}

static int daemon_jobs(struct daemon_conn *c)
{
	bool all = proto_get(&c->msg, "all") != NULL;
	int ret = jobs_list(c->jq, all ? UINT32_MAX : 20, daemon_jobs_cb, c);

	return daemon_end(c, ret, NULL);
}

static int daemon_status(struct daemon_conn *c, int64_t id)
{
	struct jobs_job j = { 0 };
	struct runner_job *rj;
	int ret = jobs_get(c->jq, id, &j);

	if (ret == -ENOENT)
		return daemon_end(c, ret, "no job %" PRId64, id);
	if (ret)
		return daemon_end(c, ret, NULL);
	rj = j.state == JOBS_RUNNING ? daemon_find(c->d, id) : NULL;
	daemon_row(c, "row");
	daemon_job_fields(&c->out, &j, rj);
	runner_put(rj);
	jobs_job_release(&j);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_end(c, 0, NULL);
}

/* Stream progress of job id until it is final. */
static int daemon_watch(struct daemon_conn *c, int64_t id)
{
	struct runner_job *rj = NULL;
	struct jobs_job j = { 0 };
	int ret;

	for (;;) {
		struct timespec ts = { 0, 500 * 1000 * 1000 };

		ret = jobs_get(c->jq, id, &j);
		if (ret == -ENOENT)
			return daemon_end(c, ret, "no job %" PRId64, id);
		if (ret)
			return daemon_end(c, ret, NULL);
		if (jobs_state_final(j.state)) {
			if (!rj)
				rj = daemon_find(c->d, id);
			break;
		}
		if (j.state == JOBS_RUNNING && !rj)
			rj = daemon_find(c->d, id);
		if (rj && atomic_load(&rj->finished)) {
			jobs_job_release(&j);
			continue; /* its final state is in the catalog */
		}
		daemon_row(c, "progress");
		daemon_job_fields(&c->out, &j, rj);
		jobs_job_release(&j);
		ret = proto_send(c->fd, &c->out);
		if (ret)
			goto out;
		if (rj) {
			/* Next row in half a second, or at once when the job
			 * ends. */
			struct timespec dl;

			clock_gettime(CLOCK_REALTIME, &dl);
			dl.tv_nsec += ts.tv_nsec;
			if (dl.tv_nsec >= 1000000000L) {
				dl.tv_sec++;
				dl.tv_nsec -= 1000000000L;
			}
			pthread_mutex_lock(&rj->lock);
			if (!atomic_load(&rj->finished))
				pthread_cond_timedwait(&rj->cond, &rj->lock,
						       &dl);
			pthread_mutex_unlock(&rj->lock);
		} else {
			nanosleep(&ts, NULL);
		}
	}
	if (rj) {
		pthread_mutex_lock(&rj->lock);
		for (size_t i = 0; i < rj->n_mm && !ret; i++) {
			daemon_row(c, "mismatch");
			proto_add(&c->out, "key", rj->mm[i].key);
			proto_add(&c->out, "expected", rj->mm[i].expected);
			proto_add(&c->out, "actual", rj->mm[i].actual);
			ret = proto_send(c->fd, &c->out);
		}
		pthread_mutex_unlock(&rj->lock);
	}
	daemon_row(c, "row");
	daemon_job_fields(&c->out, &j, NULL);
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
		ret = daemon_end(c, 0, NULL);
out:
	runner_put(rj);
	return ret;
}

/* ---- mutations ---- */

static int daemon_register(struct daemon_conn *c, const char *name,
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
static int daemon_register_failed(struct daemon_conn *c, const char *what,
				  const char *name, const char *url,
				  const char *sums_key, int err)
{
	if (err == -ENODATA)
		return daemon_end(c, err,
				  "%s %s: manifest key %s not found at %s "
				  "(--manifest names a key relative to the "
				  "dataset's URL)",
				  what, name, sums_key, url);
	return daemon_end(c, err, "%s %s from %s: %s", what, name, url,
			  strerror(-err));
}

static int daemon_add(struct daemon_conn *c, const char *name)
{
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
		return daemon_end(c, -EINVAL, "add: no URL");
	if (manifest && keypath_check(manifest, strlen(manifest), &why))
		return daemon_end(c, -EINVAL,
				  "--manifest '%s': not a key under the "
				  "dataset's URL: %s",
				  keypath_printable(manifest, strlen(manifest),
						    buf, sizeof(buf)),
				  why);
	ret = catalog_dataset_add(c->cat, name, url,
				  group && *group ? group : NULL);
	if (ret == -EEXIST)
		return daemon_end(c, ret, "a dataset named %s exists", name);
	if (ret == -EINVAL)
		return daemon_end(c, ret, "bad dataset name '%s'", name);
	if (ret)
		return daemon_end(c, ret, NULL);
	if (manifest)
		ret = catalog_dataset_set_sums_key(c->cat, name, manifest);
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
		ret = daemon_register(c, name, url);
	if (ret) {
		int r2 = catalog_dataset_remove(c->cat, name);

		if (r2)
			log_warn("add %s: removing it again: %s", name,
				 strerror(-r2));
		return daemon_register_failed(
			c, "registering", name, url,
			manifest ? manifest : CATALOG_SUMS_KEY_DEFAULT, ret);
	}
	daemon_audit(c, "dataset.add", name, url);
	ret = catalog_dataset_get(c->cat, name, &ds);
	if (!ret) {
		daemon_row(c, "row");
		daemon_ds_fields(&c->out, &ds);
		catalog_dataset_release(&ds);
		ret = proto_send(c->fd, &c->out);
	}
	return ret ? ret : daemon_end(c, 0, NULL);
}

static int daemon_refresh(struct daemon_conn *c, const char *name)
{
	struct catalog_dataset ds = { 0 };
	int ret = catalog_dataset_get(c->cat, name, &ds);

	if (ret == -ENOENT)
		return daemon_end(c, ret, "no dataset named %s", name);
	if (ret)
		return daemon_end(c, ret, "refreshing %s: %s", name,
				  strerror(-ret));
	ret = daemon_register(c, name, ds.source);
	if (ret) {
		ret = daemon_register_failed(c, "refreshing", name, ds.source,
					     ds.sums_key, ret);
		goto out;
	}
	daemon_audit(c, "dataset.refresh", name, NULL);
	catalog_dataset_release(&ds);
	ret = catalog_dataset_get(c->cat, name, &ds);
	if (!ret) {
		daemon_row(c, "row");
		daemon_ds_fields(&c->out, &ds);
		ret = proto_send(c->fd, &c->out);
	}
	if (!ret)
		ret = daemon_end(c, 0, NULL);
out:
	catalog_dataset_release(&ds);
	return ret;
}

struct daemon_drop {
	struct cache *cache;
	struct objstore *os;
	const char *dataset;
};

static int daemon_drop_cb(void *arg, const char *path,
			  const struct catalog_entry *e)
{
	struct daemon_drop *dr = arg;
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

static int daemon_remove(struct daemon_conn *c, const char *name)
{
	struct daemon *d = c->d;
	struct catalog_dataset ds = { 0 };
	struct daemon_drop dr = { .cache = d->env.cache, .dataset = name };
	int ret = catalog_dataset_get(c->cat, name, &ds);

	if (ret == -ENOENT)
		return daemon_end(c, ret, "no dataset named %s", name);
	if (ret)
		return daemon_end(c, ret, NULL);
	/* stop its running jobs; queued ones fail when claimed */
	pthread_mutex_lock(&d->lock);
	for (unsigned i = 0; i < DAEMON_MAX_JOBS; i++)
		if (d->used[i] && !strcmp(d->running[i]->dataset, name)) {
			jobs_cancel(c->jq, d->running[i]->id, NULL);
			atomic_store(&d->running[i]->cancel, true);
		}
	pthread_mutex_unlock(&d->lock);
	if (dr.cache) {
		if (objstore_open(ds.source, d->cfg, &dr.os))
			dr.os = NULL;
		runner_walk(c->cat, name, daemon_drop_cb, &dr);
		objstore_free(dr.os);
	}
	catalog_dataset_release(&ds);
	ret = catalog_dataset_remove(c->cat, name);
	if (ret)
		return daemon_end(c, ret, "removing %s: %s", name,
				  strerror(-ret));
	daemon_audit(c, "dataset.remove", name, NULL);
	return daemon_end(c, 0, NULL);
}

/* Queue a stage or verify job with the request's options. */
static int daemon_submit(struct daemon_conn *c, const char *kind,
			 const char *name)
{
	static const char *const keys[] = { "bandwidth", "parallel", "mode",
					    "repair",	 "fit",	     "files" };
	struct proto_buf args = { 0 };
	struct catalog_dataset ds = { 0 };
	int64_t id;
	int ret;

	ret = catalog_dataset_get(c->cat, name, &ds);
	if (ret == -ENOENT)
		return daemon_end(c, ret, "no dataset named %s", name);
	if (ret)
		return daemon_end(c, ret, NULL);
	if (ds.state != CATALOG_DS_READY) {
		catalog_dataset_release(&ds);
		return daemon_end(c, -ENOENT, "%s is not registered", name);
	}
	if (!strcmp(kind, "stage") && !proto_get(&c->msg, "fit")) {
		const char *files = proto_get(&c->msg, "files");
		uint64_t total = ds.bytes;

		if (files && *files) {
			uint64_t sum = 0;
			char *list = strdup(files), *save = NULL, *k;
			struct catalog_entry e;

			if (!list) {
				catalog_dataset_release(&ds);
				return daemon_end(c, -ENOMEM, NULL);
			}
			for (k = strtok_r(list, "\n", &save); k;
			     k = strtok_r(NULL, "\n", &save)) {
				ret = catalog_lookup(c->cat, name, k, &e);
				if (ret || e.is_dir) {
					ret = daemon_end(c, -ENOENT,
							 "%s: no file %s", name,
							 k);
					free(list);
					catalog_dataset_release(&ds);
					return ret;
				}
				sum += e.size;
			}
			free(list);
			total = sum;
		}
		if (total > c->d->cfg->cache_size) {
			char a[32], b[32];

			catalog_dataset_release(&ds);
			return daemon_end(
				c, -EFBIG,
				"%s is %s, larger than the cache (%s, "
				"cache.size): stage part of it with --files, "
				"or add --fit to stage what fits",
				name, stager_bytes(total, a, sizeof(a)),
				stager_bytes(c->d->cfg->cache_size, b,
					     sizeof(b)));
		}
	}
	catalog_dataset_release(&ds);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		const char *v = proto_get(&c->msg, keys[i]);

		if (v)
			proto_add(&args, keys[i], v);
	}
	ret = args.err;
	if (!ret && args.data)
		args.data[args.len] = '\0'; /* proto_buf keeps room for it */
	if (!ret)
		ret = jobs_submit(c->jq, kind, name, args.data, &id);
	proto_free(&args);
	if (ret)
		return daemon_end(c, ret, "queueing the %s job: %s", kind,
				  strerror(-ret));
	daemon_audit(c, kind, name, NULL);
	daemon_wake(c->d);
	daemon_row(c, "row");
	proto_add_i64(&c->out, "job", id);
	proto_add(&c->out, "kind", kind);
	proto_add(&c->out, "dataset", name);
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_end(c, 0, NULL);
}

static int daemon_cancel(struct daemon_conn *c, int64_t id)
{
	struct runner_job *rj;
	enum jobs_state was;
	int ret = jobs_cancel(c->jq, id, &was);
	char sid[24];

	if (ret == -ENOENT)
		return daemon_end(c, ret, "no job %" PRId64, id);
	if (ret == -EALREADY)
		return daemon_end(c, ret, "job %" PRId64 " already %s", id,
				  jobs_state_name(was));
	if (ret)
		return daemon_end(c, ret, NULL);
	rj = daemon_find(c->d, id);
	if (rj)
		atomic_store(&rj->cancel, true);
	runner_put(rj);
	snprintf(sid, sizeof(sid), "%" PRId64, id);
	daemon_audit(c, "job.cancel", sid, jobs_state_name(was));
	return daemon_end(c, 0, NULL);
}

/* ---- connections ---- */

static bool daemon_mutation(const char *cmd)
{
	static const char *const ro[] = { "ping", "list",   "show",
					  "jobs", "status", "watch" };

	for (size_t i = 0; i < sizeof(ro) / sizeof(ro[0]); i++)
		if (!strcmp(cmd, ro[i]))
			return false;
	return true;
}

static int daemon_request(struct daemon_conn *c)
{
	const char *cmd = proto_get(&c->msg, "cmd");
	const char *name = proto_get(&c->msg, "name");
	int64_t id = 0;
	bool has_id = !proto_get_i64(&c->msg, "job", &id);

	if (!cmd)
		return daemon_end(c, -EINVAL, "no cmd in the request");
	if (daemon_mutation(cmd) && !c->admin)
		return daemon_end(
			c, -EPERM,
			"permission denied: '%s' changes the node's "
			"state and is allowed only to root and to "
			"members of group '%s' (you are uid %u%s%s%s)",
			cmd, c->d->cfg->daemon_admin_group, (unsigned)c->uid,
			c->user[0] ? " (" : "", c->user, c->user[0] ? ")" : "");
	if (!strcmp(cmd, "ping"))
		return daemon_end(c, 0, "stager daemon, pid %d", (int)getpid());
	if (!strcmp(cmd, "list"))
		return daemon_list(c);
	if (!strcmp(cmd, "jobs") || (!strcmp(cmd, "status") && !has_id))
		return daemon_jobs(c);
	if (!strcmp(cmd, "status"))
		return daemon_status(c, id);
	if (!strcmp(cmd, "watch") && has_id)
		return daemon_watch(c, id);
	if (!strcmp(cmd, "cancel") && has_id)
		return daemon_cancel(c, id);
	if (!name)
		return daemon_end(c, -EINVAL, "%s: no name or job", cmd);
	if (!strcmp(cmd, "show"))
		return daemon_show(c, name);
	if (!strcmp(cmd, "add"))
		return daemon_add(c, name);
	if (!strcmp(cmd, "refresh"))
		return daemon_refresh(c, name);
	if (!strcmp(cmd, "remove"))
		return daemon_remove(c, name);
	if (!strcmp(cmd, "stage") || !strcmp(cmd, "verify"))
		return daemon_submit(c, cmd, name);
	return daemon_end(c, -EINVAL, "unknown request '%s'", cmd);
}

static void *daemon_conn_thread(void *arg)
{
	struct daemon_conn *c = arg;
	struct ucred cr;
	socklen_t len = sizeof(cr);
	struct passwd pw, *pwp = NULL;
	char pwbuf[4096];
	int ret;

	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
		log_error("SO_PEERCRED: %s", strerror(errno));
		goto out;
	}
	c->uid = cr.uid;
	c->gid = cr.gid;
	c->pid = cr.pid;
	if (!getpwuid_r(c->uid, &pw, pwbuf, sizeof(pwbuf), &pwp) && pwp)
		snprintf(c->user, sizeof(c->user), "%s", pw.pw_name);
	c->admin = daemon_in_group(c);
	ret = catalog_open(c->d->cfg->catalog_path, 0, &c->cat);
	if (!ret)
		ret = jobs_open(c->d->cfg->catalog_path, &c->jq);
	if (ret) {
		daemon_end(c, ret, "the daemon cannot open its catalog: %s",
			   strerror(-ret));
		goto out;
	}
	proto_reader_init(&c->in, c->fd);
	for (;;) {
		ret = proto_read(&c->in, &c->msg);
		if (ret == -EINVAL || ret == -E2BIG) {
			daemon_end(c, ret, "malformed request");
			break;
		}
		if (ret)
			break;
		log_debug("uid %u: %s", (unsigned)c->uid,
			  proto_get(&c->msg, "cmd") ?: "?");
		if (daemon_request(c))
			break;
	}
out:
	jobs_close(c->jq);
	catalog_close(c->cat);
	proto_free(&c->out);
	close(c->fd);
	free(c);
	return NULL;
}

static void *daemon_accept_thread(void *arg)
{
	struct daemon *d = arg;
	pthread_attr_t attr;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	while (!atomic_load(&d->stop)) {
		int fd = accept4(d->lfd, NULL, NULL, SOCK_CLOEXEC);
		struct daemon_conn *c;
		pthread_t t;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (!atomic_load(&d->stop))
				log_error("accept: %s", strerror(errno));
			break;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		c->d = d;
		c->fd = fd;
		if (pthread_create(&t, &attr, daemon_conn_thread, c)) {
			close(fd);
			free(c);
		}
	}
	pthread_attr_destroy(&attr);
	return NULL;
}

static void *daemon_job_thread(void *arg)
{
	struct daemon_jobarg *a = arg;
	struct daemon *d = a->d;

	struct runner_job *old;

	runner_run(&d->env, a->rj, &a->j);
	pthread_mutex_lock(&d->lock);
	d->used[a->slot] = false;
	d->running[a->slot] = NULL;
	d->n_running--;
	/* the running list's reference moves to the recent ring */
	old = d->recent[d->recent_next];
	d->recent[d->recent_next] = a->rj;
	d->recent_next = (d->recent_next + 1) % DAEMON_RECENT;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	runner_put(old);
	jobs_job_release(&a->j);
	free(a);
	return NULL;
}

static void *daemon_dispatch_thread(void *arg)
{
	struct daemon *d = arg;
	struct jobs *jq = NULL;
	int ret = jobs_open(d->cfg->catalog_path, &jq);

	if (ret) {
		log_error("dispatcher: cannot open the catalog: %s",
			  strerror(-ret));
		return NULL;
	}
	pthread_mutex_lock(&d->lock);
	while (!atomic_load(&d->stop)) {
		struct daemon_jobarg *a;
		struct timespec ts;
		unsigned slot = 0;

		if (d->n_running < DAEMON_MAX_JOBS) {
			a = calloc(1, sizeof(*a));
			pthread_mutex_unlock(&d->lock);
			ret = a ? jobs_claim(jq, &a->j) : -ENOMEM;
			pthread_mutex_lock(&d->lock);
			if (!ret) {
				a->d = d;
				a->rj = calloc(1, sizeof(*a->rj));
				ret = a->rj ? 0 : -ENOMEM;
			}
			if (!ret) {
				struct runner_job *rj = a->rj;

				rj->id = a->j.id;
				snprintf(rj->kind, sizeof(rj->kind), "%s",
					 a->j.kind);
				snprintf(rj->dataset, sizeof(rj->dataset), "%s",
					 a->j.dataset);
				rj->created = a->j.created;
				rj->started = stager_now();
				pthread_mutex_init(&rj->lock, NULL);
				pthread_cond_init(&rj->cond, NULL);
				atomic_store(&rj->refs, 2);
				while (d->used[slot])
					slot++;
				a->slot = slot;
				d->used[slot] = true;
				d->running[slot] = rj;
				d->n_running++;
				if (pthread_create(&d->threads[slot], NULL,
						   daemon_job_thread, a)) {
					log_error("cannot start job %" PRId64,
						  rj->id);
					d->used[slot] = false;
					d->n_running--;
					runner_put(rj);
					runner_put(rj);
					jobs_job_release(&a->j);
					free(a);
				}
				continue;
			}
			if (a) {
				if (ret != -ENOENT)
					jobs_job_release(&a->j);
				free(a);
			}
			if (ret && ret != -ENOENT && ret != -EBUSY)
				log_error("claiming a job: %s", strerror(-ret));
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&d->cond, &d->lock, &ts);
	}
	/* stopping: tell the jobs, wait for them */
	for (unsigned i = 0; i < DAEMON_MAX_JOBS; i++)
		if (d->used[i])
			atomic_store(&d->running[i]->cancel, true);
	for (unsigned i = 0; i < DAEMON_MAX_JOBS; i++) {
		pthread_t t;

		if (!d->used[i])
			continue;
		t = d->threads[i];
		pthread_mutex_unlock(&d->lock);
		pthread_join(t, NULL);
		pthread_mutex_lock(&d->lock);
	}
	pthread_mutex_unlock(&d->lock);
	jobs_close(jq);
	return NULL;
}

static int daemon_listen(struct daemon *d)
{
	const char *path = d->cfg->daemon_socket;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char lockpath[sizeof(sa.sun_path) + 8], dir[sizeof(sa.sun_path)];
	char *slash;
	int ret;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_error("daemon.socket %s: longer than %zu bytes", path,
			  sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = '\0';
		if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
			ret = -errno;
			log_error("creating %s: %s", dir, strerror(errno));
			return ret;
		}
	}
	snprintf(lockpath, sizeof(lockpath), "%s.lock", path);
	d->lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (d->lockfd < 0) {
		ret = -errno;
		log_error("%s: %s", lockpath, strerror(errno));
		return ret;
	}
	if (flock(d->lockfd, LOCK_EX | LOCK_NB) < 0) {
		log_error("another stager daemon holds %s: it is already "
			  "running on %s",
			  lockpath, path);
		return -EADDRINUSE;
	}
	unlink(path);
	d->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (d->lfd < 0)
		return -errno;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (bind(d->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    chmod(path, 0666) < 0 || listen(d->lfd, 64) < 0) {
		ret = -errno;
		log_error("listening on %s: %s", path, strerror(errno));
		return ret;
	}
	return 0;
}

int daemon_main(const struct dstage_config *cfg)
{
	struct daemon d = { .cfg = cfg, .lfd = -1, .lockfd = -1 };
	struct catalog *cat = NULL;
	struct jobs *jq = NULL;
	struct cachepol *pol = NULL; /* kept with the cache: see out */
	pthread_t acc, disp;
	bool acc_started = false, disp_started = false;
	unsigned requeued = 0;
	sigset_t set;
	int sig, ret;

	pthread_mutex_init(&d.lock, NULL);
	pthread_cond_init(&d.cond, NULL);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	d.env.cfg = cfg;
	ret = catalog_open(cfg->catalog_path, CATALOG_CREATE, &cat);
	if (ret) {
		log_error("cannot open the catalog %s: %s", cfg->catalog_path,
			  strerror(-ret));
		goto out;
	}
	ret = jobs_open(cfg->catalog_path, &jq);
	if (!ret)
		ret = daemon_listen(&d);
	if (!ret)
		ret = jobs_recover(jq, &requeued);
	if (ret)
		goto out;
	if (requeued)
		log_info("resuming %u job(s) interrupted by a crash or stop",
			 requeued);
	ret = cachepol_open(cfg, &pol);
	if (!ret)
		ret = cache_open(cfg, cachepol_source(pol), &d.env.cache);
	if (ret) {
		log_error("the cache %s cannot be opened (%s): stage and "
			  "verify --cache will fail until it can",
			  cfg->cache_dir, strerror(-ret));
		d.env.cache = NULL;
	}
	ret = sched_create(cfg->s3_max_inflight, &d.env.sched);
	if (ret)
		goto out;
	if (pthread_create(&acc, NULL, daemon_accept_thread, &d)) {
		ret = -EAGAIN;
		goto out;
	}
	acc_started = true;
	if (pthread_create(&disp, NULL, daemon_dispatch_thread, &d)) {
		ret = -EAGAIN;
		goto out;
	}
	disp_started = true;
	log_info("stager daemon listening on %s (catalog %s, cache %s)",
		 cfg->daemon_socket, cfg->catalog_path, cfg->cache_dir);
	do {
		sig = 0;
		sigwait(&set, &sig);
	} while (sig == SIGHUP);
	log_info("signal %d: stopping; running jobs resume at the next start",
		 sig);
	ret = 0;
out:
	atomic_store(&d.stop, true);
	if (d.lfd >= 0)
		shutdown(d.lfd, SHUT_RDWR);
	daemon_wake(&d);
	if (acc_started)
		pthread_join(acc, NULL);
	if (disp_started)
		pthread_join(disp, NULL);
	if (d.lfd >= 0) {
		close(d.lfd);
		unlink(cfg->daemon_socket);
	}
	if (d.lockfd >= 0)
		close(d.lockfd);
	/* connection threads may still use the cache: exit without closing
	 * it; the kernel releases its locks and files. */
	sched_destroy(ret ? d.env.sched : NULL);
	jobs_close(jq);
	catalog_close(cat);
	return ret ? STAGER_EXIT_FAIL : STAGER_EXIT_OK;
}
