// SPDX-License-Identifier: MIT
/*
 * ckpt_base: the ckpt module's leaf helpers: what a valid key is, joining
 * keys, the sidecar key of a file, error mapping, the clock. Stateless.
 * (The module's files, top to bottom: ckpt_rename.c, ckpt.c,
 * ckpt_recover.c, ckpt_file.c, ckpt_stat.c, ckpt_journal.c, ckpt_base.c;
 * each calls only files below it. ckpt_i.h has the layout and the locks.)
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/log.h"
#include "dstage/sha256.h"
#include "util/strutil.h"

int ckpt_store_errno(int ret)
{
	if (ret == -ENOSPC || ret == -EDQUOT || ret == -ENOMEM || ret >= 0)
		return ret;
	return -EIO;
}

/* DSTAGE_TEST_CRASH_AT, read once (the first call): the hooks sit on
 * the write path, where a getenv per write would cost a scan of the
 * environment. */
static const char *ckpt_crash_at;
static pthread_once_t ckpt_crash_once = PTHREAD_ONCE_INIT;

static void ckpt_crash_read(void)
{
	const char *at = getenv("DSTAGE_TEST_CRASH_AT");

	ckpt_crash_at = at && *at ? strdup(at) : NULL;
}

void ckpt_test_crash(const char *point)
{
	pthread_once(&ckpt_crash_once, ckpt_crash_read);
	if (!ckpt_crash_at || strcmp(ckpt_crash_at, point))
		return;
	log_warn("checkpoints: DSTAGE_TEST_CRASH_AT=%s: exiting now, as a "
		 "crash would",
		 point);
	_exit(CKPT_TEST_CRASH_STATUS);
}

/* A segment is valid: not empty, ".", "..", not over NAME_MAX, no
 * ".dstage" prefix (the store's own names: sidecars, filestore's
 * temporaries), no control byte (0x00-0x1f, 0x7f: a name reaches logs,
 * the journal and terminals). */
int ckpt_seg_ok(const char *s, size_t len)
{
	if (len == 0 || len > NAME_MAX)
		return -EINVAL;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return -EINVAL;
	if ((len == 1 && s[0] == '.') ||
	    (len == 2 && s[0] == '.' && s[1] == '.'))
		return -EINVAL;
	if (len >= 7 && memcmp(s, ".dstage", 7) == 0)
		return -EINVAL;
	return 0;
}

int ckpt_key_ok(const char *key)
{
	const char *p = key, *slash;

	if (!*key)
		return 0;
	if (strlen(key) >= 4000)
		return -ENAMETOOLONG;
	for (;;) {
		slash = strchr(p, '/');
		if (ckpt_seg_ok(p, slash ? (size_t)(slash - p) : strlen(p)))
			return -EINVAL;
		if (!slash)
			return 0;
		p = slash + 1;
	}
}

int ckpt_name_ok(const char *dirkey, const char *name)
{
	(void)dirkey;
	if (strchr(name, '/'))
		return -EINVAL;
	return ckpt_seg_ok(name, strlen(name));
}

int ckpt_key_new_ok(const struct ckpt *ck, const char *key)
{
	int ret = ckpt_key_ok(key);

	if (ret)
		return ret;
	return strlen(key) > ck->key_max ? -ENAMETOOLONG : 0;
}

int ckpt_key_check(const struct ckpt *ck, const char *key)
{
	return ckpt_key_new_ok(ck, key);
}

size_t ckpt_key_max_of(const char *url)
{
	size_t prefix = 0;
	const char *p;

	if (!strncmp(url, "s3://", 5) && (p = strchr(url + 5, '/')))
		prefix = strlen(p + 1);
	_Static_assert(CKPT_AUX_KEY_EXTRA >= sizeof(CKPT_SIDECAR) - 1,
		       "the owner record's key is the longest");
	if (prefix + CKPT_AUX_KEY_EXTRA >= CKPT_STORE_KEY_MAX)
		return 0;
	return CKPT_STORE_KEY_MAX - prefix - CKPT_AUX_KEY_EXTRA;
}

char *ckpt_key_join(const char *dir, const char *name)
{
	size_t dl = strlen(dir), nl = strlen(name);
	char *k = malloc(dl + nl + 2);

	if (!k)
		return NULL;
	if (dl) {
		memcpy(k, dir, dl);
		k[dl++] = '/';
	}
	memcpy(k + dl, name, nl + 1);
	return k;
}

