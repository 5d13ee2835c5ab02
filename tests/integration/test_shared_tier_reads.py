# SPDX-License-Identifier: MIT
"""The shared tier read through dstagefs (issue 32): a node's mount fills its
cache from the dataset's copy on the parallel file system first, and reads
byte-exact whether the copy is complete, partial, damaged, gone, or
published only after the mount started; and eight nodes on one radosgw
with the tier on a real CephFS: the store serves the dataset's bytes about
once for the cluster, not once per node."""
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_dstagefs import Dstagefs
from test_metrics import free_port
from test_shared_tier import FILES, node, shared
from test_stager import Stager, data, make_dataset, stager_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import cluster_sim  # noqa: E402
from waits import wait_for


def mount(s, tool, name="mnt"):
    # the daemon has the config's metrics port: the mount its own
    env = dict(s.env, DSTAGE_CONFIG=str(s.cfg), DSTAGE_LOG_LEVEL="info",
               DSTAGE_METRICS_LISTEN="127.0.0.1:%d" % free_port())
    return Dstagefs(tool("dstagefs"), s.root / name, env,
                    s.root / (name + ".log")).start()


def read_exact(m, files, ds="ds"):
    root = m.mnt / "datasets" / ds
    for k, v in files.items():
        got = (root / k).read_bytes()
        assert hashlib.sha256(got).digest() == hashlib.sha256(v).digest(), k


def tier_stats(m):
    return {k: v for k, v in m.stats().items() if k.startswith("tier_")}


def one_node(tool, stager_dir, publish=True):
    """A node with the dataset registered; its copy published by the node
    itself when publish. Returns (stager, tier root, the copy's dir)."""
    tier = stager_dir / "pfs" / "tier"
    tier.mkdir(parents=True)
    make_dataset(stager_dir / "src", FILES)
    s = node(tool, stager_dir / "n", tier)
    s.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    d = None
    if publish:
        p, r = shared(s)
        assert p.returncode == 0, p.stderr
        d = r["dir"]
    return s, tier, d


def origin_gone(stager_dir):
    """Every file of the origin removed (its directory stays: it opens)."""
    for k in list(FILES) + ["SHA256SUMS"]:
        os.unlink(stager_dir / "src" / k)


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        c = f.read(1)
        f.seek(off)
        f.write(bytes([c[0] ^ 1]))


@contextlib.contextmanager
def mounted_node(tool, stager_dir, publish=True, before=None):
    """one_node's node with a mount; before(copy dir) runs before the
    mount starts. Yields (stager, tier root, copy dir, mount)."""
    s, tier, d = one_node(tool, stager_dir, publish)
    try:
        if before:
            before(d)
        m = mount(s, tool)
        try:
            yield s, tier, d, m
        finally:
            m.cleanup()
    finally:
        s.stop()


def test_mount_fills_from_the_tier_with_the_origin_gone(tool, stager_dir):
    with mounted_node(tool, stager_dir) as (_, _, d, m):
        origin_gone(stager_dir)
        read_exact(m, FILES)
        st = tier_stats(m)
        # every byte read came from the copy: nothing fell back
        assert st["tier_bytes"] >= sum(len(v) for v in FILES.values()), st
        assert all(v == 0 for k, v in st.items() if "fallbacks" in k), st
        assert "filling from its shared tier %s first" % d in \
            m.log_text(), m.log_text()[-2000:]


def test_mount_reads_right_from_a_damaged_tier(tool, stager_dir):
    def damage(d):
        flip(os.path.join(d, "data", "a.bin"), 2 * 1024 * 1024 + 7)

    with mounted_node(tool, stager_dir, before=damage) as (_, _, _, m):
        read_exact(m, FILES)
        st = tier_stats(m)
        assert st["tier_fallbacks_damaged"] >= 1, st
        assert st["tier_fallbacks_missing"] == 0, st
        assert "a.bin is damaged there" in m.log_text()
        # the other files still came from the copy
        assert st["tier_reads"] >= 2, st


def test_mount_reads_right_from_a_partial_tier(tool, stager_dir):
    def remove(d):
        os.unlink(os.path.join(d, "data", "dir", "b.bin"))

    with mounted_node(tool, stager_dir, before=remove) as (_, _, _, m):
        read_exact(m, FILES)
        st = tier_stats(m)
        assert st["tier_fallbacks_missing"] >= 1, st
        assert "dir/b.bin is missing there" in m.log_text()


def test_mount_reads_right_when_the_tier_goes_away(tool, stager_dir):
    with mounted_node(tool, stager_dir) as (_, tier, _, m):
        # the copy was there at the mount's start, then vanishes (the
        # parallel file system's directory removed under the mount)
        assert "filling from its shared tier" in m.log_text()
        shutil.rmtree(tier)
        read_exact(m, FILES)
        st = tier_stats(m)
        assert st["tier_bytes"] == 0, st
        assert sum(v for k, v in st.items() if "fallbacks" in k) >= 3, st


