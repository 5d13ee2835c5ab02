"""Integration tests of <mount>/checkpoints/ (fs/ckpt/dsfs_ckpt.c over lib/ckpt/)
on real FUSE mounts, with a directory store (file://) and radosgw (s3://,
the `rgw` fixture; faults through the `faultproxy` fixture).

What each test checks against the store itself: the bytes under the final
key, the SHA-256 sidecar (.dstage-sha256/<key>), and that no partial file
ever appears under a final name.

DSTAGE_TEST_CKPT_LARGE_MB (default 256) sizes the large-file test (2048 for
the 2 GiB run).
"""
import errno
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest

from waits import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

LARGE_MB = int(os.environ.get("DSTAGE_TEST_CKPT_LARGE_MB", "256"))
PY = "/usr/bin/python3"


def sha(b):
    return hashlib.sha256(b).hexdigest()


def sha_file(p, bs=4 << 20):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while True:
            b = f.read(bs)
            if not b:
                return h.hexdigest()
            h.update(b)


def close_all(*parts):
    """A test's teardown: stop (or clean up) each of parts in order, its
    daemons before its mounts before its stores. None and a part with
    neither (a directory store) are skipped; every part is tried, then the
    first error is raised."""
    err = None
    for p in parts:
        f = getattr(p, "stop", None) or getattr(p, "cleanup", None)
        if f is None:
            continue
        try:
            f()
        except Exception as e:
            err = err or e
    if err:
        raise err


def is_mounted(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == mnt for line in f)


# ---- stores ----

class DirStore:
    kind = "dir"

    def __init__(self, root):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = "file://%s/" % self.root
        self.env = dict(os.environ)
        self.conf = ""

    def keys(self):
        out = []
        for dp, dn, fn in os.walk(self.root):
            for f in fn:
                out.append(os.path.relpath(os.path.join(dp, f), self.root))
        return sorted(out)

    def get(self, key):
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key, data):
        p = self.root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


class S3Store:
    kind = "s3"

    def __init__(self, rgw, env=None):
        self.rgw = rgw
        self.bucket = rgw.make_bucket("ckpt-" + uuid.uuid4().hex[:12])
        self.prefix = "ck/"
        self.url = "s3://%s/%s" % (self.bucket, self.prefix)
        self.env = env or rgw.env()
        self.conf = ("[s3]\nmultipart_threshold = 8M\npart_size = 8M\n"
                     "max_attempts = 2\ndeadline = 10s\n"
                     "backoff_base = 50ms\nbackoff_max = 200ms\n")

    def keys(self):
        p = self.rgw.curl("/%s?list-type=2&max-keys=1000&prefix=%s" %
                          (self.bucket, urllib.parse.quote(self.prefix,
                                                           safe="")))
        xml = p.stdout.decode()
        assert "<IsTruncated>false" in xml, xml[:500]
        return sorted(k[len(self.prefix):]
                      for k in re.findall(r"<Key>(.*?)</Key>", xml))

    def get(self, key):
        p = self.rgw.curl("/%s/%s%s" % (self.bucket, self.prefix, key),
                          "-o", "-", "-w", "\n%{http_code}")
        body, _, code = p.stdout.rpartition(b"\n")
        if code == b"404":
            return None
        assert code == b"200", (key, code, body[:300])
        return body

    def put(self, key, data):
        assert self.rgw.put_object(self.bucket, self.prefix + key,
                                   data) == 200

    def cleanup(self):
        """Delete what the test stored (the shared radosgw is in memory)."""
        try:
            for k in self.keys():
                self.rgw.curl("/%s/%s%s" % (self.bucket, self.prefix, k),
                              "-X", "DELETE", timeout=30)
            self.rgw.curl("/" + self.bucket, "-X", "DELETE", timeout=30)
        except Exception:       # best effort: never hide the test's result
            pass


def store_staging(staging_dir, url):
    """staging_dir/stores/<hash of the store's URL> (issue 34)."""
    h = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:32]
    return Path(staging_dir) / "stores" / h


