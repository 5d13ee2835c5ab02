"""Guards on every door (issue 21): access checks tested on every entry point,
generated from the tables the code dispatches on, so that a new stager
request or a new FUSE operation cannot be added untested.

- The stager daemon's request table (stager/daemon/daemon_req.c, parsed from
  the source): as a uid outside the admin group, every mutating request is
  refused (protocol rc -EPERM; the CLI exits 4) and changes nothing; every
  read-only request is answered. The test holds its own list of which
  requests change the node: a request moved to the read-only side of the
  table fails it, and a new row fails it until it is classified here.
- dstagefs's lowlevel ops table (fs/dsfs_ops.c, parsed from the source): on
  a fresh mount (no kernel dentry or attribute cache), a uid outside a
  dataset's group reaches each operation on the restricted dataset and is
  refused; `.dstage/prefetch` ignores its keys and `.dstage/stats` does not
  name it. Each op is mapped to a probe here; an op not mapped fails.
"""
import errno
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_dstagefs import Env
from test_stager import Stager, make_dataset

REPO = Path(__file__).resolve().parents[2]

# ---- the stager's request table ----

# What each request does to the node; the table's admin flag must agree,
# and the daemon's behaviour with it.
MUTATING = {"add", "refresh", "remove", "stage", "verify", "cancel",
            "cache.policy.set", "cache.pin", "cache.unpin", "cache.quota",
            "cache.priority", "cache.evict", "cache.gc",
            "lifecycle.add", "lifecycle.remove", "lifecycle.run",
            "stage.shared", "cache.csi-allow"}
READ_ONLY = {"ping", "list", "show", "jobs", "status", "watch",
             "cache.status", "cache.policy", "lifecycle.list"}
# Changes nothing but is for admins only (who changed what, and when).
ADMIN_READ = {"audit", "unpublished"}  # every user's names: admins only


def daemon_requests():
    """{cmd: flags string} from daemon_req_table in
    stager/daemon/daemon_req.c."""
    src = (REPO / "stager" / "daemon" / "daemon_req.c").read_text()
    m = re.search(r"daemon_req_table\[\]\s*=\s*\{(.*?)\n\};", src, re.S)
    assert m, "daemon_req_table not found in stager/daemon/daemon_req.c"
    rows = re.findall(r'\{\s*"([a-z_.-]+)"\s*,\s*(\w+)\s*,\s*([^}]*)\}',
                      m.group(1))
    return {cmd: flags.strip() for cmd, _, flags in rows}


def client_commands():
    """Names of the CLI commands that talk to the daemon (stager/main.c)."""
    src = (REPO / "stager" / "main.c").read_text()
    return set(re.findall(r'\{\s*"([a-z_-]+)"\s*,\s*\w+\s*,\s*'
                          r'[^,]*STAGER_NEEDS_DAEMON', src))


def test_request_table_parsed():
    reqs = daemon_requests()
    # the parse found the rows known today (a parse finding nothing would
    # make every test below vacuous)
    assert MUTATING | READ_ONLY <= set(reqs), reqs
    new = set(reqs) - MUTATING - READ_ONLY - ADMIN_READ
    assert not new, ("new stager request(s) %s: add each to MUTATING, "
                     "READ_ONLY or ADMIN_READ in "
                     "tests/integration/test_guards.py" % new)
    for cmd, flags in reqs.items():
        assert ("DAEMON_REQ_ADMIN" in flags) == \
            (cmd in MUTATING | ADMIN_READ), \
            "%s: table flags %r disagree with the test's list" % (cmd, flags)
    # every stager request but ping and watch is a CLI command of its own
    # (cache.* and audit are cachectl's, tested in test_cachectl.py;
    # lifecycle.* are `stager lifecycle SUB`, tested in test_lifecycle.py;
    # stage.shared is `stager stage NAME --shared`, in test_shared_tier.py)
    stager_reqs = {c for c in MUTATING | READ_ONLY
                   if not c.startswith(("cache.", "lifecycle.", "stage."))}
    assert stager_reqs - {"ping", "watch"} <= client_commands()


