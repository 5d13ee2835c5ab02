"""dstage Python bindings (ctypes over libdstage.so, no build step).

dstage.pinned     page-locked buffers and the GPU path (include/dstage/pinned.h)
dstage.webdataset a PyTorch Dataset / IterableDataset over WebDataset-style
                  tar shards, read into pinned tensors (needs torch)
"""
