"""Integrity without a per-read hash (issue 31): cache.verify_reads and the
stager daemon's scrub (lib/glue/cachescrub.c, docs/cache.md), against a
real daemon, the real block cache and a real dstagefs mount, file://
sources.

- fill (the default): a byte flipped in a cached block is found by the
  scrub within its period (a 1 s interval here, polled with a bound), the
  block's record is cleared and the block fetched again from the source;
  `verify --cache` then finds the object whole without the source, and
  cachectl status (text and --json) and the daemon's metrics count the
  damaged and repaired block and the bytes scrubbed. With the source
  unreachable the block is dropped, counted as not repaired, and is then
  missing (not damaged) in the cache; --fetch-missing brings it back.
- Two daemons on one cache directory: one scrubs, the other waits for
  scrub.lock.
- always: with the scrub off, a flipped byte is never returned by a read
  through a dstagefs mount (whole-file and ranged reads): with the source
  unusable (its ETag changed) the damaged block's read fails with EIO and
  the other blocks read right; with the source back the file reads right.
"""
import errno
import fcntl
import json
import os
import struct
import subprocess

import pytest

from test_dstagefs import Dstagefs
from test_stager import MiB, Stager, data, make_dataset  # noqa: F401
from test_stager import stager_dir  # noqa: F401 (fixture)
from test_verify import (BLOCK, DATA_OFF, cache_files, flip, hide, metrics_port,
                         scrape, text, unhide)
from waits import wait_for

FILES = {"big.bin": data(7, 10 * MiB), "small.bin": data(8, 5000)}


def scrub_daemon(tool, root, rate="1G", interval="1s", verify="fill",
                 sock=None, metrics=True):
    env = dict(os.environ, DSTAGE_CACHE_SCRUB_RATE=rate,
               DSTAGE_CACHE_SCRUB_INTERVAL=interval,
               DSTAGE_CACHE_VERIFY_READS=verify)
    s = Stager(tool("stager"), root, env=env, sock=sock)
    if metrics:  # not for a config a dstagefs mount shares
        s.port = metrics_port()
        with open(s.cfg, "a") as f:
            f.write("[metrics]\nlisten = 127.0.0.1:%d\n" % s.port)
    return s.start()


def cachectl(tool, s, *args):
    p = subprocess.run([tool("cachectl"), "--config", str(s.cfg)] +
                       list(args), env=s.env, capture_output=True,
                       timeout=60)
    assert p.returncode == 0, text(p)
    return p


def status(tool, s):
    return json.loads(cachectl(tool, s, "status", "--json").stdout)


def big_file(root):
    big = [p for p in cache_files(root) if p.stat().st_size >= 10 * MiB]
    assert len(big) == 1, big
    return big[0]


def staged(s, root):
    src = root / "src"
    make_dataset(src, FILES)
    s.run("add", "ds", "file://%s/" % src, check=True)
    s.run("stage", "ds", "--wait", check=True)
    return src


def passes_after(tool, s, n):
    return wait_for(lambda: (lambda st: st if st["scrub_passes"] >= n and
                             not st["scrub_running"] else None)(
                        status(tool, s)),
                    "scrub pass %d" % n)


@pytest.fixture
def sdaemon(tool, stager_dir):  # noqa: F811
    s = scrub_daemon(tool, stager_dir)
    yield s
    s.stop()


def test_scrub_finds_and_repairs_a_flipped_byte(tool, sdaemon,
                                                stager_dir):  # noqa: F811
    s = sdaemon
    src = staged(s, stager_dir)
    st = status(tool, s)
    assert st["verify_reads"] == "fill" and st["scrub_enabled"] == 1
    assert st["scrub_rate"] == 1 << 30 and st["scrub_interval_ms"] == 1000
    # a pass over the staged cache, before the damage: nothing found
    first = passes_after(tool, s, status(tool, s)["scrub_passes"] + 1)
    assert first["scrub_damaged"] == 0, first
    big = big_file(stager_dir)
    flip(big, DATA_OFF + BLOCK + 2 * MiB + 77)  # block 1

    st = wait_for(lambda: (lambda x: x if x["scrub_damaged"] else None)(
                      status(tool, s)),
                  "the scrub to find the damage")
    assert (st["scrub_damaged"], st["scrub_repaired"],
            st["scrub_unrepaired"]) == (1, 1, 0), st
    log = s.log.read_text()
    assert ("scrub: ds/big.bin: block 1 (cache file %s) failed its "
            "checksum: fetched again from file://%s/" % (big, src)) in log
    # and never again: the next pass finds the cache whole
    st = passes_after(tool, s, st["scrub_passes"] + 2)
    # every object (the files and SHA256SUMS), every byte cached
    cached = sum(p.stat().st_size for p in src.iterdir())
    assert st["scrub_damaged"] == 1 and st["scrub_objects"] == 3, st
    assert st["scrub_bytes"] == cached, st
    assert st["scrub_pass_end"] >= st["scrub_pass_start"] > 0, st

    # repaired in place: whole in the cache with the source away
    hide(src)
    p = s.run("verify", "ds", "--cache")
    assert p.returncode == 0 and "all match" in text(p), text(p)
    unhide(src)

    out = cachectl(tool, s, "status").stdout.decode()
    assert "verify reads: fill" in out, out
    assert "damaged blocks found 1, repaired 1, not repaired 0" in out, out

    m = scrape(s.port)[0]
    assert m["dstage_scrub_damaged_blocks_total"] == 1
    assert m["dstage_scrub_repaired_blocks_total"] == 1
    assert m["dstage_scrub_unrepaired_blocks_total"] == 0
    assert m["dstage_scrub_bytes_total"] >= 2 * cached
    assert m["dstage_scrub_passes_total"] >= 2
    assert 0 <= m["dstage_scrub_pass_progress"] <= 1
    assert m["dstage_scrub_enabled"] == 1