class Ckpt:
    """dstagefs with a [checkpoints] store, in one temporary directory."""

    def __init__(self, tool, tmp, store, conf="", staging_size="2G",
                 env=None, opts=()):
        self.tool, self.tmp, self.store = tool, Path(tmp), store
        self.opts = [str(o) for o in opts]  # dstagefs options (-o ...)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.mnt = self.tmp / "mnt"
        self.staging_dir = self.tmp / "staging"   # checkpoints.staging_dir
        self.log = self.tmp / "dstagefs.log"
        self.cfg = self.tmp / "dstage.conf"
        self.cfg.write_text(
            "[cache]\ndir = %s\nsize = 1G\n[catalog]\npath = %s\n"
            "[checkpoints]\nstore = %s\nstaging_dir = %s\n"
            "staging_size = %s\nretry_interval = 1s\n%s%s" %
            (self.tmp / "cache", self.tmp / "catalog.db", store.url,
             self.staging_dir, staging_size, store.conf, conf))
        self.env = dict(env or store.env, DSTAGE_CONFIG=str(self.cfg),
                        DSTAGE_LOG_LEVEL="info")
        self.p = None

    @property
    def ck(self):
        return self.mnt / "checkpoints"

    @property
    def staging(self):
        """This store's subdirectory of staging_dir (tree, journal,
        abandoned)."""
        return store_staging(self.staging_dir, self.store.url)

    def start(self, timeout=30):
        self.mnt.mkdir(exist_ok=True)
        with open(self.log, "ab") as logf:
            self.p = subprocess.Popen([self.tool("dstagefs"), "-f"] +
                                      self.opts + [str(self.mnt)],
                                      env=self.env,
                                      stdout=logf, stderr=subprocess.STDOUT)
        end = time.time() + timeout
        while time.time() < end:
            if self.p.poll() is not None:
                raise AssertionError("dstagefs exited %d:\n%s" %
                                     (self.p.returncode, self.log_text()))
            if is_mounted(self.mnt):
                try:
                    os.statvfs(self.mnt)
                    return self
                except OSError:
                    pass
            time.sleep(0.05)
        raise AssertionError("dstagefs did not mount:\n" + self.log_text())

    def log_text(self):
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(30)
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-uz", str(self.mnt)],
                           capture_output=True, timeout=30)

    def kill9(self):
        self.p.kill()
        self.p.wait(30)
        subprocess.run(["fusermount3", "-uz", str(self.mnt)],
                       capture_output=True, timeout=30)

    def check_published(self, key, data_sha):
        """The store holds key with data_sha, and its sidecar says so."""
        got = self.store.get(key)
        assert got is not None, "%s not in the store: %s" % (
            key, self.store.keys())
        assert sha(got) == data_sha, key
        side = self.store.get(".dstage-sha256/" + key)
        assert side is not None, "no SHA-256 record for " + key
        assert side.decode().split()[0] == data_sha
        assert int(side.decode().split()[1]) == len(got)

    def wait_published(self, key, data_sha, timeout=30, what="the publish"):
        """Wait until the store holds key with data_sha AND its sidecar
        says so, then check_published. A publish writes the data, then the
        sidecar, then the catalog record: waiting for the data alone and
        checking the sidecar raced the publish (failed in the ASan stage)."""
        def done():
            got = self.store.get(key)
            side = self.store.get(".dstage-sha256/" + key)
            return got is not None and sha(got) == data_sha and \
                side is not None and side.decode().split()[0] == data_sha
        wait_for(done, what, timeout)
        self.check_published(key, data_sha)


@pytest.fixture(params=["dir", "s3"])
def store(request, tmp_path):
    if request.param == "dir":
        yield DirStore(tmp_path / "store")
        return
    st = S3Store(request.getfixturevalue("rgw"))
    try:
        yield st
    finally:
        st.cleanup()


@pytest.fixture
def proxied_store(faultproxy):
    """An S3 store reached through the fault proxy."""
    st = S3Store(faultproxy.rgw, env=faultproxy.env())
    try:
        yield st
    finally:
        st.cleanup()


@pytest.fixture
def mount(tool, tmp_path, store):
    m = Ckpt(tool, tmp_path / "m", store)
    m.start()
    try:
        yield m
    finally:
        m.stop()


def no_partials(store):
    """No temporary or partial name in the store's listing."""
    for k in store.keys():
        assert ".dstage-tmp" not in k, k


# ---- the writable subtree ----

