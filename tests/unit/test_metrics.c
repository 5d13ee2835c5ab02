// SPDX-License-Identifier: MIT
/* metrics: the text exposition, histograms, bounds, and metrics.listen
 * parsing (the HTTP side is tested in tests/integration/test_metrics.py). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dstage/metrics.h"
#include "dstage/metrics_http.h"

static void collect_two(void *arg, struct metrics_buf *b)
{
	unsigned *calls = arg;

	(*calls)++;
	metrics_counter(b, "t_events_total", "Events", 42);
	metrics_family(b, "t_jobs", "gauge", "Jobs by state");
	metrics_sample(b, "t_jobs", "state=\"done\"", 3);
	metrics_sample(b, "t_jobs", "state=\"failed\"", 0);
	metrics_gauge(b, "t_big_bytes", "Big", 9007199254740992.0); /* 2^53 */
}

static void collect_huge(void *arg, struct metrics_buf *b)
{
	(void)arg;
	for (unsigned i = 0; i < 100000; i++)
		metrics_gauge(b, "t_padding_padding_padding_padding", "x", i);
}

static void test_render(void)
{
	struct metrics *m = NULL;
	unsigned calls = 0;
	char *text = NULL;
	size_t len = 0;

	CHECK_INT(metrics_new(&m), 0);
	CHECK_INT(metrics_add_collector(m, collect_two, &calls), 0);
	CHECK_INT(metrics_render(m, &text, &len), 0);
	CHECK_INT(calls, 1);
	CHECK(text && strlen(text) == len);
	CHECK(strstr(text, "# HELP t_events_total Events\n"
			   "# TYPE t_events_total counter\n"
			   "t_events_total 42\n"));
	CHECK(strstr(text, "# TYPE t_jobs gauge\nt_jobs{state=\"done\"} 3\n"
			   "t_jobs{state=\"failed\"} 0\n"));
	CHECK(strstr(text, "t_big_bytes 9007199254740992\n"));
	/* the process collector and both histograms are always there */
	CHECK(strstr(text, "# TYPE process_resident_memory_bytes gauge\n"));
	CHECK(strstr(text, "# TYPE process_open_fds gauge\n"));
	CHECK(strstr(text, "# TYPE dstage_cache_read_seconds histogram\n"));
	CHECK(strstr(text, "dstage_source_fetch_seconds_bucket{le=\"+Inf\"}"));
	free(text);
	metrics_free(m);
}

static unsigned long long sample(const char *text, const char *name)
{
	const char *p = strstr(text, name);

	return p ? strtoull(p + strlen(name), NULL, 10) : ~0ull;
}

static void test_histogram(void)
{
	struct metrics *m = NULL;
	char *text = NULL;
	size_t len;
	unsigned long long before, b25, inf;

	CHECK_INT(metrics_new(&m), 0);
	CHECK_INT(metrics_render(m, &text, &len), 0);
	before = sample(text, "dstage_cache_read_seconds_count ");
	free(text);
	/* An event that began 3 ms ago: above the 2.5 ms bucket whatever
	 * the time the call itself takes. */
	metrics_observe_since(METRICS_HIST_READ, metrics_now_ns() - 3000000);
	metrics_observe_since(METRICS_NHIST, 0); /* ignored */
	CHECK_INT(metrics_render(m, &text, &len), 0);
	b25 = sample(text, "dstage_cache_read_seconds_bucket{le=\"0.0025\"} ");
	inf = sample(text, "dstage_cache_read_seconds_bucket{le=\"+Inf\"} ");
	CHECK_INT(sample(text, "dstage_cache_read_seconds_count "), before + 1);
	CHECK_INT(inf, before + 1);
	CHECK_INT(b25, before); /* cumulative: not in le=0.0025 */
	CHECK(strstr(text, "dstage_cache_read_seconds_sum 0.00"));
	free(text);
	metrics_free(m);
}

/* Without a server the read path reads no clock and counts nothing:
 * metrics_start gives 0, which metrics_observe_since ignores. */
static void test_disabled(void)
{
	struct metrics *m = NULL;
	char *text = NULL;
	size_t len;
	unsigned long long before;

	CHECK_INT(metrics_new(&m), 0);
	CHECK_INT(metrics_render(m, &text, &len), 0);
	before = sample(text, "dstage_cache_read_seconds_count ");
	free(text);
	metrics_enable(false);
	CHECK(metrics_start() == 0);
	metrics_observe_since(METRICS_HIST_READ, metrics_start());
	CHECK_INT(metrics_render(m, &text, &len), 0);
	CHECK_INT(sample(text, "dstage_cache_read_seconds_count "), before);
	free(text);
	metrics_enable(true);
	CHECK(metrics_start() != 0);
	metrics_observe_since(METRICS_HIST_READ, metrics_start());
	CHECK_INT(metrics_render(m, &text, &len), 0);
	CHECK_INT(sample(text, "dstage_cache_read_seconds_count "), before + 1);
	free(text);
	metrics_enable(false);
	metrics_free(m);
}

