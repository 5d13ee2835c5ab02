// SPDX-License-Identifier: MIT
/*
 * client: the commands that go through the daemon. One connection per
 * command; each request is one proto line, answered by rows ("type=row",
 * "type=progress", "type=mismatch") and one "type=end rc=... msg=..." line.
 *
 * Each command is an entry of main.c's table (its flags say whether the
 * argument is a dataset or a job and whether it queues a job; its json
 * field the shape of --json). The handlers here share one exchange,
 * client_exchange: connect, build the request from the options, feed each
 * row to the command's text printer or to the JSON document.
 *
 * Output: text for people, --json for scripts (one JSON document on
 * stdout, written with jansson through jsonout.c, whose policy covers keys
 * that are not UTF-8), and for --wait a progress bar when stdout is a
 * terminal, else a plain line every few seconds.
 *
 * Stateless between commands; struct client lives for one command in one
 * thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "dstage/grow.h"
#include "dstage/proto_client.h"
#include "dstage/sharedtier.h"
#include "jsonout.h"
#include "stager.h"

struct client {
	const struct dstage_config *cfg;
	const struct stager_opts *o;
	struct proto_client pc; /* the connection, request, row, end line */
};

/* Row handler: called for every row before the end line. */
typedef int (*client_row_cb)(struct client *cl, void *arg);

/* Keys whose values are never numbers in --json. */
static const char *const client_strs[] = {
	"name",	      "source", "state", "group",	"kind",
	"dataset",    "error",	"args",	 "key",		"expected",
	"actual",     "msg",	"label", "last_verify", "last_verify_msg",
	"last_stage", "type",	"etag",	 "url",		"manifest_key",
	NULL,
};

static int client_connect(struct client *cl)
{
	return proto_client_open(&cl->pc, "stager", cl->cfg->daemon_socket);
}

struct client_trampoline {
	struct client *cl;
	client_row_cb cb;
	void *arg;
};

static int client_row(struct proto_client *pc, void *arg)
{
	struct client_trampoline *t = arg;

	(void)pc;
	return t->cb(t->cl, t->arg);
}

/* Send the request in cl->pc.out; feed rows to cb until the end line.
 * Returns 0 when the exchange completed (result in cl->pc.rc), or -errno. */
static int client_call(struct client *cl, client_row_cb cb, void *arg)
{
	struct client_trampoline t = { cl, cb, arg };

	return proto_client_call(&cl->pc, cb ? client_row : NULL, &t);
}

/* s with control bytes escaped for a terminal (cli_safe), in one of
 * CLIENT_SAFE_N buffers in turn: up to that many in one printf. Every
 * column printed as text goes through it (issue 42); --json carries the
 * bytes as they are. */
#define CLIENT_SAFE_N 8
static const char *client_safe(const char *s)
{
	static char ring[CLIENT_SAFE_N][4 * 1024 + 1];
	static unsigned next;

	return cli_safe(s ? s : "", ring[next++ % CLIENT_SAFE_N],
			sizeof(ring[0]));
}

/* The exit code for a completed call, printing its error: on stderr, and
 * with --json also as {"error": {"errno", "code", "message"}} on stdout. */
static int client_result(struct client *cl)
{
	const char *msg =
		cl->pc.endmsg[0] ? cl->pc.endmsg : strerror(-cl->pc.rc);

	if (!cl->pc.rc) {
		if (cl->pc.endwarn[0])
			fprintf(stderr, "stager: warning: %s\n",
				client_safe(cl->pc.endwarn));
		return CLI_EXIT_OK;
	}
	fprintf(stderr, "stager: %s\n", client_safe(msg));
	if (cl->o->json) {
		json_t *doc = json_object(), *e = json_object();
		const char *name = strerrorname_np(-cl->pc.rc);

		if (doc && e && !json_object_set(doc, "error", e) &&
		    !json_object_set_new(e, "errno",
					 json_integer(-cl->pc.rc)) &&
		    !jsonout_set_str(e, "code", name ? name : "") &&
		    !jsonout_set_str(e, "message", msg))
			jsonout_print(doc);
		json_decref(e);
		json_decref(doc);
	}
	return cli_exit_code(cl->pc.rc);
}

/* ---- collecting rows ---- */

