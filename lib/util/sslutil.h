/* SPDX-License-Identifier: MIT */
/*
 * sslutil: what lib/ needs around OpenSSL's calls. Safe from any thread
 * (OpenSSL's error queue is the calling thread's).
 */
#ifndef DSTAGE_SSLUTIL_H
#define DSTAGE_SSLUTIL_H

/*
 * Log (error level) "<what> failed: <reason>", the reason OpenSSL's first
 * queued error on this thread, or where none is queued "out of memory" for
 * -ENOMEM and "unknown error" otherwise; then clear the thread's queue.
 * Returns err, the caller's -errno for the failure (-ENOMEM, -EIO...), so
 * that a caller can return what it gives back.
 */
int sslutil_fail(const char *what, int err);

#endif
