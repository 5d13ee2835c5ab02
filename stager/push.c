// SPDX-License-Identifier: MIT
/*
 * push: `stager push LOCAL_DIR URL`, the command-line side of lib/push/push.c.
 *
 *   1. the dataset NAME (--name, else the directory's name) and whether it,
 *      or any dataset, is registered from URL: one `list` to the daemon
 *   2. push_prepare: walk, one listing of URL, the resume journal, the plan
 *   3. refuse to change a registered dataset's objects without
 *      --new-version; --dry-run prints the plan and stops
 *   4. push_execute with a progress bar (terminal) or plain lines, Ctrl-C
 *      stopping it cleanly (files in flight finish; a re-run resumes)
 *   5. register: `add NAME URL`, or `refresh NAME` (--new-version) for a
 *      registered one; then --stage (stage --wait) and --verify (verify
 *      --source), through client.c as those commands would
 *
 * With --json, stdout carries one summary document; what the registration,
 * stage and verify print goes to stderr meanwhile.
 *
 * State: one struct push_cli for the command, in the main thread; the
 * progress thread reads only the push's atomic counters and its own
 * fields, stopped through `quit` (an atomic).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/proto_client.h"
#include "dstage/push.h"
#include "jsonout.h"
#include "stager.h"

#define PUSH_LIST_MAX 10000 /* problem rows kept for --json */

enum {
	PR_CHANGED,
	PR_FAILED,
	PR_BAD,
	PR_IGNORED,
	PR_DELETED,
	PR_PLAN,
	PR_ABORTED,
	PR_N
};

struct push_cli {
	const struct stager_opts *o;
	struct push *push;
	bool tty, json, drew;
	/* changed, failed, bad, ignored, deleted, plan, aborted uploads */
	json_t *rows[PR_N];
	uint64_t n_rows[PR_N];
	uint64_t deleted, uploaded, skipped, would_delete;
	bool sums_written;
	_Atomic bool quit;
	double t0, t1; /* start; end of the upload (0: running) */
	bool summarized; /* the --json document was printed */
	char err[1024]; /* the last message of a failure, for --json */
};

static const char *const push_row_names[] = {
	"changed", "failed", "bad_names",	"ignored",
	"deleted", "plan",   "aborted_uploads",
};

static struct push *_Atomic push_sig_target;

static void push_on_signal(int sig)
{
	struct push *p = atomic_load(&push_sig_target);

	(void)sig;
	if (p)
		push_stop(p);
	signal(SIGINT, SIG_DFL); /* a second Ctrl-C ends the process */
}

/* A failure's message: on stderr, and kept for --json's error document. */
__attribute__((format(printf, 2, 3))) static void push_err(struct push_cli *c,
							   const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	fprintf(stderr, "stager push: %s\n", c->err);
}

static const char *push_cause(void)
{
	const char *c = log_cause();

	return c ? c : "";
}

static bool push_s3_key_ok(void *arg, const char *key, size_t len,
			   const char **why)
{
	(void)arg;
	if (jsonout_utf8_valid(key, len))
		return true;
	*why = "not UTF-8: S3 keys are UTF-8; rename the file or push to a "
	       "file:// URL";
	return false;
}

/* key for a message: as keypath_printable, and a name that is not UTF-8
 * with every byte above 0x7f as \xNN too (terminals mangle them). */
static const char *push_printable(const char *key, char *buf, size_t size)
{
	size_t n = 0, len = strlen(key);

	if (jsonout_utf8_valid(key, len))
		return keypath_printable(key, len, buf, size);
	for (size_t i = 0; i < len && n + 8 < size; i++) {
		unsigned char ch = (unsigned char)key[i];

		if (ch < 0x20 || ch >= 0x7f || ch == '\\')
			n += (size_t)snprintf(buf + n, size - n, "\\x%02x", ch);
		else
			buf[n++] = (char)ch;
	}
	buf[n] = '\0';
	return buf;
}

