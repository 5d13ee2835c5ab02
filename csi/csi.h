/* SPDX-License-Identifier: MIT */
/*
 * dstage-csi: a CSI node plugin over the node's dstagefs mount and stager
 * daemon (docs/deployment.md, "Kubernetes"). This header is the line
 * between the gRPC shell (csi_grpc.cc, the only C++) and the C core: the
 * shell copies each request into the plain structs below, calls one
 * csi_node_* function and turns its 0 or -errno into a gRPC status with
 * csi_status_code(); every decision is made in C.
 *
 * Modules, top down: main.c (options, signals) -> csi_node.c (publish,
 * unpublish, stats; the table of targets being worked on) -> csi_stage.c
 * (the stager daemon's requests: show, stage/verify with join=1, status)
 * and csi_state.c (the state directory, /proc/self/mountinfo, bind mounts,
 * re-binding stale targets) -> csi_volume.c (volume attributes, pure).
 *
 * Errors are -errno, chosen so csi_status_code maps each to the CSI spec's
 * code: -EINVAL INVALID_ARGUMENT, -ENOENT NOT_FOUND, -ENOTCONN
 * FAILED_PRECONDITION (dstagefs not mounted), -EPERM PERMISSION_DENIED,
 * -EINPROGRESS UNAVAILABLE (staging: kubelet retries), -EBUSY ABORTED
 * (another call on the target in flight), -EEXIST ALREADY_EXISTS (the
 * target holds another volume), -ETIMEDOUT DEADLINE_EXCEEDED (the volume's
 * stagingTimeout passed), -EHOSTUNREACH UNAVAILABLE (no stager daemon),
 * -EFBIG/-ENOSPC RESOURCE_EXHAUSTED, anything else INTERNAL. Every error
 * comes with a message naming its cause in the caller's buffer.
 */
#ifndef DSTAGE_CSI_H
#define DSTAGE_CSI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CSI_DRIVER_NAME "csi.dstage.io"
#define CSI_MSG_MAX 1024

/* gRPC's status codes (the same numbers in every gRPC implementation). */
enum csi_code {
	CSI_OK = 0,
	CSI_INVALID_ARGUMENT = 3,
	CSI_DEADLINE_EXCEEDED = 4,
	CSI_NOT_FOUND = 5,
	CSI_ALREADY_EXISTS = 6,
	CSI_PERMISSION_DENIED = 7,
	CSI_RESOURCE_EXHAUSTED = 8,
	CSI_FAILED_PRECONDITION = 9,
	CSI_ABORTED = 10,
	CSI_INTERNAL = 13,
	CSI_UNAVAILABLE = 14,
};

/* The spec's VolumeCapability.AccessMode.Mode numbers we look at. */
enum csi_access_mode {
	CSI_MODE_UNKNOWN = 0,
	CSI_MODE_SINGLE_NODE_WRITER = 1,
	CSI_MODE_SINGLE_NODE_READER_ONLY = 2,
	CSI_MODE_MULTI_NODE_READER_ONLY = 3,
	CSI_MODE_MULTI_NODE_SINGLE_WRITER = 4,
	CSI_MODE_MULTI_NODE_MULTI_WRITER = 5,
	CSI_MODE_SINGLE_NODE_SINGLE_WRITER = 6,
	CSI_MODE_SINGLE_NODE_MULTI_WRITER = 7,
};

enum csi_access_type {
	CSI_ACCESS_NONE = 0, /* no volume_capability, or no access type */
	CSI_ACCESS_MOUNT,
	CSI_ACCESS_BLOCK,
};

struct csi_kv {
	const char *key, *val;
};

/* NodePublishVolumeRequest, as far as dstage uses it. */
struct csi_publish_req {
	const char *volume_id;
	const char *target_path;
	enum csi_access_type access_type;
	int access_mode; /* enum csi_access_mode */
	bool readonly;
	const struct csi_kv *ctx; /* volume_context */
	size_t nctx;
};

enum csi_vol_kind {
	CSI_VOL_DATASET = 1, /* <mount>/datasets/NAME[/subPath], read-only */
	CSI_VOL_CHECKPOINTS, /* <mount>/checkpoints/JOB, read-write */
};

#define CSI_NAME_MAX 256
#define CSI_SUBPATH_MAX 1024
#define CSI_NS_MAX 64

/* A volume's attributes (volume_context), checked by csi_volume_parse. */
struct csi_volume {
	enum csi_vol_kind kind;
	char name[CSI_NAME_MAX]; /* dataset or job */
	char subpath[CSI_SUBPATH_MAX]; /* "" for the whole dataset */
	bool verify; /* dataset: verify (SHA-256) before publishing */
	unsigned timeout_s; /* stagingTimeout; 0: wait as long as it takes */
	bool ephemeral; /* csi.storage.k8s.io/ephemeral: "true" */
	char pod_namespace[CSI_NS_MAX]; /* "" when kubelet sent none */
};

