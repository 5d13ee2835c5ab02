// SPDX-License-Identifier: MIT
/*
 * dstage-csi's pure decisions (csi/csi_volume.c, csi_stage_next in
 * csi/csi_stage.c): volume attributes, namespaces, errno -> gRPC code, and
 * what a dataset publish does next from the daemon's `show`; and the
 * state directory's first-wait files (csi/csi_state.c), in a temporary
 * directory. The calls themselves are tests/integration/test_csi.py's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "csi.h"

static int parse(const char *const *kv, size_t n, struct csi_volume *v)
{
	struct csi_kv a[16];
	char msg[CSI_MSG_MAX];

	for (size_t i = 0; i < n; i++) {
		a[i].key = kv[2 * i];
		a[i].val = kv[2 * i + 1];
	}
	return csi_volume_parse(a, n, v, msg, sizeof(msg));
}

#define PARSE(v, ...)                                              \
	({                                                         \
		const char *const kv_[] = { __VA_ARGS__ };         \
		parse(kv_, sizeof(kv_) / sizeof(kv_[0]) / 2, (v)); \
	})

static void check_attributes(void)
{
	struct csi_volume v;

	CHECK_INT(PARSE(&v, "dataset", "train-set-a"), 0);
	CHECK_INT(v.kind, CSI_VOL_DATASET);
	CHECK_STR(v.name, "train-set-a");
	CHECK(v.verify);
	CHECK_INT(v.timeout_s, 0);
	CHECK_INT(PARSE(&v, "dataset", "d", "verify", "false", "subPath", "a/b",
			"stagingTimeout", "90s",
			"csi.storage.k8s.io/pod.namespace", "team-a",
			"csi.storage.k8s.io/ephemeral", "true",
			"csi.storage.k8s.io/pod.name", "p"),
		  0);
	CHECK(!v.verify);
	CHECK_STR(v.subpath, "a/b");
	CHECK_INT(v.timeout_s, 90);
	CHECK_STR(v.pod_namespace, "team-a");
	CHECK(v.ephemeral);
	CHECK_INT(PARSE(&v, "checkpoints", "job-7"), 0);
	CHECK_INT(v.kind, CSI_VOL_CHECKPOINTS);
	CHECK_STR(v.name, "job-7");

	CHECK_INT(PARSE(&v, "verify", "true"), -EINVAL); /* no dataset */
	CHECK_INT(PARSE(&v, "dataset", "a", "checkpoints", "b"), -EINVAL);
	CHECK_INT(PARSE(&v, "dataset", "a", "verify", "yes"), -EINVAL);
	CHECK_INT(PARSE(&v, "dataset", "a", "datset", "b"), -EINVAL);
	CHECK_INT(PARSE(&v, "dataset", "a", "stagingTimeout", "soon"), -EINVAL);
	CHECK_INT(PARSE(&v, "checkpoints", "j", "subPath", "x"), -EINVAL);
	static const char *const bad_names[] = { "",	    ".",   "..",
						 ".hidden", "a/b", "../etc" };
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++)
		CHECK_INT(PARSE(&v, "dataset", bad_names[i]), -EINVAL);
	static const char *const bad_sub[] = { "/abs", "..",  "a/../b", "a//b",
					       "a/",   "./a", "" };
	for (size_t i = 0; i < sizeof(bad_sub) / sizeof(bad_sub[0]); i++)
		CHECK_INT(PARSE(&v, "dataset", "d", "subPath", bad_sub[i]),
			  bad_sub[i][0] ? -EINVAL : 0);
}

static void check_namespaces(void)
{
	CHECK(csi_volume_ns_allowed("team-a,team-c", "team-a"));
	CHECK(csi_volume_ns_allowed("team-a, team-c", "team-c"));
	CHECK(!csi_volume_ns_allowed("team-a,team-c", "team"));
	CHECK(!csi_volume_ns_allowed("team-a,team-c", "team-b"));
	CHECK(!csi_volume_ns_allowed("", "team-a"));
	CHECK(csi_volume_ns_allowed("*", "anything"));
	CHECK(!csi_volume_ns_allowed("*", "")); /* no namespace sent */
}

static void check_codes(void)
{
	CHECK_INT(csi_status_code(0), CSI_OK);
	CHECK_INT(csi_status_code(-EINVAL), CSI_INVALID_ARGUMENT);
	CHECK_INT(csi_status_code(-ENOENT), CSI_NOT_FOUND);
	CHECK_INT(csi_status_code(-ENOTCONN), CSI_FAILED_PRECONDITION);
	CHECK_INT(csi_status_code(-EPERM), CSI_PERMISSION_DENIED);
	CHECK_INT(csi_status_code(-EINPROGRESS), CSI_UNAVAILABLE);
	CHECK_INT(csi_status_code(-EHOSTUNREACH), CSI_UNAVAILABLE);
	CHECK_INT(csi_status_code(-EBUSY), CSI_ABORTED);
	CHECK_INT(csi_status_code(-EEXIST), CSI_ALREADY_EXISTS);
	CHECK_INT(csi_status_code(-ETIMEDOUT), CSI_DEADLINE_EXCEEDED);
	CHECK_INT(csi_status_code(-EFBIG), CSI_RESOURCE_EXHAUSTED);
	CHECK_INT(csi_status_code(-EIO), CSI_INTERNAL);
}

