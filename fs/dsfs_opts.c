// SPDX-License-Identifier: MIT
/*
 * dsfs_opts: the command line of dstagefs. Stateless: fills a struct
 * dsfs_opts that is immutable once the file system is mounted.
 *
 * dstagefs's own settings come as long options or as -o NAME=VALUE; every
 * other -o option goes to libfuse (allow_other, max_read=N, ...).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsfs.h"
#include "dstage/config.h"

/* Defaults chosen by measurement: docs/dstagefs.md, "Tuning". */
#define DSFS_DEF_MOUNTPOINT "/data"
#define DSFS_DEF_THREADS 16
/* 1 MiB - 16 KiB: libfuse splices a reply only if it fits its pipe with 3
 * pages to spare, and a pipe grows to at most fs.pipe-max-size (1 MiB)
 * without CAP_SYS_RESOURCE: 1 MiB replies were silently copied instead. */
#define DSFS_DEF_MAX_WRITE_KB 1008
#define DSFS_DEF_READ_AHEAD_KB 16384
#define DSFS_DEF_ENTRY_TIMEOUT 86400.0
#define DSFS_DEF_POLL_MS 1000
#define DSFS_DEF_PREFETCH_WINDOW (1ULL << 30)

void dsfs_opts_help(const char *prog)
{
	printf("usage: %s [options] [MOUNTPOINT]\n"
	       "\n"
	       "Mount the dstage namespace at MOUNTPOINT (default %s):\n"
	       "  MOUNTPOINT/datasets/NAME/...  every dataset of the catalog, "
	       "read-only\n"
	       "  MOUNTPOINT/checkpoints/       checkpoints (empty for now)\n"
	       "  MOUNTPOINT/.dstage/prefetch   write paths to read next, one "
	       "a line\n"
	       "  MOUNTPOINT/.dstage/stats      cache and file-system "
	       "counters\n"
	       "\n"
	       "Options (each -o NAME=VALUE has a --NAME VALUE form too):\n"
	       "  --config FILE         dstage configuration (default: "
	       "$DSTAGE_CONFIG, then %s)\n"
	       "  --log-level LEVEL     error, warn, info or debug (default: "
	       "log.level)\n"
	       "  -f                    stay in the foreground (log to "
	       "stderr)\n"
	       "  -d                    FUSE debug output (implies -f)\n"
	       "  -o allow_other        let every user use the mount (needs "
	       "root or\n"
	       "                        user_allow_other in /etc/fuse.conf); "
	       "required for\n"
	       "                        group-restricted datasets to matter\n"
	       "  -o uid=N,gid=N        owner of every file (default: the "
	       "mounting user)\n"
	       "  -o umask=OOO          mode mask (default 022; write bits are "
	       "always off)\n"
	       "  -o threads=N          worker threads of the session loop "
	       "(default %d)\n"
	       "  -o clone_fd           one /dev/fuse descriptor per thread\n"
	       "  -o no_splice          copy reads instead of splicing from "
	       "the "
	       "cache files\n"
	       "  -o max_request_kb=N   largest READ request, KiB, 4 to 1024 "
	       "(default %d)\n"
	       "  -o read_ahead_kb=N    kernel readahead of the mount, KiB; 0 "
	       "keeps the\n"
	       "                        kernel default (default %d)\n"
	       "  -o entry_timeout=S    entry and attribute cache time, "
	       "seconds (default %.0f)\n"
	       "  -o poll_ms=N          how often new or refreshed datasets "
	       "are "
	       "looked for\n"
	       "                        (default %d)\n"
	       "  -o prefetch_window=SIZE  bytes in flight for "
	       ".dstage/prefetch (default 1G)\n"
	       "  -o max_read=N, ...    other options go to libfuse\n"
	       "  -h, --help            this text\n"
	       "  -V, --version         the version\n"
	       "\n"
	       "A stale mount at MOUNTPOINT (a dstagefs killed with SIGKILL: "
	       "\"Transport\n"
	       "endpoint is not connected\") is detached first, with a log "
	       "line.\n"
	       "SIGTERM, SIGINT and fusermount3 -u unmount cleanly.\n"
	       "\n"
	       "Exit status:\n"
	       "  0  unmounted cleanly\n"
	       "  1  the FUSE session failed\n"
	       "  2  bad option or configuration\n"
	       "  3  the mountpoint is unusable (already mounted, stale mount "
	       "not cleared,\n"
	       "     mount refused)\n"
	       "  4  the catalog or the cache could not be opened\n",
	       prog, DSFS_DEF_MOUNTPOINT, CONFIG_DEFAULT_PATH, DSFS_DEF_THREADS,
	       DSFS_DEF_MAX_WRITE_KB, DSFS_DEF_READ_AHEAD_KB,
	       DSFS_DEF_ENTRY_TIMEOUT, DSFS_DEF_POLL_MS);
}

