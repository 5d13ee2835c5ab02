// SPDX-License-Identifier: MIT
/*
 * ckpt_drill: restore a checkpoint from the checkpoint store into a scratch
 * directory and check every file against its recorded SHA-256 (see
 * include/dstage/ckpt_drill.h), and against this node's staging journal
 * (a file of it whose writer has not finished, or not yet published).
 * Stateless: one call, one store handle, nothing shared.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/ckpt_drill.h"
#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "dstage/sha256.h"
#include "dstage/timeutil.h"
#include "util/strutil.h"

#define DRILL_CHUNK (8u << 20)
#define DRILL_RECORDS_MAX (1u << 20) /* journal records looked at */

/* A candidate checkpoint: a name directly under "<job>/". */
struct drill_ckpt {
	char *name;
	int64_t step; /* -1: no number in the name */
	int64_t mtime; /* newest object */
};

struct drill_list {
	size_t plen; /* "<job>/" */
	struct drill_ckpt *v;
	size_t n, cap;
	/* collecting the objects of one checkpoint */
	char **keys;
	uint64_t *sizes;
	size_t nkeys, capkeys, capsizes;
	int err;
};

/* The last run of digits in name, or -1. */
static int64_t drill_step(const char *name)
{
	const char *end = NULL;

	for (const char *p = name; *p; p++)
		if (*p >= '0' && *p <= '9')
			end = p;
	if (!end)
		return -1;
	while (end > name && end[-1] >= '0' && end[-1] <= '9')
		end--;
	return strtoll(end, NULL, 10);
}

static int drill_ckpt_cb(void *arg, const struct objstore_info *oi)
{
	struct drill_list *l = arg;
	const char *rest = oi->key + l->plen, *slash = strchr(rest, '/');
	size_t len = slash ? (size_t)(slash - rest) : strlen(rest);
	struct drill_ckpt *c = l->n ? &l->v[l->n - 1] : NULL;

	if (c && strlen(c->name) == len && !memcmp(c->name, rest, len)) {
		if (oi->mtime > c->mtime)
			c->mtime = oi->mtime;
		return 0;
	}
	if (GROW_ONE(l->v, l->n, l->cap, 16))
		goto nomem;
	c = &l->v[l->n];
	c->name = strndup(rest, len);
	if (!c->name)
		goto nomem;
	c->step = drill_step(c->name);
	c->mtime = oi->mtime;
	l->n++;
	return 0;
nomem:
	l->err = -ENOMEM;
	return 1;
}

static int drill_key_cb(void *arg, const struct objstore_info *oi)
{
	struct drill_list *l = arg;

	if (GROW_ONE(l->keys, l->nkeys, l->capkeys, 64) ||
	    GROW_ONE(l->sizes, l->nkeys, l->capsizes, 64)) {
		l->err = -ENOMEM;
		return 1;
	}
	l->keys[l->nkeys] = strdup(oi->key);
	if (!l->keys[l->nkeys]) {
		l->err = -ENOMEM;
		return 1;
	}
	l->sizes[l->nkeys++] = oi->size;
	return 0;
}

/* The checkpoint to restore, or NULL. */
static const struct drill_ckpt *drill_pick(const struct drill_list *l,
					   const char *step)
{
	const struct drill_ckpt *best = NULL;
	bool numbered = false;

	for (size_t i = 0; i < l->n; i++)
		numbered = numbered || l->v[i].step >= 0;
	for (size_t i = 0; i < l->n; i++) {
		const struct drill_ckpt *c = &l->v[i];

		if (step) {
			char *end;
			long long s = strtoll(step, &end, 10);

			if (!strcmp(c->name, step) ||
			    (!*end && *step && c->step == s))
				return c;
			continue;
		}
		if (numbered ? c->step > (best ? best->step : -1)
			     : !best || c->mtime > best->mtime)
			best = c;
	}
	return best;
}

