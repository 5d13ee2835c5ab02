// SPDX-License-Identifier: MIT
/*
 * fuzz_manifest: the catalog's manifest import (catalog_register_source in
 * lib/catalog/catalog_register.c) from a listing and a SHA256SUMS file that are
 * both the input's, into a real SQLite catalog (one file under /dev/shm,
 * one dataset registered again by every input).
 *
 * Input: the listing, one key a line (sorted into byte order, as a source
 * lists; the key's size is its line number), then a NUL byte and the
 * SHA256SUMS text (listed as key SHA256SUMS when there is a NUL).
 *
 * Checks: registration succeeds; walking the new manifest with
 * catalog_readdir finds names that are single, valid path segments, and as
 * many files and bytes as the dataset's counts say; every listed key that
 * is a valid path can be looked up (as a file, or as the directory that
 * wins over it); a file named once in SHA256SUMS by a good line has that
 * expected hash.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "catalog/catalog_i.h"
#include "dstage/catalog.h"
#include "dstage/keypath.h"
#include "dstage/log.h"
#include "dstage/sha256sums.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_KEYS 256

/* catalog_register's source; this target registers through its own. */
int objstore_list_tree(struct objstore *os, const char *prefix,
		       objstore_list_cb cb, void *arg)
{
	(void)os, (void)prefix, (void)cb, (void)arg;
	abort();
}

int objstore_get(struct objstore *os, const char *key, uint64_t off, size_t len,
		 const char *etag, void *buf, size_t *got)
{
	(void)os, (void)key, (void)off, (void)len, (void)etag, (void)buf;
	(void)got;
	abort();
}

struct src {
	char *keys[MAX_KEYS + 1];
	size_t n;
	const char *sums;
	size_t sums_len;
	bool has_sums;
};

static int src_list(void *arg, objstore_list_cb cb, void *cb_arg)
{
	struct src *s = arg;

	for (size_t i = 0; i < s->n; i++) {
		struct objstore_info oi = { .key = s->keys[i] };
		int ret;

		oi.size = strcmp(oi.key, CATALOG_SUMS_KEY_DEFAULT) == 0
				  ? s->sums_len
				  : i;
		snprintf(oi.etag, sizeof(oi.etag), "\"%zu\"", i);
		oi.mtime = 1700000000;
		ret = cb(cb_arg, &oi);
		if (ret)
			return ret;
	}
	return 0;
}

static int src_read(void *arg, const struct objstore_info *oi,
		    struct sha256sums_parser *p)
{
	struct src *s = arg;

	if (strcmp(oi->key, CATALOG_SUMS_KEY_DEFAULT))
		abort();
	/* In pieces of 13 bytes, as a streaming reader would feed it. */
	for (size_t off = 0; off < s->sums_len; off += 13) {
		size_t n = s->sums_len - off < 13 ? s->sums_len - off : 13;
		int ret = sha256sums_feed(p, s->sums + off, n);

		if (ret)
			return ret;
	}
	return 0;
}

static int key_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* catalog_readdir holds a transaction while it calls back, so the walk
 * queues the directories it finds and lists them one after another. */
struct walk {
	struct catalog *cat;
	uint64_t files, bytes;
	const char *dir; /* being listed */
	char **queue;
	size_t n, cap;
};

static int walk_entry(void *arg, const char *name,
		      const struct catalog_entry *e)
{
	struct walk *w = arg;
	size_t nlen = strlen(name), dlen = strlen(w->dir);
	const char *why;
	char *path;

	if (keypath_check(name, nlen, &why) || strchr(name, '/'))
		abort(); /* a name that is not one valid segment */
	if (!e->is_dir) {
		w->files++;
		w->bytes += e->size;
		return 0;
	}
	if (w->n == w->cap) {
		w->cap = w->cap ? 2 * w->cap : 16;
		w->queue = realloc(w->queue, w->cap * sizeof(*w->queue));
		if (!w->queue)
			abort();
	}
	path = malloc(dlen + nlen + 2);
	if (!path)
		abort();
	if (dlen)
		snprintf(path, dlen + nlen + 2, "%s/%s", w->dir, name);
	else
		memcpy(path, name, nlen + 1);
	if (strlen(path) >= KEYPATH_MAX)
		abort();
	w->queue[w->n++] = path;
	return 0;
}

