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
#include <stddef.h>
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
	{ "daemon", stager_daemon, 0, STAGER_JSON_NONE, 0, 0, "mui", "", "",
	  "Run the daemon in the foreground (systemd)",
	  "Run the stager daemon in the foreground (for systemd): listen on\n"
	  "daemon.socket, run queued stage and verify jobs, resume the jobs a\n"
	  "crash or stop interrupted. Stops on SIGTERM or SIGINT.\n"
	  "  --max-conns N          connections served at once, all users\n"
	  "                         but root together (default 64); more\n"
	  "                         are refused with a message; the last\n"
	  "                         N/8 go only to uids holding none\n"
	  "  --max-conns-per-uid N  connections served at once per uid\n"
	  "                         (default 16)\n"
	  "  --idle-timeout T       close a connection that sends no whole\n"
	  "                         request for T (default 5s; 500ms, 1m)" },
	{ "add", client_add, STAGER_NEEDS_DAEMON, STAGER_JSON_OBJECT, 2, 2,
	  "jVMGpPL", "", "NAME URL",
	  "Register a dataset and record its manifest",
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
	  "j", "", "NAME", "List a dataset's source again",
	  "List the dataset's source again and make that the new manifest,\n"
	  "with the expected hashes from the same --manifest key as at add." },
	{ "remove", client_remove, STAGER_NEEDS_DAEMON, STAGER_JSON_NONE, 1, 1,
	  "j", "", "NAME", "Forget a dataset, drop its cached blocks",
	  "Cancel the dataset's jobs, drop its cached blocks and forget it." },
	{ "list", client_list, STAGER_NEEDS_DAEMON, STAGER_JSON_ARRAY, 0, 0,
	  "j", "", "", "List the datasets", "List the datasets." },
	{ "show", client_show, STAGER_NEEDS_DAEMON, STAGER_JSON_OBJECT, 1, 1,
	  "j", "", "NAME", "One dataset's files, bytes and state",
	  "Files, bytes, manifest key, cached and verified share and last\n"
	  "verify of a dataset." },
	{ "stage", client_submit, STAGER_NEEDS_DAEMON | STAGER_SUBMIT,
	  STAGER_JSON_OBJECT, 1, 1, "jwbnfFJHO", "", "NAME|PATH",
	  "Prewarm a dataset into the cache",
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
	  STAGER_JSON_OBJECT, 1, 1, "jwsCrebnf", "", "NAME|PATH",
	  "Check every file's SHA-256",
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
	  "ja", "", "", "Running, queued and recent jobs",
	  "Running, queued and recent jobs (--all: all)." },
	{ "status", client_jobs, STAGER_NEEDS_DAEMON | STAGER_ARG_JOB,
	  STAGER_JSON_OBJECT, 0, 1, "jwa", "", "[JOB]",
	  "One job's state, or all jobs",
	  "One job's state (--wait: follow it to its end), or all as `jobs`." },
	{ "cancel", client_cancel, STAGER_NEEDS_DAEMON | STAGER_ARG_JOB,
	  STAGER_JSON_NONE, 1, 1, "j", "", "JOB",
	  "Cancel a queued or running job", "Cancel a queued or running job." },
	{ "ls", local_ls, 0, STAGER_JSON_ARRAY, 1, 1, "j", "", "URL",
	  "List an object-store prefix (no daemon)",
	  "List an object-store prefix directly (no daemon): checks the\n"
	  "endpoint and the credentials." },
	{ "bench", local_bench, 0, STAGER_JSON_OBJECT, 1, 1, "jz", "",
	  "NAME|URL", "Read throughput of source, cache and disk",
	  "Read throughput of the source, the cache and the local disk, and\n"
	  "SHA-256 on all cores, on this node (no daemon).\n"
	  "  --size BYTES  read at most this much (default 1G)" },
	{ "push", local_push, 0, STAGER_JSON_OBJECT, 2, 2, "jNTYbnxDdR", "",
	  "LOCAL_DIR URL", "Upload a directory and register it",
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
	{ "drill", local_drill, 0, STAGER_JSON_OBJECT, 1, 1, "jtS", "--to DIR",
	  "JOB", "Restore a checkpoint and check its hashes",
	  "Restore the newest checkpoint of JOB (or --step S) from\n"
	  "checkpoints.store into --to DIR and check every file's SHA-256\n"
	  "against the one recorded at publish (no daemon); exit 1 names\n"
	  "each file that differs or is missing.\n"
	  "  --step S  a step number or a checkpoint name\n"
	  "  --to DIR  an empty or new scratch directory" },
	{ "unpublished", client_unpublished, STAGER_NEEDS_DAEMON,
	  STAGER_JSON_ARRAY, 0, 0, "jwEO", "", "",
	  "Checkpoint files not yet in the store",
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
	  STAGER_JSON_OBJECT, 1, 2, "", "", "list|add|remove|run",
	  "Checkpoint lifecycle rules", lifecycle_cli_help },
};

