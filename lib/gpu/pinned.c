// SPDX-License-Identifier: MIT
/*
 * pinned: dataset files into pinned host buffers and onto the device
 * (include/dstage/pinned.h). The device side is pinned_cuda.c.
 *
 * Reads are records (struct pinned_io) of one context's pool, each reading
 * bytes of one descriptor into memory: a file opened by path (buffered, or
 * O_DIRECT when buffer, offset and length are 4 KiB-aligned), a cache
 * object's own data file read the same way when the cache holds it whole
 * and verified (cache_open_passthrough: its bytes at offset 0, checked when
 * filled and by the scrub, as for FUSE passthrough), or else a dup of a
 * cache file from cache_read_fd (bytes the cache has just checked). Ranges
 * the cache cannot hand out that way are read with cache_read_iov at once.
 * Records are queued on the context's io_uring and submitted together; with
 * no ring each is read with pread when queued.
 *
 * State of a record: free -> busy (queued or in the kernel) -> free, its
 * bytes counted in done; a short completion is requeued for the rest, an
 * end of file before len is -EIO (a short file). On completion it
 * decrements *pending of its owner (a staging slot, a host read, a batch)
 * and stores the first error in *err. Invariant: no call returns while a
 * record is busy, so buffers are the caller's again on return.
 *
 * State of a staging slot (pinned_read_device): FREE -> READING (records
 * pending) -> COPYING (cudaMemcpyAsync queued, its event recorded) -> FREE
 * once the event is done. A slot is copied only with pending == 0 and no
 * error: no unread or unchecked byte ever reaches the device.
 *
 * Locking: none. A context and its files belong to one thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dstage/cache.h"
#include "dstage/log.h"
#include "dstage/pinned.h"
#include "pinned_i.h"

#define PINNED_ALIGN 4096u
#define PINNED_MAX_DEPTH 8
#define PINNED_IOS 256 /* records, and io_uring entries */
#define PINNED_DEFAULT_CHUNK (8u << 20)
#define PINNED_MAX_CHUNK (1u << 30)
#define PINNED_CACHE_BLOCKS 63 /* per cache_read_fd (limit 64, unaligned) */

/* cachestat(2), Linux 6.5: the same number on every architecture; older
 * kernels answer ENOSYS. Not in Debian 12's headers yet. */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct pinned_cachestat_range {
	uint64_t off, len;
};
struct pinned_cachestat {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted,
		nr_recently_evicted;
};

struct pinned_file;

struct pinned_io {
	struct pinned_file *f;
	int fd;
	bool own_fd; /* a cache_read_fd dup: closed when done */
	bool direct; /* fd is f->dfd */
	bool busy;
	char *buf;
	uint64_t foff; /* offset of buf[0] in fd */
	size_t len; /* bytes wanted */
	size_t rlen; /* bytes asked (len, rounded up for an O_DIRECT tail) */
	size_t done;
	unsigned *pending; /* the owner's count of busy records */
	int *err; /* the owner's first error */
};

enum pinned_slot_state { SLOT_FREE, SLOT_READING, SLOT_COPYING };

struct pinned_slot {
	char *buf; /* chunk bytes of pinned memory */
	void *ev; /* CUDA event of its copy (NULL in the CPU mode) */
	enum pinned_slot_state state;
	uint64_t off; /* file offset of its bytes */
	size_t len;
	unsigned pending;
	int err;
};

struct pinned {
	struct pinned_cuda cu;
	size_t chunk;
	unsigned depth;
	unsigned flags;
	char *stage; /* depth * chunk bytes, pinned */
	void *batch_ev;
	struct pinned_slot slots[PINNED_MAX_DEPTH];
	bool ring_ok;
	struct io_uring ring;
	unsigned busy; /* records queued or in the kernel */
	unsigned unsubmitted; /* of which not yet submitted */
	struct pinned_io ios[PINNED_IOS];
};

struct pinned_file {
	struct pinned *p;
	int fd; /* -1 for a cache object read through the cache */
	int dfd; /* O_DIRECT descriptor of the same file, or -1 */
	uint64_t size;
	struct cache *c; /* NULL for a file by path */
	bool whole; /* a cache object read from its data file (fd, dfd) */
	struct cache_object obj; /* its strings in strs */
	char *strs;
	char *name; /* path, or dataset/key, for messages */
	bool no_cachestat; /* the kernel has none: O_DIRECT where aligned */
};

