#!/usr/bin/python3
"""bench/scrape_ab.py: what a Prometheus-style scraper costs dstagefs's warm
read, measured as an A/B in one run (issue 15: "within the run-to-run
spread of the same read without it").

    bench/scrape_ab.py [--files N] [--size-mb M] [--rounds R]
                       [--interval S] [--json]

Alone, it stages N x M MiB (default 4 x 512) from a file:// source into a
fresh cache with the build's stager daemon, mounts dstagefs with
metrics.listen on a free loopback port, then R rounds (default 5) of two
warm reads of every file (4 MiB reads, the page cache dropped before
each): one with no scraper, one while a thread GETs /metrics every S
seconds (default 1), as Prometheus would. The order within a round
alternates, so a drift of the machine's speed falls on both sides. It
prints each run's MB/s, the medians, the spread of the runs without a
scraper (max - min) and whether the medians differ by no more than that
spread ("within the run-to-run spread"). bench/run calls ab() on its own mount (row
large_warm_scraped). Needs root (drop_caches, FUSE) and build/
($DSTAGE_BUILD_DIR). Commands and figures:
bench/results/history/issue15-scrape-cost-2026-12-01.md.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

MiB = 1 << 20
READ_BUF = 4 * MiB


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_all(paths):
    """Read every file with 4 MiB reads; (bytes, seconds)."""
    buf = bytearray(READ_BUF)
    mv = memoryview(buf)
    tot = 0
    t = time.monotonic()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            while True:
                n = os.readv(fd, [mv])
                if n <= 0:
                    break
                tot += n
        finally:
            os.close(fd)
    return tot, max(time.monotonic() - t, 1e-6)


class Scraper:
    """GET url every interval seconds on a thread, as Prometheus does; the
    body is read whole. Counts scrapes and failures."""

    def __init__(self, url, interval):
        self.url, self.interval = url, interval
        self.stop = threading.Event()
        self.scrapes = self.failures = 0
        self.th = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while True:
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    r.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1
            if self.stop.wait(self.interval):
                return

    def __enter__(self):
        self.th.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.th.join(10)


def ab(read_once, url, rounds, interval=1.0, log=print):
    """rounds x (a read without a scraper, a read with one), the order
    alternating. read_once() drops caches itself and returns MB/s.
    Returns a dict: runs without and with (MB/s, in order), medians, the
    spread of each (max - min), scrapes made, and within (the median with
    the two medians differ by no more than the spread of the runs
    without: the issue's "within the run-to-run spread")."""
    no, yes, scrapes, failures = [], [], 0, 0
    for i in range(rounds):
        for with_scraper in ((False, True) if i % 2 == 0 else (True, False)):
            if with_scraper:
                with Scraper(url, interval) as s:
                    v = read_once()
                scrapes += s.scrapes
                failures += s.failures
                yes.append(v)
            else:
                no.append(v := read_once())
            log(f"round {i + 1}: warm read {'with' if with_scraper else 'without'}"
                f" a scraper: {v:.0f} MB/s")
    med_no, med_yes = statistics.median(no), statistics.median(yes)
    return {
        "without_MBps": [round(v, 1) for v in no],
        "with_MBps": [round(v, 1) for v in yes],
        "median_without_MBps": round(med_no, 1),
        "median_with_MBps": round(med_yes, 1),
        "spread_without_MBps": round(max(no) - min(no), 1),
        "spread_with_MBps": round(max(yes) - min(yes), 1),
        "interval_s": interval,
        "scrapes": scrapes,
        "scrape_failures": failures,
        "median_delta_MBps": round(med_yes - med_no, 1),
        "within": abs(med_yes - med_no) <= max(no) - min(no),
    }


def summary(r):
    return (f"warm read without a scraper: {', '.join(f'{v:.0f}' for v in r['without_MBps'])}"
            f" MB/s (median {r['median_without_MBps']:.0f}, spread"
            f" {r['spread_without_MBps']:.0f}); with a scrape every"
            f" {r['interval_s']:g} s ({r['scrapes']} scrapes):"
            f" {', '.join(f'{v:.0f}' for v in r['with_MBps'])} MB/s (median"
            f" {r['median_with_MBps']:.0f}, spread {r['spread_with_MBps']:.0f});"
            f" medians {r['median_delta_MBps']:+.0f} MB/s apart:"
            f" {'within' if r['within'] else 'OUTSIDE'} the spread without")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.abspath(os.environ.get("DSTAGE_BUILD_DIR", os.path.join(repo, "build")))
    stager = os.path.join(build, "stager", "stager")
    dstagefs = os.path.join(build, "fs", "dstagefs")
    for exe in (stager, dstagefs):
        if not os.access(exe, os.X_OK):
            sys.exit(f"bench/scrape_ab.py: {exe} not built")
    work = tempfile.mkdtemp(prefix="dstage-scrape-ab.", dir="/var/tmp")
    mnt = os.path.join(work, "mnt")
    port = free_port()
    procs = []
    try:
        os.makedirs(os.path.join(work, "src"))
        os.makedirs(mnt)
        for i in range(a.files):
            with open(os.path.join(work, "src", f"f{i}"), "wb") as f:
                for _ in range(a.size_mb):
                    f.write(os.urandom(MiB))
        conf = os.path.join(work, "dstage.conf")
        with open(conf, "w") as f:
            f.write(f"[cache]\ndir = {work}/cache\nsize = {a.files * a.size_mb * 2}M\n"
                    f"[catalog]\npath = {work}/catalog.db\n"
                    f"[daemon]\nsocket = {work}/stager.sock\n"
                    f"[metrics]\nlisten = 127.0.0.1:{port}\n[log]\nlevel = warn\n")
        log = open(os.path.join(work, "log"), "ab")
        d = subprocess.Popen([stager, "--config", conf, "daemon"], stdout=log, stderr=log)
        procs.append(d)
        for _ in range(100):
            if os.path.exists(os.path.join(work, "stager.sock")):
                break
            time.sleep(0.1)
        subprocess.run([stager, "--config", conf, "add", "d", f"file://{work}/src/"],
                       check=True, capture_output=True, timeout=120)
        subprocess.run([stager, "--config", conf, "stage", "d", "--wait"],
                       check=True, capture_output=True, timeout=600)
        d.terminate()
        d.wait(30)
        procs.remove(d)
        fs = subprocess.Popen([dstagefs, "--config", conf, "-f", mnt], stdout=log,
                              stderr=log)
        procs.append(fs)
        paths = [os.path.join(mnt, "datasets", "d", f"f{i}") for i in range(a.files)]
        for _ in range(200):
            if os.path.exists(paths[-1]):
                break
            time.sleep(0.1)

        def read_once():
            drop_caches()
            b, s = read_all(paths)
            if b != a.files * a.size_mb * MiB:
                raise RuntimeError(f"read {b} bytes, expected {a.files * a.size_mb * MiB}")
            return b / s / 1e6

        read_once()  # one untimed pass: every process has verified its blocks
        r = ab(read_once, f"http://127.0.0.1:{port}/metrics", a.rounds, a.interval,
               log=(lambda m: None) if a.json else print)
        r.update(files=a.files, size_mb=a.size_mb, rounds=a.rounds)
        print(json.dumps(r, indent=1) if a.json else summary(r))
    finally:
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
        for p in procs:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