/*
 * Parse and check volume_context into v. Keys: dataset or checkpoints
 * (exactly one), verify ("true"/"false"), subPath, stagingTimeout (a
 * duration: 90s, 30m, 2h); csi.storage.k8s.io/... keys from kubelet;
 * anything else is refused (a typo must not publish something else).
 * Returns 0 or -EINVAL with a message in msg.
 */
int csi_volume_parse(const struct csi_kv *kv, size_t n, struct csi_volume *v,
		     char *msg, size_t len);

/* true when ns is in list (comma- or space-separated names, or "*"). */
bool csi_volume_ns_allowed(const char *list, const char *ns);

/* snprintf into a message buffer: a cut message is as good as it gets,
 * and this says so once instead of at every call. */
__attribute__((format(printf, 3, 4))) void csi_msgf(char *msg, size_t len,
						    const char *fmt, ...);

/* The gRPC code for an error of the functions below. */
enum csi_code csi_status_code(int err);

/* ---- the daemon (csi_stage.c) ---- */

/* What `show` says about a dataset, as dstage-csi decides on it. */
struct csi_ds_info {
	char group[256]; /* "" when not restricted */
	char namespaces[1024]; /* csi_namespaces=, "" when none */
	uint64_t bytes, cached;
	bool cache_available;
	int64_t refreshed; /* the current version's registration time */
	uint64_t mismatched_files;
	char last_stage[16], last_verify[16]; /* "" when none */
	int64_t last_stage_at, last_verify_at;
	int64_t last_stage_job, last_verify_job;
	char last_stage_msg[512], last_verify_msg[512];
	int64_t active_stage, active_verify; /* job ids, 0 when none */
	/* the newest stage/verify job ids in any state when show looked
	 * (0: none; -1: a daemon that does not say) */
	int64_t seen_stage, seen_verify;
};

/* A job's progress (status job=). */
struct csi_job {
	int64_t id;
	char kind[16], state[16];
	uint64_t done, total, files_done, files_total;
	char error[512];
};

enum csi_next {
	CSI_NEXT_READY, /* publish now */
	CSI_NEXT_WAIT_STAGE, /* a stage job is queued or running */
	CSI_NEXT_START_STAGE,
	CSI_NEXT_WAIT_VERIFY,
	CSI_NEXT_START_VERIFY,
	CSI_NEXT_STAGE_FAILED, /* the last stage failed less than retry_s ago */
	CSI_NEXT_VERIFY_FAILED,
};

/*
 * What a dataset publish does next, from show's answer (pure): wait for
 * or start the stage while blocks are missing from the cache, then (with
 * verify) wait for or start a verify in the cache unless one finished
 * without mismatches since the version was registered. A stage or verify
 * that failed less than retry_s seconds before now is reported, not
 * started again (kubelet retries every few seconds).
 */
enum csi_next csi_stage_next(const struct csi_ds_info *di, bool verify,
			     int64_t now, unsigned retry_s);

/* Each request to the stager daemon (a connection of its own) fails after
 * this many seconds without an answer (-EHOSTUNREACH, "did not answer"):
 * --daemon-timeout, set once before serving. */
#define CSI_DAEMON_TIMEOUT_S 30
void csi_stage_set_timeout(unsigned s);

/* show name=NAME. -ENOENT (no such dataset), -EHOSTUNREACH (no daemon). */
int csi_stage_show(const char *socket, const char *name, struct csi_ds_info *di,
		   char *msg, size_t len);

/* stage/verify name=NAME join=1 after=AFTER (verify: mode=cache; after
 * left out when AFTER < 0). *job gets its id, *joined whether the daemon
 * answered a job queued since show's seen_* (AFTER) or one already queued
 * or running instead of queueing one. */
int csi_stage_submit(const char *socket, const char *kind, const char *name,
		     int64_t after, int64_t *job, bool *joined, char *msg,
		     size_t len);

/* status job=ID. */
int csi_stage_status(const char *socket, int64_t id, struct csi_job *j,
		     char *msg, size_t len);

/* ---- the state directory and mounts (csi_state.c) ---- */

/* One published target, as recorded in the state directory. */
struct csi_record {
	char target[4096];
	char volume_id[256];
	enum csi_vol_kind kind;
	char name[CSI_NAME_MAX];
	char subpath[CSI_SUBPATH_MAX];
	bool readonly;
};

