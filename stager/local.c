// SPDX-License-Identifier: MIT
/*
 * local: the commands that run without the daemon.
 *
 *   ls URL          list an object-store prefix (endpoint and credentials)
 *   bench NAME|URL  read throughput of the source, of the cache (cold, then
 *                   warm), of the local disk under cache.dir, and SHA-256
 *                   on all cores, with the ratios issue 5 asks for
 *
 * bench state: one struct local_bench shared by its reader threads; the
 * object list is read-only once built, the next index and byte counters
 * are atomics. No locks.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "dstage/cache.h"
#include "dstage/cachepol.h"
#include "dstage/catalog.h"
#include "dstage/grow.h"
#include "dstage/objstore.h"
#include "dstage/sha256.h"
#include "jsonout.h"
#include "stager.h"

#define LOCAL_CHUNK (8u << 20)
#define LOCAL_THREADS_MAX 64

struct local_ls {
	json_t *doc; /* --json: the array of objects, else NULL */
	uint64_t n, bytes;
};

static int local_ls_cb(void *arg, const struct objstore_info *oi)
{
	struct local_ls *l = arg;

	if (l->doc) {
		json_t *o = json_object();

		if (!o || jsonout_set_str(o, "key", oi->key) ||
		    json_object_set_new(o, "size",
					json_integer((json_int_t)oi->size)) ||
		    jsonout_set_str(o, "etag", oi->etag) ||
		    json_object_set_new(o, "mtime",
					json_integer((json_int_t)oi->mtime)) ||
		    json_array_append(l->doc, o)) {
			json_decref(o);
			return -ENOMEM;
		}
		json_decref(o);
	} else {
		char safe[4 * 1024 + 1]; /* a key: at most 1,024 bytes */

		printf("%12" PRIu64 "  %s\n", oi->size,
		       cli_safe(oi->key, safe, sizeof(safe)));
	}
	l->n++;
	l->bytes += oi->size;
	return 0;
}

int local_ls(const struct dstage_config *cfg, const struct stager_cmd *cmd,
	     const struct stager_opts *o)
{
	struct objstore *os = NULL;
	struct local_ls l = { 0 };
	char b[32];
	int ret;

	(void)cmd;
	if (o->json) {
		l.doc = json_array();
		if (!l.doc)
			return CLI_EXIT_FAIL;
	}
	ret = objstore_open(o->argv[0], cfg, &os);
	if (ret) {
		fprintf(stderr, "stager ls: %s: %s\n", o->argv[0],
			strerror(-ret));
		return cli_exit_code(ret);
	}
	ret = objstore_list(os, "", local_ls_cb, &l);
	if (!ret && l.doc && jsonout_print(l.doc))
		ret = -EIO;
	json_decref(l.doc);
	objstore_free(os);
	if (ret) {
		fprintf(stderr, "stager ls: %s: %s\n", o->argv[0],
			strerror(-ret));
		return ret == -ENOENT ? CLI_EXIT_NOENT : CLI_EXIT_FAIL;
	}
	if (!o->json)
		fprintf(stderr, "%" PRIu64 " objects, %s\n", l.n,
			cli_bytes(l.bytes, b, sizeof(b)));
	return CLI_EXIT_OK;
}

/* ---- bench ---- */

struct local_obj {
	char *key;
	uint64_t size;
	char etag[OBJSTORE_ETAG_MAX];
};

struct local_bench {
	const struct dstage_config *cfg;
	const char *dataset;
	struct objstore *os;
	struct cache *cache;
	struct local_obj *objs;
	size_t n, cap;
	uint64_t limit, bytes;
	bool use_cache;
	_Atomic size_t next;
	_Atomic uint64_t done;
	_Atomic int err;
};

static int local_bench_cb(void *arg, const struct objstore_info *oi)
{
	struct local_bench *b = arg;
	struct local_obj *p;

	if (b->bytes >= b->limit)
		return 1;
	if (!oi->size)
		return 0;
	if (GROW_ONE(b->objs, b->n, b->cap, 64))
		return -ENOMEM;
	p = &b->objs[b->n];
	p->key = strdup(oi->key);
	if (!p->key)
		return -ENOMEM;
	p->size = oi->size;
	snprintf(p->etag, sizeof(p->etag), "%s", oi->etag);
	b->n++;
	b->bytes += oi->size;
	return 0;
}

