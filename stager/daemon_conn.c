// SPDX-License-Identifier: MIT
/*
 * daemon_conn: the daemon's socket. daemon_conn_listen binds daemon.socket
 * under an exclusive flock on "<socket>.lock" (one daemon per socket); the
 * accept thread starts a detached thread per connection, which reads the
 * peer's credentials (SO_PEERCRED), decides whether it is an admin, opens
 * its own catalog and jobs connections and serves one request line after
 * another through daemon_req_run until the peer closes or a send fails.
 *
 * Connection states: accepted -> credentials read -> serving (request,
 * reply, request, ...) -> closed. A struct daemon_conn belongs to its
 * thread alone; nothing in it is shared.
 *
 * Authorization: uid 0 is an admin; otherwise the peer is one when the
 * group daemon.admin_group is its gid or, via getgrouplist, one of its
 * user's groups.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon_i.h"
#include "dstage/catalog.h"
#include "dstage/log.h"

static bool daemon_conn_admin(const struct daemon_conn *c)
{
	const char *name = c->d->cfg->daemon_admin_group;
	struct group *gr;
	gid_t groups[256];
	int n = 256;
	gid_t admin;

	if (c->uid == 0)
		return true;
	if (!name || !*name)
		return false;
	gr = getgrnam(name);
	if (!gr)
		return false;
	admin = gr->gr_gid;
	if (c->gid == admin)
		return true;
	if (!c->user[0] || c->user[0] == '#')
		return false;
	if (getgrouplist(c->user, c->gid, groups, &n) < 0)
		n = 256;
	for (int i = 0; i < n; i++)
		if (groups[i] == admin)
			return true;
	return false;
}

int daemon_conn_end(struct daemon_conn *c, int rc, const char *fmt, ...)
{
	char msg[1024] = "";
	va_list ap;

	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
	}
	proto_reset(&c->out);
	proto_add(&c->out, "type", "end");
	proto_add_i64(&c->out, "rc", rc);
	if (msg[0])
		proto_add(&c->out, "msg", msg);
	else if (rc)
		proto_add(&c->out, "msg", strerror(-rc));
	return proto_send(c->fd, &c->out);
}

void daemon_conn_row(struct daemon_conn *c, const char *type)
{
	proto_reset(&c->out);
	proto_add(&c->out, "type", type);
}

/* ---- connections ---- */

static void *daemon_conn_thread(void *arg)
{
	struct daemon_conn *c = arg;
	struct ucred cr;
	socklen_t len = sizeof(cr);
	struct passwd pw, *pwp = NULL;
	char pwbuf[4096];
	int ret;

	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
		log_error("SO_PEERCRED: %s", strerror(errno));
		goto out;
	}
	c->uid = cr.uid;
	c->gid = cr.gid;
	c->pid = cr.pid;
	if (!getpwuid_r(c->uid, &pw, pwbuf, sizeof(pwbuf), &pwp) && pwp)
		snprintf(c->user, sizeof(c->user), "%s", pw.pw_name);
	c->admin = daemon_conn_admin(c);
	ret = catalog_open(c->d->cfg->catalog_path, 0, &c->cat);
	if (!ret)
		ret = jobs_open(c->d->cfg->catalog_path, &c->jq);
	if (ret) {
		daemon_conn_end(c, ret,
				"the daemon cannot open its catalog: %s",
				strerror(-ret));
		goto out;
	}
	proto_reader_init(&c->in, c->fd);
	for (;;) {
		ret = proto_read(&c->in, &c->msg);
		if (ret == -EINVAL || ret == -E2BIG) {
			daemon_conn_end(c, ret, "malformed request");
			break;
		}
		if (ret)
			break;
		log_debug("uid %u: %s", (unsigned)c->uid,
			  proto_get(&c->msg, "cmd") ?: "?");
		if (daemon_req_run(c))
			break;
	}
out:
	jobs_close(c->jq);
	catalog_close(c->cat);
	proto_free(&c->out);
	close(c->fd);
	free(c);
	return NULL;
}

void *daemon_conn_accept_thread(void *arg)
{
	struct daemon *d = arg;
	pthread_attr_t attr;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	while (!atomic_load(&d->stop)) {
		int fd = accept4(d->lfd, NULL, NULL, SOCK_CLOEXEC);
		struct daemon_conn *c;
		pthread_t t;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (!atomic_load(&d->stop))
				log_error("accept: %s", strerror(errno));
			break;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		c->d = d;
		c->fd = fd;
		if (pthread_create(&t, &attr, daemon_conn_thread, c)) {
			close(fd);
			free(c);
		}
	}
	pthread_attr_destroy(&attr);
	return NULL;
}

int daemon_conn_listen(struct daemon *d)
{
	const char *path = d->cfg->daemon_socket;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char lockpath[sizeof(sa.sun_path) + 8], dir[sizeof(sa.sun_path)];
	char *slash;
	int ret;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_error("daemon.socket %s: longer than %zu bytes", path,
			  sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = '\0';
		if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
			ret = -errno;
			log_error("creating %s: %s", dir, strerror(errno));
			return ret;
		}
	}
	snprintf(lockpath, sizeof(lockpath), "%s.lock", path);
	d->lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (d->lockfd < 0) {
		ret = -errno;
		log_error("%s: %s", lockpath, strerror(errno));
		return ret;
	}
	if (flock(d->lockfd, LOCK_EX | LOCK_NB) < 0) {
		log_error("another stager daemon holds %s: it is already "
			  "running on %s",
			  lockpath, path);
		return -EADDRINUSE;
	}
	unlink(path);
	d->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (d->lfd < 0)
		return -errno;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (bind(d->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    chmod(path, 0666) < 0 || listen(d->lfd, 64) < 0) {
		ret = -errno;
		log_error("listening on %s: %s", path, strerror(errno));
		return ret;
	}
	return 0;
}
