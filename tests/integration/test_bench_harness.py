"""The bench harness itself (bench/run, bench/bench_report.py), not speed:
the table, its ratios and the chart are generated from a recorded results
file (tests/data/bench_results_quick.json, a real `bench/run --quick`), and
broken results files are refused. Needs gnuplot (gnuplot-nox, installed by
scripts/install-deps)."""
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_report  # noqa: E402

FIXTURE = REPO / "tests" / "data" / "bench_results_quick.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def res():
    with open(FIXTURE) as f:
        return json.load(f)


def table_rows(md):
    """{workload text: [cells]} of the main table."""
    rows = {}
    for ln in md.splitlines():
        if ln.startswith("| ") and not ln.startswith("| workload") \
                and not ln.startswith("| ---") and ln.count("|") == 10:
            cells = [c.strip() for c in ln.strip("|").split("|")]
            rows[cells[0]] = cells
    return rows


def test_fixture_is_valid(res):
    bench_report.validate(res)
    assert {r["id"] for r in res["rows"]} >= {
        "large_cold", "large_warm", "large_epoch2", "small_cold_1", "small_cold_8",
        "small_warm_1", "small_warm_8", "stat_all", "stage", "verify_cache"}


def test_table_has_every_row_and_right_ratios(res):
    md = bench_report.markdown(res)
    rows = table_rows(md)
    assert len(rows) == len(res["rows"])
    for r in res["rows"]:
        cells = rows[r["what"]]
        d = r["systems"]["dstage"]["value"]
        # dstage/limit, with the target verdict
        want = f"{d / r['limit']:.2f}"
        assert cells[7].startswith(want), (r["id"], cells[7], want)
        if r.get("target") is not None:
            verdict = "ok" if d / r["limit"] >= r["target"] else f"**below {r['target']}**"
            assert cells[7] == f"{want} {verdict}", (r["id"], cells[7])
        # dstage/best peer, naming the peer
        peers = {p: (r["systems"].get(p) or {}).get("value") for p in ("s3fs", "rclone")}
        peers = {p: v for p, v in peers.items() if v}
        if peers:
            best = max(peers, key=peers.get)
            assert cells[8] == f"{d / peers[best]:.2f} ({best})", (r["id"], cells[8])
        else:
            assert cells[8] == "n/a"


def test_known_figures_of_the_recording(res):
    rows = table_rows(bench_report.markdown(res))
    # 272.586 / 572.3 = 0.476; s3fs 370.x is the best peer: 272.586 / 370.x
    cold = rows["large files, sequential read, cold"]
    assert cold[4] == "273" and cold[7] == "0.48 **below 0.9**"
    assert cold[8].endswith("(s3fs)")
    stat = rows["stat every file of the metadata tree"]
    assert stat[7] == "1.34 ok"
    assert rows["stager stage (large files)"][5:7] == ["n/a", "n/a"]


def test_truncated_figures_are_marked(res):
    r = next(r for r in res["rows"] if r["id"] == "small_cold_1")
    r["systems"]["dstage"]["truncated"] = True
    r["systems"]["s3fs"]["truncated"] = False
    cells = table_rows(bench_report.markdown(res))[r["what"]]
    assert cells[4].endswith("\\*") and not cells[5].endswith("\\*")


def test_missing_peer_and_limit(res):
    r = res["rows"][0]
    r["systems"]["s3fs"] = {"value": None, "truncated": False, "why": "skipped"}
    r["systems"]["rclone"] = {"value": None, "truncated": False}
    r["limit"] = None
    cells = table_rows(bench_report.markdown(res))[r["what"]]
    assert cells[5] == cells[6] == "n/a"
    assert cells[7] == "n/a" and cells[8] == "n/a"
    # a row without a limit is left out of the chart
    assert not any(ln.startswith(f'"{r["id"]}"') for ln in bench_report.chart_data(res))


def test_chart_data_is_figure_over_limit(res):
    lines = bench_report.chart_data(res)
    by_id = {ln.split()[0].strip('"'): ln.split()[1:] for ln in lines[1:]}
    for r in res["rows"]:
        vals = by_id[r["id"]]
        for i, s in enumerate(("dstage", "s3fs", "rclone")):
            v = (r["systems"].get(s) or {}).get("value")
            if v is None:
                assert vals[i] == "-"
            else:
                assert float(vals[i]) == pytest.approx(max(v / r["limit"], 1e-3), rel=1e-3)


