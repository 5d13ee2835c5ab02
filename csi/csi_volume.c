// SPDX-License-Identifier: MIT
/*
 * csi_volume: a volume's attributes (the PV's volumeAttributes or an inline
 * volume's, plus what kubelet adds with podInfoOnMount), checked before
 * anything touches the node; and the errno -> gRPC code table. Pure: no
 * state, no locks, no system calls.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "csi.h"
#include "dstage/config.h"

#define CSI_KUBE_PREFIX "csi.storage.k8s.io/"

void csi_msgf(char *msg, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, len, fmt, ap);
	va_end(ap);
}

enum csi_code csi_status_code(int err)
{
	switch (err) {
	case 0:
		return CSI_OK;
	case -EINVAL:
		return CSI_INVALID_ARGUMENT;
	case -ENOENT:
		return CSI_NOT_FOUND;
	case -ENOTCONN:
		return CSI_FAILED_PRECONDITION;
	case -EPERM:
	case -EACCES:
		return CSI_PERMISSION_DENIED;
	case -EINPROGRESS:
	case -EHOSTUNREACH:
		return CSI_UNAVAILABLE;
	case -EBUSY:
		return CSI_ABORTED;
	case -EEXIST:
		return CSI_ALREADY_EXISTS;
	case -ETIMEDOUT:
		return CSI_DEADLINE_EXCEEDED;
	case -EFBIG:
	case -ENOSPC:
		return CSI_RESOURCE_EXHAUSTED;
	default:
		return CSI_INTERNAL;
	}
}

/* A dataset or job name: one path component, as the mount shows it. */
static int csi_volume_name(const char *what, const char *s, char *out,
			   char *msg, size_t len)
{
	size_t n = strlen(s);

	if (!n || n >= CSI_NAME_MAX || strchr(s, '/') || !strcmp(s, ".") ||
	    !strcmp(s, "..") || s[0] == '.') {
		csi_msgf(msg, len,
			 "volume attribute %s: '%.80s' is not a name (1 to "
			 "%d bytes, no '/', not starting with '.')",
			 what, s, CSI_NAME_MAX - 1);
		return -EINVAL;
	}
	memcpy(out, s, n + 1);
	return 0;
}

/* subPath: relative, no empty, "." or ".." segments. */
static int csi_volume_subpath(const char *s, char *out, char *msg, size_t len)
{
	size_t n = strlen(s);
	const char *p = s;

	if (n >= CSI_SUBPATH_MAX || s[0] == '/')
		goto bad;
	while (*p) {
		const char *e = strchrnul(p, '/');
		size_t seg = (size_t)(e - p);

		if (!seg || (seg == 1 && p[0] == '.') ||
		    (seg == 2 && p[0] == '.' && p[1] == '.'))
			goto bad;
		p = *e ? e + 1 : e;
		if (*e && !*p)
			goto bad; /* a trailing '/' */
	}
	memcpy(out, s, n + 1);
	return 0;
bad:
	csi_msgf(msg, len,
		 "volume attribute subPath: '%.200s' is not a relative path "
		 "inside the dataset (no leading '/', no empty, '.' or '..' "
		 "segments)",
		 s);
	return -EINVAL;
}

static int csi_volume_bool(const char *key, const char *s, bool *out, char *msg,
			   size_t len)
{
	if (!strcmp(s, "true")) {
		*out = true;
		return 0;
	}
	if (!strcmp(s, "false")) {
		*out = false;
		return 0;
	}
	csi_msgf(msg, len,
		 "volume attribute %s: '%.40s': expected \"true\" or "
		 "\"false\"",
		 key, s);
	return -EINVAL;
}

int csi_volume_parse(const struct csi_kv *kv, size_t n, struct csi_volume *v,
		     char *msg, size_t len)
{
	const char *dataset = NULL, *job = NULL;
	int ret = 0;

	memset(v, 0, sizeof(*v));
	v->verify = true;
	for (size_t i = 0; i < n && !ret; i++) {
		const char *k = kv[i].key, *val = kv[i].val;

		if (!strcmp(k, "dataset")) {
			dataset = val;
		} else if (!strcmp(k, "checkpoints")) {
			job = val;
		} else if (!strcmp(k, "verify")) {
			ret = csi_volume_bool(k, val, &v->verify, msg, len);
		} else if (!strcmp(k, "subPath")) {
			ret = csi_volume_subpath(val, v->subpath, msg, len);
		} else if (!strcmp(k, "stagingTimeout")) {
			unsigned ms;

			if (config_parse_duration_ms(val, &ms)) {
				csi_msgf(msg, len,
					 "volume attribute stagingTimeout: "
					 "'%.40s' is not a duration (90s, "
					 "30m, 2h)",
					 val);
				ret = -EINVAL;
			}
			v->timeout_s = ms / 1000 + (ms % 1000 != 0);
		} else if (!strcmp(k, CSI_KUBE_PREFIX "ephemeral")) {
			v->ephemeral = !strcmp(val, "true");
		} else if (!strcmp(k, CSI_KUBE_PREFIX "pod.namespace")) {
			snprintf(v->pod_namespace, sizeof(v->pod_namespace),
				 "%s", val);
		} else if (!strncmp(k, CSI_KUBE_PREFIX,
				    strlen(CSI_KUBE_PREFIX))) {
			/* pod.name, pod.uid, serviceAccount.name... */
		} else {
			csi_msgf(msg, len,
				 "unknown volume attribute '%.80s' (dstage "
				 "takes dataset, verify, subPath, "
				 "stagingTimeout, or checkpoints)",
				 k);
			ret = -EINVAL;
		}
	}
	if (ret)
		return ret;
	if (!dataset == !job) {
		csi_msgf(msg, len,
			 dataset ? "volume attributes: dataset and checkpoints "
				   "exclude each other"
				 : "volume attributes: no dataset (or "
				   "checkpoints) named");
		return -EINVAL;
	}
	if (job) {
		if (v->subpath[0]) {
			csi_msgf(msg, len,
				 "volume attribute subPath: only "
				 "for dataset volumes");
			return -EINVAL;
		}
		v->kind = CSI_VOL_CHECKPOINTS;
		return csi_volume_name("checkpoints", job, v->name, msg, len);
	}
	v->kind = CSI_VOL_DATASET;
	return csi_volume_name("dataset", dataset, v->name, msg, len);
}

bool csi_volume_ns_allowed(const char *list, const char *ns)
{
	size_t nl = strlen(ns);
	const char *p = list;

	if (!nl)
		return false;
	while (*p) {
		size_t n;

		p += strspn(p, ", ");
		n = strcspn(p, ", ");
		if (!n)
			break;
		if ((n == 1 && p[0] == '*') || (n == nl && !memcmp(p, ns, n)))
			return true;
		p += n;
	}
	return false;
}
