// SPDX-License-Identifier: MIT
/*
 * cmds: cachectl's commands, each one request to the stager daemon
 * (stager/daemon/daemon_admin.c serves them) and its printers: text for
 * people, --json (one JSON document on stdout) for scripts.
 *
 * Stateless: main.c has checked the arguments' shape; the daemon checks
 * them again, and the caller's rights, before it changes anything.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cachectl.h"
#include "dstage/sharedtier.h"
#include "jsonout.h"

/* Fields that are strings in --json, whatever they look like. */
static const char *const cmds_strs[] = {
	"name",
	"group",
	"kind",
	"dataset",
	"state",
	"user",
	"action",
	"target",
	"old",
	"new",
	"capacity_from",
	"high_from",
	"low_from",
	"verify_reads",
	"tier_untrusted_what",
	"tier_not_regular_what",
	"tier_mismatch_what",
	"tier_unreadable_what",
	"tier_health_error",
	NULL,
};

/* Rows kept for --json or for printing after the end line. */
struct cmds_doc {
	json_t *cache; /* status: the "cache" row */
	json_t *rows; /* other rows (status: datasets) */
	json_t *jobs; /* status: jobs */
	int err;
};

static int cmds_collect(struct conn *cn, void *arg)
{
	struct cmds_doc *d = arg;
	const char *type = conn_get(cn, "type");
	json_t *o = jsonout_row(&cn->pc.msg, cmds_strs);

	if (!o)
		return -ENOMEM;
	if (!strcmp(type, "cache")) {
		json_decref(d->cache);
		d->cache = o;
		return 0;
	}
	return json_array_append_new(strcmp(type, "job") ? d->rows : d->jobs, o)
		       ? -ENOMEM
		       : 0;
}

static void cmds_doc_free(struct cmds_doc *d)
{
	json_decref(d->cache);
	json_decref(d->rows);
	json_decref(d->jobs);
}

static int cmds_doc_init(struct cmds_doc *d)
{
	d->cache = NULL;
	d->rows = json_array();
	d->jobs = json_array();
	return d->rows && d->jobs ? 0 : -ENOMEM;
}

static uint64_t cmds_ju(json_t *o, const char *k)
{
	json_int_t v = json_integer_value(json_object_get(o, k));

	return v > 0 ? (uint64_t)v : 0;
}

static const char *cmds_js(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k)) ?: "";
}

/* One exchange: open, add the request's fields (fill), call, collect. */
typedef void (*cmds_fill_fn)(struct conn *cn, const struct cachectl_opts *o);

static int cmds_exchange(const struct dstage_config *cfg, const char *req,
			 const struct cachectl_opts *o, cmds_fill_fn fill,
			 struct cmds_doc *d)
{
	struct conn cn;
	int ret = cmds_doc_init(d);

	if (ret)
		return CLI_EXIT_FAIL;
	ret = conn_open(&cn, cfg, req);
	if (ret) {
		conn_close(&cn);
		return CLI_EXIT_DAEMON;
	}
	if (fill)
		fill(&cn, o);
	ret = conn_call(&cn, cmds_collect, d);
	if (ret == -ENOMEM) {
		fprintf(stderr, "cachectl: out of memory\n");
		ret = CLI_EXIT_FAIL;
	} else {
		ret = ret ? CLI_EXIT_DAEMON : conn_result(&cn);
	}
	conn_close(&cn);
	return ret;
}

/* Prints a command's answer as text: its one row, or (audit) all rows. */
typedef void (*cmds_text_fn)(json_t *r, const struct cachectl_opts *o);

/*
 * One exchange whose answer is its first row (need names it in the error
 * when the daemon sent none), or all its rows when need is NULL; printed
 * as --json or handed to text.
 */
