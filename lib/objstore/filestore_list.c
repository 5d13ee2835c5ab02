// SPDX-License-Identifier: MIT
/*
 * filestore_list: the listings of the file:// backend (the rules are at the
 * top of filestore.c), one walk of the tree in the byte order of keys:
 *
 *   objstore_list         the regular files; links and special files
 *                         skipped with a log line naming the key.
 *   objstore_list_tree    the same for a snapshot, and also every
 *                         directory as "KEY/" (an S3 folder marker's form)
 *                         before what it holds, and every entry that cannot
 *                         be an object reported to the caller with why (a
 *                         link not followed, a special file, a file or
 *                         directory this process may not read, a reserved
 *                         name, nesting too deep): the caller logs and
 *                         counts it.
 *   objstore_upload_list  only the temporary files.
 *
 * Bounded: at most FILESTORE_LIST_DEPTH_MAX directories deep, keys of at
 * most PATH_MAX bytes, one directory's entries in memory at a time per
 * level. Stateless; thread-safe.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/grow.h"
#include "dstage/log.h"
#include "filestore_i.h"
#include "util/fdutil.h"

void filestore_list_etag(const struct stat *st, char *out, size_t len)
{
	snprintf(out, len, "\"%llx-%llx-%llx\"",
		 (unsigned long long)st->st_size,
		 (unsigned long long)st->st_mtim.tv_sec * 1000000000ULL +
			 (unsigned long long)st->st_mtim.tv_nsec,
		 (unsigned long long)st->st_ino);
}

void filestore_list_info(const struct stat *st, struct objstore_info *info)
{
	info->size = (uint64_t)st->st_size;
	info->mtime = st->st_mtim.tv_sec;
	filestore_list_etag(st, info->etag, sizeof(info->etag));
}

enum fs_dirent_type { FS_DT_REG, FS_DT_DIR, FS_DT_LNK, FS_DT_OTHER };

struct fs_dirent {
	char *name;
	enum fs_dirent_type type;
	mode_t mode; /* FS_DT_OTHER: what it is, for the message */
};

/* The i-th byte of an entry's key form: a directory ends in "/". -1 past
 * the end, which sorts first. */
static int fs_dirent_byte(const struct fs_dirent *e, size_t i, size_t len)
{
	if (i < len)
		return (unsigned char)e->name[i];
	if (i == len && e->type == FS_DT_DIR)
		return '/';
	return -1;
}

/* Byte order of keys, so that the walk lists in the order S3 does. */
static int fs_dirent_cmp(const void *a, const void *b)
{
	const struct fs_dirent *x = a, *y = b;
	size_t lx = strlen(x->name), ly = strlen(y->name);

	for (size_t i = 0;; i++) {
		int c1 = fs_dirent_byte(x, i, lx);
		int c2 = fs_dirent_byte(y, i, ly);

		if (c1 != c2)
			return c1 < c2 ? -1 : 1;
		if (c1 < 0)
			return 0;
	}
}

struct fs_walk {
	struct filestore *fs;
	const char *prefix;
	size_t prefix_len;
	objstore_list_cb cb;
	/* objstore_upload_list: only temporary files, through ucb */
	objstore_upload_list_cb ucb;
	void *arg;
	bool tree; /* objstore_list_tree: directories and skips too */
	char why[200]; /* a skip's reason, when it is formatted */
	char key[PATH_MAX];
	unsigned depth;
};

static bool fs_is_tmp(const char *name)
{
	return !strncmp(name, FILESTORE_TMP_PREFIX,
			sizeof(FILESTORE_TMP_PREFIX) - 1);
}

/* Could a key starting with key[0..keylen) match the prefix? */
static bool fs_may_match(const struct fs_walk *w, size_t keylen)
{
	size_t n = keylen < w->prefix_len ? keylen : w->prefix_len;

	return memcmp(w->key, w->prefix, n) == 0;
}

/* Read the entries of directory d, unsorted, classified without following
 * anything; temporary files only when tmp. */
