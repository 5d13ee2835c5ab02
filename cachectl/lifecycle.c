// SPDX-License-Identifier: MIT
/*
 * lifecycle (cachectl): `cachectl lifecycle list|add|remove|run`, the same
 * requests and output as `stager lifecycle` (stager/lifecycle.c, linked
 * as the stager_lifecycle library). Stateless.
 */
#include "cachectl.h"
#include "lifecycle.h"

int lifecycle_cachectl_run(const struct dstage_config *cfg,
			   const struct cachectl_cmd *cmd,
			   const struct cachectl_opts *o)
{
	(void)cfg;
	(void)cmd;
	return lifecycle_cli("cachectl", o->config, o->argc, o->argv);
}
