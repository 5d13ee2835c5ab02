"""mlperf_bench: the MLPerf Storage v2.0 training workloads and its
checkpointing shape (issue 45), for `bench/run --rows mlperf`.

What MLPerf Storage measures: each workload's samples are read through
the framework's own loader while the accelerator's compute is emulated
by a sleep of the published length per step; accelerator utilization
(AU) is the compute time over the step time, the first step of every
epoch left out (it holds the loader's start-up); a result counts at or
above the workload's AU floor, and a client node is rated by how many
emulated accelerators it keeps there.

Here each emulated accelerator is one process with its own PyTorch
DataLoader (torch from Debian's python3-torch) over its shard of the
files: num_workers = the workload's reader threads, the published batch
size (scaled for ResNet-50, below), a Dataset that reads each file whole
(1 MiB reads) and hands the loader its length (the bytes stay in the
worker: the storage is what is measured, not the pickling). Per step the
rank waits for its batch, then sleeps the compute time; AU of an epoch
is the sum of the sleeps over the sum of the step times (wait + sleep),
steps 2..S of every rank together. The N ranks start each epoch
together; the page cache is dropped before every epoch.

Scale (the published H100 figures divided so that a 2-core VM with one
disk keeps a handful of accelerators, and one epoch lasts about a
second; said in the results and on the page):
  UNet3D     samples 146.6 MB +- 68.3 MB / 128, compute 0.323 s / 8
  ResNet-50  samples 114.7 KB as published (small files are the point),
             batch 400 / 8, compute 0.224 s / 2
  CosmoFlow  samples 2.83 MB / 8, compute 0.0035 s x 4 (a 3.5 ms step,
             batch 1, is below what the DataLoader turns around on 2
             shared cores: the smoke run kept no accelerator at 70%
             reading 5 KB files from the page cache)
So a UNet3D accelerator asks 1/16 of the published bytes per second, a
ResNet-50 one 1/4 of the files per second, a CosmoFlow one 1/32 of the
bytes and 1/4 of the files per second. An epoch is S steps per rank
(the profile's steps), so a trial with N accelerators reads the first
N x S x batch files of the data set (the ranks' shards are disjoint).

Systems (rows): the local copy (the limit of the staged row), dstage
after `stager stage` (page cache dropped before each epoch; 2 epochs),
dstage cold (a fresh dstage, empty cache, per trial, the store on its
own cores: bench/pinning.py), s3fs and rclone (a fresh mount and cache
per trial, store elsewhere too); cold trials run one epoch. The search:
N = 1, 2, 4, ... while the trial's AU (mean over its epochs) stays at
the floor, then bisection between the last N that held and the first
that did not, bounded by the profile's n_max and a time budget per
system. The cold row's limit is the accelerators the store's own GET
rate allows: curl GETs of the same objects (8 kept-alive streams, store
elsewhere) in files/s x compute / (floor x batch).

Checkpointing (MLPerf Storage's shape, scaled: R ranks each write a
shard of the model's state, fsync it, close; then, page cache dropped,
all read their shards back): into the local disk, through
<mount>/checkpoints/ to a directory store and to radosgw; the store
directly (cp + sync into the directory; the project's multipart client
objstore_tool put, and awscli `aws s3 cp`, into radosgw). Write rows:
MB/s until every rank's close returned (published, for dstage), limit
the bytes over (local write + fsync) + the store's own upload, target
1/1.2; read rows: the read-back rate against the local disk's.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import time

MiB = 1 << 20
READ = 1 * MiB
CURL_STREAMS = 8

# published MLPerf Storage v2.0 H100 parameters, and the scale used here
PUBLISHED = {
    "unet3d": dict(sample=146.6e6, sd=68.3e6, batch=7, threads=4,
                   compute=0.323, floor=0.90),
    "resnet50": dict(sample=114.7e3, sd=0.0, batch=400, threads=8,
                     compute=0.224, floor=0.90),
    "cosmoflow": dict(sample=2.83e6, sd=0.0, batch=1, threads=4,
                      compute=0.0035, floor=0.70),
}
SCALE = {  # divisors of the published sample size, batch and compute
    "unet3d": dict(size=128, batch=1, compute=8),
    "resnet50": dict(size=1, batch=8, compute=2),
    "cosmoflow": dict(size=8, batch=1, compute=0.25),
}
PROFILES = {
    # steps per epoch per rank, n_max accelerators, seconds per system search
    "full": dict(steps={"unet3d": 24, "resnet50": 24, "cosmoflow": 100},
                 n_max=8, search_s=60, epoch_cap_s=15, ranks=4,
                 shard=128 * MiB, get_cap_s=15),
    "tiny": dict(steps={"unet3d": 6, "resnet50": 4, "cosmoflow": 20},
                 n_max=2, search_s=60, epoch_cap_s=10, ranks=2,
                 shard=4 * MiB, get_cap_s=3, size_div=64),
}
ORDER = ("unet3d", "resnet50", "cosmoflow")
NAMES = {"unet3d": "UNet3D", "resnet50": "ResNet-50", "cosmoflow": "CosmoFlow"}


def scaled(wl, prof):
    """The workload as run: sample mean/sd (bytes), batch, threads,
    compute (s), floor, steps per epoch, files the data set needs."""
    p, k = PUBLISHED[wl], SCALE[wl]
    extra = prof.get("size_div", 1)  # tiny: smaller still (the test)
    w = dict(name=wl, sample=int(p["sample"] / k["size"] / extra),
             sd=int(p["sd"] / k["size"] / extra), batch=p["batch"] // k["batch"],
             threads=p["threads"], compute=p["compute"] / k["compute"],
             floor=p["floor"], steps=prof["steps"][wl])
    if extra > 1:
        w["batch"] = max(1, w["batch"] // extra)
    w["files"] = prof["n_max"] * w["steps"] * w["batch"]
    return w


def div(k):
    return f"/ {k:g}" if k >= 1 else f"x {1 / k:g}"


def scale_text(wl, prof):
    w, k = scaled(wl, prof), SCALE[wl]
    sd = f" +- {w['sd'] / 1e6:.2f} MB" if w["sd"] else ""
    return (f"{NAMES[wl]}: samples {w['sample'] / 1e6:.3g} MB{sd} (published / {k['size']}), "
            f"batch {w['batch']} (published / {k['batch']}), {w['threads']} reader "
            f"threads, compute {w['compute']:.4g} s (published {div(k['compute'])}), "
            f"AU floor {w['floor']:.0%}, {w['steps']} steps an epoch, "
            f"{w['files']} files ({w['files'] * w['sample'] / 1e9:.2f} GB)")


# ---------------------------------------------------------------- data
def make_files(root, w, seed=45):
    """w's data set under root: files of w's sample size (normal, mean and
    sd, clipped to [mean/4, mean + 3 sd]), 500 a directory (every
    directory holds files). Returns the keys, in reading order."""
    rng = random.Random(seed)
    pool = os.urandom(max(4 * MiB, 4 * w["sample"] + 4 * w["sd"]))
    keys = []
    for i in range(w["files"]):
        size = int(rng.gauss(w["sample"], w["sd"])) if w["sd"] else w["sample"]
        size = max(w["sample"] // 4, min(size, w["sample"] + 3 * w["sd"]), 16)
        key = f"d{i // 500:03d}/s{i:06d}.bin"
        path = os.path.join(root, key)
        if i % 500 == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        off = rng.randint(0, len(pool) - size)
        with open(path, "wb") as f:
            f.write(i.to_bytes(8, "little") + pool[off + 8:off + size])
        keys.append(key)
    return keys


# ---------------------------------------------------------------- one trial
class _Files:
    """torch Dataset (duck-typed): whole-file reads; an item is its length."""

    def __init__(self, paths, delay=0.0, go=None):
        self.paths, self.delay, self.go = paths, delay, go

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        if self.go is not None:
            self.go.wait()  # the epoch's start (the workers are up before it)
        if self.delay:
            time.sleep(self.delay)  # the harness test's slow reader
        n = 0
        buf = bytearray(READ)
        with open(self.paths[i], "rb", buffering=0) as f:
            while True:
                k = f.readinto(buf)
                if not k:
                    return n
                n += k


def _rank(paths, w, epochs, bars, go, out, cap_s, delay):
    """One emulated accelerator: per epoch a fresh DataLoader iterator whose
    workers start before the epoch's clock and wait for `go` to read (in
    MLPerf's long epochs their start-up sits in the first step, which AU
    leaves out; in these short ones it would spill into the next steps),
    then up to w['steps'] steps; reports (wait, compute) per step, bytes."""
    import warnings
    import torch.utils.data as tud
    # "suggested max number of worker": the published reader threads are the point
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    ready, start, done = bars
    loader = tud.DataLoader(_Files(paths, delay, go), batch_size=w["batch"],
                            num_workers=w["threads"], shuffle=False)
    for _ in range(epochs):
        it = iter(loader)
        ready.wait()
        start.wait()
        steps, nbytes, trunc = [], 0, False
        end = time.monotonic() + cap_s
        prev = time.monotonic()
        for batch in it:
            got = time.monotonic()
            time.sleep(w["compute"])
            fin = time.monotonic()
            steps.append((got - prev, fin - got))
            nbytes += int(batch.sum())
            prev = fin
            if len(steps) >= w["steps"]:
                break
            if fin > end:
                trunc = True
                break
        del it  # stops this epoch's workers
        out.put((steps, nbytes, trunc))
        done.wait()


def au_of(steps_by_rank):
    """AU of one epoch: compute over step time, steps 2.. of every rank."""
    comp = sum(c for steps in steps_by_rank for _, c in steps[1:])
    tot = sum(wt + c for steps in steps_by_rank for wt, c in steps[1:])
    return comp / tot if tot else 0.0


def _get(q, ranks, timeout):
    """The next rank's epoch report; RuntimeError when a rank died (its
    DataLoader failed) or none came within timeout."""
    import queue
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            return q.get(timeout=1)
        except queue.Empty:
            dead = [p.exitcode for p in ranks if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"an emulated accelerator exited with {dead[0]}")
    raise RuntimeError(f"no epoch report within {timeout:.0f}s")


def run_trial(paths, w, n, epochs=2, before_epoch=None, cpu_pids=(), cap_s=20,
              delay=0.0):
    """n emulated accelerators over paths (the first n x steps x batch, the
    ranks' shards disjoint), `epochs` epochs, before_epoch() (dropping the
    page cache) ahead of each. Returns {n, au (mean over epochs), epochs:
    [{au, seconds, bytes, truncated, cpu_s}]}, cpu_s: utime + stime of
    cpu_pids over the epoch."""
    import multiprocessing
    import torch  # noqa: F401  (imported once here, inherited by the ranks)
    from pinning import proc_cpu_s
    ctx = multiprocessing.get_context("fork")
    use = paths[:n * w["steps"] * w["batch"]]
    bars = [ctx.Barrier(n + 1) for _ in range(3)]  # ready, start, done
    go = ctx.Event()
    out = ctx.Queue()
    ranks = [ctx.Process(target=_rank, args=(use[r::n], w, epochs, bars, go, out,
                                             cap_s, delay))
             for r in range(n)]
    for p in ranks:
        p.start()
    res = []
    ok = False
    try:
        for _ in range(epochs):
            bars[0].wait(timeout=120)  # every rank's workers are up
            if before_epoch:
                before_epoch()
            cpu0 = [proc_cpu_s(p) for p in cpu_pids]
            t = time.monotonic()
            go.set()
            bars[1].wait(timeout=120)
            got = [_get(out, ranks, cap_s + 120) for _ in range(n)]
            s = time.monotonic() - t
            cpu1 = [proc_cpu_s(p) for p in cpu_pids]
            cpu = sum(b - a for a, b in zip(cpu0, cpu1) if a is not None and b is not None)
            res.append(dict(au=round(au_of([g[0] for g in got]), 4), seconds=round(s, 2),
                            bytes=sum(g[1] for g in got), truncated=any(g[2] for g in got),
                            cpu_s=round(cpu, 2) if cpu_pids else None))
            go.clear()
            bars[2].wait(timeout=120)
        ok = True
    finally:
        for bar in bars if not ok else ():
            bar.abort()  # a rank still waiting (after an error) gets out
        for p in ranks:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return dict(n=n, au=round(sum(e["au"] for e in res) / len(res), 4), epochs=res)


def search(trial, floor, n_max, budget_s):
    """The most accelerators n <= n_max whose trial(n)['au'] >= floor:
    n doubles from 1 while it holds, then bisection. Stops when budget_s
    is spent (the answer is then what was shown to hold). Returns (n,
    {n: trial result}, budget_hit)."""
    end = time.monotonic() + budget_s
    tried = {}

    def holds(n):
        if n not in tried:
            tried[n] = trial(n)
        return tried[n]["au"] >= floor
    lo, hi, n = 0, n_max + 1, 1
    while n <= n_max:
        if time.monotonic() > end:
            return lo, tried, True
        if not holds(n):
            hi = n
            break
        lo = n
        n = n_max if n < n_max < 2 * n else 2 * n
    while hi - lo > 1:
        if time.monotonic() > end:
            return lo, tried, True
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried, False


def entry(n, tried, hit, extra=None):
    """A system's entry of an mlperf row: value = accelerators at the
    floor, the AU of every trial, per-epoch figures of the answer's trial."""
    e = {"value": n, "truncated": hit,
         "au_by_n": {str(k): [ep["au"] for ep in v["epochs"]] for k, v in sorted(tried.items())}}
    best = tried.get(n)
    if best:
        e["au_per_epoch"] = [ep["au"] for ep in best["epochs"]]
        e["epoch_s"] = [ep["seconds"] for ep in best["epochs"]]
        e["bytes_per_epoch"] = [ep["bytes"] for ep in best["epochs"]]
        if best["epochs"][0].get("cpu_s") is not None:
            e["cpu_s_per_epoch"] = [ep["cpu_s"] for ep in best["epochs"]]
    if hit:
        e["why"] = "the search's time budget ran out: the answer is a lower bound"
    e.update(extra or {})
    return e