def test_file_operations(mount, store):
    d = mount.ck / "job1"
    d.mkdir()
    p = d / "f.bin"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"A" * 100, 0)
        os.pwrite(fd, b"B" * 10, 1000)          # past the end: a hole
        assert os.pread(fd, 10, 1000) == b"B" * 10  # read while writing
        assert os.pread(fd, 4, 98) == b"AA\0\0"
        assert os.fstat(fd).st_size == 1010
        assert store.get("job1/f.bin") is None   # nothing before fsync
        os.ftruncate(fd, 500)
        assert os.fstat(fd).st_size == 500
        os.fdatasync(fd)                          # published now
        want = b"A" * 100 + b"\0" * 400
        mount.check_published("job1/f.bin", sha(want))
        os.pwrite(fd, b"C", 499)
    finally:
        os.close(fd)
    mount.check_published("job1/f.bin", sha(b"A" * 100 + b"\0" * 399 + b"C"))

    with open(p, "wb") as f:                       # O_TRUNC reopen
        f.write(b"new")
    mount.check_published("job1/f.bin", sha(b"new"))
    with open(p, "r+b") as f:                      # a rewrite in place
        f.write(b"abcdef")
        f.flush()
        os.pwrite(f.fileno(), b"X", 1)
    mount.check_published("job1/f.bin", sha(b"aXcdef"))
    with open(p, "wb") as f:                       # sequential, then back
        f.write(b"0123456789")
        f.flush()
        f.seek(2)
        f.write(b"YY")
    mount.check_published("job1/f.bin", sha(b"01YY456789"))
    with open(p, "wb") as f:
        f.write(b"new")
    os.truncate(p, 1)                              # truncate(2) by path
    mount.check_published("job1/f.bin", sha(b"n"))
    assert p.read_bytes() == b"n"
    os.utime(p, (1_000_000_000, 1_000_000_000))
    assert int(os.stat(p).st_mtime) == 1_000_000_000

    (d / "g").write_bytes(b"ggg")
    os.replace(d / "g", p)                         # rename over a file
    assert p.read_bytes() == b"ggg"
    mount.check_published("job1/f.bin", sha(b"ggg"))
    assert store.get("job1/g") is None
    assert store.get(".dstage-sha256/job1/g") is None
    assert sorted(os.listdir(d)) == ["f.bin"]

    (d / "sub").mkdir()
    (d / "sub" / "x").write_bytes(b"x")
    with pytest.raises(OSError) as ei:
        os.rmdir(d / "sub")
    assert ei.value.errno == errno.ENOTEMPTY
    os.rename(d / "sub", d / "sub2")               # a directory rename
    assert (d / "sub2" / "x").read_bytes() == b"x"
    mount.check_published("job1/sub2/x", sha(b"x"))
    assert store.get("job1/sub/x") is None
    os.unlink(d / "sub2" / "x")
    assert store.get("job1/sub2/x") is None
    os.rmdir(d / "sub2")
    (d / "empty").mkdir()
    os.rmdir(d / "empty")
    assert sorted(os.listdir(d)) == ["f.bin"]

    os.unlink(p)
    assert not p.exists()
    assert store.get("job1/f.bin") is None
    assert ".dstage-sha256" not in os.listdir(mount.ck)

    sv = os.statvfs(mount.ck)
    assert 0 < sv.f_blocks * sv.f_frsize <= 2 << 30
    no_partials(store)


def test_fork_while_writing_does_not_publish(mount, store):
    """A writer that starts a subprocess mid-write (DataLoader workers,
    a shell-out): the child's copy of the descriptor is closed at exec
    (FLUSH from the child), which must not publish the half-written file."""
    (mount.ck / "fk").mkdir()
    p = mount.ck / "fk" / "model.bin"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY)
    try:
        os.write(fd, b"half")
        os.set_inheritable(fd, True)            # inherited, closed at exit
        subprocess.run(["true"], close_fds=False, check=True, timeout=30)
        os.set_inheritable(fd, False)           # closed at exec (CLOEXEC)
        subprocess.run(["true"], check=True, timeout=30)
        assert store.get("fk/model.bin") is None
        os.write(fd, b" and the rest")
    finally:
        os.close(fd)
    mount.check_published("fk/model.bin", sha(b"half and the rest"))


def test_refused_operations(mount):
    d = mount.ck / "job"
    d.mkdir()
    (d / "a").write_bytes(b"a")
    for call, want in [
            (lambda: os.link(d / "a", d / "b"), errno.EPERM),
            (lambda: os.symlink("a", d / "s"), errno.EPERM),
            (lambda: os.mkfifo(d / "fifo"), errno.EPERM),
            (lambda: os.mknod(d / "dev", 0o600 | 0o020000, os.makedev(1, 3)),
             errno.EPERM),
            (lambda: os.setxattr(d / "a", "user.x", b"1"), errno.ENOTSUP),
            (lambda: os.removexattr(d / "a", "user.x"), errno.ENOTSUP),
            (lambda: open(mount.mnt / "datasets" / "x", "wb"), errno.EROFS),
            (lambda: os.mkdir(mount.mnt / "datasets" / "x"), errno.EROFS),
            (lambda: os.rename(d / "a", mount.mnt / "datasets" / "a"),
             errno.EXDEV),
            (lambda: os.mkdir(d / ".dstage-x"), errno.EINVAL)]:
        with pytest.raises(OSError) as ei:
            call()
        assert ei.value.errno == want, (ei.value, want)
    assert sorted(os.listdir(d)) == ["a"]


