# SPDX-License-Identifier: MIT
"""What a POSIX (file://) source's snapshot shows (issue 45; the table of
docs/catalog.md, "What a POSIX source's snapshot shows"): one source tree
holding every kind of entry a POSIX tree can hold, registered with a real
stager daemon (`stager add NAME file:///DIR/`) and read through a real
dstagefs mount (datasets/NAME/), one test a row:

- empty directories (and one holding only skipped entries) are
  directories of the snapshot, empty; also in the overlay (dstagefs
  --over) and in the shared tier's copy (`stager stage --shared`), whose
  snapshot id they change;
- symbolic links: one to a file inside the tree (skipped by default,
  followed as a file with sources.follow_symlinks = inside), one to a
  directory inside (never followed), ones leading out (never followed, the
  outside file never readable through the mount), a dangling one: each
  skipped one is counted in the dataset's bad keys and logged with its key;
- FIFOs, sockets and devices: skipped, counted, logged;
- hard links: each name is a file with the content;
- unreadable files and directories (mode 000): as root, in the snapshot
  and readable (root reads them); as an unprivileged service uid, skipped,
  counted and logged, the rest of the tree registered;
- names the store's keys cannot carry (a newline, a key over 1,024 bytes)
  skipped, counted, logged; a Latin-1 name kept byte for byte;
- names of dstage's own temporary files (.dstage-tmp.*) skipped, counted;
- directories nested deeper than 256 levels: skipped, counted.
"""
import errno
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from test_dstagefs import Dstagefs
from test_metrics import free_port
from test_overlay import TIMEOUT as OVERLAY_TIMEOUT
from test_overlay import Overlay
from test_stager import Stager

SECRET = b"outside the tree: never in the snapshot\n"
LATIN1 = b"caf\xe9.txt"
LONG = "/".join(["d" * 200] * 5) + "/" + "g" * 30  # 1,035 bytes
DEEP = 300  # directories nested below deep/


