"""bench/mlperf_bench.py's harness (issue 45), not speed: the emulated
accelerators, the AU arithmetic and the search for the most accelerators
at the floor, on a tiny data set on local disk (seconds; needs torch,
Debian's python3-torch). Timing enters only through wide bounds: a
reader that is never the bottleneck keeps AU near 1, one forced to take
several times the compute per step falls far below the floor."""
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import mlperf_bench as mb  # noqa: E402

pytest.importorskip("torch")


def test_au_of_leaves_out_first_step():
    # rank 1: a 10 s first step (ignored), then 2 steps of 0.1 wait + 0.3 compute
    steps = [[(10.0, 0.3), (0.1, 0.3), (0.1, 0.3)], [(5.0, 0.3), (0.0, 0.3)]]
    assert mb.au_of(steps) == pytest.approx(0.9 / 1.1)
    assert mb.au_of([[(1.0, 0.3)]]) == 0.0  # nothing after the first step


def test_search_doubles_then_bisects():
    seen = []

    def trial(n):
        seen.append(n)
        return {"au": 0.95 if n <= 5 else 0.5}
    n, tried, hit = mb.search(trial, 0.9, 8, 60)
    assert (n, hit) == (5, False)
    assert seen == [1, 2, 4, 8, 6, 5]
    n, _, _ = mb.search(lambda k: {"au": 0.1}, 0.9, 8, 60)
    assert n == 0
    seen.clear()
    n, _, _ = mb.search(trial, 0.9, 3, 60)  # the cap is tried, not passed
    assert n == 3 and seen == [1, 2, 3]


def test_scaled_workloads_keep_published_floors():
    prof = mb.PROFILES["full"]
    for wl, p in mb.PUBLISHED.items():
        w = mb.scaled(wl, prof)
        assert w["floor"] == p["floor"] and w["threads"] == p["threads"]
        assert w["files"] == prof["n_max"] * w["steps"] * w["batch"]
        assert mb.NAMES[wl] in mb.scale_text(wl, prof)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    w = mb.scaled("unet3d", mb.PROFILES["tiny"])
    w = dict(w, compute=0.05, steps=6, threads=2)
    root = tmp_path_factory.mktemp("mlperf")
    keys = mb.make_files(str(root), dict(w, files=2 * w["steps"] * w["batch"]))
    return w, [str(root / k) for k in keys]


def test_fast_reader_keeps_au_near_one(tiny):
    w, paths = tiny
    drops = []
    r = mb.run_trial(paths, w, 2, epochs=2, before_epoch=lambda: drops.append(1), cap_s=30)
    assert drops == [1, 1] and len(r["epochs"]) == 2
    for e in r["epochs"]:
        assert not e["truncated"]
        # every rank read its shard: n x steps x batch files
        assert e["bytes"] == sum(Path(p).stat().st_size for p in paths)
        # reading a few small files a step takes far less than 50 ms: only a
        # machine loaded many times over its cores pulls this down
        assert e["au"] > 0.6, r
    assert r["au"] == pytest.approx(sum(e["au"] for e in r["epochs"]) / 2, abs=1e-3)


def test_slow_reader_falls_below_floor_and_search_stops(tiny):
    w, paths = tiny
    calls = []

    def trial(n):
        calls.append(n)
        # every sample takes 8x a step's compute: with 2 workers a batch
        # arrives every ~4 computes at best (batch 1), AU about 1/4
        return mb.run_trial(paths, w, n, epochs=1, cap_s=30, delay=8 * w["compute"] * w["batch"])
    n, tried, hit = mb.search(trial, w["floor"], 2, 120)
    assert n == 0 and calls == [1] and not hit
    assert tried[1]["au"] < 0.45
    e = mb.entry(n, tried, hit)
    assert e["value"] == 0 and e["au_by_n"]["1"] == [tried[1]["au"]]