# ---------------------------------------------------------------- bench/run
class MLPerf:
    def __init__(self, b, log, prof="full"):
        self.b, self.log = b, log
        self.prof = PROFILES[prof]
        self.w = {wl: scaled(wl, self.prof) for wl in ORDER}
        self.keys = {}
        self.src = os.path.join(b.work, "mlperf-src")
        self.results = {}  # wl -> {system: entry}

    def data(self):
        b = self.b
        for wl in ORDER:
            t = time.monotonic()
            root = os.path.join(self.src, wl)
            self.keys[wl] = make_files(root, self.w[wl])

            def body(k, root=root):
                return lambda: open(os.path.join(root, k), "rb").read()
            b.s3.put_many(b.bucket, ((f"mlperf/{wl}/{k}", body(k)) for k in self.keys[wl]),
                          threads=16, deadline_s=max(120, b.left()))
            self.log(f"mlperf data: {scale_text(wl, self.prof)}; made and uploaded in "
                     f"{time.monotonic() - t:.0f}s")

    def paths(self, root, wl):
        return [os.path.join(root, k) for k in self.keys[wl]]

    def find(self, wl, system, root_of, epochs, pids_of=lambda: (), extra=None):
        """The search for one (workload, system). root_of(n): the data
        set's directory for a trial of n (a fresh mount for cold systems;
        None: not mountable), with its cleanup."""
        w, b = self.w[wl], self.b

        def trial(n):
            root, cleanup = root_of(n)
            try:
                r = run_trial(self.paths(root, wl), w, n, epochs, b.drop_caches,
                              pids_of(), self.prof["epoch_cap_s"])
            finally:
                cleanup()
            self.log(f"mlperf {wl} {system}: N={n} AU " + ", ".join(
                f"{e['au']:.3f}" for e in r["epochs"]) + f" ({r['epochs'][0]['seconds']}s)")
            return r
        n, tried, hit = search(trial, w["floor"], self.prof["n_max"], self.prof["search_s"])
        self.results.setdefault(wl, {})[system] = entry(n, tried, hit, extra)
        self.log(f"mlperf {wl} {system}: {n} accelerators at AU >= {w['floor']:.0%}")

    def get_limit(self, wl):
        """curl GETs of the data set's objects, 8 streams, store elsewhere:
        the accelerators that rate allows (files/s x compute / (floor x batch))."""
        b, w = self.b, self.w[wl]
        b.mode("elsewhere")
        fps = b.curl_small(b.curl_base(), CURL_STREAMS, keys=self.keys[wl],
                           prefix=f"mlperf/{wl}", cap=self.prof["get_cap_s"])
        b.mode("shared")
        allowed = fps * w["compute"] / (w["floor"] * w["batch"])
        b.limits[f"mlperf_{wl}_curl_get_fps"] = round(fps, 1)
        b.limits[f"mlperf_{wl}_curl_get_MBps"] = round(fps * w["sample"] / 1e6, 1)
        b.limits[f"mlperf_{wl}_store_allows_accelerators"] = round(allowed, 2)
        self.log(f"mlperf {wl}: store GETs {fps:.0f} files/s: {allowed:.2f} accelerators")

    def run(self, peers):
        import fair_bench
        b = self.b
        self.data()
        for wl in ORDER:
            self.get_limit(wl)
        nothing = (lambda: None)
        # the local copy, then dstage after stage: all cores, 2 epochs
        b.mode("shared")
        for wl in ORDER:
            self.find(wl, "local", lambda n, wl=wl: (os.path.join(self.src, wl), nothing), 2)
        urls = {wl: f"s3://{b.bucket}/mlperf/{wl}/" for wl in ORDER}
        st = fair_bench.Setup(b, "mlperf-staged", urls)
        try:
            for wl in ORDER:
                t = time.monotonic()
                b.stager_cmd(st.conf, "stage", wl, "--wait", timeout=1800)
                s = time.monotonic() - t
                b.limits[f"mlperf_{wl}_stage_s"] = round(s, 2)
                self.find(wl, "dstage", lambda n, wl=wl: (st.path(wl), nothing), 2,
                          st.pids, {"stage_s": round(s, 2)})
        finally:
            st.close()
        # cold: a fresh dstage per trial, the store on its own cores
        for wl in ORDER:
            b.mode("elsewhere")
            holder = {}

            def fresh(n, wl=wl):
                s = fair_bench.Setup(b, f"mlperf-cold-{wl}-{n}", {wl: urls[wl]})
                holder["s"] = s
                b.mode("elsewhere")
                return s.path(wl), s.close
            self.find(wl, "dstage_cold", fresh, 1, lambda: holder["s"].pids())
            b.mode("shared")
        for name in (("s3fs", "rclone") if peers else ()):
            for wl in ORDER:
                if b.left() < 120:
                    self.results.setdefault(wl, {})[name] = {
                        "value": None, "why": "skipped: the run's budget was spent"}
                    continue
                b.mode("elsewhere")
                holder = {}

                def mount(n, wl=wl, name=name):
                    d = os.path.join(b.work, f"mlperf-{name}-{wl}-{n}")
                    probe = os.path.join(d, "mnt", "mlperf", wl, self.keys[wl][0])
                    pr = b.peer_mount(name, d, probe)
                    holder["pr"] = pr

                    def close():
                        b.unmount(os.path.join(d, "mnt"), pr)
                        shutil.rmtree(d, ignore_errors=True)
                    return os.path.join(d, "mnt", "mlperf", wl), close
                self.find(wl, name, mount, 1, lambda: [holder["pr"].pid])
                b.mode("shared")

    def put_rows(self):
        """The mlperf rows into the results (b.put) and their definitions
        (b.mlperf_rows, drawn by bench_rows.define_rows)."""
        b, defs = self.b, []
        for wl in ORDER:
            r, w = self.results.get(wl, {}), self.w[wl]
            loc = (r.get("local") or {}).get("value")
            scale = scale_text(wl, self.prof)
            defs.append(dict(id=f"mlperf_{wl}", what=f"MLPerf {NAMES[wl]}: accelerators at "
                             f"AU >= {w['floor']:.0%}, after stage", unit="accelerators",
                             limit=loc or None, limit_what="the local copy, same search",
                             target=1.0, scale=scale))
            for sysname in ("dstage", "local"):
                if sysname in r:
                    b.put(f"mlperf_{wl}", sysname, r[sysname].pop("value"), **r[sysname])
            allowed = b.limits.get(f"mlperf_{wl}_store_allows_accelerators")
            defs.append(dict(id=f"mlperf_{wl}_cold", what=f"MLPerf {NAMES[wl]}: accelerators at "
                             f"AU >= {w['floor']:.0%}, cold from radosgw (store elsewhere)",
                             unit="accelerators", limit=allowed or None,
                             limit_what="what curl GETs of the same objects allow "
                             "(8 streams, store elsewhere)", target=0.9, scale=scale))
            for sysname, key in (("dstage_cold", "dstage"), ("s3fs", "s3fs"),
                                 ("rclone", "rclone")):
                if sysname in r:
                    e = dict(r[sysname])
                    b.put(f"mlperf_{wl}_cold", key, e.pop("value"), **e)
        b.mlperf_rows = getattr(b, "mlperf_rows", []) + defs
        for wl in ORDER:
            b.notes.append("mlperf scale: " + scale_text(wl, self.prof))


