"""Integration tests of dstagefs (fs/) on real FUSE mounts under a temporary
directory, with file:// sources (always) and radosgw (the `rgw` fixture).

Datasets are registered with tests/tools/catalog_tool. The large file is
1 GiB on file:// (DSTAGE_TEST_LARGE_MB changes it) and 64 MiB on radosgw.
"""
import contextlib
import hashlib
import os
import random
import signal
import subprocess
import threading
import time
import mmap
from pathlib import Path

import pytest

from conftest import injected

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

LARGE_MB = int(os.environ.get("DSTAGE_TEST_LARGE_MB", "1024"))
N_SMALL = 10000
UTF8_NAMES = ["caf\u00e9.txt", "\u65e5\u672c\u8a9e/\u30c7\u30fc\u30bf.bin",
              "\u00fcber/\u00e4\u00f6\u00fc \u00df.json", "emoji_\U0001F600.txt"]
# Names a POSIX directory can hold but that are not valid keys: skipped by
# registration and never visible in the mount.
BAD_NAMES = ["bad\x01ctl", "bad\x7fdel", "sub/ctl\x1bname"]


def sha256_file(path, bs=4 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bs)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def mounted(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if parts[1] == mnt and parts[2] == "fuse.dstagefs":
                return True
    return False


class Dstagefs:
    """One dstagefs process on one mountpoint."""

    def __init__(self, binary, mnt, env, log, opts=()):
        self.binary, self.mnt, self.env, self.log = binary, Path(mnt), env, log
        self.opts = list(opts)
        self.p = None

    def start(self, timeout=30):
        self.mnt.mkdir(exist_ok=True)
        logf = open(self.log, "ab")
        self.p = subprocess.Popen([self.binary, "-f"] + self.opts +
                                  [str(self.mnt)], env=self.env,
                                  stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        end = time.time() + timeout
        while time.time() < end:
            if self.p.poll() is not None:
                raise AssertionError("dstagefs exited %d:\n%s" %
                                     (self.p.returncode, self.log_text()))
            # statfs always reaches the daemon (stat may be answered from
            # the kernel's cache, even by a dead mount).
            if mounted(self.mnt) and not self._stale():
                return self
            time.sleep(0.05)
        raise AssertionError("dstagefs did not mount:\n" + self.log_text())

    def log_text(self):
        try:
            return Path(self.log).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout=30):
        self.p.send_signal(sig)
        rc = self.p.wait(timeout)
        return rc

    def kill9(self):
        self.p.kill()
        self.p.wait(30)

    def cleanup(self):
        if self.p and self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(30)
        if mounted(self.mnt) or self._stale():
            subprocess.run(["fusermount3", "-uz", str(self.mnt)],
                           capture_output=True)

    def _stale(self):
        try:
            os.statvfs(self.mnt)
            return False
        except OSError:
            return True

    def stats(self):
        out = {}
        for line in (self.mnt / ".dstage" / "stats").read_text().splitlines():
            k, v = line.split()
            out[k] = int(v)
        return out


class Env:
    """A config, catalog and cache in one temporary directory."""

    def __init__(self, tool, tmp, extra_env=None, conf=""):
        self.tool, self.tmp = tool, Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.cfg = self.tmp / "dstage.conf"
        self.cfg.write_text(
            "[cache]\ndir = %s\nsize = 8G\n[catalog]\npath = %s\n%s" %
            (self.tmp / "cache", self.tmp / "catalog.db", conf))
        self.env = dict(os.environ, DSTAGE_CONFIG=str(self.cfg),
                        DSTAGE_LOG_LEVEL="info")
        self.env.update(extra_env or {})
        self.mounts = []

    def catalog(self, *args, env=None, check=True):
        p = subprocess.run([self.tool("catalog_tool"),
                            str(self.tmp / "catalog.db")] + list(args),
                           env=env or self.env, capture_output=True,
                           timeout=600)
        if check and p.returncode != 0:
            raise AssertionError("catalog_tool %s: %s" %
                                 (args, p.stderr.decode(errors="replace")))
        return p

    def add_dataset(self, name, files):
        """A file:// dataset `name` of files ({name: bytes}) under tmp,
        added to the catalog; returns its source directory."""
        src = self.tmp / ("src-" + name)
        src.mkdir()
        for k, v in files.items():
            (src / k).write_bytes(v)
        self.catalog("add", name, "file://%s/" % src)
        return src

    def mount(self, opts=(), env=None, name="mnt"):
        m = Dstagefs(self.tool("dstagefs"), self.tmp / name, env or self.env,
                     self.tmp / (name + ".log"), opts)
        self.mounts.append(m)
        return m.start()

    def cleanup(self):
        for m in self.mounts:
            m.cleanup()


@contextlib.contextmanager
def stager_daemon(env, stager, tmp):
    """A stager daemon for env (its socket under tmp, added to env's
    config), ready when entered, stopped on exit; yields its Popen."""
    sock = tmp / "stager.sock"
    with open(env.cfg, "a") as f:
        f.write("[daemon]\nsocket = %s\n" % sock)
    log = open(tmp / "daemon.log", "wb")
    daemon = subprocess.Popen([stager, "daemon"], env=env.env, stdout=log,
                              stderr=log)
    try:
        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.05)
        yield daemon
    finally:
        daemon.terminate()
        daemon.wait(30)
        log.close()


