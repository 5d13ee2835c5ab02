// SPDX-License-Identifier: MIT
/*
 * test_cache_recover: cache_dir_recover (lib/cache/cache_read.c), the path a
 * running process takes when its cache.dir, objects/ or identity file went
 * away under it. Recreating a directory is a moment in which another user
 * may have put their own in its place, so the guard that matters is the
 * refusal:
 *
 *   nothing removed               0, nothing changed
 *   objects/ removed              1, recreated 0700, the cache reads again
 *   identity file removed         1, recreated
 *   cache.dir removed             1, recreated 0700 with its identity
 *   objects/ planted 0777         -EACCES, the planted directory untouched;
 *                                 1 once it is made 0700
 *   objects/ planted as a symlink an error, the link's target never used
 *   objects/ planted by uid 65534 -EACCES (as root only; skipped otherwise)
 *   cache.dir planted 0777        -EACCES
 *
 * Found uncovered by scripts/test --coverage (issue 21): no test removed
 * a directory while the cache was open.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define BS 4096u
#define SIZE (4 * BS)

static char tmp[256], srcdir[300], cachedir[300], objdir[320], elsewhere[300];

static int rm_rf(const char *path)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	return system(cmd);
}

/* 0 when directory path holds nothing */
static int dir_empty(const char *path)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A '%s')\"", path);
	return system(cmd);
}

static unsigned mode_of(const char *path)
{
	struct stat st;

	if (lstat(path, &st))
		return 0;
	return st.st_mode & 07777;
}

/* Read the whole object through the cache; 0 when the bytes are want's. */
static int read_back(struct cache *c, struct objstore *os, const char *want)
{
	struct objstore_info oi;
	struct cache_object o;
	char got[SIZE];

	if (objstore_head(os, "k", &oi))
		return 1;
	o = (struct cache_object){ .dataset = "d",
				   .os = os,
				   .key = "k",
				   .etag = oi.etag,
				   .size = SIZE };
	if (cache_read(c, &o, 0, SIZE, got) != (ssize_t)SIZE)
		return 1;
	return memcmp(got, want, SIZE) ? 1 : 0;
}

/* Put a directory at path with mode, in place of whatever is there. */
static void plant_dir(const char *path, unsigned mode)
{
	rm_rf(path);
	CHECK_INT(mkdir(path, 0700), 0);
	CHECK_INT(chmod(path, mode), 0);
}

int main(void)
{
	struct dstage_config *cfg = NULL;
	struct objstore *os = NULL;
	struct cache *c = NULL;
	char path[400], url[400], *orig_dir, want[SIZE];
	FILE *f;

	log_set_level(LOG_LVL_ERROR);
	snprintf(tmp, sizeof(tmp), "/var/tmp/test_cache_recover.XXXXXX");
	if (!mkdtemp(tmp))
		return 1;
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	snprintf(objdir, sizeof(objdir), "%s/objects", cachedir);
	snprintf(elsewhere, sizeof(elsewhere), "%s/elsewhere", tmp);
	mkdir(srcdir, 0755);
	mkdir(elsewhere, 0700);
	for (size_t k = 0; k < SIZE; k++)
		want[k] = (char)(k * 7 + 3);
	snprintf(path, sizeof(path), "%s/k", srcdir);
	f = fopen(path, "wb");
	CHECK(f && fwrite(want, 1, SIZE, f) == SIZE);
	if (f)
		fclose(f);

	CHECK_INT(config_defaults(&cfg), 0);
	if (!cfg)
		return 1;
	orig_dir = cfg->cache_dir;
	cfg->cache_dir = cachedir;
	cfg->cache_block_size = BS;
	cfg->cache_size = 1ULL << 30;
	snprintf(url, sizeof(url), "file://%s/", srcdir);
	CHECK_INT(objstore_open(url, cfg, &os), 0);
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	if (!os || !c)
		return check_result();
	CHECK_INT(read_back(c, os, want), 0);

	/* nothing removed */
	CHECK_INT(cache_dir_recover(c), 0);
	CHECK_INT(cache_dir_recover(NULL), -EINVAL);

	/* objects/ removed: recreated, private, and the cache reads again */
	CHECK_INT(rm_rf(objdir), 0);
	CHECK_INT(cache_dir_recover(c), 1);
	CHECK_INT(mode_of(objdir), 0700);
	CHECK_INT(read_back(c, os, want), 0);
	CHECK_INT(cache_dir_recover(c), 0);

	/* the identity file removed */
	snprintf(path, sizeof(path), "%s/dstage-cache", cachedir);
	CHECK_INT(unlink(path), 0);
	CHECK_INT(cache_dir_recover(c), 1);
	CHECK(access(path, F_OK) == 0);

	/* cache.dir removed: recreated, private, with its identity */
	CHECK_INT(rm_rf(cachedir), 0);
	CHECK_INT(cache_dir_recover(c), 1);
	CHECK_INT(mode_of(cachedir), 0700);
	CHECK_INT(mode_of(objdir), 0700);
	CHECK(access(path, F_OK) == 0);
	CHECK_INT(read_back(c, os, want), 0);

	/* objects/ planted writable by everyone: refused and left alone;
	 * taken once made private */
	plant_dir(objdir, 0777);
	CHECK_INT(cache_dir_recover(c), -EACCES);
	CHECK_INT(mode_of(objdir), 0777);
	CHECK_INT(chmod(objdir, 0700), 0);
	CHECK_INT(cache_dir_recover(c), 1);
	CHECK_INT(read_back(c, os, want), 0);

	/* objects/ planted as a link to a directory of the same owner and
	 * mode: never followed, nothing written through it */
	CHECK_INT(rm_rf(objdir), 0);
	CHECK_INT(symlink(elsewhere, objdir), 0);
	{
		int ret = cache_dir_recover(c);

		CHECK(ret < 0);
		CHECK(ret == -ELOOP || ret == -ENOTDIR);
	}
	read_back(c, os, want); /* whatever it answers, not through the link */
	CHECK_INT(dir_empty(elsewhere), 0);
	CHECK_INT(unlink(objdir), 0);
	CHECK_INT(cache_dir_recover(c), 1);

	/* objects/ planted by another user, private to them */
	if (geteuid() == 0) {
		plant_dir(objdir, 0700);
		CHECK_INT(chown(objdir, 65534, 65534), 0);
		CHECK_INT(cache_dir_recover(c), -EACCES);
		CHECK_INT(chown(objdir, 0, 0), 0);
		CHECK_INT(cache_dir_recover(c), 1);
	} else {
		fprintf(stderr, "not root: the other owner's directory is not "
				"tried\n");
	}

	/* cache.dir planted writable by everyone */
	plant_dir(cachedir, 0777);
	CHECK_INT(cache_dir_recover(c), -EACCES);
	CHECK_INT(mode_of(cachedir), 0777);
	CHECK_INT(chmod(cachedir, 0700), 0);
	CHECK_INT(cache_dir_recover(c), 1);
	CHECK_INT(read_back(c, os, want), 0);

	cache_close(c);
	objstore_free(os);
	cfg->cache_dir = orig_dir;
	config_free(cfg);
	if (rm_rf(tmp))
		return 1;
	return check_result();
}
