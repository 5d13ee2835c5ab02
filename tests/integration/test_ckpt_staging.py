"""The staging directory shared by dstagefs and the stager daemon's
lifecycle and retry job (lib/ckpt/ckpt_journal.c's locks, lib/lifecycle/lifecycle_stage.c):

* a published local copy open in dstagefs is not dropped by a lifecycle
  run (flock: dstagefs holds it shared from open to the last close, the
  drop takes it exclusively without waiting and skips a busy copy);
* one version at a time goes to the store (an OFD write lock on the local
  copy during a publish): dstagefs's close waits for a publish the daemon
  has begun, and the daemon's retry job skips a file dstagefs is
  publishing.

The tests stand in for the other side by taking the same lock on the
local copy themselves.
"""
import fcntl
import os
import struct
import threading
import time

import pytest

from test_checkpoints import sha, wait_for
from test_lifecycle import Daemon, daemon, dirmount  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

F_OFD_SETLK = 37     # <fcntl.h>, Linux
F_OFD_SETLKW = 38


def ofd_wrlock(path):
    """An OFD write lock on the whole file path (what a publish holds);
    closing the descriptor returned releases it."""
    fd = os.open(path, os.O_RDWR)
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (+ padding)
    fcntl.fcntl(fd, F_OFD_SETLK,
                struct.pack("hhqqixxxx", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    return fd


def test_drop_skips_a_copy_open_in_dstagefs(daemon, dirmount):
    m, d = dirmount, daemon
    (m.ck / "lk").mkdir()
    for s in (1, 2):
        (m.ck / "lk" / ("step-%d" % s)).write_bytes(b"%d" % s * 5000)
    tree = m.staging / "tree" / "lk"
    assert sorted(os.listdir(tree)) == ["step-1", "step-2"]
    d.lc("add", "lk", "--keep-local", "1")
    with open(m.ck / "lk" / "step-1", "rb") as f:
        assert f.read(4) == b"1111"
        d.lc_json("run")
        # open in dstagefs: kept, and read from the same local copy
        assert sorted(os.listdir(tree)) == ["step-1", "step-2"]
        assert f.read() == b"1" * 4996
    d.lc_json("run")
    assert os.listdir(tree) == ["step-2"]
    # the store has it; opening it again reads the store
    assert (m.ck / "lk" / "step-1").read_bytes() == b"1" * 5000


def test_close_waits_for_a_publish_in_progress(dirmount):
    m = dirmount
    (m.ck / "pw").mkdir()
    data = os.urandom(300000)
    fd = os.open(m.ck / "pw" / "a.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data)
    # the daemon's retry job publishing an older version of it, say
    lfd = ofd_wrlock(m.staging / "tree" / "pw" / "a.bin")
    done = []
    t = threading.Thread(target=lambda: (os.close(fd), done.append(1)))
    t.start()
    try:
        time.sleep(1.5)
        assert not done, "close returned while another publish held the file"
        assert m.store.get("pw/a.bin") is None
    finally:
        os.close(lfd)
        t.join(60)
    assert done
    m.check_published("pw/a.bin", sha(data))


def test_retry_job_skips_a_file_being_published(tool, tmp_path, dirmount):
    m = dirmount
    (m.ck / "rb").mkdir()
    m.store.put("rb", b"in the way")     # the store refuses rb/...
    data = os.urandom(200000)
    with pytest.raises(OSError):
        with open(m.ck / "rb" / "x.bin", "wb") as f:
            f.write(data)
    m.stop()
    (m.store.root / "rb").unlink()       # the store is back
    # dstagefs (restarted elsewhere) publishing it, say
    lfd = ofd_wrlock(m.staging / "tree" / "rb" / "x.bin")
    d = Daemon(tool, tmp_path / "d", m).start()
    try:
        def row():
            rows = [j for j in d.json("jobs") if j.get("kind") == "publish"]
            return rows[0] if rows else {}
        r = wait_for(lambda: row().get("attempts", 0) >= 1 and row(), 30,
                     "the retry job's first try")
        assert r["state"] == "retrying" and "busy" in r["error"], r
        assert m.store.get("rb/x.bin") is None
        os.close(lfd)
        lfd = -1
        wait_for(lambda: m.store.get(".dstage-sha256/rb/x.bin"), 60,
                 "the retry job's publish once the lock is free")
        m.check_published("rb/x.bin", sha(data))
    finally:
        if lfd >= 0:
            os.close(lfd)
        d.stop()


# ---- negative lookups ----

def test_repeated_misses_do_not_each_ask_the_store(tool, tmp_path,
                                                   faultproxy):
    from test_checkpoints import Ckpt, S3Store
    st = S3Store(faultproxy.rgw, env=faultproxy.env())
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    try:
        (m.ck / "job").mkdir()
        (m.ck / "job" / "here.py").write_bytes(b"x")
        miss = m.ck / "job" / "missing.py"
        faultproxy.reset_stats()
        assert not os.path.exists(miss)
        one = len(faultproxy.requests())
        assert one >= 1     # the first miss asks the store
        t0 = time.monotonic()
        for _ in range(30):
            assert not os.path.exists(miss)
        spent = time.monotonic() - t0
        n = len(faultproxy.requests())
        # remembered for the entry timeout (1 s): one more round of
        # requests per second spent at most (this machine may be slow)
        assert n <= one * (2 + int(spent)), (n, one, spent,
                                             faultproxy.counts())
        assert os.path.exists(m.ck / "job" / "here.py")
        # a name this node adds shows at once, even to a new lookup (the
        # kernel's dentries dropped within the entry timeout)
        d = m.ck / "job" / "newdir"
        assert not os.path.exists(d)
        os.mkdir(d)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2")
        assert os.path.isdir(d)
        assert not os.path.exists(miss)
        miss.write_bytes(b"now")
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2")
        assert os.path.exists(miss)
        # one another node adds shows once the entry timeout passed
        other = m.ck / "job" / "other.py"
        assert not os.path.exists(other)
        st.put("job/other.py", b"o")
        wait_for(lambda: os.path.exists(other), 10, "another node's file")
    finally:
        m.stop()
        st.cleanup()