struct stager_optdef;
/* Store one option's argument (or its presence) in o; non-zero: a usage
 * error, already reported. */
typedef int (*stager_set_fn)(struct stager_opts *o,
			     const struct stager_optdef *d, const char *arg);

/* One option of any command: a command takes those whose letter is in its
 * row's opts. */
struct stager_optdef {
	const char *name; /* the long option, without "--" */
	int has_arg; /* no_argument or required_argument */
	int letter; /* its letter in stager_cmd.opts */
	size_t off; /* the field of stager_opts it sets (stager_set_flag,
		     * stager_set_str) */
	stager_set_fn set;
};

/* A flag: the bool at d->off becomes true. */
static int stager_set_flag(struct stager_opts *o, const struct stager_optdef *d,
			   const char *arg)
{
	(void)arg;
	*(bool *)((char *)o + d->off) = true;
	return 0;
}

/* A string: the const char * at d->off becomes the argument. */
static int stager_set_str(struct stager_opts *o, const struct stager_optdef *d,
			  const char *arg)
{
	*(const char **)((char *)o + d->off) = arg;
	return 0;
}

/* A size such as 500M or 1G, more than 0. */
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

/* --priority N: -1000 to 1000. */
static int stager_set_priority(struct stager_opts *o,
			       const struct stager_optdef *d, const char *arg)
{
	char *end;

	(void)d;
	errno = 0;
	o->priority = strtoll(arg, &end, 10);
	if (errno || *end || o->priority < -1000 || o->priority > 1000) {
		fprintf(stderr,
			"stager: --priority %s: expected -1000 to 1000\n", arg);
		return -EINVAL;
	}
	o->has_priority = true;
	return 0;
}

/* --bandwidth RATE, --size BYTES: a size at d->off. */
static int stager_set_size(struct stager_opts *o, const struct stager_optdef *d,
			   const char *arg)
{
	char opt[32];

	snprintf(opt, sizeof(opt), "--%s", d->name);
	return stager_size(opt, arg, (uint64_t *)((char *)o + d->off));
}

/* --parallel N: 1 to STAGER_PARALLEL_MAX. */
static int stager_set_parallel(struct stager_opts *o,
			       const struct stager_optdef *d, const char *arg)
{
	(void)d;
	return stager_count("--parallel", arg, 1, STAGER_PARALLEL_MAX,
			    &o->parallel);
}

/* --jitter S: 0 to 86400 seconds. */
static int stager_set_jitter(struct stager_opts *o,
			     const struct stager_optdef *d, const char *arg)
{
	(void)d;
	return stager_count("--jitter", arg, 0, 86400, &o->jitter_s);
}

/* --max-conns N, --max-conns-per-uid N: 1 to STAGER_CONNS_LIMIT. */
static int stager_set_conns(struct stager_opts *o,
			    const struct stager_optdef *d, const char *arg)
{
	char opt[32];

	snprintf(opt, sizeof(opt), "--%s", d->name);
	return stager_count(opt, arg, 1, STAGER_CONNS_LIMIT,
			    (unsigned *)((char *)o + d->off));
}

