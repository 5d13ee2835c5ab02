"""bench_data: the data bench/run measures on (moved out of bench/run,
behaviour unchanged): large shards (uploaded with the project's multipart
client), small files of 64-256 KiB (1,000 a directory) and a metadata tree
of tiny files, each kept on local disk too (the limits read the local
copies), and the reading order of the small files (one shuffle, two
disjoint halves: set1 for 1 reader, set8 for 8)."""
import hashlib
import os
import random
import subprocess
import time

MiB = 1 << 20


def make_data(b, log):
    p = b.p
    src = os.path.join(b.work, "src")
    b.src = src
    rng = random.Random(20261129)
    # large shards: written locally (the page-cache limit reads them),
    # uploaded with the project's own multipart client
    bigdir = os.path.join(src, "big")
    os.makedirs(bigdir)
    b.big_keys = []
    sums = []
    t = time.monotonic()
    for i in range(p["big_n"]):
        key = f"shard-{i:06d}.tar"
        path = os.path.join(bigdir, key)
        h = hashlib.sha256()
        block = os.urandom(16 * MiB)
        with open(path, "wb") as f:
            for j in range(p["big_size"] // (16 * MiB)):
                # distinct bytes per block without paying urandom for all
                chunk = j.to_bytes(8, "little") + os.urandom(4088) + block[4096:]
                h.update(chunk)
                f.write(chunk)
        sums.append(f"{h.hexdigest()}  {key}\n")
        b.run([b.objstore_tool, f"s3://{b.bucket}/", "put", f"big/{key}", path],
                 stdout=subprocess.DEVNULL)
        b.big_keys.append(key)
    b.s3.put(b.bucket, "big/SHA256SUMS", "".join(sums).encode())
    log(f"large: {p['big_n']} x {p['big_size'] / MiB:.0f} MiB in "
        f"{time.monotonic() - t:.0f}s")
    # small files: 64-256 KiB, 1,000 a directory
    t = time.monotonic()
    write_small(b, src, rng)

    def body(k):
        return lambda: open(os.path.join(src, "small", k), "rb").read()
    b.s3.put_many(b.bucket, ((f"small/{k}", body(k)) for k in b.small_keys),
                     threads=16, deadline_s=max(60, b.left()))
    log(f"small: {p['small_n']} files in {time.monotonic() - t:.0f}s")
    # metadata tree: tiny files, 1,000 a directory, same tree on local disk
    t = time.monotonic()
    b.meta_keys = [f"d{i // 1000:03d}/f{i:06d}" for i in range(p["meta_n"])]
    for k in b.meta_keys:
        path = os.path.join(src, "meta", k)
        if k.endswith("000000") or not os.path.isdir(os.path.dirname(path)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"x" * 16)
    b.s3.put_many(b.bucket, ((f"meta/{k}", b"x" * 16) for k in b.meta_keys),
                     threads=16, deadline_s=max(60, b.left()))
    log(f"meta: {p['meta_n']} files in {time.monotonic() - t:.0f}s")
    # reading order: one shuffle, two disjoint halves (1 reader, 8 readers)
    order = list(b.small_keys)
    random.Random(7).shuffle(order)
    half = len(order) // 2
    b.set1, b.set8 = order[:half], order[half:]


def write_small(b, src, rng):
    """The small files on local disk (src/small/KEY), their keys in
    b.small_keys."""
    b.small_keys = []
    pool = os.urandom(512 * 1024)
    for i in range(b.p["small_n"]):
        key = f"d{i // 1000:03d}/f{i:06d}.jpg"
        size = rng.randint(64 * 1024, 256 * 1024)
        off = rng.randint(0, len(pool) - size)
        path = os.path.join(src, "small", key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(i.to_bytes(8, "little") + pool[off + 8:off + size])
        b.small_keys.append(key)


def make_small_local(b, log):
    """Only the small files, on local disk (a run without radosgw: the
    prefetch rows then read them through a file:// source)."""
    b.src = os.path.join(b.work, "src")
    t = time.monotonic()
    write_small(b, b.src, random.Random(20261129))
    log(f"small (local only): {b.p['small_n']} files in {time.monotonic() - t:.0f}s")
