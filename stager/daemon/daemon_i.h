/* SPDX-License-Identifier: MIT */
/*
 * daemon_i: the stager daemon's private declarations, shared by
 *
 *   daemon.c       lifecycle: start, signals, stop
 *   daemon_conn.c  the socket: listening, admission, peer credentials, one
 *                  thread per connection reading requests and dispatching
 *                  them through daemon_req's table
 *   daemon_req.c   the request table and its handlers
 *   daemon_admin.c cachectl's handlers in that table, and the audit writer
 *   daemon_submit.c stage, verify (join=1 included) and cancel
 *   daemon_lifecycle.c the checkpoint requests (lifecycle.*), the
 *                  publish-retry and lifecycle thread
 *   daemon_jobs.c  the dispatcher and the table of running and recent jobs
 *   daemon_peer.c  the peer (its groups, admin or not, which datasets it
 *                  may see) and the reply lines (daemon_peer_row,
 *                  daemon_peer_end)
 *
 * Calls go down only (scripts/check-layers checks it): daemon.c ->
 * daemon_conn.c -> daemon_req.c -> daemon_admin.c, daemon_submit.c,
 * daemon_lifecycle.c, daemon_jobs.c -> daemon_peer.c, some skipping a layer (daemon.c starts
 * the dispatcher and the lifecycle thread itself). The replies are no
 * call up: daemon_peer.c, which writes them (daemon_peer_row,
 * daemon_peer_end), is the room's bottom layer, below the connection
 * thread and every handler.
 */
#ifndef DSTAGE_STAGER_DAEMON_I_H
#define DSTAGE_STAGER_DAEMON_I_H

#include <stdbool.h>
#include <sys/types.h>

#include "daemon.h"
#include "runner.h"
#include "sched.h"
#include "stager.h"

#define DAEMON_MAX_JOBS 4
#define DAEMON_RECENT 32 /* finished jobs kept for late watchers */

/* Modes of what the daemon creates (docs/stager.md): the socket needs only
 * write permission to connect(2); the lock file is the daemon's alone; a
 * socket directory it creates can be passed through, not listed. */
#define DAEMON_SOCKET_MODE 0622
#define DAEMON_LOCK_MODE 0600
#define DAEMON_DIR_MODE 0711

/* Connections open per uid (daemon_conn.c). */
struct daemon_uidcount {
	uid_t uid;
	unsigned n; /* 0: a free slot */
};

struct daemon {
	const struct dstage_config *cfg;
	struct runner_env env;
	int lfd; /* listening socket */
	int lockfd;
	_Atomic bool stop;
	pthread_mutex_t lock; /* protects the fields below; before rj->lock */
	pthread_cond_t cond; /* dispatcher wake-up: submit, job end, stop */
	struct runner_job *running[DAEMON_MAX_JOBS];
	pthread_t threads[DAEMON_MAX_JOBS];
	bool used[DAEMON_MAX_JOBS];
	unsigned n_running;
	struct runner_job *recent[DAEMON_RECENT]; /* each holds a ref */
	unsigned recent_next;
	/* set at start, read-only after */
	struct stager_daemon_limits lim;
	gid_t admin_gid; /* daemon.admin_group, when has_admin_gid */
	bool has_admin_gid;
	/* conn_lock protects n_conns, uids[] and conns; taken alone */
	pthread_mutex_t conn_lock;
	pthread_cond_t conn_cond; /* broadcast when a connection ends */
	unsigned n_conns; /* admitted, uid 0 not counted */
	struct daemon_conn *conns; /* those with a thread, until it closes */
	struct daemon_uidcount *uids; /* n_uids = lim.max_conns + 1 */
	unsigned n_uids;
	/* the accept thread's alone */
	double accept_burst; /* when accept began failing, 0: it works */
	double refuse_logged; /* when a refusal was last logged */
	unsigned refused; /* refusals since */
	/* checkpoint work (daemon_lifecycle.c); NULL without
	 * checkpoints.store; set at start, read-only after */
	struct daemon_lifecycle *lifecycle;
	/* the cache's scrub (lib/glue/cachescrub.c); NULL without a cache;
	 * set at start, read-only after (cachescrub_get takes its lock) */
	struct cachescrub *scrub;
};

/* One client connection, owned by its thread. */
struct daemon_conn {
	struct daemon *d;
	struct daemon_conn *next, *prev; /* d->conns, under d->conn_lock */
	int fd;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	char user[64];
	gid_t *groups; /* the user's groups (getgrouplist) */
	int n_groups;
	bool admin;
	struct catalog *cat;
	struct jobs *jq;
	struct proto_buf out;
	struct proto_reader in;
	struct proto_msg msg;
	/* the request being served, set by daemon_req_run */
	const char *cmd;
	const char *name; /* name=, when the request's entry needs one */
	int64_t job; /* job=, 0 when absent */
	/* The request's warning for its end line (it was done, but its
	 * audit record could not be written): "" when none; cleared as the
	 * end line is sent. This connection's thread only. */
	char warn[256];
};

/* daemon_jobs.c */
/* The dispatcher thread: runs until d->stop, then stops and joins the
 * running jobs. */
