#!/usr/bin/python3
"""bench_report: turn a bench/run results JSON into the Markdown table (with
the ratios dstage/limit and dstage/best peer) and a PNG chart (gnuplot).

    bench/bench_report.py RESULTS.json [--md OUT.md] [--png OUT.png]
    bench/bench_report.py bench/results/current.json [--page docs/benchmarks.md [--check]]

Without --md/--png the files go next to RESULTS.json (same name, .md/.png).
A page file (schema "page-1", bench/results/current.json) names, per area,
rows of results files under bench/results/ (and holds the figures of by-hand
runs as rows of its own, each with its command, date and source) and the
targets not met; from it the report prints the tables of docs/benchmarks.md,
with --page rewrites the page's region between "<!-- bench-report:begin -->"
and "<!-- bench-report:end -->", and with --check only compares it (exit 1
when they differ, with the diff). bench/run --report passes these on.
bench/run calls the same functions at the end of a run; the harness test
(tests/integration/test_bench_harness.py) calls them on a recorded JSON.

Results format (schema 1): {"schema": 1, "date", "mode", "command", ...,
"rows": [{"id", "what", "unit", "limit", "limit_what", "target",
"systems": {"dstage": {"value", "truncated"}, "s3fs": {...}, ...}}]}.
A value is a number or null (not measured; the entry may say "why").
Issue 17 adds, all optional (a results file without them renders as
before): per entry cpu_s_per_GiB (the system's processes), store_cpu_s_per_GiB,
reader_cpu_s_per_GiB; per row limit_cpu_s_per_GiB (curl for the cold
limits); prefetch rows' no_list_fps and x_no_list; "cpu_sets" (the store
elsewhere split). They render as the "CPU seconds per GiB" and "Known-order
prefetch" tables and a second chart, <name>-cpu.png.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

SYSTEMS = ("dstage", "s3fs", "rclone")
PEERS = ("s3fs", "rclone")


class ResultsError(ValueError):
    pass


def load(path):
    with open(path) as f:
        res = json.load(f)
    validate(res)
    return res


def validate(res):
    if not isinstance(res, dict) or res.get("schema") != 1:
        raise ResultsError("not a bench results file (schema 1)")
    rows = res.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ResultsError("results have no rows")
    ids = set()
    for r in rows:
        for k in ("id", "what", "unit", "systems"):
            if k not in r:
                raise ResultsError(f"row {r.get('id', '?')} lacks '{k}'")
        if r["id"] in ids:
            raise ResultsError(f"row id {r['id']} appears twice")
        ids.add(r["id"])
        for name, s in r["systems"].items():
            v = s.get("value")
            if v is not None and (not isinstance(v, (int, float)) or v < 0
                                  or math.isnan(v)):
                raise ResultsError(f"row {r['id']}, {name}: bad value {v!r}")
        lim = r.get("limit")
        if lim is not None and (not isinstance(lim, (int, float)) or lim <= 0):
            raise ResultsError(f"row {r['id']}: bad limit {lim!r}")


def value(row, system):
    s = row["systems"].get(system) or {}
    return s.get("value")


def ratios(row):
    """(dstage/limit or None, dstage/best peer or None, best peer name or None)"""
    d = value(row, "dstage")
    lim = row.get("limit")
    r_lim = d / lim if d is not None and lim else None
    best, best_name = None, None
    for p in PEERS:
        v = value(row, p)
        if v is not None and v > 0 and (best is None or v > best):
            best, best_name = v, p
    r_peer = d / best if d is not None and best else None
    return r_lim, r_peer, best_name


def fmt_num(v):
    if v is None:
        return "n/a"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_cell(row, system):
    s = row["systems"].get(system) or {}
    v = s.get("value")
    if v is None:
        return "n/a"
    return fmt_num(v) + ("\\*" if s.get("truncated") else "")


CAP_NOTE = "the phase hit its time cap: the rate over what it read before it"
SEARCH_NOTE = ("the search for the most accelerators ran out of its time budget: "
               "the figure is the most shown to hold the floor, a lower bound")


def star_notes(rows):
    """The footnotes of the "*" marks in rows' cells: an MLPerf row's
    (mlperf_*) means its search's budget ran out, any other's that the
    phase hit its time cap. Returns the notes, "\\* ..." each, or []."""
    kinds = set()
    for row in rows:
        for e in row["systems"].values():
            if (e or {}).get("truncated"):
                kinds.add(SEARCH_NOTE if row.get("id", "").startswith("mlperf_") else CAP_NOTE)
    return [f"\\* {k}." for k in (CAP_NOTE, SEARCH_NOTE) if k in kinds]


def fmt_ratio(r, target=None):
    if r is None:
        return "n/a"
    txt = f"{r:.2f}"
    if target is not None:
        txt += " ok" if r >= target else f" **below {target}**"
    return txt


def markdown(res):
    out = []
    out.append(f"Run: `{res.get('command', 'bench/run')}` ({res.get('mode', '?')}), "
               f"{res.get('date', '?')}, {res.get('host', {}).get('summary', '')}".rstrip(", "))
    out.append("")
    out.append("| workload | unit | limit | limit is | dstage | s3fs | rclone "
               "| dstage/limit (target) | dstage/best peer |")
    out.append("| --- | --- | ---: | --- | ---: | ---: | ---: | --- | --- |")
    for row in res["rows"]:
        r_lim, r_peer, best = ratios(row)
        tgt = row.get("target")
        lim_txt = fmt_ratio(r_lim, tgt) if tgt is not None else fmt_ratio(r_lim)
        peer_txt = fmt_ratio(r_peer) + (f" ({best})" if best else "")
        out.append("| " + " | ".join([
            row["what"], row["unit"], fmt_num(row.get("limit")),
            row.get("limit_what", ""),
            fmt_cell(row, "dstage"), fmt_cell(row, "s3fs"), fmt_cell(row, "rclone"),
            lim_txt, peer_txt]) + " |")
    out.append("")
    # the run's own table keeps its wording (committed tables are compared
    # with it); an MLPerf row's "*" gets its own note after it
    search = [n for n in star_notes(res["rows"]) if SEARCH_NOTE in n]
    out.append(" ".join(["\\* the phase hit its time cap: the figure is the rate over the part "
                         "read before the cap."] + search + ["n/a: not measured (see notes)."]))
    lims = res.get("limits") or {}
    if lims:
        out.append("")
        out.append("Limits measured in the same run:")
        out.append("")
        out.append("| limit | figure |")
        out.append("| --- | ---: |")
        for k in sorted(lims):
            v = lims[k]
            if isinstance(v, list):  # runs of one limit, in the order taken
                v = ", ".join(fmt_num(x) for x in v)
            elif isinstance(v, (int, float)):
                v = fmt_num(v)
            out.append(f"| {k} | {v} |")
    out += cpu_markdown(res)
    out += ceiling_markdown(res)
    out += prefetch_markdown(res)
    out += push_markdown(res)
    mem = res.get("memory") or {}
    if mem:
        out.append("")
        out.append("Memory, peak resident set (VmHWM) over the whole run of each process:")
        out.append("")
        out.append("| system | FUSE process, MiB | stager daemon (stage + verify), MiB |")
        out.append("| --- | ---: | ---: |")
        for name in ("dstage", *PEERS, *sorted(set(mem) - {"dstage", *PEERS})):
            m = mem.get(name)
            if m:
                tgt = m.get("target_MiB")
                out.append(f"| {name}{f' (target {tgt})' if tgt else ''} "
                           f"| {fmt_num(m.get('fuse_peak_rss_MiB'))} "
                           f"| {fmt_num(m.get('daemon_peak_rss_MiB'))} |")
        steps = [(n, st) for n in mem for st in [(mem[n] or {}).get("rss_after_MiB")] if st]
        for name, st in steps:
            out.append("")
            out.append(f"{name}: resident set (VmRSS) after each step, MiB (dstagefs, daemon): "
                       + "; ".join(f"{k} {fmt_num(v[0])}, {fmt_num(v[1])}"
                                   for k, v in st.items()))
    notes = res.get("notes") or []
    if notes:
        out.append("")
        out.append("Notes:")
        out.append("")
        for n in notes:
            out.append(f"- {n}")
    return "\n".join(out) + "\n"


def cpu_value(row, system):
    return (row["systems"].get(system) or {}).get("cpu_s_per_GiB")


def cpu_rows(res):
    """Rows that carry a CPU-per-GiB figure (cold and stage rows; the push
    rows have a table of their own)."""
    return [r for r in res["rows"]
            if not r["id"].startswith("push_")
            and (r.get("limit_cpu_s_per_GiB") is not None
                 or any(cpu_value(r, s) is not None for s in SYSTEMS))]


def cpu_markdown(res):
    rows = cpu_rows(res)
    if not rows:
        return []
    out = ["", "CPU seconds per GiB moved (utime + stime; dstage: dstagefs + stager "
           "daemon, + the stager CLI for stage; the limit: curl; store: ceph-osd + "
           "radosgw + ceph-mon during dstage's phase):", "",
           "| workload | limit (curl) | dstage | s3fs | rclone | store, during dstage "
           "| dstage page faults / GiB |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        d = r["systems"].get("dstage") or {}
        out.append("| " + " | ".join([r["what"], fmt_num(r.get("limit_cpu_s_per_GiB"))]
                                     + [fmt_num(cpu_value(r, s)) for s in SYSTEMS]
                                     + [fmt_num(d.get("store_cpu_s_per_GiB")),
                                        fmt_num(d.get("faults_per_GiB"))]) + " |")
    cs = res.get("cpu_sets") or {}
    if cs.get("store_cpus"):
        out += ["", f"Store elsewhere: the store's processes on CPUs {cs['store_cpus']}, the "
                f"client side on {cs['client_cpus']} ({cs.get('rule', '')}); warm rows on "
                "all cores."]
    return out


CEILING = ("passthrough_hp", "passthrough_hp_nopt", "dstage")


def ceiling_markdown(res):
    """The FUSE ceiling rows (bench/ceiling.py, issue 31): raw disk,
    passthrough_hp with and without FUSE passthrough, dstagefs, each as a
    ratio to the raw disk, and the FUSE daemons' CPU-seconds per GiB."""
    rows = [r for r in res["rows"] if r["id"].startswith("ceil_")]
    if not rows:
        return []
    out = ["", "The FUSE ceiling in the same run (the same files on the caches' disk; "
           "x raw: the system over the raw disk; CPU: the FUSE daemon's utime + stime "
           "per GiB read):", "",
           "| workload | unit | raw disk | passthrough_hp | x raw | --nopassthrough | x raw "
           "| dstagefs | x raw | CPU-s/GiB passthrough_hp | --nopassthrough | dstagefs "
           "| stager daemon |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
           "| ---: | ---: |"]
    whys = []
    for r in rows:
        lim = r.get("limit")
        cells = [r["what"], r["unit"], fmt_num(lim)]
        for name in CEILING:
            v = value(r, name)
            cells += [fmt_cell(r, name), fmt_ratio(v / lim if v is not None and lim else None)]
            why = (r["systems"].get(name) or {}).get("why")
            if why and why not in whys:
                whys.append(why)
        cells += [fmt_num(cpu_value(r, name)) for name in CEILING]
        cells.append(fmt_num((r["systems"].get("dstage") or {}).get("daemon_cpu_s_per_GiB")))
        out.append("| " + " | ".join(cells) + " |")
    out += [""] + [f"passthrough_hp: {w}" for w in whys] if whys else []
    return out


