// SPDX-License-Identifier: MIT
/*
 * Fuzz the configuration file parser: any bytes as an INI file must give
 * either a config (which then dumps and reloads to the same values) or
 * -EINVAL / -ERANGE with a message naming the file; never a crash or a leak.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dstage/config.h"
#include "dstage/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fd = -1;
static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	log_set_level((enum log_level)(LOG_LVL_ERROR - 1));
	/* The environment must not leak into what is fuzzed. */
	clearenv();
	fd = memfd_create("fuzz-config", 0);
	if (fd < 0)
		abort();
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dstage_config *cfg = NULL, *again = NULL;
	char err[512];
	int r;

	if (ftruncate(fd, 0) || pwrite(fd, data, size, 0) != (ssize_t)size)
		abort();
	r = config_load(path, &cfg, err, sizeof(err));
	if (r) {
		if (r != -EINVAL && r != -ERANGE && r != -ENOMEM)
			abort();
		if (cfg || !strstr(err, path))
			abort();
		return 0;
	}
	/* What loaded dumps to a file that loads to the same values. */
	FILE *f = fdopen(dup(fd), "w+");

	if (!f)
		abort();
	if (ftruncate(fd, 0) || lseek(fd, 0, SEEK_SET))
		abort();
	config_dump(cfg, f);
	fclose(f);
	if (config_load(path, &again, err, sizeof(err)))
		abort();
	if (again->cache_size != cfg->cache_size ||
	    again->s3_max_inflight != cfg->s3_max_inflight ||
	    again->s3_deadline_ms != cfg->s3_deadline_ms ||
	    again->s3_path_style != cfg->s3_path_style ||
	    strcmp(again->cache_dir, cfg->cache_dir))
		abort();
	config_free(again);
	config_free(cfg);
	return 0;
}
