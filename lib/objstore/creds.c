// SPDX-License-Identifier: MIT
/*
 * creds: S3 credentials from a dstage credentials file, the environment or
 * the AWS shared credentials file.
 *
 * State: libinih's line-length and comment settings are process-wide
 * globals. creds_load sets them for its own parse (long session tokens,
 * no inline comments, as the AWS tools read the file) and puts them back
 * afterwards, under a mutex of its own; it should not run at the same time as
 * another libinih user in the process (config_load runs at startup, before
 * any store is opened).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>

#include "creds.h"
#include "format/inifile.h"
#include "util/strutil.h"

/* Session tokens run to a few KiB; lines up to INIFILE_MAX_LINE. */

struct creds_parse {
	const char *profile;
	char *access_key;
	char *secret_key;
	char *session_token;
	bool in_profile; /* a key was seen in the profile's section */
	int err; /* -ENOMEM from the handler */
	const char *bad; /* the key whose value holds a control character */
};

static void creds_wipe_free(char *s)
{
	if (s) {
		explicit_bzero(s, strlen(s));
		free(s);
	}
}

void creds_release(struct creds *c)
{
	if (!c)
		return;
	creds_wipe_free(c->access_key);
	creds_wipe_free(c->secret_key);
	creds_wipe_free(c->session_token);
	explicit_bzero(c, sizeof(*c));
}

/* Replace *slot by a copy of value (wiping the old one). */
static int creds_set(char **slot, const char *value)
{
	char *v = strdup(value);

	if (!v)
		return -ENOMEM;
	creds_wipe_free(*slot);
	*slot = v;
	return 0;
}

static int creds_ini_handler(void *user, const char *section, const char *name,
			     const char *value)
{
	struct creds_parse *p = user;
	char **slot = NULL;

	if (strcmp(section, p->profile) != 0)
		return 1;
	p->in_profile = true;
	if (strcasecmp(name, "aws_access_key_id") == 0)
		slot = &p->access_key;
	else if (strcasecmp(name, "aws_secret_access_key") == 0)
		slot = &p->secret_key;
	else if (strcasecmp(name, "aws_session_token") == 0)
		slot = &p->session_token;
	if (!slot)
		return 1; /* region, output, ...: not ours */
	/* The access key and token go into HTTP headers: a stray CR or other
	 * control byte in them is refused, not sent. */
	for (const unsigned char *c = (const unsigned char *)value; *c; c++)
		if (*c < 0x20 || *c == 0x7f) {
			p->bad = slot == &p->access_key ? "aws_access_key_id"
				 : slot == &p->secret_key
					 ? "aws_secret_access_key"
					 : "aws_session_token";
			return 0;
		}
	if (creds_set(slot, value)) {
		p->err = -ENOMEM;
		return 0;
	}
	return 1;
}

/* Run libinih on f with the settings the AWS tools' reader implies. */
static char *creds_ini_reader(char *str, int num, void *stream)
{
	return fgets(str, num, stream);
}

static int creds_ini_parse(FILE *f, struct creds_parse *p)
{
	return inifile_parse_stream(creds_ini_reader, f, creds_ini_handler, p,
				    false);
}

/*
 * Read profile from path into out. strict: the dstage file (mode checked,
 * profile must exist). explicit: the profile was asked for by name.
 * Returns 0, -ENOENT (no file; or no such profile, neither strict nor
 * explicit), -EACCES, -EINVAL, -ENOMEM, -errno.
 */
