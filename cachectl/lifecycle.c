// SPDX-License-Identifier: MIT
/*
 * lifecycle (cachectl): `cachectl lifecycle list|add|remove|run`, the same
 * requests and output as `stager lifecycle` (cli/lifecycle.c, linked
 * from cli/'s library, dstage_cli). Stateless.
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
