// SPDX-License-Identifier: MIT
/*
 * test_cache_migrate: objects cached in the one-file formats (versions 1
 * and 2: header, records, then the blocks at data_off) are migrated at
 * open to version 3's pair (the bytes at offset 0 of the data file, header
 * and records in the sidecar), issue 31. The old files are written by
 * tests/unit/cacheold.h from docs/cache.md's layout, not by lib/cache.
 *
 *   version 2, every block present, by FALLOC_FL_COLLAPSE_RANGE where the
 *   file system has it: nothing fetched, the data file is the object's
 *   bytes exactly, the sidecar is version 3;
 *   the same by copying (DSTAGE_NO_COLLAPSE=1), with blocks absent: only
 *   those are fetched, the others were moved;
 *   another open file description of the old file (another process's idle
 *   object, a descriptor handed out for splicing): not migrated, read as
 *   it is, nothing fetched; migrated at the next open once it is closed;
 *   a crash inside the migration (the header already zeroed, no sidecar
 *   linked): the file is removed and the object fetched again, never a
 *   wrong byte;
 *   cachectl gc's listing pairs each sidecar with its data file (one entry,
 *   both files' bytes), lists a sidecar whose data file is gone alone and
 *   removes it; dropping an object removes both files.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "cacheold.h"
#include "cachetest.h"
#include "dstage/cache.h"
#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

#define BS 4096u
#define NBLOCKS 9u
#define SIZE ((NBLOCKS - 1) * BS + 100) /* a partial last block */

static char tmp[256], srcdir[300], cachedir[300];
static struct dstage_config *cfg;
static uint64_t rnd_state = 0x2545f4914f6cdd1dULL;

static int put(const char *key, char *data)
{
	char path[400];
	FILE *f;
	int ok;

	for (size_t i = 0; i < SIZE; i++)
		data[i] = (char)cachetest_rnd(&rnd_state);
	snprintf(path, sizeof(path), "%s/%s", srcdir, key);
	f = fopen(path, "wb");
	ok = f && fwrite(data, 1, SIZE, f) == SIZE;
	if (f && fclose(f))
		ok = 0;
	return ok ? 0 : -1;
}

/* The sidecar of key's object (the key follows the dataset "d" at 64). */
static int meta_of(const char *key, char *out, size_t len)
{
	char pat[400], name[16];
	glob_t g;
	int ret = -1;

	snprintf(pat, sizeof(pat), "%s/objects/*/*.meta", cachedir);
	if (glob(pat, 0, NULL, &g))
		return -1;
	for (size_t i = 0; i < g.gl_pathc && ret; i++) {
		int fd = open(g.gl_pathv[i], O_RDONLY);

		memset(name, 0, sizeof(name));
		if (fd >= 0 && pread(fd, name, strlen(key), 65) > 0 &&
		    !memcmp(name, key, strlen(key))) {
			snprintf(out, len, "%s", g.gl_pathv[i]);
			ret = 0;
		}
		if (fd >= 0)
			close(fd);
	}
	globfree(&g);
	return ret;
}

static bool exists(const char *path)
{
	return access(path, F_OK) == 0;
}

/* The object was migrated: a version 3 sidecar beside a data file that
 * holds exactly the object's bytes (want). */
static bool is_pair(const char *meta, const char *want)
{
	static char got[SIZE + 1];
	char data[400];
	uint32_t version = 0;
	struct stat st;
	bool ok;
	int mfd = open(meta, O_RDONLY), dfd;

	cacheold_data_path(meta, data, sizeof(data));
	dfd = open(data, O_RDONLY);
	ok = mfd >= 0 && dfd >= 0 && pread(mfd, &version, 4, 8) == 4 &&
	     version == 3 && fstat(dfd, &st) == 0 && st.st_size == SIZE &&
	     pread(dfd, got, SIZE + 1, 0) == SIZE && !memcmp(got, want, SIZE);
	if (mfd >= 0)
		close(mfd);
	if (dfd >= 0)
		close(dfd);
	return ok;
}

/* One gc listing: what it says of each file. */
struct gc_seen {
	unsigned files, objects, leftovers;
	uint64_t object_bytes;
	char leftover[200];
};

static int gc_note(void *arg, const struct cache_gc_file *f)
{
	struct gc_seen *s = arg;

	s->files++;
	if (f->object) {
		s->objects++;
		s->object_bytes += f->bytes;
	} else {
		s->leftovers++;
		snprintf(s->leftover, sizeof(s->leftover), "%s", f->name);
	}
	return 0;
}

static uint64_t disk_bytes(const char *path)
{
	struct stat st;

	return stat(path, &st) ? 0 : (uint64_t)st.st_blocks * 512;
}