static int fs_read_dir(DIR *d, bool tmp, struct fs_dirent **out, size_t *nout)
{
	struct fs_dirent *ents = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int ret = 0;

	while ((errno = 0, de = readdir(d))) {
		enum fs_dirent_type type = FS_DT_OTHER;
		mode_t mode = 0;
		struct stat st;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (!tmp && fs_is_tmp(de->d_name))
			continue;
		if (de->d_type != DT_UNKNOWN)
			mode = (mode_t)DTTOIF(de->d_type);
		else if (!fstatat(dirfd(d), de->d_name, &st,
				  AT_SYMLINK_NOFOLLOW))
			mode = st.st_mode;
		else if (errno == ENOENT)
			continue; /* vanished */
		else
			mode = S_IFREG; /* the walk's own stat says why */
		if (S_ISREG(mode))
			type = FS_DT_REG;
		else if (S_ISDIR(mode))
			type = FS_DT_DIR;
		else if (S_ISLNK(mode))
			type = FS_DT_LNK;
		if (GROW_ONE(ents, n, cap, 64)) {
			ret = -ENOMEM;
			goto out;
		}
		ents[n].name = strdup(de->d_name);
		if (!ents[n].name) {
			ret = -ENOMEM;
			goto out;
		}
		ents[n].type = type;
		ents[n++].mode = mode;
	}
	if (errno)
		ret = -errno;
out:
	*out = ents;
	*nout = n;
	return ret;
}

/* w->key is skipped for why (a noun phrase): told to the caller in a tree
 * listing, else logged. The callback's value. */
static int fs_walk_skip(struct fs_walk *w, const char *why)
{
	struct objstore_info oi = { .key = w->key, .skipped = why };

	if (w->tree)
		return w->cb(w->arg, &oi);
	log_warn("%s: '%s' is %s: skipped", w->fs->base.url, w->key, why);
	return 0;
}

/* A link not resolved (err -ELOOP or -EXDEV), skipped. */
static int fs_walk_skip_link(struct fs_walk *w, int err)
{
	if (!w->tree) {
		filestore_path_msg(w->fs, w->key, err, "skipped");
		return 0;
	}
	if (err == -EXDEV)
		return fs_walk_skip(w, "a symbolic link leading outside the "
				       "source (never followed)");
	return fs_walk_skip(w, w->fs->follow_inside
				       ? "a symbolic link passing through "
					 "another link (not followed)"
				       : "a symbolic link, not followed "
					 "(sources.follow_symlinks = no)");
}

/* Whether this process may read the file st (name in dfd, with faccessat's
 * flags). The mode bits answer most cases without a system call; when the
 * kernel cannot tell, the file is kept (a read would say). */
static bool fs_walk_readable(int dfd, const char *name, int flags,
			     const struct stat *st)
{
	if (st->st_mode & S_IROTH)
		return true;
	if (st->st_uid == geteuid() && (st->st_mode & S_IRUSR))
		return true;
	if (!faccessat(dfd, name, R_OK, AT_EACCESS | flags))
		return true;
	return errno != EACCES && errno != EPERM;
}

/* *keep when the file st may be listed: in a tree listing, only when this
 * process may read it (a snapshot of a file no read can serve would fail
 * its readers later); else it is skipped. */
static int fs_walk_check_read(struct fs_walk *w, int dfd, const char *name,
			      int flags, const struct stat *st, bool *keep)
{
	if (!w->tree || fs_walk_readable(dfd, name, flags, st)) {
		*keep = true;
		return 0;
	}
	snprintf(w->why, sizeof(w->why),
		 "a file uid %u may not read (permission denied)",
		 (unsigned)geteuid());
	return fs_walk_skip(w, w->why);
}

/* A symbolic link w->key: its target's stat into st and *keep, when it is
 * followed to a regular file; else skipped. */
