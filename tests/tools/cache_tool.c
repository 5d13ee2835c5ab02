// SPDX-License-Identifier: MIT
/*
 * cache_tool: drive the block cache from the integration tests and benches.
 *
 *   cache_tool [OPTIONS] URL DATASET read KEY OFF LEN   (bytes to stdout)
 *   cache_tool [OPTIONS] URL DATASET cat KEY [CHUNK]    (whole object in
 *                                  sequential CHUNK reads, to stdout, through
 *                                  cache_read_iov: no copy of bytes that sit
 *                                  in memory, as dstagefs reads; `read`
 *                                  takes cache_read's copying path)
 *   cache_tool [OPTIONS] URL DATASET fetch KEY [OFF LEN]
 *   cache_tool [OPTIONS] URL DATASET present KEY        (bytes present)
 *   cache_tool [OPTIONS] URL DATASET drop KEY
 *   cache_tool [OPTIONS] URL DATASET forget-block KEY BLOCK  (its record
 *                                  cleared, as the scrub does a damaged
 *                                  block's)
 *   cache_tool [OPTIONS] URL DATASET threads KEY N CHUNK  (N threads each
 *                                  read the whole object in shuffled CHUNKs)
 *   cache_tool [OPTIONS] URL DATASET verify KEY   ("PRESENT BAD": blocks
 *                                  present, and of those failing their
 *                                  checksum; fetches nothing)
 *   cache_tool [OPTIONS] URL DATASET policy pinned|quota|priority VALUE
 *                                  (set DATASET's policy in the catalog,
 *                                  creating both if needed)
 *   cache_tool [OPTIONS] URL DATASET evict
 *   cache_tool [OPTIONS] URL DATASET stats
 *
 * OPTIONS: --config F; --etag E and --size N (use this version instead of
 * HEAD's: a snapshot's view); --slow-us N (every ranged GET from the source
 * takes N microseconds more: a slow source for crash tests).
 *
 * The configuration comes from F or the environment (DSTAGE_CACHE_DIR,
 * DSTAGE_CACHE_BLOCK_SIZE, DSTAGE_CATALOG_PATH...). After every command the
 * cache and source counters are written to stderr as one JSON line starting
 * with "stats: ". Exit 0, 1 on an error ("error: <errno name>" last on
 * stderr), 2 on bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dstage/cache.h"
#include "dstage/cachepol.h"
#include "dstage/catalog.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"
#include "objstore/objstore_backend.h"

static unsigned slow_us;
static const struct objstore_ops *real_ops;
static struct objstore_ops slow_ops;

static int slow_get_many(struct objstore *os, struct objstore_get_req *reqs,
			 size_t n)
{
	usleep(slow_us * (unsigned)n);
	return real_ops->get_many(os, reqs, n);
}

/* A byte count: plain numbers, or sizes such as 1M (config_parse_size).
 * Anything else is 0, which the callers refuse or treat as "default". */
static uint64_t num(const char *s)
{
	uint64_t v = 0;

	if (config_parse_size(s, &v))
		v = strtoull(s, NULL, 0);
	return v;
}

