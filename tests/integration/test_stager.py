"""Integration tests of the stager (stager/, lib/catalog/jobs.c, lib/format/proto.c): a real
daemon on a Unix socket, file:// and radosgw sources, the real block cache.

Covered: add/stage/verify with a correct SHA256SUMS (exit 0); a corrupted
source object (non-zero exit, the key named); --repair after the cache held
bad bytes and after flipping cache bytes; a mutation from a non-admin uid
refused while reads are allowed; the progress bar on a pty and a bandwidth
cap; --json parsed; kill -9 of the daemon mid-stage against radosgw behind
a counting proxy: the job completes and no block is fetched twice (beyond
the blocks in flight at the kill). add --manifest KEY, on file:// and on
radosgw: hashes from another key (verify passes; a source object corrupted
and refreshed fails verify naming it and the key; a bad line is logged with
key:line), a missing key fails add and refresh naming it and the URL, bad
keys refused naming them, refresh keeps the key, show/list --json report
it."""
import contextlib
import hashlib
import json
import os
import pty
import pwd
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

MiB = 1 << 20


class Stager:
    """A daemon with its own config, catalog, cache and socket."""

    def __init__(self, exe, root, env=None, cache_size="1G", sock=None,
                 args=(), prefix=(), admin_group="dstage-test"):
        self.exe, self.root = exe, Path(root)
        self.env = dict(env or os.environ)
        self.env.pop("DSTAGE_CONFIG", None)
        self.cfg = self.root / "dstage.conf"
        self.sock = Path(sock) if sock else self.root / "stager.sock"
        self.args, self.prefix = list(args), list(prefix)
        self.cfg.write_text(
            "[cache]\ndir = %s/cache\nsize = %s\n"
            "[catalog]\npath = %s/catalog.db\n"
            "[daemon]\nsocket = %s\nadmin_group = %s\n"
            % (self.root, cache_size, self.root, self.sock, admin_group))
        os.chmod(self.cfg, 0o644)
        self.proc = None
        self.log = self.root / "daemon.log"

    def start(self):
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.prefix + [self.exe, "--config", str(self.cfg), "daemon"] +
            self.args, env=self.env, stdout=logf, stderr=logf)
        logf.close()
        for _ in range(200):
            if self.sock.exists() and self.run("list").returncode == 0:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError("daemon did not start: " + self.log.read_text())

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            rc = self.proc.wait(timeout=30)
            # a clean stop exits 0 (under ASan: with no leak either)
            assert sig != signal.SIGTERM or rc == 0, \
                "daemon exit %d:\n%s" % (rc, self.log.read_text()[-3000:])
        self.proc = None

    def run(self, *args, check=False, timeout=120, prefix=()):
        p = subprocess.run(list(prefix) + [self.exe, "--config",
                                           str(self.cfg)] + list(args),
                           env=self.env, capture_output=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError("stager %s: rc %d\n%s\n%s" % (
                args, p.returncode, p.stdout.decode(errors="replace"),
                p.stderr.decode(errors="replace")))
        return p

    def json(self, *args):
        p = self.run(*args, "--json", check=True)
        return json.loads(p.stdout)


@pytest.fixture
def stager_dir():
    # world-traversable: the non-admin test reaches the socket as another uid
    d = tempfile.mkdtemp(prefix="stager-test-")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemon(tool, stager_dir):
    s = Stager(tool("stager"), stager_dir).start()
    yield s
    s.stop()


def make_dataset(root, files, sums=None):
    """files: {key: bytes}; sums: {key: bytes used for the hash} or None to
    hash the files' own bytes."""
    root.mkdir(parents=True, exist_ok=True)
    for k, v in files.items():
        p = root / k
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(v)
    src = sums if sums is not None else files
    lines = ["%s  %s\n" % (hashlib.sha256(v).hexdigest(), k)
             for k, v in sorted(src.items())]
    (root / "SHA256SUMS").write_text("".join(lines))


def data(seed, n):
    return (hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]


def test_add_stage_verify_ok_and_json(daemon, stager_dir):
    files = {"a.bin": data(1, 3 * MiB + 5), "dir/b.bin": data(2, 100000),
             "dir/sub/c.txt": b"hello\n", "empty": b""}
    make_dataset(stager_dir / "src", files)
    p = daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    assert b"added ds" in p.stdout
    ls = daemon.json("list")
    assert [d["name"] for d in ls] == ["ds"]
    assert ls[0]["files"] == 5 and ls[0]["state"] == "ready"
    assert ls[0]["manifest_key"] == "SHA256SUMS"

    p = daemon.run("stage", "ds", "--wait", "--json", check=True)
    res = json.loads(p.stdout)
    assert res["job"]["state"] == "done" and res["mismatches"] == []
    assert res["job"]["total"] == sum(len(v) for v in files.values()) + \
        (stager_dir / "src" / "SHA256SUMS").stat().st_size

    show = daemon.json("show", "ds")
    assert show["cached"] == show["bytes"]
    assert show["verified_files"] == 5 and show["mismatched_files"] == 0

    for mode in ("--cache", "--source"):
        p = daemon.run("verify", "ds", mode)
        assert p.returncode == 0, p.stderr
        assert b"all match" in p.stdout
    show = daemon.json("show", "ds")
    assert show["last_verify"] == "done"

    jobs = daemon.json("jobs")
    assert {j["kind"] for j in jobs} == {"stage", "verify"}
    assert all(j["state"] == "done" for j in jobs)
    st = daemon.json("status", str(jobs[0]["job"]))
    assert st["job"] == jobs[0]["job"]

    # errors: unknown dataset, unknown job, bad usage
    assert daemon.run("show", "nope").returncode == 5
    assert daemon.run("status", "999").returncode == 5
    assert daemon.run("stage").returncode == 2
    assert daemon.run("verify", "ds", "--source", "--repair").returncode == 2


def test_corrupted_source_named(daemon, stager_dir):
    good = {"ok.bin": data(3, 200000), "bad.bin": data(4, 300000)}
    corrupt = dict(good)
    corrupt["bad.bin"] = b"X" + good["bad.bin"][1:]
    make_dataset(stager_dir / "src", corrupt, sums=good)
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)

    p = daemon.run("stage", "ds", "--wait")
    assert p.returncode == 1
    assert b"bad.bin" in p.stdout and b"ok.bin" not in p.stdout
    p = daemon.run("verify", "ds", "--source", "--json")
    assert p.returncode == 1
    res = json.loads(p.stdout)
    assert [m["key"] for m in res["mismatches"]] == ["bad.bin"]
    m = res["mismatches"][0]
    assert m["expected"] == hashlib.sha256(good["bad.bin"]).hexdigest()
    assert m["actual"] == hashlib.sha256(corrupt["bad.bin"]).hexdigest()
    assert daemon.json("show", "ds")["mismatched_files"] == 1

    # The source is mended in place, keeping its ETag (size, mtime,
    # inode): the cache still holds the bad bytes until --repair.
    path = stager_dir / "src" / "bad.bin"
    st = path.stat()
    with open(path, "r+b") as f:
        f.write(good["bad.bin"][:1])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    p = daemon.run("verify", "ds", "--cache")
    assert p.returncode == 1 and b"bad.bin" in p.stdout
    p = daemon.run("verify", "ds", "--cache", "--repair")
    assert p.returncode == 0, p.stdout + p.stderr
    p = daemon.run("verify", "ds", "--cache")
    assert p.returncode == 0


