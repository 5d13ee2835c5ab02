// SPDX-License-Identifier: MIT
/*
 * objstore: the front end over the s3:// and file:// backends.
 *
 * It checks arguments once (keys, ranges) so that backends see only valid
 * requests, keeps the counters, and turns single calls into the backends'
 * batch form. A handle holds no lock: the backends are thread-safe.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/config.h"
#include "dstage/grow.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "objstore_backend.h"

/* S3 keys are at most 1024 bytes of UTF-8; a NUL cannot be in one. The
 * catalog registers no longer key (keypath.h): one limit everywhere. */
#define OBJSTORE_KEY_MAX KEYPATH_KEY_MAX

/* Process totals (objstore_get_total_stats): the open handles, linked from
 * objstore_live, plus what freed handles counted. objstore_live_lock
 * protects both; it is a leaf lock. */
static pthread_mutex_t objstore_live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct objstore *objstore_live;
static struct objstore_stats objstore_gone;

static void objstore_add_stats(struct objstore_stats *to,
			       const struct objstore *os)
{
	struct objstore_stats st;

	objstore_get_stats(os, &st);
	to->requests += st.requests;
	to->retries += st.retries;
	to->bytes_in += st.bytes_in;
	to->bytes_out += st.bytes_out;
	to->errors += st.errors;
}

void objstore_get_total_stats(struct objstore_stats *st)
{
	pthread_mutex_lock(&objstore_live_lock);
	*st = objstore_gone;
	for (struct objstore *os = objstore_live; os; os = os->live_next)
		objstore_add_stats(st, os);
	pthread_mutex_unlock(&objstore_live_lock);
}

static int objstore_check_key(const struct objstore *os, const char *key)
{
	size_t len;

	if (!key)
		return -EINVAL;
	len = strlen(key);
	if (len == 0 || len > OBJSTORE_KEY_MAX) {
		log_error("%s: invalid key of %zu bytes (1 to %d allowed)",
			  os->url, len, OBJSTORE_KEY_MAX);
		return -EINVAL;
	}
	return 0;
}

static int objstore_register(struct objstore *os, const char *url,
			     const struct dstage_config *cfg,
			     struct objstore **out);

int objstore_open(const char *url, const struct dstage_config *cfg,
		  struct objstore **out)
{
	struct objstore *os = NULL;
	int ret;

	*out = NULL;
	if (!url || !cfg)
		return -EINVAL;
	if (strncmp(url, "s3://", 5) == 0) {
		ret = s3store_open(url, url + 5, cfg, &os);
	} else if (strncmp(url, "file://", 7) == 0) {
		ret = filestore_open(url, url + 7, cfg, &os);
	} else {
		log_error("unsupported store URL '%s': expected "
			  "s3://BUCKET/PREFIX/ or file:///DIR/",
			  url);
		return -EINVAL;
	}
	if (ret)
		return ret;
	return objstore_register(os, url, cfg, out);
}

/* The base of a backend's new handle: its URL, config and place in the
 * live list. Frees os on failure (-ENOMEM). */
static int objstore_register(struct objstore *os, const char *url,
			     const struct dstage_config *cfg,
			     struct objstore **out)
{
	os->cfg = cfg;
	os->url = strdup(url);
	if (!os->url) {
		os->ops->free(os);
		return -ENOMEM;
	}
	pthread_mutex_lock(&objstore_live_lock);
	os->live_prev = NULL;
	os->live_next = objstore_live;
	if (objstore_live)
		objstore_live->live_prev = os;
	objstore_live = os;
	pthread_mutex_unlock(&objstore_live_lock);
	*out = os;
	return 0;
}

int objstore_open_tiered(const char *dir, const struct objstore_tier_opts *o,
			 struct objstore *origin, struct objstore **out)
{
	struct objstore *tier = NULL, *os = NULL;
	char url[4200];
	int n, ret;

	*out = NULL;
	if (!dir || !origin || !o)
		return -EINVAL;
	n = snprintf(url, sizeof(url), "file://%s/data/", dir);
	if (n < 0 || (size_t)n >= sizeof(url))
		return -ENAMETOOLONG;
	/* a refused tier is not opened at all */
	ret = o->refused >= 0 ? 0 : objstore_open(url, origin->cfg, &tier);
	if (!ret)
		ret = tierstore_open(dir, o, tier, origin, objstore_free, &os);
	if (ret) {
		objstore_free(tier);
		return ret;
	}
	/* (-ENOMEM here has freed origin with os) */
	return objstore_register(os, origin->url, origin->cfg, out);
}

