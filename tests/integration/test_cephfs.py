"""dstage on a real parallel file system: CephFS through ceph-fuse (the
`cephfs` fixture, scripts/cephfs; issue 32). docs/parallel-fs.md says where
it differs from a local disk and what dstage does about it.

- the file system's own semantics that the checkpoint store and the overlay
  rely on: temp + fsync + rename replaces a file atomically for a reader,
  fsync puts the bytes in RADOS (read back with `rados`, not through the
  client's cache); and what docs/parallel-fs.md measured (O_DIRECT, OFD
  locks, flock, RENAME_EXCHANGE, O_TMPFILE, xattrs), so the document stays
  true;
- `dstagefs --over` on a directory of the mount: bytes through the cache,
  writes through to CephFS (in RADOS once close returns), a second uid
  gets the answers CephFS itself gives it; locks stay the node's (they
  never reach CephFS), RENAME_EXCHANGE fails as on CephFS, xattrs are not
  passed through;
- a checkpoint directory store on the mount: published with its sidecar,
  overlapped parts included; kill -9 of dstagefs in the middle of a publish
  leaves the previous version or the whole new one under the final name,
  and the restart publishes the new one.
"""
import ctypes
import errno
import fcntl
import hashlib
import mmap
import os
import signal
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from test_checkpoints import (OVERLAP_CONF, Ckpt, DirStore, no_partials,
                              open_uploads, sha, sha_file, writer)
from waits import wait_for
from test_overlay import Overlay, drop_pages

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
F_OFD_SETLK = 37
LIBC = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def area(cephfs):
    """A fresh directory of the CephFS mount, removed after the test."""
    d = cephfs.mount / ("t-" + uuid.uuid4().hex[:10])
    d.mkdir(mode=0o755)
    try:
        yield d
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(d)],
                       capture_output=True, timeout=120)


def rados_bytes(cephfs, path):
    """A file's bytes as RADOS holds them (objects <ino>.<n> of 4 MiB in
    cephfs_data), read by `rados`, a client of its own: what fsync
    promised is on the OSD, not in ceph-fuse's cache."""
    st = os.stat(path)
    out = b""
    for n in range((st.st_size + (4 << 20) - 1) // (4 << 20)):
        obj = "%x.%08x" % (st.st_ino, n)
        p = subprocess.run(["rados", "-c", str(cephfs.conf), "-p",
                            "cephfs_data", "get", obj, "-"],
                           capture_output=True, timeout=60)
        if p.returncode != 0:
            return None
        out += p.stdout
    return out


def renameat2(src, dst, flags):
    r = LIBC.renameat2(-100, os.fsencode(src), -100, os.fsencode(dst),
                       flags)
    return 0 if r == 0 else ctypes.get_errno()


def ofd_lock(fd):
    """A non-blocking OFD write lock on the whole file: 0 or the errno."""
    lk = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0) + \
        b"\0" * 4
    try:
        fcntl.fcntl(fd, F_OFD_SETLK, lk)
        return 0
    except OSError as e:
        return e.errno


# ---- the file system itself ----

def test_rename_is_atomic_and_fsync_reaches_rados(cephfs, area):
    """What the directory store's commit relies on: a reader of the final
    name sees one whole version or the other while it is replaced by temp +
    fsync + rename, and fsync'd bytes are in RADOS."""
    final = area / "model.bin"
    versions = {}

    def version(i):
        body = hashlib.sha256(b"%d" % i).digest() * (40000 + 977 * i)
        return b"%08d" % i + body
    v0 = version(0)
    final.write_bytes(v0)
    versions[sha(v0)] = 0
    stop = threading.Event()
    seen, bad = [], []

    def reader():
        end = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < end:
            with open(final, "rb") as f:
                b = f.read()
            (seen if sha(b) in versions else bad).append(len(b))
    for i in range(1, 31):
        versions[sha(version(i))] = i  # known before it can be read
    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(1, 31):
            tmp = area / (".model.bin.tmp%d" % i)
            with open(tmp, "wb") as f:
                f.write(version(i))
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
            dfd = os.open(area, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dfd)
            os.close(dfd)
    finally:
        stop.set()
        t.join(70)
    assert not bad, "partial or mixed reads: %s" % bad[:5]
    assert len(seen) > 30, "the reader read %d times" % len(seen)
    assert final.read_bytes() == version(30)
    # fsync'd: RADOS has the bytes (a 1.2 MiB and a 5 MiB file: one and
    # two objects)
    assert rados_bytes(cephfs, final) == version(30)
    big = os.urandom(5 << 20)
    with open(area / "big.bin", "wb") as f:
        f.write(big)
        os.fsync(f.fileno())
    assert rados_bytes(cephfs, area / "big.bin") == big
    assert sorted(os.listdir(area)) == ["big.bin", "model.bin"]


