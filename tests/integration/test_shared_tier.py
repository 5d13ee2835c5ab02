# SPDX-License-Identifier: MIT
"""The shared tier (issue 32): `stager stage NAME --shared` copies a
dataset's snapshot once into a directory of the parallel file system, under
a lease kept there, every file checked against SHA256SUMS before it is
published and a MANIFEST written last."""
import hashlib
import json
import os
import subprocess
import time

import pytest

from test_metrics import free_port, http, parse_metrics
from test_stager import Stager, data, make_dataset, stager_dir  # noqa: F401

MiB = 1 << 20

FILES = {"a.bin": data(1, 3 * MiB + 5), "dir/b.bin": data(2, 100000),
         "dir/sub/c.txt": b"hello\n", "empty": b""}


def node(tool, root, tier_root):
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    s = Stager(tool("stager"), root)
    s.port = free_port()
    with open(s.cfg, "a") as f:
        f.write("[sources]\nshared_tier_root = %s\n"
                "shared_tier_lease = 2s\n"
                "[metrics]\nlisten = 127.0.0.1:%d\n" % (tier_root, s.port))
    return s.start()


def tier_metrics(s):
    st, body = http("http://127.0.0.1:%d/metrics" % s.port)
    assert st == 200, body
    m = parse_metrics(body)[0]
    return {k: v for k, v in m.items() if k.startswith("dstage_shared_tier")}


@pytest.fixture
def two_nodes(tool, stager_dir):
    tier = stager_dir / "pfs" / "tier"
    tier.mkdir(parents=True)
    make_dataset(stager_dir / "src", FILES)
    nodes = [node(tool, stager_dir / ("n%d" % i), tier) for i in range(2)]
    for s in nodes:
        s.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    yield nodes, tier
    for s in nodes:
        s.stop()


def shared(s, *args):
    p = s.run("stage", "ds", "--shared", "--json", *args)
    return p, (json.loads(p.stdout) if p.returncode == 0 else None)


def tmp_files(tier):
    return [p for p in tier.rglob("*") if ".dstage-tmp" in p.name]


def check_copy(d):
    d = os.fspath(d)
    for k, v in FILES.items():
        with open(os.path.join(d, "data", k), "rb") as f:
            assert f.read() == v, k
    lines = open(os.path.join(d, "MANIFEST")).read().splitlines()
    assert lines[0] == "dstage-shared-tier 1"
    assert lines[1] == "dataset ds"
    assert lines[2] == "snapshot " + os.path.basename(d)
    assert lines[3] == "files %d" % (len(FILES) + 1)  # and SHA256SUMS
    keys = {ln.split(" ", 3)[3]: ln.split(" ")[0] for ln in lines[5:]}
    for k, v in FILES.items():
        assert keys[k] == hashlib.sha256(v).hexdigest(), k


def test_stage_shared_publishes_once(two_nodes):
    (a, b), tier = two_nodes
    p, r = shared(a)
    assert p.returncode == 0, p.stderr
    assert r["state"] == "published" and int(r["copied"]) == len(FILES) + 1
    assert r["dir"].startswith(str(tier / "ds") + "/")
    check_copy(r["dir"])
    assert not os.path.exists(os.path.join(r["dir"], ".lease"))
    # another node with the same listing: the same snapshot, nothing copied
    p, r2 = shared(b)
    assert p.returncode == 0, p.stderr
    assert r2["state"] == "already published" and int(r2["copied"]) == 0
    assert r2["dir"] == r["dir"]
    assert not tmp_files(tier)


def test_changed_snapshot_gets_its_own_copy(two_nodes, stager_dir):
    (a, _), tier = two_nodes
    _, r1 = shared(a)
    changed = dict(FILES, **{"dir/sub/c.txt": b"changed\n"})
    make_dataset(stager_dir / "src", changed)
    a.run("refresh", "ds", check=True)
    p, r2 = shared(a)
    assert p.returncode == 0, p.stderr
    assert r2["dir"] != r1["dir"] and r2["state"] == "published"
    with open(os.path.join(r2["dir"], "data/dir/sub/c.txt"), "rb") as f:
        assert f.read() == b"changed\n"
    with open(os.path.join(r1["dir"], "data/dir/sub/c.txt"), "rb") as f:
        assert f.read() == b"hello\n"


