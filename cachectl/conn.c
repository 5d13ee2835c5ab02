// SPDX-License-Identifier: MIT
/*
 * conn: cachectl's exchange with the stager daemon. One connection per
 * command: the request is one proto line ("cmd=cache.status ..."), the
 * answer rows and one "type=end rc=... msg=..." line (docs/stager.md).
 *
 * Stateless between commands; a struct conn lives for one command in one
 * thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cachectl.h"
#include "jsonout.h"

int conn_open(struct conn *cn, const struct dstage_config *cfg, const char *cmd)
{
	int ret;

	cn->cfg = cfg;
	ret = proto_client_open(&cn->pc, "cachectl", cfg->daemon_socket);
	if (!ret)
		proto_add(&cn->pc.out, "cmd", cmd);
	return ret;
}

void conn_close(struct conn *cn)
{
	proto_client_close(&cn->pc);
}

struct conn_trampoline {
	struct conn *cn;
	conn_row_cb cb;
	void *arg;
};

static int conn_row(struct proto_client *pc, void *arg)
{
	struct conn_trampoline *t = arg;

	(void)pc;
	return t->cb(t->cn, t->arg);
}

int conn_call(struct conn *cn, conn_row_cb cb, void *arg)
{
	struct conn_trampoline t = { cn, cb, arg };

	return proto_client_call(&cn->pc, cb ? conn_row : NULL, &t);
}

int conn_result(struct conn *cn)
{
	if (!cn->pc.rc) {
		if (cn->pc.endwarn[0])
			fprintf(stderr, "cachectl: warning: %s\n",
				cn->pc.endwarn);
		return CLI_EXIT_OK;
	}
	fprintf(stderr, "cachectl: %s\n",
		cn->pc.endmsg[0] ? cn->pc.endmsg : strerror(-cn->pc.rc));
	return cli_exit_code(cn->pc.rc);
}

const char *conn_get(struct conn *cn, const char *k)
{
	return proto_get(&cn->pc.msg, k) ?: "";
}
