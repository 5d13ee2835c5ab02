// SPDX-License-Identifier: MIT
/* config: defaults, file, environment, and the messages for bad values. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dstage/config.h"
#include "dstage/log.h"

static char tmpdir[] = "/tmp/dstage-test-config-XXXXXX";

static const char *write_conf(const char *name, const char *text)
{
	static char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	f = fopen(path, "w");
	if (!f)
		return NULL;
	fputs(text, f);
	fclose(f);
	return path;
}

static void clear_env(void)
{
	unsetenv("DSTAGE_CONFIG");
	unsetenv("AWS_ENDPOINT_URL");
	unsetenv("AWS_REGION");
	unsetenv("AWS_DEFAULT_REGION");
	unsetenv("DSTAGE_CACHE_DIR");
	unsetenv("DSTAGE_S3_ENDPOINT");
	unsetenv("DSTAGE_S3_REGION");
	unsetenv("DSTAGE_CACHE_SIZE");
	unsetenv("DSTAGE_S3_COPY_THRESHOLD");
	unsetenv("DSTAGE_S3_COPY_PART_SIZE");
}

static void test_sizes(void)
{
	uint64_t v = 0;
	unsigned ms = 0;

	CHECK_INT(config_parse_size("4096", &v), 0);
	CHECK_INT(v, 4096);
	CHECK_INT(config_parse_size("500M", &v), 0);
	CHECK_INT(v, 500ULL << 20);
	CHECK_INT(config_parse_size("2G", &v), 0);
	CHECK_INT(v, 2ULL << 30);
	CHECK_INT(config_parse_size("1T", &v), 0);
	CHECK_INT(v, 1ULL << 40);
	CHECK_INT(config_parse_size("4MiB", &v), 0);
	CHECK_INT(v, 4ULL << 20);
	CHECK_INT(config_parse_size("1.5G", &v), 0);
	CHECK_INT(v, 3ULL << 29);
	CHECK_INT(config_parse_size("4 KB", &v), 0);
	CHECK_INT(v, 4096);
	CHECK_INT(config_parse_size("", &v), -EINVAL);
	CHECK_INT(config_parse_size("-1G", &v), -EINVAL);
	CHECK_INT(config_parse_size("12Q", &v), -EINVAL);
	CHECK_INT(config_parse_size("1Gx", &v), -EINVAL);
	CHECK_INT(config_parse_size("1.3", &v), -EINVAL);
	CHECK_INT(config_parse_size("99999999999P", &v), -ERANGE);
	CHECK_INT(config_parse_duration_ms("250ms", &ms), 0);
	CHECK_INT(ms, 250);
	CHECK_INT(config_parse_duration_ms("30s", &ms), 0);
	CHECK_INT(ms, 30000);
	CHECK_INT(config_parse_duration_ms("5m", &ms), 0);
	CHECK_INT(ms, 300000);
	CHECK_INT(config_parse_duration_ms("7", &ms), 0);
	CHECK_INT(ms, 7000);
	CHECK_INT(config_parse_duration_ms("3 days", &ms), -EINVAL);
}

static void test_defaults_without_file(void)
{
	struct dstage_config *cfg = NULL;
	char err[512];

	clear_env();
	/* Not explicit, default path absent here: defaults only. */
	if (access(CONFIG_DEFAULT_PATH, F_OK) == 0)
		return;
	CHECK_INT(config_load(NULL, &cfg, err, sizeof(err)), 0);
	if (!cfg)
		return;
	CHECK_INT(cfg->cache_block_size, 4u << 20);
	CHECK_STR(cfg->s3_region, "us-east-1");
	CHECK(cfg->s3_path_style);
	CHECK(cfg->s3_verify_tls);
	CHECK(cfg->s3_endpoint == NULL);
	CHECK(cfg->source_file == NULL);
	/* Safe by default: no token in clear, no symlink followed. */
	CHECK(!cfg->s3_allow_insecure_token);
	CHECK_INT(cfg->sources_follow_symlinks, CONFIG_SYMLINKS_NO);
	config_free(cfg);
}