def test_wrong_bytes_never_published(tool, stager_dir):
    tier = stager_dir / "tier"
    tier.mkdir()
    make_dataset(stager_dir / "src", FILES,
                 sums=dict(FILES, **{"a.bin": b"other"}))
    s = node(tool, stager_dir / "n", tier)
    try:
        s.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
        p, _ = shared(s)
        assert p.returncode != 0
        log = s.log.read_text()
        assert "a.bin from the source has SHA-256" in log, log[-2000:]
        snaps = list((tier / "ds").iterdir())
        assert len(snaps) == 1
        assert not (snaps[0] / "data" / "a.bin").exists()
        assert not (snaps[0] / "MANIFEST").exists()
        assert not (snaps[0] / ".lease").exists()
        assert not tmp_files(tier)
    finally:
        s.stop()


def test_no_tier_and_unmounted_tier_refused(tool, stager_dir):
    make_dataset(stager_dir / "src", FILES)
    s = node(tool, stager_dir / "n", stager_dir / "not-mounted")
    try:
        s.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
        p, _ = shared(s)
        assert p.returncode != 0
        assert "is not a directory" in s.log.read_text()
        assert not (stager_dir / "not-mounted").exists()
        # the dataset's own setting wins over the cluster default
        own = stager_dir / "own"
        own.mkdir()
        # a tier others may write is refused: every node trusts it
        os.chmod(own, 0o777)
        s.run("add", "ds3", "file://%s/src/" % stager_dir,
              "--shared-tier", str(own), check=True)
        p = s.run("stage", "ds3", "--shared")
        assert p.returncode != 0
        assert "is writable by others" in s.log.read_text()
        assert not list(own.iterdir())
        os.chmod(own, 0o755)
        s.run("add", "ds2", "file://%s/src/" % stager_dir,
              "--shared-tier", "file://%s/" % own, check=True)
        assert s.json("show", "ds2")["shared_tier"] == "file://%s/" % own
        p = s.run("stage", "ds2", "--shared", "--json", check=True)
        assert json.loads(p.stdout)["dir"].startswith(str(own) + "/")
    finally:
        s.stop()


def lease_text(holder, expires_ms):
    return "holder %s\nexpires_ms %d\n" % (holder, expires_ms)


def test_restricted_dataset_not_published(tool, stager_dir):
    """A dataset restricted to a group is never copied to the tier: its
    files there would be readable by every user of the parallel FS."""
    tier = stager_dir / "tier"
    tier.mkdir()
    make_dataset(stager_dir / "src", FILES)
    s = node(tool, stager_dir / "n", tier)
    try:
        s.run("add", "ds", "file://%s/src/" % stager_dir, "--group", "root",
              check=True)
        p, _ = shared(s)
        assert p.returncode != 0
        assert "is restricted to group 'root'" in s.log.read_text()
        assert not any(tier.rglob("*")), list(tier.rglob("*"))
    finally:
        s.stop()


def test_live_lease_waited_for_then_expired_taken_over(two_nodes):
    (a, b), tier = two_nodes
    # find the snapshot's directory without publishing: a copy left half
    # done by a node that died (one file published, a temporary file)
    p, r = shared(a)
    d = r["dir"]
    os.unlink(os.path.join(d, "MANIFEST"))
    os.unlink(os.path.join(d, "data", "dir", "b.bin"))
    with open(os.path.join(d, "data", ".dstage-tmp.dead"), "wb") as f:
        f.write(b"half")
    lease = os.path.join(d, ".lease")
    now = int(time.time() * 1000)
    with open(lease, "w") as f:
        f.write(lease_text("deadnode pid 1", now + 60000))
    # a live lease: no wait refuses at once, naming the holder
    p, _ = shared(b)
    assert p.returncode != 0 and b"deadnode pid 1" in p.stderr, p.stderr
    # a bounded wait ends
    t0 = time.monotonic()
    p, _ = shared(b, "--timeout", "1s")
    assert p.returncode != 0 and time.monotonic() - t0 >= 1.0
    # expired: the next node takes over and resumes
    with open(lease, "w") as f:
        f.write(lease_text("deadnode pid 1", now - 1000))
    p, r = shared(b)
    assert p.returncode == 0, p.stderr
    assert r["took_over"] in ("1", 1, True)
    # SHA256SUMS has no reference hash: fetched again, never kept as found
    assert int(r["copied"]) == 2 and int(r["kept"]) == len(FILES) - 1
    assert "taking over" in b.log.read_text()
    check_copy(d)
    assert not os.path.exists(lease)


