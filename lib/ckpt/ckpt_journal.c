// SPDX-License-Identifier: MIT
/*
 * ckpt_journal: the records of the local copies (staging_dir/journal/<ino>,
 * format in ckpt_i.h), the staging space they take, the eviction of clean
 * copies, and moving unfinished files to abandoned/. (What a restart and
 * the retry thread do with the records: ckpt_recover.c.)
 *
 * Record life: W when a file is created or first changed; P once it is
 * closed or synced and its SHA-256 computed, just before the upload; C with
 * the store's ETag once published. A record is replaced atomically (a
 * temporary file renamed over it); a P record left by a failed publish is
 * fsynced together with its file. Records whose file is gone (or is another
 * inode now) are dropped by the scan (ckpt_recover.c).
 *
 * ck->used (the staging bytes) and the entry list are under ck->lock.
 * Also the staging bounds per uid (ck->uids: uid_staging_size and its
 * share, uid_files).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/log.h"
#include "util/fdutil.h"

/* ---- locks shared with the stager daemon (see ckpt_i.h) ---- */

static int ckpt_flock(int fd, int op)
{
	while (flock(fd, op)) {
		if (errno != EINTR)
			return errno == EWOULDBLOCK ? -EBUSY : -errno;
	}
	return 0;
}

int ckpt_lock_use(int fd)
{
	return ckpt_flock(fd, LOCK_SH);
}

int ckpt_lock_drop(int fd)
{
	return ckpt_flock(fd, LOCK_EX | LOCK_NB);
}

static int ckpt_ofd_lock(int fd, short type, bool wait)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET };

	while (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl)) {
		if (errno != EINTR)
			return errno == EAGAIN || errno == EACCES ? -EBUSY
								  : -errno;
	}
	return 0;
}

int ckpt_lock_publish(int fd, bool wait)
{
	return ckpt_ofd_lock(fd, F_WRLCK, wait);
}

void ckpt_unlock_publish(int fd)
{
	ckpt_ofd_lock(fd, F_UNLCK, false);
}

/* ---- records ---- */

/*
 * The key and upload lines of a record are escaped (a record whose first
 * line ends in " %" says so): every byte below 0x21, 0x7f and '%' as %XX,
 * so no name, nor an upload id a store returned, can end a line early and
 * forge the fields that follow. Records without the mark (written before)
 * are read as they are.
 */
static size_t ckpt_esc(char *out, size_t size, const char *s)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = 0;

	for (; *s && n + 4 < size; s++) {
		unsigned char c = (unsigned char)*s;

		if (c <= 0x20 || c == 0x7f || c == '%') {
			out[n++] = '%';
			out[n++] = hex[c >> 4];
			out[n++] = hex[c & 15];
		} else {
			out[n++] = (char)c;
		}
	}
	out[n] = '\0';
	return n;
}

static int ckpt_hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Undo ckpt_esc into out (size bytes): 0, or -EINVAL (a bad escape, a
 * NUL, or too long). */
static int ckpt_unesc(char *out, size_t size, const char *s)
{
	size_t n = 0;

	for (; *s; s++) {
		int c = (unsigned char)*s;

		if (c == '%') {
			int hi = ckpt_hexval(s[1]),
			    lo = hi < 0 ? -1 : ckpt_hexval(s[2]);

			if (lo < 0 || (hi == 0 && lo == 0))
				return -EINVAL;
			c = hi * 16 + lo;
			s += 2;
		}
		if (n + 1 >= size)
			return -EINVAL;
		out[n++] = (char)c;
	}
	out[n] = '\0';
	return 0;
}

