"""`stager push` (issue 22): upload a local tree, hash-checked, then register,
stage and verify it, against a file:// directory and against radosgw
through the fault proxy.

Covered: a tree with nested directories, empty files, UTF-8 and special
characters in names (a backslash too: SHA256SUMS escapes it), one large
file (PUSH_TEST_LARGE_MB, default 256) and many small ones
(PUSH_TEST_SMALL, default 2000; the issue's 2 GiB and 10,000 by setting
them) pushed with --stage --verify (verify --source passes) and read back
through a dstagefs mount byte for byte; SHA256SUMS equals sha256sum's of the
local tree; injected 503s, resets and a failed multipart completion are
retried with no wrong byte; a re-run uploads nothing; kill -9 mid-push then
a re-run completes with no file PUT twice beyond those in flight (counted at
the proxy); a file written while it is uploaded is reported, removed from
the store and not in SHA256SUMS, and pushed by the next run; a non-UTF-8
name is refused for s3:// and kept for file:// (JSON key_hex); --dry-run
lists and changes nothing, --delete removes only keys absent locally (not
excluded ones); a registered dataset is not changed without --new-version,
which registers manifest version 2; a safetensors directory is pushed,
staged and loaded through the mount; the journal is 0600 in a 0700
directory."""
import hashlib
import json
import os
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from test_dstagefs import Dstagefs
from test_stager import MiB, Stager, data
from test_stager import stager_dir  # noqa: F401 (fixture)

LARGE_MB = int(os.environ.get("PUSH_TEST_LARGE_MB", "256"))
N_SMALL = int(os.environ.get("PUSH_TEST_SMALL", "2000"))


def text(p):
    return (p.stdout + p.stderr).decode(errors="replace")


def special_tree(root, large_mb=0, n_small=0, non_utf8=False):
    """Write the test tree under root; returns {key bytes: content}."""
    files = {
        b"a/b/c/deep.txt": b"deep\n",
        b"empty0": b"",
        b"dir/empty1": b"",
        "ünï/cødé €.txt".encode(): "ünïcødé\n".encode(),
        b"sp ace+plus&amp=%25 #hash?q.bin": data(3, 70000),
        b"back\\slash.txt": b"backslash\n",
        b"quote'\"(1).txt": b"quotes\n",
        b"mid/4MiB-plus.bin": data(4, 4 * MiB + 17),
    }
    if non_utf8:
        files[b"caf\xff/latin1.bin"] = b"latin-1 name\n"
    if large_mb:
        files[b"large/big.bin"] = os.urandom(large_mb * MiB)
    for i in range(n_small):
        files[b"small/%02d/f%05d.bin" % (i % 50, i)] = data(
            1000 + i, 100 + (i * 37) % 4000)
    root = bytes(root)
    for k, v in files.items():
        p = os.path.join(root, k)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(v)
    return files


def sums_of(files):
    """sha256sum's output for files, as push writes it (key order)."""
    out = []
    for k in sorted(files):
        h = hashlib.sha256(files[k]).hexdigest().encode()
        if b"\\" in k:
            out.append(b"\\" + h + b"  " + k.replace(b"\\", b"\\\\") + b"\n")
        else:
            out.append(h + b"  " + k + b"\n")
    return b"".join(out)


def push(s, *args, timeout=900):
    return s.run("push", *args, timeout=timeout)


def mount(s, tool, name="mnt"):
    env = dict(s.env, DSTAGE_CONFIG=str(s.cfg))
    return Dstagefs(tool("dstagefs"), s.root / name, env,
                    s.root / (name + ".log")).start()


def check_mount(m, ds, files):
    root = bytes(m.mnt / "datasets" / ds)
    for k, v in files.items():
        with open(os.path.join(root, k), "rb") as f:
            got = f.read()
        assert got == v, k


class FileDest:
    def __init__(self, root):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = "file://%s/" % self.root
        self.env = None

    def get(self, key):
        p = os.path.join(bytes(self.root), key)
        if not os.path.exists(p):
            return None
        with open(p, "rb") as f:
            return f.read()

    def put(self, key, data):
        p = os.path.join(bytes(self.root), key)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)


