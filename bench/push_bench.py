"""push_bench: the `stager push` rows of bench/run (issue 22).

The data-preparation step of the deployment guides, three ways, on the
bench's own local trees (the large shards and the small files bench/run
made) into fresh prefixes of its radosgw, the page cache dropped before
each (the local files are read cold):

  dstage          stager push DIR s3://bench/PREFIX/ (hash while uploading,
                  SHA256SUMS, registration)
  aws+sha256sum   aws s3 sync DIR s3://bench/PREFIX/, then sha256sum of
                  every local file (what the step costs by hand)
  rclone          rclone copy --checksum DIR rgw:bench/PREFIX/

and the store's own PUT limit for large files: 8 curl PUTs in parallel
(UNSIGNED-PAYLOAD, no hashing). Rows: push_large (MB/s; limit: the curl
PUTs, target 0.9) and push_small (files/s). Each prefix is deleted after
its phase (radosgw's memstore holds every byte). Run from bench/run, after
the peers' mount phases; `python3 bench/push_bench.py` alone only explains.

Standalone, against a radosgw already running (the shared one of a test
session), alternating push and the curl limit on the same files:

  python3 bench/push_bench.py --rgw-env /tmp/rgw-shared/env.json \\
      [--build build] [--mib 256] [--files 2] [--rounds 3] [--dir /dev/shm]

prints per round both rates, their ratio and CPU-seconds per GiB of the
client (push or curl) and of radosgw (RGW_PIDS of the env file).
"""
import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

EMPTY_SHA = ("e3b0c44298fc1c149afbf4c8996fb924"
             "27ae41e4649b934ca495991b7852b855")
AWS = "/usr/bin/aws" if os.access("/usr/bin/aws", os.X_OK) else shutil.which("aws")


def _files(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in names]
    return sorted(out)


def _size(paths):
    return sum(os.path.getsize(p) for p in paths)


