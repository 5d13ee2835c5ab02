// SPDX-License-Identifier: MIT
/*
 * dsfs_opts: the command line of dstagefs. Stateless: fills a struct
 * dsfs_opts that is immutable once the file system is mounted.
 *
 * dstagefs's own settings come as long options or as -o NAME=VALUE; every
 * other -o option goes to libfuse (allow_other, max_read=N, ...). The -o
 * lists are split by fuse_opt_parse (which also handles "\," escapes):
 * our names are taken out, the rest stay in o->fuse_args for
 * fuse_session_new.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsfs_opts.h"
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
	       "       %s [options] --over DIR\n"
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
	       "With --over DIR (or overlay.dir in the configuration), mount "
	       "over DIR\n"
	       "itself and keep serving DIR's own tree (transparent mode): "
	       "reads through\n"
	       "the cache, writes passed to DIR's file system as the caller; "
	       "see\n"
	       "overlay.attr_timeout and overlay.min_cached_size. Only root "
	       "may mount\n"
	       "over a directory it does not own.\n"
	       "\n"
	       "Options (each -o NAME=VALUE has a --NAME VALUE form too):\n"
	       "  --over DIR            transparent mode over DIR (instead of "
	       "MOUNTPOINT)\n"
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
	       "  -o nopassthrough      never let the kernel read files "
	       "directly (FUSE\n"
	       "                        passthrough, libfuse >= 3.17)\n"
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
	       "  -o prefetch_max_entries=N, prefetch_max_bytes=SIZE\n"
	       "                        one prefetch list's limits (default "
	       "%u, %lluM)\n"
	       "  -o prefetch_uid_max_entries=N, prefetch_uid_max_bytes=SIZE\n"
	       "                        one user's open lists together "
	       "(default %u, %lluM);\n"
	       "                        writes past a limit fail with "
	       "EDQUOT\n"
	       "  -o ctl_max_handles=N  open .dstage files per user (default "
	       "%d)\n"
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
	       prog, prog, DSFS_DEF_MOUNTPOINT, CONFIG_DEFAULT_PATH,
	       DSFS_DEF_THREADS, DSFS_DEF_MAX_WRITE_KB, DSFS_DEF_READ_AHEAD_KB,
	       DSFS_DEF_ENTRY_TIMEOUT, DSFS_DEF_POLL_MS,
	       DSFS_DEF_PF_MAX_ENTRIES, DSFS_DEF_PF_MAX_BYTES >> 20,
	       DSFS_DEF_PF_UID_MAX_ENTRIES, DSFS_DEF_PF_UID_MAX_BYTES >> 20,
	       DSFS_DEF_CTL_MAX_HANDLES);
}

static int dsfs_opts_size(const char *name, const char *v, uint64_t *out)
{
	if (config_parse_size(v, out) || *out == 0) {
		fprintf(stderr,
			"dstagefs: bad value '%s' for %s: expected a size such "
			"as 256M or 1G\n",
			v, name);
		return -EINVAL;
	}
	return 0;
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

/* One dstagefs setting, NAME and VALUE (VALUE may be NULL for flags). */
static int dsfs_opts_set(struct dsfs_opts *o, const char *name, const char *v)
{
	/* 0 until parsed: on a parse error it is stored, then the caller fails. */
	unsigned long x = 0;
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
	} else if (strcmp(name, "nopassthrough") == 0 ||
		   strcmp(name, "no_passthrough") == 0) {
		o->passthrough = false;
	} else if (strcmp(name, "passthrough") == 0) {
		o->passthrough = true;
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
	} else if (strcmp(name, "over") == 0) {
		NEED_VALUE;
		o->over_dir = v;
	} else if (strcmp(name, "poll_ms") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 10, 3600000, 10, &x);
		o->poll_ms = (unsigned)x;
	} else if (strcmp(name, "prefetch_window") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_size(name, v, &o->prefetch_window);
	} else if (strcmp(name, "prefetch_max_bytes") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_size(name, v, &o->pf_max_bytes);
	} else if (strcmp(name, "prefetch_uid_max_bytes") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_size(name, v, &o->pf_uid_max_bytes);
	} else if (strcmp(name, "prefetch_max_entries") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 1, UINT_MAX, 10, &x);
		o->pf_max_entries = x;
	} else if (strcmp(name, "prefetch_uid_max_entries") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 1, UINT_MAX, 10, &x);
		o->pf_uid_max_entries = x;
	} else if (strcmp(name, "ctl_max_handles") == 0) {
		NEED_VALUE;
		ret = dsfs_opts_uint(name, v, 1, 1u << 20, 10, &x);
		o->ctl_max_handles = (unsigned)x;
	} else {
		return 1; /* not ours */
	}
