// SPDX-License-Identifier: MIT
/*
 * objstore_tool: drive the object-store client from the integration tests and
 * the benchmarks.
 *
 *   objstore_tool [--config F] URL ls [PREFIX]
 *   objstore_tool [--config F] URL head KEY
 *   objstore_tool [--config F] URL get KEY OFF LEN [ETAG]   (bytes to stdout)
 *   objstore_tool [--config F] URL cat KEY [CHUNK] [OUT]    (whole object,
 *                                  CHUNK-sized ranged GETs in flight at once)
 *   objstore_tool [--config F] URL put KEY FILE
 *   objstore_tool [--config F] URL rm KEY
 *   objstore_tool [--config F] URL cp SRC DST
 *   objstore_tool [--config F] URL fill PREFIX N   (N small objects
 *                                  PREFIX00000..., each holding its key)
 *   objstore_tool [--config F] URL upload KEY FILE [leave]  (the parts API:
 *                                  parts sent last to first, then commit;
 *                                  "leave": first part only, print the
 *                                  upload id and exit as if killed)
 *   objstore_tool [--config F] URL abort-id KEY ID
 *   objstore_tool [--config F] URL uploads [PREFIX]  (open uploads, one
 *                                  "initiated<TAB>id<TAB>key" a line)
 *
 * Exit 0 on success, 1 on an objstore error (the message is on stderr, and
 * "error: <errno name>" is the last line), 2 on bad usage. With
 * DSTAGE_TOOL_STATS=1 the counters are printed to stderr as JSON.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstage/config.h"
#include "dstage/log.h"
#include "dstage/objstore.h"

static int usage(void)
{
	fprintf(stderr,
		"usage: objstore_tool [--config F] URL "
		"ls|head|get|cat|put|rm|cp|fill|upload|abort-id|uploads|"
		"set-sha256 "
		"ARGS...\n");
	return 2;
}

/* The parts API end to end: parts last to first (any order must do). */
static int upload_file(struct objstore *os, const char *key, const char *path,
		       bool leave)
{
	struct objstore_upload *up = NULL;
	struct stat sb;
	uint64_t ps, n;
	int fd = open(path, O_RDONLY), ret;

	if (fd < 0 || fstat(fd, &sb)) {
		perror(path);
		return -errno;
	}
	ret = objstore_upload_begin(os, key, (uint64_t)sb.st_size, NULL, &up);
	if (ret)
		goto out;
	printf("%s\n", objstore_upload_id(up));
	fflush(stdout);
	ps = objstore_upload_part_size(up);
	n = ((uint64_t)sb.st_size + ps - 1) / ps;
	for (uint64_t i = leave ? 0 : n; !ret && (leave ? i < 1 : i > 0);
	     leave ? i++ : i--) {
		uint64_t p = leave ? i : i - 1;
		uint64_t len = p + 1 < n ? ps : (uint64_t)sb.st_size - p * ps;

		ret = objstore_upload_part_fd(up, (unsigned)p + 1, fd, p * ps,
					      len);
	}
	if (leave)
		_exit(ret ? 1 : 0);
	if (ret)
		objstore_upload_abort(up);
	else
		ret = objstore_upload_commit(up, (uint64_t)sb.st_size);
out:
	close(fd);
	return ret;
}

/* "uploads PREFIX": one "initiated<TAB>id<TAB>key" line per open upload. */
static int print_upload(void *arg, const struct objstore_upload_info *ui)
{
	(void)arg;
	printf("%" PRId64 "\t%s\t%s\n", ui->initiated, ui->id, ui->key);
	return 0;
}

static int print_entry(void *arg, const struct objstore_info *oi)
{
	(void)arg;
	printf("%" PRIu64 "\t%s\t%" PRId64 "\t%s\n", oi->size, oi->etag,
	       oi->mtime, oi->key);
	return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p = (const char *)p + w;
		n -= (size_t)w;
	}
	return 0;
}

/*
 * objstore_get's on_data contract, checked by cat when OBJSTORE_TOOL_CHECK_RX
 * is set (the tests set it; the benches, which time cat as a limit, do not):
 * pieces arrive in order from 0 (again from 0 after a retry that starts
 * over), and what they showed, hashed as it came, equals the bytes left in
 * buf.
 */
