// SPDX-License-Identifier: MIT
/*
 * runner_report: what a stage or verify job found, kept for its watchers
 * (rj->mm: SHA-256 mismatches, and for verify in the cache the damaged,
 * repaired, missing and fetched blocks) and its final message. Also the
 * check of a file's cached blocks before verify reads it (runner_check):
 * it never contacts the source.
 *
 * State: the entries live in the runner_job under rj->lock; the counts in
 * struct runner_ctx are atomics (see runner.c for the locks' order).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/cache.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/sha256.h"
#include "runner_i.h"

void runner_error(struct runner_ctx *c, const char *fmt, ...)
{
	struct runner_job *rj = c->rj;
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_error("job %" PRId64 " (%s %s): %s", rj->id, rj->kind, rj->dataset,
		  msg);
	pthread_mutex_lock(&rj->lock);
	if (!rj->error[0])
		snprintf(rj->error, sizeof(rj->error), "%s", msg);
	pthread_mutex_unlock(&rj->lock);
}

void runner_obj(const struct runner_ctx *c, const struct runner_file *f,
		struct cache_object *o)
{
	o->dataset = c->rj->dataset;
	o->os = c->os;
	o->key = f->key;
	o->etag = f->etag;
	o->size = f->size;
}

/* Add an entry to rj->mm (see struct runner_mismatch); best effort: on
 * no memory the entry is left out (the job's counts still have it). */
void runner_found(struct runner_ctx *c, const struct runner_file *f,
		  const struct runner_mismatch *src, const char *path)
{
	struct runner_job *rj = c->rj;
	struct runner_mismatch *m;

	pthread_mutex_lock(&rj->lock);
	if (src->kind && c->n_found >= RUNNER_FOUND_MAX) {
		c->n_unlisted++;
		goto out;
	}
	if (GROW_ONE(rj->mm, rj->n_mm, rj->cap_mm, 16))
		goto out;
	m = &rj->mm[rj->n_mm];
	*m = *src;
	m->key = strdup(f->key);
	m->path = path ? strdup(path) : NULL;
	if (!m->key || (path && !m->path)) {
		free(m->key);
		free(m->path);
		goto out;
	}
	rj->n_mm++;
	if (src->kind)
		c->n_found++;
out:
	pthread_mutex_unlock(&rj->lock);
}

void runner_mismatch(struct runner_ctx *c, const struct runner_file *f,
		     const unsigned char *ref, const unsigned char got[32])
{
	struct runner_job *rj = c->rj;
	struct runner_mismatch m = { .listed = ref == f->exp };

	if (ref)
		sha256_hex(ref, m.expected);
	sha256_hex(got, m.actual);
	log_warn("job %" PRId64 " (%s %s): %s: SHA-256 mismatch: expected %s,"
		 " got %s",
		 rj->id, rj->kind, rj->dataset, f->key, m.expected, m.actual);
	atomic_fetch_add(&c->mismatched, 1);
	runner_found(c, f, &m, NULL);
}

/* cache_object_check's report of one damaged block. */
struct runner_bad {
	struct runner_ctx *c;
	const struct runner_file *f;
};

static void runner_bad_block(void *arg, uint64_t block, const char *path)
{
	struct runner_bad *b = arg;
	struct runner_mismatch m = {
		.kind = b->c->repair ? "repaired" : "damaged",
		.block = block,
		.count = 1,
	};

	runner_found(b->c, b->f, &m, path);
}

/*
 * verify in the cache: check the file's present blocks against their
 * checksums without contacting the source, and report each damaged block
 * and the blocks missing. Returns true when the file is to be read and
 * hashed: all present and sound, or what is not is to be fetched
 * (--repair; --fetch-missing for missing blocks).
 */
bool runner_check(struct runner_ctx *c, const struct runner_file *f)
{
	struct runner_bad b = { c, f };
	struct cache_check chk = { .bad_fn = runner_bad_block, .arg = &b };
	struct cache_object o;
	uint64_t missing;
	int ret;

	runner_obj(c, f, &o);
	ret = cache_object_check(c->env->cache, &o, &chk);
	if (ret) {
		atomic_fetch_add(&c->errors, 1);
		runner_error(c,
			     "%s: reading its blocks in the cache (%s): %s; "
			     "the cache's side failed, not the source",
			     f->key, c->env->cfg->cache_dir, strerror(-ret));
		return false;
	}
	if (chk.bad) {
		atomic_fetch_add(&c->damaged, chk.bad);
		atomic_fetch_add(&c->damaged_files, 1);
	}
	missing = chk.blocks - chk.present;
	if (missing) {
		bool fetch = c->repair || c->fetch_missing;
		struct runner_mismatch m = {
			.kind = fetch ? "fetched" : "missing",
			.count = missing,
		};

		atomic_fetch_add(&c->missing, missing);
		atomic_fetch_add(&c->missing_files, 1);
		runner_found(c, f, &m, NULL);
		if (!fetch)
			return false;
	}
	return !chk.bad || c->repair;
}