def test_repair_after_flipping_cache_bytes(daemon, stager_dir):
    files = {"big.bin": data(5, 6 * MiB)}
    make_dataset(stager_dir / "src", files)
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    daemon.run("stage", "ds", "--wait", check=True)
    objs = [p for p in (stager_dir / "cache").rglob("*")
            if p.is_file() and p.stat().st_size >= 6 * MiB]
    assert len(objs) == 1
    with open(objs[0], "r+b") as f:
        f.seek(MiB + 123)
        b = f.read(1)
        f.seek(MiB + 123)
        f.write(bytes([b[0] ^ 0xff]))
    p = daemon.run("verify", "ds", "--cache", "--repair")
    assert p.returncode == 0, p.stdout + p.stderr
    p = daemon.run("verify", "ds", "--cache")
    assert p.returncode == 0


def test_non_admin_refused(daemon, stager_dir):
    if os.geteuid() != 0 or not shutil.which("useradd") or \
            not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv")
    make_dataset(stager_dir / "src", {"a": b"a"})
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    user = "dstg%d" % (os.getpid() % 100000)
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin",
                    user], check=True, capture_output=True)
    try:
        pw = pwd.getpwnam(user)
        as_user = ["setpriv", "--reuid", str(pw.pw_uid), "--regid",
                   str(pw.pw_gid), "--clear-groups"]
        p = daemon.run("list", prefix=as_user)
        assert p.returncode == 0, p.stderr
        assert b"ds" in p.stdout
        for args in (("stage", "ds"), ("remove", "ds"),
                     ("add", "x", "file:///tmp/"), ("cancel", "1")):
            p = daemon.run(*args, prefix=as_user)
            assert p.returncode == 4, (args, p.stderr)
            assert b"permission denied" in p.stderr
            assert b"dstage-test" in p.stderr
        assert daemon.json("list")[0]["name"] == "ds"
    finally:
        subprocess.run(["userdel", user], capture_output=True)