/* cache.verify_reads, cache.scrub_rate and cache.scrub_interval (issue
 * 31): defaults, values, refusals, and config_dump's spelling. */
static void test_verify_and_scrub_keys(void)
{
	struct dstage_config *cfg = NULL;
	char err[512], *text = NULL;
	size_t len = 0;
	FILE *f;

	clear_env();
	CHECK_INT(config_defaults(&cfg), 0);
	if (!cfg)
		return;
	CHECK_INT(cfg->cache_verify_reads, CONFIG_VERIFY_FILL);
	CHECK(cfg->cache_scrub_rate == 50ull << 20);
	CHECK_INT(cfg->cache_scrub_interval_ms, 7u * 24 * 3600 * 1000);
	CHECK_INT(config_set(cfg, "cache.verify_reads", "always", err,
			     sizeof(err)),
		  0);
	CHECK_INT(cfg->cache_verify_reads, CONFIG_VERIFY_ALWAYS);
	CHECK_INT(config_set(cfg, "cache.verify_reads", "never", err,
			     sizeof(err)),
		  -EINVAL);
	CHECK_STR(err, "bad value 'never' for cache.verify_reads: "
		       "expected fill or always");
	CHECK_INT(cfg->cache_verify_reads, CONFIG_VERIFY_ALWAYS);
	CHECK_INT(config_set(cfg, "cache.scrub_rate", "0", err, sizeof(err)),
		  0);
	CHECK(cfg->cache_scrub_rate == 0);
	CHECK_INT(
		config_set(cfg, "cache.scrub_interval", "2s", err, sizeof(err)),
		0);
	CHECK_INT(cfg->cache_scrub_interval_ms, 2000);
	CHECK_INT(config_set(cfg, "cache.scrub_interval", "10ms", err,
			     sizeof(err)),
		  -EINVAL);
	f = open_memstream(&text, &len);
	if (f) {
		config_dump(cfg, f);
		fclose(f);
		CHECK(text && strstr(text, "verify_reads = always\n"));
		CHECK(text && strstr(text, "scrub_interval = 2000ms\n"));
	}
	free(text);
	config_free(cfg);
}

static void test_security_keys(void)
{
	struct dstage_config *cfg = NULL;
	char err[512];

	clear_env();
	CHECK_INT(config_defaults(&cfg), 0);
	if (!cfg)
		return;
	CHECK_INT(config_set(cfg, "sources.follow_symlinks", "inside", err,
			     sizeof(err)),
		  0);
	CHECK_INT(cfg->sources_follow_symlinks, CONFIG_SYMLINKS_INSIDE);
	CHECK_INT(config_set(cfg, "sources.follow_symlinks", "no", err,
			     sizeof(err)),
		  0);
	CHECK_INT(cfg->sources_follow_symlinks, CONFIG_SYMLINKS_NO);
	CHECK_INT(config_set(cfg, "sources.follow_symlinks", "always", err,
			     sizeof(err)),
		  -EINVAL);
	CHECK_STR(err, "bad value 'always' for sources.follow_symlinks: "
		       "expected no or inside");
	CHECK_INT(config_set(cfg, "s3.allow_insecure_token", "yes", err,
			     sizeof(err)),
		  0);
	CHECK(cfg->s3_allow_insecure_token);
	config_free(cfg);
}

