#!/usr/bin/python3
"""mlperf_profile: where an MLPerf workload's time goes (issue 45).

    nice -n 5 bench/mlperf_profile.py [--wl unet3d] [--n 1] [--trials 3]

One workload of bench/mlperf_bench.py (its own radosgw and data, the
full profile's scale) read by N emulated accelerators from the local
copy, from dstage after `stager stage`, and from a fresh dstage (cold,
store elsewhere), `--trials` times each, interleaved, so that the load
of a shared machine falls on every system alike. Per system: the AU,
the per-file time of the loader's workers split into open, reads and
close (mean ms), and for dstage the mount's .dstage/stats over the trial
(FUSE reads and their mean size, passthrough opens, GETs). --probe N:
afterwards one thread's stat, open, first 1 MiB read and close of N
files, page cache dropped (local and staged: the last N files; cold:
the first N, beside one curl stream's GETs of them), --strace FILE with
it: `strace -f -T` of dstagefs meanwhile. --base DSTAGEFS: another
build's dstagefs runs its own staged and cold trials (and cold probes)
interleaved with this one's. Prints one JSON object; the figures of
bench/results/history/issue45-mlperf-profile-2026-12-07.md come from it.
"""
import argparse
import importlib.machinery
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mlperf_bench  # noqa: E402
import fair_bench  # noqa: E402


class _Timed(mlperf_bench._Files):
    """_Files that appends (open, reads, close seconds, reads) of every
    file to a per-worker log (the workers are forked processes)."""

    logdir = None

    def __getitem__(self, i):
        if self.go is not None:
            self.go.wait()
        buf = bytearray(mlperf_bench.READ)
        t0 = time.monotonic()
        f = open(self.paths[i], "rb", buffering=0)
        t1 = time.monotonic()
        n = k = 0
        while True:
            got = f.readinto(buf)
            if not got:
                break
            n += got
            k += 1
        t2 = time.monotonic()
        f.close()
        t3 = time.monotonic()
        with open(os.path.join(self.logdir, f"w{os.getpid()}"), "a") as lg:
            lg.write(f"{t1 - t0} {t2 - t1} {t3 - t2} {k}\n")
        return n


def stats_of(mnt):
    """The mount's .dstage/stats as {name: int}."""
    out = {}
    with open(os.path.join(mnt, ".dstage", "stats")) as f:
        for ln in f:
            k, _, v = ln.partition(" ")
            try:
                out[k] = int(v)
            except ValueError:
                pass
    return out


def one_trial(b, paths, w, n, logdir, mnt=None, epochs=1):
    for f in os.listdir(logdir):
        os.unlink(os.path.join(logdir, f))
    before = stats_of(mnt) if mnt else {}
    r = mlperf_bench.run_trial(paths, w, n, epochs, b.drop_caches, (), 20)
    after = stats_of(mnt) if mnt else {}
    rows = []
    for f in os.listdir(logdir):
        with open(os.path.join(logdir, f)) as fh:
            rows += [tuple(float(x) for x in ln.split()) for ln in fh]
    files = len(rows) or 1
    res = dict(au=r["au"], seconds=r["epochs"][0]["seconds"], files=len(rows),
               open_ms=1e3 * sum(x[0] for x in rows) / files,
               read_ms=1e3 * sum(x[1] for x in rows) / files,
               close_ms=1e3 * sum(x[2] for x in rows) / files,
               reads_per_file=sum(x[3] for x in rows) / files)
    if mnt:
        d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        res.update(fuse_reads=d.get("fs_reads", 0),
                   fuse_read_kib=round(d.get("fs_read_bytes", 0) / max(1, d.get("fs_reads", 0))
                                       / 1024, 1),
                   passthrough=after.get("fs_passthrough"),
                   passthrough_opens=d.get("fs_passthrough_opens", 0),
                   fetches=d.get("fetches", 0), splice=d.get("fs_splice_replies", 0),
                   copy=d.get("fs_copy_replies", 0),
                   MB_from_source=round(d.get("bytes_from_source", 0) / 1e6, 1))
    return res


def open_probe(b, paths, strace_pid=None, out=None):
    """One thread, page cache dropped: mean ms of stat, open, first 1 MiB
    read and close over paths; with strace_pid, `strace -f -c` (and -T of
    the slow calls into out) on that process (dstagefs) meanwhile."""
    import subprocess
    b.drop_caches()
    st = None
    if strace_pid:
        st = subprocess.Popen(["strace", "-f", "-qq", "-T", "-o", out, "-p", str(strace_pid)])
        time.sleep(1)
    t = dict(stat=0.0, open=0.0, read=0.0, close=0.0)
    buf = bytearray(mlperf_bench.READ)
    for p in paths:
        t0 = time.monotonic()
        os.stat(p)
        t1 = time.monotonic()
        f = open(p, "rb", buffering=0)
        t2 = time.monotonic()
        f.readinto(buf)
        t3 = time.monotonic()
        f.close()
        t4 = time.monotonic()
        for k, v in (("stat", t1 - t0), ("open", t2 - t1), ("read", t3 - t2),
                     ("close", t4 - t3)):
            t[k] += v
    if st:
        st.terminate()
        st.wait(10)
    return {k: round(1e3 * v / len(paths), 3) for k, v in t.items()}


