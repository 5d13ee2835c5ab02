#!/usr/bin/env python3
"""soak: dstage under load for a set time, checking every byte and watching
for leaks.

  tests/soak/soak.py [--duration SECONDS] [--build DIR] [--readers N]
                     [--cache-mb MB] [--kill-every SECONDS] [--rgw-env FILE]
                     [--keep] [--json FILE]

What runs together, for --duration seconds (default 150):
  - a stager daemon and a dstagefs mount sharing one config, catalog and a
    cache (--cache-mb, default 32) smaller than the datasets together, so
    that eviction runs all the time;
  - three file:// datasets (large files, many small files, a few 8 MiB
    files) and, with --rgw-env (an env.json of a running radosgw, as
    $DSTAGE_RGW_ENV), a fourth on radosgw behind tests/faultproxy.py, which
    arms one fault (503, 500, reset, truncate, bare 503, 429) every 2 s;
  - --readers threads (default 16) reading through the mount: whole files
    hashed against SHA256SUMS, and random ranges compared with the source's
    bytes;
  - a stager thread (stage --wait, verify --repair, in turn), an eviction
    thread (cachectl evict), and a fault thread that flips bytes in cache
    files that no process holds open (a process checks a block once while
    it holds the object open);
  - every --kill-every seconds (default 60; 0: never) kill -9 of the daemon
    or of the mount, in turn, and a restart.
  - a sampler: RSS, open descriptors and threads of the daemon and of
    dstagefs, every 2 s.

It fails (exit 1) on: any byte read that differs from the source; an error
that no restart or injected fault explains (a read error outside a mount
restart; a stager or cachectl failure outside a daemon restart, except a
stage whose file was evicted before it ended, by cachectl evict or by the
mount's fills, which is counted; a verify that leaves a damaged block or a
mismatch); a process that dies by itself;
a sanitizer report in a log; or growth in one process's life (its first
20 s left out as warm-up, the rest in thirds: the smallest sample of the
last third over the largest of the first) beyond the bounds: RSS 64 MiB
(four of the cache's 16 MiB fill buffers), 32 descriptors, 16 threads. Exit 2: the setup failed (a binary missing: build first).

Every loop is bounded by the deadline; the summary (counts by kind, reads,
bytes, the samples' ranges) is printed, and written as JSON with --json.
"""
import argparse
import hashlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
SAMPLE_S = 2.0
# Growth allowed in one process life after warm-up. RSS: the cache keeps
# idle 16 MiB fill buffers for reuse, and a buffer's pages are faulted in
# as fills first use them, so RSS climbs in steps of up to 16 MiB before it
# levels off: four such steps.
BOUNDS = {"rss_kb": 64 * 1024, "fds": 32, "threads": 16}
GRACE_S = 3.0  # after a restart, errors of operations begun before it
WARM_S = 20.0
EVICTED = "not kept in the cache (full of pinned or busy data?)"  # of each process life, not looked at for growth


def data(seed, n):
    """Deterministic bytes that do not repeat within a block."""
    out = bytearray()
    h = hashlib.sha256(seed.encode()).digest()
    while len(out) < n:
        h = hashlib.sha256(h).digest()
        out += h * 64  # 2 KiB per hash: cheap, still unique per 2 KiB
    return bytes(out[:n])


def write_dataset(root, files):
    root.mkdir(parents=True)
    lines = []
    for key, body in sorted(files.items()):
        p = root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body)
        lines.append("%s  %s\n" % (hashlib.sha256(body).hexdigest(), key))
    (root / "SHA256SUMS").write_text("".join(lines))
    return {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}


FLIP = 0x5a  # flip_loop XORs 3 bytes with this


# lib/cache/cache_i.h: the header's fixed part (magic, version, block size, object
# size, data offset) and the OFD lock byte of block b, CACHE_LOCK_BLOCK + b.
CACHE_HDR = struct.Struct("<8sIIQQ")
CACHE_LOCK_BLOCK = (1 << 62) + 1