/* --json: each row an element of the array doc, or (an object) doc. */
static int client_json_row(struct client *cl, void *arg)
{
	json_t **doc = arg;
	json_t *o = jsonout_row(&cl->pc.msg, client_strs);

	if (!o)
		return -ENOMEM;
	if (json_is_array(*doc))
		return json_array_append_new(*doc, o) ? -ENOMEM : 0;
	json_decref(*doc);
	*doc = o;
	return 0;
}

static const char *client_get(struct client *cl, const char *k)
{
	return proto_get(&cl->pc.msg, k) ?: "";
}

/* The value of key k of the row, escaped for a terminal. */
static const char *client_text(struct client *cl, const char *k)
{
	return client_safe(client_get(cl, k));
}

static uint64_t client_u64(struct client *cl, const char *k)
{
	uint64_t v = 0;

	proto_get_u64(&cl->pc.msg, k, &v);
	return v;
}

static int client_list_row(struct client *cl, void *arg)
{
	char b[32];

	(void)arg;
	printf("%-20s %-6s %7s %8" PRIu64 " %11s %4s %4s  %s\n",
	       client_text(cl, "name"), client_text(cl, "state"),
	       client_text(cl, "version"), client_u64(cl, "files"),
	       cli_bytes(client_u64(cl, "bytes"), b, sizeof(b)),
	       client_u64(cl, "pinned") ? "yes" : "no",
	       client_text(cl, "priority"), client_text(cl, "source"));
	return 0;
}

static double client_pct(uint64_t a, uint64_t b)
{
	return b ? 100.0 * (double)a / (double)b : 0.0;
}

static int client_show_row(struct client *cl, void *arg)
{
	uint64_t files = client_u64(cl, "files"),
		 bytes = client_u64(cl, "bytes");
	uint64_t cached = client_u64(cl, "cached");
	uint64_t ver = client_u64(cl, "verified_files");
	int64_t t = 0;
	char b[32], c[32], tb[64];

	(void)arg;
	printf("name:       %s\n", client_text(cl, "name"));
	printf("source:     %s\n", client_text(cl, "source"));
	printf("state:      %s, manifest version %s%s%s\n",
	       client_text(cl, "state"), client_text(cl, "version"),
	       proto_get(&cl->pc.msg, "label") ? ", label " : "",
	       client_text(cl, "label"));
	printf("files:      %" PRIu64 " (%s skipped as bad keys)\n", files,
	       client_text(cl, "bad_keys"));
	printf("bytes:      %s\n", cli_bytes(bytes, b, sizeof(b)));
	printf("manifest:   %s (the expected SHA-256 list)\n",
	       client_text(cl, "manifest_key"));
	if (client_u64(cl, "cache_available"))
		printf("cached:     %.1f%% (%s)\n", client_pct(cached, bytes),
		       cli_bytes(cached, c, sizeof(c)));
	else
		printf("cached:     unknown (the daemon has no cache)\n");
	printf("verified:   %.1f%% (%" PRIu64 " of %" PRIu64
	       " files; %s mismatched; %s listed in %s)\n",
	       client_pct(ver, files), ver, files,
	       client_text(cl, "mismatched_files"),
	       client_text(cl, "expected_files"),
	       client_text(cl, "manifest_key"));
	if (proto_get(&cl->pc.msg, "last_verify")) {
		proto_get_i64(&cl->pc.msg, "last_verify_at", &t);
		cli_time(t, tb, sizeof(tb));
		if (proto_get(&cl->pc.msg, "last_verify_damaged"))
			printf("last verify: %s %s: %s damaged blocks, %s "
			       "missing, %" PRIu64 " file%s, %s blocks "
			       "repaired\n             %s\n",
			       client_text(cl, "last_verify"), tb,
			       client_text(cl, "last_verify_damaged"),
			       client_text(cl, "last_verify_missing"),
			       client_u64(cl, "last_verify_mismatched"),
			       client_u64(cl, "last_verify_mismatched") == 1
				       ? " differs"
				       : "s differ",
			       client_text(cl, "last_verify_repaired"),
			       client_text(cl, "last_verify_msg"));
		else /* a job from before schema 7 */
			printf("last verify: %s at %s: %s\n",
			       client_text(cl, "last_verify"), tb,
			       client_text(cl, "last_verify_msg"));
	} else {
		printf("last verify: never\n");
	}
	printf("pinned:     %s, priority %s, group %s\n",
	       client_u64(cl, "pinned") ? "yes" : "no",
	       client_text(cl, "priority"),
	       *client_text(cl, "group") ? client_text(cl, "group") : "-");
	for (int i = 0; i < SHAREDTIER_CAUSES; i++) {
		const char *cause = sharedtier_cause_name(i);
		char k[64];
		int64_t first = 0, last = 0;
		uint64_t n;

		snprintf(k, sizeof(k), "tier_%s", cause);
		n = client_u64(cl, k);
		snprintf(k, sizeof(k), "tier_%s_first", cause);
		proto_get_i64(&cl->pc.msg, k, &first);
		snprintf(k, sizeof(k), "tier_%s_last", cause);
		proto_get_i64(&cl->pc.msg, k, &last);
		snprintf(k, sizeof(k), "tier_%s_what", cause);
		cli_tier_line("shared tier: ", cause, n, first, last,
			      proto_get(&cl->pc.msg, k));
	}
	if (*client_text(cl, "tier_health_error"))
		printf("shared tier: status unknown (%s)\n",
		       client_text(cl, "tier_health_error"));
	return 0;
}

