// SPDX-License-Identifier: MIT
/*
 * cachectl: the admins' console for the node's cache, over the stager
 * daemon's socket (docs/cachectl.md).
 *
 *   cachectl [--config FILE] COMMAND [OPTIONS] [ARGS]
 *
 * Every command is one request to the daemon, which checks the caller's
 * rights (SO_PEERCRED) and the input again, changes the catalog and the
 * running cache, and records the change in the audit table.
 *
 * Stateless: parse and check the command line, load the configuration,
 * dispatch, exit.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cachectl.h"
#include "dstage/log.h"

static const struct cachectl_cmd cachectl_cmds[] = {
	{ "status", cmds_status, 0, 0, "j", "",
	  "The cache at a glance: capacity, used, free, watermarks, hit\n"
	  "ratio and bytes from cache and from source since the daemon\n"
	  "started, every dataset's size, cached bytes, share of the used\n"
	  "space, pin, quota and priority, and queued and running jobs.\n"
	  "Anyone may run it; restricted datasets are shown only to their\n"
	  "group and to admins.\n"
	  "  --json  one JSON object" },
	{ "pin", cmds_dataset, 1, 1, "j", "DATASET",
	  "Never evict DATASET from the cache (admins)." },
	{ "unpin", cmds_dataset, 1, 1, "j", "DATASET",
	  "Let DATASET be evicted again (admins)." },
	{ "quota", cmds_dataset, 2, 2, "j", "DATASET SIZE|none",
	  "Cap the bytes DATASET may hold in the cache (admins). SIZE is\n"
	  "bytes or with a K, M, G, T suffix (powers of 1024); 'none'\n"
	  "removes the cap. A pinned dataset's quota may not be below what\n"
	  "it has cached." },
	{ "priority", cmds_dataset, 2, 2, "j", "DATASET N",
	  "Set DATASET's eviction priority, -1000 to 1000 (admins): lower\n"
	  "priorities are evicted first." },
	{ "csi-allow", cmds_dataset, 2, 2, "j", "DATASET NS[,NS...]|none",
	  "Let pods of these Kubernetes namespaces have DATASET, a dataset\n"
	  "restricted to a group, through dstage-csi (admins; audited as\n"
	  "csi.allow). '*' allows every namespace, 'none' none (the\n"
	  "default): dstage-csi then refuses it (PERMISSION_DENIED)." },
	{ "policy", cmds_policy, 1, 1, "jCHL", "show|set",
	  "Show or set the cache's capacity and watermarks. Values set here\n"
	  "are kept in the catalog and override cache.size,\n"
	  "cache.high_watermark and cache.low_watermark of the\n"
	  "configuration. set is for admins.\n"
	  "  --capacity SIZE        at least 1 MiB (K, M, G, T suffixes)\n"
	  "  --high-watermark PCT   1 to 100: eviction starts above it\n"
	  "  --low-watermark PCT    1 to 100, below the high watermark:\n"
	  "                         eviction stops at it\n"
	  "  --json                 the resulting policy as one object" },
	{ "evict", cmds_evict, 0, 1, "jlDo",
	  "DATASET | --to-low-watermark | --older-than AGE",
	  "Drop DATASET's cached files, evict down to the low watermark\n"
	  "(unpinned, lowest priority, least recently used first), or drop\n"
	  "every file not read for AGE (admins). A file a reader has open is\n"
	  "left to it and reported.\n"
	  "  --to-low-watermark  evict the whole cache down to the low\n"
	  "                      watermark\n"
	  "  --older-than AGE    drop the files of every dataset last read\n"
	  "                      AGE ago or earlier (30m, 12h, 7d, 2w;\n"
	  "                      pinned ones too)\n"
	  "  --dry-run           say what would be freed; change nothing\n"
	  "  --json              the result as one object" },
	{ "gc", cmds_gc, 0, 0, "jDo", "[--dry-run] [--older-than AGE]",
	  "Remove what the cache holds for nobody (admins): cache files no\n"
	  "catalog entry owns (removed datasets, old versions), catalog\n"
	  "block rows whose cache files are gone, and leftovers of killed\n"
	  "fills and checkpoint writers (torn or stray files in cache.dir,\n"
	  "journal temporaries and abandoned/ in checkpoints.staging_dir).\n"
	  "A file a reader has open or is filling is left and reported.\n"
	  "  --older-than AGE  leftovers last changed AGE ago or earlier\n"
	  "                    (default 1h; 90s, 30m, 12h, 7d, 2w)\n"
	  "  --dry-run         count what would go; change nothing\n"
	  "  --json            the counts as one object" },
	{ "audit", cmds_audit, 0, 0, "jsu", "",
	  "Every change made through cachectl and the stager (admins): time,\n"
	  "uid and user, action, target, old and new value. The record is\n"
	  "append-only.\n"
	  "  --since T  only records from T on: seconds since the epoch,\n"
	  "             YYYY-MM-DD[THH:MM:SS] (local time), or an age such\n"
	  "             as 30m, 12h, 7d\n"
	  "  --user U   only records by user name or uid U\n"
	  "  --json     an array of objects" },
	/* opts "*": parses its own options (cli/lifecycle.c) */
	{ "lifecycle", lifecycle_cachectl_run, 1, 2, "*", "list|add|remove|run",
	  "Checkpoint lifecycle rules (see 'cachectl lifecycle --help')." },
};