/* --source, --cache: verify's side, one of the two. */
static int stager_set_mode(struct stager_opts *o, const struct stager_optdef *d,
			   const char *arg)
{
	(void)arg;
	if (o->mode) {
		fprintf(stderr, "stager: --source and --cache "
				"exclude each other\n");
		return -EINVAL;
	}
	o->mode = d->letter == 's' ? "source" : "cache";
	return 0;
}

/* --exclude GLOB: repeatable, at most STAGER_EXCLUDES_MAX. */
static int stager_set_exclude(struct stager_opts *o,
			      const struct stager_optdef *d, const char *arg)
{
	(void)d;
	if (o->push_n_excludes == STAGER_EXCLUDES_MAX) {
		fprintf(stderr, "stager: at most %d --exclude patterns\n",
			STAGER_EXCLUDES_MAX);
		return -EINVAL;
	}
	o->push_excludes[o->push_n_excludes++] = arg;
	return 0;
}

/* --since T: seconds since the epoch, digits only. */
static int stager_set_since(struct stager_opts *o,
			    const struct stager_optdef *d, const char *arg)
{
	char *end;

	(void)d;
	errno = 0;
	o->since = strtoll(arg, &end, 10);
	if (errno || end == arg || *end || o->since < 0 || *arg < '0' ||
	    *arg > '9') {
		fprintf(stderr,
			"stager: --since %s: expected seconds "
			"since the epoch (date +%%s)\n",
			arg);
		return -EINVAL;
	}
	return 0;
}

/* --timeout T: 1ms to 24h; implies --wait. */
static int stager_set_timeout(struct stager_opts *o,
			      const struct stager_optdef *d, const char *arg)
{
	(void)d;
	if (config_parse_duration_ms(arg, &o->timeout_ms) ||
	    o->timeout_ms < 1 || o->timeout_ms > 86400000) {
		fprintf(stderr,
			"stager: --timeout %s: expected a "
			"duration from 1ms to 24h (60s, 5m, "
			"500ms)\n",
			arg);
		return -EINVAL;
	}
	o->wait = true;
	return 0;
}

/* --idle-timeout T: 1ms to 1h. */
static int stager_set_idle(struct stager_opts *o, const struct stager_optdef *d,
			   const char *arg)
{
	(void)d;
	if (config_parse_duration_ms(arg, &o->lim.idle_ms) ||
	    o->lim.idle_ms < 1 || o->lim.idle_ms > 3600000) {
		fprintf(stderr,
			"stager: --idle-timeout %s: expected "
			"a duration from 1ms to 1h (5s, "
			"500ms)\n",
			arg);
		return -EINVAL;
	}
	return 0;
}

#define OPT_FLAG(name, letter, field)                                        \
	{                                                                    \
		name, no_argument, letter,                                   \
			offsetof(struct stager_opts, field), stager_set_flag \
	}
#define OPT_STR(name, letter, field)                                        \
	{                                                                   \
		name, required_argument, letter,                            \
			offsetof(struct stager_opts, field), stager_set_str \
	}
#define OPT_FN(name, has_arg, letter, field, fn)                               \
	{                                                                      \
		name, has_arg, letter, offsetof(struct stager_opts, field), fn \
	}

