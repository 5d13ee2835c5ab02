// SPDX-License-Identifier: MIT
/*
 * runner: runs one stage or verify job, claimed by the daemon.
 * (runner_report.c keeps what the job found and writes its final message;
 * runner_i.h is what the two share.)
 *
 * Life of a job here: load the file list from the catalog (the --files
 * list, or the whole current manifest), check it fits the cache (stage),
 * start the workers, publish progress to the catalog every second until the
 * workers are done, then record done/failed with a message.
 *
 * Workers take files in order from a shared atomic index and read each file
 * front to back in chunks: through the cache (cache_read_iov: present blocks
 * are read locally, missing ones fetched and stored; bytes that just landed
 * are hashed in place, without a copy) or from the source
 * (objstore_get with If-Match on the manifest's ETag). Each chunk is read
 * while holding a slot of the daemon's scheduler (sched.c: priorities and
 * bandwidth caps), and hashed (SHA-256, OpenSSL EVP) as it arrives. The
 * hash is compared to the expected one (from the dataset's sums key,
 * SHA256SUMS unless add --manifest chose another) or, without one, to the
 * one recorded at staging, and recorded with catalog_object_set_actual.
 *
 * Resuming after a crash: the job is claimed again from the start. Blocks
 * already present are not fetched again (the cache keeps them); a file whose
 * hash was recorded since the job was created and whose blocks are all
 * present is skipped without reading it.
 *
 * Stopping: a cancel (from the catalog) or the daemon's stop sets
 * rj->cancel; workers check it before each chunk. A worker blocked inside
 * one read (a stalled store, a hung NFS server) is waited for at most
 * RUNNER_STOP_GRACE_S seconds: then the job ends without it (logged), the
 * worker is detached, and the context it uses stays alive until the last
 * worker lets go of it (refs). So neither a cancel nor SIGTERM waits on a
 * read for ever.
 *
 * Shared state: struct runner_ctx (on the heap, refcounted: the job's thread
 * and each worker hold a reference; the last one frees it, with the store,
 * the catalog connection and a reference to rj) belongs to the job; its
 * counters are atomics; cat (one catalog connection) is used under cat_lock by workers
 * recording hashes; the mismatch list and error text are in the
 * runner_job under rj->lock. Lock order: cat_lock, then rj->lock.
 * run_lock (a leaf) and run_cv let the job's thread sleep until a worker
 * ends; rj->lock and rj->cond tell watchers the job finished.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dstage/cache.h"
#include "dstage/catalog.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/sha256.h"
#include "dstage/sharedtier.h"
#include "dstage/timeutil.h"
#include "runner_i.h"

#define RUNNER_CHUNK (8u << 20)
#define RUNNER_MIN_CHUNK (256u << 10)
#define RUNNER_MAX_WORKERS 64
#define RUNNER_STOP_GRACE_S 5 /* wait for blocked workers after a stop */

void runner_put(struct runner_job *rj)
{
	if (!rj || atomic_fetch_sub(&rj->refs, 1) != 1)
		return;
	for (size_t i = 0; i < rj->n_mm; i++) {
		free(rj->mm[i].key);
		free(rj->mm[i].path);
	}
	free(rj->mm);
	pthread_mutex_destroy(&rj->lock);
	pthread_cond_destroy(&rj->cond);
	free(rj);
}

static int runner_add(struct runner_ctx *c, const char *key,
		      const struct catalog_entry *e)
{
	struct runner_file *f;

	if (GROW_ONE(c->files, c->n, c->cap, 256))
		return -ENOMEM;
	f = &c->files[c->n];
	memset(f, 0, sizeof(*f));
	f->key = strdup(key);
	if (!f->key)
		return -ENOMEM;
	f->id = e->id;
	f->size = e->size;
	snprintf(f->etag, sizeof(f->etag), "%s", e->etag);
	f->has_exp = e->has_expected;
	f->has_act = e->has_actual;
	memcpy(f->exp, e->expected_sha256, 32);
	memcpy(f->act, e->actual_sha256, 32);
	f->verified_at = e->verified_at;
	c->n++;
	return 0;
}