static bool pinned_no_uring(void)
{
	const char *v = getenv("DSTAGE_NO_URING");

	return v && *v && strcmp(v, "0");
}

int pinned_init(const struct pinned_opts *opts, struct pinned **out)
{
	struct pinned_opts o = { 0 };
	struct pinned *p;
	int ret;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (opts)
		o = *opts;
	if (o.chunk == 0)
		o.chunk = PINNED_DEFAULT_CHUNK;
	if (o.depth == 0)
		o.depth = 3;
	if (o.depth < 2 || o.depth > PINNED_MAX_DEPTH ||
	    o.chunk > PINNED_MAX_CHUNK) {
		log_error("pinned: depth %u / chunk %zu out of range (depth "
			  "2..%d, chunk up to %u bytes)",
			  o.depth, o.chunk, PINNED_MAX_DEPTH, PINNED_MAX_CHUNK);
		return -EINVAL;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->chunk = (o.chunk + PINNED_ALIGN - 1) & ~(size_t)(PINNED_ALIGN - 1);
	p->depth = o.depth;
	p->flags = o.flags;
	ret = pinned_cuda_init(&p->cu, o.device, o.flags);
	if (ret)
		goto err;
	ret = pinned_cuda_host_alloc(&p->cu, p->chunk * p->depth,
				     (void **)&p->stage);
	if (ret)
		goto err;
	for (unsigned i = 0; i < p->depth; i++) {
		p->slots[i].buf = p->stage + (size_t)i * p->chunk;
		ret = pinned_cuda_event_new(&p->cu, &p->slots[i].ev);
		if (ret)
			goto err;
	}
	ret = pinned_cuda_event_new(&p->cu, &p->batch_ev);
	if (ret)
		goto err;
	if (!pinned_no_uring()) {
		ret = io_uring_queue_init(PINNED_IOS, &p->ring, 0);
		if (ret == 0)
			p->ring_ok = true;
		else
			log_info("pinned: io_uring unavailable (%s): reads "
				 "use pread",
				 strerror(-ret));
	}
	*out = p;
	return 0;
err:
	pinned_free(p);
	return ret;
}

void pinned_free(struct pinned *p)
{
	if (!p)
		return;
	if (p->ring_ok)
		io_uring_queue_exit(&p->ring);
	for (unsigned i = 0; i < PINNED_MAX_DEPTH; i++)
		pinned_cuda_event_free(&p->cu, p->slots[i].ev);
	pinned_cuda_event_free(&p->cu, p->batch_ev);
	pinned_cuda_host_free(&p->cu, p->stage);
	pinned_cuda_release(&p->cu);
	free(p);
}

enum pinned_mode pinned_mode(const struct pinned *p)
{
	return p ? p->cu.mode : PINNED_MODE_CPU;
}

const char *pinned_mode_name(enum pinned_mode mode)
{
	return mode == PINNED_MODE_CUDA ? "cuda" : "cpu";
}

const char *pinned_mode_reason(const struct pinned *p)
{
	return p ? p->cu.reason : "";
}

int pinned_host_alloc(struct pinned *p, size_t len, void **out)
{
	return p ? pinned_cuda_host_alloc(&p->cu, len, out) : -EINVAL;
}

void pinned_host_free(struct pinned *p, void *buf)
{
	if (p)
		pinned_cuda_host_free(&p->cu, buf);
}

int pinned_dev_alloc(struct pinned *p, size_t len, void **out)
{
	return p ? pinned_cuda_dev_alloc(&p->cu, len, out) : -EINVAL;
}

void pinned_dev_free(struct pinned *p, void *dev)
{
	if (p)
		pinned_cuda_dev_free(&p->cu, dev);
}

int pinned_copy_to_dev(struct pinned *p, void *dev, const void *host,
		       size_t len)
{
	if (!p || (len && (!dev || !host)))
		return -EINVAL;
	return pinned_cuda_copy(&p->cu, dev, host, len, true);
}

int pinned_copy_from_dev(struct pinned *p, void *host, const void *dev,
			 size_t len)
{
	if (!p || (len && (!dev || !host)))
		return -EINVAL;
	return pinned_cuda_copy(&p->cu, host, dev, len, false);
}

/* Files. */

int pinned_file_open(struct pinned *p, const char *path,
		     struct pinned_file **out)
{
	struct pinned_file *f;
	struct stat st, dst;
	int ret;

	if (!p || !path || !out)
		return -EINVAL;
	*out = NULL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->p = p;
	f->dfd = -1;
	f->name = strdup(path);
	f->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (!f->name || f->fd < 0) {
		ret = f->name ? -errno : -ENOMEM;
		goto err;
	}
	if (fstat(f->fd, &st)) {
		ret = -errno;
		goto err;
	}
	if (S_ISDIR(st.st_mode)) {
		ret = -EISDIR;
		goto err;
	}
	f->size = (uint64_t)st.st_size;
	if (!(p->flags & PINNED_NO_DIRECT)) {
		/* Where the filesystem takes O_DIRECT (not tmpfs); the same
		 * file, or none (replaced between the two opens). */
		f->dfd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
		if (f->dfd >= 0 &&
		    (fstat(f->dfd, &dst) || dst.st_dev != st.st_dev ||
		     dst.st_ino != st.st_ino)) {
			close(f->dfd);
			f->dfd = -1;
		}
	}
	*out = f;
	return 0;
err:
	if (ret != -ENOENT)
		log_warn("pinned: cannot open %s: %s", path, strerror(-ret));
	pinned_file_close(f);
	return ret;
}

/*
 * A cache object the cache holds whole and verified is read from its data
 * file directly: fd is cache_open_passthrough's descriptor (which holds the
 * object's in-use lock, so it is not evicted under the reader) and dfd an
 * O_DIRECT reopen of it. Otherwise (partial, an older format,
 * verify_reads = always, O_DIRECT refused) f stays on the cache's path.
 */
static void pinned_open_whole(struct pinned_file *f)
{
	struct stat st, dst;
	char proc[64];
	int fd, ret;

	ret = cache_open_passthrough(f->c, &f->obj, &fd);
	if (ret) {
		if (ret != -EAGAIN)
			log_warn("pinned: %s: cannot open its cache file: %s: "
				 "reading it through the cache",
				 f->name, strerror(-ret));
		return;
	}
	if (fstat(fd, &st) || (uint64_t)st.st_size < f->size) {
		close(fd);
		return;
	}
	f->fd = fd;
	f->whole = true;
	if (f->p->flags & PINNED_NO_DIRECT)
		return;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	f->dfd = open(proc, O_RDONLY | O_CLOEXEC | O_DIRECT);
	if (f->dfd >= 0 && (fstat(f->dfd, &dst) || dst.st_dev != st.st_dev ||
			    dst.st_ino != st.st_ino)) {
		close(f->dfd);
		f->dfd = -1;
	}
}

bool pinned_file_direct(const struct pinned_file *f)
{
	return f && f->whole;
}

int pinned_file_open_cached(struct pinned *p, struct cache *c,
			    const struct cache_object *obj,
			    struct pinned_file **out)
{
	struct pinned_file *f;
	size_t ld, lk, le;

	if (!p || !c || !obj || !obj->key || !obj->dataset || !out)
		return -EINVAL;
	*out = NULL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	ld = strlen(obj->dataset) + 1;
	lk = strlen(obj->key) + 1;
	le = strlen(obj->etag ? obj->etag : "") + 1;
	f->strs = malloc(ld + lk + le);
	f->name = malloc(ld + lk);
	if (!f->strs || !f->name) {
		free(f->strs);
		free(f->name);
		free(f);
		return -ENOMEM;
	}
	f->p = p;
	f->fd = f->dfd = -1;
	f->c = c;
	f->size = obj->size;
	f->obj = *obj;
	memcpy(f->strs, obj->dataset, ld);
	memcpy(f->strs + ld, obj->key, lk);
	memcpy(f->strs + ld + lk, obj->etag ? obj->etag : "", le);
	f->obj.dataset = f->strs;
	f->obj.key = f->strs + ld;
	f->obj.etag = f->strs + ld + lk;
	snprintf(f->name, ld + lk, "%s/%s", obj->dataset, obj->key);
	if (f->size)
		pinned_open_whole(f);
	*out = f;
	return 0;
}

void pinned_file_close(struct pinned_file *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	if (f->dfd >= 0)
		close(f->dfd);
	free(f->strs);
	free(f->name);
	free(f);
}

uint64_t pinned_file_size(const struct pinned_file *f)
{
	return f ? f->size : 0;
}

/* Records. */

static void pinned_io_end(struct pinned *p, struct pinned_io *io, int err)
{
	if (err && !*io->err) {
		*io->err = err;
		if (err == -EIO && io->done < io->len)
			log_error("pinned: %s is short or unreadable: %zu of "
				  "%zu bytes at offset %llu (file changed "
				  "since open, or an I/O error): nothing of "
				  "it handed over",
				  io->f->name, io->done, io->len,
				  (unsigned long long)io->foff);
	}
	if (io->own_fd)
		close(io->fd);
	io->busy = false;
	(*io->pending)--;
	p->busy--;
}

/* Read the rest of io with pread, at once (no ring). */
static void pinned_io_pread(struct pinned *p, struct pinned_io *io)
{
	while (io->done < io->len) {
		ssize_t r =
			pread(io->fd, io->buf + io->done, io->rlen - io->done,
			      (off_t)(io->foff + io->done));

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno == EINVAL && io->direct) {
			io->fd = io->f->fd;
			io->direct = false;
			io->rlen = io->len;
			continue;
		}
		if (r <= 0) {
			pinned_io_end(p, io, r < 0 ? -errno : -EIO);
			return;
		}
		io->done += (size_t)r;
		if (io->direct && io->done % PINNED_ALIGN) {
			io->fd = io->f->fd;
			io->direct = false;
			io->rlen = io->len;
		}
	}
	pinned_io_end(p, io, 0);
}