class PushBench:
    def __init__(self, b):
        self.b = b
        self.env = dict(b.env)
        self.env.pop("AWS_CA_BUNDLE", None)
        self.bucket = "bench"
        self.n = 0
        self.limit_cpu = (None, None)

    def prefix(self, what):
        self.n += 1
        return f"push-{what}-{self.n}"

    def clear(self, prefix):
        if AWS:
            subprocess.run([AWS, "--endpoint-url", self.b.endpoint, "s3", "rm",
                            "--recursive", "--quiet",
                            f"s3://{self.bucket}/{prefix}/"],
                           env=self.env, capture_output=True, timeout=900)
        gc = getattr(self.b, "store_gc", None)
        if gc:
            gc()  # the store's room for the next phase

    def timed(self, cmds, cwd=None, pids=()):
        """Run cmds one after the other: (seconds, CPU seconds of the
        client (the commands, and pids: the stager daemon), CPU seconds of
        the store), or None on a failure."""
        self.b.drop_caches()
        store = getattr(self.b, "store_pids", list)()
        c0, s0 = _child_cpu() + _cpu(pids), _cpu(store)
        t = time.monotonic()
        for c in cmds:
            p = subprocess.run(c, env=self.env, cwd=cwd, capture_output=True,
                               timeout=1800)
            if p.returncode != 0:
                self.b.notes.append(
                    f"push bench: {' '.join(c[:3])} failed: "
                    f"{p.stderr.decode(errors='replace')[-300:]}")
                return None
        t = time.monotonic() - t
        return (t, _child_cpu() + _cpu(pids) - c0,
                _cpu(store) - s0 if store else None)

    def dstage(self, src, conf, daemon=None):
        pre = self.prefix("dstage")
        s = self.timed([[self.b.stager, "--config", conf, "push", src,
                         f"s3://{self.bucket}/{pre}/", "--name", pre]],
                       pids=[daemon] if daemon else ())
        self.clear(pre)
        return s

    def aws_sha(self, src):
        if not AWS:
            return None
        pre = self.prefix("aws")
        files = _files(src)
        s = self.timed([[AWS, "--endpoint-url", self.b.endpoint, "s3", "sync",
                         "--only-show-errors", src,
                         f"s3://{self.bucket}/{pre}/"],
                        ["sh", "-c", "find . -type f -print0 | xargs -0 "
                         "sha256sum > /dev/null"]], cwd=src)
        self.clear(pre)
        return s if files else None

    def rclone(self, src):
        if not shutil.which("rclone"):
            return None
        d = os.path.join(self.b.work, "push-rclone")
        os.makedirs(d, exist_ok=True)
        cfg = os.path.join(d, "rclone.conf")
        with open(os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                  "w") as f:
            f.write(f"[rgw]\ntype = s3\nprovider = Ceph\n"
                    f"access_key_id = {self.b.ak}\n"
                    f"secret_access_key = {self.b.sk}\n"
                    f"endpoint = {self.b.endpoint}\nregion = us-east-1\n")
        pre = self.prefix("rclone")
        s = self.timed([["rclone", "--config", cfg, "copy", "--checksum",
                         "--transfers", "8", "--checkers", "8", src,
                         f"rgw:{self.bucket}/{pre}"]])
        self.clear(pre)
        return s

    def curl_put_limit(self, paths):
        """8 parallel curl PUTs of the large files (each repeated to 8),
        MB/s."""
        pre = self.prefix("curl")
        jobs = [(i, paths[i % len(paths)]) for i in range(8)]
        total = _size(p for _, p in jobs)
        errs = []

        def put(i, path):
            p = subprocess.run(
                ["curl", "-sf", "--aws-sigv4", "aws:amz:us-east-1:s3",
                 "--user", f"{self.b.ak}:{self.b.sk}",
                 "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                 "-T", path, "-o", "/dev/null",
                 f"{self.b.endpoint}/{self.bucket}/{pre}/{i}"],
                capture_output=True, timeout=1800)
            if p.returncode:
                errs.append(p.stderr)

        self.b.drop_caches()
        store = getattr(self.b, "store_pids", list)()
        c0, s0 = _child_cpu(), _cpu(store)
        t = time.monotonic()
        th = [threading.Thread(target=put, args=j) for j in jobs]
        for x in th:
            x.start()
        for x in th:
            x.join()
        s = time.monotonic() - t
        g = total / 2**30
        self.limit_cpu = (round((_child_cpu() - c0) / g, 3),
                          round((_cpu(store) - s0) / g, 3) if store else None)
        self.clear(pre)
        return None if errs else total / s / 1e6

    def run(self, log):
        b = self.b
        big, small = os.path.join(b.src, "big"), os.path.join(b.src, "small")
        big_files, small_files = _files(big), _files(small)
        big_bytes = _size(big_files)
        # The target is against the store's own PUT limit: as for the cold
        # rows, the store on cores of its own and every client (push, curl,
        # awscli, rclone) on the rest; push hashes (SHA-256 and MD5, about
        # 2.5 CPU-s/GiB), curl's PUTs do not, and sharing the cores with the
        # store charged that to the ratio.
        getattr(b, "mode", lambda m: None)("elsewhere")
        d, conf = b.dstage_conf("dstage-push", "1G")
        dpr = b.start_daemon(d, conf, "stager-push")
        try:
            lim = self.curl_put_limit(big_files)
            b.limits["curl_8_parallel_put_MBps"] = None if lim is None \
                else round(lim, 1)
            b.limits["curl_8_parallel_put_cpu_s_per_GiB"] = self.limit_cpu[0]
            b.limits["curl_8_parallel_put_store_cpu_s_per_GiB"] = \
                self.limit_cpu[1]
            r = b.row("push_large", "push large files to the store, hashed "
                      "(local files cold)", "MB/s", lim,
                      "curl, 8 parallel PUTs (no hashing; store elsewhere)",
                      0.9)
            r["limit_cpu_s_per_GiB"] = self.limit_cpu[0]
            b.row("push_small", "push small files to the store, hashed "
                  "(local files cold)", "files/s")
            for rid, src, files, unit in (
                    ("push_large", big, big_files, big_bytes / 1e6),
                    ("push_small", small, small_files, len(small_files))):
                nbytes = _size(files)
                for system, fn in (("dstage",
                                    lambda s: self.dstage(s, conf, dpr.pid)),
                                   ("aws+sha256sum", self.aws_sha),
                                   ("rclone --checksum", self.rclone)):
                    r = fn(src)
                    if r is None:
                        b.put(rid, system, None, why="not run or failed")
                        continue
                    s, cpu, scpu = r
                    b.put(rid, system, unit / s, seconds=round(s, 2),
                          files=len(files), **_cpu_fields(cpu, scpu, nbytes,
                                                          len(files)))
                    log(f"{system}: {rid} {unit / s:.1f} "
                        f"{'MB/s' if rid == 'push_large' else 'files/s'}, "
                        f"client {cpu:.1f} CPU-s, store "
                        f"{'n/a' if scpu is None else f'{scpu:.1f}'} CPU-s")
        finally:
            b.stop("stager-push", dpr)
            getattr(b, "mode", lambda m: None)("shared")


