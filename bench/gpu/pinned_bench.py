#!/usr/bin/python3
"""bench/gpu/pinned_bench.py: the pinned path (include/dstage/pinned.h)
against its limits, through the Python binding (python/dstage). Usually run
by bench/gpu/run, which builds libdstage.so first.

    pinned_bench.py --lib LIBDSTAGE.so --dir DATADIR --out RESULTS.json
                    [--size-mb 4096] [--files 20000] [--threads 1,4,8]
                    [--reps 3] [--dstagefs BIN --catalog-tool BIN]

Cases (each the best of --reps runs, GB/s = 1e9 bytes/s):
  a  copy_pinned        cudaMemcpy from pinned memory of the same size: the
                        PCIe limit the reader is held against
     file_pinned_warm   file (in the page cache) -> pinned chunks -> device,
                        pinned_read_device, with 1..T threads (one context
                        each, a range each)
     file_pinned_cold   the same after drop_caches (O_DIRECT from the disk),
                        when this process may drop caches (root)
     ratio_*            file_pinned_* / copy_pinned
     mount_pinned_*     the same file through a dstagefs mount (--dstagefs):
                        its first read, filling dstage's cache from the
                        file:// source (after drop_caches), then warm
  b  file_pageable_warm read into malloc'd (pageable) memory, then cudaMemcpy
                        from it: the path pinned buffers replace
  c  small_batch        --files files of 1-150 KB, 1,000 per pinned_read_batch
                        to the device (files/s, GB/s)
     small_loop         the same files one by one: open, read into pageable
                        memory, cudaMemcpy to the file's own place on the
                        device (as the batch lays them out)

Writes RESULTS.json: {"mode", "reason", "host", "date", "params",
"cases": {name: {...}}, "notes": [...]}. Without a GPU (or a CUDA build)
the library runs in its CPU mode: "device" copies are memcpy, and the
figures measure the host side only.
"""
import argparse
import ctypes
import datetime
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def best(reps, fn):
    """The shortest of reps timed calls of fn."""
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def make_file(path, size):
    if path.exists() and path.stat().st_size == size:
        return
    block = random.Random(1).randbytes(64 << 20)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


def make_small(d, n):
    d.mkdir(exist_ok=True)
    r = random.Random(2)
    sizes = [r.randrange(1000, 150000) for _ in range(n)]
    paths = [d / ("%06d.bin" % i) for i in range(n)]
    blob = r.randbytes(150000)
    for p, s in zip(paths, sizes):
        if not p.exists() or p.stat().st_size != s:
            p.write_bytes(blob[:s])
    return paths, sizes