static int client_job_row(struct client *cl, void *arg)
{
	uint64_t done = client_u64(cl, "done"), total = client_u64(cl, "total");
	char b[32];

	(void)arg;
	printf("%6s  %-6s %-20s %-9s %5.1f%% %10s  %s\n",
	       client_text(cl, "job"), client_text(cl, "kind"),
	       client_text(cl, "dataset"), client_text(cl, "state"),
	       client_pct(done, total), cli_bytes(total, b, sizeof(b)),
	       client_text(cl, "error"));
	return 0;
}

/* add, refresh: arg is the command's name ("added", "refreshed") */
static int client_added_row(struct client *cl, void *arg)
{
	char b[32];

	printf("%sed %s: %" PRIu64 " files, %s, manifest version %s\n",
	       (const char *)arg, client_text(cl, "name"),
	       client_u64(cl, "files"),
	       cli_bytes(client_u64(cl, "bytes"), b, sizeof(b)),
	       client_text(cl, "version"));
	return 0;
}

static int client_shared_row(struct client *cl, void *arg)
{
	char b[32];

	(void)arg;
	printf("shared tier of %s: snapshot %s in %s: %s; %" PRIu64
	       " files, %s (%" PRIu64 " fetched, %" PRIu64 " kept)\n",
	       client_text(cl, "name"), client_text(cl, "snapshot"),
	       client_text(cl, "dir"), client_text(cl, "state"),
	       client_u64(cl, "files"),
	       cli_bytes(client_u64(cl, "bytes"), b, sizeof(b)),
	       client_u64(cl, "copied"), client_u64(cl, "kept"));
	return 0;
}

static int client_submit_row(struct client *cl, void *arg)
{
	int64_t *job = arg;

	proto_get_i64(&cl->pc.msg, "job", job);
	return 0;
}

/* ---- waiting for a job ---- */

/* A "mismatch" row: a SHA-256 mismatch (kind NULL) or what verify found
 * in the cache (kind "damaged", "repaired", "missing", "fetched"). */
struct client_mm {
	char *kind, *key, *expected, *actual, *path;
	uint64_t block, count;
};

static void client_mm_free(struct client_mm *m)
{
	free(m->kind);
	free(m->key);
	free(m->expected);
	free(m->actual);
	free(m->path);
}

struct client_watch;
/* Keep the row in cl->pc.msg as w->mm's next entry. */
static int client_mm_add(struct client_watch *w, struct client *cl);

struct client_watch {
	bool tty;
	double t0, last_print, last_t;
	uint64_t last_done;
	double rate;
	unsigned width;
	struct proto_buf final; /* the final row, re-encoded */
	struct client_mm *mm; /* the job's "mismatch" rows */
	size_t n_mm, cap_mm;
	bool drew;
};

