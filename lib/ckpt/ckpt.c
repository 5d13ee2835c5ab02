// SPDX-License-Identifier: MIT
/*
 * ckpt: the checkpoint store of one node: opening it (the store, the
 * staging directory and its checks, recovery), listings (the store's and
 * this node's local copies, merged), directories, truncate by name and
 * statfs (see include/dstage/ckpt.h, and ckpt_i.h for the staging layout,
 * the journal, the files of the module and the lock order; ckpt_stat.c
 * says what a key is).
 *
 * State of this module: the handle is immutable after ckpt_open except
 * what ckpt_i.h marks (entries, counters, under ck->lock).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "util/fdutil.h"

/* ---- opening ---- */

/* staging_dir must be ours and writable by nobody else (like cache.dir):
 * whoever can write it could swap a local copy before it is published. */
static int ckpt_staging_check(const char *path, int fd)
{
	struct stat st;

	if (fstat(fd, &st))
		return -errno;
	if (st.st_uid != geteuid()) {
		log_error("checkpoints: checkpoints.staging_dir %s is owned by "
			  "uid %u, not by this process's uid %u: chown %u %s "
			  "and chmod 0700 it, or set checkpoints.staging_dir "
			  "to a directory of this user",
			  path, (unsigned)st.st_uid, (unsigned)geteuid(),
			  (unsigned)geteuid(), path);
		return -EACCES;
	}
	if (st.st_mode & 022) {
		log_error("checkpoints: checkpoints.staging_dir %s is writable "
			  "by group or others (mode %04o): they could change a "
			  "checkpoint before it is published; chmod 0700 %s",
			  path, (unsigned)(st.st_mode & 07777), path);
		return -EACCES;
	}
	if ((st.st_mode & 077) && fchmod(fd, CKPT_DIR_MODE))
		log_warn("checkpoints: cannot chmod 0700 %s: %s", path,
			 strerror(errno));
	return 0;
}

