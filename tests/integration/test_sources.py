"""file:// sources are confined beneath their root (lib/objstore/filestore.c): links
out of the tree, FIFOs, devices and sockets are skipped at listing and
refused at reads, quickly, both with openat2 and with the per-component
fallback; and through a real mount with allow_other, a second uid sees
none of it."""
import os
from pathlib import Path
import socket
import stat
import subprocess
import time

import pytest

from test_dstagefs import Env

SECRET = b"root-only secret\n"


def tree(tmp_path):
    """src/ (the source) beside out/ (outside it, with a root-only file)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "secret").write_bytes(SECRET)
    os.chmod(out / "secret", 0o600)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"plain\n")
    (src / "sub" / "f").write_bytes(b"deep\n")
    os.symlink(out / "secret", src / "abs")          # absolute, out
    os.symlink("../out/secret", src / "rel")         # ../ escape
    os.symlink("../../out/secret", src / "sub" / "rel2")
    os.symlink("../out", src / "dirlink")            # a directory, out
    os.symlink("a.txt", src / "inside")              # stays inside
    os.symlink("../a.txt", src / "sub" / "up")       # ../ but inside
    os.mkfifo(src / "fifo")
    return src, out


LINKS_OUT = ["abs", "rel", "sub/rel2", "dirlink/secret"]
LINKS_IN = ["inside", "sub/up"]


class Tool:
    def __init__(self, binary, url, env):
        self.binary, self.url, self.env = binary, url, env

    def run(self, *args, env=None, timeout=20):
        e = dict(self.env)
        e.update(env or {})
        return subprocess.run([self.binary, self.url] + list(args), env=e,
                              capture_output=True, timeout=timeout)

    def keys(self, **kw):
        p = self.run("ls", **kw)
        assert p.returncode == 0, p.stderr
        return [line.split("\t", 3)[3]
                for line in p.stdout.decode().splitlines()], p.stderr


@pytest.fixture(params=["openat2", "walk"])
def src_tool(request, tool, tmp_path):
    src, out = tree(tmp_path)
    env = dict(os.environ, DSTAGE_LOG_LEVEL="info",
               DSTAGE_TEST_NO_OPENAT2="1" if request.param == "walk" else "0")
    env.pop("DSTAGE_SOURCES_FOLLOW_SYMLINKS", None)
    return Tool(tool("objstore_tool"), "file://%s/" % src, env), src, out


def test_links_skipped_and_refused_by_default(src_tool):
    t, src, _ = src_tool
    keys, err = t.keys()
    assert keys == ["a.txt", "sub/f"]
    for name in ["abs", "rel", "dirlink", "inside", "sub/rel2", "sub/up"]:
        assert ("'%s' is or passes through a symbolic link: skipped" %
                name).encode() in err, name
    assert b"'fifo' is a FIFO, not a regular file: skipped" in err
    for key in LINKS_OUT + LINKS_IN:
        for op in (["get", key, "0", "100"], ["head", key]):
            p = t.run(*op)
            assert p.returncode == 1, (op, p.stdout)
            assert p.stderr.rstrip().endswith(b"error: ELOOP"), (op, p.stderr)
            assert SECRET not in p.stdout
            assert ("'%s'" % key).encode() in p.stderr
    assert t.run("get", "a.txt", "0", "100").stdout == b"plain\n"


def test_inside_follows_only_links_that_stay_inside(src_tool):
    t, src, _ = src_tool
    inside = {"DSTAGE_SOURCES_FOLLOW_SYMLINKS": "inside"}
    keys, err = t.keys(env=inside)
    assert keys == ["a.txt", "inside", "sub/f", "sub/up"]
    for name in ["abs", "rel", "dirlink", "sub/rel2"]:
        assert ("'%s' is a symbolic link leading outside the source" %
                name).encode() in err, name
    for key in LINKS_OUT:
        p = t.run("get", key, "0", "100", env=inside)
        assert p.returncode == 1 and SECRET not in p.stdout
        assert p.stderr.rstrip().endswith(b"error: EXDEV"), (key, p.stderr)
    for key in LINKS_IN:
        assert t.run("get", key, "0", "100", env=inside).stdout == b"plain\n"


def test_special_files_refused_without_hanging(src_tool):
    t, src, _ = src_tool
    # A FIFO nobody writes: a blocking open would hang here for ever.
    start = time.monotonic()
    p = t.run("get", "fifo", "0", "100", timeout=20)
    assert p.returncode == 1
    assert b"'fifo' is a FIFO, not a regular file: refused" in p.stderr
    assert p.stderr.rstrip().endswith(b"error: EINVAL")
    assert time.monotonic() - start < 15
    # A regular file swapped for a FIFO after it was listed (registered).
    (src / "swap").write_bytes(b"v1")
    etag = t.run("head", "swap").stdout.split(b"\t")[1].decode()
    os.unlink(src / "swap")
    os.mkfifo(src / "swap")
    p = t.run("get", "swap", "0", "100", etag, timeout=20)
    assert p.returncode == 1 and b"'swap' is a FIFO" in p.stderr
    # A socket, and a device where we may make one.
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(src / "sock"))
    try:
        p = t.run("get", "sock", "0", "1")
        assert p.returncode == 1 and b"'sock' is a socket" in p.stderr
        assert p.stderr.rstrip().endswith(b"error: EINVAL")
    finally:
        s.close()
    if os.geteuid() == 0:
        os.mknod(src / "zero", 0o644 | stat.S_IFCHR, os.makedev(1, 5))
        p = t.run("get", "zero", "0", "100")
        assert p.returncode == 1
        assert b"'zero' is a character device" in p.stderr
        keys, err = t.keys()
        assert "zero" not in keys and b"'zero' is a character device" in err
    # A directory is not an object.
    p = t.run("get", "sub", "0", "1")
    assert p.returncode == 1 and p.stderr.rstrip().endswith(b"error: ENOENT")


def test_writes_never_pass_a_link(src_tool, tmp_path):
    t, src, out = src_tool
    payload = tmp_path / "payload"
    payload.write_bytes(b"planted")
    p = t.run("put", "dirlink/planted", str(payload))
    assert p.returncode == 1 and b"ELOOP" in p.stderr
    assert not (out / "planted").exists()
    p = t.run("rm", "dirlink/secret")
    assert p.returncode == 1 and (out / "secret").read_bytes() == SECRET
    p = t.run("cp", "abs", "copied")
    assert p.returncode == 1 and not (src / "copied").exists()
    # Ordinary writes still work, and delete drops empty directories.
    assert t.run("put", "new/dir/x", str(payload)).returncode == 0
    assert (src / "new/dir/x").read_bytes() == b"planted"
    assert t.run("rm", "new/dir/x").returncode == 0
    assert not (src / "new").exists()


def test_mount_second_uid_sees_no_link_and_no_hang(tool, tmp_path, users):
    """Through dstagefs (root, allow_other) as an unprivileged uid: links
    out of the tree are not in the dataset, and a file swapped for a FIFO
    after registration fails fast instead of hanging the reader."""
    env = Env(tool, tmp_path / "env")
    try:
        src, out = tree(tmp_path)
        os.unlink(src / "fifo")
        (src / "swap").write_bytes(b"was a file\n")
        env.catalog("add", "ds", "file://%s/" % src)
        os.unlink(src / "swap")
        os.mkfifo(src / "swap")
        user = users.user("dsrc")
        users.reach(tmp_path)
        os.chmod(tmp_path, 0o755)
        m = env.mount(opts=["-o", "allow_other"])
        root = m.mnt / "datasets/ds"
        r = users.run(user, ["ls", "-1", root])
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().split() == ["a.txt", "sub", "swap"]
        for key in ["abs", "rel", "dirlink/secret", "inside"]:
            r = users.run(user, ["cat", root / key])
            assert r.returncode != 0 and SECRET not in r.stdout, key
        start = time.monotonic()
        r = users.run(user, ["cat", root / "swap"], timeout=30)
        assert r.returncode != 0 and r.stdout == b""
        assert time.monotonic() - start < 20
        assert "'swap' is a FIFO, not a regular file" in m.log_text()
        r = users.run(user, ["cat", root / "a.txt"])
        assert r.returncode == 0 and r.stdout == b"plain\n"
    finally:
        env.cleanup()


class StallingS3:
    """A fake S3 endpoint on 127.0.0.1: it lists one object, then holds
    every GET of it open without sending a byte, so that a worker reading
    it stays blocked inside the read."""

    LISTING = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        "<Name>bkt</Name><Prefix>ds/</Prefix><KeyCount>1</KeyCount>"
        "<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
        "<Contents><Key>ds/stall.bin</Key>"
        "<LastModified>2026-01-01T00:00:00.000Z</LastModified>"
        "<ETag>&quot;0123456789abcdef0123456789abcdef&quot;</ETag>"
        "<Size>1048576</Size><StorageClass>STANDARD</StorageClass>"
        "</Contents></ListBucketResult>").encode()

    def __init__(self):
        import http.server
        import threading
        outer = self
        self.stop = threading.Event()
        self.got_get = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if "list-type=2" in self.path:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length",
                                     str(len(outer.LISTING)))
                    self.end_headers()
                    self.wfile.write(outer.LISTING)
                    return
                outer.got_get.set()
                outer.stop.wait(120)  # bounded: the test ends long before

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       daemon=True)
        self.thread.start()
        self.endpoint = "http://127.0.0.1:%d" % self.server.server_port

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def clean_exit(rc, log):
    """Exit 0; under ASan, the daemon's scheduler, which
    stager/daemon/daemon.c leaves allocated at exit on purpose, is reported
    as a leak (exit 1)."""
    text = log.read_text()
    return rc == 0 or (rc == 1 and "LeakSanitizer" in text and
                       "sched_create" in text)


def test_sigterm_stops_daemon_with_worker_blocked_in_a_read(tool, tmp_path):
    """A stage job whose worker is blocked in a read that will not end for
    minutes (the store answers nothing; low_speed_time 300 s): SIGTERM
    still stops the daemon within seconds (stager/daemon/runner.c waits
    RUNNER_STOP_GRACE_S for blocked workers, then leaves them)."""
    from test_stager import Stager
    s3 = StallingS3()
    env = dict(os.environ, HOME=str(tmp_path),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
              "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        env.pop(k, None)
    s = Stager(tool("stager"), tmp_path, env=env)
    with open(s.cfg, "a") as f:
        f.write("[s3]\nendpoint = %s\nlow_speed_time = 300s\n"
                "deadline = 600s\nmax_attempts = 1\n" % s3.endpoint)
    try:
        s.start()
        s.run("add", "ds", "s3://bkt/ds/", check=True)
        s.run("stage", "ds", check=True)
        assert s3.got_get.wait(30), s.log.read_text()
        time.sleep(1)  # the worker is now inside the read
        start = time.monotonic()
        s.proc.send_signal(15)
        try:
            rc = s.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(10)
            raise AssertionError("the daemon ignored SIGTERM for 30 s:\n" +
                                 s.log.read_text())
        took = time.monotonic() - start
        s.proc = None
        assert clean_exit(rc, s.log), s.log.read_text()
        assert took < 20, took
        assert "still blocked in a read" in s.log.read_text()
    finally:
        s.stop()
        s3.close()


def test_sigterm_with_fifo_swapped_source(tool, tmp_path):
    """A stage job over a file:// source whose file became a FIFO after
    registration fails naming the key (no hang), and the daemon stops at
    once on SIGTERM."""
    from test_stager import Stager
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(b"x" * 1000)
    (tmp_path / "d").mkdir()
    s = Stager(tool("stager"), tmp_path / "d")
    try:
        s.start()
        s.run("add", "ds", "file://%s/" % src, check=True)
        os.unlink(src / "f.bin")
        os.mkfifo(src / "f.bin")
        p = s.run("stage", "ds", "--wait", timeout=60)
        assert p.returncode != 0
        assert b"f.bin" in p.stdout + p.stderr
        assert "'f.bin' is a FIFO, not a regular file" in s.log.read_text()
        start = time.monotonic()
        s.proc.send_signal(15)
        rc = s.proc.wait(timeout=30)
        s.proc = None
        assert time.monotonic() - start < 10
        assert clean_exit(rc, s.log), s.log.read_text()
    finally:
        s.stop()


def test_one_key_limit_1024_bytes(tool, tmp_path):
    """Keys over 1,024 bytes (S3's limit, which objstore enforces on every
    read) are skipped at registration with a message naming the key's
    start and the limit; a key of exactly 1,024 bytes registers and reads."""
    src = tmp_path / "src"
    seg = "d" * 200
    ok = "/".join([seg] * 5) + "/" + "f" * 19        # 1,024 bytes
    long = "/".join([seg] * 5) + "/" + "g" * 30      # 1,035 bytes
    assert len(ok) == 1024 and len(long) == 1035
    for k in (ok, long):
        (src / k).parent.mkdir(parents=True, exist_ok=True)
        (src / k).write_bytes(b"payload")
    env = dict(os.environ, DSTAGE_LOG_LEVEL="info")
    env.pop("DSTAGE_CONFIG", None)
    db = tmp_path / "catalog.db"
    p = subprocess.run([tool("catalog_tool"), str(db), "add", "ds",
                        "file://%s/" % src], env=env, capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert b"key longer than 1024 bytes" in p.stderr, p.stderr
    line = [ln for ln in p.stderr.decode().splitlines()
            if "key longer than 1024 bytes" in ln][0]
    assert "skipping key '" + seg in line
    p = subprocess.run([tool("catalog_tool"), str(db), "ls"], env=env,
                       capture_output=True, timeout=60)
    name, version, objects, size, bad = p.stdout.decode().split("\t")[:5]
    assert (objects, bad) == ("1", "1"), p.stdout
    p = subprocess.run([tool("objstore_tool"), "file://%s/" % src, "get", ok,
                        "0", "100"], env=env, capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stdout == b"payload", p.stderr


def test_long_log_lines_keep_their_reason(tool, tmp_path):
    """lib/util/log.c: a message longer than a line loses its middle, never its
    end (the reason and the fix), and says how much was cut. Here a file://
    root of ~2.4 KiB and a key of ~1 KiB make a ~6 KiB message."""
    root = tmp_path
    for i in range(12):
        root = root / (("r%02d" % i) * 66)[:200]
    root.mkdir(parents=True)
    (root / "out").write_bytes(SECRET)
    key = "/".join([("k" * 200)] * 4) + "/link"
    (root / "src" / key).parent.mkdir(parents=True)
    os.symlink("../../../../../out", root / "src" / key)
    url = "file://%s/src/" % root
    assert len(url) > 2000
    env = dict(os.environ, DSTAGE_SOURCES_FOLLOW_SYMLINKS="inside")
    p = subprocess.run([tool("objstore_tool"), url, "get", key, "0", "10"],
                       env=env, capture_output=True, timeout=60)
    assert p.returncode == 1
    lines = p.stderr.decode().splitlines()
    msg = [ln for ln in lines if "leading outside the source" in ln]
    assert msg, lines
    line = msg[0]
    assert line.endswith(": refused"), line[-200:]
    assert "bytes cut)..." in line
    assert len(line) < 4096
    assert line.split(" ", 2)[1] == "warn:"
    # A short line is left whole.
    p = subprocess.run([tool("objstore_tool"), "file://%s/" % tmp_path,
                        "get", "nope/" + "x" * 10, "0", "1"], env=env,
                       capture_output=True, timeout=60)
    assert b"bytes cut" not in p.stderr


# ---- the catalog's files (lib/catalog/catalog_file.c) -------------------------------

def catalog_tool(tool, db, *args, env=None, timeout=60):
    e = dict(os.environ, DSTAGE_LOG_LEVEL="info")
    e.pop("DSTAGE_CONFIG", None)
    e.update(env or {})
    return subprocess.run([tool("catalog_tool"), str(db)] + list(args),
                          env=e, capture_output=True, timeout=timeout)


def test_catalog_files_private_to_the_service(tool, tmp_path, users):
    """catalog.db, -wal and -shm are 0600 (a daemon holds all three open);
    a second uid can read none of them, even through catalog_tool; looser
    files are tightened at open with a log line; a directory others may
    write is refused with the path and the fix."""
    from test_stager import Stager
    os.chmod(tmp_path, 0o755)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"data")
    (tmp_path / "d").mkdir()
    s = Stager(tool("stager"), tmp_path / "d")
    db = tmp_path / "d" / "catalog.db"
    try:
        s.start()
        s.run("add", "ds", "file://%s/" % src, check=True)
        for f in (db, Path(str(db) + "-wal"), Path(str(db) + "-shm")):
            assert f.exists(), f
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        user = users.user("dscat")
        users.reach(tmp_path / "d")
        for f in (db, str(db) + "-wal", str(db) + "-shm"):
            r = users.run(user, ["cat", f])
            assert r.returncode != 0 and b"Permission denied" in r.stderr
        r = users.run(user, [tool("catalog_tool"), db, "ls"])
        assert r.returncode != 0 and b"ds\t" not in r.stdout, r.stdout
    finally:
        s.stop()
    os.chmod(db, 0o644)
    p = catalog_tool(tool, db, "ls")
    assert p.returncode == 0, p.stderr
    assert b"had mode 0644; tightened to 0600" in p.stderr
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    os.chmod(tmp_path / "d", 0o777)
    p = catalog_tool(tool, db, "ls")
    assert p.returncode != 0
    assert ("its directory %s is writable by others (mode 0777)" %
            (tmp_path / "d")).encode() in p.stderr
    assert b"chmod go-w" in p.stderr
    os.chmod(tmp_path / "d", 0o755)


HOLDER = r'''
import fcntl, os, sqlite3, sys, time
if sys.argv[3] == "live":  # as a reader would: the -shm is in use
    db = sqlite3.connect(sys.argv[1])
    db.execute("select count(*) from datasets").fetchall()
fd = os.open(sys.argv[1] + "-shm", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.lockf(fd, fcntl.LOCK_EX, 1, 120, os.SEEK_SET)  # WAL_WRITE_LOCK
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
'''


@pytest.mark.parametrize("shm", ["live", "fresh"])
def test_catalog_write_lock_held_by_another_process(tool, tmp_path, shm):
    """A process holding the WAL write lock of catalog.db-shm makes a
    catalog write fail within the busy bound (5 s a wait) instead of
    hanging, and the log names the lock and its holder's pid."""
    import sys
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"data")
    db = tmp_path / "catalog.db"
    assert catalog_tool(tool, db, "add", "ds",
                        "file://%s/" % src).returncode == 0
    h = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), "60", shm],
                         stdout=subprocess.PIPE)
    try:
        assert h.stdout.readline() == b"locked\n"
        start = time.monotonic()
        p = catalog_tool(tool, db, "refresh", "ds", timeout=60)
        took = time.monotonic() - start
        err = p.stderr.decode()
        assert p.returncode != 0, err
        assert took < 30, took
        assert ("database is locked" in err or
                "locking protocol" in err), err
        assert "locked (each wait is at most 5000 ms)" in err, err
        assert ("the WAL write lock is held (write lock, bytes 120+1) by "
                "pid %d (python3)" % h.pid) in err, err
    finally:
        h.kill()
        h.wait(10)
    # Once the holder is gone, writes work again.
    assert catalog_tool(tool, db, "refresh", "ds").returncode == 0
