// SPDX-License-Identifier: MIT
/*
 * csi_node: the Node service's decisions. A publish goes
 *
 *   checks (request, attributes, access mode) -> claim the target
 *   -> dstagefs answers at --mount? -> already published here? (idempotent)
 *   -> dataset: show -> may this pod's namespace have it? -> staged and
 *      verified? else start or join the stage/verify, answer UNAVAILABLE
 *      with its progress (kubelet retries) -> record, bind, remount ro
 *   -> checkpoints: make <mount>/checkpoints/JOB (1777, sticky, as
 *      checkpoints/ itself) when missing -> record, bind read-write
 *
 * and an unpublish unmounts whatever is mounted at the target (all of a
 * stack), removes the directory and the record. Both are idempotent: the
 * truth is /proc/self/mountinfo and the state directory, never memory, so
 * a plugin killed between publish and unpublish unpublishes as before.
 *
 * The re-binder thread looks at every recorded target every recheck_ms and
 * binds the mount's source again over a target found stale (ENOTCONN:
 * dstagefs restarted under it).
 *
 * The stagingTimeout clock: a target's first wait for staging is kept in
 * memory and in the state directory (csi_state_wait_put), loaded again by
 * csi_node_open, so a plugin restarted while a pod waits answers
 * DEADLINE_EXCEEDED at the original deadline. A target's first wait goes
 * when its publish succeeds, fails with a code kubelet does not retry as
 * a wait (anything but UNAVAILABLE and DEADLINE_EXCEEDED), or it is
 * unpublished; at most CSI_WAITS_MAX are kept, the oldest dropped first.
 *
 * Locks: n->lock guards the table of targets in flight (one call at a
 * time on a target; a second gets ABORTED), the first-wait times and
 * their files (one small write when a wait starts) and the counters; it
 * is never held across a daemon request or a mount. The re-binder claims
 * a target like a call does. ABORTED is per target, not per volume_id:
 * kubelet publishes one volume at several targets at once (a PVC shared
 * by pods of the node), which are independent bind mounts, and serializes
 * its calls per target itself; two calls on one target at once mean a CO
 * that lost track of one (docs/deployment.md, "Errors").
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "csi.h"
#include "dstage/log.h"
#include "dstage/timeutil.h"

#define CSI_WAITS_MAX 4096 /* first-wait times kept */

struct csi_wait {
	struct csi_wait *next;
	int64_t since; /* real time, s */
	char target[]; /* owned */
};

struct csi_busy {
	struct csi_busy *next;
	char target[];
};

/* Failure causes counted (csi_status_code's, by name). */
enum { CSI_CAUSES = 17 };

struct csi_node {
	char mount[PATH_MAX], socket[PATH_MAX], state_dir[PATH_MAX];
	char node_id[256];
	unsigned retry_s, recheck_ms;

	pthread_mutex_t lock;
	pthread_cond_t cond; /* the re-binder's sleep; stop */
	bool stop, rebinder_started;
	pthread_t rebinder;
	struct csi_busy *busy;
	struct csi_wait *waits;
	unsigned nwaits;
	/* counters */
	uint64_t published, unpublished, waiting, rebound;
	uint64_t failed[CSI_CAUSES];
};

static const char *const csi_code_names[CSI_CAUSES] = {
	"ok",
	"cancelled",
	"unknown",
	"invalid_argument",
	"deadline",
	"not_found",
	"already_exists",
	"permission_denied",
	"exhausted",
	"failed_precondition",
	"aborted",
	"out_of_range",
	"unimplemented",
	"internal",
	"unavailable",
	"data_loss",
	"unauthenticated",
};

/* ---- targets in flight, first waits ---- */

static int csi_node_claim(struct csi_node *n, const char *target)
{
	size_t len = strlen(target);
	struct csi_busy *b;

	pthread_mutex_lock(&n->lock);
	for (b = n->busy; b; b = b->next)
		if (!strcmp(b->target, target)) {
			pthread_mutex_unlock(&n->lock);
			return -EBUSY;
		}
	b = malloc(sizeof(*b) + len + 1);
	if (!b) {
		pthread_mutex_unlock(&n->lock);
		return -ENOMEM;
	}
	memcpy(b->target, target, len + 1);
	b->next = n->busy;
	n->busy = b;
	pthread_mutex_unlock(&n->lock);
	return 0;
}

