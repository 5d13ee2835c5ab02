// SPDX-License-Identifier: MIT
/*
 * ckpt_drill_tool: the recovery drill (lib/ckpt_drill.c) from the command
 * line, for the integration tests, until `stager drill` calls the same
 * function.
 *
 *   ckpt_drill_tool JOB --to DIR [--step S] [--json]
 *
 * Exit 0: every file matched; 1: a file differs, is missing or has no
 * recorded SHA-256 (each named); 2: usage or configuration; 3: the drill
 * could not run (no such job or step, the store failed).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "dstage/ckpt_drill.h"
#include "dstage/config.h"
#include "dstage/log.h"

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "to", required_argument, NULL, 't' },
		{ "step", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ NULL, 0, NULL, 0 },
	};
	struct ckpt_drill_opts o = { 0 };
	struct ckpt_drill_report r;
	struct dstage_config *cfg = NULL;
	bool json = false;
	char err[512];
	int opt, ret;

	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (opt == 't')
			o.to = optarg;
		else if (opt == 's')
			o.step = optarg;
		else if (opt == 'j')
			json = true;
		else
			return 2;
	}
	if (optind + 1 != argc || !o.to) {
		fprintf(stderr, "usage: %s JOB --to DIR [--step S] [--json]\n",
			argv[0]);
		return 2;
	}
	o.job = argv[optind];
	if (config_load(NULL, &cfg, err, sizeof(err))) {
		fprintf(stderr, "%s\n", err);
		return 2;
	}
	log_set_level((enum log_level)cfg->log_level);
	ret = ckpt_drill(cfg, &o, &r);
	if (!ret)
		ckpt_drill_print(&r, json, stdout);
	else
		fprintf(stderr, "drill of %s failed: %s\n", o.job,
			strerror(-ret));
	ret = ret ? 3 : r.nbad ? 1 : 0;
	ckpt_drill_release(&r);
	config_free(cfg);
	return ret;
}