def prefetch_markdown(res):
    rows = [r for r in res["rows"] if r["id"].startswith("prefetch_")]
    if not rows:
        return []
    out = ["", "Known-order prefetch (the same shuffled read, cold, with and without "
           "the `.dstage/prefetch` list):", "",
           "| readers | with the list, files/s | without, files/s | with / without "
           "| limit, files/s | with / limit |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        d = r["systems"].get("dstage") or {}
        v, lim = d.get("value"), r.get("limit")
        out.append(f"| {r['id'].split('_')[1]} | {fmt_num(v)} | {fmt_num(d.get('no_list_fps'))} "
                   f"| {fmt_num(d.get('x_no_list'))} | {fmt_num(lim)} "
                   f"| {fmt_ratio(v / lim if v is not None and lim else None)} |")
    return out


PUSH_SYSTEMS = ("dstage", "aws+sha256sum", "rclone --checksum")


def push_markdown(res):
    """The push rows with every client's rate, time and CPU: the client's
    (push and its daemon; awscli and sha256sum; rclone) and the store's,
    per GiB for large files and per file for small ones. Where every
    client runs at the store's rate, the client's CPU per unit is what
    each would cost a node whose store is not the bound."""
    rows = [r for r in res["rows"] if r["id"].startswith("push_")]
    if not rows:
        return []
    out = ["", "Push (`stager push` against the step by hand; client CPU: the "
           "client's processes, store CPU: radosgw + ceph-osd + ceph-mon in the "
           "same phase):", "",
           "| row | client | rate | seconds | client CPU | store CPU "
           "| dstage's rate / this | this client's CPU / dstage's |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        per_file = r["unit"] == "files/s"
        key, unit = (("cpu_ms_per_file", "ms/file") if per_file
                     else ("cpu_s_per_GiB", "s/GiB"))
        skey = "store_" + key
        d = r["systems"].get("dstage") or {}
        for sname in PUSH_SYSTEMS:
            e = r["systems"].get(sname)
            if not e:
                continue
            v = e.get("value")
            rate = (fmt_num(d.get("value") / v)
                    if v and d.get("value") is not None and sname != "dstage"
                    else "")
            cpu_x = (fmt_num(e.get(key) / d.get(key))
                     if e.get(key) and d.get(key) and sname != "dstage" else "")
            cpu = e.get(key)
            scpu = e.get(skey)
            out.append("| " + " | ".join([
                r["id"], sname, f"{fmt_num(v)} {r['unit']}",
                fmt_num(e.get("seconds")),
                "n/a" if cpu is None else f"{fmt_num(cpu)} {unit}",
                "n/a" if scpu is None else f"{fmt_num(scpu)} {unit}",
                rate, cpu_x]) + " |")
        lim = r.get("limit")
        if lim:
            out.append("| " + " | ".join([
                r["id"], f"limit: {r.get('limit_what', '')}",
                f"{fmt_num(lim)} {r['unit']}", "",
                "n/a" if r.get("limit_cpu_s_per_GiB") is None
                else f"{fmt_num(r['limit_cpu_s_per_GiB'])} s/GiB", "",
                "", ""]) + " |")
    return out


def gnuplot_terminal():
    gp = shutil.which("gnuplot")
    if not gp:
        raise RuntimeError("gnuplot not found (Debian: apt-get install -y gnuplot-nox)")
    r = subprocess.run([gp, "-e", "set terminal"], capture_output=True, text=True,
                       timeout=30)
    txt = r.stdout + r.stderr
    names = {ln.split()[0] for ln in txt.splitlines() if ln.strip()}
    for t in ("pngcairo", "png"):
        if t in names:
            return gp, t
    raise RuntimeError("gnuplot has neither the pngcairo nor the png terminal")


def chart_data(res):
    """Lines of the gnuplot data file: label, then value/limit per system
    ('-' when not measured). Only rows with a limit are charted."""
    lines = ["# workload " + " ".join(SYSTEMS) + "  (figure / limit)"]
    for row in res["rows"]:
        lim = row.get("limit")
        if not lim:
            continue
        cols = []
        for s in SYSTEMS:
            v = value(row, s)
            cols.append("-" if v is None else f"{max(v / lim, 1e-3):.4g}")
        label = row["id"].replace('"', "")
        lines.append(f'"{label}" ' + " ".join(cols))
    return lines


def chart(res, png_path):
    gp, term = gnuplot_terminal()
    base = os.path.splitext(png_path)[0]
    dat, script = base + ".dat", base + ".gp"
    lines = chart_data(res)
    if len(lines) < 2:
        raise RuntimeError("nothing to chart: no row has a limit")
    with open(dat, "w") as f:
        f.write("\n".join(lines) + "\n")
    title = f"dstage bench ({res.get('mode', '?')}, {res.get('date', '?')[:10]}): figure / machine limit"
    size = "1200,560" if term == "pngcairo" else "1200,560"
    with open(script, "w") as f:
        f.write(f"""set terminal {term} size {size}
set output '{png_path}'
set title "{title}"
set termoption noenhanced
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set datafile missing '-'
set logscale y
set yrange [0.001:10]
set ylabel "figure / limit (log; 1 = limit)"
set grid ytics
set xtics rotate by -30
set key top right
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lw 2
plot '{dat}' using 2:xtic(1) title 'dstage', '' using 3 title 's3fs', '' using 4 title 'rclone'
""")
    r = subprocess.run([gp, script], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or not os.path.exists(png_path) or os.path.getsize(png_path) == 0:
        raise RuntimeError(f"gnuplot failed: {r.stderr.strip()[:500]}")
    os.unlink(dat)
    os.unlink(script)
    return png_path


def cpu_chart(res, png_path):
    """Bars of CPU-seconds per GiB (linear), per row: the limit (curl),
    dstage, s3fs, rclone. None when no row has a CPU figure."""
    rows = cpu_rows(res)
    if not rows:
        return None
    gp, term = gnuplot_terminal()
    base = os.path.splitext(png_path)[0]
    dat, script = base + ".dat", base + ".gp"
    cols = ("limit", *SYSTEMS)
    with open(dat, "w") as f:
        f.write("# workload " + " ".join(cols) + "  (CPU-s per GiB)\n")
        for r in rows:
            vals = [r.get("limit_cpu_s_per_GiB")] + [cpu_value(r, s) for s in SYSTEMS]
            f.write(f'"{r["id"]}" ' + " ".join("-" if v is None else f"{v:.4g}" for v in vals)
                    + "\n")
    with open(script, "w") as f:
        f.write(f"""set terminal {term} size 1200,560
set output '{png_path}'
set title "dstage bench ({res.get('mode', '?')}, {res.get('date', '?')[:10]}): CPU-seconds per GiB moved"
set termoption noenhanced
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set datafile missing '-'
set yrange [0:*]
set ylabel "CPU-s per GiB (lower is better)"
set grid ytics
set xtics rotate by -30
set key top right
plot '{dat}' using 2:xtic(1) title 'limit (curl)', '' using 3 title 'dstage', \
     '' using 4 title 's3fs', '' using 5 title 'rclone'
""")
    r = subprocess.run([gp, script], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or not os.path.exists(png_path) or os.path.getsize(png_path) == 0:
        raise RuntimeError(f"gnuplot failed: {r.stderr.strip()[:500]}")
    os.unlink(dat)
    os.unlink(script)
    return png_path


def write_all(res, md_path, png_path):
    """The table (md_path), the chart (png_path) and, when rows carry CPU
    figures, the CPU chart next to it (<png name>-cpu.png)."""
    validate(res)
    with open(md_path, "w") as f:
        f.write(markdown(res))
    chart(res, png_path)
    cpu_chart(res, os.path.splitext(png_path)[0] + "-cpu.png")
    return md_path, png_path



# ------------------------------------------------------------ the page
# docs/benchmarks.md's tables come from a page file, bench/results/current.json
# (schema "page-1"): sections that name rows of results files under
# bench/results/ (or rows of the page file itself, for figures of by-hand
# runs, each with its command, date and source), and the targets not met.
# page_markdown() draws them; write_page() puts them between the page's
# markers, check_page() says whether the page holds what the data gives.

PAGE_SCHEMA = "page-1"
BEGIN = "<!-- bench-report:begin"
END = "<!-- bench-report:end -->"
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_page(res):
    return isinstance(res, dict) and res.get("schema") == PAGE_SCHEMA


class Page:
    """A loaded page file: its sections and targets, and the results files
    they name (paths relative to the page file's directory; "" or the page
    file's own name: its own "rows")."""

    def __init__(self, spec, path):
        self.spec, self.path = spec, os.path.abspath(path)
        self.dir = os.path.dirname(self.path)
        self.cache = {}
        validate_page(spec)

    def results(self, name):
        if not name or name == os.path.basename(self.path):
            return {"rows": self.spec.get("rows", []), "self": True}
        if name not in self.cache:
            p = os.path.join(self.dir, name)
            try:
                res = load(p)
            except OSError as e:
                raise ResultsError(f"{name}: {e.strerror}") from None
            except ResultsError as e:
                raise ResultsError(f"{name}: {e}") from None
            self.cache[name] = res
        return self.cache[name]

    def row(self, ref):
        res = self.results(ref.get("from", ""))
        for r in res["rows"]:
            if r["id"] == ref["id"]:
                return r, res
        raise ResultsError(f"{ref.get('from') or 'the page file'}: no row {ref['id']!r}")

    def link(self, name):
        """A Markdown link from the page (spec "page", relative to the
        repository) to a file under the page file's directory."""
        page_dir = os.path.dirname(os.path.join(REPO_DIR, self.spec["page"]))
        target = os.path.join(self.dir, name)
        return os.path.relpath(target, page_dir).replace(os.sep, "/")


def validate_page(spec):
    if not is_page(spec):
        raise ResultsError(f"not a page file (schema {PAGE_SCHEMA})")
    for k in ("page", "sections"):
        if k not in spec:
            raise ResultsError(f"page file lacks '{k}'")
    ids = set()
    for r in spec.get("rows", []):
        for k in ("id", "what", "unit", "systems", "date", "source"):
            if k not in r:
                raise ResultsError(f"page row {r.get('id', '?')} lacks '{k}'")
        if not r.get("command") and not r.get("how"):
            raise ResultsError(f"page row {r['id']} lacks 'command' (or 'how', for a run by hand)")
        if r["id"] in ids:
            raise ResultsError(f"page row id {r['id']} appears twice")
        ids.add(r["id"])
    for s in spec["sections"]:
        if "title" not in s or not (s.get("rows") or s.get("memory")):
            raise ResultsError(f"section {s.get('title', '?')}: needs a title and rows")


def entry_metric(e, metric):
    """A system's figure for metric (value, cpu_s_per_GiB, ...): the number,
    or its runs ("runs" for value, "runs_<metric>" otherwise) as a list."""
    if not e:
        return None
    v = e.get(metric)
    if v is not None:
        return v
    runs = e.get("runs" if metric == "value" else "runs_" + metric)
    return list(runs) if runs else None


def fmt_fig(v):
    """fmt_num, but whole numbers (counts) as they are, and runs joined."""
    if v is None:
        return "n/a"
    if isinstance(v, list):
        return ", ".join(fmt_fig(x) for x in v)
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return f"{v:,}"
    return fmt_num(v)


def ref_field(row, ref_sys, key):
    """key "row:NAME" reads the row, otherwise the system's entry."""
    if key.startswith("row:"):
        return row.get(key[4:])
    return (row["systems"].get(ref_sys) or {}).get(key)


def best_of(row, systems, but):
    best = None
    for name in systems:
        if name == but:
            continue
        v = value(row, name)
        if v is not None and v > 0 and (best is None or v > best[1]):
            best = (name, v)
    return best


def vs_cell(row, a, b, systems, labels):
    va = value(row, a)
    if b == "best":
        best = best_of(row, systems, a)
        if va is None or not best:
            return ""  # no peer ran this row
        return f"{va / best[1]:.2f} ({labels.get(best[0], best[0])})"
    vb = value(row, b)
    if va is None or not vb:
        return ""
    return f"{va / vb:.2f}"


def source_of(page, ref, res, section):
    """Where a row's figures come from: (key, group, group text, item).
    Sources of one group (same command, profile and machine, or the same
    by-hand command and source) share a line under the table."""
    name = ref.get("from", "")
    if res.get("self"):
        row, _ = page.row(ref)
        srcs = ", ".join(f"[`{x}`]({page.link(x)})" for x in _list(row["source"]))
        how = f"`{row['command']}`" if row.get("command") else f"by hand: {row['how']}"
        return (("page", row["id"]), ("page", how, row["date"], srcs),
                f"{how}, {row['date']}; source: {srcs}", None)
    cmd = ref.get("command") or section.get("command") or res.get("command", "bench/run")
    date = res.get("date", "?")
    when = date[:16].replace("T", " ") + " UTC" if len(date) >= 16 else date
    host = (res.get("host") or {}).get("summary", "")
    mode = res.get("mode", "?")
    rev = (res.get("versions") or {}).get("dstage")
    return (("file", name), ("file", cmd, mode, host),
            f"`{cmd}` ({mode} profile), {host}",
            f"[`{name}`]({page.link(name)}), {when}" + (f", dstage {rev}" if rev else ""))


def fmt_runs(nums):
    """[1, 2, 3] -> "1-3", [1, 3] -> "1, 3"."""
    if len(nums) > 1 and nums == list(range(nums[0], nums[-1] + 1)):
        return f"{nums[0]}-{nums[-1]}"
    return ", ".join(str(n) for n in nums)


def sources_markdown(sources):
    """Lines naming each source (numbered as the table's run column when
    there are several), one line per group."""
    groups = []
    for i, (_, g, text, item) in enumerate(sources, 1):
        for grp in groups:
            if grp[0] == g:
                grp[2].append(i)
                break
        else:
            groups.append((g, text, [i], []))
        if item:
            grp = next(x for x in groups if x[0] == g)
            grp[3].append(item)
    lines = []
    for _, text, nums, items in groups:
        line = text + (": " + "; ".join(items) if items else "")
        if len(sources) == 1:
            lines.append(f"Run: {line}")
        else:
            lines.append(f"- run{'s' if len(nums) > 1 else ''} {fmt_runs(nums)}: {line}")
    return lines


def _list(x):
    return x if isinstance(x, list) else [x]


def section_markdown(page, s):
    systems = [x[0] for x in s.get("systems", [["dstage", "dstage"]])]
    labels = {x[0]: x[1] for x in s.get("systems", [["dstage", "dstage"]])}
    metric = s.get("metric", "value")
    show_limit = s.get("limit", True)
    rows = []
    sources = []
    for ref in s.get("rows", []):
        row, res = page.row(ref)
        src = source_of(page, ref, res, s)
        keys = [x[0] for x in sources]
        if src[0] not in keys:
            sources.append(src)
            keys.append(src[0])
        rows.append((ref, row, keys.index(src[0]) + 1))
    many = len(sources) > 1
    head = ["workload"] + (["limit"] if show_limit else [])
    head += [labels[n] for n in systems]
    head += [v["label"] for v in s.get("vs", [])]
    head += [c["label"] for c in s.get("columns", [])]
    head += ["target"] + (["run"] if many else [])
    aligns = ["---"] + ["---:"] * (len(head) - 2 - many) + ["---"] + (["---:"] if many else [])
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join(aligns) + " |"]
    for ref, row, src in rows:
        lim = row.get("limit")
        what = ref.get("label", row["what"])
        unit = s["unit"] if "unit" in s else row.get("unit")
        cells = [f"{what} ({unit})" if unit else what]
        if show_limit:
            cells.append(f"{fmt_num(lim)}: {row.get('limit_what', '')}" if lim else "")
        for n in systems:
            e = row["systems"].get(n)
            v = entry_metric(e, metric)
            if v is None:
                cells.append("" if e is None else "n/a")
                continue
            c = (fmt_num(v) if isinstance(v, (int, float)) else fmt_fig(v)) \
                + ("\\*" if (e or {}).get("truncated") else "")
            if metric == "value" and lim and isinstance(v, (int, float)):
                c += f" ({v / lim:.2f})"
            cells.append(c)
        for v in s.get("vs", []):
            cells.append(vs_cell(row, v["a"], v["b"], systems, labels))
        for c in s.get("columns", []):
            v = ref_field(row, c.get("system", "dstage"), c["key"])
            cells.append("" if v is None else fmt_fig(v))
        tgt = ref.get("target", row.get("target"))
        cells.append("" if tgt is None else str(tgt))
        if many:
            cells.append(str(src))
        out.append("| " + " | ".join(cells) + " |")
    notes = []
    notes += star_notes([row for _, row, _ in rows])
    if metric == "value" and show_limit:
        notes.append("In brackets: the figure / the limit of the same run.")
    out += ["", " ".join(notes)] if notes else []
    out.append("")
    out += sources_markdown(sources)
    return out


def memory_markdown(page, s):
    m = s["memory"]
    res = page.results(m["from"])
    mem = res.get("memory") or {}
    out = ["| process | FUSE process, MiB | stager daemon, MiB | target, MiB |",
           "| --- | ---: | ---: | ---: |"]
    for key, label in m["entries"]:
        e = mem.get(key)
        if not e:
            raise ResultsError(f"{m['from']}: no memory entry {key!r}")
        out.append(f"| {label} | {fmt_num(e.get('fuse_peak_rss_MiB'))} "
                   f"| {fmt_num(e.get('daemon_peak_rss_MiB'))} "
                   f"| {fmt_num(e.get('target_MiB')) if e.get('target_MiB') else ''} |")
    date = res.get("date", "?")
    out += ["", f"Peak resident set (VmHWM). Run: `{m.get('command') or res.get('command')}`, "
            f"{date[:16].replace('T', ' ')} UTC, {(res.get('host') or {}).get('summary', '')}: "
            f"[`{m['from']}`]({page.link(m['from'])})"]
    return out


def measured_text(page, ref):
    """One measured item of a target: "label fig / fig" over its refs, each
    fig computed from a row (show: ratio to the limit, vs:SYSTEM, a field or
    its runs, over:SYSTEM:FIELD)."""
    if "refs" in ref:
        figs = " / ".join(measured_text(page, r) for r in ref["refs"])
        return f"{ref['label']} {figs}" if ref.get("label") else figs
    row, _ = page.row(ref)
    sysname = ref.get("system", "dstage")
    show = ref.get("show", "ratio")
    e = row["systems"].get(sysname) or {}
    if show == "ratio":
        v, lim = e.get("value"), row.get("limit")
        if v is None or not lim:
            raise ResultsError(f"{row['id']}: {sysname} has no ratio to a limit")
        txt = f"{v / lim:.2f}"
    elif show.startswith("vs:"):
        other = value(row, show[3:])
        if e.get("value") is None or not other:
            raise ResultsError(f"{row['id']}: no {sysname} / {show[3:]}")
        txt = f"{e['value'] / other:.2f}"
    elif show.startswith("over:"):  # another system's field over this one's
        o_sys, key = show[5:].split(":", 1)
        a = (row["systems"].get(o_sys) or {}).get(key)
        if not a or not e.get(key):
            raise ResultsError(f"{row['id']}: no {key} for {o_sys} and {sysname}")
        txt = f"{a / e[key]:.2f}"
    else:
        v = entry_metric(e, show) if not show.startswith("row:") else row.get(show[4:])
        if v is None:
            raise ResultsError(f"{row['id']}: {sysname} has no {show}")
        txt = fmt_fig(v)
    return f"{ref['label']} {txt}" if ref.get("label") else txt


def targets_markdown(page, targets):
    out = ["| target | measured | why it is not met | details |", "| --- | --- | --- | --- |"]
    for t in targets:
        got = "; ".join(measured_text(page, r) for r in t["measured"])
        details = ", ".join(f"[{os.path.basename(d).split('#')[0]}]({page.link(d)})"
                            for d in _list(t.get("details", [])))
        out.append(f"| {t['target']} | {got} | {t['reason']} | {details} |")
    return out


def page_markdown(page):
    """The page's generated region (without the markers)."""
    spec = page.spec
    out = []
    for s in spec["sections"]:
        out += ["", f"## {s['title']}", ""]
        if s.get("text"):
            out += [s["text"], ""]
        if s.get("rows"):
            out += section_markdown(page, s)
        if s.get("memory"):
            if s.get("rows"):
                out.append("")
            out += memory_markdown(page, s)
    if spec.get("targets"):
        out += ["", "## Targets not met", ""]
        if spec.get("targets_text"):
            out += [spec["targets_text"], ""]
        out += targets_markdown(page, spec["targets"])
    return "\n".join(out).strip("\n") + "\n"


def load_page(path):
    with open(path) as f:
        return Page(json.load(f), path)


def region(text):
    """(head, generated, tail) of a page: the text up to and including the
    begin marker's line, the text between the markers, the end marker on."""
    b = text.find(BEGIN)
    if b < 0:
        raise ResultsError(f"no '{BEGIN} ... -->' marker")
    b_end = text.find("\n", b)
    e = text.find(END, b_end)
    if b_end < 0 or e < 0:
        raise ResultsError(f"no '{END}' after the begin marker")
    if text.find(BEGIN, b_end) >= 0:
        raise ResultsError("more than one bench-report region")
    return text[:b_end + 1], text[b_end + 1:e], text[e:]


def render_page(page, text):
    head, _, tail = region(text)
    return head + "\n" + page_markdown(page) + "\n" + tail


def write_page(page, page_path):
    with open(page_path) as f:
        text = f.read()
    new = render_page(page, text)
    if new != text:
        with open(page_path, "w") as f:
            f.write(new)
    return new != text


def check_page(page, page_path):
    """None when the page's region is what the data gives, else a diff."""
    import difflib
    with open(page_path) as f:
        text = f.read()
    want = render_page(page, text)
    if want == text:
        return None
    return "".join(difflib.unified_diff(text.splitlines(True), want.splitlines(True),
                                        page_path, "from " + page.path, n=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--md")
    ap.add_argument("--png")
    ap.add_argument("--page", metavar="PAGE.md",
                    help="a page file (bench/results/current.json): rewrite PAGE.md's "
                         "bench-report region from it")
    ap.add_argument("--check", action="store_true",
                    help="with --page: change nothing, exit 1 when the region differs")
    a = ap.parse_args(argv)
    if a.check and not a.page:
        ap.error("--check needs --page")
    try:
        with open(a.results) as f:
            raw = json.load(f)
        if is_page(raw):
            return page_main(Page(raw, a.results), a)
        if a.page:
            raise ResultsError(f"--page needs a page file (schema {PAGE_SCHEMA}, "
                               "bench/results/current.json), not a run's results")
        res = load(a.results)
        base = os.path.splitext(a.results)[0]
        md, png = write_all(res, a.md or base + ".md", a.png or base + ".png")
    except (OSError, ValueError, RuntimeError) as e:
        print(f"bench_report: {a.results}: {e}", file=sys.stderr)
        return 1
    print(f"bench_report: wrote {md} and {png}")
    return 0


def page_main(page, a):
    """A page file: print its tables, or rewrite/check a page's region.
    Errors (a missing row, results file or marker) raise."""
    if not a.page:
        sys.stdout.write(page_markdown(page))
        return 0
    if a.check:
        diff = check_page(page, a.page)
        if diff is None:
            print(f"bench_report: {a.page} holds what {a.results} gives")
            return 0
        sys.stdout.write(diff)
        print(f"bench_report: {a.page} differs from what {a.results} gives; "
              f"regenerate: bench/run --report {a.results} --page {a.page}", file=sys.stderr)
        return 1
    changed = write_page(page, a.page)
    print(f"bench_report: {a.page}: " + ("region rewritten" if changed else "already current"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
