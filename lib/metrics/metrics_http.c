// SPDX-License-Identifier: MIT
/*
 * metrics_http: serve a metrics registry on metrics.listen with
 * libmicrohttpd, one internal polling thread (see metrics_http.h).
 *
 * State: started (listening socket bound here, handed to MHD) -> stopped
 * (MHD_stop_daemon joins the thread and closes the socket). The handler
 * runs only on MHD's one thread; the registry serialises renders itself.
 *
 * Bounds: 16 connections, 4 per client address, 10 s idle timeout, 32 KiB
 * of memory per connection (request line and headers must fit), no request
 * body; GET or HEAD of /metrics only.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <microhttpd.h>

#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/metrics_http.h"

#define METRICS_HTTP_CONNS 16
#define METRICS_HTTP_CONNS_PER_IP 4
#define METRICS_HTTP_TIMEOUT_S 10
#define METRICS_HTTP_CONN_MEMORY (32 * 1024)
#define METRICS_HTTP_CTYPE "text/plain; version=0.0.4; charset=utf-8"

struct metrics_http {
	struct MHD_Daemon *mhd;
	struct metrics *m;
};

int metrics_http_parse_listen(const char *s, struct sockaddr_storage *ss,
			      socklen_t *len, bool *loopback)
{
	char host[64];
	const char *colon, *h = s;
	size_t hlen;
	char *end;
	long port;

	memset(ss, 0, sizeof(*ss));
	if (!s)
		return -EINVAL;
	if (s[0] == '[') {
		const char *rb = strchr(s, ']');

		if (!rb || rb[1] != ':')
			return -EINVAL;
		h = s + 1;
		hlen = (size_t)(rb - h);
		colon = rb + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || strchr(s, ':') != colon)
			return -EINVAL;
		hlen = (size_t)(colon - s);
	}
	if (hlen == 0 || hlen >= sizeof(host))
		return -EINVAL;
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || port < 1 || port > 65535)
		return -EINVAL;
	if (s[0] == '[') {
		struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;

		if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1)
			return -EINVAL;
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*a6);
		*loopback = IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr);
	} else {
		struct sockaddr_in *a4 = (struct sockaddr_in *)ss;

		if (inet_pton(AF_INET, host, &a4->sin_addr) != 1)
			return -EINVAL;
		a4->sin_family = AF_INET;
		a4->sin_port = htons((uint16_t)port);
		*len = sizeof(*a4);
		*loopback = (ntohl(a4->sin_addr.s_addr) >> 24) == 127;
	}
	return 0;
}

static enum MHD_Result metrics_http_reply(struct MHD_Connection *conn,
					  unsigned status, const char *body,
					  bool owned, size_t len)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = MHD_create_response_from_buffer(len, (void *)body,
					    owned ? MHD_RESPMEM_MUST_FREE
						  : MHD_RESPMEM_PERSISTENT);
	if (!r) {
		if (owned)
			free((void *)body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
				METRICS_HTTP_CTYPE);
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

#define METRICS_HTTP_STATIC(conn, status, text) \
	metrics_http_reply(conn, status, text, false, sizeof(text) - 1)

static bool metrics_http_has_body(struct MHD_Connection *conn)
{
	const char *cl = MHD_lookup_connection_value(
		conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);

	return (cl && strcmp(cl, "0")) ||
	       MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
					   MHD_HTTP_HEADER_TRANSFER_ENCODING);
}

static enum MHD_Result
metrics_http_handle(void *cls, struct MHD_Connection *conn, const char *url,
		    const char *method, const char *version,
		    const char *upload_data, size_t *upload_data_size,
		    void **req_cls)
{
	struct metrics_http *h = cls;
	char *text;
	size_t len;
	int ret;

	(void)version;
	(void)upload_data;
	if (strcmp(method, MHD_HTTP_METHOD_GET) &&
	    strcmp(method, MHD_HTTP_METHOD_HEAD))
		return METRICS_HTTP_STATIC(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
					   "only GET /metrics is served\n");
	/* A GET with a body: refused before its first byte is read. */
	if (*upload_data_size || metrics_http_has_body(conn))
		return METRICS_HTTP_STATIC(conn, MHD_HTTP_BAD_REQUEST,
					   "no request body is accepted\n");
	if (strcmp(url, "/metrics"))
		return METRICS_HTTP_STATIC(conn, MHD_HTTP_NOT_FOUND,
					   "not found: only /metrics\n");
	if (!*req_cls) {
		/* The headers are in; a body, if one follows, comes in the
		 * next call (refused above). */
		*req_cls = h;
		return MHD_YES;
	}
	ret = metrics_render(h->m, &text, &len);
	if (ret) {
		log_error("metrics: cannot render the page: %s",
			  strerror(-ret));
		return METRICS_HTTP_STATIC(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
					   "cannot render the metrics\n");
	}
	return metrics_http_reply(conn, MHD_HTTP_OK, text, true, len);
}