# ---------------------------------------------------------------- checkpoints
def ckpt(b, log, prof="full"):
    """MLPerf Storage's checkpointing shape, scaled: R ranks each write a
    shard, fsync, close; then (page cache dropped) read them back; into the
    local disk, through the mount to a directory store and to radosgw, and
    the stores directly."""
    import ckpt_bench
    from benchlib import read_files
    p = PROFILES[prof]
    ranks, shard = p["ranks"], p["shard"]
    work = os.path.join(b.work, "mlperf-ckpt")
    os.makedirs(work)
    cb = ckpt_bench.CkptBench(b.build, work, b.env, shard, ranks, shard,
                              gc=b.store_gc)
    total = ranks * shard
    mb = total / 1e6
    writer = [sys.executable, "-c", ckpt_bench.WRITER]
    r = {}

    def write(d, tag):
        os.makedirs(d, exist_ok=True)
        t, outs = cb.parallel([writer + [os.path.join(d, f"rank{i}.pt"), str(shard), "fsync"]
                               for i in range(ranks)])
        r[f"{tag}_write_s"] = round(t, 3)
        r[f"{tag}_fsync_close_s"] = round(max(json.loads(o)["fsync"] + json.loads(o)["close"]
                                              for o in outs), 3)
        log(f"mlperf checkpoint {tag}: {ranks} x {shard // MiB} MiB written, fsynced, "
            f"closed in {t:.2f}s")

    def read(d, tag):
        b.drop_caches()
        files, nbytes, s, _ = read_files([os.path.join(d, f"rank{i}.pt") for i in range(ranks)],
                                         ranks, time.monotonic() + 600)
        r[f"{tag}_read_MBps"] = round(nbytes / s / 1e6, 1)
        log(f"mlperf checkpoint {tag}: read back at {nbytes / s / 1e6:.0f} MB/s")

    try:
        local = os.path.join(work, "local")
        write(local, "local")
        read(local, "local")
        src = os.path.join(local, "rank0.pt")
        # the directory store directly: cp + sync of each shard, at once
        store = os.path.join(work, "dirstore")
        os.makedirs(os.path.join(store, "direct"))
        r["dir_upload_s"] = round(cb.parallel(
            [["sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", src,
              os.path.join(store, "direct", f"rank{i}.pt")] for i in range(ranks)])[0], 3)
        shutil.rmtree(os.path.join(store, "direct"))
        ck = cb.mount("mlperf-dir", f"file://{store}/")
        write(ck, "dir_mount")
        read(ck, "dir_mount")
        cb.unmount_all()
        shutil.rmtree(store, ignore_errors=True)
        # radosgw: the project's multipart client, awscli, then the mount
        bucket = "mlperfckpt"
        b.s3.make_bucket(bucket)
        ot = b.tool("tests", "objstore_tool")
        url = f"s3://{bucket}/"
        r["s3_upload_s"] = round(cb.parallel(
            [[ot, url, "put", f"direct/rank{i}.pt", src] for i in range(ranks)])[0], 3)
        r["s3_get_s"] = round(cb.parallel(
            [[ot, url, "cat", f"direct/rank{i}.pt", "4M", "/dev/null"]
             for i in range(ranks)])[0], 3)
        for i in range(ranks):
            cb.timed([ot, url, "rm", f"direct/rank{i}.pt"])
        b.store_gc()
        aws = shutil.which("aws")
        if aws:
            r["s3_awscli_s"] = round(cb.parallel(
                [[aws, "--endpoint-url", b.endpoint, "s3", "cp", "--quiet", src,
                  f"s3://{bucket}/aws/rank{i}.pt"] for i in range(ranks)])[0], 3)
            for i in range(ranks):
                cb.timed([ot, url, "rm", f"aws/rank{i}.pt"])
            b.store_gc()
        ck = cb.mount("mlperf-s3", f"s3://{bucket}/ck/")
        write(ck, "s3_mount")
        read(ck, "s3_mount")
        cb.unmount_all()
    finally:
        cb.unmount_all()
        shutil.rmtree(work, ignore_errors=True)
    for k, v in r.items():
        b.limits[f"mlperf_ckpt_{k}"] = v
    base = r["local_write_s"]
    defs = []
    for kind, up, what in (("dir", "dir_upload_s", "cp + sync into the directory"),
                           ("s3", "s3_upload_s", "objstore_tool put (multipart)")):
        if f"{kind}_mount_write_s" not in r:
            continue
        rid = f"mlperf_ckpt_{kind}"
        defs.append(dict(id=rid, what=f"MLPerf checkpoint, {ranks} ranks x {shard // MiB} MiB, "
                         f"write + fsync until published, {kind} store", unit="MB/s",
                         limit=mb / (base + r[up]),
                         limit_what=f"local write + fsync, then {what}", target=0.83))
        b.put(rid, "dstage", mb / r[f"{kind}_mount_write_s"],
              seconds=r[f"{kind}_mount_write_s"], fsync_close_s=r[f"{kind}_mount_fsync_close_s"],
              ratio_time=round(r[f"{kind}_mount_write_s"] / (base + r[up]), 3),
              local_write_fsync_s=base, store_upload_s=r[up])
        if kind == "s3" and r.get("s3_awscli_s"):
            b.put(rid, "awscli", mb / r["s3_awscli_s"], seconds=r["s3_awscli_s"])
        defs.append(dict(id=rid + "_read", what=f"MLPerf checkpoint read-back, {ranks} ranks, "
                         f"{kind} store", unit="MB/s", limit=r["local_read_MBps"],
                         limit_what="the same read of the local disk's copy, page cache "
                         "dropped", target=None))
        b.put(rid + "_read", "dstage", r[f"{kind}_mount_read_MBps"])
        if kind == "s3":
            b.put(rid + "_read", "objstore_tool", mb / r["s3_get_s"], seconds=r["s3_get_s"])
    b.mlperf_rows = getattr(b, "mlperf_rows", []) + defs


def run(b, log, peers=True, prof="full"):
    """bench/run's mlperf group: the three training workloads, then (on the
    write rows' store, which bench/run swaps in) the checkpoint shape."""
    m = MLPerf(b, log, prof)
    try:
        m.run(peers)
    finally:
        m.put_rows()