def test_copy_published_after_the_mount_started_is_used(tool, stager_dir):
    with mounted_node(tool, stager_dir, publish=False) as (s, _, _, m):
        first = {"dir/sub/c.txt": FILES["dir/sub/c.txt"]}
        read_exact(m, first)
        assert tier_stats(m)["tier_reads"] == 0
        p, r = shared(s)
        assert p.returncode == 0, p.stderr
        # the next poll finds the MANIFEST (one stat a poll, 1 s)
        wait_for(lambda: "filling from its shared tier %s first" %
                 r["dir"] in m.log_text(), what="the tier taken up")
        origin_gone(stager_dir)
        rest = {k: v for k, v in FILES.items() if k not in first}
        read_exact(m, rest)
        read_exact(m, first)  # from the node's cache
        st = tier_stats(m)
        assert st["tier_bytes"] >= len(FILES["a.bin"]), st
        assert all(v == 0 for k, v in st.items() if "fallbacks" in k), st


# ---- eight nodes, one radosgw, the tier on CephFS ----

NODES = 8
OBJECTS = 12


def test_eight_nodes_store_serves_the_dataset_about_once(
        tool, faultproxy, cephfs, tmp_path):
    """Eight nodes (each its own daemon, catalog, cache and mount) with the
    tier on CephFS: all race `stage --shared --wait` (one copies, the
    others wait for its MANIFEST), then four stage into their caches and
    four only read through their mounts. The proxy in front of radosgw
    counts the object bytes it served: at most 1.1x the dataset's size
    (without the tier: 8x, test_manynodes.py)."""
    rgw = faultproxy.rgw
    bucket = "tier8-" + os.urandom(4).hex()
    rgw.make_bucket(bucket)
    files = {"f%02d.bin" % i: data(800 + i, (384 << 10) + 1000 * i)
             for i in range(OBJECTS)}
    sums = "".join("%s  %s\n" % (hashlib.sha256(v).hexdigest(), k)
                   for k, v in sorted(files.items())).encode()
    for k, v in files.items():
        assert rgw.put_object(bucket, "ds/" + k, v) == 200
    assert rgw.put_object(bucket, "ds/SHA256SUMS", sums) == 200
    size = sum(len(v) for v in files.values()) + len(sums)
    tier = cephfs.mount / ("tier8-%d-%s" % (os.getpid(), os.urandom(3).hex()))
    tier.mkdir()
    os.chmod(tier, 0o755)
    nodes, mounts = [], []
    try:
        for i in range(NODES):
            root = tmp_path / ("node%d" % i)
            root.mkdir()
            os.chmod(root, 0o755)
            s = Stager(tool("stager"), root, env=faultproxy.env())
            with open(s.cfg, "a") as f:
                f.write("[sources]\nshared_tier_root = %s\n"
                        "shared_tier_lease = 5s\n" % tier)
            nodes.append(s.start())
        for s in nodes:
            s.run("add", "ds", "s3://%s/ds/" % bucket, check=True)
        faultproxy.reset_stats()
        procs = [subprocess.Popen(
            [s.exe, "--config", str(s.cfg), "stage", "ds", "--shared",
             "--wait", "--json"], env=s.env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE) for s in nodes]
        outs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0] * NODES, outs
        copied = sorted(int(json.loads(o[0])["copied"])
                        for o in outs)
        assert copied == [0] * (NODES - 1) + [OBJECTS + 1], copied
        for s in nodes[:NODES // 2]:
            s.run("stage", "ds", "--wait", check=True, timeout=300)
        for s in nodes:
            mounts.append(mount(s, tool))
        for m in mounts:
            read_exact(m, files)
        for m in mounts[NODES // 2:]:
            st = tier_stats(m)
            assert st["tier_bytes"] >= size - len(sums), st
            assert all(v == 0 for k, v in st.items() if "fallbacks" in k), st
        served = faultproxy.body_bytes("GET", query="")
        reqs = faultproxy.requests()
    finally:
        for m in mounts:
            m.cleanup()
        for s in nodes:
            s.stop()
        rgw.drop_bucket(bucket, ["ds/" + k for k in
                                 list(files) + ["SHA256SUMS"]])
        shutil.rmtree(tier, ignore_errors=True)
    print("8 nodes, shared tier on CephFS: store served %d object bytes for "
          "a %d-byte dataset (%.2fx) in %d requests"
          % (served, size, served / size, len(reqs)))
    assert size - len(sums) <= served <= 1.1 * size, (served, size)
    # the model of the same shape: the publisher's reads alone
    r = cluster_sim.predict_tier(nodes=NODES, objects=OBJECTS + 1,
                                 object_size=size / (OBJECTS + 1),
                                 part_size=8 << 20, extra=0, jitter=0,
                                 store_rps=1e9, dt=0.01)
    assert r["store_bytes"] == size * 1.0 or \
        abs(r["store_bytes"] - size) <= 1, r
    data_gets = sum(1 for q in reqs if q["method"] == "GET" and
                    not q["query"])
    assert data_gets <= r["store_requests"] * 1.25 + 2, (data_gets, r)
