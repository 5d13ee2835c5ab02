"""Security tests across components (issue 12): what a local user without
privileges can reach of the files dstage creates.

Each test runs a real stager daemon and a real dstagefs mount (allow_other)
over one config, catalog and cache, then looks at every file and directory
they created, as root (modes) and as a second, unprivileged uid outside the
admin group and outside the dataset's group (what it can open). Component
tests (test_cache.py, test_stager.py, test_dstagefs.py, test_sources.py)
test each guard on its own paths; these test the class: every file.
"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from test_dstagefs import Dstagefs
from test_stager import Stager, make_dataset

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

# A script run as the unprivileged uid: which of the paths on stdin it can
# open for reading (or list, for directories). Prints them, one a line.
PROBE = r"""
import os, sys
for p in sys.stdin.read().split("\0"):
    if not p:
        continue
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))
        print(p)
    except OSError:
        pass
"""


class Node:
    """A daemon and a mount sharing a config, catalog and cache under root,
    with one group-restricted dataset staged and read."""

    def __init__(self, tool, root, users):
        self.root = Path(root)
        self.users = users
        os.chmod(self.root, 0o755)
        users.reach(self.root)
        self.group = users.group("dsg")
        self.member = users.user("dsm", groups=[self.group])
        self.other = users.user("dso")
        self.src = self.root / "src"
        make_dataset(self.src, {"a.bin": os.urandom(5 << 20),
                                "sub/b.txt": b"restricted\n"})
        self.daemon = Stager(tool("stager"), self.root)
        self.fs_exe = tool("dstagefs")
        self.mount = None

    def start(self):
        self.daemon.start()
        env = dict(self.daemon.env, DSTAGE_CONFIG=str(self.daemon.cfg))
        self.mount = Dstagefs(self.fs_exe, self.root / "mnt", env,
                              self.root / "mnt.log", ["-o", "allow_other"])
        self.mount.start()
        return self

    def stop(self):
        if self.mount:
            self.mount.cleanup()
            self.mount = None
        self.daemon.stop()

    def created(self):
        """Every path the daemon and the mount created (not the test's own
        config, logs, source tree or mount point)."""
        skip = {self.daemon.cfg, self.daemon.log, self.root / "mnt",
                self.root / "mnt.log", self.src}
        out = []
        for dirpath, dirs, files in os.walk(self.root):
            d = Path(dirpath)
            dirs[:] = [x for x in dirs if d / x not in skip]
            for name in dirs + files:
                p = d / name
                if p not in skip:
                    out.append(p)
        return out

    def openable_by(self, user, paths):
        p = self.users.run(user, [sys.executable, "-c", PROBE],
                           input="\0".join(str(x) for x in paths).encode())
        assert p.returncode == 0, p.stderr
        return [x for x in p.stdout.decode().splitlines() if x]


@pytest.fixture
def node(tool, users):
    # Outside pytest's base directory: a pytest session starting elsewhere
    # resets /tmp/pytest-of-root to 0700, which would lock the test users
    # out of the mount midway.
    root = tempfile.mkdtemp(prefix="dstage-security-")
    n = Node(tool, root, users)
    try:
        yield n
    finally:
        n.stop()
        shutil.rmtree(root, ignore_errors=True)


def stage_and_read(n):
    if not any(d["name"] == "team" for d in n.daemon.json("list")):
        n.daemon.run("add", "team", "file://%s/" % n.src, "--group",
                     n.group, check=True)
    n.daemon.run("stage", "team", "--wait", check=True)
    f = n.mount.mnt / "datasets" / "team" / "sub" / "b.txt"
    # A mount started next to a busy daemon may list the dataset only at
    # its next catalog poll: give it 30 s, then the member must read it.
    for _ in range(60):
        r = n.users.run(n.member, ["cat", f])
        if r.returncode == 0:
            break
        time.sleep(0.5)
    assert r.returncode == 0 and r.stdout == b"restricted\n", r.stderr
    r = n.users.run(n.other, ["cat", f])
    assert r.returncode != 0


def check_private(n):
    """Every created file: nothing for others, nothing writable by the
    group; the cache and its subdirectories 0700, its files 0600; the
    catalog's files 0600 or 0640. Returns the paths checked."""
    paths = n.created()
    assert paths, "the daemon and the mount created nothing?"
    cache = n.root / "cache"
    bad = []
    for p in paths:
        st = os.lstat(p)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISSOCK(st.st_mode):
            # The socket answers read-only requests to every local user
            # (docs/security.md): connecting needs write permission only.
            if mode & 0o155:
                bad.append((p, oct(mode)))
            continue
        if st.st_uid != os.geteuid():
            bad.append((p, "owned by uid %d" % st.st_uid))
        if p == cache or cache in p.parents:
            if mode & 0o077:
                bad.append((p, oct(mode)))
        elif mode & 0o027:
            bad.append((p, oct(mode)))
    assert not bad, "created with modes wider than needed: %s" % bad
    return paths


def test_every_created_file_is_private(node):
    node.start()
    stage_and_read(node)
    paths = check_private(node)
    # The class, from the other side: the second uid opens none of them
    # (the socket aside: connecting is not opening).
    files = [p for p in paths if not stat.S_ISSOCK(os.lstat(p).st_mode)]
    assert any((node.root / "cache") in p.parents for p in files)
    assert any(p.name.startswith("catalog.db") for p in files)
    got = node.openable_by(node.other, files)
    assert got == [], "a second uid opened: %s" % got
    got = node.openable_by(node.member, files)
    assert got == [], "a dataset member opened the cache directly: %s" % got


def test_loose_modes_tightened_at_start(node):
    node.start()
    stage_and_read(node)
    node.stop()
    # An older release (or an admin's chmod -R) left everything readable.
    loosened = []
    for p in node.created():
        st = os.lstat(p)
        if stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode):
            continue
        os.chmod(p, 0o755 if stat.S_ISDIR(st.st_mode) else 0o644)
        loosened.append(p)
    assert node.openable_by(node.other, loosened)
    node.start()
    stage_and_read(node)
    check_private(node)
    got = node.openable_by(node.other, loosened)
    assert got == [], "still readable after a restart: %s" % got
    logs = node.daemon.log.read_text() + node.mount.log_text()
    assert "tighten" in logs.lower(), logs[-4000:]


@pytest.mark.parametrize("what", ["cache", "catalog", "socket"])
def test_directory_writable_by_others_refused(node, what):
    """cache.dir, the catalog's directory and daemon.socket's directory are
    refused at start when others can write them; the message names the
    path and the fix."""
    d = node.root / ("d-" + what)
    d.mkdir()
    os.chmod(d, 0o777)
    cfg = node.daemon.cfg.read_text()
    if what == "cache":
        cfg = cfg.replace("dir = %s/cache" % node.root, "dir = %s" % d)
    elif what == "catalog":
        cfg = cfg.replace("path = %s/catalog.db" % node.root,
                          "path = %s/catalog.db" % d)
    else:
        cfg = cfg.replace("socket = %s" % node.daemon.sock,
                          "socket = %s/stager.sock" % d)
    node.daemon.cfg.write_text(cfg)
    p = subprocess.run([node.daemon.exe, "--config", str(node.daemon.cfg),
                        "daemon"], env=node.daemon.env, capture_output=True,
                       timeout=20)
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0, err
    assert str(d) in err, err
    assert "chmod" in err or "writable" in err, err
