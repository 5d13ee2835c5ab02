/* SPDX-License-Identifier: MIT */
/*
 * proto_client: one request to the stager daemon over daemon.socket, as the
 * command-line tools make it (stager, cachectl): connect, send the request
 * line built in pc->out, hand each answer row to a callback, keep the end
 * line's rc and msg. The wire format is proto.h's (docs/stager.md).
 *
 * A struct proto_client is used by one thread for one request.
 */
#ifndef DSTAGE_PROTO_CLIENT_H
#define DSTAGE_PROTO_CLIENT_H

#include "dstage/proto.h"

struct proto_client {
	const char *prog; /* "stager", "cachectl": prefixes messages */
	const char *socket; /* daemon.socket */
	int fd; /* -1 when not connected */
	struct proto_buf out; /* the request, built by the caller */
	struct proto_reader in;
	struct proto_msg msg; /* the row being handled, then the end line */
	int rc; /* the end line's rc (0 or -errno) */
	char endmsg[2048]; /* the end line's msg, "" when none */
	char endwarn[512]; /* the end line's warning (done, but...), or "" */
};

/* Called for each row before the end line; a non-zero return stops the
 * exchange and is returned by proto_client_call. */
typedef int (*proto_client_row_fn)(struct proto_client *pc, void *arg);

/*
 * Connect to socket. On failure a message naming the socket and how to
 * start the daemon is printed on stderr. Returns 0, -ENAMETOOLONG (the
 * path does not fit a sockaddr_un) or connect's -errno (-ENOENT,
 * -ECONNREFUSED, -EACCES...). pc is ready for proto_client_close either way.
 */
int proto_client_open(struct proto_client *pc, const char *prog,
		      const char *socket);

/*
 * Send pc->out and read rows (to fn, which may be NULL) until the end
 * line, whose rc, msg and warning land in pc->rc, pc->endmsg and
 * pc->endwarn. Returns 0 when the
 * exchange completed, fn's non-zero return, or the transport's -errno
 * (-EPIPE, -ECONNRESET, -EPROTO, -ETIMEDOUT...; a message naming the
 * socket is printed). A daemon that refuses the connection (too many)
 * answers with an end line and closes: that end line is still read.
 */
int proto_client_call(struct proto_client *pc, proto_client_row_fn fn,
		      void *arg);

/* Close the connection and free the request. Accepts a zeroed pc (fd 0 is
 * never ours: open sets fd first thing). */
void proto_client_close(struct proto_client *pc);

#endif