def test_scrub_drops_a_block_it_cannot_fetch(tool, sdaemon,
                                             stager_dir):  # noqa: F811
    s = sdaemon
    src = staged(s, stager_dir)
    big = big_file(stager_dir)
    hide(src)
    # a pass under way when the source went away may hold the store open
    # (a file:// store keeps its directory's descriptor: renamed, it still
    # reads) and would repair the block: damage it once that pass is over
    passes_after(tool, s, status(tool, s)["scrub_passes"] + 1)
    flip(big, DATA_OFF + 2 * BLOCK + 5)  # block 2
    st = wait_for(lambda: (lambda x: x if x["scrub_damaged"] else None)(
                      status(tool, s)),
                  "the scrub to find the damage")
    assert (st["scrub_repaired"], st["scrub_unrepaired"]) == (0, 1), st
    assert "block 2 (cache file %s) failed its checksum: dropped from the " \
        "cache and not fetched again" % big in s.log.read_text()
    # its record is gone: missing now, not damaged (the object is no
    # longer complete, so it would leave passthrough at its next open)
    p = s.run("verify", "ds", "--cache")
    assert p.returncode == 1, text(p)
    assert "MISSING" in text(p) and "DAMAGED" not in text(p), text(p)
    unhide(src)
    p = s.run("verify", "ds", "--cache", "--fetch-missing")
    assert p.returncode == 0, text(p)
    hide(src)
    p = s.run("verify", "ds", "--cache")
    assert p.returncode == 0 and "all match" in text(p), text(p)
    unhide(src)


def test_one_scrub_per_cache_directory(tool, sdaemon,
                                       stager_dir):  # noqa: F811
    # a second daemon, its own socket and catalog, the same cache.dir
    other = stager_dir / "other"
    other.mkdir()
    s2 = Stager(tool("stager"), other, sock=other / "s.sock",
                env=dict(os.environ, DSTAGE_CACHE_SCRUB_INTERVAL="1s",
                         DSTAGE_CACHE_DIR=str(stager_dir / "cache")))
    # hold scrub.lock as a daemon does during a pass (an OFD lock); the
    # first daemon's passes over this small cache are short: retry
    lock = stager_dir / "cache" / "scrub.lock"
    wait_for(lock.exists, "scrub.lock")
    fd = os.open(lock, os.O_RDWR)
    fl = struct.pack("hhxxxxqqixxxx", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)

    def take():
        try:
            fcntl.fcntl(fd, getattr(fcntl, "F_OFD_SETLK", 37), fl)
            return True
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            return False
    try:
        wait_for(take, "the first daemon's pass to end")
    except BaseException:
        os.close(fd)
        raise
    try:
        s2.start()
        st = wait_for(lambda: (lambda x: x if x["scrub_waiting_lock"]
                               else None)(status(tool, s2)),
                      "the second daemon to wait for the lock")
        assert st["scrub_passes"] == 0 and not st["scrub_running"], st
        assert "another process scrubs" in s2.log.read_text()
    finally:
        os.close(fd)
        s2.stop()


def test_always_never_returns_a_flipped_byte(tool, stager_dir):  # noqa: F811
    s = scrub_daemon(tool, stager_dir, rate="0", verify="always",
                     metrics=False)
    mnt = None
    try:
        st = status(tool, s)
        assert st["verify_reads"] == "always" and st["scrub_enabled"] == 0
        assert "scrub: off" in cachectl(tool, s, "status").stdout.decode()
        src = staged(s, stager_dir)
        big = big_file(stager_dir)
        flip(big, DATA_OFF + BLOCK + 2 * MiB + 77)  # block 1
        env = dict(s.env, DSTAGE_CONFIG=str(s.cfg),
                   DSTAGE_CACHE_VERIFY_READS="always")
        mnt = Dstagefs(tool("dstagefs"), stager_dir / "mnt", env,
                       stager_dir / "mnt.log").start()
        # the source unusable for the mount's fetches: a file:// ETag is
        # size, mtime and inode, so another mtime fails every If-Match
        # (EIO, never bytes of another version)
        orig = (src / "big.bin").stat().st_mtime_ns
        os.utime(src / "big.bin", ns=(orig, orig + 10**9))
        f = mnt.mnt / "datasets" / "ds" / "big.bin"
        want = FILES["big.bin"]
        # the blocks around the damaged one read right
        with open(f, "rb") as r:
            assert r.read(BLOCK) == want[:BLOCK]
            r.seek(2 * BLOCK)
            assert r.read() == want[2 * BLOCK:]
        # the damaged block: an error, never its bytes (ranged, whole)
        for off, n in ((BLOCK + 2 * MiB, 4096), (BLOCK, BLOCK), (0, None)):
            with open(f, "rb") as r:
                r.seek(off)
                with pytest.raises(OSError) as e:
                    got = r.read() if n is None else r.read(n)
                    raise AssertionError("read %d+%s returned %d bytes%s" % (
                        off, n, len(got),
                        " (the flipped ones)" if got != want[off:off + len(
                            got)] else ""))
                assert e.value.errno == errno.EIO
        os.utime(src / "big.bin", ns=(orig, orig))
        with open(f, "rb") as r:
            assert r.read() == want
        assert "failed its checksum" in mnt.log_text()
    finally:
        if mnt:
            mnt.cleanup()
        s.stop()
