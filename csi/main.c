// SPDX-License-Identifier: MIT
/*
 * dstage-csi: the CSI node plugin's program. Options, the configuration
 * (dstage.conf and DSTAGE_* for the daemon's socket and the log), the node
 * (csi_node.c), the gRPC server (csi_grpc.cc), then waits for SIGTERM or
 * SIGINT with the signals blocked in every thread. docs/deployment.md,
 * "Kubernetes with the CSI driver".
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "csi.h"
#include "dstage/config.h"
#include "dstage/log.h"

static void csi_usage(FILE *f)
{
	fprintf(f,
		"usage: dstage-csi [--endpoint unix:///PATH/csi.sock] [--mount "
		"DIR]\n"
		"                  [--state-dir DIR] [--node-id ID] "
		"[--config FILE]\n"
		"                  [--recheck MS] [--retry-after S] "
		"[--daemon-timeout S]\n"
		"                  [--metrics-textfile PATH]\n"
		"\n"
		"The dstage CSI node plugin: serves the CSI Identity and Node "
		"services on a\n"
		"unix socket for kubelet. A volume names a dataset (staged and "
		"verified\n"
		"through the node's stager daemon, then bound read-only) or a "
		"job's\n"
		"checkpoint directory (bound read-write) of the node's "
		"dstagefs "
		"mount.\n"
		"\n"
		"  --endpoint unix:///PATH  the socket (default "
		"unix:///csi/csi.sock; $CSI_ENDPOINT)\n"
		"  --mount DIR              the node's dstagefs mount (default "
		"/data)\n"
		"  --state-dir DIR          published targets, for restarts "
		"(default /run/dstage-csi)\n"
		"  --node-id ID             NodeGetInfo's id (default: the "
		"host "
		"name; $NODE_NAME)\n"
		"  --config FILE            dstage.conf (default "
		"$DSTAGE_CONFIG, "
		"/etc/dstage/dstage.conf)\n"
		"  --recheck MS             how often stale targets are looked "
		"for (default 5000)\n"
		"  --retry-after S          a failed stage is reported this "
		"long "
		"before the next (default 30)\n"
		"  --daemon-timeout S       a request to the stager daemon "
		"fails (UNAVAILABLE) after\n"
		"                           this long without an answer "
		"(default 30)\n"
		"  --metrics-textfile PATH  write the counters there every "
		"--recheck (node exporter's\n"
		"                           textfile format)\n"
		"  -h, --help               this text\n"
		"\n"
		"The stager daemon's socket is daemon.socket of the "
		"configuration (DSTAGE_DAEMON_SOCKET).\n");
}

static void csi_write_metrics(struct csi_node *n, const char *path)
{
	char buf[4096], tmp[PATH_MAX + 8];
	FILE *f;

	if (!path)
		return;
	csi_node_metrics(n, buf, sizeof(buf));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "we");
	if (!f)
		return;
	fputs(buf, f);
	if (fclose(f) || rename(tmp, path))
		unlink(tmp);
}

/* The command line's options (the rest comes from dstage.conf). */
struct csi_args {
	const char *endpoint, *config, *metrics;
	struct csi_node_opts o;
};