def build_tree(top):
    """top/src (the source) beside top/out (outside it). Returns src."""
    out = top / "out"
    out.mkdir()
    (out / "secret").write_bytes(SECRET)
    src = top / "src"
    (src / "data/train").mkdir(parents=True)
    (src / "data/train/x.bin").write_bytes(b"x" * 5000)
    (src / "valid").mkdir()                       # the MLPerf case
    (src / "a/b/c").mkdir(parents=True)           # nested, all empty
    (src / "specials").mkdir()                    # only skipped entries
    os.mkfifo(src / "specials/fifo")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(src / "specials/sock"))
    s.close()                                     # the socket file stays
    os.mknod(src / "specials/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.symlink("data/train/x.bin", src / "link_in")
    os.symlink("data", src / "link_dir")
    os.symlink("../out/secret", src / "link_out")
    os.symlink(str(out / "secret"), src / "link_abs")
    os.symlink("../out", src / "link_outdir")
    os.symlink("nowhere", src / "link_dangling")
    (src / "hard1").write_bytes(b"one inode, two names\n")
    os.link(src / "hard1", src / "hard2")
    (src / "locked").write_bytes(b"mode 000\n")
    os.chmod(src / "locked", 0)
    (src / "lockdir").mkdir()
    (src / "lockdir/inner").write_bytes(b"behind a mode 000 directory\n")
    os.chmod(src / "lockdir", 0)
    (src / "new\nline").write_bytes(b"newline\n")
    (Path(os.fsdecode(bytes(src) + b"/" + LATIN1))).write_bytes(b"latin-1\n")
    (src / LONG).parent.mkdir(parents=True)
    (src / LONG).write_bytes(b"too long a key\n")
    (src / ".dstage-tmp.mine").write_bytes(b"a reserved name\n")
    deep = src / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(DEEP):  # past PATH_MAX would need *at calls anyway
            os.mkdir("n", dir_fd=fd)
            nfd = os.open("n", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    return src


def mount(s, tool, name="mnt"):
    env = dict(s.env, DSTAGE_CONFIG=str(s.cfg), DSTAGE_LOG_LEVEL="info",
               DSTAGE_METRICS_LISTEN="127.0.0.1:%d" % free_port())
    return Dstagefs(tool("dstagefs"), s.root / name, env,
                    s.root / (name + ".log")).start()


class Snap:
    """A stager (its config's extra lines: conf) with the tree registered
    as dataset ds, and a dstagefs mount of its catalog."""

    def __init__(self, tool, top, conf="", prefix=(), name="n"):
        self.root = top / name
        self.root.mkdir()
        os.chmod(self.root, 0o755)
        self.s = Stager(tool("stager"), self.root, prefix=prefix)
        self.s.env["DSTAGE_LOG_LEVEL"] = "info"
        with open(self.s.cfg, "a") as f:
            f.write(conf)
        self.m = None

    def add(self, src, tool):
        self.s.start()
        self.s.run("add", "ds", "file://%s/" % src, check=True)
        self.m = mount(self.s, tool)
        self.ds = self.m.mnt / "datasets" / "ds"
        return self

    def bad_keys(self):
        return int(self.s.json("show", "ds")["bad_keys"])

    def skipped(self):
        """The keys the registration logged as skipped, and why."""
        out = {}
        for line in self.s.log.read_text(errors="replace").splitlines():
            if "catalog: dataset ds: skipping key '" in line:
                key, why = line.split("skipping key '", 1)[1].split("': ", 1)
                out[key] = why
        return out

    def close(self):
        if self.m:
            self.m.cleanup()
        self.s.stop()


@pytest.fixture(scope="module")
def top():
    d = Path(tempfile.mkdtemp(prefix="fidelity-"))
    os.chmod(d, 0o755)
    yield d
    for p in (d / "src/lockdir",):
        if p.exists():
            os.chmod(p, 0o755)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def src(top):
    if os.geteuid() != 0:
        pytest.skip("needs root (a device node, a second uid)")
    return build_tree(top)


@pytest.fixture(scope="module")
def snap(tool, top, src):
    """The default configuration (sources.follow_symlinks = no), as root."""
    sn = Snap(tool, top)
    try:
        yield sn.add(src, tool)
    finally:
        sn.close()


@pytest.fixture(scope="module")
def snap_inside(tool, top, src):
    """sources.follow_symlinks = inside, as root."""
    sn = Snap(tool, top, conf="[sources]\nfollow_symlinks = inside\n",
              name="inside")
    try:
        yield sn.add(src, tool)
    finally:
        sn.close()


def listing(root):
    """{relative path: 'd' or 'f'} of everything under root."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for n in dirs:
            out[os.path.normpath(os.path.join(rel, n))] = "d"
        for n in files:
            out[os.path.normpath(os.path.join(rel, n))] = "f"
    return out


# ---- empty directories ------------------------------------------------------

def test_empty_directories_are_in_the_snapshot(snap):
    ls = listing(snap.ds)
    for d in ["valid", "a", "a/b", "a/b/c", "specials"]:
        assert ls.get(d) == "d", (d, sorted(ls))
    assert os.listdir(snap.ds / "valid") == []
    assert os.listdir(snap.ds / "a/b/c") == []
    assert os.listdir(snap.ds / "specials") == []
    assert stat.S_ISDIR(os.stat(snap.ds / "valid").st_mode)
    # what MLPerf Storage's tool does with its data directory
    assert {"a", "data", "valid"} <= set(os.listdir(snap.ds))
    assert (snap.ds / "data/train/x.bin").read_bytes() == b"x" * 5000


def test_empty_directories_in_the_overlay(tool, tmp_path, src):
    o = Overlay(tool, tmp_path)
    try:
        (o.pfs / "data").mkdir()
        (o.pfs / "data/f").write_bytes(b"f\n")
        (o.pfs / "valid").mkdir()
        (o.pfs / "a/b/c").mkdir(parents=True)
        o.start()
        assert sorted(os.listdir(o.pfs)) == ["a", "data", "valid"]
        assert os.listdir(o.pfs / "valid") == []
        assert os.listdir(o.pfs / "a/b/c") == []
        assert (o.pfs / "data/f").read_bytes() == b"f\n"
    finally:
        o.close()


def test_empty_directories_in_the_shared_tier(tool, tmp_path):
    """The copy has the empty directories (under data/), reads through it
    see them, and an empty directory added to the source makes another
    snapshot (so a copy made without it is never taken as this one)."""
    from test_shared_tier import node, shared
    tier = tmp_path / "pfs"
    tier.mkdir()
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "train/x.bin").write_bytes(b"y" * 3000)
    (src / "valid").mkdir()
    (src / "a/b").mkdir(parents=True)
    s = node(tool, tmp_path / "n", tier)
    m = None
    try:
        s.run("add", "ds", "file://%s/" % src, check=True)
        p, r = shared(s)
        assert p.returncode == 0, p.stderr
        d = Path(r["dir"])
        for e in ["valid", "a/b"]:
            assert (d / "data" / e).is_dir(), e
            assert os.listdir(d / "data" / e) == []
        assert (d / "data/train/x.bin").read_bytes() == b"y" * 3000
        m = mount(s, tool)
        ds = m.mnt / "datasets/ds"
        assert sorted(os.listdir(ds)) == ["a", "train", "valid"]
        assert os.listdir(ds / "valid") == [] and (ds / "a/b").is_dir()
        assert (ds / "train/x.bin").read_bytes() == b"y" * 3000
        (src / "test").mkdir()
        s.run("refresh", "ds", check=True)
        p, r2 = shared(s)
        assert p.returncode == 0, p.stderr
        assert r2["state"] == "published" and r2["dir"] != r["dir"]
        assert (Path(r2["dir"]) / "data/test").is_dir()
    finally:
        if m:
            m.cleanup()
        s.stop()


# ---- symbolic links ---------------------------------------------------------

def test_symlink_inside_skipped_by_default(snap):
    ls = listing(snap.ds)
    assert "link_in" not in ls and "link_dir" not in ls
    sk = snap.skipped()
    assert "symbolic link" in sk["link_in"], sk
    assert "symbolic link" in sk["link_dir"], sk


def test_symlink_inside_followed_with_inside(snap_inside):
    ds = snap_inside.ds
    assert (ds / "link_in").read_bytes() == b"x" * 5000
    assert stat.S_ISREG(os.lstat(ds / "link_in").st_mode)
    # a link to a directory is never followed (no loops)
    assert not os.path.lexists(ds / "link_dir")
    assert "a symbolic link to a directory" in \
        snap_inside.skipped()["link_dir"]


@pytest.mark.parametrize("which", ["snap", "snap_inside"])
def test_symlinks_out_of_the_tree_never_expose_outside_files(which, request):
    sn = request.getfixturevalue(which)
    ls = listing(sn.ds)
    for k in ["link_out", "link_abs", "link_outdir"]:
        assert k not in ls, k
        assert not os.path.lexists(sn.ds / k), k
        assert k in sn.skipped(), k
    for rel, kind in ls.items():
        if kind == "f" and not rel.startswith("deep"):
            assert SECRET not in (sn.ds / rel).read_bytes(), rel
    if which == "snap_inside":
        assert "leading outside the source" in sn.skipped()["link_out"]


@pytest.mark.parametrize("which", ["snap", "snap_inside"])
def test_dangling_symlink_skipped_and_counted(which, request):
    sn = request.getfixturevalue(which)
    assert not os.path.lexists(sn.ds / "link_dangling")
    why = sn.skipped()["link_dangling"]
    assert "symbolic link" in why, why
    if which == "snap_inside":
        assert "dangling" in why, why


# ---- special files, hard links -----------------------------------------------

def test_special_files_skipped_and_counted(snap):
    sk = snap.skipped()
    assert os.listdir(snap.ds / "specials") == []
    assert "a FIFO" in sk["specials/fifo"], sk
    assert "a socket" in sk["specials/sock"], sk
    assert "a character device" in sk["specials/null"], sk


def test_hard_links_are_two_files(snap):
    for k in ["hard1", "hard2"]:
        assert (snap.ds / k).read_bytes() == b"one inode, two names\n", k
        assert stat.S_ISREG(os.stat(snap.ds / k).st_mode)


def test_bad_keys_count_every_skip(snap):
    """Every skip of the rows above is one bad key of the dataset (stager
    show), each logged once with its key."""
    sk = snap.skipped()
    want = {"specials/fifo", "specials/sock", "specials/null", "link_in",
            "link_dir", "link_out", "link_abs", "link_outdir",
            "link_dangling", "new\\x0aline", ".dstage-tmp.mine"}
    assert want <= set(sk), sk
    assert len(sk) == len(want) + 2, sk  # and the long key, the deep one
    assert snap.bad_keys() == len(sk), sk


# ---- unreadable entries -------------------------------------------------------

def test_unreadable_entries_as_root_are_in_the_snapshot(snap):
    """Root reads a mode 000 file and directory: they are in the snapshot,
    readable through the mount (by root; the mount's own permission
    checks apply to other users)."""
    assert (snap.ds / "locked").read_bytes() == b"mode 000\n"
    assert (snap.ds / "lockdir/inner").read_bytes() == \
        b"behind a mode 000 directory\n"


def test_unreadable_entries_as_service_uid_skipped(tool, top, src, users):
    """A stager running as an unprivileged uid may not read a mode 000 file
    or directory: both are skipped at registration, logged and counted, and
    the rest of the tree is registered (the registration does not fail)."""
    svc = users.user("dsvc")
    uid, gid = users.uid(svc), users.gid(svc)
    d = top / "svc"
    d.mkdir()
    os.chown(d, uid, gid)
    sn = Snap(tool, d, prefix=users.prefix(svc))
    os.chown(sn.root, uid, gid)
    os.chown(sn.s.cfg, uid, gid)
    try:
        sn.s.start()
        p = sn.s.run("add", "ds", "file://%s/" % src)
        assert p.returncode == 0, (p.stderr, sn.s.log.read_text())
        sk = sn.skipped()
        assert "locked" in sk and "permission denied" in sk["locked"], sk
        assert "lockdir/" in sk and "permission denied" in sk["lockdir/"], sk
        assert sn.bad_keys() == len(sk)
        # The snapshot through a mount: /dev/fuse is root's here, so the
        # catalog is handed to root (dstagefs opens only its own).
        sn.s.stop()
        for p in [sn.root] + list(sn.root.rglob("*")):
            os.lchown(p, 0, 0)
        sn.m = mount(sn.s, tool)
        ls = listing(sn.m.mnt / "datasets" / "ds")
        assert "locked" not in ls and "lockdir" not in ls, sorted(ls)
        assert ls.get("valid") == "d" and ls.get("hard1") == "f"
        assert (sn.m.mnt / "datasets/ds/hard1").read_bytes() == \
            b"one inode, two names\n"
    finally:
        sn.close()


# ---- names ------------------------------------------------------------------

def test_names_keys_cannot_carry(snap):
    sk = snap.skipped()
    assert not os.path.lexists(snap.ds / "new\nline")
    assert "new\\x0aline" in sk, sk
    assert not any(k.startswith("d" * 200) and k.endswith("g" * 30)
                   for k in listing(snap.ds))
    assert any("key longer than 1024 bytes" in why for why in sk.values()), sk
    # Latin-1: not UTF-8, kept byte for byte
    p = os.path.join(os.fsencode(snap.ds), LATIN1)
    with open(p, "rb") as f:
        assert f.read() == b"latin-1\n"
    assert LATIN1 in os.listdir(os.fsencode(snap.ds))


def test_reserved_temporary_names_skipped_and_counted(snap):
    assert not os.path.lexists(snap.ds / ".dstage-tmp.mine")
    assert "temporary" in snap.skipped()[".dstage-tmp.mine"]


def test_nesting_deeper_than_256_skipped_and_counted(snap):
    sk = snap.skipped()
    deep = [k for k in sk if k.startswith("deep/")]
    assert len(deep) == 1 and "256" in sk[deep[0]], deep
    # deep/ is level 1: levels 1 to 255 below the root are listed, the
    # directory at level 256 is the one skipped
    assert deep[0] == "deep/" + "n/" * 255, len(deep[0])
    assert (snap.ds / deep[0]).parent.is_dir()
    assert not os.path.lexists(snap.ds / deep[0])


# ---- the overlay: what was a file, replaced underneath -------------------------

def test_overlay_never_opens_a_fifo_or_device_swapped_in(tool, tmp_path,
                                                         users):
    """A file the kernel has looked up through the overlay, replaced
    underneath by a FIFO or a device node (by anyone who may write its
    directory, on the tree itself), is never opened by dstagefs: the open,
    a create over the name and a truncate by path answer ESTALE, the
    kernel looks the name up again and does what the tree would do with
    what is there now (a FIFO: the caller's own pipe and wait; a device:
    refused, the mount is nodev). Before, a worker thread of dstagefs
    blocked in the FIFO's open until a writer came (a second uid could
    take every worker so), and the device was opened on the tree's file
    system, past the mount's nodev."""
    u = users.user("ovs")
    users.reach(tmp_path)
    o = Overlay(tool, tmp_path)
    # long enough that the kernel keeps the old entries for every step
    o.conf.write_text(o.conf.read_text().replace(
        "attr_timeout = %gs" % OVERLAY_TIMEOUT, "attr_timeout = 60s"))
    under = o.under
    names = ["fifo", "fifo2", "dev", "trunc"]
    for n in names:
        o.put(n, b"a regular file\n")
    procs = []
    try:
        o.start()
        for n in names:
            assert (o.pfs / n).read_bytes() == b"a regular file\n"
        with pytest.raises(FileNotFoundError):
            os.stat(o.pfs / "made")  # an absence the kernel keeps
        for n in ["fifo", "fifo2", "trunc"]:
            os.unlink(n, dir_fd=under)
            os.mkfifo(n, 0o666, dir_fd=under)
        os.mkfifo("made", 0o666, dir_fd=under)
        os.unlink("dev", dir_fd=under)
        os.mknod("dev", 0o666 | stat.S_IFCHR, os.makedev(1, 3),
                 dir_fd=under)

        def nobody_opened(n):
            """The tree's FIFO n has no reader: dstagefs did not open
            it (an O_WRONLY|O_NONBLOCK open finds none: ENXIO)."""
            try:
                os.close(os.open(n, os.O_WRONLY | os.O_NONBLOCK,
                                 dir_fd=under))
            except OSError as e:
                return e.errno == errno.ENXIO
            return False

        # a non-blocking open: the mount's own FIFO, at once
        fd = os.open(o.pfs / "fifo", os.O_RDONLY | os.O_NONBLOCK)
        try:
            assert stat.S_ISFIFO(os.fstat(fd).st_mode)
            assert os.read(fd, 10) == b""
            assert nobody_opened("fifo")
        finally:
            os.close(fd)
        # a blocking open by a second uid waits in its own pipe, and a
        # writer through the mount meets it there
        cat = users.popen(u, ["timeout", "30", "cat", o.pfs / "fifo2"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(cat)
        w = None
        end = time.monotonic() + 20
        while w is None and time.monotonic() < end:
            try:
                w = os.open(o.pfs / "fifo2", os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                assert e.errno == errno.ENXIO, e  # no reader there yet
                time.sleep(0.05)
        assert w is not None, "the reader never opened the mount's FIFO"
        try:
            assert nobody_opened("fifo2")
            os.write(w, b"through the mount's pipe\n")
        finally:
            os.close(w)
        out, err = cat.communicate(timeout=20)
        assert cat.returncode == 0 and out == b"through the mount's pipe\n", \
            (cat.returncode, err)
        # a device: refused (nodev), never opened by dstagefs
        with pytest.raises(PermissionError):
            os.open(o.pfs / "dev", os.O_RDONLY)
        assert stat.S_ISCHR(os.stat(o.pfs / "dev").st_mode)
        # a truncate by path: what the tree says of a FIFO (EINVAL)
        p = subprocess.run(
            ["timeout", "20", sys.executable, "-c",
             "import os, sys; os.truncate(sys.argv[1], 0)",
             str(o.pfs / "trunc")], capture_output=True, timeout=30)
        assert p.returncode == 1 and b"Invalid argument" in p.stderr, p
        # a create over a name that became a FIFO opens the FIFO, as on
        # the tree: the writer meets a reader through the mount
        sh = subprocess.Popen(
            ["timeout", "30", "sh", "-c", "echo created > '%s'"
             % (o.pfs / "made")], stderr=subprocess.PIPE)
        procs.append(sh)
        got, r = b"", None
        end = time.monotonic() + 20
        while got != b"created\n" and time.monotonic() < end:
            if r is None:
                try:
                    r = os.open(o.pfs / "made", os.O_RDONLY | os.O_NONBLOCK)
                except FileNotFoundError:
                    time.sleep(0.05)
                    continue
            try:
                got += os.read(r, 100)
            except BlockingIOError:
                pass
            time.sleep(0.02)
        if r is not None:
            os.close(r)
        assert got == b"created\n", (got, sh.poll())
        assert sh.wait(20) == 0
        # and dstagefs still answers
        assert (o.pfs / "fifo").exists() and os.listdir(o.pfs)
    finally:
        # release whatever waits in the tree's FIFOs (an O_RDWR open of a
        # FIFO never blocks and is both ends)
        for n in ["fifo", "fifo2", "trunc", "made"]:
            try:
                os.close(os.open(n, os.O_RDWR | os.O_NONBLOCK, dir_fd=under))
            except OSError:
                pass
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        o.close()