static const struct option cachectl_long[] = {
	{ "help", no_argument, NULL, 'h' },
	{ "json", no_argument, NULL, 'j' },
	{ "capacity", required_argument, NULL, 'C' },
	{ "high-watermark", required_argument, NULL, 'H' },
	{ "low-watermark", required_argument, NULL, 'L' },
	{ "to-low-watermark", no_argument, NULL, 'l' },
	{ "dry-run", no_argument, NULL, 'D' },
	{ "older-than", required_argument, NULL, 'o' },
	{ "since", required_argument, NULL, 's' },
	{ "user", required_argument, NULL, 'u' },
	{ "config", required_argument, NULL, 'c' },
	{ 0 },
};

static void cachectl_usage(FILE *f)
{
	fprintf(f, "usage: cachectl [--config FILE] COMMAND [OPTIONS] "
		   "[ARGS]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(cachectl_cmds) / sizeof(cachectl_cmds[0]);
	     i++)
		fprintf(f, "  %-9s %s\n", cachectl_cmds[i].name,
			cachectl_cmds[i].usage);
	fprintf(f, "\n'cachectl COMMAND --help' for a command's options.\n"
		   "Exit codes: 0 success, 1 failure, 2 usage, 3 daemon not "
		   "running, 4 permission denied, 5 no such dataset.\n");
}

static void cachectl_cmd_help(const struct cachectl_cmd *c)
{
	printf("usage: cachectl %s%s%s\n\n%s\n", c->name,
	       c->usage[0] ? " " : "", c->usage, c->help);
}

static const struct cachectl_cmd *cachectl_find(const char *name)
{
	return cli_cmd_find(cachectl_cmds,
			    sizeof(cachectl_cmds) / sizeof(cachectl_cmds[0]),
			    sizeof(cachectl_cmds[0]), name);
}

/* A size: digits with an optional K/M/G/T suffix; never negative. */
static int cachectl_size(const char *what, const char *s, uint64_t min,
			 uint64_t *v)
{
	if (*s == '-' || *s == '+' || config_parse_size(s, v) || *v < min) {
		fprintf(stderr,
			"cachectl: %s '%s': expected a size of at least "
			"%" PRIu64 " bytes: bytes, or with K, M, G or T "
			"(powers of 1024)\n",
			what, s, min);
		return -EINVAL;
	}
	return 0;
}

/* A percentage 1..100 ("85" or "85%"), into buf as digits. */
static int cachectl_pct(const char *what, const char *s, char *buf, size_t len)
{
	char *end;
	long v;

	errno = 0;
	v = *s >= '0' && *s <= '9' ? strtol(s, &end, 10) : -1;
	if (v >= 1 && v <= 100 && !errno &&
	    (!*end || (end[0] == '%' && !end[1]))) {
		snprintf(buf, len, "%ld", v);
		return 0;
	}
	fprintf(stderr,
		"cachectl: %s '%s': expected a percentage from 1 "
		"to 100\n",
		what, s);
	return -EINVAL;
}

