"""file:// sources are confined beneath their root (lib/filestore.c): links
out of the tree, FIFOs, devices and sockets are skipped at listing and
refused at reads, quickly, both with openat2 and with the per-component
fallback; and through a real mount with allow_other, a second uid sees
none of it."""
import os
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