/* Directory walk: pending directories, depth first. */
struct runner_walk {
	const char *dir;
	char **dirs;
	size_t n, cap;
	runner_file_cb cb;
	void *arg;
};

static char *runner_join(const char *dir, const char *name)
{
	char *p = NULL;

	if (asprintf(&p, "%s%s%s", dir, *dir ? "/" : "", name) < 0)
		return NULL;
	return p;
}

static int runner_walk_cb(void *arg, const char *name,
			  const struct catalog_entry *e)
{
	struct runner_walk *w = arg;
	char *path = runner_join(w->dir, name);
	int ret = 0;

	if (!path)
		return -ENOMEM;
	if (!e->is_dir) {
		ret = w->cb(w->arg, path, e);
		free(path);
		return ret;
	}
	if (GROW_ONE(w->dirs, w->n, w->cap, 64)) {
		free(path);
		return -ENOMEM;
	}
	w->dirs[w->n++] = path;
	return 0;
}

int runner_walk(struct catalog *cat, const char *dataset, runner_file_cb cb,
		void *arg)
{
	struct runner_walk w = { .cb = cb, .arg = arg };
	char *dir = strdup("");
	int ret = 0;

	if (!dir)
		return -ENOMEM;
	while (dir) {
		w.dir = dir;
		ret = catalog_readdir(cat, dataset, dir, NULL, runner_walk_cb,
				      &w);
		free(dir);
		dir = NULL;
		if (ret)
			break;
		if (w.n)
			dir = w.dirs[--w.n];
	}
	while (w.n)
		free(w.dirs[--w.n]);
	free(w.dirs);
	return ret;
}

static int runner_add_cb(void *arg, const char *path,
			 const struct catalog_entry *e)
{
	return runner_add(arg, path, e);
}

static int runner_load_all(struct runner_ctx *c)
{
	return runner_walk(c->cat, c->rj->dataset, runner_add_cb, c);
}

static int runner_load_list(struct runner_ctx *c)
{
	char *save = NULL, *key;
	struct catalog_entry e;
	int ret;

	for (key = strtok_r(c->files_arg, "\n", &save); key;
	     key = strtok_r(NULL, "\n", &save)) {
		if (!*key)
			continue;
		ret = catalog_lookup(c->cat, c->rj->dataset, key, &e);
		if (ret == -ENOENT || (!ret && e.is_dir)) {
			runner_error(c, "%s: no such file in the dataset", key);
			return -ENOENT;
		}
		if (ret)
			return ret;
		ret = runner_add(c, key, &e);
		if (ret)
			return ret;
	}
	return 0;
}

/* SHA-256 over the bytes cache_read_iov hands out. */
struct runner_digest {
	struct sha256 *md;
	size_t bytes;
};

static int runner_digest_iov(void *arg, const struct iovec *iov, int n)
{
	struct runner_digest *d = arg;

	for (int i = 0; i < n; i++) {
		if (sha256_update(d->md, iov[i].iov_base, iov[i].iov_len))
			return -ENOMEM;
		d->bytes += iov[i].iov_len;
	}
	return 0;
}

