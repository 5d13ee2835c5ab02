// SPDX-License-Identifier: MIT
/*
 * stager: prewarm, verify and manage datasets on this node.
 *
 *   stager [--config FILE] COMMAND [OPTIONS] [ARGS]
 *
 * `daemon`, `ls` and `bench` run in this process; every other command is a
 * request to the daemon over daemon.socket (docs/stager.md).
 *
 * Stateless: parse, load the configuration, dispatch, exit.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "dstage/log.h"
#include "lifecycle.h"
#include "stager.h"

static int stager_daemon(const struct dstage_config *cfg,
			 const struct stager_cmd *cmd,
			 const struct stager_opts *o)
{
	(void)cmd;
	if (cfg->log_syslog)
		log_use_syslog("dstage-stager");
	return daemon_main(cfg, o);
}

static int stager_lifecycle(const struct dstage_config *cfg,
			    const struct stager_cmd *cmd,
			    const struct stager_opts *o)
{
	(void)cfg;
	(void)cmd;
	return lifecycle_cli("stager", o->config, o->argc, o->argv);
}

static const struct stager_cmd stager_cmds[] = {
	{ "daemon", stager_daemon, 0, STAGER_JSON_NONE, 0, 0, "mui", "",
	  "Run the stager daemon in the foreground (for systemd): listen on\n"
	  "daemon.socket, run queued stage and verify jobs, resume the jobs a\n"
	  "crash or stop interrupted. Stops on SIGTERM or SIGINT.\n"
	  "  --max-conns N          connections served at once, all users\n"
	  "                         but root together (default 64); more\n"
	  "                         are refused with a message\n"
	  "  --max-conns-per-uid N  connections served at once per uid\n"
	  "                         (default 16)\n"
	  "  --idle-timeout T       close a connection that sends no whole\n"
	  "                         request for T (default 5s; 500ms, 1m)" },
	{ "add", client_add, STAGER_NEEDS_DAEMON, STAGER_JSON_OBJECT, 2, 2,
	  "jVMGpPL", "NAME URL",
	  "Register a dataset: list URL (s3://bucket/prefix/ or file:///dir/)\n"
	  "once and record its manifest, with the expected SHA-256 of every\n"
	  "file listed in its SHA256SUMS file (or --manifest KEY).\n"
	  "  --version V     a version label shown by list/show\n"
	  "  --manifest KEY  the expected-hash list (sha256sum format), a\n"
	  "                  key under URL such as meta/sums.sha256, with\n"
	  "                  names relative to URL. Default SHA256SUMS, used\n"
	  "                  when present; any other KEY must exist.\n"
	  "                  refresh reuses it.\n"
	  "  --group G       owning group\n"
	  "  --pin           never evict it from the cache\n"
	  "  --priority N    eviction and bandwidth priority (higher: kept\n"
	  "                  longer, more bandwidth)\n"
	  "  --shared-tier DIR  the dataset's shared tier: a directory on the\n"
	  "                  parallel FS (/DIR or file:///DIR/) holding a\n"
	  "                  verified copy of each snapshot (stage --shared);\n"
	  "                  default sources.shared_tier_root/NAME" },
	{ "refresh", client_add, STAGER_NEEDS_DAEMON, STAGER_JSON_OBJECT, 1, 1,
	  "j", "NAME",
	  "List the dataset's source again and make that the new manifest,\n"
	  "with the expected hashes from the same --manifest key as at add." },
	{ "remove", client_remove, STAGER_NEEDS_DAEMON, STAGER_JSON_NONE, 1, 1,
	  "j", "NAME",
	  "Cancel the dataset's jobs, drop its cached blocks and forget it." },
	{ "list", client_list, STAGER_NEEDS_DAEMON, STAGER_JSON_ARRAY, 0, 0,
	  "j", "", "List the datasets." },
	{ "show", client_show, STAGER_NEEDS_DAEMON, STAGER_JSON_OBJECT, 1, 1,
	  "j", "NAME",
	  "Files, bytes, manifest key, cached and verified share and last\n"
	  "verify of a dataset." },
	{ "stage", client_submit, STAGER_NEEDS_DAEMON | STAGER_SUBMIT,
	  STAGER_JSON_OBJECT, 1, 1, "jwbnfFJHO", "NAME|PATH",
	  "Prewarm the dataset (or --files) into the cache, hashing every "
	  "file\n"
	  "as it streams and checking it against the dataset's manifest key\n"
	  "(SHA256SUMS unless add --manifest chose another). A PATH (it holds\n"
	  "a '/') is a directory under a dstagefs mount (dstagefs --over):\n"
	  "every file is read through the mount, in this process and with\n"
	  "your rights, so that dstagefs caches it (--parallel, --json).\n"
	  "  --wait           follow the job: a progress bar on a terminal,\n"
	  "                   plain lines otherwise; exit 1 if it fails\n"
	  "  --bandwidth RATE cap, bytes per second (500M, 1G)\n"
	  "  --parallel N     files in flight (default s3.max_inflight)\n"
	  "  --files LIST     comma-separated keys, or @FILE with one a line\n"
	  "  --fit            stage what fits in the cache instead of failing\n"
	  "                   when the dataset is larger than cache.size\n"
	  "  --jitter S       first wait a uniform random 0 to S seconds\n"
	  "                   (0-86400), so many nodes' scheduled stages\n"
	  "                   spread out (the Slurm prolog)\n"
	  "  --shared         copy the snapshot once into the dataset's "
	  "shared\n"
	  "                   tier for the whole cluster instead (one node\n"
	  "                   holds a lease; with --wait or --timeout T\n"
	  "                   (default 10m) wait for another node's copy,\n"
	  "                   else exit 1 at once naming that node)" },
	{ "verify", client_submit,
	  STAGER_NEEDS_DAEMON | STAGER_SUBMIT | STAGER_ALWAYS_WAIT,
	  STAGER_JSON_OBJECT, 1, 1, "jwscrebnf", "NAME|PATH",
	  "Check every file's SHA-256 against the dataset's manifest key\n"
	  "(SHA256SUMS unless add --manifest chose another) or, for files it\n"
	  "does not list, against the hash recorded when staging. Exit 0 only\n"
	  "when all match. Always waits. A PATH under a dstagefs mount: every\n"
	  "file read through it and hashed, checked against PATH/SHA256SUMS\n"
	  "when there is one (mismatched, missing, not listed).\n"
	  "  --cache     read the cache (default): check each cached block's\n"
	  "              checksum first, never contacting the source; report\n"
	  "              each damaged block (key, block, cache file) and the\n"
	  "              blocks missing, and exit 1 if any\n"
	  "  --source    read the source\n"
	  "  --repair    fetch damaged and missing blocks again, drop and\n"
	  "              fetch again cached files that mismatch, then check\n"
	  "              them again; report what was repaired\n"
	  "  --fetch-missing  fetch the blocks missing from the cache (never\n"
	  "              staged or evicted) instead of reporting them\n"
	  "  --parallel N, --bandwidth RATE, --files LIST as for stage" },
	{ "jobs", client_jobs, STAGER_NEEDS_DAEMON, STAGER_JSON_ARRAY, 0, 0,
	  "ja", "", "Running, queued and recent jobs (--all: all)." },
	{ "status", client_jobs, STAGER_NEEDS_DAEMON | STAGER_ARG_JOB,
	  STAGER_JSON_OBJECT, 0, 1, "jwa", "[JOB]",
	  "One job's state (--wait: follow it to its end), or all as `jobs`." },
	{ "cancel", client_cancel, STAGER_NEEDS_DAEMON | STAGER_ARG_JOB,
	  STAGER_JSON_NONE, 1, 1, "j", "JOB",
	  "Cancel a queued or running job." },
	{ "ls", local_ls, 0, STAGER_JSON_ARRAY, 1, 1, "j", "URL",
	  "List an object-store prefix directly (no daemon): checks the\n"
	  "endpoint and the credentials." },
	{ "bench", local_bench, 0, STAGER_JSON_OBJECT, 1, 1, "jz", "NAME|URL",
	  "Read throughput of the source, the cache and the local disk, and\n"
	  "SHA-256 on all cores, on this node (no daemon).\n"
	  "  --size BYTES  read at most this much (default 1G)" },
	{ "push", local_push, 0, STAGER_JSON_OBJECT, 2, 2, "jNTYbnxDdR",
	  "LOCAL_DIR URL",
	  "Upload every regular file under LOCAL_DIR to URL (s3://BUCKET/\n"
	  "PREFIX/ or file:///DIR/; keys are the relative paths), hashing\n"
	  "each (SHA-256) as it is read; check the stored size and ETag (or,\n"
	  "file://, a re-read hash); write SHA256SUMS last; then register\n"
	  "the dataset as `add` does. A file that changes while pushed is\n"
	  "reported and not published. Run it again to resume: files the\n"
	  "store holds as recorded are skipped without reading them.\n"
	  "  --name NAME      the dataset (default: LOCAL_DIR's name)\n"
	  "  --stage          then prewarm it (stage --wait)\n"
	  "  --verify         then verify --source\n"
	  "  --parallel N     files in flight (default s3.max_inflight);\n"
	  "                   large files go up in parallel parts too\n"
	  "  --bandwidth RATE cap over all files, bytes per second (500M)\n"
	  "  --exclude GLOB   leave out matching names (no '/': any name,\n"
	  "                   a directory's subtree too; with '/': the\n"
	  "                   relative path); repeatable, at most 256\n"
	  "  --delete         delete keys under URL absent locally\n"
	  "  --dry-run        list what would be uploaded and deleted\n"
	  "  --new-version    allow changing a registered dataset's objects\n"
	  "                   and register a new manifest version (running\n"
	  "                   jobs keep theirs)" },
	{ "drill", local_drill, 0, STAGER_JSON_OBJECT, 1, 1, "jtS", "JOB",
	  "Restore the newest checkpoint of JOB (or --step S) from\n"
	  "checkpoints.store into --to DIR and check every file's SHA-256\n"
	  "against the one recorded at publish (no daemon); exit 1 names\n"
	  "each file that differs or is missing.\n"
	  "  --step S  a step number or a checkpoint name\n"
	  "  --to DIR  an empty or new scratch directory" },
	{ "unpublished", client_unpublished, STAGER_NEEDS_DAEMON,
	  STAGER_JSON_ARRAY, 0, 0, "jwEO", "",
	  "This node's checkpoint files that are not in checkpoints.store:\n"
	  "each one's key, state and cause: open (still open by a writer),\n"
	  "unpublished (closed; the store refused it, with the store's\n"
	  "error, or its publish is under way) or abandoned (its writer was\n"
	  "killed before closing it). Exit 0 when there are none, 1 when\n"
	  "there are (admins only; the Slurm epilog waits on it).\n"
	  "  --since T    only files changed at or after T (seconds since\n"
	  "               the epoch: the job's start)\n"
	  "  --wait       ask again every second until there are none, at\n"
	  "               most --timeout\n"
	  "  --timeout T  how long --wait waits (default 60s; 500ms, 5m;\n"
	  "               at most 24h); implies --wait" },
	{ "lifecycle", stager_lifecycle, STAGER_NEEDS_DAEMON | STAGER_OWN_OPTS,
	  STAGER_JSON_OBJECT, 1, 2, "", "list|add|remove|run",
	  lifecycle_cli_help },
};

static const struct option stager_long[] = {
	{ "config", required_argument, NULL, 'c' },
	{ "json", no_argument, NULL, 'j' },
	{ "wait", no_argument, NULL, 'w' },
	{ "version", required_argument, NULL, 'V' },
	{ "manifest", required_argument, NULL, 'M' },
	{ "shared-tier", required_argument, NULL, 'L' },
	{ "shared", no_argument, NULL, 'H' },
	{ "group", required_argument, NULL, 'G' },
	{ "pin", no_argument, NULL, 'p' },
	{ "priority", required_argument, NULL, 'P' },
	{ "bandwidth", required_argument, NULL, 'b' },
	{ "parallel", required_argument, NULL, 'n' },
	{ "files", required_argument, NULL, 'f' },
	{ "fit", no_argument, NULL, 'F' },
	{ "jitter", required_argument, NULL, 'J' },
	{ "source", no_argument, NULL, 's' },
	{ "cache", no_argument, NULL, 'C' },
	{ "repair", no_argument, NULL, 'r' },
	{ "fetch-missing", no_argument, NULL, 'e' },
	{ "all", no_argument, NULL, 'a' },
	{ "size", required_argument, NULL, 'z' },
	{ "to", required_argument, NULL, 't' },
	{ "step", required_argument, NULL, 'S' },
	{ "max-conns", required_argument, NULL, 'm' },
	{ "max-conns-per-uid", required_argument, NULL, 'u' },
	{ "idle-timeout", required_argument, NULL, 'i' },
	{ "name", required_argument, NULL, 'N' },
	{ "stage", no_argument, NULL, 'T' },
	{ "verify", no_argument, NULL, 'Y' },
	{ "exclude", required_argument, NULL, 'x' },
	{ "delete", no_argument, NULL, 'D' },
	{ "dry-run", no_argument, NULL, 'd' },
	{ "new-version", no_argument, NULL, 'R' },
	{ "since", required_argument, NULL, 'E' },
	{ "timeout", required_argument, NULL, 'O' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static void stager_usage(FILE *f)
{
	fprintf(f, "usage: stager [--config FILE] COMMAND [OPTIONS] [ARGS]\n\n"
		   "Commands:\n");
	for (size_t i = 0; i < sizeof(stager_cmds) / sizeof(stager_cmds[0]);
	     i++)
		fprintf(f, "  %-8s %s\n", stager_cmds[i].name,
			stager_cmds[i].usage);
	fprintf(f, "\n'stager COMMAND --help' describes one. Exit codes: 0 ok, "
		   "1 failed (or a mismatch), 2 usage, 3 daemon not running,\n"
		   "4 permission denied, 5 no such dataset or job.\n");
}

static void stager_cmd_help(const struct stager_cmd *c)
{
	printf("usage: stager %s %s%s\n\n%s\n\n"
	       "Common options: --config FILE, --json (where it prints "
	       "results), --help.\n",
	       c->name, c->usage, c->usage[0] ? " [OPTIONS]" : "[OPTIONS]",
	       c->help);
}

static const struct stager_cmd *stager_find(const char *name)
{
	return cli_cmd_find(stager_cmds,
			    sizeof(stager_cmds) / sizeof(stager_cmds[0]),
			    sizeof(stager_cmds[0]), name);
}

static int stager_size(const char *opt, const char *s, uint64_t *v)
{
	if (config_parse_size(s, v) || !*v) {
		fprintf(stderr,
			"stager: %s %s: expected a size such as 500M "
			"or 1G\n",
			opt, s);
		return -EINVAL;
	}
	return 0;
}

/* A count from lo to hi: decimal digits only, no suffix. */
static int stager_count(const char *opt, const char *s, unsigned lo,
			unsigned hi, unsigned *v)
{
	unsigned long n = 0;

	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9' || n > hi) {
			n = (unsigned long)hi + 1;
			break;
		}
		n = n * 10 + (unsigned long)(*p - '0');
	}
	if (!*s || n < lo || n > hi) {
		fprintf(stderr,
			"stager: %s %s: expected a count from %u to %u\n", opt,
			s, lo, hi);
		return -EINVAL;
	}
	*v = (unsigned)n;
	return 0;
}

