#!/usr/bin/python3
"""bench/ckpt_bench.py: writing checkpoints through <mount>/checkpoints/
against plain copies of the same bytes to the same store.

    bench/ckpt_bench.py [--size-mb N] [--shards N] [--shard-mb N]
                        [--stores dir,s3] [--rgw-env F] [--json OUT]
                        [--staging DIR] [--no-peers]

--staging DIR puts the mounts' staging directories (the local copies)
under DIR instead of the work directory. By default they share the disk
with the directory store, so every byte is written twice to one device;
--staging /dev/shm is the fair variant (tmpfs standing in for a node's
NVMe, another device than the parallel file system).

Rows (one process each unless said):
  ckpt_dir      one process writes N MiB (open to close returned) through a
                dstagefs mount whose checkpoints.store is a directory, vs
                `cp` of the same bytes into that directory (and, the fair
                variant, `cp` then `sync FILE`: the mount's close returns
                only once the file is fsynced in the store)
  ckpt_s3       the same to radosgw, vs the project's own multipart client
                (tests/tools/objstore_tool put: objstore_put_fd)
  ckpt_*_shards N processes writing one shard each at once, vs N copies
                (cp / objstore_tool put) at once (directory store: and vs N
                `cp` then `sync FILE` at once, the fair variant)
Peers (--no-peers leaves them out; each skipped when not installed), in
the ckpt_s3 row: the same N MiB file written into the same bucket by
  s3fs          `cp` into an s3fs mount of the bucket (its close returns
                once the file is uploaded; use_cache, parallel_count=8)
  rclone        `rclone copyto FILE rgw:BUCKET/KEY` (its multipart client)
Also: close latency (last write returned to close returned) against the
time to send one part (objstore_tool put of one s3.part_size object).

Radosgw: the one named by --rgw-env (scripts/rgw's env.json, as
$DSTAGE_RGW_ENV) or by AWS_ENDPOINT_URL and the AWS_* keys in the
environment; objects are deleted after each phase (a memstore keeps them
in RAM). Needs root (FUSE) and the build ($DSTAGE_BUILD_DIR, default
build/). bench/run calls run() with its own radosgw.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MiB = 1 << 20
CHUNK = 4 * MiB
PART = 16 * MiB   # s3.part_size's default: the part the close may wait for

WRITER = r"""
import json, os, sys, time
path, size = sys.argv[1], int(sys.argv[2])
sync = sys.argv[3:] == ["fsync"]  # fsync before the close (MLPerf's shape)
buf = os.urandom(%d)
t0 = time.monotonic()
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
left = size
while left:
    n = min(left, len(buf))
    os.write(fd, buf[:n])
    left -= n
t1 = time.monotonic()
if sync:
    os.fsync(fd)
tf = time.monotonic()
os.close(fd)
t2 = time.monotonic()
print(json.dumps({"open_to_close": t2 - t0, "write": t1 - t0,
                  "fsync": tf - t1, "close": t2 - tf}))
