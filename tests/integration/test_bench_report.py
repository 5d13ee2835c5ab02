"""docs/benchmarks.md against its data (issue 44): the page's tables are
drawn by bench/bench_report.py from bench/results/current.json (which names
rows of results files under bench/results/ and holds the figures of runs by
hand), between the page's bench-report markers. These tests fail when the
page drifts from the data, and check that --page rewrites only the region
and --check says so. No mounts, no radosgw, no gnuplot: about a second."""
import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_report  # noqa: E402

PAGE = REPO / "docs" / "benchmarks.md"
SPEC = REPO / "bench" / "results" / "current.json"
RESULTS = REPO / "bench" / "results"


def report(*args):
    return subprocess.run([sys.executable, str(REPO / "bench" / "run"), "--report", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def page():
    return bench_report.load_page(SPEC)


def refs(spec):
    """Every row reference of the page file: section rows and targets'."""
    for s in spec["sections"]:
        yield from s.get("rows", [])
    for t in spec.get("targets", []):
        for m in t["measured"]:
            yield from m.get("refs", [m])


def test_page_holds_what_the_data_gives():
    out = report(str(SPEC), "--page", str(PAGE), "--check")
    assert out.returncode == 0, out.stdout + out.stderr


def test_check_fails_when_a_figure_on_the_page_drifts(tmp_path):
    text = PAGE.read_text()
    head, body, tail = bench_report.region(text)
    m = re.search(r"\| (\d[\d,.]*) \((\d\.\d\d)\) \|", body)
    assert m, "no 'figure (ratio)' cell in the region"
    drifted = body.replace(m.group(0), f"| {m.group(1)}9 ({m.group(2)}) |", 1)
    p = tmp_path / "benchmarks.md"
    p.write_text(head + drifted + tail)
    out = report(str(SPEC), "--page", str(p), "--check")
    assert out.returncode == 1
    diff = out.stdout.splitlines()
    bad = f"| {m.group(1)}9 ({m.group(2)}) |"
    assert any(ln.startswith("-") and bad in ln for ln in diff), out.stdout
    assert any(ln.startswith("+") and m.group(0) in ln for ln in diff), out.stdout
    assert "regenerate: bench/run --report" in out.stderr
    assert p.read_text() == head + drifted + tail, "--check must not write"
    # --page puts the data back, and leaves the text outside the region alone
    p.write_text("Edited intro.\n" + head + drifted + tail + "Edited end.\n")
    out = report(str(SPEC), "--page", str(p))
    assert out.returncode == 0, out.stderr
    assert p.read_text() == "Edited intro.\n" + text + "Edited end.\n"
    assert report(str(SPEC), "--page", str(p), "--check").returncode == 0


def test_check_fails_when_the_data_changes(page):
    text = PAGE.read_text()
    assert bench_report.render_page(page, text) == text
    # a figure of a run by hand (a row of the page file itself)
    spec = copy.deepcopy(page.spec)
    spec["rows"][0]["systems"]["dstage"]["runs_cpu_s_per_GiB"][0] = 9.99
    assert bench_report.render_page(bench_report.Page(spec, SPEC), text) != text
    # a figure of a results file the page names
    first = next(r for r in refs(page.spec) if r.get("from"))
    moved = bench_report.Page(copy.deepcopy(page.spec), SPEC)
    res = copy.deepcopy(moved.results(first["from"]))
    row = next(r for r in res["rows"] if r["id"] == first["id"])
    row["systems"]["dstage"]["value"] = row["systems"]["dstage"]["value"] * 1.5 + 1
    moved.cache[first["from"]] = res
    assert bench_report.render_page(moved, text) != text


def test_ratios_on_the_page_are_computed_from_the_data(page):
    """Each dstage figure with a limit shows as 'figure (figure / limit)',
    both from the results file the section names."""
    body = bench_report.region(PAGE.read_text())[1]
    checked = 0
    for s in page.spec["sections"]:
        if s.get("metric", "value") != "value" or s.get("limit") is False:
            continue
        for ref in s.get("rows", []):
            row, _ = page.row(ref)
            v, lim = bench_report.value(row, "dstage"), row.get("limit")
            if v is None or not lim:
                continue
            cell = f"{bench_report.fmt_num(v)}" + ("\\*" if row["systems"]["dstage"].get(
                "truncated") else "") + f" ({v / lim:.2f})"
            assert cell in body, (ref, cell)
            checked += 1
    assert checked >= 30


def test_every_file_the_page_names_exists(page):
    names = {r["from"] for r in refs(page.spec) if r.get("from")}
    names |= {s["memory"]["from"] for s in page.spec["sections"] if s.get("memory")}
    for r in page.spec.get("rows", []):
        names |= set(bench_report._list(r["source"]))
        assert r.get("date") and (r.get("command") or r.get("how")), r["id"]
    for t in page.spec.get("targets", []):
        names |= set(bench_report._list(t.get("details", [])))
    for n in names:
        assert (RESULTS / n).is_file(), n
    for r in refs(page.spec):  # every row it names is there
        page.row(r)


def test_page_is_one_page():
    assert len(PAGE.read_text().splitlines()) < 300


def test_markers_and_references_are_checked(tmp_path, page):
    p = tmp_path / "nomarkers.md"
    p.write_text("# no region here\n")
    out = report(str(SPEC), "--page", str(p), "--check")
    assert out.returncode == 1 and "bench-report:begin" in out.stderr
    spec = copy.deepcopy(page.spec)
    spec["sections"][0]["rows"].append({"from": spec["sections"][0]["rows"][0]["from"],
                                        "id": "no_such_row"})
    with pytest.raises(bench_report.ResultsError, match="no_such_row"):
        bench_report.page_markdown(bench_report.Page(spec, SPEC))
    # a run's results file is not a page file
    run_file = next(RESULTS.glob("20*.json"))
    out = report(str(run_file), "--page", str(p))
    assert out.returncode == 1 and "page file" in out.stderr
    # --check alone is refused
    assert report(str(SPEC), "--check").returncode == 2


def test_page_file_without_page_prints_the_tables(page):
    out = report(str(SPEC))
    assert out.returncode == 0, out.stderr
    assert out.stdout == bench_report.page_markdown(page)
    assert out.stdout.startswith("## ") and "## Targets not met" in out.stdout


def test_star_says_what_was_cut():
    """A "*" on an MLPerf row is a search whose budget ran out (a lower
    bound), elsewhere a phase that hit its time cap: each with its note."""
    cut = {"systems": {"dstage": {"value": 6, "truncated": True}}}
    whole = {"systems": {"dstage": {"value": 2}}}
    mlperf = bench_report.star_notes([dict(cut, id="mlperf_resnet50")])
    assert len(mlperf) == 1 and "lower bound" in mlperf[0] and "time cap" not in mlperf[0]
    phase = bench_report.star_notes([dict(cut, id="large_cold")])
    assert len(phase) == 1 and "time cap" in phase[0]
    assert bench_report.star_notes([dict(whole, id="mlperf_unet3d")]) == []
    both = bench_report.star_notes([dict(cut, id="large_cold"), dict(cut, id="mlperf_x")])
    assert len(both) == 2