/* Read the whole file in chunks and hash it. */
static int runner_hash(struct runner_ctx *c, const struct runner_file *f,
		       void *buf, unsigned char out[32])
{
	struct runner_job *rj = c->rj;
	struct sha256 md = { 0 };
	struct cache_object o;
	uint64_t off = 0;
	int ret;

	runner_obj(c, f, &o);
	ret = sha256_init(&md);
	if (ret)
		goto out;
	while (off < f->size) {
		size_t len =
			f->size - off < c->chunk ? f->size - off : c->chunk;
		size_t got = 0;

		if (atomic_load(&rj->cancel)) {
			ret = -ECANCELED;
			goto out;
		}
		sched_acquire(c->env->sched, c->sj, len);
		if (c->cache_mode) {
			/* Hashed where the bytes are: landed fills and
			 * direct reads of present blocks need no copy into
			 * buf; the workers are the parallelism. */
			struct runner_digest d = { .md = &md };

			/* A stage fills the whole file: its room on disk in
			 * one piece (CACHE_READ_WHOLE). */
			ret = cache_read_iov(
				c->env->cache, &o, off, len, buf,
				CACHE_READ_DIRECT |
					(c->stage ? CACHE_READ_WHOLE : 0),
				runner_digest_iov, &d);
			got = d.bytes;
		} else {
			ret = objstore_get(c->os, f->key, off, len,
					   f->etag[0] ? f->etag : NULL, buf,
					   &got);
			if (!ret)
				sha256_update(&md, buf, got);
		}
		sched_release(c->env->sched);
		if (ret)
			goto out;
		if (got == 0) {
			ret = -EIO; /* shorter than the manifest says */
			goto out;
		}
		off += got;
		atomic_fetch_add(&rj->bytes_done, got);
	}
	if (sha256_final(&md, out))
		ret = -EIO;
out:
	sha256_release(&md);
	return ret;
}

static int runner_record(struct runner_ctx *c, const struct runner_file *f,
			 const unsigned char got[32])
{
	int ret;

	pthread_mutex_lock(&c->cat_lock);
	ret = catalog_object_set_actual(c->cat, f->id, got,
					(int64_t)time(NULL));
	pthread_mutex_unlock(&c->cat_lock);
	return ret;
}

/* true when the cache holds all of the file. */
static bool runner_present(struct runner_ctx *c, const struct runner_file *f)
{
	struct cache_object o;
	uint64_t have = 0;

	runner_obj(c, f, &o);
	return cache_object_present(c->env->cache, &o, &have) == 0 &&
	       have >= f->size;
}

