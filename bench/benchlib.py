"""bench/benchlib.py: what the single-purpose bench scripts share (sizes on
the command line, a radosgw to run against)."""
import json
import multiprocessing
import os
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_size(s):
    """'4M', '1G', '512K' or plain bytes."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult \
        else int(s)


def rgw_env(tmp):
    """(environment, rgw dir to stop or None): the radosgw named by RGW_DIR
    and AWS_ENDPOINT_URL if both are set, else a new one under tmp
    (scripts/rgw), its env.json values added to the environment."""
    if os.environ.get("RGW_DIR") and os.environ.get("AWS_ENDPOINT_URL"):
        return dict(os.environ), None
    d = os.path.join(tmp, "rgw")
    subprocess.run([os.path.join(REPO, "scripts", "rgw"), "start", d],
                   check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(d, "env.json")) as f:
        info = json.load(f)
    env = dict(os.environ, **{k: str(v) for k, v in info.items()
                              if not isinstance(v, list)})
    return env, d


# ---------------------------------------------------------------- workloads
# (bench/run's readers, shared with fair_bench and million_bench)
MiB = 1 << 20
READ_BUF = 4 * MiB


def peak_rss_mib(pid):
    """Peak resident set (VmHWM) of a live process, MiB; None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def read_seq(paths, deadline, limit=None):
    """Read files one after another with 4 MiB reads until `deadline` or
    `limit` bytes. Returns (bytes, seconds, truncated)."""
    buf = bytearray(READ_BUF)
    mv = memoryview(buf)
    tot = 0
    t = time.monotonic()
    trunc = False
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            while True:
                if limit is not None and tot >= limit:
                    break
                n = os.readv(fd, [mv])
                if n <= 0:
                    break
                tot += n
                if time.monotonic() > deadline:
                    trunc = True
                    break
        finally:
            os.close(fd)
        if trunc or (limit is not None and tot >= limit):
            break
    return tot, max(time.monotonic() - t, 1e-6), trunc


def _read_chunk(args):
    paths, deadline = args
    got, tot = [], 0
    buf = bytearray(1 * MiB)
    for p in paths:
        if time.monotonic() > deadline:
            break
        with open(p, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                tot += n
        got.append(p)
    return got, tot


def read_files(paths, readers, deadline):
    """Whole-file reads by `readers` processes (round-robin split) until
    `deadline`. Returns (files, bytes, seconds, files read)."""
    chunks = [paths[i::readers] for i in range(readers)]
    if readers == 1:
        t = time.monotonic()
        res = [_read_chunk((chunks[0], deadline))]
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(readers) as pool:
            t = time.monotonic()
            res = pool.map(_read_chunk, [(c, deadline) for c in chunks])
            pool.close()
            pool.join()
    s = max(time.monotonic() - t, 1e-6)
    got = [p for g, _ in res for p in g]
    return len(got), sum(b for _, b in res), s, got


def stat_tree(root, deadline):
    """Walk `root` and lstat every file. Returns (files, seconds, truncated)."""
    t = time.monotonic()
    n = 0
    for dp, _, fs in os.walk(root):
        for f in fs:
            os.lstat(os.path.join(dp, f))
            n += 1
        if time.monotonic() > deadline:
            return n, time.monotonic() - t, True
    return n, max(time.monotonic() - t, 1e-6), False