static int cmds_rows(const struct dstage_config *cfg, const char *req,
		     const struct cachectl_opts *o, cmds_fill_fn fill,
		     const char *need, cmds_text_fn text)
{
	struct cmds_doc d = { 0 };
	json_t *r;
	int code;

	code = cmds_exchange(cfg, req, o, fill, &d);
	r = need ? json_array_get(d.rows, 0) : d.rows;
	if (code == CLI_EXIT_OK && !r) {
		fprintf(stderr, "cachectl: the daemon sent no %s row\n",
			need ? need : "result");
		code = CLI_EXIT_FAIL;
	}
	if (code == CLI_EXIT_OK && o->json) {
		if (jsonout_print(r))
			code = CLI_EXIT_FAIL;
	} else if (code == CLI_EXIT_OK) {
		text(r, o);
	}
	cmds_doc_free(&d);
	return code;
}

/* ---- status ---- */

/* The scrub's lines of status (the cache row's scrub_* fields). */
static void cmds_scrub_text(json_t *c)
{
	uint64_t total = cmds_ju(c, "scrub_bytes_total");
	uint64_t done = cmds_ju(c, "scrub_bytes");
	char a[32], b[32], t[64];

	printf("verify reads: %s\n", cmds_js(c, "verify_reads"));
	if (!cmds_ju(c, "scrub_enabled")) {
		printf("scrub: off (cache.scrub_rate = 0)\n");
		return;
	}
	cli_time((int64_t)cmds_ju(c, "scrub_pass_start"), t, sizeof(t));
	printf("scrub: %s at %s/s, pass %s %s: %" PRIu64 "/%" PRIu64
	       " objects, %s of %s (%.1f%%)\n",
	       cmds_ju(c, "scrub_running")	  ? "running"
	       : cmds_ju(c, "scrub_waiting_lock") ? "waiting (another process "
						    "scrubs this cache)"
						  : "idle",
	       cli_bytes(cmds_ju(c, "scrub_rate"), a, sizeof(a)),
	       cmds_ju(c, "scrub_running") ? "started" : "last started", t,
	       cmds_ju(c, "scrub_objects"), cmds_ju(c, "scrub_objects_total"),
	       cli_bytes(done, b, sizeof(b)), cli_bytes(total, a, sizeof(a)),
	       total ? 100.0 * (double)(done < total ? done : total) /
			       (double)total
		     : 0.0);
	cli_time((int64_t)cmds_ju(c, "scrub_pass_end"), t, sizeof(t));
	printf("scrub: %" PRIu64 " passes done (last ended %s); damaged blocks "
	       "found %" PRIu64 ", repaired %" PRIu64 ", not repaired %" PRIu64
	       "\n",
	       cmds_ju(c, "scrub_passes"), t, cmds_ju(c, "scrub_damaged"),
	       cmds_ju(c, "scrub_repaired"), cmds_ju(c, "scrub_unrepaired"));
}