static int fs_walk_link(struct fs_walk *w, struct stat *st, bool *keep)
{
	struct filestore *fs = w->fs;
	int fd = -1, ret;

	if (!fs->follow_inside)
		return fs_walk_skip_link(w, -ELOOP);
	ret = filestore_path_resolve(fs, w->key, O_PATH, &fd);
	if (ret == -ELOOP || ret == -EXDEV)
		return fs_walk_skip_link(w, ret);
	if (ret == -ENOENT)
		return fs_walk_skip(w, "a symbolic link to nothing (dangling)");
	if (ret) {
		snprintf(w->why, sizeof(w->why),
			 "a symbolic link that cannot be followed (%s)",
			 strerror(-ret));
		return fs_walk_skip(w, w->why);
	}
	if (fstat(fd, st)) {
		snprintf(w->why, sizeof(w->why),
			 "a symbolic link whose target cannot be looked at "
			 "(%s)",
			 strerror(errno));
		ret = fs_walk_skip(w, w->why);
	} else if (!S_ISREG(st->st_mode)) {
		/* links to directories: never (no loops) */
		snprintf(w->why, sizeof(w->why), "a symbolic link to %s",
			 filestore_path_type_name(st->st_mode));
		ret = fs_walk_skip(w, w->why);
	} else {
		ret = fs_walk_check_read(w, fd, "", AT_EMPTY_PATH, st, keep);
	}
	close(fd);
	return ret;
}

/*
 * A listed non-directory entry w->key (e, in directory dfd): its stat into
 * st and *keep when it is listed; else it is skipped (reported) or it
 * vanished. Returns 0 or the callback's value.
 */
static int fs_walk_stat(struct fs_walk *w, int dfd, const struct fs_dirent *e,
			struct stat *st, bool *keep)
{
	*keep = false;
	if (e->type == FS_DT_OTHER) {
		snprintf(w->why, sizeof(w->why), "%s, not a regular file",
			 filestore_path_type_name(e->mode));
		return fs_walk_skip(w, w->why);
	}
	if (e->type == FS_DT_LNK)
		return fs_walk_link(w, st, keep);
	/* Not following: a file swapped for a link since readdir is
	 * skipped, never followed. */
	if (fstatat(dfd, e->name, st, AT_SYMLINK_NOFOLLOW)) {
		if (errno == ENOENT)
			return 0; /* vanished */
		snprintf(w->why, sizeof(w->why),
			 "an entry that cannot be looked at (%s)",
			 strerror(errno));
		return fs_walk_skip(w, w->why);
	}
	if (!S_ISREG(st->st_mode))
		return 0; /* replaced since readdir: the next listing sees it */
	return fs_walk_check_read(w, dfd, e->name, AT_SYMLINK_NOFOLLOW, st,
				  keep);
}

/* objstore_upload_list: report e (named w->key, in directory dfd) when it
 * is a temporary file, never following a link. */
static int fs_walk_tmp(struct fs_walk *w, int dfd, const struct fs_dirent *e)
{
	struct objstore_upload_info ui = { .key = w->key, .id = e->name };
	struct stat st;

	if (!fs_is_tmp(e->name) || e->type != FS_DT_REG ||
	    fstatat(dfd, e->name, &st, AT_SYMLINK_NOFOLLOW) ||
	    !S_ISREG(st.st_mode))
		return 0;
	ui.initiated = st.st_mtim.tv_sec;
	return w->ucb(w->arg, &ui);
}

static int fs_walk_dir(struct fs_walk *w, int dfd, size_t keylen);

/* Directory e of d, whose key is w->key[0..klen) (without its '/'): in a
 * tree listing its marker, then what it holds. */