#undef NEED_VALUE
	return ret;
}

/*
 * fuse_opt_parse's callback for one option of a -o list: ours are applied
 * and dropped (0), the rest kept for libfuse (1), errors stop it (-1).
 */
static int dsfs_opts_proc(void *data, const char *arg, int key,
			  struct fuse_args *outargs)
{
	struct dsfs_opts *o = data;
	const char *eq;
	char name[64];
	size_t len;
	int ret;

	(void)outargs;
	if (key != FUSE_OPT_KEY_OPT)
		return 1; /* "-o" itself and argv[0] */
	eq = strchr(arg, '=');
	len = eq ? (size_t)(eq - arg) : strlen(arg);
	if (len >= sizeof(name))
		return 1; /* no name of ours is that long */
	memcpy(name, arg, len);
	name[len] = '\0';
	ret = dsfs_opts_set(o, name, eq ? eq + 1 : NULL);
	if (ret == 1 && strcmp(name, "allow_other") == 0)
		o->allow_other = true;
	return ret == 1 ? 1 : ret ? -1 : 0;
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
		{ "no-passthrough", no_argument, NULL, 1 },
		{ "max-request-kb", required_argument, NULL, 1 },
		{ "read-ahead-kb", required_argument, NULL, 1 },
		{ "entry-timeout", required_argument, NULL, 1 },
		{ "poll-ms", required_argument, NULL, 1 },
		{ "prefetch-window", required_argument, NULL, 1 },
		{ "prefetch-max-entries", required_argument, NULL, 1 },
		{ "prefetch-max-bytes", required_argument, NULL, 1 },
		{ "prefetch-uid-max-entries", required_argument, NULL, 1 },
		{ "prefetch-uid-max-bytes", required_argument, NULL, 1 },
		{ "ctl-max-handles", required_argument, NULL, 1 },
		{ "over", required_argument, NULL, 1 },
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
	o->passthrough = true;
	o->max_write_kb = DSFS_DEF_MAX_WRITE_KB;
	o->read_ahead_kb = DSFS_DEF_READ_AHEAD_KB;
	o->entry_timeout = DSFS_DEF_ENTRY_TIMEOUT;
	o->poll_ms = DSFS_DEF_POLL_MS;
	o->prefetch_window = DSFS_DEF_PREFETCH_WINDOW;
	o->pf_max_entries = DSFS_DEF_PF_MAX_ENTRIES;
	o->pf_max_bytes = DSFS_DEF_PF_MAX_BYTES;
	o->pf_uid_max_entries = DSFS_DEF_PF_UID_MAX_ENTRIES;
	o->pf_uid_max_bytes = DSFS_DEF_PF_UID_MAX_BYTES;
	o->ctl_max_handles = DSFS_DEF_CTL_MAX_HANDLES;
	if (fuse_opt_add_arg(&o->fuse_args, "dstagefs"))
		return -ENOMEM;

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
			/* Gathered here, split below by fuse_opt_parse. */
			if (fuse_opt_add_arg(&o->fuse_args, "-o") ||
			    fuse_opt_add_arg(&o->fuse_args, optarg))
				return -ENOMEM;
			break;
		case 'c':
			o->config_path = optarg;
			break;
		case 'l':
			o->log_level = optarg;
			break;
		case 1: {
			char name[40];
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
	if (optind < argc) {
		o->mountpoint = argv[optind++];
		o->mountpoint_given = true;
	}
	if (optind < argc) {
		fprintf(stderr, "dstagefs: unexpected argument '%s'\n",
			argv[optind]);
		return -EINVAL;
	}
	if (fuse_opt_parse(&o->fuse_args, o, NULL, dsfs_opts_proc))
		return -EINVAL;
	if (o->over_dir && o->mountpoint_given) {
		fprintf(stderr, "dstagefs: --over DIR mounts on DIR: give it "
				"or MOUNTPOINT, not both\n");
		return -EINVAL;
	}
	if (o->over_dir)
		o->mountpoint = o->over_dir;
	return 0;
}

void dsfs_opts_release(struct dsfs_opts *o)
{
	fuse_opt_free_args(&o->fuse_args);
}