static void pinned_io_queue(struct pinned *p, struct pinned_io *io)
{
	struct io_uring_sqe *sqe;
	size_t l = io->rlen - io->done;

	if (!p->ring_ok) {
		pinned_io_pread(p, io);
		return;
	}
	sqe = io_uring_get_sqe(&p->ring);
	if (!sqe) {
		io_uring_submit(&p->ring);
		p->unsubmitted = 0;
		sqe = io_uring_get_sqe(&p->ring);
	}
	/* PINNED_IOS records never exceed the ring's PINNED_IOS entries. */
	io_uring_prep_read(sqe, io->fd, io->buf + io->done, (unsigned)l,
			   io->foff + io->done);
	io_uring_sqe_set_data(sqe, io);
	p->unsubmitted++;
}

/* Complete what the kernel has done; wait for one completion first when
 * wait. Returns 0 or a -errno of io_uring itself. */
static int pinned_reap(struct pinned *p, bool wait)
{
	struct io_uring_cqe *cqe;
	int ret;

	if (!p->ring_ok || !p->busy)
		return 0;
	ret = wait ? io_uring_submit_and_wait(&p->ring, 1)
		   : io_uring_submit(&p->ring);
	if (ret < 0 && ret != -EINTR)
		return ret;
	p->unsubmitted = 0;
	while (io_uring_peek_cqe(&p->ring, &cqe) == 0) {
		struct pinned_io *io = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&p->ring, cqe);
		if (res == -EINTR || res == -EAGAIN) {
			pinned_io_queue(p, io);
			continue;
		}
		if (res == -EINVAL && io->direct) {
			/* The filesystem refused O_DIRECT after all. */
			io->fd = io->f->fd;
			io->direct = false;
			io->rlen = io->len;
			pinned_io_queue(p, io);
			continue;
		}
		if (res <= 0) {
			pinned_io_end(p, io, res < 0 ? res : -EIO);
			continue;
		}
		io->done += (size_t)res;
		if (io->done >= io->len) {
			pinned_io_end(p, io, 0);
			continue;
		}
		if (io->direct && io->done % PINNED_ALIGN) {
			io->fd = io->f->fd;
			io->direct = false;
			io->rlen = io->len;
		}
		pinned_io_queue(p, io);
	}
	return 0;
}

