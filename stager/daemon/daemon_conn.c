// SPDX-License-Identifier: MIT
/*
 * daemon_conn: the daemon's socket. daemon_conn_listen binds daemon.socket
 * under an exclusive flock on "<socket>.lock" (one daemon per socket); the
 * accept thread admits each connection against the connection caps and
 * starts a detached thread for it, which decides whether the peer is an
 * admin, opens its own catalog and jobs connections at its first request
 * and serves one request line after another through daemon_req_run until
 * the peer closes, a send fails or the peer stays idle too long.
 *
 * Connection states: accepted -> admitted (caps) or refused (an end line
 * saying why, then closed) -> serving (request, reply, request, ...) ->
 * closed (peer gone, send failed or timed out, idle past --idle-timeout
 * with no whole request, or shut down by daemon_conn_stop at stop).
 *
 * Invariants:
 *   - at most d->lim.max_conns connections are served at once (uid 0 is not
 *     counted against it, so root can always reach a flooded daemon), and
 *     at most d->lim.max_conns_uid per uid; the last max_conns / 8 of
 *     them go only to uids holding none, so however many uids hold their
 *     most, max_conns / 8 more uids still get one each (issue 42);
 *   - the accept thread never exits before d->stop: out of descriptors
 *     (EMFILE, ENFILE) or memory it backs off and tries again, logging once
 *     per burst;
 *   - the socket is created with its final mode (umask around bind): there
 *     is no moment when it has another one;
 *   - a struct daemon_conn belongs to its thread alone.
 *
 * Locks: d->conn_lock protects d->n_conns and d->uids[]; it is taken alone
 * (never together with d->lock or a job's lock).
 *
 * Who is an admin and who may see which dataset: daemon_peer.c.
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon_i.h"
#include "dstage/catalog.h"
#include "dstage/log.h"

#define DAEMON_CONN_SEND_TIMEOUT 30 /* s: a peer that reads nothing */
#define DAEMON_CONN_BACKOFF_MS 50 /* accept out of descriptors */
#define DAEMON_CONN_LOG_EVERY 10 /* s between "refusing" lines */
#define DAEMON_CONN_FDS 8 /* descriptors a serving connection may need */
#define DAEMON_CONN_STOP_WAIT 5 /* s for connections to end at stop */
#define DAEMON_CONN_RESERVE_DIV 8 /* --max-conns / 8 kept for new uids */

/* ---- admission ---- */

/* The last connections under --max-conns, kept for uids holding none. */
static unsigned daemon_conn_reserve(const struct daemon *d)
{
	return d->lim.max_conns / DAEMON_CONN_RESERVE_DIV;
}

/* Whether uid (holding held connections) is over a cap; writes why. */
static int daemon_conn_over(const struct daemon *d, uid_t uid, unsigned held,
			    char *why, size_t len)
{
	unsigned reserve = daemon_conn_reserve(d);

	if (uid != 0 && d->n_conns >= d->lim.max_conns)
		snprintf(why, len,
			 "the daemon serves its most connections, %u "
			 "(daemon --max-conns)",
			 d->lim.max_conns);
	else if (held >= d->lim.max_conns_uid)
		snprintf(why, len,
			 "uid %u has its most connections open, %u "
			 "(daemon --max-conns-per-uid)",
			 (unsigned)uid, d->lim.max_conns_uid);
	else if (uid != 0 && held && d->n_conns >= d->lim.max_conns - reserve)
		snprintf(why, len,
			 "uid %u holds %u; the daemon's last %u of %u "
			 "connections are kept for uids holding none "
			 "(daemon --max-conns / %u)",
			 (unsigned)uid, held, reserve, d->lim.max_conns,
			 DAEMON_CONN_RESERVE_DIV);
	else
		return 0;
	return -EAGAIN;
}

/* Count a connection of uid in, or say why not (-EAGAIN, why written). */
static int daemon_conn_admit(struct daemon *d, uid_t uid, char *why, size_t len)
{
	struct daemon_uidcount *u = NULL, *free_slot = NULL;
	int ret;

	pthread_mutex_lock(&d->conn_lock);
	for (unsigned i = 0; i < d->n_uids; i++) {
		if (d->uids[i].n && d->uids[i].uid == uid)
			u = &d->uids[i];
		else if (!d->uids[i].n && !free_slot)
			free_slot = &d->uids[i];
	}
	ret = daemon_conn_over(d, uid, u ? u->n : 0, why, len);
	if (!ret && !u && !free_slot) {
		snprintf(why, len,
			 "the daemon serves its most users (daemon "
			 "--max-conns)");
		ret = -EAGAIN;
	} else if (!ret) {
		if (!u) {
			u = free_slot;
			u->uid = uid;
		}
		u->n++;
		if (uid != 0)
			d->n_conns++;
	}
	pthread_mutex_unlock(&d->conn_lock);
	return ret;
}

