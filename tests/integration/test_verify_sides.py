"""stager verify: the node's cache and the source checked apart (issue 34),
beside test_verify.py (what verify --cache reports).

- `verify --cache` reads only the node's NVMe: it works with the source
  unreachable, reporting what the cache lacks or holds damaged instead of
  fetching it; `--repair` and `--fetch-missing` need the source and say so.
- `--source` and `--cache` disagree when only one side is wrong, each way:
  a source changed in place with the cache intact, and a cache damaged with
  the source intact.
"""
import hashlib
import json
import os

from test_stager import MiB, Stager, data, make_dataset  # noqa: F401
from test_stager import stager_dir  # noqa: F401 (fixture)
from test_verify import cache_files, flip

import pytest


@pytest.fixture
def daemon(tool, stager_dir):  # noqa: F811
    s = Stager(tool("stager"), stager_dir).start()
    yield s
    s.stop()


def cache_file_of(stager_dir, size):  # noqa: F811
    objs = [p for p in cache_files(stager_dir) if p.stat().st_size >= size]
    assert len(objs) == 1, objs
    return objs[0]


def staged(daemon, stager_dir, files):  # noqa: F811
    make_dataset(stager_dir / "src", files)
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    daemon.run("stage", "ds", "--wait", check=True)


def test_verify_cache_with_the_source_gone(daemon, stager_dir):  # noqa: F811
    """The source's directory itself is gone (test_verify.py's hide()
    keeps it, so the store opens): the job used to fail opening it."""
    files = {"big.bin": data(11, 6 * MiB), "small.txt": b"small\n"}
    staged(daemon, stager_dir, files)
    src = stager_dir / "src"
    gone = stager_dir / "src-away"
    src.rename(gone)
    try:
        p = daemon.run("verify", "ds", "--cache", "--json")
        assert p.returncode == 0, p.stdout + p.stderr
        res = json.loads(p.stdout)
        assert res["job"]["state"] == "done" and res["mismatches"] == []
        # The source is needed only to fetch, and nothing is fetched.
        assert daemon.run("verify", "ds", "--source").returncode != 0

        # A damaged block is found and reported, not fetched.
        flip(cache_file_of(stager_dir, 6 * MiB), 2 * MiB + 7)
        p = daemon.run("verify", "ds", "--cache")
        assert p.returncode == 1, p.stdout + p.stderr
        assert b"big.bin" in p.stdout and b"damaged" in p.stdout
        # Repairing needs the source: an error that names it.
        p = daemon.run("verify", "ds", "--cache", "--repair")
        assert p.returncode != 0
        assert str(src).encode() in p.stdout + p.stderr
    finally:
        gone.rename(src)
    p = daemon.run("verify", "ds", "--cache", "--repair")
    assert p.returncode == 0, p.stdout + p.stderr
    assert daemon.run("verify", "ds", "--cache").returncode == 0


def test_source_changed_cache_intact(daemon, stager_dir):  # noqa: F811
    """The source's bytes change in place (same size, mtime and inode:
    the ETag a file:// store derives stays): --source finds the mismatch,
    --cache still holds and verifies the registered bytes."""
    good = data(12, 3 * MiB + 1)
    staged(daemon, stager_dir, {"a.bin": good})
    path = stager_dir / "src" / "a.bin"
    st = path.stat()
    flip(path, MiB, 1)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    p = daemon.run("verify", "ds", "--cache", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["mismatches"] == []
    p = daemon.run("verify", "ds", "--source", "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    res = json.loads(p.stdout)
    assert [m["key"] for m in res["mismatches"]] == ["a.bin"]
    m = res["mismatches"][0]
    assert m["expected"] == hashlib.sha256(good).hexdigest()
    assert m["actual"] != m["expected"]


def test_cache_damaged_source_intact(daemon, stager_dir):  # noqa: F811
    staged(daemon, stager_dir, {"b.bin": data(13, 5 * MiB)})
    flip(cache_file_of(stager_dir, 5 * MiB), 3 * MiB + 11)

    p = daemon.run("verify", "ds", "--source")
    assert p.returncode == 0, p.stdout + p.stderr
    assert b"all match" in p.stdout
    p = daemon.run("verify", "ds", "--cache")
    assert p.returncode == 1, p.stdout + p.stderr
    assert b"b.bin" in p.stdout and b"damaged" in p.stdout
    # The cache's damage is the cache's: --repair mends it from the source.
    assert daemon.run("verify", "ds", "--cache", "--repair").returncode == 0
    assert daemon.run("verify", "ds", "--cache").returncode == 0