/* Every command's options but --config and --help (main() takes those). */
static const struct stager_optdef stager_optdefs[] = {
	OPT_FLAG("json", 'j', json),
	OPT_FLAG("wait", 'w', wait),
	OPT_STR("version", 'V', version),
	OPT_STR("manifest", 'M', manifest),
	OPT_STR("shared-tier", 'L', shared_tier),
	OPT_FLAG("shared", 'H', shared),
	OPT_STR("group", 'G', group),
	OPT_FLAG("pin", 'p', pin),
	OPT_FN("priority", required_argument, 'P', priority,
	       stager_set_priority),
	OPT_FN("bandwidth", required_argument, 'b', bandwidth, stager_set_size),
	OPT_FN("parallel", required_argument, 'n', parallel,
	       stager_set_parallel),
	OPT_STR("files", 'f', files),
	OPT_FLAG("fit", 'F', fit),
	OPT_FN("jitter", required_argument, 'J', jitter_s, stager_set_jitter),
	OPT_FN("source", no_argument, 's', mode, stager_set_mode),
	OPT_FN("cache", no_argument, 'C', mode, stager_set_mode),
	OPT_FLAG("repair", 'r', repair),
	OPT_FLAG("fetch-missing", 'e', fetch_missing),
	OPT_FLAG("all", 'a', all),
	OPT_FN("size", required_argument, 'z', bench_bytes, stager_set_size),
	OPT_STR("to", 't', to),
	OPT_STR("step", 'S', step),
	OPT_FN("max-conns", required_argument, 'm', lim.max_conns,
	       stager_set_conns),
	OPT_FN("max-conns-per-uid", required_argument, 'u', lim.max_conns_uid,
	       stager_set_conns),
	OPT_FN("idle-timeout", required_argument, 'i', lim.idle_ms,
	       stager_set_idle),
	OPT_STR("name", 'N', push_name),
	OPT_FLAG("stage", 'T', push_stage),
	OPT_FLAG("verify", 'Y', push_verify),
	OPT_FN("exclude", required_argument, 'x', push_excludes,
	       stager_set_exclude),
	OPT_FLAG("delete", 'D', push_delete),
	OPT_FLAG("dry-run", 'd', push_dry_run),
	OPT_FLAG("new-version", 'R', push_new_version),
	OPT_FN("since", required_argument, 'E', since, stager_set_since),
	OPT_FN("timeout", required_argument, 'O', timeout_ms,
	       stager_set_timeout),
};

#define STAGER_N_CMDS (sizeof(stager_cmds) / sizeof(stager_cmds[0]))
#define STAGER_N_OPTS (sizeof(stager_optdefs) / sizeof(stager_optdefs[0]))

/* One line of `stager --help`: "  NAME ARGS NEEDS", then its summary. */
static void stager_usage_row(FILE *f, const struct stager_cmd *c)
{
	char syn[96];
	int n;

	n = snprintf(syn, sizeof(syn), "%s%s%s%s%s", c->name,
		     c->usage[0] ? " " : "", c->usage, c->needs[0] ? " " : "",
		     c->needs);
	if (n > 30)
		fprintf(f, "  %s\n  %-30s %s\n", syn, "", c->summary);
	else
		fprintf(f, "  %-30s %s\n", syn, c->summary);
}

/* `stager --help`, drawn from the command table. */
static void stager_usage(FILE *f)
{
	fprintf(f, "usage: stager [--config FILE] COMMAND [OPTIONS] [ARGS]\n\n"
		   "Commands:\n");
	for (size_t i = 0; i < STAGER_N_CMDS; i++)
		stager_usage_row(f, &stager_cmds[i]);
	fprintf(f, "\n'stager COMMAND --help' describes one. Exit codes: 0 ok, "
		   "1 failed (or a mismatch), 2 usage, 3 daemon not running,\n"
		   "4 permission denied, 5 no such dataset or job.\n");
}

/* `stager COMMAND --help`: its synopsis and its help text. */
static void stager_cmd_help(const struct stager_cmd *c)
{
	printf("usage: stager %s %s%s%s%s\n\n%s\n\n"
	       "Common options: --config FILE, --json (where it prints "
	       "results), --help.\n",
	       c->name, c->usage, c->usage[0] && c->needs[0] ? " " : "",
	       c->needs,
	       c->usage[0] || c->needs[0] ? " [OPTIONS]" : "[OPTIONS]",
	       c->help);
}

/* The command named name, or NULL. */
static const struct stager_cmd *stager_find(const char *name)
{
	return cli_cmd_find(stager_cmds, STAGER_N_CMDS, sizeof(stager_cmds[0]),
			    name);
}