int ckpt_journal_write(const struct ckpt_dirs *d, ino_t ino,
		       const struct ckpt_rec *r, bool durable)
{
	char name[32], tmp[40];
	/* each escaped byte takes at most 3 */
	char buf[3 * (sizeof(r->key) + sizeof(r->upload_key) +
		      sizeof(r->upload_id)) +
		 512];
	size_t len;
	int fd, ret = 0;

	snprintf(name, sizeof(name), "%ju", (uintmax_t)ino);
	snprintf(tmp, sizeof(tmp), ".%s.tmp", name);
	len = (size_t)snprintf(buf, sizeof(buf), "%c %s %" PRIu64 " %s %%\n",
			       r->state, r->sha[0] ? r->sha : "-", r->size,
			       r->etag[0] ? r->etag : "-");
	len += ckpt_esc(buf + len, sizeof(buf) - len - 1, r->key);
	buf[len++] = '\n';
	if (r->upload_id[0]) {
		buf[len++] = 'u';
		buf[len++] = ' ';
		len += ckpt_esc(buf + len, sizeof(buf) - len - 1, r->upload_id);
		buf[len++] = '\n';
		len += ckpt_esc(buf + len, sizeof(buf) - len - 1,
				r->upload_key);
		buf[len++] = '\n';
	}
	fd = openat(d->journal_fd, tmp,
		    O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
		    0600);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	if (write(fd, buf, len) != (ssize_t)len)
		ret = errno ? -errno : -EIO;
	if (!ret && durable && fsync(fd))
		ret = -errno;
	close(fd);
	if (!ret && renameat(d->journal_fd, tmp, d->journal_fd, name))
		ret = -errno;
	if (!ret && durable && fsync(d->journal_fd))
		ret = -errno;
out:
	if (ret)
		log_error("checkpoints: cannot write the record of %s in "
			  "%s/%s: %s",
			  r->key, d->staging, CKPT_JOURNAL, strerror(-ret));
	return ret;
}