static void cmds_status_text(struct cmds_doc *d)
{
	json_t *c = d->cache, *r;
	uint64_t cap = cmds_ju(c, "capacity"), used = cmds_ju(c, "used");
	uint64_t hits = cmds_ju(c, "hits"), misses = cmds_ju(c, "misses");
	char a[32], b[32], e[32];
	size_t i;

	printf("capacity:  %s (from %s)   used %s (%.1f%%)   free %s\n",
	       cli_bytes(cap, a, sizeof(a)), cmds_js(c, "capacity_from"),
	       cli_bytes(used, b, sizeof(b)),
	       cap ? 100.0 * (double)used / (double)cap : 0.0,
	       cli_bytes(cmds_ju(c, "free"), e, sizeof(e)));
	printf("watermarks: high %" PRIu64 "%% (%s), low %" PRIu64 "%% (%s)\n",
	       cmds_ju(c, "high_watermark"),
	       cli_bytes(cmds_ju(c, "high_bytes"), a, sizeof(a)),
	       cmds_ju(c, "low_watermark"),
	       cli_bytes(cmds_ju(c, "low_bytes"), b, sizeof(b)));
	printf("since start: hit ratio %.1f%% (%" PRIu64 " hits, %" PRIu64
	       " misses), %s from cache, %s from source, %" PRIu64
	       " evictions\n",
	       hits + misses ? 100.0 * (double)hits / (double)(hits + misses)
			     : 0.0,
	       hits, misses,
	       cli_bytes(cmds_ju(c, "bytes_from_cache"), a, sizeof(a)),
	       cli_bytes(cmds_ju(c, "bytes_from_source"), b, sizeof(b)),
	       cmds_ju(c, "evictions"));
	if (!cmds_ju(c, "cache_available"))
		printf("(the daemon has no cache open: see its log)\n");
	printf("jobs: %" PRIu64 " running, %" PRIu64 " queued\n",
	       cmds_ju(c, "jobs_running"), cmds_ju(c, "jobs_queued"));
	cmds_scrub_text(c);
	printf("\n%-24s %11s %11s %6s %6s %11s %8s  %s\n", "DATASET", "SIZE",
	       "CACHED", "SHARE", "PINNED", "QUOTA", "PRIORITY", "LAST ACCESS");
	json_array_foreach(d->rows, i, r)
	{
		uint64_t cached = cmds_ju(r, "cached"),
			 quota = cmds_ju(r, "quota");
		char t[64];

		cli_time((int64_t)cmds_ju(r, "last_access"), t, sizeof(t));
		printf("%-24s %11s %11s %5.1f%% %6s %11s %8" JSON_INTEGER_FORMAT
		       "  %s\n",
		       cmds_js(r, "name"),
		       cli_bytes(cmds_ju(r, "bytes"), a, sizeof(a)),
		       cli_bytes(cached, b, sizeof(b)),
		       used ? 100.0 * (double)cached / (double)used : 0.0,
		       cmds_ju(r, "pinned") ? "yes" : "no",
		       quota ? cli_bytes(quota, e, sizeof(e)) : "none",
		       json_integer_value(json_object_get(r, "priority")), t);
	}
	json_array_foreach(d->rows, i, r)
	{
		char safe[1024];

		/* the node's, the same in every row: said once */
		if (*cmds_js(r, "tier_health_error")) {
			printf("shared tier status unknown (%s)\n",
			       cli_safe(cmds_js(r, "tier_health_error"), safe,
					sizeof(safe)));
			break;
		}
	}
	json_array_foreach(d->rows, i, r)
	{
		char k[64], p[300];

		for (int j = 0; j < SHAREDTIER_CAUSES; j++) {
			const char *cause = sharedtier_cause_name(j);
			uint64_t n;
			int64_t first, last;

			snprintf(k, sizeof(k), "tier_%s", cause);
			n = cmds_ju(r, k);
			snprintf(k, sizeof(k), "tier_%s_first", cause);
			first = (int64_t)cmds_ju(r, k);
			snprintf(k, sizeof(k), "tier_%s_last", cause);
			last = (int64_t)cmds_ju(r, k);
			snprintf(k, sizeof(k), "tier_%s_what", cause);
			snprintf(p, sizeof(p), "%s: shared tier ",
				 cmds_js(r, "name"));
			cli_tier_line(p, cause, n, first, last, cmds_js(r, k));
		}
	}
	json_array_foreach(d->jobs, i, r)
	{
		if (!i)
			printf("\n%6s  %-6s %-24s %-8s %11s\n", "JOB", "KIND",
			       "DATASET", "STATE", "DONE");
		printf("%6" PRIu64 "  %-6s %-24s %-8s %11s\n",
		       cmds_ju(r, "job"), cmds_js(r, "kind"),
		       cmds_js(r, "dataset"), cmds_js(r, "state"),
		       cli_bytes(cmds_ju(r, "done"), a, sizeof(a)));
	}
}

int cmds_status(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
		const struct cachectl_opts *o)
{
	struct cmds_doc d = { 0 };
	int code = cmds_exchange(cfg, "cache.status", o, NULL, &d);

	(void)cmd;
	if (code == CLI_EXIT_OK && !d.cache) {
		fprintf(stderr, "cachectl: the daemon sent no cache row\n");
		code = CLI_EXIT_FAIL;
	}
	if (code == CLI_EXIT_OK && o->json) {
		json_t *doc = json_copy(d.cache);

		if (!doc || json_object_set(doc, "datasets", d.rows) ||
		    json_object_set(doc, "jobs", d.jobs) || jsonout_print(doc))
			code = CLI_EXIT_FAIL;
		json_decref(doc);
	} else if (code == CLI_EXIT_OK) {
		cmds_status_text(&d);
	}
	cmds_doc_free(&d);
	return code;
}

