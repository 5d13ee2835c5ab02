"""FUSE over io_uring (issue 31, docs/dstagefs.md "FUSE over io_uring"):
dstagefs built on libfuse >= 3.18 (DSTAGE_LIBFUSE_SUITE=sid
scripts/install-deps) and mounted with -o io_uring takes the kernel's
requests on the ring when the fuse module offers it (its enable_uring
parameter), says at mount whether the kernel offers it, and counts the
requests that came over the ring (.dstage/stats fs_uring_requests): the same
bytes either way.

Skipped on a build against libfuse < 3.18 (no "io_uring:" line at mount:
CI's build is trixie's 3.17) and where the parameter cannot be set (not
root); the parameter is put back after each test.
"""
import os

import pytest

from test_passthrough import data_set, mount_on, penv, stage  # noqa: F401

PARAM = "/sys/module/fuse/parameters/enable_uring"
MiB = 1 << 20


def uring_lines(m):
    """The mount's line on whether the kernel offers io_uring."""
    return [line for line in m.log_text().splitlines()
            if "io_uring: offered" in line or "io_uring: not offered" in line]


@pytest.fixture
def uring_param():
    """set(on): the fuse module's enable_uring, put back at the end."""
    try:
        with open(PARAM) as f:
            was = f.read().strip()
    except OSError as e:
        pytest.skip(f"{PARAM}: {e.strerror}")

    def set_(on):
        try:
            with open(PARAM, "w") as f:
                f.write("Y\n" if on else "N\n")
        except OSError as e:
            pytest.skip(f"{PARAM} cannot be set: {e.strerror}")
    yield set_
    with open(PARAM, "w") as f:
        f.write(was + "\n")


def test_requests_over_io_uring_same_bytes(penv, uring_param):  # noqa: F811
    files = {"staged.bin": os.urandom(2 * MiB + 5),
             "cold.bin": os.urandom(3 * MiB + 7),
             "cold2.bin": os.urandom(MiB + 3)}
    src = data_set(penv, "u", files)
    stage(penv, src, "u", "staged.bin")

    # Not offered: the line says so (a build on libfuse < 3.18 has no such
    # line, nor the option), and nothing comes over a ring.
    uring_param(False)
    m = mount_on(penv, name="m0")
    lines = uring_lines(m)
    if not lines:
        pytest.skip("built against libfuse < 3.18 (no io_uring line at mount)")
    assert len(lines) == 1 and "not offered by the kernel" in lines[0], lines
    assert m.stop() == 0
    m = mount_on(penv, opts=["-o", "io_uring"], name="m0b")
    assert (m.mnt / "datasets/u/cold.bin").read_bytes() == files["cold.bin"]
    assert m.stats()["fs_uring_requests"] == 0
    assert "requests arrive on the kernel's ring" not in m.log_text()
    assert m.stop() == 0

    # Offered and asked for: the requests (a LOOKUP, the READs of the
    # file the cache does not hold) arrive on the ring; the staged file is
    # still passed through (no READ at all).
    uring_param(True)
    m = mount_on(penv, opts=["-o", "io_uring"], name="m1")
    lines = uring_lines(m)
    assert len(lines) == 1 and "offered by the kernel" in lines[0], lines
    before = m.stats()
    for k in ("staged.bin", "cold2.bin"):
        assert (m.mnt / "datasets/u" / k).read_bytes() == files[k]
    st = m.stats()
    assert st["fs_uring_requests"] > before["fs_uring_requests"], st
    assert "requests arrive on the kernel's ring" in m.log_text()
    assert st["fs_passthrough_opens"] == before["fs_passthrough_opens"] + 1
    assert st["fs_reads"] > before["fs_reads"], st     # cold2.bin's
    assert st["bytes_from_source"] >= len(files["cold2.bin"]), st
    assert m.stop() == 0

    # Offered, not asked for: /dev/fuse as before.
    m = mount_on(penv, name="m2")
    for k, v in files.items():
        assert (m.mnt / "datasets/u" / k).read_bytes() == v
    assert m.stats()["fs_uring_requests"] == 0
    assert m.stop() == 0