def test_semantics_docs_parallel_fs_states(cephfs, area):
    """The measurements behind docs/parallel-fs.md's table: if ceph-fuse
    changes, this fails and the document is to be corrected."""
    p = area / "f.bin"
    p.write_bytes(b"x" * (1 << 20))
    # O_DIRECT opens, reads and writes (also unaligned: ceph-fuse takes the
    # request as it comes)
    fd = os.open(p, os.O_RDWR | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    buf.write(b"d" * 4096)
    assert os.pwrite(fd, buf, 0) == 4096
    back = mmap.mmap(-1, 4096)
    assert os.preadv(fd, [back], 0) == 4096 and back[:] == b"d" * 4096
    assert os.pwrite(fd, b"abc", 1) == 3
    os.close(fd)
    # OFD locks and flock conflict between two opens
    a, b = os.open(p, os.O_RDWR), os.open(p, os.O_RDWR)
    try:
        assert ofd_lock(a) == 0
        assert ofd_lock(b) == errno.EAGAIN
        os.close(a)
        a = -1
        # released with its open file: once ceph-fuse has the RELEASE,
        # which the kernel sends after close(2) returns (asynchronously;
        # seen once taking longer than the next call, on a loaded machine)
        end = time.monotonic() + 10
        while ofd_lock(b) == errno.EAGAIN and time.monotonic() < end:
            time.sleep(0.01)
        assert ofd_lock(b) == 0
        c = os.open(p, os.O_RDWR)
        fcntl.flock(c, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(c)
    finally:
        for x in (a, b):
            if x >= 0:
                os.close(x)
    # renameat2: NOREPLACE is honoured, EXCHANGE is not supported
    (area / "a").write_bytes(b"a")
    (area / "b").write_bytes(b"b")
    assert renameat2(area / "a", area / "b", RENAME_NOREPLACE) == \
        errno.EEXIST
    assert renameat2(area / "a", area / "b", RENAME_EXCHANGE) == \
        errno.EINVAL
    assert (area / "a").read_bytes() == b"a"
    assert (area / "b").read_bytes() == b"b"
    # no O_TMPFILE (the directory store names its temporaries instead)
    with pytest.raises(OSError) as ei:
        os.open(area, os.O_TMPFILE | os.O_WRONLY, 0o600)
    assert ei.value.errno == errno.EOPNOTSUPP
    # user xattrs are kept; the layout is a virtual xattr
    os.setxattr(p, "user.dstage", b"v")
    assert os.getxattr(p, "user.dstage") == b"v"
    assert b"object_size=4194304" in os.getxattr(p, "ceph.file.layout")
    # copy_file_range within the mount copies
    with open(area / "c.bin", "wb") as out, open(p, "rb") as src:
        assert os.copy_file_range(src.fileno(), out.fileno(), 1 << 20) == \
            1 << 20
    assert (area / "c.bin").read_bytes() == p.read_bytes()


# ---- dstagefs --over on CephFS ----

@pytest.fixture
def ov_ceph(tool, tmp_path, area):
    o = Overlay(tool, tmp_path, pfs=area / "pfs")
    try:
        yield o
    finally:
        o.close()


def test_overlay_reads_cached_and_writes_through(ov_ceph, cephfs):
    ov = ov_ceph
    files = {"big.bin": os.urandom(3 << 20),
             "ds/shard-000.tar": os.urandom(700 << 10),
             "ds/small.txt": b"small\n"}
    os.makedirs(ov.pfs / "ds")
    for rel, data in files.items():
        ov.put(rel, data)
    ov.start()
    for rel, data in files.items():
        assert sha((ov.pfs / rel).read_bytes()) == sha(data), rel
    misses = ov.ds_counter("misses")
    assert misses == 12 + 3  # 256 KiB blocks: 3 MiB and 700 KiB
    for rel in files:
        drop_pages(ov.pfs / rel)
        assert (ov.pfs / rel).read_bytes() == files[rel]
    assert ov.ds_counter("misses") == misses  # the cache, not CephFS
    # writes go through: a save, temp + fsync + os.replace, an append
    os.makedirs(ov.pfs / "ckpt")
    model = os.urandom(2 << 20)
    (ov.pfs / "ckpt" / "model.pt").write_bytes(model)
    assert ov.get("ckpt/model.pt") == model
    # close returned: the bytes are in RADOS, not only in ceph-fuse
    assert rados_bytes(cephfs, Path("/proc/self/fd/%d" % ov.under) /
                       "ckpt" / "model.pt") == model
    tmp = ov.pfs / "ckpt" / ".step9.tmp"
    with open(tmp, "wb") as f:
        f.write(b"v2" * 300000)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ov.pfs / "ckpt" / "model.pt")
    assert ov.get("ckpt/model.pt") == b"v2" * 300000
    assert not ov.exists("ckpt/.step9.tmp")
    with open(ov.pfs / "ckpt" / "log.txt", "a") as f:
        f.write("one\n")
    with open(ov.pfs / "ckpt" / "log.txt", "a") as f:
        f.write("two\n")
    assert ov.get("ckpt/log.txt") == b"one\ntwo\n"
    # a file changed on CephFS underneath is read fresh
    new = os.urandom(3 << 20)
    ov.put("big.bin", new)
    time.sleep(1.2)  # test_overlay's overlay.attr_timeout, 1 s
    assert sha((ov.pfs / "big.bin").read_bytes()) == sha(new)
    ov.stop()
    assert ov.get("ckpt/model.pt") == b"v2" * 300000


def test_overlay_second_uid_gets_what_cephfs_gives(ov_ceph, users):
    """The same commands as a second uid, on CephFS itself and through the
    overlay: the same answers (0600 of root refused, its own files
    readable, no writes where the modes forbid them)."""
    ov = ov_ceph
    u = users.user("cfs")
    users.reach(ov.pfs)
    os.makedirs(ov.pfs / "locked")
    os.makedirs(ov.pfs / "open")
    ov.put("private.bin", b"secret" * 20000, 0o600)
    ov.put("public.bin", b"public" * 20000, 0o644)
    ov.put("locked/inside.bin", b"inner" * 20000, 0o644)
    os.chmod(ov.pfs / "locked", 0o700)
    os.chmod(ov.pfs / "open", 0o777)
    os.chmod(ov.pfs, 0o755)
    uid, gid = users.uid(u), users.gid(u)
    mine = ov.pfs / "open" / "mine.bin"
    ov.put("open/mine.bin", b"mine" * 20000, 0o600)
    os.chown(mine, uid, gid)

    def probes():
        out = {}
        for name, cmd in (
                ("read public", ["cat", ov.pfs / "public.bin"]),
                ("read private", ["cat", ov.pfs / "private.bin"]),
                ("read in locked", ["cat", ov.pfs / "locked/inside.bin"]),
                ("list locked", ["ls", ov.pfs / "locked"]),
                ("read own 0600", ["cat", mine]),
                ("create in root's dir",
                 ["sh", "-c", "echo x > %s" % (ov.pfs / "x.txt")]),
                ("append to root's file",
                 ["sh", "-c", "echo x >> %s" % (ov.pfs / "public.bin")]),
                ("chmod root's file", ["chmod", "666",
                                       ov.pfs / "private.bin"])):
            r = users.run(u, cmd)
            out[name] = (r.returncode == 0,
                         b"Permission denied" in r.stderr or
                         b"Operation not permitted" in r.stderr)
        r = users.run(u, ["sh", "-c", "echo made > %s" %
                          (ov.pfs / "open" / "made.txt")])
        out["create in 0777 dir"] = (r.returncode == 0, False)
        st = os.stat(ov.pfs / "open" / "made.txt")
        out["owner of made"] = (st.st_uid, st.st_gid)
        os.unlink(ov.pfs / "open" / "made.txt")
        return out

    direct = probes()  # CephFS itself
    assert direct["read public"] == (True, False)
    assert direct["read private"] == (False, True)
    assert direct["read in locked"] == (False, True)
    assert direct["list locked"][0] is False
    assert direct["read own 0600"] == (True, False)
    assert direct["create in root's dir"][0] is False
    assert direct["append to root's file"][0] is False
    assert direct["chmod root's file"][0] is False
    assert direct["create in 0777 dir"] == (True, False)
    assert direct["owner of made"] == (uid, gid)
    ov.start()
    for rel in ("private.bin", "public.bin", "locked/inside.bin"):
        (ov.pfs / rel).read_bytes()  # root first: dentries cached
    assert probes() == direct
    assert ov.get("public.bin") == b"public" * 20000
    assert os.stat("private.bin", dir_fd=ov.under).st_mode & 0o777 == 0o600
    assert not ov.exists("x.txt")


# ---- the checkpoint directory store on CephFS ----

def test_ckpt_store_on_cephfs_publishes_with_sidecar(tool, tmp_path, area):
    st = DirStore(area / "ckpt")
    m = Ckpt(tool, tmp_path / "m", st, conf=OVERLAP_CONF)
    m.start()
    try:
        (m.ck / "job").mkdir()
        small = os.urandom(3 << 20)
        (m.ck / "job" / "small.bin").write_bytes(small)
        m.check_published("job/small.bin", sha(small))
        # 36 MiB: parts of 8 MiB copied into the store's temporary file on
        # CephFS while the file is written (sendfile: the staging directory
        # is another file system), committed at close
        big = os.urandom(36 << 20)
        with open(m.ck / "job" / "big.bin", "wb") as f:
            for off in range(0, len(big), 1 << 20):
                f.write(big[off:off + (1 << 20)])
        m.check_published("job/big.bin", sha(big))
        assert sha_file(st.root / "job" / "big.bin") == sha(big)
        # temp + os.replace through the mount: a rename in the store
        tmp = m.ck / "job" / "step1.tmp"
        tmp.write_bytes(small[::-1])
        os.replace(tmp, m.ck / "job" / "step1.bin")
        m.check_published("job/step1.bin", sha(small[::-1]))
        assert st.get("job/step1.tmp") is None
        assert open_uploads(st) == []
        no_partials(st)
        assert sorted(k for k in st.keys() if not k.startswith(".")) == \
            ["job/big.bin", "job/small.bin", "job/step1.bin"]
    finally:
        m.stop()


def fuse_pid(cephfs):
    for p in cephfs.pids:
        try:
            if Path("/proc/%d/comm" % p).read_text().strip() == "ceph-fuse":
                return p
        except FileNotFoundError:
            pass
    raise AssertionError("no ceph-fuse among %s" % cephfs.pids)


class SlowMotion:
    """ceph-fuse run at about a sixth of its speed (SIGSTOP 50 ms, SIGCONT
    10 ms), so that a publish to the store lasts long enough to be killed
    in the middle; freeze() leaves it stopped, and the end always
    continues it."""

    def __init__(self, pid):
        self.pid, self.run, self.frozen = pid, True, False
        self.t = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        end = time.monotonic() + 120  # bounded whatever the test does
        while self.run and time.monotonic() < end:
            os.kill(self.pid, signal.SIGSTOP)
            time.sleep(0.05)
            if not self.run:
                break
            os.kill(self.pid, signal.SIGCONT)
            time.sleep(0.01)

    def __enter__(self):
        self.t.start()
        return self

    def freeze(self):
        self.run = False
        self.t.join(10)
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc):
        self.run = False
        self.t.join(10)
        os.kill(self.pid, signal.SIGCONT)


