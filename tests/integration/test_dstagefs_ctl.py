"""Integration tests of dstagefs's .dstage/ control files as a second,
unprivileged uid (split from test_dstagefs.py, which holds the fixtures):
the limits on prefetch lists (entries, bytes, per uid, open files), the
per-uid summary, objects fetched while a list is in flight.
"""
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from test_dstagefs import Env, denv  # noqa: F401 (denv: a fixture)

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")


# ---- .dstage limits, as a second, unprivileged uid (issue 12) ----

# Run as the test user: floods .dstage/prefetch, reporting each phase as a
# JSON line on stdout; waits for a line on stdin after the duplicate
# flood, so that the test can read dstagefs's memory while the list is
# still open. Every loop is bounded in count.
FLOOD_SCRIPT = r"""
import errno, json, os, sys
mnt, n_keys = sys.argv[1], int(sys.argv[2])
pf = os.path.join(mnt, ".dstage", "prefetch")
key = lambda i: b"datasets/flood/f%05d\n" % i
def say(**kw):
    print(json.dumps(kw), flush=True)
def first_refusal(fd, keys):
    for n, i in enumerate(keys):
        try:
            os.write(fd, key(i))
        except OSError as e:
            return n, e.errno
    return len(keys), None
fd = os.open(pf, os.O_WRONLY)
chunk = key(0) * 1000
for _ in range(300):  # the same key 300,000 times
    assert os.write(fd, chunk) == len(chunk)
say(phase="dups")
sys.stdin.readline()
# Distinct keys, one a write: the list's own limit.
taken, err = first_refusal(fd, range(1, n_keys))
try:
    os.write(fd, key(0))
    again = None
except OSError as e:
    again = e.errno
say(phase="handle", taken=taken, errno=err, again=again)
# A second list of the same uid: the uid's limit.
fd2 = os.open(pf, os.O_WRONLY)
taken2, err2 = first_refusal(fd2, range(taken + 1, n_keys))
say(phase="uid", taken=taken2, errno=err2)
# Open .dstage files of one uid.
fds, herr = [], None
for _ in range(16):
    try:
        fds.append(os.open(os.path.join(mnt, ".dstage", "stats"),
                           os.O_RDONLY))
    except OSError as e:
        herr = e.errno
        break
say(phase="handles", opened=len(fds), errno=herr)
for x in fds + [fd, fd2]:
    os.close(x)
# A normal list works again.
with open(pf, "wb") as f:
    f.write(key(1) + key(2) + key(3) + key(2))
say(phase="after", status=open(pf).read())
"""


def _rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for %d" % pid)


