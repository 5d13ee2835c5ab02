/* SPDX-License-Identifier: MIT */
/*
 * metrics: a small registry of collectors rendered as the Prometheus text
 * exposition format (version 0.0.4), the process-wide latency histograms the
 * cache observes into. metrics_http.h serves it over HTTP.
 *
 * A collector is a function called at every scrape that writes its families
 * with metrics_counter/metrics_gauge/metrics_family+metrics_sample. Values
 * are read at scrape time (cache_get_stats, objstore_get_total_stats, /proc),
 * so the read path pays only the histograms' relaxed atomic adds.
 *
 * Labels are constant strings chosen by the collectors (states, kinds,
 * methods, status codes), with one exception: a dataset's name, which the
 * catalog bounds, and of which a collector exports at most
 * METRICS_MAX_DATASETS series, folding the rest into dataset="/other"
 * (metrics_cache.c). No file ever becomes a label.
 */
#ifndef DSTAGE_METRICS_H
#define DSTAGE_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct metrics;
struct metrics_buf;

/* Called at every scrape, one scrape at a time. */
typedef void (*metrics_collect_fn)(void *arg, struct metrics_buf *b);

/* The most collectors a registry holds. */
#define METRICS_MAX_COLLECTORS 8
/* The largest page rendered; a scrape that would exceed it fails (500). */
#define METRICS_MAX_PAGE (1u << 20)

/* Returns 0 or -ENOMEM. The registry starts with the process collector
 * (RSS, open files, start time) and the latency histograms. */
int metrics_new(struct metrics **out);

/* Accepts NULL. Stop the HTTP server first. */
void metrics_free(struct metrics *m);

/* Add a collector; before the HTTP server starts. Returns 0 or -ENOSPC
 * (METRICS_MAX_COLLECTORS reached). */
int metrics_add_collector(struct metrics *m, metrics_collect_fn fn, void *arg);

/* Render every collector's families into a new NUL-terminated string
 * (*text, freed by the caller, *len its length). Returns 0, -ENOMEM, or
 * -EFBIG (over METRICS_MAX_PAGE). */
int metrics_render(struct metrics *m, char **text, size_t *len);

/* # HELP and # TYPE lines of a family; type is "counter" or "gauge". */
void metrics_family(struct metrics_buf *b, const char *name, const char *type,
		    const char *help);
/* One sample; labels is NULL or `key="value",...` (constant strings). */
void metrics_sample(struct metrics_buf *b, const char *name, const char *labels,
		    double v);
/* A family of one unlabelled sample. */
void metrics_counter(struct metrics_buf *b, const char *name, const char *help,
		     uint64_t v);
void metrics_gauge(struct metrics_buf *b, const char *name, const char *help,
		   double v);

/* Process-wide latency histograms (buckets 100 us to 10 s). */
enum metrics_hist {
	METRICS_HIST_READ, /* dstage_cache_read_seconds: a cache_read_iov */
	METRICS_HIST_FETCH, /* dstage_source_fetch_seconds: a block batch's
			     * objstore_get_many */
	METRICS_HIST_CKPT, /* dstage_checkpoint_publish_seconds: a closed
			    * checkpoint file's publish (the rest of its
			    * upload, its SHA-256, the check) */
	METRICS_NHIST,
};

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t metrics_now_ns(void);

/*
 * Whether anything serves the histograms: metrics_http_start turns it on
 * once its server listens. Off (the default, metrics.listen unset), the
 * read path pays no clock read: metrics_start returns 0, and
 * metrics_observe_since ignores a start of 0.
 */
void metrics_enable(bool on);

/* The start of an event to time: metrics_now_ns() when enabled, else 0
 * (no clock read). */
uint64_t metrics_start(void);

/* Count one event that began at start_ns (metrics_start or metrics_now_ns);
 * a start_ns of 0 is not counted. Lock-free. */
void metrics_observe_since(enum metrics_hist h, uint64_t start_ns);

/* The most per-dataset series a collector exports (see above). */
#define METRICS_MAX_DATASETS 64

/*
 * One family's per-dataset samples, bounded: metrics_ds_add names the
 * first METRICS_MAX_DATASETS datasets it is given (label value escaped)
 * and sums the rest into dataset="/other"; a restricted dataset (one
 * group may read it) is never named but summed into dataset="/restricted"
 * (the page is open to every local user). metrics_ds_end writes those two
 * sums where anything went into them. A '/' is never in a dataset's name.
 */
struct metrics_ds {
	struct metrics_buf *b;
	const char *name; /* the family */
	unsigned n; /* datasets named or summed into "/other" */
	double other, restricted;
	bool any_restricted;
};
void metrics_ds_begin(struct metrics_ds *d, struct metrics_buf *b,
		      const char *name);
void metrics_ds_add(struct metrics_ds *d, const char *dataset, bool restricted,
		    double v);
void metrics_ds_end(struct metrics_ds *d);

/*
 * Count one request to a source that ended (dstage_source_requests_total
 * {method,status}). method: "GET", "HEAD", "PUT", "POST", "DELETE" (any
 * other string counts as "other"). status: an HTTP status (100 to 599), 0
 * for a file operation that succeeded ("ok"), or -errno for one that failed,
 * or for a request that got no HTTP answer (the errno's name, e.g. "EIO").
 * Lock-free; every combination is one series, so the count stays bounded.
 */
void metrics_source_request(const char *method, int status);

/*
 * Count one checkpoint publish that ended with ret (0 or -errno), of bytes
 * bytes, begun at start_ns (metrics_start; 0: not timed):
 * dstage_checkpoint_publishes_total{result="ok"|"failed"},
 * dstage_checkpoint_published_bytes_total and, when timed and it
 * succeeded, dstage_checkpoint_publish_seconds. Lock-free.
 */
void metrics_ckpt_publish(int ret, uint64_t bytes, uint64_t start_ns);

#endif
