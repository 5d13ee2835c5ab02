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
import shutil
import subprocess
import sys
import struct
import threading
import time

import pytest

from test_checkpoints import Ckpt, DirStore, sha
from waits import wait_for
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
        r = wait_for(lambda: row().get("attempts", 0) >= 1 and row(),
                     "the retry job's first try", 30)
        assert r["state"] == "retrying" and "busy" in r["error"], r
        assert m.store.get("rb/x.bin") is None
        os.close(lfd)
        lfd = -1
        wait_for(lambda: m.store.get(".dstage-sha256/rb/x.bin"),
                 "the retry job's publish once the lock is free", 60)
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
        wait_for(lambda: os.path.exists(other), "another node's file", 10)
    finally:
        m.stop()
        st.cleanup()


# ---- one staging subdirectory per store (issue 34) ----

def crash_after_close(m, key, data):
    """Write key through m, which exits after the close's P record (before
    the upload): the file stays in m's staging, closed, not published."""
    m.env["DSTAGE_TEST_CRASH_AT"] = "upload"
    m.start()
    subprocess.run([sys.executable, "-c", "open(%r, 'wb').write(%r)" %
                    (str(m.ck / key), data)], capture_output=True,
                   timeout=60)
    m.p.wait(30)
    subprocess.run(["fusermount3", "-uz", str(m.mnt)], capture_output=True,
                   timeout=30)
    del m.env["DSTAGE_TEST_CRASH_AT"]


def share_staging(m, other):
    """Make m use other's checkpoints.staging_dir."""
    m.cfg.write_text(m.cfg.read_text().replace(
        "staging_dir = %s\n" % m.staging_dir,
        "staging_dir = %s\n" % other.staging_dir))
    m.staging_dir = other.staging_dir


def flatten(m):
    """Turn m's staging into the layout before issue 34 (tree, journal and
    abandoned directly in staging_dir)."""
    for sub in ("tree", "journal", "abandoned"):
        os.rename(m.staging / sub, m.staging_dir / sub)
    shutil.rmtree(m.staging_dir / "stores")


def test_two_stores_never_share_local_files(tool, tmp_path):
    s1, s2 = DirStore(tmp_path / "s1"), DirStore(tmp_path / "s2")
    m1 = Ckpt(tool, tmp_path / "m1", s1)
    m2 = Ckpt(tool, tmp_path / "m2", s2)
    share_staging(m2, m1)
    try:
        m1.start()
        (m1.ck / "j").mkdir()
        m1.stop()
        crash_after_close(m1, "j/team1.pt", b"team 1's weights")
        assert s1.get("j/team1.pt") is None
        # the next mount on the node, another store, same staging_dir:
        # its restart scan and retry thread must not publish team 1's file
        m2.start()
        (m2.ck / "k").mkdir()
        (m2.ck / "k" / "team2.pt").write_bytes(b"team 2's")
        time.sleep(3)               # three retry intervals
        assert s2.get("j/team1.pt") is None, "published into store 2"
        assert not os.path.exists(m2.ck / "j")
        assert s2.get("k/team2.pt") == b"team 2's"
        assert m1.staging != m2.staging
        assert os.listdir(m2.staging / "tree") == ["k"]
        assert os.listdir(m2.staging / "tree" / "k") == ["team2.pt"]
        assert os.listdir(m1.staging / "tree" / "j") == ["team1.pt"]
        assert (m1.staging / "store").read_text() == \
            s1.url.rstrip("/") + "\n"
        assert (m2.staging / "store").read_text() == \
            s2.url.rstrip("/") + "\n"
        m2.stop()
        # team 1's own mount publishes it, into store 1 only
        m1.start()
        wait_for(lambda: s1.get(".dstage-sha256/j/team1.pt"),
                 "team 1's republish", 30)
        m1.check_published("j/team1.pt", sha(b"team 1's weights"))
        assert s1.get("k/team2.pt") is None
        assert s2.get("j/team1.pt") is None
    finally:
        m1.stop()
        m2.stop()


def test_store_file_mismatch_refused(tool, tmp_path):
    s1, s2 = DirStore(tmp_path / "s1"), DirStore(tmp_path / "s2")
    m1 = Ckpt(tool, tmp_path / "m1", s1)
    try:
        m1.start()
        m1.stop()
        # store 1's subdirectory claiming to be another store's
        (m1.staging / "store").write_text(s2.url.rstrip("/") + "\n")
        with pytest.raises(AssertionError):
            m1.start(timeout=10)
        assert "names the store \"%s\", not %s" % (
            s2.url.rstrip("/"), s1.url.rstrip("/")) in m1.log_text()
    finally:
        m1.stop()


def test_flat_staging_migrated_or_refused(tool, tmp_path):
    s1, s2 = DirStore(tmp_path / "s1"), DirStore(tmp_path / "s2")
    m1 = Ckpt(tool, tmp_path / "m1", s1)
    m2 = Ckpt(tool, tmp_path / "m2", s2)
    share_staging(m2, m1)
    try:
        # published copies only: the journal's ETags say whose they are
        m1.start()
        (m1.ck / "j").mkdir()
        (m1.ck / "j" / "done.pt").write_bytes(b"done")
        m1.stop()
        flatten(m1)
        m1.start()
        assert "moved into %s" % m1.staging in m1.log_text()
        assert not (m1.staging_dir / "journal").exists()
        assert os.listdir(m1.staging / "tree" / "j") == ["done.pt"]
        assert (m1.ck / "j" / "done.pt").read_bytes() == b"done"
        m1.stop()
        # a closed file never published: whose is it? refused, for both
        crash_after_close(m1, "j/p.pt", b"pending")
        flatten(m1)
        for m in (m2, m1):
            with pytest.raises(AssertionError):
                m.start(timeout=10)
            assert "unpublished or abandoned file(s) of an unknown store" \
                in m.log_text()
            assert "mv %s/tree" % m1.staging_dir in m.log_text()
        assert s2.get("j/p.pt") is None and s1.get("j/p.pt") is None
        # the fix the message names
        for sub in ("tree", "journal", "abandoned"):
            os.rename(m1.staging_dir / sub, m1.staging / sub)
        m1.start()
        wait_for(lambda: s1.get("j/p.pt") == b"pending", "republish", 30)
        assert s2.get("j/p.pt") is None
    finally:
        m1.stop()
        m2.stop()
