"""Per-uid bounds on checkpoint staging (issue 34):
checkpoints.uid_staging_size (bytes: file SIZES, a sparse ftruncate counts
its whole size) and checkpoints.uid_files (local copies, empty ones
included), per uid (the file's creator), abandoned files included; past
either, EDQUOT and a log line naming the uid, the option and the value.
checkpoints.uid_open_files: the files one uid (the opener) holds open in
dstagefs; past it, an open or a create gets EDQUOT, logged the same way.
checkpoints.uid_store_size: the bytes of one uid's files in the store as
this node knows them (published through it, and being written); past it a
write or a truncate gets EDQUOT, logged the same way.
Run as root with two throwaway unprivileged users (the `users` fixture)
on one mount with allow_other; a directory store (file://).
"""
import os
import signal
import sqlite3
import time

import pytest

from test_checkpoints import Ckpt, DirStore, store
from waits import wait_for  # noqa: F401

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

MB = 1 << 20

# One operation as another user: prints OK or the errno's name.
#   trunc PATH SIZE       create, ftruncate to SIZE, close
#   write PATH N          create, write N bytes, close
#   touch PATH            create an empty file
#   hold PATH SIZE N      create, ftruncate to SIZE, write N bytes at 0,
#                         print the result, then keep it open (until killed)
#   rewrite PATH N        open with O_TRUNC (or create), write N bytes, close
#   rm PATH               unlink
OP = r'''
import errno, os, sys, time
op, a = sys.argv[1], sys.argv[2:]
try:
    if op == "rm":
        os.unlink(a[0])
        print("OK", flush=True)
        sys.exit(0)
    fd = os.open(a[0], os.O_WRONLY | os.O_CREAT |
                 (os.O_TRUNC if op == "rewrite" else 0), 0o600)
    try:
        if op in ("trunc", "hold"):
            os.ftruncate(fd, int(a[1]))
        left = int(a[1]) if op in ("write", "rewrite") else int(a[2]) if op == "hold" \
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
    wait_for(lambda: os.listdir(ab), "the abandoned file", 20)
    (name,) = os.listdir(ab)
    assert os.stat(ab / name).st_uid == ua
    # still A's: 12 + 8 MB pass A's 16 MB
    assert op(users, a, "write", m.ck / "a" / "next", 8 * MB) == "EDQUOT"
    # removed (gc, or by hand): counted no more after a retry interval
    os.unlink(ab / name)
    time.sleep(2.5)
    assert op(users, a, "write", m.ck / "a" / "next", 8 * MB) == "OK"


# Holds files open for the test, one command a line on stdin, one answer
# (OK or the errno's name) a line on stdout:
#   create LABEL PATH     open(O_WRONLY | O_CREAT | O_EXCL), kept as LABEL
#   open LABEL PATH       open(O_RDONLY), kept as LABEL
#   close LABEL
HOLDER = r'''
import errno, os, sys
fds = {}
for line in sys.stdin:
    cmd, label, *path = line.split()
    try:
        if cmd == "create":
            fds[label] = os.open(path[0], os.O_WRONLY | os.O_CREAT |
                                 os.O_EXCL, 0o644)
        elif cmd == "open":
            fds[label] = os.open(path[0], os.O_RDONLY)
        else:
            os.close(fds.pop(label))
        print("OK", flush=True)
    except OSError as e:
        print(errno.errorcode[e.errno], flush=True)
