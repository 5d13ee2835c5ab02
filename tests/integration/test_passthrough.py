"""FUSE passthrough of dataset files (issue 31, docs/dstagefs.md
"Passthrough"): an open of a file whose object the cache holds whole and
recorded is handed to the kernel (the cache's data file as backing file),
and dstagefs serves no READ for it; anything else reads through dstagefs.

Objects are staged with tests/tools/cache_tool's fetch (cache_fetch, as the
stager's prewarm), never read through the mount first, so the FUSE inode's
page cache holds nothing and a read that reached dstagefs would show in
fs_reads. Skipped where the build or the kernel has no passthrough: the
mount's line ("passthrough off: ...") is the reason given.
"""
import os
import subprocess
import time

import pytest

from test_dstagefs import (Dstagefs, Env, mounted, passthrough_lines,
                           stager_daemon)

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

MiB = 1 << 20


@pytest.fixture
def penv(tool, tmp_path):
    e = Env(tool, tmp_path)
    yield e
    e.cleanup()


def stage(env, src, ds, key):
    """Fill the whole object into the cache without the mount."""
    p = subprocess.run([env.tool("cache_tool"), "--config", str(env.cfg),
                        "file://%s/" % src, ds, "fetch", key],
                       env=env.env, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")


def drop(env, src, ds, key):
    """cache_object_drop of one object (an eviction): cache_tool's rc and
    stderr."""
    p = subprocess.run([env.tool("cache_tool"), "--config", str(env.cfg),
                        "file://%s/" % src, ds, "drop", key],
                       env=env.env, capture_output=True, timeout=120)
    return p.returncode, p.stderr.decode(errors="replace")


def mount_on(env, opts=(), name="mnt"):
    """A mount with passthrough on, or skip with its log line."""
    m = env.mount(opts=opts, name=name)
    lines = passthrough_lines(m)
    assert len(lines) == 1, m.log_text()
    if "passthrough on: " not in lines[0]:
        pytest.skip("no FUSE passthrough here: " + lines[0].split(
            "passthrough ", 1)[1])
    return m


def data_set(penv, name, files, group=None):
    src = penv.tmp / ("src-" + name)
    src.mkdir()
    for k, v in files.items():
        (src / k).parent.mkdir(parents=True, exist_ok=True)
        (src / k).write_bytes(v)
    args = ["add", name, "file://%s/" % src]
    if group:
        args += ["--group", group]
    penv.catalog(*args)
    return src


def test_staged_files_are_passed_through(penv):
    files = {"a.bin": os.urandom(3 * MiB + 17), "d/b.bin": os.urandom(5000)}
    src = data_set(penv, "st", files)
    for k in files:
        stage(penv, src, "st", k)
    m = mount_on(penv)
    before = m.stats()
    for k, v in files.items():
        assert (m.mnt / "datasets/st" / k).read_bytes() == v
    st = m.stats()
    assert st["fs_passthrough_opens"] == \
        before["fs_passthrough_opens"] + len(files), st
    # The kernel read the cache's files itself: no READ reached dstagefs.
    assert st["fs_reads"] == before["fs_reads"], st
    assert st["bytes_from_cache"] == before["bytes_from_cache"], st
    assert st["bytes_from_source"] == 0, st
    # Two opens of one file at once share its backing file.
    with open(m.mnt / "datasets/st/a.bin", "rb") as f1, \
            open(m.mnt / "datasets/st/a.bin", "rb") as f2:
        assert f1.read(1000) == files["a.bin"][:1000]
        f2.seek(MiB)
        assert f2.read(1000) == files["a.bin"][MiB:MiB + 1000]
    assert m.stats()["fs_reads"] == before["fs_reads"]
    assert m.stop() == 0

    # -o nopassthrough: today's path, READs and no passthrough open.
    m2 = penv.mount(opts=["-o", "nopassthrough"], name="mnt2")
    for k, v in files.items():
        assert (m2.mnt / "datasets/st" / k).read_bytes() == v
    st = m2.stats()
    assert st["fs_passthrough"] == 0 and st["fs_passthrough_opens"] == 0
    assert st["fs_reads"] > 0, st


def test_partial_object_reads_through_dstagefs(penv):
    files = {"cold.bin": os.urandom(2 * MiB + 5)}
    data_set(penv, "pa", files)
    m = mount_on(penv)
    with open(m.mnt / "datasets/pa/cold.bin", "rb") as f:
        # Cold: nothing cached at the open, so not passed through.
        assert f.read(4096) == files["cold.bin"][:4096]
        st = m.stats()
        assert st["fs_passthrough_opens"] == 0 and st["fs_reads"] > 0, st
        # A second open beside it reads through dstagefs too (the kernel
        # refuses a passthrough open beside a plain one), whole now.
        with open(m.mnt / "datasets/pa/cold.bin", "rb") as g:
            assert g.read() == files["cold.bin"]
        assert m.stats()["fs_passthrough_opens"] == 0
        assert f.read() == files["cold.bin"][4096:]
    # Both closed, the object whole in the cache: the next open is passed
    # through.
    reads = m.stats()["fs_reads"]
    with open(m.mnt / "datasets/pa/cold.bin", "rb") as f:
        f.seek(MiB)
        assert f.read(100) == files["cold.bin"][MiB:MiB + 100]
    st = m.stats()
    assert st["fs_passthrough_opens"] == 1 and st["fs_reads"] == reads, st


def test_restricted_dataset_refused_with_passthrough(penv, users):
    group = users.group("dpg")
    member = users.user("dpm", groups=[group])
    other = users.user("dpo")
    files = {"secret.bin": os.urandom(100000)}
    src = data_set(penv, "team", files, group=group)
    stage(penv, src, "team", "secret.bin")
    users.reach(penv.tmp)
    os.chmod(penv.tmp, 0o755)
    m = mount_on(penv, opts=["-o", "allow_other"])
    f = m.mnt / "datasets/team/secret.bin"
    r = users.run(other, ["cat", f])
    assert r.returncode != 0 and b"Permission denied" in r.stderr, r
    assert m.stats()["fs_passthrough_opens"] == 0
    r = users.run(member, ["cat", f])
    assert r.returncode == 0 and r.stdout == files["secret.bin"], r.stderr
    assert m.stats()["fs_passthrough_opens"] == 1
    # After a member's passthrough open, still refused.
    r = users.run(other, ["cat", f])
    assert r.returncode != 0 and b"Permission denied" in r.stderr, r


READER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
assert os.read(fd, 4096) == open(sys.argv[2], "rb").read(4096)
print("open", flush=True)
sys.stdin.readline()
try:
    b = os.pread(fd, 4096, 1 << 20)
    print("read", len(b), b == open(sys.argv[2], "rb").read()[1 << 20:(1 << 20) + 4096], flush=True)
except OSError as e:
    print("error", e.errno, flush=True)
"""


def reader(m, key, src_file):
    p = subprocess.Popen(["/usr/bin/python3", "-c", READER,
                          str(m.mnt / key), str(src_file)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "open"
    return p


def test_kill9_with_a_passthrough_file_open(penv):
    files = {"k.bin": os.urandom(2 * MiB)}
    src = data_set(penv, "kk", files)
    stage(penv, src, "kk", "k.bin")
    m = mount_on(penv)
    p = reader(m, "datasets/kk/k.bin", src / "k.bin")
    assert m.stats()["fs_passthrough_opens"] == 1
    m.kill9()
    # No hang: the read returns within the timeout, an error or (the
    # kernel keeps the backing file) the right bytes.
    out, _ = p.communicate("\n", timeout=30)
    assert out.startswith("error ") or out.strip() == "read 4096 True", out
    print("reader after kill -9:", out.strip())
    m2 = penv.mount(name="mnt")
    assert mounted(m2.mnt)
    assert (m2.mnt / "datasets/kk/k.bin").read_bytes() == files["k.bin"]
    assert m2.stats()["fs_passthrough_opens"] == 1


def test_eviction_of_an_object_open_in_passthrough(penv):
    files = {"e.bin": os.urandom(3 * MiB)}
    src = data_set(penv, "ev", files)
    stage(penv, src, "ev", "e.bin")
    m = mount_on(penv)
    p = reader(m, "datasets/ev/e.bin", src / "e.bin")
    # The backing file holds the object's in-use lock: not evicted.
    rc, err = drop(penv, src, "ev", "e.bin")
    assert rc == 1 and "EBUSY" in err, err
    out, _ = p.communicate("\n", timeout=30)
    assert out.strip() == "read 4096 True", out
    assert p.returncode == 0
    # Closed (the RELEASE closed the backing id): evicted now.
    deadline = time.time() + 10
    while True:
        rc, err = drop(penv, src, "ev", "e.bin")
        if rc == 0 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert rc == 0, err
    # The next open reads through dstagefs (the object is gone), right.
    before = m.stats()
    assert (m.mnt / "datasets/ev/e.bin").read_bytes() == files["e.bin"]
    st = m.stats()
    assert st["fs_passthrough_opens"] == before["fs_passthrough_opens"]
    assert st["fs_reads"] > before["fs_reads"]


def test_verify_reads_always_never_passes_through(tool, tmp_path):
    e = Env(tool, tmp_path, conf="[cache]\nverify_reads = always\n")
    try:
        files = {"v.bin": os.urandom(MiB + 3)}
        src = data_set(e, "va", files)
        stage(e, src, "va", "v.bin")
        m = mount_on(e)
        assert (m.mnt / "datasets/va/v.bin").read_bytes() == files["v.bin"]
        st = m.stats()
        assert st["fs_passthrough_opens"] == 0 and st["fs_reads"] > 0, st
        assert st["bytes_from_source"] == 0, st
    finally:
        e.cleanup()


def test_objects_found_whole_are_remembered(penv):
    """More small files than dstagefs keeps open (RLIMIT_NOFILE 768: a
    table of 128): a later open of one no longer open is answered from
    the memo of objects found whole (cache_passthrough_remembered), with
    the right bytes and no READ; one another process evicted meanwhile
    reads through dstagefs, right, and is fetched again."""
    n = 200
    files = {"s/%03d" % i: os.urandom(3000 + 37 * i) for i in range(n)}
    data_set(penv, "mw", files)
    wrapper = penv.tmp / "dstagefs-768"
    wrapper.write_text("#!/bin/sh\nexec prlimit --nofile=768:768 %s \"$@\"\n"
                       % penv.tool("dstagefs"))
    wrapper.chmod(0o700)
    m = Dstagefs(str(wrapper), penv.tmp / "mnt", penv.env,
                 penv.tmp / "mnt.log")
    penv.mounts.append(m)
    m.start()
    if "passthrough on: " not in "".join(passthrough_lines(m)):
        pytest.skip("no FUSE passthrough here")
    root = m.mnt / "datasets/mw"
    for k, v in files.items():  # cold: filled through dstagefs
        assert (root / k).read_bytes() == v
    for k, v in files.items():  # whole: the records read, noted
        assert (root / k).read_bytes() == v
    before = m.stats()
    for k, v in files.items():
        assert (root / k).read_bytes() == v
    st = m.stats()
    assert st["fs_passthrough_opens"] == before["fs_passthrough_opens"] + n
    assert st["fs_reads"] == before["fs_reads"], st
    remembered = st["cache_passthrough_remembered"] - \
        before["cache_passthrough_remembered"]
    print("remembered", remembered, "of", n)
    assert n - 128 <= remembered < n, st
    # The first file was answered from the memo: evict it (no in-use
    # lock while nobody has it open), then read it through dstagefs.
    rc, err = drop(penv, penv.tmp / "src-mw", "mw", "s/000")
    assert rc == 0, err
    before = m.stats()
    assert (root / "s/000").read_bytes() == files["s/000"]
    st = m.stats()
    assert st["fs_passthrough_opens"] == before["fs_passthrough_opens"], st
    assert st["cache_passthrough_remembered"] == \
        before["cache_passthrough_remembered"], st
    assert st["fs_reads"] > before["fs_reads"] and \
        st["bytes_from_source"] > before["bytes_from_source"], st
    assert m.stop() == 0


def test_a_stage_marks_objects_whole_for_a_later_mount(penv, tmp_path):
    """stager stage marks each object it filled whole (an extended
    attribute of its data file): a dstagefs started after the stage passes
    every file through at its first open without reading its records
    (cache_passthrough_remembered), right. A record cleared after that
    (the scrub's way) makes every mark stale: the next mount reads the
    records again, and marks them anew."""
    files = {"f%02d" % i: os.urandom(5000 + 911 * i) for i in range(20)}
    src = data_set(penv, "sm", files)
    stager = penv.tool("stager")
    with stager_daemon(penv, stager, tmp_path):
        p = subprocess.run([stager, "stage", "sm", "--wait"], env=penv.env,
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
    m = mount_on(penv)
    for k, v in files.items():
        assert (m.mnt / "datasets/sm" / k).read_bytes() == v
    st = m.stats()
    assert st["fs_passthrough_opens"] == len(files), st
    assert st["cache_passthrough_remembered"] == len(files), st
    assert st["fs_reads"] == 0, st
    assert m.stop() == 0
    # A record cleared elsewhere (cache_tool forget-block, as the scrub
    # does): a new generation; the next mount goes the long way once.
    p = subprocess.run([penv.tool("cache_tool"), "--config", str(penv.cfg),
                        "file://%s/" % src, "sm", "forget-block", "f03", "0"],
                       env=penv.env, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    m = mount_on(penv, name="mnt2")
    for k, v in files.items():
        assert (m.mnt / "datasets/sm" / k).read_bytes() == v
    st = m.stats()
    assert st["cache_passthrough_remembered"] == 0, st
    assert st["fs_passthrough_opens"] == len(files) - 1, st
    assert m.stop() == 0
    # f03 was filled again by a read, not marked: the long way once more.
    m = mount_on(penv, name="mnt3")
    for k, v in files.items():
        assert (m.mnt / "datasets/sm" / k).read_bytes() == v
    st = m.stats()
    assert st["fs_passthrough_opens"] == len(files), st
    assert st["cache_passthrough_remembered"] == len(files) - 1, st