static void test_file_and_env(void)
{
	struct dstage_config *cfg = NULL;
	char err[512];
	const char *p =
		write_conf("good.conf", "; comment\n"
					"[cache]\n"
					"dir = /nvme/cache\n"
					"size = 2G\n"
					"block_size = 1M\n"
					"[s3]\n"
					"endpoint = http://127.0.0.1:7480\n"
					"path_style = no\n"
					"max_inflight = 16\n"
					"deadline = 45s\n"
					"[log]\n"
					"level = debug"); /* no final newline */

	clear_env();
	CHECK_INT(config_load(p, &cfg, err, sizeof(err)), 0);
	if (!cfg) {
		fprintf(stderr, "%s\n", err);
		return;
	}
	CHECK_STR(cfg->cache_dir, "/nvme/cache");
	CHECK_INT(cfg->cache_size, 2ULL << 30);
	CHECK_INT(cfg->cache_block_size, 1u << 20);
	CHECK_STR(cfg->s3_endpoint, "http://127.0.0.1:7480");
	CHECK(!cfg->s3_path_style);
	CHECK_INT(cfg->s3_max_inflight, 16);
	CHECK_INT(cfg->s3_deadline_ms, 45000);
	CHECK_INT(cfg->log_level, LOG_LVL_DEBUG);
	CHECK_STR(cfg->source_file, p);
	config_free(cfg);

	/* The environment wins over the file; AWS_* fill endpoint/region. */
	setenv("DSTAGE_CACHE_DIR", "/other", 1);
	setenv("AWS_REGION", "eu-west-3", 1);
	setenv("AWS_ENDPOINT_URL", "https://s3.example.test", 1);
	cfg = NULL;
	CHECK_INT(config_load(p, &cfg, err, sizeof(err)), 0);
	if (cfg) {
		CHECK_STR(cfg->cache_dir, "/other");
		CHECK_STR(cfg->s3_region, "eu-west-3");
		CHECK_STR(cfg->s3_endpoint, "https://s3.example.test");
		config_free(cfg);
	}
	/* DSTAGE_S3_ENDPOINT beats AWS_ENDPOINT_URL. */
	setenv("DSTAGE_S3_ENDPOINT", "http://127.0.0.2:9000", 1);
	cfg = NULL;
	CHECK_INT(config_load(p, &cfg, err, sizeof(err)), 0);
	if (cfg) {
		CHECK_STR(cfg->s3_endpoint, "http://127.0.0.2:9000");
		config_free(cfg);
	}
	/* $DSTAGE_CONFIG names the file when no path is given. */
	clear_env();
	setenv("DSTAGE_CONFIG", p, 1);
	cfg = NULL;
	CHECK_INT(config_load(NULL, &cfg, err, sizeof(err)), 0);
	if (cfg) {
		CHECK_STR(cfg->cache_dir, "/nvme/cache");
		config_free(cfg);
	}
	clear_env();
}

/* Each bad file fails with a message naming file, line, key, what's accepted. */
static void expect_bad(const char *text, const char *want1, const char *want2)
{
	struct dstage_config *cfg = NULL;
	char err[512] = "";
	const char *p = write_conf("bad.conf", text);

	CHECK_INT(config_load(p, &cfg, err, sizeof(err)), -EINVAL);
	CHECK(cfg == NULL);
	if (!strstr(err, want1) || !strstr(err, want2)) {
		fprintf(stderr, "message '%s' lacks '%s' or '%s'\n", err, want1,
			want2);
		check_failures++;
	}
	if (!strstr(err, "bad.conf")) {
		fprintf(stderr, "message '%s' does not name the file\n", err);
		check_failures++;
	}
}

static void test_bad_values(void)
{
	struct dstage_config *cfg = NULL;
	char err[512];

	clear_env();
	expect_bad("[cache]\n\nsize = lots\n", "bad.conf:3", "cache.size");
	expect_bad("[cache]\nsize = lots\n", "500M", "lots");
	expect_bad("[cache]\nblock_size = 3M\n", ":2", "power-of-two");
	expect_bad("[s3]\nmax_inflight = 0\n", "s3.max_inflight", "from 1");
	expect_bad("[s3]\nendpoint = ftp://x\n", "s3.endpoint", "http://");
	expect_bad("[s3]\npath_style = maybe\n", "path_style", "true or false");
	expect_bad("[s3]\nbogus = 1\n", "bad.conf:2", "unknown key 's3.bogus'");
	expect_bad("[cache]\ndir = relative/path\n", "cache.dir", "absolute");
	expect_bad("[log]\nlevel = loud\n", "log.level", "debug");
	expect_bad("[cache]\nthis line is not ini\n", "bad.conf:2", "syntax");
	expect_bad("[cache]\nhigh_watermark = 50\nlow_watermark = 60\n",
		   "low_watermark", "high_watermark");

	/* A named file that does not exist is an error, not defaults. */
	CHECK_INT(
		config_load("/nonexistent/dstage.conf", &cfg, err, sizeof(err)),
		-ENOENT);
	CHECK(strstr(err, "/nonexistent/dstage.conf") != NULL);

	/* A bad environment value names the variable. */
	setenv("DSTAGE_CACHE_SIZE", "huge", 1);
	CHECK_INT(config_load(NULL, &cfg, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "DSTAGE_CACHE_SIZE") != NULL);
	clear_env();
}

