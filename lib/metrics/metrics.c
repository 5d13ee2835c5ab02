// SPDX-License-Identifier: MIT
/*
 * metrics: collectors rendered as Prometheus text, the process collector and
 * the process-wide latency histograms (see metrics.h).
 *
 * State: a registry is filled (metrics_add_collector) before its HTTP server
 * starts and only read afterwards; m->lock serialises renders (one scrape at
 * a time: collectors need not be reentrant). No other lock is taken under
 * it except the collectors' own (a leaf for them).
 *
 * The histograms are static arrays of relaxed atomics: observing is one
 * bucket search and two atomic adds; a render reads them without a lock, so
 * a scrape may see a count a moment ahead of its sum (Prometheus tolerates
 * that; every value stays monotonic). They are fed only while
 * metrics_enabled is set (metrics_http_start): without a server, the read
 * path reads no clock (metrics_start returns 0).
 *
 * Source requests (metrics_source_request) are a fixed matrix of relaxed
 * atomics, method x status: every series it can render is known at compile
 * time, so their number is bounded whatever the sources answer.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dstage/grow.h"
#include "dstage/metrics.h"
#include "dstage/timeutil.h"

struct metrics_buf {
	char *p;
	size_t len, cap;
	int err; /* first error: -ENOMEM or -EFBIG */
};

struct metrics_collector {
	metrics_collect_fn fn;
	void *arg;
};

struct metrics {
	pthread_mutex_t lock; /* one render at a time */
	struct metrics_collector col[METRICS_MAX_COLLECTORS];
	unsigned ncol; /* set before serving, then read-only */
};

/* Upper bounds of the buckets, seconds; +Inf follows. */
static const double metrics_bounds[] = { 0.0001, 0.00025, 0.0005, 0.001,
					 0.0025, 0.005,	  0.01,	  0.025,
					 0.05,	 0.1,	  0.25,	  0.5,
					 1,	 2.5,	  5,	  10 };
#define METRICS_NB (sizeof(metrics_bounds) / sizeof(metrics_bounds[0]))
/* A checkpoint's publish: up to 10 minutes (multi-GiB files); at most
 * METRICS_NB bounds. */
static const double metrics_bounds_ckpt[] = { 0.01, 0.025, 0.05, 0.1, 0.25,
					      0.5,  1,	   2.5,	 5,   10,
					      30,   60,	   120,	 300, 600 };
_Static_assert(sizeof(metrics_bounds_ckpt) <= sizeof(metrics_bounds),
	       "a histogram has at most METRICS_NB bounds");

struct metrics_histogram {
	const char *name, *help;
	const double *bounds; /* NULL: metrics_bounds */
	size_t nb; /* bounds' count when set */
	_Atomic uint64_t bucket[METRICS_NB + 1]; /* not cumulative */
	_Atomic uint64_t sum_ns;
};

static struct metrics_histogram metrics_hists[METRICS_NHIST] = {
	[METRICS_HIST_READ] = {
		.name = "dstage_cache_read_seconds",
		.help = "Time of a read through the cache, hit or miss",
	},
	[METRICS_HIST_FETCH] = {
		.name = "dstage_source_fetch_seconds",
		.help = "Time of one batch of block fetches from the source",
	},
	[METRICS_HIST_CKPT] = {
		.name = "dstage_checkpoint_publish_seconds",
		.help = "Time from a checkpoint file's close (or fsync) to its "
			"publish in the store",
		.bounds = metrics_bounds_ckpt,
		.nb = sizeof(metrics_bounds_ckpt) /
		      sizeof(metrics_bounds_ckpt[0]),
	},
};

/* Checkpoint publishes: [0] ok, [1] failed; and the bytes published. */
static _Atomic uint64_t metrics_ckpt[2], metrics_ckpt_bytes;

static time_t metrics_start_time;

/* Set by metrics_http_start once it serves; read with relaxed loads. */
static _Atomic bool metrics_enabled;