@pytest.fixture
def denv(tool, tmp_path):
    e = Env(tool, tmp_path)
    yield e
    e.cleanup()


def write_tree(root, large_mb, n_small, seed=1):
    """A dataset tree; returns {relative path: bytes or a Path}."""
    rnd = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    files = {}

    def put(rel, data):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        files[rel] = data

    put("a/b/c/deep.txt", b"deep\n")
    put("a/b/sibling.bin", rnd.randbytes(70000))
    put("empty", b"")
    put("a/empty2", b"")
    put("odd size.bin", rnd.randbytes(4 * 1024 * 1024 + 123))
    for n in UTF8_NAMES:
        put(n, ("name " + n).encode())
    small = root / "small"
    small.mkdir()
    for i in range(n_small):
        data = b"%06d:" % i + rnd.randbytes(rnd.randrange(0, 2000))
        (small / ("%05d.dat" % i)).write_bytes(data)
        files["small/%05d.dat" % i] = data
    big = root / "large.bin"
    with open(big, "wb") as f:
        chunk = rnd.randbytes(1 << 20)
        for i in range(large_mb):
            # Vary each MiB so a misplaced block is caught.
            f.write(i.to_bytes(8, "little") + chunk[8:])
    files["large.bin"] = big
    for n in BAD_NAMES:
        p = root / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"bad key")
    return files


@pytest.fixture(scope="module")
def file_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "ds"
    files = write_tree(root, LARGE_MB, N_SMALL)
    return root, files


def expected_bytes(v):
    return v.read_bytes() if isinstance(v, Path) else v


def check_tree(mnt_ds, files):
    seen = set()
    for dirpath, _, names in os.walk(mnt_ds):
        for n in names:
            seen.add(os.path.relpath(os.path.join(dirpath, n), mnt_ds))
    assert seen == set(files), (sorted(seen ^ set(files))[:10])
    for rel, v in files.items():
        p = mnt_ds / rel
        if isinstance(v, Path):
            assert sha256_file(p) == sha256_file(v), rel
        else:
            assert p.stat().st_size == len(v), rel
            assert hashlib.sha256(p.read_bytes()).digest() == \
                hashlib.sha256(v).digest(), rel