/* An age: digits and a unit s, m, h, d or w (plain digits: seconds). */
static int cachectl_age(const char *what, const char *s, int64_t *out)
{
	static const struct {
		char unit;
		int64_t sec;
	} units[] = { { 's', 1 },
		      { 'm', 60 },
		      { 'h', 3600 },
		      { 'd', 86400 },
		      { 'w', 7 * 86400 } };
	char *end;
	long long v;

	errno = 0;
	v = *s >= '0' && *s <= '9' ? strtoll(s, &end, 10) : -1;
	if (v > 0 && !errno && v < 100000) {
		if (!*end) {
			*out = v;
			return 0;
		}
		for (size_t i = 0;
		     !end[1] && i < sizeof(units) / sizeof(units[0]); i++)
			if (*end == units[i].unit) {
				*out = v * units[i].sec;
				return 0;
			}
	}
	fprintf(stderr,
		"cachectl: %s '%s': expected an age such as 90s, 30m, 12h, "
		"7d or 2w (more than 0)\n",
		what, s);
	return -EINVAL;
}

/* --since: epoch seconds, a date, or an age. */
static int cachectl_since(const char *s, int64_t *out)
{
	struct tm tm = { 0 };
	unsigned ms;
	char *end;

	if (*s >= '0' && *s <= '9') {
		errno = 0;
		*out = strtoll(s, &end, 10);
		if (!errno && !*end)
			return 0;
		end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
		if (!end || *end) {
			memset(&tm, 0, sizeof(tm));
			end = strptime(s, "%Y-%m-%d", &tm);
		}
		if (end && !*end) {
			tm.tm_isdst = -1;
			*out = (int64_t)mktime(&tm);
			return 0;
		}
	}
	if (!config_parse_duration_ms(s, &ms) && ms) {
		*out = (int64_t)time(NULL) - ms / 1000;
		return 0;
	}
	fprintf(stderr,
		"cachectl: --since '%s': expected seconds since the epoch, "
		"YYYY-MM-DD[THH:MM:SS] or an age such as 30m, 12h, 7d\n",
		s);
	return -EINVAL;
}

/* Check and normalize the command's arguments. */
static int cachectl_args(const struct cachectl_cmd *cmd,
			 struct cachectl_opts *o)
{
	static char num[32];
	uint64_t v;