def test_other_nodes_files_listed_and_read(mount, store):
    data = os.urandom(3 << 20)
    store.put("other/step-1/model.pt", data)       # another node wrote it
    assert "other" in os.listdir(mount.ck)
    assert os.listdir(mount.ck / "other") == ["step-1"]
    p = mount.ck / "other" / "step-1" / "model.pt"
    assert os.stat(p).st_size == len(data)
    assert p.read_bytes() == data                  # read from the store

    # This node's copy is replaced in the store by another node: the
    # mount shows the store's new bytes, not the stale local copy.
    mine = mount.ck / "other" / "mine"
    mine.write_bytes(b"old")
    store.put("other/mine", b"replaced elsewhere")
    wait_for(lambda: mine.read_bytes() == b"replaced elsewhere",
             "the store's version", 10)


def mount_stats(mnt):
    out = {}
    for line in (Path(mnt) / ".dstage" / "stats").read_text().splitlines():
        k, v = line.split()
        out[k] = int(v)
    return out


def drop_caches():
    subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"],
                   check=False)


def test_other_nodes_files_read_through_the_cache(mount, store):
    """A file only the store has (another node's checkpoint) is read
    through the verified block cache: fetched once, served from the cache
    on the next open, and a byte flipped in the cache file is caught by its
    block checksum in a new dstagefs, counted and fetched again: the reader
    never sees it."""
    data = os.urandom((9 << 20) + 4321)       # 3 blocks of 4 MiB
    store.put("other/step-3/model.pt", data)
    p = mount.ck / "other" / "step-3" / "model.pt"
    s0 = mount_stats(mount.mnt)
    assert p.read_bytes() == data
    s1 = mount_stats(mount.mnt)
    assert s1["bytes_from_source"] - s0["bytes_from_source"] >= len(data)
    assert s1["fs_reads"] > s0["fs_reads"]

    # Opened again (checkpoint files keep no page cache across opens, and
    # the page cache is dropped too): nothing more from the store.
    drop_caches()
    assert sha(p.read_bytes()) == sha(data)
    s2 = mount_stats(mount.mnt)
    assert s2["bytes_from_source"] == s1["bytes_from_source"], (s1, s2)
    assert s2["bytes_from_cache"] - s1["bytes_from_cache"] >= len(data)

    # A flipped byte in the cache file: a new dstagefs checks each block
    # before it serves it, so it fetches that block again.
    mount.stop()
    from test_guards import flip_cache_byte
    flip_cache_byte(mount.tmp / "cache", len(data), (5 << 20) + 77)
    drop_caches()
    mount.start()
    assert sha(p.read_bytes()) == sha(data)
    s3 = mount_stats(mount.mnt)
    assert s3["checksum_failures"] == 1, s3
    assert s3["bytes_from_source"] == 4 << 20, s3   # that block alone
    assert "failed its checksum" in mount.log_text()


def catalog_rows_now(m, db_path=None):
    """catalog_rows, or {} while the catalog has no table yet (it is made
    at the first record)."""
    import sqlite3
    try:
        return catalog_rows(m, db_path)
    except sqlite3.OperationalError:
        return {}


def catalog_rows(m, db_path=None):
    """This node's catalog record of what it published: {key: (sha, size)}
    for m's store (m's catalog, or the one at db_path)."""
    import sqlite3
    db = sqlite3.connect("file:%s?mode=ro" % (db_path or
                                              m.tmp / "catalog.db"),
                         uri=True)
    try:
        return {k: (s, n) for k, s, n in db.execute(
            "SELECT key, sha256, size FROM checkpoint_files WHERE store = ?",
            (m.store.url,))}
    finally:
        db.close()


