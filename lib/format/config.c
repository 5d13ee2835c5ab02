// SPDX-License-Identifier: MIT
/*
 * config: defaults, the INI file, then the environment.
 *
 * Every key is one row of config_keys[]: its name, type, where it lives in
 * struct dstage_config, its default and what it accepts. The file parser, the
 * environment overrides, config_set() and config_dump() all walk that table,
 * so a key exists everywhere or nowhere.
 */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <ini.h>

#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/metrics_http.h"
#include "inifile.h"
#include "util/strutil.h"

enum config_type {
	CT_STRING, /* char *, NULL allowed for optional keys */
	CT_PATH, /* char *, must be absolute */
	CT_SIZE, /* uint64_t, with K/M/G/T suffixes */
	CT_SIZE32, /* uint32_t size, power of two */
	CT_UINT, /* unsigned */
	CT_PERCENT, /* unsigned 1..100 */
	CT_BOOL, /* bool */
	CT_DURATION, /* unsigned milliseconds */
	CT_LOGLEVEL, /* int, enum log_level */
	CT_URL, /* char *, http:// or https:// */
	CT_SYMLINKS, /* int, enum config_symlinks: no or inside */
	CT_VERIFY, /* int, enum config_verify_reads: fill or always */
};

/* The words of a type that is a choice: names[v] is the enum's value v. */
struct config_choice {
	const char *accepts; /* the names, for the messages */
	const char *names[3]; /* NULL-ended */
};

static const struct config_choice config_symlinks = {
	"no or inside",
	{ [CONFIG_SYMLINKS_NO] = "no", [CONFIG_SYMLINKS_INSIDE] = "inside" },
};

static const struct config_choice config_verify = {
	"fill or always",
	{ [CONFIG_VERIFY_FILL] = "fill", [CONFIG_VERIFY_ALWAYS] = "always" },
};

struct config_key {
	const char *name; /* "section.key" */
	enum config_type type;
	size_t off;
	const char *def; /* default as text; NULL: unset */
	uint64_t min, max; /* for numeric types; 0,0: no bound */
	const char *help;
};

#define OFF(f) offsetof(struct dstage_config, f)

