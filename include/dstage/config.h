/* SPDX-License-Identifier: MIT */
/*
 * config: the dstage configuration.
 *
 * Sources, later ones winning: built-in defaults, the INI file (--config FILE,
 * else $DSTAGE_CONFIG, else /etc/dstage/dstage.conf when it exists), then the
 * environment (AWS_ENDPOINT_URL, AWS_REGION, and DSTAGE_<SECTION>_<KEY> for
 * every key). docs/configuration.md lists every key.
 *
 * A loaded config is immutable and may be shared by threads without locking.
 */
#ifndef DSTAGE_CONFIG_H
#define DSTAGE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CONFIG_DEFAULT_PATH "/etc/dstage/dstage.conf"

/* sources.follow_symlinks: what a file:// source does with a symlink. */
enum config_symlinks {
	CONFIG_SYMLINKS_NO = 0, /* skip it at listing, refuse it at reads */
	CONFIG_SYMLINKS_INSIDE = 1, /* follow it when it stays in the source */
};

/* cache.verify_reads: when cached blocks are checked (docs/cache.md). */
enum config_verify_reads {
	CONFIG_VERIFY_FILL = 0, /* when filled, then by the scrub; FUSE
				 * passthrough allowed */
	CONFIG_VERIFY_ALWAYS = 1, /* at each process's first read of a
				   * block; no passthrough */
};

struct dstage_config {
	/* [cache] */
	char *cache_dir; /* cache.dir */
	uint64_t cache_size; /* cache.size, bytes */
	uint32_t cache_block_size; /* cache.block_size, bytes, power of 2 */
	unsigned cache_high_watermark; /* cache.high_watermark, percent */
	unsigned cache_low_watermark; /* cache.low_watermark, percent */
	unsigned cache_readahead_max; /* cache.readahead_max, blocks */
	int cache_verify_reads; /* cache.verify_reads, enum
				 * config_verify_reads */
	uint64_t cache_scrub_rate; /* cache.scrub_rate, bytes/s, 0: off */
	unsigned cache_scrub_interval_ms; /* cache.scrub_interval */

	/* [catalog] */
	char *catalog_path; /* catalog.path */

	/* [daemon] */
	char *daemon_socket; /* daemon.socket */
	char *daemon_admin_group; /* daemon.admin_group */

	/* [s3] */
	char *s3_endpoint; /* s3.endpoint, e.g. http://127.0.0.1:7480 */
	char *s3_region; /* s3.region */
	bool s3_path_style; /* s3.path_style */
	char *s3_ca_file; /* s3.ca_file, NULL: system store */
	bool s3_verify_tls; /* s3.verify_tls */
	char *s3_credentials_file; /* s3.credentials_file */
	char *s3_profile; /* s3.profile (AWS shared credentials) */
	unsigned s3_max_inflight; /* s3.max_inflight, ranged GETs at once */
	uint64_t s3_multipart_threshold; /* s3.multipart_threshold, bytes */
	uint64_t s3_part_size; /* s3.part_size, bytes */
	/* s3.copy_threshold: server-side copies larger than this go as
	 * multipart copies (UploadPartCopy); 5 MiB..5 GiB, bytes */
	uint64_t s3_copy_threshold;
	uint64_t s3_copy_part_size; /* s3.copy_part_size, 5 MiB..5 GiB */
	unsigned s3_connect_timeout_ms; /* s3.connect_timeout */
	unsigned s3_low_speed_time_ms; /* s3.low_speed_time */
	unsigned s3_max_attempts; /* s3.max_attempts */
	unsigned s3_deadline_ms; /* s3.deadline, per operation incl. retries */
	unsigned s3_backoff_base_ms; /* s3.backoff_base */
	unsigned s3_backoff_max_ms; /* s3.backoff_max */
	unsigned s3_max_requests_per_second; /* 0: unlimited */
	uint64_t s3_max_bytes_per_second; /* 0: unlimited */
	bool s3_allow_insecure_token; /* s3.allow_insecure_token */