void *daemon_jobs_dispatch_thread(void *arg);
/* Wake the dispatcher (a job was queued, or stop). */
void daemon_jobs_wake(struct daemon *d);
/* A reference to the running or recent job id (runner_put it), or NULL. */
struct runner_job *daemon_jobs_find(struct daemon *d, int64_t id);
/* Cancel dataset's running jobs (in jq and in their runners). */
void daemon_jobs_cancel_dataset(struct daemon *d, struct jobs *jq,
				const char *dataset);

/* daemon_lifecycle.c: checkpoint lifecycle rules and the publish-retry
 * job (docs/checkpoints.md). start: the thread (nothing without
 * checkpoints.store); stop: join it. jobs: add its rows (retries,
 * abandoned files) to a `jobs` answer, admins only. The rest are rows of
 * daemon_req.c's table. */
int daemon_lifecycle_start(struct daemon *d);
void daemon_lifecycle_stop(struct daemon *d);
/* Free what start made, once no connection thread is left. */
void daemon_lifecycle_free(struct daemon *d);
int daemon_lifecycle_jobs(struct daemon_conn *c);
int daemon_lifecycle_list(struct daemon_conn *c);
int daemon_lifecycle_add(struct daemon_conn *c);
int daemon_lifecycle_remove(struct daemon_conn *c);
int daemon_lifecycle_run(struct daemon_conn *c);
/* unpublished [since=T]: a row per checkpoint file of this node not in
 * the store (open, unpublished, abandoned; changed at or after T), with
 * its cause. Admins only. */
int daemon_lifecycle_unpublished(struct daemon_conn *c);

/* daemon_conn.c */
/* Bind daemon.socket under its lock file. Returns 0 or -errno (logged). */
int daemon_conn_listen(struct daemon *d);
/* Raise RLIMIT_NOFILE's soft limit to what the connection caps need (up
 * to the hard limit); warn when it stays short. */
void daemon_conn_fd_limit(const struct daemon *d);
/* The accept thread: runs until d->stop. */
void *daemon_conn_accept_thread(void *arg);
/* After the accept thread ended: shut every connection down and wait (at
 * most DAEMON_CONN_STOP_WAIT s) for their threads to end. Returns 0, or
 * -EBUSY when some are still running (then d's connection state must
 * stay). */
int daemon_conn_stop(struct daemon *d);
/* daemon_peer.c */
/* The gid of group name (getgrnam_r, thread-safe). 0, -ENOENT (no such
 * group) or -errno of the lookup. */
int daemon_peer_gid(const char *name, gid_t *gid);
/* Read the peer's user's groups (getgrouplist) into c->groups. */
void daemon_peer_groups(struct daemon_conn *c);
/* uid 0, or the admin group among the peer's groups. */
bool daemon_peer_admin(const struct daemon_conn *c);
/* true when the peer has gid as its gid or one of its user's groups. */
bool daemon_peer_in_group(const struct daemon_conn *c, gid_t gid);
/* true when the peer may see a dataset of group (NULL or "": everyone's):
 * an admin, or a member of the group. An unknown group: admins only. */
bool daemon_peer_may_read(const struct daemon_conn *c, const char *group);
/* Start a reply row of type (the fields follow in c->out). */
void daemon_peer_row(struct daemon_conn *c, const char *type);
/* Why this node did not use name's shared tier, as fields of the row being
 * built: tier_CAUSE (a count), tier_CAUSE_first, _last, _what for each
 * cause seen (sharedtier_health_get; docs/stager.md), and
 * tier_health_error ("PATH: reason") when the node's file is there but
 * cannot be read. */
void daemon_peer_tier_fields(struct daemon_conn *c, const char *name);
/* Send `type=end rc=... msg=...`. Returns 0 or -errno of the send. */
int daemon_peer_end(struct daemon_conn *c, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* daemon_admin.c: cachectl's requests (rows of daemon_req.c's table; see
 * docs/cachectl.md), each answering c->msg with rows and an end line. */
int daemon_admin_status(struct daemon_conn *c);
int daemon_admin_pin(struct daemon_conn *c); /* cache.pin and cache.unpin */
int daemon_admin_quota(struct daemon_conn *c);
int daemon_admin_priority(struct daemon_conn *c);
/* cache.csi-allow: namespaces dstage-csi may give a restricted dataset */
int daemon_admin_csi_allow(struct daemon_conn *c);
int daemon_admin_policy_show(struct daemon_conn *c);
int daemon_admin_policy_set(struct daemon_conn *c);
int daemon_admin_evict(struct daemon_conn *c);
int daemon_admin_gc(struct daemon_conn *c); /* cachectl gc */
int daemon_admin_audit_list(struct daemon_conn *c);
/* The cache's capacity in force: the catalog's (cachectl policy set;
 * *from_catalog true) or cache.size. */
uint64_t daemon_admin_capacity(struct daemon_conn *c, bool *from_catalog);
/* Append an audit record for the peer's change (old, new may be NULL);
 * a failure is logged, never fatal to the change. */
void daemon_admin_audit(struct daemon_conn *c, const char *action,
			const char *target, const char *old_value,
			const char *new_value);

/* daemon_submit.c: stage and verify (queue the job, or with join=1 answer
 * the one it follows: docs/stager.md, "Protocol") and cancel, each answering
 * c->msg with rows and an end line. */
int daemon_submit_job(struct daemon_conn *c);
int daemon_submit_cancel(struct daemon_conn *c);

/* daemon_req.c: serve the request in c->msg. A non-zero return (a failed
 * send) ends the connection. */
int daemon_req_run(struct daemon_conn *c);

#endif