static void push_row(struct push_cli *c, int kind, const char *key,
		     uint64_t size, const char *msg)
{
	json_t *r;

	c->n_rows[kind]++;
	if (!c->json || c->n_rows[kind] > PUSH_LIST_MAX)
		return;
	r = json_object();
	if (!r || jsonout_set_str(r, "key", key) ||
	    json_object_set_new(r, "size", json_integer((json_int_t)size)) ||
	    (msg && jsonout_set_str(r, "reason", msg)) ||
	    json_array_append(c->rows[kind], r))
		fprintf(stderr, "stager push: out of memory\n");
	json_decref(r);
}

static void push_event(void *arg, enum push_event ev, const char *key,
		       uint64_t size, const char *msg)
{
	struct push_cli *c = arg;
	FILE *out = c->json ? stderr : stdout;
	char pr[512], b[32];

	push_printable(key, pr, sizeof(pr));
	if (c->drew && ev != PUSH_EV_UPLOADED && ev != PUSH_EV_SKIPPED) {
		fputs("\r\033[K", stdout);
		c->drew = false;
	}
	switch (ev) {
	case PUSH_EV_UPLOADED:
		c->uploaded++;
		return;
	case PUSH_EV_SKIPPED:
		c->skipped++;
		return;
	case PUSH_EV_CHANGED:
		fprintf(stderr, "CHANGED %s: %s\n", pr, msg);
		push_row(c, PR_CHANGED, key, size, msg);
		return;
	case PUSH_EV_FAILED:
		fprintf(stderr, "FAILED %s: %s\n", pr, msg);
		push_row(c, PR_FAILED, key, size, msg);
		return;
	case PUSH_EV_BADNAME:
		fprintf(stderr, "BAD NAME %s: %s\n", pr, msg);
		push_row(c, PR_BAD, key, size, msg);
		return;
	case PUSH_EV_IGNORED:
		fprintf(stderr, "ignored %s: %s\n", pr, msg);
		push_row(c, PR_IGNORED, key, size, msg);
		return;
	case PUSH_EV_DELETED:
		c->deleted++;
		fprintf(out, "deleted %s\n", pr);
		push_row(c, PR_DELETED, key, size, NULL);
		return;
	case PUSH_EV_PLAN_UPLOAD:
		fprintf(out, "would upload %s (%s)%s%s\n", pr,
			cli_bytes(size, b, sizeof(b)), msg ? ": " : "",
			msg ? msg : "");
		push_row(c, PR_PLAN, key, size, "upload");
		return;
	case PUSH_EV_PLAN_DELETE:
		c->would_delete++;
		fprintf(out, "would delete %s (%s)\n", pr,
			cli_bytes(size, b, sizeof(b)));
		push_row(c, PR_PLAN, key, size, "delete");
		return;
	case PUSH_EV_SUMS:
		c->sums_written = true;
		return;
	case PUSH_EV_ABORTED:
		fprintf(out, "aborted upload %s: %s\n", pr, msg);
		push_row(c, PR_ABORTED, key, size, msg);
		return;
	}
}

/* One progress line: a bar redrawn in place on a terminal, else a plain
 * line (every 5 s; on stderr with --json). */