static int creds_from_file(const char *path, bool strict, const char *profile,
			   bool explicit, struct creds *out, char *err,
			   size_t errlen)
{
	struct creds_parse p = { .profile = profile };
	struct stat st;
	FILE *f = NULL;
	int fd, rc, r;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		r = -errno;
		if (r != -ENOENT)
			strutil_msg(err, errlen,
				    "credentials file %s: cannot open: %s",
				    path, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		strutil_msg(err, errlen, "credentials file %s: %s", path,
			    strerror(-r));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		strutil_msg(err, errlen,
			    "credentials file %s: not a regular file", path);
		r = -EINVAL;
		goto out;
	}
	if (strict && (st.st_mode & 077)) {
		strutil_msg(
			err, errlen,
			"credentials file %s has mode %04o: group or others "
			"may access it, refusing to use it; run: chmod 600 %s",
			path, (unsigned)(st.st_mode & 07777), path);
		r = -EACCES;
		goto out;
	}
	f = fdopen(fd, "r");
	if (!f) {
		r = -errno;
		strutil_msg(err, errlen, "credentials file %s: %s", path,
			    strerror(-r));
		goto out;
	}
	fd = -1;
	rc = creds_ini_parse(f, &p);
	if (p.err || rc == -2) {
		strutil_msg(err, errlen, "credentials file %s: out of memory",
			    path);
		r = -ENOMEM;
		goto out;
	}
	if (rc == -1) {
		strutil_msg(err, errlen, "credentials file %s: cannot read it",
			    path);
		r = -EIO;
		goto out;
	}
	if (rc > 0 && p.bad) {
		strutil_msg(err, errlen,
			    "credentials file %s: line %d: the value of %s "
			    "holds a control character; rewrite it as plain "
			    "text",
			    path, rc, p.bad);
		r = -EINVAL;
		goto out;
	}
	if (rc > 0) {
		strutil_msg(err, errlen,
			    "credentials file %s: line %d: not an INI "
			    "'[profile]' or 'name = value' line (or too long)",
			    path, rc);
		r = -EINVAL;
		goto out;
	}
	if (!p.in_profile) {
		r = strict || explicit ? -EINVAL : -ENOENT;
		strutil_msg(err, errlen,
			    "credentials file %s: no profile [%s] in it", path,
			    profile);
		goto out;
	}
	if (!p.access_key || !*p.access_key || !p.secret_key ||
	    !*p.secret_key) {
		strutil_msg(err, errlen,
			    "credentials file %s: profile [%s] has no %s", path,
			    profile,
			    !p.access_key || !*p.access_key
				    ? "aws_access_key_id"
				    : "aws_secret_access_key");
		r = -EINVAL;
		goto out;
	}
	out->access_key = p.access_key;
	out->secret_key = p.secret_key;
	if (p.session_token && *p.session_token) {
		out->session_token = p.session_token;
		p.session_token = NULL;
	}
	p.access_key = p.secret_key = NULL;
	snprintf(out->source, sizeof(out->source), "%s [%s]", path, profile);
	r = 0;
out:
	creds_wipe_free(p.access_key);
	creds_wipe_free(p.secret_key);
	creds_wipe_free(p.session_token);
	if (f)
		fclose(f);
	if (fd >= 0)
		close(fd);
	return r;
}

static const char *creds_env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

static int creds_from_env(struct creds *out, char *err, size_t errlen)
{
	const char *ak = creds_env("AWS_ACCESS_KEY_ID");
	const char *sk = creds_env("AWS_SECRET_ACCESS_KEY");
	const char *tok = creds_env("AWS_SESSION_TOKEN");

	if (!ak && !sk)
		return -ENOENT;
	if (!ak || !sk) {
		strutil_msg(err, errlen, "%s is set but %s is not",
			    ak ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
			    ak ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
		return -EINVAL;
	}
	out->access_key = strdup(ak);
	out->secret_key = strdup(sk);
	out->session_token = tok ? strdup(tok) : NULL;
	if (!out->access_key || !out->secret_key ||
	    (tok && !out->session_token)) {
		creds_release(out);
		strutil_msg(err, errlen, "out of memory");
		return -ENOMEM;
	}
	snprintf(out->source, sizeof(out->source), "environment");
	return 0;
}

/* The AWS shared credentials file path, malloc'd; NULL with *r set. */
static char *creds_shared_path(int *r)
{
	const char *f = creds_env("AWS_SHARED_CREDENTIALS_FILE");
	const char *home = creds_env("HOME");
	char *path = NULL;
	int n;

	*r = -ENOENT;
	if (f && f[0] == '~' && f[1] == '/' && home)
		n = asprintf(&path, "%s%s", home, f + 1);
	else if (f)
		n = asprintf(&path, "%s", f);
	else if (home)
		n = asprintf(&path, "%s/.aws/credentials", home);
	else
		return NULL;
	if (n < 0) {
		*r = -ENOMEM;
		return NULL;
	}
	*r = 0;
	return path;
}

int creds_load(const char *dstage_file, const char *profile, struct creds *out,
	       char *err, size_t errlen)
{
	const char *prof = profile ? profile : creds_env("AWS_PROFILE");
	bool explicit = prof != NULL;
	char *shared = NULL;
	int r;

	memset(out, 0, sizeof(*out));
	if (err && errlen)
		err[0] = '\0';
	if (!prof)
		prof = "default";

	if (dstage_file) {
		r = creds_from_file(dstage_file, true, prof, explicit, out, err,
				    errlen);
		if (r != -ENOENT)
			return r;
	}
	r = creds_from_env(out, err, errlen);
	if (r != -ENOENT)
		return r;
	shared = creds_shared_path(&r);
	if (shared)
		r = creds_from_file(shared, false, prof, explicit, out, err,
				    errlen);
	if (r == -ENOMEM)
		strutil_msg(err, errlen, "out of memory");
	if (r == -ENOENT)
		strutil_msg(err, errlen,
			    "no S3 credentials found: %s%s%sAWS_ACCESS_KEY_ID "
			    "is not set, and %s has no profile [%s]",
			    dstage_file ? "credentials file " : "",
			    dstage_file ? dstage_file : "",
			    dstage_file ? " does not exist, " : "",
			    shared ? shared : "$HOME/.aws/credentials", prof);
	free(shared);
	return r;
}
