// SPDX-License-Identifier: MIT
/*
 * daemon_submit: the requests that queue or cancel a job (stage, verify,
 * cancel; rows of daemon_req.c's table). A stage is refused up front when
 * the dataset, or its --files, cannot fit the cache. join=1 (dstage-csi's
 * publishes) follows a job instead of queueing another: daemon_submit_join
 * picks it and jobs_submit queues otherwise, both under
 * daemon_submit_join_lock (a leaf; no other lock is held or taken under
 * it), so two joins at once queue one job.
 *
 * Otherwise stateless, as daemon_req.c: the job table is reached through
 * daemon_jobs.c (daemon_jobs_find, daemon_jobs_wake), which takes d->lock.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "daemon_i.h"
#include "dstage/catalog.h"
#include "dstage/jobs.h"
#include "dstage/proto.h"
#include "stager.h"

/* Makes a join's look and submit one step (daemon_submit_join); a leaf. */
static pthread_mutex_t daemon_submit_join_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * The job a join=1 request follows, under daemon_submit_join_lock: with
 * after=N (show's seen_stage/seen_verify, the newest job id when the caller
 * looked; -1 without it) the newest job above N in any state, since a job
 * queued after the caller looked was queued for what it saw, even if it
 * has finished by now; else the queued or running one. true with *id set,
 * false when a new job is wanted.
 */
static bool daemon_submit_join(struct daemon_conn *c, const char *kind,
			       const char *name, int64_t after, int64_t *id)
{
	struct jobs_job j = { 0 };
	bool found = false;

	if (after >= 0 && !jobs_newest(c->jq, name, kind, &j)) {
		found = j.id > after;
		if (found)
			*id = j.id;
		jobs_job_release(&j);
		if (found)
			return true;
	}
	if (!jobs_active(c->jq, name, kind, &j)) {
		*id = j.id;
		found = true;
		jobs_job_release(&j);
	}
	return found;
}

/* Queue a stage or verify job with the request's options, or with join=1
 * answer the one already queued or running (joined=1 in the row). */
