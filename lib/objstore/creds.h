/* SPDX-License-Identifier: MIT */
/*
 * creds: the S3 access key, secret key and session token.
 *
 * Secrets never appear in a message or a log line, and are wiped on release.
 */
#ifndef DSTAGE_CREDS_H
#define DSTAGE_CREDS_H

#include <stddef.h>

struct creds {
	char *access_key;
	char *secret_key;
	char *session_token; /* may be NULL */
	/* human-readable: "environment", "/root/.aws/credentials [default]" */
	char source[512];
};

/*
 * Load credentials into *out (zeroed first), the first source that has them
 * winning:
 *   1. dstage_file, if non-NULL and it exists: the AWS shared-credentials INI
 *      format ([profile] aws_access_key_id, aws_secret_access_key,
 *      aws_session_token). Refused if group or others may read or write it
 *      (mode & 077). A file that does not exist is skipped, so that a
 *      default path may be configured.
 *   2. the environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and
 *      AWS_SESSION_TOKEN); empty values count as unset.
 *   3. the AWS shared credentials file ($AWS_SHARED_CREDENTIALS_FILE, else
 *      $HOME/.aws/credentials).
 * The profile is profile if non-NULL, else $AWS_PROFILE, else "default".
 *
 * Returns:
 *   0        found; out->source says where
 *   -ENOENT  none found (the caller may go anonymous)
 *   -EACCES  dstage_file is readable by group or others: err names the file,
 *            its mode and "chmod 600 FILE"; or a file could not be opened
 *   -EINVAL  a file is malformed, or the profile lacks a key, or only one of
 *            the two environment variables is set, or a profile named
 *            explicitly is missing (err names the file, line or profile)
 *   -ENOMEM  out of memory
 *   -errno   another error reading a file
 * A message goes to err (errlen bytes; may be NULL) on every error. Neither
 * err nor the log ever holds the secret key or the session token.
 */
int creds_load(const char *dstage_file, const char *profile, struct creds *out,
	       char *err, size_t errlen);

/* Wipe (explicit_bzero) and free the secrets, zero *c. Accepts NULL. */
void creds_release(struct creds *c);

#endif
