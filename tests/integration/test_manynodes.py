"""Many nodes, one store (issue 18): start jitter for scheduled staging
(`stager stage --jitter`, the Slurm prolog's DSTAGE_STAGE_JITTER) and eight
independent "nodes" on this machine (each its own cache, catalog, socket,
stager daemon and <cache.dir>/ratelimit) staging one dataset from radosgw
through the counting fault proxy: every node verifies, the request rate the
proxy sees stays under the nodes' combined limit, and the measurement
agrees with bench/cluster_sim.py's prediction for 8 nodes."""
import hashlib
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_stager import Stager, data, make_dataset

ROOT = Path(__file__).resolve().parents[2]
PROLOG = ROOT / "packaging" / "slurm" / "prolog"
JITTER_LINE = re.compile(
    rb"stager: start jitter: waiting (\d+)\.(\d{3}) s of at most (\d+) s")


def chosen_jitter(stderr):
    """The delay (s) and bound (s) a `stage --jitter` said it waits."""
    m = JITTER_LINE.search(stderr)
    assert m, stderr
    return int(m.group(1)) + int(m.group(2)) / 1000, int(m.group(3))


def test_stage_jitter_waits_a_bounded_random_time(tool, tmp_path):
    os.chmod(tmp_path, 0o755)
    make_dataset(tmp_path / "src", {"a.bin": data(1, 100000)})
    s = Stager(tool("stager"), tmp_path).start()
    try:
        s.run("add", "ds", "file://%s/src/" % tmp_path, check=True)
        seen = []
        for _ in range(4):
            t0 = time.monotonic()
            p = s.run("stage", "ds", "--wait", "--jitter", "1", check=True)
            took = time.monotonic() - t0
            delay, bound = chosen_jitter(p.stderr)
            assert bound == 1 and 0 <= delay <= 1, p.stderr
            # the wait was applied before the stage (and the stage done)
            assert took >= delay - 0.005, (took, delay)
            seen.append(delay)
        # random: four draws from 0-1000 ms are not all the same
        assert len(set(seen)) > 1, seen
        # no jitter without the option; out of range refused
        p = s.run("stage", "ds", "--wait", check=True)
        assert b"start jitter" not in p.stderr
        p = s.run("stage", "ds", "--jitter", "86401")
        assert p.returncode == 2 and b"--jitter 86401" in p.stderr
    finally:
        s.stop()


def fake_stager(path, log):
    """A stager stand-in for the prolog: records its arguments, says a jitter
    like the real one."""
    path.write_text(
        "#!/bin/bash\n"
        "echo \"$*\" >> %s\n"
        "for a in \"$@\"; do [ \"$a\" = --jitter ] && "
        "echo 'stager: start jitter: waiting 0.123 s of at most 7 s "
        "(--jitter)' >&2; done\n"
        "exit 0\n" % log)
    path.chmod(0o755)


@pytest.mark.parametrize("jitter,first", [("7", "--jitter 7"), ("0", None),
                                          ("junk", None)])