def _cpu_fields(cpu, scpu, nbytes, nfiles):
    """The CPU figures of one push phase for the results: per GiB sent and
    per 1,000 files, of the client (cpu) and of the store (scpu)."""
    g = nbytes / 2**30
    out = {"cpu_s": round(cpu, 2),
           "cpu_s_per_GiB": round(cpu / g, 3) if g else None,
           "cpu_ms_per_file": round(cpu * 1000 / nfiles, 3) if nfiles else None}
    if scpu is not None:
        out.update(store_cpu_s=round(scpu, 2),
                   store_cpu_s_per_GiB=round(scpu / g, 3) if g else None,
                   store_cpu_ms_per_file=(round(scpu * 1000 / nfiles, 3)
                                          if nfiles else None))
    return out


def run(b, log):
    PushBench(b).run(log)


# ---- standalone: push against curl on an already running radosgw ----

def _cpu(pids):
    """utime + stime of pids (all threads), seconds; dead ones count 0."""
    t = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                v = f.read().rsplit(")", 1)[1].split()
            t += int(v[11]) + int(v[12])
        except (OSError, IndexError, ValueError):
            pass
    return t / os.sysconf("SC_CLK_TCK")


def _child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def standalone(argv=None):
    """Alternate `stager push` and 8 curl PUTs of the same files against
    the radosgw named by --rgw-env (DSTAGE_RGW_ENV's JSON), the files on
    tmpfs (the client's own cost, no disk); prints MB/s, the ratio and
    CPU-seconds per GiB of push, curl and the store."""
    ap = argparse.ArgumentParser(prog="push_bench.py", description=standalone.__doc__)
    ap.add_argument("--rgw-env", default=os.environ.get("DSTAGE_RGW_ENV"))
    ap.add_argument("--build", default=os.environ.get("DSTAGE_BUILD_DIR", "build"))
    ap.add_argument("--stager", help="the stager binary (default BUILD/stager/stager)")
    ap.add_argument("--mib", type=int, default=256, help="size of each file")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm")
    a = ap.parse_args(argv)
    if not a.rgw_env:
        ap.error("--rgw-env (or DSTAGE_RGW_ENV) is required")
    with open(a.rgw_env) as f:
        rgw = json.load(f)
    stager = a.stager or os.path.join(a.build, "stager", "stager")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and k != "DSTAGE_CONFIG"}
    env.update(AWS_ACCESS_KEY_ID=rgw["AWS_ACCESS_KEY_ID"],
               AWS_SECRET_ACCESS_KEY=rgw["AWS_SECRET_ACCESS_KEY"],
               AWS_ENDPOINT_URL=rgw["AWS_ENDPOINT_URL"],
               AWS_REGION=rgw.get("AWS_REGION", "us-east-1"),
               AWS_DEFAULT_REGION=rgw.get("AWS_REGION", "us-east-1"))
    ep, ak, sk = rgw["AWS_ENDPOINT_URL"], rgw["AWS_ACCESS_KEY_ID"], \
        rgw["AWS_SECRET_ACCESS_KEY"]
    rgw_pids = [int(p) for p in rgw.get("RGW_PIDS", [])]
    work = tempfile.mkdtemp(prefix="pushbench-", dir=a.dir)
    bucket = "pushbench-%08x" % random.getrandbits(32)
    sign = ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{ak}:{sk}"]
    unsigned = ["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
    daemon = None
    try:
        src = os.path.join(work, "src")
        os.makedirs(src)
        paths = []
        for i in range(a.files):
            paths.append(os.path.join(src, f"shard-{i:02d}.bin"))
            with open(paths[-1], "wb") as f:
                for _ in range(a.mib):
                    f.write(os.urandom(1 << 20))
        total = a.files * a.mib << 20
        subprocess.run(["curl", "-sf", "-X", "PUT", *sign, "-H",
                        "x-amz-content-sha256: " + EMPTY_SHA,
                        f"{ep}/{bucket}"], check=True, timeout=60)
        conf = os.path.join(work, "dstage.conf")
        with open(conf, "w") as f:
            f.write(f"[cache]\ndir = {work}/cache\nsize = 1G\n"
                    f"[catalog]\npath = {work}/catalog.db\n"
                    f"[daemon]\nsocket = {work}/stager.sock\n"
                    f"[s3]\nendpoint = {ep}\nregion = us-east-1\n"
                    f"[log]\nlevel = warn\n")
        daemon = subprocess.Popen([stager, "--config", conf, "daemon"],
                                  env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.exists(os.path.join(work, "stager.sock")):
                break
            time.sleep(0.1)

        def clear(prefix):
            subprocess.run([AWS or "aws", "--endpoint-url", ep, "s3", "rm",
                            "--recursive", "--quiet",
                            f"s3://{bucket}/{prefix}/"], env=env,
                           capture_output=True, timeout=900)

        def measure(cmds):
            c0, r0, t0 = _child_cpu(), _cpu(rgw_pids), time.monotonic()
            procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE) for c in cmds]
            errs = [p.communicate(timeout=1800)[1] for p in procs]
            t = time.monotonic() - t0
            bad = [e for p, e in zip(procs, errs) if p.returncode]
            if bad:
                sys.stderr.write(bad[0].decode(errors="replace")[-500:])
                return None
            return t, _child_cpu() - c0, _cpu(rgw_pids) - r0

        print(f"{a.files} x {a.mib} MiB on {a.dir}, {a.rounds} rounds, "
              f"load {os.getloadavg()[0]:.1f}")
        for r in range(a.rounds):
            pre = f"curl-{r}"
            cm = measure([["curl", "-sf", *sign, *unsigned, "-T",
                           paths[i % len(paths)], "-o", "/dev/null",
                           f"{ep}/{bucket}/{pre}/{i}"] for i in range(8)])
            clear(pre)
            cbytes = 8 * (a.mib << 20)
            pre = f"push-{r}"
            pm = measure([[stager, "--config", conf, "push", src,
                           f"s3://{bucket}/{pre}/", "--name",
                           f"{bucket}-{r}"]])
            clear(pre)
            if cm is None or pm is None:
                print(f"round {r}: failed")
                continue
            cr, pr_ = cbytes / cm[0] / 1e6, total / pm[0] / 1e6
            gib_c, gib_p = cbytes / (1 << 30), total / (1 << 30)
            print(f"round {r}: curl {cr:.1f} MB/s (curl {cm[1] / gib_c:.2f}, "
                  f"store {cm[2] / gib_c:.2f} CPU-s/GiB); push {pr_:.1f} MB/s "
                  f"(push {pm[1] / gib_p:.2f}, store {pm[2] / gib_p:.2f} "
                  f"CPU-s/GiB); ratio {pr_ / cr:.2f}; "
                  f"load {os.getloadavg()[0]:.1f}")
    finally:
        if daemon:
            daemon.terminate()
            daemon.wait(timeout=30)
        subprocess.run(["curl", "-sf", "-X", "DELETE", *sign,
                        "-H", "x-amz-content-sha256: " + EMPTY_SHA,
                        f"{ep}/{bucket}"], timeout=60, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        standalone()
    else:
        print(__doc__)