int main(int argc, char **argv)
{
	struct stager_opts o = {
		.since = -1,
		.lim = { .max_conns = STAGER_MAX_CONNS,
			 .max_conns_uid = STAGER_MAX_CONNS_UID,
			 .idle_ms = STAGER_IDLE_MS },
	};
	const struct stager_cmd *cmd = NULL;
	struct dstage_config *cfg = NULL;
	char err[512];
	int opt, ret, code = CLI_EXIT_USAGE;

	if (cli_global_opts(&argc, &argv, &o.config)) {
		stager_usage(stdout);
		return CLI_EXIT_OK;
	}
	if (argc < 2) {
		stager_usage(stderr);
		return CLI_EXIT_USAGE;
	}
	cmd = stager_find(argv[1]);
	if (!cmd) {
		fprintf(stderr, "stager: unknown command '%s'\n", argv[1]);
		stager_usage(stderr);
		return CLI_EXIT_USAGE;
	}
	argv++;
	argc--;
	if (cmd->flags & STAGER_OWN_OPTS) {
		o.argc = argc;
		o.argv = argv;
		return cmd->run(NULL, cmd, &o);
	}
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", stager_long, NULL)) != -1) {
		if (opt == 'h') {
			stager_cmd_help(cmd);
			return CLI_EXIT_OK;
		}
		if (opt == '?')
			goto usage;
		if (opt == 'c') {
			o.config = optarg;
			continue;
		}
		if (!strchr(cmd->opts, opt) &&
		    !(opt == 'C' && strchr(cmd->opts, 'c'))) {
			fprintf(stderr, "stager %s: option %s does not apply\n",
				cmd->name, argv[optind - 1]);
			goto usage;
		}
		switch (opt) {
		case 'j':
			o.json = true;
			break;
		case 'w':
			o.wait = true;
			break;
		case 'V':
			o.version = optarg;
			break;
		case 'M':
			o.manifest = optarg;
			break;
		case 'L':
			o.shared_tier = optarg;
			break;
		case 'H':
			o.shared = true;
			break;
		case 'G':
			o.group = optarg;
			break;
		case 'p':
			o.pin = true;
			break;
		case 'P': {
			char *end;

			errno = 0;
			o.priority = strtoll(optarg, &end, 10);
			if (errno || *end || o.priority < -1000 ||
			    o.priority > 1000) {
				fprintf(stderr,
					"stager: --priority %s: "
					"expected -1000 to 1000\n",
					optarg);
				goto usage;
			}
			o.has_priority = true;
			break;
		}
		case 'b':
			if (stager_size("--bandwidth", optarg, &o.bandwidth))
				goto usage;
			break;
		case 'n':
			if (stager_count("--parallel", optarg, 1,
					 STAGER_PARALLEL_MAX, &o.parallel))
				goto usage;
			break;
		case 'f':
			o.files = optarg;
			break;
		case 'F':
			o.fit = true;
			break;
		case 'J':
			if (stager_count("--jitter", optarg, 0, 86400,
					 &o.jitter_s))
				goto usage;
			break;
		case 's':
		case 'C':
			if (o.mode) {
				fprintf(stderr, "stager: --source and --cache "
						"exclude each other\n");
				goto usage;
			}
			o.mode = opt == 's' ? "source" : "cache";
			break;
		case 'r':
			o.repair = true;
			break;
		case 'e':
			o.fetch_missing = true;
			break;
		case 'a':
			o.all = true;
			break;
		case 'z':
			if (stager_size("--size", optarg, &o.bench_bytes))
				goto usage;
			break;
		case 't':
			o.to = optarg;
			break;
		case 'S':
			o.step = optarg;
			break;
		case 'N':
			o.push_name = optarg;
			break;
		case 'T':
			o.push_stage = true;
			break;
		case 'Y':
			o.push_verify = true;
			break;
		case 'x':
			if (o.push_n_excludes == STAGER_EXCLUDES_MAX) {
				fprintf(stderr,
					"stager: at most %d --exclude "
					"patterns\n",
					STAGER_EXCLUDES_MAX);
				goto usage;
			}
			o.push_excludes[o.push_n_excludes++] = optarg;
			break;
		case 'D':
			o.push_delete = true;
			break;
		case 'd':
			o.push_dry_run = true;
			break;
		case 'R':
			o.push_new_version = true;
			break;
		case 'E': {
			char *end;

			errno = 0;
			o.since = strtoll(optarg, &end, 10);
			if (errno || end == optarg || *end || o.since < 0 ||
			    *optarg < '0' || *optarg > '9') {
				fprintf(stderr,
					"stager: --since %s: expected seconds "
					"since the epoch (date +%%s)\n",
					optarg);
				goto usage;
			}
			break;
		}
		case 'O':
			if (config_parse_duration_ms(optarg, &o.timeout_ms) ||
			    o.timeout_ms < 1 || o.timeout_ms > 86400000) {
				fprintf(stderr,
					"stager: --timeout %s: expected a "
					"duration from 1ms to 24h (60s, 5m, "
					"500ms)\n",
					optarg);
				goto usage;
			}
			o.wait = true;
			break;
		case 'm':
			if (stager_count("--max-conns", optarg, 1,
					 STAGER_CONNS_LIMIT, &o.lim.max_conns))
				goto usage;
			break;
		case 'u':
			if (stager_count("--max-conns-per-uid", optarg, 1,
					 STAGER_CONNS_LIMIT,
					 &o.lim.max_conns_uid))
				goto usage;
			break;
		case 'i':
			if (config_parse_duration_ms(optarg, &o.lim.idle_ms) ||
			    o.lim.idle_ms < 1 || o.lim.idle_ms > 3600000) {
				fprintf(stderr,
					"stager: --idle-timeout %s: expected "
					"a duration from 1ms to 1h (5s, "
					"500ms)\n",
					optarg);
				goto usage;
			}
			break;
		}
	}
	o.argc = argc - optind;
	o.argv = argv + optind;
	if (o.argc < cmd->min_args || o.argc > cmd->max_args) {
		fprintf(stderr, "stager %s: expected %s\n", cmd->name,
			cmd->usage[0] ? cmd->usage : "no arguments");
		goto usage;
	}
	if ((o.repair || o.fetch_missing) && o.mode &&
	    !strcmp(o.mode, "source")) {
		fprintf(stderr,
			"stager verify: --repair and --fetch-missing "
			"mend the cache: they do not go with --source\n");
		goto usage;
	}
	if (cmd->flags & STAGER_ALWAYS_WAIT)
		o.wait = true;

	ret = config_load(o.config, &cfg, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "stager: %s\n", err);
		return CLI_EXIT_USAGE;
	}
	log_set_level((enum log_level)cfg->log_level);
	code = cmd->run(cfg, cmd, &o);
	config_free(cfg);
	return code;
usage:
	fprintf(stderr, "'stager %s --help' for help\n", cmd->name);
	return CLI_EXIT_USAGE;
}
