// SPDX-License-Identifier: MIT
/*
 * jobs: submit, claim by priority, progress, finish, cancel (queued and
 * running), recovery after a crash, a final state never changing, two
 * connections claiming concurrently never taking the same job, listing,
 * jobs_last, a verify job's counts (kept with its end; the newest per
 * dataset; a catalog of schema 6 migrated to 7 gets their table), and the
 * proto line format used for job arguments. An idle claim (nothing
 * queued) while another connection holds the write lock answers -ENOENT
 * without waiting for the lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sqlite3.h>

#include "catalog/catalog_i.h"
#include "check.h"
#include "dstage/catalog.h"
#include "dstage/jobs.h"
#include "dstage/log.h"
#include "dstage/proto.h"

static char dir[64];
static char dbpath[128];

static int count_cb(void *arg, const struct jobs_job *j)
{
	(void)j;
	(*(int *)arg)++;
	return 0;
}

/* With another connection holding the catalog's write lock, an idle
 * claim only reads: -ENOENT, not -EBUSY after the busy bound. */
static void check_idle_claim_takes_no_lock(struct jobs *jq)
{
	struct jobs_job j = { 0 };
	sqlite3 *db = NULL;

	CHECK(sqlite3_open(dbpath, &db) == SQLITE_OK);
	CHECK(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) ==
	      SQLITE_OK);
	CHECK_INT(jobs_claim(jq, &j), -ENOENT);
	sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
	sqlite3_close(db);
}

