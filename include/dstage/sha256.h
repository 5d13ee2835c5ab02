/* SPDX-License-Identifier: MIT */
/*
 * sha256: the one way the library and its programs take a SHA-256 (over
 * OpenSSL's EVP interface). A hash is used by one thread at a time; the
 * functions are otherwise stateless. Every failure of OpenSSL is logged
 * with the library's message and returned as -ENOMEM (an allocation is the
 * only way a SHA-256 digest fails in OpenSSL's default provider).
 *
 * State machine of a hash: {0} -> init (or copy) -> update* -> final ->
 * release; release is safe on a {0} hash and after any failure.
 */
#ifndef DSTAGE_SHA256_H
#define DSTAGE_SHA256_H

#include <stddef.h>

#define SHA256_LEN 32 /* a digest's bytes */
#define SHA256_HEX_LEN 65 /* its 64 lowercase hex digits and a NUL */

struct evp_md_ctx_st; /* OpenSSL's EVP_MD_CTX */

struct sha256 {
	struct evp_md_ctx_st *ctx;
};

/* Start a hash in h. Returns 0 or -ENOMEM. */
int sha256_init(struct sha256 *h);

/* Start dst where src (begun, not finished) is now. Returns 0 or -ENOMEM. */
int sha256_copy(struct sha256 *dst, const struct sha256 *src);

/* Add n bytes at p. Returns 0 or -ENOMEM. */
int sha256_update(struct sha256 *h, const void *p, size_t n);

/* The digest of what was added, into md. Returns 0 or -ENOMEM. */
int sha256_final(struct sha256 *h, unsigned char md[SHA256_LEN]);

/* Free h's context (h is {0} after). */
void sha256_release(struct sha256 *h);

/* The digest of n bytes at p. Returns 0 or -ENOMEM. */
int sha256_buf(const void *p, size_t n, unsigned char md[SHA256_LEN]);

/* The digest of what fd reads from its offset to its end. Returns 0,
 * -ENOMEM, or read's -errno (-EINTR is retried). */
int sha256_fd(int fd, unsigned char md[SHA256_LEN]);

/* md in lowercase hex, NUL-terminated. */
void sha256_hex(const unsigned char md[SHA256_LEN], char out[SHA256_HEX_LEN]);

#endif