def test_prefetch_limits_second_uid(tool, users):
    """Any user of an allow_other mount can write .dstage/prefetch, and
    dstagefs runs as root: a flood of one key must not grow it (duplicates
    are dropped), distinct keys stop at the list's and the uid's limits
    with EDQUOT and one log line, open .dstage files are capped per uid,
    and a normal list still works afterwards."""
    import shutil
    import tempfile
    # Not under pytest's basetemp: a pytest session starting meanwhile
    # (another checkout's) resets /tmp/pytest-of-root to 0700, and the
    # test user could no longer reach the mount.
    base = Path(tempfile.mkdtemp(prefix="dstage-pflim-", dir="/tmp"))
    denv = Env(tool, base)
    try:
        _prefetch_limits(denv, users, base)
    finally:
        denv.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def test_prefetch_summary_is_per_uid(tool, users):
    """Reading .dstage/prefetch gives the reader's own last list: a second
    uid neither sees root's list of a dataset it may not read (its byte
    total) nor changes what root reads."""
    import shutil
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="dstage-pfsum-", dir="/tmp"))
    denv = Env(tool, base)
    try:
        group = users.group("dspfs")
        user = users.user("dspfs")
        secret = base / "secret"
        secret.mkdir()
        (secret / "s.bin").write_bytes(b"s" * 12345)
        denv.catalog("add", "secret", "file://%s/" % secret, "--group",
                     group)
        denv.add_dataset("pub", {"p.bin": b"p" * 77})
        os.chmod(base, 0o755)
        users.reach(base)
        m = denv.mount(opts=["-o", "allow_other"])
        pf = m.mnt / ".dstage" / "prefetch"

        def read_as(u):
            r = users.run(u, ["cat", pf])
            assert r.returncode == 0, r.stderr
            return r.stdout.decode()

        assert read_as(user) == "no list yet\n"
        with open(pf, "w") as f:
            f.write("datasets/secret/s.bin\n")
        root_status = pf.read_text()
        assert "objects 1\n" in root_status and \
            "bytes 12345\n" in root_status, root_status
        # root's list is root's: the other uid has none of its own yet.
        assert read_as(user) == "no list yet\n"
        r = users.run(user, ["/usr/bin/python3", "-c",
                             "import sys; open(sys.argv[1], 'w')"
                             ".write('datasets/pub/p.bin\\n"
                             "datasets/secret/s.bin\\n')", pf])
        assert r.returncode == 0, r.stderr
        mine = read_as(user)
        assert "objects 1\n" in mine and "bytes 77\n" in mine and \
            "skipped 1\n" in mine, mine
        assert pf.read_text() == root_status
    finally:
        denv.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def _prefetch_limits(denv, users, base):
    import errno
    import json
    n_keys = 2000
    denv.add_dataset("flood", {"f%05d" % i: b"x" for i in range(n_keys)})
    os.chmod(base, 0o755)
    users.reach(base)
    user = users.user("dspf")
    m = denv.mount(opts=["-o", "allow_other,prefetch_max_entries=1000,"
                         "prefetch_uid_max_entries=1500,ctl_max_handles=4"])
    (m.mnt / "datasets" / "flood").stat()  # loaded, threads started
    rss0 = _rss_kb(m.p.pid)
    p = users.popen(user, ["/usr/bin/python3", "-c", FLOOD_SCRIPT, m.mnt,
                           n_keys], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = {}
    killer = threading.Timer(120, p.kill)  # bounds the reads below
    killer.start()
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read().decode(errors="replace")
        out["dups"] = json.loads(line)
        rss_dups = _rss_kb(m.p.pid)
        p.stdin.write(b"go\n")
        p.stdin.flush()
        for line in p.stdout:
            d = json.loads(line)
            out[d["phase"]] = d
        rc = p.wait(120)
    finally:
        killer.cancel()
        if p.poll() is None:
            p.kill()
            p.wait(30)
    assert rc == 0, p.stderr.read().decode(errors="replace")
    # 300,000 writes of one key: bounded memory (it grew by 200 MB).
    # (Measured: +0.3 MB; +33 MB before duplicates were dropped.)
    assert rss_dups - rss0 < 8 * 1024, (rss0, rss_dups)
    # The list's limit: 1,000 objects (f00000 and 999 more), then EDQUOT,
    # and every later write of that list too.
    assert out["handle"] == {"phase": "handle", "taken": 999,
                             "errno": errno.EDQUOT,
                             "again": errno.EDQUOT}, out
    # The uid's limit across its lists: 1,500 in all.
    assert out["uid"]["taken"] == 500 and \
        out["uid"]["errno"] == errno.EDQUOT, out
    # 4 open .dstage files per uid: the two lists and two more.
    assert out["handles"]["opened"] == 2 and \
        out["handles"]["errno"] == errno.EDQUOT, out
    # Afterwards a normal list is taken (its duplicate dropped).
    status = out["after"]["status"]
    assert "objects 4" in status and "duplicates 1" in status and \
        "result ok" in status and "limit none" in status, status
    assert _rss_kb(m.p.pid) - rss0 < 32 * 1024
    log = m.log_text()
    assert log.count("uid %d reached" % users.uid(user)) == 1, log
    assert "EDQUOT" in log


def test_prefetch_objects_in_flight(faultproxy, tool, tmp_path):
    """.dstage/prefetch keeps several list entries in flight (up to
    s3.max_inflight): with every GET held at the proxy, the most GETs seen
    at once is well above one."""
    bucket = faultproxy.rgw.make_bucket("fs-pf-inflight")
    url = "s3://%s/pf/" % bucket
    n = 16
    subprocess.run([tool("objstore_tool"), url, "fill", "s/", str(n)],
                   env=faultproxy.env(), check=True, capture_output=True,
                   timeout=120)
    e = Env(tool, tmp_path / "env", extra_env=faultproxy.env(),
            conf="[s3]\nmax_inflight = 8\n")
    try:
        e.catalog("add", "pfi", url)
        m = e.mount()
        names = sorted(os.listdir(m.mnt / "datasets/pfi/s"))
        assert len(names) == n, names
        total = sum(len("s/" + k) for k in names)
        faultproxy.reset_stats()
        faultproxy.get_delay = 0.3
        with open(m.mnt / ".dstage" / "prefetch", "w") as f:
            f.write("".join("datasets/pfi/s/%s\n" % k for k in names))
        deadline = time.time() + 60
        while m.stats()["bytes_from_source"] < total:
            assert time.time() < deadline, m.stats()
            time.sleep(0.1)
        faultproxy.get_delay = None
        # One object at a time would never show more than one GET.
        assert faultproxy.max_active_gets >= 4, faultproxy.max_active_gets
        gets = faultproxy.count("GET", path="/pf/s/")
        assert gets >= n, faultproxy.counts()
        for k in names:
            assert (m.mnt / "datasets/pfi/s" / k).read_bytes() == \
                ("s/" + k).encode()
        assert m.stats()["bytes_from_source"] == total
    finally:
        e.cleanup()
