// SPDX-License-Identifier: MIT
/*
 * catalog_tool: register datasets for the integration tests until
 * `stager add` exists.
 *
 *   catalog_tool [--config F] DB add NAME URL [--group G]
 *                                   (catalog_dataset_add + catalog_register)
 *   catalog_tool [--config F] DB refresh NAME   (catalog_register again)
 *   catalog_tool [--config F] DB remove NAME
 *   catalog_tool [--config F] DB ls   (name, version, objects, bytes, bad)
 *
 * The source is opened with the configuration (--config, $DSTAGE_CONFIG,
 * environment), so S3 endpoints and credentials come from there.
 * Exit 0 on success, 1 on an error (message on stderr), 2 on bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

static int usage(void)
{
	fprintf(stderr, "usage: catalog_tool [--config F] DB "
			"add NAME URL [--group G] | refresh NAME | "
			"remove NAME | ls\n");
	return 2;
}

static int print_ds(void *arg, const struct catalog_dataset *ds)
{
	(void)arg;
	printf("%s\t%" PRId64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%s\n",
	       ds->name, ds->version, ds->objects, ds->bytes, ds->bad_keys,
	       ds->group ? ds->group : "");
	return 0;
}

static int do_register(struct catalog *cat, const struct dstage_config *cfg,
		       const char *name)
{
	struct catalog_dataset ds = { 0 };
	struct objstore *os = NULL;
	int ret;

	ret = catalog_dataset_get(cat, name, &ds);
	if (ret)
		goto out;
	ret = objstore_open(ds.source, cfg, &os);
	if (ret)
		goto out;
	ret = catalog_register(cat, name, os);
out:
	objstore_free(os);
	catalog_dataset_release(&ds);
	return ret;
}

int main(int argc, char **argv)
{
	struct dstage_config *cfg = NULL;
	struct catalog *cat = NULL;
	const char *config = NULL;
	char err[1024];
	int ret, a = 1;

	if (argc > 2 && strcmp(argv[1], "--config") == 0) {
		config = argv[2];
		a = 3;
	}
	if (argc - a < 2)
		return usage();
	ret = config_load(config, &cfg, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "catalog_tool: %s\n", err);
		return 1;
	}
	log_set_level(cfg->log_level);
	ret = catalog_open(argv[a], CATALOG_CREATE, &cat);
	if (ret)
		goto out;
	const char *cmd = argv[a + 1];
	int n = argc - a - 2;
	char **args = argv + a + 2;

	if (strcmp(cmd, "add") == 0 && (n == 2 || n == 4)) {
		const char *group = NULL;

		if (n == 4) {
			if (strcmp(args[2], "--group")) {
				ret = -EINVAL;
				goto out;
			}
			group = args[3];
		}
		ret = catalog_dataset_add(cat, args[0], args[1], group);
		if (!ret)
			ret = do_register(cat, cfg, args[0]);
	} else if (strcmp(cmd, "refresh") == 0 && n == 1) {
		ret = do_register(cat, cfg, args[0]);
	} else if (strcmp(cmd, "remove") == 0 && n == 1) {
		ret = catalog_dataset_remove(cat, args[0]);
	} else if (strcmp(cmd, "ls") == 0 && n == 0) {
		ret = catalog_dataset_list(cat, print_ds, NULL);
	} else {
		catalog_close(cat);
		config_free(cfg);
		return usage();
	}
out:
	if (ret)
		fprintf(stderr, "catalog_tool: %s: %s\nerror: %d\n",
			argc > a + 1 ? argv[a + 1] : "open", strerror(-ret),
			-ret);
	catalog_close(cat);
	config_free(cfg);
	return ret ? 1 : 0;
}
