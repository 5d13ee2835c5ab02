/* SPDX-License-Identifier: MIT */
/*
 * strutil: small string helpers shared by the parsers and the modules that
 * build messages. Stateless; safe from any thread.
 */
#ifndef DSTAGE_STRUTIL_H
#define DSTAGE_STRUTIL_H

#include <stddef.h>

/* The value of one hex digit (either case), or -1. */
int strutil_hexval(int c);

/* Lowercase hex of n bytes into out (2n + 1 bytes, NUL-terminated). */
void strutil_hex(const unsigned char *in, size_t n, char *out);

/* snprintf into a caller's message buffer; does nothing when err is NULL or
 * errlen is 0 (callers that do not want the message). */
void strutil_msg(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