def block_lock(fh, off):
    """Take, without waiting, the lock a fill holds on the block whose data
    holds byte off of the cache file fh (none is needed outside the blocks'
    data). A fill writes its blocks with O_DIRECT; a buffered write into the
    same pages while that write runs may leave the page cache holding what
    the disk had before it (a hole's zeros), and writeback then puts those
    stale bytes on disk under a valid record, which the filling process
    itself never checks again (it wrote them). Disk damage does not race a
    write like that; the flip must not either. The lock is a POSIX record
    lock, which conflicts with the cache's OFD locks, and goes with fh.
    Since format version 3 the header is in the sidecar (PATH.meta, data_off
    0 there: the data file holds the blocks alone); a sidecar itself holds
    no block's data, and its records are written buffered."""
    name = str(getattr(fh, "name", ""))
    if name.endswith(".meta"):
        return True
    try:
        with open(name + ".meta", "rb") as m:
            hdr = m.read(CACHE_HDR.size)
    except OSError:
        hdr = os.pread(fh.fileno(), CACHE_HDR.size, 0)
    if len(hdr) < CACHE_HDR.size:
        return True
    magic, _, bs, _, data_off = CACHE_HDR.unpack(hdr)
    if magic != b"DSTGOBJ1" or not bs or off + 3 <= data_off:
        return True
    first = max(off - data_off, 0) // bs
    last = (off + 2 - data_off) // bs
    try:
        fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB, last - first + 1,
                    CACHE_LOCK_BLOCK + first)
    except OSError:
        return False
    return True


def flip_signature(got, want):
    """True when got differs from want exactly as flip_loop damages a
    cache file: 1 to 3 contiguous bytes, each XORed with FLIP."""
    if len(got) != len(want):
        return False
    diff = [i for i in range(len(got)) if got[i] != want[i]]
    return (0 < len(diff) <= 3 and diff[-1] - diff[0] == len(diff) - 1
            and all(got[i] ^ want[i] == FLIP for i in diff))


def describe_diff(got, want):
    """What a difference looks like, for the report: lengths, where the
    differing bytes are and what they were XORed with, so that a failure of
    a long run can be classified afterwards (a flip, a short read, a
    block of zeros, a block of another object)."""
    diff = [i for i in range(min(len(got), len(want))) if got[i] != want[i]]
    out = "got %d bytes, want %d" % (len(got), len(want))
    if diff:
        xors = sorted({got[i] ^ want[i] for i in diff[:4096]})
        out += "; %d differ in [%d, %d]; XOR values %s%s; got %s at %d" % (
            len(diff), diff[0], diff[-1],
            ",".join("%02x" % x for x in xors[:8]),
            "..." if len(xors) > 8 else "",
            "zeros" if not any(got[diff[0]:diff[-1] + 1]) else
            got[diff[0]:diff[0] + 16].hex(), diff[0])
    return out


