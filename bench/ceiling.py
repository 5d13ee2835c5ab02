"""ceiling: the FUSE ceiling in the same run (issue 31), bench/run's row
group `ceiling` (`bench/run --rows ceiling`; no radosgw: dstage reads a
file:// source).

One tree on the work directory's disk (the disk dstagefs's cache is on):
big/blob.bin (one file of the profile's file_size) and small/ (the
small-file set, 64-256 KiB files). Four systems read it, alternated within
each of WARM_ROUNDS rounds (medians kept; the disk's speed swings minute to
minute):

  raw disk             the tree itself (the row's limit)
  passthrough_hp       libfuse's example/passthrough_hp of the libfuse
                       dstagefs is built against (/opt/dstage/libfuse,
                       scripts/install-deps) mounted over the tree, FUSE
                       passthrough on (its default): the FUSE ceiling
  passthrough_hp_nopt  the same with --nopassthrough: every read a FUSE
                       request, served by a plain pread of the tree
  dstage               dstagefs over the same files staged into its cache
                       (`stager stage` of file:// datasets of the tree)

Rows (each system's value, ratio = value / raw disk):
  ceil_large_warm   one big file, `dd bs=1M`, page cache dropped before
  ceil_small_warm_1 the small files, whole-file reads, page cache dropped,
  ceil_small_warm_8   1 and 8 reader processes
  ceil_epoch2       the big file read once, then again in whole passes of
                    4 MiB reads for at least EPOCH_MIN_S (the timed read:
                    page cache warm, the second epoch)

Every entry carries cpu_s_per_GiB: the FUSE daemon's utime + stime
(/proc/PID/stat of dstagefs or passthrough_hp, before and after the read)
per GiB read; dstage's also daemon_cpu_s_per_GiB (the stager daemon). The
passthrough_hp entries are null, with the reason, when the binary is
missing ($DSTAGE_PASSTHROUGH_HP overrides the path).
"""
import os
import shutil
import statistics
import subprocess
import time

from benchlib import read_seq
from pinning import cpu_s_per_gib

MiB = 1 << 20
PASSTHROUGH_HP = "/opt/dstage/libfuse/bin/passthrough_hp"
# system -> passthrough_hp's extra arguments (None: not passthrough_hp)
SYSTEMS = {"raw": None, "passthrough_hp": [], "passthrough_hp_nopt": ["--nopassthrough"],
           "dstage": None}
ROW_IDS = ("ceil_large_warm", "ceil_small_warm_1", "ceil_small_warm_8", "ceil_epoch2")


def passthrough_hp_path(env=os.environ):
    return env.get("DSTAGE_PASSTHROUGH_HP") or PASSTHROUGH_HP


def passthrough_hp_missing(path):
    """Why passthrough_hp at path cannot run (a sentence), or None."""
    if not os.path.exists(path):
        return (f"skipped: {path} not found (scripts/install-deps builds libfuse "
                "with its examples into /opt/dstage/libfuse)")
    if not os.access(path, os.X_OK):
        return f"skipped: {path} is not executable"
    return None


def passthrough_hp_cmd(path, src, mnt, extra=()):
    """passthrough_hp in the foreground (so its pid is the daemon whose CPU
    is measured) over src at mnt."""
    return [path, "--foreground", *extra, src, mnt]