static int dsfs_opts_uint(const char *name, const char *v, unsigned long min,
			  unsigned long max, int base, unsigned long *out)
{
	char *end;
	unsigned long x;

	errno = 0;
	x = strtoul(v, &end, base);
	if (errno || end == v || *end || x < min || x > max) {
		fprintf(stderr,
			"dstagefs: bad value '%s' for %s: expected a whole "
			"number from %lu to %lu\n",
			v, name, min, max);
		return -EINVAL;
	}
	*out = x;
	return 0;
}

static int dsfs_opts_append_fuse(struct dsfs_opts *o, const char *opt)
{
	size_t a = o->fuse_opts ? strlen(o->fuse_opts) : 0, b = strlen(opt);
	char *p = realloc(o->fuse_opts, a + b + 2);

	if (!p)
		return -ENOMEM;
	if (a)
		p[a++] = ',';
	memcpy(p + a, opt, b + 1);
	o->fuse_opts = p;
	return 0;
}

/* One dstagefs setting, NAME and VALUE (VALUE may be NULL for flags). */
static int dsfs_opts_set(struct dsfs_opts *o, const char *name, const char *v)
{
	unsigned long x;
	int ret = 0;

#define NEED_VALUE                                                             \
	do {                                                                   \
		if (!v) {                                                      \
			fprintf(stderr, "dstagefs: %s needs a value\n", name); \
			return -EINVAL;                                        \
		}                                                              \
	} while (0)

	if (strcmp(name, "uid") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 0, UINT_MAX - 1, 10, &x);
		o->uid = (uid_t)x;
	} else if (strcmp(name, "gid") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 0, UINT_MAX - 1, 10, &x);
		o->gid = (gid_t)x;
	} else if (strcmp(name, "umask") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 0, 0777, 8, &x);
		o->umask = (mode_t)x;
	} else if (strcmp(name, "threads") == 0 ||
		   strcmp(name, "max_threads") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 1, 1024, 10, &x);
		o->threads = (unsigned)x;
	} else if (strcmp(name, "clone_fd") == 0) {
		o->clone_fd = true;
	} else if (strcmp(name, "no_splice") == 0) {
		o->splice = false;
	} else if (strcmp(name, "splice") == 0) {
		o->splice = true;
	} else if (strcmp(name, "max_request_kb") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 4, 1024, 10, &x);
		o->max_write_kb = (unsigned)x;
	} else if (strcmp(name, "read_ahead_kb") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 0, 1u << 20, 10, &x);
		o->read_ahead_kb = (unsigned)x;
	} else if (strcmp(name, "entry_timeout") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 0, 1u << 30, 10, &x);
		o->entry_timeout = (double)x;
	} else if (strcmp(name, "poll_ms") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 10, 3600000, 10, &x);
		o->poll_ms = (unsigned)x;
	} else if (strcmp(name, "prefetch_window") == 0) {
		uint64_t sz;

		NEED_VALUE;
		if (config_parse_size(v, &sz) || sz == 0) {
			fprintf(stderr,
				"dstagefs: bad value '%s' for prefetch_window: "
				"expected a size such as 256M or 1G\n",
				v);
			return -EINVAL;
		}
		o->prefetch_window = sz;
	} else {
		return 1; /* not ours */
	}