def test_published_files_recorded_in_the_catalog(mount, store, tool,
                                                 tmp_path):
    """Each publish records the SHA-256 and size written in this node's
    catalog; a rename moves the record (a directory's with everything
    below it), an unlink drops it. The drill checks a file whose version
    in the store is the one recorded against that record too, so bytes
    changed in the store together with their sidecar are named."""
    data = os.urandom(200_000)
    d = mount.ck / "cat" / "step-1"
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(data)
    (d / "sub").mkdir()
    (d / "sub" / "opt.bin").write_bytes(b"x" * 1000)
    rows = catalog_rows(mount)
    assert rows["cat/step-1/model.pt"] == (sha(data), len(data)), rows
    assert rows["cat/step-1/sub/opt.bin"] == (sha(b"x" * 1000), 1000)

    os.rename(d, mount.ck / "cat" / "step-2")
    rows = catalog_rows(mount)
    assert "cat/step-1/model.pt" not in rows, rows
    assert rows["cat/step-2/model.pt"] == (sha(data), len(data)), rows
    assert rows["cat/step-2/sub/opt.bin"][1] == 1000, rows
    (mount.ck / "cat" / "step-2" / "sub" / "opt.bin").unlink()
    assert "cat/step-2/sub/opt.bin" not in catalog_rows(mount)

    # A file renamed alone: its record follows with the copy's version.
    os.rename(mount.ck / "cat" / "step-2" / "model.pt",
              mount.ck / "cat" / "step-2" / "model2.pt")
    rows = catalog_rows(mount)
    assert rows["cat/step-2/model2.pt"] == (sha(data), len(data)), rows
    assert "cat/step-2/model.pt" not in rows

    (mount.ck / "cat" / "step-3").mkdir()
    (mount.ck / "cat" / "step-3" / "model.pt").write_bytes(data)
    rc, out, err = drill(tool, mount, tmp_path, "cat", "--to",
                         tmp_path / "r1")
    assert rc == 0, (out, err)
    if store.kind != "dir":
        return
    # The same version (size, mtime and inode kept: the directory store's
    # ETag) with other bytes and a sidecar rewritten to match them: only
    # this node's record can tell.
    obj = store.root / "cat" / "step-3" / "model.pt"
    st = os.stat(obj)
    bad = bytearray(data)
    bad[777] ^= 0x10
    with open(obj, "r+b") as f:
        f.write(bad)
    os.utime(obj, ns=(st.st_atime_ns, st.st_mtime_ns))
    side = store.root / ".dstage-sha256" / "cat" / "step-3" / "model.pt"
    side.write_text("%s  %d\n" % (sha(bytes(bad)), len(bad)))
    assert os.stat(obj).st_ino == st.st_ino
    rc, out, err = drill(tool, mount, tmp_path, "cat", "--to",
                         tmp_path / "r2")
    assert rc == 1, (out, err)
    assert ("BAD cat/step-3/model.pt: differs from the catalog's record"
            in out), out
    assert "the store changed its bytes and its SHA-256 record" in err


# ---- real clients ----

def run_py(code, *args, timeout=300):
    p = subprocess.run([PY, "-c", code] + [str(a) for a in args],
                       capture_output=True, timeout=timeout)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    return p.stdout.decode()


def test_torch_save_load(mount, store, tmp_path):
    pytest.importorskip("torch")
    (mount.ck / "llm").mkdir()
    out = run_py("""
import os, sys, torch
p = sys.argv[1]
torch.manual_seed(0)
sd = {"w": torch.randn(512, 512), "b": torch.arange(4096),
      "layers.0.w": torch.randn(64, 64, dtype=torch.float16)}
torch.save(sd, p + ".tmp")
os.replace(p + ".tmp", p)                # temporary name, then os.replace
torch.save(sd, p + ".direct")            # straight to the final name
for q in (p, p + ".direct"):
    l = torch.load(q)
    assert l.keys() == sd.keys()
    assert all(torch.equal(sd[k], l[k]) for k in sd)
print("ok")
""", mount.ck / "llm" / "step-100.pt")
    assert out.strip() == "ok"
    for name in ("step-100.pt", "step-100.pt.direct"):
        local = (mount.ck / "llm" / name).read_bytes()
        mount.check_published("llm/" + name, sha(local))
    assert store.get("llm/step-100.pt.tmp") is None
    # What the store holds loads too (as another node would read it).
    copy = tmp_path / "from-store.pt"
    copy.write_bytes(store.get("llm/step-100.pt"))
    run_py("import torch,sys; assert 'w' in torch.load(sys.argv[1])", copy)


def test_numpy_save(mount):
    pytest.importorskip("numpy")
    (mount.ck / "np").mkdir()
    run_py("""
import sys, numpy as np
a = np.arange(1 << 20, dtype=np.float64).reshape(1024, 1024)
np.save(sys.argv[1], a)
b = np.load(sys.argv[1])
assert (a == b).all()
""", mount.ck / "np" / "arr.npy")
    mount.check_published("np/arr.npy",
                          sha((mount.ck / "np" / "arr.npy").read_bytes()))


