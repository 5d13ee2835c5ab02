"""Integration tests of the pinned path's Python binding (python/dstage,
ctypes over libdstage.so) and its PyTorch example (dstage.webdataset), in
the mode this machine gives (the CPU mode without a GPU): right bytes for
many sizes and a 1 GiB file (DSTAGE_TEST_PINNED_LARGE_MB changes it; 0
skips), errors as OSError, small files in one batch, and WebDataset-style
tar shards read from a dstagefs mount into pinned tensors.
"""
import hashlib
import io
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LARGE_MB = int(os.environ.get("DSTAGE_TEST_PINNED_LARGE_MB", "1024"))
SYSFS_SHORT = "/sys/devices/system/cpu/online"  # st_size 4096, a few bytes


@pytest.fixture(scope="module")
def pinned(build_dir):
    """The dstage.pinned module over this build's libdstage.so."""
    so = build_dir / "lib" / "libdstage.so"
    if not so.exists():
        pytest.fail("%s is not built (cmake --build %s --target dstage_shared)"
                    % (so, build_dir), pytrace=False)
    os.environ["DSTAGE_LIB"] = str(so)
    sys.path.insert(0, str(REPO / "python"))
    import dstage.pinned as m
    return m


@pytest.fixture(params=["cpu", "fakecuda"])
def mode(request, build_dir, monkeypatch):
    """Each binding test twice: the CPU mode, and the CUDA mode's code on
    the stand-in runtime of tests/unit/pinned_fake_cudart.c (built where
    the toolkit is), which queues copies until their events are waited for
    and aborts on misuse."""
    if request.param == "cpu":
        monkeypatch.setenv("DSTAGE_PINNED_MODE", "cpu")
    else:
        fake = build_dir / "tests" / "pinned_fake_cudart.so"
        if not fake.exists():
            pytest.skip("no CUDA toolkit at build time: no fake runtime")
        monkeypatch.delenv("DSTAGE_PINNED_MODE", raising=False)
        monkeypatch.setenv("DSTAGE_CUDART", str(fake))
    return "cuda" if request.param == "fakecuda" else "cpu"


def rnd(n, seed):
    return random.Random(seed).randbytes(n)