# Run as the unprivileged uid: send each request on stdin (one JSON object
# of fields a line) over the socket, print {"cmd", "rc", "msg", "rows"}.
RAW = r"""
import json, socket, sys
path = sys.argv[1]
def esc(v):
    return v.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
for line in sys.stdin:
    req = json.loads(line)
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(path)
    s.sendall(("\t".join("%s=%s" % (k, esc(v)) for k, v in req.items())
               + "\n").encode())
    buf, rows, end = b"", 0, None
    while end is None:
        d = s.recv(65536)
        if not d:
            break
        buf += d
        while b"\n" in buf:
            ln, buf = buf.split(b"\n", 1)
            f = dict(x.split("=", 1) for x in ln.decode().split("\t") if x)
            if f.get("type") == "end":
                end = f
            else:
                rows += 1
    s.close()
    end = end or {}
    print(json.dumps({"cmd": req["cmd"], "rc": int(end.get("rc", 1)),
                      "msg": end.get("msg", ""), "rows": rows}))
"""


def node_state(d):
    """What a refused request must leave alone: datasets, their manifests
    and counters, and the jobs."""
    out = {"list": d.json("list"), "jobs": d.json("jobs", "--all")}
    for ds in out["list"]:
        out["show " + ds["name"]] = d.json("show", ds["name"])
    return out


@pytest.fixture
def guarded(tool, tmp_path, users):
    os.chmod(tmp_path, 0o755)
    users.reach(tmp_path)
    d = Stager(tool("stager"), tmp_path)
    make_dataset(tmp_path / "src", {"a.bin": b"a" * 100000, "b": b"b"})
    d.start()
    try:
        d.run("add", "ds", "file://%s/src/" % tmp_path, check=True)
        d.run("stage", "ds", "--wait", check=True)
        yield d, users.user("dsna")
    finally:
        d.stop()