def test_safetensors_pattern(mount, store):
    """Write a temporary file, fsync it, rename it: the final name holds
    the whole file, the temporary name is gone from the store."""
    d = mount.ck / "st"
    d.mkdir()
    data = os.urandom(5 << 20)
    tmp = d / ".model.safetensors.tmp123"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        mount.check_published("st/.model.safetensors.tmp123", sha(data))
    os.rename(tmp, d / "model.safetensors")
    dfd = os.open(d, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    mount.check_published("st/model.safetensors", sha(data))
    assert store.get("st/.model.safetensors.tmp123") is None
    assert os.listdir(d) == ["model.safetensors"]
    no_partials(store)


def make_tree(root):
    files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(1 << 20),
             "sub/deeper/c": b"", "d/e/f/g.json": b'{"k": 1}'}
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


def test_cp_rsync_tar(mount, store, tmp_path):
    if shutil.which("rsync") is None:
        pytest.skip("rsync missing: install the Debian package 'rsync'")
    src = tmp_path / "src"
    files = make_tree(src)
    with tarfile.open(tmp_path / "src.tar", "w") as t:
        t.add(src, arcname=".")
    job = mount.ck / "tools"
    job.mkdir()
    subprocess.run(["cp", "-r", str(src), str(job / "cp")], check=True,
                   timeout=120)
    subprocess.run(["rsync", "-a", str(src) + "/", str(job / "rsync")],
                   check=True, timeout=120, capture_output=True)
    (job / "tar").mkdir()
    subprocess.run(["tar", "-x", "-f", str(tmp_path / "src.tar"), "-C",
                    str(job / "tar")], check=True, timeout=120)
    for how in ("cp", "rsync", "tar"):
        for rel, data in files.items():
            assert (job / how / rel).read_bytes() == data, (how, rel)
            mount.check_published("tools/%s/%s" % (how, rel), sha(data))
    # rsync's dot-temporaries were renamed away, in the store too, and
    # their owner records with them.
    own = ".dstage-owner/"
    keys = [k[len(own):-len("/.dstage-own")] if k.startswith(own) else k
            for k in store.keys()]
    assert not [k for k in keys if "/." in k and
                not k.startswith(".dstage-sha256/")]
    assert own + "tools/cp/a.txt/.dstage-own" in store.keys()


def test_parallel_shards(mount):
    d = mount.ck / "sharded" / "step-7"
    d.mkdir(parents=True)
    procs = []
    for i in range(8):
        procs.append(subprocess.Popen([PY, "-c", """
import os, sys, hashlib
i = int(sys.argv[2])
data = hashlib.sha256(b"%d" % i).digest() * (4 << 15)   # 4 MiB
with open(os.path.join(sys.argv[1], "shard-%02d.bin" % i), "wb") as f:
    for o in range(0, len(data), 1 << 20):
        f.write(data[o:o + (1 << 20)])
""", str(d), str(i)]))
    for p in procs:
        assert p.wait(180) == 0
    assert sorted(os.listdir(d)) == ["shard-%02d.bin" % i for i in range(8)]
    for i in range(8):
        data = hashlib.sha256(b"%d" % i).digest() * (4 << 15)
        mount.check_published("sharded/step-7/shard-%02d.bin" % i, sha(data))


def test_large_file(mount, store):
    (mount.ck / "big").mkdir()
    p = mount.ck / "big" / "ckpt.bin"
    h = hashlib.sha256()
    block = os.urandom(1 << 20)
    with open(p, "wb") as f:
        for i in range(LARGE_MB):
            b = block[i % 7:] + block[:i % 7]
            h.update(b)
            f.write(b)
    want = h.hexdigest()
    assert sha_file(p) == want
    if store.kind == "dir":
        assert sha_file(store.root / "big" / "ckpt.bin") == want
        side = store.get(".dstage-sha256/big/ckpt.bin").decode().split()
        assert side == [want, str(LARGE_MB << 20)]
    else:
        mount.check_published("big/ckpt.bin", want)


# ---- a writer process (the failure tests in test_ckpt_failures.py) ----

def writer(path, mb, close=True):
    """A process that writes mb MiB to path, says 'ready', then closes or
    waits to be killed."""
    return subprocess.Popen([PY, "-c", """
import os, sys, time
f = open(sys.argv[1], "wb")
for i in range(int(sys.argv[2])):
    f.write(bytes([i % 251]) * (1 << 20))
f.flush()
print("ready", flush=True)
if sys.argv[3] == "1":
    f.close()
    print("closed", flush=True)
else:
    time.sleep(600)
"""] + [str(path), str(mb), "1" if close else "0"],
        stdout=subprocess.PIPE)


