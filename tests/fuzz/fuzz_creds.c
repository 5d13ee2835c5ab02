// SPDX-License-Identifier: MIT
/*
 * fuzz_creds: the credentials file reader (creds_load in lib/objstore/creds.c, over
 * libinih through inifile.c) on any file content, as the dstage
 * credentials file (mode 0600) and as the profile named by the input's
 * first byte. The environment's AWS_* variables are cleared first and HOME
 * points nowhere, so that the file is the only source.
 *
 * Checks: the result is 0, -ENOENT or -EINVAL (or -ENOMEM); on 0 both keys
 * are non-empty, no value holds a control character (a CR in the access
 * key or token would reach an HTTP header), and the source names the file
 * and the profile; on an error the message is a NUL-terminated line that
 * names the file, and never holds a secret key the input set.
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "objstore/creds.h"
#include "dstage/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

static void cleanup(void)
{
	unlink(path);
}

static void setup(void)
{
	log_set_level(LOG_LVL_ERROR);
	unsetenv("AWS_ACCESS_KEY_ID");
	unsetenv("AWS_SECRET_ACCESS_KEY");
	unsetenv("AWS_SESSION_TOKEN");
	unsetenv("AWS_PROFILE");
	setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/fuzz_creds", 1);
	setenv("HOME", "/nonexistent", 1);
	snprintf(path, sizeof(path), "/dev/shm/fuzz_creds.%d", (int)getpid());
	atexit(cleanup);
}

/* The last value of aws_secret_access_key in the text (the one that
 * counts), if it looks like a secret: 12+ letters, digits, '+' or '/' with
 * a digit among them (others may well be words of a message). */
static void secret_of(const char *text, char *out, size_t outlen)
{
	static const char ok[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
		"0123456789+/";
	const char *p = text, *k = "aws_secret_access_key";

	out[0] = '\0';
	while ((p = strstr(p, k))) {
		const char *v = p + strlen(k);
		size_t n;

		v += strspn(v, " \t");
		p = v;
		if (*v != '=')
			continue;
		v++;
		v += strspn(v, " \t");
		n = strcspn(v, "\r\n");
		while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
			n--;
		out[0] = '\0';
		if (n >= 12 && n < outlen && strspn(v, ok) >= n &&
		    strcspn(v, "0123456789") < n) {
			memcpy(out, v, n);
			out[n] = '\0';
		}
	}
}

/* Whether s holds a control character (they would reach HTTP headers). */
static bool has_ctl(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return true;
	return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const profiles[] = { NULL, "default", "p", "a b" };
	struct creds c;
	char err[512], secret[256], *text;
	int fd, ret;

	if (size < 1)
		return 0;
	if (!path[0])
		setup();
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || fchmod(fd, 0600) ||
	    write(fd, data + 1, size - 1) != (ssize_t)(size - 1))
		abort();
	close(fd);

	memset(err, 'x', sizeof(err));
	ret = creds_load(path, profiles[data[0] % 4], &c, err, sizeof(err));
	if (ret == 0) {
		if (!c.access_key || !c.secret_key || !c.access_key[0] ||
		    !c.secret_key[0] || has_ctl(c.access_key) ||
		    has_ctl(c.secret_key) ||
		    (c.session_token && has_ctl(c.session_token)) ||
		    !strstr(c.source, path))
			abort();
		creds_release(&c);
		return 0;
	}
	if (ret != -ENOENT && ret != -EINVAL && ret != -ENOMEM)
		abort();
	if (!memchr(err, '\0', sizeof(err)))
		abort();
	if (ret == -EINVAL && !strstr(err, path))
		abort(); /* the message does not name the file */
	text = malloc(size);
	if (!text)
		abort();
	memcpy(text, data + 1, size - 1);
	text[size - 1] = '\0';
	secret_of(text, secret, sizeof(secret));
	if (secret[0] && strstr(err, secret))
		abort(); /* a secret in a message */
	free(text);
	return 0;
}