def test_every_mutating_request_refused_raw(guarded):
    d, user = guarded
    job = str(d.json("jobs", "--all")[0]["job"])
    reqs = daemon_requests()
    lines = []
    for cmd in sorted(reqs):
        # every field any request takes, so no argument check answers first
        lines.append(json.dumps({"cmd": cmd, "name": "ds", "job": job,
                                 "url": "file:///tmp/", "mode": "cache"}))
    before = node_state(d)
    r = subprocess.run(
        ["setpriv"] + guarded_prefix(user) + [sys.executable, "-c", RAW,
                                              str(d.sock)],
        input="\n".join(lines).encode(), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = {x["cmd"]: x for x in map(json.loads, r.stdout.decode().splitlines())}
    assert set(got) == set(reqs)
    for cmd, res in got.items():
        if cmd in MUTATING | ADMIN_READ:
            assert res["rc"] == -errno.EPERM, res
            assert "permission denied" in res["msg"], res
            assert "dstage-test" in res["msg"], res
        else:
            assert res["rc"] == 0, res
    assert node_state(d) == before


def guarded_prefix(user):
    import pwd
    pw = pwd.getpwnam(user)
    return ["--reuid", str(pw.pw_uid), "--regid", str(pw.pw_gid),
            "--init-groups", "--"]


# CLI arguments of each daemon command (the client's table names them).
CLI_ARGS = {
    "add": ["add", "x", "file:///tmp/"],
    "refresh": ["refresh", "ds"],
    "remove": ["remove", "ds"],
    "stage": ["stage", "ds"],
    "verify": ["verify", "ds"],
    "cancel": ["cancel", "{job}"],
    "list": ["list"],
    "show": ["show", "ds"],
    "jobs": ["jobs"],
    "status": ["status", "{job}"],
    "lifecycle": ["lifecycle", "list"],
    "unpublished": ["unpublished"],
}


def test_every_mutating_command_refused_cli(guarded):
    d, user = guarded
    job = str(d.json("jobs", "--all")[0]["job"])
    cmds = client_commands()
    assert {"add", "stage", "list"} <= cmds, cmds
    missing = cmds - set(CLI_ARGS)
    assert not missing, "add CLI_ARGS for %s in test_guards.py" % missing
    before = node_state(d)
    for cmd in sorted(cmds):
        args = [a.format(job=job) for a in CLI_ARGS[cmd]]
        p = d.run(*args, prefix=["setpriv"] + guarded_prefix(user))
        if cmd in MUTATING | ADMIN_READ:
            assert p.returncode == 4, (args, p.stdout, p.stderr)
            assert b"permission denied" in p.stderr, (args, p.stderr)
        else:
            assert p.returncode == 0, (args, p.stdout, p.stderr)
    assert node_state(d) == before


# ---- dstagefs's ops table ----

def fuse_ops():
    src = (REPO / "fs" / "dsfs_ops.c").read_text()
    m = re.search(r"fuse_lowlevel_ops\s+dsfs_ops_ll\s*=\s*\{(.*?)\n\};", src,
                  re.S)
    assert m, "dsfs_ops_ll not found in fs/dsfs_ops.c"
    return set(re.findall(r"\.(\w+)\s*=", m.group(1)))


# How a non-member reaches each op on the restricted dataset. Paths: R the
# dataset's root (visible in `ls -l datasets/`, nothing more), D a
# directory in it, F a file in it, L a name in it for new entries.
PROBES = {
    "lookup": ["stat F", "stat D", "lstat L"],
    "getattr": ["stat F", "stat D"],
    "access": ["access R r", "access R x", "access D r", "access F r"],
    "open": ["open F"],
    "read": ["open F"],
    "opendir": ["listdir R", "listdir D"],
    "readdir": ["listdir R", "listdir D"],
    "readdirplus": ["listdir R", "listdir D"],
    "readlink": ["readlink F"],
    "getxattr": ["getxattr F", "getxattr D"],
    "listxattr": ["listxattr F", "listxattr D"],
    "setxattr": ["setxattr F"],
    "removexattr": ["removexattr F"],
    "setattr": ["chmod F", "truncate F"],
    "mknod": ["mkfifo L"],
    "mkdir": ["mkdir L"],
    "unlink": ["unlink F"],
    "rmdir": ["rmdir D"],
    "symlink": ["symlink L"],
    "rename": ["rename F"],
    "link": ["link F"],
    "create": ["create L"],
    "write": ["openw F"],
    "fallocate": ["openw F"],
    "statfs": [],  # the mount's totals, no dataset's; allowed to all
}
# Ops that need a handle from open/opendir (refused above) or that no
# caller drives.
HANDLE_OR_LIFECYCLE = {"init", "forget", "forget_multi", "flush", "release",
                       "fsync", "releasedir", "fsyncdir"}

FS_PROBE = r"""
import errno, json, os, sys
R, D, F, L, mnt = sys.argv[1:6]
paths = dict(R=R, D=D, F=F, L=L)
def run(op, p, arg):
    if op in ("stat", "lstat"):
        st = (os.stat if op == "stat" else os.lstat)(p)
        return "size %d" % st.st_size
    if op == "access":
        return os.access(p, os.R_OK if arg == "r" else os.X_OK) or \
            (_ for _ in ()).throw(PermissionError(errno.EACCES, "access"))
    if op == "open":
        with open(p, "rb") as f:
            return f.read(4).hex()
    if op == "openw":
        os.close(os.open(p, os.O_WRONLY))
    if op == "listdir":
        return os.listdir(p)
    if op == "readlink":
        return os.readlink(p)
    if op == "getxattr":
        return os.getxattr(p, "user.dstage.etag").hex()
    if op == "listxattr":
        return os.listxattr(p)
    if op == "setxattr":
        os.setxattr(p, "user.x", b"1")
    if op == "removexattr":
        os.removexattr(p, "user.x")
    if op == "chmod":
        os.chmod(p, 0o777)
    if op == "truncate":
        os.truncate(p, 0)
    if op == "mkfifo":
        os.mkfifo(p)
    if op == "mkdir":
        os.mkdir(p)
    if op == "unlink":
        os.unlink(p)
    if op == "rmdir":
        os.rmdir(p)
    if op == "symlink":
        os.symlink("x", p)
    if op == "rename":
        os.rename(p, p + ".2")
    if op == "link":
        os.link(p, p + ".2")
    if op == "create":
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
    return "done"
out = {}
for probe in sys.stdin.read().split("\n"):
    if not probe:
        continue
    op, which, *arg = probe.split()
    try:
        out[probe] = "ok " + str(run(op, paths[which], arg[0] if arg else None))
    except OSError as e:
        out[probe] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"""

# What a refusal may look like: EACCES, or EROFS/EPERM for a change (the
# mount is read-only before it asks who), ENOTSUP/ENODATA for an xattr.
REFUSED = {"EACCES", "EPERM", "EROFS"}


def test_ops_table_parsed():
    ops = fuse_ops()
    assert {"lookup", "getattr", "open", "opendir", "readdir", "read",
            "getxattr", "access"} <= ops, ops
    new = ops - set(PROBES) - HANDLE_OR_LIFECYCLE
    assert not new, ("new FUSE op(s) %s in fs/dsfs_ops.c: add a probe to "
                     "PROBES in tests/integration/test_guards.py" % new)


@pytest.fixture
def restricted(tool, tmp_path, users):
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    group = users.group("dgg")
    member = users.user("dgm", groups=[group])
    other = users.user("dgo")
    e = Env(tool, tmp_path)
    src = tmp_path / "team"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "data.bin").write_bytes(b"secret bytes" * 1000)
    (src / "top.bin").write_bytes(b"top secret")
    e.catalog("add", "teamsecret", "file://%s/" % src, "--group", group)
    pub = tmp_path / "pub"
    pub.mkdir()
    (pub / "p.txt").write_bytes(b"public")
    e.catalog("add", "pub", "file://%s/" % pub)
    os.chmod(tmp_path, 0o755)
    users.reach(tmp_path)
    m = e.mount(opts=["-o", "allow_other"])
    try:
        yield m, users, member, other
    finally:
        e.cleanup()