/* Source requests: one series per (method, status) seen; unknown methods
 * and statuses fold into "other". */
static void test_requests(void)
{
	struct metrics *m = NULL;
	char *text = NULL;
	size_t len;

	CHECK_INT(metrics_new(&m), 0);
	metrics_source_request("GET", 200);
	metrics_source_request("GET", 200);
	metrics_source_request("GET", 503);
	metrics_source_request("HEAD", -ENOENT);
	metrics_source_request("GET", 0);
	metrics_source_request("PATCH", 999);
	CHECK_INT(metrics_render(m, &text, &len), 0);
	CHECK(strstr(text, "# TYPE dstage_source_requests_total counter\n"));
	CHECK_INT(sample(text, "dstage_source_requests_total{method=\"GET\","
			       "status=\"200\"} "),
		  2);
	CHECK_INT(sample(text, "dstage_source_requests_total{method=\"GET\","
			       "status=\"503\"} "),
		  1);
	CHECK_INT(sample(text, "dstage_source_requests_total{method=\"HEAD\","
			       "status=\"ENOENT\"} "),
		  1);
	CHECK_INT(sample(text, "dstage_source_requests_total{method=\"GET\","
			       "status=\"ok\"} "),
		  1);
	CHECK_INT(sample(text, "dstage_source_requests_total{method=\"other\","
			       "status=\"other\"} "),
		  1);
	free(text);
	metrics_free(m);
}

static void test_bounds(void)
{
	struct metrics *m = NULL;
	char *text = (char *)"x";
	size_t len = 1;
	int ret = 0;

	CHECK_INT(metrics_new(&m), 0);
	for (unsigned i = 1; i < METRICS_MAX_COLLECTORS; i++)
		ret |= metrics_add_collector(m, collect_huge, NULL);
	CHECK_INT(ret, 0);
	CHECK_INT(metrics_add_collector(m, collect_huge, NULL), -ENOSPC);
	CHECK_INT(metrics_render(m, &text, &len), -EFBIG);
	CHECK(text == NULL && len == 0);
	metrics_free(m);
	metrics_free(NULL);
}

static void test_parse_listen(void)
{
	static const struct {
		const char *s;
		int ret;
		int family;
		bool loopback;
		unsigned port;
	} cases[] = {
		{ "127.0.0.1:9101", 0, AF_INET, true, 9101 },
		{ "127.1.2.3:1", 0, AF_INET, true, 1 },
		{ "[::1]:65535", 0, AF_INET6, true, 65535 },
		{ "0.0.0.0:9101", 0, AF_INET, false, 9101 },
		{ "10.0.0.1:80", 0, AF_INET, false, 80 },
		{ "[::]:9101", 0, AF_INET6, false, 9101 },
		{ "[::ffff:127.0.0.1]:9101", 0, AF_INET6, false, 9101 },
		{ "128.0.0.1:9101", 0, AF_INET, false, 9101 },
		{ "127.0.0.1", -EINVAL, 0, false, 0 },
		{ "127.0.0.1:", -EINVAL, 0, false, 0 },
		{ "127.0.0.1:0", -EINVAL, 0, false, 0 },
		{ "127.0.0.1:65536", -EINVAL, 0, false, 0 },
		{ "127.0.0.1:80x", -EINVAL, 0, false, 0 },
		{ "127.0.0.1:-1", -EINVAL, 0, false, 0 },
		{ "localhost:9101", -EINVAL, 0, false, 0 },
		{ "::1:9101", -EINVAL, 0, false, 0 },
		{ "[::1]9101", -EINVAL, 0, false, 0 },
		{ "[::1:9101", -EINVAL, 0, false, 0 },
		{ ":9101", -EINVAL, 0, false, 0 },
		{ "", -EINVAL, 0, false, 0 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct sockaddr_storage ss;
		socklen_t len = 0;
		bool lo = !cases[i].loopback;
		int ret;

		ret = metrics_http_parse_listen(cases[i].s, &ss, &len, &lo);
		if (ret != cases[i].ret)
			fprintf(stderr, "case %s\n", cases[i].s);
		CHECK_INT(ret, cases[i].ret);
		if (ret)
			continue;
		CHECK_INT(ss.ss_family, cases[i].family);
		CHECK_INT(lo, cases[i].loopback);
		if (ss.ss_family == AF_INET)
			CHECK_INT(ntohs(((struct sockaddr_in *)&ss)->sin_port),
				  cases[i].port);
		else
			CHECK_INT(
				ntohs(((struct sockaddr_in6 *)&ss)->sin6_port),
				cases[i].port);
	}
	CHECK_INT(metrics_http_parse_listen(NULL,
					    &(struct sockaddr_storage){ 0 },
					    &(socklen_t){ 0 }, &(bool){ 0 }),
		  -EINVAL);
}

int main(void)
{
	test_render();
	test_histogram();
	test_disabled();
	test_requests();
	test_bounds();
	test_parse_listen();
	return check_result();
}
