"""ctypes binding of include/dstage/pinned.h: read dataset files into
page-locked host buffers and onto a GPU (docs/gpu.md).

libdstage.so is found through $DSTAGE_LIB (a path), then the build trees
$DSTAGE_BUILD_DIR/lib and <repo>/build/lib, then the loader's path.

    with Pinned() as p:                 # mode "cuda" or "cpu"
        buf = p.host_alloc(1 << 20)     # pinned, 4 KiB-aligned
        with p.open("/mnt/ds/file") as f:
            f.read_host(0, f.size, buf)
        views = p.read_batch(["/mnt/ds/a", "/mnt/ds/b"], buf)

Errors are OSError with the errno the C call returned.
"""
import ctypes
import ctypes.util
import os
from pathlib import Path

PINNED_CUDA_REQUIRED = 1 << 0
PINNED_CPU_ONLY = 1 << 1
PINNED_NO_DIRECT = 1 << 2


class _Opts(ctypes.Structure):
    _fields_ = [("chunk", ctypes.c_size_t), ("depth", ctypes.c_uint),
                ("device", ctypes.c_int), ("flags", ctypes.c_uint)]


class _Entry(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char_p), ("cache", ctypes.c_void_p),
                ("obj", ctypes.c_void_p), ("file", ctypes.c_void_p),
                ("off", ctypes.c_uint64), ("len", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("arena_off", ctypes.c_uint64),
                ("err", ctypes.c_int)]


def _find_lib():
    env = os.environ.get("DSTAGE_LIB")
    if env:
        return env
    repo = Path(__file__).resolve().parents[2]
    dirs = []
    if os.environ.get("DSTAGE_BUILD_DIR"):
        b = Path(os.environ["DSTAGE_BUILD_DIR"])
        dirs.append(b if b.is_absolute() else repo / b)
    dirs.append(repo / "build")
    for d in dirs:
        if (d / "lib" / "libdstage.so").exists():
            return str(d / "lib" / "libdstage.so")
    found = ctypes.util.find_library("dstage")
    if not found:
        raise OSError("libdstage.so not found: build it (cmake --build build "
                      "--target dstage_shared) or set DSTAGE_LIB to its path")
    return found


_lib = None