static void runner_file(struct runner_ctx *c, struct runner_file *f, void *buf)
{
	struct runner_job *rj = c->rj;
	const unsigned char *ref = NULL;
	unsigned char got[32];
	bool match;
	int ret;

	if (c->stage && f->has_act && f->verified_at >= rj->created &&
	    (!f->has_exp || !memcmp(f->exp, f->act, 32)) &&
	    runner_present(c, f)) {
		atomic_fetch_add(&rj->bytes_done, f->size);
		return; /* done before a restart */
	}
	if (!c->stage && c->cache_mode && !runner_check(c, f)) {
		atomic_fetch_add(&rj->bytes_done, f->size);
		return; /* reported: not read */
	}
	log_cause_clear(); /* this file's own cause, for its error */
	ret = runner_hash(c, f, buf, got);
	if (ret && ret != -ECANCELED && ret != -ESTALE && c->cache_mode) {
		/* Which side failed: a cache.dir removed under the daemon
		 * fails every open of a cache file (ENOENT, like an object
		 * gone at the source). Recreate it and read the file again. */
		int r = cache_dir_recover(c->env->cache);

		if (r == 1)
			atomic_store(&c->cache_recreated, true);
		if (r < 0) {
			atomic_fetch_add(&c->errors, 1);
			runner_error(c,
				     "%s: the cache failed, not the source: "
				     "cache.dir %s is damaged and cannot be "
				     "recreated (%s; see the daemon's log)",
				     f->key, c->env->cfg->cache_dir,
				     strerror(-r));
			return;
		}
		if (r == 1 || atomic_load(&c->cache_recreated)) {
			atomic_fetch_add(&rj->bytes_total, f->size);
			ret = runner_hash(c, f, buf, got);
		}
	}
	if (ret == -ECANCELED)
		return;
	if (ret) {
		atomic_fetch_add(&c->errors, 1);
		if (ret == -ESTALE)
			runner_error(
				c,
				"%s: changed at the source since the "
				"dataset was registered ('stager refresh')",
				f->key);
		else if (ret == -ENOENT)
			runner_error(c, "%s: not found at the source (%s)",
				     f->key, c->ds.source);
		else if (ret == -ENXIO && !c->os)
			runner_error(c,
				     "%s: a block must be fetched again, but "
				     "the source %s cannot be opened",
				     f->key, c->ds.source);
		else if (log_cause())
			/* what the store or the cache logged first: the
			 * transport error, the HTTP status and S3 code */
			runner_error(c, "%s: %s: %s", f->key, strerror(-ret),
				     log_cause());
		else
			runner_error(c, "%s: %s", f->key, strerror(-ret));
		return;
	}
	if (f->has_exp)
		ref = f->exp;
	else if (f->has_act)
		ref = f->act;
	match = ref && !memcmp(ref, got, 32);
	if (ref && !match && c->repair && c->cache_mode) {
		struct cache_object o;

		log_warn("job %" PRId64 ": %s: mismatch, dropping its cached "
			 "blocks and fetching it again",
			 rj->id, f->key);
		runner_obj(c, f, &o);
		ret = cache_object_drop(c->env->cache, &o);
		if (!ret)
			ret = runner_hash(c, f, buf, got);
		/* the file is read twice: so is its share of the total */
		atomic_fetch_add(&rj->bytes_total, f->size);
		if (ret) {
			atomic_fetch_add(&c->errors, 1);
			runner_error(c, "%s: repair: %s", f->key,
				     strerror(-ret));
			return;
		}
		match = !memcmp(ref, got, 32);
	}
	if (!ref)
		atomic_fetch_add(&c->unchecked, 1);
	/* Keep a staging hash as the reference for files with no expected
	 * one: replace it only by an equal one (a newer verified_at). */
	if (f->has_exp || !f->has_act || match) {
		ret = runner_record(c, f, got);
		if (ret) {
			atomic_fetch_add(&c->errors, 1);
			runner_error(c, "%s: recording its hash: %s", f->key,
				     strerror(-ret));
		}
	}
	if (ref && !match)
		runner_mismatch(c, f, ref, got);
	if (c->stage && c->env->cache && (!ref || match)) {
		/* Whole and sound: a passthrough open anywhere (a dstagefs
		 * started later) need not read its records again. */
		struct cache_object o;

		runner_obj(c, f, &o);
		(void)cache_object_mark_whole(c->env->cache, &o);
	}
	if (c->stage && c->env->cache && !runner_present(c, f)) {
		atomic_fetch_add(&c->errors, 1);
		if (cache_disk_full(c->env->cache))
			runner_error(c,
				     "%s: not kept in the cache: the file "
				     "system of cache.dir %s is full",
				     f->key, c->env->cfg->cache_dir);
		else
			runner_error(c,
				     "%s: not kept in the cache (full of "
				     "pinned or busy data?)",
				     f->key);
	}
}

/* Drop a reference to the context; the last one frees it. */
static void runner_ctx_put(struct runner_ctx *c)
{
	if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	sched_leave(c->env->sched, c->sj);
	for (size_t i = 0; i < c->n; i++)
		free(c->files[i].key);
	free(c->files);
	free(c->files_arg);
	objstore_free(c->os);
	catalog_dataset_release(&c->ds);
	catalog_close(c->cat);
	pthread_mutex_destroy(&c->cat_lock);
	pthread_mutex_destroy(&c->run_lock);
	pthread_cond_destroy(&c->run_cv);
	runner_put(c->rj);
	free(c);
}

static void *runner_worker(void *arg)
{
	struct runner_ctx *c = arg;
	void *buf = malloc(c->chunk);
	size_t i;

	if (!buf) {
		atomic_fetch_add(&c->errors, 1);
		runner_error(c, "out of memory");
		goto out;
	}
	while (!atomic_load(&c->rj->cancel) &&
	       (i = atomic_fetch_add(&c->next, 1)) < c->n) {
		runner_file(c, &c->files[i], buf);
		atomic_fetch_add(&c->rj->files_done, 1);
	}
out:
	free(buf);
	pthread_mutex_lock(&c->run_lock);
	c->running--;
	pthread_cond_signal(&c->run_cv);
	pthread_mutex_unlock(&c->run_lock);
	runner_ctx_put(c);
	return NULL;
}

