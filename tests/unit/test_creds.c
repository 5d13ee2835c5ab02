// SPDX-License-Identifier: MIT
/*
 * creds: precedence, profiles, the 0600 rule for the dstage file, malformed
 * files, and that no message ever holds a secret.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "objstore/creds.h"

#define SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define TOKEN "FQoGZXIvYXdzEXAMPLETOKEN"

static char dir[256];

static void put_file(const char *path, mode_t mode, const char *text)
{
	FILE *f = fopen(path, "w");

	CHECK(f != NULL);
	if (!f)
		return;
	fputs(text, f);
	fclose(f);
	CHECK_INT(chmod(path, mode), 0);
}

static void clear_env(void)
{
	unsetenv("AWS_ACCESS_KEY_ID");
	unsetenv("AWS_SECRET_ACCESS_KEY");
	unsetenv("AWS_SESSION_TOKEN");
	unsetenv("AWS_PROFILE");
	unsetenv("AWS_SHARED_CREDENTIALS_FILE");
	setenv("HOME", dir, 1);
}

/* err must never carry a secret, whatever happened */
static void no_secret(const char *err)
{
	CHECK(strstr(err, SECRET) == NULL);
	CHECK(strstr(err, "SECRETFROMFILE") == NULL);
	CHECK(strstr(err, TOKEN) == NULL);
}