static const struct config_key config_keys[] = {
	{ "cache.dir", CT_PATH, OFF(cache_dir), "/var/cache/dstage", 0, 0,
	  "directory of the block cache (local NVMe)" },
	{ "cache.size", CT_SIZE, OFF(cache_size), "10G", 1 << 20, 0,
	  "cache capacity" },
	{ "cache.block_size", CT_SIZE32, OFF(cache_block_size), "4M", 4096,
	  1u << 30,
	  "block size, a power of two, fixed when the cache is created" },
	{ "cache.high_watermark", CT_PERCENT, OFF(cache_high_watermark), "90",
	  1, 100, "start evicting above this fill, percent" },
	{ "cache.low_watermark", CT_PERCENT, OFF(cache_low_watermark), "80", 1,
	  100, "evict down to this fill, percent" },
	{ "cache.readahead_max", CT_UINT, OFF(cache_readahead_max), "16", 0,
	  4096, "largest sequential readahead window, blocks" },
	{ "cache.verify_reads", CT_VERIFY, OFF(cache_verify_reads), "fill", 0,
	  0,
	  "fill: blocks are checked when filled, then by the scrub, and FUSE "
	  "passthrough may serve whole cached objects unchecked; always: "
	  "every block is checked when a process first reads it, no "
	  "passthrough" },
	{ "cache.scrub_rate", CT_SIZE, OFF(cache_scrub_rate), "50M", 0, 0,
	  "bytes per second the stager daemon's scrub re-reads and checks "
	  "cached blocks at; 0: no scrub" },
	{ "cache.scrub_interval", CT_DURATION, OFF(cache_scrub_interval_ms),
	  "168h", 100, 0,
	  "a scrub pass over the whole cache starts this long after the "
	  "previous one started (or at once, when it took longer)" },
	{ "catalog.path", CT_PATH, OFF(catalog_path),
	  "/var/lib/dstage/catalog.db", 0, 0, "SQLite catalog of this node" },
	{ "daemon.socket", CT_PATH, OFF(daemon_socket),
	  "/run/dstage/stager.sock", 0, 0, "Unix socket of the stager daemon" },
	{ "daemon.admin_group", CT_STRING, OFF(daemon_admin_group), "dstage", 0,
	  0, "group allowed to make changes (besides root)" },
	{ "s3.endpoint", CT_URL, OFF(s3_endpoint), NULL, 0, 0,
	  "S3 endpoint URL; unset: AWS (https://s3.REGION.amazonaws.com)" },
	{ "s3.region", CT_STRING, OFF(s3_region), "us-east-1", 0, 0,
	  "region used in Signature V4" },
	{ "s3.path_style", CT_BOOL, OFF(s3_path_style), "true", 0, 0,
	  "path-style URLs (endpoint/bucket/key); false: virtual-host style" },
	{ "s3.ca_file", CT_PATH, OFF(s3_ca_file), NULL, 0, 0,
	  "CA bundle for https; unset: the system store" },
	{ "s3.verify_tls", CT_BOOL, OFF(s3_verify_tls), "true", 0, 0,
	  "verify the server certificate" },
	{ "s3.credentials_file", CT_PATH, OFF(s3_credentials_file), NULL, 0, 0,
	  "dstage credentials file (AWS format); must be mode 0600" },
	{ "s3.profile", CT_STRING, OFF(s3_profile), NULL, 0, 0,
	  "profile in the credentials file; unset: $AWS_PROFILE or default" },
	{ "s3.max_inflight", CT_UINT, OFF(s3_max_inflight), "8", 1, 256,
	  "ranged GETs and upload parts in flight at once" },
	{ "s3.multipart_threshold", CT_SIZE, OFF(s3_multipart_threshold), "64M",
	  5 << 20, 5ULL << 40,
	  "objects this large go up as multipart uploads" },
	{ "s3.part_size", CT_SIZE, OFF(s3_part_size), "16M", 5 << 20,
	  5ULL << 30, "multipart part size" },
	{ "s3.copy_threshold", CT_SIZE, OFF(s3_copy_threshold), "5G", 5 << 20,
	  5ULL << 30,
	  "server-side copies larger than this go in parts (UploadPartCopy); "
	  "at most 5G, what one CopyObject may copy" },
	{ "s3.copy_part_size", CT_SIZE, OFF(s3_copy_part_size), "512M", 5 << 20,
	  5ULL << 30, "part size of a copy in parts" },
	{ "s3.connect_timeout", CT_DURATION, OFF(s3_connect_timeout_ms), "5s",
	  1, 0, "TCP/TLS connect timeout" },
	{ "s3.low_speed_time", CT_DURATION, OFF(s3_low_speed_time_ms), "15s",
	  1000, 0, "abort a transfer stalled (under 1 KiB/s) this long" },
	{ "s3.max_attempts", CT_UINT, OFF(s3_max_attempts), "5", 1, 100,
	  "attempts per request, first included" },
	{ "s3.deadline", CT_DURATION, OFF(s3_deadline_ms), "120s", 1, 0,
	  "give up retrying an operation after this long" },
	{ "s3.backoff_base", CT_DURATION, OFF(s3_backoff_base_ms), "100ms", 1,
	  0, "first retry backoff ceiling (full jitter)" },
	{ "s3.backoff_max", CT_DURATION, OFF(s3_backoff_max_ms), "10s", 1, 0,
	  "largest retry backoff ceiling" },
	{ "s3.max_requests_per_second", CT_UINT,
	  OFF(s3_max_requests_per_second), "0", 0, 1000000,
	  "requests to the store per second, this node; 0: unlimited" },
	{ "s3.max_bytes_per_second", CT_SIZE, OFF(s3_max_bytes_per_second), "0",
	  0, 0,
	  "bytes to and from the store per second, this node; 0: unlimited" },
	{ "s3.allow_insecure_token", CT_BOOL, OFF(s3_allow_insecure_token),
	  "false", 0, 0,
	  "send a session token over plain http:// (refused by default)" },
	{ "sources.follow_symlinks", CT_SYMLINKS, OFF(sources_follow_symlinks),
	  "no", 0, 0,
	  "file:// sources: no (skip symlinks) or inside (follow links that "
	  "stay inside the source)" },
	{ "sources.shared_tier_root", CT_PATH, OFF(sources_shared_tier_root),
	  NULL, 0, 0,
	  "the cluster's shared tier on the parallel FS: a dataset's verified "
	  "copies under ROOT/NAME/SNAPSHOT/; unset: only datasets added with "
	  "--shared-tier have one" },
	{ "sources.shared_tier_lease", CT_DURATION,
	  OFF(sources_shared_tier_lease_ms), "60s", 1000, 0,
	  "how long a node's lease on publishing a shared-tier copy lasts "
	  "unrenewed; after it another node takes over" },
	{ "store.tmp_max_age", CT_DURATION, OFF(store_tmp_max_age_ms), "6h", 0,
	  0,
	  "file:// stores: temporary files of puts older than this are "
	  "removed (0: never)" },
	{ "checkpoints.store", CT_STRING, OFF(ckpt_store), NULL, 0, 0,
	  "checkpoint store, file:///dir/ or s3://bucket/prefix/; unset: "
	  "checkpoints/ stays empty and read-only" },
	{ "checkpoints.staging_dir", CT_PATH, OFF(ckpt_staging_dir),
	  "/var/cache/dstage-checkpoints", 0, 0,
	  "local copies of checkpoints being written (cache disk), mode 0700" },
	{ "checkpoints.staging_size", CT_SIZE, OFF(ckpt_staging_size), "64G",
	  1 << 20, 0, "most bytes of local copies in staging_dir" },
	{ "checkpoints.uid_staging_size", CT_SIZE, OFF(ckpt_uid_staging_size),
	  "0", 0, 0,
	  "most bytes (file sizes, sparse included) of one uid's local "
	  "copies and abandoned files; past it EDQUOT; 0: half of "
	  "staging_size" },
	{ "checkpoints.uid_files", CT_UINT, OFF(ckpt_uid_files), "10000", 0, 0,
	  "most local copies and abandoned files (empty ones included) of "
	  "one uid; past it EDQUOT; 0: no bound" },
	{ "checkpoints.uid_open_files", CT_UINT, OFF(ckpt_uid_open_files),
	  "4096", 0, 0,
	  "most checkpoint files one uid holds open in dstagefs (each open "
	  "or create; dup and fork share one); past it EDQUOT; 0: no bound" },
	{ "checkpoints.uid_store_size", CT_SIZE, OFF(ckpt_uid_store_size), "0",
	  0, 0,
	  "most bytes of one uid's checkpoint files in the store, as this "
	  "node knows them (published through it, and being written); past "
	  "it EDQUOT; 0: no bound" },
	{ "checkpoints.retry_interval", CT_DURATION, OFF(ckpt_retry_ms), "30s",
	  100, 0, "retry publishing files the store refused this often" },
	{ "checkpoints.lifecycle_interval", CT_DURATION, OFF(ckpt_lifecycle_ms),
	  "1h", 0, 0,
	  "the stager daemon applies the lifecycle rules this often; 0: only "
	  "on demand (stager lifecycle run)" },
	{ "checkpoints.stamp_sha256", CT_BOOL, OFF(ckpt_stamp_sha256), "true",
	  0, 0,
	  "after an upload in parts, copy the object onto itself to set "
	  "x-amz-meta-sha256 (radosgw copies no data; AWS rewrites it): "
	  "false leaves the hash in the sidecar and the catalog only" },
	{ "checkpoints.abandoned_keep", CT_DURATION,
	  OFF(ckpt_abandoned_keep_ms), "168h", 0, 0,
	  "lifecycle removes files of killed writers (staging_dir/abandoned/) "
	  "older than this" },
	{ "checkpoints.passthrough", CT_BOOL, OFF(ckpt_passthrough), "false", 0,
	  0,
	  "hand a read-only open of a checkpoint file this node holds a local "
	  "copy of to the kernel (FUSE passthrough); while such an open is "
	  "there, an open of the file for writing fails with ETXTBSY: for "
	  "checkpoints read back while nobody rewrites them" },
	{ "overlay.dir", CT_PATH, OFF(overlay_dir), NULL, 0, 0,
	  "dstagefs mounts over this directory and serves its own tree "
	  "(transparent mode, as --over DIR); unset: no overlay" },
	{ "overlay.attr_timeout", CT_DURATION, OFF(overlay_attr_timeout_ms),
	  "1s", 0, 0,
	  "overlay: how long names, attributes and absences are cached: the "
	  "most a change made underneath stays unseen" },
	{ "overlay.min_cached_size", CT_SIZE, OFF(overlay_min_cached_size),
	  "64K", 0, 0,
	  "overlay: files smaller than this are read directly, not through "
	  "the cache" },
	{ "overlay.passthrough", CT_BOOL, OFF(overlay_passthrough), "false", 0,
	  0,
	  "overlay: hand a read-only open of a file the cache holds whole to "
	  "the kernel (FUSE passthrough); while such an open is there, an "
	  "open of the file for writing, or of a newer version of it, fails "
	  "with ETXTBSY: for trees this node only reads" },
	{ "overlay.no_cache", CT_STRING, OFF(overlay_no_cache), NULL, 0, 0,
	  "overlay: files matching one of these comma-separated shell "
	  "patterns (the name, or the path when the pattern has a '/') are "
	  "read directly" },
	{ "metrics.listen", CT_STRING, OFF(metrics_listen), NULL, 0, 0,
	  "ADDR:PORT of the Prometheus endpoint (GET /metrics), such as "
	  "127.0.0.1:9101; unset: no endpoint" },
	{ "metrics.allow_remote", CT_BOOL, OFF(metrics_allow_remote), "false",
	  0, 0, "allow a metrics.listen address that is not loopback" },
	{ "log.level", CT_LOGLEVEL, OFF(log_level), "info", 0, 0,
	  "error, warn, info or debug" },
	{ "log.syslog", CT_BOOL, OFF(log_syslog), "false", 0, 0,
	  "log to syslog instead of stderr" },
};