static void test_basic(void)
{
	struct catalog *cat = NULL;
	struct jobs *jq = NULL;
	struct jobs_job j = { 0 };
	enum jobs_state was;
	int64_t a, b, c;
	unsigned n = 0;
	int cnt;

	CHECK_INT(catalog_open(dbpath, CATALOG_CREATE, &cat), 0);
	CHECK_INT(catalog_dataset_add(cat, "low", "file:///x/", NULL), 0);
	CHECK_INT(catalog_dataset_add(cat, "high", "file:///y/", NULL), 0);
	CHECK_INT(catalog_dataset_set_priority(cat, "high", 5), 0);
	CHECK_INT(jobs_open(dbpath, &jq), 0);
	if (!jq)
		goto out;

	CHECK_INT(jobs_submit(jq, "stage", "nope", NULL, &a), -ENOENT);
	CHECK_INT(jobs_submit(jq, "", "low", NULL, &a), -EINVAL);
	CHECK_INT(
		jobs_submit(jq, "stage", "low", "bandwidth=10\tparallel=2", &a),
		0);
	CHECK_INT(jobs_submit(jq, "verify", "high", NULL, &b), 0);
	CHECK_INT(jobs_submit(jq, "stage", "low", NULL, &c), 0);
	CHECK(a < b && b < c);

	CHECK_INT(jobs_get(jq, a, &j), 0);
	CHECK_STR(j.kind, "stage");
	CHECK_STR(j.dataset, "low");
	CHECK_STR(j.args, "bandwidth=10\tparallel=2");
	CHECK_INT(j.state, JOBS_QUEUED);
	jobs_job_release(&j);
	CHECK_INT(jobs_get(jq, 999, &j), -ENOENT);
	/* jobs_active: the oldest queued or running job of a kind */
	CHECK_INT(jobs_active(jq, "low", "stage", &j), 0);
	CHECK_INT(j.id, a);
	jobs_job_release(&j);
	CHECK_INT(jobs_active(jq, "low", "verify", &j), -ENOENT);
	CHECK_INT(jobs_active(jq, "nope", "stage", &j), -ENOENT);

	/* the higher priority dataset first, then oldest first */
	CHECK_INT(jobs_claim(jq, &j), 0);
	CHECK_INT(j.id, b);
	CHECK_INT(j.state, JOBS_RUNNING);
	CHECK_INT(j.priority, 5);
	jobs_job_release(&j);
	CHECK_INT(jobs_claim(jq, &j), 0);
	CHECK_INT(j.id, a);
	jobs_job_release(&j);

	CHECK_INT(jobs_progress(jq, a, 10, 100), 0);
	CHECK_INT(jobs_progress(jq, c, 10, 100), -ECANCELED); /* queued */
	CHECK_INT(jobs_progress(jq, 999, 10, 100), -ENOENT);
	CHECK_INT(jobs_get(jq, a, &j), 0);
	CHECK_INT(j.done, 10);
	CHECK_INT(j.total, 100);
	jobs_job_release(&j);

	/* cancel while running: progress and finish then fail */
	CHECK_INT(jobs_cancel(jq, a, &was), 0);
	CHECK_INT(was, JOBS_RUNNING);
	CHECK_INT(jobs_progress(jq, a, 20, 100), -ECANCELED);
	CHECK_INT(jobs_finish(jq, a, JOBS_DONE, NULL), -ECANCELED);
	CHECK_INT(jobs_cancel(jq, a, NULL), -EALREADY);
	CHECK_INT(jobs_get(jq, a, &j), 0);
	CHECK_INT(j.state, JOBS_CANCELLED);
	jobs_job_release(&j);

	CHECK_INT(jobs_finish(jq, b, JOBS_QUEUED, NULL), -EINVAL);
	CHECK_INT(jobs_finish(jq, b, JOBS_FAILED, "2 mismatches"), 0);
	CHECK_INT(jobs_finish(jq, b, JOBS_DONE, NULL), -ECANCELED);
	CHECK_INT(jobs_last(jq, "high", "verify", &j), 0);
	CHECK_INT(j.id, b);
	CHECK_STR(j.error, "2 mismatches");
	CHECK_INT(j.state, JOBS_FAILED);
	jobs_job_release(&j);
	CHECK_INT(jobs_last(jq, "low", "verify", &j), -ENOENT);
	/* a, cancelled, and b, failed, are not active; c, queued, is */
	CHECK_INT(jobs_active(jq, "high", "verify", &j), -ENOENT);
	CHECK_INT(jobs_active(jq, "low", "stage", &j), 0);
	CHECK_INT(j.id, c);
	jobs_job_release(&j);

	/* crash while running: recover queues it again */
	CHECK_INT(jobs_claim(jq, &j), 0);
	CHECK_INT(j.id, c);
	jobs_job_release(&j);
	CHECK_INT(jobs_claim(jq, &j), -ENOENT);
	check_idle_claim_takes_no_lock(jq);
	jobs_close(jq);
	jq = NULL;
	CHECK_INT(jobs_open(dbpath, &jq), 0);
	if (!jq)
		goto out;
	CHECK_INT(jobs_recover(jq, &n), 0);
	CHECK_INT(n, 1);
	CHECK_INT(jobs_claim(jq, &j), 0);
	CHECK_INT(j.id, c);
	jobs_job_release(&j);
	CHECK_INT(jobs_finish(jq, c, JOBS_DONE, NULL), 0);
	CHECK_INT(jobs_last(jq, "low", "stage", &j), 0);
	CHECK_INT(j.id, c);
	jobs_job_release(&j);

	cnt = 0;
	CHECK_INT(jobs_list(jq, UINT32_MAX, count_cb, &cnt), 0);
	CHECK_INT(cnt, 3);
	cnt = 0;
	CHECK_INT(jobs_list(jq, 1, count_cb, &cnt), 0);
	CHECK_INT(cnt, 1);
	CHECK_INT(jobs_submit(jq, "stage", "low", NULL, &a), 0);
	cnt = 0;
	CHECK_INT(jobs_list(jq, 0, count_cb, &cnt), 0);
	CHECK_INT(cnt, 1);

	/* a removed dataset leaves its jobs, without a name */
	CHECK_INT(catalog_dataset_remove(cat, "low"), 0);
	CHECK_INT(jobs_get(jq, c, &j), 0);
	CHECK_STR(j.dataset, "");
	CHECK_INT(j.dataset_id, 0);
	jobs_job_release(&j);
out:
	jobs_close(jq);
	catalog_close(cat);
}

#define RACE_JOBS 200
#define RACE_THREADS 4

static _Atomic int race_claimed[RACE_JOBS + 8];

