"""The soak's short variant (tests/soak/soak.py; docs/testing.md, "Soak").

Runs the soak for $DSTAGE_SOAK_SECONDS (default 150) with a kill -9 every
60 s (the daemon first, then the mount), against radosgw through the fault
proxy when $DSTAGE_RGW_ENV names a running one (file:// datasets only
otherwise). Needs root, /dev/fuse and fusermount3; the build in
$DSTAGE_BUILD_DIR (default build/). Fails with the soak's summary: the
failures, counts by kind and the processes' samples."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_soak_short(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the soak mounts dstagefs and kills it: needs root")
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        pytest.skip("no /dev/fuse or fusermount3 (apt-get install fuse3)")
    secs = int(os.environ.get("DSTAGE_SOAK_SECONDS", "150"))
    build = os.environ.get("DSTAGE_BUILD_DIR", "build")
    if not os.path.isabs(build):
        build = str(REPO / build)
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(REPO / "tests" / "soak" / "soak.py"),
           "--duration", str(secs), "--kill-every", "60", "--build", build,
           "--json", str(out)]
    if os.environ.get("DSTAGE_RGW_ENV"):
        cmd += ["--rgw-env", os.environ["DSTAGE_RGW_ENV"]]
    # Bounded: the soak's own deadline, its setup and its 120 s join.
    p = subprocess.run(cmd, capture_output=True, timeout=secs + 600)
    assert p.returncode == 0, (p.stdout.decode(errors="replace")[-6000:] +
                               p.stderr.decode(errors="replace")[-3000:])


def _soak_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "soak", REPO / "tests" / "soak" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_flip_waits_for_a_fill_of_its_block(tmp_path):
    """The soak's flip must not write a block while a fill holds it: the
    fill's O_DIRECT write and a buffered write into the same pages can
    leave stale bytes in the page cache (soak.py, block_lock). A fill holds
    the OFD lock of byte CACHE_LOCK_BLOCK + b (lib/cache/cache_i.h)."""
    import fcntl
    import struct
    soak = _soak_module()
    bs, data_off = 65536, 8192
    path = tmp_path / "obj"
    hdr = soak.CACHE_HDR.pack(b"DSTGOBJ1", 1, bs, 3 * bs, data_off)
    path.write_bytes(hdr + bytes(data_off + 3 * bs - len(hdr)))
    filler = os.open(path, os.O_RDWR)
    try:
        flock = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET,
                            soak.CACHE_LOCK_BLOCK + 1, 1, 0)
        fcntl.fcntl(filler, fcntl.F_OFD_SETLK, flock)
        cases = [(100, True),  # the header: no block's data
                 (data_off + 10, True),  # block 0
                 (data_off + bs + 10, False),  # block 1, being filled
                 (data_off + bs - 1, False),  # its 3 bytes reach block 1
                 (data_off + 2 * bs, True)]  # block 2
        for off, free in cases:
            with open(path, "r+b") as fh:
                assert soak.block_lock(fh, off) is free, off
        unlock = struct.pack("hh4xqqi4x", fcntl.F_UNLCK, os.SEEK_SET,
                             soak.CACHE_LOCK_BLOCK + 1, 1, 0)
        fcntl.fcntl(filler, fcntl.F_OFD_SETLK, unlock)
        with open(path, "r+b") as fh:
            assert soak.block_lock(fh, data_off + bs + 10)
        # version 3: the header in the sidecar, the blocks from offset 0
        meta = tmp_path / "obj.meta"
        meta.write_bytes(soak.CACHE_HDR.pack(b"DSTGOBJ1", 3, bs, 3 * bs, 0))
        path.write_bytes(bytes(3 * bs))
        fcntl.fcntl(filler, fcntl.F_OFD_SETLK, flock)
        for off, free in [(10, True), (bs + 10, False), (bs - 1, False),
                          (2 * bs, True)]:
            with open(path, "r+b") as fh:
                assert soak.block_lock(fh, off) is free, off
        with open(meta, "r+b") as fh:
            assert soak.block_lock(fh, bs + 10)  # a sidecar: no data
    finally:
        os.close(filler)
