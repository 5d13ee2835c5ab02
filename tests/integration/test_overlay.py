"""dstagefs --over DIR: the transparent mode (issue 19, docs/dstagefs.md,
"Overlay (transparent) mode").

A tmp directory stands in for /mnt/parallel-fs. The tests reach the tree
underneath the mount through a directory descriptor opened before the mount
(dir_fd=...), as a job on another node would see the parallel FS:
- every file read through the overlay has the underlying bytes and
  attributes;
- a second read is served by the cache: the per-dataset miss counter of
  the metrics endpoint (blocks fetched from the tree) does not move, also
  after a remount (the cache is on disk);
- a file changed underneath is read fresh; new and removed files show
  within overlay.attr_timeout;
- saves (torch.save or its stand-in), temp + os.replace and rm through the
  overlay land in the tree, durably;
- a second uid is refused what the tree's modes refuse (read and write);
- kill -9 leaves the tree as it was, and a new dstagefs detaches the stale
  mount and serves again;
- a non-root user may not mount over a directory it does not own.
"""
import hashlib
import io
import os
import pickle
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from waits import wait_for

TIMEOUT = 1.0  # overlay.attr_timeout in these tests, seconds


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha(data):
    return hashlib.sha256(data).hexdigest()


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) and
                   " - fuse.dstagefs " in line for line in f)


