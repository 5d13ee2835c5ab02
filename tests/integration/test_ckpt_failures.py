"""Checkpoints under failure, on real FUSE mounts with a directory store
and radosgw (split from test_checkpoints.py, which holds the fixtures): a
killed writer or dstagefs, store errors, stalls and cut parts through the
`faultproxy`, kill -9 mid-upload, a full directory store, the staging
bound, a staging directory others may write. Each checks the store itself:
never a partial file under a final name, the SHA-256 sidecar, the
catalog's record."""
import errno
import os
import re
import subprocess
import time

import pytest

from test_checkpoints import (Ckpt, DirStore, catalog_rows,  # noqa: F401
                              catalog_rows_now, no_partials, open_uploads,
                              sha, sha_file, writer)
from waits import wait_for
from test_checkpoints import mount, proxied_store, store  # noqa: F401,E501 (fixtures)

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")


def test_writer_killed_never_published(mount, store):
    (mount.ck / "k").mkdir()
    store_before = store.keys()
    w = writer(mount.ck / "k" / "partial.bin", 4, close=False)
    assert w.stdout.readline().strip() == b"ready"
    w.kill()
    w.wait(30)
    # The kernel closes the killed writer's file: not published, and
    # the partial file is not left under its final name.
    wait_for(lambda: "killed by signal 9" in mount.log_text(), "the log line",
             10)
    assert store.get("k/partial.bin") is None
    assert store.keys() == store_before
    wait_for(lambda: os.listdir(mount.ck / "k") == [], "the listing", 10)
    assert list((mount.staging / "abandoned").iterdir())


def test_kill9_dstagefs_mid_write(tool, tmp_path, store):
    m = Ckpt(tool, tmp_path / "m", store)
    m.start()
    try:
        (m.ck / "j").mkdir()
        (m.ck / "j" / "done.bin").write_bytes(b"acknowledged" * 1000)
        w = writer(m.ck / "j" / "partial.bin", 8, close=False)
        assert w.stdout.readline().strip() == b"ready"
        m.kill9()
        w.kill()
        w.wait(30)
        assert store.get("j/partial.bin") is None
        m.start()                                  # restart
        wait_for(lambda: "never closed" in m.log_text(), "the report", 10)
        assert store.get("j/partial.bin") is None
        assert os.listdir(m.ck / "j") == ["done.bin"]
        m.check_published("j/done.bin", sha(b"acknowledged" * 1000))
        assert (m.ck / "j" / "done.bin").read_bytes() == b"acknowledged" * 1000
        no_partials(store)
    finally:
        m.stop()


def test_s3_faults_error_then_retry(tool, tmp_path, faultproxy,
                                    proxied_store):
    st = proxied_store
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    try:
        (m.ck / "f").mkdir()
        data = os.urandom(2 << 20)
        faultproxy.add_fault("503", count=1000, match="PUT")
        with pytest.raises(OSError) as ei:
            with open(m.ck / "f" / "a.bin", "wb") as f:
                f.write(data)
        assert ei.value.errno == errno.EIO
        assert st.get("f/a.bin") is None
        assert re.search(r"cannot publish f/a.bin .*retried", m.log_text())
        faultproxy.clear_faults()
        # The retry thread publishes it (retry_interval 1s).
        m.wait_published("f/a.bin", sha(data), 30, "the retry")
        # the catalog's record comes after the sidecar (the published
        # hook; its catalog is opened at the first record)
        wait_for(lambda: catalog_rows_now(m).get("f/a.bin") ==
                 (sha(data), len(data)), "the catalog record", 30)

        # A connection reset on the upload: fsync fails, a later fsync
        # publishes.
        data2 = os.urandom(1 << 20)
        fd = os.open(m.ck / "f" / "b.bin", os.O_CREAT | os.O_WRONLY)
        try:
            os.write(fd, data2)
            faultproxy.add_fault("reset_request", count=1000, match="PUT")
            with pytest.raises(OSError) as ei:
                os.fsync(fd)
            assert ei.value.errno == errno.EIO
            assert st.get("f/b.bin") is None
            faultproxy.clear_faults()
            os.fsync(fd)
            m.check_published("f/b.bin", sha(data2))
        finally:
            os.close(fd)
    finally:
        m.stop()