static void test_gc_and_drop(const char *meta, const char *other,
			     const char *key)
{
	char data[400], odata[400], orphan[400], cmd[1000];
	struct gc_seen s = { 0 };
	struct cache *c = NULL;
	struct objstore *os = NULL;
	struct objstore_info oi;
	struct cache_object o;
	uint64_t freed = 0;

	cacheold_data_path(meta, data, sizeof(data));
	cacheold_data_path(other, odata, sizeof(odata));
	CHECK_INT(cache_open(cfg, NULL, &c), 0);
	if (!c)
		return;
	/* A sidecar whose data file is gone, beside the pair. */
	snprintf(orphan, sizeof(orphan), "%s/objects/00", cachedir);
	mkdir(orphan, 0700);
	snprintf(orphan, sizeof(orphan),
		 "%s/objects/00/000000000000000000000000000000.meta", cachedir);
	snprintf(cmd, sizeof(cmd), "cp -p '%s' '%s'", meta, orphan);
	CHECK_INT(system(cmd), 0);
	CHECK_INT(cache_gc_list(c, gc_note, &s), 0);
	/* each pair: one entry (the data file's name), both files' bytes */
	CHECK_INT(s.objects, 2);
	CHECK_INT(s.object_bytes, disk_bytes(meta) + disk_bytes(data) +
					  disk_bytes(other) +
					  disk_bytes(odata));
	CHECK_INT(s.leftovers, 1);
	CHECK(!strcmp(s.leftover, "00/000000000000000000000000000000.meta"));
	CHECK_INT(cache_gc_remove(c, s.leftover, &freed), 0);
	CHECK(!exists(orphan));
	CHECK(freed > 0);
	/* a sidecar with its data file is not removed alone */
	CHECK_INT(cache_gc_remove(c, meta + strlen(cachedir) + 9, &freed),
		  -EBUSY);
	CHECK(exists(meta));

	/* Dropping the object removes both files. */
	snprintf(cmd, sizeof(cmd), "file://%s/", srcdir);
	CHECK_INT(objstore_open(cmd, cfg, &os), 0);
	CHECK_INT(objstore_head(os, key, &oi), 0);
	o = (struct cache_object){ .dataset = "d",
				   .os = os,
				   .key = key,
				   .etag = oi.etag,
				   .size = SIZE };
	CHECK_INT(cache_object_drop(c, &o), 0);
	CHECK(!exists(meta));
	CHECK(!exists(data));
	cache_close(c);
	objstore_free(os);
}

int main(void)
{
	static char a[SIZE], b[SIZE], got[SIZE];
	const char *base = getenv("TMPDIR");
	char ma[400] = "", mb[400] = "", da[400], db[400], cmd[400];
	uint64_t fetches = 0;
	char *orig_dir;
	int hold;

	log_set_level(LOG_LVL_ERROR);
	snprintf(tmp, sizeof(tmp), "%s/test_cache_migrate.XXXXXX",
		 base && *base ? base : "/tmp");
	if (!mkdtemp(tmp))
		return 1;
	snprintf(srcdir, sizeof(srcdir), "%s/src", tmp);
	snprintf(cachedir, sizeof(cachedir), "%s/cache", tmp);
	mkdir(srcdir, 0755);
	CHECK_INT(put("ka", a), 0);
	CHECK_INT(put("kb", b), 0);
	CHECK_INT(config_defaults(&cfg), 0);
	if (!cfg)
		return 1;
	orig_dir = cfg->cache_dir;
	cfg->cache_dir = cachedir;
	cfg->cache_block_size = BS;
	cfg->cache_size = 1ULL << 30;

	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "ka", SIZE, got, &fetches),
		  0);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "kb", SIZE, got, &fetches),
		  0);
	CHECK_INT(meta_of("ka", ma, sizeof(ma)), 0);
	CHECK_INT(meta_of("kb", mb, sizeof(mb)), 0);
	cacheold_data_path(ma, da, sizeof(da));
	cacheold_data_path(mb, db, sizeof(db));
	CHECK(is_pair(ma, a));

	/* Version 2, whole: migrated in place, nothing fetched. */
	CHECK_INT(cacheold_make(ma, 2, BS, ~0ull), 0);
	CHECK(!exists(ma));
	memset(got, 0, SIZE);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "ka", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, a, SIZE));
	CHECK_INT(fetches, 0);
	CHECK(is_pair(ma, a));

	/* By copying, blocks 2 and 7 absent: those two are fetched. */
	CHECK_INT(cacheold_make(mb, 2, BS, ~0ull & ~(1ull << 2 | 1ull << 7)),
		  0);
	setenv("DSTAGE_NO_COLLAPSE", "1", 1);
	memset(got, 0, SIZE);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "kb", SIZE, got, &fetches),
		  0);
	unsetenv("DSTAGE_NO_COLLAPSE");
	CHECK(!memcmp(got, b, SIZE));
	CHECK_INT(fetches, 2);
	CHECK(is_pair(mb, b));
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "kb", SIZE, got, &fetches),
		  0);
	CHECK_INT(fetches, 0);

	/* Open elsewhere: read as it is, then migrated once closed. */
	CHECK_INT(cacheold_make(ma, 2, BS, ~0ull), 0);
	hold = open(da, O_RDONLY);
	CHECK(hold >= 0);
	memset(got, 0, SIZE);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "ka", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, a, SIZE));
	CHECK_INT(fetches, 0);
	CHECK(!exists(ma)); /* still one file */
	if (hold >= 0)
		close(hold);
	memset(got, 0, SIZE);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "ka", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, a, SIZE));
	CHECK_INT(fetches, 0);
	CHECK(is_pair(ma, a));

	/* A crash inside a migration: header zeroed, no sidecar. */
	CHECK_INT(cacheold_make(ma, 1, BS, ~0ull), 0);
	{
		static const char zeros[64];
		int fd = open(da, O_RDWR);

		CHECK(fd >= 0 && pwrite(fd, zeros, 64, 0) == 64);
		if (fd >= 0)
			close(fd);
	}
	memset(got, 0, SIZE);
	CHECK_INT(cachetest_read_fresh(cfg, srcdir, "ka", SIZE, got, &fetches),
		  0);
	CHECK(!memcmp(got, a, SIZE));
	CHECK_INT(fetches, NBLOCKS); /* all of it again */
	CHECK(is_pair(ma, a));

	test_gc_and_drop(ma, mb, "ka");

	cfg->cache_dir = orig_dir;
	config_free(cfg);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd))
		return 1;
	return check_result();
}
