// SPDX-License-Identifier: MIT
/*
 * metrics_http: serve a metrics registry on metrics.listen with
 * libmicrohttpd, one internal polling thread (see metrics_http.h).
 *
 * State: started (listening socket bound here, handed to MHD; the reaper
 * thread running) -> stopped (MHD_stop_daemon joins MHD's thread and
 * closes the socket, then the reaper is joined). The handler and the
 * connection notifications run only on MHD's one thread; the registry
 * serialises renders itself.
 *
 * Bounds: 128 connections, 4 per client, 32 KiB of memory per connection
 * (request line and headers must fit), no request body; GET or HEAD of
 * /metrics only. A client is the uid owning the peer's socket when it is
 * local (metrics_peer.c), else its address: every local user is
 * 127.0.0.1, so a limit per address let one user's 4 idle connections
 * shut out the node's scraper. Each request must be answered within 5 s
 * of the connection's accept or of the previous answer on it (the
 * deadline): MHD's own timeout (10 s) is an idle one, which a client
 * sending a byte now and then resets; the reaper thread shuts down the
 * socket of a connection past its deadline, and MHD then closes it.
 *
 * The slot table (h->lock) holds, per connection, a dup of its socket
 * (so the number cannot be reused while the reaper may shut it down),
 * its client and its deadline. MHD's thread fills and empties slots; the
 * reaper only reads them and calls shutdown(2) under the lock.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <microhttpd.h>

#include "dstage/log.h"
#include "dstage/metrics_http.h"
#include "dstage/timeutil.h"
#include "metrics/metrics_peer.h"

#define METRICS_HTTP_CONNS 128
#define METRICS_HTTP_CONNS_PER_CLIENT 4
#define METRICS_HTTP_TIMEOUT_S 10
#define METRICS_HTTP_DEADLINE_MS 5000
#define METRICS_HTTP_REAP_MS 200
#define METRICS_HTTP_CONN_MEMORY (32 * 1024)
#define METRICS_HTTP_CTYPE "text/plain; version=0.0.4; charset=utf-8"

struct metrics_http_slot {
	int fd; /* a dup of the connection's socket; -1: free */
	struct metrics_peer peer;
	int64_t deadline_ms; /* monotonic */
};

struct metrics_http {
	struct MHD_Daemon *mhd;
	struct metrics *m;
	pthread_mutex_t lock;
	pthread_cond_t wake; /* the reaper's sleep; signalled at stop */
	pthread_t reaper;
	bool reaper_on, stopping; /* lock */
	int64_t refused_log_ms; /* MHD's thread only */
	/* lock; one more than MHD admits, so a new one always fits */
	struct metrics_http_slot slots[METRICS_HTTP_CONNS + 1];
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

/* ---- per-client limits and deadlines ---- */

/* MHD's thread, with h->lock: the connections of p's client. */
static unsigned metrics_http_count(struct metrics_http *h,
				   const struct metrics_peer *p)
{
	unsigned n = 0;

	for (size_t i = 0; i < sizeof(h->slots) / sizeof(h->slots[0]); i++)
		if (h->slots[i].fd >= 0 &&
		    metrics_peer_same(&h->slots[i].peer, p))
			n++;
	return n;
}

static void metrics_http_refused(struct metrics_http *h,
				 const struct metrics_peer *p)
{
	int64_t now = timeutil_mono_ms();

	if (now - h->refused_log_ms < 10000)
		return;
	h->refused_log_ms = now;
	if (p->by_uid)
		log_warn("metrics: refused a connection of uid %u: it has %d "
			 "open (logged at most every 10 s)",
			 (unsigned)p->uid, METRICS_HTTP_CONNS_PER_CLIENT);
	else
		log_warn("metrics: refused a connection: its address has %d "
			 "open (logged at most every 10 s)",
			 METRICS_HTTP_CONNS_PER_CLIENT);
}

/* A new connection takes a slot, or is shut down (MHD then closes it)
 * when its client has its share; a closed one gives its slot back. */
static void metrics_http_notify(void *cls, struct MHD_Connection *conn,
				void **sock_cls,
				enum MHD_ConnectionNotificationCode code)
{
	struct metrics_http *h = cls;
	struct metrics_http_slot *s = *sock_cls;
	const union MHD_ConnectionInfo *ci;
	struct metrics_peer p;
	int fd;

	if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (!s)
			return;
		pthread_mutex_lock(&h->lock);
		close(s->fd);
		s->fd = -1;
		pthread_mutex_unlock(&h->lock);
		*sock_cls = NULL;
		return;
	}
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return;
	if (metrics_peer_of(ci->connect_fd, &p)) {
		shutdown(ci->connect_fd, SHUT_RDWR);
		return;
	}
	fd = fcntl(ci->connect_fd, F_DUPFD_CLOEXEC, 0);
	pthread_mutex_lock(&h->lock);
	if (fd >= 0 &&
	    metrics_http_count(h, &p) < METRICS_HTTP_CONNS_PER_CLIENT) {
		for (size_t i = 0; i < sizeof(h->slots) / sizeof(h->slots[0]);
		     i++) {
			if (h->slots[i].fd >= 0)
				continue;
			s = &h->slots[i];
			s->fd = fd;
			s->peer = p;
			s->deadline_ms =
				timeutil_mono_ms() + METRICS_HTTP_DEADLINE_MS;
			*sock_cls = s;
			break;
		}
	}
	pthread_mutex_unlock(&h->lock);
	if (*sock_cls)
		return;
	/* over its share, or out of descriptors: refused */
	shutdown(ci->connect_fd, SHUT_RDWR);
	if (fd >= 0) {
		close(fd);
		metrics_http_refused(h, &p);
	}
}

