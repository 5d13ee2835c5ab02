#!/usr/bin/python3
"""bench/overlay_bench.py: the transparent mode (dstagefs --over DIR) against
reading the tree directly and against reading the cache's files directly.

    bench/overlay_bench.py [--files N] [--size MIB] [--work DIR] [--json OUT]

Standalone, and bench/run's `--rows overlay` (run()): makes a tree of N
files of SIZE MiB in WORK/pfs (the stand-in for /mnt/parallel-fs; on this
machine a local disk), a cache in WORK/cache, mounts dstagefs --over
WORK/pfs, then reads every file, one reader, 1 MiB reads:

  direct_cold    the tree directly, page cache dropped
  direct_warm    the tree directly, second pass (page cache)
  overlay_cold   through the overlay, cache empty, page cache dropped:
                 the cold path's overhead against direct_cold
  overlay_warm   through the overlay, blocks in the cache, page cache
                 dropped (echo 3 > drop_caches): NVMe cache -> FUSE
  cachefile_warm the cache's object files read directly after the same
                 drop: what overlay_warm should reach (ratio >= 0.9)

Needs root (FUSE over a directory, drop_caches) and the build in build/
($DSTAGE_BUILD_DIR). Prints one JSON object: MiB/s per phase and the ratios
overlay_warm/cachefile_warm and overlay_cold/direct_cold.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 1 << 20


def drop_caches():
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def read_all(paths, dir_fd=None):
    total, buf = 0, bytearray(CHUNK)
    t0 = time.monotonic()
    for p in paths:
        fd = os.open(p, os.O_RDONLY, dir_fd=dir_fd)
        try:
            while True:
                n = os.readv(fd, [buf])
                if not n:
                    break
                total += n
        finally:
            os.close(fd)
    dt = time.monotonic() - t0
    return total / (1 << 20) / dt if dt > 0 else 0.0


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) and
                   " - fuse.dstagefs " in line for line in f)


def measure(dstagefs, files, size_mib, work=None):
    """The five phases (module docstring) on files x size_mib MiB; MiB/s
    per phase, and the two ratios. work=None: a temporary directory,
    removed after."""
    work = Path(work or tempfile.mkdtemp(prefix="dstage-ovl-bench."))
    keep = work.exists() and any(work.iterdir())
    pfs, cache = work / "pfs", work / "cache"
    pfs.mkdir(parents=True, exist_ok=True)
    cache.mkdir(mode=0o700, exist_ok=True)
    conf = work / "dstage.conf"
    conf.write_text("[cache]\ndir = %s\nsize = %dM\nblock_size = 4M\n"
                    "[catalog]\npath = %s/catalog.db\n"
                    % (cache, files * size_mib * 2 + 256, work))
    names = ["f%04d.bin" % i for i in range(files)]
    block = os.urandom(CHUNK)
    for n in names:
        with open(pfs / n, "wb") as f:
            for _ in range(size_mib):
                f.write(block)
    under = os.open(pfs, os.O_RDONLY | os.O_DIRECTORY)
    res, proc = {"files": files, "size_mib": size_mib}, None
    try:
        res["drop_caches"] = drop_caches()
        res["direct_cold"] = read_all(names, under)
        res["direct_warm"] = read_all(names, under)
        proc = subprocess.Popen([str(dstagefs), "-f", "--config", str(conf),
                                 "--over", str(pfs)],
                                stdout=subprocess.DEVNULL,
                                stderr=open(work / "dstagefs.log", "ab"))
        for _ in range(200):
            if mounted(pfs):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("overlay_bench: no mount; see %s/dstagefs.log"
                               % work)
        drop_caches()
        res["overlay_cold"] = read_all([pfs / n for n in names])
        drop_caches()
        res["overlay_warm"] = read_all([pfs / n for n in names])
        objs = sorted(p for p in (cache / "objects").rglob("*")
                      if p.is_file())
        drop_caches()
        res["cachefile_warm"] = read_all(objs)
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)
        os.close(under)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    res["warm_vs_cachefile"] = (res["overlay_warm"] / res["cachefile_warm"]
                                if res.get("cachefile_warm") else None)
    res["cold_vs_direct"] = (res["overlay_cold"] / res["direct_cold"]
                             if res.get("direct_cold") else None)
    return res


def run(b, log):
    """bench/run's overlay rows (--rows overlay): the big files' count and
    size of the profile, capped at 1 GiB in all."""
    files = max(1, min(b.p["big_n"] * 4, 16))
    size = max(16, min(b.p["big_size"] >> 20, (1 << 30 >> 20) // files))
    log(f"overlay: {files} files of {size} MiB, dstagefs --over")
    try:
        r = measure(b.dstagefs, files, size)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        for rid in ("overlay_warm", "overlay_cold", "overlay_vs_tree"):
            b.put(rid, "dstage", None, why=str(e)[:200])
        return
    mb = 1.048576  # MiB/s -> MB/s
    b.limits["overlay_cachefile_MBps"] = r["cachefile_warm"] * mb
    b.limits["overlay_tree_cold_MBps"] = r["direct_cold"] * mb
    b.put("overlay_warm", "dstage", r["overlay_warm"] * mb)
    b.put("overlay_cold", "dstage", r["overlay_cold"] * mb)
    b.put("overlay_vs_tree", "dstage", r["overlay_warm"] * mb)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--size", type=int, default=64, help="MiB per file")
    ap.add_argument("--work", help="work directory (default: a tmp dir)")
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    build = Path(os.environ.get("DSTAGE_BUILD_DIR", "build"))
    dstagefs = build / "fs" / "dstagefs"
    if not dstagefs.exists():
        sys.exit("overlay_bench: %s not built" % dstagefs)
    try:
        res = measure(dstagefs, a.files, a.size, a.work)
    except RuntimeError as e:
        sys.exit(str(e))
    out = json.dumps(res, indent=1)
    print(out)
    if a.json:
        Path(a.json).write_text(out + "\n")


if __name__ == "__main__":
    main()
