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
"""
import os
import shutil
import subprocess
import threading
import time

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

    def prefix(self, what):
        self.n += 1
        return f"push-{what}-{self.n}"

    def clear(self, prefix):
        if AWS:
            subprocess.run([AWS, "--endpoint-url", self.b.endpoint, "s3", "rm",
                            "--recursive", "--quiet",
                            f"s3://{self.bucket}/{prefix}/"],
                           env=self.env, capture_output=True, timeout=900)

    def timed(self, cmds, cwd=None):
        """Run cmds one after the other; seconds, or None on a failure."""
        self.b.drop_caches()
        t = time.monotonic()
        for c in cmds:
            p = subprocess.run(c, env=self.env, cwd=cwd, capture_output=True,
                               timeout=1800)
            if p.returncode != 0:
                self.b.notes.append(
                    f"push bench: {' '.join(c[:3])} failed: "
                    f"{p.stderr.decode(errors='replace')[-300:]}")
                return None
        return time.monotonic() - t

    def dstage(self, src, conf):
        pre = self.prefix("dstage")
        s = self.timed([[self.b.stager, "--config", conf, "push", src,
                         f"s3://{self.bucket}/{pre}/", "--name", pre]])
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
        t = time.monotonic()
        th = [threading.Thread(target=put, args=j) for j in jobs]
        for x in th:
            x.start()
        for x in th:
            x.join()
        s = time.monotonic() - t
        self.clear(pre)
        return None if errs else total / s / 1e6

    def run(self, log):
        b = self.b
        big, small = os.path.join(b.src, "big"), os.path.join(b.src, "small")
        big_files, small_files = _files(big), _files(small)
        big_bytes = _size(big_files)
        d, conf = b.dstage_conf("dstage-push", "1G")
        dpr = b.start_daemon(d, conf, "stager-push")
        try:
            lim = self.curl_put_limit(big_files)
            b.limits["curl_8_parallel_put_MBps"] = None if lim is None \
                else round(lim, 1)
            b.row("push_large", "push large files to the store, hashed "
                  "(local files cold)", "MB/s", lim,
                  "curl, 8 parallel PUTs (no hashing)", 0.9)
            b.row("push_small", "push small files to the store, hashed "
                  "(local files cold)", "files/s")
            for rid, src, files, unit in (
                    ("push_large", big, big_files, big_bytes / 1e6),
                    ("push_small", small, small_files, len(small_files))):
                for system, fn in (("dstage", lambda s: self.dstage(s, conf)),
                                   ("aws+sha256sum", self.aws_sha),
                                   ("rclone --checksum", self.rclone)):
                    s = fn(src)
                    if s is None:
                        b.put(rid, system, None, why="not run or failed")
                        continue
                    b.put(rid, system, unit / s, seconds=round(s, 2),
                          files=len(files))
                    log(f"{system}: {rid} {unit / s:.1f} "
                        f"{'MB/s' if rid == 'push_large' else 'files/s'}")
        finally:
            b.stop("stager-push", dpr)


def run(b, log):
    PushBench(b).run(log)


if __name__ == "__main__":
    print(__doc__)
