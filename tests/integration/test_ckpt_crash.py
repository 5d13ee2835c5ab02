"""Issue 34: a checkpoint is published only by a finished writer, and the
names the mount takes are ones the store, the journal, the logs and a
terminal can carry.

* kill -9 of dstagefs in the middle of a write by dd (which dup2()s its
  descriptor onto 1 and closes the first one before writing), cp,
  truncate-by-path + write, torch.save and the temporary-then-os.replace
  pattern, on a directory store and on radosgw: the final key holds the
  previous complete version (never an empty or partial one), the drill
  names the unfinished file until the restart, the restart moves it to
  abandoned/ and the drill then passes;
* dstagefs exiting at fixed points of a write (DSTAGE_TEST_CRASH_AT,
  ckpt_test_crash in lib/ckpt/ckpt_base.c): after the create, after a
  truncate, after the close's P record before the upload, between the
  object and its sidecar: the final key holds the previous or the new
  complete version, and the restart publishes the new one only when its
  writer had closed it;
* the writer (dd) killed mid-write: nothing published;
* fallocate(2) on an open file, and a rename of a file its writer still
  has open and has written to (over a previous version and to a fresh
  name): nothing published under either name until the writer's fsync or
  close, which stores exactly the bytes written;
* names: control bytes refused (EINVAL, also for an unprivileged uid),
  the store's 1,024-byte key limit (prefix and sidecar included) enforced
  at create, mkdir and rename (ENAMETOOLONG); the journal's escaped
  records (a name with '%' and spaces survives a crash; an old unescaped
  record still reads); `stager jobs` and `stager unpublished` print no raw
  control byte.
"""
import errno
import os
import signal
import subprocess
import time

import pytest

from test_checkpoints import (PY, Ckpt, DirStore, drill,  # noqa: F401
                              no_partials, sha, store, wait_for)
from test_lifecycle import Daemon

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

MB = 1 << 20
OLD = b"previous complete version " * 40000          # about 1 MiB


def staged_size(m, key):
    try:
        return os.path.getsize(m.staging / "tree" / key)
    except FileNotFoundError:
        return -1


def store_is(store, key, want):
    """The final key holds exactly want (None: nothing)."""
    got = store.get(key)
    if want is None:
        assert got is None, "%s in the store: %d bytes" % (key, len(got))
    else:
        assert got is not None, "%s not in the store" % key
        assert len(got) == len(want) and sha(got) == sha(want), \
            "%s holds %d bytes, not the %d of a complete version" % (
                key, len(got), len(want))


# ---- writers that stop half way (they hold the file open until killed) ----

HOLD = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"

WRITERS = {
    # dd reads blocks from a pipe that stops after 3 MiB
    "dd": lambda p, src: ["bash", "-c",
                          "(head -c %d %s; sleep 600) | "
                          "exec dd of=%s bs=1M iflag=fullblock 2>/dev/null"
                          % (3 * MB, src, p)],
    # cp from a FIFO fed 3 MiB then held open
    "cp": lambda p, src: ["bash", "-c",
                          "f=$(mktemp -u); mkfifo $f; "
                          "(head -c %d %s; sleep 600) > $f & "
                          "exec cp $f %s" % (3 * MB, src, p)],
    # truncate(2) by path while the writer has it open, then writes
    "truncate": lambda p, src: [PY, "-c", """
import os, sys
f = open(sys.argv[1], "r+b")
os.truncate(sys.argv[1], 0)
f.write(open(sys.argv[2], "rb").read(3 << 20)); f.flush()
""" + HOLD, str(p), src],
    # torch.save into a file that stalls after 3 MiB
    "torch": lambda p, src: [PY, "-c", """
import io, sys, time, torch
class Stall(io.FileIO):
    n = 0
    def write(self, b):
        r = super().write(b)
        self.n += r
        if self.n >= 3 << 20:
            print('ready', flush=True)
            time.sleep(600)
        return r
torch.save({"w": torch.ones(4 << 20)}, Stall(sys.argv[1], "wb"))
""", str(p), src],
    # the temporary-then-replace pattern, killed before the replace
    "replace": lambda p, src: [PY, "-c", """
import os, sys
f = open(sys.argv[1] + ".tmp", "wb")
f.write(open(sys.argv[2], "rb").read(3 << 20)); f.flush()
""" + HOLD + "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n",
        str(p), src],
}