int ckpt_journal_read(const struct ckpt_dirs *d, ino_t ino, struct ckpt_rec *r)
{
	char name[32], sha[80], etag[160], mark[4] = "";
	char buf[3 * (sizeof(r->key) + sizeof(r->upload_key) +
		      sizeof(r->upload_id)) +
		 512];
	char *nl, *key, *up;
	bool esc;
	ssize_t n;
	int fd, fields;

	memset(r, 0, sizeof(*r));
	snprintf(name, sizeof(name), "%ju", (uintmax_t)ino);
	fd = openat(d->journal_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -ENOENT;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		goto bad;
	buf[n] = '\0';
	nl = strchr(buf, '\n');
	if (!nl)
		goto bad;
	*nl = '\0';
	key = nl + 1;
	nl = strchr(key, '\n');
	if (!nl)
		goto bad;
	*nl = '\0';
	fields = sscanf(buf, "%c %79s %" SCNu64 " %159s %3s", &r->state, sha,
			&r->size, etag, mark);
	esc = fields == 5 && !strcmp(mark, "%");
	if (fields < 4 || (fields == 5 && !esc) || !r->state ||
	    !strchr("WPC", r->state) || strlen(sha) >= sizeof(r->sha) ||
	    strlen(etag) >= sizeof(r->etag))
		goto bad;
	if (strcmp(sha, "-"))
		memcpy(r->sha, sha, strlen(sha) + 1); /* fits: checked */
	if (strcmp(etag, "-"))
		memcpy(r->etag, etag, strlen(etag) + 1); /* fits: checked */
	if (esc ? ckpt_unesc(r->key, sizeof(r->key), key)
		: strlen(key) >= sizeof(r->key))
		goto bad;
	if (!esc)
		snprintf(r->key, sizeof(r->key), "%s", key);
	/* Optional: "u <upload id>\n<its key>\n", an upload maybe open. */
	up = nl + 1;
	if (!strncmp(up, "u ", 2) && (nl = strchr(up, '\n'))) {
		char *ukey = nl + 1, *end = strchr(ukey, '\n');

		*nl = '\0';
		if (end && esc) {
			*end = '\0';
			if (ckpt_unesc(r->upload_id, sizeof(r->upload_id),
				       up + 2) ||
			    ckpt_unesc(r->upload_key, sizeof(r->upload_key),
				       ukey))
				r->upload_id[0] = r->upload_key[0] = '\0';
		} else if (end &&
			   (size_t)(nl - up - 2) < sizeof(r->upload_id) &&
			   (size_t)(end - ukey) < sizeof(r->upload_key)) {
			*end = '\0';
			snprintf(r->upload_id, sizeof(r->upload_id), "%s",
				 up + 2);
			snprintf(r->upload_key, sizeof(r->upload_key), "%s",
				 ukey);
		}
		if (!r->upload_id[0]) /* an upload line without an id */
			r->upload_key[0] = '\0';
	}
	return 0;
bad:
	log_warn("checkpoints: unreadable record %s/%s/%s: ignored", d->staging,
		 CKPT_JOURNAL, name);
	r->state = 0;
	return -EINVAL;
}

void ckpt_dirs_close(struct ckpt_dirs *d)
{
	int *fds[] = { &d->tree_fd, &d->journal_fd, &d->abandoned_fd,
		       &d->owners_fd };

	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
	free(d->staging);
	d->staging = NULL;
}

int ckpt_journal_name(const char *name, ino_t *ino)
{
	char *end;
	uintmax_t v;

	if (name[0] < '0' || name[0] > '9')
		return -EINVAL;
	errno = 0;
	v = strtoumax(name, &end, 10);
	if (*end || errno || v != (uintmax_t)(ino_t)v)
		return -EINVAL;
	*ino = (ino_t)v;
	return 0;
}

int ckpt_journal_live(const struct ckpt_dirs *d, ino_t ino,
		      struct ckpt_rec *rec, struct stat *st)
{
	if (ckpt_journal_read(d, ino, rec) || !rec->key[0] ||
	    ckpt_key_ok(rec->key) ||
	    fstatat(d->tree_fd, rec->key, st, AT_SYMLINK_NOFOLLOW) ||
	    st->st_ino != ino || !S_ISREG(st->st_mode))
		return -ENOENT;
	return 0;
}

void ckpt_journal_remove(const struct ckpt_dirs *d, ino_t ino)
{
	char name[32];

	snprintf(name, sizeof(name), "%ju", (uintmax_t)ino);
	unlinkat(d->journal_fd, name, 0);
}

void ckpt_journal_abandon(struct ckpt *ck, ino_t ino, const char *key,
			  const char *why)
{
	const char *base = strrchr(key, '/');
	char name[300];
	struct stat st;

	if (fstatat(ck->dirs.tree_fd, key, &st, AT_SYMLINK_NOFOLLOW) ||
	    st.st_ino != ino)
		return;
	snprintf(name, sizeof(name), "%ju-%.200s", (uintmax_t)ino,
		 base ? base + 1 : key);
	if (renameat(ck->dirs.tree_fd, key, ck->dirs.abandoned_fd, name)) {
		log_error("checkpoints: cannot move the unfinished %s to "
			  "%s/%s/: %s",
			  key, ck->dirs.staging, CKPT_ABANDONED,
			  strerror(errno));
		return;
	}
	ckpt_journal_remove(&ck->dirs, ino);
	/* no longer a local copy, but still held: it counts as abandoned
	 * (against staging_size and its uid) until it is removed */
	ckpt_space(ck, st.st_uid, -(int64_t)st.st_size);
	pthread_mutex_lock(&ck->lock);
	ckpt_files_locked(ck, st.st_uid, -1);
	ck->ab_used += (uint64_t)st.st_size;
	for (size_t i = 0; i < ck->n_uids; i++) {
		if (ck->uids[i].uid == st.st_uid) {
			ck->uids[i].ab_bytes += (uint64_t)st.st_size;
			ck->uids[i].ab_files++;
		}
	}
	pthread_mutex_unlock(&ck->lock);
	log_warn("checkpoints: %s: %s; not published (the store keeps what "
		 "it had); the partial file is %s/%s/%s",
		 key, why, ck->dirs.staging, CKPT_ABANDONED, name);
}

/* Rekey the records of every file under the open directory dfd (key). */
static void ckpt_rekey_dir(struct ckpt *ck, int dfd, const char *key, int depth)
{
	struct dirent *de;
	DIR *d;

	if (fdutil_fdopendir(dfd, &d))
		return;
	while ((de = readdir(d))) {
		struct ckpt_rec rec;
		struct stat st;
		char *ck_key;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW))
			continue;
		ck_key = ckpt_key_join(key, de->d_name);
		if (!ck_key)
			break;
		if (S_ISDIR(st.st_mode) && depth < 256) {
			int sub = openat(dirfd(d), de->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
						 O_CLOEXEC);

			if (sub >= 0)
				ckpt_rekey_dir(ck, sub, ck_key, depth + 1);
		} else if (S_ISREG(st.st_mode) &&
			   !ckpt_journal_read(&ck->dirs, st.st_ino, &rec)) {
			snprintf(rec.key, sizeof(rec.key), "%s", ck_key);
			ckpt_journal_write(&ck->dirs, st.st_ino, &rec, false);
		}
		free(ck_key);
	}
	closedir(d);
}