static void push_show(struct push_cli *c, bool last)
{
	struct push_progress pr;
	double el = timeutil_mono_s() - c->t0, rate;
	char a[32], b[32], r[32], eta[32], line[512];
	uint64_t left;
	int n;

	push_progress(c->push, &pr);
	rate = el > 0 ? (double)pr.sent / el : 0;
	left = pr.bytes_total > pr.bytes_done ? pr.bytes_total - pr.bytes_done
					      : 0;
	cli_eta(rate > 0 ? (double)left / rate : -1, eta, sizeof(eta));
	cli_bytes(pr.bytes_done, a, sizeof(a));
	cli_bytes(pr.bytes_total, b, sizeof(b));
	cli_bytes((uint64_t)rate, r, sizeof(r));
	if (c->tty) {
		unsigned bar = 30,
			 fill = pr.bytes_total
					? (unsigned)((double)bar *
						     (double)pr.bytes_done /
						     (double)pr.bytes_total)
					: bar;

		n = snprintf(line, sizeof(line), "\rpush [");
		for (unsigned i = 0; i < bar; i++)
			line[n++] = i < fill ? '#' : '-';
		snprintf(line + n, sizeof(line) - (size_t)n,
			 "] %s/%s %" PRIu64 "/%" PRIu64
			 " files %s/s ETA %s\033[K%s",
			 a, b, pr.files_done, pr.files_total, r, eta,
			 last ? "\n" : "");
		fputs(line, stdout);
		fflush(stdout);
		c->drew = !last;
		return;
	}
	fprintf(c->json ? stderr : stdout,
		"push: %s of %s, %" PRIu64 "/%" PRIu64
		" files, %s/s sent, ETA %s\n",
		a, b, pr.files_done, pr.files_total, r, eta);
	fflush(c->json ? stderr : stdout);
}

static void *push_ticker(void *arg)
{
	struct push_cli *c = arg;
	double every = c->tty ? 0.5 : 5.0, last = timeutil_mono_s();

	while (!atomic_load(&c->quit)) {
		struct timespec ts = { 0, 100 * 1000 * 1000 };

		nanosleep(&ts, NULL);
		if (timeutil_mono_s() - last >= every) {
			last = timeutil_mono_s();
			push_show(c, false);
		}
	}
	return NULL;
}

/* Is NAME, or any dataset, registered from url? One `list`. */
struct push_reg {
	const char *name, *url;
	char source[4096]; /* NAME's source, "" when NAME is not registered */
	char other[256]; /* another dataset from the same URL, or "" */
	char nested[256]; /* a dataset whose source holds URL or lies
			     under it, or "" */
};

static bool push_same_url(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);

	while (la && a[la - 1] == '/')
		la--;
	while (lb && b[lb - 1] == '/')
		lb--;
	return la == lb && !memcmp(a, b, la);
}

/* Does one of the URLs lie under the other (a prefix up to a '/')? */
static bool push_nested_url(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);

	while (la && a[la - 1] == '/')
		la--;
	while (lb && b[lb - 1] == '/')
		lb--;
	if (la > lb)
		return push_nested_url(b, a);
	return !memcmp(a, b, la) && b[la] == '/';
}

static int push_list_row(struct proto_client *pc, void *arg)
{
	struct push_reg *r = arg;
	const char *name = proto_get(&pc->msg, "name");
	const char *src = proto_get(&pc->msg, "source");

	if (!name || !src)
		return 0;
	if (!strcmp(name, r->name))
		snprintf(r->source, sizeof(r->source), "%s", src);
	else if (push_same_url(src, r->url) && !r->other[0])
		snprintf(r->other, sizeof(r->other), "%s", name);
	else if (push_nested_url(src, r->url) && !r->nested[0])
		snprintf(r->nested, sizeof(r->nested), "%s", name);
	return 0;
}

/* Returns 0 or an exit code (message printed). */
static int push_registered(const struct dstage_config *cfg, struct push_reg *r)
{
	struct proto_client pc = { .fd = -1 };
	int ret = proto_client_open(&pc, "stager", cfg->daemon_socket);

	if (ret) {
		proto_client_close(&pc);
		return CLI_EXIT_DAEMON;
	}
	proto_add(&pc.out, "cmd", "list");
	ret = proto_client_call(&pc, push_list_row, r);
	if (!ret && pc.rc)
		fprintf(stderr, "stager push: %s\n",
			pc.endmsg[0] ? pc.endmsg : strerror(-pc.rc));
	proto_client_close(&pc);
	if (ret)
		return CLI_EXIT_DAEMON;
	return pc.rc ? cli_exit_code(pc.rc) : 0;
}

/* Run another command (add, refresh, stage, verify) as its handler would;
 * with --json its output goes to stderr. */