class Windows:
    """Times when a process was down (kill -9 to ready + GRACE_S)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.spans = []  # [start, end or None]

    def down(self):
        with self.lock:
            self.spans.append([time.monotonic(), None])

    def up(self):
        with self.lock:
            self.spans[-1][1] = time.monotonic() + GRACE_S

    def overlaps(self, t0, t1):
        with self.lock:
            return any(s <= t1 and (e is None or e >= t0)
                       for s, e in self.spans)


class Soak:
    def __init__(self, a):
        self.a = a
        self.build = Path(a.build).resolve()
        self.root = Path(tempfile.mkdtemp(prefix="dstage-soak-"))
        os.chmod(self.root, 0o755)
        self.deadline = None
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = {}  # kind -> n
        self.failures = {}  # kind -> {"n", "first_s", "example"}
        self.reads = self.read_bytes = 0
        self.datasets = {}  # name -> {"src": Path, "sums": {key: hex}}
        self.samples = {"daemon": {}, "dstagefs": {}}  # pid -> [samples]
        self.daemon_win, self.mount_win = Windows(), Windows()
        self.daemon = self.mount = None
        self.proxy = None
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("AWS_") and k != "DSTAGE_CONFIG"}

    # ---- bookkeeping ----

    def count(self, kind, n=1):
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + n

    def fail(self, what):
        """An unexplained event: counted by kind (digits and the temporary
        directory left out), the first 40 kinds kept with one example."""
        kind = re.sub(r"\b[0-9a-f]{16,}\b", "HEX",
                      what.replace(str(self.root), "ROOT"))
        kind = re.sub(r"\d+", "N", kind)[:120]
        with self.lock:
            f = self.failures.get(kind)
            if f:
                f["n"] += 1
            elif len(self.failures) < 40:
                self.failures[kind] = {
                    "n": 1, "first_s": round(time.monotonic() - self.t0),
                    "example": what[:600]}
        self.count("unexplained")

    def exe(self, name):
        for d in ("stager", "fs", "cachectl"):
            p = self.build / d / name
            if p.exists():
                return str(p)
        print("soak: %s not built under %s (cmake --build %s)" %
              (name, self.build, self.build), file=sys.stderr)
        sys.exit(2)

    # ---- setup ----

    def setup(self):
        self.stager_exe = self.exe("stager")
        self.fs_exe = self.exe("dstagefs")
        self.cachectl_exe = self.exe("cachectl")
        self.cfg = self.root / "dstage.conf"
        self.sock = self.root / "stager.sock"
        self.mnt = self.root / "mnt"
        self.mnt.mkdir()
        # verify_reads = always: the soak flips bytes in cache files and
        # holds that no reader ever sees one; that is the `always` policy.
        # In `fill` (the default) a whole object is passed through to the
        # kernel and a flip is the scrub's to find (test_scrub.py,
        # test_passthrough.py); the soak read one in its first run with
        # passthrough ("BYTES DIFFER", unexplained by its classifier).
        self.cfg.write_text(
            "[cache]\ndir = %s/cache\nsize = %dM\nverify_reads = always\n"
            "[catalog]\npath = %s/catalog.db\n"
            "[daemon]\nsocket = %s\n[log]\nlevel = info\n"
            % (self.root, self.a.cache_mb, self.root, self.sock))
        os.chmod(self.cfg, 0o644)
        layouts = {
            "big": {"f%02d.bin" % i: data("big%d" % i, 2 * MiB + 4099 * i)
                    for i in range(8)},
            "small": {"d%d/s%03d" % (i % 7, i): data("small%d" % i,
                                                     1 + 997 * i % 60000)
                      for i in range(150)},
            "wide": {"w%d.bin" % i: data("wide%d" % i, 8 * MiB - 3 * i)
                     for i in range(2)},
        }
        for name, files in layouts.items():
            src = self.root / ("src-" + name)
            sums = write_dataset(src, files)
            self.datasets[name] = {"src": src, "sums": sums,
                                   "url": "file://%s/" % src}
        if self.a.rgw_env:
            try:
                self.setup_s3()
            except (OSError, ValueError, KeyError,
                    subprocess.SubprocessError) as e:
                print("soak: radosgw of %s: %s (is it running and "
                      "answering?)" % (self.a.rgw_env, e), file=sys.stderr)
                sys.exit(2)
        self.start_daemon()
        for name, d in self.datasets.items():
            p = self.stager("add", name, d["url"], timeout=300)
            if p.returncode:
                print("soak: add %s: %s" % (name, p.stderr.decode()),
                      file=sys.stderr)
                sys.exit(2)
        self.start_mount()
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if all((self.mnt / "datasets" / n).is_dir()
                   for n in self.datasets):
                return
            time.sleep(0.2)
        print("soak: datasets did not appear in the mount", file=sys.stderr)
        sys.exit(2)

    def setup_s3(self):
        sys.path.insert(0, str(REPO / "tests"))
        from faultproxy import FaultProxy
        info = json.loads(Path(self.a.rgw_env).read_text())
        self.rgw = info
        self.proxy = FaultProxy(int(info["RGW_PORT"]), control_port=None)
        self.proxy.start()
        self.env.update(AWS_ACCESS_KEY_ID=info["AWS_ACCESS_KEY_ID"],
                        AWS_SECRET_ACCESS_KEY=info["AWS_SECRET_ACCESS_KEY"],
                        AWS_ENDPOINT_URL=self.proxy.endpoint,
                        AWS_REGION=info.get("AWS_REGION", "us-east-1"))
        bucket = "soak-%d-%d" % (os.getpid(), int(time.time()))
        files = {"o%02d.bin" % i: data("s3%d" % i, MiB + 511 * i)
                 for i in range(10)}
        src = self.root / "src-s3"
        sums = write_dataset(src, files)
        self.s3_put(bucket, "", None)
        for p in sorted(src.rglob("*")):
            self.s3_put(bucket, "p/" + str(p.relative_to(src)), p)
        self.datasets["s3"] = {"src": src, "sums": sums,
                               "url": "s3://%s/p/" % bucket}

    def s3_put(self, bucket, key, path):
        """PUT a bucket (path None) or an object, straight to radosgw."""
        info = self.rgw
        cmd = ["curl", "-sS", "-f", "--aws-sigv4",
               "aws:amz:%s:s3" % info.get("AWS_REGION", "us-east-1"),
               "--user", "%s:%s" % (info["AWS_ACCESS_KEY_ID"],
                                    info["AWS_SECRET_ACCESS_KEY"]),
               "-H", "x-amz-content-sha256: " +
               ("UNSIGNED-PAYLOAD" if path else hashlib.sha256(b"").hexdigest()),
               "-o", "/dev/null"]
        cmd += ["-T", str(path)] if path else ["-X", "PUT"]
        cmd.append("%s/%s/%s" % (info["AWS_ENDPOINT_URL"], bucket, key))
        subprocess.run(cmd, check=True, timeout=60, capture_output=True)

    def start_daemon(self):
        logf = open(self.root / "daemon.log", "ab")
        self.daemon = subprocess.Popen(
            [self.stager_exe, "--config", str(self.cfg), "daemon"],
            env=self.env, stdout=logf, stderr=logf)
        logf.close()
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if self.daemon.poll() is not None:
                break
            if self.sock.exists() and self.stager("list").returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("the daemon did not start; see %s/daemon.log" %
                           self.root)

    def start_mount(self):
        logf = open(self.root / "dstagefs.log", "ab")
        self.mount = subprocess.Popen(
            [self.fs_exe, "-f", str(self.mnt)],
            env=dict(self.env, DSTAGE_CONFIG=str(self.cfg)),
            stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if self.mount.poll() is not None:
                break
            if self.mounted():
                return
            time.sleep(0.05)
        raise RuntimeError("dstagefs did not mount; see %s/dstagefs.log" %
                           self.root)

    def mounted(self):
        real = os.path.realpath(self.mnt)
        with open("/proc/self/mounts") as f:
            if not any(line.split()[1] == real and
                       line.split()[2] == "fuse.dstagefs" for line in f):
                return False
        try:
            os.statvfs(self.mnt)
            return True
        except OSError:
            return False

    def stager(self, *args, timeout=600):
        return subprocess.run([self.stager_exe, "--config", str(self.cfg)] +
                              list(args), env=self.env, capture_output=True,
                              timeout=timeout)

    # ---- workers ----

    def reader(self, seed):
        rnd = random.Random(seed)
        names = sorted(self.datasets)
        while not self.stop.is_set():
            name = rnd.choice(names)
            d = self.datasets[name]
            key = rnd.choice(sorted(d["sums"]))
            path = self.mnt / "datasets" / name / key
            t0 = time.monotonic()
            try:
                if rnd.random() < 0.4:
                    self.read_whole(path, d["sums"][key], name, key)
                else:
                    self.read_ranges(path, d["src"] / key, rnd, name, key)
            except OSError as e:
                t1 = time.monotonic()
                if self.mount_win.overlaps(t0, t1):
                    self.count("read error in a mount restart")
                    time.sleep(0.1)
                else:
                    self.fail("read %s/%s: %s" % (name, key, e))
                    time.sleep(0.5)

    def read_whole(self, path, want, name, key):
        h = hashlib.sha256()
        n = 0
        with open(path, "rb") as f:
            while not self.stop.is_set():
                b = f.read(1 << 20)
                if not b:
                    break
                h.update(b)
                n += len(b)
            else:
                return
        if h.hexdigest() != want:
            self.count("BYTES DIFFER")
            self.fail("%s/%s: sha256 %s, manifest %s" %
                      (name, key, h.hexdigest(), want))
        with self.lock:
            self.reads += 1
            self.read_bytes += n

    def read_ranges(self, path, src, rnd, name, key):
        size = src.stat().st_size
        with open(path, "rb") as f, open(src, "rb") as s:
            for _ in range(8):
                off = rnd.randrange(0, max(size, 1))
                n = rnd.choice((1, 511, 4096, 65536, 300000))
                got = os.pread(f.fileno(), n, off)
                want = os.pread(s.fileno(), n, off)
                if got != want and flip_signature(got, want):
                    # flip_loop's own bytes, read from a block this
                    # process had verified before the flip landed (one
                    # check per open, docs/cache.md): the race between
                    # its "not open" check and its write. Counted, not a
                    # failure; any other difference is one.
                    self.count("read a flip under an open object "
                               "(verified before the flip)")
                    return
                if len(got) < len(want) and want.startswith(got):
                    # A read that the kernel split into several FUSE
                    # requests returns the pages it already had when the
                    # connection dies under a later one (kill -9 of
                    # dstagefs). The rest, read again on the same
                    # descriptor, then fails; the reader counts that
                    # error against the mount's restart window. A rest
                    # that reads is a short reply from a live server.
                    rest = os.pread(f.fileno(), len(want) - len(got),
                                    off + len(got))
                    self.count("BYTES DIFFER")
                    self.fail("%s/%s: a read of %d bytes at %d returned %d; "
                              "the rest read again gave %d" %
                              (name, key, n, off, len(got), len(rest)))
                    return
                if got != want:
                    self.count("BYTES DIFFER")
                    self.fail("%s/%s: %d bytes at %d differ from the "
                              "source (%s)" % (name, key, n, off,
                                               describe_diff(got, want)))
                    return
                with self.lock:
                    self.reads += 1
                    self.read_bytes += len(got)

    def command(self, kind, argv):
        """Run a stager or cachectl command and count it. Returns the
        CompletedProcess of a failure that no daemon restart explains, else
        None."""
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, env=self.env, capture_output=True,
                               timeout=max(30, self.deadline - t0 + 60))
        except subprocess.TimeoutExpired:
            self.fail("%s: timed out" % kind)
            return None
        if p.returncode == 0:
            self.count(kind + " ok")
            return None
        if self.daemon_win.overlaps(t0, time.monotonic()):
            self.count(kind + " failed in a daemon restart")
            return None
        return p

    def stager_loop(self):
        rnd = random.Random(7)
        names = sorted(self.datasets)
        base = [self.stager_exe, "--config", str(self.cfg)]
        while not self.stop.is_set():
            name = rnd.choice(names)
            p = self.command("stage", base + ["stage", name, "--wait"])
            out = p and (p.stdout + p.stderr).decode(errors="replace")
            if p is not None and EVICTED in out and "ismatch" not in out:
                # Its file was evicted (cachectl evict, or the mount's
                # fills of a working set larger than the cache) before
                # the stage ended.
                self.count("stage: a file evicted before the stage ended")
            elif p is not None:
                self.fail("stage %s: rc %d: %s" % (name, p.returncode,
                                                   out.strip()[-400:]))
            if self.stop.is_set():
                break
            p = self.command("verify", base + ["verify", name, "--repair",
                                               "--json"])
            if p is not None:
                self.verify_failed(name, p)

    def verify_failed(self, name, p):
        """A verify --repair that failed: blocks evicted under it (missing)
        are explained; a damaged block left or a mismatch is not."""
        try:
            res = json.loads(p.stdout)
        except ValueError:
            res = None
        if not isinstance(res, dict):
            res = None
        if res and not res.get("damaged") and not res.get("mismatches"):
            self.count("verify: blocks evicted while it ran")
            return
        self.fail("verify %s: rc %d: %s %s" % (
            name, p.returncode, p.stdout.decode(errors="replace")[-400:],
            p.stderr.decode(errors="replace").strip()[-300:]))

    def evict_loop(self):
        rnd = random.Random(11)
        names = sorted(self.datasets)
        while not self.stop.wait(rnd.uniform(5, 15)):
            args = (["evict", rnd.choice(names)] if rnd.random() < 0.7
                    else ["evict", "--to-low-watermark"])
            p = self.command("evict", [self.cachectl_exe, "--config",
                                       str(self.cfg)] + args)
            if p is not None:
                self.fail("cachectl %s: rc %d: %s" % (
                    " ".join(args), p.returncode,
                    p.stderr.decode(errors="replace").strip()[-300:]))

    def open_files(self):
        """Paths of the files the daemon and dstagefs hold open."""
        out = set()
        for proc in (self.daemon, self.mount):
            try:
                d = "/proc/%d/fd" % proc.pid
                for fd in os.listdir(d):
                    try:
                        out.add(os.readlink(os.path.join(d, fd)))
                    except OSError:
                        pass
            except OSError:
                pass
        return out

    def flip_loop(self):
        """Flip 3 bytes of a cache file now and then; reads must still give
        the source's bytes. A process checks each block once while it holds
        the object open (docs/cache.md: a block verified by this process is
        not checked again), so only files that neither process holds open
        are flipped, and a flip is undone at once if one opened the file
        meanwhile."""
        rnd = random.Random(13)
        objs = self.root / "cache" / "objects"
        while not self.stop.wait(rnd.uniform(2, 5)):
            try:
                busy = self.open_files()
                files = [p for p in objs.rglob("*")
                         if p.is_file() and str(p) not in busy]
                if not files:
                    continue
                f = rnd.choice(files)
                size = f.stat().st_size
                if size < 16:
                    continue
                off = rnd.randrange(0, size - 3)
                with open(f, "r+b") as fh:
                    if not block_lock(fh, off):
                        self.count("cache flip skipped (block being filled)")
                        continue
                    b = os.pread(fh.fileno(), 3, off)
                    os.pwrite(fh.fileno(), bytes(x ^ FLIP for x in b), off)
                    if str(f) in self.open_files():
                        os.pwrite(fh.fileno(), b, off)
                        self.count("cache flip undone (file opened)")
                        continue
                self.count("cache bytes flipped")
            except OSError:
                pass  # evicted meanwhile

    def s3_fault_loop(self):
        rnd = random.Random(17)
        kinds = ("503", "500", "reset", "truncate", "bare503", "429")
        # One fault at a time, on a GET 10-40 GETs after it is armed: a
        # per-request rate of at most 1 in 11 however light the traffic.
        # (Arming one every 2 s regardless let one object's consecutive
        # retries all meet a fault when little else was read: a stage then
        # failed with its retries spent, which is the client doing its job
        # against a store failing every request, not what a low fault rate
        # should test.)
        while not self.stop.wait(2.0):
            if self.proxy.pending_faults():
                continue
            self.proxy.add_fault(rnd.choice(kinds), count=1, match="GET",
                                 skip=rnd.randrange(10, 41), seconds=1)
            self.count("s3 faults armed")
            self.proxy.reset_stats()  # its request log would grow

    def chaos_loop(self):
        if self.a.kill_every <= 0:
            return
        turn = 0
        while not self.stop.wait(self.a.kill_every):
            if turn % 2 == 0:
                self.daemon_win.down()
                self.daemon.kill()
                self.daemon.wait(30)
                self.start_daemon()
                self.daemon_win.up()
                self.count("daemon kill -9")
            else:
                self.mount_win.down()
                self.mount.kill()
                self.mount.wait(30)
                subprocess.run(["fusermount3", "-uz", str(self.mnt)],
                               capture_output=True, timeout=60)
                self.start_mount()
                self.mount_win.up()
                self.count("dstagefs kill -9")
            turn += 1

    # ---- leaks ----

    def sample_loop(self):
        while not self.stop.wait(SAMPLE_S):
            for role, proc in (("daemon", self.daemon),
                               ("dstagefs", self.mount)):
                s = self.sample(proc.pid)
                if s:
                    self.samples[role].setdefault(proc.pid, []).append(s)
            for role, proc in (("daemon", self.daemon),
                               ("dstagefs", self.mount)):
                if proc.poll() is not None and not (
                        self.daemon_win if role == "daemon"
                        else self.mount_win).overlaps(time.monotonic() - 5,
                                                      time.monotonic()):
                    rc = proc.returncode
                    self.fail("%s exited by itself: %s" % (
                        role, signal.Signals(-rc).name if rc < 0 else rc))
                    self.stop.set()

    @staticmethod
    def sample(pid):
        try:
            rss = threads = 0
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("State:") and "Z" in line:
                        return None  # killed, not yet reaped
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
                    elif line.startswith("Threads:"):
                        threads = int(line.split()[1])
            fds = len(os.listdir("/proc/%d/fd" % pid))
        except (OSError, ValueError):
            return None
        return {"t": time.monotonic(), "rss_kb": rss, "fds": fds,
                "threads": threads}

    def leak_check(self):
        """Each process life: its samples after WARM_S, split in thirds;
        min(last third) - max(first third) within BOUNDS. Lives with fewer
        than 15 samples after warm-up are not checked."""
        out = {}
        for role, lives in self.samples.items():
            r = out[role] = {"lives": len(lives), "checked": 0}
            for k in BOUNDS:
                vals = [s[k] for ss in lives.values() for s in ss]
                if vals:
                    r[k + "_min"], r[k + "_max"] = min(vals), max(vals)
            for pid, ss in lives.items():
                ss = [s for s in ss if s["t"] - ss[0]["t"] >= WARM_S]
                n = len(ss)
                if n < 15:
                    continue
                r["checked"] += 1
                r["longest_checked_s"] = max(r.get("longest_checked_s", 0),
                                             round(ss[-1]["t"] - ss[0]["t"]))
                early, late = ss[:n // 3], ss[n - n // 3:]
                for k, bound in BOUNDS.items():
                    growth = min(s[k] for s in late) - \
                        max(s[k] for s in early)
                    key = k + "_growth_max"
                    r[key] = max(r.get(key, growth), growth)
                    if growth > bound:
                        self.fail("%s pid %d: %s grew by %d (bound %d) "
                                  "over %.0f s" % (
                                      role, pid, k, growth, bound,
                                      ss[-1]["t"] - ss[0]["t"]))
        return out

    def log_check(self):
        """Sanitizer reports fail; error lines are counted by kind."""
        kinds = {}
        for name in ("daemon.log", "dstagefs.log"):
            p = self.root / name
            if not p.exists():
                continue
            for line in p.read_text(errors="replace").splitlines():
                if "ERROR: AddressSanitizer" in line or \
                        "runtime error:" in line or \
                        "ERROR: LeakSanitizer" in line:
                    self.fail("%s: %s" % (name, line.strip()))
                m = re.search(r" (error|warn): (.*)", line)
                if m:
                    k = re.sub(r"\b[0-9a-f]{2}/[0-9a-f]+\b", "XX/HEX",
                               m.group(2))
                    k = re.sub(r"[0-9a-f]{8,}|\d+", "N", k)[:90]
                    k = name.split(".")[0] + " " + m.group(1) + ": " + k
                    kinds[k] = kinds.get(k, 0) + 1
        return kinds

    # ---- run ----

    def run(self):
        self.t0 = time.monotonic()
        self.setup()
        self.deadline = time.monotonic() + self.a.duration
        work = [(self.reader, (i,)) for i in range(self.a.readers)]
        work += [(f, ()) for f in (self.stager_loop, self.evict_loop,
                                   self.flip_loop, self.chaos_loop,
                                   self.sample_loop)]
        if self.proxy:
            work.append((self.s3_fault_loop, ()))
        threads = [threading.Thread(target=self.guarded, args=(f, args),
                                    name=f.__name__, daemon=True)
                   for f, args in work]
        for t in threads:
            t.start()
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            time.sleep(1)
        self.stop.set()
        for t in threads:
            t.join(timeout=120)
            if t.is_alive():
                self.fail("a worker did not stop within 120 s "
                          "(a read or command hung)")
        return self.finish()

    def guarded(self, f, args):
        """Run one worker; a worker that dies of an exception is a failure
        of the soak (and ends it), never a silently missing load."""
        try:
            f(*args)
        except Exception as e:
            self.fail("worker %s died: %s: %s" % (f.__name__,
                                                  type(e).__name__, e))
            self.stop.set()
        else:
            idle = f == self.chaos_loop and self.a.kill_every <= 0
            if (not idle and not self.stop.is_set()
                    and time.monotonic() < self.deadline):
                self.fail("worker %s returned before the end" % f.__name__)
                self.stop.set()

    def finish(self):
        leaks = self.leak_check()
        for role, proc in (("dstagefs", self.mount), ("daemon", self.daemon)):
            if proc and proc.poll() is None:
                proc.terminate()
                try:
                    rc = proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = "killed after 60 s"
                if rc != 0:
                    self.fail("%s: exit %s at SIGTERM" % (role, rc))
        subprocess.run(["fusermount3", "-uz", str(self.mnt)],
                       capture_output=True, timeout=60)
        logs = self.log_check()
        if self.proxy:
            self.proxy.stop()
        summary = {
            "duration_s": self.a.duration,
            "readers": self.a.readers,
            "cache_mb": self.a.cache_mb,
            "datasets": {n: len(d["sums"]) for n, d in self.datasets.items()},
            "reads": self.reads,
            "read_mib": round(self.read_bytes / MiB, 1),
            "counts": dict(sorted(self.counts.items())),
            "processes": leaks,
            "bounds": BOUNDS,
            "log_lines": dict(sorted(logs.items(), key=lambda kv: -kv[1])[:25]),
            "failures": self.failures,
            "failure_count": self.counts.get("unexplained", 0),
            "root": str(self.root),
        }
        text = json.dumps(summary, indent=1)
        print(text)
        if self.a.json:
            Path(self.a.json).write_text(text + "\n")
        ok = not self.failures and self.reads > 0
        if ok and not self.a.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        print("soak: %s (%d reads, %.0f MiB, %d failures; files in %s)" % (
            "PASS" if ok else "FAIL", self.reads, self.read_bytes / MiB,
            self.counts.get("unexplained", 0), self.root if not ok or self.a.keep
            else "(removed)"), file=sys.stderr)
        return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=int, default=150)
    ap.add_argument("--build", default=os.environ.get(
        "DSTAGE_BUILD_DIR", str(REPO / "build")))
    ap.add_argument("--readers", type=int, default=16)
    ap.add_argument("--cache-mb", type=int, default=32)
    ap.add_argument("--kill-every", type=int, default=60)
    ap.add_argument("--rgw-env", default=os.environ.get("DSTAGE_RGW_ENV"))
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary directory when passing")
    ap.add_argument("--json", help="write the summary there")
    a = ap.parse_args()
    if a.build and not os.path.isabs(a.build):
        a.build = str(REPO / a.build)
    s = Soak(a)
    try:
        return s.run()
    finally:
        for proc in (s.mount, s.daemon):
            if proc and proc.poll() is None:
                proc.kill()
        if s.mnt.exists() if hasattr(s, "mnt") else False:
            subprocess.run(["fusermount3", "-uz", str(s.mnt)],
                           capture_output=True, timeout=60)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
