// SPDX-License-Identifier: MIT
/*
 * push: prepare a push (walk the local tree, list the destination once,
 * read the journal, make the plan), describe it (dry run) or execute it
 * (push_exec.c's workers, then --delete, then SHA256SUMS), see push.h.
 *
 * State machine: prepared -> (dry run | executing -> executed) -> freed.
 * Everything but the counters and events is built by push_prepare in the
 * caller's thread and only read afterwards, except push_file.state/etag/
 * sha (push_exec.c says who writes them when).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "push_i.h"
#include "util/fdutil.h"
#include "util/strutil.h"

#define PUSH_DEPTH_MAX 256 /* directory levels below the root */

/* ---- excludes ---- */

/* Does the exclude list leave out path (whose last segment is name)? */
static bool push_excluded(const struct push_opts *o, const char *path,
			  const char *name)
{
	for (size_t i = 0; i < o->n_excludes; i++) {
		const char *g = o->excludes[i];

		if (strchr(g, '/') ? !fnmatch(g, path, FNM_PATHNAME)
				   : !fnmatch(g, name, 0))
			return true;
	}
	return false;
}

/* A key of the store excluded by any of its prefixes (a directory). */
static bool push_key_excluded(const struct push_opts *o, const char *key)
{
	char buf[KEYPATH_MAX];
	size_t len = strlen(key);

	if (!o->n_excludes || len >= sizeof(buf))
		return false;
	memcpy(buf, key, len + 1);
	for (size_t i = 0; i <= len; i++) {
		if (buf[i] != '/' && buf[i])
			continue;
		char c = buf[i];
		const char *slash;

		buf[i] = '\0';
		slash = strrchr(buf, '/');
		if (push_excluded(o, buf, slash ? slash + 1 : buf))
			return true;
		buf[i] = c;
	}
	return false;
}

/* ---- the walk ---- */

static int push_add_protect(struct push *p, const char *path)
{
	if (GROW_ONE(p->protect, p->n_protect, p->cap_protect, 16))
		return -ENOMEM;
	p->protect[p->n_protect] = strdup(path);
	return p->protect[p->n_protect++] ? 0 : -ENOMEM;
}

/* A name that is not pushed: reported, and never deleted at the store. */
static int push_skip_name(struct push *p, enum push_event ev, const char *path,
			  const char *why)
{
	char pr[512];

	if (ev == PUSH_EV_BADNAME)
		p->plan.bad++;
	else
		p->plan.ignored++;
	push_emit(p, ev, keypath_printable(path, strlen(path), pr, sizeof(pr)),
		  0, why);
	return push_add_protect(p, path);
}