def lib():
    """The loaded libdstage.so, its prototypes declared."""
    global _lib
    if _lib is not None:
        return _lib
    L = ctypes.CDLL(_find_lib())
    vp, sz, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    protos = {
        "pinned_init": (ctypes.c_int, [ctypes.POINTER(_Opts), ctypes.POINTER(vp)]),
        "pinned_free": (None, [vp]),
        "pinned_mode": (ctypes.c_int, [vp]),
        "pinned_mode_name": (ctypes.c_char_p, [ctypes.c_int]),
        "pinned_mode_reason": (ctypes.c_char_p, [vp]),
        "pinned_host_alloc": (ctypes.c_int, [vp, sz, ctypes.POINTER(vp)]),
        "pinned_host_free": (None, [vp, vp]),
        "pinned_dev_alloc": (ctypes.c_int, [vp, sz, ctypes.POINTER(vp)]),
        "pinned_dev_free": (None, [vp, vp]),
        "pinned_copy_to_dev": (ctypes.c_int, [vp, vp, vp, sz]),
        "pinned_copy_from_dev": (ctypes.c_int, [vp, vp, vp, sz]),
        "pinned_file_open": (ctypes.c_int, [vp, ctypes.c_char_p, ctypes.POINTER(vp)]),
        "pinned_file_close": (None, [vp]),
        "pinned_file_size": (u64, [vp]),
        "pinned_read_host": (ctypes.c_int, [vp, u64, sz, vp]),
        "pinned_read_device": (ctypes.c_int, [vp, u64, sz, vp, vp]),
        "pinned_read_batch": (ctypes.c_int64, [vp, ctypes.POINTER(_Entry), sz, vp,
                                               sz, sz, vp, vp]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(L, name)
        fn.restype, fn.argtypes = res, args
    _lib = L
    return L


def _check(ret, what, path=None):
    if ret < 0:
        raise OSError(-ret, f"{what}: {os.strerror(-ret)}", path)
    return ret


class Buffer:
    """Memory from the context: host (pinned) or device. ptr is its address;
    a host buffer is also a writable buffer (memoryview(buf), numpy,
    torch.frombuffer) and stays allocated while any view of it lives."""

    def __init__(self, ctx, size, device):
        self.ctx, self.size, self.device = ctx, size, device
        p = ctypes.c_void_p()
        alloc = lib().pinned_dev_alloc if device else lib().pinned_host_alloc
        _check(alloc(ctx._p, size, ctypes.byref(p)),
               "pinned_dev_alloc" if device else "pinned_host_alloc")
        self.ptr = p.value
        self._array = None

    def array(self):
        """A ctypes array over the bytes (host buffers only); it keeps the
        buffer alive."""
        if self.device and self.ctx.mode != "cpu":
            raise ValueError("device memory is not addressable from the host")
        if self._array is None:
            self._array = (ctypes.c_uint8 * self.size).from_address(self.ptr)
            self._array._owner = self
        return self._array

    def __buffer__(self, flags):  # Python 3.12+
        return memoryview(self.array())

    def tobytes(self, off=0, n=None):
        n = self.size - off if n is None else n
        if self.device:
            out = ctypes.create_string_buffer(n)
            _check(lib().pinned_copy_from_dev(self.ctx._p, out,
                                              self.ptr + off, n),
                   "pinned_copy_from_dev")
            return out.raw
        return ctypes.string_at(self.ptr + off, n)

    def __del__(self):
        if getattr(self, "ptr", None) and self.ctx._p:
            free = lib().pinned_dev_free if self.device else lib().pinned_host_free
            free(self.ctx._p, self.ptr)
            self.ptr = None


class File:
    """A file opened for pinned reads (its size is taken at open)."""

    def __init__(self, ctx, path):
        self.ctx, self.path = ctx, os.fspath(path)
        f = ctypes.c_void_p()
        _check(lib().pinned_file_open(ctx._p, self.path.encode(),
                                      ctypes.byref(f)),
               "pinned_file_open", self.path)
        self._f = f.value
        self.size = lib().pinned_file_size(self._f)

    def read_host(self, off, n, buf, buf_off=0):
        """Read [off, off + n) into a host Buffer (or any address) at buf_off."""
        addr = (buf.ptr if isinstance(buf, Buffer) else buf) + buf_off
        if isinstance(buf, Buffer) and buf_off + n > buf.size:
            raise ValueError("read past the end of the buffer")
        _check(lib().pinned_read_host(self._f, off, n, addr),
               "pinned_read_host", self.path)

    def read_device(self, off, n, dev, dev_off=0, stream=None):
        """Read [off, off + n) onto the device at dev (a device Buffer, or
        an address such as torch's tensor.data_ptr()) on stream (a
        cudaStream_t as an int, e.g. torch.cuda.current_stream().cuda_stream)."""
        addr = (dev.ptr if isinstance(dev, Buffer) else dev) + dev_off
        if isinstance(dev, Buffer) and dev_off + n > dev.size:
            raise ValueError("read past the end of the buffer")
        _check(lib().pinned_read_device(self._f, off, n, addr, stream),
               "pinned_read_device", self.path)

    def close(self):
        if getattr(self, "_f", None):
            lib().pinned_file_close(self._f)
            self._f = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Pinned:
    """A pinned-read context (one per thread; DataLoader workers each make
    their own)."""

    def __init__(self, chunk=0, depth=0, device=0, flags=0):
        o = _Opts(chunk, depth, device, flags)
        p = ctypes.c_void_p()
        _check(lib().pinned_init(ctypes.byref(o), ctypes.byref(p)), "pinned_init")
        self._p = p.value
        self.mode = lib().pinned_mode_name(lib().pinned_mode(self._p)).decode()
        self.reason = lib().pinned_mode_reason(self._p).decode()

    def host_alloc(self, size):
        return Buffer(self, size, device=False)

    def dev_alloc(self, size):
        return Buffer(self, size, device=True)

    def open(self, path):
        return File(self, path)

    def copy_to_dev(self, dev, host_addr, n, dev_off=0):
        """Synchronous copy (cudaMemcpy) from any host address: baselines."""
        addr = (dev.ptr if isinstance(dev, Buffer) else dev) + dev_off
        _check(lib().pinned_copy_to_dev(self._p, addr, host_addr, n),
               "pinned_copy_to_dev")

    def read_batch(self, items, arena, align=0, dev=None, stream=None):
        """Read many small files into arena (a host Buffer) with one
        submission; items are paths (whole files) or (File, off, len)
        ranges. With dev, the used part of the arena goes to the device in
        one copy. All or nothing: raises OSError for the first failing item
        (its index in .item). Returns [(arena_off, size)] in item order."""
        n = len(items)
        ents = (_Entry * max(n, 1))()
        keep = []
        for i, it in enumerate(items):
            if isinstance(it, tuple):
                f, off, ln = it
                ents[i].file, ents[i].off, ents[i].len = f._f, off, ln
            else:
                b = os.fsencode(it)
                keep.append(b)
                ents[i].path = b
        devp = None if dev is None else (dev.ptr if isinstance(dev, Buffer) else dev)
        ret = lib().pinned_read_batch(self._p, ents, n, arena.ptr, arena.size,
                                      align, devp, stream)
        if ret < 0:
            bad = next((i for i in range(n) if ents[i].err not in (0, -125)), None)
            err = OSError(-ret, f"pinned_read_batch: {os.strerror(-ret)}",
                          None if bad is None or isinstance(items[bad], tuple)
                          else os.fspath(items[bad]))
            err.item = bad
            raise err
        self.batch_used = ret
        return [(ents[i].arena_off, ents[i].size) for i in range(n)]

    def close(self):
        """Free the context; drop its buffers and files first."""
        if getattr(self, "_p", None):
            lib().pinned_free(self._p)
            self._p = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
