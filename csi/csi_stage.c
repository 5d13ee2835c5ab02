// SPDX-License-Identifier: MIT
/*
 * csi_stage: dstage-csi's requests to the node's stager daemon (show,
 * stage or verify with join=1, status; docs/stager.md, "Protocol"), one
 * connection a request, and the decision of what a dataset publish does
 * next (csi_stage_next, pure).
 *
 * The daemon keeps the jobs: a publish never remembers a job of its own. It
 * asks `show` each time, and `join=1 after=SEEN` makes the daemon answer
 * the job of the dataset queued since show looked (SEEN: show's seen_stage
 * or seen_verify), even one finished since, or the queued or running one,
 * instead of queueing a second, so any number of publishes (two pods,
 * kubelet's retries, a restarted plugin) follow one stage: a publish that
 * saw "nothing staged" just before another's stage ran and ended does not
 * start it again. No locks: each call has its own connection.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "csi.h"
#include "dstage/proto_client.h"

/* Seconds a request to the daemon may take (--daemon-timeout); set once
 * before the server starts, read-only after. */
static unsigned csi_stage_timeout_s = CSI_DAEMON_TIMEOUT_S;

void csi_stage_set_timeout(unsigned s)
{
	csi_stage_timeout_s = s;
}

static void csi_stage_copy(char *dst, size_t size, const char *s)
{
	snprintf(dst, size, "%s", s ? s : "");
}

static int csi_stage_open(struct proto_client *pc, const char *socket,
			  char *msg, size_t len)
{
	int ret = proto_client_open(pc, "dstage-csi", socket);
	struct timeval tv = { .tv_sec = csi_stage_timeout_s };

	/* a stuck daemon must not hold a publish (and its target) forever */
	if (!ret &&
	    (setsockopt(pc->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	     setsockopt(pc->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv))))
		ret = -errno;
	if (ret) {
		csi_msgf(msg, len,
			 "the node's stager daemon does not answer at %s: %s "
			 "(is dstage-stager running on this node?)",
			 socket, strerror(-ret));
		proto_client_close(pc);
		return -EHOSTUNREACH;
	}
	return 0;
}

/* Send pc->out, rows to fn; the end line's error becomes msg. */
static int csi_stage_call(struct proto_client *pc, proto_client_row_fn fn,
			  void *arg, const char *what, char *msg, size_t len)
{
	int ret = proto_client_call(pc, fn, arg);

	if (ret == -EAGAIN || ret == -EWOULDBLOCK || ret == -ETIMEDOUT) {
		csi_msgf(msg, len,
			 "%s: the node's stager daemon did not answer within "
			 "%u s (--daemon-timeout): is it stuck or overloaded? "
			 "(stager status on the node)",
			 what, csi_stage_timeout_s);
		return -EHOSTUNREACH;
	}
	if (ret) {
		csi_msgf(msg, len, "%s: the stager daemon's connection: %s",
			 what, strerror(ret < 0 ? -ret : EIO));
		return -EHOSTUNREACH;
	}
	if (pc->rc) {
		csi_msgf(msg, len, "%s: %s", what,
			 pc->endmsg[0] ? pc->endmsg : strerror(-pc->rc));
		return pc->rc;
	}
	return 0;
}

static int csi_stage_show_row(struct proto_client *pc, void *arg)
{
	struct csi_ds_info *di = arg;
	const struct proto_msg *m = &pc->msg;
	uint64_t u;

	csi_stage_copy(di->group, sizeof(di->group), proto_get(m, "group"));
	csi_stage_copy(di->namespaces, sizeof(di->namespaces),
		       proto_get(m, "csi_namespaces"));
	proto_get_u64(m, "bytes", &di->bytes);
	proto_get_u64(m, "cached", &di->cached);
	if (!proto_get_u64(m, "cache_available", &u))
		di->cache_available = u != 0;
	proto_get_i64(m, "refreshed", &di->refreshed);
	proto_get_u64(m, "mismatched_files", &di->mismatched_files);
	csi_stage_copy(di->last_stage, sizeof(di->last_stage),
		       proto_get(m, "last_stage"));
	csi_stage_copy(di->last_verify, sizeof(di->last_verify),
		       proto_get(m, "last_verify"));
	proto_get_i64(m, "last_stage_at", &di->last_stage_at);
	proto_get_i64(m, "last_verify_at", &di->last_verify_at);
	proto_get_i64(m, "last_stage_job", &di->last_stage_job);
	csi_stage_copy(di->last_stage_msg, sizeof(di->last_stage_msg),
		       proto_get(m, "last_stage_msg"));
	csi_stage_copy(di->last_verify_msg, sizeof(di->last_verify_msg),
		       proto_get(m, "last_verify_msg"));
	proto_get_i64(m, "active_stage", &di->active_stage);
	proto_get_i64(m, "active_verify", &di->active_verify);
	di->seen_stage = di->seen_verify = -1;
	proto_get_i64(m, "seen_stage", &di->seen_stage);
	proto_get_i64(m, "seen_verify", &di->seen_verify);
	return 0;
}