static void runner_args(struct runner_ctx *c, const struct jobs_job *j)
{
	static struct proto_msg m;
	static pthread_mutex_t m_lock = PTHREAD_MUTEX_INITIALIZER;
	const char *mode, *files;
	uint64_t v;

	c->stage = strcmp(j->kind, "stage") == 0;
	pthread_mutex_lock(&m_lock);
	if (proto_parse(&m, j->args, strlen(j->args)))
		m.n = 0;
	if (!proto_get_u64(&m, "bandwidth", &v))
		c->rate = v;
	if (!proto_get_u64(&m, "parallel", &v) && v > 0)
		c->workers = v > RUNNER_MAX_WORKERS ? RUNNER_MAX_WORKERS
						    : (unsigned)v;
	mode = proto_get(&m, "mode");
	c->cache_mode = c->stage || !mode || strcmp(mode, "source") != 0;
	c->repair = proto_get(&m, "repair") != NULL;
	c->fit = proto_get(&m, "fit") != NULL;
	c->fetch_missing = proto_get(&m, "fetch_missing") != NULL;
	files = proto_get(&m, "files");
	if (files && *files)
		c->files_arg = strdup(files);
	pthread_mutex_unlock(&m_lock);
}

/* Pick the defaults left open and check the job can run. */
static int runner_prepare(struct runner_ctx *c)
{
	const struct dstage_config *cfg = c->env->cfg;
	uint64_t total = 0, room;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	char a[32], b[32];

	if (c->cache_mode && !c->env->cache) {
		runner_error(c,
			     "the cache (%s) is not available; see the "
			     "daemon's log",
			     cfg->cache_dir);
		return -ENXIO;
	}
	if (c->cache_mode) {
		/* cache.dir removed under the daemon: found (and recreated)
		 * once here, not as each file's cache file missing. */
		int r = cache_dir_recover(c->env->cache);

		if (r < 0) {
			runner_error(c,
				     "the cache failed, not the source: "
				     "cache.dir %s is damaged and cannot be "
				     "recreated (%s; see the daemon's log)",
				     cfg->cache_dir, strerror(-r));
			return r;
		}
		if (r == 1)
			atomic_store(&c->cache_recreated, true);
	}
	if (!c->workers) {
		if (c->cache_mode && !c->stage)
			c->workers = (unsigned)(cpus > 0 ? cpus : 1) * 2;
		else
			c->workers = cfg->s3_max_inflight;
	}
	if (c->workers > RUNNER_MAX_WORKERS)
		c->workers = RUNNER_MAX_WORKERS;
	if (!c->workers)
		c->workers = 1;
	c->chunk = RUNNER_CHUNK;
	if (c->rate && c->rate / 8 < c->chunk)
		c->chunk = c->rate / 8 < RUNNER_MIN_CHUNK ? RUNNER_MIN_CHUNK
							  : c->rate / 8;
	for (size_t i = 0; i < c->n; i++)
		total += c->files[i].size;
	if (c->stage) {
		room = cfg->cache_size / 100 * cfg->cache_high_watermark;
		if (total > cfg->cache_size && !c->fit) {
			runner_error(c,
				     "%s is %s, larger than the cache (%s, "
				     "cache.size); stage part of it with "
				     "--files, or --fit to stage what fits",
				     c->rj->dataset,
				     cli_bytes(total, a, sizeof(a)),
				     cli_bytes(cfg->cache_size, b, sizeof(b)));
			return -EFBIG;
		}
		if (total > room && c->fit) {
			uint64_t sum = 0;
			size_t k = 0;

			for (; k < c->n && sum + c->files[k].size <= room; k++)
				sum += c->files[k].size;
			log_info("job %" PRId64 ": --fit: staging %zu of %zu "
				 "files (%s)",
				 c->rj->id, k, c->n,
				 cli_bytes(sum, a, sizeof(a)));
			for (size_t i = k; i < c->n; i++)
				free(c->files[i].key);
			c->n = k;
			total = sum;
		}
	}
	atomic_store(&c->rj->bytes_total, total);
	atomic_store(&c->rj->files_total, c->n);
	return 0;
}