static void csi_node_release(struct csi_node *n, const char *target)
{
	pthread_mutex_lock(&n->lock);
	for (struct csi_busy **p = &n->busy; *p; p = &(*p)->next)
		if (!strcmp((*p)->target, target)) {
			struct csi_busy *b = *p;

			*p = b->next;
			free(b);
			break;
		}
	pthread_mutex_unlock(&n->lock);
}

/* Add target's first wait at since (n->lock held); when the table is
 * full the oldest one goes (most likely a pod deleted while it waited,
 * whose target kubelet never unpublished), file and all. */
static struct csi_wait *csi_node_wait_add(struct csi_node *n,
					  const char *target, int64_t since)
{
	size_t len = strlen(target);
	struct csi_wait *w, **oldest = NULL;

	if (n->nwaits >= CSI_WAITS_MAX) {
		for (struct csi_wait **p = &n->waits; *p; p = &(*p)->next)
			if (!oldest || (*p)->since < (*oldest)->since)
				oldest = p;
		w = *oldest;
		*oldest = w->next;
		csi_state_wait_del(n->state_dir, w->target);
		free(w);
		n->nwaits--;
	}
	w = malloc(sizeof(*w) + len + 1);
	if (!w)
		return NULL;
	memcpy(w->target, target, len + 1);
	w->since = since;
	w->next = n->waits;
	n->waits = w;
	n->nwaits++;
	return w;
}

/* Seconds target has waited for staging (0 at its first wait, which is
 * written to the state directory: a restart goes on counting from it). */
static int64_t csi_node_waited(struct csi_node *n, const char *target,
			       int64_t now)
{
	struct csi_wait *w;
	int64_t ret = 0;
	int err;

	pthread_mutex_lock(&n->lock);
	for (w = n->waits; w; w = w->next)
		if (!strcmp(w->target, target))
			break;
	if (w) {
		ret = now - w->since;
	} else if (csi_node_wait_add(n, target, now)) {
		err = csi_state_wait_put(n->state_dir, target, now);
		if (err)
			log_warn("dstage-csi: recording the first wait of %s "
				 "in %s: %s (a restart restarts its "
				 "stagingTimeout)",
				 target, n->state_dir, strerror(-err));
	}
	n->waiting++;
	pthread_mutex_unlock(&n->lock);
	return ret;
}

static void csi_node_unwait(struct csi_node *n, const char *target)
{
	pthread_mutex_lock(&n->lock);
	for (struct csi_wait **p = &n->waits; *p; p = &(*p)->next)
		if (!strcmp((*p)->target, target)) {
			struct csi_wait *w = *p;

			*p = w->next;
			csi_state_wait_del(n->state_dir, w->target);
			free(w);
			n->nwaits--;
			break;
		}
	pthread_mutex_unlock(&n->lock);
}

/* The first waits a plugin before this one recorded (csi_node_open). */
static int csi_node_load_wait_cb(void *arg, const char *target, int64_t since)
{
	struct csi_node *n = arg;

	pthread_mutex_lock(&n->lock);
	if (!csi_node_wait_add(n, target, since))
		log_warn("dstage-csi: no memory for the first wait of %s",
			 target);
	pthread_mutex_unlock(&n->lock);
	return 0;
}

/* ---- the mount ---- */

static int csi_node_check_mount(struct csi_node *n, char *msg, size_t len)
{
	char fstype[64] = "", sub[PATH_MAX + 16];
	struct stat st;
	int m = csi_state_mounted(n->mount, fstype);

	if (m < 0) {
		csi_msgf(msg, len, "reading /proc/self/mountinfo: %s",
			 strerror(-m));
		return m;
	}
	if (!m || !strstr(fstype, "dstagefs")) {
		csi_msgf(msg, len,
			 "dstagefs is not mounted at %s (%s): start dstagefs "
			 "on the node (the DaemonSet's dstagefs container), or "
			 "give dstage-csi --mount DIR",
			 n->mount, m ? fstype : "not a mount point");
		return -ENOTCONN;
	}
	snprintf(sub, sizeof(sub), "%s/datasets", n->mount);
	if (stat(sub, &st)) {
		csi_msgf(msg, len, "dstagefs at %s does not answer: %s: %s",
			 n->mount, sub, strerror(errno));
		return -ENOTCONN;
	}
	return 0;
}