/* dstage_source_requests_total{method,status}: the methods, then
 * "other". Status index: 0 "ok", 100..599 HTTP, METRICS_ST_ERRNO + e for
 * -e (e below METRICS_NERRNO), METRICS_ST_OTHER for anything else. */
static const char *const metrics_methods[] = { "GET",  "HEAD",	 "PUT",
					       "POST", "DELETE", "other" };
#define METRICS_NMETHODS (sizeof(metrics_methods) / sizeof(metrics_methods[0]))
#define METRICS_NERRNO 160
#define METRICS_ST_ERRNO 600
#define METRICS_ST_OTHER (METRICS_ST_ERRNO + METRICS_NERRNO)
#define METRICS_NSTATUS (METRICS_ST_OTHER + 1)
static _Atomic uint64_t metrics_requests[METRICS_NMETHODS][METRICS_NSTATUS];

uint64_t metrics_now_ns(void)
{
	return (uint64_t)timeutil_mono_ns();
}

void metrics_enable(bool on)
{
	atomic_store_explicit(&metrics_enabled, on, memory_order_relaxed);
}

uint64_t metrics_start(void)
{
	if (!atomic_load_explicit(&metrics_enabled, memory_order_relaxed))
		return 0;
	return metrics_now_ns();
}

void metrics_observe_since(enum metrics_hist h, uint64_t start_ns)
{
	struct metrics_histogram *mh;
	uint64_t ns;
	double s;
	size_t i = 0;

	if ((unsigned)h >= METRICS_NHIST || !start_ns)
		return;
	ns = metrics_now_ns() - start_ns;
	s = (double)ns / 1e9;
	mh = &metrics_hists[h];
	while (i < (mh->bounds ? mh->nb : METRICS_NB) &&
	       s > (mh->bounds ? mh->bounds : metrics_bounds)[i])
		i++;
	atomic_fetch_add_explicit(&mh->bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&mh->sum_ns, ns, memory_order_relaxed);
}

void metrics_source_request(const char *method, int status)
{
	size_t m = 0, st;

	while (m < METRICS_NMETHODS - 1 &&
	       (!method || strcmp(method, metrics_methods[m])))
		m++;
	if (status >= 100 && status <= 599)
		st = (size_t)status;
	else if (status == 0)
		st = 0;
	else if (status < 0 && status > -METRICS_NERRNO)
		st = METRICS_ST_ERRNO + (size_t)-status;
	else
		st = METRICS_ST_OTHER;
	atomic_fetch_add_explicit(&metrics_requests[m][st], 1,
				  memory_order_relaxed);
}

static void metrics_printf(struct metrics_buf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void metrics_printf(struct metrics_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->err)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->err = -EINVAL;
			return;
		}
		if ((size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		if (b->len + (size_t)n + 1 > METRICS_MAX_PAGE) {
			b->err = -EFBIG;
			return;
		}
		if (grow_array(&b->p, &b->cap, b->len + (size_t)n + 1, 1, 0)) {
			b->err = -ENOMEM;
			return;
		}
	}
}

void metrics_family(struct metrics_buf *b, const char *name, const char *type,
		    const char *help)
{
	metrics_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
		       type);
}

void metrics_sample(struct metrics_buf *b, const char *name, const char *labels,
		    double v)
{
	/* %.17g: a uint64 counter up to 2^53 is exact. */
	if (labels && *labels)
		metrics_printf(b, "%s{%s} %.17g\n", name, labels, v);
	else
		metrics_printf(b, "%s %.17g\n", name, v);
}

void metrics_counter(struct metrics_buf *b, const char *name, const char *help,
		     uint64_t v)
{
	metrics_family(b, name, "counter", help);
	metrics_sample(b, name, NULL, (double)v);
}

void metrics_gauge(struct metrics_buf *b, const char *name, const char *help,
		   double v)
{
	metrics_family(b, name, "gauge", help);
	metrics_sample(b, name, NULL, v);
}