static int push_add_file(struct push *p, const char *path,
			 const struct stat *st)
{
	struct push_file *f;

	if (p->n_files >= PUSH_FILES_MAX)
		return -E2BIG;
	if (GROW_ONE(p->files, p->n_files, p->cap_files, 1024))
		return -ENOMEM;
	f = &p->files[p->n_files];
	memset(f, 0, sizeof(*f));
	f->key = strdup(path);
	if (!f->key)
		return -ENOMEM;
	f->size = (uint64_t)st->st_size;
	f->mtime_ns =
		(int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
	f->ino = (uint64_t)st->st_ino;
	f->dev = (uint64_t)st->st_dev;
	p->n_files++;
	return 0;
}

/* Walk the directory dfd (whose relative path is path[0..len), "" for the
 * root). Takes dfd. */
static int push_walk(struct push *p, int dfd, char *path, size_t len, int depth)
{
	struct dirent *de;
	DIR *d;
	int ret = fdutil_fdopendir(dfd, &d);

	if (ret)
		return ret;
	while ((errno = 0, de = readdir(d))) {
		const char *name = de->d_name;
		size_t nl = strlen(name), pl = len + (len ? 1 : 0) + nl;
		const char *why = NULL;
		struct stat st;

		if (!strcmp(name, ".") || !strcmp(name, ".."))
			continue;
		if (pl >= KEYPATH_MAX + NAME_MAX) {
			ret = push_skip_name(p, PUSH_EV_BADNAME, name,
					     "its path is longer than a key "
					     "may be (1,024 bytes)");
			if (ret)
				break;
			continue;
		}
		if (len)
			path[len] = '/';
		memcpy(path + len + (len ? 1 : 0), name, nl + 1);
		if (push_excluded(p->o, path, name))
			goto next;
		if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW)) {
			ret = -errno;
			log_error("push: %s/%s: %s", p->o->dir, path,
				  strerror(-ret));
			break;
		}
		if (!len && !strcmp(name, PUSH_SUMS_KEY) &&
		    S_ISREG(st.st_mode)) {
			ret = push_skip_name(p, PUSH_EV_IGNORED, path,
					     "replaced by the SHA256SUMS this "
					     "push writes");
			goto next;
		}
		if (S_ISDIR(st.st_mode)) {
			int sub;

			if (depth >= PUSH_DEPTH_MAX) {
				ret = push_skip_name(p, PUSH_EV_BADNAME, path,
						     "deeper than 256 levels");
				goto next;
			}
			sub = openat(dirfd(d), name,
				     O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					     O_CLOEXEC);
			if (sub < 0) {
				ret = -errno;
				log_error("push: %s/%s: %s", p->o->dir, path,
					  strerror(-ret));
				break;
			}
			ret = push_walk(p, sub, path, pl, depth + 1);
			goto next;
		}
		if (!S_ISREG(st.st_mode)) {
			ret = push_skip_name(p, PUSH_EV_IGNORED, path,
					     S_ISLNK(st.st_mode)
						     ? "a symbolic link: not "
						       "followed"
						     : "not a regular file");
			goto next;
		}
		if (keypath_check(path, pl, &why) ||
		    (p->o->key_ok &&
		     !p->o->key_ok(p->o->key_ok_arg, path, pl, &why)) ||
		    (!len && !strncmp(name, ".dstage-tmp.", 12) &&
		     (why = "names starting .dstage-tmp. are the store's "
			    "temporary files"))) {
			ret = push_skip_name(p, PUSH_EV_BADNAME, path, why);
			goto next;
		}
		ret = push_add_file(p, path, &st);
next:
		path[len] = '\0';
		if (ret)
			break;
	}
	if (!ret && errno)
		ret = -errno;
	closedir(d);
	return ret;
}

/* ---- listing and plan ---- */

static int push_list_cb(void *arg, const struct objstore_info *oi)
{
	struct push *p = arg;
	struct push_obj *o;

	if (p->n_objs >= 4 * (size_t)PUSH_FILES_MAX)
		return -E2BIG;
	if (GROW_ONE(p->objs, p->n_objs, p->cap_objs, 1024))
		return -ENOMEM;
	o = &p->objs[p->n_objs];
	o->key = strdup(oi->key);
	o->etag = strdup(oi->etag);
	o->size = oi->size;
	o->matched = false;
	if (!o->key || !o->etag) {
		free(o->key);
		free(o->etag);
		return -ENOMEM;
	}
	p->n_objs++;
	return 0;
}

static int push_file_cmp(const void *a, const void *b)
{
	return strcmp(((const struct push_file *)a)->key,
		      ((const struct push_file *)b)->key);
}

static int push_obj_cmp(const void *a, const void *b)
{
	return strcmp(((const struct push_obj *)a)->key,
		      ((const struct push_obj *)b)->key);
}

static int push_order_cmp(const void *a, const void *b, void *arg)
{
	const struct push *p = arg;
	const struct push_file *x = &p->files[*(const size_t *)a],
			       *y = &p->files[*(const size_t *)b];

	return x->size > y->size ? -1 : x->size < y->size;
}

static bool push_protected(const struct push *p, const char *key)
{
	for (size_t i = 0; i < p->n_protect; i++) {
		size_t l = strlen(p->protect[i]);

		if (!strncmp(key, p->protect[i], l) &&
		    (key[l] == '\0' || key[l] == '/'))
			return true;
	}
	return false;
}