/* Wait until every record is done. */
static int pinned_drain(struct pinned *p)
{
	int ret = 0;

	while (p->busy && !ret)
		ret = pinned_reap(p, true);
	if (ret)
		log_error("pinned: io_uring wait failed: %s", strerror(-ret));
	return ret;
}

static struct pinned_io *pinned_io_get(struct pinned *p)
{
	while (p->busy >= PINNED_IOS)
		if (pinned_reap(p, true))
			return NULL;
	for (unsigned i = 0; i < PINNED_IOS; i++)
		if (!p->ios[i].busy)
			return &p->ios[i];
	return NULL;
}

/* Start reading len bytes of fd at foff into buf for an owner. */
static int pinned_io_start(struct pinned_file *f, int fd, bool own_fd,
			   bool direct, uint64_t foff, char *buf, size_t len,
			   size_t rlen, unsigned *pending, int *err)
{
	struct pinned *p = f->p;
	struct pinned_io *io = pinned_io_get(p);

	if (!io) {
		if (own_fd)
			close(fd);
		return -EIO;
	}
	*io = (struct pinned_io){ .f = f,
				  .fd = fd,
				  .own_fd = own_fd,
				  .direct = direct,
				  .busy = true,
				  .buf = buf,
				  .foff = foff,
				  .len = len,
				  .rlen = rlen,
				  .pending = pending,
				  .err = err };
	(*pending)++;
	p->busy++;
	pinned_io_queue(p, io);
	return 0;
}