#define NKEYS (sizeof(config_keys) / sizeof(config_keys[0]))

static const struct config_key *config_find(const char *name)
{
	for (size_t i = 0; i < NKEYS; i++)
		if (strcmp(config_keys[i].name, name) == 0)
			return &config_keys[i];
	return NULL;
}

/* A non-negative decimal number after optional blanks; *end is left after
 * it (its unit). Returns 0 or -EINVAL. */
static int config_parse_number(const char *s, double *v, char **end)
{
	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	*v = strtod(s, end);
	if (errno || *end == s || !isfinite(*v))
		return -EINVAL;
	return 0;
}

int config_parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v;
	double mult = 1;

	if (config_parse_number(s, &v, &end))
		return -EINVAL;
	while (isspace((unsigned char)*end))
		end++;
	switch (toupper((unsigned char)*end)) {
	case '\0':
		break;
	case 'B':
		if (end[1])
			return -EINVAL;
		break;
	case 'K':
		mult = 1024.0;
		break;
	case 'M':
		mult = 1024.0 * 1024;
		break;
	case 'G':
		mult = 1024.0 * 1024 * 1024;
		break;
	case 'T':
		mult = 1024.0 * 1024 * 1024 * 1024;
		break;
	case 'P':
		mult = 1024.0 * 1024 * 1024 * 1024 * 1024;
		break;
	default:
		return -EINVAL;
	}
	if (mult > 1) {
		/* Accept "M", "MB", "MiB" (all binary). */
		const char *suf = end + 1;

		if (*suf && strcasecmp(suf, "B") && strcasecmp(suf, "iB"))
			return -EINVAL;
	}
	v *= mult;
	if (v >= 18446744073709551615.0)
		return -ERANGE;
	if (v != floor(v))
		return -EINVAL; /* "1.3K" is not a whole number of bytes */
	*out = (uint64_t)v;
	return 0;
}

