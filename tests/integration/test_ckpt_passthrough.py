# SPDX-License-Identifier: MIT
"""FUSE passthrough of checkpoint files read back (checkpoints.passthrough
= true; issue 31, docs/checkpoints.md "Reading back"): a read-only open of a
file this node holds a local copy of is handed to the kernel with that copy
as backing file. The kernel allows no other kind of open of the inode
beside it, so a writer meanwhile (an open for writing, an O_TRUNC, a create
over it) is refused with ETXTBSY before anything is cut, and succeeds once
the passed-through opens are closed. The caller's access is checked first:
another uid is refused a 0600 file as before. Off by default. Skipped where
the build or the kernel has no passthrough (the stats say fs_passthrough 0).
A directory store: the local copy is the same whatever the store."""
import errno
import os
import time

import pytest

from test_checkpoints import Ckpt, DirStore, mount_stats, sha
from waits import wait_for
from test_ckpt_owners import op

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

MiB = 1 << 20
PT = "[checkpoints]\npassthrough = true\n"


def passed(m):
    return mount_stats(m.mnt)["fs_passthrough_opens"]


def skip_unless_passthrough(m):
    if not mount_stats(m.mnt)["fs_passthrough"]:
        pytest.skip("no FUSE passthrough here (build or kernel)")


