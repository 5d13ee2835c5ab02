"""fair_bench: the issue-17 rows of bench/run that need their own dstage
setups (a fresh cache each), run after the main dstage phases.

  shared_rows    the cold read and `stage` again with the store and the
                 client sharing every core (the figures bench/run gave
                 before the "store elsewhere" mode; kept as extra rows:
                 large_cold_shared, stage_shared), each with its curl limit
                 measured the same way.
  file_rows      a `file://` source on tmpfs (/dev/shm), faster than the
                 cache disk: a cold read through a fresh dstagefs
                 (file_cold) and `stager stage` (file_stage); the limit of
                 both is the cache disk's O_DIRECT write speed (dd
                 oflag=direct bs=4M into the cache's file system), measured
                 alternately with them (WARM_ROUNDS each, medians).
  prefetch_rows  the known-order prefetch (`<mount>/.dstage/prefetch`,
                 docs/dstagefs.md): the small-file set in one shuffled
                 order, cold (fresh cache, page cache dropped), 1 and 8
                 readers, with the list written first (prefetch_1,
                 prefetch_8) and without (the same read; its files/s is in
                 the row as no_list_fps and the ratio as x_no_list). The
                 limit is curl with as many streams as the read has in
                 flight: PREFETCH_STREAMS for 1 reader (one prefetch job is
                 run by one cache worker, one object at a time:
                 lib/cache/cache_ahead.c cache_run_prefetch), 8 for 8 readers.

Every figure carries its CPU-seconds per GiB (pinning.Meter).
"""
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from pinning import Meter

MiB = 1 << 20
PREFETCH_STREAMS = 1  # lib/cache/cache_ahead.c: one worker runs a dataset's list, in order


class Setup:
    """One fresh dstage: config, empty cache and catalog, daemon, datasets
    registered, optionally mounted."""

    def __init__(self, b, name, datasets, mount=True):
        self.b = b
        self.name = name
        self.d, self.conf = b.dstage_conf(name, "16G")
        self.dpr = b.start_daemon(self.d, self.conf, f"{name}-daemon")
        self.fpr = None
        self.mnt = None
        self.register_s = {}
        for ds, url in datasets.items():
            t = time.monotonic()
            b.stager_cmd(self.conf, "add", ds, url, timeout=3600)
            self.register_s[ds] = time.monotonic() - t
        if mount:
            self.mnt = os.path.join(self.d, "mnt")
            os.makedirs(self.mnt)
            self.fpr = b.spawn(f"{name}-fs", [b.dstagefs, "--config", self.conf, "-f",
                                              *b.fuse_opts(), self.mnt])
            b.mounts.append(self.mnt)
            first = next(iter(datasets))
            b.mount_wait(self.mnt, self.fpr, os.path.join(self.mnt, "datasets", first))

    def pids(self):
        return [p.pid for p in (self.fpr, self.dpr) if p is not None]

    def path(self, ds, key=""):
        return os.path.join(self.mnt, "datasets", ds, key)

    def close(self):
        if self.mnt:
            self.b.unmount(self.mnt, self.fpr)
        self.b.stop(f"{self.name}-daemon", self.dpr)
        shutil.rmtree(self.d, ignore_errors=True)


def _median_entry(runs):
    """The run with the median value (its bytes, seconds and CPU kept)."""
    return sorted(runs, key=lambda r: r["value"])[len(runs) // 2]


def shared_rows(b, log, read_seq):
    """large_cold_shared and stage_shared: store and client on every core."""
    b.mode("shared")
    cpu_lim = b.curl_ranged(tag="_shared")
    url = f"s3://{b.bucket}/big/"
    s = Setup(b, "shared-cold", {"big": url})
    try:
        b.mode("shared")
        files = [s.path("big", k) for k in b.big_keys]
        b.drop_caches()
        m = Meter(s.pids(), b.store_pids())
        nb, sec, tr = read_seq(files, time.monotonic() + b.cap())
        b.put("large_cold_shared", "dstage", nb / sec / 1e6, tr, bytes=nb,
              seconds=round(sec, 2), **m.stop(nb))
        log(f"dstage: large cold, shared cores {nb / sec / 1e6:.0f} MB/s")
    finally:
        s.close()
    s = Setup(b, "shared-stage", {"big": url}, mount=False)
    try:
        b.mode("shared")
        total = b.p["big_n"] * b.p["big_size"]
        b.drop_caches()
        m = Meter(s.pids(), b.store_pids())
        t = time.monotonic()
        b.stager_cmd(s.conf, "stage", "big", "--wait")
        sec = time.monotonic() - t
        b.put("stage_shared", "dstage", total / sec / 1e6, bytes=total, seconds=round(sec, 2),
              **m.stop(total, reader_is_system=True))
        log(f"dstage: stage, shared cores {total / sec / 1e6:.0f} MB/s")
    finally:
        s.close()
    return cpu_lim


def direct_write_MBps(where, size):
    """dd oflag=direct bs=4M of size bytes into a new file in `where`."""
    path = os.path.join(where, "dd-direct")
    t = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={size // (4 * MiB)}",
                    "oflag=direct"], check=True, capture_output=True, timeout=600)
    sec = time.monotonic() - t
    os.unlink(path)
    return size / sec / 1e6