/* cache_read_iov's bytes into the caller's buffer (when not there yet). */
struct pinned_sink {
	char *buf;
	size_t len, at;
};

static int pinned_sink_fn(void *arg, const struct iovec *iov, int n)
{
	struct pinned_sink *k = arg;

	for (int i = 0; i < n; i++) {
		if (iov[i].iov_len > k->len - k->at)
			return -EIO;
		if (iov[i].iov_base != k->buf + k->at)
			memcpy(k->buf + k->at, iov[i].iov_base, iov[i].iov_len);
		k->at += iov[i].iov_len;
	}
	return 0;
}

/* One piece of a cache object (at most PINNED_CACHE_BLOCKS blocks): from
 * the cache file where cache_read_fd hands out checked blocks, otherwise
 * through cache_read_iov (fetching, repairing) at once. */
static int pinned_cache_piece(struct pinned_file *f, uint64_t off, size_t len,
			      char *buf, unsigned *pending, int *err)
{
	struct pinned_sink k = { .buf = buf, .len = len };
	uint64_t fd_off = 0;
	int fd = -1, ret;

	ret = cache_read_fd(f->c, &f->obj, off, len, &fd, &fd_off);
	if (ret == 0)
		return pinned_io_start(f, fd, true, false, fd_off, buf, len,
				       len, pending, err);
	if (ret != -EAGAIN)
		return ret;
	ret = cache_read_iov(f->c, &f->obj, off, len, buf, CACHE_READ_DIRECT,
			     pinned_sink_fn, &k);
	if (ret == 0 && k.at != len) {
		log_error("pinned: %s: the cache returned %zu of %zu bytes at "
			  "offset %llu (object shorter than its manifest "
			  "size): nothing of it handed over",
			  f->name, k.at, len, (unsigned long long)off);
		ret = -EIO;
	}
	return ret;
}

/*
 * Whether [off, off + len) of f is all in the page cache (cachestat(2)):
 * then a buffered read is a memory copy, where O_DIRECT would go to the
 * disk again (and first write back any dirty pages). Cold ranges, and every
 * range on kernels before 6.5, take O_DIRECT.
 */
static bool pinned_in_page_cache(struct pinned_file *f, uint64_t off,
				 size_t len)
{
	struct pinned_cachestat_range r = { off, len };
	struct pinned_cachestat cs;
	uint64_t pages = (off + len + PINNED_ALIGN - 1) / PINNED_ALIGN -
			 off / PINNED_ALIGN;

	if (f->no_cachestat || !len)
		return false;
	if (syscall(__NR_cachestat, f->fd, &r, &cs, 0)) {
		if (errno == ENOSYS || errno == EOPNOTSUPP)
			f->no_cachestat = true;
		return false;
	}
	return cs.nr_cache >= pages;
}

/*
 * Queue the reads of [off, off + len) of f into buf; *pending counts them,
 * *err gets the first failure. may_round: buf has room to round the last
 * piece up to 4 KiB (a staging chunk), so a file's tail can be O_DIRECT.
 */
