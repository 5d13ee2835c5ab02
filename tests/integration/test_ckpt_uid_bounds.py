"""Per-uid bounds on checkpoint staging (issue 34):
checkpoints.uid_staging_size (bytes: file SIZES, a sparse ftruncate counts
its whole size) and checkpoints.uid_files (local copies, empty ones
included), per uid (the file's creator), abandoned files included; past
either, EDQUOT and a log line naming the uid, the option and the value.
Run as root with two throwaway unprivileged users (the `users` fixture)
on one mount with allow_other; a directory store (file://).
"""
import os
import signal
import time

import pytest

from test_checkpoints import Ckpt, DirStore, wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

MB = 1 << 20

# One operation as another user: prints OK or the errno's name.
#   trunc PATH SIZE       create, ftruncate to SIZE, close
#   write PATH N          create, write N bytes, close
#   touch PATH            create an empty file
#   hold PATH SIZE N      create, ftruncate to SIZE, write N bytes at 0,
#                         print the result, then keep it open (until killed)
OP = r'''
import errno, os, sys, time
op, a = sys.argv[1], sys.argv[2:]
try:
    fd = os.open(a[0], os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        if op in ("trunc", "hold"):
            os.ftruncate(fd, int(a[1]))
        left = int(a[1]) if op == "write" else int(a[2]) if op == "hold" \
            else 0
        while left > 0:             # a short write is no error: go on
            left -= os.write(fd, b"w" * min(left, 1 << 20))
    finally:
        if op != "hold":
            os.close(fd)
    print("OK", flush=True)
except OSError as e:
    print(errno.errorcode[e.errno], flush=True)
if op == "hold":
    time.sleep(600)
'''


def op(users, user, *args):
    p = users.run(user, ["/usr/bin/python3", "-c", OP] + list(args))
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode().strip()


def hold(users, user, *args):
    p = users.popen(user, ["/usr/bin/python3", "-c", OP, "hold"] +
                    list(args), stdout=-1, stderr=-1)
    return p, p.stdout.readline().decode().strip()


@pytest.fixture
def bounded(tool, tmp_path, users):
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"),
             staging_size="64M",
             conf="uid_staging_size = 16M\nuid_files = 5\n",
             opts=["-o", "allow_other,umask=000"])
    users.reach(m.tmp)
    m.start()
    try:
        yield m
    finally:
        m.stop()


def test_sparse_ftruncate_past_uid_bound(bounded, users):
    m = bounded
    a, b = users.user("cqa"), users.user("cqb")
    ua = users.uid(a)
    (m.ck / "a").mkdir(mode=0o777)
    (m.ck / "b").mkdir(mode=0o777)
    os.chmod(m.ck / "a", 0o777)
    os.chmod(m.ck / "b", 0o777)
    # the attack: a sparse file of the whole staging_size, held open
    p, got = hold(users, a, m.ck / "a" / "big", 64 * MB, 0)
    try:
        assert got == "EDQUOT"
        assert ("uid %d reached checkpoints.uid_staging_size (%d bytes"
                % (ua, 16 * MB)) in m.log_text()
    finally:
        p.kill()
        p.wait()
    # at the bound: allowed, and counted by size, not blocks on disk
    p, got = hold(users, a, m.ck / "a" / "sparse", 16 * MB, 0)
    try:
        assert got == "OK"
        assert os.stat(m.staging / "tree" / "a" / "sparse").st_blocks == 0
        assert op(users, a, "write", m.ck / "a" / "one", 1) == "EDQUOT"
        # B is not blocked by A
        assert op(users, b, "write", m.ck / "b" / "w", 12 * MB) == "OK"
        assert os.path.getsize(m.store.root / "b" / "w") == 12 * MB
    finally:
        p.kill()
        p.wait()


def test_uid_file_count_bound(bounded, users):
    m = bounded
    a, b = users.user("cqa"), users.user("cqb")
    ua = users.uid(a)
    (m.ck / "d").mkdir()
    os.chmod(m.ck / "d", 0o777)
    for i in range(5):
        assert op(users, a, "trunc", m.ck / "d" / ("e%d" % i), 0) == "OK"
    assert op(users, a, "trunc", m.ck / "d" / "e5", 0) == "EDQUOT"
    assert ("uid %d reached checkpoints.uid_files (5 files" % ua) in \
        m.log_text()
    assert op(users, b, "trunc", m.ck / "d" / "b0", 0) == "OK"
    os.unlink(m.ck / "d" / "e0")
    assert op(users, a, "trunc", m.ck / "d" / "e5", 0) == "OK"


def test_abandoned_files_still_count(bounded, users):
    m = bounded
    a = users.user("cqa")
    ua = users.uid(a)
    (m.ck / "a").mkdir()
    os.chmod(m.ck / "a", 0o777)
    # a writer killed before its close: its file goes to abandoned/
    p, got = hold(users, a, m.ck / "a" / "killed", 0, 12 * MB)
    assert got == "OK"
    p.send_signal(signal.SIGKILL)
    p.wait()
    ab = m.staging / "abandoned"
    wait_for(lambda: os.listdir(ab), 20, "the abandoned file")
    (name,) = os.listdir(ab)
    assert os.stat(ab / name).st_uid == ua
    # still A's: 12 + 8 MB pass A's 16 MB
    assert op(users, a, "write", m.ck / "a" / "next", 8 * MB) == "EDQUOT"
    # removed (gc, or by hand): counted no more after a retry interval
    os.unlink(ab / name)
    time.sleep(2.5)
    assert op(users, a, "write", m.ck / "a" / "next", 8 * MB) == "OK"