def stat_text(pid):
    """/proc/PID/stat of a live process, or None."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read()
    except OSError:
        return None


class CPU:
    """utime + stime of some named processes, sampled at start and at
    stop(nbytes) -> {name: CPU-s per GiB}."""

    def __init__(self, pids):
        self.pids = {k: v for k, v in pids.items() if v}
        self.t0 = {k: stat_text(p) for k, p in self.pids.items()}

    def stop(self, nbytes):
        out = {}
        for k, p in self.pids.items():
            v = cpu_s_per_gib(self.t0[k], stat_text(p), nbytes)
            if v is not None:
                out[k] = v
        return out


def make_tree(b, log):
    """big/blob.bin and small/ under the work directory (the caches' disk)."""
    src = os.path.join(b.work, "ceiling-src")
    os.makedirs(os.path.join(src, "big"))
    size = b.p["file_size"]
    block = os.urandom(4 * MiB)
    with open(os.path.join(src, "big", "blob.bin"), "wb") as f:
        for i in range(size // (4 * MiB)):
            f.write(i.to_bytes(8, "little") + block[8:])
    if getattr(b, "src", None) and getattr(b, "small_keys", None):
        # hard links: the same files, on the same disk, nothing copied
        try:
            shutil.copytree(os.path.join(b.src, "small"), os.path.join(src, "small"),
                            copy_function=os.link)
        except (OSError, shutil.Error):
            shutil.rmtree(os.path.join(src, "small"), ignore_errors=True)
            shutil.copytree(os.path.join(b.src, "small"), os.path.join(src, "small"))
        keys = list(b.small_keys)
    else:
        import bench_data
        import random
        bench_data.write_small(b, src, random.Random(20261129))
        keys = list(b.small_keys)
    log(f"ceiling: {size // MiB} MiB file and {len(keys)} small files in {src}")
    return src, keys


def dd_read(path, timeout=900):
    """`dd bs=1M` of path to /dev/null: (bytes, seconds)."""
    t = time.monotonic()
    r = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], capture_output=True,
                       timeout=timeout)
    s = max(time.monotonic() - t, 1e-6)
    if r.returncode:
        raise RuntimeError(f"dd {path}: {r.stderr[-200:]!r}")
    return os.path.getsize(path), s


EPOCH_MIN_S = 1.0  # a second epoch's timed reads last at least this long


def epoch_read(path):
    """The page-cache-warm read of the second epoch: whole passes over
    path (benchlib.read_seq: 4 MiB reads), in this process, until
    EPOCH_MIN_S has passed (at least two). One pass of 1 GiB takes 50 ms
    at 20 GB/s: a `dd` of it timed from outside counted the process's
    start and swung by a fifth between rounds. Returns (bytes, seconds)."""
    tot = passes = 0
    t = time.monotonic()
    while passes < 2 or time.monotonic() - t < EPOCH_MIN_S:
        nb, _, _ = read_seq([path], float("inf"))
        tot += nb
        passes += 1
    return tot, max(time.monotonic() - t, 1e-6)


def measure(b, rid, root, keys, read_files, pids):
    """One read of row rid under root (the tree, a mount of it, or
    dstagefs's datasets/ directory): {value, bytes, seconds, cpu...}."""
    big = os.path.join(root, "big", "blob.bin")
    if rid == "ceil_epoch2":
        b.drop_caches()
        dd_read(big)
        cpu = CPU(pids)
        nb, s = epoch_read(big)
        e = dict(value=nb / s / 1e6, bytes=nb, seconds=round(s, 3))
    elif rid == "ceil_large_warm":
        b.drop_caches()
        cpu = CPU(pids)
        nb, s = dd_read(big)
        e = dict(value=nb / s / 1e6, bytes=nb, seconds=round(s, 3))
    else:
        n = int(rid.rsplit("_", 1)[1])
        b.drop_caches()
        cpu = CPU(pids)
        paths = [os.path.join(root, "small", k) for k in keys]
        f_, nb, s, _ = read_files(paths, n, time.monotonic() + b.cap())
        e = dict(value=f_ / s, files=f_, bytes=nb, seconds=round(s, 3),
                 truncated=f_ < len(paths))
    c = cpu.stop(e["bytes"])
    if "fuse" in c:
        e["cpu_s_per_GiB"] = c["fuse"]
    if "daemon" in c:
        e["daemon_cpu_s_per_GiB"] = c["daemon"]
    return e


def skip_passthrough_hp(b, why):
    """The passthrough_hp entries of every ceiling row: null, with why."""
    for rid in ROW_IDS:
        for name, extra in SYSTEMS.items():
            if extra is not None:
                b.put(rid, name, None, why=why)
    b.notes.append(f"passthrough_hp rows {why}")


NOFILE_SPARE = 2048


def fit_nofile(b, log, keys):
    """The small files every system reads: passthrough_hp keeps a
    descriptor per inode the kernel knows, so no more than the
    descriptor limit allows (bench/run raises it where it may; a
    container may not raise the hard limit)."""
    import resource
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    n = max(soft - NOFILE_SPARE, 100)
    if len(keys) <= n:
        return keys
    b.notes.append(f"ceiling rows: {n} of the {len(keys)} small files (descriptor limit "
                   f"{soft}: passthrough_hp holds one per inode)")
    log(f"ceiling: reading {n} of {len(keys)} small files (RLIMIT_NOFILE {soft})")
    return keys[:n]


