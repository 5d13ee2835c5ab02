"""PyTorch datasets over WebDataset-style tar shards, read with dstage's
pinned path (dstage.pinned) into page-locked tensors.

A shard is a plain tar whose members are grouped into samples by key: the
member's path up to the first dot of its file name ("train/000017.jpg" and
"train/000017.cls" are sample "train/000017", fields "jpg" and "cls").
Samples are the runs of consecutive members with the same key, as
WebDataset writes them.

    ds = TarShards(sorted(glob("/mnt/dstage/imagenet/shard-*.tar")))
    for sample in DataLoader(ds, batch_size=None):
        img = sample["jpg"]          # uint8 tensor in pinned host memory
        img = img.cuda(non_blocking=True)

Each group of `batch` samples is read with one pinned_read_batch (one
io_uring submission) into one pinned arena; the tensors are views of it
(torch.frombuffer, no copy) and keep it alive, like torch's pin_memory(). With
device="cuda" on a machine where dstage runs in the CUDA mode, the arena is
also copied to a CUDA tensor in one cudaMemcpyAsync and the fields are views
of that instead.

DataLoader: num_workers=0 keeps the pinned views (the I/O is already
parallel in the kernel). With workers, PyTorch moves each sample through
shared memory, so the main process's copies are pageable again: add
pin_memory=True there, as for any dataset.
"""
import os
import tarfile

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from .pinned import Pinned

ALIGN = 256  # each field starts 256-byte aligned in the arena


def index_shard(path):
    """[(key, [(field, offset, size)])] of a tar shard, in order, from its
    headers only."""
    samples = []
    with tarfile.open(path, "r:") as tf:
        for m in tf:
            if not m.isfile():
                continue
            d, base = os.path.split(m.name)
            if "." not in base or base.startswith("."):
                continue
            stem, field = base.split(".", 1)
            key = os.path.join(d, stem)
            if not samples or samples[-1][0] != key:
                samples.append((key, []))
            samples[-1][1].append((field, m.offset_data, m.size))
    return samples


_ctx = {}


def context(**opts):
    """This process's Pinned context (one per process: DataLoader workers
    are processes, and each makes its own)."""
    pid = os.getpid()
    if pid not in _ctx:
        for old in _ctx.values():
            old._p = None  # a forked child: the parent's, never freed here
        _ctx.clear()
        _ctx[pid] = Pinned(**opts)
    return _ctx[pid]


def read_samples(ctx, f, shard, samples, device=None):
    """Read these samples of one open shard (a dstage.pinned.File) in one
    batch: a list of dicts {"__key__", "__shard__", field: uint8 tensor}."""
    items, where = [], []
    for key, fields in samples:
        for field, off, size in fields:
            where.append((key, field))
            items.append((f, off, size))
    total = 0
    for _, _, size in items:
        total = (total + ALIGN - 1) // ALIGN * ALIGN + size
    arena = ctx.host_alloc(max(total, 1))
    dev = None
    stream = None
    if device is not None and ctx.mode == "cuda":
        dev = torch.empty(max(total, 1), dtype=torch.uint8, device=device)
        stream = torch.cuda.current_stream(dev.device).cuda_stream
    placed = ctx.read_batch(items, arena, ALIGN,
                            None if dev is None else dev.data_ptr(), stream)
    whole = dev if dev is not None else torch.frombuffer(arena.array(),
                                                         dtype=torch.uint8)
    out, by_key = [], {}
    for (key, field), (aoff, size) in zip(where, placed):
        if key not in by_key:
            by_key[key] = {"__key__": key, "__shard__": shard}
            out.append(by_key[key])
        by_key[key][field] = whole[aoff:aoff + size]
    return out


class TarShards(IterableDataset):
    """Stream the samples of tar shards (paths, e.g. under a dstagefs
    mount), `batch` samples per pinned batch. Shards are split between
    DataLoader workers."""

    def __init__(self, shards, batch=64, device=None, **pinned_opts):
        self.shards = [os.fspath(s) for s in shards]
        self.batch, self.device, self.opts = batch, device, pinned_opts

    def __iter__(self):
        wi = get_worker_info()
        shards = self.shards
        if wi is not None:
            shards = shards[wi.id::wi.num_workers]
        ctx = context(**self.opts)
        for shard in shards:
            samples = index_shard(shard)
            with ctx.open(shard) as f:
                for i in range(0, len(samples), self.batch):
                    yield from read_samples(ctx, f, shard,
                                            samples[i:i + self.batch],
                                            self.device)


class TarShardSamples(Dataset):
    """Random access to the samples of tar shards: the index (tar headers)
    is read once; each item is read with one pinned batch."""

    def __init__(self, shards, device=None, **pinned_opts):
        self.shards = [os.fspath(s) for s in shards]
        self.device, self.opts = device, pinned_opts
        self.index = [(s, sample) for s in self.shards
                      for sample in index_shard(s)]
        self._files = {}

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        shard, sample = self.index[i]
        ctx = context(**self.opts)
        key = (os.getpid(), shard)
        if key not in self._files:
            if any(k[0] != os.getpid() for k in self._files):
                for f in self._files.values():
                    f._f = None  # a forked worker: the parent's handles
                self._files = {}
            self._files[key] = ctx.open(shard)
        return read_samples(ctx, self._files[key], shard, [sample],
                            self.device)[0]