@pytest.mark.parametrize("how", sorted(WRITERS))
def test_kill9_dstagefs_mid_write_keeps_previous(tool, tmp_path, store,
                                                 how):
    st = store
    src = tmp_path / "random"
    src.write_bytes(os.urandom(4 * MB))
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    w = None
    try:
        (m.ck / "j").mkdir()
        (m.ck / "j" / "model.pt").write_bytes(OLD)
        m.check_published("j/model.pt", sha(OLD))
        key = "j/model.pt" + (".tmp" if how == "replace" else "")
        w = subprocess.Popen(WRITERS[how](m.ck / "j" / "model.pt",
                                          str(src)),
                             stdout=subprocess.DEVNULL,
                             start_new_session=True)
        wait_for(lambda: staged_size(m, key) >= 3 * MB, 60,
                 "3 MiB written by " + how)
        store_is(st, "j/model.pt", OLD)        # nothing published yet
        m.kill9()
        os.killpg(w.pid, signal.SIGKILL)
        w.wait(30)
        store_is(st, "j/model.pt", OLD)
        # before the restart: the drill names the unfinished file
        rc, out, err = drill(tool, m, tmp_path, "j", "--to", tmp_path / "d1")
        if how == "replace":
            assert rc == 0, (out, err)          # model.pt itself is whole
        else:
            assert rc == 1 and "BAD j/model.pt: unfinished" in out, \
                (rc, out, err)
        m.start()
        wait_for(lambda: "never closed" in m.log_text() or
                 "without publishing" in m.log_text(), 20, "the report")
        wait_for(lambda: os.listdir(m.staging / "abandoned"), 10,
                 "the abandoned file")
        store_is(st, "j/model.pt", OLD)
        assert (m.ck / "j" / "model.pt").read_bytes() == OLD
        rc, out, err = drill(tool, m, tmp_path, "j", "--to", tmp_path / "d2")
        assert rc == 0, (out, err)
        assert (tmp_path / "d2" / "model.pt").read_bytes() == OLD
    finally:
        if w and w.poll() is None:
            os.killpg(w.pid, signal.SIGKILL)
        m.stop()


# ---- dstagefs exits at fixed points (DSTAGE_TEST_CRASH_AT) ----

NEW = os.urandom(2 * MB + 12345)
POINT_WRITER = """
import os, sys
f = open(sys.argv[1], "r+b" if sys.argv[2] == "truncate" else "wb")
if sys.argv[2] == "truncate":
    os.ftruncate(f.fileno(), 0)
f.write(open(sys.argv[3], "rb").read())
f.close()
"""


@pytest.mark.parametrize("point", ["create", "truncate", "upload",
                                   "sidecar"])
def test_crash_at_point(tool, tmp_path, store, point):
    st = store
    new = tmp_path / "new"
    new.write_bytes(NEW)
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    try:
        (m.ck / "j").mkdir()
        (m.ck / "j" / "model.pt").write_bytes(OLD)
        m.stop()
        m.env["DSTAGE_TEST_CRASH_AT"] = point
        m.start()
        w = subprocess.run([PY, "-c", POINT_WRITER,
                            str(m.ck / "j" / "model.pt"), point, str(new)],
                           capture_output=True, timeout=120)
        assert w.returncode != 0             # the mount went away under it
        m.p.wait(30)
        assert m.p.returncode == 86, m.log_text()[-2000:]  # the test exit
        subprocess.run(["fusermount3", "-uz", str(m.mnt)],
                       capture_output=True, timeout=30)
        got = st.get("j/model.pt")
        assert got in (OLD, NEW), "a stand-in of %d bytes" % len(got or b"")
        if point in ("create", "truncate", "upload"):
            assert got == OLD
        del m.env["DSTAGE_TEST_CRASH_AT"]
        m.start()
        if point in ("upload", "sidecar"):
            # the writer had closed it: the restart publishes it. After a
            # crash at "sidecar" the store already holds NEW under the key
            # with OLD's sidecar: wait for the sidecar too, not the data
            # alone (the data alone once raced the republish's sidecar).
            def republished():
                side = st.get(".dstage-sha256/j/model.pt")
                return st.get("j/model.pt") == NEW and side is not None \
                    and side.decode().split()[0] == sha(NEW)
            wait_for(republished, 30, "republish")
            m.check_published("j/model.pt", sha(NEW))
        else:
            wait_for(lambda: os.listdir(m.staging / "abandoned"), 20,
                     "the abandoned file")
            store_is(st, "j/model.pt", OLD)
        rc, out, err = drill(tool, m, tmp_path, "j", "--to", tmp_path / "d")
        assert rc == 0, (out, err)
    finally:
        m.stop()


