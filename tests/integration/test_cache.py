"""Integration tests of the block cache (lib/cache/cache.c) through
tests/tools/cache_tool, against radosgw and file:// sources: bytes equal the
source, kill -9 during fills, a flipped byte, 2 processes x 8 threads
fetching each block once, a small tmpfs that fills up (pins, quotas,
priorities), a tmpfs too full for a new object file's header, a source
object replaced under a snapshot, and the io_uring fallback path."""
import errno
import hashlib
import json
import os
import random
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from conftest import injected

KIB = 1024
MIB = 1024 * 1024


class Cache:
    """cache_tool bound to a source URL, a cache dir and a catalog."""

    def __init__(self, tool, url, env, tmp, block_size="64K", **conf):
        self.tool, self.url = tool, url
        self.dir = tmp / "cache"
        self.env = dict(env)
        self.env.update(DSTAGE_CACHE_DIR=str(self.dir),
                        DSTAGE_CACHE_BLOCK_SIZE=block_size,
                        DSTAGE_CATALOG_PATH=str(tmp / "catalog.db"),
                        DSTAGE_LOG_LEVEL="warn")
        self.env.pop("DSTAGE_CONFIG", None)
        for k, v in conf.items():
            self.env["DSTAGE_CACHE_" + k.upper()] = str(v)

    def cmd(self, ds, *args, opts=(), env=None):
        e = dict(self.env)
        e.update(env or {})
        return [self.tool] + list(opts) + [self.url, ds] + list(args), e

    def run(self, ds, *args, opts=(), check=True, env=None, timeout=600):
        argv, e = self.cmd(ds, *args, opts=opts, env=env)
        p = subprocess.run(argv, env=e, capture_output=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError("cache_tool %s failed: %s" %
                                 (args, p.stderr.decode(errors="replace")))
        return p

    @staticmethod
    def stats(p):
        for line in reversed(p.stderr.decode(errors="replace").splitlines()):
            if line.startswith("stats: "):
                return json.loads(line[7:])
        raise AssertionError("no stats in: %r" % p.stderr)

    def read(self, ds, key, off, length, **kw):
        return self.run(ds, "read", key, str(off), str(length), **kw)

    def present(self, ds, key):
        return int(self.run(ds, "present", key).stdout)

    def verify(self, ds, key):
        present, bad = self.run(ds, "verify", key).stdout.split()
        return int(present), int(bad)


class Source:
    def __init__(self, url, put, env):
        self.url, self.put, self.env = url, put, env


@pytest.fixture
def file_source(tmp_path):
    root = tmp_path / "src"
    root.mkdir()

    def put(key, data):
        p = root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = root / (".dstage-tmp.t" + key.replace("/", "_"))
        tmp.write_bytes(data)
        os.rename(tmp, p)
    return Source(f"file://{root}/", put, dict(os.environ))


@pytest.fixture
def s3_source(tool, rgw, request, tmp_path):
    bucket = "c-" + hashlib.sha1(request.node.name.encode()).hexdigest()[:20]
    rgw.make_bucket(bucket)
    url = f"s3://{bucket}/pfx/"
    env = rgw.env()

    def put(key, data):
        f = tmp_path / "upload"
        f.write_bytes(data)
        subprocess.run([tool("objstore_tool"), url, "put", key, str(f)],
                       env=env, check=True, capture_output=True, timeout=600)
    return Source(url, put, env)


@pytest.fixture(params=["file", "s3"])
def source(request):
    return request.getfixturevalue(request.param + "_source")


def make_cache(tool, source, tmp_path, **kw):
    return Cache(tool("cache_tool"), source.url, source.env, tmp_path, **kw)


def test_bytes_equal_source(tool, source, tmp_path):
    rnd = random.Random(3)
    data = rnd.randbytes(3 * MIB + 17)
    source.put("obj", data)
    source.put("empty", b"")
    source.put("one", b"x")
    c = make_cache(tool, source, tmp_path)
    bs = 64 * KIB
    cases = [(rnd.randrange(len(data)), rnd.randrange(1, 300000))
             for _ in range(12)]
    cases += [(k * bs - 1, 2) for k in (1, 7, 30)]
    cases += [(k * bs, bs) for k in (0, 5, 47)]
    cases += [(len(data) - 1, 1), (len(data) - 5, 100), (len(data), 10)]
    for off, length in cases:
        assert c.read("ds", "obj", off, length).stdout == \
            data[off:off + length], (off, length)
    assert c.read("ds", "empty", 0, 100).stdout == b""
    assert c.read("ds", "one", 0, 100).stdout == b"x"
    p = c.run("ds", "cat", "obj", "100000")
    assert p.stdout == data
    # Restart: everything was kept; nothing is fetched again.
    p = c.run("ds", "cat", "obj", "100000")
    assert p.stdout == data
    st = c.stats(p)
    assert st["fetches"] == 0 and st["bytes_from_source"] == 0, st
    assert c.verify("ds", "obj") == (49, 0)


def one_gib(tmp_path):
    """1 GiB of pseudo-random bytes in a file, and its SHA-256."""
    f = tmp_path / "gib"
    h = hashlib.sha256()
    rnd = random.Random(1)
    block = rnd.randbytes(16 * MIB)
    with open(f, "wb") as out:
        for i in range(64):
            chunk = bytes([i]) + block[1:]
            h.update(chunk)
            out.write(chunk)
    return f, h.hexdigest()


def cat_sha(c, ds, key, chunk):
    argv, e = c.cmd(ds, "cat", key, str(chunk))
    p = subprocess.Popen(argv, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    h = hashlib.sha256()
    n = 0
    while True:
        b = p.stdout.read(4 * MIB)
        if not b:
            break
        h.update(b)
        n += len(b)
    err = p.stderr.read()
    assert p.wait() == 0, err
    return h.hexdigest(), n, Cache.stats(subprocess.CompletedProcess(
        argv, 0, b"", err))


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_one_gib_object(tool, kind, request, tmp_path):
    source = request.getfixturevalue(kind + "_source")
    f, sha = one_gib(tmp_path)
    if kind == "file":
        os.rename(f, Path(source.url[7:]) / "gib")
    else:
        subprocess.run([tool("objstore_tool"), source.url, "put", "gib",
                        str(f)], env=source.env, check=True,
                       capture_output=True, timeout=600)
        f.unlink()
    c = make_cache(tool, source, tmp_path, block_size="4M")
    got, n, st = cat_sha(c, "ds", "gib", 4 * MIB)
    assert (got, n) == (sha, 1 << 30)
    assert st["fetches"] == 256, st
    got, n, st = cat_sha(c, "ds", "gib", 1 * MIB)
    assert (got, n) == (sha, 1 << 30)
    assert st["fetches"] == 0, st


def test_kill9_while_filling(tool, file_source, tmp_path):
    """kill -9 a filling process at random moments until 50 kills landed
    while it ran; after each, every present block verifies; at the end,
    reads are correct and the next run fetches only the blocks that were
    missing (counted by the cache and by the source's request counter)."""
    data = random.Random(9).randbytes(256 * KIB + 100)
    file_source.put("obj", data)
    c = make_cache(tool, file_source, tmp_path, block_size="4K",
                   readahead_max=4)
    nblocks = (len(data) + 4095) // 4096
    rnd = random.Random(50)
    deadline = time.monotonic() + 60
    kills = i = 0
    while kills < 50:
        i += 1
        if c.present("ds", "obj") > len(data) * 3 // 4:
            c.run("ds", "drop", "obj")  # start over: keep filling
        args = (["cat", "obj", "4096"] if i % 2 else
                ["threads", "obj", "4", "4096"])
        argv, e = c.cmd("ds", *args, opts=["--slow-us", "20000"])
        p = subprocess.Popen(argv, env=e, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(rnd.uniform(0.002, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        kills += p.returncode == -signal.SIGKILL
        present, bad = c.verify("ds", "obj")
        assert bad == 0, (i, present)
        assert time.monotonic() < deadline, "kill loop too slow"
    present, bad = c.verify("ds", "obj")
    assert bad == 0
    assert present <= nblocks, present
    p = c.run("ds", "cat", "obj", "4096")
    assert p.stdout == data
    st = c.stats(p)
    assert st["fetches"] == nblocks - present, (st, present)
    assert st["source_requests"] == nblocks - present + 1, st  # + HEAD


def object_files(cache_dir):
    """The objects' data files (each with its sidecar, NAME.meta)."""
    return sorted(f for f in (cache_dir / "objects").glob("*/*")
                  if not f.name.endswith(".meta"))


def all_object_files(cache_dir):
    """Data files and sidecars."""
    return sorted((cache_dir / "objects").glob("*/*"))


def flip_cached_byte(cache_dir, off, mask):
    """XOR byte `off` of the one object cached in cache_dir with mask (its
    data file holds its bytes at their own offsets)."""
    [f] = object_files(cache_dir)
    assert Path(str(f) + ".meta").exists()
    with open(f, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ mask]))


def test_flipped_byte_is_refetched(tool, source, tmp_path):
    data = random.Random(4).randbytes(1 * MIB)
    source.put("obj", data)
    c = make_cache(tool, source, tmp_path)
    assert c.run("ds", "cat", "obj").stdout == data
    flip_cached_byte(c.dir, 5 * 64 * KIB + 1234, 0x01)
    p = c.read("ds", "obj", 5 * 64 * KIB, 64 * KIB)
    assert p.stdout == data[5 * 64 * KIB:6 * 64 * KIB]
    st = c.stats(p)
    assert st["checksum_failures"] == 1 and st["fetches"] == 1, st
    assert b"block 5 failed its checksum" in p.stderr
    assert c.verify("ds", "obj") == (16, 0)
    p = c.run("ds", "cat", "obj")
    assert p.stdout == data and c.stats(p)["fetches"] == 0


def test_two_processes_eight_threads_fetch_once(tool, source, tmp_path):
    data = random.Random(5).randbytes(4 * MIB + 3)
    source.put("obj", data)
    c = make_cache(tool, source, tmp_path)
    procs = []
    for _ in range(2):
        argv, e = c.cmd("ds", "threads", "obj", "8", "50000",
                        opts=["--slow-us", "2000"])
        procs.append(subprocess.Popen(argv, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    fetches = 0
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        fetches += Cache.stats(subprocess.CompletedProcess(
            [], 0, out, err))["fetches"]
    assert fetches == 65
    p = c.run("ds", "cat", "obj")
    assert p.stdout == data and c.stats(p)["fetches"] == 0


@pytest.fixture
def tmpfs(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs",
                        str(d)], capture_output=True)
    if p.returncode != 0:
        pytest.skip("cannot mount a tmpfs: %s" % p.stderr.decode())
    yield d
    subprocess.run(["umount", str(d)], check=True)


def test_small_filesystem_fills_up(tool, file_source, tmp_path, tmpfs):
    """A cache larger than its 8 MiB filesystem: writes hit ENOSPC, and
    reads still succeed (evicting, then streaming)."""
    rnd = random.Random(6)
    objs = {f"o{i}": rnd.randbytes(1536 * KIB) for i in range(10)}
    for k, v in objs.items():
        file_source.put(k, v)
    c = make_cache(tool, file_source, tmpfs, size="64M")
    for k, v in objs.items():
        assert c.run("ds", "cat", k).stdout == v
    for k, v in objs.items():
        assert c.run("ds", "cat", k).stdout == v
    os.statvfs(tmpfs)


def fill_up(d):
    """Fill the filesystem of d with one file until ENOSPC; returns it."""
    filler = d / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 * MIB, 4 * KIB):
            chunk = b"\xa5" * size
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler


def test_full_filesystem_no_room_for_a_header(tool, file_source, tmp_path,
                                              tmpfs):
    """A filesystem so full that a new object file cannot get even its
    header page (the capacity, 64 MiB, says there is room): every read
    still succeeds, streamed from the source, and nothing is cached or
    left behind; a fetch, which must cache, fails with ENOSPC. Once there
    is room again the same reads cache their objects."""
    rnd = random.Random(13)
    sizes = {"a": 1, "b": 64 * KIB - 1, "c": 64 * KIB + 1,
             "d": 300 * KIB + 5, "e": 1 * MIB + 3}
    objs = {k: rnd.randbytes(n) for k, n in sizes.items()}
    for k, v in objs.items():
        file_source.put(k, v)
    c = make_cache(tool, file_source, tmpfs, size="64M")
    c.env["DSTAGE_CATALOG_PATH"] = str(tmp_path / "catalog.db")
    c.run("ds", "stats")  # creates the cache directory, before the fill
    assert (c.dir / "dstage-cache").exists()
    filler = fill_up(tmpfs)
    assert os.statvfs(tmpfs).f_bavail == 0
    # Not a page left: a new file's first write fails.
    probe = tmpfs / "probe"
    try:
        with pytest.raises(OSError) as e:
            with open(probe, "wb", buffering=0) as f:
                f.write(b"x")
        assert e.value.errno == errno.ENOSPC
    finally:
        probe.unlink(missing_ok=True)

    chunk = 100000
    for k, v in objs.items():
        p = c.run("ds", "cat", k, str(chunk))
        assert p.stdout == v, k
        st = c.stats(p)
        assert st["fetches"] == 0 and st["used"] == 0, (k, st)
        assert st["streamed"] == -(-len(v) // chunk), (k, st)
        assert st["bytes_from_source"] == len(v), (k, st)
        off = len(v) // 3
        p = c.read("ds", k, off, 70000)
        assert p.stdout == v[off:off + 70000], k
        assert c.stats(p)["streamed"] == 1, k
    p = c.run("ds", "threads", "e", "4", "50000")
    assert c.stats(p)["fetches"] == 0
    p = c.run("ds", "fetch", "d", check=False)
    assert p.returncode == 1 and b"error: ENOSPC" in p.stderr, p.stderr
    for k in objs:
        assert c.present("ds", k) == 0, k
    assert object_files(c.dir) == []
    assert sorted(x.name for x in tmpfs.iterdir()) == ["cache", "filler"]
    assert os.statvfs(tmpfs).f_bavail == 0

    # Room again: the next reads cache, and the ones after read the cache.
    filler.unlink()
    for k, v in objs.items():
        p = c.run("ds", "cat", k, str(chunk))
        assert p.stdout == v, k
        st = c.stats(p)
        assert st["streamed"] == 0, (k, st)
        assert st["fetches"] == -(-len(v) // (64 * KIB)), (k, st)
        assert c.present("ds", k) == len(v), k
    assert len(object_files(c.dir)) == len(objs)
    for k, v in objs.items():
        p = c.run("ds", "cat", k, str(chunk))
        assert p.stdout == v, k
        st = c.stats(p)
        assert st["fetches"] == 0 and st["bytes_from_source"] == 0, (k, st)


def disk_usage(path):
    """Bytes allocated to the files under path (st_blocks)."""
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512
               for d, _, fs in os.walk(str(path)) for f in fs)


def test_eviction_pins_quotas_priorities(tool, file_source, tmp_path,
                                         tmpfs):
    """A 6 MiB cache (high 90%, low 80%) on an 8 MiB tmpfs: the lowest
    priority goes first and, within it, the least recently used object;
    pins are never evicted; a dataset never holds more than its quota; when
    everything is pinned, reads stream through and still succeed."""
    rnd = random.Random(7)
    objs = {k: rnd.randbytes(1 * MIB) for k in
            ("p1", "l1", "l2", "h1", "h2", "h3", "q1", "q2")}
    objs.update({f"x{i}": rnd.randbytes(1 * MIB) for i in range(6)})
    for k, v in objs.items():
        file_source.put(k, v)
    c = make_cache(tool, file_source, tmpfs, size="6M", high_watermark=90,
                   low_watermark=80, readahead_max=2)
    c.env["DSTAGE_CATALOG_PATH"] = str(tmp_path / "catalog.db")
    c.run("pin", "policy", "pinned", "1")
    c.run("low", "policy", "priority", "-5")
    c.run("high", "policy", "priority", "10")
    c.run("quota", "policy", "quota", str(1536 * KIB))
    c.run("quota", "policy", "priority", "20")
    order = [("pin", "p1"), ("low", "l1"), ("high", "h1"), ("low", "l2"),
             ("high", "h2"), ("low", "l1")]
    for ds, k in order:
        assert c.run(ds, "cat", k).stdout == objs[k]
        time.sleep(1.1)  # distinct access times (1 s resolution)
    # 5 MiB used; h3 crosses the high mark: l2 (low priority, least
    # recently used) goes, and nothing else is needed.
    p = c.run("high", "cat", "h3")
    assert p.stdout == objs["h3"]
    assert c.stats(p)["evictions"] == 1
    assert c.present("low", "l2") == 0
    assert c.present("low", "l1") == MIB
    for ds, k in [("pin", "p1"), ("high", "h1"), ("high", "h2")]:
        assert c.present(ds, k) == MIB, k
    # The quota dataset never holds more than 1.5 MiB: q2 evicts q1.
    for k in ("q1", "q2"):
        assert c.run("quota", "cat", k).stdout == objs[k]
    assert c.present("quota", "q1") + c.present("quota", "q2") <= 1536 * KIB
    assert c.present("quota", "q2") == MIB
    assert c.present("pin", "p1") == MIB
    # Everything pinned: reads still succeed, uncached; pins stay.
    for ds in ("low", "high", "quota"):
        c.run(ds, "policy", "pinned", "1")
    time.sleep(2.1)  # the cache trusts a dataset's policy for 2 s
    streamed = 0
    for i in range(6):  # 6 MiB more than a full 6 MiB cache can take
        p = c.run("pin", "cat", f"x{i}")
        assert p.stdout == objs[f"x{i}"]
        st = c.stats(p)
        streamed += st["streamed"]
        # What the object files really hold stays within the capacity
        # (the process's own estimate may run one fill ahead between
        # scans); cache.dir's identity file and damage.gen, a page
        # each, are not objects.
        assert disk_usage(tmpfs / "cache" / "objects") <= 6 * MIB, st
        assert st["used"] <= 6 * MIB + 256 * KIB, st
    assert streamed > 0
    assert c.present("pin", "p1") == MIB


def test_replaced_source_object_fails_with_eio(tool, source, tmp_path):
    v1 = random.Random(10).randbytes(1 * MIB)
    v2 = random.Random(11).randbytes(1 * MIB)
    source.put("snap", v1)
    c = make_cache(tool, source, tmp_path)
    etag = c.run("ds", "read", "snap", "0", "1", env={
        "DSTAGE_LOG_LEVEL": "debug"}).stderr  # warm block 0
    head = subprocess.run([c.tool.replace("cache_tool", "objstore_tool"),
                           source.url, "head", "snap"], env=source.env,
                          capture_output=True, check=True)
    etag = head.stdout.decode().split("\t")[1]
    time.sleep(0.02)
    source.put("snap", v2)
    snap = ["--etag", etag, "--size", str(len(v1))]
    p = c.run("ds", "read", "snap", "0", str(len(v1)), opts=snap,
              check=False)
    assert p.returncode == 1 and p.stdout == b""
    err = p.stderr.decode()
    assert "error: EIO" in err and "ds/snap" in err and \
        "changed under the snapshot" in err, err
    # The block cached before the change still reads as the old version.
    assert c.run("ds", "read", "snap", "0", "1000",
                 opts=snap).stdout == v1[:1000]
    # The new version reads as itself.
    assert c.run("ds", "cat", "snap").stdout == v2


def test_io_uring_fallback(tool, file_source, tmp_path):
    data = random.Random(12).randbytes(2 * MIB + 5)
    file_source.put("obj", data)
    c = make_cache(tool, file_source, tmp_path)
    env = {"DSTAGE_NO_URING": "1", "DSTAGE_LOG_LEVEL": "info"}
    p = c.run("ds", "cat", "obj", env=env)
    assert p.stdout == data
    assert p.stderr.decode().count("io_uring disabled") == 1
    p = c.run("ds", "cat", "obj", env=env)
    assert p.stdout == data and c.stats(p)["fetches"] == 0


def test_unmappable_blocks_are_read_and_checked(tool, file_source, tmp_path,
                                                faults):
    data = random.Random(13).randbytes(4 * MIB + 7)
    file_source.put("obj", data)
    c = make_cache(tool, file_source, tmp_path)
    assert c.run("ds", "fetch", "obj").returncode == 0
    env, log = faults("mmap_populate")
    # A fresh process checks present blocks before serving them; none can
    # be mapped, so each is read into a buffer and checked there.
    p = c.run("ds", "cat", "obj", env=env)
    assert p.stdout == data
    st = c.stats(p)
    assert st["fetches"] == 0 and st["checksum_failures"] == 0, st
    assert injected(log) > 0, "no mapping was refused"
    # A damaged block is still caught on that path, and only it fetched.
    flip_cached_byte(c.dir, 40 * 64 * KIB + 99, 0x80)
    p = c.run("ds", "cat", "obj", env=env)
    assert p.stdout == data
    st = c.stats(p)
    assert st["checksum_failures"] == 1 and st["fetches"] == 1, st
    assert b"block 40 failed its checksum" in p.stderr


def test_direct_writes_refused_at_write_time(tool, file_source, tmp_path,
                                            faults):
    """A file system that opens with O_DIRECT but refuses the writes
    (tests/preload/faults.c, on the pread/pwrite path): fills fall back to
    buffered writes of the same bytes, which are kept and durable like any
    others."""
    data = random.Random(14).randbytes(3 * MIB + 11)
    file_source.put("obj", data)
    c = make_cache(tool, file_source, tmp_path)
    env, log = faults("direct_write")
    env["DSTAGE_NO_URING"] = "1"
    p = c.run("ds", "cat", "obj", env=env)
    assert p.stdout == data
    assert injected(log) > 0, "no direct write refused"
    # Every block is present and sound; a fresh process fetches nothing.
    assert c.verify("ds", "obj") == (49, 0)
    p = c.run("ds", "cat", "obj")
    assert p.stdout == data and c.stats(p)["fetches"] == 0


# ---- Issue 12: the cache kept from other local users ----

LOCK_INUSE = 1 << 62  # lib/cache/cache_i.h: CACHE_LOCK_INUSE
LOCK_BLOCK = LOCK_INUSE + 1  # + block number


def mode(p):
    return os.stat(p).st_mode & 0o7777


def cache_entries(d):
    """(directories, files) the cache keeps under d."""
    dirs = [d, d / "objects"] + sorted((d / "objects").glob("*"))
    files = [d / "dstage-cache", d / "damage.gen"] + all_object_files(d)
    return dirs, files


def reachable(users, path):
    """Let other users walk down to path (not into it): o+x on parents."""
    users.reach(path.parent)


def test_cache_modes_keep_other_users_out(tool, file_source, tmp_path,
                                          users):
    """A new cache is 0700 directories and 0600 files: a second,
    unprivileged uid can neither list cache.dir nor read, nor open to lock,
    an object file (whose header names dataset and key)."""
    data = random.Random(21).randbytes(200 * KIB)
    file_source.put("obj", data)
    c = make_cache(tool, file_source, tmp_path)
    assert c.run("ds", "cat", "obj").stdout == data
    dirs, files = cache_entries(c.dir)
    assert len(files) == 4  # identity, damage generation, data file, sidecar
    for d in dirs:
        assert mode(d) == 0o700, (d, oct(mode(d)))
    for f in files:
        assert mode(f) == 0o600, (f, oct(mode(f)))
    u = users.user("cacheu")
    reachable(users, c.dir)
    obj = object_files(c.dir)[0]
    p = users.run(u, ["ls", c.dir / "objects"])
    assert p.returncode != 0 and b"Permission denied" in p.stderr, p
    # Even with a way into the directories, the file itself is closed.
    os.chmod(c.dir, 0o711)
    os.chmod(c.dir / "objects", 0o711)
    os.chmod(obj.parent, 0o711)
    try:
        p = users.run(u, ["/usr/bin/python3", "-c",
                          "import sys; open(sys.argv[1], 'rb').read(1)",
                          obj])
        assert p.returncode != 0 and b"PermissionError" in p.stderr, p
    finally:
        for d in (obj.parent, c.dir / "objects", c.dir):
            os.chmod(d, 0o700)


def test_looser_modes_tightened_at_open(tool, file_source, tmp_path,
                                        users):
    """An older cache (0755 directories, 0644 files) is tightened by the
    next open, with one log line saying what changed; then a second uid
    cannot read its files."""
    data = random.Random(22).randbytes(300 * KIB)
    file_source.put("obj", data)
    c = make_cache(tool, file_source, tmp_path)
    assert c.run("ds", "cat", "obj").stdout == data
    dirs, files = cache_entries(c.dir)
    for d in dirs:
        os.chmod(d, 0o755)
    for f in files:
        os.chmod(f, 0o644)
    u = users.user("cacheu")
    reachable(users, c.dir)
    obj = object_files(c.dir)[0]
    assert users.run(u, ["head", "-c1", obj]).returncode == 0  # the hole
    p = c.run("ds", "stats")
    log = p.stderr.decode()
    assert log.count("modes tightened") == 1, log
    # identity, damage generation, data file, sidecar
    assert "3 directories to 0700 and 4 files to 0600" in log, log
    for d in dirs:
        assert mode(d) == 0o700, d
    for f in files:
        assert mode(f) == 0o600, f
    p = users.run(u, ["head", "-c1", obj])
    assert p.returncode != 0 and b"Permission denied" in p.stderr, p
    # Nothing left to tighten: no line the next time.
    assert b"modes tightened" not in c.run("ds", "stats").stderr


@pytest.mark.parametrize("how", ["group-writable", "world-writable",
                                 "other-owner"])
def test_unsafe_cache_dir_refused(tool, file_source, tmp_path, users, how):
    """cache.dir writable by group or others, or owned by another user, is
    refused at open with the path and the fix; once fixed it opens."""
    file_source.put("obj", b"x" * 1000)
    c = make_cache(tool, file_source, tmp_path)
    c.run("ds", "stats")
    if how == "other-owner":
        u = users.user("cacheo")
        os.chown(c.dir, users.uid(u), -1)
        fix = "chown %d %s" % (os.geteuid(), c.dir)
    else:
        os.chmod(c.dir, 0o770 if how == "group-writable" else 0o707)
        fix = "chmod go-w %s" % c.dir
    p = c.run("ds", "cat", "obj", check=False)
    assert p.returncode != 0 and b"EACCES" in p.stderr, p.stderr
    assert fix.encode() in p.stderr, p.stderr
    assert str(c.dir).encode() in p.stderr
    if how == "other-owner":
        os.chown(c.dir, os.geteuid(), -1)
    else:
        os.chmod(c.dir, 0o750)
    assert c.run("ds", "cat", "obj").stdout == b"x" * 1000
    assert mode(c.dir) == 0o700


HOLD_LOCK = r"""
import fcntl, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fl = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, int(sys.argv[2]), 1, 0)
fcntl.fcntl(fd, fcntl.F_OFD_SETLK, fl)
print("locked", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("what", ["block", "inuse"])
def test_lock_wait_is_bounded(tool, file_source, tmp_path, users, what):
    """Another process (root: the modes keep other users from even opening
    the file, checked here too) holds a block's fill lock, or the in-use
    lock exclusively: a read that needs it fails with ETIMEDOUT within
    DSTAGE_CACHE_LOCK_TIMEOUT instead of hanging, and the log names the
    lock and the holder's pid. Released, the same read succeeds."""
    data = random.Random(23).randbytes(4 * 64 * KIB)
    file_source.put("obj", data)
    c = make_cache(tool, file_source, tmp_path, readahead_max=0)
    assert c.read("ds", "obj", 0, 100).stdout == data[:100]  # block 0 only
    [obj] = object_files(c.dir)
    u = users.user("cachel")
    reachable(users, c.dir)
    os.chmod(c.dir, 0o711)  # a way in, to show the file itself is closed
    os.chmod(c.dir / "objects", 0o711)
    os.chmod(obj.parent, 0o711)
    try:
        p = users.run(u, ["/usr/bin/python3", "-c", HOLD_LOCK, obj,
                          str(LOCK_BLOCK + 2)], timeout=30)
        assert p.returncode != 0 and b"PermissionError" in p.stderr, p
    finally:
        for d in (obj.parent, c.dir / "objects", c.dir):
            os.chmod(d, 0o700)
    byte = LOCK_BLOCK + 2 if what == "block" else LOCK_INUSE
    holder = subprocess.Popen(["/usr/bin/python3", "-c", HOLD_LOCK, obj,
                               str(byte)],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"locked\n"
        env = {"DSTAGE_CACHE_LOCK_TIMEOUT": "1"}
        t0 = time.monotonic()
        p = c.read("ds", "obj", 2 * 64 * KIB, 100, env=env, check=False,
                   timeout=30)
        took = time.monotonic() - t0
        log = p.stderr.decode()
        assert p.returncode == 1 and "error: ETIMEDOUT" in log, log
        assert took < 10, took
        assert "pid %d" % holder.pid in log, log
        assert ("fill byte of block 2" if what == "block"
                else "in-use byte") in log, log
        assert "DSTAGE_CACHE_LOCK_TIMEOUT" in log
    finally:
        holder.kill()
        holder.wait()
    p = c.read("ds", "obj", 2 * 64 * KIB, 100, timeout=30)
    assert p.stdout == data[2 * 64 * KIB:2 * 64 * KIB + 100]


def test_full_disk_reported_as_such(tool, file_source, tmp_path, tmpfs):
    """ENOSPC from cache.dir's file system is logged naming cache.dir and
    the full disk, and counted (disk_full); a cache full by its own
    capacity (cache.size) is not reported as a full disk."""
    data = random.Random(24).randbytes(3 * MIB + 5)
    file_source.put("obj", data)
    c = make_cache(tool, file_source, tmpfs, size="64M")
    c.run("ds", "stats")
    filler = fill_up(tmpfs)
    p = c.run("ds", "fetch", "obj", check=False)
    log = p.stderr.decode()
    assert p.returncode == 1 and "error: ENOSPC" in log, log
    assert "the file system of cache.dir %s is full" % c.dir in log, log
    assert log.count("is full (") == 1, log  # once, not per block
    assert c.stats(p)["disk_full"] >= 1
    filler.unlink()
    # Full by cache.size, with room on the disk: not a disk problem.
    small = make_cache(tool, file_source, tmp_path, size="1M")
    p = small.run("ds", "fetch", "obj", check=False)
    log = p.stderr.decode()
    assert p.returncode == 1 and "error: ENOSPC" in log, log
    assert "is full" not in log, log
    assert small.stats(p)["disk_full"] == 0


def test_stage_on_a_full_disk_says_so(tool, tmp_path):
    """The stager, its cache.dir a tmpfs filled up behind its back: a stage
    reports what was not kept as the file system of cache.dir being full,
    not as "full of pinned or busy data?"."""
    from test_stager import Stager, make_dataset, data
    root = tmp_path / "st"
    (root / "cache").mkdir(parents=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700",
                        "tmpfs", str(root / "cache")], capture_output=True)
    if p.returncode != 0:
        pytest.skip("cannot mount a tmpfs: %s" % p.stderr.decode())
    s = None
    try:
        s = Stager(tool("stager"), root, cache_size="64M").start()
        make_dataset(root / "src", {"a": data(40, 3 * MIB)})
        s.run("add", "ds", "file://%s/src/" % root, check=True)
        fill_up(root / "cache")
        p = s.run("stage", "ds", "--wait")
        out = (p.stdout + p.stderr).decode(errors="replace")
        assert p.returncode != 0, out
        assert "the file system of cache.dir %s/cache is full" % root in out, \
            out
        assert "pinned or busy" not in out, out
    finally:
        if s:
            s.stop()
        subprocess.run(["umount", str(root / "cache")], check=True)