static int client_watch_row(struct client *cl, void *arg)
{
	struct client_watch *w = arg;
	const char *type = client_get(cl, "type");
	uint64_t done = client_u64(cl, "done"), total = client_u64(cl, "total");
	uint64_t fd = client_u64(cl, "files_done");
	uint64_t ft = client_u64(cl, "files_total");
	double now = timeutil_mono_s();
	char a[32], b[32], r[32], eta[32];

	if (!strcmp(type, "mismatch"))
		return client_mm_add(w, cl);
	if (!strcmp(type, "row")) {
		proto_reset(&w->final);
		for (unsigned i = 0; i < cl->pc.msg.n; i++)
			proto_add(&w->final, cl->pc.msg.f[i].key,
				  cl->pc.msg.f[i].val);
		proto_end(&w->final);
	}
	if (strcmp(type, "progress") || cl->o->json)
		return 0;
	if (w->last_t && now > w->last_t && done >= w->last_done) {
		double inst = (double)(done - w->last_done) / (now - w->last_t);

		w->rate = w->rate ? 0.7 * w->rate + 0.3 * inst : inst;
	}
	if (!w->last_t || now - w->last_t > 0.4) {
		w->last_t = now;
		w->last_done = done;
	}
	cli_bytes((uint64_t)w->rate, r, sizeof(r));
	cli_eta(w->rate > 0 ? (double)(total - done) / w->rate : -1, eta,
		sizeof(eta));
	cli_bytes(done, a, sizeof(a));
	cli_bytes(total, b, sizeof(b));
	if (w->tty) {
		unsigned bar = 30, fill;
		char line[512];
		int n;

		fill = total ? (unsigned)((double)bar * (double)done /
					  (double)total)
			     : 0;
		if (fill > bar)
			fill = bar;
		n = snprintf(line, sizeof(line), "\r%s %s [",
			     client_text(cl, "kind"),
			     client_text(cl, "dataset"));
		for (unsigned i = 0; i < bar && n < (int)sizeof(line) - 2; i++)
			line[n++] = i < fill ? '#' : '-';
		snprintf(line + n, sizeof(line) - (size_t)n,
			 "] %5.1f%% %s/%s %" PRIu64 "/%" PRIu64
			 " files %s/s ETA %s\033[K",
			 client_pct(done, total), a, b, fd, ft, r, eta);
		fputs(line, stdout);
		fflush(stdout);
		w->drew = true;
	} else if (now - w->last_print >= 2.0) {
		printf("job %s %s %s: %s, %.1f%%, %s of %s, %" PRIu64
		       "/%" PRIu64 " files, %s/s, ETA %s\n",
		       client_text(cl, "job"), client_text(cl, "kind"),
		       client_text(cl, "dataset"), client_text(cl, "state"),
		       client_pct(done, total), a, b, fd, ft, r, eta);
		fflush(stdout);
		w->last_print = now;
	}
	return 0;
}

static int client_mm_add(struct client_watch *w, struct client *cl)
{
	struct client_mm *m;
	const char *kind = proto_get(&cl->pc.msg, "kind");

	if (GROW_ONE(w->mm, w->n_mm, w->cap_mm, 8))
		return -ENOMEM;
	m = &w->mm[w->n_mm];
	*m = (struct client_mm){
		.kind = kind ? strdup(kind) : NULL,
		.key = strdup(client_get(cl, "key")),
		.expected = strdup(client_get(cl, "expected")),
		.actual = strdup(client_get(cl, "actual")),
		.path = strdup(client_get(cl, "path")),
		.block = client_u64(cl, "block"),
		.count = client_u64(cl, "count"),
	};
	if ((kind && !m->kind) || !m->key || !m->expected || !m->actual ||
	    !m->path) {
		client_mm_free(m);
		return -ENOMEM;
	}
	w->n_mm++;
	return 0;
}

/* --json of the job's rows: "mismatches" (SHA-256), and what verify found
 * in the cache under "damaged", "repaired" (blocks), "missing", "fetched"
 * (counts of blocks a file lacked). Returns true on no memory. */
static bool client_mm_json(json_t *doc, const struct client_watch *w,
			   const char *dataset)
{
	static const char *const kinds[] = { "mismatches", "damaged",
					     "repaired", "missing", "fetched" };
	bool bad = false;

	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]) && !bad; k++) {
		json_t *arr = json_array();

		bad = !arr || json_object_set(doc, kinds[k], arr) != 0;
		for (size_t i = 0; i < w->n_mm && !bad; i++) {
			const struct client_mm *m = &w->mm[i];
			json_t *o;

			if (k ? !m->kind || strcmp(m->kind, kinds[k])
			      : !!m->kind)
				continue;
			o = json_object();
			bad = !o || jsonout_set_str(o, "key", m->key);
			if (!bad && !k)
				bad = jsonout_set_str(o, "expected",
						      m->expected) ||
				      jsonout_set_str(o, "actual", m->actual);
			if (!bad && k)
				bad = jsonout_set_str(o, "dataset", dataset);
			if (!bad && k <= 2 && k)
				bad = json_object_set_new(
					      o, "block",
					      json_integer(
						      (json_int_t)m->block)) ||
				      jsonout_set_str(o, "path", m->path);
			if (!bad && k > 2)
				bad = json_object_set_new(
					o, "blocks",
					json_integer((json_int_t)m->count));
			bad = bad || json_array_append(arr, o);
			json_decref(o);
		}
		json_decref(arr);
	}
	return bad;
}

