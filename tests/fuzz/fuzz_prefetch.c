// SPDX-License-Identifier: MIT
/*
 * fuzz_prefetch: what a user writes to .dstage/prefetch, through
 * fs/dsfs_ctl.c's own hooks (open, write, flush, release), with the FUSE
 * dispatcher, the dataset table, the catalog and the cache replaced by the
 * stubs below.
 *
 * Input: byte 0 picks the limits (entries and bytes of one list and of the
 * uid), byte 1 the size of each write; the rest is the text written, and a
 * 0xff byte in it closes the file (flush, release) and opens a new one.
 *
 * Checks: every write answers its whole size, a shorter positive count or
 * -EDQUOT; the cache gets only files the writer may read, each once, with
 * the catalog's size and ETag, never more than the list's limit; every
 * dataset reference taken is given back and every uid's charge released
 * (a new list after all of them may again hold the limit); the status file
 * reads as the summary.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsfs_ctl.h"
#include "dsfs_dataset.h"
#include "dsfs_opts.h"
#include "dstage/cache.h"
#include "dstage/catalog.h"
#include "dstage/keypath.h"
#include "dstage/objstore.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- stubs of what dsfs_ctl.c calls ---- */

/* "a" and "b" anyone reads; "r" only uid 0. */
static struct dsfs_dataset dss[3] = {
	{ .name = "a" },
	{ .name = "b" },
	{ .name = "r", .restricted = true },
};
static struct catalog *const fake_cat = (struct catalog *)&dss;
static uint64_t submitted, submit_limit;
static uid_t writer_uid;
static char status[600];
static size_t status_len;

struct dsfs_dataset *dsfs_dataset_table_current(struct dsfs_dataset_table *t,
						const char *name)
{
	(void)t;
	for (size_t i = 0; i < 3; i++)
		if (strcmp(dss[i].name, name) == 0) {
			atomic_fetch_add(&dss[i].refs, 1);
			return &dss[i];
		}
	return NULL;
}

void dsfs_dataset_put(struct dsfs_dataset *d)
{
	if (d && atomic_fetch_sub(&d->refs, 1) <= 0)
		abort(); /* a reference given back twice */
}

bool dsfs_dataset_allowed(const struct dsfs_dataset *d, struct dsfs_caller *who)
{
	return !d->restricted || who->uid == 0;
}

struct catalog *dsfs_dataset_catalog(struct dsfs_dataset_table *t, int *err)
{
	(void)t;
	*err = 0;
	return fake_cat;
}

/* A valid key starting with 'd' is a directory, with 'x' absent; any other
 * valid key is a file of strlen(key) bytes and ETag "e<len>". */
int catalog_lookup(struct catalog *cat, const char *dataset, const char *path,
		   struct catalog_entry *e)
{
	const char *why;
	size_t len = strlen(path);

	if (cat != fake_cat || !dataset)
		abort();
	memset(e, 0, sizeof(*e));
	if (len == 0) {
		e->is_dir = true;
		return 0;
	}
	if (keypath_check(path, len, &why) || path[0] == 'x')
		return -ENOENT;
	e->is_dir = path[0] == 'd';
	e->size = e->is_dir ? 0 : len;
	snprintf(e->etag, sizeof(e->etag), "e%zu", len);
	return 0;
}

int cache_prefetch(struct cache *c, const struct cache_object *objs, size_t n,
		   uint64_t window)
{
	char etag[32];

	(void)c;
	(void)window;
	for (size_t i = 0; i < n; i++) {
		const struct cache_object *o = &objs[i];
		size_t len = strlen(o->key);
		const char *why;

		snprintf(etag, sizeof(etag), "e%zu", len);
		if (strcmp(o->dataset, objs[0].dataset) ||
		    (strcmp(o->dataset, "r") == 0 && writer_uid != 0) ||
		    o->key[0] == 'd' || o->key[0] == 'x' ||
		    keypath_check(o->key, len, &why) || o->size != len ||
		    strcmp(o->etag, etag))
			abort();
		for (size_t j = 0; j < i; j++)
			if (strcmp(objs[j].key, o->key) == 0)
				abort(); /* a duplicate kept */
	}
	submitted += n;
	if (submitted > submit_limit)
		abort();
	return 0;
}

void cache_get_stats(struct cache *c, struct cache_stats *st)
{
	(void)c;
	memset(st, 0, sizeof(*st));
}

void objstore_get_tier_stats(struct objstore_tier_stats *st)
{
	memset(st, 0, sizeof(*st));
}

const char *objstore_tier_cause_name(int cause)
{
	(void)cause;
	return "stub";
}

void dsfs_caller_load_groups(struct dsfs_caller *who)
{
	who->ngroups = 0;
}

int dsfs_nodes_add_fixed(struct dsfs_nodes *t, fuse_ino_t ino,
			 fuse_ino_t parent, const struct dsfs_subtree *sub,
			 const char *name, void *priv)
{
	(void)t, (void)ino, (void)parent, (void)sub, (void)name, (void)priv;
	return 0;
}

struct dsfs_node *dsfs_nodes_find(struct dsfs_nodes *t, fuse_ino_t ino)
{
	(void)t, (void)ino;
	return NULL;
}

void dsfs_reply_attr(const struct dsfs_opts *o, struct stat *st, fuse_ino_t ino,
		     bool dir, uint64_t size, int64_t mtime)
{
	(void)o, (void)ino, (void)dir, (void)size, (void)mtime;
	memset(st, 0, sizeof(*st));
}

