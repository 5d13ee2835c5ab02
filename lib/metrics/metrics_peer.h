/* SPDX-License-Identifier: MIT */
/*
 * metrics_peer: who is at the other end of an accepted TCP connection of
 * the metrics endpoint, for its per-client limits (metrics_http.c).
 *
 * On loopback every local user has the address 127.0.0.1, so an address
 * says nothing about who connects; the peer's socket is on this host,
 * though, and the kernel knows its owner (NETLINK_SOCK_DIAG, the lookup
 * `ss -e` makes). A client is its uid when it is a local socket whose
 * owner could be found, else its address (a remote client, or a kernel
 * without inet_diag: the per-address limit of before).
 */
#ifndef DSTAGE_METRICS_PEER_H
#define DSTAGE_METRICS_PEER_H

#include <stdbool.h>
#include <stdint.h>

struct metrics_peer {
	bool by_uid; /* uid is the client; else addr */
	uint32_t uid;
	unsigned char addr[16]; /* IPv4 in the first 4 bytes */
};

/*
 * The client of the connected TCP socket fd. Returns 0 (*p set; by_uid
 * when the owner was found), or -errno when fd has no peer address.
 */
int metrics_peer_of(int fd, struct metrics_peer *p);

/* Whether a and b are the same client. */
bool metrics_peer_same(const struct metrics_peer *a,
		       const struct metrics_peer *b);

/*
 * The owner of the local TCP socket whose own address is src and whose
 * peer is dst (both struct sockaddr_in or _in6 of family): 0 and *uid,
 * -ENOENT (no such socket: not local, or already closed) or another
 * -errno (no inet_diag in this kernel).
 */
int metrics_peer_uid(int family, const void *src, const void *dst,
		     uint32_t *uid);

#endif