int csi_node_probe(struct csi_node *n, char *msg, size_t len)
{
	return csi_node_check_mount(n, msg, len);
}

static int csi_node_source(const struct csi_node *n,
			   const struct csi_record *rec, char *out, size_t len)
{
	int w;

	if (rec->kind == CSI_VOL_CHECKPOINTS)
		w = snprintf(out, len, "%s/checkpoints/%s", n->mount,
			     rec->name);
	else if (rec->subpath[0])
		w = snprintf(out, len, "%s/datasets/%s/%s", n->mount, rec->name,
			     rec->subpath);
	else
		w = snprintf(out, len, "%s/datasets/%s", n->mount, rec->name);
	return w < 0 || (size_t)w >= len ? -ENAMETOOLONG : 0;
}

/* ---- staging ---- */

static void csi_node_pct(char *out, size_t len, const struct csi_job *j)
{
	if (j->total)
		snprintf(out, len,
			 "%.1f%% (%" PRIu64 " of %" PRIu64 " bytes, %" PRIu64
			 "/%" PRIu64 " files)",
			 100.0 * (double)j->done / (double)j->total, j->done,
			 j->total, j->files_done, j->files_total);
	else
		snprintf(out, len, "no bytes counted yet");
}

/* Wait for, or start, what csi_stage_next says; always an error: the
 * answer the pod sees in its events while it waits. */
static int csi_node_staging(struct csi_node *n, const struct csi_publish_req *r,
			    const struct csi_volume *v,
			    const struct csi_ds_info *di, enum csi_next next,
			    char *msg, size_t len)
{
	const char *kind =
		next == CSI_NEXT_WAIT_STAGE || next == CSI_NEXT_START_STAGE
			? "stage"
			: "verify";
	int64_t id = next == CSI_NEXT_WAIT_STAGE    ? di->active_stage
		     : next == CSI_NEXT_WAIT_VERIFY ? di->active_verify
						    : 0;
	int64_t now = timeutil_real_s(), waited;
	bool joined = true;
	struct csi_job j;
	char pct[160];
	int ret;

	if (!id) {
		ret = csi_stage_submit(n->socket, kind, v->name,
				       next == CSI_NEXT_START_STAGE
					       ? di->seen_stage
					       : di->seen_verify,
				       &id, &joined, msg, len);
		if (ret)
			return ret;
		if (!joined)
			log_info("dstage-csi: %s %s: started job %" PRId64
				 " for %s",
				 kind, v->name, id, r->target_path);
	}
	ret = csi_stage_status(n->socket, id, &j, msg, len);
	if (ret)
		return ret == -ENOENT ? -EINPROGRESS : ret;
	csi_node_pct(pct, sizeof(pct), &j);
	waited = csi_node_waited(n, r->target_path, now);
	if (v->timeout_s && waited > (int64_t)v->timeout_s) {
		csi_msgf(msg, len,
			 "dataset %s: still not ready after the volume's "
			 "stagingTimeout of %us: %s job %" PRId64 " is %s, %s; "
			 "the job goes on (stager status %" PRId64 ")",
			 v->name, v->timeout_s, kind, id, j.state, pct, id);
		return -ETIMEDOUT;
	}
	csi_msgf(msg, len,
		 "dataset %s is being %s on this node: job %" PRId64
		 " %s%s, %s; waited %" PRId64 "s; the pod starts when it is "
		 "done (stager status %" PRId64 ")",
		 v->name, !strcmp(kind, "stage") ? "staged" : "verified", id,
		 j.state, !joined ? " (started now)" : "", pct, waited, id);
	return -EINPROGRESS;
}