/* ---- pin, unpin, quota, priority ---- */

static void cmds_dataset_fill(struct conn *cn, const struct cachectl_opts *o)
{
	proto_add(&cn->pc.out, "name", o->argv[0]);
	if (o->argc > 1)
		proto_add(&cn->pc.out, "quota", o->argv[1]); /* or priority */
}

static void cmds_priority_fill(struct conn *cn, const struct cachectl_opts *o)
{
	proto_add(&cn->pc.out, "name", o->argv[0]);
	proto_add(&cn->pc.out, "priority", o->argv[1]);
}

static void cmds_csi_allow_fill(struct conn *cn, const struct cachectl_opts *o)
{
	proto_add(&cn->pc.out, "name", o->argv[0]);
	proto_add(&cn->pc.out, "namespaces", o->argv[1]);
}

int cmds_dataset(const struct dstage_config *cfg,
		 const struct cachectl_cmd *cmd, const struct cachectl_opts *o)
{
	struct cmds_doc d = { 0 };
	char req[32];
	int code;

	snprintf(req, sizeof(req), "cache.%s", cmd->name);
	code = cmds_exchange(cfg, req, o,
			     !strcmp(cmd->name, "priority") ? cmds_priority_fill
			     : !strcmp(cmd->name, "csi-allow")
				     ? cmds_csi_allow_fill
				     : cmds_dataset_fill,
			     &d);
	if (code == CLI_EXIT_OK && o->json) {
		json_t *doc = json_pack("{s:b,s:s,s:s}", "ok", 1, "command",
					cmd->name, "dataset", o->argv[0]);

		if (!doc || jsonout_print(doc))
			code = CLI_EXIT_FAIL;
		json_decref(doc);
	} else if (code == CLI_EXIT_OK) {
		printf("%s %s%s%s: done\n", cmd->name, o->argv[0],
		       o->argc > 1 ? " " : "", o->argc > 1 ? o->argv[1] : "");
	}
	cmds_doc_free(&d);
	return code;
}

/* ---- policy ---- */

static void cmds_policy_fill(struct conn *cn, const struct cachectl_opts *o)
{
	if (o->capacity)
		proto_add(&cn->pc.out, "capacity", o->capacity);
	if (o->high)
		proto_add(&cn->pc.out, "high", o->high);
	if (o->low)
		proto_add(&cn->pc.out, "low", o->low);
}

static void cmds_policy_text(json_t *r, const struct cachectl_opts *o)
{
	char a[32], b[32], e[32];

	(void)o;
	printf("capacity        %s (%" PRIu64 " bytes, from %s)\n",
	       cli_bytes(cmds_ju(r, "capacity"), a, sizeof(a)),
	       cmds_ju(r, "capacity"), cmds_js(r, "capacity_from"));
	printf("high_watermark  %" PRIu64 "%% (%s, from %s)\n",
	       cmds_ju(r, "high_watermark"),
	       cli_bytes(cmds_ju(r, "high_bytes"), b, sizeof(b)),
	       cmds_js(r, "high_from"));
	printf("low_watermark   %" PRIu64 "%% (%s, from %s)\n",
	       cmds_ju(r, "low_watermark"),
	       cli_bytes(cmds_ju(r, "low_bytes"), e, sizeof(e)),
	       cmds_js(r, "low_from"));
	printf("eviction order  unpinned only; lowest priority first, "
	       "then least recently used; a dataset over its quota "
	       "from itself\n");
}

int cmds_policy(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
		const struct cachectl_opts *o)
{
	bool set = !strcmp(o->argv[0], "set");

	(void)cmd;
	return cmds_rows(cfg, set ? "cache.policy.set" : "cache.policy", o,
			 set ? cmds_policy_fill : NULL, "policy",
			 cmds_policy_text);
}

/* ---- evict ---- */

/* The files evict and gc left because readers have them open, if any. */
static void cmds_busy_text(json_t *r, const char *again)
{
	char b[32];

	if (cmds_ju(r, "busy_files"))
		printf("left %" PRIu64 " files (%s) that readers "
		       "have open; %s once they close\n",
		       cmds_ju(r, "busy_files"),
		       cli_bytes(cmds_ju(r, "busy_bytes"), b, sizeof(b)),
		       again);
}

