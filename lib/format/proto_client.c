// SPDX-License-Identifier: MIT
/*
 * proto_client: the command-line tools' side of the daemon protocol (see
 * include/dstage/proto_client.h). Stateless between requests; one
 * struct proto_client is one connection in one thread: opened -> request
 * sent -> rows read -> end line read -> closed.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "dstage/proto_client.h"

int proto_client_open(struct proto_client *pc, const char *prog,
		      const char *socket_path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = strlen(socket_path);

	memset(pc, 0, sizeof(*pc));
	pc->prog = prog;
	pc->socket = socket_path;
	pc->fd = -1;
	if (len >= sizeof(sa.sun_path)) {
		fprintf(stderr, "%s: daemon.socket %s is too long\n", prog,
			socket_path);
		return -ENAMETOOLONG;
	}
	pc->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (pc->fd < 0)
		return -errno;
	memcpy(sa.sun_path, socket_path, len + 1);
	if (connect(pc->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		fprintf(stderr,
			"%s: the stager daemon is not running: cannot "
			"connect to %s (%s).\n"
			"Start it with 'systemctl start dstage-stager' or "
			"'stager daemon', or set daemon.socket.\n",
			prog, socket_path, strerror(e));
		return -e;
	}
	proto_reader_init(&pc->in, pc->fd);
	return 0;
}

int proto_client_call(struct proto_client *pc, proto_client_row_fn fn,
		      void *arg)
{
	/* A daemon that refuses the connection (too many) says why and
	 * closes: the send may fail, but its end line is there to read. */
	int sent = proto_send(pc->fd, &pc->out), ret = sent;

	if (sent && sent != -EPIPE && sent != -ECONNRESET)
		goto lost;
	for (;;) {
		const char *type;

		ret = proto_read(&pc->in, &pc->msg);
		if (ret) {
			ret = sent ? sent : ret;
			goto lost;
		}
		type = proto_get(&pc->msg, "type");
		if (type && !strcmp(type, "end")) {
			int64_t rc = -EPROTO;

			proto_get_i64(&pc->msg, "rc", &rc);
			pc->rc = (int)rc;
			snprintf(pc->endmsg, sizeof(pc->endmsg), "%s",
				 proto_get(&pc->msg, "msg") ?: "");
			snprintf(pc->endwarn, sizeof(pc->endwarn), "%s",
				 proto_get(&pc->msg, "warning") ?: "");
			return 0;
		}
		if (fn) {
			ret = fn(pc, arg);
			if (ret)
				return ret;
		}
	}
lost:
	fprintf(stderr, "%s: lost the connection to the daemon (%s): %s\n",
		pc->prog, pc->socket, strerror(-ret));
	return ret;
}

void proto_client_close(struct proto_client *pc)
{
	if (pc->fd > 0)
		close(pc->fd);
	pc->fd = -1;
	proto_free(&pc->out);
}