static int counts_cb(void *arg, const char *dataset, bool restricted,
		     const struct jobs_counts *k)
{
	char *out = arg;
	size_t n = strlen(out);

	snprintf(out + n, 256 - n, "%s%s:%d/%d/%d/%d;", dataset,
		 restricted ? "(r)" : "", (int)k->damaged, (int)k->missing,
		 (int)k->mismatched, (int)k->repaired);
	return 0;
}

static void test_counts(void)
{
	struct jobs_counts k1 = { 3, 1, 2, 0 }, k2 = { 0, 0, 0, 4 };
	struct catalog *cat = NULL;
	struct jobs *jq = NULL;
	struct jobs_job j = { 0 };
	char path[160], out[256] = "";
	int64_t a, b, c;
	sqlite3 *db;

	/* a schema-6 catalog with a finished verify job: migrated to 7 */
	snprintf(path, sizeof(path), "%s/v6.db", dir);
	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	CHECK_INT(catalog_migrate(db, 6), 0);
	CHECK(sqlite3_exec(
		      db,
		      "INSERT INTO datasets(id, name, source, state,"
		      " created) VALUES (1, 'old', 'file:///o/', 1, 1);"
		      "INSERT INTO jobs(id, kind, dataset_id, state, error,"
		      " created, updated) VALUES (5, 'verify', 1, 'failed',"
		      " 'found 1 damaged block(s)', 1, 2);"
		      "INSERT INTO jobs_args VALUES (5, '');",
		      0, 0, 0) == SQLITE_OK);
	CHECK(sqlite3_exec(db, "SELECT * FROM jobs_counts", 0, 0, 0) !=
	      SQLITE_OK);
	sqlite3_close(db);
	CHECK_INT(jobs_open(path, &jq), -EPROTO); /* not migrated yet */
	CHECK_INT(catalog_open(path, 0, &cat), 0);
	CHECK_INT(catalog_schema_version(cat), CATALOG_SCHEMA_VERSION);
	CHECK_INT(jobs_open(path, &jq), 0);
	if (!jq || !cat)
		goto out;
	/* the old job has no counts: show prints its message only */
	CHECK_INT(jobs_last(jq, "old", "verify", &j), 0);
	CHECK(!j.has_counts);
	CHECK_STR(j.error, "found 1 damaged block(s)");
	jobs_job_release(&j);

	CHECK_INT(catalog_dataset_add(cat, "ds", "file:///x/", NULL), 0);
	CHECK_INT(catalog_dataset_add(cat, "sec", "file:///y/", "root"), 0);
	CHECK_INT(jobs_submit(jq, "verify", "ds", NULL, &a), 0);
	CHECK_INT(jobs_submit(jq, "verify", "ds", NULL, &b), 0);
	CHECK_INT(jobs_submit(jq, "verify", "sec", NULL, &c), 0);
	/* only a running job finishes, counts and all */
	CHECK_INT(jobs_finish_counts(jq, a, JOBS_FAILED, "x", &k1), -ECANCELED);
	CHECK_INT(jobs_get(jq, a, &j), 0);
	CHECK(!j.has_counts);
	jobs_job_release(&j);
	for (int i = 0; i < 3; i++) {
		CHECK_INT(jobs_claim(jq, &j), 0);
		jobs_job_release(&j);
	}
	CHECK_INT(jobs_finish_counts(jq, a, JOBS_FAILED, "x", &k1), 0);
	CHECK_INT(jobs_finish_counts(jq, a, JOBS_DONE, "y", &k2), -ECANCELED);
	CHECK_INT(jobs_get(jq, a, &j), 0);
	CHECK(j.has_counts && j.counts.damaged == 3 && j.counts.missing == 1 &&
	      j.counts.mismatched == 2 && j.counts.repaired == 0);
	CHECK_INT(j.state, JOBS_FAILED);
	jobs_job_release(&j);
	CHECK_INT(jobs_verify_counts(jq, 100, counts_cb, out), 0);
	CHECK_STR(out, "ds:3/1/2/0;");
	/* the newest finished one counts */
	CHECK_INT(jobs_finish_counts(jq, b, JOBS_DONE, NULL, &k2), 0);
	CHECK_INT(jobs_finish_counts(jq, c, JOBS_FAILED, NULL, &k1), 0);
	CHECK_INT(jobs_last(jq, "ds", "verify", &j), 0);
	CHECK(j.id == b && j.has_counts && j.counts.repaired == 4);
	jobs_job_release(&j);
	out[0] = '\0';
	CHECK_INT(jobs_verify_counts(jq, 100, counts_cb, out), 0);
	CHECK_STR(out, "ds:0/0/0/4;sec(r):3/1/2/0;");
	out[0] = '\0';
	CHECK_INT(jobs_verify_counts(jq, 1, counts_cb, out), 0); /* bounded */
	CHECK_STR(out, "ds:0/0/0/4;");
out:
	jobs_close(jq);
	catalog_close(cat);
	for (int k = 0; k < 3; k++) {
		static const char *const sfx[] = { "", "-wal", "-shm" };
		char p[200];

		snprintf(p, sizeof(p), "%s%s", path, sfx[k]);
		unlink(p);
	}
}

