// SPDX-License-Identifier: MIT
/*
 * lifecycle (front end): the `lifecycle` command of stager and cachectl
 * (cli/lifecycle.h). Stateless: parse, one request, print, exit code.
 * The daemon checks the caller's rights and the rule again
 * (stager/daemon/daemon_lifecycle.c); this side refuses what it can before
 * connecting.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dstage/lifecycle.h"
#include "dstage/proto_client.h"
#include "cli.h"
#include "jsonout.h"
#include "lifecycle.h"

const char lifecycle_cli_help[] =
	"Checkpoint lifecycle rules, one per job-name pattern (a glob: * ?\n"
	"[...]; the first rule added that matches a job applies). list is\n"
	"open to everyone; add, remove and run are for admins.\n"
	"  list                    the rules, in the order they apply\n"
	"  add PATTERN             add a rule:\n"
	"    --keep-local N        keep the newest N checkpoints' local\n"
	"                          copies (N >= 1; default 1)\n"
	"    --shared-days D       move checkpoints older than D days to\n"
	"                          the archive (needs --archive)\n"
	"    --archive URL         the archive tier: s3://bucket/prefix/\n"
	"                          or file:///dir/\n"
	"    --storage-class C     S3 storage class of archived objects\n"
	"                          (GLACIER, STANDARD_IA, ...)\n"
	"    --delete-days R       delete checkpoints older than R days\n"
	"                          (R >= D); never the newest complete one\n"
	"    --keep-every K        never delete checkpoints whose step\n"
	"                          number is a multiple of K\n"
	"  remove PATTERN|ID       remove a rule\n"
	"  run                     apply the rules now:\n"
	"    --dry-run             say what would be done; change nothing\n"
	"    --as-of TIME          judge ages as if it were TIME (seconds\n"
	"                          since the epoch): what-if with --dry-run\n"
	"  --json                  list: an array; add, remove, run: an\n"
	"                          object\n"
	"  --config FILE           the configuration file\n"
	"Exit codes: 0 ok, 1 failed (run: an action failed), 2 usage or a\n"
	"rule refused (the message says why), 3 daemon not running,\n"
	"4 permission denied, 5 no such rule.\n";

static const struct option lifecycle_cli_long[] = {
	{ "keep-local", required_argument, NULL, 'N' },
	{ "shared-days", required_argument, NULL, 'D' },
	{ "delete-days", required_argument, NULL, 'R' },
	{ "keep-every", required_argument, NULL, 'K' },
	{ "archive", required_argument, NULL, 'A' },
	{ "storage-class", required_argument, NULL, 'S' },
	{ "dry-run", no_argument, NULL, 'n' },
	{ "as-of", required_argument, NULL, 't' },
	{ "json", no_argument, NULL, 'j' },
	{ "config", required_argument, NULL, 'c' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* The command line, parsed: the subcommand, its PATTERN|ID (name, NULL for
 * list and run) and the options, as given (NULL: not given). */
struct lifecycle_cli_args {
	const char *prog;
	const char *config;
	const char *sub;
	const char *name;
	const char *keep, *shared, *del, *every; /* digits, checked */
	const char *archive, *cls, *asof;
	bool dry;
	bool json;
};

/* What the replies collect (the row callback's argument). */
struct lifecycle_cli_out {
	bool json;
	const char *sub;
	json_t *rows; /* --json: rows (list, run's actions) */
	json_t *obj; /* --json: add, remove, run's summary */
	unsigned n;
};

/* The parse and check steps' "go on" (their exit codes are >= 0). */
#define LIFECYCLE_CLI_GO (-1)