def locked_kb_at(addr):
    """The locked kB (/proc/self/smaps "Locked:") of the mapping that holds
    addr: the arena's own mlock accounting, whatever else this process
    (pytest, torch, earlier tests) has locked or unlocked meanwhile."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(None, 1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "Locked:":
            return int(line.split()[1])
    return 0


def test_mode_and_sizes(pinned, mode, tmp_path):
    p = pinned.Pinned(chunk=64 << 10, depth=3)
    assert p.mode == mode and p.reason
    if p.mode == "cpu":
        os.environ.pop("DSTAGE_PINNED_MODE")  # (monkeypatch restores it)
        if pinned.Pinned().mode == "cpu":  # no GPU here
            with pytest.raises(OSError) as ei:
                pinned.Pinned(flags=pinned.PINNED_CUDA_REQUIRED)
            assert ei.value.errno == 19  # ENODEV
    block = 4 << 20  # cache.block_size's default
    for i, n in enumerate([0, 1, 4095, 4096, 4097, (64 << 10) + 1,
                           block - 1, block, block + 1]):
        data = rnd(n, i)
        path = tmp_path / ("f%d" % n)
        path.write_bytes(data)
        buf = p.host_alloc(n + 8)
        dev = p.dev_alloc(n + 1)
        with p.open(path) as f:
            assert f.size == n
            f.read_host(0, n, buf)
            assert buf.tobytes(0, n) == data
            f.read_device(0, n, dev)
            assert dev.tobytes(0, n) == data
            if n > 4097:
                f.read_host(4095, n - 4095, buf, buf_off=3)
                assert buf.tobytes(3, n - 4095) == data[4095:]
                f.read_device(4097, n - 4097, dev, dev_off=1)
                assert dev.tobytes(1, n - 4097) == data[4097:]
            with pytest.raises(OSError) as ei:
                f.read_host(0, n + 1, buf)
            assert ei.value.errno == 22  # past the end: EINVAL


def test_errors(pinned, mode, tmp_path):
    p = pinned.Pinned()
    with pytest.raises(FileNotFoundError):
        p.open(tmp_path / "absent")
    if os.path.exists(SYSFS_SHORT):
        buf = p.host_alloc(8192)
        dev = p.dev_alloc(4096)
        ctypes_fill(dev, 4096, p)
        with p.open(SYSFS_SHORT) as f:
            assert f.size == 4096
            with pytest.raises(OSError) as ei:
                f.read_device(0, 4096, dev)
            assert ei.value.errno == 5  # EIO: short
        assert dev.tobytes() == b"\xa5" * 4096  # nothing handed over
        (tmp_path / "ok").write_bytes(b"x" * 100)
        with pytest.raises(OSError) as ei:
            p.read_batch([tmp_path / "ok", SYSFS_SHORT], buf)
        assert ei.value.errno == 5 and ei.value.item == 1


def ctypes_fill(dev, n, p):
    """Fill device memory with the sentinel 0xA5."""
    import ctypes
    src = ctypes.create_string_buffer(b"\xa5" * n, n)
    p.copy_to_dev(dev, ctypes.addressof(src), n)


def test_batch_many_small(pinned, mode, tmp_path):
    p = pinned.Pinned()
    files = {}
    for i in range(500):
        files[tmp_path / ("s%03d" % i)] = rnd(0 if i % 100 == 0 else
                                              random.Random(i).randrange(20000),
                                              1000 + i)
    for path, data in files.items():
        path.write_bytes(data)
    arena = p.host_alloc(16 << 20)
    dev = p.dev_alloc(16 << 20)
    placed = p.read_batch(list(files), arena, dev=dev)
    back = dev.tobytes(0, p.batch_used)
    for (off, size), data in zip(placed, files.values()):
        assert off % 256 == 0 and size == len(data)
        assert arena.tobytes(off, size) == data
        assert back[off:off + size] == data
    with pytest.raises(OSError) as ei:
        p.read_batch(list(files), arena.ctx.host_alloc(4096))
    assert ei.value.errno == 28  # ENOSPC
    os.unlink(list(files)[3])
    ctypes_fill(dev, 1 << 20, p)
    with pytest.raises(FileNotFoundError) as ei:
        p.read_batch(list(files), arena, dev=dev)
    assert ei.value.item == 3
    assert dev.tobytes(0, 1 << 20) == b"\xa5" * (1 << 20)


@pytest.mark.skipif(LARGE_MB == 0, reason="DSTAGE_TEST_PINNED_LARGE_MB=0")
def test_large_file(pinned, tmp_path):
    """A 1 GiB file through 8 MiB staging chunks: hashes equal."""
    path = tmp_path / "large"
    h = hashlib.sha256()
    block = rnd(1 << 20, 7)
    with open(path, "wb") as f:
        for i in range(LARGE_MB):
            b = i.to_bytes(8, "little") + block[8:]
            h.update(b)
            f.write(b)
    n = LARGE_MB << 20
    p = pinned.Pinned()
    dev = p.dev_alloc(n)
    t0 = time.monotonic()
    with p.open(path) as f:
        f.read_device(0, n, dev)
    took = time.monotonic() - t0
    if p.mode == "cpu":
        got = hashlib.sha256(memoryview(dev.array())).hexdigest()
    else:
        got = hashlib.sha256(dev.tobytes()).hexdigest()
    assert got == h.hexdigest()
    print("pinned %s: %d MiB to the device in %.2f s" % (p.mode, LARGE_MB,
                                                         took))


# ---- WebDataset-style shards through a dstagefs mount ---------------------

def make_shards(src, n_shards=3, per_shard=40):
    """Tar shards of samples (jpg: random bytes, cls: text, some json);
    returns {(shard, key): {field: bytes}}."""
    want = {}
    for s in range(n_shards):
        name = "shard-%04d.tar" % s
        with tarfile.open(src / name, "w", format=tarfile.USTAR_FORMAT) as tf:
            for j in range(per_shard):
                key = "train/%06d" % (s * per_shard + j)
                r = random.Random(s * 1000 + j)
                fields = {"jpg": r.randbytes(r.randrange(0, 30000)),
                          "cls": str(r.randrange(1000)).encode()}
                if j % 3 == 0:
                    fields["meta.json"] = b'{"j": %d}' % j
                for field, data in fields.items():
                    ti = tarfile.TarInfo("%s.%s" % (key, field))
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
                want[(name, key)] = fields
    return want


@pytest.fixture
def mount(tool, tmp_path):
    """mount(files_dir) -> Path of the dataset "ds" (a file:// source of
    files_dir) in a dstagefs mount: mnt/datasets/ds."""
    procs = []
    cfg = tmp_path / "dstage.conf"
    cfg.write_text("[cache]\ndir = %s\nsize = 2G\n[catalog]\npath = %s\n" %
                   (tmp_path / "cache", tmp_path / "catalog.db"))
    env = dict(os.environ, DSTAGE_CONFIG=str(cfg))

    def start(src):
        subprocess.run([tool("catalog_tool"), str(tmp_path / "catalog.db"),
                        "add", "ds", "file://%s/" % src], env=env,
                       check=True, capture_output=True, timeout=120)
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        log = open(tmp_path / "dstagefs.log", "wb")
        procs.append((subprocess.Popen([tool("dstagefs"), "-f", str(mnt)],
                                       env=env, stdout=log,
                                       stderr=subprocess.STDOUT), mnt))
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if (mnt / "datasets" / "ds").is_dir():
                return mnt / "datasets" / "ds"
            assert procs[-1][0].poll() is None, \
                (tmp_path / "dstagefs.log").read_text()
            time.sleep(0.05)
        raise AssertionError("dstagefs did not mount: " +
                             (tmp_path / "dstagefs.log").read_text())

    yield start
    for proc, mnt in procs:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


@pytest.fixture(scope="module")
def torch_wds(pinned):
    torch = pytest.importorskip("torch")
    import dstage.webdataset as wds
    return torch, wds


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")
def test_tar_shards_from_mount(torch_wds, mount, tmp_path):
    torch, wds = torch_wds
    src = tmp_path / "src"
    src.mkdir()
    want = make_shards(src)
    ds_dir = mount(src)
    shards = sorted(ds_dir.glob("shard-*.tar"))
    assert len(shards) == 3

    # In-process: pinned views, one batch of 16 samples at a time. In the
    # CPU mode the arena is mlock'd: the mapping under each batch's tensors
    # is locked, at least as many pages as the tensor spans (measured on
    # that mapping: a process-wide VmLck baseline moved with what pytest and
    # earlier tests locked and freed, and once read 30,544 kB against
    # 53,276).
    got, checked = {}, 0
    for sample in torch.utils.data.DataLoader(
            wds.TarShards(shards, batch=16), batch_size=None, num_workers=0):
        name = os.path.basename(sample["__shard__"])
        got[(name, sample["__key__"])] = {
            k: bytes(v.numpy()) for k, v in sample.items()
            if not k.startswith("__")}
        assert sample["jpg"].dtype == torch.uint8
        if wds.context().mode == "cpu":
            t = sample["jpg"]
            span_kb = (t.numel() * t.element_size() + 4095) // 4096 * 4
            assert locked_kb_at(t.data_ptr()) >= span_kb, \
                (t.data_ptr(), span_kb)
            checked += 1
    assert got == want
    if wds.context().mode == "cpu":
        assert checked > 0

    # Two DataLoader workers, shards split between them.
    got = {}
    for sample in torch.utils.data.DataLoader(
            wds.TarShards(shards, batch=7), batch_size=None, num_workers=2):
        name = os.path.basename(sample["__shard__"])
        got[(name, sample["__key__"])] = {
            k: bytes(v.numpy()) for k, v in sample.items()
            if not k.startswith("__")}
    assert got == want

    # Map-style, random order, in workers.
    ds = wds.TarShardSamples(shards)
    assert len(ds) == len(want)
    order = list(range(len(ds)))
    random.Random(3).shuffle(order)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(ds, order[:50]), batch_size=None,
        num_workers=2)
    n = 0
    for sample in loader:
        name = os.path.basename(sample["__shard__"])
        fields = want[(name, sample["__key__"])]
        assert {k: bytes(v.numpy()) for k, v in sample.items()
                if not k.startswith("__")} == fields
        n += 1
    assert n == 50


def test_tar_shard_index(torch_wds, tmp_path):
    _, wds = torch_wds
    want = make_shards(tmp_path, n_shards=1, per_shard=5)
    idx = wds.index_shard(tmp_path / "shard-0000.tar")
    assert [k for k, _ in idx] == ["train/%06d" % j for j in range(5)]
    assert [f for f, _, _ in idx[0][1]] == ["jpg", "cls", "meta.json"]
    data = (tmp_path / "shard-0000.tar").read_bytes()
    for key, fields in idx:
        for field, off, size in fields:
            assert data[off:off + size] == want[("shard-0000.tar", key)][field]