struct rx_check {
	uint64_t fnv; /* FNV-1a of the pieces so far */
	size_t next; /* where the next piece must start */
	bool bad;
};

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

#define FNV_INIT 0xcbf29ce484222325ULL

static void rx_data(void *arg, size_t at, const void *p, size_t n)
{
	struct rx_check *rx = arg;

	if (at == 0) {
		rx->fnv = FNV_INIT;
		rx->next = 0;
	}
	if (at != rx->next)
		rx->bad = true;
	rx->fnv = fnv1a(rx->fnv, p, n);
	rx->next = at + n;
}

static bool rx_ok(const struct rx_check *rx, const struct objstore_get_req *g)
{
	if (!rx->bad && rx->next == g->got &&
	    rx->fnv == fnv1a(FNV_INIT, g->buf, g->got))
		return true;
	fprintf(stderr,
		"objstore_tool: on_data of %s at %llu: pieces out of order "
		"or not the bytes stored\n",
		g->key, (unsigned long long)g->off);
	return false;
}

/* Whole object with ranged GETs in flight at once, written in order. */
static int cat_object(struct objstore *os, const struct dstage_config *cfg,
		      const char *key, uint64_t chunk, int outfd)
{
	struct objstore_info oi;
	/* Batches of 4 x s3.max_inflight: the client keeps max_inflight in
	 * flight and the batch barrier is paid once per 4 rounds. */
	unsigned n = 4 * cfg->s3_max_inflight;
	struct objstore_get_req *g = calloc(n, sizeof(*g));
	bool check = getenv("OBJSTORE_TOOL_CHECK_RX") != NULL;
	struct rx_check *rx = calloc(n, sizeof(*rx));
	char *buf = malloc((size_t)chunk * n);
	uint64_t off = 0;
	int ret;

	if (!g || !rx || !buf) {
		ret = -ENOMEM;
		goto out;
	}
	ret = objstore_head(os, key, &oi);
	if (ret)
		goto out;
	while (off < oi.size) {
		unsigned m = 0;

		for (; m < n && off < oi.size; m++) {
			uint64_t len =
				oi.size - off < chunk ? oi.size - off : chunk;
			g[m] = (struct objstore_get_req){
				.key = key,
				.off = off,
				.len = (size_t)len,
				.if_match = oi.etag[0] ? oi.etag : NULL,
				.buf = buf + (size_t)chunk * m,
				.on_data = check ? rx_data : NULL,
				.on_data_arg = &rx[m],
			};
			rx[m] = (struct rx_check){ .fnv = FNV_INIT };
			off += len;
		}
		ret = objstore_get_many(os, g, m);
		if (ret)
			goto out;
		for (unsigned i = 0; i < m; i++) {
			if (g[i].got != g[i].len ||
			    (check && !rx_ok(&rx[i], &g[i]))) {
				ret = -EIO;
				goto out;
			}
			if (outfd >= 0) {
				ret = write_all(outfd, g[i].buf, g[i].got);
				if (ret)
					goto out;
			}
		}
	}
out:
	free(g);
	free(rx);
	free(buf);
	return ret;
}