static int push_then(const struct dstage_config *cfg, struct push_cli *c,
		     const struct stager_cmd *cmd, struct stager_opts *so)
{
	int saved = -1, code;

	if (c->json) {
		fflush(stdout);
		saved = dup(STDOUT_FILENO);
		if (saved < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
			return CLI_EXIT_FAIL;
	}
	code = cmd->run(cfg, cmd, so);
	if (saved >= 0) {
		fflush(stdout);
		dup2(saved, STDOUT_FILENO);
		close(saved);
	}
	return code;
}

/* action: "add", "refresh" or NULL (registered and unchanged). */
static int push_register(const struct dstage_config *cfg, struct push_cli *c,
			 const char *name, const char *action, int *stage_code,
			 int *verify_code)
{
	const struct stager_opts *o = c->o;
	char *args[2] = { (char *)name, o->argv[1] };
	struct stager_cmd add = { .name = action ? action : "",
				  .run = client_add,
				  .flags = STAGER_NEEDS_DAEMON,
				  .json = STAGER_JSON_OBJECT,
				  .opts = "",
				  .needs = "",
				  .usage = "",
				  .summary = "",
				  .help = "" };
	struct stager_cmd job = { .name = "stage",
				  .run = client_submit,
				  .flags = STAGER_NEEDS_DAEMON | STAGER_SUBMIT,
				  .json = STAGER_JSON_OBJECT,
				  .opts = "",
				  .needs = "",
				  .usage = "",
				  .summary = "",
				  .help = "" };
	struct stager_opts so = { .config = o->config,
				  .argc = action && !strcmp(action, "add") ? 2
									   : 1,
				  .argv = args };
	int code = action ? push_then(cfg, c, &add, &so) : 0;

	if (code)
		return code;
	so.argc = 1;
	so.wait = true;
	so.parallel = o->parallel;
	so.bandwidth = o->bandwidth;
	if (o->push_stage) {
		*stage_code = push_then(cfg, c, &job, &so);
		if (*stage_code)
			return *stage_code;
	}
	if (o->push_verify) {
		job.name = "verify";
		so.mode = "source";
		*verify_code = push_then(cfg, c, &job, &so);
		if (*verify_code)
			return *verify_code;
	}
	return 0;
}

static void push_summary(struct push_cli *c, const char *name, int ret,
			 const struct push_plan *plan, const char *registered,
			 int stage_code, int verify_code, int code)
{
	struct push_progress pr;
	double el = (c->t1 ? c->t1 : timeutil_mono_s()) - c->t0;
	char a[32], b[32];
	json_t *doc;

	push_progress(c->push, &pr);
	if (!c->json) {
		if (c->o->push_dry_run) {
			printf("dry run: %" PRIu64 " of %" PRIu64
			       " files (%s) to upload, %" PRIu64
			       " already in the store, %" PRIu64 " to delete\n",
			       plan->upload, plan->files,
			       cli_bytes(plan->upload_bytes, a, sizeof(a)),
			       plan->skip, c->would_delete);
			return;
		}
		printf("pushed %s: %" PRIu64 " uploaded (%s in %.1fs, %s/s), "
		       "%" PRIu64 " already there, %" PRIu64 " deleted, "
		       "%" PRIu64 " changed, %" PRIu64 " failed, %" PRIu64
		       " open uploads aborted%s\n",
		       name, c->uploaded, cli_bytes(pr.sent, a, sizeof(a)), el,
		       cli_bytes(el > 0 ? (uint64_t)((double)pr.sent / el) : 0,
				 b, sizeof(b)),
		       c->skipped, c->deleted, pr.changed, pr.failed,
		       c->n_rows[PR_ABORTED],
		       c->sums_written ? "; SHA256SUMS written" : "");
		return;
	}
	doc = json_object();
	if (!doc || jsonout_set_str(doc, "name", name) ||
	    jsonout_set_str(doc, "dir", c->o->argv[0]) ||
	    jsonout_set_str(doc, "url", c->o->argv[1]) ||
	    json_object_set_new(doc, "dry_run",
				json_boolean(c->o->push_dry_run)) ||
	    json_object_set_new(doc, "files",
				json_integer((json_int_t)plan->files)) ||
	    json_object_set_new(doc, "bytes",
				json_integer((json_int_t)plan->bytes)) ||
	    json_object_set_new(doc, "to_upload",
				json_integer((json_int_t)plan->upload)) ||
	    json_object_set_new(doc, "uploaded",
				json_integer((json_int_t)c->uploaded)) ||
	    json_object_set_new(doc, "sent",
				json_integer((json_int_t)pr.sent)) ||
	    json_object_set_new(doc, "skipped",
				json_integer((json_int_t)plan->skip)) ||
	    json_object_set_new(doc, "seconds", json_real(el)) ||
	    json_object_set_new(doc, "sums_written",
				json_boolean(c->sums_written)) ||
	    jsonout_set_str(doc, "journal", push_journal_path(c->push)) ||
	    (c->err[0] && jsonout_set_str(doc, "error", c->err)) ||
	    json_object_set_new(doc, "result", json_integer(ret)) ||
	    json_object_set_new(doc, "exit", json_integer(code)) ||
	    (registered && jsonout_set_str(doc, "registered", registered)) ||
	    (c->o->push_stage &&
	     json_object_set_new(doc, "stage_exit",
				 json_integer(stage_code))) ||
	    (c->o->push_verify &&
	     json_object_set_new(doc, "verify_exit",
				 json_integer(verify_code)))) {
		json_decref(doc);
		doc = NULL;
	}
	for (int k = 0; doc && k < PR_N; k++)
		if (json_object_set(doc, push_row_names[k], c->rows[k]) ||
		    json_object_set_new(
			    doc,
			    k == PR_PLAN      ? "plan_count"
			    : k == PR_CHANGED ? "changed_count"
			    : k == PR_FAILED  ? "failed_count"
			    : k == PR_BAD     ? "bad_names_count"
			    : k == PR_IGNORED ? "ignored_count"
			    : k == PR_ABORTED ? "aborted_uploads_count"
					      : "deleted_count",
			    json_integer((json_int_t)c->n_rows[k]))) {
			json_decref(doc);
			doc = NULL;
		}
	if (!jsonout_print(doc))
		c->summarized = true;
	json_decref(doc);
}

/* Check URL's scheme and pick its key check. Returns 0 or an exit code. */
static int push_check_url(struct push_cli *c, struct push_opts *po)
{
	if (!strncmp(po->url, "s3://", 5))
		po->key_ok = push_s3_key_ok;
	else if (strncmp(po->url, "file://", 7)) {
		push_err(c, "%s: expected s3://BUCKET/PREFIX/ or file:///DIR/",
			 po->url);
		return CLI_EXIT_USAGE;
	}
	return 0;
}

/* The dataset's name: --name, else LOCAL_DIR's (its real path's last
 * component, in *dup and *real for the caller to free), checked as a
 * key path. Returns 0 or an exit code. */
static int push_dataset_name(struct push_cli *c, const struct push_opts *po,
			     const char **name, char **dup, char **real)
{
	const char *why = NULL;
	char pr[512];

	if (!*name) {
		*real = realpath(po->dir, NULL);
		if (!*real) {
			int err = errno;

			push_err(c, "%s: %s", po->dir, strerror(err));
			return cli_exit_code(-err);
		}
		*dup = strdup(*real);
		*name = *dup ? basename(*dup) : NULL;
		if (!*name)
			return CLI_EXIT_FAIL;
	}
	if (keypath_check_name(*name, strlen(*name), &why)) {
		push_err(
			c, "dataset name '%s' %s: give one with --name",
			keypath_printable(*name, strlen(*name), pr, sizeof(pr)),
			why);
		return CLI_EXIT_USAGE;
	}
	return 0;
}

/* Ask the daemon what is registered at or around URL (a dry run goes on
 * without it) and refuse a name registered from another source. Returns 0
 * or an exit code. */
static int push_check_registered(const struct dstage_config *cfg,
				 struct push_cli *c, const struct push_opts *po,
				 struct push_reg *reg)
{
	int code = push_registered(cfg, reg);

	if (code && !(c->o->push_dry_run && code == CLI_EXIT_DAEMON)) {
		snprintf(c->err, sizeof(c->err),
			 "cannot ask the daemon which datasets are registered "
			 "(%s)",
			 cfg->daemon_socket);
		return code;
	}
	if (reg->source[0] && !push_same_url(reg->source, po->url)) {
		push_err(c,
			 "dataset %s is registered from %s, not %s: choose "
			 "another --name",
			 reg->name, reg->source, po->url);
		return CLI_EXIT_FAIL;
	}
	return 0;
}

/* Refuse a push that would change a registered dataset's objects without
 * --new-version, or push a registered URL under another name. Returns 0
 * or an exit code. */
static int push_check_change(struct push_cli *c, const struct push_opts *po,
			     const struct push_reg *reg,
			     const struct push_plan *plan)
{
	if ((reg->source[0] || reg->other[0] || reg->nested[0]) &&
	    !c->o->push_new_version &&
	    (plan->upload || plan->remove || !plan->sums_current)) {
		push_err(c,
			 "%s %s the registered dataset %s: this push would "
			 "change its objects (%" PRIu64 " to upload, %" PRIu64
			 " of them replacing stored ones, %" PRIu64
			 " to delete%s). Add --new-version to push and "
			 "register a new manifest version (running jobs keep "
			 "theirs), or --dry-run to see the changes",
			 po->url,
			 reg->source[0] || reg->other[0]
				 ? "is the source of"
				 : "overlaps the source of",
			 reg->source[0]	 ? reg->name
			 : reg->other[0] ? reg->other
					 : reg->nested,
			 plan->upload, plan->overwrite, plan->remove,
			 plan->sums_current ? "" : ", SHA256SUMS rewritten");
		return CLI_EXIT_FAIL;
	}
	if (reg->other[0] && !reg->source[0]) {
		push_err(c,
			 "%s is already registered as dataset %s: push with "
			 "--name %s",
			 po->url, reg->other, reg->other);
		return CLI_EXIT_FAIL;
	}
	return 0;
}

/* Run the upload with the progress thread and SIGINT/SIGTERM stopping it;
 * show the last progress. Returns push_execute()'s result. */
static int push_upload(struct push_cli *c)
{
	pthread_t ticker;
	bool ticking;
	int ret;

	atomic_store(&push_sig_target, c->push);
	signal(SIGINT, push_on_signal);
	signal(SIGTERM, push_on_signal);
	ticking = !pthread_create(&ticker, NULL, push_ticker, c);
	ret = push_execute(c->push);
	c->t1 = timeutil_mono_s();
	atomic_store(&c->quit, true);
	if (ticking)
		pthread_join(ticker, NULL);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	atomic_store(&push_sig_target, NULL);
	if (c->tty || !c->json)
		push_show(c, true);
	return ret;
}

/* Report a failed upload (ret) with what to do next. Returns the exit
 * code. */
static int push_upload_failed(struct push_cli *c, const struct push_opts *po,
			      const char *name, int ret,
			      const struct push_plan *plan)
{
	const char *hint = ret == -ECANCELED ? "stopped; run it again to resume"
			   : ret == -EAGAIN
				   ? "some files changed while pushed or "
				     "have names that cannot be keys; "
				     "fix them and run it again (what "
				     "is stored is kept)"
				   : "run it again to resume";

	push_err(c,
		 "%s -> %s: %s: %s; SHA256SUMS not written, %s not "
		 "registered%s%s",
		 po->dir, po->url, strerror(-ret), hint, name,
		 push_cause()[0] ? ": " : "", push_cause());
	push_summary(c, name, ret, plan, NULL, 0, 0, CLI_EXIT_FAIL);
	return CLI_EXIT_FAIL;
}

/* After an upload: add or refresh the dataset (unless nothing changed),
 * then --stage and --verify it, and print the summary. Returns the exit
 * code. */
static int push_finish(const struct dstage_config *cfg, struct push_cli *c,
		       const struct push_opts *po, const struct push_reg *reg,
		       const char *name, const struct push_plan *plan)
{
	const char *registered;
	int code, stage_code = 0, verify_code = 0;

	if (reg->source[0] && !c->uploaded && !c->deleted && !c->sums_written)
		registered = "unchanged";
	else
		registered = reg->source[0] ? "refreshed" : "added";
	code = push_register(cfg, c, name,
			     !strcmp(registered, "unchanged") ? NULL
			     : reg->source[0]		      ? "refresh"
							      : "add",
			     &stage_code, &verify_code);
	if (reg->nested[0] && !code)
		fprintf(stderr,
			"stager push: the registered dataset %s overlaps %s: "
			"'stager refresh %s' makes it see this push\n",
			reg->nested, po->url, reg->nested);
	push_summary(c, name, 0, plan, registered, stage_code, verify_code,
		     code);
	return code;
}

/* --json: a failure no summary reported, as {"error": {exit, message}}. */
static void push_json_error(const struct push_cli *c, int code)
{
	json_t *doc = json_object(), *e = json_object();

	if (doc && e && !json_object_set(doc, "error", e) &&
	    !json_object_set_new(e, "exit", json_integer(code)) &&
	    !jsonout_set_str(e, "message", c->err[0] ? c->err : "push failed"))
		jsonout_print(doc);
	json_decref(e);
	json_decref(doc);
}

/* Everything from the checks to the summary. Returns the exit code. */
static int push_cli_run(const struct dstage_config *cfg, struct push_cli *c,
			struct push_opts *po, const char *name)
{
	struct push_reg reg = { .url = po->url, .name = name };
	struct push_plan plan = { 0 };
	int ret, code;

	code = push_check_registered(cfg, c, po, &reg);
	if (code)
		return code;
	ret = push_prepare(cfg, po, &c->push);
	if (ret) {
		push_err(c, "%s -> %s: %s%s%s", po->dir, po->url,
			 strerror(-ret), push_cause()[0] ? ": " : "",
			 push_cause());
		return cli_exit_code(ret);
	}
	push_plan(c->push, &plan);
	if (c->o->push_dry_run) {
		push_dry_run(c->push);
		push_summary(c, name, 0, &plan, NULL, 0, 0, CLI_EXIT_OK);
		return CLI_EXIT_OK;
	}
	code = push_check_change(c, po, &reg, &plan);
	if (code)
		return code;
	ret = push_upload(c);
	if (ret)
		return push_upload_failed(c, po, name, ret, &plan);
	return push_finish(cfg, c, po, &reg, name, &plan);
}

int local_push(const struct dstage_config *cfg, const struct stager_cmd *cmd,
	       const struct stager_opts *o)
{
	struct push_cli c = { .o = o, .json = o->json };
	struct push_opts po = { .dir = o->argv[0],
				.url = o->argv[1],
				.parallel = o->parallel,
				.bandwidth = o->bandwidth,
				.excludes = o->push_excludes,
				.n_excludes = o->push_n_excludes,
				.delete_extra = o->push_delete,
				.event = push_event,
				.event_arg = &c };
	char *dup = NULL, *real = NULL;
	const char *name = o->push_name;
	int code = CLI_EXIT_FAIL;

	(void)cmd;
	c.t0 = timeutil_mono_s();
	c.tty = !o->json && isatty(STDOUT_FILENO);
	for (int k = 0; k < PR_N; k++)
		if (!(c.rows[k] = json_array()))
			goto out;
	code = push_check_url(&c, &po);
	if (!code)
		code = push_dataset_name(&c, &po, &name, &dup, &real);
	if (!code)
		code = push_cli_run(cfg, &c, &po, name);
out:
	if (c.json && !c.summarized && code)
		push_json_error(&c, code);
	for (int k = 0; k < PR_N; k++)
		json_decref(c.rows[k]);
	push_free(c.push);
	free(dup);
	free(real);
	return code;
}