def probe_fs(users, user, m, probes):
    ds = m.mnt / "datasets" / "teamsecret"
    args = [ds, ds / "sub", ds / "sub" / "data.bin", ds / "new", m.mnt]
    r = users.run(user, [sys.executable, "-c", FS_PROBE] + args,
                  input="\n".join(probes).encode())
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_fuse_op_refused_to_non_member(restricted):
    m, users, member, other = restricted
    probes = sorted({p for v in PROBES.values() for p in v})
    # fresh mount: nobody has looked anything up yet
    got = probe_fs(users, other, m, probes)
    assert m.stats()["bytes_from_source"] == 0
    leaks = {p: r for p, r in got.items() if r not in REFUSED and
             not (r in ("ENOTSUP", "EOPNOTSUPP", "ENODATA") and "xattr" in p)}
    assert not leaks, "a non-member got through: %s" % leaks
    # the root itself is visible, its contents are not
    st = users.run(other, ["stat", "-c", "%F", m.mnt / "datasets" /
                           "teamsecret"])
    assert st.returncode == 0 and b"directory" in st.stdout, st.stderr
    # a member reads it all (the probes are not refused for other reasons)
    ok = probe_fs(users, member, m, ["stat F", "open F", "listdir D",
                                     "access R x", "listdir R"])
    assert all(v.startswith("ok") for v in ok.values()), ok


def test_control_files_refuse_non_member(restricted):
    m, users, member, other = restricted
    ctl = m.mnt / ".dstage"
    lines = "datasets/teamsecret/sub/data.bin\ndatasets/teamsecret/top.bin\n" \
        "datasets/pub/p.txt\n"
    w = users.run(other, [sys.executable, "-c",
                          "import sys, time; f = open(sys.argv[1], 'w'); "
                          "f.write(sys.stdin.read()); f.close()\n"
                          "for _ in range(100):\n"
                          "    s = open(sys.argv[1]).read()\n"
                          "    if 'objects' in s: break\n"
                          "    time.sleep(0.05)\n"
                          "print(s)",
                          ctl / "prefetch"], input=lines.encode())
    assert w.returncode == 0, w.stderr
    status = w.stdout.decode()
    # the restricted keys were skipped, the public one taken
    assert "objects 1" in status and "skipped 2" in status, status
    deadline = time.time() + 10
    while m.stats()["bytes_from_source"] < len(b"public"):
        assert time.time() < deadline, m.stats()
        time.sleep(0.1)
    time.sleep(0.5)
    assert m.stats()["bytes_from_source"] == len(b"public"), m.stats()
    # stats and the directory name no dataset
    s = users.run(other, ["cat", ctl / "stats"])
    assert s.returncode == 0 and b"teamsecret" not in s.stdout, s.stdout
    ls = users.run(other, ["ls", "-a", ctl])
    assert ls.returncode == 0 and b"teamsecret" not in ls.stdout


