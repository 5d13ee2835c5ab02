// SPDX-License-Identifier: MIT
/*
 * drill: `stager drill JOB [--step S] --to DIR [--json]`, the recovery drill
 * of the checkpoint store, run in this process (no daemon). The work is
 * libdstage's ckpt_drill (include/dstage/ckpt_drill.h); this file turns its
 * result into output and an exit code. Stateless.
 *
 * Not yet wired into stager/main.c and stager/CMakeLists.txt (another
 * change owns them): the hook lines are in this file's first commit.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dstage/ckpt_drill.h"
#include "stager.h"

int local_drill(const struct dstage_config *cfg, const char *job,
		const char *step, const char *to, bool json)
{
	struct ckpt_drill_opts o = { .job = job, .step = step, .to = to };
	struct ckpt_drill_report r;
	int ret;

	if (!to) {
		fprintf(stderr, "stager drill: --to DIR is required: an empty "
				"or new scratch directory\n");
		return STAGER_EXIT_USAGE;
	}
	ret = ckpt_drill(cfg, &o, &r);
	if (ret) {
		fprintf(stderr, "stager drill %s: %s\n", job, strerror(-ret));
		return ret == -ENOENT			  ? STAGER_EXIT_NOENT
		       : ret == -EINVAL || ret == -EEXIST ? STAGER_EXIT_USAGE
							  : STAGER_EXIT_FAIL;
	}
	ckpt_drill_print(&r, json, stdout);
	ret = r.nbad ? STAGER_EXIT_FAIL : STAGER_EXIT_OK;
	ckpt_drill_release(&r);
	return ret;
}