def wait_passed(m, f, timeout=10.0):
    """Open and close f until an open of it is passed through: the writer's
    RELEASE comes after its close(2) returned, and an open beside a plain
    one still open reads through dstagefs."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        before = passed(m)
        os.close(os.open(f, os.O_RDONLY))
        if passed(m) > before:
            return
        time.sleep(0.05)
    raise AssertionError("no open of %s was passed through" % f)


def write(f, data):
    with open(f, "wb") as fh:
        fh.write(data)


@pytest.fixture
def ptm(tool, tmp_path):
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"), conf=PT)
    m.start()
    try:
        skip_unless_passthrough(m)
        yield m
    finally:
        m.stop()


def test_read_back_is_passed_through(ptm):
    m = ptm
    data = os.urandom(3 * MiB + 77)
    f = m.ck / "job1" / "model.pt"
    os.mkdir(f.parent)
    write(f, data)
    m.wait_published("job1/model.pt", sha(data))
    wait_passed(m, f)
    n = passed(m)
    assert sha(f.read_bytes()) == sha(data)
    assert passed(m) == n + 1
    # two opens at once share the inode's backing file
    with open(f, "rb") as a, open(f, "rb") as b:
        b.seek(MiB)
        assert a.read(4096) == data[:4096]
        assert b.read(4096) == data[MiB:MiB + 4096]
    assert passed(m) == n + 3
    # a file still being written is read through dstagefs meanwhile
    g = m.ck / "job1" / "opt.pt"
    with open(g, "wb") as w:
        w.write(b"x" * 1000)
        w.flush()
        before = passed(m)
        with open(g, "rb") as r:
            assert r.read() == b"x" * 1000
        assert passed(m) == before


def test_writer_refused_while_passed_through(ptm):
    m = ptm
    data = os.urandom(MiB + 5)
    f = m.ck / "model.pt"
    write(f, data)
    m.wait_published("model.pt", sha(data))
    wait_passed(m, f)
    with open(f, "rb") as r:
        t0 = time.monotonic()
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC,
                      os.O_RDONLY | os.O_TRUNC,
                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
            with pytest.raises(OSError) as e:
                os.close(os.open(f, flags, 0o644))
            assert e.value.errno == errno.ETXTBSY, flags
        # each waited (bounded) for RELEASEs in flight first
        assert time.monotonic() - t0 >= 1.0
        # nothing was cut under the reader the kernel serves
        assert os.stat(f).st_size == len(data)
        assert sha(r.read()) == sha(data)
    # closed: a writer gets in (its RELEASE may still be in flight)
    new = os.urandom(2 * MiB)

    def rewrite():
        try:
            write(f, new)
            return True
        except OSError as e:
            if e.errno != errno.ETXTBSY:
                raise
            return False
    wait_for(rewrite, "the writer's open", 10)
    m.wait_published("model.pt", sha(new))
    wait_passed(m, f)
    assert sha(f.read_bytes()) == sha(new)


def test_other_uid_refused_with_passthrough_on(tool, tmp_path, users):
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"), conf=PT,
             opts=["-o", "allow_other,umask=000"])
    users.reach(m.tmp)
    m.start()
    try:
        skip_unless_passthrough(m)
        a, b = users.user("cpa"), users.user("cpb")
        f = m.ck / "a.pt"
        assert op(users, a, "create", f, "077") == "OK"
        m.wait_published("a.pt", sha(b"written by %d" % users.uid(a)))
        before = passed(m)
        assert op(users, b, "read", f) == "EACCES"
        assert passed(m) == before
        # its owner's read is passed through (after the create's RELEASE)
        wait_for(lambda: op(users, a, "read", f) == "OK" and
                 passed(m) > before, "a passed-through read by A", 10)
    finally:
        m.stop()


def test_off_by_default(tool, tmp_path):
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"))
    m.start()
    try:
        data = os.urandom(MiB)
        f = m.ck / "model.pt"
        write(f, data)
        m.wait_published("model.pt", sha(data))
        for _ in range(3):
            assert sha(f.read_bytes()) == sha(data)
        assert passed(m) == 0
        # and a writer beside a reader is not refused
        with open(f, "rb"):
            write(f, b"again")
        assert f.read_bytes() == b"again"
    finally:
        m.stop()


# B's reader, one command a line on stdin, one answer a line on stdout:
#   open PATH      open(O_RDONLY), kept
#   read OFF N     pread: the SHA-256 of what came, or the errno's name
#   close
READER = r'''
import errno, hashlib, os, sys
fd = None
for line in sys.stdin:
    cmd, *a = line.split()
    try:
        if cmd == "open":
            fd = os.open(a[0], os.O_RDONLY)
            out = "OK"
        elif cmd == "read":
            out = hashlib.sha256(os.pread(fd, int(a[1]),
                                          int(a[0]))).hexdigest()
        else:
            os.close(fd)
            out = "OK"
    except OSError as e:
        out = errno.errorcode[e.errno]
    print(out, flush=True)
'''

# A's writer: append or rewrite (O_TRUNC, created 0644) PATH with N bytes
# of BYTE; prints OK or the errno's name.
WRITER = r'''
import errno, os, sys
how, path, n, byte = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
os.umask(0o022)
try:
    fd = os.open(path, os.O_WRONLY | (os.O_APPEND if how == "append" else
                                      os.O_CREAT | os.O_TRUNC), 0o644)
    try:
        os.write(fd, byte.encode() * n)
    finally:
        os.close(fd)
    print("OK")
except OSError as e:
    print(errno.errorcode[e.errno])
'''


def test_other_uid_reader_does_not_block_the_owner(tool, tmp_path, users):
    """Issue 42, finding 9: B reading A's 0644 file while A appends and
    rewrites it: A's writes succeed; B reads the bytes it opened, or
    ESTALE once A changed them (never a mix), and the new version once it
    opens again."""
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"), conf=PT,
             opts=["-o", "allow_other,umask=000"])
    users.reach(m.tmp)
    m.start()
    r = None
    try:
        skip_unless_passthrough(m)
        a, b = users.user("cpa"), users.user("cpb")
        (m.ck / "d").mkdir()
        os.chmod(m.ck / "d", 0o777)
        f = m.ck / "d" / "a.pt"

        def w(how, n, byte):
            p = users.run(a, ["/usr/bin/python3", "-c", WRITER, how,
                              str(f), str(n), byte])
            assert p.returncode == 0, p.stderr.decode()
            return p.stdout.decode().strip()
        old = b"o" * MiB
        assert w("rewrite", MiB, "o") == "OK"
        m.wait_published("d/a.pt", sha(old))
        time.sleep(0.5)  # the create's RELEASE
        r = users.popen(b, ["/usr/bin/python3", "-c", READER],
                        stdin=-1, stdout=-1, stderr=-1)

        def ask(*words):
            r.stdin.write((" ".join(str(x) for x in words) +
                           "\n").encode())
            r.stdin.flush()
            got = r.stdout.readline().decode().strip()
            assert got, r.stderr.read().decode()
            return got
        assert ask("open", f) == "OK"
        assert ask("read", 0, 2 * MiB) == sha(old)
        # A appends, then rewrites, beside B's open reader
        assert w("append", 4096, "p") == "OK"
        assert ask("read", 0, 2 * MiB) == "ESTALE"
        assert w("rewrite", 2 * MiB, "n") == "OK"
        new = b"n" * (2 * MiB)
        m.wait_published("d/a.pt", sha(new))
        assert ask("read", 0, 4 * MiB) == "ESTALE"
        assert ask("read", MiB, 4096) == "ESTALE"
        assert ask("close") == "OK"
        # opened again: the new version
        assert ask("open", f) == "OK"
        assert ask("read", 0, 4 * MiB) == sha(new)
    finally:
        if r:
            r.kill()
            r.wait()
        m.stop()