def test_progress_bar_on_pty_and_bandwidth_cap(daemon, stager_dir):
    files = {"f%d" % i: data(10 + i, 2 * MiB) for i in range(4)}
    make_dataset(stager_dir / "src", files)
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    total = 8 * MiB + (stager_dir / "src" / "SHA256SUMS").stat().st_size
    rate = 4 * MiB
    master, slave = pty.openpty()
    t0 = time.monotonic()
    p = subprocess.Popen([daemon.exe, "--config", str(daemon.cfg), "stage",
                          "ds", "--wait", "--bandwidth", "4M"],
                         stdout=slave, stderr=slave, env=daemon.env)
    os.close(slave)
    out = b""
    while True:
        r, _, _ = select.select([master], [], [], 30)
        if not r:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    rc = p.wait(timeout=30)
    elapsed = time.monotonic() - t0
    os.close(master)
    assert rc == 0, out
    text = out.decode(errors="replace")
    assert "\r" in text and "[" in text and "#" in text
    assert "ETA" in text and "files" in text and "/s" in text
    assert "done" in text
    # the cap: no faster than 4 MiB/s plus 10% (the first chunk is free)
    assert total / elapsed <= rate * 1.1, (total, elapsed)
    assert elapsed < 10


def test_plain_progress_lines_and_cancel(daemon, stager_dir):
    files = {"f%d" % i: data(20 + i, MiB) for i in range(4)}
    make_dataset(stager_dir / "src", files)
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    p = daemon.run("stage", "ds", "--bandwidth", "1M", check=True)
    job = int(p.stdout.split()[1])
    time.sleep(0.5)
    assert daemon.run("cancel", str(job)).returncode == 0
    p = daemon.run("status", str(job), "--wait")
    assert p.returncode == 1 and b"cancelled" in p.stdout
    assert b"\r" not in p.stdout
    assert daemon.run("cancel", str(job)).returncode == 1


def test_too_big_for_the_cache(tool, stager_dir):
    s = Stager(tool("stager"), stager_dir, cache_size="4M").start()
    try:
        files = {"a": data(30, 3 * MiB), "b": data(31, 3 * MiB)}
        make_dataset(stager_dir / "src", files)
        s.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
        p = s.run("stage", "ds")
        assert p.returncode == 1
        assert b"larger than the cache" in p.stderr and b"--fit" in p.stderr
        assert s.json("jobs") == []
        p = s.run("stage", "ds", "--fit", "--wait")
        assert p.returncode == 0, p.stdout + p.stderr
    finally:
        s.stop()


def test_daemon_not_running(tool, stager_dir):
    s = Stager(tool("stager"), stager_dir)
    p = s.run("list")
    assert p.returncode == 3
    assert str(s.sock).encode() in p.stderr and b"not running" in p.stderr


def test_ls_file_url(tool, stager_dir):
    make_dataset(stager_dir / "src", {"x/y": b"12345"})
    s = Stager(tool("stager"), stager_dir)
    rows = json.loads(s.run("ls", "file://%s/src/" % stager_dir, "--json",
                            check=True).stdout)
    assert {r["key"]: r["size"] for r in rows}["x/y"] == 5


