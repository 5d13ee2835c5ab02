# SPDX-License-Identifier: MIT
"""What a POSIX (file://) source's snapshot shows (issue 45; the table of
docs/catalog.md, "What a POSIX source's snapshot shows"): one source tree
holding every kind of entry a POSIX tree can hold, registered with a real
stager daemon (`stager add NAME file:///DIR/`) and read through a real
dstagefs mount (datasets/NAME/), one test a row. Each row is also checked
through the overlay (dstagefs --over a copy of the tree: the tree itself,
links as links, special files the kernel's, nothing skipped; what it
reaches as the caller only) and in the shared tier's copy (stager stage
--shared: exactly the snapshot, only directories and regular files, read
through a mount from the copy):

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
- directories nested deeper than 256 levels: skipped, counted;
- the overlay never opens a FIFO or a device put underneath in place of a
  file it served, and a directory swapped for a link leading out grants no
  more than the caller's rights.
"""
import errno
import hashlib
import json
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
from test_overlay import Overlay, adhoc
from test_shared_tier import shared
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


def mount(s, tool, name="mnt", opts=()):
    env = dict(s.env, DSTAGE_CONFIG=str(s.cfg), DSTAGE_LOG_LEVEL="info",
               DSTAGE_METRICS_LISTEN="127.0.0.1:%d" % free_port())
    return Dstagefs(tool("dstagefs"), s.root / name, env,
                    s.root / (name + ".log"), opts=opts).start()


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

    def add(self, src, tool, shared_copy=False, opts=()):
        """Register src as ds; with shared_copy, publish it into the
        shared tier (stager stage --shared: self.copy, its directory)
        before the mount (dstagefs opts), which then reads from that copy
        first."""
        self.s.start()
        self.s.run("add", "ds", "file://%s/" % src, check=True)
        if shared_copy:
            p, r = shared(self.s)
            assert p.returncode == 0, (p.stderr, self.s.log.read_text())
            assert r["state"] == "published", r
            self.copy = Path(r["dir"])
        self.m = mount(self.s, tool, opts=opts)
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
    for p in [d / "src/lockdir"] + list(d.glob("*/src/lockdir")):
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


@pytest.fixture(scope="module")
def ovl(tool, top, src):
    """The same tree (its own copy, top/ovl/src beside top/ovl/out, the
    outside file mode 0600) served by dstagefs --over, as root."""
    d = top / "ovl"
    d.mkdir()
    os.chmod(d, 0o755)
    o = Overlay(tool, d, pfs=d / "src")
    try:
        build_tree(d)
        os.chmod(d / "out/secret", 0o600)
        o.start()
        yield o
    finally:
        o.close()


# The files a snapshot of the tree keeps, listed in the tier trees'
# SHA256SUMS: a mount reads a file from the shared tier's copy only when
# the sums key gives its reference hash (docs/stager.md, "The shared
# tier"). link_in is a file of the snapshot only with "inside"; listed
# otherwise, it is a name the registration logs and skips.
SUMS = {b"data/train/x.bin": b"x" * 5000,
        b"link_in": b"x" * 5000,
        b"hard1": b"one inode, two names\n",
        b"hard2": b"one inode, two names\n",
        b"locked": b"mode 000\n",
        b"lockdir/inner": b"behind a mode 000 directory\n",
        LATIN1: b"latin-1\n"}


def tier_snap(tool, top, name, conf="", prefix=(), owner=None):
    """top/NAME: a tree (src, out) with a SHA256SUMS, a shared tier root
    (pfs, of owner: (uid, gid)) and a stager (n) whose tier root it is.
    Returns (Snap, src)."""
    d = top / name
    d.mkdir()
    os.chmod(d, 0o755)
    tree = build_tree(d)
    (tree / "SHA256SUMS").write_bytes(b"".join(
        b"%s  %s\n" % (hashlib.sha256(v).hexdigest().encode(), k)
        for k, v in SUMS.items()))
    (d / "pfs").mkdir(mode=0o755)
    if owner:
        os.chown(d / "pfs", *owner)
    sn = Snap(tool, d, conf="[sources]\nshared_tier_root = %s\n%s"
              % (d / "pfs", conf), prefix=prefix)
    return sn, tree