/* A dataset: may the pod have it, and is it ready? 0 when it is. */
static int csi_node_dataset(struct csi_node *n, const struct csi_publish_req *r,
			    const struct csi_volume *v, char *msg, size_t len)
{
	struct csi_ds_info di;
	enum csi_next next;
	int ret = csi_stage_show(n->socket, v->name, &di, msg, len);

	if (ret)
		return ret;
	if (di.group[0] &&
	    !csi_volume_ns_allowed(di.namespaces, v->pod_namespace)) {
		if (!v->pod_namespace[0])
			csi_msgf(msg, len,
				 "dataset %s is restricted to group %s and "
				 "kubelet sent no pod namespace (the "
				 "CSIDriver needs podInfoOnMount: true)",
				 v->name, di.group);
		else
			csi_msgf(msg, len,
				 "dataset %s is restricted to group %s; "
				 "namespace %s is not allowed it (an admin: "
				 "cachectl csi-allow %s %s)",
				 v->name, di.group, v->pod_namespace, v->name,
				 v->pod_namespace);
		return -EPERM;
	}
	next = csi_stage_next(&di, v->verify, timeutil_real_s(), n->retry_s);
	switch (next) {
	case CSI_NEXT_READY:
		return 0;
	case CSI_NEXT_STAGE_FAILED:
		csi_msgf(msg, len,
			 "staging dataset %s failed (job %" PRId64 "): %s; "
			 "tried again after %us",
			 v->name, di.last_stage_job, di.last_stage_msg,
			 n->retry_s);
		return -EIO;
	case CSI_NEXT_VERIFY_FAILED:
		csi_msgf(msg, len,
			 "verifying dataset %s failed: %s; tried again after "
			 "%us",
			 v->name, di.last_verify_msg, n->retry_s);
		return -EIO;
	default:
		return csi_node_staging(n, r, v, &di, next, msg, len);
	}
}

/* <mount>/checkpoints/JOB, made sticky and open to all as checkpoints/ is
 * when missing: each file belongs to the uid that writes it. */
static int csi_node_ckpt_dir(const char *src, char *msg, size_t len)
{
	struct stat st;

	if (!stat(src, &st)) {
		if (S_ISDIR(st.st_mode))
			return 0;
		csi_msgf(msg, len, "%s is not a directory", src);
		return -EINVAL;
	}
	if (errno != ENOENT || (mkdir(src, 01777) && errno != EEXIST) ||
	    chmod(src, 01777)) {
		csi_msgf(msg, len, "making %s: %s", src, strerror(errno));
		return -errno;
	}
	return 0;
}

static bool csi_node_writer(int mode)
{
	return mode != CSI_MODE_SINGLE_NODE_READER_ONLY &&
	       mode != CSI_MODE_MULTI_NODE_READER_ONLY;
}

static bool csi_node_same(const struct csi_record *a,
			  const struct csi_record *b)
{
	return !strcmp(a->volume_id, b->volume_id) && a->kind == b->kind &&
	       !strcmp(a->name, b->name) && !strcmp(a->subpath, b->subpath) &&
	       a->readonly == b->readonly;
}

static int csi_node_publish_1(struct csi_node *n,
			      const struct csi_publish_req *r,
			      struct csi_volume *v, char *msg, size_t len)
{
	struct csi_record rec = { 0 }, old;
	char src[PATH_MAX + CSI_SUBPATH_MAX + 64];
	struct stat st;
	int ret, m;

	ret = csi_node_check_mount(n, msg, len);
	if (ret)
		return ret;
	snprintf(rec.target, sizeof(rec.target), "%s", r->target_path);
	snprintf(rec.volume_id, sizeof(rec.volume_id), "%s", r->volume_id);
	rec.kind = v->kind;
	snprintf(rec.name, sizeof(rec.name), "%s", v->name);
	snprintf(rec.subpath, sizeof(rec.subpath), "%s", v->subpath);
	rec.readonly = v->kind == CSI_VOL_DATASET || r->readonly ||
		       !csi_node_writer(r->access_mode);
	if (csi_node_source(n, &rec, src, sizeof(src))) {
		csi_msgf(msg, len, "the volume's path is too long");
		return -EINVAL;
	}