/* Parse argv into a: -1 to go on, else the exit code. */
static int csi_args_parse(int argc, char **argv, struct csi_args *a)
{
	static const struct option opts[] = {
		{ "endpoint", required_argument, NULL, 'e' },
		{ "mount", required_argument, NULL, 'm' },
		{ "state-dir", required_argument, NULL, 's' },
		{ "node-id", required_argument, NULL, 'n' },
		{ "config", required_argument, NULL, 'c' },
		{ "recheck", required_argument, NULL, 'r' },
		{ "retry-after", required_argument, NULL, 'a' },
		{ "daemon-timeout", required_argument, NULL, 'T' },
		{ "metrics-textfile", required_argument, NULL, 'M' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		char *end;
		unsigned long v;

		switch (c) {
		case 'e':
			a->endpoint = optarg;
			break;
		case 'm':
			a->o.mount = optarg;
			break;
		case 's':
			a->o.state_dir = optarg;
			break;
		case 'n':
			a->o.node_id = optarg;
			break;
		case 'c':
			a->config = optarg;
			break;
		case 'r':
		case 'a':
		case 'T':
			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || *end || !*optarg || !v || v > 86400000) {
				fprintf(stderr,
					"dstage-csi: --%s %s: expected a "
					"positive number\n",
					c == 'r'   ? "recheck"
					: c == 'a' ? "retry-after"
						   : "daemon-timeout",
					optarg);
				return 2;
			}
			if (c == 'r')
				a->o.recheck_ms = (unsigned)v;
			else if (c == 'a')
				a->o.retry_s = (unsigned)v;
			else
				csi_stage_set_timeout((unsigned)v);
			break;
		case 'M':
			a->metrics = optarg;
			break;
		case 'h':
			csi_usage(stdout);
			return 0;
		default:
			csi_usage(stderr);
			return 2;
		}
	}
	return -1;
}

int main(int argc, char **argv)
{
	struct csi_args a = {
		.endpoint = getenv("CSI_ENDPOINT"),
		.o = {
			.mount = "/data",
			.state_dir = "/run/dstage-csi",
			.node_id = getenv("NODE_NAME"),
		},
	};
	struct dstage_config *cfg = NULL;
	struct csi_node *n = NULL;
	struct csi_grpc *g = NULL;
	char err[CSI_MSG_MAX];
	sigset_t set;
	int ret, sig;

	ret = csi_args_parse(argc, argv, &a);
	if (ret >= 0)
		return ret;
	if (optind < argc) {
		fprintf(stderr, "dstage-csi: unexpected argument '%s'\n",
			argv[optind]);
		csi_usage(stderr);
		return 2;
	}
	if (!a.endpoint)
		a.endpoint = "unix:///csi/csi.sock";
	if (strncmp(a.endpoint, "unix://", 7) || a.endpoint[7] != '/') {
		fprintf(stderr,
			"dstage-csi: --endpoint %s: expected unix:///PATH\n",
			a.endpoint);
		return 2;
	}
	ret = config_load(a.config, &cfg, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "dstage-csi: %s\n", err);
		return 2;
	}
	log_set_level((enum log_level)cfg->log_level);
	a.o.socket = cfg->daemon_socket;
	/* The server's threads inherit the mask: signals come to sigwait. */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* The socket (connect needs write permission: root, kubelet, only),
	 * the state directory's files and the targets made: the service's. */
	umask(077);
	ret = csi_node_open(&a.o, &n, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "dstage-csi: %s\n", err);
		config_free(cfg);
		return 1;
	}
	ret = csi_node_rebind_stale(n, NULL);
	if (ret && ret != -ENOTCONN)
		log_warn("dstage-csi: re-binding stale targets at start: %s",
			 strerror(-ret));
	ret = csi_node_start_rebinder(n);
	if (!ret)
		ret = csi_grpc_start(n, a.endpoint + 7, &g);
	if (ret) {
		fprintf(stderr, "dstage-csi: %s: %s\n", a.endpoint,
			strerror(-ret));
		csi_node_close(n);
		config_free(cfg);
		return 1;
	}
	log_info("dstage-csi: serving %s on %s for node %s (mount %s, daemon "
		 "%s)",
		 CSI_DRIVER_NAME, a.endpoint, csi_node_id(n), a.o.mount,
		 a.o.socket);
	for (;;) {
		unsigned ms = a.o.recheck_ms ? a.o.recheck_ms : 5000;
		struct timespec ts = { .tv_sec = ms / 1000,
				       .tv_nsec =
					       (long)(ms % 1000) * 1000000L };

		csi_write_metrics(n, a.metrics);
		sig = sigtimedwait(&set, NULL, &ts);
		if (sig == SIGTERM || sig == SIGINT)
			break;
	}
	log_info("dstage-csi: signal %d: stopping (published volumes stay)",
		 sig);
	csi_grpc_stop(g);
	csi_write_metrics(n, a.metrics);
	csi_node_close(n);
	config_free(cfg);
	return 0;
}