def test_file_tree_hashes_and_bad_keys(denv, file_tree):
    root, files = file_tree
    denv.catalog("add", "ds", "file://%s/" % root)
    m = denv.mount()
    ds = m.mnt / "datasets" / "ds"
    check_tree(ds, files)
    # Directory attributes, empty files, sizes.
    assert (ds / "a" / "b").is_dir()
    assert (ds / "empty").stat().st_size == 0
    assert (ds / "large.bin").stat().st_size == LARGE_MB << 20
    for n in BAD_NAMES:
        assert not os.path.lexists(ds / n)
    # sha256sum(1) through the mount agrees too, on a sample.
    sample = ["large.bin", UTF8_NAMES[1], "small/00042.dat"]
    out = subprocess.run(["sha256sum"] + sample, cwd=ds, capture_output=True,
                         check=True).stdout.decode()
    for line in out.splitlines():
        h, name = line.split("  ", 1)
        assert h == sha256_file(root / name)
    assert m.stop() == 0
    assert not mounted(m.mnt)


def test_threads_random_ranges_and_mmap(denv, file_tree):
    root, files = file_tree
    denv.catalog("add", "ds", "file://%s/" % root)
    m = denv.mount()
    ds = m.mnt / "datasets" / "ds"
    names = [n for n in files if not n.startswith("small/")] + \
        ["small/%05d.dat" % i for i in range(0, N_SMALL, 97)]
    errors = []

    def worker(seed):
        rnd = random.Random(seed)
        try:
            for _ in range(150):
                n = rnd.choice(names)
                size = (root / n).stat().st_size
                off = rnd.randrange(size) if size else 0
                ln = rnd.choice([1, 4096, 100000, 1 << 20, 3 << 20])
                with open(ds / n, "rb") as f:
                    got = os.pread(f.fileno(), ln, off)
                with open(root / n, "rb") as f:
                    want = os.pread(f.fileno(), ln, off)
                if got != want:
                    errors.append((n, off, ln))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:5]

    for n in ["odd size.bin", "large.bin"]:
        with open(ds / n, "rb") as f, open(root / n, "rb") as g:
            mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            size = len(mm)
            rnd = random.Random(5)
            for _ in range(50):
                off = rnd.randrange(size)
                assert mm[off:off + 10000] == os.pread(g.fileno(), 10000, off)
            assert hashlib.sha256(mm).digest() == \
                hashlib.sha256(g.read()).digest()
            mm.close()


def test_dataset_appears_live_and_refresh(denv, tmp_path):
    src = tmp_path / "live"
    (src / "d").mkdir(parents=True)
    (src / "d" / "one.txt").write_bytes(b"one")
    m = denv.mount(opts=["-o", "poll_ms=200"])
    assert os.listdir(m.mnt / "datasets") == []
    denv.catalog("add", "live", "file://%s/" % src)
    deadline = time.time() + 10
    while "live" not in os.listdir(m.mnt / "datasets"):
        assert time.time() < deadline, "dataset did not appear"
        time.sleep(0.1)
    assert (m.mnt / "datasets/live/d/one.txt").read_bytes() == b"one"
    # A refresh with a new file: visible without a remount.
    (src / "d" / "two.txt").write_bytes(b"two")
    denv.catalog("refresh", "live")
    deadline = time.time() + 10
    while True:
        try:
            if (m.mnt / "datasets/live/d/two.txt").read_bytes() == b"two":
                break
        except FileNotFoundError:
            pass
        assert time.time() < deadline, "refresh not visible"
        time.sleep(0.1)
    # And a removed dataset disappears.
    denv.catalog("remove", "live")
    deadline = time.time() + 10
    while "live" in os.listdir(m.mnt / "datasets"):
        assert time.time() < deadline, "dataset did not go away"
        time.sleep(0.1)