static void *race_thread(void *arg)
{
	struct jobs *jq = NULL;
	struct jobs_job j;
	int ret;

	(void)arg;
	if (jobs_open(dbpath, &jq))
		return (void *)1;
	while ((ret = jobs_claim(jq, &j)) != -ENOENT) {
		if (ret == -EBUSY)
			continue;
		if (ret)
			break;
		if (j.id > 0 && j.id < RACE_JOBS + 8)
			race_claimed[j.id]++;
		jobs_finish(jq, j.id, JOBS_DONE, NULL);
		jobs_job_release(&j);
	}
	jobs_close(jq);
	return NULL;
}

static void test_race(void)
{
	struct catalog *cat = NULL;
	struct jobs *jq = NULL;
	pthread_t t[RACE_THREADS];
	int64_t id;

	unlink(dbpath);
	CHECK_INT(catalog_open(dbpath, CATALOG_CREATE, &cat), 0);
	CHECK_INT(catalog_dataset_add(cat, "d", "file:///x/", NULL), 0);
	CHECK_INT(jobs_open(dbpath, &jq), 0);
	if (!jq)
		goto out;
	for (int i = 0; i < RACE_JOBS; i++)
		CHECK_INT(jobs_submit(jq, "stage", "d", NULL, &id), 0);
	for (int i = 0; i < RACE_THREADS; i++)
		pthread_create(&t[i], NULL, race_thread, NULL);
	for (int i = 0; i < RACE_THREADS; i++)
		pthread_join(t[i], NULL);
	for (int i = 1; i <= RACE_JOBS; i++)
		CHECK_INT(race_claimed[i], 1);
out:
	jobs_close(jq);
	catalog_close(cat);
}

static void test_proto(void)
{
	static struct proto_msg m;
	struct proto_buf b = { 0 };
	const char weird[] = "a\tb\nc\\d\re\x01\x7f=é";
	uint64_t u;
	int64_t i;

	proto_add(&b, "cmd", "stage");
	proto_add(&b, "files", weird);
	proto_add_u64(&b, "n", 18446744073709551615ull);
	proto_add_i64(&b, "neg", -5);
	proto_add(&b, "empty", "");
	CHECK_INT(proto_end(&b), 0);
	CHECK(memchr(b.data, '\n', b.len - 1) == NULL);
	CHECK_INT(proto_parse(&m, b.data, b.len - 1), 0);
	CHECK_INT(m.n, 5);
	CHECK_STR(proto_get(&m, "cmd"), "stage");
	CHECK_STR(proto_get(&m, "files"), weird);
	CHECK_STR(proto_get(&m, "empty"), "");
	CHECK(proto_get(&m, "nope") == NULL);
	CHECK_INT(proto_get_u64(&m, "n", &u), 0);
	CHECK(u == 18446744073709551615ull);
	CHECK_INT(proto_get_i64(&m, "neg", &i), 0);
	CHECK_INT(i, -5);
	CHECK_INT(proto_get_u64(&m, "neg", &u), -EINVAL);
	CHECK_INT(proto_get_u64(&m, "nope", &u), -ENOENT);
	proto_free(&b);

	proto_add(&b, "Bad", "x");
	CHECK_INT(proto_end(&b), -EINVAL);
	proto_free(&b);

	CHECK_INT(proto_parse(&m, "", 0), 0);
	CHECK_INT(m.n, 0);
	CHECK_INT(proto_parse(&m, "novalue", 7), -EINVAL);
	CHECK_INT(proto_parse(&m, "=x", 2), -EINVAL);
	CHECK_INT(proto_parse(&m, "a=\\q", 4), -EINVAL);
	CHECK_INT(proto_parse(&m, "a=\\x0", 5), -EINVAL);
	CHECK_INT(proto_parse(&m, "a=\\x00", 6), -EINVAL);
	CHECK_INT(proto_parse(&m, "a=x\t", 4), -EINVAL);
	CHECK_INT(proto_parse(&m, "a=\\", 3), -EINVAL);
	CHECK_INT(proto_parse(&m, "a=b=c\tk=\\x41", 12), 0);
	CHECK_STR(proto_get(&m, "a"), "b=c");
	CHECK_STR(proto_get(&m, "k"), "A");
}