/*
 * Wait until every worker has ended, publishing progress (and reading a
 * cancel from the catalog) once a second. After a stop, wait at most
 * RUNNER_STOP_GRACE_S for workers blocked in a read. Returns the number of
 * workers still running (0: all ended).
 */
static unsigned runner_wait(struct runner_ctx *c, struct jobs *jq)
{
	struct runner_job *rj = c->rj;
	int64_t stop_at = 0; /* timeutil_mono_ns; 0: no stop seen yet */
	unsigned left;

	for (;;) {
		struct timespec ts;

		timeutil_real_after_ms(&ts, 1000);
		pthread_mutex_lock(&c->run_lock);
		if (c->running)
			pthread_cond_timedwait(&c->run_cv, &c->run_lock, &ts);
		left = c->running;
		pthread_mutex_unlock(&c->run_lock);
		if (!left)
			return 0;
		if (atomic_load(&rj->cancel)) {
			int64_t now = timeutil_mono_ns();

			if (!stop_at) {
				stop_at = now + (int64_t)RUNNER_STOP_GRACE_S *
							1000000000;
			} else if (now >= stop_at) {
				log_error("job %" PRId64 ": %u worker(s) still "
					  "blocked in a read %d s after the "
					  "stop: the job ends without them",
					  rj->id, left, RUNNER_STOP_GRACE_S);
				return left;
			}
			continue;
		}
		if (jobs_progress(jq, rj->id, atomic_load(&rj->bytes_done),
				  atomic_load(&rj->bytes_total)) == -ECANCELED)
			atomic_store(&rj->cancel, true);
	}
}

