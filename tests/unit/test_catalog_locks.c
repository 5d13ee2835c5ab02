// SPDX-License-Identifier: MIT
/*
 * catalog_locks: a second catalog_open, and a busy report, in a process
 * whose connection is open must not drop that connection's POSIX locks.
 *
 * close() of any descriptor of a file drops all the process's POSIX locks
 * on it, SQLite's included. A WAL-mode connection keeps a shared lock on
 * the database for its whole life; without it, another process closing its
 * own connection takes the exclusive lock, checkpoints and deletes the
 * -wal and -shm under the first one ("disk I/O error" on its next query).
 * The other process here is this program run again as "child".
 */
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "catalog/catalog_i.h"
#include "check.h"
#include "dstage/log.h"

extern char **environ;

/* The other process: open, read, close (the close is the last one it
 * sees unless our locks are still there). */
static int child(const char *path)
{
	struct catalog *cat = NULL;
	int ret = catalog_open(path, 0, &cat);

	if (!ret)
		ret = catalog_dataset_add(cat, "from-child", "file:///tmp/",
					  NULL);
	catalog_close(cat);
	return ret ? 1 : 0;
}

static int run_child(const char *path)
{
	char *argv[] = { "/proc/self/exe", "child", (char *)path, NULL };
	pid_t pid;
	int st;

	if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ))
		return -1;
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool exists(const char *path, const char *suffix)
{
	char p[256];
	struct stat st;

	snprintf(p, sizeof(p), "%s%s", path, suffix);
	return stat(p, &st) == 0;
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/dstage-catlocks-XXXXXX", path[128], cmd[160];
	struct catalog *c1 = NULL, *c2 = NULL;

	if (argc == 3 && !strcmp(argv[1], "child"))
		return child(argv[2]);
	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/catalog.db", dir);
	CHECK_INT(catalog_open(path, CATALOG_CREATE, &c1), 0);
	CHECK_INT(catalog_dataset_add(c1, "a", "file:///tmp/", NULL), 0);
	CHECK(exists(path, "-wal") && exists(path, "-shm"));

	/* A second open in the same process runs the file guard. */
	CHECK_INT(catalog_open(path, 0, &c2), 0);
	catalog_close(c2);
	/* So does a busy report. */
	catalog_file_log_holders(path);

	/* Another process opens, writes and closes. */
	CHECK_INT(run_child(path), 0);
	CHECK(exists(path, "-wal"));
	CHECK(exists(path, "-shm"));
	/* The first connection still works and sees the other's write. */
	CHECK_INT(catalog_dataset_add(c1, "b", "file:///tmp/", NULL), 0);
	CHECK_INT(catalog_dataset_remove(c1, "from-child"), 0);
	catalog_close(c1);

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd))
		return 1;
	return check_result();
}