int config_parse_duration_ms(const char *s, unsigned *out)
{
	char *end;
	double v, mult = 1000;

	if (config_parse_number(s, &v, &end))
		return -EINVAL;
	if (strcmp(end, "") == 0 || strcmp(end, "s") == 0)
		mult = 1000;
	else if (strcmp(end, "ms") == 0)
		mult = 1;
	else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
		mult = 60000;
	else if (strcmp(end, "h") == 0)
		mult = 3600000;
	else
		return -EINVAL;
	v *= mult;
	if (v > (double)UINT_MAX)
		return -ERANGE;
	*out = (unsigned)v;
	return 0;
}

static int parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "1", "true", "yes", "on" };
	static const char *const no[] = { "0", "false", "no", "off" };

	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return -EINVAL;
}

/* The words of a choice type t (CT_SYMLINKS, CT_VERIFY). */
static const struct config_choice *config_choice_of(enum config_type t)
{
	return t == CT_SYMLINKS ? &config_symlinks : &config_verify;
}

/* The name of choice value v; the first name for a value it has none for. */
static const char *config_choice_name(const struct config_choice *c, int v)
{
	for (int i = 0; c->names[i]; i++)
		if (i == v)
			return c->names[i];
	return c->names[0];
}

static const char *config_accepts(const struct config_key *k)
{
	switch (k->type) {
	case CT_STRING:
		return "a string";
	case CT_PATH:
		return "an absolute path";
	case CT_SIZE:
		return "a size such as 4096, 500M, 2G or 1T";
	case CT_SIZE32:
		return "a power-of-two size such as 1M or 4M";
	case CT_UINT:
		return "a whole number";
	case CT_PERCENT:
		return "a percentage from 1 to 100";
	case CT_BOOL:
		return "true or false";
	case CT_DURATION:
		return "a duration such as 250ms, 30s or 5m";
	case CT_LOGLEVEL:
		return "error, warn, info or debug";
	case CT_URL:
		return "an http:// or https:// URL";
	case CT_SYMLINKS:
	case CT_VERIFY:
		return config_choice_of(k->type)->accepts;
	}
	return "?";
}