static int pinned_queue_range(struct pinned_file *f, uint64_t off, size_t len,
			      char *buf, bool may_round, unsigned *pending,
			      int *err)
{
	struct pinned *p = f->p;
	int ret = 0;

	while (len && !ret && !*err) {
		size_t n = len < p->chunk ? len : p->chunk;

		if (f->c && !f->whole) {
			uint64_t bs = cache_block_size(f->c);
			uint64_t lim = (off / bs + PINNED_CACHE_BLOCKS) * bs;

			if (n > lim - off)
				n = (size_t)(lim - off);
			ret = pinned_cache_piece(f, off, n, buf, pending, err);
		} else {
			bool aligned = f->dfd >= 0 && !(off % PINNED_ALIGN) &&
				       !((uintptr_t)buf % PINNED_ALIGN);
			bool whole = !(n % PINNED_ALIGN);
			bool tail = may_round && off + n == f->size;
			size_t rl = n;

			if (aligned && !whole && tail)
				rl = (n + PINNED_ALIGN - 1) &
				     ~(size_t)(PINNED_ALIGN - 1);
			aligned = aligned && (whole || tail) &&
				  !pinned_in_page_cache(f, off, n);
			ret = pinned_io_start(f, aligned ? f->dfd : f->fd,
					      false, aligned, off, buf, n, rl,
					      pending, err);
		}
		off += n;
		buf += n;
		len -= n;
	}
	return ret;
}

static int pinned_check_range(const struct pinned_file *f, uint64_t off,
			      size_t len)
{
	if (off > f->size || len > f->size - off) {
		log_error("pinned: %s: range [%llu, +%zu) past its end "
			  "(%llu bytes)",
			  f->name, (unsigned long long)off, len,
			  (unsigned long long)f->size);
		return -EINVAL;
	}
	return 0;
}

int pinned_read_host(struct pinned_file *f, uint64_t off, size_t len, void *dst)
{
	unsigned pending = 0;
	int err = 0, ret;

	if (!f || (len && !dst))
		return -EINVAL;
	ret = pinned_check_range(f, off, len);
	if (ret)
		return ret;
	ret = pinned_queue_range(f, off, len, dst, false, &pending, &err);
	if (pinned_drain(f->p) && !ret)
		ret = -EIO;
	return ret ? ret : err;
}

/* A slot whose reads are done and good goes to the device. */
static int pinned_slot_send(struct pinned *p, struct pinned_slot *s, char *dev,
			    uint64_t base, void *stream)
{
	int ret;

	if (s->err)
		return s->err;
	ret = pinned_cuda_copy_async(&p->cu, dev + (s->off - base), s->buf,
				     s->len, stream, s->ev);
	s->state = ret ? SLOT_FREE : SLOT_COPYING;
	return ret;
}

/* Free the slots whose copies are done; when wait and none is, wait for
 * the one with the lowest offset. */
static int pinned_slots_free(struct pinned *p, bool wait)
{
	struct pinned_slot *oldest = NULL;
	bool freed = false;

	for (unsigned i = 0; i < p->depth; i++) {
		struct pinned_slot *s = &p->slots[i];
		int r;

		if (s->state != SLOT_COPYING)
			continue;
		r = pinned_cuda_event_done(&p->cu, s->ev);
		if (r < 0)
			return r;
		if (r) {
			s->state = SLOT_FREE;
			freed = true;
		} else if (!oldest || s->off < oldest->off) {
			oldest = s;
		}
	}
	if (freed || !wait || !oldest)
		return 0;
	oldest->state = SLOT_FREE;
	return pinned_cuda_event_wait(&p->cu, oldest->ev);
}

int pinned_read_device(struct pinned_file *f, uint64_t off, size_t len,
		       void *dev, void *stream)
{
	struct pinned *p;
	uint64_t next = off, end = off + len;
	int ret;

	if (!f || (len && !dev))
		return -EINVAL;
	ret = pinned_check_range(f, off, len);
	if (ret)
		return ret;
	p = f->p;
	while (!ret) {
		bool reading = false;

		ret = pinned_slots_free(p, false);
		for (unsigned i = 0; i < p->depth && !ret && next < end; i++) {
			struct pinned_slot *s = &p->slots[i];
			uint64_t n =
				end - next < p->chunk ? end - next : p->chunk;

			if (s->state != SLOT_FREE)
				continue;
			*s = (struct pinned_slot){ .buf = s->buf,
						   .ev = s->ev,
						   .state = SLOT_READING,
						   .off = next,
						   .len = (size_t)n };
			next += n;
			ret = pinned_queue_range(f, s->off, s->len, s->buf,
						 true, &s->pending, &s->err);
		}
		if (!ret)
			ret = pinned_reap(p, false);
		for (unsigned i = 0; i < p->depth && !ret; i++) {
			struct pinned_slot *s = &p->slots[i];

			if (s->state != SLOT_READING)
				continue;
			if (s->pending)
				reading = true;
			else
				ret = pinned_slot_send(p, s, dev, off, stream);
		}
		if (ret || (next >= end && !reading))
			break; /* the copies still queued are waited for below */
		if (reading)
			ret = pinned_reap(p, true);
		else
			ret = pinned_slots_free(p, true);
	}
	/* Give every buffer back: reads in flight, copies queued. */
	if (pinned_drain(p) && !ret)
		ret = -EIO;
	for (unsigned i = 0; i < p->depth; i++) {
		struct pinned_slot *s = &p->slots[i];
		int r = 0;

		if (s->state == SLOT_COPYING)
			r = pinned_cuda_event_wait(&p->cu, s->ev);
		if (r && !ret)
			ret = r;
		if (!ret && s->state == SLOT_READING && s->err)
			ret = s->err;
		s->state = SLOT_FREE;
	}
	return ret;
}