def test_report_cli_writes_table_and_png(tmp_path):
    src = tmp_path / "r.json"
    src.write_bytes(FIXTURE.read_bytes())
    out = subprocess.run([sys.executable, str(REPO / "bench" / "run"), "--report", str(src)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "r.md").read_text()
    assert md.startswith("Run: `bench/run --quick` (quick)")
    png = (tmp_path / "r.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 5000
    # width and height from the IHDR chunk: the size the script asks for
    w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (w, h) == (1200, 560)
    # gnuplot's scratch files are cleaned up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md", "r.png"]


@pytest.mark.parametrize("breakage", [
    "no_rows", "bad_schema", "negative", "duplicate", "zero_limit", "no_unit"])
def test_broken_results_are_refused(res, tmp_path, breakage):
    bad = copy.deepcopy(res)
    if breakage == "no_rows":
        bad["rows"] = []
    elif breakage == "bad_schema":
        bad["schema"] = 2
    elif breakage == "negative":
        bad["rows"][0]["systems"]["dstage"]["value"] = -1
    elif breakage == "duplicate":
        bad["rows"].append(copy.deepcopy(bad["rows"][0]))
    elif breakage == "zero_limit":
        bad["rows"][0]["limit"] = 0
    elif breakage == "no_unit":
        del bad["rows"][0]["unit"]
    with pytest.raises(bench_report.ResultsError):
        bench_report.validate(bad)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_report.py"), str(p)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert re.search(r"bench_report: .*bad\.json: ", out.stderr)
    assert not (tmp_path / "bad.png").exists()


def test_committed_results_have_their_table_and_chart():
    """Every committed bench/results/<date>[-quick].json has its .md and .png
    and the .md is what the JSON renders to (the docs quote these)."""
    found = 0
    for j in sorted((REPO / "bench" / "results").glob("20*.json")):
        if "incomplete" in j.name:
            continue
        res = bench_report.load(j)
        md = j.with_suffix(".md")
        assert md.exists(), md
        assert md.read_text() == bench_report.markdown(res), f"{md} is stale"
        assert j.with_suffix(".png").read_bytes()[:8] == PNG_MAGIC
        found += 1
    if not found:
        pytest.skip("no bench results committed yet")


# ------------------------------------------------ the FUSE ceiling (issue 31)
import ceiling  # noqa: E402
import pinning  # noqa: E402


def stat_line(utime, stime, comm="dstagefs"):
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
    # majflt cmajflt utime stime cutime cstime ...
    return (f"4242 ({comm}) S 1 4242 4242 0 -1 4194560 900 0 3 0 {utime} {stime} "
            "7 8 20 0 9 0 12345 1000000 300 18446744073709551615\n")


def test_cpu_per_gib_from_two_proc_stat_samples():
    before, after = stat_line(100, 50), stat_line(160, 90)
    # (60 + 40) ticks at 100 ticks/s = 1.0 s over 2 GiB
    assert pinning.stat_cpu_s(after, tck=100) == pytest.approx(2.5)
    assert pinning.cpu_s_per_gib(before, after, 2 << 30, tck=100) == pytest.approx(0.5)
    # a command name with spaces and parentheses is skipped whole
    odd = stat_line(160, 90, comm="a) (b c")
    assert pinning.cpu_s_per_gib(before, odd, 1 << 30, tck=100) == pytest.approx(1.0)
    # nothing moved, or the process was gone: no figure
    assert pinning.cpu_s_per_gib(before, after, 0, tck=100) is None
    assert pinning.cpu_s_per_gib(before, None, 1 << 30, tck=100) is None


def test_cpu_class_reads_a_live_process():
    c = ceiling.CPU({"fuse": sys.modules["os"].getpid(), "gone": None})
    sum(range(3_000_000))
    out = c.stop(1 << 30)
    assert set(out) == {"fuse"} and out["fuse"] >= 0


def test_epoch_read_times_whole_passes(tmp_path, monkeypatch):
    f = tmp_path / "blob"
    f.write_bytes(b"x" * (3 * (1 << 20) + 5))
    monkeypatch.setattr(ceiling, "EPOCH_MIN_S", 0.05)
    nb, s = ceiling.epoch_read(str(f))
    # whole passes only, at least two, for at least the minimum
    assert nb % f.stat().st_size == 0 and nb >= 2 * f.stat().st_size
    assert s >= 0.05


class FakeBench:
    def __init__(self):
        self.rows, self.notes = {}, []

    def put(self, rid, system, val, truncated=False, why=None, **extra):
        r = self.rows.setdefault(rid, {"id": rid, "systems": {}})
        r["systems"][system] = dict(value=val, truncated=truncated, why=why, **extra)


def test_passthrough_hp_rows_skipped_when_the_binary_is_missing(tmp_path):
    missing = str(tmp_path / "no" / "passthrough_hp")
    why = ceiling.passthrough_hp_missing(missing)
    assert why.startswith("skipped:") and missing in why
    noexec = tmp_path / "passthrough_hp"
    noexec.write_text("")
    assert "not executable" in ceiling.passthrough_hp_missing(str(noexec))
    noexec.chmod(0o755)
    assert ceiling.passthrough_hp_missing(str(noexec)) is None
    assert ceiling.passthrough_hp_path({"DSTAGE_PASSTHROUGH_HP": missing}) == missing
    assert ceiling.passthrough_hp_path({}) == ceiling.PASSTHROUGH_HP
    b = FakeBench()
    ceiling.skip_passthrough_hp(b, why)
    assert set(b.rows) == set(ceiling.ROW_IDS)
    for r in b.rows.values():
        assert set(r["systems"]) == {"passthrough_hp", "passthrough_hp_nopt"}
        assert all(e["value"] is None and e["why"] == why for e in r["systems"].values())
    assert any(why in n for n in b.notes)


def test_passthrough_hp_command_line():
    assert ceiling.passthrough_hp_cmd("/x/ph", "/src", "/mnt") == \
        ["/x/ph", "--foreground", "/src", "/mnt"]
    assert ceiling.passthrough_hp_cmd("/x/ph", "/src", "/mnt",
                                      ceiling.SYSTEMS["passthrough_hp_nopt"]) == \
        ["/x/ph", "--foreground", "--nopassthrough", "/src", "/mnt"]


def load_bench_run():
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("bench_run", str(REPO / "bench" / "run"))
    spec = importlib.util.spec_from_loader("bench_run", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_rows_argument_knows_the_ceiling_group(capsys):
    run = load_bench_run()
    a = run.parse_args(["--smoke", "--rows", "ceiling", "--no-peers"])
    assert a.smoke and a.rows == "ceiling" and a.no_peers
    assert "ceiling" in run.ROW_GROUPS and "ceiling" not in run.RGW_GROUPS
    assert set(ceiling.ROW_IDS) <= set(run.ROW_ORDER)
    with pytest.raises(SystemExit):
        run.parse_args(["--rows", "ceiling,bogus"])
    assert "--rows bogus: unknown" in capsys.readouterr().err


def ceiling_results(skip=False):
    import bench_rows
    L = {"ceil_large_warm_raw": 1000.0, "ceil_small_warm_1_raw": 4000.0,
         "ceil_small_warm_8_raw": 8000.0, "ceil_epoch2_raw": 5000.0}

    class B(FakeBench):
        limits = L

        def row(self, rid, what, unit, limit=None, limit_what="", target=None):
            self.rows[rid].update(what=what, unit=unit, limit=limit, limit_what=limit_what,
                                  target=target)
    b = B()
    for rid, lim in (("ceil_large_warm", 1000), ("ceil_small_warm_1", 4000),
                     ("ceil_small_warm_8", 8000), ("ceil_epoch2", 5000)):
        b.put(rid, "dstage", lim * 0.8, cpu_s_per_GiB=0.4, daemon_cpu_s_per_GiB=0.01)
        if not skip:
            b.put(rid, "passthrough_hp", lim * 1.0, cpu_s_per_GiB=0.0)
            b.put(rid, "passthrough_hp_nopt", lim * 0.7, cpu_s_per_GiB=1.3)
    if skip:
        ceiling.skip_passthrough_hp(b, "skipped: /x/passthrough_hp not found")
    bench_rows.define_rows(b, 3)
    return {"schema": 1, "command": "bench/run --rows ceiling", "mode": "smoke",
            "rows": list(b.rows.values()), "notes": b.notes}


def ceiling_line(md, what):
    """The ceiling table's line of a row (13 cells)."""
    (ln,) = [ln for ln in md.splitlines()
             if ln.startswith(f"| FUSE ceiling: {what}") and ln.count("|") == 14]
    return ln


def test_ceiling_table_has_ratios_to_raw_disk_and_cpu():
    res = ceiling_results()
    bench_report.validate(res)
    md = bench_report.markdown(res)
    assert "The FUSE ceiling in the same run" in md
    lines = [ln for ln in md.splitlines() if ln.startswith("| FUSE ceiling: one large file, warm")]
    assert len(lines) == 3  # the main table, the CPU table and the ceiling table
    cells = [c.strip() for c in ceiling_line(md, "one large file, warm").strip("|").split("|")]
    assert cells[1:] == ["MB/s", "1,000", "1,000", "1.00", "700", "0.70", "800", "0.80",
                         "0.00", "1.30", "0.40", "0.01"]
    # the main table: dstage over the raw disk
    assert table_rows(md)["FUSE ceiling: one large file, warm, dd bs=1M, page cache "
                          "dropped"][7] == "0.80"


def test_ceiling_table_says_why_passthrough_hp_is_missing():
    res = ceiling_results(skip=True)
    bench_report.validate(res)
    md = bench_report.markdown(res)
    row = ceiling_line(md, "small files, warm, 8 readers")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:7] == ["n/a", "n/a", "n/a", "n/a"] and cells[7:9] == ["6,400", "0.80"]
    assert "passthrough_hp: skipped: /x/passthrough_hp not found" in md