@pytest.mark.parametrize("kind", ["stall", "reset_upload"])
def test_s3_stall_or_cut_part_error_then_retry(tool, tmp_path, faultproxy,
                                             proxied_store, kind):
    """A store that stops answering (stall: every PUT held 30 s before its
    answer) or that loses parts in the middle of their bodies
    (reset_upload): fsync returns EIO within the client's bounds, no hang,
    nothing under the final name, one log line naming the file; once the
    store answers again, the next fsync publishes exactly the bytes
    written and no upload in parts is left open."""
    st = proxied_store
    m = Ckpt(tool, tmp_path / "m", st, conf="[s3]\nlow_speed_time = 1s\n")
    m.start()
    try:
        (m.ck / "s").mkdir()
        data = os.urandom(20 << 20)            # 3 parts of 8 MiB
        faultproxy.add_fault(kind, count=1000, match="PUT",
                             seconds=30 if kind == "stall" else None)
        fd = os.open(m.ck / "s" / "a.bin", os.O_CREAT | os.O_WRONLY)
        try:
            t = time.monotonic()
            for off in range(0, len(data), 1 << 20):
                os.pwrite(fd, data[off:off + (1 << 20)], off)
            with pytest.raises(OSError) as ei:
                os.fsync(fd)
            assert ei.value.errno == errno.EIO
            # Bounded by s3.low_speed_time, max_attempts and deadline
            # (10 s), not by the store's 30 s silence.
            assert time.monotonic() - t < 25
            assert faultproxy.count("PUT") > 0
            assert st.get("s/a.bin") is None
            assert "s/a.bin" in m.log_text()
            faultproxy.clear_faults()
            os.fsync(fd)
        finally:
            os.close(fd)
        m.check_published("s/a.bin", sha(data))
        assert catalog_rows(m)["s/a.bin"] == (sha(data), len(data))
        wait_for(lambda: open_uploads(st) == [], "no open upload", 30)
        no_partials(st)
    finally:
        faultproxy.clear_faults()
        m.stop()


def test_s3_kill9_mid_upload_restart_publishes(tool, tmp_path, faultproxy,
                                               proxied_store):
    """dstagefs dies while a multipart upload is stalled: the final key
    never holds a partial object, and the restart publishes the file."""
    st = proxied_store
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    try:
        (m.ck / "u").mkdir()
        faultproxy.add_fault("stall", count=1000, match="PUT",
                             seconds=60)
        w = writer(m.ck / "u" / "big.bin", 24, close=True)  # 3 parts
        assert w.stdout.readline().strip() == b"ready"
        wait_for(lambda: faultproxy.count("PUT") > 0, "the upload", 30)
        # Parts go up while the file is written (they stall here): kill
        # once the writer's close has begun, i.e. its record is P (a file
        # killed before its close is never published, by contract).
        def closing():
            for j in (m.staging / "journal").iterdir():
                if not j.name.startswith(".") and \
                        j.read_text(errors="replace").startswith("P "):
                    return True
            return False
        wait_for(closing, "the close to begin", 30)
        m.kill9()
        w.kill()
        w.wait(30)
        faultproxy.clear_faults()
        assert st.get("u/big.bin") is None
        m.start()
        want = sha(b"".join(bytes([i % 251]) * (1 << 20) for i in range(24)))
        m.wait_published("u/big.bin", want, 60, "republish")
        assert re.search(r"u/big.bin published to .*\(retried\)",
                         m.log_text())
    finally:
        m.stop()


@pytest.fixture
def small_tmpfs(tmp_path):
    d = tmp_path / "tmpfs"
    d.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs",
                        str(d)], capture_output=True)
    if p.returncode != 0:
        pytest.skip("cannot mount a tmpfs: %s" % p.stderr.decode())
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_full_dir_store_enospc_then_restart_publishes(tool, tmp_path,
                                                      small_tmpfs):
    st = DirStore(small_tmpfs / "store")
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    try:
        (m.ck / "full").mkdir()
        data = os.urandom(12 << 20)               # more than the 8 MiB store
        with pytest.raises(OSError) as ei:
            with open(m.ck / "full" / "ckpt.bin", "wb") as f:
                f.write(data)
        assert ei.value.errno == errno.ENOSPC
        assert st.get("full/ckpt.bin") is None
        no_partials(st)
        assert "cannot publish full/ckpt.bin" in m.log_text()
        # The local copy is still served.
        assert sha_file(m.ck / "full" / "ckpt.bin") == sha(data)
        m.kill9()
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)],
                       check=True)
        m.start()                                  # the restart publishes
        m.wait_published("full/ckpt.bin", sha(data), 30, "the publish after restart")
        # recorded by the recovery at open too
        wait_for(lambda: catalog_rows_now(m).get("full/ckpt.bin") ==
                 (sha(data), len(data)), "the catalog's record", 10)
    finally:
        m.stop()