void objstore_free(struct objstore *os)
{
	char *url;

	if (!os)
		return;
	pthread_mutex_lock(&objstore_live_lock);
	if (os->live_prev)
		os->live_prev->live_next = os->live_next;
	else
		objstore_live = os->live_next;
	if (os->live_next)
		os->live_next->live_prev = os->live_prev;
	objstore_add_stats(&objstore_gone, os);
	pthread_mutex_unlock(&objstore_live_lock);
	url = os->url;
	free(os->storage_class);
	os->ops->free(os);
	free(url);
}

const char *objstore_url(const struct objstore *os)
{
	return os->url;
}

int objstore_set_storage_class(struct objstore *os, const char *cls)
{
	char *c = NULL;

	if (cls && *cls) {
		for (const char *p = cls; *p; p++)
			if (!((*p >= 'A' && *p <= 'Z') ||
			      (*p >= '0' && *p <= '9') || *p == '_'))
				return -EINVAL;
		c = strdup(cls);
		if (!c)
			return -ENOMEM;
	}
	free(os->storage_class);
	os->storage_class = c;
	return 0;
}

static int objstore_result(struct objstore *os, int ret)
{
	if (ret < 0)
		objstore_count(&os->n_errors, 1);
	return ret;
}

int objstore_list(struct objstore *os, const char *prefix, objstore_list_cb cb,
		  void *arg)
{
	if (!cb)
		return -EINVAL;
	return objstore_result(
		os, os->ops->list(os, prefix ? prefix : "", cb, arg));
}

int objstore_list_tree(struct objstore *os, const char *prefix,
		       objstore_list_cb cb, void *arg)
{
	if (!cb)
		return -EINVAL;
	if (!os->ops->list_tree)
		return objstore_list(os, prefix, cb, arg);
	return objstore_result(
		os, os->ops->list_tree(os, prefix ? prefix : "", cb, arg));
}

int objstore_head(struct objstore *os, const char *key,
		  struct objstore_info *info)
{
	int ret = objstore_check_key(os, key);

	if (ret)
		return ret;
	memset(info, 0, sizeof(*info));
	info->key = key;
	return objstore_result(os, os->ops->head(os, key, info));
}

int objstore_get(struct objstore *os, const char *key, uint64_t off, size_t len,
		 const char *if_match, void *buf, size_t *got)
{
	struct objstore_get_req rq = {
		.key = key,
		.off = off,
		.len = len,
		.if_match = if_match,
		.buf = buf,
	};
	int ret;

	ret = objstore_get_many(os, &rq, 1);
	if (got)
		*got = rq.got;
	return ret;
}

int objstore_get_many(struct objstore *os, struct objstore_get_req *reqs,
		      size_t n)
{
	int ret;

	if (!os)
		return -ENXIO;
	for (size_t i = 0; i < n; i++) {
		reqs[i].got = 0;
		reqs[i].result = objstore_check_key(os, reqs[i].key);
		if (reqs[i].result)
			return reqs[i].result;
		if (reqs[i].len && !reqs[i].buf)
			return -EINVAL;
		if (reqs[i].off + reqs[i].len < reqs[i].off)
			return -EINVAL;
	}
	if (n == 0)
		return 0;
	ret = os->ops->get_many(os, reqs, n);
	for (size_t i = 0; i < n; i++)
		if (reqs[i].result)
			objstore_count(&os->n_errors, 1);
	return ret;
}

static bool objstore_sha_ok(const char *sha)
{
	size_t n = 0;

	if (!sha)
		return true;
	for (; sha[n]; n++)
		if (!strchr("0123456789abcdef", sha[n]))
			return false;
	return n == 64;
}

int objstore_put_fd_sha(struct objstore *os, const char *key, int fd,
			uint64_t size, const char *sha256)
{
	int ret = objstore_check_key(os, key);

	if (ret)
		return ret;
	if (fd < 0)
		return -EBADF;
	if (!objstore_sha_ok(sha256))
		return -EINVAL;
	return objstore_result(os, os->ops->put_fd(os, key, fd, size, sha256));
}