static void test_parse_id(void)
{
	int64_t id = 0;

	CHECK_INT(jobs_parse_id("1", &id), 0);
	CHECK_INT(id, 1);
	CHECK_INT(jobs_parse_id("9223372036854775807", &id), 0);
	CHECK(id == INT64_MAX);
	CHECK_INT(jobs_parse_id("9223372036854775808", &id), -ERANGE);
	CHECK_INT(jobs_parse_id("99999999999999999999999999", &id), -ERANGE);
	CHECK_INT(jobs_parse_id("0", &id), -ERANGE);
	CHECK_INT(jobs_parse_id("000", &id), -ERANGE);
	CHECK_INT(jobs_parse_id("", &id), -EINVAL);
	CHECK_INT(jobs_parse_id(NULL, &id), -EINVAL);
	CHECK_INT(jobs_parse_id("-1", &id), -EINVAL);
	CHECK_INT(jobs_parse_id("+1", &id), -EINVAL);
	CHECK_INT(jobs_parse_id(" 1", &id), -EINVAL);
	CHECK_INT(jobs_parse_id("1x", &id), -EINVAL);
	CHECK(id == INT64_MAX); /* untouched by the failures */
}

/* A reader with a timeout gets -ETIMEDOUT when no whole line comes, keeps
 * the partial line, and returns it once its end arrives. */
static void test_proto_timeout(void)
{
	static struct proto_reader r;
	static struct proto_msg m;
	int sv[2];

	CHECK_INT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	proto_reader_init(&r, sv[0]);
	CHECK_INT(r.timeout_ms, 0);
	r.timeout_ms = 1;
	CHECK_INT(proto_read(&r, &m), -ETIMEDOUT);
	CHECK_INT((int)write(sv[1], "cmd=li", 6), 6);
	CHECK_INT(proto_read(&r, &m), -ETIMEDOUT);
	CHECK_INT((int)write(sv[1], "st\n", 3), 3);
	CHECK_INT(proto_read(&r, &m), 0);
	CHECK_STR(proto_get(&m, "cmd"), "list");
	close(sv[1]);
	CHECK_INT(proto_read(&r, &m), -EPIPE);
	close(sv[0]);
}

int main(void)
{
	log_set_level(LOG_LVL_WARN);
	snprintf(dir, sizeof(dir), "/tmp/test_jobs.XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(dbpath, sizeof(dbpath), "%s/catalog.db", dir);
	test_basic();
	test_race();
	test_counts();
	test_proto();
	test_parse_id();
	test_proto_timeout();
	for (int k = 0; k < 3; k++) {
		static const char *const sfx[] = { "", "-wal", "-shm" };
		char p[160];

		snprintf(p, sizeof(p), "%s%s", dbpath, sfx[k]);
		unlink(p);
	}
	rmdir(dir);
	return check_result();
}
