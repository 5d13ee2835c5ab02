#!/usr/bin/env python3
"""bench/cache_bench.py: the block cache against the tools it must keep up
with, in one run.

  warm  reading an object that is fully cached, through the cache API
        (tests/tools/cache_tool cat: checksums verified, as a fresh process
        does), against dd reading the same bytes of the same cache file;
        the page cache is dropped before each (echo 3 > drop_caches),
        then each tool is run once idle (cache_tool --help, dd --version)
        so that loading its program and libraries from disk (cache_tool
        links curl, OpenSSL and SQLite: about 100 ms) is not timed.
        Target: cache/dd >= 0.9.
  cold  reading an object that is not cached (fetch, write, fdatasync,
        checksum, then copy out) against the object-store client's own
        parallel ranged GET of the same object to /dev/null
        (tests/tools/objstore_tool URL cat KEY CHUNK -). Target >= 0.9.

    bench/cache_bench.py [--size 1G] [--block 4M] [--runs 3] [--build DIR]

Cold runs against radosgw: starts one (scripts/rgw) unless RGW_DIR and
AWS_ENDPOINT_URL name a running one. Prints the figures and ratios and
writes bench/results/cache-<UTC date>.json.
"""
import argparse
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchlib import REPO, parse_size, rgw_env


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(argv, env):
    t = time.monotonic()
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    dt = time.monotonic() - t
    if p.returncode != 0:
        sys.exit("%s failed: %s" % (argv, p.stderr.decode(errors="replace")))
    return dt, p.stderr.decode(errors="replace")


def curl_mb(env, bucket):
    sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    subprocess.run(["curl", "-sf", "-X", "PUT", "--aws-sigv4",
                    "aws:amz:us-east-1:s3", "--user",
                    env["AWS_ACCESS_KEY_ID"] + ":" +
                    env["AWS_SECRET_ACCESS_KEY"],
                    "-H", "x-amz-content-sha256: " + sha,
                    env["AWS_ENDPOINT_URL"] + "/" + bucket],
                   check=True, stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--block", default="4M")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", default=os.environ.get("DSTAGE_BUILD_DIR",
                                                      "build"))
    args = ap.parse_args()
    size = parse_size(args.size)
    build = os.path.join(REPO, args.build)
    cache_tool = os.path.join(build, "tests", "cache_tool")
    os_tool = os.path.join(build, "tests", "objstore_tool")
    tmp = tempfile.mkdtemp(prefix="cache-bench.", dir="/var/tmp")
    rgw_dir = None
    try:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        with open(os.path.join(src, "obj"), "wb") as f:
            chunk = os.urandom(16 << 20)
            for i in range(0, size, len(chunk)):
                f.write(chunk[:min(len(chunk), size - i)])
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("DSTAGE_")}
        base.update(DSTAGE_CACHE_BLOCK_SIZE=args.block,
                    DSTAGE_CACHE_SIZE=str(4 * size + (1 << 30)),
                    DSTAGE_CATALOG_PATH=os.path.join(tmp, "none.db"),
                    DSTAGE_LOG_LEVEL="warn")

        # ---- warm: cache API vs dd on the same cache file ----
        wenv = dict(base, DSTAGE_CACHE_DIR=os.path.join(tmp, "wcache"))
        url = "file://" + src + "/"
        timed([cache_tool, url, "ds", "fetch", "obj"], wenv)
        # the data file (its sidecar, NAME.meta, holds header and records):
        # the object's bytes from offset 0
        [cfile] = [p for p in glob.glob(os.path.join(tmp, "wcache",
                                                     "objects", "*", "*"))
                   if not p.endswith(".meta")]
        data_off = 0
        bs = parse_size(args.block)
        warm_cache, warm_dd = [], []
        for _ in range(args.runs):
            drop_caches()
            subprocess.run([cache_tool, "--help"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            dt, _ = timed([cache_tool, url, "ds", "cat", "obj", str(bs)],
                          wenv)
            warm_cache.append(size / dt)
            drop_caches()
            subprocess.run(["dd", "--version"], stdout=subprocess.DEVNULL)
            dt, _ = timed(["dd", "if=" + cfile, "of=/dev/null",
                           "bs=%d" % bs, "iflag=skip_bytes",
                           "skip=%d" % data_off, "count=%d" % (size // bs)],
                          wenv)
            warm_dd.append(size // bs * bs / dt)

        # ---- cold: cache API vs the client's parallel GET ----
        env, rgw_dir = rgw_env(tmp)
        env.update({k: v for k, v in base.items() if k.startswith("DSTAGE")})
        curl_mb(env, "cache-bench")
        s3 = "s3://cache-bench/b/"
        subprocess.run([os_tool, s3, "put", "obj", os.path.join(src, "obj")],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        cold_cache, cold_get = [], []
        for i in range(args.runs):
            cdir = os.path.join(tmp, "ccache%d" % i)
            cenv = dict(env, DSTAGE_CACHE_DIR=cdir)
            dt, err = timed([os_tool, s3, "cat", "obj", "16M", "-"],
                            env)
            cold_get.append(size / dt)
            dt, err = timed([cache_tool, s3, "ds", "cat", "obj", str(bs)],
                            cenv)
            cold_cache.append(size / dt)
            shutil.rmtree(cdir)

        def best(v):
            return max(v) / 1e6
        res = {
            "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
            "size": size, "block_size": bs, "runs": args.runs,
            "warm_cache_MBps": [round(x / 1e6, 1) for x in warm_cache],
            "warm_dd_MBps": [round(x / 1e6, 1) for x in warm_dd],
            "warm_ratio": round(best(warm_cache) / best(warm_dd), 3),
            "cold_cache_MBps": [round(x / 1e6, 1) for x in cold_cache],
            "cold_objstore_get_MBps": [round(x / 1e6, 1) for x in cold_get],
            "cold_ratio": round(best(cold_cache) / best(cold_get), 3),
            "target": 0.9,
        }
        print("warm: cache %.0f MB/s, dd %.0f MB/s, ratio %.2f (target 0.9)"
              % (best(warm_cache), best(warm_dd), res["warm_ratio"]))
        print("cold: cache %.0f MB/s, objstore GET %.0f MB/s, ratio %.2f "
              "(target 0.9)" % (best(cold_cache), best(cold_get),
                                res["cold_ratio"]))
        os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
        out = os.path.join(REPO, "bench", "results", "cache-%s.json" %
                           datetime.datetime.utcnow().strftime("%Y-%m-%d"))
        with open(out, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
        print("written", out)
    finally:
        if rgw_dir:
            subprocess.run([os.path.join(REPO, "scripts", "rgw"), "stop",
                            rgw_dir], stdout=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