	m = csi_state_mounted(r->target_path, NULL);
	if (m < 0) {
		csi_msgf(msg, len, "reading /proc/self/mountinfo: %s",
			 strerror(-m));
		return m;
	}
	if (m) {
		if (csi_state_get(n->state_dir, r->target_path, &old) ||
		    !csi_node_same(&old, &rec)) {
			csi_msgf(msg, len,
				 "%s is already a mount point, not of volume "
				 "%s as asked now",
				 r->target_path, r->volume_id);
			return -EEXIST;
		}
		if (!csi_state_stale(r->target_path)) {
			/* published: idempotent (read-only again, in case a
			 * plugin killed between the bind and its remount
			 * left it writable) */
			if (rec.readonly &&
			    mount(NULL, r->target_path, NULL,
				  MS_REMOUNT | MS_BIND | MS_RDONLY, NULL)) {
				ret = -errno;
				csi_msgf(msg, len,
					 "remounting %s read-only: %s",
					 r->target_path, strerror(-ret));
				return ret;
			}
			return 0;
		}
		ret = csi_state_rebind(src, r->target_path, rec.readonly);
		if (ret)
			csi_msgf(msg, len, "re-binding stale %s: %s",
				 r->target_path, strerror(-ret));
		return ret;
	}
	if (v->kind == CSI_VOL_DATASET) {
		ret = csi_node_dataset(n, r, v, msg, len);
		if (ret)
			return ret;
		if (stat(src, &st)) {
			ret = -errno;
			csi_msgf(msg, len, "dataset %s: %s: %s", v->name, src,
				 strerror(-ret));
			return ret == -ENOENT || ret == -ENOTDIR ? -ENOENT
								 : ret;
		}
		if (!S_ISDIR(st.st_mode)) {
			csi_msgf(msg, len,
				 "dataset %s: subPath %s is a file, not a "
				 "directory",
				 v->name, v->subpath);
			return -EINVAL;
		}
	} else {
		ret = csi_node_ckpt_dir(src, msg, len);
		if (ret)
			return ret;
	}
	ret = csi_state_put(n->state_dir, &rec);
	if (ret) {
		csi_msgf(msg, len, "recording %s in %s: %s", r->target_path,
			 n->state_dir, strerror(-ret));
		return ret;
	}
	ret = csi_state_bind(src, r->target_path, rec.readonly);
	if (ret) {
		csi_msgf(msg, len, "bind-mounting %s at %s: %s", src,
			 r->target_path, strerror(-ret));
		csi_state_del(n->state_dir, r->target_path);
		return ret;
	}
	log_info("dstage-csi: published %s %s%s%s at %s (%s)",
		 v->kind == CSI_VOL_DATASET ? "dataset" : "checkpoints",
		 v->name, v->subpath[0] ? "/" : "", v->subpath, r->target_path,
		 rec.readonly ? "read-only" : "read-write");
	return 0;
}

static int csi_node_check_req(const struct csi_publish_req *r,
			      struct csi_volume *v, char *msg, size_t len)
{
	int ret;

	if (!r->volume_id || !*r->volume_id) {
		csi_msgf(msg, len, "no volume_id");
		return -EINVAL;
	}
	if (!r->target_path || r->target_path[0] != '/') {
		csi_msgf(msg, len, "no target_path (an absolute path)%s%.200s",
			 r->target_path && *r->target_path ? ": " : "",
			 r->target_path ? r->target_path : "");
		return -EINVAL;
	}
	if (r->access_type == CSI_ACCESS_NONE) {
		csi_msgf(msg, len, "no volume_capability (mount access)");
		return -EINVAL;
	}
	if (r->access_type == CSI_ACCESS_BLOCK) {
		csi_msgf(msg, len,
			 "block access: dstage volumes are "
			 "directories (mount access only)");
		return -EINVAL;
	}
	ret = csi_volume_parse(r->ctx, r->nctx, v, msg, len);
	if (ret)
		return ret;
	if (v->kind == CSI_VOL_DATASET && csi_node_writer(r->access_mode) &&
	    !r->readonly) {
		csi_msgf(msg, len,
			 "dataset %s is read-only: ask for a reader-only "
			 "access mode (ReadOnlyMany) or readOnly: true, not "
			 "write access (mode %d)",
			 v->name, r->access_mode);
		return -EINVAL;
	}
	return 0;
}