/* Every file under the root; -errno from catalog_readdir. */
static int walk(struct walk *w)
{
	int ret;

	w->dir = "";
	ret = catalog_readdir(w->cat, "d", "", NULL, walk_entry, w);
	for (size_t i = 0; !ret && i < w->n; i++) {
		w->dir = w->queue[i];
		ret = catalog_readdir(w->cat, "d", w->dir, NULL, walk_entry, w);
	}
	for (size_t i = 0; i < w->n; i++)
		free(w->queue[i]);
	free(w->queue);
	return ret;
}

/* How many good lines of the sums text name name, and the hash of the
 * last one. */
struct sums_count {
	const char *name;
	unsigned n;
	unsigned char hash[32];
};

static int count_entry(void *arg, const char *name, size_t len,
		       const unsigned char hash[32], bool binary)
{
	struct sums_count *c = arg;

	(void)binary;
	if (strlen(c->name) == len && memcmp(c->name, name, len) == 0) {
		c->n++;
		memcpy(c->hash, hash, 32);
	}
	return 0;
}

static int count_bad(void *arg, unsigned long line, const char *why)
{
	(void)arg, (void)line, (void)why;
	return 0;
}

static struct catalog *cat;
static char dir[64];

static void remove_dir(void)
{
	static const char *const files[] = { "c.db", "c.db-wal", "c.db-shm" };
	char path[96];

	for (size_t i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		unlink(path);
	}
	rmdir(dir);
}

/* The catalog refuses a directory others may write (/dev/shm is 1777):
 * it goes in a 0700 directory of its own, removed at exit. */
static void open_catalog(void)
{
	char path[96];

	log_set_level(LOG_LVL_ERROR);
	snprintf(dir, sizeof(dir), "/dev/shm/fuzz_manifest.%d", (int)getpid());
	remove_dir();
	if (mkdir(dir, 0700))
		abort();
	atexit(remove_dir);
	snprintf(path, sizeof(path), "%s/c.db", dir);
	if (catalog_open(path, CATALOG_CREATE, &cat) ||
	    catalog_dataset_add(cat, "d", "file:///fuzz/", NULL))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct catalog_source cs = { src_list, src_read, NULL };
	struct src *s = calloc(1, sizeof(*s));
	struct catalog_dataset ds = { 0 };
	struct walk w = { 0 };
	char *text = malloc(size + 1), *line, *save = NULL;
	const char *nul;
	size_t list_len;

	if (!s || !text)
		abort();
	if (!cat)
		open_catalog();
	memcpy(text, data, size);
	text[size] = '\0';
	nul = memchr(data, '\0', size);
	list_len = nul ? (size_t)(nul - (const char *)data) : size;
	if (nul) {
		s->has_sums = true;
		s->sums = text + list_len + 1;
		s->sums_len = size - list_len - 1;
		s->keys[s->n++] = strdup(CATALOG_SUMS_KEY_DEFAULT);
	}
	text[list_len] = '\0';
	for (line = strtok_r(text, "\n", &save); line && s->n < MAX_KEYS;
	     line = strtok_r(NULL, "\n", &save))
		s->keys[s->n++] = strdup(line);
	qsort(s->keys, s->n, sizeof(s->keys[0]), key_cmp);
	cs.arg = s;

	if (catalog_register_source(cat, "d", &cs))
		abort();
	if (catalog_dataset_get(cat, "d", &ds))
		abort();
	w.cat = cat;
	if (walk(&w) || w.files != ds.objects || w.bytes != ds.bytes)
		abort();

	for (size_t i = 0; i < s->n; i++) {
		const char *k = s->keys[i], *why;
		size_t klen = strlen(k);
		struct catalog_entry e;
		struct sums_count c = { .name = k };
		struct sha256sums_parser p;

		if (keypath_dir_marker(k, klen) || keypath_check(k, klen, &why))
			continue;
		if (catalog_lookup(cat, "d", k, &e))
			abort(); /* a good key lost */
		if (e.is_dir || !s->has_sums)
			continue;
		sha256sums_init(&p, count_entry, count_bad, &c);
		if (sha256sums_feed(&p, s->sums, s->sums_len) ||
		    sha256sums_finish(&p))
			abort();
		sha256sums_release(&p);
		if (c.n == 1 &&
		    (!e.has_expected || memcmp(e.expected_sha256, c.hash, 32)))
			abort(); /* a good hash line not recorded */
	}

	catalog_dataset_release(&ds);
	for (size_t i = 0; i < s->n; i++)
		free(s->keys[i]);
	free(s);
	free(text);
	return 0;
}