class RgwDest:
    """A fresh prefix of a fresh bucket; emptied again by the fixture that
    made it (the shared radosgw keeps every byte in memory)."""

    def __init__(self, rgw, proxy=None):
        self.rgw = rgw
        self.bucket = rgw.make_bucket("push-" + uuid.uuid4().hex[:8])
        self.prefix = "p-" + uuid.uuid4().hex[:8]
        self.url = "s3://%s/%s/" % (self.bucket, self.prefix)
        self.env = proxy.env() if proxy else rgw.env()

    def get(self, key):
        from urllib.parse import quote
        p = self.rgw.curl("/%s/%s/%s" % (self.bucket, self.prefix,
                                         quote(key)),
                          "-o", "-", "-w", "\n%{http_code}")
        body, _, code = p.stdout.rpartition(b"\n")
        return body if code == b"200" else None

    def put(self, key, data):
        assert self.rgw.put_object(self.bucket, "%s/%s" % (self.prefix,
                                                           key.decode()),
                                   data) == 200

    def empty(self, stager_exe):
        """Delete every object under the prefix and abort its open
        multipart uploads (best effort: this is cleanup)."""
        from urllib.parse import quote
        env = dict(os.environ, **self.rgw.env())
        env.pop("DSTAGE_CONFIG", None)
        p = subprocess.run([stager_exe, "ls", "--json", self.url], env=env,
                           capture_output=True, timeout=120)
        keys = []
        if p.returncode == 0:
            for o in json.loads(p.stdout):
                keys.append(bytes.fromhex(o["key_hex"]) if "key_hex" in o
                            else o["key"].encode())
        for k in keys:
            self.rgw.curl("/%s/%s/%s" % (self.bucket, self.prefix, quote(k)),
                          "-X", "DELETE", "-o", "/dev/null")
        p = self.rgw.aws("s3api", "list-multipart-uploads", "--bucket",
                         self.bucket, check=False)
        if p.returncode == 0 and p.stdout.strip():
            for u in json.loads(p.stdout).get("Uploads") or []:
                self.rgw.aws("s3api", "abort-multipart-upload", "--bucket",
                             self.bucket, "--key", u["Key"], "--upload-id",
                             u["UploadId"], check=False)
        self.rgw.curl("/%s" % self.bucket, "-X", "DELETE", "-o", "/dev/null")


@pytest.fixture
def rgw_dests(tool, faultproxy):
    """make(): an RgwDest behind the fault proxy, emptied afterwards."""
    made = []

    def make():
        made.append(RgwDest(faultproxy.rgw, faultproxy))
        return made[-1]
    yield make
    for d in made:
        d.empty(tool("stager"))


@pytest.fixture
def file_env(tool, stager_dir):  # noqa: F811
    s = Stager(tool("stager"), stager_dir, cache_size="8G").start()
    yield s, FileDest(stager_dir / "dest")
    s.stop()


def test_file_tree_pushed_verified_and_mounted(file_env, tool, stager_dir):  # noqa: F811,E501
    s, dest = file_env
    src = stager_dir / "src"
    files = special_tree(src, LARGE_MB, N_SMALL, non_utf8=True)
    p = push(s, str(src), dest.url, "--name", "ds", "--stage", "--verify",
             "--json")
    assert p.returncode == 0, text(p)
    res = json.loads(p.stdout)
    assert res["uploaded"] == len(files) and res["skipped"] == 0, res
    assert res["sums_written"] and res["registered"] == "added"
    assert res["stage_exit"] == 0 and res["verify_exit"] == 0
    assert res["bad_names"] == [] and res["changed"] == []
    assert dest.get(b"SHA256SUMS") == sums_of(files)
    for k, v in files.items():
        assert dest.get(k) == v, k
    # the journal: 0600 in a 0700 directory
    j = Path(res["journal"])
    assert stat.S_IMODE(j.stat().st_mode) == 0o600
    assert stat.S_IMODE(j.parent.stat().st_mode) == 0o700
    show = s.json("show", "ds")
    assert show["files"] == len(files) + 1  # and SHA256SUMS
    m = mount(s, tool)
    try:
        check_mount(m, "ds", files)
    finally:
        m.cleanup()
    # A re-run uploads nothing, rewrites nothing, registers nothing.
    before = os.stat(os.path.join(bytes(dest.root), b"SHA256SUMS"))
    p = push(s, str(src), dest.url, "--name", "ds", "--json")
    assert p.returncode == 0, text(p)
    res = json.loads(p.stdout)
    assert res["uploaded"] == 0 and res["skipped"] == len(files), res
    assert res["registered"] == "unchanged" and not res["sums_written"]
    after = os.stat(os.path.join(bytes(dest.root), b"SHA256SUMS"))
    assert before.st_ino == after.st_ino
    assert before.st_mtime_ns == after.st_mtime_ns


