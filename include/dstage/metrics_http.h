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
struct dstage_config;

/*
 * metrics.listen: parse "ADDR:PORT" (IPv4, or [IPv6]:PORT; PORT 1-65535)
 * into *ss / *len and say whether the address is a loopback one (127/8,
 * ::1). Returns 0 or -EINVAL (not an address with a port).
 */
int metrics_http_parse_listen(const char *s, struct sockaddr_storage *ss,
			      socklen_t *len, bool *loopback);

/*
 * Serve m on cfg->metrics_listen (GET /metrics only; 404 other paths, 405
 * other methods; at most 128 connections, 4 per client (the uid owning a
 * local peer's socket, else its address), each request answered within 5 s
 * of the accept or the previous answer or its connection shut, 10 s idle
 * timeout, 32 KiB of memory per connection, no request body). *out is NULL
 * and 0 is returned when metrics.listen is unset. Returns 0, -EINVAL (the
 * address is invalid, or not loopback without metrics.allow_remote: message
 * logged), -EADDRINUSE or another -errno from binding (logged).
 */
int metrics_http_start(const struct dstage_config *cfg, struct metrics *m,
		       struct metrics_http **out);

/* Stop the server and wait for its thread. Accepts NULL. */
void metrics_http_stop(struct metrics_http *h);

#endif
