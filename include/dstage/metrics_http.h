/* SPDX-License-Identifier: MIT */
/*
 * metrics_http: the HTTP endpoint (libmicrohttpd) that serves a metrics
 * registry to Prometheus on metrics.listen.
 */
#ifndef DSTAGE_METRICS_HTTP_H
#define DSTAGE_METRICS_HTTP_H

#include <stdbool.h>
#include <sys/socket.h>

#include "dstage/metrics.h"

struct metrics_http;

/*
 * metrics.listen: parse "ADDR:PORT" (IPv4, or [IPv6]:PORT; PORT 1-65535)
 * into *ss / *len and say whether the address is a loopback one (127/8,
 * ::1). Returns 0 or -EINVAL (not an address with a port).
 */
int metrics_http_parse_listen(const char *s, struct sockaddr_storage *ss,
			      socklen_t *len, bool *loopback);

/*
 * Serve m on listen_addr, metrics.listen's "ADDR:PORT" (as
 * metrics_http_parse_listen reads it); an address that is not loopback
 * only with allow_remote (metrics.allow_remote). GET /metrics only; 404
 * other paths, 405 other methods; at most 128 connections, 4 per client
 * (the uid owning a local peer's socket, else its address), each request
 * answered within 5 s of the accept or the previous answer or its
 * connection shut, 10 s idle timeout, 32 KiB of memory per connection, no
 * request body. listen_addr NULL (metrics.listen unset): *out is NULL and
 * 0 is returned. Otherwise returns 0 (*out set, to metrics_http_stop) or,
 * with *out NULL:
 *   -EINVAL      listen_addr is not ADDR:PORT, or is not loopback and
 *                allow_remote is false (logged)
 *   -EADDRINUSE  the port is taken; -EACCES, -EADDRNOTAVAIL and bind(2)'s
 *                and listen(2)'s other errors likewise (logged)
 *   -EMFILE      no descriptor for the socket (and socket(2)'s other
 *                errors: -ENFILE, -ENOBUFS...; not logged)
 *   -ENOMEM      no memory for the server's state (not logged)
 *   -EAGAIN      its reaper thread could not be started (pthread_create's
 *                error; not logged)
 *   -EIO         libmicrohttpd did not start (logged)
 */
int metrics_http_start(const char *listen_addr, bool allow_remote,
		       struct metrics *m, struct metrics_http **out);

/* Stop the server and wait for its thread. Accepts NULL. */
void metrics_http_stop(struct metrics_http *h);

#endif