def test_kill9_resume_no_refetch(tool, stager_dir, faultproxy):
    rgw = faultproxy.rgw
    bucket = "stager-kill9"
    rgw.make_bucket(bucket)
    files = {"s%d.bin" % i: data(40 + i, 8 * MiB) for i in range(4)}
    sums = "".join("%s  %s\n" % (hashlib.sha256(v).hexdigest(), k)
                   for k, v in sorted(files.items()))
    for k, v in files.items():
        assert rgw.put_object(bucket, "ds/" + k, v) == 200
    assert rgw.put_object(bucket, "ds/SHA256SUMS", sums.encode()) == 200
    s = Stager(tool("stager"), stager_dir, env=faultproxy.env())
    s.start()
    try:
        s.run("add", "ds", "s3://%s/ds/" % bucket, check=True)
        faultproxy.reset_stats()
        p = s.run("stage", "ds", "--bandwidth", "8M", "--parallel", "2",
                  check=True)
        job = int(p.stdout.split()[1])
        for _ in range(100):
            st = s.json("status", str(job))
            if st["done"] >= 12 * MiB:
                break
            time.sleep(0.1)
        assert st["state"] == "running" and st["done"] < st["total"]
        s.stop(signal.SIGKILL)
        s.start()
        p = s.run("status", str(job), "--wait", timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        assert s.json("show", "ds")["cached"] == s.json("show", "ds")["bytes"]
        assert s.run("verify", "ds", "--cache").returncode == 0
    finally:
        s.stop()
    fetched = {}
    for r in faultproxy.requests():
        if r["method"] != "GET" or not r.get("range") or \
                "SHA256SUMS" in r["path"]:
            continue
        a, b = r["range"].split("=")[1].split("-")
        for blk in range(int(a) // (4 * MiB), int(b) // (4 * MiB) + 1):
            key = (r["path"], blk)
            fetched[key] = fetched.get(key, 0) + 1
    assert len(fetched) == 8  # every 4 MiB block of the 4 objects
    refetched = sum(n - 1 for n in fetched.values())
    # at most the blocks in flight at the kill: 2 workers, plus readahead
    assert refetched <= 4, fetched


# ---- add --manifest KEY, on file:// and on radosgw ----

def sums_text(files):
    return "".join("%s  %s\n" % (hashlib.sha256(v).hexdigest(), k)
                   for k, v in sorted(files.items()))


class FileSource:
    """A dataset in a local directory, as file:// URL."""

    def __init__(self, root):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = "file://%s/" % self.root
        self.env = None

    def put(self, key, data):
        p = self.root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    def delete(self, key):
        (self.root / key).unlink()


class RgwSource:
    """A dataset under a fresh prefix of a radosgw bucket, as s3:// URL."""

    def __init__(self, rgw, bucket):
        self.rgw, self.bucket = rgw, rgw.make_bucket(bucket)
        self.prefix = "m-" + uuid.uuid4().hex[:12]
        self.url = "s3://%s/%s/" % (self.bucket, self.prefix)
        self.env = rgw.env()

    def put(self, key, data):
        assert self.rgw.put_object(self.bucket, "%s/%s" % (self.prefix, key),
                                   data) == 200

    def delete(self, key):
        p = self.rgw.curl("/%s/%s/%s" % (self.bucket, self.prefix, key),
                          "-X", "DELETE", "-o", "/dev/null", "-w",
                          "%{http_code}")
        assert p.returncode == 0 and p.stdout.decode() == "204", p


@pytest.fixture(params=["file", "rgw"])
def sourced(request, tool, stager_dir):
    """(daemon, source): a stager daemon that can read the source."""
    if request.param == "file":
        src = FileSource(stager_dir / "src")
    else:
        src = RgwSource(request.getfixturevalue("rgw"), "stager-manifest")
    s = Stager(tool("stager"), stager_dir, env=src.env).start()
    try:
        yield s, src
    finally:
        s.stop()


def test_manifest_key_verify_refresh_show(sourced):
    s, src = sourced
    files = {"a.bin": data(60, 300000), "dir/b.bin": data(61, MiB + 3),
             "c.txt": b"hello\n"}
    for k, v in files.items():
        src.put(k, v)
    lines = sums_text(files).splitlines(keepends=True)
    # line 2 is malformed: logged with key:line and skipped, as in SHA256SUMS
    lines.insert(1, "this is not a sha256sum line\n")
    src.put("meta/sums.txt", "".join(lines).encode())
    # A SHA256SUMS at the root that matches nothing: not read with --manifest
    src.put("SHA256SUMS", sums_text({k: b"wrong" for k in files}).encode())

    p = s.run("add", "ds", src.url, "--manifest", "meta/sums.txt", check=True)
    assert b"added ds" in p.stdout
    show = s.json("show", "ds")
    assert show["manifest_key"] == "meta/sums.txt"
    assert show["expected_files"] == 3
    # the sums file stays in the manifest as a file, as SHA256SUMS does
    assert show["files"] == 5
    assert s.json("list")[0]["manifest_key"] == "meta/sums.txt"
    p = s.run("show", "ds", check=True)
    assert b"manifest:   meta/sums.txt" in p.stdout
    assert b"3 listed in meta/sums.txt" in p.stdout
    log = s.log.read_text(errors="replace")
    assert "meta/sums.txt:2: " in log, log

    p = s.run("verify", "ds", "--source")
    assert p.returncode == 0, p.stdout + p.stderr
    # the two sums files are not listed in meta/sums.txt: hashes recorded
    assert b"done: 5 files; 2 had no reference hash (no entry in " \
        b"meta/sums.txt" in p.stdout

    # Corrupt one object at the source (same size), refresh: the hashes
    # still come from meta/sums.txt, so verify names the object and the key.
    good = files["dir/b.bin"]
    bad = b"X" + good[1:]
    src.put("dir/b.bin", bad)
    r = s.json("refresh", "ds")
    assert r["version"] == 2 and r["manifest_key"] == "meta/sums.txt"
    assert s.json("show", "ds")["expected_files"] == 3
    p = s.run("verify", "ds", "--source", "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    res = json.loads(p.stdout)
    assert [m["key"] for m in res["mismatches"]] == ["dir/b.bin"]
    m = res["mismatches"][0]
    assert m["expected"] == hashlib.sha256(good).hexdigest()
    assert m["actual"] == hashlib.sha256(bad).hexdigest()
    assert "dir/b.bin" in res["job"]["error"]
    assert "meta/sums.txt" in res["job"]["error"]
    # never staged: --cache alone would report the blocks as missing
    p = s.run("verify", "ds", "--cache", "--fetch-missing")
    assert p.returncode == 1
    assert b"dir/b.bin" in p.stdout and b"meta/sums.txt" in p.stdout
    assert b"a.bin" not in p.stdout

    # Mended at the source and refreshed again: all match.
    src.put("dir/b.bin", good)
    assert s.json("refresh", "ds")["manifest_key"] == "meta/sums.txt"
    p = s.run("verify", "ds", "--source")
    assert p.returncode == 0, p.stdout + p.stderr


def test_manifest_key_missing(sourced):
    s, src = sourced
    src.put("a", b"a")
    src.put("meta/sums.txt", sums_text({"a": b"a"}).encode())
    p = s.run("add", "ds", src.url, "--manifest", "missing.txt")
    assert p.returncode == 1, p.stdout + p.stderr
    err = p.stderr.decode()
    assert "missing.txt" in err and src.url in err, err
    assert s.json("list") == []  # removed again

    # SHA256SUMS, the default, is optional: there is none here.
    s.run("add", "plain", src.url, check=True)
    assert s.json("show", "plain")["manifest_key"] == "SHA256SUMS"
    assert s.json("show", "plain")["expected_files"] == 0

    # A key that disappears later: refresh fails the same way, the
    # manifest and the key stay.
    s.run("add", "ds", src.url, "--manifest", "meta/sums.txt", check=True)
    assert s.json("show", "ds")["expected_files"] == 1
    src.delete("meta/sums.txt")
    p = s.run("refresh", "ds")
    assert p.returncode == 1, p.stdout + p.stderr
    err = p.stderr.decode()
    assert "meta/sums.txt" in err and src.url in err, err
    show = s.json("show", "ds")
    assert show["version"] == 1 and show["manifest_key"] == "meta/sums.txt"
    assert show["expected_files"] == 1


def test_manifest_key_refused(sourced):
    s, src = sourced
    src.put("a", b"a")
    for key, shown in [("../x", "../x"), ("a/../x", "a/../x"),
                       ("/abs/sums", "/abs/sums"), ("a//b", "a//b"),
                       ("meta/", "meta/"), ("", "''"), (".", "'.'"),
                       ("a\nb", "a\\x0ab"), ("s" * 256, "s" * 256)]:
        p = s.run("add", "ds", src.url, "--manifest", key)
        assert p.returncode == 2, (key, p.stdout + p.stderr)
        err = p.stderr.decode()
        assert "--manifest" in err and shown in err, (key, err)
    assert s.json("list") == []


def test_sums_ok_and_corrupt_object_on_each_source(sourced):
    """The core contract on file:// and on radosgw alike: a dataset whose
    SHA256SUMS matches stages and verifies with exit 0; one whose object was
    corrupted at the source fails both, naming that key and both hashes."""
    s, src = sourced
    good = {"a.bin": data(70, 5 * MiB + 17), "d/b.bin": data(71, 200000),
            "d/e/c.txt": b"hello\n", "empty": b""}
    for k, v in good.items():
        src.put("good/" + k, v)
        src.put("bad/" + k, v if k != "d/b.bin" else b"Y" + v[1:])
    src.put("good/SHA256SUMS", sums_text(good).encode())
    src.put("bad/SHA256SUMS", sums_text(good).encode())
    s.run("add", "good", src.url + "good/", check=True)
    s.run("add", "bad", src.url + "bad/", check=True)

    res = json.loads(s.run("stage", "good", "--wait", "--json",
                           check=True).stdout)
    assert res["job"]["state"] == "done" and res["mismatches"] == []
    for mode in ("--cache", "--source"):
        p = s.run("verify", "good", mode)
        assert p.returncode == 0, p.stdout + p.stderr
        assert b"all match" in p.stdout

    p = s.run("stage", "bad", "--wait")
    assert p.returncode == 1
    assert b"d/b.bin" in p.stdout and b"a.bin" not in p.stdout
    for mode in ("--cache", "--source"):
        p = s.run("verify", "bad", mode, "--json")
        assert p.returncode == 1, p.stdout + p.stderr
        mm = json.loads(p.stdout)["mismatches"]
        assert [m["key"] for m in mm] == ["d/b.bin"]
        assert mm[0]["expected"] == hashlib.sha256(good["d/b.bin"]).hexdigest()
        assert mm[0]["actual"] == hashlib.sha256(
            b"Y" + good["d/b.bin"][1:]).hexdigest()
    assert s.json("show", "bad")["mismatched_files"] == 1
    assert s.json("show", "good")["mismatched_files"] == 0


def test_json_non_utf8_key(daemon, stager_dir):
    """A key with byte 0xff (not UTF-8) from a file:// dataset: every
    --json output parses, and the key comes back exactly from key_hex
    (docs/stager.md, the non-UTF-8 policy)."""
    bad = b"caf\xff/\xc3(x.bin"  # 0xff, and an invalid 2-byte sequence
    src = stager_dir / "src"
    (src / "ok").mkdir(parents=True)
    bdir = os.path.join(os.fsencode(src), b"caf\xff")
    os.mkdir(bdir)
    with open(os.path.join(os.fsencode(src), bad), "wb") as f:
        f.write(b"payload")
    (src / "ok" / "a.txt").write_bytes(b"fine")
    # a wrong expected hash for the bad key, so verify names it
    with open(src / "SHA256SUMS", "wb") as f:
        f.write(b"%s  %s\n" % (b"0" * 64, bad))

    def key_of(o, field="key"):
        if o.get(field + "_utf8", True):
            return o[field].encode()
        assert "\ufffd" in o[field]
        return bytes.fromhex(o[field + "_hex"])

    p = daemon.run("ls", "file://%s/" % src, "--json", check=True)
    rows = json.loads(p.stdout)
    assert sorted(key_of(r) for r in rows) == sorted(
        [bad, b"ok/a.txt", b"SHA256SUMS"])
    assert [r for r in rows if r["key"] == "ok/a.txt"][0].get(
        "key_utf8", True) is True

    daemon.run("add", "ds", "file://%s/" % src, check=True)
    p = daemon.run("verify", "ds", "--source", "--json")
    assert p.returncode == 1, p.stderr
    res = json.loads(p.stdout)
    assert [key_of(m) for m in res["mismatches"]] == [bad]

    lst = stager_dir / "files.lst"
    lst.write_bytes(bad + b"\n")
    p = daemon.run("stage", "ds", "--files", "@%s" % lst, "--json",
                   check=True)
    job = json.loads(p.stdout)["job"]
    jobs = daemon.json("jobs")
    mine = [j for j in jobs if j["job"] == job][0]
    assert mine["args_utf8"] is False
    assert b"files=" + bad.replace(b"\\", b"\\\\") in bytes.fromhex(
        mine["args_hex"])


# ---- security (issue 12): a second uid outside the admin group ----------

FLOOD = r'''
import json, select, socket, sys, time
path, n, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
conns, failed = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(path)
        conns.append(s)
    except OSError:  # the backlog is full
        s.close()
        failed += 1
got = {s: b"" for s in conns}
end = time.monotonic() + 1.0
while time.monotonic() < end:
    r, _, _ = select.select(conns, [], [], max(0, end - time.monotonic()))
    for s in r:
        try:
            got[s] += s.recv(4096) or b"<eof>"
        except OSError:
            got[s] += b"<eof>"
refused = [s for s in conns if b"too many connections" in got[s]]
held = [s for s in conns if s not in refused]
print(json.dumps({"connected": len(conns), "failed": failed,
                  "refused": len(refused), "held": len(held)}), flush=True)
# hold the rest; count those the daemon closes for idleness
closed, idle_msg = set(), False
end = time.monotonic() + hold
while time.monotonic() < end and len(closed) < len(held):
    live = [s for s in held if s not in closed]
    r, _, _ = select.select(live, [], [], max(0, end - time.monotonic()))
    for s in r:
        try:
            b = s.recv(4096)
        except OSError:
            b = b""
        idle_msg |= b"--idle-timeout" in b
        if not b:
            closed.add(s)
print(json.dumps({"closed_by_daemon": len(closed), "idle_msg": idle_msg}),
      flush=True)
'''


def read_json_line(proc, timeout):
    r, _, _ = select.select([proc.stdout], [], [], timeout)
    assert r, "no line from the flooder within %ss" % timeout
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    return json.loads(line)


def flood_script(stager_dir):
    f = stager_dir / "flood.py"
    f.write_text(FLOOD)
    os.chmod(f, 0o644)
    return f


@contextlib.contextmanager
def flooding(users, s, n, hold):
    """Run FLOOD as a new unprivileged uid against s: n connections, held
    for hold seconds. Yields the process (its stdout gives two JSON
    lines); kills it at the end."""
    u = users.user("flood")
    fl = users.popen(u, ["/usr/bin/python3", flood_script(s.root), s.sock,
                         str(n), str(hold)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    fl.user = u
    try:
        yield fl
    finally:
        fl.kill()
        fl.wait()


def timed_list(s, timeout):
    t0 = time.monotonic()
    p = s.run("list", "--json", timeout=timeout)
    assert p.returncode == 0, p.stderr
    return time.monotonic() - t0


@pytest.mark.parametrize("cap", ["--max-conns-per-uid", "--max-conns"])
def test_flood_capped_and_idle_closed(tool, stager_dir, users, cap):
    """A second uid opening 12 idle connections is held to the cap (4,
    per uid or in all): the others are refused at once with a message;
    root's list answers during the flood; the held ones are closed once
    idle."""
    s = Stager(tool("stager"), stager_dir,
               args=[cap, "4", "--idle-timeout", "1500ms"]).start()
    try:
        with flooding(users, s, 12, 8) as fl:
            first = read_json_line(fl, 30)
            assert first["connected"] == 12, first
            assert first["held"] == 4 and first["refused"] == 8, first
            assert timed_list(s, 10) < 5  # root, during the flood
            # the flooder's own CLI is told why
            p = users.run(fl.user, [s.exe, "--config", s.cfg, "list"],
                          env=s.env)
            assert p.returncode == 1, p.stderr
            assert b"too many connections" in p.stderr
            second = read_json_line(fl, 30)
            assert second == {"closed_by_daemon": 4, "idle_msg": True}
        assert timed_list(s, 10) < 5
        assert ("(daemon %s)" % cap).encode() in s.log.read_bytes()
    finally:
        s.stop()


def test_accept_survives_emfile(tool, stager_dir, users):
    """With RLIMIT_NOFILE lowered, a flood of idle connections from a
    second uid drives accept to EMFILE: the daemon backs off instead of
    losing its accept thread, answers root's list during the flood (idle
    ones close), and at once after it."""
    s = Stager(tool("stager"), stager_dir,
               args=["--max-conns", "4096", "--max-conns-per-uid", "4096",
                     "--idle-timeout", "1s"],
               prefix=["prlimit", "--nofile=64:64", "--"]).start()
    try:
        with flooding(users, s, 200, 4) as fl:
            first = read_json_line(fl, 30)
            assert first["connected"] > 64, first
            assert timed_list(s, 30) < 20  # during the flood
            read_json_line(fl, 30)
        assert timed_list(s, 10) < 5
        log = s.log.read_text()
        assert "Too many open files: backing off" in log, log
        assert s.proc.poll() is None
    finally:
        s.stop()


def test_restricted_datasets_hidden_from_non_members(daemon, stager_dir,
                                                     users):
    """list, show, jobs, status and watch show a dataset with a group,
    its source and its key names only to members (and root/admins)."""
    g = users.group("team")
    outsider = users.user("out")
    member = users.user("mem", groups=[g])
    make_dataset(stager_dir / "secretsrc", {"hidden-key.bin": b"x" * 100})
    make_dataset(stager_dir / "opensrc", {"a": b"a"})
    daemon.run("add", "secret", "file://%s/secretsrc/" % stager_dir,
               "--group", g, check=True)
    daemon.run("add", "open", "file://%s/opensrc/" % stager_dir, check=True)
    job = daemon.json("stage", "secret", "--files", "hidden-key.bin")["job"]
    ojob = daemon.json("stage", "open")["job"]
    base = [daemon.exe, "--config", str(daemon.cfg)]

    def run(user, *args):
        return users.run(user, base + list(args), env=daemon.env)

    for user, sees in ((outsider, False), (member, True)):
        p = run(user, "list", "--json")
        assert p.returncode == 0, p.stderr
        names = [d["name"] for d in json.loads(p.stdout)]
        assert names == (["open", "secret"] if sees else ["open"]), names
        assert (b"secretsrc" in p.stdout) == sees
        p = run(user, "show", "secret", "--json")
        assert p.returncode == (0 if sees else 5), p.stderr
        for args in (("jobs", "--all", "--json"), ("status", "--json")):
            p = run(user, *args)
            assert p.returncode == 0, p.stderr
            ids = [j["job"] for j in json.loads(p.stdout)]
            assert ojob in ids
            assert (job in ids) == sees, (user, args, ids)
            assert (b"hidden-key" in p.stdout) == sees
        for args in (("status", str(job), "--json"),
                     ("status", str(job), "--wait", "--json")):
            p = run(user, *args)
            assert p.returncode == (0 if sees else 5), (args, p.stderr)
            assert (b"secret" in p.stdout) == sees
    # root still sees everything
    assert [d["name"] for d in daemon.json("list")] == ["open", "secret"]


def raw_request(sock, line, timeout=10):
    """Send one request line; return the reply lines up to the end line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(timeout)
        c.connect(str(sock))
        c.sendall(line.encode() + b"\n")
        buf = b""
        while not any(ln.startswith(b"type=end")
                      for ln in buf.split(b"\n")):
            b = c.recv(65536)
            if not b:
                break
            buf += b
    return [ln for ln in buf.split(b"\n") if ln]


def test_status_huge_job_id_refused(daemon, stager_dir):
    """job= is parsed strictly: an id past INT64_MAX (or 0, or junk) is
    an error, not 'no id' (which listed every job)."""
    make_dataset(stager_dir / "src", {"a": b"a"})
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    daemon.run("stage", "ds", "--wait", check=True)
    assert len(raw_request(daemon.sock, "cmd=status")) == 2  # row + end
    for bad in ("99999999999999999999999", "9223372036854775808", "0",
                "-1", "1x", ""):
        lines = raw_request(daemon.sock, "cmd=status\tjob=" + bad)
        assert len(lines) == 1, (bad, lines)
        assert lines[0].startswith(b"type=end\trc=-22\tmsg=status: job=")
        assert b"is not a job id" in lines[0]
        lines = raw_request(daemon.sock, "cmd=watch\tjob=" + bad)
        assert len(lines) == 1 and b"rc=-22" in lines[0], (bad, lines)
    p = daemon.run("status", "99999999999999999999999")
    assert p.returncode == 2 and b"is not a job id" in p.stderr
    p = daemon.run("stage", "ds", "--parallel", "1K")
    assert p.returncode == 2 and b"expected a count" in p.stderr
    lines = raw_request(daemon.sock, "cmd=stage\tname=ds\tparallel=100000")
    assert b"rc=-22" in lines[-1] and b"expected a count" in lines[-1]


def test_watch_slow_reader_does_not_stall(daemon, stager_dir):
    """A watcher that never reads must not hold the job's lock while its
    send blocks: a second watcher of the same job still gets the whole
    result (the mismatch rows are more than a socket buffer)."""
    d = "/".join(c * 200 for c in "def")
    files = {"%s/%0190d" % (d, i): b"v%d" % i for i in range(400)}
    make_dataset(stager_dir / "src", files,
                 sums={k: b"other" for k in files})
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    p = daemon.run("verify", "ds", "--source", "--json")
    assert p.returncode == 1
    job = json.loads(p.stdout)["job"]["job"]
    assert len(json.loads(p.stdout)["mismatches"]) == 400
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(str(daemon.sock))
        stuck.sendall(b"cmd=watch\tjob=%d\n" % job)
        time.sleep(1)  # its thread is now blocked in send
        t0 = time.monotonic()
        p = daemon.run("status", str(job), "--wait", "--json", timeout=20)
        assert p.returncode == 1, p.stderr
        assert len(json.loads(p.stdout)["mismatches"]) == 400
        assert time.monotonic() - t0 < 10
    finally:
        stuck.close()


def test_daemon_file_modes(tool, stager_dir):
    """What the daemon creates for its socket has the narrowest mode that
    works, whatever the umask: the socket 0622 (connect needs write only),
    its lock file 0600, a socket directory it creates 0711; a lock file
    left wider is tightened."""
    run = stager_dir / "run"
    sock = run / "stager.sock"
    umask0 = ["sh", "-c", 'umask 000; exec "$0" "$@"']
    s = Stager(tool("stager"), stager_dir, sock=sock, prefix=umask0).start()
    try:
        lock = Path(str(sock) + ".lock")
        st = os.lstat(sock)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o622, oct(st.st_mode)
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(run).st_mode) == 0o711
        for p in (sock, lock, run):
            assert os.lstat(p).st_uid == os.geteuid()
        # nothing else the daemon put there, and nothing world-writable
        assert sorted(os.listdir(run)) == ["stager.sock", "stager.sock.lock"]
    finally:
        s.stop()
    os.chmod(lock, 0o666)
    s.start()
    try:
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
        assert "tightened to 0600" in s.log.read_text()
    finally:
        s.stop()


def start_fails(s):
    """Run s's daemon expecting it to refuse to start; its output."""
    p = subprocess.run(s.prefix + [s.exe, "--config", str(s.cfg), "daemon"],
                       env=s.env, capture_output=True, timeout=10)
    assert p.returncode != 0, p.stderr
    return p.stderr.decode(errors="replace")


def test_socket_dir_and_lock_refused(tool, stager_dir, users):
    """daemon.socket's directory is refused when others or its group may
    write it, or another uid owns it; the lock file is never opened
    through a symlink. Each message names the path and the fix."""
    run = stager_dir / "run"
    run.mkdir()
    s = Stager(tool("stager"), stager_dir, sock=run / "stager.sock")
    for mode in (0o777, 0o1777, 0o775):
        os.chmod(run, mode)
        err = start_fails(s)
        assert str(run) in err and "chmod go-w %s" % run in err, err
        assert not (run / "stager.sock").exists()
    os.chmod(run, 0o755)
    other = users.user("owner")
    os.chown(run, users.uid(other), -1)
    err = start_fails(s)
    assert str(run) in err and "chown" in err, err
    os.chown(run, 0, -1)
    target = stager_dir / "target"
    os.symlink(target, run / "stager.sock.lock")
    err = start_fails(s)
    assert "stager.sock.lock" in err and "symlink" in err, err
    assert not target.exists()
    os.unlink(run / "stager.sock.lock")
    s.start().stop()  # and with all that mended it starts


def test_admin_group_member_allowed(tool, stager_dir, users):
    """daemon.admin_group, resolved once at start (getgrnam_r, not
    getgrnam in the connection threads): a member that is not root may
    change datasets, and sees restricted ones; a non-member may not."""
    g = users.group("admins")
    admin = users.user("adm", groups=[g])
    other = users.user("oth")
    make_dataset(stager_dir / "src", {"a": b"a"})
    s = Stager(tool("stager"), stager_dir, admin_group=g).start()
    try:
        base = [s.exe, "--config", s.cfg]
        p = users.run(admin, base + ["add", "ds", "file://%s/src/" %
                                     stager_dir, "--group", "nosuchgroup"],
                      env=s.env)
        assert p.returncode == 0, p.stderr
        p = users.run(admin, base + ["list", "--json"], env=s.env)
        assert [d["name"] for d in json.loads(p.stdout)] == ["ds"]
        p = users.run(other, base + ["list", "--json"], env=s.env)
        assert json.loads(p.stdout) == []  # unknown group: admins only
        p = users.run(other, base + ["remove", "ds"], env=s.env)
        assert p.returncode == 4 and g.encode() in p.stderr, p.stderr
        p = users.run(admin, base + ["remove", "ds"], env=s.env)
        assert p.returncode == 0, p.stderr
    finally:
        s.stop()
