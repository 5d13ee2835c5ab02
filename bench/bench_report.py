#!/usr/bin/python3
"""bench_report: turn a bench/run results JSON into the Markdown table (with
the ratios dstage/limit and dstage/best peer) and a PNG chart (gnuplot).

    bench/bench_report.py RESULTS.json [--md OUT.md] [--png OUT.png]

Without --md/--png the files go next to RESULTS.json (same name, .md/.png).
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
    out.append("\\* the phase hit its time cap: the figure is the rate over the part "
               "read before the cap. n/a: not measured (see notes).")
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--md")
    ap.add_argument("--png")
    a = ap.parse_args(argv)
    base = os.path.splitext(a.results)[0]
    try:
        res = load(a.results)
        md, png = write_all(res, a.md or base + ".md", a.png or base + ".png")
    except (OSError, ValueError, RuntimeError) as e:
        print(f"bench_report: {a.results}: {e}", file=sys.stderr)
        return 1
    print(f"bench_report: wrote {md} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