/* An answer went out: the next request on the connection has its own
 * deadline. */
static void metrics_http_completed(void *cls, struct MHD_Connection *conn,
				   void **req_cls,
				   enum MHD_RequestTerminationCode code)
{
	struct metrics_http *h = cls;
	const union MHD_ConnectionInfo *ci;
	struct metrics_http_slot *s;

	(void)req_cls;
	(void)code;
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	s = ci ? ci->socket_context : NULL;
	if (!s)
		return;
	pthread_mutex_lock(&h->lock);
	s->deadline_ms = timeutil_mono_ms() + METRICS_HTTP_DEADLINE_MS;
	pthread_mutex_unlock(&h->lock);
}

/* Every METRICS_HTTP_REAP_MS: shut down what is past its deadline. A
 * slot shut down stays until MHD reports the close; shutting it down
 * again is harmless. */
static void *metrics_http_reap(void *arg)
{
	struct metrics_http *h = arg;
	struct timespec ts;

	pthread_mutex_lock(&h->lock);
	while (!h->stopping) {
		int64_t now = timeutil_mono_ms();

		for (size_t i = 0; i < sizeof(h->slots) / sizeof(h->slots[0]);
		     i++)
			if (h->slots[i].fd >= 0 &&
			    h->slots[i].deadline_ms <= now)
				shutdown(h->slots[i].fd, SHUT_RDWR);
		timeutil_real_after_ms(&ts, METRICS_HTTP_REAP_MS);
		pthread_cond_timedwait(&h->wake, &h->lock, &ts);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

static void metrics_http_free(struct metrics_http *h)
{
	if (!h)
		return;
	if (h->reaper_on) {
		pthread_mutex_lock(&h->lock);
		h->stopping = true;
		pthread_cond_signal(&h->wake);
		pthread_mutex_unlock(&h->lock);
		pthread_join(h->reaper, NULL);
	}
	for (size_t i = 0; i < sizeof(h->slots) / sizeof(h->slots[0]); i++)
		if (h->slots[i].fd >= 0)
			close(h->slots[i].fd);
	pthread_cond_destroy(&h->wake);
	pthread_mutex_destroy(&h->lock);
	free(h);
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

int metrics_http_start(const char *listen_addr, bool allow_remote,
		       struct metrics *m, struct metrics_http **out)
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
	if (!listen_addr)
		return 0;
	ret = metrics_http_parse_listen(listen_addr, &ss, &len, &loopback);
	if (ret) {
		log_error("metrics.listen = %s: expected ADDR:PORT such as "
			  "127.0.0.1:9101 or [::1]:9101",
			  listen_addr);
		return ret;
	}
	if (!loopback && !allow_remote) {
		log_error("metrics.listen = %s is not a loopback address: set "
			  "metrics.allow_remote = true to serve metrics to "
			  "other hosts",
			  listen_addr);
		return -EINVAL;
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->m = m;
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->wake, NULL);
	for (size_t i = 0; i < sizeof(h->slots) / sizeof(h->slots[0]); i++)
		h->slots[i].fd = -1;
	ret = -pthread_create(&h->reaper, NULL, metrics_http_reap, h);
	if (ret)
		goto err;
	h->reaper_on = true;
	fd = metrics_http_bind(listen_addr, &ss, len);
	if (fd < 0) {
		ret = fd;
		goto err;
	}
	if (ss.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	h->mhd = MHD_start_daemon(
		flags, 0, NULL, NULL, metrics_http_handle, h,
		MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
		(unsigned)METRICS_HTTP_CONNS, MHD_OPTION_NOTIFY_CONNECTION,
		metrics_http_notify, h, MHD_OPTION_NOTIFY_COMPLETED,
		metrics_http_completed, h, MHD_OPTION_CONNECTION_TIMEOUT,
		(unsigned)METRICS_HTTP_TIMEOUT_S,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT,
		(size_t)METRICS_HTTP_CONN_MEMORY, MHD_OPTION_END);
	if (!h->mhd) {
		ret = -EIO;
		log_error("metrics.listen = %s: libmicrohttpd did not start",
			  listen_addr);
		goto err;
	}
	log_info("metrics served on http://%s/metrics", listen_addr);
	metrics_enable(true); /* the read path's histograms from now on */
	*out = h;
	return 0;
err:
	if (fd >= 0)
		close(fd);
	metrics_http_free(h);
	return ret;
}

void metrics_http_stop(struct metrics_http *h)
{
	if (!h)
		return;
	/* Also closes the listening socket handed to it. */
	MHD_stop_daemon(h->mhd);
	metrics_http_free(h);
}