/* Create (mode 0700) or check the state directory. 0 or -errno. */
int csi_state_init(const char *dir);

/* Write rec durably (a temporary file renamed over its name). */
int csi_state_put(const char *dir, const struct csi_record *rec);

/* The record of target: 0, -ENOENT or -errno. */
int csi_state_get(const char *dir, const char *target, struct csi_record *rec);

/* Remove target's record; -ENOENT is not an error. */
int csi_state_del(const char *dir, const char *target);

/* Call fn for each record; fn's non-zero return stops and is returned. */
int csi_state_each(const char *dir,
		   int (*fn)(void *arg, const struct csi_record *rec),
		   void *arg);

/* A target's first wait for staging (the clock of its stagingTimeout),
 * kept so that a restart of the plugin does not restart it: written
 * durably as a record is, removed (-ENOENT is not an error), and each
 * one passed to fn (a file that holds none is removed). */
int csi_state_wait_put(const char *dir, const char *target, int64_t since);
int csi_state_wait_del(const char *dir, const char *target);
int csi_state_wait_each(const char *dir,
			int (*fn)(void *arg, const char *target, int64_t since),
			void *arg);

/* Is path a mount point (its own entry in /proc/self/mountinfo)? When
 * fstype is not NULL it gets the mount's type (size 64). 1, 0 or -errno. */
int csi_state_mounted(const char *path, char *fstype);

/* Bind src at target (created when missing), then remount it read-only
 * when readonly. On failure nothing stays mounted. 0 or -errno. */
int csi_state_bind(const char *src, const char *target, bool readonly);

/* Unmount target (lazily when busy or stale) until it is no mount point,
 * then remove the directory. Neither is an error when already so. */
int csi_state_unbind(const char *target);

/* Bind src over a stale target, on top of the dead mount: a new mount at
 * the same place propagates to the pods' HostToContainer copies of it, a
 * fresh directory would not (docs/deployment.md, "Restarts"). */
int csi_state_rebind(const char *src, const char *target, bool readonly);

/* Is target's mount stale (its FUSE connection gone: ENOTCONN)? */
bool csi_state_stale(const char *target);

/* ---- the node (csi_node.c) ---- */

struct csi_node_opts {
	const char *mount; /* the node's dstagefs mount, default /data */
	const char *socket; /* the stager daemon's socket */
	const char *state_dir; /* default /run/dstage-csi */
	const char *node_id; /* default: the host name */
	unsigned
		retry_s; /* a failed stage is reported, not retried, this long */
	unsigned recheck_ms; /* how often stale targets are looked for */
};

struct csi_node;

/* Check the options, create the state directory and re-bind recorded
 * targets found stale. 0 or -errno (msg says why). */
int csi_node_open(const struct csi_node_opts *o, struct csi_node **out,
		  char *msg, size_t len);

/* Stop the re-bind thread and free n. Published targets stay. */
void csi_node_close(struct csi_node *n);

/* Start the thread that re-binds stale targets every recheck_ms. */
int csi_node_start_rebinder(struct csi_node *n);

/* Re-bind every recorded target whose mount is stale; *n_rebound (may be
 * NULL) gets how many. 0 or the first -errno. */
int csi_node_rebind_stale(struct csi_node *n, unsigned *n_rebound);

const char *csi_node_id(const struct csi_node *n);

/* Probe: 0 when dstagefs answers at the mount, else -ENOTCONN. */
int csi_node_probe(struct csi_node *n, char *msg, size_t len);

int csi_node_publish(struct csi_node *n, const struct csi_publish_req *r,
		     char *msg, size_t len);

int csi_node_unpublish(struct csi_node *n, const char *volume_id,
		       const char *target, char *msg, size_t len);

struct csi_vol_stats {
	int64_t bytes_total, bytes_used, bytes_avail;
	int64_t inodes_total, inodes_used, inodes_avail;
	bool abnormal;
	char condition[320];
};

int csi_node_stats(struct csi_node *n, const char *volume_id, const char *path,
		   struct csi_vol_stats *st, char *msg, size_t len);

/* Metrics: the counters' text (Prometheus), written to buf. */
int csi_node_metrics(struct csi_node *n, char *buf, size_t len);

/* ---- the gRPC shell (csi_grpc.cc) ---- */

struct csi_grpc;

/* Serve Identity and Node on the unix socket path (an old socket file is
 * removed first). 0 or -errno with a message on stderr. */
int csi_grpc_start(struct csi_node *n, const char *path, struct csi_grpc **out);

/* Stop serving (calls in flight finish) and free g. */
void csi_grpc_stop(struct csi_grpc *g);

#endif