# ---- checksums on the read paths of the stager and of the mount ----

def flip_cache_byte(cache_dir, size, at):
    """Flip a bit at byte `at` of the data of the one cache file of at least
    size bytes (the data lies at the end of the file)."""
    objs = [p for p in Path(cache_dir).rglob("*")
            if p.is_file() and p.stat().st_size >= size]
    assert len(objs) == 1, objs
    pos = objs[0].stat().st_size - size + at
    with open(objs[0], "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


def checksum_lines(log):
    return Path(log).read_text(errors="replace").count("failed its checksum")


def test_stager_reads_recheck_flipped_block(tool, tmp_path):
    """stage and verify read present blocks in batches (CACHE_READ_DIRECT):
    a flipped byte is caught and counted (logged); verify --cache names
    the damaged block and exits 1, verify --cache --repair and stage fetch
    it again and succeed."""
    size = 6 << 20
    d = Stager(tool("stager"), tmp_path)
    make_dataset(tmp_path / "src", {"big.bin": os.urandom(size)})
    d.start()
    try:
        d.run("add", "ds", "file://%s/src/" % tmp_path, check=True)
        d.run("stage", "ds", "--wait", check=True)
        for cmd, at in [("verify", (1 << 20) + 123),
                        ("stage", (5 << 20) + 7)]:
            d.stop()  # a fresh process: nothing verified yet
            flip_cache_byte(tmp_path / "cache", size, at)
            d.start()
            # a stage skips files verified since its job was created
            # (a resumed job), to the second
            time.sleep(1.1)
            seen = checksum_lines(d.log)
            if cmd == "verify":
                # verify reports the damage and fetches nothing (issue 16)
                p = d.run(cmd, "ds", "--wait", "--cache")
                assert p.returncode == 1, (cmd, p.stdout, p.stderr)
                assert b"DAMAGED ds big.bin block 0" in p.stdout, p.stdout
                args = [cmd, "ds", "--wait", "--cache", "--repair"]
            else:
                args = [cmd, "ds", "--wait"]
            p = d.run(*args)
            assert p.returncode == 0, (cmd, p.stdout, p.stderr)
            # caught and logged (by the check, and by the repair's read)
            assert checksum_lines(d.log) > seen, (cmd, d.log.read_text())
        # repaired on disk: a fresh process meets no failure
        d.stop()
        d.start()
        seen = checksum_lines(d.log)
        d.run("verify", "ds", "--cache", check=True)
        assert checksum_lines(d.log) == seen
    finally:
        d.stop()


@pytest.mark.parametrize("policy", ["always", "fill-nopassthrough"])
def test_mount_reads_recheck_flipped_block(tool, tmp_path, policy):
    """Every read path of dstagefs checks a block before it serves it: with
    cache.verify_reads = always (no file is passed through), and in fill
    mode on dstagefs's own path (-o nopassthrough: a fresh mount verifies
    each block at its first read). In fill mode a file passed through is
    the kernel's to read, unchecked: the scrub finds a flipped byte there
    (test_scrub.py, docs/cache.md)."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    size = 6 << 20
    data = os.urandom(size)
    always = policy == "always"
    e = Env(tool, tmp_path,
            conf="[cache]\nverify_reads = always\n" if always else "")
    opts = [] if always else ["-o", "nopassthrough"]
    try:
        e.add_dataset("ds", {"big.bin": data})
        m = e.mount()
        assert (m.mnt / "datasets/ds/big.bin").read_bytes() == data
        m.cleanup()
        for n, at in enumerate([(1 << 20) + 123, (5 << 20) + 7]):
            flip_cache_byte(tmp_path / "cache", size, at)
            # a fresh mount (nothing verified) and no page cache of the
            # mount's file (the cache file's pages hold the flipped byte)
            subprocess.run(["sh", "-c", "echo 1 > /proc/sys/vm/drop_caches"],
                           capture_output=True)
            m = e.mount(opts, name="mnt%d" % n)
            f = m.mnt / "datasets/ds/big.bin"
            if n == 0:
                got = f.read_bytes()  # whole: sequential, spliced
            else:
                with open(f, "rb") as fh:  # small reads at the block
                    fh.seek(at - 100)
                    got = data[:at - 100] + fh.read(200)
                    got += data[len(got):]
            assert got == data, "corrupt bytes through the mount"
            assert m.stats()["checksum_failures"] == 1, m.stats()
            m.cleanup()
    finally:
        e.cleanup()


# ---- retries judged by the HTTP status, not only by an S3 error code ----

from test_objstore_faults import DATA, proxied, stats  # noqa: E402,F401

# A load balancer's answers: no S3 error body to read a code from.
LB_KINDS = ["bare502", "bare503", "bare504", "html502", "html503", "html504",
            "429"]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("kind", LB_KINDS)
def test_status_only_errors_retried_to_success(proxied, kind, method):
    store, _, proxy = proxied
    proxy.add_fault(kind, count=2, match=method, path="/blob", seconds=1)
    if method == "GET":
        p = store.get("blob", 4096, 100000, check=False)
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout == DATA[4096:4096 + 100000]
    else:
        p = store.head("blob", check=False)
        assert p.returncode == 0, p.stderr.decode()
        assert int(p.stdout.split(b"\t")[0]) == len(DATA)
    assert stats(p)["retries"] == 2, p.stderr.decode()
    assert proxy.count(method, "/blob") == 3
    assert not proxy.pending_faults()


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("kind", LB_KINDS)
def test_status_only_errors_give_up_clearly(proxied, kind, method):
    store, _, proxy = proxied
    proxy.add_fault(kind, count=1000, match=method, path="/blob", seconds=1)
    t = time.monotonic()
    if method == "GET":
        p = store.get("blob", 0, 100, check=False)
    else:
        p = store.head("blob", check=False)
    assert p.returncode == 1 and p.stdout == b""
    err = p.stderr.decode()
    # the status named (no S3 code to name), the attempts, the errno
    assert "HTTP %s" % kind[-3:] in err, err
    assert "attempt 5 of 5" in err and "EIO" in err, err
    assert proxy.count(method, "/blob") == 5
    assert time.monotonic() - t < 10


# ---- crash ordering: a block's record only after its data is durable ----

def cache_layout(meta):
    """(rec_off, block_size) of a cache object's sidecar
    (lib/cache/cache_i.h's struct cache_hdr; the data file holds block b
    at b * block_size)."""
    import struct
    h = Path(meta).read_bytes()[:64]
    bs, = struct.unpack_from("<I", h, 12)
    lens = struct.unpack_from("<III", h, 32)
    rec_off = (64 + sum(lens) + 4095) & ~4095
    return rec_off, bs


def trace_fill(tool, tmp_path, uring):
    """Fill an 8 MiB object in 64 KiB blocks through cache_tool under the
    sync trace; returns (trace lines, data file, sidecar, blocks)."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "obj.bin").write_bytes(os.urandom(8 << 20))
    trace = tmp_path / ("trace-%s" % uring)
    shim = str(Path(tool("cache_tool")).parent / "faults.so")
    env = dict(os.environ, DSTAGE_CACHE_DIR=str(tmp_path / ("c-%s" % uring)),
               DSTAGE_CACHE_BLOCK_SIZE="64K",
               DSTAGE_CATALOG_PATH=str(tmp_path / "catalog.db"),
               DSTAGE_LOG_LEVEL="warn", LD_PRELOAD=shim,
               DSTAGE_SYNC_TRACE=str(trace))
    env.pop("DSTAGE_CONFIG", None)
    if not uring:
        env.update(DSTAGE_NO_URING="1", DSTAGE_NO_DIRECT="1")
    p = subprocess.run([tool("cache_tool"), "file://%s/" % src, "ds", "read",
                        "obj.bin", "0", str(8 << 20)], env=env,
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    files = sorted(f for f in (tmp_path / ("c-%s" % uring)).rglob("*")
                   if f.is_file() and "objects" in f.parts)
    assert len(files) == 2 and files[1].name == files[0].name + ".meta", \
        files
    lines = trace.read_text().split("\n") if trace.exists() else []
    return [x.split() for x in lines if x], files[0], files[1], 128


def test_record_written_after_data_is_durable_pwrite(tool, tmp_path):
    """The pread/pwrite path: every write and sync seen, on two files (the
    data file and its sidecar, told apart by inode). For each record
    written to the sidecar (block b), b's data was written to the data
    file before, and a sync of the data file came between that data write
    and the record write."""
    ops, data, meta, nblocks = trace_fill(tool, tmp_path, uring=False)
    rec_off, bs = cache_layout(meta)
    data_ino, meta_ino = str(data.stat().st_ino), str(meta.stat().st_ino)
    data_at = {}   # block -> index of the op that wrote its data
    synced = -1    # index of the last sync of the data file
    recorded = set()
    for i, op in enumerate(ops):
        if op[0] == "S":
            if op[1] == data_ino:
                synced = i
            continue
        off, length = int(op[2]), int(op[3])
        if op[1] == data_ino:
            b0 = off // bs
            for b in range(b0, b0 + (length + bs - 1) // bs):
                data_at[b] = i
        elif op[1] == meta_ino and off >= rec_off:
            b0 = (off - rec_off) // 16
            for b in range(b0, b0 + length // 16):
                assert b in data_at, "record of block %d before its data" % b
                assert synced > data_at[b], \
                    "record of block %d written before its data was " \
                    "synced (op %d, data at op %d, last sync op %d)" % (
                        b, i, data_at[b], synced)
                recorded.add(b)
    assert recorded == set(range(nblocks)), sorted(recorded)


def test_record_written_after_data_is_durable_uring(tool, tmp_path):
    """The io_uring path: its writes are not seen, but each sync of the
    data file reports how many records its sidecar holds at that moment. A batch syncs its data,
    then writes its records: so the first sync of a new file sees none, and
    the last sync does not see the last batch's records."""
    ops, data, _, nblocks = trace_fill(tool, tmp_path, uring=True)
    data_ino = str(data.stat().st_ino)
    counts = [int(op[2]) for op in ops if op[0] == "S" and op[1] == data_ino]
    assert counts, "no sync traced: %s" % ops[:5]
    assert counts[0] == 0, "records present at the first sync: %s" % counts
    assert counts[-1] < nblocks, \
        "every record present at the last sync: %s" % counts


# ---- verify --source reads the source, --cache the cache ----

def rewrite_keeping_etag(path, data):
    """Change a source file's bytes in place, keeping its size, mtime and
    inode: a file:// ETag that does not change, so the cache keeps what it
    holds."""
    st = path.stat()
    assert len(data) == st.st_size
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_verify_source_and_cache_differ_each_way(tool, tmp_path):
    good = os.urandom(3 << 20)
    bad = good[:1000] + bytes([good[1000] ^ 0xff]) + good[1001:]
    d = Stager(tool("stager"), tmp_path)
    src = tmp_path / "src"
    make_dataset(src, {"f.bin": good, "ok.bin": b"fine\n"})
    d.start()
    try:
        d.run("add", "ds", "file://%s/" % src, check=True)
        d.run("stage", "ds", "--wait", check=True)
        # the cache good, the source bad
        rewrite_keeping_etag(src / "f.bin", bad)
        p = d.run("verify", "ds", "--cache")
        assert p.returncode == 0, p.stdout + p.stderr
        p = d.run("verify", "ds", "--source")
        assert p.returncode == 1 and b"f.bin" in p.stdout, p.stdout
        assert b"ok.bin" not in p.stdout
        # the cache bad (staged from the bad source, its checksums right),
        # the source good
        d.run("remove", "ds", check=True)
        d.run("add", "ds", "file://%s/" % src, check=True)
        p = d.run("stage", "ds", "--wait")
        assert p.returncode == 1 and b"f.bin" in p.stdout, p.stdout
        rewrite_keeping_etag(src / "f.bin", good)
        p = d.run("verify", "ds", "--source")
        assert p.returncode == 0, p.stdout + p.stderr
        p = d.run("verify", "ds", "--cache")
        assert p.returncode == 1 and b"f.bin" in p.stdout, p.stdout
    finally:
        d.stop()