def test_read_only_contract(denv, tool, tmp_path):
    src = tmp_path / "ro"
    (src / "dir").mkdir(parents=True)
    (src / "dir" / "f.bin").write_bytes(os.urandom(10000))
    denv.catalog("add", "ro", "file://%s/" % src)
    m = denv.mount()
    d = m.mnt / "datasets" / "ro" / "dir"
    p = subprocess.run([tool("fs_syscalls"), str(d), "f.bin"],
                       capture_output=True)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    for path in [m.mnt / "x", m.mnt / "datasets" / "new",
                 m.mnt / "checkpoints" / "x", m.mnt / ".dstage" / "x"]:
        with pytest.raises(OSError) as ei:
            open(path, "w")
        assert ei.value.errno == 30, path  # EROFS
    with pytest.raises(OSError) as ei:
        os.mkdir(m.mnt / "datasets" / "ro" / "newdir")
    assert ei.value.errno == 30


def _run_as(user, cmd):
    import pwd
    pw = pwd.getpwnam(user)
    return subprocess.run(["setpriv", "--reuid", str(pw.pw_uid), "--regid",
                           str(pw.pw_gid), "--init-groups"] + cmd,
                          capture_output=True, timeout=60)


def test_group_restriction(denv, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (useradd, allow_other)")
    tag = "%05d" % (os.getpid() % 100000)
    group, member, other = "dsg" + tag, "dsm" + tag, "dso" + tag
    created = []
    try:
        subprocess.run(["groupadd", group], check=True)
        created.append(("groupdel", group))
        for u, extra in [(member, ["-G", group]), (other, [])]:
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/false"] +
                           extra + [u], check=True)
            created.insert(0, ("userdel", u))
        src = tmp_path / "team"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "data.bin").write_bytes(b"secret bytes")
        pub = tmp_path / "pub"
        pub.mkdir()
        (pub / "p.txt").write_bytes(b"public")
        denv.catalog("add", "team", "file://%s/" % src, "--group", group)
        denv.catalog("add", "pub", "file://%s/" % pub)
        # The mount dir's parents must be traversable by the test users.
        os.chmod(tmp_path, 0o755)
        for p in tmp_path.parents:
            if str(p) in ("/", "/tmp"):
                break
            os.chmod(p, os.stat(p).st_mode | 0o005)
        m = denv.mount(opts=["-o", "allow_other"])
        f = str(m.mnt / "datasets/team/sub/data.bin")
        r = _run_as(member, ["cat", f])
        assert r.returncode == 0 and r.stdout == b"secret bytes", r.stderr
        r = _run_as(other, ["cat", f])
        assert r.returncode != 0 and b"Permission denied" in r.stderr
        r = _run_as(other, ["ls", str(m.mnt / "datasets/team")])
        assert r.returncode != 0 and b"Permission denied" in r.stderr
        r = _run_as(other, ["cat", str(m.mnt / "datasets/pub/p.txt")])
        assert r.returncode == 0 and r.stdout == b"public"
        # A member after a non-member (and vice versa): no cached bypass.
        r = _run_as(member, ["cat", f])
        assert r.returncode == 0
        r = _run_as(other, ["cat", f])
        assert r.returncode != 0
    finally:
        for cmd, name in created:
            subprocess.run([cmd, name], capture_output=True)


def test_kill9_then_remount_downloads_nothing(denv):
    data = {("f%d.bin" % i): os.urandom(3 << 20) for i in range(4)}
    denv.add_dataset("k", data)
    m = denv.mount()
    for k, v in data.items():
        assert (m.mnt / "datasets/k" / k).read_bytes() == v
    assert m.stats()["bytes_from_source"] >= sum(map(len, data.values()))
    m.kill9()
    with pytest.raises(OSError):
        os.statvfs(m.mnt)  # ENOTCONN: the stale mount
    m2 = denv.mount()
    assert "stale FUSE mount" in m2.log_text()
    subprocess.run(["sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"])
    for k, v in data.items():
        assert (m2.mnt / "datasets/k" / k).read_bytes() == v
    st = m2.stats()
    assert st["bytes_from_source"] == 0, st
    assert m2.stop(signal.SIGINT) == 0
    assert not mounted(m2.mnt)