void ckpt_journal_rekey(struct ckpt *ck, const char *key)
{
	int dfd = openat(ck->dirs.tree_fd, key,
			 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (dfd >= 0)
		ckpt_rekey_dir(ck, dfd, key, 0);
}

bool ckpt_is_open_locked(struct ckpt *ck, const char *key)
{
	for (struct ckpt_ent *e = ck->ents; e; e = e->next)
		if (!strcmp(e->key, key))
			return true;
	return false;
}

struct ckpt_victim {
	ino_t ino;
	int64_t mtime;
	uint64_t size;
	uid_t uid;
	char *key;
};

/* uid's local copy of size bytes is gone (ck->lock held; ck->used is the
 * caller's). */
static void ckpt_uid_freed_locked(struct ckpt *ck, uid_t uid, uint64_t size)
{
	struct ckpt_uid_use *u = ckpt_uid_locked(ck, uid);

	if (!u)
		return;
	u->bytes -= size < u->bytes ? size : u->bytes;
	u->files -= u->files ? 1 : 0;
}

static int ckpt_victim_cmp(const void *x, const void *y)
{
	const struct ckpt_victim *a = x, *b = y;

	return (a->mtime > b->mtime) - (a->mtime < b->mtime);
}

void ckpt_journal_evict_locked(struct ckpt *ck, uint64_t need)
{
	struct ckpt_victim *v = NULL;
	size_t n = 0, cap = 0;
	uint64_t freed = 0;
	struct ckpt_rec rec;
	struct dirent *de;
	DIR *d;

	if (fdutil_opendir(ck->dirs.journal_fd, &d))
		return;
	while ((de = readdir(d))) {
		struct stat st;
		ino_t ino;

		if (ckpt_journal_name(de->d_name, &ino) ||
		    ckpt_journal_live(&ck->dirs, ino, &rec, &st) ||
		    rec.state != 'C' || ckpt_is_open_locked(ck, rec.key))
			continue;
		if (GROW_ONE(v, n, cap, 64))
			break;
		v[n].key = strdup(rec.key);
		if (!v[n].key)
			break;
		v[n].ino = ino;
		v[n].mtime = st.st_mtim.tv_sec;
		v[n].size = (uint64_t)st.st_size;
		v[n].uid = st.st_uid;
		n++;
	}
	closedir(d);
	if (n)
		qsort(v, n, sizeof(*v), ckpt_victim_cmp);
	for (size_t i = 0; i < n; i++) {
		if (freed < need && !unlinkat(ck->dirs.tree_fd, v[i].key, 0)) {
			ckpt_journal_remove(&ck->dirs, v[i].ino);
			freed += v[i].size;
			ckpt_uid_freed_locked(ck, v[i].uid, v[i].size);
			log_debug("checkpoints: dropped the local copy of %s "
				  "(published)",
				  v[i].key);
		}
		free(v[i].key);
	}
	free(v);
	ck->used -= freed < ck->used ? freed : ck->used;
}

/* ---- the retry thread ---- */

struct ckpt_ent *ckpt_ent_find_locked(struct ckpt *ck, const char *key)
{
	for (struct ckpt_ent *e = ck->ents; e; e = e->next) {
		if (strcmp(e->key, key) == 0) {
			e->refs++;
			return e;
		}
	}
	return NULL;
}

struct ckpt_uid_use *ckpt_uid_locked(struct ckpt *ck, uid_t uid)
{
	struct ckpt_uid_use *u;

	for (size_t i = 0; i < ck->n_uids; i++)
		if (ck->uids[i].uid == uid)
			return &ck->uids[i];
	if (ck->n_uids == ck->cap_uids &&
	    (ck->cap_uids ? ck->cap_uids * 2 : 16) > CKPT_UIDS_MAX)
		return NULL;
	if (GROW_ONE(ck->uids, ck->n_uids, ck->cap_uids, 16))
		return NULL;
	u = &ck->uids[ck->n_uids++];
	memset(u, 0, sizeof(*u));
	u->uid = uid;
	return u;
}

void ckpt_uid_log_locked(struct ckpt *ck, uid_t uid, const char *opt,
			 uint64_t value, const char *unit)
{
	ckpt_uid_log_what_locked(ck, uid, opt, value, unit,
				 "abandoned files included", ck->dirs.staging);
}

void ckpt_uid_log_what_locked(struct ckpt *ck, uid_t uid, const char *opt,
			      uint64_t value, const char *unit,
			      const char *what, const char *where)
{
	int64_t now = timeutil_mono_ms();

	if (ck->uid_logged_ms && now - ck->uid_logged_ms < 10000)
		return;
	ck->uid_logged_ms = now;
	log_warn("checkpoints: uid %u reached checkpoints.%s (%" PRIu64
		 " %s, %s) in %s: its writes and "
		 "creates fail with EDQUOT until it removes files",
		 (unsigned)uid, opt, value, unit, what, where);
}

int ckpt_files_locked(struct ckpt *ck, uid_t uid, int delta)
{
	struct ckpt_uid_use *u = ckpt_uid_locked(ck, uid);

	if (!u)
		return 0;
	if (delta < 0) {
		u->files -= u->files ? 1 : 0;
		return 0;
	}
	if (uid != 0 && ck->uid_files &&
	    u->files + u->ab_files >= ck->uid_files) {
		ckpt_uid_log_locked(ck, uid, "uid_files", ck->uid_files,
				    "files");
		return -EDQUOT;
	}
	u->files++;
	return 0;
}

int ckpt_files(struct ckpt *ck, uid_t uid, int delta)
{
	int ret;

	pthread_mutex_lock(&ck->lock);
	ret = ckpt_files_locked(ck, uid, delta);
	pthread_mutex_unlock(&ck->lock);
	return ret;
}

/* Bound on the entries of abandoned/ one recount reads. */
#define CKPT_ABANDONED_MAX (1u << 20)

/* Add size bytes of a file of uid to the table t (n of cap). -ENOMEM. */
static int ckpt_tally(struct ckpt_uid_use **t, size_t *n, size_t *cap,
		      uid_t uid, uint64_t size)
{
	size_t i;

	for (i = 0; i < *n && (*t)[i].uid != uid; i++)
		;
	if (i == *n) {
		if (*n == *cap && (*cap ? *cap * 2 : 16) > CKPT_UIDS_MAX)
			return -ENOMEM;
		if (GROW_ONE(*t, *n, *cap, 16))
			return -ENOMEM;
		memset(&(*t)[i], 0, sizeof(**t));
		(*t)[i].uid = uid;
		(*n)++;
	}
	(*t)[i].bytes += size;
	(*t)[i].files++;
	return 0;
}

/* Bound on the entries one recount reads in a directory. */
#define CKPT_RECOUNT_MAX (1u << 22)

/* Tally the files of abandoned/ (abandoned true) or the local copies the
 * journal names into t; the total bytes into *total. */
static void ckpt_count_dir(struct ckpt *ck, bool abandoned,
			   struct ckpt_uid_use **t, size_t *n, size_t *cap,
			   uint64_t *total)
{
	int dirfd = abandoned ? ck->dirs.abandoned_fd : ck->dirs.journal_fd;
	struct ckpt_rec rec;
	unsigned seen = 0;
	struct dirent *de;
	DIR *d;

	if (fdutil_opendir(dirfd, &d))
		return;
	while ((de = readdir(d)) && seen++ < CKPT_RECOUNT_MAX) {
		struct stat st;
		ino_t ino;

		if (abandoned) {
			if (fstatat(dirfd, de->d_name, &st,
				    AT_SYMLINK_NOFOLLOW))
				continue;
		} else if (ckpt_journal_name(de->d_name, &ino) ||
			   ckpt_journal_live(&ck->dirs, ino, &rec, &st)) {
			continue;
		}
		if (!S_ISREG(st.st_mode))
			continue;
		*total += (uint64_t)st.st_size;
		if (ckpt_tally(t, n, cap, st.st_uid, (uint64_t)st.st_size))
			break;
	}
	closedir(d);
}

void ckpt_live_count(struct ckpt *ck)
{
	struct ckpt_uid_use *t = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;

	ckpt_count_dir(ck, false, &t, &n, &cap, &total);
	pthread_mutex_lock(&ck->lock);
	for (size_t i = 0; i < ck->n_uids; i++)
		ck->uids[i].bytes = ck->uids[i].files = 0;
	for (size_t i = 0; i < n; i++) {
		struct ckpt_uid_use *u = ckpt_uid_locked(ck, t[i].uid);

		if (u) {
			u->bytes = t[i].bytes;
			u->files = t[i].files;
		}
	}
	ck->used = total;
	pthread_mutex_unlock(&ck->lock);
	free(t);
}

void ckpt_abandoned_count(struct ckpt *ck)
{
	struct ckpt_uid_use *t = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;

	ckpt_count_dir(ck, true, &t, &n, &cap, &total);
	pthread_mutex_lock(&ck->lock);
	for (size_t i = 0; i < ck->n_uids; i++)
		ck->uids[i].ab_bytes = ck->uids[i].ab_files = 0;
	for (size_t i = 0; i < n; i++) {
		struct ckpt_uid_use *u = ckpt_uid_locked(ck, t[i].uid);

		if (u) {
			u->ab_bytes = t[i].bytes;
			u->ab_files = t[i].files;
		}
	}
	ck->ab_used = total;
	pthread_mutex_unlock(&ck->lock);
	free(t);
}

/* ---- checkpoints.staging_size shared between uids (issue 42) ----
 *
 * The share of staging_size one uid may hold falls as more uids hold
 * staging bytes, so that a few cannot starve the rest, and abandoned files
 * are removed, oldest first, when a write needs their room
 * (docs/checkpoints.md, "Staging bounds per uid"). */

uint64_t ckpt_uid_share_locked(struct ckpt *ck, const struct ckpt_uid_use *u,
			       unsigned *holders)
{
	uint64_t share;
	unsigned n = 1; /* u, holding bytes or about to */

	for (size_t i = 0; i < ck->n_uids; i++) {
		const struct ckpt_uid_use *o = &ck->uids[i];

		if (o != u && o->uid != 0 && (o->bytes || o->ab_bytes))
			n++;
	}
	*holders = n;
	share = ck->limit / ((uint64_t)n + 1);
	return ck->uid_limit && ck->uid_limit < share ? ck->uid_limit : share;
}

void ckpt_uid_share_log_locked(struct ckpt *ck, uid_t uid, uint64_t share,
			       unsigned holders)
{
	char what[160];

	if (ck->uid_limit && ck->uid_limit <= share)
		snprintf(what, sizeof(what), "abandoned files included");
	else
		snprintf(what, sizeof(what),
			 "its share of checkpoints.staging_size with %u uids "
			 "holding staging bytes, abandoned files included",
			 holders);
	ckpt_uid_log_what_locked(ck, uid, "uid_staging_size", share, "bytes",
				 what, ck->dirs.staging);
}

struct ckpt_ab_file {
	char name[300];
	int64_t mtime;
	uint64_t size;
	uid_t uid;
};

static int ckpt_ab_file_cmp(const void *x, const void *y)
{
	const struct ckpt_ab_file *a = x, *b = y;

	return (a->mtime > b->mtime) - (a->mtime < b->mtime);
}

/* Bound on the entries of abandoned/ one reclaim reads. */
#define CKPT_RECLAIM_MAX (1u << 20)

/* The regular files of abandoned/ into *v (*n of them), oldest first. */
static void ckpt_ab_list(struct ckpt *ck, struct ckpt_ab_file **v, size_t *n)
{
	size_t cap = 0;
	unsigned seen = 0;
	struct dirent *de;
	DIR *d;

	*v = NULL;
	*n = 0;
	if (fdutil_opendir(ck->dirs.abandoned_fd, &d))
		return;
	while ((de = readdir(d)) && seen++ < CKPT_RECLAIM_MAX) {
		struct stat st;

		if (strlen(de->d_name) >= sizeof((*v)->name) ||
		    fstatat(ck->dirs.abandoned_fd, de->d_name, &st,
			    AT_SYMLINK_NOFOLLOW) ||
		    !S_ISREG(st.st_mode))
			continue;
		if (GROW_ONE(*v, *n, cap, 64))
			break;
		snprintf((*v)[*n].name, sizeof((*v)->name), "%s", de->d_name);
		(*v)[*n].mtime = st.st_mtim.tv_sec;
		(*v)[*n].size = (uint64_t)st.st_size;
		(*v)[*n].uid = st.st_uid;
		(*n)++;
	}
	closedir(d);
	if (*n)
		qsort(*v, *n, sizeof(**v), ckpt_ab_file_cmp);
}

void ckpt_abandoned_reclaim_locked(struct ckpt *ck, uid_t uid, uint64_t need)
{
	struct ckpt_ab_file *v;
	uint64_t freed = 0;
	size_t n;

	ckpt_ab_list(ck, &v, &n);
	for (size_t i = 0; i < n && freed < need; i++) {
		struct ckpt_uid_use *o;

		if (unlinkat(ck->dirs.abandoned_fd, v[i].name, 0))
			continue;
		freed += v[i].size;
		o = ckpt_uid_locked(ck, v[i].uid);
		if (o) {
			o->ab_bytes -= v[i].size < o->ab_bytes ? v[i].size
							       : o->ab_bytes;
			o->ab_files -= o->ab_files ? 1 : 0;
		}
		ck->ab_used -=
			v[i].size < ck->ab_used ? v[i].size : ck->ab_used;
		log_warn("checkpoints: removed the abandoned file %s/%s/%s of "
			 "uid %u (%" PRIu64 " bytes, the oldest there) to make "
			 "room in checkpoints.staging_size for a write of "
			 "uid %u",
			 ck->dirs.staging, CKPT_ABANDONED, v[i].name,
			 (unsigned)v[i].uid, v[i].size, (unsigned)uid);
	}
	free(v);
}

int ckpt_space(struct ckpt *ck, uid_t uid, int64_t growth)
{
	static int64_t last_log;
	uint64_t g = (uint64_t)growth, held, share = 0;
	struct ckpt_uid_use *u;
	unsigned holders = 0;
	int ret = 0;

	pthread_mutex_lock(&ck->lock);
	u = ckpt_uid_locked(ck, uid);
	if (growth <= 0) {
		g = (uint64_t)-growth;
		ck->used -= g < ck->used ? g : ck->used;
		if (u)
			u->bytes -= g < u->bytes ? g : u->bytes;
	} else if (u && uid != 0 &&
		   (share = ckpt_uid_share_locked(ck, u, &holders)) &&
		   u->bytes + u->ab_bytes + g > share) {
		ret = -EDQUOT;
		ckpt_uid_share_log_locked(ck, uid, share, holders);
	} else {
		held = ck->used + ck->ab_used;
		if (held + g > ck->limit)
			ckpt_journal_evict_locked(ck, held + g - ck->limit);
		held = ck->used + ck->ab_used;
		if (held + g > ck->limit)
			ckpt_abandoned_reclaim_locked(ck, uid,
						      held + g - ck->limit);
		held = ck->used + ck->ab_used;
		if (held + g > ck->limit) {
			ret = -ENOSPC;
			if (timeutil_mono_ms() - last_log > 10000) {
				last_log = timeutil_mono_ms();
				log_warn(
					"checkpoints: checkpoints.staging_size "
					"(%" PRIu64 " bytes) reached in %s and "
					"nothing published nor abandoned to "
					"drop: writes fail with ENOSPC; raise "
					"it",
					ck->limit, ck->dirs.staging);
			}
		} else {
			ck->used += g;
			if (u)
				u->bytes += g;
		}
	}
	pthread_mutex_unlock(&ck->lock);
	return ret;
}
