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

#include "ckpt_i.h"

int ckpt_store_errno(int ret)
{
	if (ret == -ENOSPC || ret == -EDQUOT || ret == -ENOMEM || ret >= 0)
		return ret;
	return -EIO;
}

/* A segment is valid: not empty, ".", "..", not over NAME_MAX, no
 * ".dstage" prefix (the store's own names: sidecars, filestore's
 * temporaries). */
int ckpt_seg_ok(const char *s, size_t len)
{
	if (len == 0 || len > NAME_MAX)
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