def test_fusermount_unmount_ends_process(denv):
    m = denv.mount()
    subprocess.run(["fusermount3", "-u", str(m.mnt)], check=True)
    assert m.p.wait(30) == 0
    assert "unmounted" in m.log_text()


def built_libfuse(tool):
    """(major, minor) of the libfuse dstagefs was built against."""
    import re
    out = subprocess.run([tool("dstagefs"), "--version"], capture_output=True,
                         text=True, check=True).stdout
    m = re.search(r"\(libfuse (\d+)\.(\d+)", out)
    assert m, out
    return int(m[1]), int(m[2])


def kernel_has_passthrough():
    """True, False, or None when the kernel's configuration is unknown."""
    import gzip
    if tuple(map(int, os.uname().release.split(".")[:2])) < (6, 9):
        return False
    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            return "CONFIG_FUSE_PASSTHROUGH=y" in f.read()
    except OSError:
        return None


def passthrough_lines(m, timeout=10.0):
    """The mount's "passthrough on/off" lines. They are logged at the
    kernel's INIT, answered after the mount point appears: under load a
    moment later, so wait for the first (bounded)."""
    end = time.monotonic() + timeout
    while True:
        lines = [line for line in m.log_text().splitlines()
                 if "passthrough on: " in line or
                 "passthrough off: " in line]
        if lines or time.monotonic() > end:
            return lines
        time.sleep(0.05)


def test_passthrough_mode_line_and_option(denv, tool):
    """One line at mount says whether FUSE passthrough is on and why; the
    stats file agrees; -o nopassthrough turns it off."""
    data = {"f.bin": os.urandom(300000)}
    denv.add_dataset("pt", data)
    ver = built_libfuse(tool)
    m = denv.mount()
    assert (m.mnt / "datasets/pt/f.bin").read_bytes() == data["f.bin"]
    lines = passthrough_lines(m)
    assert len(lines) == 1, m.log_text()
    kernel = kernel_has_passthrough()
    if ver < (3, 17):
        assert "passthrough off: built against libfuse %d.%d" % ver \
            in lines[0]
        on = False
    elif os.geteuid() == 0 and kernel:
        assert "passthrough on: libfuse %d.%d." % ver in lines[0]
        assert lines[0].endswith(", kernel capable"), lines[0]
        on = True
    elif os.geteuid() == 0 and kernel is False:
        assert "passthrough off: the kernel did not offer it" in lines[0]
        on = False
    else:
        on = "passthrough on: " in lines[0]
    assert m.stats()["fs_passthrough"] == int(on)
    assert m.stop() == 0

    m2 = denv.mount(opts=["-o", "nopassthrough"], name="mnt2")
    assert (m2.mnt / "datasets/pt/f.bin").read_bytes() == data["f.bin"]
    lines = passthrough_lines(m2)
    assert len(lines) == 1, m2.log_text()
    if ver < (3, 17):
        assert "passthrough off: built against libfuse" in lines[0]
    else:
        assert "passthrough off: disabled by option (-o nopassthrough)" \
            in lines[0]
    assert m2.stats()["fs_passthrough"] == 0


UNPRIV_SCRIPT = r"""
set -e
# A private mount namespace with a /dev/fuse that any user may open (the
# host's may be 0600): the mount(2) as the user fails, so libfuse runs the
# system's setuid fusermount3, as for any unprivileged mount.
mknod -m 666 "$BASE/fusedev" c 10 229
mount --bind "$BASE/fusedev" /dev/fuse
U="setpriv --reuid $USER_UID --regid $USER_GID --clear-groups --"
$U env DSTAGE_CONFIG="$BASE/dstage.conf" DSTAGE_LOG_LEVEL=info     "$DSTAGEFS" -f "$BASE/mnt" >"$BASE/mnt.log" 2>&1 &
pid=$!
for i in $(seq 100); do
    grep -q " $BASE/mnt fuse.dstagefs " /proc/self/mounts && break
    sleep 0.1
done
$U cat "$BASE/mnt/datasets/u/f.txt" >"$BASE/read.out"
$U cat "$BASE/mnt/.dstage/stats" >"$BASE/stats.out"
$U fusermount3 -u "$BASE/mnt"
wait $pid
"""