int objstore_put_fd(struct objstore *os, const char *key, int fd, uint64_t size)
{
	return objstore_put_fd_sha(os, key, fd, size, NULL);
}

/* ---- uploads in parts ---- */

int objstore_upload_begin(struct objstore *os, const char *key,
			  uint64_t size_hint, const char *sha256,
			  struct objstore_upload **out)
{
	struct objstore_upload *up = NULL;
	int ret = objstore_check_key(os, key);

	*out = NULL;
	if (ret)
		return ret;
	if (!objstore_sha_ok(sha256))
		return -EINVAL;
	ret = os->ops->up_begin(os, key, sha256, &up);
	if (ret)
		return objstore_result(os, ret);
	up->os = os;
	up->part_size = objstore_part_size(os, size_hint);
	pthread_mutex_init(&up->lock, NULL);
	*out = up;
	return 0;
}

uint64_t objstore_upload_part_size(const struct objstore_upload *up)
{
	return up->part_size;
}

const char *objstore_upload_id(const struct objstore_upload *up)
{
	return up->id;
}

/* Make room for part partno in up->parts and mark it unsent. */
static int objstore_upload_slot(struct objstore_upload *up, unsigned partno)
{
	int ret = 0;

	pthread_mutex_lock(&up->lock);
	if (partno > up->nparts_cap) {
		size_t old = up->nparts_cap;

		if (grow_array(&up->parts, &up->nparts_cap, partno,
			       sizeof(*up->parts), 64)) {
			ret = -ENOMEM;
			goto out;
		}
		memset(up->parts + old, 0,
		       (up->nparts_cap - old) * sizeof(*up->parts));
	}
	up->parts[partno - 1].len = 0;
out:
	pthread_mutex_unlock(&up->lock);
	return ret;
}

static int objstore_upload_send(struct objstore_upload *up, unsigned partno,
				const void *buf, int fd, uint64_t off,
				uint64_t len,
				const struct objstore_digests *dig)
{
	struct objstore *os = up->os;
	char etag[OBJSTORE_ETAG_MAX] = "";
	int ret;

	if (partno == 0 || partno > OBJSTORE_MAX_PARTS || len == 0 ||
	    len > up->part_size) {
		log_error("%s: upload of '%s': part %u of %llu bytes is "
			  "invalid (parts 1 to %d, 1 to %llu bytes)",
			  os->url, up->key, partno, (unsigned long long)len,
			  OBJSTORE_MAX_PARTS,
			  (unsigned long long)up->part_size);
		return -EINVAL;
	}
	ret = objstore_upload_slot(up, partno);
	if (ret)
		return ret;
	ret = os->ops->up_part(up, partno, buf, fd, off, len, dig, etag);
	if (ret)
		return objstore_result(os, ret);
	pthread_mutex_lock(&up->lock);
	up->parts[partno - 1].len = len;
	memcpy(up->parts[partno - 1].etag, etag, sizeof(etag));
	pthread_mutex_unlock(&up->lock);
	return 0;
}

int objstore_upload_part(struct objstore_upload *up, unsigned partno,
			 const void *buf, size_t len)
{
	return objstore_upload_part_ex(up, partno, buf, len, NULL);
}

int objstore_upload_part_ex(struct objstore_upload *up, unsigned partno,
			    const void *buf, size_t len,
			    const struct objstore_digests *dig)
{
	if (!up || !buf)
		return -EINVAL;
	return objstore_upload_send(up, partno, buf, -1, 0, len, dig);
}

int objstore_upload_part_fd(struct objstore_upload *up, unsigned partno, int fd,
			    uint64_t off, uint64_t len)
{
	if (!up)
		return -EINVAL;
	if (fd < 0)
		return -EBADF;
	return objstore_upload_send(up, partno, NULL, fd, off, len, NULL);
}

int objstore_upload_commit(struct objstore_upload *up, uint64_t size)
{
	return objstore_upload_commit_etag(up, size, NULL);
}