def run(b, log, read_files, rounds):
    """The ceiling rows (module docstring)."""
    import fair_bench
    b.mode("shared")
    src, keys = make_tree(b, log)
    keys = fit_nofile(b, log, keys)
    ph = passthrough_hp_path(b.env)
    why = passthrough_hp_missing(ph)
    roots = {"raw": (src, {})}
    mounted = []  # (mnt, Popen) of the passthrough_hp mounts
    s = None
    try:
        if why:
            log(f"ceiling: passthrough_hp {why}")
        else:
            for name, extra in SYSTEMS.items():
                if extra is None:
                    continue
                mnt = os.path.join(b.work, f"ceiling-{name}")
                os.makedirs(mnt)
                pr = b.spawn(name, passthrough_hp_cmd(ph, src, mnt,
                                                      [*extra, *b.fuse_opts()]))
                b.mounts.append(mnt)
                mounted.append((mnt, pr))
                b.mount_wait(mnt, pr, os.path.join(mnt, "big", "blob.bin"))
                roots[name] = (mnt, {"fuse": pr.pid})
        s = fair_bench.Setup(b, "ceiling-dstage", {
            "big": f"file://{src}/big/", "small": f"file://{src}/small/"})
        t = time.monotonic()
        for ds in ("big", "small"):
            b.stager_cmd(s.conf, "stage", ds, "--wait", timeout=3600)
        log(f"ceiling: dstage staged the tree in {time.monotonic() - t:.1f}s")
        roots["dstage"] = (os.path.join(s.mnt, "datasets"),
                           {"fuse": s.fpr.pid, "daemon": s.dpr.pid})
        runs = {rid: {name: [] for name in roots} for rid in ROW_IDS}
        for i in range(rounds):
            for rid in ROW_IDS:
                for name, (root, pids) in roots.items():
                    e = measure(b, rid, root, keys, read_files, pids)
                    runs[rid][name].append(e)
                    log(f"ceiling {rid} round {i + 1}: {name} {e['value']:.0f} "
                        f"{'files/s' if 'files' in e else 'MB/s'}"
                        + (f", {e['cpu_s_per_GiB']} CPU-s/GiB" if "cpu_s_per_GiB" in e
                           else ""))
        for rid, by in runs.items():
            lim = statistics.median(e["value"] for e in by["raw"])
            b.limits[f"{rid}_raw"] = round(lim, 1)
            b.limits[f"{rid}_raw_runs"] = [round(e["value"], 1) for e in by["raw"]]
            for name, es in by.items():
                if name == "raw":
                    continue
                e = dict(sorted(es, key=lambda x: x["value"])[len(es) // 2])
                v, tr = e.pop("value"), e.pop("truncated", False)
                b.put(rid, name, v, tr, runs=[round(x["value"], 1) for x in es],
                      runs_cpu_s_per_GiB=[x.get("cpu_s_per_GiB") for x in es], **e)
        if why:
            skip_passthrough_hp(b, why)
    finally:
        if s is not None:
            s.close()
        for mnt, pr in mounted:
            b.unmount(mnt, pr)
        shutil.rmtree(src, ignore_errors=True)


def row_defs(L, rounds):
    """(id, what, unit, limit, limit_what, target) of the ceiling rows
    measured (limits ceil_*_raw)."""
    how = f"medians of {rounds}, alternated with passthrough_hp and dstagefs"
    defs = [("ceil_large_warm", "FUSE ceiling: one large file, warm, dd bs=1M, page cache "
             "dropped", "MB/s", "the same file on local disk, dd bs=1M, page cache dropped"),
            ("ceil_small_warm_1", "FUSE ceiling: small files, warm, 1 reader", "files/s",
             "the same files on local disk, page cache dropped, 1 reader"),
            ("ceil_small_warm_8", "FUSE ceiling: small files, warm, 8 readers", "files/s",
             "the same files on local disk, page cache dropped, 8 readers"),
            ("ceil_epoch2", "FUSE ceiling: one large file, second epoch (page cache warm)",
             "MB/s", "the same file on local disk, read again in whole passes of 4 MiB "
             f"reads for at least {EPOCH_MIN_S:g} s")]
    return [(rid, what, unit, L[f"{rid}_raw"], f"{lw} ({how})", None)
            for rid, what, unit, lw in defs if f"{rid}_raw" in L]