#undef NEED_VALUE
	return ret;
}

/* Split a -o list: our settings are applied, the rest go to libfuse. */
static int dsfs_opts_o(struct dsfs_opts *o, const char *list)
{
	char *copy = strdup(list), *save = NULL, *tok;
	int ret = 0;

	if (!copy)
		return -ENOMEM;
	for (tok = strtok_r(copy, ",", &save); tok && !ret;
	     tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '=');

		if (eq)
			*eq = '\0';
		ret = dsfs_opts_set(o, tok, eq ? eq + 1 : NULL);
		if (eq)
			*eq = '=';
		if (ret == 1) {
			if (strcmp(tok, "allow_other") == 0)
				o->allow_other = true;
			ret = dsfs_opts_append_fuse(o, tok);
		}
	}
	free(copy);
	return ret;
}

int dsfs_opts_parse(int argc, char **argv, struct dsfs_opts *o)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "config", required_argument, NULL, 'c' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "uid", required_argument, NULL, 1 },
		{ "gid", required_argument, NULL, 1 },
		{ "umask", required_argument, NULL, 1 },
		{ "threads", required_argument, NULL, 1 },
		{ "clone-fd", no_argument, NULL, 1 },
		{ "no-splice", no_argument, NULL, 1 },
		{ "max-request-kb", required_argument, NULL, 1 },
		{ "read-ahead-kb", required_argument, NULL, 1 },
		{ "entry-timeout", required_argument, NULL, 1 },
		{ "poll-ms", required_argument, NULL, 1 },
		{ "prefetch-window", required_argument, NULL, 1 },
		{ NULL, 0, NULL, 0 },
	};
	int c, idx, ret;

	memset(o, 0, sizeof(*o));
	o->mountpoint = DSFS_DEF_MOUNTPOINT;
	o->uid = getuid();
	o->gid = getgid();
	o->umask = 022;
	o->threads = DSFS_DEF_THREADS;
	o->splice = true;
	o->max_write_kb = DSFS_DEF_MAX_WRITE_KB;
	o->read_ahead_kb = DSFS_DEF_READ_AHEAD_KB;
	o->entry_timeout = DSFS_DEF_ENTRY_TIMEOUT;
	o->poll_ms = DSFS_DEF_POLL_MS;
	o->prefetch_window = DSFS_DEF_PREFETCH_WINDOW;

	optind = 1;
	while ((c = getopt_long(argc, argv, "hVfdo:", longopts, &idx)) != -1) {
		switch (c) {
		case 'h':
			o->show_help = true;
			break;
		case 'V':
			o->show_version = true;
			break;
		case 'f':
			o->foreground = true;
			break;
		case 'd':
			o->debug = true;
			o->foreground = true;
			break;
		case 'o':
			ret = dsfs_opts_o(o, optarg);
			if (ret)
				return ret < 0 ? ret : -EINVAL;
			break;
		case 'c':
			o->config_path = optarg;
			break;
		case 'l':
			o->log_level = optarg;
			break;
		case 1: {
			char name[32];
			size_t i;

			/* --read-ahead-kb -> read_ahead_kb */
			snprintf(name, sizeof(name), "%s", longopts[idx].name);
			for (i = 0; name[i]; i++)
				if (name[i] == '-')
					name[i] = '_';
			ret = dsfs_opts_set(o, name, optarg);
			if (ret)
				return -EINVAL;
			break;
		}
		default:
			return -EINVAL;
		}
	}
	if (optind < argc)
		o->mountpoint = argv[optind++];
	if (optind < argc) {
		fprintf(stderr, "dstagefs: unexpected argument '%s'\n",
			argv[optind]);
		return -EINVAL;
	}
	return 0;
}

void dsfs_opts_release(struct dsfs_opts *o)
{
	free(o->fuse_opts);
	o->fuse_opts = NULL;
}