int objstore_upload_commit_etag(struct objstore_upload *up, uint64_t size,
				char etag[OBJSTORE_ETAG_MAX])
{
	char own[OBJSTORE_ETAG_MAX] = "";
	struct objstore *os;
	uint64_t n;
	int ret;

	if (etag)
		etag[0] = '\0';
	if (!up)
		return -EINVAL;
	os = up->os;
	n = (size + up->part_size - 1) / up->part_size;
	if (n > OBJSTORE_MAX_PARTS || n > up->nparts_cap) {
		ret = -EINVAL;
		goto bad;
	}
	for (uint64_t i = 0; i < n; i++) {
		uint64_t want =
			i + 1 < n ? up->part_size : size - i * up->part_size;

		if (up->parts[i].len != want) {
			ret = -EINVAL;
			goto bad;
		}
	}
	ret = os->ops->up_commit(up, (unsigned)n, size, own);
	if (!ret && etag)
		memcpy(etag, own, OBJSTORE_ETAG_MAX);
	return objstore_result(os, ret);
bad:
	log_error("%s: upload of '%s': the parts sent do not make an object "
		  "of %llu bytes (parts of %llu bytes); aborted",
		  os->url, up->key, (unsigned long long)size,
		  (unsigned long long)up->part_size);
	objstore_upload_abort(up);
	return objstore_result(os, ret);
}

void objstore_upload_abort(struct objstore_upload *up)
{
	if (up)
		up->os->ops->up_abort(up);
}

int objstore_upload_abort_id(struct objstore *os, const char *key,
			     const char *id)
{
	int ret = objstore_check_key(os, key);

	if (ret)
		return ret;
	if (!id || !*id)
		return -EINVAL;
	return objstore_result(os, os->ops->up_abort_id(os, key, id));
}

int objstore_upload_list(struct objstore *os, const char *prefix,
			 objstore_upload_list_cb cb, void *arg)
{
	if (!os || !prefix || !cb)
		return -EINVAL;
	return objstore_result(os, os->ops->up_list(os, prefix, cb, arg));
}

int objstore_put_buf(struct objstore *os, const char *key, const void *buf,
		     size_t len)
{
	return objstore_put_buf_ex(os, key, buf, len, NULL);
}

int objstore_put_buf_ex(struct objstore *os, const char *key, const void *buf,
			size_t len, const struct objstore_digests *dig)
{
	int ret = objstore_check_key(os, key);

	if (ret)
		return ret;
	if (len && !buf)
		return -EINVAL;
	return objstore_result(os, os->ops->put_buf(os, key, buf, len, dig));
}

int objstore_put_buf_new(struct objstore *os, const char *key, const void *buf,
			 size_t len)
{
	int ret = objstore_check_key(os, key);

	if (ret)
		return ret;
	if (len && !buf)
		return -EINVAL;
	if (!os->ops->put_new)
		return -EOPNOTSUPP;
	ret = os->ops->put_new(os, key, buf, len);
	return ret == -EEXIST ? ret : objstore_result(os, ret);
}

int objstore_delete(struct objstore *os, const char *key)
{
	int ret = objstore_check_key(os, key);

	if (ret)
		return ret;
	return objstore_result(os, os->ops->del(os, key));
}

int objstore_copy(struct objstore *os, const char *src_key, const char *dst_key)
{
	int ret = objstore_check_key(os, src_key);

	if (!ret)
		ret = objstore_check_key(os, dst_key);
	if (ret)
		return ret;
	return objstore_result(os, os->ops->copy(os, src_key, dst_key));
}

int objstore_set_sha256(struct objstore *os, const char *key, const char *etag,
			const char *sha256, char new_etag[OBJSTORE_ETAG_MAX])
{
	char own[OBJSTORE_ETAG_MAX] = "";
	int ret = objstore_check_key(os, key);

	if (new_etag)
		new_etag[0] = '\0';
	if (ret)
		return ret;
	if (!sha256 || !objstore_sha_ok(sha256))
		return -EINVAL;
	ret = os->ops->set_sha256(os, key, etag, sha256, own);
	if (!ret && new_etag)
		memcpy(new_etag, own, OBJSTORE_ETAG_MAX);
	/* a version replaced meanwhile, or too large to copy: expected */
	return ret == -ESTALE || ret == -EFBIG ? ret : objstore_result(os, ret);
}

void objstore_get_stats(const struct objstore *os, struct objstore_stats *st)
{
	st->requests = atomic_load(&os->n_requests);
	st->retries = atomic_load(&os->n_retries);
	st->bytes_in = atomic_load(&os->n_bytes_in);
	st->bytes_out = atomic_load(&os->n_bytes_out);
	st->errors = atomic_load(&os->n_errors);
}