def test_dd_killed_mid_write_publishes_nothing(tool, tmp_path):
    st = DirStore(tmp_path / "store")
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    try:
        (m.ck / "j").mkdir()
        w = subprocess.Popen(WRITERS["dd"](m.ck / "j" / "big.bin",
                                           "/dev/urandom"),
                             start_new_session=True)
        wait_for(lambda: staged_size(m, "j/big.bin") >= 3 * MB, 30,
                 "dd's writes")
        assert st.get("j/big.bin") is None
        os.killpg(w.pid, signal.SIGKILL)
        w.wait(30)
        wait_for(lambda: os.listdir(m.staging / "abandoned"), 10,
                 "the abandoned file")
        assert st.get("j/big.bin") is None
        assert st.get(".dstage-sha256/j/big.bin") is None
        # and a dd that finishes publishes once, at its last close
        subprocess.run(["dd", "if=/dev/zero", "of=%s" % (m.ck / "j" / "z"),
                        "bs=1M", "count=3"], check=True, capture_output=True)
        m.check_published("j/z", sha(b"\0" * 3 * MB))
    finally:
        m.stop()


# ---- calls on an open file that publish nothing ----

def fallocate(fd, off, length):
    """fallocate(2), mode 0, called directly: glibc's posix_fallocate
    writes zeros itself where the file system refuses the call, which
    would test writes instead."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                               ctypes.c_int64]
    if libc.fallocate(fd, 0, off, length):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def sidecar_is(st, key, want):
    """key's SHA-256 sidecar names want's hash (None: there is none)."""
    side = st.get(".dstage-sha256/" + key)
    if want is None:
        assert side is None, "a SHA-256 record for " + key
    else:
        assert side is not None and side.split()[0].decode() == sha(want), \
            "the SHA-256 record of %s changed: %r" % (key, side)


def test_fallocate_on_an_open_file_publishes_nothing(tool, tmp_path, store):
    """fallocate(2) on an open checkpoint file, past its end (20 MiB, with
    a write past two parts: on radosgw an upload in parts is under way)
    and inside it, publishes nothing: the final key and its sidecar keep
    the previous version until the writer's close, which stores exactly
    the bytes written and the allocated zeros."""
    st = store
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    fd = -1
    try:
        (m.ck / "j").mkdir()
        p = m.ck / "j" / "model.pt"
        p.write_bytes(OLD)
        m.check_published("j/model.pt", sha(OLD))
        head, tail = os.urandom(MB), os.urandom(MB)
        fd = os.open(p, os.O_RDWR)             # no O_TRUNC: fallocate alone
        os.pwrite(fd, head, 0)                 # covers OLD's 1,040,000 bytes
        fallocate(fd, 0, 20 * MB)
        assert os.fstat(fd).st_size == 20 * MB
        os.pwrite(fd, tail, 18 * MB)
        fallocate(fd, 4 * MB, 2 * MB)          # inside: the size stays
        assert os.fstat(fd).st_size == 20 * MB
        time.sleep(1.5)                        # past retry_interval (1 s)
        store_is(st, "j/model.pt", OLD)
        sidecar_is(st, "j/model.pt", OLD)
        os.close(fd)
        fd = -1
        want = head + b"\0" * (17 * MB) + tail + b"\0" * MB
        m.check_published("j/model.pt", sha(want))
        no_partials(st)
    finally:
        if fd >= 0:
            os.close(fd)
        m.stop()


def test_rename_of_an_open_file_publishes_nothing(tool, tmp_path, store):
    """A file renamed while its writer has it open and has written to it
    (the temporary name then os.replace, done before the close): over a
    previous version (20 MiB written first: on radosgw parts of an upload
    are in flight under the old name) and to a fresh name. Until the
    writer's fsync or close nothing of the new bytes is under the old name
    or the new one (the previous version stays, with its sidecar); its
    fsync, then its close, store exactly the bytes written under the final
    name, nothing under the old one, no temporary left."""
    st = store
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    fds = []
    try:
        j = m.ck / "j"
        j.mkdir()
        (j / "model.pt").write_bytes(OLD)
        m.check_published("j/model.pt", sha(OLD))
        a1, a2 = os.urandom(20 * MB), os.urandom(3 * MB)
        b1, b2 = b"optimizer state " * 4096, b"and the rest"
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
        fds.append(os.open(j / "model.pt.tmp", flags, 0o644))
        fds.append(os.open(j / "opt.tmp", flags, 0o644))
        fa, fb = fds
        os.write(fa, a1)
        os.write(fb, b1)
        os.replace(j / "model.pt.tmp", j / "model.pt")
        os.rename(j / "opt.tmp", j / "opt.pt")
        os.write(fa, a2)                       # written on after the rename
        os.write(fb, b2)
        time.sleep(1.5)                        # past retry_interval (1 s)
        store_is(st, "j/model.pt", OLD)
        sidecar_is(st, "j/model.pt", OLD)
        for key in ("j/model.pt.tmp", "j/opt.tmp", "j/opt.pt"):
            store_is(st, key, None)
            sidecar_is(st, key, None)
        os.fsync(fa)
        m.check_published("j/model.pt", sha(a1 + a2))
        for fd in list(fds):
            os.close(fd)
            fds.remove(fd)
        m.check_published("j/model.pt", sha(a1 + a2))
        m.check_published("j/opt.pt", sha(b1 + b2))
        for key in ("j/model.pt.tmp", "j/opt.tmp"):
            store_is(st, key, None)
            sidecar_is(st, key, None)
        assert sorted(os.listdir(j)) == ["model.pt", "opt.pt"]
        no_partials(st)
    finally:
        for fd in fds:
            os.close(fd)
        m.stop()


# ---- names ----

def open_to_all(tool, tmp_path):
    """tool, but its dstagefs mounts with -o allow_other,umask=0 (every
    user may write checkpoints)."""
    wrap = tmp_path / "dstagefs-all"
    wrap.write_text("#!/bin/sh\nexec %s -o allow_other,umask=0 \"$@\"\n" %
                    tool("dstagefs"))
    wrap.chmod(0o755)
    return lambda name: str(wrap) if name == "dstagefs" else tool(name)


def test_names_control_bytes_and_length(tool, tmp_path, store, users):
    st = store
    m = Ckpt(open_to_all(tool, tmp_path), tmp_path / "m", st)
    m.start()
    try:
        j = m.ck / "j"
        j.mkdir()
        os.chmod(j, 0o1777)  # the second uid below writes in it too
        (j / "ok").write_bytes(b"x")
        for bad in ("a\nb", "evil\n2026 fake log line", "\x1b[31mred",
                    "tab\there", "del\x7f", "cr\r"):
            for op in (lambda p: p.write_bytes(b"x"), lambda p: p.mkdir(),
                       lambda p: os.rename(j / "ok", p)):
                with pytest.raises(OSError) as ei:
                    op(j / bad)
                assert ei.value.errno == errno.EINVAL, (bad, ei.value)
        assert sorted(os.listdir(j)) == ["ok"]
        # the same as an unprivileged uid (j lets everyone write)
        u = users.user("ckn")
        users.reach(m.mnt.parent)
        p = users.run(u, [PY, "-c", "open(%r, 'wb').write(b'y')" %
                          str(j / "fine")])
        assert p.returncode == 0, p.stderr
        for bad in ("x\ny", "\x1b[2Jz"):
            p = users.run(u, [PY, "-c", "open(%r, 'wb')" % str(j / bad)])
            assert p.returncode != 0 and b"Invalid argument" in p.stderr, \
                p.stderr
        assert sorted(os.listdir(j)) == ["fine", "ok"]

        # the store's key limit: the longest key a file has, its owner
        # record (prefix + ".dstage-owner/" + key + "/.dstage-own") <= 1024
        prefix = len(st.prefix) if st.kind == "s3" else 0
        room = 1024 - prefix - len(".dstage-owner/") - len("/.dstage-own") \
            - len("j/")
        d = j
        left = room
        while left > 255 + 1:                 # directories of 200 bytes
            d = d / ("d" * 199)
            d.mkdir()
            left -= 200
        longest = d / ("f" * left)
        longest.write_bytes(b"fits")
        m.check_published(os.path.relpath(longest, m.ck), sha(b"fits"))
        for op in (lambda p: p.write_bytes(b"x"), lambda p: p.mkdir(),
                   lambda p: os.rename(longest, p)):
            with pytest.raises(OSError) as ei:
                op(d / ("f" * (left + 1)))
            assert ei.value.errno == errno.ENAMETOOLONG
        os.unlink(longest)                     # removable, as any file
        assert st.get(os.path.relpath(longest, m.ck)) is None
    finally:
        m.stop()


def test_journal_escaped_and_old_records_read(tool, tmp_path):
    st = DirStore(tmp_path / "store")
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    name = "a b%41 c.pt"
    try:
        (m.ck / "j").mkdir()
        m.stop()
        m.env["DSTAGE_TEST_CRASH_AT"] = "upload"
        m.start()
        subprocess.run([PY, "-c", "open(%r, 'wb').write(b'data')" %
                        str(m.ck / "j" / name)], capture_output=True,
                       timeout=60)
        m.p.wait(30)
        subprocess.run(["fusermount3", "-uz", str(m.mnt)],
                       capture_output=True, timeout=30)
        recs = [p for p in (m.staging / "journal").iterdir()
                if not p.name.startswith(".")]
        assert len(recs) == 1
        text = recs[0].read_bytes()
        first, key = text.split(b"\n")[:2]
        assert first.startswith(b"P ") and first.endswith(b" %")
        assert key == b"j/a%20b%2541%20c.pt", text
        del m.env["DSTAGE_TEST_CRASH_AT"]
        m.start()
        m.wait_published("j/" + name, sha(b"data"), 30, "republish")

        # a record as an older dstagefs wrote it (no escaping, no mark)
        m.env["DSTAGE_TEST_CRASH_AT"] = "upload"
        m.stop()
        m.start()
        subprocess.run([PY, "-c", "open(%r, 'wb').write(b'more')" %
                        str(m.ck / "j" / "old%41.pt")], capture_output=True,
                       timeout=60)
        m.p.wait(30)
        subprocess.run(["fusermount3", "-uz", str(m.mnt)],
                       capture_output=True, timeout=30)
        rec = [p for p in (m.staging / "journal").iterdir()
               if not p.name.startswith(".") and
               b"old" in p.read_bytes()][0]
        first = rec.read_bytes().split(b"\n")[0]
        rec.write_bytes(first[:-2] + b"\nj/old%41.pt\n")
        del m.env["DSTAGE_TEST_CRASH_AT"]
        m.start()
        wait_for(lambda: st.get("j/old%41.pt") == b"more", 30,
                 "the old record's republish")
    finally:
        m.stop()


def test_stager_jobs_prints_no_control_bytes(tool, tmp_path):
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"))
    m.start()
    d = None
    try:
        (m.staging / "abandoned").mkdir(exist_ok=True)
        (m.staging / "abandoned" / "7-\x1b]0;owned\x07\x1b[2J\nx").write_bytes(
            b"partial")
        d = Daemon(tool, tmp_path / "d", m).start()
        out = d.run("jobs", check=True).stdout
        assert b"abandoned" in out
        body = out.replace(b"\n", b"")
        assert not [c for c in body if c < 0x20 or c == 0x7f], out
        assert b"\\x1b]0;owned\\x07\\x1b[2J\\x0ax" in out
        assert out.count(b"\n") == 2          # header and one row
    finally:
        if d:
            d.stop()
        m.stop()


def test_stager_unpublished_prints_no_control_bytes(tool, tmp_path):
    """`stager unpublished` escapes what it prints from names as `stager
    jobs` does: an abandoned file whose name holds an escape sequence and a
    newline (planted: the mount refuses such names at create) shows as
    \\xNN in the key and in the cause, one row."""
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"))
    m.start()
    d = None
    try:
        (m.staging / "abandoned").mkdir(exist_ok=True)
        (m.staging / "abandoned" / "7-\x1b]0;owned\x07\x1b[2J\nx").write_bytes(
            b"partial")
        d = Daemon(tool, tmp_path / "d", m).start()
        p = d.run("unpublished")
        out = p.stdout
        assert p.returncode == 1, (p.returncode, out, p.stderr)
        assert b"abandoned" in out
        body = out.replace(b"\n", b"")
        assert not [c for c in body if c < 0x20 or c == 0x7f], out
        # the key and the cause both name it
        assert out.count(b"7-\\x1b]0;owned\\x07\\x1b[2J\\x0ax") == 2, out
        assert out.count(b"\n") == 2          # header and one row
    finally:
        if d:
            d.stop()
        m.stop()
