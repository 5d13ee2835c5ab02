// SPDX-License-Identifier: MIT
/*
 * conn: cachectl's exchange with the stager daemon. One connection per
 * command: the request is one proto line ("cmd=cache.status ..."), the
 * answer rows and one "type=end rc=... msg=..." line (docs/stager.md).
 *
 * Stateless between commands; a struct conn lives for one command in one
 * thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cachectl.h"
#include "jsonout.h"

int conn_exit_code(int err)
{
	switch (err) {
	case 0:
		return CACHECTL_EXIT_OK;
	case -EPERM:
	case -EACCES:
		return CACHECTL_EXIT_DENIED;
	case -ENOENT:
		return CACHECTL_EXIT_NOENT;
	case -EINVAL:
		return CACHECTL_EXIT_USAGE;
	default:
		return CACHECTL_EXIT_FAIL;
	}
}

int conn_open(struct conn *cn, const struct dstage_config *cfg, const char *cmd)
{
	const char *path = cfg->daemon_socket;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	memset(cn, 0, sizeof(*cn));
	cn->cfg = cfg;
	cn->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (cn->fd < 0)
		return -errno;
	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "cachectl: daemon.socket %s is too long\n",
			path);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(cn->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		fprintf(stderr,
			"cachectl: the stager daemon is not running: cannot "
			"connect to %s (%s).\n"
			"Start it with 'systemctl start dstage-stager' or "
			"'stager daemon', or set daemon.socket.\n",
			path, strerror(e));
		return -e;
	}
	proto_reader_init(&cn->in, cn->fd);
	proto_add(&cn->out, "cmd", cmd);
	return 0;
}

void conn_close(struct conn *cn)
{
	if (cn->fd > 0)
		close(cn->fd);
	cn->fd = -1;
	proto_free(&cn->out);
}

int conn_call(struct conn *cn, conn_row_cb cb, void *arg)
{
	/* A daemon that refuses the connection says why and closes: the
	 * send may fail, but its end line is there to read. */
	int sent = proto_send(cn->fd, &cn->out), ret = sent;

	if (sent && sent != -EPIPE && sent != -ECONNRESET)
		goto lost;
	for (;;) {
		const char *type;

		ret = proto_read(&cn->in, &cn->msg);
		if (ret) {
			ret = sent ? sent : ret;
			goto lost;
		}
		type = proto_get(&cn->msg, "type");
		if (type && !strcmp(type, "end")) {
			int64_t rc = -EPROTO;

			proto_get_i64(&cn->msg, "rc", &rc);
			cn->rc = (int)rc;
			snprintf(cn->endmsg, sizeof(cn->endmsg), "%s",
				 proto_get(&cn->msg, "msg") ?: "");
			return 0;
		}
		if (cb) {
			ret = cb(cn, arg);
			if (ret)
				return ret;
		}
	}
lost:
	fprintf(stderr,
		"cachectl: lost the connection to the daemon (%s): %s\n",
		cn->cfg->daemon_socket, strerror(-ret));
	return ret;
}

int conn_result(struct conn *cn)
{
	if (!cn->rc)
		return CACHECTL_EXIT_OK;
	fprintf(stderr, "cachectl: %s\n",
		cn->endmsg[0] ? cn->endmsg : strerror(-cn->rc));
	return conn_exit_code(cn->rc);
}

const char *conn_get(struct conn *cn, const char *k)
{
	return proto_get(&cn->msg, k) ?: "";
}

uint64_t conn_u64(struct conn *cn, const char *k)
{
	uint64_t v = 0;

	proto_get_u64(&cn->msg, k, &v);
	return v;
}

int64_t conn_i64(struct conn *cn, const char *k)
{
	int64_t v = 0;

	proto_get_i64(&cn->msg, k, &v);
	return v;
}

static bool conn_is_str(const char *k, const char *const *strs)
{
	for (; strs && *strs; strs++)
		if (!strcmp(k, *strs))
			return true;
	return false;
}

json_t *conn_json_row(struct conn *cn, const char *const *strs)
{
	json_t *o = json_object();

	for (unsigned i = 0; o && i < cn->msg.n; i++) {
		const struct proto_field *f = &cn->msg.f[i];
		int64_t v;
		int ret;

		if (!strcmp(f->key, "type"))
			continue;
		if (!conn_is_str(f->key, strs) &&
		    !proto_get_i64(&cn->msg, f->key, &v))
			ret = json_object_set_new(o, f->key, json_integer(v));
		else
			ret = jsonout_set_str(o, f->key, f->val);
		if (ret) {
			json_decref(o);
			o = NULL;
		}
	}
	return o;
}

const char *conn_bytes(uint64_t v, char *buf, size_t len)
{
	static const char *const units[] = { "B",   "KiB", "MiB",
					     "GiB", "TiB", "PiB" };
	double d = (double)v;
	int u = 0;

	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", v);
	else
		snprintf(buf, len, "%.1f %s", d, units[u]);
	return buf;
}
