"""A group-restricted dataset on a dstagefs mount, each guard on its own
path (fs/dsfs_datasets.c; issue 42): after a member's lookup the kernel
holds the names, so a non-member's stat and open reach dstagefs without a
lookup of their own. The stat must be refused by the per-caller getattr
check (finding 11: the dataset's files and directories have no attribute
timeout), and an open straight by path, with no stat before it, by the
open check alone, with FUSE passthrough and without (mutation
restricted-open in tests/mutations.txt)."""
import os
import shutil
import sys
import tempfile

import pytest

from test_dstagefs import Env
from test_passthrough import data_set, mount_on, stage

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

# Run as a test uid: argv[1] is "stat" or "open"; print what happened to
# each path in argv[2:] ("ok", or the errno's name), without any other
# system call on the path (os.open, then os.read on the descriptor).
PROBE = r"""
import errno, os, sys
for p in sys.argv[2:]:
    try:
        if sys.argv[1] == "stat":
            os.stat(p)
        else:
            fd = os.open(p, os.O_RDONLY)
            os.read(fd, 1)
            os.close(fd)
        print("ok")
    except OSError as e:
        print(errno.errorcode[e.errno])
"""


@pytest.fixture
def penv(tool):
    # Outside pytest's base directory: a pytest session starting elsewhere
    # resets /tmp/pytest-of-root to 0700, which would lock the test users
    # out of the mount midway (as in test_security.py).
    root = tempfile.mkdtemp(prefix="dstage-guards-")
    e = Env(tool, root)
    try:
        yield e
    finally:
        e.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def probe(users, user, what, paths):
    r = users.run(user, [sys.executable, "-c", PROBE, what] +
                  [str(p) for p in paths])
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().split()


def team(penv, users, passthrough):
    group = users.group("rgg")
    member = users.user("rgm", groups=[group])
    other = users.user("rgo")
    files = {"secret.bin": os.urandom(100000), "sub/b.txt": b"restricted\n"}
    src = data_set(penv, "team", files, group=group)
    for k in files:
        stage(penv, src, "team", k)
    users.reach(penv.tmp)
    os.chmod(penv.tmp, 0o755)
    if passthrough:
        m = mount_on(penv, opts=["-o", "allow_other"])
    else:
        m = penv.mount(opts=["-o", "allow_other", "-o", "nopassthrough"])
    d = m.mnt / "datasets" / "team"
    paths = [d / "secret.bin", d / "sub", d / "sub" / "b.txt"]
    # the member looks every name up (and reads): the kernel caches them
    assert probe(users, member, "stat", paths) == ["ok"] * 3
    files = [d / "secret.bin", d / "sub" / "b.txt"]
    assert probe(users, member, "open", files) == ["ok"] * 2
    return m, member, other, paths, files


def test_non_member_stat_after_member_lookup_refused(penv, users):
    """Finding 11: within entry_timeout of a member's lookup, a non-member
    stats the dataset's names: refused, each one."""
    m, member, other, paths, _ = team(penv, users, False)
    assert probe(users, other, "stat", paths) == ["EACCES"] * 3
    assert probe(users, member, "stat", paths) == ["ok"] * 3


@pytest.mark.parametrize("passthrough", [False, True],
                         ids=["normal", "passthrough"])
def test_non_member_open_without_stat_refused(penv, users, passthrough):
    """Right after a member's lookup and read, a non-member opens each file
    by path with no stat before it: EACCES from the open check; nothing
    passed through for it."""
    m, member, other, _, files = team(penv, users, passthrough)
    before = m.stats().get("fs_passthrough_opens", 0)
    assert probe(users, other, "open", files) == ["EACCES"] * 2
    assert m.stats().get("fs_passthrough_opens", 0) == before
    assert probe(users, member, "open", files) == ["ok"] * 2
