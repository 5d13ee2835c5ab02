// SPDX-License-Identifier: MIT
/*
 * s3req_once: one request without a body, built, run and (when its answer
 * is not wanted) released in one call: the shape of a HEAD, a DELETE or an
 * AbortMultipartUpload. The request engine is s3req.c; see s3store_i.h.
 */
#include "s3store_i.h"

int s3req_once(struct s3store *st, struct s3req *rq, const char *method,
	       const char *key, const char *const *kv, size_t nkv,
	       unsigned flags)
{
	struct s3req own;
	struct s3req *r = rq ? rq : &own;
	int ret = s3req_init(st, r, method, key, kv, nkv);

	if (ret)
		return ret;
	r->flags = flags;
	ret = s3req_run(st, r, 1);
	if (!rq)
		s3req_release(r);
	return ret;
}