/* s3.copy_threshold and s3.copy_part_size: 5 MiB to 5 GiB (what one
 * CopyObject, and one UploadPartCopy, may copy), from file and environment;
 * a refusal names the key and the range. */
static void test_copy_keys(void)
{
	static const char *const keys[] = { "s3.copy_threshold",
					    "s3.copy_part_size" };
	struct dstage_config *cfg = NULL;
	char err[512];

	clear_env();
	CHECK_INT(config_defaults(&cfg), 0);
	if (!cfg)
		return;
	CHECK_INT(cfg->s3_copy_threshold, 5ULL << 30);
	CHECK_INT(cfg->s3_copy_part_size, 512ULL << 20);
	for (size_t i = 0; i < 2; i++) {
		CHECK_INT(config_set(cfg, keys[i], "5M", err, sizeof(err)), 0);
		CHECK_INT(config_set(cfg, keys[i], "5G", err, sizeof(err)), 0);
		err[0] = '\0';
		CHECK_INT(config_set(cfg, keys[i], "6G", err, sizeof(err)),
			  -EINVAL);
		CHECK(strstr(err, keys[i]) != NULL);
		CHECK(strstr(err, "from 5242880 to 5368709120") != NULL);
		err[0] = '\0';
		CHECK_INT(config_set(cfg, keys[i], "4M", err, sizeof(err)),
			  -EINVAL);
		CHECK(strstr(err, keys[i]) != NULL);
	}
	CHECK_INT(cfg->s3_copy_threshold, 5ULL << 30);
	CHECK_INT(cfg->s3_copy_part_size, 5ULL << 30);
	config_free(cfg);
	expect_bad("[s3]\ncopy_threshold = 1M\n", "bad.conf:2",
		   "s3.copy_threshold");
	expect_bad("[s3]\ncopy_part_size = 10G\n", "bad.conf:2",
		   "s3.copy_part_size");

	/* The environment, as the integration tests set them. */
	setenv("DSTAGE_S3_COPY_THRESHOLD", "5M", 1);
	setenv("DSTAGE_S3_COPY_PART_SIZE", "6M", 1);
	cfg = NULL;
	CHECK_INT(config_load(NULL, &cfg, err, sizeof(err)), 0);
	if (cfg) {
		CHECK_INT(cfg->s3_copy_threshold, 5ULL << 20);
		CHECK_INT(cfg->s3_copy_part_size, 6ULL << 20);
		config_free(cfg);
	}
	setenv("DSTAGE_S3_COPY_THRESHOLD", "8G", 1);
	cfg = NULL;
	CHECK_INT(config_load(NULL, &cfg, err, sizeof(err)), -EINVAL);
	CHECK(cfg == NULL);
	CHECK(strstr(err, "DSTAGE_S3_COPY_THRESHOLD") != NULL);
	CHECK(strstr(err, "s3.copy_threshold") != NULL);
	clear_env();
}

