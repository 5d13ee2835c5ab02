// SPDX-License-Identifier: MIT
/*
 * daemon_peer: what the daemon knows of a connection's peer and how it
 * answers it: its groups, whether it is an admin, which datasets it may
 * see, and the reply lines (rows, the end line). Used by the connection
 * thread (daemon_conn.c) and the request handlers (daemon_req.c), below
 * both.
 *
 * Stateless: everything is in the struct daemon_conn of the calling
 * connection thread, which owns it.
 */
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dstage/log.h"
#include "dstage/sharedtier.h"

#include "daemon_i.h"

#define DAEMON_PEER_GRBUF_MAX (4u << 20) /* getgrnam_r's buffer, at most */

/* The peer's groups: its gid from SO_PEERCRED and its user's groups. */
void daemon_peer_groups(struct daemon_conn *c)
{
	int n = 64;

	c->groups = malloc((size_t)n * sizeof(gid_t));
	if (c->groups && c->user[0] &&
	    getgrouplist(c->user, c->gid, c->groups, &n) < 0) {
		gid_t *g = realloc(c->groups, (size_t)n * sizeof(gid_t));

		if (g) {
			c->groups = g;
			if (getgrouplist(c->user, c->gid, c->groups, &n) < 0)
				n = 0;
		} else {
			n = 0;
		}
	} else if (!c->user[0]) {
		n = 0;
	}
	if (!c->groups)
		n = 0;
	c->n_groups = n;
}

bool daemon_peer_in_group(const struct daemon_conn *c, gid_t gid)
{
	if (c->gid == gid)
		return true;
	for (int i = 0; i < c->n_groups; i++)
		if (c->groups[i] == gid)
			return true;
	return false;
}

int daemon_peer_gid(const char *name, gid_t *gid)
{
	struct group gr, *res = NULL;
	size_t len = 4096;
	char *buf = NULL;
	int ret;

	for (;;) {
		char *p = realloc(buf, len);

		if (!p) {
			ret = ENOMEM;
			break;
		}
		buf = p;
		ret = getgrnam_r(name, &gr, buf, len, &res);
		if (ret != ERANGE || len >= DAEMON_PEER_GRBUF_MAX)
			break;
		len *= 4; /* a group with many members */
	}
	if (!ret && res)
		*gid = res->gr_gid;
	free(buf);
	return ret ? -ret : res ? 0 : -ENOENT;
}

bool daemon_peer_may_read(const struct daemon_conn *c, const char *group)
{
	gid_t gid;

	if (!group || !*group || c->admin)
		return true;
	if (daemon_peer_gid(group, &gid))
		return false; /* unknown group: admins only, as dstagefs */
	return daemon_peer_in_group(c, gid);
}

int daemon_peer_end(struct daemon_conn *c, int rc, const char *fmt, ...)
{
	char msg[2048] = "";
	const char *cause;
	va_list ap;

	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
	}
	if (rc && !msg[0])
		snprintf(msg, sizeof(msg), "%s", strerror(-rc));
	/* The cause this thread logged while serving the request (a
	 * store's transport error, HTTP status and S3 code, a bad URL):
	 * where the user is, not only in the daemon's log. */
	cause = rc ? log_cause() : NULL;
	if (cause && !strstr(msg, cause)) {
		size_t n = strlen(msg);

		snprintf(msg + n, sizeof(msg) - n, ": %s", cause);
	}
	log_cause_clear();
	proto_reset(&c->out);
	proto_add(&c->out, "type", "end");
	proto_add_i64(&c->out, "rc", rc);
	if (msg[0])
		proto_add(&c->out, "msg", msg);
	if (c->warn[0])
		proto_add(&c->out, "warning", c->warn);
	c->warn[0] = '\0';
	return proto_send(c->fd, &c->out);
}

void daemon_peer_row(struct daemon_conn *c, const char *type)
{
	proto_reset(&c->out);
	proto_add(&c->out, "type", type);
}

bool daemon_peer_admin(const struct daemon_conn *c)
{
	const struct daemon *d = c->d;

	if (c->uid == 0)
		return true;
	return d->has_admin_gid && daemon_peer_in_group(c, d->admin_gid);
}

void daemon_peer_tier_fields(struct daemon_conn *c, const char *name)
{
	struct sharedtier_health h[SHAREDTIER_CAUSES];
	char k[64], why[PATH_MAX + 64];
	int ret = sharedtier_health_get(c->d->cfg, name, h);

	/* a file there that cannot be read (a directory, say): the status
	 * says it does not know, rather than nothing */
	if (ret < 0 && ret != -ENOENT) {
		snprintf(why, sizeof(why), "%s/" SHAREDTIER_HEALTH_FILE ": %s",
			 c->d->cfg->cache_dir ? c->d->cfg->cache_dir : "",
			 strerror(-ret));
		proto_add(&c->out, "tier_health_error", why);
	}
	if (ret <= 0)
		return;
	for (int i = 0; i < SHAREDTIER_CAUSES; i++) {
		const char *cause = sharedtier_cause_name(i);

		if (!h[i].count)
			continue;
		snprintf(k, sizeof(k), "tier_%s", cause);
		proto_add_u64(&c->out, k, h[i].count);
		snprintf(k, sizeof(k), "tier_%s_first", cause);
		proto_add_i64(&c->out, k, h[i].first);
		snprintf(k, sizeof(k), "tier_%s_last", cause);
		proto_add_i64(&c->out, k, h[i].last);
		snprintf(k, sizeof(k), "tier_%s_what", cause);
		proto_add(&c->out, k, h[i].what);
	}
}