class Overlay:
    def __init__(self, tool, tmp, pfs=None):
        """pfs: the directory to mount over (default: TMP/pfs, created);
        the cache, config and log are in TMP."""
        self.tool, self.tmp = tool, Path(tmp)
        self.pfs = Path(pfs) if pfs else self.tmp / "pfs"
        self.pfs.mkdir()
        self.port = free_port()
        (self.tmp / "cache").mkdir(mode=0o700)
        self.conf = self.tmp / "dstage.conf"
        self.conf.write_text(
            "[cache]\ndir = %s/cache\nsize = 1G\nblock_size = 256K\n"
            "[catalog]\npath = %s/catalog.db\n"
            "[overlay]\nattr_timeout = %gs\nmin_cached_size = 64K\n"
            "no_cache = *.log, scratch/*\n"
            "[metrics]\nlisten = 127.0.0.1:%d\n"
            % (self.tmp, self.tmp, TIMEOUT, self.port))
        os.chmod(self.conf, 0o644)
        self.env = dict(os.environ)
        self.env.pop("DSTAGE_CONFIG", None)
        self.proc = None
        # The tree underneath, reachable while the mount hides its path.
        self.under = os.open(self.pfs, os.O_RDONLY | os.O_DIRECTORY)

    def start(self):
        log = open(self.tmp / "dstagefs.log", "ab")
        self.proc = subprocess.Popen(
            [self.tool("dstagefs"), "-f", "--config", str(self.conf),
             "--over", str(self.pfs)], env=self.env, stdout=log, stderr=log)
        log.close()
        wait_for(lambda: mounted(self.pfs) or self.proc.poll() is not None,
                 "the overlay mount")
        assert self.proc.poll() is None, self.log()
        wait_for(lambda: self.metrics() is not None, "the metrics endpoint")

    def log(self):
        p = self.tmp / "dstagefs.log"
        return p.read_text() if p.exists() else ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            rc = self.proc.wait(20)
            assert rc == 0, self.log()
        self.proc = None
        assert not mounted(self.pfs)

    def close(self):
        rc = 0
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                rc = self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait(10)
        subprocess.run(["fusermount3", "-uz", str(self.pfs)],
                       capture_output=True)
        os.close(self.under)
        # a clean exit (under ASan: no leak, no error report)
        assert rc == 0 and "AddressSanitizer" not in self.log(), self.log()

    def metrics(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics"
                                        % self.port, timeout=5) as r:
                return r.read().decode()
        except OSError:
            return None

    def ds_counter(self, kind):
        """Blocks of the overlay's dataset: 'hits' or 'misses'."""
        name = "dstage_dataset_cache_%s_total" % kind
        label = 'dataset="overlay:%s"' % self.pfs
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") and label in line:
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    def passthrough_opens(self):
        for line in self.metrics().splitlines():
            if line.startswith("dstage_cache_passthrough_opens_total "):
                return int(float(line.rsplit(" ", 1)[1]))
        raise AssertionError("no dstage_cache_passthrough_opens_total")

    # the tree underneath
    def put(self, rel, data, mode=0o644):
        fd = os.open(rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode,
                     dir_fd=self.under)
        os.write(fd, data)
        os.close(fd)
        os.chmod(rel, mode, dir_fd=self.under)

    def get(self, rel):
        fd = os.open(rel, os.O_RDONLY, dir_fd=self.under)
        try:
            return b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        finally:
            os.close(fd)

    def exists(self, rel):
        try:
            os.stat(rel, dir_fd=self.under, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False


@pytest.fixture
def ov(tool, tmp_path):
    o = Overlay(tool, tmp_path)
    try:
        yield o
    finally:
        o.close()


def tree(o):
    files = {
        "big.bin": os.urandom(3 << 20),
        "small.txt": b"hello\n",
        "datasets/imagenet/shard-000.tar": os.urandom(700 << 10),
        "datasets/imagenet/shard-001.tar": os.urandom(300 << 10),
        "datasets/imagenet/deep/er/labels.csv": b"a,1\nb,2\n",
        "empty": b"",
    }
    for rel, data in files.items():
        parent = str(Path(rel).parent)
        if parent != ".":
            os.makedirs(o.pfs / parent, exist_ok=True)
        o.put(rel, data)
    return files


def test_tree_and_bytes_equal_the_underlying(ov):
    files = tree(ov)
    before = {rel: os.stat(ov.pfs / rel) for rel in files}
    ov.start()
    for rel, data in files.items():
        assert sha((ov.pfs / rel).read_bytes()) == sha(data), rel
        st, b = os.stat(ov.pfs / rel), before[rel]
        assert (st.st_size, st.st_mode, st.st_uid, st.st_gid,
                st.st_mtime_ns) == (b.st_size, b.st_mode, b.st_uid,
                                    b.st_gid, b.st_mtime_ns), rel
    assert sorted(os.listdir(ov.pfs)) == sorted(os.listdir(ov.under))
    # symbolic links, as they are (a link out of the tree stays a link)
    os.symlink("big.bin", "link", dir_fd=ov.under)
    time.sleep(TIMEOUT + 0.2)
    assert os.readlink(ov.pfs / "link") == "big.bin"
    assert (ov.pfs / "link").read_bytes() == files["big.bin"]
    os.symlink("/etc/hostname", ov.pfs / "out")
    assert os.readlink("out", dir_fd=ov.under) == "/etc/hostname"
    # a listing longer than one READDIR(PLUS) reply
    os.makedirs(ov.pfs / "many")
    names = sorted("file-%04d-%s" % (i, "x" * 40) for i in range(600))
    for n in names:
        (ov.pfs / "many" / n).write_bytes(b"")
    assert sorted(os.listdir(ov.pfs / "many")) == names
    assert sorted(os.listdir(os.open("many", os.O_RDONLY,
                                     dir_fd=ov.under))) == names
    assert len(subprocess.run(["ls", "-l", str(ov.pfs / "many")],
                              capture_output=True, text=True,
                              check=True).stdout.splitlines()) == 601
    assert sorted(os.listdir(ov.pfs / "datasets/imagenet")) == \
        ["deep", "shard-000.tar", "shard-001.tar"]
    ov.stop()
    for rel, data in files.items():  # the tree is as it was
        assert ov.get(rel) == data


def drop_pages(path):
    """Make the next read reach dstagefs (not the mount's page cache)."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def test_second_read_is_served_from_the_cache(ov):
    data = os.urandom(2 << 20)
    ov.put("model.bin", data)
    ov.start()
    assert ov.ds_counter("misses") == 0
    assert sha((ov.pfs / "model.bin").read_bytes()) == sha(data)
    misses = ov.ds_counter("misses")
    assert misses == 8  # 2 MiB in 256 KiB blocks, each fetched once
    hits = ov.ds_counter("hits")
    drop_pages(ov.pfs / "model.bin")
    assert sha((ov.pfs / "model.bin").read_bytes()) == sha(data)
    assert ov.ds_counter("misses") == misses  # no read of the tree
    assert ov.ds_counter("hits") > hits
    # A new process: the blocks are on disk, still no read of the tree.
    ov.stop()
    ov.start()
    assert sha((ov.pfs / "model.bin").read_bytes()) == sha(data)
    assert ov.ds_counter("misses") == 0
    assert ov.ds_counter("hits") >= 8
    # overlay.passthrough is off by default (test_overlay_passthrough.py)
    assert ov.passthrough_opens() == 0


def test_small_files_and_no_cache_patterns_bypass_the_cache(ov):
    big = os.urandom(1 << 20)
    os.makedirs(ov.pfs / "scratch")
    ov.put("small.json", b"{}" * 100)
    ov.put("train.log", big)
    ov.put("scratch/x.bin", big)
    ov.put("scratch.bin", big[:300000])
    ov.start()
    assert (ov.pfs / "small.json").read_bytes() == b"{}" * 100
    assert (ov.pfs / "train.log").read_bytes() == big
    assert (ov.pfs / "scratch" / "x.bin").read_bytes() == big
    assert ov.ds_counter("misses") == 0 and ov.ds_counter("hits") == 0
    # a name matching no pattern is cached
    assert (ov.pfs / "scratch.bin").read_bytes() == big[:300000]
    assert ov.ds_counter("misses") == 2


def test_changed_file_is_read_fresh(ov):
    old, new = os.urandom(1 << 20), os.urandom(1 << 20)
    ov.put("data.bin", old)
    ov.start()
    assert (ov.pfs / "data.bin").read_bytes() == old
    # Rewritten in place underneath, same size (another node's job).
    fd = os.open("data.bin", os.O_WRONLY, dir_fd=ov.under)
    os.pwrite(fd, new, 0)
    os.close(fd)
    time.sleep(TIMEOUT + 0.2)  # the attribute timeout
    assert (ov.pfs / "data.bin").read_bytes() == new
    # Replaced underneath by a new file (temp + rename).
    newer = os.urandom(1 << 19)
    ov.put("tmp.x", newer)
    os.rename("tmp.x", "data.bin", src_dir_fd=ov.under, dst_dir_fd=ov.under)
    time.sleep(TIMEOUT + 0.2)
    assert (ov.pfs / "data.bin").read_bytes() == newer


def test_changed_while_open_is_never_mixed(ov):
    old = os.urandom(1 << 20)
    ov.put("open.bin", old)
    ov.start()
    with open(ov.pfs / "open.bin", "rb", buffering=0) as f:
        # no readahead: the rest is read from dstagefs after the change
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        head = f.read(1 << 18)
        # replaced underneath while open: the open file keeps its bytes
        ov.put("t", os.urandom(1 << 20))
        os.rename("t", "open.bin", src_dir_fd=ov.under, dst_dir_fd=ov.under)
        rest = b"".join(iter(lambda: f.read(1 << 17), b""))
    assert head + rest == old


def test_new_and_removed_files_show_within_the_timeout(ov):
    ov.put("gone.txt", b"bye")
    ov.start()
    assert (ov.pfs / "gone.txt").exists()
    assert not (ov.pfs / "new.txt").exists()  # absence cached
    t0 = time.monotonic()
    ov.put("new.txt", b"hi")
    os.unlink("gone.txt", dir_fd=ov.under)
    wait_for(lambda: (ov.pfs / "new.txt").exists() and
             not (ov.pfs / "gone.txt").exists(), "the changes", timeout=10)
    assert time.monotonic() - t0 < TIMEOUT + 1.0
    assert (ov.pfs / "new.txt").read_bytes() == b"hi"
    assert "new.txt" in os.listdir(ov.pfs)
    assert "gone.txt" not in os.listdir(ov.pfs)


def save_model(obj, path):
    """torch.save when torch is installed, else the same I/O pattern:
    open(path, 'wb'), sequential writes, close."""
    try:
        import torch
        torch.save(obj, path)
    except ImportError:
        with open(path, "wb") as f:
            buf = io.BytesIO()
            pickle.dump(obj, buf)
            f.write(buf.getvalue())


def test_torch_save_lands_in_the_tree_and_loads_back(ov):
    """A model's state dict saved with torch.save through the overlay is in
    the tree underneath, byte for byte, and torch.load reads it back from
    the tree and through the overlay, after a temp + os.replace save too."""
    torch = pytest.importorskip("torch")
    os.makedirs(ov.pfs / "ckpt")
    ov.start()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    state = model.state_dict()
    torch.save(state, ov.pfs / "ckpt" / "model.pt")
    tmp = ov.pfs / "ckpt" / ".model.pt.tmp"
    torch.save({"step": 9, "model": state}, tmp)
    os.replace(tmp, ov.pfs / "ckpt" / "step9.pt")
    assert not ov.exists("ckpt/.model.pt.tmp")
    for rel, get in (("ckpt/model.pt", lambda d: d),
                     ("ckpt/step9.pt", lambda d: d["model"])):
        direct = ov.get(rel)
        assert direct == (ov.pfs / rel).read_bytes()
        for src in (io.BytesIO(direct), str(ov.pfs / rel)):
            back = get(torch.load(src))
            assert back.keys() == state.keys()
            assert all(torch.equal(back[k], state[k]) for k in state)


def test_writes_land_in_the_tree(ov):
    os.makedirs(ov.pfs / "ckpt")
    ov.start()
    obj = {"step": 7, "w": list(range(50000))}
    save_model(obj, ov.pfs / "ckpt" / "model.pt")
    direct = ov.get("ckpt/model.pt")
    assert direct == (ov.pfs / "ckpt" / "model.pt").read_bytes()
    # temp + os.replace, fsynced: the atomic-save pattern
    tmp = ov.pfs / "ckpt" / ".model.pt.tmp"
    with open(tmp, "wb") as f:
        f.write(b"v2" * 100000)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ov.pfs / "ckpt" / "model.pt")
    assert ov.get("ckpt/model.pt") == b"v2" * 100000
    assert not ov.exists("ckpt/.model.pt.tmp")
    assert (ov.pfs / "ckpt" / "model.pt").read_bytes() == b"v2" * 100000
    # append, truncate, mkdir, rmdir, rm
    with open(ov.pfs / "ckpt" / "log.txt", "a") as f:
        f.write("one\n")
    with open(ov.pfs / "ckpt" / "log.txt", "a") as f:
        f.write("two\n")
    assert ov.get("ckpt/log.txt") == b"one\ntwo\n"
    os.truncate(ov.pfs / "ckpt" / "log.txt", 4)
    assert ov.get("ckpt/log.txt") == b"one\n"
    os.mkdir(ov.pfs / "ckpt" / "d")
    assert ov.exists("ckpt/d")
    os.rmdir(ov.pfs / "ckpt" / "d")
    assert not ov.exists("ckpt/d")
    os.unlink(ov.pfs / "ckpt" / "model.pt")
    assert not ov.exists("ckpt/model.pt")
    # a directory renamed through the overlay: what is below it moves too
    os.makedirs(ov.pfs / "ckpt" / "run1" / "e")
    (ov.pfs / "ckpt" / "run1" / "e" / "w.bin").write_bytes(b"w" * 100000)
    os.rename(ov.pfs / "ckpt" / "run1", ov.pfs / "ckpt" / "run2")
    assert (ov.pfs / "ckpt" / "run2" / "e" / "w.bin").read_bytes() == \
        b"w" * 100000
    (ov.pfs / "ckpt" / "run2" / "e" / "x.bin").write_bytes(b"x")
    assert ov.get("ckpt/run2/e/x.bin") == b"x"
    assert not ov.exists("ckpt/run1")
    shutil.rmtree(ov.pfs / "ckpt" / "run2")
    ov.stop()
    assert sorted(os.listdir(ov.pfs / "ckpt")) == ["log.txt"]


def test_second_uid_is_refused_what_the_tree_refuses(ov, users):
    u = users.user("ovl")
    users.reach(ov.tmp)
    os.makedirs(ov.pfs / "locked")
    os.makedirs(ov.pfs / "open")
    ov.put("private.bin", b"secret" * 20000, 0o600)
    ov.put("public.bin", b"public" * 20000, 0o644)
    ov.put("locked/inside.bin", b"inner" * 20000, 0o644)
    os.chmod(ov.pfs / "locked", 0o700)
    os.chmod(ov.pfs / "open", 0o777)
    os.chmod(ov.pfs, 0o755)
    ov.start()
    # root reads everything first: the kernel caches the dentries
    for rel in ("private.bin", "public.bin", "locked/inside.bin"):
        (ov.pfs / rel).read_bytes()

    def as_u(*cmd):
        return users.run(u, list(cmd))

    assert as_u("cat", ov.pfs / "public.bin").returncode == 0
    r = as_u("cat", ov.pfs / "private.bin")
    assert r.returncode != 0 and b"Permission denied" in r.stderr
    r = as_u("cat", ov.pfs / "locked" / "inside.bin")
    assert r.returncode != 0 and b"Permission denied" in r.stderr
    r = as_u("ls", ov.pfs / "locked")
    assert r.returncode != 0
    # writes: not into root's 0755 directory, not over root's file
    r = as_u("sh", "-c", "echo x > %s" % (ov.pfs / "mine.txt"))
    assert r.returncode != 0 and not ov.exists("mine.txt")
    r = as_u("sh", "-c", "echo x >> %s" % (ov.pfs / "public.bin"))
    assert r.returncode != 0
    assert ov.get("public.bin") == b"public" * 20000
    r = as_u("rm", "-f", ov.pfs / "public.bin")
    assert r.returncode != 0 and ov.exists("public.bin")
    r = as_u("mv", ov.pfs / "public.bin", ov.pfs / "open" / "p")
    assert r.returncode != 0 and ov.exists("public.bin")
    # where the tree lets it, it writes, as itself
    r = as_u("sh", "-c", "echo mine > %s" % (ov.pfs / "open" / "m.txt"))
    assert r.returncode == 0, r.stderr
    st = os.stat("open/m.txt", dir_fd=ov.under)
    assert st.st_uid == users.uid(u) and st.st_gid == users.gid(u)
    assert ov.get("open/m.txt") == b"mine\n"
    # and root's files it made stay out of its reach
    r = as_u("chmod", "666", ov.pfs / "private.bin")
    assert r.returncode != 0
    assert os.stat("private.bin", dir_fd=ov.under).st_mode & 0o777 == 0o600


def test_kill9_leaves_the_tree_and_remount_works(ov):
    files = tree(ov)
    ov.start()
    assert (ov.pfs / "big.bin").read_bytes() == files["big.bin"]
    ov.proc.send_signal(signal.SIGKILL)
    ov.proc.wait(10)
    with pytest.raises(OSError):
        os.listdir(ov.pfs)  # ENOTCONN: the stale mount
    for rel, data in files.items():
        assert ov.get(rel) == data
    ov.start()
    assert "stale mount detached" in ov.log()
    for rel, data in files.items():
        assert sha((ov.pfs / rel).read_bytes()) == sha(data)
    ov.stop()


def test_only_root_mounts_over_a_directory_it_does_not_own(ov, users):
    u = users.user("ovm")
    users.reach(ov.tmp)
    os.chmod(ov.pfs, 0o777)  # writable, but root's
    r = users.run(u, [ov.tool("dstagefs"), "-f", "--config", ov.conf,
                      "--over", ov.pfs], env=ov.env, timeout=30)
    assert r.returncode == 3, r.stderr
    assert b"only root may mount over a directory it does not own" \
        in r.stderr
    assert not mounted(ov.pfs)


def test_bad_option_combinations(ov):
    r = subprocess.run([ov.tool("dstagefs"), "--over", str(ov.pfs),
                        str(ov.tmp / "mnt")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "not both" in r.stderr
    r = subprocess.run([ov.tool("dstagefs"), "-f", "--config", str(ov.conf),
                        "--over", str(ov.tmp / "missing")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 3 and "no such directory" in r.stderr
    assert not (ov.tmp / "missing").exists()


# ---- stager stage PATH / verify PATH: a directory as an ad-hoc dataset ----

def adhoc(ov, *args, prefix=()):
    return subprocess.run(list(prefix) + [ov.tool("stager"), "--config",
                                          str(ov.conf)] + [str(a) for a in
                                                           args],
                          env=ov.env, capture_output=True, timeout=120)


def test_stage_and_verify_a_directory_under_the_overlay(ov):
    os.makedirs(ov.pfs / "ds" / "shard")
    files = {"ds/a.bin": os.urandom(1 << 20),
             "ds/shard/b.bin": os.urandom(700000),
             "ds/tiny.txt": b"tiny\n"}
    for rel, data in files.items():
        ov.put(rel, data)
    sums = "".join("%s  %s\n" % (sha(d), rel[3:]) for rel, d in
                   sorted(files.items()))
    ov.put("ds/SHA256SUMS", sums.encode())
    ov.start()
    r = adhoc(ov, "stage", ov.pfs / "ds", "--json")
    assert r.returncode == 0, r.stderr
    doc = __import__("json").loads(r.stdout)
    assert doc["files"] == 4 and doc["ok"] and doc["errors"] == 0
    misses = ov.ds_counter("misses")
    assert misses == 4 + 3  # a.bin: 4 blocks of 256K, b.bin 3; tiny: none
    # staged: reading it now touches the tree no more
    for rel, data in files.items():
        drop_pages(ov.pfs / rel)
        assert (ov.pfs / rel).read_bytes() == data
    assert ov.ds_counter("misses") == misses
    r = adhoc(ov, "verify", ov.pfs / "ds")
    out = r.stdout.decode()
    assert r.returncode == 0, (out, r.stderr)
    assert "3 listed, 0 mismatched, 0 missing, 0 not listed" in out
    # changed underneath, one listed file gone, one unlisted added
    ov.put("ds/shard/b.bin", os.urandom(700000))
    os.unlink("ds/tiny.txt", dir_fd=ov.under)
    ov.put("ds/extra.bin", b"x")
    time.sleep(TIMEOUT + 0.2)
    r = adhoc(ov, "verify", ov.pfs / "ds", "--json")
    assert r.returncode == 1
    doc = __import__("json").loads(r.stdout)
    assert (doc["mismatches"], doc["missing"], doc["unlisted"]) == (1, 1, 1)
    assert any(x.startswith("MISMATCH shard/b.bin: sha256 ")
               for x in doc["report"]), doc
    assert "MISSING tiny.txt: listed in SHA256SUMS, not found" in \
        doc["report"]


def test_adhoc_path_refusals(ov, users, tmp_path):
    ov.start()
    r = adhoc(ov, "stage", tmp_path)  # not under a dstagefs mount
    assert r.returncode == 2 and b"is not under a dstagefs mount" in r.stderr
    r = adhoc(ov, "verify", ov.pfs / "nosuch")
    assert r.returncode == 5 and b"No such file" in r.stderr
    r = adhoc(ov, "verify", ov.pfs, "--repair")
    assert r.returncode == 2 and b"apply to a registered dataset" in r.stderr
    # the caller's rights: a file the tree refuses the second uid is an
    # error for it, named, while root stages it
    u = users.user("ovs")
    users.reach(ov.tmp)
    os.chmod(ov.pfs, 0o755)
    ov.put("open.bin", os.urandom(300000), 0o644)
    ov.put("private.bin", os.urandom(300000), 0o600)
    os.makedirs(ov.pfs / "locked")
    ov.put("locked/in.bin", os.urandom(300000), 0o644)
    os.chmod(ov.pfs / "locked", 0o700)  # a directory it cannot list
    r = users.run(u, [ov.tool("stager"), "--config", str(ov.conf), "stage",
                      str(ov.pfs)])
    out = r.stdout.decode()
    assert r.returncode == 1, out
    assert "ERROR private.bin: Permission denied" in out
    assert "ERROR locked: Permission denied" in out
    assert "2 file(s) could not be read" in out
    assert adhoc(ov, "stage", ov.pfs).returncode == 0