int csi_stage_show(const char *socket, const char *name, struct csi_ds_info *di,
		   char *msg, size_t len)
{
	struct proto_client pc = { 0 };
	int ret;

	memset(di, 0, sizeof(*di));
	ret = csi_stage_open(&pc, socket, msg, len);
	if (ret)
		return ret;
	proto_add(&pc.out, "cmd", "show");
	proto_add(&pc.out, "name", name);
	ret = csi_stage_call(&pc, csi_stage_show_row, di, "dataset", msg, len);
	if (ret == -ENOENT)
		csi_msgf(msg, len,
			 "no dataset named %s on this node's stager "
			 "(stager add NAME URL registers it)",
			 name);
	proto_client_close(&pc);
	return ret;
}

struct csi_stage_sub {
	int64_t job;
	bool joined;
};

static int csi_stage_submit_row(struct proto_client *pc, void *arg)
{
	struct csi_stage_sub *s = arg;

	proto_get_i64(&pc->msg, "job", &s->job);
	s->joined = proto_get(&pc->msg, "joined") != NULL;
	return 0;
}

int csi_stage_submit(const char *socket, const char *kind, const char *name,
		     int64_t after, int64_t *job, bool *joined, char *msg,
		     size_t len)
{
	struct proto_client pc = { 0 };
	struct csi_stage_sub s = { 0 };
	char what[320];
	int ret;

	ret = csi_stage_open(&pc, socket, msg, len);
	if (ret)
		return ret;
	proto_add(&pc.out, "cmd", kind);
	proto_add(&pc.out, "name", name);
	proto_add(&pc.out, "join", "1");
	if (after >= 0)
		proto_add_i64(&pc.out, "after", after);
	if (!strcmp(kind, "verify"))
		proto_add(&pc.out, "mode", "cache");
	snprintf(what, sizeof(what), "%s %s", kind, name);
	ret = csi_stage_call(&pc, csi_stage_submit_row, &s, what, msg, len);
	proto_client_close(&pc);
	if (!ret && !s.job) {
		csi_msgf(msg, len, "%s: the daemon answered no job", what);
		ret = -EPROTO;
	}
	*job = s.job;
	*joined = s.joined;
	return ret;
}

static int csi_stage_status_row(struct proto_client *pc, void *arg)
{
	struct csi_job *j = arg;
	const struct proto_msg *m = &pc->msg;

	proto_get_i64(m, "job", &j->id);
	csi_stage_copy(j->kind, sizeof(j->kind), proto_get(m, "kind"));
	csi_stage_copy(j->state, sizeof(j->state), proto_get(m, "state"));
	proto_get_u64(m, "done", &j->done);
	proto_get_u64(m, "total", &j->total);
	proto_get_u64(m, "files_done", &j->files_done);
	proto_get_u64(m, "files_total", &j->files_total);
	csi_stage_copy(j->error, sizeof(j->error), proto_get(m, "error"));
	return 0;
}

int csi_stage_status(const char *socket, int64_t id, struct csi_job *j,
		     char *msg, size_t len)
{
	struct proto_client pc = { 0 };
	int ret;

	memset(j, 0, sizeof(*j));
	ret = csi_stage_open(&pc, socket, msg, len);
	if (ret)
		return ret;
	proto_add(&pc.out, "cmd", "status");
	proto_add_i64(&pc.out, "job", id);
	ret = csi_stage_call(&pc, csi_stage_status_row, j, "job status", msg,
			     len);
	proto_client_close(&pc);
	return ret;
}

/* A final job of this version that failed less than retry_s ago. */
static bool csi_stage_failed_recently(const char *state, int64_t at,
				      const struct csi_ds_info *di, int64_t now,
				      unsigned retry_s)
{
	return !strcmp(state, "failed") && at >= di->refreshed &&
	       now - at < (int64_t)retry_s;
}

enum csi_next csi_stage_next(const struct csi_ds_info *di, bool verify,
			     int64_t now, unsigned retry_s)
{
	bool staged = di->cache_available ? di->cached >= di->bytes
					  : !strcmp(di->last_stage, "done");

	if (di->active_stage)
		return CSI_NEXT_WAIT_STAGE;
	if (!staged) {
		if (csi_stage_failed_recently(di->last_stage, di->last_stage_at,
					      di, now, retry_s))
			return CSI_NEXT_STAGE_FAILED;
		return CSI_NEXT_START_STAGE;
	}
	if (!verify)
		return CSI_NEXT_READY;
	if (di->active_verify)
		return CSI_NEXT_WAIT_VERIFY;
	if (!strcmp(di->last_verify, "done") &&
	    di->last_verify_at >= di->refreshed && !di->mismatched_files)
		return CSI_NEXT_READY;
	if (csi_stage_failed_recently(di->last_verify, di->last_verify_at, di,
				      now, retry_s))
		return CSI_NEXT_VERIFY_FAILED;
	return CSI_NEXT_START_VERIFY;
}