def test_rgw_tree_with_faults_verified_and_mounted(tool, stager_dir,  # noqa: F811,E501
                                                   faultproxy, rgw_dests):
    dest = rgw_dests()
    src = stager_dir / "src"
    files = special_tree(src, LARGE_MB, N_SMALL)
    s = Stager(tool("stager"), stager_dir, env=dest.env,
               cache_size="8G").start()
    try:
        faultproxy.add_fault("503", count=3, match="PUT")
        faultproxy.add_fault("reset_request", count=2, match="PUT", skip=5)
        if LARGE_MB >= 64:  # multipart (s3.multipart_threshold): fail
            # the completion of one upload (POST ?uploadId=)
            faultproxy.add_fault("500", count=1, match="POST", skip=1)
        p = push(s, str(src), dest.url, "--name", "ds", "--stage",
                 "--verify", "--parallel", "8")
        assert p.returncode == 0, text(p)
        assert not faultproxy.pending_faults()
        out = text(p)
        assert "pushed ds: %d uploaded" % len(files) in out, out
        assert "all match" in out, out
        assert dest.get(b"SHA256SUMS") == sums_of(files)
        for k in (b"a/b/c/deep.txt", "ünï/cødé €.txt".encode(),
                  b"sp ace+plus&amp=%25 #hash?q.bin", b"back\\slash.txt",
                  b"empty0", b"mid/4MiB-plus.bin"):
            assert dest.get(k.decode()) == files[k], k
        m = mount(s, tool)
        try:
            check_mount(m, "ds", files)
        finally:
            m.cleanup()
        # nothing PUT again by a re-run; no object read back either: the
        # listing (a page per 1000 keys) and SHA256SUMS, compared, and
        # one list of the open multipart uploads
        faultproxy.reset_stats()
        p = push(s, str(src), dest.url, "--name", "ds")
        assert p.returncode == 0, text(p)
        gets = [r for r in faultproxy.requests() if r["method"] == "GET"]
        assert len([r for r in gets if "uploads" in r["query"]]) == 1, \
            faultproxy.counts()
        gets = [r for r in gets if "uploads" not in r["query"]]
        assert faultproxy.count("PUT") == 0, faultproxy.counts()
        assert len([r for r in gets if "SHA256SUMS" not in r["path"]]) == \
            1 + len(files) // 1000, faultproxy.counts()
        assert faultproxy.count("GET", path="SHA256SUMS") == 1
        # a name that is not UTF-8 cannot be an S3 key: refused, named
        (src / "x").mkdir()
        os.makedirs(os.path.join(bytes(src), b"x/caf\xff"))
        with open(os.path.join(bytes(src), b"x/caf\xff/a.bin"), "wb") as f:
            f.write(b"a")
        p = push(s, str(src), dest.url, "--name", "ds", "--new-version")
        assert p.returncode == 1, text(p)
        assert "BAD NAME x/caf\\xff/a.bin: not UTF-8" in text(p)
    finally:
        s.stop()


