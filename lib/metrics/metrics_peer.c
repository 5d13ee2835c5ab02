// SPDX-License-Identifier: MIT
/*
 * metrics_peer: the client of a metrics connection, by the uid that owns
 * its socket when it is a local one (see metrics_peer.h).
 *
 * The lookup is one exact SOCK_DIAG_BY_FAMILY request (no dump) for the
 * 4-tuple of the peer's socket, answered at once by the kernel; the
 * netlink socket is opened per lookup, with a 1 s receive timeout as the
 * bound.
 */
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>

#include "metrics/metrics_peer.h"

static void metrics_peer_id(int family, const void *src, const void *dst,
			    struct inet_diag_sockid *id)
{
	memset(id, 0, sizeof(*id));
	if (family == AF_INET) {
		const struct sockaddr_in *s = src, *d = dst;

		id->idiag_sport = s->sin_port;
		id->idiag_dport = d->sin_port;
		memcpy(id->idiag_src, &s->sin_addr, 4);
		memcpy(id->idiag_dst, &d->sin_addr, 4);
	} else {
		const struct sockaddr_in6 *s = src, *d = dst;

		id->idiag_sport = s->sin6_port;
		id->idiag_dport = d->sin6_port;
		memcpy(id->idiag_src, &s->sin6_addr, 16);
		memcpy(id->idiag_dst, &d->sin6_addr, 16);
	}
	id->idiag_cookie[0] = id->idiag_cookie[1] = INET_DIAG_NOCOOKIE;
}

int metrics_peer_uid(int family, const void *src, const void *dst,
		     uint32_t *uid)
{
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 r;
	} req;
	union {
		struct nlmsghdr nlh;
		char buf[2048];
	} ans;
	struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
	struct timeval tv = { .tv_sec = 1 };
	struct nlmsghdr *h = &ans.nlh;
	ssize_t n;
	int fd, ret;

	if (family != AF_INET && family != AF_INET6)
		return -EAFNOSUPPORT;
	memset(&req, 0, sizeof(req));
	req.nlh.nlmsg_len = sizeof(req);
	req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	req.nlh.nlmsg_flags = NLM_F_REQUEST;
	req.r.sdiag_family = (unsigned char)family;
	req.r.sdiag_protocol = IPPROTO_TCP;
	req.r.idiag_states = ~0u;
	metrics_peer_id(family, src, dst, &req.r.id);
	fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (sendto(fd, &req, sizeof(req), 0, (struct sockaddr *)&kernel,
		   sizeof(kernel)) < 0) {
		ret = -errno;
		goto out;
	}
	n = recv(fd, &ans, sizeof(ans), 0);
	if (n < 0) {
		ret = -errno;
		goto out;
	}
	if (!NLMSG_OK(h, (size_t)n)) {
		ret = -EPROTO;
		goto out;
	}
	if (h->nlmsg_type == NLMSG_ERROR) {
		const struct nlmsgerr *e = NLMSG_DATA(h);

		ret = h->nlmsg_len >= NLMSG_LENGTH(sizeof(*e)) && e->error
			      ? e->error
			      : -EPROTO;
		goto out;
	}
	if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
	    h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
		ret = -EPROTO;
		goto out;
	}
	*uid = ((const struct inet_diag_msg *)NLMSG_DATA(h))->idiag_uid;
	ret = 0;
out:
	close(fd);
	return ret;
}

int metrics_peer_of(int fd, struct metrics_peer *p)
{
	struct sockaddr_storage me, peer;
	socklen_t ml = sizeof(me), pl = sizeof(peer);

	memset(p, 0, sizeof(*p));
	if (getsockname(fd, (struct sockaddr *)&me, &ml) ||
	    getpeername(fd, (struct sockaddr *)&peer, &pl))
		return -errno;
	if (peer.ss_family == AF_INET)
		memcpy(p->addr, &((struct sockaddr_in *)&peer)->sin_addr, 4);
	else if (peer.ss_family == AF_INET6)
		memcpy(p->addr, &((struct sockaddr_in6 *)&peer)->sin6_addr, 16);
	else
		return -EAFNOSUPPORT;
	/* The peer's socket: its own address is our peer, its peer us. */
	p->by_uid = !metrics_peer_uid(peer.ss_family, &peer, &me, &p->uid);
	return 0;
}

bool metrics_peer_same(const struct metrics_peer *a,
		       const struct metrics_peer *b)
{
	if (a->by_uid != b->by_uid)
		return false;
	return a->by_uid ? a->uid == b->uid
			 : !memcmp(a->addr, b->addr, sizeof(a->addr));
}