# ---- recovery drill (lib/ckpt/ckpt_drill.c through `stager drill`) ---------------

def drill(tool, m, tmp, *args):
    p = subprocess.run([tool("stager"), "drill"] + [str(a) for a in args],
                       env=m.env, capture_output=True, timeout=300)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def test_drill_restores_newest_and_finds_tampering(tool, mount, store,
                                                   tmp_path):
    import json
    job = mount.ck / "drilljob"
    files = {}
    for step in (9, 10, 100):
        d = job / ("step-%d" % step)
        d.mkdir(parents=True)
        for name in ("model.pt", "optim/state.bin"):
            data = os.urandom(300_000 + step)
            (d / name).parent.mkdir(exist_ok=True)
            (d / name).write_bytes(data)
            files[(step, name)] = data
    rc, out, err = drill(tool, mount, tmp_path, "drilljob", "--to",
                         tmp_path / "r1", "--json")
    assert rc == 0, (out, err)
    rep = json.loads(out)
    assert rep["checkpoint"] == "drilljob/step-100"   # numbers, not text
    assert rep["files"] == 2 and rep["ok"] and rep["bad"] == []
    assert rep["bytes"] == 2 * 300_100
    for name in ("model.pt", "optim/state.bin"):
        assert (tmp_path / "r1" / "step-100" / name).read_bytes() == \
            files[(100, name)]

    # Tampering in the store (a bit-flip another tool made) is named.
    bad = bytearray(files[(100, "model.pt")])
    bad[1000] ^= 1
    store.put("drilljob/step-100/model.pt", bytes(bad))
    rc, out, err = drill(tool, mount, tmp_path, "drilljob", "--to",
                         tmp_path / "r2")
    assert rc == 1, (out, err)
    assert "BAD drilljob/step-100/model.pt: differs" in out
    assert "optim" not in out.split("\n")[0]

    # --step picks an older one; a deleted file is reported missing.
    rc, out, err = drill(tool, mount, tmp_path, "drilljob", "--step", "10",
                         "--to", tmp_path / "r3", "--json")
    assert rc == 0 and json.loads(out)["checkpoint"] == "drilljob/step-10"
    if store.kind == "dir":
        (store.root / "drilljob" / "step-9" / "model.pt").unlink()
    else:
        store.rgw.curl("/%s/%sdrilljob/step-9/model.pt" %
                       (store.bucket, store.prefix), "-X", "DELETE")
    rc, out, err = drill(tool, mount, tmp_path, "drilljob", "--step", "9",
                         "--to", tmp_path / "r4", "--json")
    assert rc == 1
    assert json.loads(out)["bad"] == [{"key": "drilljob/step-9/model.pt",
                                       "problem": "missing"}]
    rc, out, err = drill(tool, mount, tmp_path, "nosuchjob", "--to",
                         tmp_path / "r5")
    assert rc == 5 and "No such file" in err        # STAGER_EXIT_NOENT
    rc, out, err = drill(tool, mount, tmp_path, "drilljob", "--to",
                         tmp_path / "r1")
    assert rc == 2, err                 # usage: not an empty directory


# ---- the overlapped upload (lib/ckpt/ckpt_upload.c) ----

OVERLAP_CONF = "[s3]\nmultipart_threshold = 8M\npart_size = 8M\n"


def open_uploads(store):
    """Uploads in parts open in the store: S3 ListMultipartUploads, or the
    temporary files of a directory store (name, size)."""
    if store.kind == "s3":
        p = store.rgw.aws("s3api", "list-multipart-uploads", "--bucket",
                          store.bucket, "--output", "json")
        out = p.stdout.decode()
        import json
        return [(u["Key"], u["UploadId"]) for u in
                (json.loads(out) if out.strip() else {}).get("Uploads", [])]
    out = []
    for dp, _, fn in os.walk(store.root):
        out += [(f, os.path.getsize(os.path.join(dp, f))) for f in fn
                if f.startswith(".dstage-tmp")]
    return out