static void daemon_conn_leave(struct daemon *d, uid_t uid)
{
	pthread_mutex_lock(&d->conn_lock);
	for (unsigned i = 0; i < d->n_uids; i++)
		if (d->uids[i].n && d->uids[i].uid == uid) {
			d->uids[i].n--;
			break;
		}
	if (uid != 0)
		d->n_conns--;
	pthread_cond_broadcast(&d->conn_cond);
	pthread_mutex_unlock(&d->conn_lock);
}

static void daemon_conn_link(struct daemon *d, struct daemon_conn *c)
{
	pthread_mutex_lock(&d->conn_lock);
	c->next = d->conns;
	c->prev = NULL;
	if (d->conns)
		d->conns->prev = c;
	d->conns = c;
	pthread_mutex_unlock(&d->conn_lock);
}

/* Off the list before its fd is closed: daemon_conn_stop never shuts down
 * a descriptor number that has been reused. */
static void daemon_conn_unlink(struct daemon *d, struct daemon_conn *c)
{
	pthread_mutex_lock(&d->conn_lock);
	if (c->prev)
		c->prev->next = c->next;
	else
		d->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&d->conn_lock);
}

int daemon_conn_stop(struct daemon *d)
{
	struct timespec dl;
	unsigned left;
	int ret = 0;

	timeutil_real_after_ms(&dl, DAEMON_CONN_STOP_WAIT * 1000);
	pthread_mutex_lock(&d->conn_lock);
	for (struct daemon_conn *c = d->conns; c; c = c->next)
		shutdown(c->fd, SHUT_RDWR);
	for (;;) {
		left = 0;
		for (unsigned i = 0; i < d->n_uids; i++)
			left += d->uids[i].n;
		if (!left || ret)
			break;
		ret = pthread_cond_timedwait(&d->conn_cond, &d->conn_lock, &dl);
	}
	pthread_mutex_unlock(&d->conn_lock);
	if (left)
		log_warn("%u connection(s) still busy at stop", left);
	return left ? -EBUSY : 0;
}

/* ---- connections ---- */

/* true when fewer than DAEMON_CONN_FDS descriptors are free (fd: any open
 * one, to duplicate). */
static bool daemon_conn_fds_scarce(int fd)
{
	int fds[DAEMON_CONN_FDS], n = 0;
	bool scarce = false;

	for (; n < DAEMON_CONN_FDS; n++) {
		fds[n] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (fds[n] < 0) {
			scarce = errno == EMFILE || errno == ENFILE;
			break;
		}
	}
	while (n-- > 0)
		close(fds[n]);
	return scarce;
}

/*
 * Open the catalog and jobs connections (at the first request). Short of
 * descriptors (a flood of idle connections), wait for idle ones to close,
 * for at most the idle timeout, rather than fail the request.
 */
static int daemon_conn_open(struct daemon_conn *c)
{
	struct timespec ts = { 0, DAEMON_CONN_BACKOFF_MS * 1000000L };
	unsigned waited = 0;
	int ret;

	for (;;) {
		ret = catalog_open(c->d->cfg->catalog_path, 0, &c->cat);
		if (!ret)
			ret = jobs_open(c->d->cfg->catalog_path, &c->jq);
		if (!ret || waited >= c->d->lim.idle_ms ||
		    !daemon_conn_fds_scarce(c->fd))
			break;
		jobs_close(c->jq);
		catalog_close(c->cat);
		c->jq = NULL;
		c->cat = NULL;
		nanosleep(&ts, NULL);
		waited += DAEMON_CONN_BACKOFF_MS;
	}
	if (ret)
		daemon_peer_end(c, ret,
				"the daemon cannot open its catalog: %s",
				strerror(-ret));
	return ret;
}