int dsfs_reply_dir_add(struct dsfs_reply_dir *d, const char *name,
		       const struct dsfs_entry *e, off_t off)
{
	(void)d, (void)name, (void)e, (void)off;
	return 0;
}

int dsfs_reply_read_buf(struct dsfs_reply_read *r, const void *buf, size_t len)
{
	(void)r;
	if (len >= sizeof(status))
		abort();
	memcpy(status, buf, len);
	status[len] = '\0';
	status_len = len;
	return (int)len;
}

/* ---- the driver ---- */

static struct dsfs_node pf_node = { .ino = DSFS_INO_PREFETCH };

static int pf_open(struct dsfs *fs, struct dsfs_caller *who,
		   struct fuse_file_info *fi, int flags)
{
	memset(fi, 0, sizeof(*fi));
	fi->flags = flags;
	return dsfs_ctl_subtree.open(fs, who, &pf_node, fi);
}

static void pf_close(struct dsfs *fs, struct dsfs_caller *who,
		     struct fuse_file_info *fi)
{
	if (dsfs_ctl_subtree.flush(fs, who, &pf_node, fi))
		abort();
	dsfs_ctl_subtree.release(fs, who, &pf_node, fi);
}

/* The status file after a list: "lines N\nobjects N\n...result ok\n". */
static void check_status(struct dsfs *fs, struct dsfs_caller *who)
{
	struct fuse_file_info fi;
	struct dsfs_reply_read r = { 0 };
	int n;

	if (pf_open(fs, who, &fi, O_RDONLY))
		abort();
	status_len = 0;
	n = dsfs_ctl_subtree.read(fs, who, &pf_node, &fi, 4096, 0, &r);
	if (n < 0 || (size_t)n != status_len ||
	    (strncmp(status, "lines ", 6) && strcmp(status, "no list yet\n")) ||
	    (status_len && status[status_len - 1] != '\n'))
		abort();
	dsfs_ctl_subtree.release(fs, who, &pf_node, &fi);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dsfs_opts o = { .mountpoint = "/mnt/ds" };
	struct dsfs fs = { .opts = &o, .cache = (struct cache *)&dss };
	struct dsfs_caller who = { .uid = 1000, .gid = 1000, .ngroups = -1 };
	struct fuse_file_info fi;
	size_t step, off, lists = 1;
	int ret;

	if (size < 2)
		return 0;
	o.pf_max_entries = 1 + data[0] % 8;
	o.pf_max_bytes = 200 + (uint64_t)(data[0] >> 3 & 3) * 400;
	o.pf_uid_max_entries = 1 + (data[0] >> 5) * 3;
	o.pf_uid_max_bytes = 1u << 20;
	o.ctl_max_handles = 4;
	o.prefetch_window = 1u << 20;
	if (data[0] & 0x80)
		who.uid = 0;
	writer_uid = who.uid;
	step = data[1] % 32 + 1;
	data += 2;
	size -= 2;
	submitted = 0;
	submit_limit = 0;

	if (dsfs_ctl_subtree.init(&fs))
		abort();
	if (pf_open(&fs, &who, &fi, O_WRONLY))
		abort();
	submit_limit += o.pf_max_entries;
	for (off = 0; off < size;) {
		size_t n = size - off < step ? size - off : step;
		const uint8_t *cut = memchr(data + off, 0xff, n);
		ssize_t w;

		if (cut == data + off) {
			pf_close(&fs, &who, &fi);
			if (pf_open(&fs, &who, &fi, O_WRONLY))
				abort();
			submit_limit += o.pf_max_entries;
			lists++;
			off++;
			continue;
		}
		if (cut)
			n = (size_t)(cut - (data + off));
		w = dsfs_ctl_subtree.write(&fs, &who, &pf_node, &fi,
					   (const char *)data + off, n,
					   (off_t)off);
		if (w != (ssize_t)n && w != -EDQUOT &&
		    (w <= 0 || (size_t)w > n))
			abort();
		off += n;
	}
	pf_close(&fs, &who, &fi);
	check_status(&fs, &who);

	for (size_t i = 0; i < 3; i++)
		if (atomic_load(&dss[i].refs) != 0)
			abort(); /* a dataset reference kept */

	/* Every charge given back: a fresh list holds its limit again. */
	ret = pf_open(&fs, &who, &fi, O_WRONLY);
	if (ret)
		abort();
	submitted = 0;
	submit_limit = o.pf_max_entries;
	{
		char line[32];
		/* "a/fN" costs 96 + 2 + 2 + 2 bytes (key, ETag "e2"). */
		uint64_t want = o.pf_max_entries < o.pf_uid_max_entries
					? o.pf_max_entries
					: o.pf_uid_max_entries;

		if (want > o.pf_max_bytes / 102)
			want = o.pf_max_bytes / 102;

		for (uint64_t i = 0; i < want; i++) {
			int len = snprintf(line, sizeof(line),
					   "a/f%" PRIu64 "\n", i);

			if (dsfs_ctl_subtree.write(&fs, &who, &pf_node, &fi,
						   line, (size_t)len, 0) != len)
				abort(); /* a charge of an earlier list kept */
		}
		pf_close(&fs, &who, &fi);
		if (submitted != want)
			abort();
	}
	(void)lists;
	dsfs_ctl_subtree.destroy(&fs);
	return 0;
}