void runner_run(const struct runner_env *env, struct runner_job *rj,
		const struct jobs_job *j)
{
	struct runner_ctx *c = calloc(1, sizeof(*c));
	pthread_t tids[RUNNER_MAX_WORKERS];
	struct jobs *jq = NULL;
	enum jobs_state st = JOBS_FAILED;
	char msg[JOBS_ERROR_MAX];
	unsigned started = 0, left = 0;
	int ret;

	if (!c) {
		/* The job stays running in the catalog: the next daemon
		 * resumes it. */
		log_error("job %" PRId64 ": out of memory", rj->id);
		pthread_mutex_lock(&rj->lock);
		rj->state = JOBS_FAILED;
		snprintf(rj->error, sizeof(rj->error), "out of memory");
		atomic_store(&rj->finished, true);
		pthread_cond_broadcast(&rj->cond);
		pthread_mutex_unlock(&rj->lock);
		return;
	}
	c->env = env;
	c->rj = rj;
	c->sums_key = CATALOG_SUMS_KEY_DEFAULT;
	atomic_fetch_add(&rj->refs, 1); /* dropped with the context */
	atomic_store(&c->refs, 1);
	pthread_mutex_init(&c->cat_lock, NULL);
	pthread_mutex_init(&c->run_lock, NULL);
	pthread_cond_init(&c->run_cv, NULL);
	runner_args(c, j);
	ret = jobs_open(env->cfg->catalog_path, &jq);
	if (!ret)
		ret = catalog_open(env->cfg->catalog_path, 0, &c->cat);
	if (ret) {
		runner_error(c, "opening the catalog: %s", strerror(-ret));
		goto finish;
	}
	ret = catalog_dataset_get(c->cat, rj->dataset, &c->ds);
	if (ret) {
		runner_error(c, "dataset %s: %s", rj->dataset,
			     ret == -ENOENT ? "removed" : strerror(-ret));
		goto finish;
	}
	c->sums_key = c->ds.sums_key;
	if (c->ds.state != CATALOG_DS_READY) {
		ret = -ENOENT;
		runner_error(c, "dataset %s is not registered yet",
			     rj->dataset);
		goto finish;
	}
	ret = objstore_open(c->ds.source, env->cfg, &c->os);
	if (ret && !c->stage && c->cache_mode && !c->repair &&
	    !c->fetch_missing) {
		/* verify --cache checks the node's own copy: it must work
		 * with the network or the source down (an incident). Nothing
		 * is fetched: what the cache lacks is reported. */
		log_warn("job %" PRId64 ": %s: the source %s cannot be opened "
			 "(%s): verifying the cache alone",
			 rj->id, rj->dataset, c->ds.source, strerror(-ret));
		c->os = NULL;
		ret = 0;
	} else if (ret) {
		runner_error(c, "opening %s: %s", c->ds.source, strerror(-ret));
		goto finish;
	}
	/* fills come from the shared tier first; verify --source reads the
	 * source itself */
	if (c->stage || c->cache_mode) {
		ret = sharedtier_wrap(c->cat, env->cfg, rj->dataset, &c->os);
		if (ret < 0) {
			runner_error(c, "opening the shared tier: %s",
				     strerror(-ret));
			goto finish;
		}
	}
	ret = c->files_arg ? runner_load_list(c) : runner_load_all(c);
	if (ret) {
		runner_error(c, "listing the manifest: %s", strerror(-ret));
		goto finish;
	}
	ret = runner_prepare(c);
	if (ret)
		goto finish;
	ret = sched_join(env->sched,
			 (unsigned)(j->priority > 0 ? j->priority + 1 : 1),
			 c->rate, &c->sj);
	if (ret)
		goto finish;
	log_info("job %" PRId64 ": %s %s: %zu files, %u workers%s", rj->id,
		 rj->kind, rj->dataset, c->n, c->workers,
		 c->cache_mode ? "" : ", from the source");
	c->running = c->workers;
	for (; started < c->workers; started++) {
		atomic_fetch_add(&c->refs, 1);
		if (pthread_create(&tids[started], NULL, runner_worker, c)) {
			atomic_fetch_sub(&c->refs, 1);
			pthread_mutex_lock(&c->run_lock);
			c->running -= c->workers - started;
			pthread_mutex_unlock(&c->run_lock);
			break;
		}
	}
	left = runner_wait(c, jq);
	for (unsigned i = 0; i < started; i++) {
		if (left)
			pthread_detach(tids[i]);
		else
			pthread_join(tids[i], NULL);
	}
	ret = 0;
finish:
	if (atomic_load(&rj->cancel)) {
		/* cancelled (the catalog says so already) or shutting down
		 * (the job stays running, for the next daemon to resume) */
		pthread_mutex_lock(&rj->lock);
		rj->state = JOBS_CANCELLED;
		snprintf(rj->error, sizeof(rj->error), "cancelled");
		pthread_mutex_unlock(&rj->lock);
		goto out;
	}
	runner_result(c, ret, &st, msg, sizeof(msg));
	if (jq) {
		struct jobs_counts k;

		jobs_progress(jq, rj->id, atomic_load(&rj->bytes_done),
			      atomic_load(&rj->bytes_total));
		runner_counts(c, &k);
		ret = jobs_finish_counts(jq, rj->id, st, msg,
					 c->stage ? NULL : &k);
		if (ret && ret != -ECANCELED)
			log_error("job %" PRId64 ": recording its end: %s",
				  rj->id, strerror(-ret));
	}
	log_info("job %" PRId64 ": %s: %s", rj->id, jobs_state_name(st), msg);
	pthread_mutex_lock(&rj->lock);
	rj->state = st;
	snprintf(rj->error, sizeof(rj->error), "%s", msg);
	pthread_mutex_unlock(&rj->lock);
out:
	jobs_close(jq);
	pthread_mutex_lock(&rj->lock);
	atomic_store(&rj->finished, true);
	pthread_cond_broadcast(&rj->cond);
	pthread_mutex_unlock(&rj->lock);
	/* Workers left behind hold their own references. */
	runner_ctx_put(c);
}
