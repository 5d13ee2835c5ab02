"""The issue-17 parts of the bench harness (bench/pinning.py and the CPU and
prefetch tables of bench/bench_report.py), not speed: the store/client CPU
split rule, the CPU meter's arithmetic on a process that burns a known
amount of CPU, and the report's rendering of the optional fields (and that
a results file without them renders as before)."""
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_report  # noqa: E402
import pinning  # noqa: E402

FIXTURE = REPO / "tests" / "data" / "bench_results_quick.json"


@pytest.mark.parametrize("n,store,client", [
    (1, None, None), (2, [1], [0]), (3, [2], [0, 1]), (4, [3], [0, 1, 2]),
    (8, [6, 7], [0, 1, 2, 3, 4, 5]), (16, [12, 13, 14, 15], list(range(12)))])
def test_cpu_split_rule(n, store, client):
    assert pinning.cpu_split(n) == (store, client)


def test_cpu_split_covers_every_core_once():
    for n in range(2, 129):
        s, c = pinning.cpu_split(n)
        assert sorted(s + c) == list(range(n)) and s and c


def test_meter_counts_a_busy_process():
    # a child that spins 0.6 s of CPU before the meter starts and 0.5 s
    # after; the meter, watching its pid, sees only the second as CPU per
    # GiB of 1 GiB "moved"
    spin = "t=time.process_time()\nwhile time.process_time()-t<{}: pass\n"
    pr = subprocess.Popen([sys.executable, "-c",
                           "import time,sys\n" + spin.format(0.6) + "print(1, flush=True)\n"
                           "sys.stdin.readline()\n" + spin.format(0.5)
                           + "sys.stdin.readline()"],
                          stdout=subprocess.PIPE,
                          stdin=subprocess.PIPE, text=True)
    try:
        pr.stdout.readline()
        m = pinning.Meter([pr.pid])
        pr.stdin.write("go\n")
        pr.stdin.flush()
        end = time.monotonic() + 20
        while pinning.proc_cpu_s(pr.pid) - m.t0["sys"][pr.pid] < 0.45 and time.monotonic() < end:
            time.sleep(0.05)
        out = m.stop(1 << 30)
    finally:
        pr.stdin.write("done\n")
        pr.stdin.flush()
        pr.wait(20)
    assert 0.4 <= out["cpu_s_per_GiB"] <= 0.9, out
    assert "faults_per_GiB" in out and "reader_cpu_s_per_GiB" in out


def test_meter_gone_process_is_left_out():
    m = pinning.Meter([2 ** 22 + 12345])  # no such pid
    assert "cpu_s_per_GiB" not in m.stop(1 << 30)


@pytest.fixture
def res():
    with open(FIXTURE) as f:
        return json.load(f)


def test_results_without_issue17_fields_render_as_before(res):
    md = bench_report.markdown(res)
    assert "CPU seconds per GiB" not in md and "Known-order prefetch" not in md
    assert bench_report.cpu_rows(res) == []


def test_cpu_and_prefetch_tables_and_chart(res, tmp_path):
    r = copy.deepcopy(res)
    cold = next(x for x in r["rows"] if x["id"] == "large_cold")
    cold["limit_cpu_s_per_GiB"] = 0.21
    cold["systems"]["dstage"].update(cpu_s_per_GiB=0.88, store_cpu_s_per_GiB=1.9,
                                     faults_per_GiB=4000)
    cold["systems"]["s3fs"]["cpu_s_per_GiB"] = 1.5
    r["rows"].append({"id": "prefetch_1", "what": "prefetch, 1 reader", "unit": "files/s",
                      "limit": 200.0, "limit_what": "curl", "target": 0.9,
                      "systems": {"dstage": {"value": 150.0, "truncated": False,
                                             "no_list_fps": 30.0, "x_no_list": 5.0}}})
    r["cpu_sets"] = {"cores": 2, "store_cpus": "1", "client_cpus": "0", "rule": "1 + 1"}
    bench_report.validate(r)
    md = bench_report.markdown(r)
    line = next(ln for ln in md.splitlines()
                if ln.startswith("| large files, sequential read, cold | 0.21"))
    assert line.split("|")[2:9] == [" 0.21 ", " 0.88 ", " 1.50 ", " n/a ", " 1.90 ",
                                    " 4,000 ", ""][:7]
    assert "| 1 | 150 | 30.0 | 5.00 | 200 | 0.75 |" in md
    assert "store's processes on CPUs 1, the client side on 0" in md
    bench_report.write_all(r, str(tmp_path / "r.md"), str(tmp_path / "r.png"))
    png = (tmp_path / "r-cpu.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 3000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-cpu.png", "r.md", "r.png"]