static void metrics_write_hist(struct metrics_buf *b,
			       struct metrics_histogram *mh)
{
	const double *bounds = mh->bounds ? mh->bounds : metrics_bounds;
	size_t nb = mh->bounds ? mh->nb : METRICS_NB;
	uint64_t cum = 0;

	metrics_family(b, mh->name, "histogram", mh->help);
	for (size_t i = 0; i <= nb; i++) {
		cum += atomic_load_explicit(&mh->bucket[i],
					    memory_order_relaxed);
		if (i < nb)
			metrics_printf(b, "%s_bucket{le=\"%g\"} %llu\n",
				       mh->name, bounds[i],
				       (unsigned long long)cum);
		else
			metrics_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n",
				       mh->name, (unsigned long long)cum);
	}
	metrics_printf(b, "%s_sum %.9f\n%s_count %llu\n", mh->name,
		       (double)atomic_load_explicit(&mh->sum_ns,
						    memory_order_relaxed) /
			       1e9,
		       mh->name, (unsigned long long)cum);
}

/* The source requests counted so far, one sample per (method, status)
 * seen; the family is written even when empty. */
static void metrics_write_requests(struct metrics_buf *b)
{
	metrics_family(b, "dstage_source_requests_total", "counter",
		       "Requests to sources that ended, by method and status "
		       "(HTTP status; ok or the errno's name for file "
		       "operations and requests without an answer)");
	for (size_t m = 0; m < METRICS_NMETHODS; m++)
		for (size_t st = 0; st < METRICS_NSTATUS; st++) {
			uint64_t v = atomic_load_explicit(
				&metrics_requests[m][st], memory_order_relaxed);
			const char *name = NULL;
			char code[16];

			if (!v)
				continue;
			if (st == 0) {
				name = "ok";
			} else if (st < METRICS_ST_ERRNO) {
				snprintf(code, sizeof(code), "%zu", st);
				name = code;
			} else if (st < METRICS_ST_OTHER) {
				name = strerrorname_np(
					(int)(st - METRICS_ST_ERRNO));
			}
			metrics_printf(
				b,
				"dstage_source_requests_total{method=\"%s\","
				"status=\"%s\"} %llu\n",
				metrics_methods[m], name ? name : "other",
				(unsigned long long)v);
		}
}

void metrics_ds_begin(struct metrics_ds *d, struct metrics_buf *b,
		      const char *name)
{
	*d = (struct metrics_ds){ .b = b, .name = name };
}

void metrics_ds_add(struct metrics_ds *d, const char *dataset, bool restricted,
		    double v)
{
	char label[600], esc[540];
	size_t o = 0;

	if (restricted) {
		d->restricted += v;
		d->any_restricted = true;
		return;
	}
	if (d->n++ >= METRICS_MAX_DATASETS) {
		d->other += v;
		return;
	}
	/* a label value: backslash, double quote and newline escaped */
	for (; *dataset && o + 3 < sizeof(esc); dataset++) {
		if (*dataset == '\\' || *dataset == '"' || *dataset == '\n')
			esc[o++] = '\\';
		esc[o++] = *dataset == '\n' ? 'n' : *dataset;
	}
	esc[o] = '\0';
	snprintf(label, sizeof(label), "dataset=\"%s\"", esc);
	metrics_sample(d->b, d->name, label, v);
}

void metrics_ds_end(struct metrics_ds *d)
{
	if (d->n > METRICS_MAX_DATASETS)
		metrics_sample(d->b, d->name, "dataset=\"/other\"", d->other);
	if (d->any_restricted)
		metrics_sample(d->b, d->name, "dataset=\"/restricted\"",
			       d->restricted);
}

void metrics_ckpt_publish(int ret, uint64_t bytes, uint64_t start_ns)
{
	atomic_fetch_add_explicit(&metrics_ckpt[ret ? 1 : 0], 1,
				  memory_order_relaxed);
	if (ret)
		return;
	atomic_fetch_add_explicit(&metrics_ckpt_bytes, bytes,
				  memory_order_relaxed);
	metrics_observe_since(METRICS_HIST_CKPT, start_ns);
}