static int push_make_plan(struct push *p)
{
	size_t i = 0, k = 0;

	if (p->n_files)
		qsort(p->files, p->n_files, sizeof(*p->files), push_file_cmp);
	if (p->n_objs)
		qsort(p->objs, p->n_objs, sizeof(*p->objs), push_obj_cmp);
	p->order = malloc((p->n_files ? p->n_files : 1) * sizeof(*p->order));
	if (!p->order)
		return -ENOMEM;
	/* merge the two sorted lists */
	for (; i < p->n_files; i++) {
		struct push_file *f = &p->files[i];
		const struct push_jent *je;
		struct push_obj *o = NULL;
		int c = 1;

		while (k < p->n_objs &&
		       (c = strcmp(p->objs[k].key, f->key)) < 0)
			k++;
		if (k < p->n_objs && !c) {
			o = &p->objs[k];
			o->matched = true;
		}
		p->plan.files++;
		p->plan.bytes += f->size;
		f->in_store = o != NULL;
		je = push_journal_find(&p->j, f->key);
		if (o && je && o->size == f->size && je->size == f->size &&
		    je->mtime_ns == f->mtime_ns && je->ino == f->ino &&
		    !strcmp(je->etag, o->etag)) {
			memcpy(f->sha, je->sha, 32);
			f->etag = strdup(o->etag);
			if (!f->etag)
				return -ENOMEM;
			f->state = PF_SKIP;
			p->plan.skip++;
			p->plan.skip_bytes += f->size;
			continue;
		}
		f->state = PF_UPLOAD;
		p->order[p->n_order++] = i;
		p->plan.upload++;
		p->plan.upload_bytes += f->size;
		if (o)
			p->plan.overwrite++;
	}
	if (p->n_order)
		qsort_r(p->order, p->n_order, sizeof(*p->order), push_order_cmp,
			p);
	for (k = 0; k < p->n_objs; k++) {
		struct push_obj *o = &p->objs[k];

		if (!strcmp(o->key, PUSH_SUMS_KEY)) {
			p->plan.sums_exist = true;
			o->matched = true; /* never deleted: rewritten */
			continue;
		}
		if (o->matched || push_key_excluded(p->o, o->key) ||
		    push_protected(p, o->key))
			o->matched = true;
		else if (p->o->delete_extra)
			p->plan.remove++;
	}
	return 0;
}

/* ---- SHA256SUMS ---- */

/* The SHA256SUMS this push writes (GNU sha256sum format, key order; a
 * name holding '\\' is escaped as coreutils does). */
static int push_sums_build(const struct push *p, char **out, size_t *len)
{
	char *buf = NULL, hex[65];
	size_t n = 0, cap = 0;

	for (size_t i = 0; i < p->n_files; i++) {
		const struct push_file *f = &p->files[i];
		size_t kl = strlen(f->key), need = 64 + 4 + 2 * kl + 1;
		bool esc = strchr(f->key, '\\') != NULL;

		if (f->state != PF_SKIP && f->state != PF_DONE)
			continue;
		if (n + need >= cap &&
		    grow_array(&buf, &cap, n + need + 1, 1, 65536)) {
			free(buf);
			return -ENOMEM;
		}
		strutil_hex(f->sha, 32, hex);
		if (esc)
			buf[n++] = '\\';
		memcpy(buf + n, hex, 64);
		n += 64;
		buf[n++] = ' ';
		buf[n++] = ' ';
		for (size_t c = 0; c < kl; c++) {
			if (esc && f->key[c] == '\\')
				buf[n++] = '\\';
			buf[n++] = f->key[c];
		}
		buf[n++] = '\n';
	}
	*out = buf;
	*len = n;
	return 0;
}

/* Does the store's SHA256SUMS hold exactly buf? (false on any error) */
static bool push_sums_same(struct push *p, const char *buf, size_t len)
{
	struct objstore_info oi = { 0 };
	char *have;
	size_t got = 0;
	bool same;

	if (!p->plan.sums_exist || objstore_head(p->os, PUSH_SUMS_KEY, &oi) ||
	    oi.size != len)
		return false;
	if (!len)
		return true;
	have = malloc(len);
	if (!have)
		return false;
	same = !objstore_get(p->os, PUSH_SUMS_KEY, 0, len, oi.etag, have,
			     &got) &&
	       got == len && !memcmp(have, buf, len);
	free(have);
	return same;
}

/* file://: make the destination directory (and its parents) as the file
 * store makes a key's directories, 0755 under the umask. */
