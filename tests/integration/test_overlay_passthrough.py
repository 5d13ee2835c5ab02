# SPDX-License-Identifier: MIT
"""FUSE passthrough in the overlay (dstagefs --over DIR with
overlay.passthrough = true; issue 31, docs/dstagefs.md "Passthrough"): a
read-only open of a file the cache holds whole at the version opened is
handed to the kernel with the cache's data file as backing file. The kernel
allows no other kind of open of an inode beside a passed-through one (it
fails it with EIO), so a writer, or an open of a changed file, meanwhile is
refused with ETXTBSY, and succeeds once the passed-through opens are closed.
The caller's access is checked before anything is handed over. Skipped
where the build or the kernel has no passthrough (the mount's line is the
reason)."""
import errno
import os
import time

import pytest

from test_overlay import TIMEOUT, Overlay, drop_pages, sha

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

MiB = 1 << 20


def start_pt(o):
    o.start()
    # The kernel's INIT (where the line is logged) is answered after the
    # mount point appears: under load, a moment later.
    end = time.monotonic() + 10
    while True:
        lines = [ln for ln in o.log().splitlines()
                 if "passthrough on: " in ln or "passthrough off: " in ln]
        if lines or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert len(lines) == 1, o.log()
    if "passthrough on: " not in lines[0]:
        pytest.skip("no FUSE passthrough here: " +
                    lines[0].split("passthrough ", 1)[1])


def wait_passed(o, f, timeout=10.0):
    """Open and close f until an open of it makes a backing file: the
    kernel sends a close's RELEASE after close(2) has returned, and an
    open beside a plain one still open reads through dstagefs."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        before = o.passthrough_opens()
        os.close(os.open(f, os.O_RDONLY))
        if o.passthrough_opens() > before:
            return
        time.sleep(0.05)
    raise AssertionError("no open of %s was passed through" % f)


@pytest.fixture
def ovp(tool, tmp_path):
    o = Overlay(tool, tmp_path)
    o.env["DSTAGE_OVERLAY_PASSTHROUGH"] = "true"
    try:
        yield o
    finally:
        o.close()


def test_cached_file_is_passed_through(ovp):
    data = os.urandom(2 * MiB + 333)
    ovp.put("model.bin", data)
    start_pt(ovp)
    f = ovp.pfs / "model.bin"
    # the first read fills the cache through dstagefs (not passed through)
    assert sha(f.read_bytes()) == sha(data)
    assert ovp.passthrough_opens() == 0
    hits, misses = ovp.ds_counter("hits"), ovp.ds_counter("misses")
    # whole in the cache now: the kernel reads the cache's file itself, no
    # READ reaches dstagefs (no hit, no miss)
    wait_passed(ovp, f)
    drop_pages(f)
    assert sha(f.read_bytes()) == sha(data)
    assert ovp.ds_counter("hits") == hits
    assert ovp.ds_counter("misses") == misses
    # two opens at once share one backing file
    with open(f, "rb") as a, open(f, "rb") as b:
        b.seek(MiB)
        assert a.read(4096) == data[:4096]
        assert b.read(4096) == data[MiB:MiB + 4096]
    assert ovp.ds_counter("hits") == hits


def test_writer_beside_a_passed_through_reader(ovp):
    old, new = os.urandom(MiB), os.urandom(MiB)
    ovp.put("w.bin", old)
    start_pt(ovp)
    f = ovp.pfs / "w.bin"
    assert f.read_bytes() == old  # cached whole
    wait_passed(ovp, f)
    with open(f, "rb", buffering=0) as r:
        assert r.read(1000) == old[:1000]
        # a writer beside it: refused (the kernel would fail it with EIO),
        # the tree untouched, the reader unharmed
        with pytest.raises(OSError) as e:
            open(f, "r+b", buffering=0)
        assert e.value.errno == errno.ETXTBSY
        assert ovp.get("w.bin") == old
        assert "refused a writing open (ETXTBSY)" in ovp.log()
        r.seek(0)
        assert r.read() == old
    # the reader closed: the writer opens (its open waits, bounded, for the
    # reader's RELEASE), its bytes land in the tree
    with open(f, "r+b", buffering=0) as w:
        w.write(new)
        os.fsync(w.fileno())
    assert ovp.get("w.bin") == new
    # a new open reads the new version (through dstagefs, as it is not
    # cached whole yet), then is passed through once it is
    time.sleep(TIMEOUT + 0.2)
    before = ovp.passthrough_opens()
    assert f.read_bytes() == new
    assert ovp.passthrough_opens() == before
    wait_passed(ovp, f)
    assert f.read_bytes() == new


def test_changed_file_beside_an_open_of_the_old_version(ovp):
    old, new = os.urandom(MiB), os.urandom(MiB)
    ovp.put("c.bin", old)
    start_pt(ovp)
    f = ovp.pfs / "c.bin"
    assert f.read_bytes() == old
    wait_passed(ovp, f)
    with open(f, "rb", buffering=0) as r:
        # replaced underneath (another node): a new version
        ovp.put("t", new)
        os.rename("t", "c.bin", src_dir_fd=ovp.under, dst_dir_fd=ovp.under)
        time.sleep(TIMEOUT + 0.2)
        # an open of the new version must not join the old backing file
        # (it would read the old bytes): refused while the old one is open
        with pytest.raises(OSError) as e:
            open(f, "rb", buffering=0)
        assert e.value.errno == errno.ETXTBSY
        assert r.read() == old
    # closed: the new version reads right
    assert f.read_bytes() == new


def test_second_uid_refused_before_anything_is_passed_through(ovp, users):
    u = users.user("ovpt")
    users.reach(ovp.tmp)
    ovp.put("private.bin", b"secret" * 50000, 0o600)
    ovp.put("public.bin", b"public" * 50000, 0o644)
    os.chmod(ovp.pfs, 0o755)
    start_pt(ovp)
    for rel in ("private.bin", "public.bin"):
        (ovp.pfs / rel).read_bytes()  # cached whole, as root
        wait_passed(ovp, ovp.pfs / rel)  # and passed through
    hits = ovp.ds_counter("hits")
    time.sleep(0.2)  # the probes' RELEASEs
    before = ovp.passthrough_opens()
    r = users.run(u, ["cat", str(ovp.pfs / "private.bin")])
    assert r.returncode != 0 and b"Permission denied" in r.stderr
    assert ovp.passthrough_opens() == before  # refused before the cache
    r = users.run(u, ["cat", str(ovp.pfs / "public.bin")])
    assert r.returncode == 0 and r.stdout == b"public" * 50000
    assert ovp.ds_counter("hits") == hits  # read by the kernel


def test_verify_reads_always_never_passes_through(tool, tmp_path):
    o = Overlay(tool, tmp_path)
    try:
        o.env["DSTAGE_OVERLAY_PASSTHROUGH"] = "true"
        o.env["DSTAGE_CACHE_VERIFY_READS"] = "always"
        data = os.urandom(MiB)
        o.put("v.bin", data)
        start_pt(o)
        for _ in range(3):
            drop_pages(o.pfs / "v.bin")
            assert (o.pfs / "v.bin").read_bytes() == data
        assert o.passthrough_opens() == 0
        assert o.ds_counter("hits") > 0
    finally:
        o.close()