static int metrics_http_bind(const char *where, struct sockaddr_storage *ss,
			     socklen_t len)
{
	int one = 1, fd, ret;

	fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ss->ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)ss, len) || listen(fd, 16)) {
		ret = -errno;
		log_error("metrics.listen = %s: cannot listen: %s (choose a "
			  "free port, or unset metrics.listen)",
			  where, strerror(-ret));
		close(fd);
		return ret;
	}
	return fd;
}

int metrics_http_start(const struct dstage_config *cfg, struct metrics *m,
		       struct metrics_http **out)
{
	struct metrics_http *h = NULL;
	struct sockaddr_storage ss;
	/* poll or epoll, never select(): dstagefs keeps thousands of idle
	 * cache files open, so a scrape's socket may be past FD_SETSIZE. */
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
	bool loopback = false;
	socklen_t len = 0;
	int fd = -1, ret;

	*out = NULL;
	if (!cfg->metrics_listen)
		return 0;
	ret = metrics_http_parse_listen(cfg->metrics_listen, &ss, &len,
					&loopback);
	if (ret) {
		log_error("metrics.listen = %s: expected ADDR:PORT such as "
			  "127.0.0.1:9101 or [::1]:9101",
			  cfg->metrics_listen);
		return ret;
	}
	if (!loopback && !cfg->metrics_allow_remote) {
		log_error("metrics.listen = %s is not a loopback address: set "
			  "metrics.allow_remote = true to serve metrics to "
			  "other hosts",
			  cfg->metrics_listen);
		return -EINVAL;
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->m = m;
	fd = metrics_http_bind(cfg->metrics_listen, &ss, len);
	if (fd < 0) {
		ret = fd;
		goto err;
	}
	if (ss.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	h->mhd = MHD_start_daemon(
		flags, 0, NULL, NULL, metrics_http_handle, h,
		MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
		(unsigned)METRICS_HTTP_CONNS,
		MHD_OPTION_PER_IP_CONNECTION_LIMIT,
		(unsigned)METRICS_HTTP_CONNS_PER_IP,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_HTTP_TIMEOUT_S,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT,
		(size_t)METRICS_HTTP_CONN_MEMORY, MHD_OPTION_END);
	if (!h->mhd) {
		ret = -EIO;
		log_error("metrics.listen = %s: libmicrohttpd did not start",
			  cfg->metrics_listen);
		goto err;
	}
	log_info("metrics served on http://%s/metrics", cfg->metrics_listen);
	metrics_enable(true); /* the read path's histograms from now on */
	*out = h;
	return 0;
err:
	if (fd >= 0)
		close(fd);
	free(h);
	return ret;
}

void metrics_http_stop(struct metrics_http *h)
{
	if (!h)
		return;
	/* Also closes the listening socket handed to it. */
	MHD_stop_daemon(h->mhd);
	free(h);
}