'''


class Holder:
    """A process of user holding checkpoint files open (HOLDER)."""

    def __init__(self, users, user):
        self.p = users.popen(user, ["/usr/bin/python3", "-c", HOLDER],
                             stdin=-1, stdout=-1, stderr=-1)

    def ask(self, *words):
        self.p.stdin.write((" ".join(str(w) for w in words) +
                            "\n").encode())
        self.p.stdin.flush()
        got = self.p.stdout.readline().decode().strip()
        assert got, self.p.stderr.read().decode()
        return got

    def stop(self):
        self.p.stdin.close()
        self.p.wait(30)


def test_uid_open_files_bound(tool, tmp_path, users):
    """A holds uid_open_files (4) files open: its next create and its next
    open (of a file that exists) get EDQUOT, the create making nothing,
    and the log names A's uid, the option and the value; B still creates
    and opens, A's files included (a handle counts against its opener,
    not the file's owner); once A closes one, A opens again, and is held
    to the bound again after it. Root has no per-uid bound."""
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"),
             conf="uid_open_files = 4\n",
             opts=["-o", "allow_other,umask=000"])
    users.reach(m.tmp)
    m.start()
    a = b = None
    try:
        ua_name, ub_name = users.user("cqa"), users.user("cqb")
        ua = users.uid(ua_name)
        d = m.ck / "d"
        d.mkdir()
        os.chmod(d, 0o777)
        a = Holder(users, ua_name)
        for i in range(4):
            assert a.ask("create", "f%d" % i, d / ("f%d" % i)) == "OK"
        assert a.ask("create", "f4", d / "f4") == "EDQUOT"
        assert not os.path.exists(d / "f4")
        assert not os.path.exists(m.staging / "tree" / "d" / "f4")
        assert a.ask("open", "r0", d / "f0") == "EDQUOT"
        assert ("uid %d reached checkpoints.uid_open_files (4 open files"
                % ua) in m.log_text()
        # B is not held by A's handles, nor by A owning the files
        b = Holder(users, ub_name)
        assert b.ask("create", "b0", d / "b0") == "OK"
        assert b.ask("open", "r0", d / "f0") == "OK"
        assert b.ask("open", "r1", d / "f1") == "OK"
        # A closes one: the kernel's RELEASE follows close(2) shortly
        assert a.ask("close", "f0") == "OK"
        end = time.time() + 10
        while a.ask("open", "r0", d / "f0") == "EDQUOT":
            assert time.time() < end, "A's closed handle still counts"
            time.sleep(0.1)
        assert a.ask("create", "f4", d / "f4") == "EDQUOT"
        # root: no per-uid bound
        fds = [os.open(d / ("root%d" % i), os.O_WRONLY | os.O_CREAT)
               for i in range(6)]
        for fd in fds:
            os.close(fd)
    finally:
        for h in (a, b):
            if h:
                h.stop()
        m.stop()


def test_uid_store_size_bound(tool, tmp_path, users, store):
    """On a directory store and on radosgw, A publishes up to uid_store_size (8 MiB): its next write gets EDQUOT
    and nothing of it reaches the store, logged with A's uid, the option
    and the value; B is not held by A's bytes; a file A rewrites counts
    its new size only (not both versions); once A deletes a file it
    writes again. Root has no bound."""

    def size(key):
        data = store.get(key)
        return None if data is None else len(data)

    m = Ckpt(tool, tmp_path / "m", store, staging_size="64M",
             conf="[checkpoints]\nuid_store_size = 8M\n",
             opts=["-o", "allow_other,umask=000"])
    users.reach(m.tmp)
    m.start()
    try:
        a, b = users.user("cqa"), users.user("cqb")
        ua = users.uid(a)
        for d in ("a", "b", "r"):
            (m.ck / d).mkdir()
            os.chmod(m.ck / d, 0o777)
        assert op(users, a, "write", m.ck / "a" / "f1", 5 * MB) == "OK"
        assert op(users, a, "write", m.ck / "a" / "f2", 3 * MB) == "OK"
        assert size("a/f2") == 3 * MB
        # at the bound: one byte more fails, and none of it is stored
        assert op(users, a, "write", m.ck / "a" / "f3", 1) == "EDQUOT"
        assert size("a/f3") in (None, 0)
        assert op(users, a, "trunc", m.ck / "a" / "f4", MB) == "EDQUOT"
        assert ("uid %d reached checkpoints.uid_store_size (%d bytes"
                % (ua, 8 * MB)) in m.log_text()
        # B is not held by A's bytes
        assert op(users, b, "write", m.ck / "b" / "g", 8 * MB) == "OK"
        assert size("b/g") == 8 * MB
        # a rewrite of f1 replaces it: 5 MiB counted once, not twice
        assert op(users, a, "rewrite", m.ck / "a" / "f1", 5 * MB) == "OK"
        assert size("a/f1") == 5 * MB
        assert op(users, a, "rewrite", m.ck / "a" / "f1", 6 * MB) == \
            "EDQUOT"
        # the close publishes what the failed rewrite wrote before it
        assert size("a/f1") <= 5 * MB
        assert op(users, a, "rewrite", m.ck / "a" / "f1", 5 * MB) == "OK"
        # A deletes f2 through the mount: its 3 MiB come back
        assert op(users, a, "rm", m.ck / "a" / "f2") == "OK"
        assert op(users, a, "write", m.ck / "a" / "f3", 3 * MB) == "OK"
        assert size("a/f3") == 3 * MB
        assert op(users, a, "write", m.ck / "a" / "f5", 1) == "EDQUOT"
        # the catalog records each file's owner (schema 10): a restarted
        # dstagefs starts from A's 8 MiB, not from nothing
        db = sqlite3.connect(m.tmp / "catalog.db")
        try:
            owners = dict(db.execute("SELECT key, uid FROM"
                                     " checkpoint_files"))
        finally:
            db.close()
        assert owners["a/f1"] == ua and owners["b/g"] == users.uid(b)
        m.stop()
        m.start()
        assert op(users, a, "write", m.ck / "a" / "f5", 1) == "EDQUOT"
        assert op(users, a, "rm", m.ck / "a" / "f3") == "OK"
        assert op(users, a, "write", m.ck / "a" / "f5", 3 * MB) == "OK"
        # root: no per-uid bound
        with open(m.ck / "r" / "big", "wb") as f:
            f.write(b"r" * (12 * MB))
    finally:
        m.stop()