static void *local_reader(void *arg)
{
	struct local_bench *b = arg;
	void *buf = malloc(LOCAL_CHUNK);
	size_t i;

	if (!buf) {
		atomic_store(&b->err, -ENOMEM);
		return NULL;
	}
	while ((i = atomic_fetch_add(&b->next, 1)) < b->n) {
		const struct local_obj *ob = &b->objs[i];
		struct cache_object co = {
			.dataset = b->dataset,
			.os = b->os,
			.key = ob->key,
			.etag = ob->etag,
			.size = ob->size,
		};

		for (uint64_t off = 0; off < ob->size;) {
			size_t len = ob->size - off < LOCAL_CHUNK
					     ? ob->size - off
					     : LOCAL_CHUNK;
			size_t got = 0;
			int ret = 0;

			if (b->use_cache) {
				ssize_t n = cache_read(b->cache, &co, off, len,
						       buf);

				ret = n < 0 ? (int)n : 0;
				got = n < 0 ? 0 : (size_t)n;
			} else {
				ret = objstore_get(b->os, ob->key, off, len,
						   NULL, buf, &got);
			}
			if (ret || !got) {
				atomic_store(&b->err, ret ? ret : -EIO);
				goto out;
			}
			off += got;
			atomic_fetch_add(&b->done, got);
		}
	}
out:
	free(buf);
	return NULL;
}

/* Read every listed object with `threads` readers; returns bytes/s. */
static double local_pass(struct local_bench *b, bool cache, unsigned threads)
{
	pthread_t t[LOCAL_THREADS_MAX];
	unsigned k = 0;
	double t0;

	b->use_cache = cache;
	atomic_store(&b->next, 0);
	atomic_store(&b->done, 0);
	atomic_store(&b->err, 0);
	t0 = timeutil_mono_s();
	for (; k < threads; k++)
		if (pthread_create(&t[k], NULL, local_reader, b))
			break;
	for (unsigned i = 0; i < k; i++)
		pthread_join(t[i], NULL);
	if (atomic_load(&b->err))
		return -1;
	return (double)atomic_load(&b->done) / (timeutil_mono_s() - t0);
}

static void local_drop(struct local_bench *b)
{
	for (size_t i = 0; i < b->n; i++) {
		struct cache_object co = {
			.dataset = b->dataset,
			.os = b->os,
			.key = b->objs[i].key,
			.etag = b->objs[i].etag,
			.size = b->objs[i].size,
		};

		cache_object_drop(b->cache, &co);
	}
}

static void *local_sha(void *arg)
{
	double *rate = arg;
	size_t len = 64u << 20;
	unsigned char *buf = malloc(len), md[SHA256_LEN];
	double t0;

	*rate = 0;
	if (!buf)
		return NULL;
	memset(buf, 0x5a, len);
	t0 = timeutil_mono_s();
	for (int r = 0; r < 4; r++)
		sha256_buf(buf, len, md);
	*rate = 4.0 * (double)len / (timeutil_mono_s() - t0);
	free(buf);
	return NULL;
}

static double local_sha_all(unsigned cpus)
{
	pthread_t t[LOCAL_THREADS_MAX];
	double rates[LOCAL_THREADS_MAX], sum = 0;
	unsigned k = 0;

	for (; k < cpus && k < LOCAL_THREADS_MAX; k++)
		if (pthread_create(&t[k], NULL, local_sha, &rates[k]))
			break;
	for (unsigned i = 0; i < k; i++) {
		pthread_join(t[i], NULL);
		sum += rates[i];
	}
	return sum;
}

/* O_DIRECT write then read of `size` bytes under dir; rates in bytes/s. */
static int local_disk(const char *dir, uint64_t size, double *wr, double *rd)
{
	char path[4096];
	size_t bs = 4u << 20;
	void *buf = NULL;
	double t0;
	int fd, ret = 0;

	*wr = *rd = -1;
	snprintf(path, sizeof(path), "%s/.stager-bench.XXXXXX", dir);
	fd = mkstemp(path);
	if (fd < 0)
		return -errno;
	unlink(path);
	close(fd);
	fd = mkostemp(path, O_DIRECT);
	if (fd < 0)
		return -errno;
	unlink(path);
	if (posix_memalign(&buf, 4096, bs)) {
		ret = -ENOMEM;
		goto out;
	}
	memset(buf, 0xa5, bs);
	t0 = timeutil_mono_s();
	for (uint64_t off = 0; off < size; off += bs)
		if (pwrite(fd, buf, bs, (off_t)off) != (ssize_t)bs) {
			ret = -errno;
			goto out;
		}
	fsync(fd);
	*wr = (double)size / (timeutil_mono_s() - t0);
	t0 = timeutil_mono_s();
	for (uint64_t off = 0; off < size; off += bs)
		if (pread(fd, buf, bs, (off_t)off) != (ssize_t)bs) {
			ret = -errno;
			goto out;
		}
	*rd = (double)size / (timeutil_mono_s() - t0);
out:
	free(buf);
	close(fd);
	return ret;
}