def file_rows(b, log, read_seq, rounds):
    """file_cold and file_stage against a file:// source on tmpfs."""
    size = b.p["file_size"]
    src = tempfile.mkdtemp(prefix="dstage-bench-file.", dir="/dev/shm")
    try:
        block = os.urandom(4 * MiB)
        with open(os.path.join(src, "blob.bin"), "wb") as f:
            for i in range(size // (4 * MiB)):
                f.write(i.to_bytes(8, "little") + block[8:])
        url = f"file://{src}/"
        b.mode("shared")  # no store processes: all cores are the client's
        lims, cold, stage = [], [], []
        for i in range(rounds):
            lims.append(direct_write_MBps(b.work, size))
            log(f"limit: dd oflag=direct into the cache disk {lims[-1]:.0f} MB/s")
            s = Setup(b, f"file-cold-{i}", {"f": url})
            try:
                b.drop_caches()
                m = Meter(s.pids())
                nb, sec, tr = read_seq([s.path("f", "blob.bin")], time.monotonic() + b.cap())
                cold.append(dict(value=nb / sec / 1e6, truncated=tr, bytes=nb,
                                 seconds=round(sec, 2), **m.stop(nb)))
                log(f"dstage: file:// cold read {cold[-1]['value']:.0f} MB/s, "
                    f"{cold[-1].get('cpu_s_per_GiB')} CPU-s/GiB")
            finally:
                s.close()
            lims.append(direct_write_MBps(b.work, size))
            log(f"limit: dd oflag=direct into the cache disk {lims[-1]:.0f} MB/s")
            s = Setup(b, f"file-stage-{i}", {"f": url}, mount=False)
            try:
                b.drop_caches()
                m = Meter(s.pids())
                t = time.monotonic()
                b.stager_cmd(s.conf, "stage", "f", "--wait")
                sec = time.monotonic() - t
                stage.append(dict(value=size / sec / 1e6, truncated=False, bytes=size,
                                  seconds=round(sec, 2), **m.stop(size, reader_is_system=True)))
                log(f"dstage: file:// stage {stage[-1]['value']:.0f} MB/s, "
                    f"{stage[-1].get('cpu_s_per_GiB')} CPU-s/GiB")
            finally:
                s.close()
        b.limits["cache_disk_direct_write_MBps"] = round(statistics.median(lims), 1)
        b.limits["cache_disk_direct_write_runs_MBps"] = [round(v, 1) for v in lims]
        for rid, runs in (("file_cold", cold), ("file_stage", stage)):
            e = dict(_median_entry(runs))
            v, tr = e.pop("value"), e.pop("truncated")
            b.put(rid, "dstage", v, tr, runs_MBps=[round(r["value"], 1) for r in runs],
                  runs_cpu_s_per_GiB=[r.get("cpu_s_per_GiB") for r in runs], **e)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def prefetch_rows(b, log, read_files, random, source="s3"):
    """prefetch_1 / prefetch_8: the shuffled small-file read with and
    without `.dstage/prefetch`, cold. source "file": the local copies of
    the small files through a file:// source (a run without radosgw); the
    limit is then the same files read from local disk, cold, with as many
    readers as the read keeps in flight (limits local_prefetch_K_fps)."""
    order = list(b.small_keys)
    random.Random(17).shuffle(order)
    if source == "file":
        url = f"file://{os.path.join(b.src, 'small')}/"
        for n in sorted({max(n, PREFETCH_STREAMS) for n in (1, 8)}):
            b.drop_caches()
            f_, _, sec, _ = read_files([os.path.join(b.src, "small", k) for k in order], n,
                                       time.monotonic() + b.cap())
            b.limits[f"local_prefetch_{n}_fps"] = round(f_ / sec, 1)
            log(f"limit: the shuffled small files on local disk, cold, {n} reader(s): "
                f"{f_ / sec:.0f} files/s")
    else:
        url = f"s3://{b.bucket}/small/"
    b.prefetch_source = source
    got = {}
    for listed, n in ((False, 1), (True, 1), (True, 8), (False, 8)):
        s = Setup(b, f"prefetch-{int(listed)}-{n}", {"small": url})
        try:
            b.mode("elsewhere")
            paths = [s.path("small", k) for k in order]
            b.drop_caches()
            m = Meter(s.pids(), b.store_pids())
            t0 = time.monotonic()
            if listed:
                with open(os.path.join(s.mnt, ".dstage", "prefetch"), "w") as f:
                    f.write("".join(f"small/{k}\n" for k in order))
            f_, nb, sec, _ = read_files(paths, n, t0 + b.cap())
            sec = time.monotonic() - t0
            cpu = m.stop(nb)
            got[(listed, n)] = dict(fps=f_ / sec, files=f_, bytes=nb, seconds=round(sec, 2),
                                    truncated=f_ < len(paths), **cpu)
            if listed:
                with open(os.path.join(s.mnt, ".dstage", "prefetch")) as f:
                    got[(listed, n)]["summary"] = " ".join(f.read().split())[:300]
            log(f"dstage: small cold, {n} reader(s), {'with' if listed else 'without'} "
                f"the prefetch list: {f_ / sec:.0f} files/s")
        finally:
            s.close()
    for n in (1, 8):
        w, wo = got[(True, n)], got[(False, n)]
        x = w["fps"] / wo["fps"] if wo["fps"] else None
        extra = {k: v for k, v in w.items() if k not in ("fps", "truncated")}
        b.put(f"prefetch_{n}", "dstage", w["fps"], w["truncated"], no_list_fps=round(wo["fps"], 1),
              x_no_list=None if x is None else round(x, 2),
              no_list_cpu_s_per_GiB=wo.get("cpu_s_per_GiB"), **extra)
        b.notes.append(f"known-order prefetch, {n} reader(s): {w['fps']:.0f} files/s with the "
                       f"list, {wo['fps']:.0f} without ({'n/a' if x is None else f'{x:.2f}'}x)")