char *ckpt_sidecar_key(const char *key)
{
	return ckpt_key_join(".dstage-sha256", key);
}

/* The tree path of key for the *at calls ("." for the top). */
const char *ckpt_tpath(const char *key)
{
	return *key ? key : ".";
}

int ckpt_tree_mkparents(struct ckpt *ck, const char *key)
{
	char path[4096];
	size_t len = strlen(key);

	if (len >= sizeof(path))
		return -ENAMETOOLONG;
	memcpy(path, key, len + 1);
	for (char *p = strchr(path, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		if (mkdirat(ck->dirs.tree_fd, path, CKPT_DIR_MODE) &&
		    errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

const char *ckpt_url(const struct ckpt *ck)
{
	return objstore_url(ck->os);
}

struct objstore *ckpt_objstore(const struct ckpt *ck)
{
	return ck->os;
}

/* The url a store is known by in the staging directory: without its
 * trailing '/' (s3://b/p and s3://b/p/ are one store). */
static size_t ckpt_store_id_len(const char *url)
{
	size_t len = strlen(url);

	while (len > 1 && url[len - 1] == '/')
		len--;
	return len;
}

int ckpt_store_subdir(const char *url, char *out, size_t size)
{
	unsigned char md[SHA256_LEN];
	size_t n;

	if (sha256_buf(url, ckpt_store_id_len(url), md))
		return -EIO;
	n = strlen(CKPT_STORES "/");
	if (size < n + 2 * CKPT_STORE_HASH_BYTES + 1)
		return -ENAMETOOLONG;
	memcpy(out, CKPT_STORES "/", n);
	strutil_hex(md, CKPT_STORE_HASH_BYTES, out + n);
	return 0;
}

/* Check (or, when new, write) the store file of the store directory dfd:
 * it names url. */
static int ckpt_store_file(int dfd, const char *path, const char *url,
			   bool create)
{
	size_t len = ckpt_store_id_len(url);
	char buf[4200];
	ssize_t got;
	int fd, ret = 0;

	fd = openat(dfd, CKPT_STORE_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && create) {
		fd = openat(dfd, CKPT_STORE_FILE,
			    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
				    O_CLOEXEC,
			    0600);
		if (fd < 0)
			return -errno;
		if (write(fd, url, len) != (ssize_t)len ||
		    write(fd, "\n", 1) != 1 || fsync(fd))
			ret = errno ? -errno : -EIO;
		close(fd);
		return ret;
	}
	if (fd < 0)
		return -errno;
	got = read(fd, buf, sizeof(buf) - 1);
	ret = got < 0 ? -errno : 0;
	close(fd);
	if (got < 0)
		return ret;
	buf[got] = '\0';
	if ((size_t)got != len + 1 || memcmp(buf, url, len) ||
	    buf[len] != '\n') {
		buf[strcspn(buf, "\n")] = '\0';
		log_error("checkpoints: %s/%s names the store \"%.1024s\", "
			  "not %.*s: this staging subdirectory is another "
			  "store's; refusing to use it (set "
			  "checkpoints.staging_dir to another directory, or "
			  "remove %s once that store's files are published)",
			  path, CKPT_STORE_FILE, buf, (int)len, url, path);
		return -EINVAL;
	}
	return 0;
}

int ckpt_store_dir_open(int sdfd, const char *staging, const char *url,
			bool create, int *out, char **path_out)
{
	char sub[128], *path = NULL;
	int fd = -1, ret;

	*out = -1;
	ret = ckpt_store_subdir(url, sub, sizeof(sub));
	if (ret)
		return ret;
	if (create && mkdirat(sdfd, CKPT_STORES, CKPT_DIR_MODE) &&
	    errno != EEXIST)
		return -errno;
	if (create && mkdirat(sdfd, sub, CKPT_DIR_MODE) && errno != EEXIST)
		return -errno;
	fd = openat(sdfd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (asprintf(&path, "%s/%s", staging, sub) < 0) {
		path = NULL;
		ret = -ENOMEM;
		goto err;
	}
	ret = ckpt_store_file(fd, path, url, create);
	if (ret)
		goto err;
	*out = fd;
	if (path_out)
		*path_out = path;
	else
		free(path);
	return 0;
err:
	free(path);
	close(fd);
	return ret;
}
