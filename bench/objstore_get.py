#!/usr/bin/env python3
"""bench/objstore_get.py: the object-store client's ranged-GET throughput
against curl fetching the same object with the same number of parallel
ranges from the same server, in one run.

    bench/objstore_get.py [--size 1G] [--parallel 8] [--chunk 16M] [--runs 3]

Starts its own radosgw (scripts/rgw) unless RGW_DIR names a running one
(source its env first). Prints the figures, the ratio dstage/curl (target:
at least 0.9) and writes bench/results/objstore-get-<UTC date>.json.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchlib import REPO, parse_size, rgw_env

EMPTY_SHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def curl_base(env):
    return ["curl", "-sf", "--aws-sigv4", "aws:amz:us-east-1:s3",
            "--user", env["AWS_ACCESS_KEY_ID"] + ":" + env["AWS_SECRET_ACCESS_KEY"],
            "-H", "x-amz-content-sha256: " + EMPTY_SHA]


def timed(fn):
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--chunk", default="4M")  # the cache's default block
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", default=os.environ.get("DSTAGE_BUILD_DIR",
                                                      os.path.join(REPO, "build")))
    args = ap.parse_args()
    size = parse_size(args.size)
    tool = os.path.join(args.build, "tests", "objstore_tool")
    tmp = tempfile.mkdtemp(prefix="dstage-bench-")
    env, rgw_dir = rgw_env(tmp)
    env.pop("AWS_CA_BUNDLE", None)
    env["DSTAGE_S3_MAX_INFLIGHT"] = str(args.parallel)
    endpoint = env["AWS_ENDPOINT_URL"]
    try:
        bucket = "bench-objstore-get"
        url = f"{endpoint}/{bucket}"
        subprocess.run(curl_base(env) + ["-X", "PUT", url], check=False)
        src = os.path.join(tmp, "obj")
        with open(src, "wb") as f:
            left = size
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
        subprocess.run([tool, f"s3://{bucket}/", "put", "obj", src],
                       env=env, check=True)
        os.unlink(src)

        def run_curl():
            part = (size + args.parallel - 1) // args.parallel
            procs = []
            for i in range(args.parallel):
                a, b = i * part, min(size, (i + 1) * part) - 1
                procs.append(subprocess.Popen(
                    curl_base(env) + ["-r", f"{a}-{b}", "-o", "/dev/null",
                                      f"{url}/obj"], env=env))
            if any(p.wait() for p in procs):
                sys.exit("curl failed")

        def run_dstage():
            subprocess.run([tool, f"s3://{bucket}/", "cat", "obj",
                            args.chunk, "-"], env=env, check=True)

        res = {"curl": [], "dstage": []}
        for _ in range(args.runs):  # interleaved, so drift hits both
            res["curl"].append(size / timed(run_curl) / 1e6)
            res["dstage"].append(size / timed(run_dstage) / 1e6)
        best = {k: max(v) for k, v in res.items()}
        ratio = best["dstage"] / best["curl"]
        cmd = (f"bench/objstore_get.py --size {args.size} --parallel "
               f"{args.parallel} --chunk {args.chunk} --runs {args.runs}")
        out = {
            "bench": "objstore-get",
            "date": datetime.datetime.utcnow().isoformat(timespec="seconds") + "Z",
            "size_bytes": size, "parallel": args.parallel, "chunk": args.chunk,
            "runs_MBps": res, "best_MBps": best,
            "ratio_dstage_over_curl": round(ratio, 3), "target": 0.9,
            "command": cmd,
        }
        os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
        path = os.path.join(REPO, "bench", "results",
                            "objstore-get-" + out["date"][:10] + ".json")
        with open(path, "w") as f:
            json.dump(out, f, indent=2)
        print(f"curl, {args.parallel} parallel ranges: {best['curl']:.0f} MB/s")
        print(f"dstage objstore, {args.parallel} in flight, {args.chunk} "
              f"ranges: {best['dstage']:.0f} MB/s")
        print(f"ratio dstage/curl: {ratio:.2f} (target 0.9)  -> {path}")
        print(f"reproduce: {cmd}")
    finally:
        if rgw_dir:
            subprocess.run([os.path.join(REPO, "scripts", "rgw"), "stop", rgw_dir])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
