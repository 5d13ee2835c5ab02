// SPDX-License-Identifier: MIT
/*
 * test_cli: cli/cli.c, what stager and cachectl share: exit codes, the
 * global options, sizes and times for people, and the command-table lookup.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cli.h"
#include "dstage/log.h"

struct row {
	const char *name; /* first member, as cli_cmd_find requires */
	int id;
	const char *usage;
};

static const struct row rows[] = {
	{ "stage", 1, "NAME" },
	{ "status", 2, "[JOB]" },
	{ "st", 3, "" },
};

static void test_find(void)
{
	const struct row *r;
	size_t n = sizeof(rows) / sizeof(rows[0]);

	r = cli_cmd_find(rows, n, sizeof(rows[0]), "status");
	CHECK(r == &rows[1]);
	r = cli_cmd_find(rows, n, sizeof(rows[0]), "st");
	CHECK(r == &rows[2]); /* whole names only: no prefix match */
	CHECK(!cli_cmd_find(rows, n, sizeof(rows[0]), "sta"));
	CHECK(!cli_cmd_find(rows, n, sizeof(rows[0]), ""));
	CHECK(!cli_cmd_find(rows, 0, sizeof(rows[0]), "stage"));
}

static void test_exit_codes(void)
{
	CHECK_INT(cli_exit_code(0), CLI_EXIT_OK);
	CHECK_INT(cli_exit_code(-EPERM), CLI_EXIT_DENIED);
	CHECK_INT(cli_exit_code(-EACCES), CLI_EXIT_DENIED);
	CHECK_INT(cli_exit_code(-ENOENT), CLI_EXIT_NOENT);
	CHECK_INT(cli_exit_code(-EINVAL), CLI_EXIT_USAGE);
	CHECK_INT(cli_exit_code(-EIO), CLI_EXIT_FAIL);
}

static void test_global_opts(void)
{
	char *a1[] = {
		"stager", "--config", "/etc/x.conf", "stage", "ds", NULL
	};
	char *a2[] = { "stager", "--config=/y.conf", "ls", NULL };
	char *a3[] = { "stager", "--help", NULL };
	char *a4[] = { "stager", "--config", NULL }; /* no value: left */
	char **av = a1;
	int ac = 5;
	const char *cfg = NULL;

	CHECK_INT(cli_global_opts(&ac, &av, &cfg), 0);
	CHECK_STR(cfg, "/etc/x.conf");
	CHECK_INT(ac, 3);
	CHECK_STR(av[1], "stage");

	av = a2;
	ac = 3;
	cfg = NULL;
	CHECK_INT(cli_global_opts(&ac, &av, &cfg), 0);
	CHECK_STR(cfg, "/y.conf");
	CHECK_STR(av[1], "ls");

	av = a3;
	ac = 2;
	CHECK_INT(cli_global_opts(&ac, &av, &cfg), 1);

	av = a4;
	ac = 2;
	cfg = NULL;
	CHECK_INT(cli_global_opts(&ac, &av, &cfg), 0);
	CHECK(cfg == NULL);
	CHECK_STR(av[1], "--config"); /* the command word check reports it */
}

static void test_formats(void)
{
	char b[32];

	CHECK_STR(cli_bytes(0, b, sizeof(b)), "0 B");
	CHECK_STR(cli_bytes(1023, b, sizeof(b)), "1023 B");
	CHECK_STR(cli_bytes(1536, b, sizeof(b)), "1.5 KiB");
	CHECK_STR(cli_bytes(3ULL << 30, b, sizeof(b)), "3.0 GiB");
	CHECK_STR(cli_bytes(UINT64_MAX, b, sizeof(b)), "16384.0 PiB");

	cli_eta(0, b, sizeof(b));
	CHECK_STR(b, "0:00");
	cli_eta(61.9, b, sizeof(b));
	CHECK_STR(b, "1:01");
	cli_eta(3600 + 62, b, sizeof(b));
	CHECK_STR(b, "1:01:02");
	cli_eta(-1, b, sizeof(b));
	CHECK_STR(b, "--:--");
	cli_eta(NAN, b, sizeof(b));
	CHECK_STR(b, "--:--");
	cli_eta(INFINITY, b, sizeof(b));
	CHECK_STR(b, "--:--");

	cli_time(0, b, sizeof(b));
	CHECK_STR(b, "never");
	cli_time(86400 * 365, b, sizeof(b));
	CHECK(strlen(b) == 19 && b[4] == '-' && b[13] == ':');
}

/* Names reach terminals and logs (issue 34): no raw control byte. */
static void test_control_bytes(void)
{
	char buf[64], line[512];
	const char *s = "ok name";
	int fd, saved;
	ssize_t n;

	CHECK(cli_safe(s, buf, sizeof(buf)) == s);
	CHECK(!strcmp(cli_safe("a\nb\x1b[2J\x7f", buf, sizeof(buf)),
		      "a\\x0ab\\x1b[2J\\x7f"));
	/* cut short, never past buf */
	CHECK(strlen(cli_safe("\n\n\n\n\n\n", buf, 10)) <= 9);

	/* a log line: one line, its control bytes as \xNN */
	fd = open("/dev/shm", O_TMPFILE | O_RDWR, 0600);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	saved = dup(STDERR_FILENO);
	dup2(fd, STDERR_FILENO);
	log_warn("file %s here",
		 "x\n2026-01-01T00:00:00.000Z error: forged\x1b[0m");
	dup2(saved, STDERR_FILENO);
	close(saved);
	n = pread(fd, line, sizeof(line) - 1, 0);
	close(fd);
	CHECK(n > 0);
	if (n <= 0)
		return;
	line[n] = '\0';
	CHECK(strchr(line, '\n') == line + n - 1);
	CHECK(strstr(line, "file x\\x0a2026-01-01T00:00:00.000Z error: "
			   "forged\\x1b[0m here\n") != NULL);
}

int main(void)
{
	test_control_bytes();
	test_find();
	test_exit_codes();
	test_global_opts();
	test_formats();
	return check_result();
}
