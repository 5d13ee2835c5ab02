#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Small files warm through dstagefs against the same tree on local disk.

bench/smallfile_probe.py [--build DIR] [--files N] [--readers 1,8] [--runs 3]
                         [--ceiling] [--drop 3|1]

Makes N files of 1-150 KB (seeded) under a work directory on the cache
disk, registers them as a file:// dataset, stages it (so the cache is
warm), mounts dstagefs, then for each reader count and run, with the page
cache dropped (dentries and inodes too) before each read, alternately:
  local: every file of the tree read by R threads (open, read, close);
  dstage: the same files through MOUNT/datasets/d/.
--drop 1 drops only the page cache (dentries and inodes stay, on local
disk and in the FUSE mounts alike: the second epoch of a job whose data
outgrew memory, while its names did not).
With --ceiling, libfuse's passthrough_hp (bench/ceiling.py's, the FUSE
ceiling) mounted over the tree is read third in each run.
Prints files/s of each and the ratio. Needs root (drop_caches, FUSE).
For issue 17's per-open cost; bench/run is the full benchmark.
PROBE_PERF=record PROBE_OUT=FILE (or PROBE_PERF="record -g", "trace -s") runs
perf on dstagefs around each dstage read (FILE.READERS.RUN).
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time


DROP = "3"  # --drop: what drop() writes to drop_caches


def drop():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write(DROP + "\n")


def disk_reads():
    """Reads completed by every whole disk (sectors too), /proc/diskstats."""
    n = sec = 0
    with open("/proc/diskstats") as f:
        for line in f:
            x = line.split()
            if x[2].startswith(("vd", "sd", "nvme")) and not x[2][-1].isdigit() or x[2].startswith("nvme") and "p" not in x[2][4:]:
                n += int(x[3])
                sec += int(x[5])
    return n, sec


def read_all(paths, readers):
    """Read every path with `readers` threads; returns seconds."""
    it = iter(paths)
    lock = threading.Lock()
    errors = []

    def work():
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                return
            try:
                fd = os.open(p, os.O_RDONLY)
                try:
                    while os.read(fd, 1 << 20):
                        pass
                finally:
                    os.close(fd)
            except OSError as e:
                errors.append(f"{p}: {e}")
                return

    t0 = time.monotonic()
    ts = [threading.Thread(target=work) for _ in range(readers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=600)
    if errors:
        sys.exit("read failed: " + errors[0])
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--readers", default="1,8")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--drop", choices=("3", "1"), default="3",
                    help="what is dropped before each read (drop_caches)")
    ap.add_argument("--ceiling", action="store_true",
                    help="also read the tree through passthrough_hp")
    a = ap.parse_args()
    global DROP
    DROP = a.drop
    build = os.path.abspath(a.build)
    work = tempfile.mkdtemp(prefix="dstage-small.", dir="/var/tmp")
    src = os.path.join(work, "src")
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    rnd = random.Random(17)
    rel = []
    for i in range(a.files):
        r = f"d{i % 10}/f{i:06d}"
        os.makedirs(os.path.join(src, os.path.dirname(r)), exist_ok=True)
        with open(os.path.join(src, r), "wb") as f:
            f.write(rnd.randbytes(rnd.randint(1000, 150000)))
        rel.append(r)
    conf = os.path.join(work, "dstage.conf")
    with open(conf, "w") as f:
        f.write(f"[cache]\ndir = {work}/cache\nsize = 4G\n"
                f"[catalog]\npath = {work}/catalog.db\n"
                f"[daemon]\nsocket = {work}/stager.sock\n[log]\nlevel = warn\n")
    env = dict(os.environ, DSTAGE_CONFIG=conf)
    stager = os.path.join(build, "stager/stager")
    daemon = subprocess.Popen([stager, "daemon"], env=env,
                              stdout=subprocess.DEVNULL,
                              stderr=open(os.path.join(work, "d.log"), "w"))
    mounted = False
    hp = None
    hpmnt = os.path.join(work, "hp")
    try:
        for _ in range(100):
            if os.path.exists(os.path.join(work, "stager.sock")):
                break
            time.sleep(0.1)
        run = lambda *c: subprocess.run([stager, *c], env=env, check=True,
                                        stdout=subprocess.DEVNULL,
                                        timeout=600)
        run("add", "d", f"file://{src}/")
        run("stage", "d", "--wait")
        subprocess.run([os.path.join(build, "fs/dstagefs"), mnt], env=env,
                       check=True, timeout=60)
        mounted = True
        local = [os.path.join(src, r) for r in rel]
        mine = [os.path.join(mnt, "datasets/d", r) for r in rel]
        read_all(mine, 8)  # first opens: catalog, cache files
        theirs = None
        if a.ceiling:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import ceiling
            ph = ceiling.passthrough_hp_path()
            why = ceiling.passthrough_hp_missing(ph)
            if why:
                sys.exit(f"--ceiling: passthrough_hp {why}")
            os.makedirs(hpmnt)
            hp = subprocess.Popen(ceiling.passthrough_hp_cmd(ph, src, hpmnt),
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            theirs = [os.path.join(hpmnt, r) for r in rel]
            for _ in range(100):
                if os.path.exists(theirs[0]):
                    break
                time.sleep(0.1)
            read_all(theirs, 8)
        for readers in [int(x) for x in a.readers.split(",")]:
            for run_i in range(a.runs):
                drop()
                d0 = disk_reads()
                tl = read_all(local, readers)
                d1 = disk_reads()
                drop()
                rec = None
                if os.environ.get("PROBE_PERF"):  # perf of one dstage read
                    pid = subprocess.run(["pgrep", "-f", f"dstagefs {mnt}"],
                                         capture_output=True, text=True
                                         ).stdout.split()[0]
                    rec = subprocess.Popen(
                        ["perf", *os.environ["PROBE_PERF"].split(), "-o",
                         f"{os.environ['PROBE_OUT']}.{readers}.{run_i}",
                         "-p", pid], stderr=subprocess.DEVNULL)
                    time.sleep(1)
                d2 = disk_reads()
                td = read_all(mine, readers)
                d3 = disk_reads()
                if rec:
                    rec.send_signal(2)
                    rec.wait(timeout=60)
                print(f"readers {readers} run {run_i + 1}: local "
                      f"{a.files / tl:.0f} files/s, dstage "
                      f"{a.files / td:.0f} files/s, ratio {tl / td:.2f}; disk reads "
                      f"per file {(d1[0] - d0[0]) / a.files:.1f} / "
                      f"{(d3[0] - d2[0]) / a.files:.1f}, KiB per file "
                      f"{(d1[1] - d0[1]) / 2 / a.files:.0f} / "
                      f"{(d3[1] - d2[1]) / 2 / a.files:.0f}",
                      flush=True)
                if theirs:
                    drop()
                    th = read_all(theirs, readers)
                    print(f"readers {readers} run {run_i + 1}: passthrough_hp "
                          f"{a.files / th:.0f} files/s, ratio {tl / th:.2f}",
                          flush=True)
    finally:
        if hp:
            subprocess.run(["fusermount3", "-u", hpmnt], timeout=60)
            hp.wait(timeout=30)
        if mounted:
            subprocess.run(["fusermount3", "-u", mnt], timeout=60)
        daemon.terminate()
        daemon.wait(timeout=30)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
