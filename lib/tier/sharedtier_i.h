/* SPDX-License-Identifier: MIT */
/*
 * sharedtier's internals shared by its files: the manifest's list from the
 * catalog (sharedtier.c) and the tier's trust rule and safe opens
 * (sharedtier_trust.c; docs/security.md, "The shared tier"), the readers
 * (sharedtier_read.c).
 */
#ifndef DSTAGE_SHAREDTIER_I_H
#define DSTAGE_SHAREDTIER_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dstage/objstore.h"
#include "dstage/sharedtier.h"

struct catalog;
struct catalog_dataset;

struct sharedtier_file {
	char *key;
	uint64_t size;
	char etag[OBJSTORE_ETAG_MAX];
	bool has_expected;
	unsigned char expected[32];
	unsigned char actual[32];
};

struct sharedtier_list {
	struct sharedtier_file *v;
	size_t n, cap;
	char **dirs; /* directories still to read */
	size_t ndirs, dcap;
	const char *dir; /* the one being read ("" for the root) */
	size_t seen; /* entries of dir so far */
	char **empty; /* directories holding nothing, sorted */
	size_t nempty, ecap;
};

int sharedtier_join(char *buf, size_t len, const char *a, const char *b);
/* Every file of name's current manifest, sorted by key, and its empty
 * directories; the snapshot id (over both). */
int sharedtier_load(struct catalog *cat, const char *name,
		    struct sharedtier_list *l,
		    char snapshot[SHAREDTIER_SNAPSHOT_LEN + 1]);
void sharedtier_list_free(struct sharedtier_list *l);
/* The tier's base directory of ds: its own setting or ROOT/NAME. */
int sharedtier_base(const struct dstage_config *cfg,
		    const struct catalog_dataset *ds, char *buf, size_t len);
/* The length of base's root (the setting, or ROOT of ROOT/NAME). */
size_t sharedtier_rootlen(const struct catalog_dataset *ds, const char *base);

/*
 * The trust rule: path (not followed) is a directory or a regular file
 * owned by the service uid (or root) that neither its group nor others
 * may write. 0, -EACCES (writable by another uid), -EINVAL (another type),
 * or -errno of lstat; a failure is logged once per path and rule.
 */
int sharedtier_trusted(const char *path);
/* root, each directory from root down to dir, and everything below dir
 * (not followed): sharedtier_trusted's answer for the first that fails. */
int sharedtier_trusted_tree(const char *root, const char *dir);
/* sharedtier_trusted_tree for the readers, its answer remembered: used
 * again for SHAREDTIER_MEMO_MS while root and dir look the same (inode,
 * mode, owner, ctime, mtime); 16 copies at most, under a mutex. why: the
 * rule broken ("" when none), as logged. */
int sharedtier_trusted_copy(const char *root, const char *dir, char *why,
			    size_t len);
/* Open path read-only with O_NOFOLLOW | O_NONBLOCK, a regular file only
 * (then blocking again): the fd, or -EINVAL (another type; logged),
 * -ENOENT, -ELOOP (a symlink), -errno. */
int sharedtier_open_file(const char *path);

#endif