def test_prolog_jitters_only_the_first_stage(tmp_path, jitter, first):
    log = tmp_path / "calls"
    fake_stager(tmp_path / "stager", log)
    env = dict(os.environ, SLURM_JOB_ID="42",
               SLURM_JOB_COMMENT="dstage:ds1,ds2",
               DSTAGE_STAGER=str(tmp_path / "stager"),
               DSTAGE_SLURM_STATE=str(tmp_path / "state"),
               DSTAGE_STAGE_JITTER=jitter)
    p = subprocess.run(["bash", str(PROLOG)], env=env, capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2, calls
    assert calls[0].startswith("stage ds1 --wait")
    assert calls[1] == "stage ds2 --wait"
    if first:
        assert calls[0] == "stage ds1 --wait " + first
        assert b"start jitter: waiting 0.123 s" in p.stderr
    else:
        assert calls[0] == "stage ds1 --wait"
    if jitter == "junk":
        assert b"DSTAGE_STAGE_JITTER='junk'" in p.stderr


# ---- the model (bench/cluster_sim.py) ----

sys.path.insert(0, str(ROOT / "bench"))
import cluster_sim  # noqa: E402


def test_model_rate_bound_nodes_match_the_limits():
    """A few nodes well under the store's capacity: the store sees the sum
    of the per-node limits, and each node takes its jitter plus its
    requests at its limit."""
    r = cluster_sim.predict(nodes=8, req_limit=4, jitter=2, objects=40,
                            object_size=256 << 10, part_size=256 << 10,
                            extra=0, store_rps=1e9, dt=0.01)
    assert r["throttled_503"] == 0 and r["staged_nodes"] == 8
    # burst of 4 then 4/s: 9 s after its start, each node
    assert 8.5 <= r["time_to_staged_max_s"] <= 2 + 9.5
    assert r["mean_rps"] <= 8 * 4 * 1.1
    # any second: at most each node's burst plus a second's worth
    assert r["peak_rps"] <= 8 * (4 + 4)


def test_model_store_capacity_bounds_1000_nodes():
    """1,000 nodes whose limits add up past the store's capacity: the
    store's 503s and the nodes' AIMD keep the served rate at the capacity,
    and every node finishes."""
    r = cluster_sim.predict(nodes=1000, req_limit=20, jitter=5,
                            objects=200, object_size=1 << 20,
                            part_size=8 << 20, extra=2, store_rps=5000,
                            store_bw=1e12, dt=0.05, max_time=600)
    assert r["staged_nodes"] == 1000
    assert r["peak_rps"] <= 5000
    assert r["throttled_503"] > 0
    # 202,000 requests at most 5,000 a second
    assert r["time_to_staged_max_s"] >= 202000 / 5000


def test_model_jitter_lowers_the_peak():
    base = dict(nodes=200, req_limit=10, objects=20, object_size=1 << 20,
                part_size=8 << 20, extra=0, store_rps=1e9, dt=0.02)
    burst = cluster_sim.predict(jitter=0, **base)
    spread = cluster_sim.predict(jitter=20, **base)
    assert spread["peak_rps"] < burst["peak_rps"] / 2


# ---- eight nodes, one radosgw ----

NODES = 8
LIMIT = 4  # s3.max_requests_per_second per node
JITTER = 2
OBJECTS = 24
OBJ_SIZE = 256 << 10


def most_in(ts, window):
    """The largest number of timestamps within any window (s)."""
    best, j = 0, 0
    for i, t in enumerate(ts):
        while ts[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


def test_eight_nodes_stage_one_dataset_under_the_total_limit(
        tool, faultproxy, tmp_path):
    rgw = faultproxy.rgw
    bucket = "manynodes-" + os.urandom(4).hex()
    rgw.make_bucket(bucket)
    files = {"f%02d.bin" % i: data(500 + i, OBJ_SIZE)
             for i in range(OBJECTS)}
    sums = "".join("%s  %s\n" % (hashlib.sha256(v).hexdigest(), k)
                   for k, v in sorted(files.items()))
    for k, v in files.items():
        assert rgw.put_object(bucket, "ds/" + k, v) == 200
    assert rgw.put_object(bucket, "ds/SHA256SUMS", sums.encode()) == 200
    env = faultproxy.env(DSTAGE_S3_MAX_REQUESTS_PER_SECOND=str(LIMIT),
                         DSTAGE_S3_BACKOFF_BASE="20ms",
                         DSTAGE_S3_BACKOFF_MAX="500ms",
                         DSTAGE_S3_DEADLINE="120s")
    nodes = []
    try:
        for i in range(NODES):
            root = tmp_path / ("node%d" % i)
            root.mkdir()
            os.chmod(root, 0o755)
            nodes.append(Stager(tool("stager"), root, env=env).start())
        for s in nodes:
            s.run("add", "ds", "s3://%s/ds/" % bucket, check=True)
        faultproxy.reset_stats()
        t0 = time.monotonic()
        procs = [subprocess.Popen(
            [s.exe, "--config", str(s.cfg), "stage", "ds", "--wait",
             "--jitter", str(JITTER)], env=s.env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE) for s in nodes]
        took, outs = [None] * NODES, [None] * NODES
        while None in took and time.monotonic() - t0 < 300:
            for i, p in enumerate(procs):
                if took[i] is None and p.poll() is not None:
                    took[i] = time.monotonic() - t0
                    outs[i] = p.communicate(timeout=10)
            time.sleep(0.02)
        for p in procs:
            if p.poll() is None:
                p.kill()
        assert None not in took, "a stage did not end within 300 s"
        for i, p in enumerate(procs):
            assert p.returncode == 0, (i, outs[i])
            chosen_jitter(outs[i][1])
        reqs = faultproxy.requests()
        served = faultproxy.body_bytes("GET", query="")
        # every node verifies, and kept its limits in its own shared file
        for s in nodes:
            assert s.run("verify", "ds", "--cache").returncode == 0
            st = (s.root / "cache" / "ratelimit").stat()
            assert stat.S_IMODE(st.st_mode) == 0o600
    finally:
        for s in nodes:
            s.stop()
        rgw.drop_bucket(bucket, ["ds/" + k for k in
                                 list(files) + ["SHA256SUMS"]])
    # without a shared tier the store serves the dataset once per node
    # (with one: about once in all, test_shared_tier_reads.py)
    size = OBJECTS * OBJ_SIZE + len(sums)
    print("8 nodes, no shared tier: store served %d object bytes for a "
          "%d-byte dataset (%.2fx)" % (served, size, served / size))
    assert served >= NODES * OBJECTS * OBJ_SIZE, (served, size)
    ts = sorted(r["t"] for r in reqs)
    assert len(ts) >= NODES * OBJECTS, len(ts)
    total = NODES * LIMIT
    span = ts[-1] - ts[0]
    peak1, peak4 = most_in(ts, 1.0), most_in(ts, 4.0)
    mean = len(ts) / span
    print("8 nodes: %d requests in %.1f s (mean %.1f/s), peak %d in 1 s, "
          "%d in 4 s; stages took %s" % (len(ts), span, mean, peak1, peak4,
                                         ["%.1f" % t for t in took]))
    # the configured total: each node's bucket holds one second's worth, so
    # any window of W s sees at most total x (W + 1)
    assert peak1 <= total * 2, peak1
    assert peak4 <= total * 5, peak4
    assert mean <= total * 1.1, mean
    # the model, given the same shape (requests per node as measured)
    per_node = len(ts) / NODES
    r = cluster_sim.predict(nodes=NODES, req_limit=LIMIT, jitter=JITTER,
                            objects=int(round(per_node)),
                            object_size=OBJ_SIZE, part_size=OBJ_SIZE,
                            extra=0, store_rps=1e9, latency=0.02, dt=0.01)
    print("model for 8: peak %d/s, mean %.1f/s, time-to-staged max %.1f s"
          % (r["peak_rps"], r["mean_rps"], r["time_to_staged_max_s"]))
    # within 35% (plus 2 s of CLI start and --wait polling for the time)
    assert abs(max(took) - r["time_to_staged_max_s"]) <= \
        0.35 * r["time_to_staged_max_s"] + 2.0, (took, r)
    assert abs(mean - r["mean_rps"]) <= 0.35 * r["mean_rps"], (mean, r)
    assert peak1 <= r["peak_rps"] * 1.35 + 4, (peak1, r)