static int push_mkdirs(const char *url)
{
	char path[4096];
	size_t n;

	if (strncmp(url, "file://", 7) ||
	    (n = strlen(url + 7)) >= sizeof(path) || url[7] != '/')
		return 0;
	memcpy(path, url + 7, n + 1);
	for (char *q = path + 1;; q++) {
		char c = *q;

		if (c != '/' && c)
			continue;
		*q = '\0';
		if (mkdir(path, 0755) && errno != EEXIST) {
			int ret = -errno;

			log_error("push: cannot make %s: %s", path,
				  strerror(-ret));
			return ret;
		}
		*q = c;
		if (!c)
			break;
	}
	return 0;
}

/* ---- public ---- */

int push_prepare(const struct dstage_config *cfg, const struct push_opts *o,
		 struct push **out)
{
	struct push *p = calloc(1, sizeof(*p));
	char path[KEYPATH_MAX + NAME_MAX + 2] = "", *real = NULL;
	int fd, ret;

	*out = NULL;
	if (!p)
		return -ENOMEM;
	p->cfg = cfg;
	p->o = o;
	p->rootfd = -1;
	p->j.fd = -1;
	pthread_mutex_init(&p->ev_lock, NULL);
	pthread_mutex_init(&p->bw_lock, NULL);
	pthread_mutex_init(&p->j.lock, NULL);
	if (o->n_excludes > PUSH_EXCLUDES_MAX) {
		log_error("push: %zu --exclude patterns: at most %d",
			  o->n_excludes, PUSH_EXCLUDES_MAX);
		ret = -EINVAL;
		goto err;
	}
	p->rootfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (p->rootfd < 0) {
		ret = -errno;
		log_error("push: %s: %s", o->dir, strerror(-ret));
		goto err;
	}
	real = realpath(o->dir, NULL);
	if (!real) {
		ret = -errno;
		goto err;
	}
	/* a new file:// directory is made by push_execute (a dry run or a
	 * refused push leaves no trace); empty until then */
	ret = 0;
	if (strncmp(o->url, "file:///", 8) ||
	    !(access(o->url + 7, F_OK) && errno == ENOENT))
		ret = objstore_open(o->url, cfg, &p->os);
	if (ret)
		goto err;
	p->s3 = !strncmp(o->url, "s3://", 5);
	pthread_mutex_destroy(&p->j.lock);
	ret = push_journal_open(&p->j, cfg, o->journal_dir, o->url, real);
	if (ret)
		goto err;
	fd = dup(p->rootfd);
	if (fd < 0) {
		ret = -errno;
		goto err;
	}
	ret = push_walk(p, fd, path, 0, 0);
	if (ret) {
		if (ret == -E2BIG)
			log_error("push: %s holds more than %u files: push it "
				  "in parts",
				  o->dir, PUSH_FILES_MAX);
		goto err;
	}
	ret = p->os ? objstore_list(p->os, "", push_list_cb, p) : 0;
	if (ret) {
		log_error("push: cannot list %s: %s", o->url, strerror(-ret));
		goto err;
	}
	ret = push_make_plan(p);
	if (ret)
		goto err;
	if (p->os && !p->plan.upload && !p->plan.remove && !p->plan.bad) {
		char *sums;
		size_t len;

		if (!push_sums_build(p, &sums, &len)) {
			p->plan.sums_current = push_sums_same(p, sums, len);
			free(sums);
		}
	}
	free(real);
	*out = p;
	return 0;
err:
	free(real);
	push_free(p);
	return ret;
}

void push_plan(const struct push *p, struct push_plan *plan)
{
	*plan = p->plan;
}

void push_dry_run(struct push *p)
{
	for (size_t i = 0; i < p->n_files; i++)
		if (p->files[i].state == PF_UPLOAD)
			push_emit(p, PUSH_EV_PLAN_UPLOAD, p->files[i].key,
				  p->files[i].size,
				  p->files[i].in_store ? "replaces the "
							 "stored object"
						       : NULL);
	if (p->o->delete_extra)
		for (size_t k = 0; k < p->n_objs; k++)
			if (!p->objs[k].matched)
				push_emit(p, PUSH_EV_PLAN_DELETE,
					  p->objs[k].key, p->objs[k].size,
					  NULL);
}