	if (!strcmp(cmd->name, "quota")) {
		if (!strcmp(o->argv[1], "none")) {
			snprintf(num, sizeof(num), "0");
		} else {
			if (cachectl_size("quota", o->argv[1], 1, &v))
				return -EINVAL;
			snprintf(num, sizeof(num), "%" PRIu64, v);
		}
		o->argv[1] = num;
	} else if (!strcmp(cmd->name, "priority")) {
		const char *s = o->argv[1];
		char *end;
		long p;

		errno = 0;
		p = strtol(s, &end, 10);
		if (!*s || *end || errno || p < -1000 || p > 1000) {
			fprintf(stderr,
				"cachectl: priority '%s': expected a whole "
				"number from -1000 to 1000\n",
				s);
			return -EINVAL;
		}
	} else if (!strcmp(cmd->name, "policy")) {
		bool set = !strcmp(o->argv[0], "set");

		if (!set && strcmp(o->argv[0], "show")) {
			fprintf(stderr,
				"cachectl policy: '%s': expected show "
				"or set\n",
				o->argv[0]);
			return -EINVAL;
		}
		if (set != (o->capacity || o->high || o->low)) {
			fprintf(stderr,
				set ? "cachectl policy set: give --capacity, "
				      "--high-watermark or --low-watermark\n"
				    : "cachectl policy show: takes no "
				      "--capacity or watermark\n");
			return -EINVAL;
		}
	} else if (!strcmp(cmd->name, "evict")) {
		if ((o->argc == 1) + o->to_low + (o->older_than > 0) != 1) {
			fprintf(stderr, "cachectl evict: give a DATASET, "
					"--to-low-watermark or --older-than "
					"(one of them)\n");
			return -EINVAL;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	static char cap[32], high[8], low[8], neg[4][32];
	struct cachectl_opts o = { 0 };
	const struct cachectl_cmd *cmd = NULL;
	struct dstage_config *cfg = NULL;
	char err[512];
	uint64_t v;
	int opt, ret, code;

	if (cli_global_opts(&argc, &argv, &o.config)) {
		cachectl_usage(stdout);
		return CLI_EXIT_OK;
	}
	if (argc < 2) {
		cachectl_usage(stderr);
		return CLI_EXIT_USAGE;
	}
	cmd = cachectl_find(argv[1]);
	if (!cmd) {
		fprintf(stderr, "cachectl: unknown command '%s'\n", argv[1]);
		cachectl_usage(stderr);
		return CLI_EXIT_USAGE;
	}
	argv++;
	argc--;
	if (!strcmp(cmd->opts, "*")) {
		o.argc = argc;
		o.argv = argv;
		return cmd->run(NULL, cmd, &o);
	}
	/* A negative number is an argument (priority ds -5, quota ds -1 to
	 * be refused by name), not an option: hide it from getopt. */
	for (int i = 1, n = 0; i < argc && n < 4; i++)
		if (argv[i][0] == '-' && argv[i][1] >= '0' &&
		    argv[i][1] <= '9' && strlen(argv[i]) < sizeof(neg[0]) - 1) {
			snprintf(neg[n], sizeof(neg[0]), "\x01%s", argv[i]);
			argv[i] = neg[n++];
		}
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", cachectl_long, NULL)) !=
	       -1) {
		if (optarg && optarg[0] == '\x01')
			optarg++; /* a negative number, refused by name */
		if (opt == 'h') {
			cachectl_cmd_help(cmd);
			return CLI_EXIT_OK;
		}
		if (opt == '?')
			goto usage;
		if (opt == 'c') {
			o.config = optarg;
			continue;
		}
		if (!strchr(cmd->opts, opt)) {
			fprintf(stderr,
				"cachectl %s: option %s does not apply\n",
				cmd->name, argv[optind - 1]);
			goto usage;
		}
		switch (opt) {
		case 'j':
			o.json = true;
			break;
		case 'D':
			o.dry_run = true;
			break;
		case 'l':
			o.to_low = true;
			break;
		case 'C':
			if (cachectl_size("--capacity", optarg, 1024 * 1024,
					  &v))
				goto usage;
			snprintf(cap, sizeof(cap), "%" PRIu64, v);
			o.capacity = cap;
			break;
		case 'H':
			if (cachectl_pct("--high-watermark", optarg, high,
					 sizeof(high)))
				goto usage;
			o.high = high;
			break;
		case 'L':
			if (cachectl_pct("--low-watermark", optarg, low,
					 sizeof(low)))
				goto usage;
			o.low = low;
			break;
		case 's':
			if (cachectl_since(optarg, &o.since))
				goto usage;
			break;
		case 'u':
			o.user = optarg;
			break;
		case 'o':
			if (cachectl_age("--older-than", optarg, &o.older_than))
				goto usage;
			break;
		}
	}
	o.argc = argc - optind;
	o.argv = argv + optind;
	for (int i = 0; i < o.argc; i++)
		if (o.argv[i][0] == '\x01')
			o.argv[i]++;
	if (o.argc < cmd->min_args || o.argc > cmd->max_args) {
		fprintf(stderr, "cachectl %s: expected %s\n", cmd->name,
			cmd->usage[0] ? cmd->usage : "no arguments");
		goto usage;
	}
	if (cachectl_args(cmd, &o))
		goto usage;
	ret = config_load(o.config, &cfg, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "cachectl: %s\n", err);
		return CLI_EXIT_USAGE;
	}
	log_set_level((enum log_level)cfg->log_level);
	code = cmd->run(cfg, cmd, &o);
	config_free(cfg);
	return code;
usage:
	fprintf(stderr, "'cachectl %s --help' for help\n", cmd->name);
	return CLI_EXIT_USAGE;
}
