"""Known-order prefetch (.dstage/prefetch) within the cache's space: a list
larger than the cache streams through without evicting what the reader has
not read yet (docs/cache.md, "Readahead and prefetch").

Real dstagefs mounts over radosgw, through the counting proxy
(tests/faultproxy.py): every GET the mount makes is in its log.
"""
import os
import subprocess
import time

import pytest

from test_dstagefs import Env

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

MiB = 1 << 20
CACHE = 32 * MiB
OBJ = MiB  # one block (cache.block_size 4M): one GET per object
N = 96  # 3 x the cache
# What one entry is charged (lib/cache/cache_ahead.c, cache_pf_cost): its bytes
# and a page of header and records; the budget is half the cache.
COST = OBJ + 8192
AHEAD = (CACHE // 2) // COST


def _body(prefix, i):
    """1 MiB that names its object, then filler."""
    head = ("%s%03d:" % (prefix, i)).encode()
    return (head * (OBJ // len(head) + 1))[:OBJ]


def _put_all(faultproxy, tool, tmp_path, url, prefix, n):
    ot = tool("objstore_tool")
    f = tmp_path / "body"
    for i in range(n):
        f.write_bytes(_body(prefix, i))
        subprocess.run([ot, url, "put", "%s%03d" % (prefix, i), str(f)],
                       env=faultproxy.env(), check=True,
                       capture_output=True, timeout=60)


def _env(tool, tmp_path, faultproxy, **extra):
    """A 32 MiB cache, 4 GETs in flight: a reservation in flight may be
    counted twice for a moment (on disk and in flight, see cache_scan), so
    what is in flight stays small beside the cache, or a fill finds no room
    and its block is fetched again."""
    e = Env(tool, tmp_path / "env", extra_env=faultproxy.env(**extra))
    e.cfg.write_text(
        "[cache]\ndir = %s\nsize = %d\n[catalog]\npath = %s\n"
        "[s3]\nmax_inflight = 4\n" %
        (e.tmp / "cache", CACHE, e.tmp / "catalog.db"))
    return e


def _write_list(m, lines):
    with open(m.mnt / ".dstage" / "prefetch", "w") as f:
        f.write("".join(x + "\n" for x in lines))
    deadline = time.time() + 10
    while "objects" not in (m.mnt / ".dstage" / "prefetch").read_text():
        assert time.time() < deadline
        time.sleep(0.05)


def _fetched(faultproxy, path_part):
    """Distinct objects under path_part GET so far, and GETs per object."""
    per = {}
    for r in faultproxy.requests():
        if r["method"] == "GET" and path_part in r["target"]:
            k = r["target"].split("?")[0]
            per[k] = per.get(k, 0) + 1
    return per


def test_list_larger_than_cache_fetched_once(faultproxy, tool, tmp_path):
    """A list of 3 x cache.size, read in list order by a reader slower than
    the prefetch: every object comes from the store exactly once (nothing
    prefetched is evicted before it is read), the bytes are right, and the
    prefetch never runs more than its budget (half of cache.size) ahead.
    Without the holds, or without the wait for the reader, objects are
    fetched twice or far ahead."""
    bucket = faultproxy.rgw.make_bucket("fs-pf-space")
    url = "s3://%s/sp/" % bucket
    _put_all(faultproxy, tool, tmp_path, url, "o", N)
    e = _env(tool, tmp_path, faultproxy)
    try:
        e.catalog("add", "pfs", url)
        m = e.mount()
        ds = m.mnt / "datasets" / "pfs"
        names = ["o%03d" % i for i in range(N)]
        assert sorted(os.listdir(ds)) == names
        faultproxy.reset_stats()
        _write_list(m, ["datasets/pfs/" + k for k in names])
        worst = 0
        for i, k in enumerate(names):
            # Let the prefetch run ahead as far as it will.
            time.sleep(0.15 if i < 2 else 0.05)
            ahead = len(_fetched(faultproxy, "/sp/o")) - i
            worst = max(worst, ahead)
            assert ahead <= AHEAD + 1, (i, ahead, AHEAD)
            assert (ds / k).read_bytes() == _body("o", i), k
        per = _fetched(faultproxy, "/sp/o")
        twice = {k: v for k, v in per.items() if v != 1}
        assert len(per) == N and not twice, (len(per), twice)
        # It did run ahead (a reader alone would never be ahead).
        assert worst >= AHEAD // 2, worst
        assert m.stats()["bytes_from_source"] == N * OBJ
    finally:
        e.cleanup()


def test_reader_that_stops_does_not_wedge_the_cache(faultproxy, tool,
                                                    tmp_path):
    """A reader that reads two entries and stops: after its idle time
    (DSTAGE_PREFETCH_IDLE_S, 2 s here; 30 s by default) the prefetch lets
    go what it held and ends, so another dataset of 2/3 of the cache is
    cached whole (its second read fetches nothing). With the holds kept,
    it would not fit beside them."""
    bucket = faultproxy.rgw.make_bucket("fs-pf-stop")
    url = "s3://%s/st/" % bucket
    other = "s3://%s/ot/" % bucket
    _put_all(faultproxy, tool, tmp_path, url, "s", N)
    n_other = 20  # 5/8 of the cache: does not fit beside 16 MiB held
    _put_all(faultproxy, tool, tmp_path, other, "t", n_other)
    e = _env(tool, tmp_path, faultproxy, DSTAGE_PREFETCH_IDLE_S="2")
    try:
        e.catalog("add", "pst", url)
        e.catalog("add", "oth", other)
        m = e.mount()
        ds = m.mnt / "datasets" / "pst"
        _write_list(m, ["datasets/pst/s%03d" % i for i in range(N)])
        for i in range(2):
            assert (ds / ("s%03d" % i)).read_bytes() == _body("s", i)
        # The budget fills, then the prefetch waits for a reader that
        # does not come.
        deadline = time.time() + 30
        while "read none of the list" not in m.log_text():
            assert time.time() < deadline, m.log_text()[-2000:]
            time.sleep(0.2)
        ahead = len(_fetched(faultproxy, "/st/s"))
        assert ahead <= 2 + AHEAD + 1, ahead
        od = m.mnt / "datasets" / "oth"
        for i in range(n_other):
            assert (od / ("t%03d" % i)).read_bytes() == _body("t", i)
        # A fresh mount on the same cache: nothing from the kernel's page
        # cache, every read reaches the cache.
        assert m.stop() == 0
        m2 = e.mount(name="mnt2")
        od = m2.mnt / "datasets" / "oth"
        faultproxy.reset_stats()
        for i in range(n_other):
            assert (od / ("t%03d" % i)).read_bytes() == _body("t", i)
        again = _fetched(faultproxy, "/ot/t")
        assert not again, again
    finally:
        e.cleanup()