static int config_set_key(struct dstage_config *cfg, const struct config_key *k,
			  const char *value)
{
	void *field = (char *)cfg + k->off;
	uint64_t u64;
	unsigned u;
	char *end;
	int ret;

	switch (k->type) {
	case CT_PATH:
		if (value[0] != '/')
			return -EINVAL;
		/* fallthrough */
	case CT_STRING:
	case CT_URL: {
		char *dup;

		if (k->type == CT_URL && strncmp(value, "http://", 7) &&
		    strncmp(value, "https://", 8))
			return -EINVAL;
		if (k->type == CT_URL && strlen(value) <= 8)
			return -EINVAL;
		dup = strdup(value);
		if (!dup)
			return -ENOMEM;
		free(*(char **)field);
		*(char **)field = dup;
		return 0;
	}
	case CT_SIZE:
	case CT_SIZE32:
		ret = config_parse_size(value, &u64);
		if (ret)
			return ret;
		if (u64 < k->min || (k->max && u64 > k->max))
			return -ERANGE;
		if (k->type == CT_SIZE) {
			*(uint64_t *)field = u64;
			return 0;
		}
		if (u64 & (u64 - 1))
			return -EINVAL;
		*(uint32_t *)field = (uint32_t)u64;
		return 0;
	case CT_UINT:
	case CT_PERCENT:
		if (!isdigit((unsigned char)value[0]))
			return -EINVAL;
		errno = 0;
		u64 = strtoull(value, &end, 10);
		if (errno || *end)
			return -EINVAL;
		if (u64 < k->min || (k->max && u64 > k->max) || u64 > UINT_MAX)
			return -ERANGE;
		*(unsigned *)field = (unsigned)u64;
		return 0;
	case CT_BOOL:
		return parse_bool(value, (bool *)field);
	case CT_DURATION:
		ret = config_parse_duration_ms(value, &u);
		if (ret)
			return ret;
		if (u < k->min || (k->max && u > k->max))
			return -ERANGE;
		*(unsigned *)field = u;
		return 0;
	case CT_LOGLEVEL:
		ret = log_level_parse(value);
		if (ret < 0)
			return ret;
		*(int *)field = ret;
		return 0;
	case CT_SYMLINKS:
	case CT_VERIFY: {
		const struct config_choice *c = config_choice_of(k->type);

		for (int v = 0; c->names[v]; v++)
			if (!strcasecmp(value, c->names[v])) {
				*(int *)field = v;
				return 0;
			}
		return -EINVAL;
	}
	}
	return -EINVAL;
}

