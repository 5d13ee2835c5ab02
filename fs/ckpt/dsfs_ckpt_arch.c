// SPDX-License-Identifier: MIT
/*
 * dsfs_ckpt_arch: checkpoints the lifecycle moved to their archive tier
 * (lib/lifecycle/lifecycle_run.c), as the checkpoint subtree shows them.
 *
 * A lookup or getattr of a name in an archived checkpoint shows it with
 * its attributes in the archive (a directory, or a file and its size) and
 * copies nothing: any local user may stat. The copy back (the recall) is
 * made by a read: an open for reading of a file (dsfs_ckpt_file_open, after
 * its own checks and the kernel's default_permissions) or the listing of
 * a directory in it (dsfs_ckpt_opendir). Each recall is audited in the
 * catalog as the reader's uid (action "lifecycle.recall"), the record
 * `cachectl audit` shows.
 */
#include <errno.h>
#include <pwd.h>
#include <stdlib.h>
#include <unistd.h>

#include "dsfs_caller.h"
#include "dsfs_ckpt_i.h"
#include "dstage/catalog.h"
#include "dstage/ckpt.h"
#include "dstage/lifecycle_run.h"

int dsfs_ckpt_arch_stat(struct dsfs *fs, const char *key, struct ckpt_attr *a)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct lifecycle_archived la;
	int ret;

	ret = lifecycle_archived_stat(fs->cfg, ckpt_objstore(st->ck), key, &la);
	if (ret)
		return ret;
	a->dir = la.dir;
	a->size = la.dir ? 0 : la.size;
	a->mtime = la.mtime;
	a->local = false;
	return 0;
}

int dsfs_ckpt_arch_recall(struct dsfs *fs, struct dsfs_caller *who,
			  const char *key)
{
	struct dsfs_ckpt *st = dsfs_ckpt_st(fs);
	struct catalog_audit a = { .uid = (uint32_t)who->uid };
	struct passwd pw, *res = NULL;
	char buf[1024];

	if (!key)
		return -ENOMEM;
	if (!getpwuid_r(who->uid, &pw, buf, sizeof(buf), &res) && res)
		a.user = res->pw_name;
	return lifecycle_recall(fs->cfg, ckpt_objstore(st->ck), key, &a);
}