static void check_next(void)
{
	struct csi_ds_info di = { .bytes = 100,
				  .cached = 0,
				  .cache_available = true,
				  .refreshed = 1000 };

	/* nothing staged: start; a running stage: wait */
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_START_STAGE);
	di.active_stage = 7;
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_WAIT_STAGE);
	di.active_stage = 0;
	/* a stage that failed 10 s ago: reported; 40 s ago: started again */
	snprintf(di.last_stage, sizeof(di.last_stage), "%s", "failed");
	di.last_stage_at = 1990;
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_STAGE_FAILED);
	CHECK_INT(csi_stage_next(&di, true, 2030, 30), CSI_NEXT_START_STAGE);
	/* a failure of an older version does not count */
	di.refreshed = 1995;
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_START_STAGE);
	di.refreshed = 1000;
	/* staged: verify, unless not asked */
	di.cached = 100;
	snprintf(di.last_stage, sizeof(di.last_stage), "%s", "done");
	CHECK_INT(csi_stage_next(&di, false, 2000, 30), CSI_NEXT_READY);
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_START_VERIFY);
	di.active_verify = 8;
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_WAIT_VERIFY);
	di.active_verify = 0;
	snprintf(di.last_verify, sizeof(di.last_verify), "%s", "done");
	di.last_verify_at = 1500;
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_READY);
	/* a verify of an older version, or one that found mismatches */
	di.refreshed = 1600;
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_START_VERIFY);
	di.refreshed = 1000;
	di.mismatched_files = 1;
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_START_VERIFY);
	snprintf(di.last_verify, sizeof(di.last_verify), "%s", "failed");
	di.last_verify_at = 1995;
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_VERIFY_FAILED);
	/* evicted since: staged again first */
	di.cached = 50;
	CHECK_INT(csi_stage_next(&di, true, 2000, 30), CSI_NEXT_START_STAGE);
	/* no cache on the daemon: the last stage's state decides */
	di.cache_available = false;
	CHECK_INT(csi_stage_next(&di, false, 2000, 30), CSI_NEXT_READY);
}

struct waits {
	unsigned n;
	char target[4][64];
	int64_t since[4];
};

static int collect_wait(void *arg, const char *target, int64_t since)
{
	struct waits *w = arg;

	if (w->n < 4) {
		snprintf(w->target[w->n], sizeof(w->target[0]), "%s", target);
		w->since[w->n] = since;
	}
	w->n++;
	return 0;
}

static int count_record(void *arg, const struct csi_record *rec)
{
	(void)rec;
	++*(unsigned *)arg;
	return 0;
}

static void check_waits(void)
{
	char dir[] = "/tmp/test_csi_core.XXXXXX", bad[64];
	struct csi_record rec = { .target = "/k/pods/p3/mount",
				  .volume_id = "pv",
				  .kind = CSI_VOL_DATASET,
				  .name = "d" };
	struct waits w = { 0 };
	unsigned nrec = 0;
	int fd;

	if (!mkdtemp(dir)) {
		CHECK(!"mkdtemp");
		return;
	}
	CHECK_INT(csi_state_init(dir), 0);
	CHECK_INT(csi_state_wait_put(dir, "/k/pods/p1/mount", 100), 0);
	CHECK_INT(csi_state_wait_put(dir, "/k/pods/p2/mount", 200), 0);
	/* a second put replaces the first */
	CHECK_INT(csi_state_wait_put(dir, "/k/pods/p1/mount", 150), 0);
	CHECK_INT(csi_state_put(dir, &rec), 0);
	/* a torn or foreign file is removed, not passed on */
	snprintf(bad, sizeof(bad), "%s/0123.wait", dir);
	fd = open(bad, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0);
	if (fd >= 0) {
		static const char torn[] = "target=/x\tsin";

		CHECK_INT((int)write(fd, torn, sizeof(torn) - 1),
			  (int)sizeof(torn) - 1);
		close(fd);
	}
	CHECK_INT(csi_state_wait_each(dir, collect_wait, &w), 0);
	CHECK_INT(w.n, 2);
	for (unsigned i = 0; i < 2 && w.n == 2; i++)
		CHECK_INT(w.since[i],
			  !strcmp(w.target[i], "/k/pods/p1/mount") ? 150 : 200);
	CHECK(access(bad, F_OK) && errno == ENOENT);
	/* records and first waits do not see each other's files */
	CHECK_INT(csi_state_each(dir, count_record, &nrec), 0);
	CHECK_INT(nrec, 1);
	CHECK_INT(csi_state_wait_del(dir, "/k/pods/p1/mount"), 0);
	CHECK_INT(csi_state_wait_del(dir, "/k/pods/p1/mount"), 0);
	memset(&w, 0, sizeof(w));
	CHECK_INT(csi_state_wait_each(dir, collect_wait, &w), 0);
	CHECK_INT(w.n, 1);
	CHECK_STR(w.target[0], "/k/pods/p2/mount");
	CHECK_INT(csi_state_wait_del(dir, "/k/pods/p2/mount"), 0);
	CHECK_INT(csi_state_del(dir, rec.target), 0);
	CHECK_INT(rmdir(dir), 0);
}

int main(void)
{
	check_attributes();
	check_namespaces();
	check_codes();
	check_next();
	check_waits();
	return check_result();
}