static void config_describe_range(const struct config_key *k, char *buf,
				  size_t len)
{
	buf[0] = '\0';
	if (k->type == CT_DURATION && (k->min || k->max))
		snprintf(buf, len, " (at least %llums)",
			 (unsigned long long)k->min);
	else if ((k->type == CT_UINT || k->type == CT_SIZE ||
		  k->type == CT_SIZE32) &&
		 (k->min || k->max)) {
		if (k->max)
			snprintf(buf, len, " from %llu to %llu",
				 (unsigned long long)k->min,
				 (unsigned long long)k->max);
		else
			snprintf(buf, len, " of at least %llu",
				 (unsigned long long)k->min);
	}
}

int config_set(struct dstage_config *cfg, const char *key, const char *value,
	       char *err, size_t errlen)
{
	const struct config_key *k = config_find(key);
	char range[96];
	int ret;

	if (!k) {
		strutil_msg(err, errlen, "unknown key '%s'", key);
		return -EINVAL;
	}
	ret = config_set_key(cfg, k, value);
	if (ret == -ENOMEM) {
		strutil_msg(err, errlen, "out of memory");
		return ret;
	}
	if (ret) {
		config_describe_range(k, range, sizeof(range));
		strutil_msg(err, errlen, "bad value '%s' for %s: expected %s%s",
			    value, key, config_accepts(k), range);
		return -EINVAL;
	}
	return 0;
}

static int config_set_defaults(struct dstage_config *cfg)
{
	char err[256];

	for (size_t i = 0; i < NKEYS; i++) {
		if (!config_keys[i].def)
			continue;
		int ret = config_set(cfg, config_keys[i].name,
				     config_keys[i].def, err, sizeof(err));
		if (ret)
			return ret;
	}
	return 0;
}

int config_defaults(struct dstage_config **out)
{
	struct dstage_config *cfg = calloc(1, sizeof(*cfg));
	int ret;

	if (!cfg)
		return -ENOMEM;
	ret = config_set_defaults(cfg);
	if (ret) {
		config_free(cfg);
		return ret;
	}
	*out = cfg;
	return 0;
}

struct config_parse_ctx {
	struct dstage_config *cfg;
	const char *path;
	char *err;
	size_t errlen;
	int ret;
	FILE *f;
	int lineno; /* lines read so far: the handler's current line */
	bool midline; /* the last fgets stopped before a newline */
};

/* inih as packaged is built without line numbers in the handler, so the
 * reader counts lines itself. */
static char *config_ini_reader(char *str, int num, void *stream)
{
	struct config_parse_ctx *ctx = stream;
	char *s = fgets(str, num, ctx->f);

	if (s) {
		if (!ctx->midline)
			ctx->lineno++;
		ctx->midline = !strchr(s, '\n');
	}
	return s;
}

static int config_ini_handler(void *user, const char *section, const char *name,
			      const char *value)
{
	struct config_parse_ctx *ctx = user;
	int lineno = ctx->lineno;
	char key[256], msg[512];
	int ret;

	if (ctx->ret)
		return 0;
	if (!section[0]) {
		snprintf(msg, sizeof(msg),
			 "key '%s' outside a section (expected [cache], "
			 "[catalog], [daemon], [s3], [sources], [metrics] or "
			 "[log])",
			 name);
		ret = -EINVAL;
		goto fail;
	}
	snprintf(key, sizeof(key), "%s.%s", section, name);
	ret = config_set(ctx->cfg, key, value, msg, sizeof(msg));
	if (!ret)
		return 1;
fail:
	strutil_msg(ctx->err, ctx->errlen, "%s:%d: %s", ctx->path, lineno, msg);
	ctx->ret = ret;
	return 0;
}