/* Does a publish that answered err still wait (its clock going on)? The
 * codes kubelet retries as a wait: staging, the daemon restarting, the
 * stagingTimeout passed (until the job is done). */
static bool csi_node_waiting(int err)
{
	enum csi_code c = csi_status_code(err);

	return err && (c == CSI_UNAVAILABLE || c == CSI_DEADLINE_EXCEEDED);
}

static void csi_node_count(struct csi_node *n, int ret, uint64_t *ok)
{
	enum csi_code c = csi_status_code(ret);

	pthread_mutex_lock(&n->lock);
	if (!ret)
		(*ok)++;
	else if ((unsigned)c < CSI_CAUSES)
		n->failed[c]++;
	pthread_mutex_unlock(&n->lock);
}

int csi_node_publish(struct csi_node *n, const struct csi_publish_req *r,
		     char *msg, size_t len)
{
	struct csi_volume v;
	int ret;

	msg[0] = '\0';
	ret = csi_node_check_req(r, &v, msg, len);
	if (!ret) {
		ret = csi_node_claim(n, r->target_path);
		if (ret == -EBUSY)
			csi_msgf(msg, len,
				 "another call on %s is in progress; try again",
				 r->target_path);
	}
	if (!ret) {
		ret = csi_node_publish_1(n, r, &v, msg, len);
		csi_node_release(n, r->target_path);
		if (!csi_node_waiting(ret))
			csi_node_unwait(n, r->target_path);
	}
	if (ret == -EINPROGRESS)
		log_info("dstage-csi: publish %s: %s", r->volume_id, msg);
	else if (ret)
		log_warn("dstage-csi: publish %s at %s: %s",
			 r->volume_id ? r->volume_id : "",
			 r->target_path ? r->target_path : "", msg);
	csi_node_count(n, ret, &n->published);
	return ret;
}

int csi_node_unpublish(struct csi_node *n, const char *volume_id,
		       const char *target, char *msg, size_t len)
{
	int ret;

	msg[0] = '\0';
	if (!volume_id || !*volume_id) {
		csi_msgf(msg, len, "no volume_id");
		ret = -EINVAL;
	} else if (!target || target[0] != '/') {
		csi_msgf(msg, len, "no target_path (an absolute path)");
		ret = -EINVAL;
	} else {
		ret = csi_node_claim(n, target);
		if (ret == -EBUSY)
			csi_msgf(msg, len,
				 "another call on %s is in progress; try again",
				 target);
	}
	if (!ret) {
		ret = csi_state_unbind(target);
		if (ret)
			csi_msgf(msg, len, "unmounting %s: %s", target,
				 strerror(-ret));
		else
			ret = csi_state_del(n->state_dir, target);
		csi_node_unwait(n, target);
		csi_node_release(n, target);
		if (!ret)
			log_info("dstage-csi: unpublished %s from %s",
				 volume_id, target);
	}
	if (ret)
		log_warn("dstage-csi: unpublish %s: %s",
			 volume_id ? volume_id : "", msg);
	csi_node_count(n, ret, &n->unpublished);
	return ret;
}

int csi_node_stats(struct csi_node *n, const char *volume_id, const char *path,
		   struct csi_vol_stats *st, char *msg, size_t len)
{
	struct csi_record rec;
	struct statvfs sv;