int main(int argc, char **argv)
{
	struct dstage_config *cfg = NULL;
	struct objstore *os = NULL;
	const char *conf = NULL, *url, *cmd;
	char err[512];
	int ret, i = 1;

	if (argc > 2 && !strcmp(argv[1], "--config")) {
		conf = argv[2];
		i = 3;
	}
	if (argc - i < 2)
		return usage();
	url = argv[i];
	cmd = argv[i + 1];
	argv += i + 2;
	argc -= i + 2;
	ret = config_load(conf, &cfg, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "objstore_tool: %s\n", err);
		return 2;
	}
	log_set_level(cfg->log_level);
	ret = objstore_open(url, cfg, &os);
	if (ret)
		goto out;
	if (!strcmp(cmd, "ls")) {
		ret = objstore_list(os, argc > 0 ? argv[0] : "", print_entry,
				    NULL);
	} else if (!strcmp(cmd, "head") && argc == 1) {
		struct objstore_info oi;

		ret = objstore_head(os, argv[0], &oi);
		if (!ret)
			printf("%" PRIu64 "\t%s\t%" PRId64 "\n", oi.size,
			       oi.etag, oi.mtime);
	} else if (!strcmp(cmd, "get") && (argc == 3 || argc == 4)) {
		uint64_t off = strtoull(argv[1], NULL, 0);
		size_t len = strtoull(argv[2], NULL, 0), got = 0;
		char *buf = malloc(len ? len : 1);

		if (!buf) {
			ret = -ENOMEM;
			goto out;
		}
		ret = objstore_get(os, argv[0], off, len,
				   argc == 4 ? argv[3] : NULL, buf, &got);
		if (!ret)
			ret = write_all(STDOUT_FILENO, buf, got);
		free(buf);
	} else if (!strcmp(cmd, "cat") && argc >= 1 && argc <= 3) {
		uint64_t chunk = 8 << 20;
		int fd = STDOUT_FILENO;

		if (argc >= 2 && config_parse_size(argv[1], &chunk)) {
			ret = usage();
			goto out_rc;
		}
		if (argc == 3) {
			fd = !strcmp(argv[2], "-")
				     ? -1
				     : open(argv[2],
					    O_WRONLY | O_CREAT | O_TRUNC, 0644);
			if (fd < 0 && strcmp(argv[2], "-")) {
				perror(argv[2]);
				ret = -errno;
				goto out;
			}
		}
		ret = cat_object(os, cfg, argv[0], chunk ? chunk : 1, fd);
		if (fd > STDOUT_FILENO)
			close(fd);
	} else if (!strcmp(cmd, "put") && argc == 2) {
		struct stat sb;
		int fd = open(argv[1], O_RDONLY);

		if (fd < 0 || fstat(fd, &sb)) {
			perror(argv[1]);
			ret = -errno;
			goto out;
		}
		ret = objstore_put_fd(os, argv[0], fd, (uint64_t)sb.st_size);
		close(fd);
	} else if (!strcmp(cmd, "upload") && (argc == 2 || argc == 3)) {
		ret = upload_file(os, argv[0], argv[1], argc == 3);
	} else if (!strcmp(cmd, "abort-id") && argc == 2) {
		ret = objstore_upload_abort_id(os, argv[0], argv[1]);
	} else if (!strcmp(cmd, "uploads") && argc <= 1) {
		ret = objstore_upload_list(os, argc ? argv[0] : "",
					   print_upload, NULL);
	} else if (!strcmp(cmd, "rm") && argc == 1) {
		ret = objstore_delete(os, argv[0]);
	} else if (!strcmp(cmd, "fill") && argc == 2) {
		long n = strtol(argv[1], NULL, 10);
		char key[1100];

		for (long k = 0; k < n && !ret; k++) {
			snprintf(key, sizeof(key), "%s%05ld", argv[0], k);
			ret = objstore_put_buf(os, key, key, strlen(key));
		}
	} else if (!strcmp(cmd, "cp") && argc == 2) {
		ret = objstore_copy(os, argv[0], argv[1]);
	} else if (!strcmp(cmd, "set-sha256") && argc == 3) {
		/* KEY ETAG|- SHA256: prints the ETag afterwards */
		char now[OBJSTORE_ETAG_MAX];

		ret = objstore_set_sha256(os, argv[0],
					  strcmp(argv[1], "-") ? argv[1] : NULL,
					  argv[2], now);
		if (!ret)
			printf("%s\n", now);
	} else {
		ret = usage();
		goto out_rc;
	}
out:
	if (os && getenv("DSTAGE_TOOL_STATS")) {
		struct objstore_stats s;

		objstore_get_stats(os, &s);
		fprintf(stderr,
			"{\"requests\": %" PRIu64 ", \"retries\": %" PRIu64
			", \"bytes_in\": %" PRIu64 ", \"bytes_out\": %" PRIu64
			", \"errors\": %" PRIu64 "}\n",
			s.requests, s.retries, s.bytes_in, s.bytes_out,
			s.errors);
	}
	if (ret < 0)
		fprintf(stderr, "error: %s\n", strerrorname_np(-ret));
	ret = ret < 0 ? 1 : 0;
out_rc:
	objstore_free(os);
	config_free(cfg);
	return ret;
}
