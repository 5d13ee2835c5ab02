"""Lifetimes that cannot race (issue 34): open/read/close and
opendir/readdir/releasedir hammered from many threads and processes, as
root and as a second uid, on every subtree (.dstage files, datasets,
checkpoints, and the overlay of `dstagefs --over`); every reply's bytes
are checked (tests/integration/hammer.py), and the mount must be alive
afterwards. Meant for the ASan build too (DSTAGE_BUILD_DIR=build-asan),
where a reply's buffer freed under it by a concurrent RELEASE aborts
dstagefs: the mount then answers ENOTCONN and the log names the error.

DSTAGE_TEST_HAMMER_S (default 3) is how long each round of processes
hammers one mount.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_dstagefs import Env  # noqa: E402
from test_overlay import Overlay  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

HAMMER = Path(__file__).resolve().parent / "hammer.py"
SECONDS = float(os.environ.get("DSTAGE_TEST_HAMMER_S", "3"))
PY = "/usr/bin/python3"


def spec_file(tmp, name, files, dirs, threads=6, iters=400):
    p = Path(tmp) / ("spec-%s.json" % name)
    p.write_text(json.dumps({"seconds": SECONDS, "threads": threads,
                             "iters": iters, "files": files, "dirs": dirs}))
    os.chmod(p, 0o644)
    return p


def hammer(tmp, users, user, specs, procs=3):
    """Run procs hammer processes per spec at once, as root and (when
    user) as user too; fail with their reports if any found a bad reply
    or hung."""
    script = Path(tmp) / "hammer.py"
    shutil.copy(HAMMER, script)
    os.chmod(script, 0o644)
    ps = []
    for spec in specs:
        for i in range(procs):
            cmd = [PY, str(script), str(spec)]
            if user and i % 2:
                ps.append(("%s as %s" % (spec.name, user),
                           users.popen(user, cmd, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT)))
            else:
                ps.append((spec.name, subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    reports, failed = [], []
    for name, p in ps:
        try:
            out, _ = p.communicate(timeout=SECONDS + 120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            failed.append("%s: timed out" % name)
        text = out.decode(errors="replace").strip()
        reports.append("%s: rc %d %s" % (name, p.returncode, text[-2000:]))
        if p.returncode != 0:
            failed.append(reports[-1])
        else:
            r = json.loads(text.splitlines()[-1])
            # A round that did nothing cannot have found anything.
            assert r["rounds"] > 0 and r["reads"] > 0, reports[-1]
    return reports, failed


def alive(proc, log, probe):
    """dstagefs still runs, reported no sanitizer error, and answers."""
    text = Path(log).read_text(errors="replace")
    assert "AddressSanitizer" not in text and "ThreadSanitizer" not in \
        text, text[-6000:]
    assert proc.poll() is None, text[-6000:]
    os.stat(probe)  # ENOTCONN once dstagefs died


@pytest.fixture
def base(users):
    """A directory the second uid can reach. Not under pytest's basetemp:
    a pytest session starting meanwhile (another checkout's) resets
    /tmp/pytest-of-root to 0700."""
    d = Path(tempfile.mkdtemp(prefix="dstage-ham-", dir="/tmp"))
    os.chmod(d, 0o755)
    users.reach(d)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def second_uid(users, base):
    """An unprivileged user (that can reach base)."""
    return users.user("ham")


def test_namespace_subtrees_survive_the_hammer(tool, base, users,
                                               second_uid):
    """.dstage files, dataset files and directories, checkpoint files and
    directories, hammered at once by root and a second uid."""
    rnd = os.urandom
    store = base / "store"
    store.mkdir()
    e = Env(tool, base / "env",
            conf="[checkpoints]\nstore = file://%s/\nstaging_dir = %s\n"
                 "staging_size = 1G\n" % (store, base / "staging"))
    expect = base / "expect"
    expect.mkdir(mode=0o755)
    data = {"a.bin": rnd(300 << 10), "b.txt": b"bee\n" * 999,
            "sub/c.bin": rnd(70000), "sub/d.bin": rnd(1 << 20),
            "empty": b""}
    try:
        src = e.tmp / "src-ham"
        for k, v in data.items():
            (src / k).parent.mkdir(parents=True, exist_ok=True)
            (src / k).write_bytes(v)
        e.catalog("add", "ham", "file://%s/" % src)
        m = e.mount(opts=["-o", "allow_other,ctl_max_handles=100000"])
        users.reach(m.mnt.parent)
        files, dirs = [], []
        for i, (k, v) in enumerate(sorted(data.items())):
            (expect / str(i)).write_bytes(v)
            os.chmod(expect / str(i), 0o644)
            files.append({"path": str(m.mnt / "datasets/ham" / k),
                          "expect": str(expect / str(i)), "kind": "bytes"})
        dirs.append({"path": str(m.mnt / "datasets/ham"),
                     "names": ["a.bin", "b.txt", "empty", "sub"]})
        dirs.append({"path": str(m.mnt / "datasets/ham/sub"),
                     "names": ["c.bin", "d.bin"]})
        dirs.append({"path": str(m.mnt / ".dstage"),
                     "names": ["prefetch", "stats"]})
        # Checkpoints: written (and published) before the hammer.
        ck = m.mnt / "checkpoints" / "job1"
        ck.mkdir()
        os.chmod(ck, 0o755)
        cfiles = {"step-1.pt": rnd(200 << 10), "step-2.pt": rnd(5000)}
        for i, (k, v) in enumerate(sorted(cfiles.items())):
            with open(ck / k, "wb") as f:
                f.write(v)
            os.chmod(ck / k, 0o644)
            (expect / ("c%d" % i)).write_bytes(v)
            os.chmod(expect / ("c%d" % i), 0o644)
            files.append({"path": str(ck / k),
                          "expect": str(expect / ("c%d" % i)),
                          "kind": "bytes"})
        dirs.append({"path": str(ck), "names": sorted(cfiles)})
        ctl = [{"path": str(m.mnt / ".dstage/stats"), "expect": None,
                "kind": "stats"},
               {"path": str(m.mnt / ".dstage/prefetch"), "expect": None,
                "kind": "summary"}]
        # Everything read as it should before the hammer (a test of the
        # test: the specs are right).
        for f in files:
            assert Path(f["path"]).read_bytes() == \
                Path(f["expect"]).read_bytes(), f
        specs = [spec_file(base, "ctl", ctl, dirs[2:3]),
                 spec_file(base, "datasets", files[:len(data)],
                           dirs[:2]),
                 spec_file(base, "checkpoints", files[len(data):],
                           dirs[3:])]
        t0 = time.monotonic()
        reports, failed = hammer(base, users, second_uid, specs)
        took = time.monotonic() - t0
        print("\n".join(reports), "\n%.1f s" % took)
        alive(m.p, m.log, m.mnt / ".dstage" / "stats")
        assert not failed, "\n".join(failed) + "\n" + m.log_text()[-4000:]
    finally:
        e.cleanup()


def test_overlay_survives_the_hammer(tool, base, users, second_uid):
    """dstagefs --over: files read through the cache and small ones read
    directly, and directories, hammered by root and a second uid."""
    (base / "ov").mkdir()
    ov = Overlay(tool, base / "ov")
    try:
        os.chmod(ov.tmp, 0o755)
        data = {"big.bin": os.urandom(900 << 10), "small.txt": b"hi\n" * 50,
                "d/x.bin": os.urandom(128 << 10), "d/y.txt": b"why\n"}
        os.mkdir("d", 0o755, dir_fd=ov.under)
        for k, v in data.items():
            ov.put(k, v)
        os.chmod(ov.pfs, 0o755)
        ov.start()
        users.reach(ov.pfs)
        expect = base / "expect"
        expect.mkdir(mode=0o755)
        files = []
        for i, (k, v) in enumerate(sorted(data.items())):
            (expect / str(i)).write_bytes(v)
            os.chmod(expect / str(i), 0o644)
            files.append({"path": str(ov.pfs / k),
                          "expect": str(expect / str(i)), "kind": "bytes"})
        for f in files:
            assert Path(f["path"]).read_bytes() == \
                Path(f["expect"]).read_bytes(), f
        dirs = [{"path": str(ov.pfs), "names": ["big.bin", "d",
                                                 "small.txt"]},
                {"path": str(ov.pfs / "d"), "names": ["x.bin", "y.txt"]}]
        specs = [spec_file(base, "overlay", files, dirs)]
        reports, failed = hammer(base, users, second_uid, specs, procs=4)
        print("\n".join(reports))
        alive(ov.proc, ov.tmp / "dstagefs.log", ov.pfs / "big.bin")
        assert not failed, "\n".join(failed) + "\n" + ov.log()[-4000:]
    finally:
        ov.close()