/* Text: one line for each row but "fetched". */
static void client_mm_print(const struct client_watch *w, const char *dataset)
{
	for (size_t i = 0; i < w->n_mm; i++) {
		const struct client_mm *m = &w->mm[i];

		if (!m->kind)
			printf("MISMATCH %s\n  expected %s\n  actual   %s\n",
			       client_safe(m->key),
			       *m->expected ? client_safe(m->expected)
					    : "(none)",
			       client_safe(m->actual));
		else if (!strcmp(m->kind, "damaged"))
			printf("DAMAGED %s %s block %" PRIu64
			       ": cache file %s fails its checksum (not "
			       "repaired: --repair fetches it again)\n",
			       dataset, client_safe(m->key), m->block,
			       client_safe(m->path));
		else if (!strcmp(m->kind, "repaired"))
			printf("REPAIRED %s %s block %" PRIu64
			       ": cache file %s failed its checksum; fetched "
			       "again from the source\n",
			       dataset, client_safe(m->key), m->block,
			       client_safe(m->path));
		else if (!strcmp(m->kind, "missing"))
			printf("MISSING %s %s: %" PRIu64
			       " block(s) not in the cache (not fetched: "
			       "--fetch-missing or stage fetches them)\n",
			       dataset, client_safe(m->key), m->count);
		/* "fetched": asked for; counted in the job's message, each
		 * file only in --json */
	}
}

static int client_watch(struct client *cl, int64_t id)
{
	static struct proto_msg fin;
	struct client_watch w = { .tty = isatty(STDOUT_FILENO) == 1 };
	const char *state;
	int ret, code = CLI_EXIT_FAIL;

	w.t0 = timeutil_mono_s();
	proto_add(&cl->pc.out, "cmd", "watch");
	proto_add_i64(&cl->pc.out, "job", id);
	ret = client_call(cl, client_watch_row, &w);
	if (w.drew)
		putchar('\n');
	if (ret) {
		code = CLI_EXIT_DAEMON;
		goto out;
	}
	if (cl->pc.rc) {
		code = client_result(cl);
		goto out;
	}
	if (!w.final.len || proto_parse(&fin, w.final.data, w.final.len - 1)) {
		fprintf(stderr, "stager: no final state for job %" PRId64 "\n",
			id);
		goto out;
	}
	state = proto_get(&fin, "state") ?: "?";
	code = !strcmp(state, "done") ? CLI_EXIT_OK : CLI_EXIT_FAIL;
	if (cl->o->json) {
		json_t *doc = json_object();
		bool bad = !doc ||
			   json_object_set_new(doc, "job",
					       jsonout_row(&fin, client_strs));

		if (!bad)
			bad = client_mm_json(doc, &w,
					     proto_get(&fin, "dataset") ?: "");
		if (bad || jsonout_print(doc))
			code = CLI_EXIT_FAIL;
		json_decref(doc);
		goto out;
	}
	client_mm_print(&w, client_safe(proto_get(&fin, "dataset")));
	printf("job %" PRId64 " %s %s: %s%s%s\n", id,
	       client_safe(proto_get(&fin, "kind")),
	       client_safe(proto_get(&fin, "dataset")), client_safe(state),
	       *(proto_get(&fin, "error") ?: "") ? ": " : "",
	       client_safe(proto_get(&fin, "error")));
out:
	for (size_t i = 0; i < w.n_mm; i++)
		client_mm_free(&w.mm[i]);
	free(w.mm);
	proto_free(&w.final);
	return code;
}

/* ---- commands ---- */