/* mkdir -p path (0700 for what is made). */
static int ckpt_mkdir_p(const char *path)
{
	char buf[PATH_MAX];
	size_t len = strlen(path);

	if (len >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, len + 1);
	for (char *p = strchr(buf + 1, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		if (mkdir(buf, 0755) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, CKPT_DIR_MODE) && errno != EEXIST)
		return -errno;
	return 0;
}

static int ckpt_subdir(int dfd, const char *name, int *out)
{
	if (mkdirat(dfd, name, CKPT_DIR_MODE) && errno != EEXIST)
		return -errno;
	*out = openat(dfd, name,
		      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return *out < 0 ? -errno : 0;
}

/* Bound on the entries a migration reads in one directory. */
#define CKPT_MIGRATE_MAX (1u << 22)

/* Whether the flat staging directory's sub (fd) holds any entry. */
static int ckpt_dir_nonempty(int fd)
{
	struct dirent *de;
	unsigned n = 0;
	DIR *d;
	int ret = fdutil_opendir(fd, &d);

	if (ret)
		return ret;
	while ((de = readdir(d)) && n++ < CKPT_MIGRATE_MAX)
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			break;
	closedir(d);
	return de != NULL;
}

/*
 * The layout before issue 34: tree/, journal/ and abandoned/ directly in
 * staging_dir, whatever the store. Move them into this store's
 * subdirectory sfd when the journal says they are this store's: every
 * record is C (published) and the store has the key with the record's
 * ETag; a C record the store does not confirm is a clean copy of some
 * store's object: dropped (that store has it). A W or P record, or a file
 * in abandoned/, could be any store's: refused, naming the fix.
 */
static int ckpt_staging_migrate(struct ckpt *ck, int dfd, int sfd,
				const char *top)
{
	struct objstore_info oi;
	struct ckpt_rec rec;
	struct dirent *de;
	unsigned n = 0, unknown = 0, kept = 0, dropped = 0;
	DIR *d = NULL;
	int jfd, ret = 0;

	jfd = openat(dfd, CKPT_JOURNAL,
		     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (jfd < 0)
		return errno == ENOENT ? 0 : -errno; /* nothing flat */
	ck->dirs.journal_fd = jfd;
	ck->dirs.tree_fd =
		openat(dfd, CKPT_TREE,
		       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	ck->dirs.abandoned_fd =
		openat(dfd, CKPT_ABANDONED,
		       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (ck->dirs.abandoned_fd >= 0) {
		ret = ckpt_dir_nonempty(ck->dirs.abandoned_fd);
		if (ret < 0)
			goto out;
		unknown += (unsigned)ret;
		ret = 0;
	}
	ret = fdutil_opendir(ck->dirs.journal_fd, &d);
	if (ret)
		goto out;
	while ((de = readdir(d)) && n++ < CKPT_MIGRATE_MAX) {
		char *end;
		unsigned long long ino = strtoull(de->d_name, &end, 10);

		if (de->d_name[0] < '0' || de->d_name[0] > '9' || *end)
			continue;
		if (ckpt_journal_read(&ck->dirs, (ino_t)ino, &rec))
			continue;
		if (rec.state != 'C') {
			log_error("checkpoints: %s/%s/%s: %s is not yet "
				  "published, and this staging directory (the "
				  "layout before issue 34) does not say to "
				  "which store",
				  top, CKPT_JOURNAL, de->d_name, rec.key);
			unknown++;
			continue;
		}
		if (!objstore_head(ck->os, rec.key, &oi) && rec.etag[0] &&
		    !strcmp(oi.etag, rec.etag)) {
			kept++;
			continue;
		}
		if (unlinkat(ck->dirs.tree_fd, rec.key, 0) && errno != ENOENT)
			log_warn("checkpoints: cannot remove %s/%s/%s: %s", top,
				 CKPT_TREE, rec.key, strerror(errno));
		ckpt_journal_remove(&ck->dirs, (ino_t)ino);
		dropped++;
	}
	if (unknown) {
		log_error(
			"checkpoints: %s holds %u unpublished or abandoned "
			"file(s) of an unknown store (the layout before "
			"issue 34); refusing to mount over %s. Fix: if they "
			"are this store's, mkdir -p %s && mv %s/%s %s/%s %s/%s "
			"%s/ && echo '%s' > %s/%s; else publish them with "
			"dstagefs on their store's version before this "
			"upgrade, or remove them",
			top, unknown, ckpt_url(ck), ck->dirs.staging, top,
			CKPT_TREE, top, CKPT_JOURNAL, top, CKPT_ABANDONED,
			ck->dirs.staging, ck->cfg->ckpt_store, ck->dirs.staging,
			CKPT_STORE_FILE);
		ret = -EINVAL;
		goto out;
	}
	if (ck->dirs.tree_fd >= 0 && renameat(dfd, CKPT_TREE, sfd, CKPT_TREE) &&
	    errno != ENOENT)
		ret = -errno;
	if (!ret && renameat(dfd, CKPT_JOURNAL, sfd, CKPT_JOURNAL))
		ret = -errno;
	if (!ret && ck->dirs.abandoned_fd >= 0 &&
	    renameat(dfd, CKPT_ABANDONED, sfd, CKPT_ABANDONED) &&
	    errno != ENOENT)
		ret = -errno;
	if (ret)
		log_error("checkpoints: cannot move %s's tree, journal and "
			  "abandoned/ into %s: %s",
			  top, ck->dirs.staging, strerror(-ret));
	else
		log_info("checkpoints: %s moved into %s (the staging "
			 "directory is one per store; %u published copies "
			 "kept, %u of other versions dropped)",
			 top, ck->dirs.staging, kept, dropped);
out:
	if (d)
		closedir(d);
	close(ck->dirs.journal_fd);
	if (ck->dirs.tree_fd >= 0)
		close(ck->dirs.tree_fd);
	if (ck->dirs.abandoned_fd >= 0)
		close(ck->dirs.abandoned_fd);
	ck->dirs.tree_fd = ck->dirs.journal_fd = ck->dirs.abandoned_fd =
		ck->dirs.owners_fd = -1;
	return ret;
}

int ckpt_open(const struct dstage_config *cfg, struct ckpt **out)
{
	return ckpt_open_ex(cfg, NULL, out);
}

int ckpt_start(struct ckpt *ck)
{
	int ret = 0;

	if (!ck->n_uploaders)
		ret = ckpt_upload_start(ck);
	if (!ret && !ck->retry_running)
		ret = ckpt_retry_start(ck);
	return ret;
}

int ckpt_open_ex(const struct dstage_config *cfg, const struct ckpt_hooks *h,
		 struct ckpt **out)
{
	pthread_mutexattr_t ma;
	struct ckpt *ck;
	char *spath = NULL;
	int dfd = -1, sfd = -1, ret;

	*out = NULL;
	if (!cfg->ckpt_store || !*cfg->ckpt_store) {
		log_error("checkpoints: checkpoints.store is not set");
		return -EINVAL;
	}
	ck = calloc(1, sizeof(*ck));
	if (!ck)
		return -ENOMEM;
	ck->cfg = cfg;
	if (h)
		ck->hooks = *h;
	ck->dirs.tree_fd = ck->dirs.journal_fd = ck->dirs.abandoned_fd =
		ck->dirs.owners_fd = -1;
	ck->limit = cfg->ckpt_staging_size;
	ck->uid_limit = cfg->ckpt_uid_staging_size;
	ck->uid_files = cfg->ckpt_uid_files;
	ck->uid_store = cfg->ckpt_uid_store_size;
	pthread_mutexattr_init(&ma);
	/* stat may drop a stale copy (open_lock) inside an open */
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&ck->open_lock, &ma);
	pthread_mutexattr_destroy(&ma);
	pthread_cond_init(&ck->cond, NULL);
	pthread_rwlock_init(&ck->ns_lock, NULL);
	pthread_mutex_init(&ck->lock, NULL);
	pthread_mutex_init(&ck->upq_lock, NULL);
	pthread_cond_init(&ck->upq_cond, NULL);
	pthread_mutex_init(&ck->neg_lock, NULL);
	ck->dirs.staging = strdup(cfg->ckpt_staging_dir);
	if (!ck->dirs.staging) {
		ret = -ENOMEM;
		goto err;
	}
	ret = objstore_open(cfg->ckpt_store, cfg, &ck->os);
	if (ret) {
		log_error("checkpoints: cannot open checkpoints.store %s: %s",
			  cfg->ckpt_store, strerror(-ret));
		goto err;
	}
	ck->key_max = ckpt_key_max_of(cfg->ckpt_store);
	ret = ckpt_mkdir_p(ck->dirs.staging);
	if (!ret) {
		dfd = open(ck->dirs.staging,
			   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		ret = dfd < 0 ? -errno : 0;
	}
	if (ret) {
		log_error(
			"checkpoints: cannot make checkpoints.staging_dir %s: "
			"%s; set it to a directory on the cache disk",
			ck->dirs.staging, strerror(-ret));
		goto err;
	}
	ret = ckpt_staging_check(ck->dirs.staging, dfd);
	if (!ret)
		ret = ckpt_store_dir_open(dfd, ck->dirs.staging,
					  cfg->ckpt_store, true, &sfd, &spath);
	if (!ret) {
		free(ck->dirs.staging); /* from here on, messages name the subdir */
		ck->dirs.staging = spath;
		ret = ckpt_staging_migrate(ck, dfd, sfd, cfg->ckpt_staging_dir);
	}
	if (!ret)
		ret = ckpt_subdir(sfd, CKPT_TREE, &ck->dirs.tree_fd);
	if (!ret)
		ret = ckpt_subdir(sfd, CKPT_JOURNAL, &ck->dirs.journal_fd);
	if (!ret)
		ret = ckpt_subdir(sfd, CKPT_ABANDONED, &ck->dirs.abandoned_fd);
	if (!ret)
		ret = ckpt_subdir(sfd, CKPT_OWNERS, &ck->dirs.owners_fd);
	if (ret) {
		if (ret != -EACCES && ret != -EINVAL)
			log_error("checkpoints: %s: %s", ck->dirs.staging,
				  strerror(-ret));
		goto err;
	}
	close(sfd);
	sfd = -1;
	close(dfd);
	dfd = -1;
	ckpt_store_census(ck);
	ret = ckpt_journal_scan(ck, true, false);
	if (!ret) {
		ckpt_live_count(ck);
		ckpt_abandoned_count(ck);
	}
	if (!ret && !(h && h->threads_later))
		ret = ckpt_start(ck);
	if (ret)
		goto err;
	log_info("checkpoints: store %s, staging %s (%" PRIu64 " of %" PRIu64
		 " bytes used)",
		 cfg->ckpt_store, ck->dirs.staging, ck->used, ck->limit);
	*out = ck;
	return 0;
err:
	if (sfd >= 0)
		close(sfd);
	if (dfd >= 0)
		close(dfd);
	ckpt_free(ck);
	return ret;
}

void ckpt_free(struct ckpt *ck)
{
	if (!ck)
		return;
	ckpt_retry_stop(ck);
	ckpt_upload_stop(ck);
	while (ck->ents) {
		struct ckpt_ent *e = ck->ents;

		ck->ents = e->next;
		log_warn("checkpoints: %s still open at shutdown", e->key);
		if (e->fd >= 0)
			close(e->fd);
		pthread_mutex_destroy(&e->lock);
		free(e->key);
		free(e);
	}
	objstore_free(ck->os);
	ckpt_dirs_close(&ck->dirs);
	pthread_mutex_destroy(&ck->open_lock);
	pthread_rwlock_destroy(&ck->ns_lock);
	pthread_mutex_destroy(&ck->lock);
	pthread_cond_destroy(&ck->cond);
	pthread_mutex_destroy(&ck->upq_lock);
	pthread_cond_destroy(&ck->upq_cond);
	ckpt_neg_clear(ck);
	pthread_mutex_destroy(&ck->neg_lock);
	free(ck->uids);
	ckpt_store_free(ck);
	free(ck);
}

/* ---- what a key is ---- */

/* ---- listing ---- */

struct ckpt_item {
	char *name;
	struct ckpt_attr a;
};

struct ckpt_items {
	struct ckpt_item *v;
	size_t n, cap;
	size_t plen; /* the store prefix's length */
	bool top;
	int err;
};

static int ckpt_items_add(struct ckpt_items *it, const char *name, size_t len,
			  const struct ckpt_attr *a)
{
	if (GROW_ONE(it->v, it->n, it->cap, 64))
		return -ENOMEM;
	it->v[it->n].name = strndup(name, len);
	if (!it->v[it->n].name)
		return -ENOMEM;
	it->v[it->n++].a = *a;
	return 0;
}

static int ckpt_list_store_cb(void *arg, const struct objstore_info *oi)
{
	struct ckpt_items *it = arg;
	const char *rest = oi->key + it->plen, *slash = strchr(rest, '/');
	size_t len = slash ? (size_t)(slash - rest) : strlen(rest);
	struct ckpt_attr a = { .dir = slash != NULL };

	if (ckpt_seg_ok(rest, len))
		return 0; /* ".dstage-sha256/", temporaries, odd keys */
	if (it->n && it->v[it->n - 1].a.dir && a.dir &&
	    !it->v[it->n - 1].a.local && strlen(it->v[it->n - 1].name) == len &&
	    memcmp(it->v[it->n - 1].name, rest, len) == 0)
		return 0; /* the same directory again */
	if (!a.dir) {
		a.size = oi->size;
		a.mtime = oi->mtime;
	}
	it->err = ckpt_items_add(it, rest, len, &a);
	return it->err ? 1 : 0;
}

static int ckpt_item_cmp(const void *x, const void *y)
{
	const struct ckpt_item *a = x, *b = y;
	int c = strcmp(a->name, b->name);

	if (c)
		return c;
	return (int)b->a.local - (int)a->a.local; /* local first */
}

static int ckpt_list_local(struct ckpt *ck, const char *dirkey,
			   struct ckpt_items *it, bool *found)
{
	struct dirent *de;
	DIR *d;
	int fd, ret = 0;

	fd = openat(ck->dirs.tree_fd, ckpt_tpath(dirkey),
		    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
	ret = fdutil_fdopendir(fd, &d);
	if (ret)
		return ret;
	*found = true;
	while (!ret && (de = readdir(d))) {
		struct ckpt_attr a = { .local = true };
		struct stat st;

		if (ckpt_seg_ok(de->d_name, strlen(de->d_name)))
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW))
			continue;
		if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
			continue;
		a.dir = S_ISDIR(st.st_mode);
		a.size = a.dir ? 0 : (uint64_t)st.st_size;
		a.mtime = st.st_mtim.tv_sec;
		ret = ckpt_items_add(it, de->d_name, strlen(de->d_name), &a);
	}
	closedir(d);
	return ret;
}

int ckpt_list(struct ckpt *ck, const char *dirkey, ckpt_list_cb cb, void *arg)
{
	struct ckpt_items it = { .top = !*dirkey };
	char *prefix = NULL;
	bool found = !*dirkey;
	size_t start;
	int ret = ckpt_key_ok(dirkey);

	if (ret)
		return ret;
	ret = ckpt_list_local(ck, dirkey, &it, &found);
	if (ret)
		goto out;
	prefix = *dirkey ? ckpt_key_join(dirkey, "") : strdup("");
	if (!prefix) {
		ret = -ENOMEM;
		goto out;
	}
	it.plen = strlen(prefix);
	start = it.n;
	ret = objstore_list(ck->os, prefix, ckpt_list_store_cb, &it);
	if (it.err) {
		ret = it.err;
		goto out;
	}
	if (ret == -ENOENT || ret == -ENOTDIR)
		ret = 0;
	if (ret) {
		ret = ckpt_store_errno(ret);
		goto out;
	}
	if (it.n > start)
		found = true;
	if (!found) {
		ret = -ENOENT;
		goto out;
	}
	if (it.n) /* qsort wants a non-NULL array */
		qsort(it.v, it.n, sizeof(*it.v), ckpt_item_cmp);
	for (size_t i = 0; i < it.n && !ret; i++) {
		if (i && strcmp(it.v[i].name, it.v[i - 1].name) == 0)
			continue;
		ret = cb(arg, it.v[i].name, &it.v[i].a);
	}
out:
	for (size_t i = 0; i < it.n; i++)
		free(it.v[i].name);
	free(it.v);
	free(prefix);
	return ret;
}

/* ---- directories ---- */

int ckpt_mkdir(struct ckpt *ck, const char *key)
{
	struct ckpt_attr a;
	int ret = *key ? ckpt_key_new_ok(ck, key) : -EEXIST;

	if (ret)
		return ret;
	ret = ckpt_parent_dir(ck, key);
	if (ret)
		return ret;
	ret = ckpt_stat(ck, key, &a);
	if (!ret)
		return -EEXIST;
	if (ret != -ENOENT)
		return ret;
	ckpt_neg_clear(ck);
	ret = ckpt_tree_mkparents(ck, key);
	if (!ret && mkdirat(ck->dirs.tree_fd, key, CKPT_DIR_MODE))
		ret = -errno;
	return ret;
}

int ckpt_rmdir(struct ckpt *ck, const char *key)
{
	struct ckpt_attr a;
	int ret = ckpt_stat(ck, key, &a);

	if (ret)
		return ret;
	if (!*key)
		return -EBUSY;
	if (!a.dir)
		return -ENOTDIR;
	ret = ckpt_store_has_dir(ck, key);
	if (ret)
		return ret < 0 ? ret : -ENOTEMPTY;
	if (unlinkat(ck->dirs.tree_fd, key, AT_REMOVEDIR) && errno != ENOENT)
		return errno == EEXIST ? -ENOTEMPTY : -errno;
	return 0;
}

int ckpt_truncate(struct ckpt *ck, const char *key, uint64_t size)
{
	struct ckpt_file *f;
	bool created, writer;
	int ret = ckpt_file_open(ck, key, O_WRONLY, &f, &created);

	if (ret)
		return ret;
	ret = ckpt_file_truncate(f, size);
	/* Another handle open for writing: its writer is not done, and its
	 * close (or fsync) publishes; publishing now would put the file as
	 * it is half way (often empty) under its final name. Alone, the
	 * truncate is a whole write of its own (open, ftruncate, close). */
	pthread_mutex_lock(&ck->lock);
	writer = f->e->writers > 1;
	pthread_mutex_unlock(&ck->lock);
	if (!ret && !writer)
		ret = ckpt_file_sync(f);
	ckpt_file_close(f);
	return ret;
}

int ckpt_statfs(struct ckpt *ck, struct statvfs *sv)
{
	uint64_t used, bs;

	if (fstatvfs(ck->dirs.tree_fd, sv))
		return -errno;
	bs = sv->f_frsize ? sv->f_frsize : 4096;
	pthread_mutex_lock(&ck->lock);
	used = ck->used;
	pthread_mutex_unlock(&ck->lock);
	if (ck->limit / bs < sv->f_blocks)
		sv->f_blocks = ck->limit / bs;
	if (used > ck->limit)
		used = ck->limit;
	if ((ck->limit - used) / bs < sv->f_bavail)
		sv->f_bavail = (ck->limit - used) / bs;
	if (sv->f_bfree > sv->f_blocks)
		sv->f_bfree = sv->f_blocks;
	if (sv->f_bavail > sv->f_bfree)
		sv->f_bavail = sv->f_bfree;
	return 0;
}