def test_two_nodes_racing(two_nodes):
    (a, b), tier = two_nodes
    procs = [subprocess.Popen(
        [s.exe, "--config", str(s.cfg), "stage", "ds", "--shared", "--json",
         "--timeout", "60s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for s in (a, b)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    rs = [json.loads(o[0]) for o in outs]
    assert sorted(int(r["copied"]) for r in rs) == [0, len(FILES) + 1], rs
    assert rs[0]["dir"] == rs[1]["dir"]
    check_copy(rs[0]["dir"])
    assert not tmp_files(tier)


# ---- node caches fill from the tier first ----

def published(two_nodes):
    (a, b), tier = two_nodes
    p, r = shared(a)
    assert p.returncode == 0, p.stderr
    return a, b, r["dir"]


def stage_ok(s):
    p = s.run("stage", "ds", "--wait")
    assert p.returncode == 0, (p.stdout, p.stderr, s.log.read_text()[-3000:])
    p = s.run("verify", "ds")
    assert p.returncode == 0, (p.stdout, p.stderr)


def test_node_fills_from_tier_with_the_origin_gone(two_nodes, stager_dir):
    a, b, d = published(two_nodes)
    total = sum(len(v) for v in FILES.values())
    # the origin loses every file (its directory stays: it opens) but
    # SHA256SUMS, which has no reference hash: read from the origin
    for k in list(FILES):
        os.unlink(stager_dir / "src" / k)
    stage_ok(b)
    log = b.log.read_text()
    assert "reading snapshot %s from %s first" % (
        os.path.basename(d), d) in log, log[-2000:]
    assert "SHA256SUMS is unchecked there" in log, log[-2000:]
    # every byte of the listed files came from the tier
    m = tier_metrics(b)
    assert m["dstage_shared_tier_bytes_total"] == total, m
    assert all(v == 0 for k, v in m.items()
               if "fallbacks" in k and "unchecked" not in k), m


def test_flipped_byte_in_the_tier_caught(two_nodes):
    a, b, d = published(two_nodes)
    path = os.path.join(d, "data", "a.bin")
    with open(path, "r+b") as f:
        f.seek(1000)
        c = f.read(1)
        f.seek(1000)
        f.write(bytes([c[0] ^ 1]))
    stage_ok(b)
    log = b.log.read_text()
    assert "a.bin: SHA-256 mismatch" in log, log[-2000:]
    assert "a.bin is damaged there" in log, log[-2000:]
    # logged once per cause, counted each time
    assert log.count("is damaged there") == 1
    m = tier_metrics(b)
    assert m['dstage_shared_tier_fallbacks_total{cause="damaged"}'] >= 1, m
    assert m['dstage_shared_tier_fallbacks_total{cause="missing"}'] == 0, m
    assert m["dstage_shared_tier_reads_total"] >= 2, m


def test_missing_tier_file_falls_back(two_nodes):
    a, b, d = published(two_nodes)
    os.unlink(os.path.join(d, "data", "dir", "b.bin"))
    stage_ok(b)
    log = b.log.read_text()
    assert "dir/b.bin is missing there" in log, log[-2000:]
    m = tier_metrics(b)
    assert m['dstage_shared_tier_fallbacks_total{cause="missing"}'] >= 1, m


def test_changed_source_not_read_from_an_old_copy(two_nodes, stager_dir):
    a, b, d = published(two_nodes)
    make_dataset(stager_dir / "src",
                 dict(FILES, **{"dir/sub/c.txt": b"changed\n"}))
    b.run("refresh", "ds", check=True)
    # the new snapshot has no copy: B reads the origin alone
    stage_ok(b)
    assert "no copy of snapshot" in b.log.read_text()


# ---- on CephFS (ceph-fuse): the parallel file system it is meant for ----

def test_on_cephfs_race_publish_and_fill(tool, stager_dir, cephfs):
    tier = cephfs.mount / ("tier-%d" % os.getpid())
    tier.mkdir()
    make_dataset(stager_dir / "src", FILES)
    nodes = [node(tool, stager_dir / ("n%d" % i), tier) for i in range(2)]
    try:
        for s in nodes:
            s.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
        procs = [subprocess.Popen(
            [s.exe, "--config", str(s.cfg), "stage", "ds", "--shared",
             "--json", "--timeout", "60s"], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE) for s in nodes]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        rs = [json.loads(o[0]) for o in outs]
        assert sorted(int(r["copied"]) for r in rs) == [0, len(FILES) + 1]
        check_copy(rs[0]["dir"])
        assert not tmp_files(tier)
        # the nodes fill from the copy on CephFS with the origin's files
        # gone (but SHA256SUMS: no reference hash of its own)
        for k in list(FILES):
            os.unlink(stager_dir / "src" / k)
        for s in nodes:
            stage_ok(s)
            assert "is damaged there" not in s.log.read_text()
    finally:
        for s in nodes:
            s.stop()