/* Read --files: "a,b,c" or "@FILE" (one key a line) into "a\nb\nc". */
static char *client_files(const char *spec)
{
	char *s = NULL;

	if (spec[0] == '@') {
		FILE *f = fopen(spec + 1, "r");
		size_t len = 0;

		if (!f) {
			fprintf(stderr, "stager: --files %s: %s\n", spec + 1,
				strerror(errno));
			return NULL;
		}
		if (getdelim(&s, &len, '\0', f) < 0) {
			free(s);
			s = strdup("");
		}
		fclose(f);
		return s;
	}
	s = strdup(spec);
	for (char *p = s; p && *p; p++)
		if (*p == ',')
			*p = '\n';
	return s;
}

/* Connect and build cmd's request from the command line in cl->pc.out.
 * Returns 0 or an exit code (message printed). */
static int client_request(struct client *cl, const struct stager_cmd *cmd,
			  int64_t *id)
{
	const struct stager_opts *o = cl->o;
	char *files;
	int ret;

	*id = 0;
	if ((cmd->flags & STAGER_ARG_JOB) && o->argc > 0) {
		ret = jobs_parse_id(o->argv[0], id);
		if (ret) {
			fprintf(stderr,
				"stager: '%s' is not a job id (1 to %" PRId64
				")\n",
				o->argv[0], (int64_t)JOBS_ID_MAX);
			return CLI_EXIT_USAGE;
		}
	}
	if (client_connect(cl))
		return CLI_EXIT_DAEMON;
	proto_add(&cl->pc.out, "cmd", cmd->name);
	if (*id)
		proto_add_i64(&cl->pc.out, "job", *id);
	else if (o->argc > 0)
		proto_add(&cl->pc.out, "name", o->argv[0]);
	if (o->argc > 1)
		proto_add(&cl->pc.out, "url", o->argv[1]);
	if (o->group)
		proto_add(&cl->pc.out, "group", o->group);
	if (o->manifest)
		proto_add(&cl->pc.out, "manifest", o->manifest);
	if (o->shared_tier)
		proto_add(&cl->pc.out, "shared_tier", o->shared_tier);
	if (o->shared)
		proto_add_u64(&cl->pc.out, "wait_ms",
			      o->timeout_ms ? o->timeout_ms
			      : o->wait	    ? 600000
					    : 0);
	if (o->version)
		proto_add(&cl->pc.out, "label", o->version);
	if (o->pin)
		proto_add(&cl->pc.out, "pin", "1");
	if (o->has_priority)
		proto_add_i64(&cl->pc.out, "priority", o->priority);
	if (o->bandwidth)
		proto_add_u64(&cl->pc.out, "bandwidth", o->bandwidth);
	if (o->parallel)
		proto_add_u64(&cl->pc.out, "parallel", o->parallel);
	if (o->fit)
		proto_add(&cl->pc.out, "fit", "1");
	if (o->repair)
		proto_add(&cl->pc.out, "repair", "1");
	if (o->fetch_missing)
		proto_add(&cl->pc.out, "fetch_missing", "1");
	if (o->mode)
		proto_add(&cl->pc.out, "mode", o->mode);
	if (o->all)
		proto_add(&cl->pc.out, "all", "1");
	if (o->files) {
		files = client_files(o->files);
		if (!files)
			return CLI_EXIT_USAGE;
		proto_add(&cl->pc.out, "files", files);
		free(files);
	}
	return 0;
}

/*
 * The common exchange of a command: request, rows, end line. With --json,
 * rows go into one document of the command's shape (an array when
 * `array`), printed at the end; otherwise header (if any) and each row
 * through row_cb. Returns the exit code.
 */
static int client_exchange(struct client *cl, const struct stager_cmd *cmd,
			   bool array, const char *header, client_row_cb row_cb,
			   void *arg)
{
	json_t *doc = NULL;
	int ret, code;

	if (cl->o->json && cmd->json != STAGER_JSON_NONE) {
		doc = array ? json_array() : json_null();
		row_cb = client_json_row;
		arg = &doc;
	} else if (header) {
		fputs(header, stdout);
	}
	ret = client_call(cl, row_cb, arg);
	if (ret) {
		code = CLI_EXIT_DAEMON;
		goto out;
	}
	code = client_result(cl);
	if (!code && doc && !json_is_null(doc) && jsonout_print(doc))
		code = CLI_EXIT_FAIL;
out:
	json_decref(doc);
	return code;
}

static void client_release(struct client *cl)
{
	proto_client_close(&cl->pc);
}

/* A command that is one exchange: a client for it, the request, rows to
 * row_cb (or --json), the end line. *id (if not NULL) gets the job id. */