static void metrics_write_ckpt(struct metrics_buf *b)
{
	static const char *const name = "dstage_checkpoint_publishes_total";

	metrics_family(b, name, "counter",
		       "Checkpoint files published to the store, by result "
		       "(a failed one is kept locally and retried)");
	metrics_printf(b, "%s{result=\"ok\"} %llu\n", name,
		       (unsigned long long)atomic_load_explicit(
			       &metrics_ckpt[0], memory_order_relaxed));
	metrics_printf(b, "%s{result=\"failed\"} %llu\n", name,
		       (unsigned long long)atomic_load_explicit(
			       &metrics_ckpt[1], memory_order_relaxed));
	metrics_counter(b, "dstage_checkpoint_published_bytes_total",
			"Bytes of checkpoint files published to the store",
			atomic_load_explicit(&metrics_ckpt_bytes,
					     memory_order_relaxed));
}

/* RSS from /proc/self/statm (pages), open descriptors from /proc/self/fd. */
static void metrics_collect_process(void *arg, struct metrics_buf *b)
{
	long page = sysconf(_SC_PAGESIZE);
	unsigned long long size = 0, rss = 0;
	unsigned nfd = 0;
	struct dirent *de;
	FILE *f;
	DIR *d;

	(void)arg;
	f = fopen("/proc/self/statm", "re");
	if (f) {
		if (fscanf(f, "%llu %llu", &size, &rss) != 2)
			rss = 0;
		fclose(f);
	}
	d = opendir("/proc/self/fd");
	if (d) {
		while ((de = readdir(d)) != NULL)
			if (de->d_name[0] != '.')
				nfd++;
		closedir(d);
		nfd--; /* the directory's own descriptor */
	}
	metrics_gauge(b, "process_resident_memory_bytes",
		      "Resident memory size, bytes",
		      (double)rss * (double)(page > 0 ? page : 4096));
	metrics_gauge(b, "process_open_fds", "Open file descriptors",
		      (double)nfd);
	metrics_gauge(b, "process_start_time_seconds",
		      "Start time of the process since the epoch, seconds",
		      (double)metrics_start_time);
	for (unsigned h = 0; h < METRICS_NHIST; h++)
		metrics_write_hist(b, &metrics_hists[h]);
	metrics_write_requests(b);
	metrics_write_ckpt(b);
}

int metrics_new(struct metrics **out)
{
	struct metrics *m = calloc(1, sizeof(*m));

	*out = NULL;
	if (!m)
		return -ENOMEM;
	pthread_mutex_init(&m->lock, NULL);
	if (!metrics_start_time)
		metrics_start_time = time(NULL);
	m->col[m->ncol++] =
		(struct metrics_collector){ metrics_collect_process, NULL };
	*out = m;
	return 0;
}

void metrics_free(struct metrics *m)
{
	if (!m)
		return;
	pthread_mutex_destroy(&m->lock);
	free(m);
}

int metrics_add_collector(struct metrics *m, metrics_collect_fn fn, void *arg)
{
	if (m->ncol == METRICS_MAX_COLLECTORS)
		return -ENOSPC;
	m->col[m->ncol++] = (struct metrics_collector){ fn, arg };
	return 0;
}

int metrics_render(struct metrics *m, char **text, size_t *len)
{
	struct metrics_buf b = { .cap = 16384 };

	*text = NULL;
	*len = 0;
	b.p = malloc(b.cap);
	if (!b.p)
		return -ENOMEM;
	b.p[0] = '\0';
	pthread_mutex_lock(&m->lock);
	for (unsigned i = 0; i < m->ncol; i++)
		m->col[i].fn(m->col[i].arg, &b);
	pthread_mutex_unlock(&m->lock);
	if (b.err) {
		free(b.p);
		return b.err;
	}
	*text = b.p;
	*len = b.len;
	return 0;
}