/* verify in the cache: what it found there, for the final message
 * (rj->lock held). */
static size_t runner_found_msg(struct runner_ctx *c, char *msg, size_t len)
{
	uint64_t d = atomic_load(&c->damaged), m = atomic_load(&c->missing);
	size_t off = 0;

	if (d && off < len)
		off += (size_t)snprintf(
			msg + off, len - off,
			"%s %" PRIu64 " damaged block(s) in %" PRIu64
			" file(s)%s; ",
			c->repair ? "repaired" : "found", d,
			atomic_load(&c->damaged_files),
			c->repair ? ""
				  : " (not repaired: --repair fetches them "
				    "again)");
	if (m && off < len)
		off += (size_t)snprintf(
			msg + off, len - off,
			"%" PRIu64 " block(s) of %" PRIu64
			" file(s) missing from the cache%s; ",
			m, atomic_load(&c->missing_files),
			c->repair || c->fetch_missing
				? ", fetched"
				: " (not fetched: --fetch-missing fetches "
				  "them, or stage)");
	if (c->n_unlisted && off < len)
		off += (size_t)snprintf(msg + off, len - off,
					"only the first %d listed, %zu more "
					"not; ",
					RUNNER_FOUND_MAX, c->n_unlisted);
	return off < len ? off : len - 1;
}

void runner_counts(struct runner_ctx *c, struct jobs_counts *k)
{
	bool fetch = c->repair || c->fetch_missing;

	k->damaged = c->repair ? 0 : atomic_load(&c->damaged);
	k->repaired = c->repair ? atomic_load(&c->damaged) : 0;
	k->missing = fetch ? 0 : atomic_load(&c->missing);
	k->mismatched = atomic_load(&c->mismatched);
}

/* The job's final message. */
void runner_result(struct runner_ctx *c, int ret, enum jobs_state *st,
		   char *msg, size_t len)
{
	struct runner_job *rj = c->rj;
	uint64_t n_mm = atomic_load(&c->mismatched);
	bool unfixed =
		(atomic_load(&c->damaged) && !c->repair) ||
		(atomic_load(&c->missing) && !c->repair && !c->fetch_missing);
	size_t off = 0;

	pthread_mutex_lock(&rj->lock);
	if (!ret && !n_mm && !atomic_load(&c->errors) && !unfixed) {
		*st = JOBS_DONE;
		off = (size_t)snprintf(msg, len, "%zu files, all match", c->n);
		if (atomic_load(&c->unchecked))
			off = (size_t)snprintf(
				msg, len,
				"%zu files; %" PRIu64 " had no reference hash "
				"(no entry in %s, never staged): their "
				"hash is now recorded",
				c->n, atomic_load(&c->unchecked), c->sums_key);
		if (off + 2 < len &&
		    (atomic_load(&c->damaged) || atomic_load(&c->missing))) {
			memcpy(msg + off, "; ", 3);
			off += 2;
			off += runner_found_msg(c, msg + off, len - off);
			if (off >= 2 && !strcmp(msg + off - 2, "; "))
				msg[off - 2] = '\0';
		}
		goto out;
	}
	*st = JOBS_FAILED;
	msg[0] = '\0';
	off = runner_found_msg(c, msg, len);
	if (n_mm && off < len)
		off += (size_t)snprintf(
			msg + off, len - off,
			"%" PRIu64 " of %zu files do not match:", n_mm, c->n);
	for (size_t i = 0; i < rj->n_mm && off < len; i++) {
		const struct runner_mismatch *m = &rj->mm[i];

		if (m->kind)
			continue;
		off += (size_t)snprintf(
			msg + off, len - off,
			" %s (expected %s %s %s, actual %s);", m->key,
			m->expected[0] ? m->expected : "none",
			m->listed ? "in" : "as",
			m->listed ? c->sums_key : "staged", m->actual);
	}
	if (off < len && (atomic_load(&c->errors) || ret))
		off += (size_t)snprintf(
			msg + off, len - off, "%s%" PRIu64 " error(s): %.400s",
			off ? " " : "", atomic_load(&c->errors) + (ret ? 1 : 0),
			rj->error[0] ? rj->error : strerror(-ret));
	/* no trailing "; " */
	if (off < len && off >= 2 && !strcmp(msg + off - 2, "; "))
		msg[off - 2] = '\0';
out:
	if (atomic_load(&c->cache_recreated)) {
		size_t n = strlen(msg);

		snprintf(msg + n, len - n,
			 "%scache.dir %s had been removed under the daemon: "
			 "recreated empty",
			 n ? "; " : "", c->env->cfg->cache_dir);
	}
	pthread_mutex_unlock(&rj->lock);
}