static int usage(void)
{
	fprintf(stderr, "usage: cache_tool [--config F] [--etag E --size N] "
			"[--slow-us N] URL DATASET "
			"read|cat|fetch|present|drop|forget-block|threads|"
			"evict|stats "
			"ARGS...\n");
	return 2;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static void print_stats(struct cache *c, struct objstore *os, FILE *f,
			const char *prefix)
{
	struct cache_stats st;
	struct objstore_stats ost;

	cache_get_stats(c, &st);
	objstore_get_stats(os, &ost);
	fprintf(f,
		"%s{\"capacity\": %" PRIu64 ", \"used\": %" PRIu64
		", \"pinned\": %" PRIu64 ", \"hits\": %" PRIu64
		", \"misses\": %" PRIu64 ", \"bytes_from_cache\": %" PRIu64
		", \"bytes_from_source\": %" PRIu64 ", \"fetches\": %" PRIu64
		", \"checksum_failures\": %" PRIu64 ", \"evictions\": %" PRIu64
		", \"streamed\": %" PRIu64 ", \"disk_full\": %" PRIu64
		", \"source_requests\": %" PRIu64 ", \"source_bytes\": %" PRIu64
		"}\n",
		prefix, st.capacity, st.used, st.pinned, st.hits, st.misses,
		st.bytes_from_cache, st.bytes_from_source, st.fetches,
		st.checksum_failures, st.evictions, st.streamed, st.disk_full,
		ost.requests, ost.bytes_in);
	fflush(f);
}

struct reader {
	struct cache *c;
	const struct cache_object *obj;
	size_t chunk;
	unsigned seed;
	int ret;
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;
	uint64_t n = (r->obj->size + r->chunk - 1) / r->chunk;
	uint64_t *order = calloc(n ? n : 1, sizeof(*order));
	char *buf = malloc(r->chunk);

	if (!order || !buf) {
		r->ret = -ENOMEM;
		goto out;
	}
	for (uint64_t i = 0; i < n; i++)
		order[i] = i;
	for (uint64_t i = n; i > 1; i--) {
		uint64_t j = (uint64_t)rand_r(&r->seed) % i, t = order[i - 1];

		order[i - 1] = order[j];
		order[j] = t;
	}
	for (uint64_t i = 0; i < n && !r->ret; i++) {
		uint64_t off = order[i] * r->chunk;
		ssize_t got = cache_read(r->c, r->obj, off, r->chunk, buf);

		if (got < 0) {
			r->ret = (int)got;
			break;
		}
	}
out:
	free(order);
	free(buf);
	return NULL;
}

static int run_threads(struct cache *c, const struct cache_object *obj,
		       unsigned n, size_t chunk)
{
	struct reader *r = calloc(n, sizeof(*r));
	pthread_t *t = calloc(n, sizeof(*t));
	int ret = 0;

	if (!r || !t) {
		ret = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		r[i] = (struct reader){ c, obj, chunk,
					(unsigned)getpid() * 31 + i, 0 };
		if (pthread_create(&t[i], NULL, reader_main, &r[i])) {
			n = i;
			ret = -EAGAIN;
			break;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		pthread_join(t[i], NULL);
		if (r[i].ret && !ret)
			ret = r[i].ret;
	}
out:
	free(r);
	free(t);
	return ret;
}

static int set_policy(const struct dstage_config *cfg, const char *ds,
		      const char *what, const char *value)
{
	struct catalog *cat = NULL;
	int ret = catalog_open(cfg->catalog_path, CATALOG_CREATE, &cat);

	if (ret)
		return ret;
	ret = catalog_dataset_add(cat, ds, "file:///unused/", NULL);
	if (ret == -EEXIST)
		ret = 0;
	if (ret)
		goto out;
	if (!strcmp(what, "pinned"))
		ret = catalog_dataset_set_pinned(cat, ds, atoi(value) != 0);
	else if (!strcmp(what, "quota"))
		ret = catalog_dataset_set_quota(cat, ds,
						strtoull(value, NULL, 0));
	else if (!strcmp(what, "priority"))
		ret = catalog_dataset_set_priority(cat, ds, atoi(value));
	else
		ret = -EINVAL;
out:
	catalog_close(cat);
	return ret;
}

/* cache_iov_fn for cat: the bytes to stdout; *arg counts them. */
static int cat_sink(void *arg, const struct iovec *iov, int n)
{
	uint64_t *got = arg;
	int ret = 0;

	for (int i = 0; i < n && !ret; i++) {
		ret = write_all(STDOUT_FILENO, iov[i].iov_base, iov[i].iov_len);
		*got += iov[i].iov_len;
	}
	return ret;
}

static int cat_object(struct cache *c, const struct cache_object *obj,
		      size_t chunk)
{
	char *buf = malloc(chunk);
	uint64_t off = 0;
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	while (off < obj->size) {
		uint64_t got = 0;

		ret = cache_read_iov(c, obj, off, chunk, buf, 0, cat_sink,
				     &got);
		if (!ret && got == 0)
			ret = -EIO;
		if (ret)
			break;
		off += got;
	}
	free(buf);
	return ret;
}

int main(int argc, char **argv)
{
	const char *conf = NULL, *etag = NULL, *url, *dataset, *cmd;
	char err[512], etagbuf[OBJSTORE_ETAG_MAX];
	struct dstage_config *cfg = NULL;
	struct objstore *os = NULL;
	struct cache *c = NULL;
	struct cachepol *pol = NULL;
	struct cache_object obj = { 0 };
	uint64_t size = 0;
	bool have_size = false;
	int i = 1, ret;

	while (i + 1 < argc && !strncmp(argv[i], "--", 2)) {
		if (!strcmp(argv[i], "--config"))
			conf = argv[i + 1];
		else if (!strcmp(argv[i], "--etag"))
			etag = argv[i + 1];
		else if (!strcmp(argv[i], "--size"))
			size = strtoull(argv[i + 1], NULL, 0), have_size = true;
		else if (!strcmp(argv[i], "--slow-us"))
			slow_us = (unsigned)strtoul(argv[i + 1], NULL, 0);
		else
			return usage();
		i += 2;
	}
	if (argc - i < 3)
		return usage();
	url = argv[i];
	dataset = argv[i + 1];
	cmd = argv[i + 2];
	argv += i + 3;
	argc -= i + 3;
	ret = config_load(conf, &cfg, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "%s\n", err);
		return 2;
	}
	log_set_level(cfg->log_level);
	ret = objstore_open(url, cfg, &os);
	if (ret)
		goto out;
	if (slow_us) {
		real_ops = os->ops;
		slow_ops = *real_ops;
		slow_ops.get_many = slow_get_many;
		os->ops = &slow_ops;
	}
	ret = cachepol_open(cfg, &pol);
	if (ret)
		goto out;
	ret = cache_open(cfg, cachepol_source(pol), &c);
	if (ret)
		goto out;
	obj.dataset = dataset;
	obj.os = os;
	if (!strcmp(cmd, "policy")) {
		ret = argc == 2 ? set_policy(cfg, dataset, argv[0], argv[1])
				: usage();
		goto out;
	}
	if (argc >= 1 && strcmp(cmd, "evict") && strcmp(cmd, "stats")) {
		obj.key = argv[0];
		if (!etag || !have_size) {
			struct objstore_info oi;

			ret = objstore_head(os, obj.key, &oi);
			if (ret)
				goto out;
			snprintf(etagbuf, sizeof(etagbuf), "%s", oi.etag);
			if (!etag)
				etag = etagbuf;
			if (!have_size)
				size = oi.size;
		}
		obj.etag = etag;
		obj.size = size;
	}
	if (!strcmp(cmd, "read") && argc == 3) {
		size_t len = num(argv[2]);
		char *buf = malloc(len ? len : 1);
		ssize_t got;

		if (!buf) {
			ret = -ENOMEM;
			goto out;
		}
		got = cache_read(c, &obj, strtoull(argv[1], NULL, 0), len, buf);
		ret = got < 0 ? (int)got
			      : write_all(STDOUT_FILENO, buf, (size_t)got);
		free(buf);
	} else if (!strcmp(cmd, "cat") && argc >= 1) {
		uint64_t chunk = argc > 1 ? num(argv[1]) : 0;

		ret = cat_object(c, &obj, chunk ? chunk : cache_block_size(c));
	} else if (!strcmp(cmd, "fetch") && argc >= 1) {
		ret = cache_fetch(
			c, &obj, argc > 2 ? strtoull(argv[1], NULL, 0) : 0,
			argc > 2 ? strtoull(argv[2], NULL, 0) : 0, NULL, NULL);
	} else if (!strcmp(cmd, "present") && argc == 1) {
		uint64_t bytes = 0;

		ret = cache_object_present(c, &obj, &bytes);
		if (!ret)
			printf("%" PRIu64 "\n", bytes);
	} else if (!strcmp(cmd, "drop") && argc == 1) {
		ret = cache_object_drop(c, &obj);
	} else if (!strcmp(cmd, "forget-block") && argc == 2) {
		ret = cache_object_forget_block(c, &obj, num(argv[1]));
	} else if (!strcmp(cmd, "threads") && argc == 3) {
		ret = run_threads(c, &obj, (unsigned)atoi(argv[1]),
				  num(argv[2]));
	} else if (!strcmp(cmd, "verify") && argc == 1) {
		uint64_t present = 0, bad = 0;

		ret = cache_object_verify(c, &obj, &present, &bad);
		if (!ret)
			printf("%" PRIu64 " %" PRIu64 "\n", present, bad);
	} else if (!strcmp(cmd, "evict") && argc == 0) {
		uint64_t freed = 0;

		ret = cache_evict(c, &freed);
		if (!ret)
			printf("%" PRIu64 "\n", freed);
	} else if (!strcmp(cmd, "stats") && argc == 0) {
		print_stats(c, os, stdout, "");
	} else {
		ret = usage();
		goto out;
	}
out:
	if (c)
		print_stats(c, os, stderr, "stats: ");
	cache_close(c);
	cachepol_close(pol);
	objstore_free(os);
	config_free(cfg);
	if (ret < 0) {
		fprintf(stderr, "error: %s\n", strerrorname_np(-ret));
		return 1;
	}
	return ret;
}