/* Lines past libinih's default 200 bytes are read whole. */
static void test_long_line(void)
{
	struct dstage_config *cfg = NULL;
	char text[1200], dir[800], err[512];
	const char *p;

	memset(dir, 'd', sizeof(dir));
	dir[0] = '/';
	dir[sizeof(dir) - 1] = '\0';
	snprintf(text, sizeof(text), "[cache]\ndir = %s\nsize = 2G ; comment\n",
		 dir);
	p = write_conf("long.conf", text);
	clear_env();
	CHECK_INT(config_load(p, &cfg, err, sizeof(err)), 0);
	if (!cfg) {
		fprintf(stderr, "%s\n", err);
		return;
	}
	CHECK_STR(cfg->cache_dir, dir);
	CHECK_INT(cfg->cache_size, 2ULL << 30);
	config_free(cfg);
}

static void test_dump_roundtrip(void)
{
	struct dstage_config *a = NULL, *b = NULL;
	char err[512], path[300];
	FILE *f;

	clear_env();
	CHECK_INT(config_defaults(&a), 0);
	if (!a)
		return;
	CHECK_INT(config_set(a, "cache.size", "3G", err, sizeof(err)), 0);
	CHECK_INT(config_set(a, "sources.follow_symlinks", "inside", err,
			     sizeof(err)),
		  0);
	CHECK_INT(config_set(a, "s3.endpoint", "http://127.0.0.1:1", err,
			     sizeof(err)),
		  0);
	snprintf(path, sizeof(path), "%s/dump.conf", tmpdir);
	f = fopen(path, "w");
	if (f) {
		config_dump(a, f);
		fclose(f);
	}
	CHECK_INT(config_load(path, &b, err, sizeof(err)), 0);
	if (b) {
		CHECK_INT(b->cache_size, 3ULL << 30);
		CHECK_STR(b->s3_endpoint, "http://127.0.0.1:1");
		CHECK_INT(b->s3_deadline_ms, a->s3_deadline_ms);
		CHECK_INT(b->sources_follow_symlinks, CONFIG_SYMLINKS_INSIDE);
	} else {
		fprintf(stderr, "%s\n", err);
	}
	config_free(a);
	config_free(b);
	config_free(NULL);
}

/* docs/configuration.md documents every key config_dump() knows. */
static void test_docs_list_every_key(void)
{
	const char *data = getenv("DSTAGE_TEST_DATA");
	struct dstage_config *cfg = NULL;
	char path[512], section[64] = "", line[256], *doc = NULL;
	size_t doclen = 0;
	FILE *f, *dump;
	int nkeys = 0;

	if (!data)
		return;
	snprintf(path, sizeof(path), "%s/../../docs/configuration.md", data);
	f = fopen(path, "r");
	CHECK(f != NULL);
	if (!f)
		return;
	doc = calloc(1, 1 << 20);
	if (doc)
		doclen = fread(doc, 1, (1 << 20) - 1, f);
	fclose(f);
	CHECK(doclen > 0);
	CHECK_INT(config_defaults(&cfg), 0);
	dump = tmpfile();
	if (!doc || !cfg || !dump)
		goto out;
	config_dump(cfg, dump);
	rewind(dump);
	while (fgets(line, sizeof(line), dump)) {
		char key[100], want[180];
		int end = 0;

		if (sscanf(line, "[%63[^]]]", section) == 1)
			continue;
		/* "key = value" or, for unset keys, "# key =". */
		if ((sscanf(line, "# %99[a-z_] =%n", key, &end) != 1 || !end) &&
		    (sscanf(line, "%99[a-z_] =%n", key, &end) != 1 || !end))
			continue;
		snprintf(want, sizeof(want), "`%s.%s`", section, key);
		nkeys++;
		if (!strstr(doc, want)) {
			fprintf(stderr, "docs/configuration.md lacks %s\n",
				want);
			check_failures++;
		}
	}
	CHECK(nkeys >= 25);
out:
	if (dump)
		fclose(dump);
	config_free(cfg);
	free(doc);
}

int main(void)
{
	if (!mkdtemp(tmpdir))
		return 1;
	test_sizes();
	test_defaults_without_file();
	test_file_and_env();
	test_bad_values();
	test_copy_keys();
	test_long_line();
	test_dump_roundtrip();
	test_security_keys();
	test_verify_and_scrub_keys();
	test_docs_list_every_key();
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd))
		return 1;
	return check_result();
}
