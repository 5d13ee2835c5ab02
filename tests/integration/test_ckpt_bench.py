"""The harness logic of bench/ckpt_bench.py, not speed: rows_from turns
the measured seconds into rows with the right ratios (the shards' cp + sync
variant, the s3fs and rclone peers of the S3 row), leaves out a peer that
did not run, and run() with peers off never calls s3fs or rclone."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import ckpt_bench  # noqa: E402

MiB = 1 << 20


def res(**s3):
    r = {"dir": {"cp_s": 2.0, "cp_sync_s": 4.0, "mount_s": 5.0,
                 "close_s": 0.1, "shards_cp_s": 1.0,
                 "shards_cp_sync_s": 2.5, "shards_mount_s": 2.0},
         "s3": {"put_s": 4.0, "part_s": 0.2, "mount_s": 5.0, "close_s": 0.3,
                "shards_put_s": 2.0, "shards_mount_s": 3.0}}
    r["s3"].update(s3)
    return r


def rows(r):
    return {x["id"]: x for x in ckpt_bench.rows_from(r, 100 * MiB, 2,
                                                     10 * MiB)}


def test_shards_rows_compare_with_cp_and_with_cp_sync():
    out = rows(res())
    d = out["ckpt_dir_shards"]
    assert d["extra"]["ratio_time"] == 2.0            # vs cp
    assert d["extra"]["ratio_time_vs_cp_sync"] == 0.8  # vs cp + sync
    assert abs(d["limit"] - 2 * 10 * MiB / 1e6 / 1.0) < 1e-9
    # S3 shards have no sync variant
    assert "ratio_time_vs_cp_sync" not in out["ckpt_s3_shards"]["extra"]
    assert out["ckpt_dir"]["extra"]["ratio_time_vs_cp_sync"] == 1.25


def test_s3_row_carries_the_peers_with_their_ratios():
    out = rows(res(s3fs_s=10.0, rclone_s=2.5))
    r = out["ckpt_s3"]
    mb = 100 * MiB / 1e6
    assert r["value"] == mb / 5.0 and r["limit"] == mb / 4.0
    assert r["peers"] == {"s3fs": mb / 10.0, "rclone": mb / 2.5}
    assert r["extra"]["ratio_time_vs_s3fs"] == 0.5
    assert r["extra"]["ratio_time_vs_rclone"] == 2.0
    assert out["ckpt_dir"]["peers"] == {}


def test_a_peer_that_did_not_run_is_left_out():
    r = rows(res(rclone_s=2.5))["ckpt_s3"]
    assert list(r["peers"]) == ["rclone"]
    assert "ratio_time_vs_s3fs" not in r["extra"]


def test_peers_off_never_runs_them(tmp_path, monkeypatch):
    b = ckpt_bench.CkptBench("/nonexistent", str(tmp_path), {}, MiB, 1, MiB,
                             peers=False)

    def boom(*a, **k):
        raise AssertionError("a peer ran with peers off")
    monkeypatch.setattr(b, "s3fs_write", boom)
    monkeypatch.setattr(b, "rclone_write", boom)
    assert b.peer_rows("bkt", "src") == {}


def test_missing_peer_binary_is_skipped(tmp_path, monkeypatch):
    b = ckpt_bench.CkptBench("/nonexistent", str(tmp_path), {}, MiB, 1, MiB)
    monkeypatch.setattr(ckpt_bench.shutil, "which", lambda n: None)
    assert b.peer_rows("bkt", "src") == {}