static void *daemon_conn_thread(void *arg)
{
	struct daemon_conn *c = arg;
	struct daemon *d = c->d;
	struct passwd pw, *pwp = NULL;
	struct timeval tv = { .tv_sec = DAEMON_CONN_SEND_TIMEOUT };
	char pwbuf[4096];
	int ret;

	if (setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
		log_warn("SO_SNDTIMEO: %s", strerror(errno));
	if (!getpwuid_r(c->uid, &pw, pwbuf, sizeof(pwbuf), &pwp) && pwp)
		snprintf(c->user, sizeof(c->user), "%s", pw.pw_name);
	daemon_peer_groups(c);
	c->admin = daemon_peer_admin(c);
	proto_reader_init(&c->in, c->fd);
	c->in.timeout_ms = d->lim.idle_ms;
	for (;;) {
		ret = proto_read(&c->in, &c->msg);
		if (ret == -EINVAL || ret == -E2BIG) {
			daemon_peer_end(c, ret, "malformed request");
			break;
		}
		if (ret == -ETIMEDOUT) {
			daemon_peer_end(c, ret,
					"no whole request in %u ms: closing "
					"(daemon --idle-timeout)",
					d->lim.idle_ms);
			break;
		}
		if (ret)
			break;
		log_debug("uid %u: %s", (unsigned)c->uid,
			  proto_get(&c->msg, "cmd") ?: "?");
		if (!c->cat && daemon_conn_open(c))
			break;
		log_cause_clear(); /* the request's own cause, for its end */
		if (daemon_req_run(c))
			break;
	}
	jobs_close(c->jq);
	catalog_close(c->cat);
	proto_free(&c->out);
	daemon_conn_unlink(d, c);
	close(c->fd);
	daemon_conn_leave(d, c->uid);
	free(c->groups);
	free(c);
	return NULL;
}

/* Tell a refused peer why, without waiting for it, and close. */
static void daemon_conn_refuse(struct daemon *d, int fd, uid_t uid,
			       const char *why)
{
	static const char fmt[] = "type=end\trc=%d\tmsg=too many connections: "
				  "%s; try again later\n";
	char line[256];
	int n = snprintf(line, sizeof(line), fmt, -EAGAIN, why);
	double now = timeutil_mono_s();

	if (n > 0)
		(void)!send(fd, line, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
	close(fd);
	d->refused++;
	if (now - d->refuse_logged >= DAEMON_CONN_LOG_EVERY) {
		log_warn("refusing a connection from uid %u: %s (%u refused "
			 "since the last such line)",
			 (unsigned)uid, why, d->refused);
		d->refuse_logged = now;
		d->refused = 0;
	}
}

/* accept failed with err: back off when the fault is a lack of resources
 * (descriptors, memory), logging once per burst. */
static void daemon_conn_backoff(struct daemon *d, int err)
{
	struct timespec ts = { 0, DAEMON_CONN_BACKOFF_MS * 1000000L };

	if (!d->accept_burst)
		log_error("accept on %s: %s: backing off until it recovers "
			  "(connections: at most %u, %u per uid, idle ones "
			  "closed after %u ms)",
			  d->cfg->daemon_socket, strerror(err),
			  d->lim.max_conns, d->lim.max_conns_uid,
			  d->lim.idle_ms);
	if (!d->accept_burst)
		d->accept_burst = timeutil_mono_s();
	nanosleep(&ts, NULL);
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
		struct ucred cr;
		socklen_t len = sizeof(cr);
		char why[192];
		pthread_t t;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (atomic_load(&d->stop))
				break;
			daemon_conn_backoff(d, errno);
			continue;
		}
		if (d->accept_burst) {
			log_info("accepting connections again after %.1f s",
				 timeutil_mono_s() - d->accept_burst);
			d->accept_burst = 0;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
			log_error("SO_PEERCRED: %s", strerror(errno));
			close(fd);
			continue;
		}
		if (daemon_conn_admit(d, cr.uid, why, sizeof(why))) {
			daemon_conn_refuse(d, fd, cr.uid, why);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			daemon_conn_leave(d, cr.uid);
			daemon_conn_backoff(d, ENOMEM);
			continue;
		}
		c->d = d;
		c->fd = fd;
		c->uid = cr.uid;
		c->gid = cr.gid;
		c->pid = cr.pid;
		daemon_conn_link(d, c);
		if (pthread_create(&t, &attr, daemon_conn_thread, c)) {
			daemon_conn_unlink(d, c);
			close(fd);
			free(c);
			daemon_conn_leave(d, cr.uid);
			daemon_conn_backoff(d, EAGAIN);
		}
	}
	pthread_attr_destroy(&attr);
	return NULL;
}

/* ---- the socket ---- */