def temporaries(st):
    return [k for k in st.keys() if ".dstage-tmp" in k]


def test_ckpt_kill9_mid_publish_on_cephfs(tool, tmp_path, area, cephfs):
    """dstagefs killed while a closed file is being committed to the store
    on CephFS (its temporary file there): under the final name the previous
    version, whole, or the new one, whole; the restart publishes the new
    one with its sidecar and leaves no temporary file."""
    st = DirStore(area / "ckpt")
    # Temporaries not written to for 2 s are stale (issue 32): the
    # restart's first publish sweeps the killed one.
    m = Ckpt(tool, tmp_path / "m", st, conf="[store]\ntmp_max_age = 2s\n")
    m.start()
    try:
        (m.ck / "j").mkdir()
        w = writer(m.ck / "j" / "model.bin", 6)        # the previous version
        assert w.wait(120) == 0
        v1 = sha(b"".join(bytes([i % 251]) * (1 << 20) for i in range(6)))
        m.check_published("j/model.bin", v1)
        v2 = sha(b"".join(bytes([i % 251]) * (1 << 20) for i in range(48)))
        with SlowMotion(fuse_pid(cephfs)) as slow:
            w = writer(m.ck / "j" / "model.bin", 48, close=True)
            assert w.stdout.readline().strip() == b"ready"
            # The close has begun (record P) and its commit has created the
            # temporary file next to the final name: kill there.
            wait_for(lambda: temporaries(st), "the store's temporary", 60)
            slow.freeze()
            m.p.kill()
        m.p.wait(30)
        w.kill()
        w.wait(30)
        subprocess.run(["fusermount3", "-uz", str(m.mnt)],
                       capture_output=True, timeout=30)
        got = st.get("j/model.bin")
        assert got is not None and sha(got) in (v1, v2), \
            "a partial file under the final name (%d bytes)" % len(got or b"")
        left = temporaries(st)
        print("killed mid-publish: final name holds %s; temporaries %s" %
              ("the previous version" if sha(got) == v1 else
               "the new version", left))
        time.sleep(2.5)   # the killed publish's temporary is stale now
        m.start()                                   # recovery
        wait_for(lambda: sha(st.get("j/model.bin") or b"") == v2,
                 "the republish", 60)
        wait_for(lambda: (st.get(".dstage-sha256/j/model.bin") or b"")
                 .split()[:1] == [v2.encode()], "the sidecar", 30)
        m.check_published("j/model.bin", v2)
        assert sha_file(m.ck / "j" / "model.bin") == v2
        # Issue 32: the killed publish's temporary file (older than
        # store.tmp_max_age) was removed by the restart's first write.
        assert not [k for k in temporaries(st) if k in left], \
            "the killed publish's temporary file stays: %s" % left
        assert "removed stale temporary file" in m.log.read_text()
        no_partials(st)
    finally:
        m.stop()