@pytest.fixture(scope="module")
def tier(tool, top, src):
    """The default configuration, its snapshot copied into the shared tier
    (tier.copy) and a mount reading from that copy first, every user's as
    deployed (-o allow_other)."""
    sn, tree = tier_snap(tool, top, "tier")
    try:
        yield sn.add(tree, tool, shared_copy=True,
                     opts=["-o", "allow_other"])
    finally:
        sn.close()


@pytest.fixture(scope="module")
def tier_inside(tool, top, src):
    """The same with sources.follow_symlinks = inside."""
    sn, tree = tier_snap(tool, top, "tier_inside",
                         conf="follow_symlinks = inside\n")
    try:
        yield sn.add(tree, tool, shared_copy=True)
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


def test_empty_directories_in_the_overlay(ovl):
    """The overlay serves the tree itself: its empty directories are there,
    empty; the one holding only special files shows them (the overlay
    skips nothing)."""
    m = ovl.pfs
    ls = listing(m)
    for d in ["valid", "a", "a/b", "a/b/c", "specials"]:
        assert ls.get(d) == "d", (d, sorted(ls))
    assert os.listdir(m / "valid") == [] and os.listdir(m / "a/b/c") == []
    assert sorted(os.listdir(m / "specials")) == ["fifo", "null", "sock"]
    assert {"a", "data", "valid"} <= set(os.listdir(m))
    assert (m / "data/train/x.bin").read_bytes() == b"x" * 5000


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


# ---- the overlay (dstagefs --over): the tree itself -------------------------

def has_reader(under, rel):
    """Whether the tree's FIFO rel (below the directory descriptor under)
    is open for reading: an O_WRONLY|O_NONBLOCK open finds a reader, or
    fails with ENXIO."""
    try:
        os.close(os.open(rel, os.O_WRONLY | os.O_NONBLOCK, dir_fd=under))
    except OSError as e:
        assert e.errno == errno.ENXIO, e
        return False
    return True