""" % CHUNK


def stop(pr):
    """Terminate pr if it still runs; kill it after 60 s."""
    if pr.poll() is None:
        pr.terminate()
    try:
        pr.wait(60)
    except subprocess.TimeoutExpired:
        pr.kill()
        pr.wait()


def log(msg):
    print(f"[ckpt_bench] {msg}", file=sys.stderr, flush=True)


class CkptBench:
    def __init__(self, build, work, env, size, shards, shard_size,
                 staging=None, peers=True, gc=None):
        self.build, self.work, self.env = build, work, dict(env)
        self.peers = peers
        # called after every deletion of what a phase wrote: bench/run's
        # store_gc (radosgw keeps a deleted object's tail until it collects
        # it, 2 h by default)
        self.gc = gc or (lambda: None)
        self.staging = staging   # parent of the staging dirs (None: work)
        self.size, self.shards, self.shard_size = size, shards, shard_size
        self.mounts = []
        self.procs = []
        self.staging_dirs = []

    def tool(self, *parts):
        p = os.path.join(self.build, *parts)
        if not os.access(p, os.X_OK):
            sys.exit(f"ckpt_bench: {p} not built")
        return p

    def timed(self, cmd, env=None):
        t = time.monotonic()
        subprocess.run(cmd, check=True, env=env or self.env,
                       stdout=subprocess.DEVNULL, timeout=1800)
        return time.monotonic() - t

    def make_src(self, name, size):
        p = os.path.join(self.work, name)
        with open(p, "wb") as f:
            chunk = os.urandom(CHUNK)
            left = size
            while left:
                n = min(left, CHUNK)
                f.write(chunk[:n])
                left -= n
        return p

    def mount(self, name, store_url):
        d = os.path.join(self.work, name)
        os.makedirs(d)
        conf = os.path.join(d, "dstage.conf")
        stg = os.path.join(d, "staging")
        if self.staging:
            stg = tempfile.mkdtemp(prefix="dstage-ckbench-stg.",
                                   dir=self.staging)
            self.staging_dirs.append(stg)
            stg = os.path.join(stg, "staging")
        with open(conf, "w") as f:
            f.write(f"[cache]\ndir = {d}/cache\nsize = 1G\n"
                    f"[catalog]\npath = {d}/catalog.db\n"
                    f"[checkpoints]\nstore = {store_url}\n"
                    f"staging_dir = {stg}\n"
                    f"staging_size = {4 * (self.size + self.shards * self.shard_size)}\n"
                    "[log]\nlevel = warn\n")
        mnt = os.path.join(d, "mnt")
        os.makedirs(mnt)
        logf = open(os.path.join(d, "dstagefs.log"), "ab")
        pr = subprocess.Popen([self.tool("fs", "dstagefs"), "--config", conf,
                               "-f", mnt], env=self.env, stdout=logf,
                              stderr=logf, stdin=subprocess.DEVNULL)
        self.procs.append(pr)
        for _ in range(300):
            if pr.poll() is not None:
                raise RuntimeError(f"dstagefs exited; see {d}/dstagefs.log")
            if os.path.isdir(os.path.join(mnt, "checkpoints")) and \
                    os.path.ismount(mnt):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("dstagefs did not mount")
        self.mounts.append(mnt)
        ck = os.path.join(mnt, "checkpoints", "bench")
        os.makedirs(ck, exist_ok=True)
        return ck

    def unmount_all(self):
        for pr in self.procs:
            stop(pr)
        for m in self.mounts:
            subprocess.run(["fusermount3", "-uz", m], capture_output=True)
        for d in self.staging_dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.procs, self.mounts, self.staging_dirs = [], [], []

    def write_through(self, path, size):
        out = subprocess.run([sys.executable, "-c", WRITER, path, str(size)],
                             check=True, capture_output=True, timeout=1800)
        return json.loads(out.stdout)

    def parallel(self, cmds):
        t = time.monotonic()
        ps = [subprocess.Popen(c, env=self.env, stdout=subprocess.PIPE)
              for c in cmds]
        outs = [p.communicate(timeout=1800)[0] for p in ps]
        if any(p.returncode for p in ps):
            raise RuntimeError(f"a parallel writer failed: {cmds[0]}")
        return time.monotonic() - t, outs

    def shards_through(self, ck):
        cmds = [[sys.executable, "-c", WRITER,
                 os.path.join(ck, f"shard{i}.bin"), str(self.shard_size)]
                for i in range(self.shards)]
        return self.parallel(cmds)[0]

    # ---- the directory store ----
    def dir_rows(self):
        store = os.path.join(self.work, "dirstore")
        os.makedirs(store)
        src = self.make_src("src.bin", self.size)
        shard_src = self.make_src("shard.bin", self.shard_size)
        r = {}
        os.makedirs(os.path.join(store, "cp"))
        r["cp_s"] = self.timed(["cp", src, os.path.join(store, "cp", "a.bin")])
        os.unlink(os.path.join(store, "cp", "a.bin"))
        dst = os.path.join(store, "cp", "b.bin")
        r["cp_sync_s"] = self.timed(["sh", "-c", 'cp "$1" "$2" && sync "$2"',
                                     "sh", src, dst])
        os.unlink(dst)
        ck = self.mount("dir-mount", f"file://{store}/")
        w = self.write_through(os.path.join(ck, "ckpt.bin"), self.size)
        r.update(mount_s=w["open_to_close"], close_s=w["close"])
        r["shards_cp_s"] = self.parallel(
            [["cp", shard_src, os.path.join(store, "cp", f"s{i}.bin")]
             for i in range(self.shards)])[0]
        for i in range(self.shards):
            os.unlink(os.path.join(store, "cp", f"s{i}.bin"))
        r["shards_cp_sync_s"] = self.parallel(
            [["sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", shard_src,
              os.path.join(store, "cp", f"s{i}.bin")]
             for i in range(self.shards)])[0]
        r["shards_mount_s"] = self.shards_through(ck)
        self.unmount_all()
        shutil.rmtree(store, ignore_errors=True)
        return r

    # ---- peers writing the same file into the bucket ----
    def s3fs_write(self, bucket, src):
        """Seconds for `cp SRC` into an s3fs mount of the bucket (s3fs
        uploads at close, so cp returns once the object is stored)."""
        d = tempfile.mkdtemp(prefix="s3fs.", dir=self.work)
        mnt, cache = os.path.join(d, "mnt"), os.path.join(d, "cache")
        os.makedirs(mnt)
        os.makedirs(cache)
        pw = os.path.join(d, "passwd")
        with open(os.open(pw, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(f"{self.env['AWS_ACCESS_KEY_ID']}:"
                    f"{self.env['AWS_SECRET_ACCESS_KEY']}\n")
        pr = subprocess.Popen(
            ["s3fs", bucket, mnt, "-f", "-o", f"passwd_file={pw}",
             "-o", f"url={self.env['AWS_ENDPOINT_URL']}",
             "-o", "use_path_request_style", "-o", "endpoint=us-east-1",
             "-o", f"use_cache={cache}", "-o", "parallel_count=8"],
            env=self.env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            for _ in range(300):
                if pr.poll() is not None:
                    raise RuntimeError("s3fs exited")
                if os.path.ismount(mnt):
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError("s3fs did not mount")
            os.makedirs(os.path.join(mnt, "peer"), exist_ok=True)
            dst = os.path.join(mnt, "peer", "s3fs.bin")
            sec = self.timed(["cp", src, dst])
            os.unlink(dst)
            return sec
        finally:
            subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
            stop(pr)
            shutil.rmtree(d, ignore_errors=True)

    def rclone_write(self, bucket, src):
        """Seconds for `rclone copyto SRC rgw:BUCKET/peer/rclone.bin`."""
        d = tempfile.mkdtemp(prefix="rclone.", dir=self.work)
        cfg = os.path.join(d, "rclone.conf")
        with open(os.open(cfg, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("[rgw]\ntype = s3\nprovider = Ceph\n"
                    f"access_key_id = {self.env['AWS_ACCESS_KEY_ID']}\n"
                    f"secret_access_key = {self.env['AWS_SECRET_ACCESS_KEY']}\n"
                    f"endpoint = {self.env['AWS_ENDPOINT_URL']}\n"
                    "region = us-east-1\n")
        # rclone 1.60 fails on AWS_CA_BUNDLE with a plain http endpoint
        env = {k: v for k, v in self.env.items() if k != "AWS_CA_BUNDLE"}
        try:
            return self.timed(["rclone", "--config", cfg, "copyto", src,
                               f"rgw:{bucket}/peer/rclone.bin"], env=env)
        finally:
            subprocess.run(["rclone", "--config", cfg, "deletefile",
                            f"rgw:{bucket}/peer/rclone.bin"], env=env,
                           capture_output=True, timeout=300)
            shutil.rmtree(d, ignore_errors=True)

    def peer_rows(self, bucket, src):
        r = {}
        for name, fn in (("s3fs", self.s3fs_write),
                         ("rclone", self.rclone_write)):
            if not self.peers:
                continue
            if not shutil.which(name):
                log(f"{name} not installed: its peer figure is left out")
                continue
            try:
                r[f"{name}_s"] = fn(bucket, src)
            except (RuntimeError, subprocess.SubprocessError) as e:
                log(f"{name}: {e}: its peer figure is left out")
            self.gc()
        return r

    # ---- radosgw ----
    def s3_rows(self, bucket):
        ot = self.tool("tests", "objstore_tool")
        url = f"s3://{bucket}/"
        src = os.path.join(self.work, "src.bin")
        if not os.path.exists(src):
            src = self.make_src("src.bin", self.size)
        shard_src = os.path.join(self.work, "shard.bin")
        if not os.path.exists(shard_src):
            shard_src = self.make_src("shard.bin", self.shard_size)
        part_src = self.make_src("part.bin", PART)
        r = {}
        r["put_s"] = self.timed([ot, url, "put", "client/ckpt.bin", src])
        self.timed([ot, url, "rm", "client/ckpt.bin"])
        self.gc()
        r.update(self.peer_rows(bucket, src))
        r["part_s"] = min(self.timed([ot, url, "put", "client/part.bin",
                                      part_src]) for _ in range(3))
        ck = self.mount("s3-mount", f"s3://{bucket}/ck/")
        w = self.write_through(os.path.join(ck, "ckpt.bin"), self.size)
        r.update(mount_s=w["open_to_close"], close_s=w["close"])
        os.unlink(os.path.join(ck, "ckpt.bin"))
        self.gc()
        r["shards_put_s"] = self.parallel(
            [[ot, url, "put", f"client/s{i}.bin", shard_src]
             for i in range(self.shards)])[0]
        for i in range(self.shards):
            self.timed([ot, url, "rm", f"client/s{i}.bin"])
        self.gc()
        r["shards_mount_s"] = self.shards_through(ck)
        for i in range(self.shards):
            os.unlink(os.path.join(ck, f"shard{i}.bin"))
        self.timed([ot, url, "rm", "client/part.bin"])
        self.unmount_all()
        return r


def rows_from(res, size, shards, shard_size):
    """bench/run rows (MB/s; limit: the plain copy; target 1/1.2)."""
    out = []
    mb = size / 1e6
    smb = shards * shard_size / 1e6
    for kind, base, base_what in (("dir", "cp_s", "cp to the directory"),
                                  ("s3", "put_s", "objstore_put_fd (objstore_tool put)")):
        r = res.get(kind)
        if not r:
            continue
        extra = {"close_s": round(r["close_s"], 3),
                 "ratio_time": round(r["mount_s"] / r[base], 3)}
        peers = {}
        if kind == "dir":
            extra["ratio_time_vs_cp_sync"] = round(r["mount_s"] / r["cp_sync_s"], 3)
        else:
            extra["part_s"] = round(r["part_s"], 3)
            for name in ("s3fs", "rclone"):
                if r.get(f"{name}_s"):
                    # the peer's MB/s, and the mount's time over the peer's
                    peers[name] = mb / r[f"{name}_s"]
                    extra[f"ratio_time_vs_{name}"] = round(
                        r["mount_s"] / r[f"{name}_s"], 3)
        out.append(dict(id=f"ckpt_{kind}", what=f"checkpoint {size // MiB} MiB, "
                        f"1 writer, open to close, {kind} store", unit="MB/s",
                        limit=mb / r[base], limit_what=base_what, target=0.83,
                        value=mb / r["mount_s"], extra=extra, peers=peers))
        sb = "shards_cp_s" if kind == "dir" else "shards_put_s"
        sextra = {"ratio_time": round(r["shards_mount_s"] / r[sb], 3)}
        if r.get("shards_cp_sync_s"):
            sextra["ratio_time_vs_cp_sync"] = round(
                r["shards_mount_s"] / r["shards_cp_sync_s"], 3)
        out.append(dict(id=f"ckpt_{kind}_shards",
                        what=f"checkpoint {shards} x {shard_size // MiB} MiB shards "
                        f"at once, {kind} store", unit="MB/s", limit=smb / r[sb],
                        limit_what=f"{shards} x " + base_what, target=0.83,
                        value=smb / r["shards_mount_s"], extra=sextra,
                        peers={}))
    return out


def run(build, work, env, size, shards, shard_size, stores, make_bucket,
        staging=None, peers=True, gc=None):
    b = CkptBench(build, work, env, size, shards, shard_size, staging, peers, gc)
    res = {}
    try:
        if "dir" in stores:
            log(f"directory store: {size // MiB} MiB and {shards} x "
                f"{shard_size // MiB} MiB")
            res["dir"] = b.dir_rows()
        if "s3" in stores:
            log(f"radosgw: {size // MiB} MiB and {shards} x "
                f"{shard_size // MiB} MiB")
            res["s3"] = b.s3_rows(make_bucket())
    finally:
        b.unmount_all()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=2048)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mb", type=int, default=256)
    ap.add_argument("--stores", default="dir,s3")
    ap.add_argument("--rgw-env", default=os.environ.get("DSTAGE_RGW_ENV"))
    ap.add_argument("--json")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--staging", default=None,
                    help="parent of the staging directories (default: the "
                    "work directory, the store's disk); /dev/shm: the fair "
                    "variant")
    ap.add_argument("--no-peers", action="store_true",
                    help="leave out s3fs and rclone")
    a = ap.parse_args()
    build = os.path.abspath(os.environ.get("DSTAGE_BUILD_DIR",
                                           os.path.join(REPO, "build")))
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_PROFILE", "AWS_SESSION_TOKEN",
                        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")}
    if a.rgw_env:
        with open(a.rgw_env) as f:
            info = json.load(f)
        env.update(AWS_ACCESS_KEY_ID=info["AWS_ACCESS_KEY_ID"],
                   AWS_SECRET_ACCESS_KEY=info["AWS_SECRET_ACCESS_KEY"],
                   AWS_ENDPOINT_URL=info["AWS_ENDPOINT_URL"],
                   AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1")
    if "s3" in a.stores.split(",") and "AWS_ENDPOINT_URL" not in env:
        sys.exit("ckpt_bench: no radosgw: give --rgw-env (scripts/rgw's "
                 "env.json) or AWS_ENDPOINT_URL and keys, or --stores dir")
    sys.path.insert(0, HERE)
    from bench_s3 import S3  # noqa: E402

    def make_bucket():
        name = "ckbench-" + uuid.uuid4().hex[:10]
        S3(env["AWS_ENDPOINT_URL"], env["AWS_ACCESS_KEY_ID"],
           env["AWS_SECRET_ACCESS_KEY"]).make_bucket(name)
        return name

    work = tempfile.mkdtemp(prefix="dstage-ckbench.", dir=a.workdir)
    try:
        res = run(build, work, env, a.size_mb * MiB, a.shards,
                  a.shard_mb * MiB, a.stores.split(","), make_bucket,
                  a.staging, not a.no_peers)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = rows_from(res, a.size_mb * MiB, a.shards, a.shard_mb * MiB)
    out = {"command": " ".join(["bench/ckpt_bench.py"] + sys.argv[1:]),
           "raw": res, "rows": rows}
    text = json.dumps(out, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