	/* [sources] */
	int sources_follow_symlinks; /* sources.follow_symlinks,
				      * enum config_symlinks */
	char *sources_shared_tier_root; /* sources.shared_tier_root, NULL:
					 * none */
	unsigned sources_shared_tier_lease_ms; /* sources.shared_tier_lease */

	/* [store] */
	unsigned store_tmp_max_age_ms; /* store.tmp_max_age, 0: no sweep */

	/* [checkpoints] */
	char *ckpt_store; /* checkpoints.store, NULL: checkpoints/ read-only */
	char *ckpt_staging_dir; /* checkpoints.staging_dir */
	uint64_t ckpt_staging_size; /* checkpoints.staging_size, bytes */
	/* checkpoints.uid_staging_size, bytes (0: half of staging_size) */
	uint64_t ckpt_uid_staging_size;
	unsigned ckpt_uid_files; /* checkpoints.uid_files (0: no bound) */
	/* checkpoints.uid_open_files: checkpoint files one uid holds open in
	 * dstagefs (0: no bound) */
	unsigned ckpt_uid_open_files;
	/* checkpoints.uid_store_size, bytes: one uid's published checkpoint
	 * files as this node knows them, and those it writes (0: no bound) */
	uint64_t ckpt_uid_store_size;
	unsigned ckpt_retry_ms; /* checkpoints.retry_interval */
	unsigned ckpt_lifecycle_ms; /* checkpoints.lifecycle_interval, 0: off */
	unsigned ckpt_abandoned_keep_ms; /* checkpoints.abandoned_keep */
	bool ckpt_stamp_sha256; /* checkpoints.stamp_sha256 */
	bool ckpt_passthrough; /* checkpoints.passthrough */
	/* [overlay] (dstagefs --over) */
	char *overlay_dir; /* overlay.dir, NULL: no overlay mount */
	unsigned overlay_attr_timeout_ms; /* overlay.attr_timeout */
	uint64_t overlay_min_cached_size; /* overlay.min_cached_size, bytes */
	bool overlay_passthrough; /* overlay.passthrough */
	char *overlay_no_cache; /* overlay.no_cache: patterns, NULL: none */
	/* [metrics] */
	char *metrics_listen; /* metrics.listen, ADDR:PORT; NULL: off */
	bool metrics_allow_remote; /* metrics.allow_remote */

	/* [log] */
	int log_level; /* log.level, enum log_level */
	bool log_syslog; /* log.syslog */

	/* Where the values came from, for messages. */
	char *source_file; /* NULL when no file was read */
};

/*
 * Load the configuration. path may be NULL (then $DSTAGE_CONFIG, then
 * CONFIG_DEFAULT_PATH if it exists). On error, a message naming the file,
 * line, key and what is accepted is written to err (size errlen) and the
 * function returns:
 *   -ENOENT  an explicitly named file does not exist
 *   -EINVAL  a bad value or unknown key
 *   -ENOMEM  out of memory
 *   -errno   the file could not be read
 */
int config_load(const char *path, struct dstage_config **out, char *err,
		size_t errlen);

/* Defaults only, no file, no environment. Returns 0 or -ENOMEM. */
int config_defaults(struct dstage_config **out);

/* Set one key ("section.key") from a string, as the file parser does.
 * Returns 0, -EINVAL (unknown key or bad value, message in err), -ENOMEM. */
int config_set(struct dstage_config *cfg, const char *key, const char *value,
	       char *err, size_t errlen);

/* Accepts NULL. */
void config_free(struct dstage_config *cfg);

/* Parse a size: "4096", "500K", "500M", "2G", "1T", "4MiB", "1.5G".
 * Returns 0 or -EINVAL / -ERANGE. */
int config_parse_size(const char *s, uint64_t *out);

/* Parse a duration: "250ms", "30s", "5m", "2h", or plain seconds.
 * Returns 0 or -EINVAL / -ERANGE. */
int config_parse_duration_ms(const char *s, unsigned *out);

/* Write every key and its current value, INI style. */
void config_dump(const struct dstage_config *cfg, FILE *f);

#endif