	memset(st, 0, sizeof(*st));
	if (!volume_id || !*volume_id || !path || path[0] != '/') {
		csi_msgf(msg, len, "no volume_id or volume_path");
		return -EINVAL;
	}
	if (csi_state_get(n->state_dir, path, &rec) ||
	    strcmp(rec.volume_id, volume_id)) {
		csi_msgf(msg, len, "volume %s is not published at %s",
			 volume_id, path);
		return -ENOENT;
	}
	if (statvfs(path, &sv)) {
		if (errno != ENOTCONN) {
			csi_msgf(msg, len, "%s: %s", path, strerror(errno));
			return -errno;
		}
		st->abnormal = true;
		snprintf(st->condition, sizeof(st->condition),
			 "dstagefs's connection is gone under %s (restarted?); "
			 "dstage-csi binds it again within %ums",
			 path, n->recheck_ms);
		return 0;
	}
	st->bytes_total = (int64_t)(sv.f_blocks * sv.f_frsize);
	st->bytes_avail = (int64_t)(sv.f_bavail * sv.f_frsize);
	st->bytes_used = (int64_t)((sv.f_blocks - sv.f_bfree) * sv.f_frsize);
	st->inodes_total = (int64_t)sv.f_files;
	st->inodes_avail = (int64_t)sv.f_favail;
	st->inodes_used = (int64_t)(sv.f_files - sv.f_ffree);
	snprintf(st->condition, sizeof(st->condition), "%s %s",
		 rec.kind == CSI_VOL_DATASET ? "dataset" : "checkpoints",
		 rec.name);
	return 0;
}

/* ---- restarts ---- */

struct csi_node_rb {
	struct csi_node *n;
	unsigned rebound;
	int err;
};

static int csi_node_rebind_cb(void *arg, const struct csi_record *rec)
{
	struct csi_node_rb *rb = arg;
	struct csi_node *n = rb->n;
	char src[PATH_MAX + CSI_SUBPATH_MAX + 64];
	int ret;

	if (csi_state_mounted(rec->target, NULL) != 1 ||
	    !csi_state_stale(rec->target))
		return 0;
	if (csi_node_claim(n, rec->target))
		return 0; /* a call is on it */
	ret = csi_node_source(n, rec, src, sizeof(src));
	if (!ret)
		ret = csi_state_rebind(src, rec->target, rec->readonly);
	csi_node_release(n, rec->target);
	if (ret) {
		log_warn("dstage-csi: re-binding stale %s from %s: %s",
			 rec->target, src, strerror(-ret));
		if (!rb->err)
			rb->err = ret;
		return 0;
	}
	log_info("dstage-csi: %s was stale (dstagefs restarted): bound %s "
		 "again",
		 rec->target, src);
	rb->rebound++;
	pthread_mutex_lock(&n->lock);
	n->rebound++;
	pthread_mutex_unlock(&n->lock);
	return 0;
}

int csi_node_rebind_stale(struct csi_node *n, unsigned *n_rebound)
{
	struct csi_node_rb rb = { .n = n };
	char msg[CSI_MSG_MAX];
	int ret;

	if (n_rebound)
		*n_rebound = 0;
	if (csi_node_check_mount(n, msg, sizeof(msg)))
		return -ENOTCONN; /* nothing to bind from yet */
	ret = csi_state_each(n->state_dir, csi_node_rebind_cb, &rb);
	if (n_rebound)
		*n_rebound = rb.rebound;
	return ret ? ret : rb.err;
}

/* Records of targets that are no mount point: a plugin killed between
 * its record and its bind, or a node rebooted (kubelet publishes again). */
static int csi_node_drop_cb(void *arg, const struct csi_record *rec)
{
	struct csi_node *n = arg;

	if (csi_state_mounted(rec->target, NULL) == 0) {
		log_info("dstage-csi: %s is not mounted: its record is dropped",
			 rec->target);
		csi_state_del(n->state_dir, rec->target);
	}
	return 0;
}

static void *csi_node_rebinder(void *arg)
{
	struct csi_node *n = arg;

	pthread_mutex_lock(&n->lock);
	while (!n->stop) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += n->recheck_ms / 1000;
		ts.tv_nsec += (long)(n->recheck_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&n->cond, &n->lock, &ts);
		if (n->stop)
			break;
		pthread_mutex_unlock(&n->lock);
		csi_node_rebind_stale(n, NULL);
		pthread_mutex_lock(&n->lock);
	}
	pthread_mutex_unlock(&n->lock);
	return NULL;
}

int csi_node_start_rebinder(struct csi_node *n)
{
	int ret = pthread_create(&n->rebinder, NULL, csi_node_rebinder, n);

	if (ret)
		return -ret;
	n->rebinder_started = true;
	return 0;
}

/* ---- life ---- */