/* Batches. */

int64_t pinned_read_batch(struct pinned *p, struct pinned_entry *e, size_t n,
			  void *arena, size_t arena_len, size_t align,
			  void *dev, void *stream)
{
	struct pinned_file *fs = NULL;
	uint64_t used = 0;
	unsigned pending = 0;
	int ret = 0;
	size_t i;

	if (!p || (n && !e) || (align & (align - 1)))
		return -EINVAL;
	if (!align)
		align = 256;
	fs = calloc(n ? n : 1, sizeof(*fs));
	if (!fs)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		fs[i] = (struct pinned_file){ .p = p, .fd = -1, .dfd = -1 };
		e[i].err = 0;
		e[i].size = e[i].arena_off = 0;
	}
	/* Open everything and lay it out before reading a byte. */
	for (i = 0; i < n && !ret; i++) {
		struct pinned_file *f = &fs[i];
		struct stat st;

		if (e[i].path) {
			f->name = (char *)e[i].path;
			f->fd = open(e[i].path, O_RDONLY | O_CLOEXEC);
			if (f->fd < 0 || fstat(f->fd, &st))
				ret = -errno;
			else if (S_ISDIR(st.st_mode))
				ret = -EISDIR;
			else
				f->size = (uint64_t)st.st_size;
		} else if (e[i].file) {
			*f = *e[i].file;
			f->fd = -1; /* not ours to close: reads use file's */
			ret = pinned_check_range(e[i].file, e[i].off,
						 (size_t)e[i].len);
			f->size = e[i].len;
		} else if (e[i].cache && e[i].obj && e[i].obj->key) {
			f->c = e[i].cache;
			f->obj = *e[i].obj;
			f->name = (char *)e[i].obj->key;
			f->size = e[i].obj->size;
		} else {
			ret = -EINVAL;
		}
		if (ret) {
			e[i].err = ret;
			log_warn("pinned: batch entry %zu (%s): %s", i,
				 e[i].path ? e[i].path : "no path or object",
				 strerror(-ret));
			break;
		}
		used = (used + align - 1) & ~(uint64_t)(align - 1);
		e[i].arena_off = used;
		e[i].size = f->size;
		used += f->size;
	}
	if (!ret && (used > arena_len || (used && !arena))) {
		log_error("pinned: a batch of %zu files needs %llu bytes of "
			  "arena, %zu given: read it in smaller batches or "
			  "give a larger arena",
			  n, (unsigned long long)used, arena_len);
		ret = -ENOSPC;
	}
	/* One submission for every file (the ring holds PINNED_IOS). */
	for (i = 0; i < n && !ret; i++) {
		ret = pinned_queue_range(e[i].file ? e[i].file : &fs[i],
					 e[i].file ? e[i].off : 0,
					 (size_t)fs[i].size,
					 (char *)arena + e[i].arena_off, false,
					 &pending, &e[i].err);
		if (ret && !e[i].err)
			e[i].err = ret;
	}
	if (pinned_drain(p) && !ret)
		ret = -EIO;
	for (i = 0; i < n && !ret; i++)
		ret = e[i].err;
	if (ret) {
		for (i = 0; i < n; i++)
			if (!e[i].err)
				e[i].err = -ECANCELED;
	} else if (dev && used) {
		ret = pinned_cuda_copy_async(&p->cu, dev, arena, (size_t)used,
					     stream, p->batch_ev);
		if (!ret)
			ret = pinned_cuda_event_wait(&p->cu, p->batch_ev);
	}
	for (i = 0; i < n; i++)
		if (fs[i].fd >= 0)
			close(fs[i].fd);
	free(fs);
	return ret ? ret : (int64_t)used;
}