static int client_simple(const struct dstage_config *cfg,
			 const struct stager_cmd *cmd,
			 const struct stager_opts *o, bool array,
			 const char *header, client_row_cb row_cb, void *arg,
			 int64_t *id)
{
	struct client cl = { .cfg = cfg, .o = o, .pc.fd = -1 };
	int64_t job;
	int code = client_request(&cl, cmd, &job);

	if (!code)
		code = client_exchange(&cl, cmd, array, header, row_cb, arg);
	if (id)
		*id = job;
	client_release(&cl);
	return code;
}

int client_list(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o)
{
	char header[128];

	snprintf(header, sizeof(header),
		 "%-20s %-6s %7s %8s %11s %4s %4s  %s\n", "NAME", "STATE",
		 "VERSION", "FILES", "BYTES", "PIN", "PRIO", "SOURCE");
	return client_simple(cfg, cmd, o, true, header, client_list_row, NULL,
			     NULL);
}

int client_show(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o)
{
	return client_simple(cfg, cmd, o, false, NULL, client_show_row, NULL,
			     NULL);
}

int client_jobs(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o)
{
	struct client cl = { .cfg = cfg, .o = o, .pc.fd = -1 };
	char header[128];
	int64_t id;
	int code = client_request(&cl, cmd, &id);

	if (code)
		goto out;
	if (id && o->wait) {
		proto_reset(&cl.pc.out);
		code = client_watch(&cl, id);
		goto out;
	}
	snprintf(header, sizeof(header), "%6s  %-6s %-20s %-9s %6s %10s  %s\n",
		 "JOB", "KIND", "DATASET", "STATE", "DONE", "BYTES", "MESSAGE");
	code = client_exchange(&cl, cmd, !id, header, client_job_row, NULL);
out:
	client_release(&cl);
	return code;
}

int client_add(const struct dstage_config *cfg, const struct stager_cmd *cmd,
	       const struct stager_opts *o)
{
	return client_simple(cfg, cmd, o, false, NULL, client_added_row,
			     (void *)cmd->name, NULL);
}

int client_remove(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		  const struct stager_opts *o)
{
	int code = client_simple(cfg, cmd, o, false, NULL, NULL, NULL, NULL);

	if (!code && !o->json)
		printf("removed %s\n", o->argv[0]);
	return code;
}

int client_cancel(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		  const struct stager_opts *o)
{
	int64_t id = 0;
	int code = client_simple(cfg, cmd, o, false, NULL, NULL, NULL, &id);

	if (!code && !o->json)
		printf("job %" PRId64 " cancelled\n", id);
	return code;
}

/* --jitter S: wait a uniform random 0 to S s (ms steps) before the request,
 * saying how long on stderr (the tests read the line). */