static bool lifecycle_cli_number(const char *s)
{
	if (*s == '-')
		s++;
	if (!*s || (*s == '0' && s[1]))
		return false;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

static json_t *lifecycle_cli_json_row(const struct proto_msg *m)
{
	json_t *o = json_object();

	for (unsigned i = 0; o && i < m->n; i++) {
		const struct proto_field *f = &m->f[i];
		int ret;

		if (!strcmp(f->key, "type"))
			continue;
		if (lifecycle_cli_number(f->val) && f->len < 19)
			ret = json_object_set_new(
				o, f->key,
				json_integer(strtoll(f->val, NULL, 10)));
		else
			ret = jsonout_set_str(o, f->key, f->val);
		if (ret) {
			json_decref(o);
			return NULL;
		}
	}
	return o;
}

static const char *lifecycle_cli_get(const struct proto_msg *m, const char *k)
{
	const char *v = proto_get(m, k);

	return v ? v : "";
}

/* A rule as a row of list's table. */
static void lifecycle_cli_print_rule(const struct proto_msg *m)
{
	const char *archive = lifecycle_cli_get(m, "archive");
	const char *cls = lifecycle_cli_get(m, "storage_class");

	printf("%4s  %-20s %10s %11s %11s %10s  %s%s%s\n",
	       lifecycle_cli_get(m, "id"), lifecycle_cli_get(m, "pattern"),
	       lifecycle_cli_get(m, "keep_local"),
	       lifecycle_cli_get(m, "shared_days"),
	       lifecycle_cli_get(m, "delete_days"),
	       lifecycle_cli_get(m, "keep_every"), *archive ? archive : "-",
	       *cls ? " " : "", cls);
}

/* A rule row: list's table (its header first), or add's and remove's
 * one line. */
static void lifecycle_cli_print_rule_row(struct lifecycle_cli_out *o,
					 const struct proto_msg *m)
{
	const char *archive = lifecycle_cli_get(m, "archive");
	const char *cls = lifecycle_cli_get(m, "storage_class");

	if (!o->n++ && !strcmp(o->sub, "list"))
		printf("%4s  %-20s %10s %11s %11s %10s  %s\n", "ID", "PATTERN",
		       "KEEP-LOCAL", "SHARED-DAYS", "DELETE-DAYS", "KEEP-EVERY",
		       "ARCHIVE");
	if (!strcmp(o->sub, "list")) {
		lifecycle_cli_print_rule(m);
		return;
	}
	printf("%s rule %s: ", !strcmp(o->sub, "add") ? "added" : "removed",
	       lifecycle_cli_get(m, "id"));
	printf("%s keep-local=%s shared-days=%s delete-days=%s "
	       "keep-every=%s archive=%s storage-class=%s\n",
	       lifecycle_cli_get(m, "pattern"),
	       lifecycle_cli_get(m, "keep_local"),
	       lifecycle_cli_get(m, "shared_days"),
	       lifecycle_cli_get(m, "delete_days"),
	       lifecycle_cli_get(m, "keep_every"), *archive ? archive : "-",
	       *cls ? cls : "-");
}

/* One of run's actions, as a line. */
static void lifecycle_cli_print_action(const struct proto_msg *m)
{
	const char *to = lifecycle_cli_get(m, "to");
	const char *rule = lifecycle_cli_get(m, "rule");
	const char *result = lifecycle_cli_get(m, "result");
	bool ok = !strcmp(result, "ok");

	printf("%-10s %-40s %s%s%s  (%s)%s%s\n", lifecycle_cli_get(m, "action"),
	       lifecycle_cli_get(m, "target"), lifecycle_cli_get(m, "from"),
	       *to ? " -> " : "", to, *rule ? rule : "abandoned",
	       ok ? "" : ": ", ok ? "" : result);
}

/* run's summary, as a line. */
static void lifecycle_cli_print_summary(const struct proto_msg *m)
{
	printf("%s%s job(s), %s checkpoint(s) with a rule: %s archived, "
	       "%s deleted, %s local copies dropped, %s abandoned "
	       "file(s) removed, %s error(s)\n",
	       strcmp(lifecycle_cli_get(m, "dry_run"), "1")
		       ? ""
		       : "dry run, nothing changed; a run would do: ",
	       lifecycle_cli_get(m, "jobs"),
	       lifecycle_cli_get(m, "checkpoints"),
	       lifecycle_cli_get(m, "archived"),
	       lifecycle_cli_get(m, "deleted"), lifecycle_cli_get(m, "dropped"),
	       lifecycle_cli_get(m, "abandoned"),
	       lifecycle_cli_get(m, "errors"));
}

/* --json: a reply row into o's rows (list's rules, run's actions) or into
 * o's object (add's and remove's rule, run's summary). 0 or -ENOMEM. */
static int lifecycle_cli_json_add(struct lifecycle_cli_out *o,
				  const struct proto_msg *m, const char *type)
{
	json_t *j = lifecycle_cli_json_row(m);

	if (!j)
		return -ENOMEM;
	if (!strcmp(type, "summary") || strcmp(o->sub, "list")) {
		if (!strcmp(type, "action"))
			return json_array_append_new(o->rows, j) ? -ENOMEM : 0;
		json_object_update(o->obj, j);
		json_decref(j);
		return 0;
	}
	return json_array_append_new(o->rows, j) ? -ENOMEM : 0;
}

/* proto_client_call's row callback: one reply row, kept (--json) or
 * printed. */
static int lifecycle_cli_row(struct proto_client *pc, void *arg)
{
	struct lifecycle_cli_out *o = arg;
	const struct proto_msg *m = &pc->msg;
	const char *type = lifecycle_cli_get(m, "type");

	if (o->json)
		return lifecycle_cli_json_add(o, m, type);
	if (!strcmp(type, "rule"))
		lifecycle_cli_print_rule_row(o, m);
	else if (!strcmp(type, "action"))
		lifecycle_cli_print_action(m);
	else if (!strcmp(type, "summary"))
		lifecycle_cli_print_summary(m);
	return 0;
}

/* The exit code for the daemon's rc: as cli_exit_code, but -EEXIST (a
 * rule already there) is a usage error. */
static int lifecycle_cli_exit(int err)
{
	return err == -EEXIST ? CLI_EXIT_USAGE : cli_exit_code(err);
}

/* A day or step count: digits only. */
static int lifecycle_cli_count(const char *prog, const char *opt, const char *s,
			       const char **out)
{
	if (!lifecycle_cli_number(s) || *s == '-' || strlen(s) > 9) {
		fprintf(stderr,
			"%s lifecycle: %s '%s': expected a whole number from "
			"0 to 999999999\n",
			prog, opt, s);
		return -EINVAL;
	}
	*out = s;
	return 0;
}

static int lifecycle_cli_usage(const char *prog, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* A usage error: the message, a pointer to --help, CLI_EXIT_USAGE. */
static int lifecycle_cli_usage(const char *prog, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s lifecycle: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n'%s lifecycle --help' for help\n", prog);
	return CLI_EXIT_USAGE;
}

/* The options (getopt_long, from argv[1]) into a. LIFECYCLE_CLI_GO, or the
 * exit code (--help, a bad option). */
static int lifecycle_cli_options(struct lifecycle_cli_args *a, int argc,
				 char **argv)
{
	int opt;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", lifecycle_cli_long, NULL)) !=
	       -1) {
		switch (opt) {
		case 'h':
			printf("usage: %s lifecycle list|add PATTERN|remove "
			       "PATTERN|run [OPTIONS]\n\n%s",
			       a->prog, lifecycle_cli_help);
			return CLI_EXIT_OK;
		case 'N':
		case 'D':
		case 'R':
		case 'K': {
			const char **dst = opt == 'N'	? &a->keep
					   : opt == 'D' ? &a->shared
					   : opt == 'R' ? &a->del
							: &a->every;

			if (lifecycle_cli_count(a->prog, argv[optind - 1],
						optarg, dst))
				return CLI_EXIT_USAGE;
			break;
		}
		case 'A':
			a->archive = optarg;
			break;
		case 'S':
			a->cls = optarg;
			break;
		case 'n':
			a->dry = true;
			break;
		case 't':
			if (!lifecycle_cli_number(optarg) || *optarg == '-')
				return lifecycle_cli_usage(
					a->prog,
					"--as-of '%s': expected seconds "
					"since the epoch",
					optarg);
			a->asof = optarg;
			break;
		case 'j':
			a->json = true;
			break;
		case 'c':
			a->config = optarg;
			break;
		default:
			return lifecycle_cli_usage(a->prog, "%s", "bad option");
		}
	}
	return LIFECYCLE_CLI_GO;
}

/* The subcommand and its operand (argv[optind] on) into a, and which
 * options go with it. LIFECYCLE_CLI_GO or CLI_EXIT_USAGE. */
static int lifecycle_cli_subcommand(struct lifecycle_cli_args *a, int argc,
				    char **argv)
{
	const char *sub;
	bool addopts = a->keep || a->shared || a->del || a->every ||
		       a->archive || a->cls;

	if (optind >= argc)
		return lifecycle_cli_usage(a->prog, "%s",
					   "expected list, add, remove or run");
	sub = argv[optind++];
	if (!strcmp(sub, "add") || !strcmp(sub, "remove")) {
		if (argc - optind != 1)
			return lifecycle_cli_usage(
				a->prog, "%s: expected one PATTERN", sub);
	} else if (!strcmp(sub, "list") || !strcmp(sub, "run")) {
		if (argc != optind)
			return lifecycle_cli_usage(
				a->prog, "%s: takes no arguments", sub);
	} else {
		return lifecycle_cli_usage(
			a->prog, "'%s': expected list, add, remove or run",
			sub);
	}
	if (addopts && strcmp(sub, "add"))
		return lifecycle_cli_usage(a->prog, "%s: takes no rule options",
					   sub);
	if ((a->dry || a->asof) && strcmp(sub, "run"))
		return lifecycle_cli_usage(
			a->prog, "%s: --dry-run and --as-of go with run", sub);
	a->sub = sub;
	a->name = optind < argc ? argv[optind] : NULL;
	return LIFECYCLE_CLI_GO;
}

/* add: the rule checked as the daemon will (lifecycle_rule_check), so that
 * a bad one is refused before connecting. LIFECYCLE_CLI_GO or
 * CLI_EXIT_USAGE. */
static int lifecycle_cli_check_rule(const struct lifecycle_cli_args *a)
{
	struct lifecycle_rule r = { 0 };
	char msg[512];

	snprintf(r.pattern, sizeof(r.pattern), "%s", a->name);
	r.keep_local = a->keep ? (unsigned)atoi(a->keep) : 1;
	r.shared_days = a->shared ? (unsigned)atoi(a->shared) : 0;
	r.delete_days = a->del ? (unsigned)atoi(a->del) : 0;
	r.keep_every = a->every ? (unsigned)atoi(a->every) : 0;
	snprintf(r.archive, sizeof(r.archive), "%s",
		 a->archive ? a->archive : "");
	snprintf(r.storage_class, sizeof(r.storage_class), "%s",
		 a->cls ? a->cls : "");
	if (strlen(a->name) >= sizeof(r.pattern) ||
	    (a->archive && strlen(a->archive) >= sizeof(r.archive)) ||
	    (a->cls && strlen(a->cls) >= sizeof(r.storage_class)))
		return lifecycle_cli_usage(a->prog, "%s",
					   "add: pattern, archive URL or "
					   "storage class too long");
	if (lifecycle_rule_check(&r, msg, sizeof(msg))) {
		fprintf(stderr, "%s: %s; nothing changed\n", a->prog, msg);
		return CLI_EXIT_USAGE;
	}
	return LIFECYCLE_CLI_GO;
}

/* The request's fields (lifecycle.SUB, the operand, the options given). */
static void lifecycle_cli_request(struct proto_client *pc,
				  const struct lifecycle_cli_args *a)
{
	char cmd[32];

	snprintf(cmd, sizeof(cmd), "lifecycle.%s", a->sub);
	proto_add(&pc->out, "cmd", cmd);
	if (a->name) {
		if (!strcmp(a->sub, "remove") && lifecycle_cli_number(a->name))
			proto_add(&pc->out, "id", a->name);
		proto_add(&pc->out, "name", a->name);
	}
	if (!strcmp(a->sub, "add"))
		proto_add(&pc->out, "keep_local", a->keep ? a->keep : "1");
	if (a->shared)
		proto_add(&pc->out, "shared_days", a->shared);
	if (a->del)
		proto_add(&pc->out, "delete_days", a->del);
	if (a->every)
		proto_add(&pc->out, "keep_every", a->every);
	if (a->archive)
		proto_add(&pc->out, "archive", a->archive);
	if (a->cls)
		proto_add(&pc->out, "storage_class", a->cls);
	if (a->dry)
		proto_add(&pc->out, "dry_run", "1");
	if (a->asof)
		proto_add(&pc->out, "as_of", a->asof);
}

/* After the reply: the daemon's error, if any, on stderr; --json's array
 * or object (also for a run that failed); list's "no rules". The exit
 * code. */
static int lifecycle_cli_finish(const struct lifecycle_cli_args *a,
				const struct proto_client *pc,
				struct lifecycle_cli_out *out)
{
	if (pc->rc && pc->endmsg[0])
		fprintf(stderr, "%s lifecycle %s: %s\n", a->prog, a->sub,
			pc->endmsg);
	else if (pc->rc)
		fprintf(stderr, "%s lifecycle %s: %s\n", a->prog, a->sub,
			strerror(-pc->rc));
	if (out->json && (!pc->rc || !strcmp(a->sub, "run"))) {
		if (!strcmp(a->sub, "list")) {
			jsonout_print(out->rows);
		} else {
			if (!strcmp(a->sub, "run"))
				json_object_set(out->obj, "actions", out->rows);
			jsonout_print(out->obj);
		}
	} else if (!out->json && !pc->rc && !strcmp(a->sub, "list") &&
		   !out->n) {
		printf("no lifecycle rules\n");
	}
	return lifecycle_cli_exit(pc->rc);
}

/* The request to the daemon of cfg, its rows, the output. The exit
 * code. */
static int lifecycle_cli_call(const struct lifecycle_cli_args *a,
			      const struct dstage_config *cfg)
{
	struct proto_client pc = { .fd = -1 };
	struct lifecycle_cli_out out = { .json = a->json, .sub = a->sub };
	int ret, code;

	out.rows = json_array();
	out.obj = json_object();
	if (!out.rows || !out.obj) {
		code = CLI_EXIT_FAIL;
		goto out;
	}
	ret = proto_client_open(&pc, a->prog, cfg->daemon_socket);
	if (ret) {
		code = CLI_EXIT_DAEMON;
		goto out;
	}
	lifecycle_cli_request(&pc, a);
	ret = proto_client_call(&pc, lifecycle_cli_row, &out);
	if (ret) {
		code = ret == -ENOMEM ? CLI_EXIT_FAIL : CLI_EXIT_DAEMON;
		goto out;
	}
	code = lifecycle_cli_finish(a, &pc, &out);
out:
	json_decref(out.rows);
	json_decref(out.obj);
	proto_client_close(&pc);
	return code;
}

int lifecycle_cli(const char *prog, const char *config, int argc, char **argv)
{
	struct lifecycle_cli_args a = { .prog = prog, .config = config };
	struct dstage_config *cfg = NULL;
	char err[512];
	int code;

	code = lifecycle_cli_options(&a, argc, argv);
	if (code == LIFECYCLE_CLI_GO)
		code = lifecycle_cli_subcommand(&a, argc, argv);
	if (code == LIFECYCLE_CLI_GO && !strcmp(a.sub, "add"))
		code = lifecycle_cli_check_rule(&a);
	if (code != LIFECYCLE_CLI_GO)
		return code;
	if (config_load(a.config, &cfg, err, sizeof(err))) {
		fprintf(stderr, "%s: %s\n", prog, err);
		return CLI_EXIT_USAGE;
	}
	code = lifecycle_cli_call(&a, cfg);
	config_free(cfg);
	return code;
}
