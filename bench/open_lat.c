// SPDX-License-Identifier: MIT
/*
 * bench/open_lat: where a small file's time goes, one reader. Reads every
 * file named on standard input (one path a line, relative to DIR), in
 * order: stat (a LOOKUP on a FUSE mount whose dentries were dropped), open
 * (an OPEN: dstagefs's passthrough check and backing file), read to the
 * end (1 MiB reads), close; and prints the mean microseconds of each step
 * and the files a second. Run it on a local tree and on the same tree
 * through a mount, page cache dropped before each, alternately
 * (bench/results/history/issue31-fuse-ceiling-2026-12-04-to-06.md,
 * "Measured 2026-12-06"):
 *
 *   (cd TREE && find . -type f | sort) > /tmp/list
 *   sync; echo 3 > /proc/sys/vm/drop_caches
 *   build/bench/open_lat TREE < /tmp/list
 *
 * Exit status 1 when a file cannot be read (named on stderr).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OPEN_LAT_BUF (1u << 20)

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
	double t_stat = 0, t_open = 0, t_read = 0, t_close = 0, t0;
	char line[4096], path[8192];
	unsigned long n = 0;
	char *buf;

	if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		fprintf(stderr, "usage: open_lat DIR < LIST (paths relative "
				"to DIR, one a line)\n");
		return argc == 2 ? 0 : 2;
	}
	buf = malloc(OPEN_LAT_BUF);
	if (!buf)
		return 1;
	t0 = now_us();
	while (fgets(line, sizeof(line), stdin)) {
		struct stat st;
		double a, b, c, d, e;
		ssize_t r;
		int fd;

		line[strcspn(line, "\n")] = '\0';
		if (!line[0])
			continue;
		snprintf(path, sizeof(path), "%s/%s", argv[1], line);
		a = now_us();
		if (stat(path, &st))
			goto fail;
		b = now_us();
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			goto fail;
		c = now_us();
		while ((r = read(fd, buf, OPEN_LAT_BUF)) > 0)
			;
		d = now_us();
		close(fd);
		e = now_us();
		if (r < 0)
			goto fail;
		t_stat += b - a;
		t_open += c - b;
		t_read += d - c;
		t_close += e - d;
		n++;
	}
	if (!n) {
		fprintf(stderr, "open_lat: no paths on standard input\n");
		free(buf);
		return 1;
	}
	printf("%s: %lu files, %.0f files/s; per file: stat %.1f us, open "
	       "%.1f us, read %.1f us, close %.1f us\n",
	       argv[1], n, (double)n / (now_us() - t0) * 1e6, t_stat / n,
	       t_open / n, t_read / n, t_close / n);
	free(buf);
	return 0;
fail:
	perror(path);
	free(buf);
	return 1;
}