def test_kill9_then_rerun_puts_each_file_once(tool, stager_dir, faultproxy,  # noqa: F811,E501
                                              rgw_dests):
    dest = rgw_dests()
    src = stager_dir / "src"
    files = {}
    for i in range(400):
        files[b"d%d/f%04d.bin" % (i % 7, i)] = data(5000 + i, 48 * 1024)
    for k, v in files.items():
        p = src / k.decode()
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(v)
    s = Stager(tool("stager"), stager_dir, env=dest.env).start()
    try:
        proc = subprocess.Popen(
            [s.exe, "--config", str(s.cfg), "push", str(src), dest.url,
             "--name", "k9", "--parallel", "4", "--bandwidth", "2M"],
            env=s.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.time() + 60
        while time.time() < end and faultproxy.count("PUT") < 120:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert 120 <= faultproxy.count("PUT") < len(files)
        p = push(s, str(src), dest.url, "--name", "k9", "--verify")
        assert p.returncode == 0, text(p)
        assert "verify k9: done" in text(p), text(p)
    finally:
        s.stop()
    puts = {}
    for r in faultproxy.requests():
        if r["method"] == "PUT":
            puts[r["path"]] = puts.get(r["path"], 0) + 1
    data_puts = {k: n for k, n in puts.items() if "SHA256SUMS" not in k}
    assert len(data_puts) == len(files)
    twice = [k for k, n in data_puts.items() if n > 1]
    # at most the files in flight at the kill (4 workers)
    assert len(twice) <= 4, twice
    assert dest.get(b"SHA256SUMS") == sums_of(files)


def test_file_changed_during_upload_reported(tool, stager_dir, faultproxy,  # noqa: F811,E501
                                             rgw_dests):
    dest = rgw_dests()
    src = stager_dir / "src"
    src.mkdir()
    (src / "steady.bin").write_bytes(data(1, 300000))
    grow = src / "grow.bin"
    grow.write_bytes(data(2, 1 * MiB))
    s = Stager(tool("stager"), stager_dir, env=dest.env).start()
    try:
        # hold the answer to grow.bin's PUT; write the file meanwhile
        faultproxy.add_fault("stall", count=1, match="PUT",
                             path="grow.bin", seconds=3)
        proc = subprocess.Popen(
            [s.exe, "--config", str(s.cfg), "push", str(src), dest.url,
             "--name", "ch"], env=s.env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        end = time.time() + 30
        while time.time() < end and not faultproxy.count("PUT",
                                                         path="grow.bin"):
            time.sleep(0.05)
        time.sleep(0.5)
        with open(grow, "ab") as f:
            f.write(b"more bytes")
        out, err = proc.communicate(timeout=120)
        msg = (out + err).decode(errors="replace")
        assert proc.returncode == 1, msg
        assert "CHANGED grow.bin: changed while it was uploaded" in msg, msg
        assert "SHA256SUMS not written" in msg, msg
        assert dest.get("grow.bin") is None  # not published under its key
        assert dest.get("SHA256SUMS") is None
        assert dest.get("steady.bin") == data(1, 300000)
        assert s.run("show", "ch").returncode == 5  # not registered
        # the next run pushes what the file holds now, steady.bin skipped
        faultproxy.reset_stats()
        p = push(s, str(src), dest.url, "--name", "ch", "--verify")
        assert p.returncode == 0, text(p)
        assert dest.get("grow.bin") == grow.read_bytes()
        assert faultproxy.count("PUT", path="steady.bin") == 0
    finally:
        s.stop()


def test_dry_run_delete_and_new_version(file_env, stager_dir):  # noqa: F811
    s, dest = file_env
    src = stager_dir / "src"
    files = special_tree(src)
    p = push(s, str(src), dest.url, "--name", "dv")
    assert p.returncode == 0, text(p)
    assert s.json("show", "dv")["version"] == 1
    dest.put(b"old/gone.bin", b"stale")
    dest.put(b"keep/x.log", b"excluded: kept")
    (src / "a/b/c/deep.txt").write_bytes(b"deeper\n")
    files[b"a/b/c/deep.txt"] = b"deeper\n"

    # a registered dataset's objects are not changed without --new-version
    p = push(s, str(src), dest.url, "--name", "dv", "--delete",
             "--exclude", "*.log")
    assert p.returncode == 1, text(p)
    assert "--new-version" in text(p) and "registered dataset dv" in text(p)
    assert dest.get(b"a/b/c/deep.txt") == b"deep\n"
    assert dest.get(b"old/gone.bin") == b"stale"

    p = push(s, str(src), dest.url, "--name", "dv", "--delete",
             "--exclude", "*.log", "--dry-run")
    assert p.returncode == 0, text(p)
    out = text(p)
    assert "would upload a/b/c/deep.txt" in out, out
    assert "would delete old/gone.bin" in out, out
    assert "keep/x.log" not in out and "would upload empty0" not in out, out
    assert dest.get(b"old/gone.bin") == b"stale"  # nothing changed
    assert dest.get(b"a/b/c/deep.txt") == b"deep\n"

    p = push(s, str(src), dest.url, "--name", "dv", "--delete",
             "--exclude", "*.log", "--new-version", "--verify")
    assert p.returncode == 0, text(p)
    assert "deleted old/gone.bin" in text(p)
    assert dest.get(b"old/gone.bin") is None
    assert dest.get(b"keep/x.log") == b"excluded: kept"
    assert dest.get(b"a/b/c/deep.txt") == b"deeper\n"
    assert dest.get(b"SHA256SUMS") == sums_of(files)
    assert s.json("show", "dv")["version"] == 2
    # another name for the same URL is refused
    p = push(s, str(src), dest.url, "--name", "other")
    assert p.returncode == 1 and "already registered as dataset dv" in \
        text(p), text(p)
    # so is a push into the registered dataset's prefix, under any name
    p = push(s, str(src), dest.url + "sub/", "--name", "sub", "--json")
    assert p.returncode == 1, text(p)
    err = json.loads(p.stdout)["error"]
    assert err["exit"] == 1, err
    assert "overlaps the source of the registered dataset dv" in \
        err["message"], err
    assert not (dest.root / "sub").exists()  # a refused push leaves no trace


def write_safetensors(path, tensors):
    """A minimal safetensors file: 8-byte header length, JSON header,
    data. tensors: {name: (dtype, shape, bytes)}."""
    header, blob = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + blob)


def read_safetensors(path):
    """{name: bytes} read from path: with safetensors when installed, else
    by the format (the header, then each tensor's byte range)."""
    try:
        from safetensors.numpy import load_file
        return {k: v.tobytes() for k, v in load_file(str(path)).items()}
    except ImportError:
        pass
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            f.seek(base + a)
            out[name] = f.read(b - a)
    return out


def test_safetensors_pushed_staged_loaded_through_mount(file_env, tool,  # noqa: F811,E501
                                                        stager_dir):
    s, dest = file_env
    src = stager_dir / "model"
    src.mkdir()
    shards = {}
    for i in range(3):
        t = {"layer%d.weight" % j: ("F32", [256, 64],
                                    data(100 * i + j, 256 * 64 * 4))
             for j in range(4)}
        write_safetensors(src / ("model-%05d-of-00003.safetensors" % (i + 1)),
                          t)
        shards["model-%05d-of-00003.safetensors" % (i + 1)] = t
    (src / "config.json").write_text('{"layers": 12}')
    # into a directory that does not exist yet: push makes it
    p = push(s, str(src), dest.url + "models/m1/", "--stage")
    assert p.returncode == 0, text(p)
    assert (dest.root / "models/m1/SHA256SUMS").is_file()
    show = s.json("show", "model")  # the directory's name
    assert show["cached"] == show["bytes"]
    m = mount(s, tool)
    try:
        for name, t in shards.items():
            got = read_safetensors(m.mnt / "datasets/model" / name)
            assert got == {k: v[2] for k, v in t.items()}, name
    finally:
        m.cleanup()


def test_kill9_mid_multipart_leaves_no_open_upload(tool, stager_dir,  # noqa: F811,E501
                                                   faultproxy, rgw_dests):
    dest = rgw_dests()
    src = stager_dir / "src"
    src.mkdir()
    big = os.urandom(80 * MiB)  # over s3.multipart_threshold (64M)
    (src / "big.bin").write_bytes(big)
    s = Stager(tool("stager"), stager_dir, env=dest.env).start()
    try:
        # hold a part's answer, and kill the push meanwhile
        faultproxy.add_fault("stall", count=1, match="PUT", path="big.bin",
                             skip=1, seconds=20)
        proc = subprocess.Popen(
            [s.exe, "--config", str(s.cfg), "push", str(src), dest.url,
             "--name", "mp"], env=s.env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        end = time.time() + 30
        while time.time() < end and not any(
                f["hits"] for f in [faultproxy.faults[0].as_dict()]):
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        faultproxy.clear_faults()

        def open_uploads():
            p = faultproxy.rgw.aws("s3api", "list-multipart-uploads",
                                   "--bucket", dest.bucket, "--prefix",
                                   dest.prefix + "/")
            return json.loads(p.stdout or b"{}").get("Uploads") or []
        left = open_uploads()
        assert [u["Key"] for u in left] == [dest.prefix + "/big.bin"], left
        p = push(s, str(src), dest.url, "--name", "mp", "--verify", "--json")
        assert p.returncode == 0, text(p)
        res = json.loads(p.stdout)
        assert [a["key"] for a in res["aborted_uploads"]] == ["big.bin"], res
        assert res["aborted_uploads_count"] == 1, res
        assert dest.get("big.bin") == big
        assert open_uploads() == []
    finally:
        s.stop()


def test_leftover_temporary_files_aborted_by_rule(file_env, stager_dir):  # noqa: F811,E501
    """file://: a put's temporary file in a directory of this push's keys
    is a leftover (removed, reported); one elsewhere is kept unless older
    than 24 hours (PUSH_STALE_UPLOAD_S)."""
    s, dest = file_env
    src = stager_dir / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"f")
    ours = dest.root / "d" / ".dstage-tmp.00000000000000a1"
    fresh = dest.root / "other" / ".dstage-tmp.00000000000000b2"
    stale = dest.root / "old" / ".dstage-tmp.00000000000000c3"
    for t in (ours, fresh, stale):
        t.parent.mkdir(parents=True, exist_ok=True)
        t.write_bytes(b"part")
    old = time.time() - 25 * 3600
    os.utime(stale, (old, old))
    p = push(s, str(src), dest.url, "--name", "tmpl", "--json")
    assert p.returncode == 0, text(p)
    res = json.loads(p.stdout)
    got = sorted(a["key"] for a in res["aborted_uploads"])
    assert got == ["d/" + ours.name, "old/" + stale.name], res
    assert not ours.exists() and not stale.exists()
    assert fresh.exists()
    assert dest.get(b"d/f") == b"f"


def read_pty(master, timeout=60):
    import select
    out = b""
    end = time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([master], [], [], 5)
        if not r:
            continue
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out


def test_progress_bar_on_pty_and_bandwidth_cap(file_env, stager_dir):  # noqa: F811,E501
    import pty
    s, dest = file_env
    src = stager_dir / "src"
    src.mkdir()
    for i in range(8):
        (src / ("f%d.bin" % i)).write_bytes(data(300 + i, 2 * MiB))
    total, rate = 16 * MiB, 4 * MiB
    master, slave = pty.openpty()
    t0 = time.monotonic()
    p = subprocess.Popen([s.exe, "--config", str(s.cfg), "push", str(src),
                          dest.url, "--bandwidth", "4M", "--parallel", "4"],
                         stdout=slave, stderr=slave, env=s.env)
    os.close(slave)
    out = read_pty(master)
    rc = p.wait(timeout=30)
    elapsed = time.monotonic() - t0
    os.close(master)
    text_ = out.decode(errors="replace")
    assert rc == 0, text_
    assert "\r" in text_ and "push [" in text_ and "#" in text_, text_
    assert "ETA" in text_ and "8/8 files" in text_, text_
    # the cap: the first file is free, the other 14 MiB take 3.5 s
    assert (total - 2 * MiB) / elapsed <= rate * 1.1, (total, elapsed)
    assert elapsed < 20


def test_sigint_stops_then_rerun_resumes(file_env, stager_dir):  # noqa: F811
    s, dest = file_env
    src = stager_dir / "src"
    src.mkdir()
    files = {("f%d.bin" % i).encode(): data(400 + i, MiB) for i in range(10)}
    for k, v in files.items():
        (src / k.decode()).write_bytes(v)
    p = subprocess.Popen([s.exe, "--config", str(s.cfg), "push", str(src),
                          dest.url, "--name", "si", "--bandwidth", "1M",
                          "--parallel", "1"], env=s.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(2.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    msg = (out + err).decode(errors="replace")
    assert p.returncode == 1, msg
    assert "stopped; run it again to resume" in msg, msg
    assert dest.get(b"SHA256SUMS") is None
    assert s.run("show", "si").returncode == 5
    stored = [k for k in files if dest.get(k) is not None]
    assert 1 <= len(stored) < len(files), stored
    p = push(s, str(src), dest.url, "--name", "si", "--json")
    assert p.returncode == 0, text(p)
    res = json.loads(p.stdout)
    assert res["skipped"] == len(stored), (res, stored)
    assert res["uploaded"] == len(files) - len(stored)
    assert dest.get(b"SHA256SUMS") == sums_of(files)


def test_bad_names_links_and_fifos(file_env, stager_dir):  # noqa: F811
    s, dest = file_env
    src = stager_dir / "src"
    (src / "ok").mkdir(parents=True)
    (src / "ok/a.txt").write_bytes(b"a")
    deep = src
    for i in range(5):  # 5 x 250 bytes: past the 1,024-byte key limit
        deep = deep / (("%d" % i) * 250)
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"too long a key")
    with open(os.path.join(bytes(src), b"new\nline.txt"), "wb") as f:
        f.write(b"control byte in the name")
    outside = stager_dir / "outside.txt"
    outside.write_bytes(b"secret")
    os.symlink(outside, src / "link.txt")
    os.mkfifo(src / "fifo")
    p = push(s, str(src), dest.url, "--name", "bad", "--json")
    assert p.returncode == 1, text(p)
    res = json.loads(p.stdout)
    bad = {r["key"]: r["reason"] for r in res["bad_names"]}
    assert any("1,024" in r or "longer" in r for r in bad.values()), bad
    assert "new\\x0aline.txt" in bad, bad
    ignored = {r["key"] for r in res["ignored"]}
    assert ignored == {"link.txt", "fifo"}, res["ignored"]
    assert dest.get(b"ok/a.txt") == b"a"
    assert dest.get(b"link.txt") is None  # never followed
    assert dest.get(b"SHA256SUMS") is None and not res["sums_written"]
    assert s.run("show", "bad").returncode == 5


@pytest.mark.parametrize("large", [False, True], ids=["put", "part"])
def test_etag_other_than_md5_sent_is_an_error(tool, stager_dir,  # noqa: F811
                                              faultproxy, rgw_dests, large):
    """The store answers a PUT (or one part of a multipart upload) with an
    ETag that is not the MD5 of the body sent (the fault proxy changes the
    answer's ETag header; the bytes stored are intact): push reports the
    key as failed, publishes nothing under it, writes no SHA256SUMS and
    leaves no upload open; a second push without the fault finishes."""
    dest = rgw_dests()
    src = stager_dir / "src"
    src.mkdir()
    body = os.urandom(12 * MiB if large else 100 * 1024)
    (src / "odd.bin").write_bytes(body)
    (src / "fine.txt").write_bytes(b"fine\n")
    s = Stager(tool("stager"), stager_dir, env=dest.env)
    with open(s.cfg, "a") as f:  # 12 MiB: three parts of 5 MiB
        f.write("[s3]\nmultipart_threshold = 5M\npart_size = 5M\n")
    s.start()
    try:
        faultproxy.add_fault("etag", count=1, match="PUT", path="odd.bin",
                             skip=1 if large else 0)
        p = push(s, str(src), dest.url, "--name", "et")
        out = text(p)
        assert p.returncode == 1, out
        assert "odd.bin" in out and "ETag" in out, out
        assert not faultproxy.pending_faults()
        assert dest.get("odd.bin") is None
        assert dest.get("SHA256SUMS") is None
        up = faultproxy.rgw.aws("s3api", "list-multipart-uploads",
                                "--bucket", dest.bucket, "--prefix",
                                dest.prefix + "/")
        assert not json.loads(up.stdout or b"{}").get("Uploads"), up.stdout
        p = push(s, str(src), dest.url, "--name", "et", "--verify")
        assert p.returncode == 0, text(p)
        assert dest.get("odd.bin") == body
    finally:
        s.stop()


def test_budget_spent_readers_send_their_own_parts(tool, stager_dir,  # noqa: F811,E501
                                                   rgw_dests):
    """s3.max_inflight 1: one sender for the whole push. Of three large
    files pushed at once (--parallel 3) two start with no sender at all:
    their readers send their own parts, or take the sender when the first
    file gives it back. Every file arrives whole, in parts, with its
    SHA-256; nothing waits for a sender that never comes."""
    dest = rgw_dests()
    src = stager_dir / "src"
    src.mkdir()
    bodies = {"l%d.bin" % i: os.urandom(11 * MiB + i) for i in range(3)}
    for k, v in bodies.items():
        (src / k).write_bytes(v)
    s = Stager(tool("stager"), stager_dir, env=dest.env)
    with open(s.cfg, "a") as f:  # 3 parts of 5 MiB each, one sender
        f.write("[s3]\nmultipart_threshold = 5M\npart_size = 5M\n"
                "max_inflight = 1\n")
    s.start()
    try:
        p = push(s, str(src), dest.url, "--name", "bs", "--parallel", "3",
                 "--verify", timeout=60)
        assert p.returncode == 0, text(p)
        assert "verify bs: done: 4 files" in text(p), text(p)
        sums = dest.get("SHA256SUMS").decode()
        for k, v in bodies.items():
            assert "%s  %s\n" % (hashlib.sha256(v).hexdigest(), k) in sums
            assert dest.get(k) == v, k
            h = dest.rgw.curl("/%s/%s/%s" % (dest.bucket, dest.prefix, k),
                              "-I").stdout.decode()
            assert '-3"' in h, h                  # the ETag of 3 parts
    finally:
        s.stop()