static int drill_mkparents(const char *path)
{
	char buf[4096];
	size_t len = strlen(path);

	if (len >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, len + 1);
	for (char *p = strchr(buf + 1, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		if (mkdir(buf, 0700) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

/* The recorded SHA-256 of key into want ("" when there is none). */
static int drill_recorded(struct objstore *os, const char *key, char *want)
{
	char side[4200], buf[256];
	struct objstore_info oi;
	size_t got = 0;
	int ret;

	want[0] = '\0';
	snprintf(side, sizeof(side), ".dstage-sha256/%s", key);
	ret = objstore_get(os, side, 0, sizeof(buf) - 1, NULL, buf, &got);
	if (ret == -ENOENT || ret == -ERANGE) {
		/* No sidecar (a recall that lost it, an object stored by
		 * another tool): the object's own x-amz-meta-sha256. */
		if (!objstore_head(os, key, &oi) && oi.sha256[0]) {
			memcpy(want, oi.sha256, 65);
			log_info("drill: %s has no SHA-256 sidecar: checked "
				 "against its x-amz-meta-sha256",
				 key);
		}
		return 0;
	}
	if (ret)
		return ret;
	buf[got] = '\0';
	if (got >= 64 && strspn(buf, "0123456789abcdef") == 64) {
		memcpy(want, buf, 64);
		want[64] = '\0';
	}
	return 0;
}

/* Whether this node's catalog recorded key's current version (same
 * ETag) with another SHA-256 than got. */
static bool drill_catalog_differs(struct objstore *os,
				  const struct ckpt_drill_opts *o,
				  const char *key, const char *got)
{
	char sha[65], etag[OBJSTORE_ETAG_MAX];
	struct objstore_info oi;

	if (!o->recorded ||
	    o->recorded(o->recorded_arg, objstore_url(os), key, sha, etag,
			sizeof(etag)) ||
	    objstore_head(os, key, &oi) || strcmp(oi.etag, etag))
		return false;
	if (!strcmp(sha, got))
		return false;
	log_error("drill: %s hashes to %s, but this node recorded %s when it "
		  "published that version (ETag %s): the store changed its "
		  "bytes and its SHA-256 record together",
		  key, got, sha, etag);
	return true;
}

/* Restore key (size bytes) to path, hashing it into got. */
static int drill_restore(struct objstore *os, const char *key, uint64_t size,
			 const char *path, char *buf, char *got)
{
	struct sha256 h = { 0 };
	unsigned char md[SHA256_LEN];
	uint64_t off = 0;
	int fd = -1, ret = drill_mkparents(path);

	if (!ret) {
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0)
			ret = -errno;
	}
	if (!ret)
		ret = sha256_init(&h);
	while (!ret && off < size) {
		size_t want =
			size - off < DRILL_CHUNK ? size - off : DRILL_CHUNK;
		size_t n = 0;

		ret = objstore_get(os, key, off, want, NULL, buf, &n);
		if (!ret && n == 0)
			ret = -EIO;
		if (!ret && write(fd, buf, n) != (ssize_t)n)
			ret = errno ? -errno : -EIO;
		if (!ret)
			ret = sha256_update(&h, buf, n);
		off += n;
	}
	if (!ret && !sha256_final(&h, md))
		strutil_hex(md, SHA256_LEN, got);
	if (fd >= 0 && close(fd) && !ret)
		ret = -errno;
	sha256_release(&h);
	return ret;
}

static int drill_add(struct ckpt_drill_report *r, const char *key,
		     uint64_t size)
{
	struct ckpt_drill_file *v;

	if (GROW_ONE(r->files, r->nfiles, r->files_cap, 16))
		return -ENOMEM;
	v = r->files;
	memset(&v[r->nfiles], 0, sizeof(*v));
	v[r->nfiles].key = strdup(key);
	if (!v[r->nfiles].key)
		return -ENOMEM;
	v[r->nfiles++].size = size;
	return 0;
}

/* Files the store recorded a hash for but no longer has. */
static int drill_missing(struct objstore *os, struct drill_list *objs,
			 const char *prefix, struct ckpt_drill_report *r)
{
	struct drill_list side = { 0 };
	size_t plen = strlen(prefix);
	char sp[4200];
	int ret;

	snprintf(sp, sizeof(sp), ".dstage-sha256/%s", prefix);
	ret = objstore_list(os, sp, drill_key_cb, &side);
	if (side.err)
		ret = side.err;
	for (size_t i = 0; !ret && i < side.nkeys; i++) {
		const char *key = side.keys[i] + strlen(".dstage-sha256/");
		bool found = key[plen] != '\0' && key[plen] != '/';

		for (size_t j = 0; j < objs->nkeys && !found; j++)
			found = !strcmp(objs->keys[j], key);
		if (found)
			continue;
		ret = drill_add(r, key, 0);
		if (!ret) {
			r->files[r->nfiles - 1].problem = "missing";
			r->nbad++;
		}
	}
	for (size_t i = 0; i < side.nkeys; i++)
		free(side.keys[i]);
	free(side.keys);
	free(side.sizes);
	return ret == -ENOENT ? 0 : ret;
}

/* Mark key (added when the store has none) with problem, once. */
static int drill_flag(struct ckpt_drill_report *r, const char *key,
		      uint64_t size, const char *problem)
{
	struct ckpt_drill_file *f = NULL;
	int ret;

	for (size_t i = 0; i < r->nfiles && !f; i++)
		if (!strcmp(r->files[i].key, key))
			f = &r->files[i];
	if (!f) {
		ret = drill_add(r, key, size);
		if (ret)
			return ret;
		f = &r->files[r->nfiles - 1];
	}
	if (!f->problem)
		r->nbad++;
	f->problem = problem;
	return 0;
}

/*
 * The files of checkpoint ck (a key) this node's staging journal says are
 * not finished: W, its writer has not closed it (being written, killed, or
 * dstagefs died under it and has not restarted to abandon it), or P,
 * closed but not yet in the store. What the store holds under such a name
 * is not what the job last wrote. Nothing when the journal cannot be read
 * (another node, another user).
 */
static int drill_unfinished(const struct dstage_config *cfg, const char *ckpt,
			    struct ckpt_drill_report *r)
{
	struct ckpt_dirs dirs = { .staging = cfg->ckpt_staging_dir,
				  .tree_fd = -1,
				  .journal_fd = -1,
				  .abandoned_fd = -1,
				  .owners_fd = -1 };
	size_t cl = strlen(ckpt);
	unsigned seen = 0;
	struct dirent *d;
	struct ckpt_rec rec;
	char path[4200];
	DIR *dir;
	int ret = 0;

	char sub[128];

	if (!dirs.staging ||
	    ckpt_store_subdir(cfg->ckpt_store, sub, sizeof(sub)))
		return 0;
	/* the store's own subdirectory of the staging directory (issue 34) */
	snprintf(path, sizeof(path), "%s/%s/%s", dirs.staging, sub,
		 CKPT_JOURNAL);
	dir = opendir(path);
	if (!dir)
		return 0;
	dirs.journal_fd = dirfd(dir);
	while (!ret && seen++ < DRILL_RECORDS_MAX && (d = readdir(dir))) {
		ino_t ino;

		if (ckpt_journal_name(d->d_name, &ino) ||
		    ckpt_journal_read(&dirs, ino, &rec))
			continue;
		if ((rec.state != 'W' && rec.state != 'P') ||
		    strncmp(rec.key, ckpt, cl) ||
		    (rec.key[cl] != '\0' && rec.key[cl] != '/'))
			continue;
		ret = drill_flag(r, rec.key, rec.size,
				 rec.state == 'W'
					 ? "unfinished: its writer has not "
					   "closed it (this node's journal)"
					 : "not yet published: closed, still "
					   "in this node's staging");
	}
	closedir(dir);
	return ret;
}

int ckpt_drill(const struct dstage_config *cfg, const struct ckpt_drill_opts *o,
	       struct ckpt_drill_report *r)
{
	struct drill_list l = { 0 };
	struct objstore *os = NULL;
	const struct drill_ckpt *c;
	int64_t t0;
	char *prefix = NULL, *buf = NULL, path[4200];
	size_t plen;
	int ret;

	memset(r, 0, sizeof(*r));
	if (!cfg->ckpt_store) {
		log_error("drill: checkpoints.store is not set");
		return -EINVAL;
	}
	if (!o->job || !*o->job || strchr(o->job, '/') || !o->to)
		return -EINVAL;
	if (rmdir(o->to) && errno != ENOENT) {
		log_error("drill: %s is not an empty directory: give a new "
			  "scratch directory with --to",
			  o->to);
		return -EEXIST;
	}
	t0 = timeutil_mono_ns();
	ret = objstore_open(cfg->ckpt_store, cfg, &os);
	if (ret)
		return ret;
	if (asprintf(&prefix, "%s/", o->job) < 0) {
		prefix = NULL;
		ret = -ENOMEM;
		goto out;
	}
	l.plen = strlen(prefix);
	ret = objstore_list(os, prefix, drill_ckpt_cb, &l);
	if (l.err)
		ret = l.err;
	if (ret)
		goto out;
	c = drill_pick(&l, o->step);
	if (!c) {
		log_error("drill: no checkpoint%s%s of job %s in %s",
			  o->step ? " named " : "", o->step ? o->step : "",
			  o->job, cfg->ckpt_store);
		ret = -ENOENT;
		goto out;
	}
	if (asprintf(&r->checkpoint, "%s%s", prefix, c->name) < 0) {
		r->checkpoint = NULL;
		ret = -ENOMEM;
		goto out;
	}
	/* The objects of the checkpoint: the file itself or its tree. */
	free(prefix);
	prefix = NULL;
	plen = strlen(r->checkpoint);
	ret = objstore_list(os, r->checkpoint, drill_key_cb, &l);
	if (l.err)
		ret = l.err;
	buf = malloc(DRILL_CHUNK);
	if (!ret && !buf)
		ret = -ENOMEM;
	if (mkdir(o->to, 0700) && !ret)
		ret = -errno;
	for (size_t i = 0; !ret && i < l.nkeys; i++) {
		const char *k = l.keys[i];
		struct ckpt_drill_file *f;

		if (k[plen] != '\0' && k[plen] != '/')
			continue; /* "step-1" listed "step-10/..." too */
		ret = drill_add(r, k, l.sizes[i]);
		if (ret)
			break;
		f = &r->files[r->nfiles - 1];
		snprintf(path, sizeof(path), "%s/%s", o->to,
			 k + strlen(o->job) + 1);
		ret = drill_recorded(os, k, f->want);
		if (!ret)
			ret = drill_restore(os, k, l.sizes[i], path, buf,
					    f->got);
		if (ret) {
			log_error("drill: cannot restore %s: %s", k,
				  strerror(-ret));
			f->problem = "unreadable";
			r->nbad++;
			ret = 0;
			continue;
		}
		r->bytes += l.sizes[i];
		if (!f->want[0])
			f->problem = "no recorded SHA-256";
		else if (strcmp(f->want, f->got))
			f->problem = "differs";
		else if (drill_catalog_differs(os, o, k, f->got))
			f->problem = "differs from the catalog's record";
		if (f->problem)
			r->nbad++;
	}
	if (!ret)
		ret = drill_missing(os, &l, r->checkpoint, r);
	if (!ret)
		ret = drill_unfinished(cfg, r->checkpoint, r);
out:
	r->seconds = (double)(timeutil_mono_ns() - t0) / 1e9;
	for (size_t i = 0; i < l.n; i++)
		free(l.v[i].name);
	for (size_t i = 0; i < l.nkeys; i++)
		free(l.keys[i]);
	free(l.v);
	free(l.keys);
	free(l.sizes);
	free(buf);
	free(prefix);
	objstore_free(os);
	return ret;
}

void ckpt_drill_release(struct ckpt_drill_report *r)
{
	for (size_t i = 0; i < r->nfiles; i++)
		free(r->files[i].key);
	free(r->files);
	free(r->checkpoint);
	memset(r, 0, sizeof(*r));
}