def test_unprivileged_mount_through_system_fusermount3(tool, users):
    """A user's mount: whichever libfuse dstagefs was built against (a
    static 3.17 from scripts/install-deps on Debian 12), it mounts and
    unmounts through the system's fusermount3, and passthrough is off for
    want of CAP_SYS_ADMIN."""
    import shutil
    import tempfile
    if not shutil.which("unshare") or not shutil.which("fusermount3"):
        pytest.skip("needs unshare and fusermount3")
    base = Path(tempfile.mkdtemp(prefix="dstage-unpriv-", dir="/tmp"))
    try:
        user = users.user("dsun")
        env = Env(tool, base)
        env.add_dataset("u", {"f.txt": b"hello from a user mount\n"})
        (base / "mnt").mkdir()
        subprocess.run(["chown", "-R", "%d:%d" % (users.uid(user),
                                                 users.gid(user)), base],
                       check=True)
        os.chmod(base, 0o755)
        p = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             UNPRIV_SCRIPT],
            env=dict(os.environ, BASE=str(base), DSTAGEFS=tool("dstagefs"),
                     USER_UID=str(users.uid(user)),
                     USER_GID=str(users.gid(user))),
            capture_output=True, text=True, timeout=120)
        log = (base / "mnt.log").read_text(errors="replace") \
            if (base / "mnt.log").exists() else ""
        assert p.returncode == 0, p.stdout + p.stderr + log
        assert (base / "read.out").read_bytes() == \
            b"hello from a user mount\n"
        assert "fs_passthrough 0" in (base / "stats.out").read_text()
        if built_libfuse(tool) >= (3, 17):
            assert "passthrough off: no CAP_SYS_ADMIN" in log, log
        assert "unmounted" in log, log
    finally:
        subprocess.run(["umount", "-l", str(base / "mnt")],
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_source_down_file_gives_eio(denv, tmp_path):
    src = denv.add_dataset("gone", {"x.bin": os.urandom(100000)})
    m = denv.mount()
    # The source loses the object (a file:// store keeps its directory
    # open, so renaming the directory would not be noticed).
    os.rename(src / "x.bin", tmp_path / "x.moved")
    for _ in range(2):
        with pytest.raises(OSError) as ei:
            (m.mnt / "datasets/gone/x.bin").read_bytes()
        assert ei.value.errno == 5  # EIO
    log = m.log_text()
    assert log.count("dataset gone key x.bin") == 1, log


def test_prefetch_control_file(denv):
    files = {("s%d" % i): os.urandom(2 << 20) for i in range(6)}
    denv.add_dataset("pf", files)
    total = sum(map(len, files.values()))
    m = denv.mount()
    lines = ["datasets/pf/s%d" % i for i in range(6)]
    lines += [str(m.mnt / "datasets/pf/s0"), "datasets/nope/x",
              "datasets/pf/missing", "# comment"]
    with open(m.mnt / ".dstage" / "prefetch", "w") as f:
        f.write("\n".join(lines) + "\n")
    # Handed over at close (FLUSH), or at RELEASE just after when the
    # kernel sends no FLUSH: poll briefly.
    deadline = time.time() + 5
    while True:
        status = (m.mnt / ".dstage" / "prefetch").read_text()
        if "objects" in status or time.time() > deadline:
            break
        time.sleep(0.05)
    assert "objects 7" in status and "skipped 2" in status, status
    deadline = time.time() + 30
    while m.stats()["bytes_from_source"] < total:
        assert time.time() < deadline, m.stats()
        time.sleep(0.2)
    assert m.stats()["fs_reads"] == 0
    for i in range(6):
        assert (m.mnt / "datasets/pf" / ("s%d" % i)).read_bytes() == \
            files["s%d" % i]
    assert m.stats()["bytes_from_source"] == total


# ---- radosgw ----

@pytest.fixture
def s3_dataset(rgw, tool, tmp_path, request):
    bucket = "fs-" + hashlib.sha1(request.node.name.encode()).hexdigest()[:16]
    rgw.make_bucket(bucket)
    url = "s3://%s/ds/" % bucket
    root = tmp_path / "s3src"
    files = write_tree(root, 64, 0, seed=3)
    ot = tool("objstore_tool")
    for rel in files:
        subprocess.run([ot, url, "put", rel, str(root / rel)],
                       env=rgw.env(), check=True, capture_output=True)
    # The small files as objects holding their own key.
    subprocess.run([ot, url, "fill", "small/", str(N_SMALL)], env=rgw.env(),
                   check=True, capture_output=True, timeout=1200)
    return url, root, files


def test_s3_tree_hashes_threads(rgw, tool, tmp_path, s3_dataset):
    url, root, files = s3_dataset
    e = Env(tool, tmp_path / "env", extra_env=rgw.env(DSTAGE_LOG_LEVEL="info"))
    try:
        e.catalog("add", "s3ds", url)
        m = e.mount()
        ds = m.mnt / "datasets" / "s3ds"
        for rel, v in files.items():
            p = ds / rel
            if isinstance(v, Path):
                assert sha256_file(p) == sha256_file(v), rel
            else:
                assert p.read_bytes() == v, rel
        smalls = sorted(os.listdir(ds / "small"))
        assert len(smalls) == N_SMALL
        for n in smalls[::50]:
            assert (ds / "small" / n).read_bytes() == \
                ("small/" + n).encode()
        errors = []

        def worker(seed):
            rnd = random.Random(seed)
            for _ in range(40):
                rel = rnd.choice([r for r in files if isinstance(files[r],
                                                                  Path)] +
                                 ["odd size.bin"])
                size = (root / rel).stat().st_size
                off = rnd.randrange(size)
                with open(ds / rel, "rb") as f:
                    got = os.pread(f.fileno(), 1 << 20, off)
                with open(root / rel, "rb") as f:
                    if got != os.pread(f.fileno(), 1 << 20, off):
                        errors.append((rel, off))
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors
    finally:
        e.cleanup()


def test_s3_source_down_eio_within_deadline(rgw, tool, tmp_path):
    bucket = rgw.make_bucket("fs-down")
    url = "s3://%s/d/" % bucket
    f = tmp_path / "obj"
    f.write_bytes(os.urandom(1 << 20))
    subprocess.run([tool("objstore_tool"), url, "put", "obj", str(f)],
                   env=rgw.env(), check=True, capture_output=True)
    e = Env(tool, tmp_path / "env", extra_env=rgw.env(),
            conf="[s3]\ndeadline = 3s\nconnect_timeout = 1s\n")
    try:
        e.catalog("add", "down", url)
        # A closed port: nothing listens on it.
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        m = e.mount(env=rgw.env(AWS_ENDPOINT_URL="http://127.0.0.1:%d" % port,
                                DSTAGE_CONFIG=str(e.cfg)))
        t0 = time.time()
        with pytest.raises(OSError) as ei:
            (m.mnt / "datasets/down/obj").read_bytes()
        took = time.time() - t0
        assert ei.value.errno == 5
        assert took < 3 + 5, took
        assert m.log_text().count("dataset down key obj") == 1
    finally:
        e.cleanup()


def test_reads_while_the_stager_fills_the_same_file(denv, tool, tmp_path):
    """dstagefs readers and a stager prewarm share one cache and one file at
    the same time: every byte read is right, and afterwards the file is
    whole in the cache (a re-read fetches nothing)."""
    import threading
    src = tmp_path / "shared"
    src.mkdir()
    blob = os.urandom(48 << 20)
    (src / "shard.tar").write_bytes(blob)
    (src / "SHA256SUMS").write_text(
        "%s  shard.tar\n" % hashlib.sha256(blob).hexdigest())
    stager = tool("stager")
    with stager_daemon(denv, stager, tmp_path):
        subprocess.run([stager, "add", "shared", "file://%s/" % src],
                       env=denv.env, check=True, capture_output=True)
        m = denv.mount()
        path = m.mnt / "datasets/shared/shard.tar"
        # A slow prewarm (16 MiB/s: about 3 s) while we read.
        stage = subprocess.Popen([stager, "stage", "shared", "--wait",
                                  "--bandwidth", "16M"], env=denv.env,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        errors = []

        def reader(seed):
            rnd = random.Random(seed)
            with open(path, "rb") as f:
                for _ in range(40):
                    off = rnd.randrange(len(blob))
                    n = rnd.randrange(1, 3 << 20)
                    f.seek(off)
                    got = f.read(n)
                    if got != blob[off:off + n]:
                        errors.append((seed, off, n))

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        whole = sha256_file(path)
        for t in threads:
            t.join(120)
        out, err = stage.communicate(timeout=120)
        assert stage.returncode == 0, err.decode()
        assert not errors, errors[:5]
        assert whole == hashlib.sha256(blob).hexdigest()
        p = subprocess.run([stager, "verify", "shared", "--cache"],
                           env=denv.env, capture_output=True, timeout=120)
        assert p.returncode == 0 and b"all match" in p.stdout, p.stderr
        before = m.stats()["bytes_from_source"]
        subprocess.run(["sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"])
        assert sha256_file(path) == hashlib.sha256(blob).hexdigest()
        assert m.stats()["bytes_from_source"] == before


def test_unmappable_cache_blocks_are_served_by_copy(denv, faults):
    """A fresh mount checks cached blocks in place through a mapping before
    splicing them; when no mapping can be made (tests/preload/faults.c
    refuses them all) each read takes the copying path, which reads and
    checks the block itself: same bytes, nothing fetched again."""
    data = {("f%d.bin" % i): os.urandom((5 << 20) + i) for i in range(3)}
    denv.add_dataset("u", data)
    m = denv.mount()
    for k, v in data.items():
        assert (m.mnt / "datasets/u" / k).read_bytes() == v
    assert m.stop() == 0
    subprocess.run(["sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"])
    fenv, log = faults("mmap_populate")
    # dstagefs's own read path (a whole cached file would otherwise be
    # passed through to the kernel, which maps nothing)
    m2 = denv.mount(["-o", "nopassthrough"], env=dict(denv.env, **fenv),
                    name="mnt2")
    for k, v in data.items():
        assert sha256_file(m2.mnt / "datasets/u" / k) == \
            hashlib.sha256(v).hexdigest()
    st = m2.stats()
    assert st["bytes_from_source"] == 0 and st["checksum_failures"] == 0, st
    assert injected(log) > 0, "no mapping was refused"
    assert m2.stop() == 0


def test_handles_left_open_are_released_at_unmount(denv):
    """Files and directories still open when dstagefs stops get no RELEASE
    from the kernel; dstagefs releases what its subtrees hold itself (the
    ASan build's leak check fails the exit code otherwise)."""
    denv.add_dataset("h", {"a.bin": os.urandom(1 << 20)})
    m = denv.mount()
    f = open(m.mnt / "datasets/h/a.bin", "rb")
    d = os.open(m.mnt / "datasets/h", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert len(f.read(4096)) == 4096
        assert os.listdir(d) == ["a.bin"]
        assert m.stop() == 0
        assert "released 2 handle(s) the kernel left open" in m.log_text()
    finally:
        f.close()
        os.close(d)