static void test_none_and_env(void)
{
	struct creds c;
	char err[512];

	clear_env();
	CHECK_INT(creds_load(NULL, NULL, &c, err, sizeof(err)), -ENOENT);
	CHECK(strstr(err, "no S3 credentials") != NULL);
	CHECK(c.access_key == NULL);

	setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
	CHECK_INT(creds_load(NULL, NULL, &c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "AWS_SECRET_ACCESS_KEY") != NULL);

	setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
	setenv("AWS_SESSION_TOKEN", TOKEN, 1);
	CHECK_INT(creds_load(NULL, NULL, &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIAENV");
	CHECK_STR(c.secret_key, SECRET);
	CHECK_STR(c.session_token, TOKEN);
	CHECK_STR(c.source, "environment");
	creds_release(&c);
	CHECK(c.access_key == NULL && c.secret_key == NULL &&
	      c.session_token == NULL);
	creds_release(NULL);

	/* Empty values count as unset. */
	setenv("AWS_ACCESS_KEY_ID", "", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "", 1);
	CHECK_INT(creds_load(NULL, NULL, &c, NULL, 0), -ENOENT);
}

static void test_dstage_file(void)
{
	char path[512], missing[512], err[512], want[700];
	struct creds c;

	clear_env();
	setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
	snprintf(path, sizeof(path), "%s/dstage-creds", dir);
	snprintf(missing, sizeof(missing), "%s/no-such-file", dir);
	put_file(path, 0600,
		 "# dstage credentials\n[default]\n"
		 "aws_access_key_id = AKIAFILE\n"
		 "aws_secret_access_key = SECRETFROMFILE;x\n"
		 "[other]\naws_access_key_id=AKIAOTHER\n"
		 "aws_secret_access_key=SECRETFROMFILE2\n");

	/* The dstage file wins over the environment. */
	CHECK_INT(creds_load(path, NULL, &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIAFILE");
	CHECK_STR(c.secret_key, "SECRETFROMFILE;x");
	CHECK(c.session_token == NULL);
	snprintf(want, sizeof(want), "%s [default]", path);
	CHECK_STR(c.source, want);
	creds_release(&c);

	CHECK_INT(creds_load(path, "other", &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIAOTHER");
	creds_release(&c);
	CHECK_INT(creds_load(path, "nope", &c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "[nope]") != NULL);

	/* A dstage file that does not exist is skipped. */
	CHECK_INT(creds_load(missing, NULL, &c, err, sizeof(err)), 0);
	CHECK_STR(c.source, "environment");
	creds_release(&c);

	/* Readable by others: refused, with what to do. */
	CHECK_INT(chmod(path, 0644), 0);
	CHECK_INT(creds_load(path, NULL, &c, err, sizeof(err)), -EACCES);
	CHECK(strstr(err, path) != NULL);
	CHECK(strstr(err, "0644") != NULL);
	snprintf(want, sizeof(want), "chmod 600 %s", path);
	CHECK(strstr(err, want) != NULL);
	CHECK(c.access_key == NULL);
	no_secret(err);
	CHECK_INT(chmod(path, 0640), 0);
	CHECK_INT(creds_load(path, NULL, &c, err, sizeof(err)), -EACCES);
	CHECK(strstr(err, "0640") != NULL);
	CHECK_INT(chmod(path, 0400), 0);
	CHECK_INT(creds_load(path, NULL, &c, err, sizeof(err)), 0);
	creds_release(&c);

	/* A profile without its secret */
	put_file(path, 0600, "[default]\naws_access_key_id = AKIAFILE\n");
	CHECK_INT(creds_load(path, NULL, &c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "aws_secret_access_key") != NULL);
	CHECK(strstr(err, "[default]") != NULL);

	/* A malformed line: the message names it, without its content. */
	put_file(path, 0600,
		 "[default]\naws_access_key_id = AKIAFILE\n"
		 "SECRETFROMFILE\naws_secret_access_key = SECRETFROMFILE\n");
	CHECK_INT(creds_load(path, NULL, &c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "line 3") != NULL);
	no_secret(err);
	put_file(path, 0600, "[default\naws_access_key_id = A\n");
	CHECK_INT(creds_load(path, NULL, &c, err, sizeof(err)), -EINVAL);
	unlink(path);
}

static void test_shared_file(void)
{
	char aws[300], path[400], alt[400], err[512], want[700];
	char *big, *text;
	struct creds c;

	clear_env();
	snprintf(aws, sizeof(aws), "%s/.aws", dir);
	mkdir(aws, 0700);
	snprintf(path, sizeof(path), "%s/credentials", aws);
	/* The AWS file has no mode rule; a 2 KiB session token is common. */
	big = malloc(2049);
	text = malloc(4096);
	CHECK(big && text);
	if (!big || !text)
		goto out;
	memset(big, 'T', 2048);
	big[2048] = '\0';
	snprintf(text, 4096,
		 "[default]\naws_access_key_id = AKIADEF\n"
		 "aws_secret_access_key = " SECRET "\nregion = us-east-1\n"
		 "\n[prod]\nAWS_ACCESS_KEY_ID = AKIAPROD\n"
		 "aws_secret_access_key = SECRETFROMFILE\n"
		 "aws_session_token = %s\n"
		 "[half]\naws_secret_access_key = SECRETFROMFILE\n",
		 big);
	put_file(path, 0644, text);

	CHECK_INT(creds_load(NULL, NULL, &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIADEF");
	snprintf(want, sizeof(want), "%s [default]", path);
	CHECK_STR(c.source, want);
	creds_release(&c);

	CHECK_INT(creds_load(NULL, "prod", &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIAPROD");
	CHECK_STR(c.session_token, big);
	creds_release(&c);

	setenv("AWS_PROFILE", "prod", 1);
	CHECK_INT(creds_load(NULL, NULL, &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIAPROD");
	creds_release(&c);
	/* The argument beats AWS_PROFILE. */
	CHECK_INT(creds_load(NULL, "default", &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIADEF");
	creds_release(&c);

	/* A named profile that is not there is an error, */
	setenv("AWS_PROFILE", "staging", 1);
	CHECK_INT(creds_load(NULL, NULL, &c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "[staging]") != NULL);
	unsetenv("AWS_PROFILE");
	CHECK_INT(creds_load(NULL, "half", &c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "aws_access_key_id") != NULL);
	CHECK(strstr(err, "[half]") != NULL);
	no_secret(err);

	/* the environment beats the shared file, */
	setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
	CHECK_INT(creds_load(NULL, NULL, &c, err, sizeof(err)), 0);
	CHECK_STR(c.source, "environment");
	creds_release(&c);
	unsetenv("AWS_ACCESS_KEY_ID");
	unsetenv("AWS_SECRET_ACCESS_KEY");

	/* and AWS_SHARED_CREDENTIALS_FILE moves the file. */
	snprintf(alt, sizeof(alt), "%s/alt-credentials", dir);
	put_file(alt, 0600,
		 "[prod]\naws_access_key_id=AKIAALT\n"
		 "aws_secret_access_key=SECRETFROMFILE\n");
	setenv("AWS_SHARED_CREDENTIALS_FILE", alt, 1);
	CHECK_INT(creds_load(NULL, "prod", &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIAALT");
	creds_release(&c);
	/* without [default] and no profile named: nothing, not an error */
	CHECK_INT(creds_load(NULL, NULL, &c, err, sizeof(err)), -ENOENT);
	CHECK(strstr(err, alt) != NULL);
	setenv("AWS_SHARED_CREDENTIALS_FILE", "~/alt-credentials", 1);
	CHECK_INT(creds_load(NULL, "prod", &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIAALT");
	creds_release(&c);
	unlink(alt);
out:
	unlink(path);
	rmdir(aws);
	free(big);
	free(text);
}

/* A control character in a value (a CR that would reach an HTTP header)
 * is refused, naming the file, the line and the key; a CRLF line end is
 * not such a character (libinih strips it). */
static void test_control_characters(void)
{
	char path[512], err[512];
	struct creds c;

	clear_env();
	snprintf(path, sizeof(path), "%s/ctl-creds", dir);
	put_file(path, 0600,
		 "[default]\r\naws_access_key_id = AKIA\rX\r\n"
		 "aws_secret_access_key = " SECRET "\r\n");
	CHECK_INT(creds_load(path, NULL, &c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, path) != NULL);
	CHECK(strstr(err, "line 2") != NULL);
	CHECK(strstr(err, "aws_access_key_id") != NULL);
	no_secret(err);

	put_file(path, 0600,
		 "[default]\r\naws_access_key_id = AKIAX\r\n"
		 "aws_secret_access_key = " SECRET "\r\n");
	CHECK_INT(creds_load(path, NULL, &c, err, sizeof(err)), 0);
	CHECK_STR(c.access_key, "AKIAX");
	CHECK_STR(c.secret_key, SECRET);
	creds_release(&c);
	unlink(path);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/dstage-test-creds-XXXXXX");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	test_none_and_env();
	test_dstage_file();
	test_shared_file();
	test_control_characters();
	rmdir(dir);
	return check_result();
}