void daemon_conn_fd_limit(const struct daemon *d)
{
	struct rlimit rl;
	rlim_t need = (rlim_t)d->lim.max_conns * DAEMON_CONN_FDS + 64;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_cur < need && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max < need ? rl.rlim_max : need;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			getrlimit(RLIMIT_NOFILE, &rl);
	}
	if (rl.rlim_cur < need)
		log_warn("RLIMIT_NOFILE is %llu: --max-conns %u needs about "
			 "%llu descriptors; a flood of connections can run the "
			 "daemon out of them (it then backs off and recovers). "
			 "Raise LimitNOFILE= or lower --max-conns",
			 (unsigned long long)rl.rlim_cur, d->lim.max_conns,
			 (unsigned long long)need);
}

/* Refuse a socket directory others could change. */
static int daemon_conn_check_dir(const char *dir)
{
	struct stat st;
	uid_t me = geteuid();

	if (stat(dir, &st) < 0) {
		int e = errno;

		log_error("daemon.socket's directory %s: %s", dir, strerror(e));
		return -e;
	}
	if (!S_ISDIR(st.st_mode)) {
		log_error("daemon.socket's directory %s is not a directory",
			  dir);
		return -ENOTDIR;
	}
	if (st.st_uid != me) {
		log_error(
			"daemon.socket's directory %s is owned by uid %u, not "
			"by the daemon's uid %u: another user could replace "
			"the socket. Fix: 'chown %u %s', or set daemon.socket "
			"in a directory of the daemon's own (e.g. "
			"/run/dstage/stager.sock)",
			dir, (unsigned)st.st_uid, (unsigned)me, (unsigned)me,
			dir);
		return -EPERM;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		log_error("daemon.socket's directory %s is writable by %s "
			  "(mode %04o): another user could replace the socket. "
			  "Fix: 'chmod go-w %s', or set daemon.socket in a "
			  "directory of the daemon's own (e.g. "
			  "/run/dstage/stager.sock)",
			  dir, st.st_mode & S_IWOTH ? "others" : "its group",
			  (unsigned)(st.st_mode & 07777), dir);
		return -EPERM;
	}
	return 0;
}

/* Open the lock file: never through a symlink, a regular file of ours,
 * mode DAEMON_LOCK_MODE. */
static int daemon_conn_lockfile(struct daemon *d, const char *lockpath)
{
	struct stat st;
	int ret;

	d->lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
			 DAEMON_LOCK_MODE);
	if (d->lockfd < 0) {
		ret = -errno;
		log_error("%s: %s%s", lockpath, strerror(errno),
			  errno == ELOOP ? " (a symlink: remove it)" : "");
		return ret;
	}
	if (fstat(d->lockfd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		log_error("%s is not a regular file of uid %u: remove it",
			  lockpath, (unsigned)geteuid());
		return -EPERM;
	}
	if ((st.st_mode & 07777) != DAEMON_LOCK_MODE) {
		log_info("%s: mode %04o tightened to %04o", lockpath,
			 (unsigned)(st.st_mode & 07777), DAEMON_LOCK_MODE);
		if (fchmod(d->lockfd, DAEMON_LOCK_MODE) < 0)
			return -errno;
	}
	return 0;
}

int daemon_conn_listen(struct daemon *d)
{
	const char *path = d->cfg->daemon_socket;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char lockpath[sizeof(sa.sun_path) + 8], dir[sizeof(sa.sun_path)];
	char *slash;
	mode_t old;
	int ret;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_error("daemon.socket %s: longer than %zu bytes", path,
			  sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == dir)
		dir[1] = '\0';
	else
		*slash = '\0';
	if (mkdir(dir, DAEMON_DIR_MODE) < 0 && errno != EEXIST) {
		ret = -errno;
		log_error("creating %s: %s", dir, strerror(errno));
		return ret;
	}
	ret = daemon_conn_check_dir(dir);
	if (ret)
		return ret;
	snprintf(lockpath, sizeof(lockpath), "%s.lock", path);
	ret = daemon_conn_lockfile(d, lockpath);
	if (ret)
		return ret;
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
	/* The socket is born with its mode: no thread runs yet, so the
	 * process-wide umask is ours alone for this call. */
	old = umask(~DAEMON_SOCKET_MODE & 0777);
	ret = bind(d->lfd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (ret < 0 || listen(d->lfd, 64) < 0) {
		ret = -errno;
		log_error("listening on %s: %s", path, strerror(errno));
		return ret;
	}
	return 0;
}