static int fs_walk_sub(struct fs_walk *w, DIR *d, const struct fs_dirent *e,
		       size_t klen)
{
	struct objstore_info oi = { .key = w->key };
	int sub, ret;

	w->key[klen] = '/';
	w->key[klen + 1] = '\0';
	if (!fs_may_match(w, klen + 1))
		return 0;
	if (w->depth >= FILESTORE_LIST_DEPTH_MAX) {
		snprintf(w->why, sizeof(w->why),
			 "a directory nested deeper than %d levels",
			 FILESTORE_LIST_DEPTH_MAX);
		return fs_walk_skip(w, w->why);
	}
	sub = openat(dirfd(d), e->name,
		     O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (sub < 0) {
		ret = -errno;
		if (w->tree && (ret == -EACCES || ret == -EPERM)) {
			snprintf(w->why, sizeof(w->why),
				 "a directory uid %u may not read (permission "
				 "denied): nothing under it is listed",
				 (unsigned)geteuid());
			return fs_walk_skip(w, w->why);
		}
		log_error("%s: cannot open directory '%s': %s", w->fs->base.url,
			  w->key, strerror(-ret));
		return ret;
	}
	if (w->tree && klen + 1 >= w->prefix_len) {
		ret = w->cb(w->arg, &oi);
		if (ret) {
			close(sub);
			return ret;
		}
	}
	return fs_walk_dir(w, sub, klen + 1);
}

/* One entry e of d, named w->key[0..klen) (copied there). */
static int fs_walk_entry(struct fs_walk *w, DIR *d, const struct fs_dirent *e,
			 size_t klen)
{
	struct objstore_info oi = { .key = w->key };
	struct stat st;
	bool keep;
	int ret;

	if (e->type == FS_DT_DIR && !(w->tree && fs_is_tmp(e->name)))
		return fs_walk_sub(w, d, e, klen);
	if (klen < w->prefix_len || memcmp(w->key, w->prefix, w->prefix_len))
		return 0;
	if (w->ucb)
		return fs_walk_tmp(w, dirfd(d), e);
	if (fs_is_tmp(e->name)) /* listed only in a tree listing */
		return fs_walk_skip(w, "a name reserved for dstage's "
				       "temporary files");
	ret = fs_walk_stat(w, dirfd(d), e, &st, &keep);
	if (ret || !keep)
		return ret;
	filestore_list_info(&st, &oi);
	return w->cb(w->arg, &oi);
}

/* List directory dfd (opened by the caller, closed here), whose key form is
 * w->key[0..keylen). */
static int fs_walk_dir(struct fs_walk *w, int dfd, size_t keylen)
{
	struct fs_dirent *ents = NULL;
	size_t n = 0;
	DIR *d = NULL;
	int ret = 0;

	w->depth++;
	ret = fdutil_fdopendir(dfd, &d);
	if (ret)
		goto out;
	ret = fs_read_dir(d, w->ucb || w->tree, &ents, &n);
	if (ret)
		goto out;
	if (n)
		qsort(ents, n, sizeof(*ents), fs_dirent_cmp);
	for (size_t i = 0; i < n && !ret; i++) {
		size_t nl = strlen(ents[i].name);

		if (keylen + nl + 2 > sizeof(w->key)) {
			w->key[keylen] = '\0';
			snprintf(w->why, sizeof(w->why),
				 "a directory holding a name whose path "
				 "would pass %zu bytes",
				 sizeof(w->key) - 2);
			ret = fs_walk_skip(w, w->why);
			continue;
		}
		memcpy(w->key + keylen, ents[i].name, nl + 1);
		ret = fs_walk_entry(w, d, &ents[i], keylen + nl);
	}
out:
	for (size_t i = 0; i < n; i++)
		free(ents[i].name);
	free(ents);
	if (d)
		closedir(d);
	w->key[keylen] = '\0';
	w->depth--;
	return ret;
}

static int fs_walk(struct objstore *os, const char *prefix, bool tree,
		   objstore_list_cb cb, objstore_upload_list_cb ucb, void *arg)
{
	struct fs_walk *w = calloc(1, sizeof(*w));
	int dfd, ret;

	if (!w)
		return -ENOMEM;
	w->fs = (struct filestore *)os;
	w->prefix = prefix;
	w->prefix_len = strlen(prefix);
	w->tree = tree;
	w->cb = cb;
	w->ucb = ucb;
	w->arg = arg;
	objstore_count(&os->n_requests, 1);
	dfd = openat(w->fs->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		ret = -errno;
		log_error("%s: cannot open directory %s: %s", os->url,
			  w->fs->root[0] ? w->fs->root : "/", strerror(errno));
	} else {
		ret = fs_walk_dir(w, dfd, 0);
	}
	free(w);
	return ret;
}

int filestore_list(struct objstore *os, const char *prefix, objstore_list_cb cb,
		   void *arg)
{
	return fs_walk(os, prefix, false, cb, NULL, arg);
}

int filestore_list_tree(struct objstore *os, const char *prefix,
			objstore_list_cb cb, void *arg)
{
	return fs_walk(os, prefix, true, cb, NULL, arg);
}

/* The temporary files (an upload's, or a put's) under prefix: the
 * uploads a process that died left open. */
int filestore_list_uploads(struct objstore *os, const char *prefix,
			   objstore_upload_list_cb cb, void *arg)
{
	return fs_walk(os, prefix, false, NULL, cb, arg);
}