/* One rate (bytes/s, < 0: not measured): a line, or a field of doc. */
static void local_rate(const char *what, double r, json_t *doc)
{
	char b[32];

	if (doc) {
		/* a failure shows as a missing field; the print fails too */
		json_object_set_new(doc, what,
				    json_integer(r < 0 ? 0 : (json_int_t)r));
		return;
	}
	if (r < 0)
		printf("%-28s n/a\n", what);
	else
		printf("%-28s %s/s\n", what,
		       cli_bytes((uint64_t)r, b, sizeof(b)));
}

int local_bench(const struct dstage_config *cfg, const struct stager_cmd *cmd,
		const struct stager_opts *o)
{
	struct local_bench b = { .cfg = cfg, .limit = o->bench_bytes };
	struct cachepol *pol = NULL;
	struct catalog *cat = NULL;
	struct catalog_dataset ds = { 0 };
	const char *url = o->argv[0];
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned threads = cfg->s3_max_inflight;
	double src, cold = -1, warm = -1, sha, dw, dr, lim;
	json_t *doc = NULL;
	int ret, code = CLI_EXIT_FAIL;

	(void)cmd;
	if (!b.limit)
		b.limit = 1ull << 30;
	if (threads > LOCAL_THREADS_MAX)
		threads = LOCAL_THREADS_MAX;
	/* cached under its own name: never touches a staged dataset */
	b.dataset = "stager-bench";
	if (!strstr(url, "://")) {
		ret = catalog_open(cfg->catalog_path, CATALOG_READONLY, &cat);
		if (!ret)
			ret = catalog_dataset_get(cat, url, &ds);
		if (ret) {
			fprintf(stderr, "stager bench: dataset %s: %s\n", url,
				strerror(-ret));
			code = cli_exit_code(ret);
			goto out;
		}
		url = ds.source;
	}
	ret = objstore_open(url, cfg, &b.os);
	if (!ret)
		ret = objstore_list(b.os, "", local_bench_cb, &b);
	if (ret < 0) {
		fprintf(stderr, "stager bench: %s: %s\n", url, strerror(-ret));
		goto out;
	}
	if (!b.n) {
		fprintf(stderr, "stager bench: %s holds no data\n", url);
		goto out;
	}
	src = local_pass(&b, false, threads);
	if (!cachepol_open(cfg, &pol) &&
	    !cache_open(cfg, cachepol_source(pol), &b.cache)) {
		local_drop(&b);
		cold = local_pass(&b, true, threads);
		warm = local_pass(&b, true, threads);
		local_drop(&b);
	}
	sha = local_sha_all(ncpu > 0 ? (unsigned)ncpu : 1);
	mkdir(cfg->cache_dir, 0700); /* as the cache makes it */
	if (local_disk(cfg->cache_dir,
		       b.bytes < (512u << 20) ? 512u << 20 : b.bytes, &dw, &dr))
		dw = dr = -1;
	if (o->json) {
		doc = json_object();
		if (!doc)
			goto out;
	} else {
		char x[32];

		printf("bench of %s: %zu objects, %s\n", url, b.n,
		       cli_bytes(b.bytes, x, sizeof(x)));
	}
	local_rate("source_read", src, doc);
	local_rate("cache_cold_read", cold, doc);
	local_rate("cache_warm_read", warm, doc);
	local_rate("disk_write_direct", dw, doc);
	local_rate("disk_read_direct", dr, doc);
	local_rate("sha256_all_cores", sha, doc);
	lim = src;
	if (dw > 0 && dw < lim)
		lim = dw;
	if (sha < lim)
		lim = sha;
	if (doc) {
		json_object_set_new(
			doc, "stage_ratio",
			json_real(cold > 0 && lim > 0 ? cold / lim : 0));
		json_object_set_new(
			doc, "cache_ratio",
			json_real(warm > 0 && dr > 0
					  ? warm / (dr < sha ? dr : sha)
					  : 0));
		if (jsonout_print(doc))
			goto out;
	} else {
		printf("stage (cold cache) / min(source, disk write, sha256): "
		       "%.2f\n",
		       cold > 0 && lim > 0 ? cold / lim : 0);
		printf("warm cache read / min(disk read, sha256):             "
		       "%.2f\n",
		       warm > 0 && dr > 0 ? warm / (dr < sha ? dr : sha) : 0);
	}
	code = src < 0 ? CLI_EXIT_FAIL : CLI_EXIT_OK;
out:
	json_decref(doc);
	for (size_t i = 0; i < b.n; i++)
		free(b.objs[i].key);
	free(b.objs);
	cache_close(b.cache);
	cachepol_close(pol);
	objstore_free(b.os);
	catalog_dataset_release(&ds);
	catalog_close(cat);
	return code;
}