def fifo_meets_through_the_mount(fifo, under, rel, users, u):
    """A blocking open of the mount's FIFO by the uid u (cat) waits in a
    pipe of this node's kernel, where a writer through the mount meets it;
    meanwhile the tree's FIFO rel has no reader: dstagefs never opened it.
    Every wait bounded."""
    cat = users.popen(u, ["timeout", "30", "cat", fifo],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        w = None
        end = time.monotonic() + 20
        while w is None and time.monotonic() < end:
            try:
                w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                assert e.errno == errno.ENXIO, e  # no reader there yet
                time.sleep(0.05)
        assert w is not None, "the reader never opened the mount's FIFO"
        try:
            assert not has_reader(under, rel)
            os.write(w, b"through the mount's pipe\n")
        finally:
            os.close(w)
        out, err = cat.communicate(timeout=20)
        assert (cat.returncode, out) == (0, b"through the mount's pipe\n"), \
            err
    finally:
        if cat.poll() is None:
            cat.kill()
        cat.wait(10)


def test_symlinks_in_the_overlay_are_the_trees(ovl):
    """Every link is there as a link with its own text (readlink); the
    kernel follows it itself: one inside reads the target's node, one to a
    directory lists it, a dangling one is ENOENT. Nothing is skipped."""
    m = ovl.pfs
    want = {"link_in": "data/train/x.bin", "link_dir": "data",
            "link_dangling": "nowhere", "link_out": "../out/secret",
            "link_abs": str(ovl.tmp / "out/secret"),
            "link_outdir": "../out"}
    for k, text in want.items():
        assert stat.S_ISLNK(os.lstat(m / k).st_mode), k
        assert os.readlink(m / k) == text, k
    assert (m / "link_in").read_bytes() == b"x" * 5000
    assert os.stat(m / "link_in").st_ino == \
        os.stat(m / "data/train/x.bin").st_ino
    assert os.listdir(m / "link_dir") == ["train"]
    with pytest.raises(FileNotFoundError):
        (m / "link_dangling").read_bytes()


def test_symlinks_out_of_the_overlay_reach_only_what_the_caller_may(
        ovl, users):
    """A link leading out is followed by the kernel, with the caller's own
    rights, to the file outside the mount (another file system's inode,
    never read through dstagefs): root reads the 0600 outside file as it
    would directly, a second uid is refused it through every link as it
    is directly; dstagefs's cache holds none of its bytes."""
    m, out = ovl.pfs, ovl.tmp / "out"
    mdev = os.stat(m).st_dev
    real = os.stat(out / "secret")
    for k in ["link_out", "link_abs"]:
        st = os.stat(m / k)
        assert (st.st_dev, st.st_ino) == (real.st_dev, real.st_ino), k
        assert st.st_dev != mdev, k
        assert (m / k).read_bytes() == SECRET, k
    assert os.stat(m / "link_outdir").st_dev != mdev
    u = users.user("ovo")
    users.reach(m)
    for p in [m / "link_out", m / "link_abs", m / "link_outdir/secret",
              out / "secret"]:
        r = users.run(u, ["cat", p])
        assert r.returncode != 0 and b"Permission denied" in r.stderr, \
            (p, r)
    r = users.run(u, ["ls", m / "link_outdir"])  # out/ is 0755: as directly
    assert r.returncode == 0 and r.stdout.split() == [b"secret"], r
    for p in (ovl.tmp / "cache").rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert SECRET not in p.read_bytes(), p


def test_special_files_in_the_overlay(ovl, users):
    """FIFOs, sockets and devices show as what they are and are the
    kernel's: a FIFO opened through the mount is the node's own pipe
    (dstagefs never opens the tree's, so no reader or writer can hang it);
    a device cannot be opened (nodev, even by root); a socket cannot be
    connected to."""
    m = ovl.pfs / "specials"
    assert sorted(os.listdir(m)) == ["fifo", "null", "sock"]
    assert stat.S_ISFIFO(os.lstat(m / "fifo").st_mode)
    assert stat.S_ISSOCK(os.lstat(m / "sock").st_mode)
    st = os.lstat(m / "null")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    with open("/proc/self/mountinfo") as f:
        opts = [ln.split()[5] for ln in f if ln.split()[4] == str(ovl.pfs)]
    assert opts and "nodev" in opts[-1].split(","), opts
    with pytest.raises(PermissionError):
        os.open(m / "null", os.O_RDONLY)
    with pytest.raises(PermissionError):
        os.open(m / "null", os.O_WRONLY)
    # non-blocking ends meet in the mount's pipe, not the tree's FIFO
    r = os.open(m / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        w = os.open(m / "fifo", os.O_WRONLY | os.O_NONBLOCK)
        os.write(w, b"pipe")
        os.close(w)
        assert os.read(r, 10) == b"pipe"
        assert not has_reader(ovl.under, "specials/fifo")
    finally:
        os.close(r)
    u = users.user("ovf")
    users.reach(m)
    fifo_meets_through_the_mount(m / "fifo", ovl.under, "specials/fifo",
                                 users, u)
    with socket.socket(socket.AF_UNIX) as s:
        with pytest.raises(ConnectionRefusedError):
            s.connect(str(m / "sock"))
    assert (ovl.pfs / "hard1").read_bytes() == b"one inode, two names\n"
    # prewarming the tree (stager stage PATH) reads its regular files
    # only: no special file opened, no link followed
    regular = [p for p in kinds(ovl.pfs).items() if p[1] == "f"]
    r = adhoc(ovl, "stage", ovl.pfs, "--json")
    assert r.returncode == 0, r
    res = json.loads(r.stdout)
    assert (res["files"], res["errors"]) == (len(regular), 0), \
        (res, sorted(regular))


def test_hard_links_in_the_overlay(ovl):
    """Both names read the content; the tree's link count shows (each name
    is a node of its own); no new hard link through the mount (EROFS)."""
    for k in ["hard1", "hard2"]:
        st = os.stat(ovl.pfs / k)
        assert stat.S_ISREG(st.st_mode) and st.st_nlink == 2, k
        assert (ovl.pfs / k).read_bytes() == b"one inode, two names\n", k
    with pytest.raises(OSError) as e:
        os.link(ovl.pfs / "hard1", ovl.pfs / "hard3")
    assert e.value.errno == errno.EROFS
    assert not os.path.lexists(ovl.pfs / "hard3")


def test_unreadable_entries_in_the_overlay(ovl, users):
    """dstagefs acts as the caller: root reads the mode 000 file and the
    file behind the mode 000 directory; a second uid is refused both, and
    the directory's listing, as on the tree; their modes show as they
    are."""
    m = ovl.pfs
    assert os.stat(m / "locked").st_mode & 0o7777 == 0
    assert os.stat(m / "lockdir").st_mode & 0o7777 == 0
    assert (m / "locked").read_bytes() == b"mode 000\n"
    assert (m / "lockdir/inner").read_bytes() == \
        b"behind a mode 000 directory\n"
    assert os.listdir(m / "lockdir") == ["inner"]
    u = users.user("ovu")
    users.reach(m)
    for cmd in (["cat", m / "locked"], ["cat", m / "lockdir/inner"],
                ["ls", m / "lockdir"]):
        r = users.run(u, cmd)
        assert r.returncode != 0 and b"Permission denied" in r.stderr, \
            (cmd, r)
    r = users.run(u, ["cat", m / "hard1"])
    assert r.returncode == 0 and r.stdout == b"one inode, two names\n", r


def test_names_in_the_overlay(ovl):
    """Names no key can carry are the tree's names: a newline, a path over
    1,024 bytes, Latin-1 byte for byte, dstage's temporary-file prefix
    (the overlay writes no file of its own into the tree)."""
    m = ovl.pfs
    assert "new\nline" in os.listdir(m)
    assert (m / "new\nline").read_bytes() == b"newline\n"
    assert len(os.fsencode(LONG)) > 1024
    assert (m / LONG).read_bytes() == b"too long a key\n"
    assert LATIN1 in os.listdir(os.fsencode(m))
    with open(os.path.join(os.fsencode(m), LATIN1), "rb") as f:
        assert f.read() == b"latin-1\n"
    assert (m / ".dstage-tmp.mine").read_bytes() == b"a reserved name\n"


def test_nesting_in_the_overlay(ovl):
    """All 300 levels below deep/ are there, and the file at the bottom."""
    fd = os.open(ovl.pfs / "deep", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(DEEP):
            assert os.listdir(fd) == ["n"]
            nfd = os.open("n", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        assert os.listdir(fd) == ["f"]
        assert stat.S_ISREG(os.stat("f", dir_fd=fd).st_mode)
    finally:
        os.close(fd)


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
    os.mkdir("sticky", dir_fd=under)
    os.chmod("sticky", 0o1777, dir_fd=under)
    procs = []
    try:
        o.start()
        for n in names:
            assert (o.pfs / n).read_bytes() == b"a regular file\n"
        for n in ["made", "planted", "planted2", "sticky/planted"]:
            with pytest.raises(FileNotFoundError):
                os.stat(o.pfs / n)  # an absence the kernel keeps
        # a create over a regular file made underneath since: that file,
        # as on the tree (O_TRUNC applies; O_EXCL is refused)
        for n in ["planted", "planted2", "sticky/planted"]:
            o.put(n, b"planted underneath\n", 0o666)
        os.chown("sticky/planted", 65534, 65534, dir_fd=under)
        with open(o.pfs / "planted", "wb") as f:
            f.write(b"created over it\n")
        assert o.get("planted") == b"created over it\n"
        with pytest.raises(FileExistsError):
            os.open(o.pfs / "planted2", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open("/proc/sys/fs/protected_regular") as f:
            protected = int(f.read()) > 0
        if protected:
            # the kernel's protected_regular still applies to the caller:
            # another uid's file in a sticky directory is not opened
            r = users.run(u, ["sh", "-c", "echo x > '%s'"
                              % (o.pfs / "sticky/planted")])
            assert r.returncode != 0 and b"Permission denied" in r.stderr, r
            assert o.get("sticky/planted") == b"planted underneath\n"
        for n in ["fifo", "fifo2", "trunc"]:
            os.unlink(n, dir_fd=under)
            os.mkfifo(n, 0o666, dir_fd=under)
        os.mkfifo("made", 0o666, dir_fd=under)
        os.unlink("dev", dir_fd=under)
        os.mknod("dev", 0o666 | stat.S_IFCHR, os.makedev(1, 3),
                 dir_fd=under)

        # a non-blocking open: the mount's own FIFO, at once
        fd = os.open(o.pfs / "fifo", os.O_RDONLY | os.O_NONBLOCK)
        try:
            assert stat.S_ISFIFO(os.fstat(fd).st_mode)
            assert os.read(fd, 10) == b""
            assert not has_reader(under, "fifo")
        finally:
            os.close(fd)
        # a blocking open by a second uid waits in its own pipe, and a
        # writer through the mount meets it there
        fifo_meets_through_the_mount(o.pfs / "fifo2", under, "fifo2", users,
                                     u)
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


def test_overlay_directory_swapped_for_a_link_out_grants_no_more(
        tool, tmp_path, users):
    """A directory the kernel has looked up, replaced underneath by a link
    leading out of the tree: dstagefs's calls below it (made as the
    caller) follow the link, so they reach the outside with the caller's
    rights only, as the tree would: a second uid is refused the 0600
    outside file through it, and reads the 0644 one it could read
    directly anyway."""
    u = users.user("ovd")
    users.reach(tmp_path)
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    (out / "secret").write_bytes(SECRET)
    os.chmod(out / "secret", 0o600)
    (out / "open").write_bytes(b"outside, world-readable\n")
    os.chmod(out / "open", 0o644)
    o = Overlay(tool, tmp_path)
    o.conf.write_text(o.conf.read_text().replace(
        "attr_timeout = %gs" % OVERLAY_TIMEOUT, "attr_timeout = 60s"))
    os.mkdir("sub", 0o755, dir_fd=o.under)
    o.put("sub/f", b"inside\n")
    try:
        o.start()
        assert (o.pfs / "sub/f").read_bytes() == b"inside\n"
        os.rename("sub", "sub.old", src_dir_fd=o.under, dst_dir_fd=o.under)
        os.symlink("../out", "sub", dir_fd=o.under)
        # served by dstagefs below the kernel's old directory node
        assert os.stat(o.pfs / "sub/open").st_dev == os.stat(o.pfs).st_dev
        r = users.run(u, ["cat", o.pfs / "sub/secret"])
        assert r.returncode != 0 and b"Permission denied" in r.stderr, r
        r = users.run(u, ["cat", out / "secret"])
        assert r.returncode != 0 and b"Permission denied" in r.stderr, r
        r = users.run(u, ["cat", o.pfs / "sub/open"])
        assert r.returncode == 0 and \
            r.stdout == b"outside, world-readable\n", r
    finally:
        o.close()


# ---- the shared tier's copy (stager stage --shared) -------------------------

def kinds(root):
    """{relative path: 'd', 'f', or ls's letter for another type} of
    everything under root, links not followed."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            mode = os.lstat(p).st_mode
            out[os.path.normpath(os.path.relpath(p, root))] = \
                "d" if stat.S_ISDIR(mode) else \
                "f" if stat.S_ISREG(mode) else stat.filemode(mode)[0]
    return out


def manifest(copy):
    """The copy's MANIFEST: {key (bytes): SHA-256 (hex)}."""
    lines = (copy / "MANIFEST").read_bytes().split(b"\n")
    assert lines[0] == b"dstage-shared-tier 1", lines[:5]
    return {ln.split(b" ", 3)[3]: ln.split(b" ", 1)[0].decode()
            for ln in lines[5:] if ln}


def read_from_the_copy(sn, rel):
    """rel's bytes through sn's mount, checked to come from the shared
    tier's copy (dstagefs's tier_reads grows)."""
    before = sn.m.stats()["tier_reads"]
    data = (sn.ds / rel).read_bytes()
    assert sn.m.stats()["tier_reads"] > before, rel
    return data


@pytest.mark.parametrize("which", ["tier", "tier_inside"])
def test_the_shared_tier_copy_is_the_snapshot(which, request):
    """The copy under data/ is exactly what the mount shows: the same
    directories (the empty ones too) and files, nothing but directories
    and regular files (no link, FIFO, socket or device: each skipped entry
    is absent), every file in the MANIFEST with its SHA-256, none holding
    the outside file's bytes."""
    sn = request.getfixturevalue(which)
    data = sn.copy / "data"
    k = kinds(data)
    assert set(k.values()) <= {"d", "f"}, \
        sorted(r for r, v in k.items() if v not in "df")
    assert k == listing(sn.ds)
    man = manifest(sn.copy)
    files = {os.fsencode(r) for r, v in k.items() if v == "f"}
    assert set(man) == files
    for key in files:
        with open(os.path.join(os.fsencode(data), key), "rb") as f:
            b = f.read()
        assert hashlib.sha256(b).hexdigest() == man[key], key
        assert SECRET not in b, key


@pytest.mark.parametrize("which", ["tier", "tier_inside"])
def test_symlinks_in_the_shared_tier(which, request):
    """No link is copied and nothing is copied from outside the tree; with
    sources.follow_symlinks = inside the link to a file inside is a
    regular file of the copy with the target's bytes, read through the
    mount from the copy."""
    sn = request.getfixturevalue(which)
    data = sn.copy / "data"
    for k in ["link_dir", "link_out", "link_abs", "link_outdir",
              "link_dangling"]:
        assert not os.path.lexists(data / k), k
        assert not os.path.lexists(sn.ds / k), k
    assert not any(k.startswith("out") or "secret" in k
                   for k in kinds(data))
    if which == "tier_inside":
        assert stat.S_ISREG(os.lstat(data / "link_in").st_mode)
        assert (data / "link_in").read_bytes() == b"x" * 5000
        assert read_from_the_copy(sn, "link_in") == b"x" * 5000
    else:
        assert not os.path.lexists(data / "link_in")
        assert not os.path.lexists(sn.ds / "link_in")


def test_special_files_in_the_shared_tier(tier):
    """The directory that held only a FIFO, a socket and a device is an
    empty directory of the copy (and of the mount); none of them is
    anywhere in the copy."""
    data = tier.copy / "data"
    assert (data / "specials").is_dir()
    assert os.listdir(data / "specials") == []
    assert os.listdir(tier.ds / "specials") == []
    assert set(kinds(tier.copy).values()) <= {"d", "f"}


def test_hard_links_in_the_shared_tier(tier):
    """Two names of one inode are two files of the copy, each with the
    content (two inodes: the copy links nothing), read from the copy."""
    data = tier.copy / "data"
    a, b = os.lstat(data / "hard1"), os.lstat(data / "hard2")
    assert stat.S_ISREG(a.st_mode) and stat.S_ISREG(b.st_mode)
    assert a.st_nlink == b.st_nlink == 1 and a.st_ino != b.st_ino
    for k in ["hard1", "hard2"]:
        assert (data / k).read_bytes() == b"one inode, two names\n", k
        assert read_from_the_copy(tier, k) == b"one inode, two names\n", k


def test_unreadable_entries_as_root_in_the_shared_tier(tier, users):
    """Root's snapshot has the mode 000 file and the file behind the mode
    000 directory: so has the copy, read from there through the mount.
    The copy grants a second uid nothing the mount does not: a dataset
    without a group is every user's through an allow_other mount (files
    0444), as in the copy (0644 files, 0755 directories); one restricted
    to a group is never copied (docs/stager.md)."""
    data = tier.copy / "data"
    want = {"locked": b"mode 000\n",
            "lockdir/inner": b"behind a mode 000 directory\n"}
    for k, v in want.items():
        assert (data / k).read_bytes() == v, k
        assert read_from_the_copy(tier, k) == v, k
    u = users.user("tiu")
    users.reach(data)  # and the mount's parents, top's
    for k in want:
        via_copy = users.run(u, ["cat", data / k])
        via_mount = users.run(u, ["cat", tier.ds / k])
        assert via_copy.returncode == via_mount.returncode == 0, \
            (k, via_copy, via_mount)


def test_unreadable_entries_as_service_uid_in_the_shared_tier(tool, top,
                                                              users):
    """A stager running as an unprivileged uid skips the mode 000 file and
    directory: its copy in the shared tier (the tier's root that uid's)
    has neither, nor its MANIFEST, and a mount reading from the copy does
    not show them; the rest is copied and read from there."""
    svc = users.user("tsvc")
    uid, gid = users.uid(svc), users.gid(svc)
    sn, tree = tier_snap(tool, top, "tier_svc", prefix=users.prefix(svc),
                         owner=(uid, gid))
    os.chown(sn.root, uid, gid)
    os.chown(sn.s.cfg, uid, gid)
    try:
        sn.s.start()
        p = sn.s.run("add", "ds", "file://%s/" % tree)
        assert p.returncode == 0, (p.stderr, sn.s.log.read_text())
        assert {"locked", "lockdir/"} <= set(sn.skipped())
        p, r = shared(sn.s)
        assert p.returncode == 0, (p.stderr, sn.s.log.read_text())
        copy = Path(r["dir"])
        data = copy / "data"
        assert not os.path.lexists(data / "locked")
        assert not os.path.lexists(data / "lockdir")
        man = manifest(copy)
        assert not any(k in (b"locked", b"lockdir/inner") for k in man), \
            sorted(man)
        assert (data / "hard1").read_bytes() == b"one inode, two names\n"
        assert os.stat(data / "hard1").st_uid == uid
        # Through a mount: root's (see above), the tier handed to root
        # too (a reader trusts a tier of its own uid or root's).
        sn.s.stop()
        for p in [sn.root, top / "tier_svc/pfs"] + \
                list(sn.root.rglob("*")) + \
                list((top / "tier_svc/pfs").rglob("*")):
            os.lchown(p, 0, 0)
        sn.m = mount(sn.s, tool)
        sn.ds = sn.m.mnt / "datasets" / "ds"
        ls = listing(sn.ds)
        assert "locked" not in ls and "lockdir" not in ls, sorted(ls)
        assert read_from_the_copy(sn, "hard1") == b"one inode, two names\n"
    finally:
        sn.close()


def test_names_in_the_shared_tier(tier):
    """No name a key cannot carry is copied (a newline, a path over 1,024
    bytes: its directories up to 1,024 bytes are, the last one empty); a
    Latin-1 name is copied byte for byte, in data/ and in the MANIFEST,
    and read from the copy."""
    data = tier.copy / "data"
    assert not os.path.lexists(data / "new\nline")
    man = manifest(tier.copy)
    assert all(b"\n" not in k and len(k) <= 1024 for k in man), sorted(man)
    d = data / "/".join(["d" * 200] * 5)
    assert d.is_dir() and os.listdir(d) == []
    assert LATIN1 in man
    assert LATIN1 in os.listdir(os.fsencode(data))
    with open(os.path.join(os.fsencode(data), LATIN1), "rb") as f:
        assert f.read() == b"latin-1\n"
    assert read_from_the_copy(tier, os.fsdecode(LATIN1)) == b"latin-1\n"


def test_reserved_temporary_names_in_the_shared_tier(tier):
    """The source's .dstage-tmp.mine is not copied, and the copy keeps
    no temporary file (nor lease) of its own."""
    assert not os.path.lexists(tier.copy / "data/.dstage-tmp.mine")
    assert not [k for k in kinds(tier.copy)
                if os.path.basename(k).startswith(".dstage-tmp.")]
    assert not os.path.lexists(tier.copy / ".lease")


def test_nesting_in_the_shared_tier(tier):
    """The copy has the snapshot's 255 levels below the root (the last one
    empty: the level-256 directory was skipped) and nothing deeper."""
    last = "deep/" + "/".join(["n"] * 254)
    for root in (tier.copy / "data", tier.ds):
        assert (root / last).is_dir(), root
        assert os.listdir(root / last) == [], root