def test_upload_overlaps_writing_and_rewrites_are_resent(tool, tmp_path,
                                                         store):
    """Parts the writer has moved past go to the store before close; a
    writer that seeks back and rewrites sent ranges still leaves exactly
    the bytes it wrote under the final name."""
    m = Ckpt(tool, tmp_path / "m", store, conf=OVERLAP_CONF
             if store.kind == "dir" else "")
    m.start()
    try:
        (m.ck / "ov").mkdir()
        data = bytearray(os.urandom(36 << 20))        # 5 parts of 8 MiB
        fd = os.open(m.ck / "ov" / "ckpt.bin", os.O_CREAT | os.O_WRONLY)
        try:
            for off in range(0, 32 << 20, 1 << 20):
                os.pwrite(fd, data[off:off + (1 << 20)], off)
            # Parts 1..3 are complete and passed: sent before any close.
            if store.kind == "s3":
                wait_for(lambda: open_uploads(store), "an open upload", 30)
            else:
                wait_for(lambda: any(s >= 24 << 20
                                     for _, s in open_uploads(store)),
                         "parts in the temporary file", 30)
            assert store.get("ov/ckpt.bin") is None
            time.sleep(0.5)
            # Seek back: rewrite inside part 1 (sent) and across the
            # boundary of parts 2 and 3, then finish the file.
            for off, n in ((1000, 5000), ((16 << 20) - 77, 4096)):
                data[off:off + n] = os.urandom(n)
                os.pwrite(fd, bytes(data[off:off + n]), off)
            os.pwrite(fd, bytes(data[32 << 20:]), 32 << 20)
        finally:
            os.close(fd)
        m.check_published("ov/ckpt.bin", sha(bytes(data)))
        assert sha_file(m.ck / "ov" / "ckpt.bin") == sha(bytes(data))
        assert open_uploads(store) == []
        no_partials(store)
        # Truncated below sent parts, then grown again: still exact.
        with open(m.ck / "ov" / "ckpt.bin", "r+b") as f:
            f.truncate(12 << 20)
            f.seek(20 << 20)
            f.write(b"tail")
        want = bytes(data[:12 << 20]) + bytes(8 << 20) + b"tail"
        m.check_published("ov/ckpt.bin", sha(want))
        assert open_uploads(store) == []
    finally:
        m.stop()


def test_writer_ahead_of_a_slow_store_is_paced(tool, tmp_path, faultproxy,
                                               proxied_store):
    """A writer faster than the store is held to about one part ahead of
    it (CKPT_PACE_PARTS, 2, in flight or queued), so the close waits for
    the tail and the commit, not for a backlog the size of the file: when
    its last write returns, all but the last few parts have reached the
    store (without the pace, none had: the begin was still queued)."""
    st = proxied_store
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    try:
        (m.ck / "pace").mkdir()
        nparts = 16                                  # 8 MiB parts
        data = os.urandom(1 << 20)
        # Every part answers 0.2 s late: the store is the slow side.
        faultproxy.add_fault("stall", count=1000, match="PUT",
                             seconds=0.2)
        faultproxy.reset_stats()
        fd = os.open(m.ck / "pace" / "big.bin", os.O_CREAT | os.O_WRONLY)
        try:
            for i in range(nparts * 8):
                os.write(fd, data)
            parts = [r for r in faultproxy.requests()
                     if r["method"] == "PUT" and "partNumber=" in r["query"]]
        finally:
            os.close(fd)
        faultproxy.clear_faults()
        # Parts passed: 16 (the last one passes with the last byte);
        # at most 2 may be queued, one more not yet passed; a margin of
        # two for the begin.
        assert len(parts) >= nparts - 5, len(parts)
        m.check_published("pace/big.bin",
                          sha(data * (nparts * 8)))
        assert open_uploads(st) == []
    finally:
        m.stop()


def test_kill9_mid_overlapped_upload_aborts_it(tool, tmp_path, store):
    """dstagefs killed while parts of an unfinished file are in the store:
    nothing under the final name, and the restart aborts the upload (S3:
    ListMultipartUploads is empty; directory: no temporary file)."""
    m = Ckpt(tool, tmp_path / "m", store, conf=OVERLAP_CONF
             if store.kind == "dir" else "")
    m.start()
    try:
        (m.ck / "kk").mkdir()
        w = writer(m.ck / "kk" / "partial.bin", 20, close=False)
        assert w.stdout.readline().strip() == b"ready"
        wait_for(lambda: open_uploads(store), "an open upload", 30)
        m.kill9()
        w.kill()
        w.wait(30)
        assert store.get("kk/partial.bin") is None
        assert open_uploads(store)
        m.start()
        wait_for(lambda: "aborted the unfinished upload of kk/partial.bin"
                 in m.log_text(), "the abort", 30)
        assert open_uploads(store) == []
        assert store.get("kk/partial.bin") is None
        no_partials(store)
    finally:
        m.stop()