/* getopt_long's table, drawn from stager_optdefs (index i: its row i). */
static void stager_long_opts(struct option *lo)
{
	size_t i;

	for (i = 0; i < STAGER_N_OPTS; i++)
		lo[i] = (struct option){ stager_optdefs[i].name,
					 stager_optdefs[i].has_arg, NULL,
					 stager_optdefs[i].letter };
	lo[i++] = (struct option){ "config", required_argument, NULL, 'c' };
	lo[i++] = (struct option){ "help", no_argument, NULL, 'h' };
	lo[i] = (struct option){ NULL, 0, NULL, 0 };
}

static const struct stager_optdef *stager_optdef(int letter)
{
	for (size_t i = 0; i < STAGER_N_OPTS; i++)
		if (stager_optdefs[i].letter == letter)
			return &stager_optdefs[i];
	return NULL;
}

/* Parse cmd's options into o. Returns -1 to go on, else an exit code
 * (--help: 0; a usage error, reported: CLI_EXIT_USAGE). */
static int stager_parse_opts(const struct stager_cmd *cmd, int argc,
			     char **argv, struct stager_opts *o)
{
	struct option lo[STAGER_N_OPTS + 3];
	const struct stager_optdef *d;
	int opt;

	stager_long_opts(lo);
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		if (opt == 'h') {
			stager_cmd_help(cmd);
			return CLI_EXIT_OK;
		}
		if (opt == '?')
			return CLI_EXIT_USAGE;
		if (opt == 'c') {
			o->config = optarg;
			continue;
		}
		if (!strchr(cmd->opts, opt)) {
			fprintf(stderr, "stager %s: option %s does not apply\n",
				cmd->name, argv[optind - 1]);
			return CLI_EXIT_USAGE;
		}
		d = stager_optdef(opt);
		if (d->set(o, d, optarg))
			return CLI_EXIT_USAGE;
	}
	return -1;
}

/* Take the arguments after the options and check what no one option can.
 * Returns 0, or CLI_EXIT_USAGE (reported). */
static int stager_check_args(const struct stager_cmd *cmd, int argc,
			     char **argv, struct stager_opts *o)
{
	o->argc = argc - optind;
	o->argv = argv + optind;
	if (o->argc < cmd->min_args || o->argc > cmd->max_args) {
		fprintf(stderr, "stager %s: expected %s\n", cmd->name,
			cmd->usage[0] ? cmd->usage : "no arguments");
		return CLI_EXIT_USAGE;
	}
	if ((o->repair || o->fetch_missing) && o->mode &&
	    !strcmp(o->mode, "source")) {
		fprintf(stderr,
			"stager verify: --repair and --fetch-missing "
			"mend the cache: they do not go with --source\n");
		return CLI_EXIT_USAGE;
	}
	if (cmd->flags & STAGER_ALWAYS_WAIT)
		o->wait = true;
	return 0;
}

/* Load the configuration and run the command. Returns its exit code. */
static int stager_dispatch(const struct stager_cmd *cmd,
			   const struct stager_opts *o)
{
	struct dstage_config *cfg = NULL;
	char err[512];
	int code;

	if (config_load(o->config, &cfg, err, sizeof(err))) {
		fprintf(stderr, "stager: %s\n", err);
		return CLI_EXIT_USAGE;
	}
	log_set_level((enum log_level)cfg->log_level);
	code = cmd->run(cfg, cmd, o);
	config_free(cfg);
	return code;
}

int main(int argc, char **argv)
{
	struct stager_opts o = {
		.since = -1,
		.lim = { .max_conns = STAGER_MAX_CONNS,
			 .max_conns_uid = STAGER_MAX_CONNS_UID,
			 .idle_ms = STAGER_IDLE_MS },
	};
	const struct stager_cmd *cmd;
	int code;

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
	code = stager_parse_opts(cmd, argc, argv, &o);
	if (code == CLI_EXIT_OK)
		return code;
	if (code < 0)
		code = stager_check_args(cmd, argc, argv, &o);
	if (code) {
		fprintf(stderr, "'stager %s --help' for help\n", cmd->name);
		return CLI_EXIT_USAGE;
	}
	return stager_dispatch(cmd, &o);
}