/* Apply DSTAGE_<SECTION>_<KEY>, then AWS_ENDPOINT_URL / AWS_REGION unless the
 * dstage variables name them. */
static int config_apply_env(struct dstage_config *cfg, char *err, size_t errlen)
{
	char var[128], msg[512];
	const char *v;
	int ret;

	v = getenv("AWS_ENDPOINT_URL");
	if (v && *v && !getenv("DSTAGE_S3_ENDPOINT")) {
		ret = config_set(cfg, "s3.endpoint", v, msg, sizeof(msg));
		if (ret) {
			strutil_msg(err, errlen,
				    "environment AWS_ENDPOINT_URL: %s", msg);
			return ret;
		}
	}
	v = getenv("AWS_REGION");
	if (!v || !*v)
		v = getenv("AWS_DEFAULT_REGION");
	if (v && *v && !getenv("DSTAGE_S3_REGION")) {
		ret = config_set(cfg, "s3.region", v, msg, sizeof(msg));
		if (ret) {
			strutil_msg(err, errlen, "environment AWS_REGION: %s",
				    msg);
			return ret;
		}
	}
	for (size_t i = 0; i < NKEYS; i++) {
		size_t n = 0;

		n = (size_t)snprintf(var, sizeof(var), "DSTAGE_");
		for (const char *p = config_keys[i].name;
		     *p && n < sizeof(var) - 1; p++)
			var[n++] = *p == '.' ? '_' : (char)toupper(*p);
		var[n] = '\0';
		v = getenv(var);
		if (!v)
			continue;
		ret = config_set(cfg, config_keys[i].name, v, msg, sizeof(msg));
		if (ret) {
			strutil_msg(err, errlen, "environment %s: %s", var,
				    msg);
			return ret;
		}
	}
	return 0;
}

static int config_check(const struct dstage_config *cfg, char *err,
			size_t errlen)
{
	const char *where = cfg->source_file ? cfg->source_file : "defaults";

	if (cfg->cache_low_watermark >= cfg->cache_high_watermark) {
		strutil_msg(err, errlen,
			    "%s: cache.low_watermark (%u) must be below "
			    "cache.high_watermark (%u)",
			    where, cfg->cache_low_watermark,
			    cfg->cache_high_watermark);
		return -EINVAL;
	}
	if (cfg->s3_backoff_base_ms > cfg->s3_backoff_max_ms) {
		strutil_msg(
			err, errlen,
			"%s: s3.backoff_base must not exceed s3.backoff_max",
			where);
		return -EINVAL;
	}
	if (cfg->metrics_listen) {
		struct sockaddr_storage ss;
		bool loopback = false;
		socklen_t len;

		if (metrics_http_parse_listen(cfg->metrics_listen, &ss, &len,
					      &loopback)) {
			strutil_msg(err, errlen,
				    "%s: metrics.listen = %s: expected "
				    "ADDR:PORT such as 127.0.0.1:9101 or "
				    "[::1]:9101",
				    where, cfg->metrics_listen);
			return -EINVAL;
		}
		if (!loopback && !cfg->metrics_allow_remote) {
			strutil_msg(err, errlen,
				    "%s: metrics.listen = %s is not a loopback "
				    "address: metrics have no authentication; "
				    "set metrics.allow_remote = true to serve "
				    "them to other hosts",
				    where, cfg->metrics_listen);
			return -EINVAL;
		}
	}
	if (cfg->cache_size < cfg->cache_block_size) {
		strutil_msg(err, errlen,
			    "%s: cache.size must hold at least one block of "
			    "cache.block_size",
			    where);
		return -EINVAL;
	}
	return 0;
}

