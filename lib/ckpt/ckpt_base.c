// SPDX-License-Identifier: MIT
/*
 * ckpt_base: the ckpt module's leaf helpers: what a valid key is, joining
 * keys, the sidecar key of a file, error mapping, the clock. Stateless.
 * (The module's files, top to bottom: ckpt_rename.c, ckpt.c,
 * ckpt_recover.c, ckpt_file.c, ckpt_stat.c, ckpt_journal.c, ckpt_base.c;
 * each calls only files below it. ckpt_i.h has the layout and the locks.)
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_i.h"
#include "dstage/log.h"

int ckpt_store_errno(int ret)
{
	if (ret == -ENOSPC || ret == -EDQUOT || ret == -ENOMEM || ret >= 0)
		return ret;
	return -EIO;
}

void ckpt_test_crash(const char *point)
{
	const char *at = getenv("DSTAGE_TEST_CRASH_AT");

	if (!at || strcmp(at, point))
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
		if (mkdirat(ck->tree_fd, path, CKPT_DIR_MODE) &&
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