int csi_node_open(const struct csi_node_opts *o, struct csi_node **out,
		  char *msg, size_t len)
{
	struct csi_node *n = calloc(1, sizeof(*n));
	pthread_condattr_t ca;
	int ret;

	if (!n)
		return -ENOMEM;
	if (!o->mount || o->mount[0] != '/' || !o->socket || !o->state_dir ||
	    o->state_dir[0] != '/') {
		csi_msgf(msg, len,
			 "--mount and --state-dir must be absolute "
			 "paths, and the daemon's socket set");
		free(n);
		return -EINVAL;
	}
	snprintf(n->mount, sizeof(n->mount), "%s", o->mount);
	/* no trailing '/': mountinfo has none */
	for (size_t l = strlen(n->mount); l > 1 && n->mount[l - 1] == '/';)
		n->mount[--l] = '\0';
	snprintf(n->socket, sizeof(n->socket), "%s", o->socket);
	snprintf(n->state_dir, sizeof(n->state_dir), "%s", o->state_dir);
	if (o->node_id && *o->node_id)
		snprintf(n->node_id, sizeof(n->node_id), "%s", o->node_id);
	else if (gethostname(n->node_id, sizeof(n->node_id) - 1))
		snprintf(n->node_id, sizeof(n->node_id), "unknown");
	n->retry_s = o->retry_s ? o->retry_s : 30;
	n->recheck_ms = o->recheck_ms ? o->recheck_ms : 5000;
	pthread_mutex_init(&n->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&n->cond, &ca);
	pthread_condattr_destroy(&ca);
	ret = csi_state_init(n->state_dir);
	if (ret) {
		csi_msgf(msg, len,
			 "state directory %s: %s (it must be root's, mode "
			 "0700)",
			 n->state_dir, strerror(-ret));
		csi_node_close(n);
		return ret;
	}
	csi_state_each(n->state_dir, csi_node_drop_cb, n);
	csi_state_wait_each(n->state_dir, csi_node_load_wait_cb, n);
	*out = n;
	return 0;
}

void csi_node_close(struct csi_node *n)
{
	if (!n)
		return;
	pthread_mutex_lock(&n->lock);
	n->stop = true;
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);
	if (n->rebinder_started)
		pthread_join(n->rebinder, NULL);
	while (n->waits) {
		struct csi_wait *w = n->waits;

		n->waits = w->next;
		free(w);
	}
	while (n->busy) {
		struct csi_busy *b = n->busy;

		n->busy = b->next;
		free(b);
	}
	pthread_cond_destroy(&n->cond);
	pthread_mutex_destroy(&n->lock);
	free(n);
}

const char *csi_node_id(const struct csi_node *n)
{
	return n->node_id;
}

int csi_node_metrics(struct csi_node *n, char *buf, size_t len)
{
	size_t off = 0;
	int w;

	pthread_mutex_lock(&n->lock);
	w = snprintf(buf, len,
		     "# TYPE dstage_csi_publishes_total counter\n"
		     "dstage_csi_publishes_total %" PRIu64 "\n"
		     "# TYPE dstage_csi_unpublishes_total counter\n"
		     "dstage_csi_unpublishes_total %" PRIu64 "\n"
		     "# TYPE dstage_csi_staging_waits_total counter\n"
		     "dstage_csi_staging_waits_total %" PRIu64 "\n"
		     "# TYPE dstage_csi_rebinds_total counter\n"
		     "dstage_csi_rebinds_total %" PRIu64 "\n"
		     "# TYPE dstage_csi_failures_total counter\n",
		     n->published, n->unpublished, n->waiting, n->rebound);
	if (w > 0)
		off = (size_t)w < len ? (size_t)w : len;
	for (unsigned i = 1; i < CSI_CAUSES && off < len; i++) {
		w = snprintf(buf + off, len - off,
			     "dstage_csi_failures_total{cause=\"%s\"} %" PRIu64
			     "\n",
			     csi_code_names[i], n->failed[i]);
		if (w > 0)
			off += (size_t)w < len - off ? (size_t)w : len - off;
	}
	pthread_mutex_unlock(&n->lock);
	return 0;
}