def test_staging_size_bound(tool, tmp_path):
    """checkpoints.staging_size bounds the local copies: published copies
    are dropped to make room (and are then read from the store); with
    nothing to drop a write fails with ENOSPC."""
    st = DirStore(tmp_path / "store")
    m = Ckpt(tool, tmp_path / "m", st, staging_size="8M")
    m.start()
    try:
        (m.ck / "s").mkdir()
        a, b = os.urandom(5 << 20), os.urandom(5 << 20)
        (m.ck / "s" / "a").write_bytes(a)
        (m.ck / "s" / "b").write_bytes(b)         # drops a's local copy
        assert not (m.staging / "tree" / "s" / "a").exists()
        assert (m.ck / "s" / "a").read_bytes() == a   # from the store
        assert (m.ck / "s" / "b").read_bytes() == b
        with pytest.raises(OSError) as ei:
            with open(m.ck / "s" / "c", "wb") as f:
                f.write(os.urandom(9 << 20))      # more than the bound
        assert ei.value.errno == errno.ENOSPC
        assert "checkpoints.staging_size" in m.log_text()
        # A file removed while open gives its space back at its last close.
        for i in range(3):
            fd = os.open(m.ck / "s" / "gone", os.O_CREAT | os.O_WRONLY)
            os.unlink(m.ck / "s" / "gone")
            os.write(fd, os.urandom(2 << 20))
            os.close(fd)
        (m.ck / "s" / "d").write_bytes(os.urandom(5 << 20))
        sv = os.statvfs(m.ck)
        assert sv.f_blocks * sv.f_frsize <= 8 << 20
    finally:
        m.stop()


def test_staging_dir_writable_by_others_refused(tool, tmp_path):
    st = DirStore(tmp_path / "store")
    m = Ckpt(tool, tmp_path / "m", st)
    m.staging_dir.mkdir()
    os.chmod(m.staging_dir, 0o777)
    try:
        with pytest.raises(AssertionError):
            m.start(timeout=10)
        assert "checkpoints.staging_dir %s is writable" % m.staging_dir in \
            m.log_text()
    finally:
        m.stop()


def test_background_mount_keeps_its_checkpoint_threads(tool, tmp_path):
    """dstagefs without -f forks into the background (fuse_daemonize), and
    a fork keeps only the thread that called it: the checkpoint uploaders
    and the retry thread start after it (dsfs_start). Here the retry
    thread publishes a file whose publish at close failed, once the store
    takes writes again. Before, a background mount (the systemd unit's)
    had neither, and under ASan its FUSE workers hung at birth on an
    allocator lock a lost thread held."""
    from test_checkpoints import is_mounted
    st = DirStore(tmp_path / "store")
    m = Ckpt(tool, tmp_path / "m", st)
    m.mnt.mkdir()
    blocker = st.root / ".dstage-owner"   # owner records cannot be stored

    def pids():
        p = subprocess.run(["pgrep", "-f", "dstagefs %s$" % m.mnt],
                           capture_output=True, text=True, timeout=30)
        return p.stdout.split()

    subprocess.run([tool("dstagefs"), str(m.mnt)], env=m.env, check=True,
                   timeout=60)
    try:
        wait_for(lambda: is_mounted(m.mnt), "the mount", 30)
        assert len(pids()) == 1, pids()
        blocker.write_bytes(b"in the way")
        f = m.ck / "bg.pt"
        try:
            f.write_bytes(b"written in the background")
        except OSError:
            pass  # the publish at close failed: the store refused it
        assert st.get("bg.pt") is None
        blocker.unlink()
        wait_for(lambda: st.get("bg.pt") == b"written in the background",
                 "the background mount's retry thread to publish", 30)
    finally:
        subprocess.run(["fusermount3", "-u", str(m.mnt)], timeout=60)
        wait_for(lambda: not pids(), "the background dstagefs to exit", 30)