static void cmds_evict_fill(struct conn *cn, const struct cachectl_opts *o)
{
	if (o->argc)
		proto_add(&cn->pc.out, "name", o->argv[0]);
	if (o->to_low)
		proto_add(&cn->pc.out, "to_low", "1");
	if (o->older_than)
		proto_add_i64(&cn->pc.out, "older_than", o->older_than);
	if (o->dry_run)
		proto_add(&cn->pc.out, "dry_run", "1");
}

static void cmds_evict_text(json_t *r, const struct cachectl_opts *o)
{
	char a[32];

	printf("%s %s%s\n", o->dry_run ? "would free" : "freed",
	       cli_bytes(cmds_ju(r, "freed"), a, sizeof(a)),
	       o->to_low       ? " (down to the low watermark)"
	       : o->older_than ? " (files not read since)"
			       : "");
	cmds_busy_text(r, "evict again");
}

int cmds_evict(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
	       const struct cachectl_opts *o)
{
	(void)cmd;
	return cmds_rows(cfg, "cache.evict", o, cmds_evict_fill, "result",
			 cmds_evict_text);
}

/* ---- gc ---- */

static void cmds_gc_fill(struct conn *cn, const struct cachectl_opts *o)
{
	if (o->older_than)
		proto_add_i64(&cn->pc.out, "min_age", o->older_than);
	if (o->dry_run)
		proto_add(&cn->pc.out, "dry_run", "1");
}

static void cmds_gc_text(json_t *r, const struct cachectl_opts *o)
{
	const char *verb = o->dry_run ? "would remove" : "removed";
	char a[32], l[32];

	printf("%s %" PRIu64 " cache files no catalog entry owns (%s)\n"
	       "%s %" PRIu64 " catalog block rows of %" PRIu64
	       " objects whose cache files are gone\n"
	       "%s %" PRIu64 " staging leftovers older than %" PRIu64
	       "s (%s)\n",
	       verb, cmds_ju(r, "orphan_files"),
	       cli_bytes(cmds_ju(r, "orphan_bytes"), a, sizeof(a)), verb,
	       cmds_ju(r, "stale_rows"), cmds_ju(r, "stale_objects"), verb,
	       cmds_ju(r, "leftover_files"), cmds_ju(r, "min_age"),
	       cli_bytes(cmds_ju(r, "leftover_bytes"), l, sizeof(l)));
	cmds_busy_text(r, "run gc again");
}

int cmds_gc(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
	    const struct cachectl_opts *o)
{
	(void)cmd;
	return cmds_rows(cfg, "cache.gc", o, cmds_gc_fill, "result",
			 cmds_gc_text);
}

/* ---- audit ---- */

static void cmds_audit_fill(struct conn *cn, const struct cachectl_opts *o)
{
	if (o->since)
		proto_add_i64(&cn->pc.out, "since", o->since);
	if (o->user)
		proto_add(&cn->pc.out, "user", o->user);
}

static void cmds_audit_text(json_t *rows, const struct cachectl_opts *o)
{
	json_t *r;
	size_t i;

	(void)o;
	json_array_foreach(rows, i, r)
	{
		char t[64];

		cli_time(json_integer_value(json_object_get(r, "time")), t,
			 sizeof(t));
		printf("%s  uid %" PRIu64 " (%s)  %s %s", t, cmds_ju(r, "uid"),
		       *cmds_js(r, "user") ? cmds_js(r, "user") : "?",
		       cmds_js(r, "action"), cmds_js(r, "target"));
		if (*cmds_js(r, "old") || *cmds_js(r, "new"))
			printf(": %s -> %s",
			       *cmds_js(r, "old") ? cmds_js(r, "old") : "-",
			       *cmds_js(r, "new") ? cmds_js(r, "new") : "-");
		printf("\n");
	}
}

int cmds_audit(const struct dstage_config *cfg, const struct cachectl_cmd *cmd,
	       const struct cachectl_opts *o)
{
	(void)cmd;
	return cmds_rows(cfg, "audit", o, cmds_audit_fill, NULL,
			 cmds_audit_text);
}