def test_overlay_locks_renames_xattrs_on_cephfs(ov_ceph):
    """What docs/parallel-fs.md says of the overlay on CephFS: locks are the
    node's kernel's (dstagefs implements no lock operation: they conflict
    between opens through the mount, never reach CephFS); RENAME_EXCHANGE
    fails as CephFS fails it, NOREPLACE is honoured; xattrs are not
    passed through."""
    ov = ov_ceph
    ov.put("lk.bin", b"l" * 100000)
    ov.put("a", b"a")
    ov.put("b", b"b")
    os.setxattr("/proc/self/fd/%d/lk.bin" % ov.under, "user.tag", b"t")
    ov.start()
    a = os.open(ov.pfs / "lk.bin", os.O_RDWR)
    b = os.open(ov.pfs / "lk.bin", os.O_RDWR)
    under = os.open("lk.bin", os.O_RDWR, dir_fd=ov.under)
    try:
        assert ofd_lock(a) == 0
        assert ofd_lock(b) == errno.EAGAIN    # the node's kernel
        assert ofd_lock(under) == 0           # CephFS never saw a lock
    finally:
        for fd in (a, b, under):
            os.close(fd)
    assert renameat2(ov.pfs / "a", ov.pfs / "b", RENAME_EXCHANGE) == \
        errno.EINVAL
    assert renameat2(ov.pfs / "a", ov.pfs / "b", RENAME_NOREPLACE) == \
        errno.EEXIST
    assert ov.get("a") == b"a" and ov.get("b") == b"b"
    # extended attributes are not passed through (the overlay has no xattr
    # hooks: the dispatcher's defaults), while CephFS keeps them
    with pytest.raises(OSError) as ei:
        os.getxattr(ov.pfs / "lk.bin", "user.tag")
    assert ei.value.errno == errno.EOPNOTSUPP
    with pytest.raises(OSError) as ei:
        os.setxattr(ov.pfs / "lk.bin", "user.tag2", b"x")
    assert ei.value.errno == errno.EROFS
    assert os.getxattr("/proc/self/fd/%d/lk.bin" % ov.under,
                       "user.tag") == b"t"