int daemon_submit_job(struct daemon_conn *c)
{
	const char *kind = c->cmd, *name = c->name;
	static const char *const keys[] = { "bandwidth",    "parallel", "mode",
					    "repair",	    "fit",	"files",
					    "fetch_missing" };
	struct proto_buf args = { 0 };
	struct catalog_dataset ds = { 0 };
	const char *par = proto_get(&c->msg, "parallel");
	const char *aft = proto_get(&c->msg, "after");
	bool join, joined = false;
	uint64_t npar, uafter = 0;
	int64_t id = 0, after = -1;
	int ret;

	if (aft && (proto_get_u64(&c->msg, "after", &uafter) ||
		    uafter > (uint64_t)JOBS_ID_MAX))
		return daemon_peer_end(
			c, -EINVAL, "after=%.40s: expected a job id or 0", aft);
	if (aft)
		after = (int64_t)uafter;
	if (par && (proto_get_u64(&c->msg, "parallel", &npar) || npar < 1 ||
		    npar > STAGER_PARALLEL_MAX))
		return daemon_peer_end(c, -EINVAL,
				       "parallel=%.40s: expected a count from "
				       "1 to %u",
				       par, STAGER_PARALLEL_MAX);
	ret = catalog_dataset_get(c->cat, name, &ds);
	if (ret == -ENOENT)
		return daemon_peer_end(c, ret, "no dataset named %s", name);
	if (ret)
		return daemon_peer_end(c, ret, NULL);
	if (ds.state != CATALOG_DS_READY) {
		catalog_dataset_release(&ds);
		return daemon_peer_end(c, -ENOENT, "%s is not registered",
				       name);
	}
	if (!strcmp(kind, "stage") && !proto_get(&c->msg, "fit")) {
		const char *files = proto_get(&c->msg, "files");
		uint64_t total = ds.bytes;

		if (files && *files) {
			uint64_t sum = 0;
			char *list = strdup(files), *save = NULL, *k;
			struct catalog_entry e;

			if (!list) {
				catalog_dataset_release(&ds);
				return daemon_peer_end(c, -ENOMEM, NULL);
			}
			for (k = strtok_r(list, "\n", &save); k;
			     k = strtok_r(NULL, "\n", &save)) {
				ret = catalog_lookup(c->cat, name, k, &e);
				if (ret || e.is_dir) {
					ret = daemon_peer_end(c, -ENOENT,
							      "%s: no file %s",
							      name, k);
					free(list);
					catalog_dataset_release(&ds);
					return ret;
				}
				sum += e.size;
			}
			free(list);
			total = sum;
		}
		bool set_by_cachectl;
		uint64_t cap = daemon_admin_capacity(c, &set_by_cachectl);

		if (total > cap) {
			char a[32], b[32];

			catalog_dataset_release(&ds);
			return daemon_peer_end(
				c, -EFBIG,
				"%s is %s, larger than the cache (%s, %s): "
				"stage part of it with --files, or add --fit "
				"to stage what fits",
				name, cli_bytes(total, a, sizeof(a)),
				cli_bytes(cap, b, sizeof(b)),
				set_by_cachectl ? "cachectl policy"
						: "cache.size");
		}
	}
	catalog_dataset_release(&ds);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		const char *v = proto_get(&c->msg, keys[i]);

		if (v)
			proto_add(&args, keys[i], v);
	}
	ret = args.err;
	if (!ret && args.data)
		args.data[args.len] = '\0'; /* proto_buf keeps room for it */
	/* join=1: follow the queued or running job of this kind for the
	 * dataset instead of queueing a second one (dstage-csi's publishes).
	 * The look and the submit are one step under daemon_submit_join_lock,
	 * a leaf taken by no one else, so two joins queue one job. */
	join = proto_get(&c->msg, "join") != NULL;
	if (join)
		pthread_mutex_lock(&daemon_submit_join_lock);
	if (!ret && join)
		joined = daemon_submit_join(c, kind, name, after, &id);
	if (!ret && !joined)
		ret = jobs_submit(c->jq, kind, name, args.data, &id);
	if (join)
		pthread_mutex_unlock(&daemon_submit_join_lock);
	proto_free(&args);
	if (ret)
		return daemon_peer_end(c, ret, "queueing the %s job: %s", kind,
				       strerror(-ret));
	if (!joined) {
		daemon_admin_audit(c, kind, name, NULL, NULL);
		daemon_jobs_wake(c->d);
	}
	daemon_peer_row(c, "row");
	proto_add_i64(&c->out, "job", id);
	proto_add(&c->out, "kind", kind);
	proto_add(&c->out, "dataset", name);
	if (joined)
		proto_add(&c->out, "joined", "1");
	ret = proto_send(c->fd, &c->out);
	return ret ? ret : daemon_peer_end(c, 0, NULL);
}

int daemon_submit_cancel(struct daemon_conn *c)
{
	int64_t id = c->job;
	struct runner_job *rj;
	enum jobs_state was;
	int ret = jobs_cancel(c->jq, id, &was);
	char sid[24];

	if (ret == -ENOENT)
		return daemon_peer_end(c, ret, "no job %" PRId64, id);
	if (ret == -EALREADY)
		return daemon_peer_end(c, ret, "job %" PRId64 " already %s", id,
				       jobs_state_name(was));
	if (ret)
		return daemon_peer_end(c, ret, NULL);
	rj = daemon_jobs_find(c->d, id);
	if (rj)
		atomic_store(&rj->cancel, true);
	runner_put(rj);
	snprintf(sid, sizeof(sid), "%" PRId64, id);
	daemon_admin_audit(c, "job.cancel", sid, jobs_state_name(was),
			   "cancelled");
	return daemon_peer_end(c, 0, NULL);
}