def summary(runs):
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {k: round(statistics.median(r[k] for r in runs), 4) for k in keys}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wl", default="unet3d", choices=mlperf_bench.ORDER)
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--systems", default="local,staged,cold")
    ap.add_argument("--probe", type=int, default=0,
                    help="after the trials: the single-thread open probe over this many files")
    ap.add_argument("--strace", metavar="FILE", help="with --probe: strace -f -T of dstagefs")
    ap.add_argument("--base", metavar="DSTAGEFS",
                    help="another dstagefs binary (a build before a change): its cold and "
                         "staged trials interleave with this build's, as cold_base, staged_base")
    a = ap.parse_args()
    run = importlib.machinery.SourceFileLoader("bench_run", os.path.join(HERE, "run")).load_module()
    run.raise_nofile()
    b = run.Bench(run.parse_args(["--rows", "mlperf", "--no-peers"]))
    logdir = tempfile.mkdtemp(prefix="mlperf-profile.")
    _Timed.logdir = logdir
    mlperf_bench._Files = _Timed
    out = {"wl": a.wl, "n": a.n, "loadavg": os.getloadavg()[0]}
    try:
        b.preflight()
        b.start_rgw()
        m = mlperf_bench.MLPerf(b, run.log)
        w = m.w[a.wl]
        src = os.path.join(m.src, a.wl)
        m.keys[a.wl] = keys = mlperf_bench.make_files(src, w)
        b.s3.put_many(b.bucket, ((f"mlperf/{a.wl}/{k}",
                                  (lambda k=k: open(os.path.join(src, k), "rb").read()))
                                 for k in keys), threads=16, deadline_s=600)
        url = {a.wl: f"s3://{b.bucket}/mlperf/{a.wl}/"}
        systems = a.systems.split(",")
        own = b.dstagefs
        if a.base:
            systems += [s + "_base" for s in systems if s in ("staged", "cold")]
        st = st_base = None
        if "staged_base" in systems:
            b.dstagefs = a.base
            st_base = fair_bench.Setup(b, "prof-staged-base", url)
            b.stager_cmd(st_base.conf, "stage", a.wl, "--wait", timeout=1800)
            b.dstagefs = own
        if "staged" in systems:
            st = fair_bench.Setup(b, "prof-staged", url)
            b.stager_cmd(st.conf, "stage", a.wl, "--wait", timeout=1800)
        runs = {s: [] for s in systems}
        for t in range(a.trials):
            for s in systems:
                b.mode("shared")
                if s == "local":
                    r = one_trial(b, [os.path.join(src, k) for k in keys], w, a.n, logdir)
                elif s.startswith("staged"):
                    x = st_base if s == "staged_base" else st
                    r = one_trial(b, [x.path(a.wl, k) for k in keys], w, a.n, logdir, x.mnt)
                else:
                    b.dstagefs = a.base if s == "cold_base" else own
                    c = fair_bench.Setup(b, f"prof-{s}-{t}", url)
                    b.dstagefs = own
                    b.mode("elsewhere")
                    try:
                        r = one_trial(b, [c.path(a.wl, k) for k in keys], w, a.n, logdir,
                                      c.mnt)
                    finally:
                        c.close()
                run.log(f"{s} trial {t}: {json.dumps(r)}")
                runs[s].append(r)
        out["systems"] = {s: summary(v) for s, v in runs.items() if v}
        if a.probe and "cold" in systems:
            sub = keys[:a.probe]
            b.mode("elsewhere")
            fps = b.curl_small(b.curl_base(), 1, keys=sub, prefix=f"mlperf/{a.wl}", cap=15)
            out["probe_curl_1stream_ms"] = round(1e3 / fps, 3)
            for t in range(4 if a.base else 2):
                base = a.base and t % 2
                b.dstagefs = a.base if base else own
                c = fair_bench.Setup(b, f"prof-coldprobe-{t}", url)
                b.dstagefs = own
                b.mode("elsewhere")
                try:
                    out[f"probe_cold{'_base' if base else ''}_{t}"] = open_probe(
                        b, [c.path(a.wl, k) for k in sub], c.fpr.pid if (a.strace and t) else None,
                        a.strace + ".cold" if a.strace else None)
                finally:
                    c.close()
            b.mode("shared")
        if a.probe and st:
            sub = keys[-a.probe:]
            for t in range(2):
                out[f"probe_local_{t}"] = open_probe(b, [os.path.join(src, k) for k in sub])
                out[f"probe_staged_{t}"] = open_probe(b, [st.path(a.wl, k) for k in sub])
            if a.strace:
                out["probe_staged_strace"] = open_probe(b, [st.path(a.wl, k) for k in sub],
                                                        st.fpr.pid, a.strace)
        for x in (st, st_base):
            if x:
                x.close()
    finally:
        b.cleanup()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
