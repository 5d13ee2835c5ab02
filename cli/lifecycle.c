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
#include "jsonout.h"
#include "lifecycle.h"

enum {
	LC_EXIT_OK = 0,
	LC_EXIT_FAIL = 1,
	LC_EXIT_USAGE = 2,
	LC_EXIT_DAEMON = 3,
	LC_EXIT_DENIED = 4,
	LC_EXIT_NOENT = 5,
};

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

static const struct option lc_long[] = {
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

struct lc_out {
	bool json;
	const char *sub;
	json_t *rows; /* --json: rows (list, run's actions) */
	json_t *obj; /* --json: add, remove, run's summary */
	unsigned n;
};

static bool lc_number(const char *s)
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

static json_t *lc_json_row(const struct proto_msg *m)
{
	json_t *o = json_object();

	for (unsigned i = 0; o && i < m->n; i++) {
		const struct proto_field *f = &m->f[i];
		int ret;

		if (!strcmp(f->key, "type"))
			continue;
		if (lc_number(f->val) && f->len < 19)
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

static const char *lc_get(const struct proto_msg *m, const char *k)
{
	const char *v = proto_get(m, k);

	return v ? v : "";
}

static void lc_print_rule(const struct proto_msg *m)
{
	printf("%4s  %-20s %10s %11s %11s %10s  %s%s%s\n", lc_get(m, "id"),
	       lc_get(m, "pattern"), lc_get(m, "keep_local"),
	       lc_get(m, "shared_days"), lc_get(m, "delete_days"),
	       lc_get(m, "keep_every"),
	       *lc_get(m, "archive") ? lc_get(m, "archive") : "-",
	       *lc_get(m, "storage_class") ? " " : "",
	       lc_get(m, "storage_class"));
}

static int lc_row(struct proto_client *pc, void *arg)
{
	struct lc_out *o = arg;
	const struct proto_msg *m = &pc->msg;
	const char *type = lc_get(m, "type");
	json_t *j;

	if (o->json) {
		j = lc_json_row(m);
		if (!j)
			return -ENOMEM;
		if (!strcmp(type, "summary") || strcmp(o->sub, "list")) {
			if (!strcmp(type, "action"))
				return json_array_append_new(o->rows, j)
					       ? -ENOMEM
					       : 0;
			json_object_update(o->obj, j);
			json_decref(j);
			return 0;
		}
		return json_array_append_new(o->rows, j) ? -ENOMEM : 0;
	}
	if (!strcmp(type, "rule")) {
		if (!o->n++ && !strcmp(o->sub, "list"))
			printf("%4s  %-20s %10s %11s %11s %10s  %s\n", "ID",
			       "PATTERN", "KEEP-LOCAL", "SHARED-DAYS",
			       "DELETE-DAYS", "KEEP-EVERY", "ARCHIVE");
		if (strcmp(o->sub, "list"))
			printf("%s rule %s: ",
			       !strcmp(o->sub, "add") ? "added" : "removed",
			       lc_get(m, "id"));
		if (strcmp(o->sub, "list"))
			printf("%s keep-local=%s shared-days=%s delete-days=%s "
			       "keep-every=%s archive=%s storage-class=%s\n",
			       lc_get(m, "pattern"), lc_get(m, "keep_local"),
			       lc_get(m, "shared_days"),
			       lc_get(m, "delete_days"),
			       lc_get(m, "keep_every"),
			       *lc_get(m, "archive") ? lc_get(m, "archive")
						     : "-",
			       *lc_get(m, "storage_class")
				       ? lc_get(m, "storage_class")
				       : "-");
		else
			lc_print_rule(m);
	} else if (!strcmp(type, "action")) {
		const char *to = lc_get(m, "to");

		printf("%-10s %-40s %s%s%s  (%s)%s%s\n", lc_get(m, "action"),
		       lc_get(m, "target"), lc_get(m, "from"),
		       *to ? " -> " : "", to,
		       *lc_get(m, "rule") ? lc_get(m, "rule") : "abandoned",
		       strcmp(lc_get(m, "result"), "ok") ? ": " : "",
		       strcmp(lc_get(m, "result"), "ok") ? lc_get(m, "result")
							 : "");
	} else if (!strcmp(type, "summary")) {
		printf("%s%s job(s), %s checkpoint(s) with a rule: %s "
		       "archived, "
		       "%s deleted, %s local copies dropped, %s abandoned "
		       "file(s) removed, %s error(s)\n",
		       strcmp(lc_get(m, "dry_run"), "1") ? ""
							 : "dry run, nothing "
							   "changed; a run "
							   "would do: ",
		       lc_get(m, "jobs"), lc_get(m, "checkpoints"),
		       lc_get(m, "archived"), lc_get(m, "deleted"),
		       lc_get(m, "dropped"), lc_get(m, "abandoned"),
		       lc_get(m, "errors"));
	}
	return 0;
}

static int lc_exit(int err)
{
	switch (err) {
	case 0:
		return LC_EXIT_OK;
	case -EPERM:
	case -EACCES:
		return LC_EXIT_DENIED;
	case -ENOENT:
		return LC_EXIT_NOENT;
	case -EINVAL:
	case -EEXIST:
		return LC_EXIT_USAGE;
	default:
		return LC_EXIT_FAIL;
	}
}

/* A day or step count: digits only. */
static int lc_count(const char *prog, const char *opt, const char *s,
		    const char **out)
{
	if (!lc_number(s) || *s == '-' || strlen(s) > 9) {
		fprintf(stderr,
			"%s lifecycle: %s '%s': expected a whole number from "
			"0 to 999999999\n",
			prog, opt, s);
		return -EINVAL;
	}
	*out = s;
	return 0;
}

static int lc_usage(const char *prog, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int lc_usage(const char *prog, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s lifecycle: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n'%s lifecycle --help' for help\n", prog);
	return LC_EXIT_USAGE;
}

int lifecycle_cli(const char *prog, const char *config, int argc, char **argv)
{
	const char *keep = NULL, *shared = NULL, *del = NULL, *every = NULL;
	const char *archive = NULL, *cls = NULL, *asof = NULL, *sub;
	struct dstage_config *cfg = NULL;
	struct proto_client pc = { .fd = -1 };
	struct lc_out out = { 0 };
	bool dry = false, addopts;
	char err[512], cmd[32];
	int opt, ret, code;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", lc_long, NULL)) != -1) {
		switch (opt) {
		case 'h':
			printf("usage: %s lifecycle list|add PATTERN|remove "
			       "PATTERN|run [OPTIONS]\n\n%s",
			       prog, lifecycle_cli_help);
			return LC_EXIT_OK;
		case 'N':
		case 'D':
		case 'R':
		case 'K': {
			const char **dst = opt == 'N'	? &keep
					   : opt == 'D' ? &shared
					   : opt == 'R' ? &del
							: &every;

			if (lc_count(prog, argv[optind - 1], optarg, dst))
				return LC_EXIT_USAGE;
			break;
		}
		case 'A':
			archive = optarg;
			break;
		case 'S':
			cls = optarg;
			break;
		case 'n':
			dry = true;
			break;
		case 't':
			if (!lc_number(optarg) || *optarg == '-')
				return lc_usage(
					prog,
					"--as-of '%s': expected seconds "
					"since the epoch",
					optarg);
			asof = optarg;
			break;
		case 'j':
			out.json = true;
			break;
		case 'c':
			config = optarg;
			break;
		default:
			return lc_usage(prog, "%s", "bad option");
		}
	}
	if (optind >= argc)
		return lc_usage(prog, "%s",
				"expected list, add, remove or run");
	sub = argv[optind++];
	addopts = keep || shared || del || every || archive || cls;
	if (!strcmp(sub, "add") || !strcmp(sub, "remove")) {
		if (argc - optind != 1)
			return lc_usage(prog, "%s: expected one PATTERN", sub);
	} else if (!strcmp(sub, "list") || !strcmp(sub, "run")) {
		if (argc != optind)
			return lc_usage(prog, "%s: takes no arguments", sub);
	} else {
		return lc_usage(prog, "'%s': expected list, add, remove or run",
				sub);
	}
	if (addopts && strcmp(sub, "add"))
		return lc_usage(prog, "%s: takes no rule options", sub);
	if ((dry || asof) && strcmp(sub, "run"))
		return lc_usage(prog, "%s: --dry-run and --as-of go with run",
				sub);
	if (!strcmp(sub, "add")) { /* refuse before connecting */
		struct lifecycle_rule r = { 0 };
		char msg[512];

		snprintf(r.pattern, sizeof(r.pattern), "%s", argv[optind]);
		r.keep_local = keep ? (unsigned)atoi(keep) : 1;
		r.shared_days = shared ? (unsigned)atoi(shared) : 0;
		r.delete_days = del ? (unsigned)atoi(del) : 0;
		r.keep_every = every ? (unsigned)atoi(every) : 0;
		snprintf(r.archive, sizeof(r.archive), "%s",
			 archive ? archive : "");
		snprintf(r.storage_class, sizeof(r.storage_class), "%s",
			 cls ? cls : "");
		if (strlen(argv[optind]) >= sizeof(r.pattern) ||
		    (archive && strlen(archive) >= sizeof(r.archive)) ||
		    (cls && strlen(cls) >= sizeof(r.storage_class)))
			return lc_usage(prog, "%s",
					"add: pattern, archive URL or "
					"storage class too long");
		if (lifecycle_rule_check(&r, msg, sizeof(msg))) {
			fprintf(stderr, "%s: %s; nothing changed\n", prog, msg);
			return LC_EXIT_USAGE;
		}
	}
	ret = config_load(config, &cfg, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "%s: %s\n", prog, err);
		return LC_EXIT_USAGE;
	}
	out.sub = sub;
	out.rows = json_array();
	out.obj = json_object();
	if (!out.rows || !out.obj) {
		code = LC_EXIT_FAIL;
		goto out;
	}
	ret = proto_client_open(&pc, prog, cfg->daemon_socket);
	if (ret) {
		code = LC_EXIT_DAEMON;
		goto out;
	}
	snprintf(cmd, sizeof(cmd), "lifecycle.%s", sub);
	proto_add(&pc.out, "cmd", cmd);
	if (optind < argc) {
		if (!strcmp(sub, "remove") && lc_number(argv[optind]))
			proto_add(&pc.out, "id", argv[optind]);
		proto_add(&pc.out, "name", argv[optind]);
	}
	if (!strcmp(sub, "add"))
		proto_add(&pc.out, "keep_local", keep ? keep : "1");
	if (shared)
		proto_add(&pc.out, "shared_days", shared);
	if (del)
		proto_add(&pc.out, "delete_days", del);
	if (every)
		proto_add(&pc.out, "keep_every", every);
	if (archive)
		proto_add(&pc.out, "archive", archive);
	if (cls)
		proto_add(&pc.out, "storage_class", cls);
	if (dry)
		proto_add(&pc.out, "dry_run", "1");
	if (asof)
		proto_add(&pc.out, "as_of", asof);
	ret = proto_client_call(&pc, lc_row, &out);
	if (ret) {
		code = ret == -ENOMEM ? LC_EXIT_FAIL : LC_EXIT_DAEMON;
		goto out;
	}
	if (pc.rc && pc.endmsg[0])
		fprintf(stderr, "%s lifecycle %s: %s\n", prog, sub, pc.endmsg);
	else if (pc.rc)
		fprintf(stderr, "%s lifecycle %s: %s\n", prog, sub,
			strerror(-pc.rc));
	code = lc_exit(pc.rc);
	if (out.json && (!pc.rc || !strcmp(sub, "run"))) {
		if (!strcmp(sub, "list")) {
			jsonout_print(out.rows);
		} else {
			if (!strcmp(sub, "run"))
				json_object_set(out.obj, "actions", out.rows);
			jsonout_print(out.obj);
		}
	} else if (!out.json && !pc.rc && !strcmp(sub, "list") && !out.n) {
		printf("no lifecycle rules\n");
	}
out:
	json_decref(out.rows);
	json_decref(out.obj);
	proto_client_close(&pc);
	config_free(cfg);
	return code;
}