static int push_deletes(struct push *p)
{
	int first = 0;

	for (size_t k = 0; k < p->n_objs && !atomic_load(&p->stop); k++) {
		int ret;

		if (p->objs[k].matched)
			continue;
		ret = objstore_delete(p->os, p->objs[k].key);
		if (ret) {
			char msg[128];

			snprintf(msg, sizeof(msg), "delete: %s",
				 strerror(-ret));
			push_emit(p, PUSH_EV_FAILED, p->objs[k].key,
				  p->objs[k].size, msg);
			if (!first)
				first = ret;
			continue;
		}
		push_emit(p, PUSH_EV_DELETED, p->objs[k].key, p->objs[k].size,
			  NULL);
	}
	return first;
}

int push_execute(struct push *p)
{
	char *sums = NULL;
	size_t len = 0;
	int ret;

	if (!p->os) {
		ret = push_mkdirs(p->o->url);
		if (!ret)
			ret = objstore_open(p->o->url, p->cfg, &p->os);
		if (ret)
			return ret;
	}
	/* skipped files count as done from the start */
	atomic_store(&p->files_done, p->plan.skip);
	atomic_store(&p->bytes_done, p->plan.skip_bytes);
	for (size_t i = 0; i < p->n_files; i++)
		if (p->files[i].state == PF_SKIP)
			push_emit(p, PUSH_EV_SKIPPED, p->files[i].key,
				  p->files[i].size, NULL);
	ret = push_exec_abort_leftovers(p);
	if (!ret)
		ret = push_exec_run(p);
	if (ret)
		goto out;
	if (atomic_load(&p->stop)) {
		ret = -ECANCELED;
		goto out;
	}
	if (atomic_load(&p->failed)) {
		ret = -EIO;
		goto out;
	}
	if (atomic_load(&p->changed) || p->plan.bad) {
		ret = -EAGAIN;
		goto out;
	}
	if (p->o->delete_extra) {
		ret = push_deletes(p);
		if (ret) {
			ret = -EIO;
			goto out;
		}
	}
	ret = push_sums_build(p, &sums, &len);
	if (ret)
		goto out;
	/* prepare compared it already when there was nothing to do */
	if (!(p->plan.sums_current && !p->plan.upload && !p->plan.remove) &&
	    !push_sums_same(p, sums, len)) {
		ret = objstore_put_buf(p->os, PUSH_SUMS_KEY, sums, len);
		if (ret) {
			push_emit(p, PUSH_EV_FAILED, PUSH_SUMS_KEY, len,
				  "upload of SHA256SUMS failed");
			goto out;
		}
		push_emit(p, PUSH_EV_SUMS, PUSH_SUMS_KEY, len, NULL);
	}
	ret = push_journal_compact(&p->j, p->files, p->n_files);
out:
	free(sums);
	return ret;
}

void push_stop(struct push *p)
{
	atomic_store(&p->stop, true);
}

void push_progress(const struct push *p, struct push_progress *pr)
{
	pr->files_done = atomic_load(&p->files_done);
	pr->files_total = p->plan.files;
	pr->bytes_done = atomic_load(&p->bytes_done);
	pr->bytes_total = p->plan.bytes;
	pr->sent = atomic_load(&p->sent);
	pr->changed = atomic_load(&p->changed);
	pr->failed = atomic_load(&p->failed);
}

const char *push_journal_path(const struct push *p)
{
	return p->j.path;
}

void push_free(struct push *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n_files; i++) {
		free(p->files[i].key);
		free(p->files[i].etag);
	}
	free(p->files);
	for (size_t i = 0; i < p->n_objs; i++) {
		free(p->objs[i].key);
		free(p->objs[i].etag);
	}
	free(p->objs);
	for (size_t i = 0; i < p->n_protect; i++)
		free(p->protect[i]);
	free(p->protect);
	free(p->order);
	push_journal_release(&p->j);
	objstore_free(p->os);
	if (p->rootfd >= 0)
		close(p->rootfd);
	pthread_mutex_destroy(&p->ev_lock);
	pthread_mutex_destroy(&p->bw_lock);
	free(p);
}