int config_load(const char *path, struct dstage_config **out, char *err,
		size_t errlen)
{
	struct dstage_config *cfg = NULL;
	struct config_parse_ctx ctx;
	bool explicit = path != NULL;
	FILE *f = NULL;
	int ret;

	strutil_msg(err, errlen, "%s", "");
	if (!path) {
		path = getenv("DSTAGE_CONFIG");
		explicit = path && *path;
		if (!explicit)
			path = CONFIG_DEFAULT_PATH;
	}
	ret = config_defaults(&cfg);
	if (ret) {
		strutil_msg(err, errlen, "out of memory");
		goto err;
	}
	f = fopen(path, "r");
	if (!f) {
		ret = -errno;
		if (ret == -ENOENT && !explicit)
			goto env; /* no file at all: defaults */
		strutil_msg(err, errlen, "cannot open config file %s: %s", path,
			    strerror(-ret));
		goto err;
	}
	cfg->source_file = strdup(path);
	if (!cfg->source_file) {
		ret = -ENOMEM;
		goto err;
	}
	ctx =
		(struct config_parse_ctx){ cfg, path, err, errlen,
					   0,	f,    0,   false };
	ret = inifile_parse_stream(config_ini_reader, &ctx, config_ini_handler,
				   &ctx, true);
	if (ctx.ret) {
		ret = ctx.ret;
		goto err;
	}
	if (ret) {
		/* inih: positive = first line with a syntax error. */
		strutil_msg(err, errlen,
			    "%s:%d: syntax error: expected [section] or key = "
			    "value",
			    path, ret);
		ret = -EINVAL;
		goto err;
	}
env:
	ret = config_apply_env(cfg, err, errlen);
	if (ret)
		goto err;
	ret = config_check(cfg, err, errlen);
	if (ret)
		goto err;
	if (f)
		fclose(f);
	*out = cfg;
	return 0;
err:
	if (f)
		fclose(f);
	config_free(cfg);
	return ret;
}

void config_free(struct dstage_config *cfg)
{
	if (!cfg)
		return;
	for (size_t i = 0; i < NKEYS; i++) {
		enum config_type t = config_keys[i].type;

		if (t == CT_STRING || t == CT_PATH || t == CT_URL)
			free(*(char **)((char *)cfg + config_keys[i].off));
	}
	free(cfg->source_file);
	free(cfg);
}

void config_dump(const struct dstage_config *cfg, FILE *f)
{
	const char *cur_section = "";
	size_t cur_len = 0;

	for (size_t i = 0; i < NKEYS; i++) {
		const struct config_key *k = &config_keys[i];
		const void *field = (const char *)cfg + k->off;
		const char *dot = strchr(k->name, '.');
		size_t slen = (size_t)(dot - k->name);

		if (slen != cur_len || strncmp(cur_section, k->name, slen)) {
			fprintf(f, "%s[%.*s]\n", i ? "\n" : "", (int)slen,
				k->name);
			cur_section = k->name;
			cur_len = slen;
		}
		fprintf(f, "# %s\n", k->help);
		switch (k->type) {
		case CT_STRING:
		case CT_PATH:
		case CT_URL: {
			const char *s = *(char *const *)field;

			if (s)
				fprintf(f, "%s = %s\n", dot + 1, s);
			else
				fprintf(f, "# %s =\n", dot + 1);
			break;
		}
		case CT_SIZE:
			fprintf(f, "%s = %llu\n", dot + 1,
				(unsigned long long)*(const uint64_t *)field);
			break;
		case CT_SIZE32:
			fprintf(f, "%s = %u\n", dot + 1,
				*(const uint32_t *)field);
			break;
		case CT_UINT:
		case CT_PERCENT:
			fprintf(f, "%s = %u\n", dot + 1,
				*(const unsigned *)field);
			break;
		case CT_DURATION:
			fprintf(f, "%s = %ums\n", dot + 1,
				*(const unsigned *)field);
			break;
		case CT_BOOL:
			fprintf(f, "%s = %s\n", dot + 1,
				*(const bool *)field ? "true" : "false");
			break;
		case CT_LOGLEVEL:
			fprintf(f, "%s = %s\n", dot + 1,
				log_level_name(*(const int *)field));
			break;
		case CT_SYMLINKS:
		case CT_VERIFY:
			fprintf(f, "%s = %s\n", dot + 1,
				config_choice_name(config_choice_of(k->type),
						   *(const int *)field));
			break;
		}
	}
}