static void client_jitter(unsigned max_s)
{
	uint64_t r, ms;
	struct timespec ts;

	if (!max_s)
		return;
	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL ^
		    (uint64_t)getpid();
	ms = r % ((uint64_t)max_s * 1000 + 1);
	fprintf(stderr,
		"stager: start jitter: waiting %" PRIu64 ".%03" PRIu64
		" s of at most %u s (--jitter)\n",
		ms / 1000, ms % 1000, max_s);
	ts.tv_sec = (time_t)(ms / 1000);
	ts.tv_nsec = (long)(ms % 1000) * 1000000;
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int client_submit(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		  const struct stager_opts *o)
{
	struct client cl = { .cfg = cfg, .o = o, .pc.fd = -1 };
	int64_t id, job = 0;
	int ret, code;
	json_t *doc;

	if (adhoc_is_path(o->argv[0]))
		return adhoc_run(cfg, cmd, o);
	client_jitter(o->jitter_s);
	if (o->shared) {
		struct stager_cmd shared = *cmd;

		shared.name = "stage.shared";
		return client_simple(cfg, &shared, o, false, NULL,
				     client_shared_row, NULL, NULL);
	}
	code = client_request(&cl, cmd, &id);

	if (code)
		goto out;
	ret = client_call(&cl, client_submit_row, &job);
	if (ret) {
		code = CLI_EXIT_DAEMON;
		goto out;
	}
	code = client_result(&cl);
	if (code)
		goto out;
	/* the row carried the job id */
	if (!job) {
		fprintf(stderr, "stager: the daemon sent no job id\n");
		code = CLI_EXIT_FAIL;
		goto out;
	}
	if (o->wait) {
		code = client_watch(&cl, job);
		goto out;
	}
	if (o->json) {
		doc = json_pack("{sIssss}", "job", (json_int_t)job, "kind",
				cmd->name, "state", "queued");
		if (jsonout_print(doc))
			code = CLI_EXIT_FAIL;
		json_decref(doc);
	} else {
		printf("job %" PRId64 " queued: %s %s (follow it with 'stager "
		       "status %" PRId64 " --wait')\n",
		       job, cmd->name, o->argv[0], job);
	}
out:
	client_release(&cl);
	return code;
}

/* ---- unpublished ---- */

/* One ask: the rows into the array *doc (emptied first). Returns the exit
 * code of the exchange. */
static int client_unpub_ask(const struct dstage_config *cfg,
			    const struct stager_cmd *cmd,
			    const struct stager_opts *o, unsigned read_ms,
			    json_t **doc)
{
	struct client cl = { .cfg = cfg, .o = o, .pc.fd = -1 };
	int ret, code;

	json_array_clear(*doc);
	if (client_connect(&cl)) {
		client_release(&cl);
		return CLI_EXIT_DAEMON;
	}
	/* every answer line within read_ms: a stuck daemon is an error */
	cl.pc.in.timeout_ms = read_ms;
	proto_add(&cl.pc.out, "cmd", cmd->name);
	if (o->since >= 0)
		proto_add_i64(&cl.pc.out, "since", o->since);
	ret = client_call(&cl, client_json_row, doc);
	code = ret ? CLI_EXIT_DAEMON : client_result(&cl);
	client_release(&cl);
	return code;
}

static const char *client_jstr(json_t *row, const char *k)
{
	return json_string_value(json_object_get(row, k)) ?: "";
}

int client_unpublished(const struct dstage_config *cfg,
		       const struct stager_cmd *cmd,
		       const struct stager_opts *o)
{
	unsigned timeout = o->timeout_ms ? o->timeout_ms : 60000;
	int64_t deadline = timeutil_mono_ms() + timeout;
	json_t *doc = json_array(), *row;
	struct timespec ts;
	size_t i;
	int code;

	if (!doc)
		return CLI_EXIT_FAIL;
	for (;;) {
		int64_t left = deadline - timeutil_mono_ms();
		unsigned read_ms = 30000;

		if (o->wait && left > 0 && left < read_ms)
			read_ms = left < 1000 ? 1000 : (unsigned)left;
		code = client_unpub_ask(cfg, cmd, o, read_ms, &doc);
		if (code || !json_array_size(doc) || !o->wait)
			break;
		left = deadline - timeutil_mono_ms();
		if (left <= 0)
			break;
		if (left > 1000)
			left = 1000;
		ts.tv_sec = left / 1000;
		ts.tv_nsec = (long)(left % 1000) * 1000000;
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	if (code)
		goto out;
	if (o->json) {
		if (jsonout_print(doc))
			code = CLI_EXIT_FAIL;
	} else if (!json_array_size(doc)) {
		printf("every checkpoint file on this node%s is in the store\n",
		       o->since >= 0 ? " changed since --since" : "");
	} else {
		printf("%-40s %-11s %10s  %s\n", "KEY", "STATE", "BYTES",
		       "CAUSE");
		json_array_foreach(doc, i, row)
		{
			/* Keys and causes hold files' names: no raw control
			 * byte reaches the terminal (issue 34). */
			char b[32], key[4 * 1024 + 1], state[64],
				err[4 * 1024 + 1];

			printf("%-40s %-11s %10s  %s\n",
			       cli_safe(client_jstr(row, "key"), key,
					sizeof(key)),
			       cli_safe(client_jstr(row, "state"), state,
					sizeof(state)),
			       cli_bytes((uint64_t)json_integer_value(
						 json_object_get(row, "size")),
					 b, sizeof(b)),
			       cli_safe(client_jstr(row, "error"), err,
					sizeof(err)));
		}
	}
	if (!code && json_array_size(doc)) {
		if (o->wait)
			fprintf(stderr,
				"stager: %zu checkpoint file%s not in the "
				"store after %u ms (--timeout)\n",
				json_array_size(doc),
				json_array_size(doc) == 1 ? "" : "s", timeout);
		code = CLI_EXIT_FAIL;
	}
out:
	json_decref(doc);
	return code;
}
