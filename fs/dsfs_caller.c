// SPDX-License-Identifier: MIT
/*
 * dsfs_caller: who is asking (see dsfs_caller.h). Stateless.
 */
#include <string.h>

#include "dsfs_caller.h"

#define DSFS_CALLER_MAX_GROUPS \
	((int)(sizeof(((struct dsfs_caller *)0)->groups) / sizeof(gid_t)))

void dsfs_caller_get(fuse_req_t req, struct dsfs_caller *who)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	who->uid = ctx->uid;
	who->gid = ctx->gid;
	who->pid = ctx->pid;
	who->req = req;
	who->released = false;
	who->ngroups = -1;
}

void dsfs_caller_none(struct dsfs_caller *who)
{
	memset(who, 0, sizeof(*who));
	who->ngroups = 0;
}

void dsfs_caller_load_groups(struct dsfs_caller *who)
{
	int n;

	if (who->ngroups != -1)
		return;
	if (!who->req) {
		who->ngroups = -2;
		return;
	}
	n = fuse_req_getgroups(who->req, DSFS_CALLER_MAX_GROUPS, who->groups);
	if (n > DSFS_CALLER_MAX_GROUPS)
		n = DSFS_CALLER_MAX_GROUPS;
	who->ngroups = n < 0 ? -2 : n;
}

bool dsfs_caller_in_group(struct dsfs_caller *who, gid_t gid)
{
	if (who->gid == gid)
		return true;
	dsfs_caller_load_groups(who);
	for (int i = 0; i < who->ngroups; i++)
		if (who->groups[i] == gid)
			return true;
	return false;
}