def read_threads(pinned, path, size, dev, threads, opts):
    """pinned_read_device of [0, size) split into threads ranges."""
    ctxs = [pinned.Pinned(**opts) for _ in range(threads)]
    files = [c.open(path) for c in ctxs]
    step = (size // threads + 4095) // 4096 * 4096
    errs = []

    def one(i):
        off = i * step
        n = max(0, min(step, size - off))
        try:
            if n:
                files[i].read_device(off, n, dev, dev_off=off)
        except OSError as e:
            errs.append(e)

    def run():
        ts = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errs:
            raise errs[0]
    return run, files


def mount_cases(a, pinned, p, big, size, dev, threads, opts, limit, res):
    """The same file through a dstagefs mount of a file:// dataset: its
    first read (the mount fills dstage's cache) and then warm."""
    cases, gb = res["cases"], lambda n, t: round(n / t / 1e9, 3)  # noqa
    if not os.path.exists("/dev/fuse"):
        res["notes"].append("mount cases skipped: no /dev/fuse")
        return
    work = Path(a.dir) / "mount"
    src = work / "src"
    src.mkdir(parents=True, exist_ok=True)
    if not (src / "big.bin").exists():
        os.link(big, src / "big.bin")
    cfg = work / "dstage.conf"
    cfg.write_text("[cache]\ndir = %s\nsize = %d\n[catalog]\npath = %s\n" %
                   (work / "cache", 2 * size + (1 << 30),
                    work / "catalog.db"))
    env = dict(os.environ, DSTAGE_CONFIG=str(cfg))
    if not (work / "catalog.db").exists():
        subprocess.run([a.catalog_tool, str(work / "catalog.db"), "add",
                        "bench", "file://%s/" % src], env=env, check=True,
                       capture_output=True, timeout=120)
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    log = open(work / "dstagefs.log", "wb")
    fs = subprocess.Popen([a.dstagefs, "-f", str(mnt)], env=env, stdout=log,
                          stderr=subprocess.STDOUT)
    path = mnt / "datasets" / "bench" / "big.bin"
    try:
        end = time.monotonic() + 30
        while not path.exists():
            if fs.poll() is not None or time.monotonic() > end:
                res["notes"].append("mount cases skipped: dstagefs did not "
                                    "mount (see %s)" % (work / "dstagefs.log"))
                return
            time.sleep(0.05)
        run, files = read_threads(pinned, path, size, dev, 1, opts)
        drop_caches()
        t = best(1, run)
        cases["mount_pinned_first_t1"] = {
            "bytes": size, "threads": 1, "s": round(t, 4),
            "GBps": gb(size, t), "ratio_to_copy_pinned":
            round(gb(size, t) / limit, 3)}
        print("mount_pinned_first t1 %.2f GB/s" % gb(size, t), flush=True)
        for f in files:
            f.close()
        for th in threads:
            run, files = read_threads(pinned, path, size, dev, th, opts)
            t = best(a.reps, run)
            cases["mount_pinned_warm_t%d" % th] = {
                "bytes": size, "threads": th, "s": round(t, 4),
                "GBps": gb(size, t), "ratio_to_copy_pinned":
                round(gb(size, t) / limit, 3)}
            print("mount_pinned_warm t%d %.2f GB/s" % (th, gb(size, t)),
                  flush=True)
            for f in files:
                f.close()
    finally:
        fs.send_signal(signal.SIGTERM)
        try:
            fs.wait(30)
        except subprocess.TimeoutExpired:
            fs.kill()
            fs.wait(30)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
        log.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size-mb", type=int, default=4096)
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--threads", default="1,4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk-mb", type=int, default=8)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--dstagefs", help="dstagefs binary: adds mount cases")
    ap.add_argument("--catalog-tool", help="tests/tools/catalog_tool binary")
    a = ap.parse_args()

    os.environ["DSTAGE_LIB"] = a.lib
    sys.path.insert(0, str(REPO / "python"))
    import dstage.pinned as pinned

    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    size = a.size_mb << 20
    threads = [int(t) for t in a.threads.split(",")]
    opts = dict(chunk=a.chunk_mb << 20, depth=a.depth)
    p = pinned.Pinned(**opts)
    res = {"mode": p.mode, "reason": p.reason, "host": socket.gethostname(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "params": vars(a), "cases": {}, "notes": []}
    cases = res["cases"]
    gb = lambda n, t: round(n / t / 1e9, 3)  # noqa: E731
    print("mode %s (%s)" % (p.mode, p.reason), flush=True)

    big = d / "big.bin"
    t0 = time.perf_counter()
    make_file(big, size)
    print("data: %d MiB file in %.1f s" % (a.size_mb, time.perf_counter() - t0),
          flush=True)
    dev = p.dev_alloc(size)
    host = p.host_alloc(size)
    with p.open(big) as f:
        f.read_host(0, size, host)  # page cache warm, host buffer touched

    # (a) the limit: cudaMemcpy from pinned memory.
    p.copy_to_dev(dev, host.ptr, size)
    t = best(a.reps, lambda: p.copy_to_dev(dev, host.ptr, size))
    cases["copy_pinned"] = {"bytes": size, "s": round(t, 4), "GBps": gb(size, t)}
    print("copy_pinned %.2f GB/s" % gb(size, t), flush=True)
    limit = gb(size, t)

    for th in threads:
        run, files = read_threads(pinned, big, size, dev, th, opts)
        t = best(a.reps, run)
        cases["file_pinned_warm_t%d" % th] = {
            "bytes": size, "threads": th, "s": round(t, 4),
            "GBps": gb(size, t), "ratio_to_copy_pinned":
            round(gb(size, t) / limit, 3)}
        print("file_pinned_warm t%d %.2f GB/s" % (th, gb(size, t)), flush=True)
        for f in files:
            f.close()

    if drop_caches():
        for th in threads:
            run, files = read_threads(pinned, big, size, dev, th, opts)
            drop_caches()
            t = best(1, run)
            cases["file_pinned_cold_t%d" % th] = {
                "bytes": size, "threads": th, "s": round(t, 4),
                "GBps": gb(size, t), "ratio_to_copy_pinned":
                round(gb(size, t) / limit, 3)}
            print("file_pinned_cold t%d %.2f GB/s" % (th, gb(size, t)),
                  flush=True)
            for f in files:
                f.close()
        with p.open(big) as f:
            f.read_host(0, size, host)  # warm again
    else:
        res["notes"].append("cold cases skipped: drop_caches not allowed")

    if a.dstagefs:
        mount_cases(a, pinned, p, big, size, dev, threads, opts, limit, res)

    # (b) pageable: read into malloc'd memory, then cudaMemcpy from it.
    host = None
    page = bytearray(size)
    addr = ctypes.addressof((ctypes.c_char * size).from_buffer(page))
    mv = memoryview(page)

    def pageable():
        fd = os.open(big, os.O_RDONLY)
        try:
            off = 0
            while off < size:
                n = os.preadv(fd, [mv[off:off + (64 << 20)]], off)
                if n <= 0:
                    raise OSError("short read of %s" % big)
                off += n
        finally:
            os.close(fd)
        p.copy_to_dev(dev, addr, size)
    t = best(a.reps, pageable)
    tr = best(1, lambda: p.copy_to_dev(dev, addr, size))
    cases["file_pageable_warm"] = {"bytes": size, "s": round(t, 4),
                                   "GBps": gb(size, t),
                                   "copy_pageable_GBps": gb(size, tr)}
    print("file_pageable_warm %.2f GB/s (its copy alone %.2f)" %
          (gb(size, t), gb(size, tr)), flush=True)
    mv = page = None
    dev = None

    # (c) many small files.
    t0 = time.perf_counter()
    paths, sizes = make_small(d / "small", a.files)
    print("data: %d small files in %.1f s" % (a.files, time.perf_counter() - t0),
          flush=True)
    total = sum(sizes)
    per = 1000
    arena = p.host_alloc(per * 160000)
    sdev = p.dev_alloc(per * 160000)
    for i in range(0, len(paths), per):  # warm
        p.read_batch(paths[i:i + per], arena, dev=sdev)

    def batch():
        for i in range(0, len(paths), per):
            p.read_batch(paths[i:i + per], arena, dev=sdev)
    t = best(a.reps, batch)
    cases["small_batch"] = {"files": len(paths), "bytes": total,
                            "per_batch": per, "s": round(t, 4),
                            "files_per_s": round(len(paths) / t),
                            "GBps": gb(total, t)}
    print("small_batch %d files/s %.2f GB/s" % (len(paths) / t, gb(total, t)),
          flush=True)
    buf = bytearray(160000)
    baddr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    bmv = memoryview(buf)

    def loop():
        # Each file to its own place on the device, as in the batch.
        at = 0
        for i, (path, s) in enumerate(zip(paths, sizes)):
            if i % per == 0:
                at = 0
            fd = os.open(path, os.O_RDONLY)
            try:
                n = os.readv(fd, [bmv[:s]])
            finally:
                os.close(fd)
            if n != s:
                raise OSError("short read of %s" % path)
            p.copy_to_dev(sdev, baddr, s, dev_off=at)
            at = (at + s + 255) // 256 * 256
    t = best(a.reps, loop)
    cases["small_loop"] = {"files": len(paths), "bytes": total,
                           "s": round(t, 4),
                           "files_per_s": round(len(paths) / t),
                           "GBps": gb(total, t)}
    print("small_loop %d files/s %.2f GB/s" % (len(paths) / t, gb(total, t)),
          flush=True)

    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
