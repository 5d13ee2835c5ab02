// SPDX-License-Identifier: MIT
/*
 * drill: `stager drill JOB [--step S] --to DIR [--json]`, the recovery drill
 * of the checkpoint store, run in this process (no daemon). The work is
 * libdstage's ckpt_drill (include/dstage/ckpt_drill.h): restore a checkpoint
 * into a scratch directory and check every file's SHA-256 against the one
 * recorded at publish. This file turns its report into lines or one JSON
 * object (jsonout, the stager's one JSON writer) and an exit code.
 * Stateless.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dstage/catalog.h"
#include "dstage/ckpt_drill.h"
#include "dstage/config.h"
#include "jsonout.h"
#include "stager.h"

static double drill_mbs(const struct ckpt_drill_report *r)
{
	return r->seconds > 0 ? (double)r->bytes / 1e6 / r->seconds : 0;
}

static void drill_print_text(const struct ckpt_drill_report *r)
{
	char safe[4 * 4096 + 1];

	for (size_t i = 0; i < r->nfiles; i++)
		if (r->files[i].problem)
			printf("BAD %s: %s\n",
			       cli_safe(r->files[i].key, safe, sizeof(safe)),
			       r->files[i].problem);
	printf("%s: %zu files, %" PRIu64 " bytes, %.2f s, %.1f MB/s, %s\n",
	       r->checkpoint ? cli_safe(r->checkpoint, safe, sizeof(safe))
			     : "-",
	       r->nfiles, r->bytes, r->seconds, drill_mbs(r),
	       r->nbad ? "FAILED" : "all SHA-256 match");
}

static int drill_print_json(const struct ckpt_drill_report *r)
{
	json_t *doc = json_object(), *bad = json_array();
	int ret = -ENOMEM;

	if (!doc || !bad)
		goto out;
	if (jsonout_set_str(doc, "checkpoint",
			    r->checkpoint ? r->checkpoint : ""))
		goto out;
	if (json_object_set_new(doc, "files",
				json_integer((json_int_t)r->nfiles)) ||
	    json_object_set_new(doc, "bytes",
				json_integer((json_int_t)r->bytes)) ||
	    json_object_set_new(doc, "seconds", json_real(r->seconds)) ||
	    json_object_set_new(doc, "mb_per_s", json_real(drill_mbs(r))) ||
	    json_object_set_new(doc, "ok", json_boolean(r->nbad == 0)))
		goto out;
	for (size_t i = 0; i < r->nfiles; i++) {
		json_t *f;

		if (!r->files[i].problem)
			continue;
		f = json_object();
		if (!f || json_array_append_new(bad, f) ||
		    jsonout_set_str(f, "key", r->files[i].key) ||
		    jsonout_set_str(f, "problem", r->files[i].problem))
			goto out;
	}
	if (json_object_set(doc, "bad", bad))
		goto out;
	ret = jsonout_print(doc);
out:
	json_decref(bad);
	json_decref(doc);
	return ret;
}

/* ckpt_drill_opts.recorded from this node's catalog. */
static int drill_recorded(void *arg, const char *store, const char *key,
			  char sha256[65], char *etag, size_t etag_len)
{
	struct catalog_ckpt c;
	int ret = catalog_ckpt_get(arg, store, key, &c);

	if (ret)
		return ret;
	memcpy(sha256, c.sha256, 65);
	snprintf(etag, etag_len, "%s", c.etag);
	return 0;
}

int local_drill(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o)
{
	struct ckpt_drill_opts d = { .job = o->argv[0],
				     .step = o->step,
				     .to = o->to };
	struct ckpt_drill_report r;
	struct catalog *cat = NULL;
	int ret, code;

	(void)cmd;
	if (!o->to) {
		fprintf(stderr, "stager drill: --to DIR is required: an empty "
				"or new scratch directory\n");
		return CLI_EXIT_USAGE;
	}
	/* This node's records too, when it has a catalog to read. */
	if (cfg->catalog_path && !access(cfg->catalog_path, R_OK) &&
	    !catalog_open(cfg->catalog_path, CATALOG_READONLY, &cat)) {
		d.recorded = drill_recorded;
		d.recorded_arg = cat;
	}
	ret = ckpt_drill(cfg, &d, &r);
	catalog_close(cat);
	if (ret) {
		fprintf(stderr, "stager drill %s: %s\n", d.job, strerror(-ret));
		return ret == -ENOENT			  ? CLI_EXIT_NOENT
		       : ret == -EINVAL || ret == -EEXIST ? CLI_EXIT_USAGE
							  : CLI_EXIT_FAIL;
	}
	if (o->json)
		code = drill_print_json(&r) ? CLI_EXIT_FAIL : CLI_EXIT_OK;
	else {
		drill_print_text(&r);
		code = CLI_EXIT_OK;
	}
	if (r.nbad)
		code = CLI_EXIT_FAIL;
	ckpt_drill_release(&r);
	return code;
}
