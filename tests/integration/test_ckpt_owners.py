"""checkpoints/ owned like files on a parallel file system (issue 34).

Each file and directory is its creator's, with the creator's mode; every
access through the mount is checked as the caller, as POSIX does, on one
mount and on a second mount ("node") over the same store; checkpoints/ is
1777. Run as root with two (three) throwaway unprivileged users (the
`users` fixture); a directory store (file://), and for the tests over two
mounts (the `two` fixture) radosgw as well: on mount 2, with everything
made through mount 1, another user's 0600 file, 0700 directory and the
sticky rule, and chmod on one mount in force on the other.
"""
import errno
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import time

import pytest

from test_checkpoints import Ckpt, DirStore, close_all, proxied_store, \
    store  # noqa: F401 (fixtures)
from waits import wait_for

# One operation as another user: prints OK or the errno's name.
OP = r'''
import errno, os, sys
op, a = sys.argv[1], sys.argv[2:]
try:
    if op == "read":
        open(a[0], "rb").read()
    elif op == "write":
        with open(a[0], "r+b") as f:
            f.write(b"overwritten by %d" % os.getuid())
    elif op == "create":
        os.umask(int(a[1], 8))
        with open(a[0], "wb") as f:
            f.write(b"written by %d" % os.getuid())
    elif op == "mkdir":
        os.umask(0)
        os.mkdir(a[0], int(a[1], 8))
    elif op == "unlink":
        os.unlink(a[0])
    elif op == "rmdir":
        os.rmdir(a[0])
    elif op == "rename":
        os.rename(a[0], a[1])
    elif op == "chmod":
        os.chmod(a[0], int(a[1], 8))
    elif op == "chown":
        os.chown(a[0], int(a[1]), int(a[2]))
    elif op == "list":
        os.listdir(a[0])
    elif op == "stat":
        os.stat(a[0])
    elif op == "truncate":
        os.truncate(a[0], 0)
    elif op == "fill":
        with open(a[0], "wb") as f:
            f.write(b"q" * int(a[1]))
    print("OK")
except OSError as e:
    print(errno.errorcode[e.errno])
'''


def op(users, user, *args):
    p = users.run(user, ["/usr/bin/python3", "-c", OP] + list(args))
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode().strip()


def expect(users, user, cases):
    """Run each (args, errno name) as user; all results at once."""
    got = {args: op(users, user, *args) for args, _ in cases}
    assert got == dict(cases)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def owner(path):
    st = os.stat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def start(tool, tmp, store, users, name, conf=""):
    # umask=000: the review's setup, where every user could do anything
    m = Ckpt(tool, tmp / name, store, conf=conf,
             opts=["-o", "allow_other,umask=000"])
    users.reach(m.tmp)
    m.start()
    return m


@pytest.fixture
def one(tool, tmp_path, users):
    m = start(tool, tmp_path, DirStore(tmp_path / "store"), users, "m1")
    try:
        yield m
    finally:
        m.stop()


def test_owner_mode_and_checks_on_one_mount(one, users):
    m = one
    a, b = users.user("cka"), users.user("ckb")
    ua, ub = users.uid(a), users.uid(b)
    top, d = m.ck, m.ck / "teamA"
    f = d / "model.pt"
    assert stat.S_IMODE(os.stat(top).st_mode) == 0o1777
    assert op(users, a, "mkdir", d, "755") == "OK"
    assert owner(d) == (ua, users.gid(a), 0o755)
    assert op(users, a, "create", f, "022") == "OK"
    assert owner(f) == (ua, users.gid(a), 0o644)
    assert op(users, b, "read", f) == "OK"          # 0644: others read
    assert op(users, a, "chmod", f, "600") == "OK"
    assert mode(f) == 0o600                          # honoured, not ignored
    # B: no read, overwrite, truncate, delete or rename of A's 0600 file
    expect(users, b, [(("read", f), "EACCES"), (("write", f), "EACCES"),
                      (("truncate", f), "EACCES"),
                      (("unlink", f), "EACCES"),
                      (("rename", f, d / "b.pt"), "EACCES"),
                      (("rename", f, top / "b.pt"), "EACCES"),
                      (("create", d / "new", "022"), "EACCES"),
                      (("chmod", f, "666"), "EPERM"),
                      (("chown", f, ub, -1), "EPERM")])
    assert f.read_bytes() == b"written by %d" % ua  # root reads anything
    assert m.store.get("teamA/model.pt") == b"written by %d" % ua
    # a 0700 directory: not even a stat or a listing below it
    assert op(users, a, "chmod", d, "700") == "OK"
    os.stat(f)      # root's lookup: the kernel holds f's entry and attrs
    for args in [("stat", f), ("list", d), ("read", f), ("unlink", f)]:
        assert op(users, b, *args) == "EACCES", args
    assert op(users, b, "rmdir", d) == "EPERM"      # the sticky top
    assert op(users, a, "stat", f) == "OK"
    # chown: root only; the umask of the creator is applied
    assert op(users, a, "chown", f, ub, -1) == "EPERM"
    os.chown(f, ub, -1)
    assert owner(f)[0] == ub
    assert op(users, a, "create", d / "private", "077") == "OK"
    assert mode(d / "private") == 0o600
    assert sorted(os.listdir(d)) == ["model.pt", "private"]
    assert m.store.get("teamA/model.pt") == b"written by %d" % ua


def test_sticky_checkpoints_top(one, users):
    m = one
    a, b = users.user("cka"), users.user("ckb")
    ja, jb = m.ck / "jobA", m.ck / "jobB"
    assert op(users, a, "mkdir", ja, "777") == "OK"  # even world-writable
    assert op(users, b, "mkdir", jb, "755") == "OK"  # anyone makes one
    assert op(users, b, "rmdir", ja) == "EPERM"
    assert op(users, b, "rename", ja, m.ck / "stolen") == "EPERM"
    assert op(users, a, "rmdir", jb) == "EPERM"
    assert op(users, b, "create", ja / "f", "022") == "OK"  # 0777 dir
    assert op(users, a, "unlink", ja / "f") == "OK"  # jobA is not sticky
    # a sticky directory inside: only the entry's or directory's owner
    assert op(users, a, "mkdir", ja / "s", "1777") == "OK"
    assert op(users, b, "create", ja / "s" / "fb", "022") == "OK"
    assert op(users, a, "create", ja / "s" / "fa", "000") == "OK"
    assert op(users, b, "unlink", ja / "s" / "fa") == "EPERM"
    assert op(users, a, "unlink", ja / "s" / "fb") == "OK"  # dir owner
    assert op(users, b, "rmdir", jb) == "OK"
    os.rename(ja, m.ck / "byroot")                  # root may
    assert sorted(os.listdir(m.ck)) == ["byroot"]


def test_groups_and_supplementary_groups(one, users):
    m = one
    g = users.group("ckg")
    a, c, b = users.user("cka", [g]), users.user("ckc", [g]), \
        users.user("ckb")
    d, f = m.ck / "team", m.ck / "team" / "w.pt"
    gid = int(os.popen("getent group %s" % g).read().split(":")[2])
    assert op(users, a, "mkdir", d, "750") == "OK"
    assert op(users, a, "chown", d, -1, gid) == "OK"   # to a group of its own
    assert op(users, a, "chown", d, -1, 0) == "EPERM"  # not its group
    assert op(users, a, "create", f, "027") == "OK"
    assert op(users, a, "chown", f, -1, gid) == "OK"
    assert owner(f) == (users.uid(a), gid, 0o640)
    assert op(users, c, "read", f) == "OK"      # supplementary group
    assert op(users, c, "write", f) == "EACCES"
    assert op(users, b, "stat", f) == "EACCES"  # no search on team/
    assert op(users, b, "read", f) == "EACCES"


MB = 1 << 20


@pytest.fixture
def two(tool, tmp_path, store, users):
    """Two mounts ("nodes") over one store (file:// and radosgw), each with
    its own staging directory and a per-uid staging bound of 4 MiB."""
    conf = "[checkpoints]\nuid_staging_size = 4M\n"
    m1 = start(tool, tmp_path, store, users, "m1", conf)
    try:
        m2 = start(tool, tmp_path, store, users, "m2", conf)
    except BaseException:
        m1.stop()
        raise
    try:
        yield m1, m2
    finally:
        m2.stop()
        m1.stop()


def test_two_mounts_same_store_and_remount(two, users):
    m1, m2 = two
    store = m1.store
    a, b = users.user("cka"), users.user("ckb")
    ua = users.uid(a)
    d1, d2 = m1.ck / "teamA", m2.ck / "teamA"
    assert op(users, a, "mkdir", d1, "755") == "OK"
    assert op(users, a, "create", d1 / "model.pt", "022") == "OK"
    assert op(users, a, "chmod", d1 / "model.pt", "600") == "OK"
    f2 = d2 / "model.pt"
    wait_for(lambda: f2.exists(), "model.pt on the second mount", 10)
    assert owner(f2) == (ua, users.gid(a), 0o600)
    assert owner(d2) == (ua, users.gid(a), 0o755)
    expect(users, b, [(("read", f2), "EACCES"),
                      (("write", f2), "EACCES"),
                      (("truncate", f2), "EACCES"),
                      (("create", f2, "022"), "EACCES"),  # O_TRUNC
                      (("unlink", f2), "EACCES"),
                      (("rename", f2, m2.ck / "x"), "EACCES"),
                      (("rename", f2, d2 / "x"), "EACCES"),
                      (("rename", d2, m2.ck / "x"), "EPERM"),
                      (("rmdir", d2), "EPERM"),
                      (("chmod", f2, "644"), "EPERM")])
    assert store.get("teamA/model.pt") == b"written by %d" % ua
    # A's chmod on mount 1 is in force on mount 2 at B's next open or
    # truncate (both read the owner record again), and stat shows it
    # within the attribute timeout (1 s)
    assert op(users, a, "chmod", d1 / "model.pt", "644") == "OK"
    expect(users, b, [(("read", f2), "OK"), (("write", f2), "EACCES"),
                      (("truncate", f2), "EACCES")])
    wait_for(lambda: mode(f2) == 0o644, "0644 on the second mount", 5)
    assert op(users, a, "chmod", d1 / "model.pt", "600") == "OK"
    expect(users, b, [(("read", f2), "EACCES"),
                      (("truncate", f2), "EACCES")])
    wait_for(lambda: mode(f2) == 0o600, "0600 on the second mount", 5)
    assert store.get("teamA/model.pt") == b"written by %d" % ua
    # a chmod on one node is in force on the other within a second
    assert op(users, a, "chmod", f2, "400") == "OK"
    wait_for(lambda: mode(d1 / "model.pt") == 0o400,
             "the chmod on the first mount", 5)
    # and kept across a remount
    m1.stop()
    m1.start()
    assert owner(d1 / "model.pt") == (ua, users.gid(a), 0o400)
    assert op(users, b, "read", d1 / "model.pt") == "EACCES"
    # a rename keeps the owner and mode, on both nodes
    assert op(users, a, "rename", d1 / "model.pt", d1 / "m2.pt") == "OK"
    assert owner(d1 / "m2.pt") == (ua, users.gid(a), 0o400)
    wait_for(lambda: (d2 / "m2.pt").exists(), "m2.pt on m2", 5)
    assert owner(d2 / "m2.pt") == (ua, users.gid(a), 0o400)


def test_private_directory_across_mounts(two, users):
    """All made through mount 1; on mount 2, B can neither list, stat,
    read, create in, rename out of or into, nor delete from A's 0700
    directory (A can); A's chmod of the directory on mount 1 is in force
    on mount 2 within the entry timeout (1 s), also for names mount 2's
    kernel still has cached from B's lookups."""
    m1, m2 = two
    a, b = users.user("cka"), users.user("ckb")
    ua = users.uid(a)
    d1, d2, jb1, jb2 = (m1.ck / "privA", m2.ck / "privA", m1.ck / "jobB",
                        m2.ck / "jobB")
    assert op(users, a, "mkdir", d1, "700") == "OK"
    assert op(users, a, "mkdir", d1 / "sub", "755") == "OK"
    assert op(users, a, "create", d1 / "sub" / "s.pt", "022") == "OK"
    assert op(users, a, "create", d1 / "model.pt", "022") == "OK"  # 0644
    assert op(users, b, "mkdir", jb1, "755") == "OK"
    assert op(users, b, "create", jb1 / "b.pt", "022") == "OK"
    f2, s2 = d2 / "model.pt", d2 / "sub" / "s.pt"
    wait_for(lambda: f2.exists() and s2.exists() and
             (jb2 / "b.pt").exists(), "mount 1's files on mount 2", 10)
    assert owner(d2) == (ua, users.gid(a), 0o700)
    assert owner(f2) == (ua, users.gid(a), 0o644)
    keys = m1.store.keys()
    expect(users, b, [(("list", d2), "EACCES"),
                      (("list", d2 / "sub"), "EACCES"),
                      (("stat", f2), "EACCES"),
                      (("read", f2), "EACCES"),
                      (("read", s2), "EACCES"),
                      (("write", f2), "EACCES"),
                      (("truncate", f2), "EACCES"),
                      (("create", f2, "022"), "EACCES"),
                      (("create", d2 / "new.pt", "022"), "EACCES"),
                      (("mkdir", d2 / "newdir", "755"), "EACCES"),
                      (("rename", f2, jb2 / "took.pt"), "EACCES"),
                      (("rename", f2, d2 / "again.pt"), "EACCES"),
                      (("rename", jb2 / "b.pt", d2 / "b.pt"), "EACCES"),
                      (("unlink", f2), "EACCES"),
                      (("unlink", s2), "EACCES"),
                      (("rmdir", d2 / "sub"), "EACCES"),
                      (("rmdir", d2), "EPERM"),           # sticky top
                      (("rename", d2, m2.ck / "stolen"), "EPERM"),
                      (("chmod", d2, "777"), "EPERM")])
    assert m1.store.keys() == keys
    assert m1.store.get("privA/model.pt") == b"written by %d" % ua
    expect(users, a, [(("list", d2), "OK"), (("read", f2), "OK"),
                      (("read", s2), "OK")])
    # opened up on mount 1: B lists and reads there, still writes nothing
    assert op(users, a, "chmod", d1, "755") == "OK"
    wait_for(lambda: op(users, b, "list", d2) == "OK",
             "0755 of privA on mount 2", 5)
    expect(users, b, [(("read", f2), "OK"), (("stat", f2), "OK"),
                      (("create", d2 / "new.pt", "022"), "EACCES"),
                      (("unlink", f2), "EACCES")])
    # closed again on mount 1: B's names cached by mount 2's kernel open
    # nothing there
    assert op(users, a, "chmod", d1, "700") == "OK"
    t0 = time.monotonic()
    wait_for(lambda: op(users, b, "stat", f2) == "EACCES",
             "0700 of privA on mount 2", 5)
    assert time.monotonic() - t0 < 4
    expect(users, b, [(("read", f2), "EACCES"), (("read", s2), "EACCES"),
                      (("list", d2), "EACCES")])
    assert m1.store.keys() == keys


def test_sticky_rule_across_mounts(two, users):
    """All made through mount 1; on mount 2, B neither removes nor renames
    A's job directories in the sticky checkpoints/ (a world-writable one
    included), nor A's world-writable file in root's sticky 1777 pool/;
    A and root do. In A's world-writable, non-sticky directory B may."""
    m1, m2 = two
    a, b = users.user("cka"), users.user("ckb")
    st = m1.store
    for who, name, mode_ in ((a, "jobA", "755"), (a, "jobW", "777"),
                             (b, "jobB", "755")):
        assert op(users, who, "mkdir", m1.ck / name, mode_) == "OK"
        for f in ("1.pt", "2.pt"):      # umask 000: 0666, anyone writes
            assert op(users, who, "create", m1.ck / name / f, "000") == "OK"
    os.mkdir(m1.ck / "pool")
    os.chmod(m1.ck / "pool", 0o1777)    # root's, as /tmp
    assert op(users, a, "create", m1.ck / "pool" / "a.pt", "000") == "OK"
    assert op(users, b, "create", m1.ck / "pool" / "b.pt", "000") == "OK"
    ck = m2.ck
    ja, jw, jb, pool = ck / "jobA", ck / "jobW", ck / "jobB", ck / "pool"
    wait_for(lambda: all((d / f).exists() for d, f in (
        (ja, "2.pt"), (jw, "2.pt"), (jb, "2.pt"), (pool, "a.pt"),
        (pool, "b.pt"))), "mount 1's files on mount 2", 10)
    assert owner(pool) == (0, 0, 0o1777)
    assert owner(jw)[2] == 0o777
    expect(users, b, [(("rmdir", ja), "EPERM"),
                      (("rename", ja, ck / "stolenA"), "EPERM"),
                      (("rmdir", jw), "EPERM"),
                      (("rename", jw, ck / "stolenW"), "EPERM"),
                      (("rename", jw, jb / "moved"), "EPERM"),
                      (("rename", jb, ja), "EPERM"),      # over A's
                      (("unlink", pool / "a.pt"), "EPERM"),
                      (("rename", pool / "a.pt", pool / "x.pt"), "EPERM"),
                      (("rename", pool / "a.pt", jb / "a.pt"), "EPERM"),
                      (("rename", pool / "b.pt", pool / "a.pt"), "EPERM"),
                      (("rmdir", pool), "EPERM"),
                      (("write", pool / "a.pt"), "OK")])  # 0666: may
    assert op(users, a, "unlink", pool / "b.pt") == "EPERM"  # nor A
    # not sticky: B removes A's file in A's world-writable directory
    assert op(users, b, "unlink", jw / "1.pt") == "OK"
    # A's own entries: A renames and removes them (on mount 2)
    expect(users, a, [(("rename", pool / "a.pt", pool / "a2.pt"), "OK"),
                      (("unlink", pool / "a2.pt"), "OK"),
                      (("rename", ja, ck / "jobA2"), "OK"),
                      (("unlink", ck / "jobA2" / "1.pt"), "OK")])
    assert op(users, b, "unlink", pool / "b.pt") == "OK"
    os.rename(jb, ck / "byroot")         # root: anyone's
    os.rename(jw, ck / "byroot" / "w")
    wait_for(lambda: st.get("byroot/2.pt") is not None and
             st.get("byroot/w/2.pt") is not None, "root's renames", 10)
    assert st.get("pool/a.pt") is None and st.get("pool/b.pt") is None
    assert st.get("jobA2/2.pt") is not None and st.get("jobA/2.pt") is None
    assert st.get("jobW/1.pt") is None
    assert st.get("pool/a2.pt") is None
    assert owner(ck / "byroot")[0] == users.uid(b)   # moved, still B's


def test_uid_staging_bound_is_per_mount(two, users):
    """checkpoints.uid_staging_size is per mount: each dstagefs counts the
    local copies in its own staging directory, so A at its bound on mount
    1 stops neither B on mount 2 nor A itself there."""
    m1, m2 = two
    a, b = users.user("cka"), users.user("ckb")
    ua = users.uid(a)
    assert op(users, a, "mkdir", m1.ck / "q", "777") == "OK"
    assert op(users, a, "fill", m1.ck / "q" / "full", 4 * MB) == "OK"
    assert op(users, a, "fill", m1.ck / "q" / "more", 1) == "EDQUOT"
    msg = "uid %d reached checkpoints.uid_staging_size" % ua
    assert msg in m1.log_text()
    q2 = m2.ck / "q"
    wait_for(lambda: (q2 / "full").exists(), "q/full on mount 2", 10)
    assert op(users, b, "fill", q2 / "b", 3 * MB) == "OK"
    assert op(users, a, "fill", q2 / "a", 3 * MB) == "OK"
    assert "reached checkpoints.uid_staging_size" not in m2.log_text()
    assert len(m1.store.get("q/b")) == 3 * MB
    assert len(m1.store.get("q/a")) == 3 * MB


def test_objects_without_owner_get_the_mount_default(tool, tmp_path,
                                                     users, store):
    """An object another tool put (no owner record) has the mount's
    default owner; looking its record up, on radosgw as on a directory,
    writes no error line: any user could fill the log by listing."""
    store.put("old/ckpt.pt", b"from before owners")
    m = Ckpt(tool, tmp_path / "m", store,
             opts=["-o", "allow_other,uid=0,gid=0,umask=077"])
    users.reach(m.tmp)
    m.start()
    try:
        b = users.user("ckb")
        f = m.ck / "old" / "ckpt.pt"
        assert owner(f) == (0, 0, 0o600)
        # the review: "with -o umask=077 ... any user still reads"
        assert op(users, b, "read", f) == "EACCES"
        assert f.read_bytes() == b"from before owners"
        for _ in range(3):  # each past the attribute timeout: read again
            time.sleep(1.1)
            assert owner(f) == (0, 0, 0o600)
        errors = [ln for ln in m.log_text().splitlines()
                  if " error: " in ln and ".dstage-owner" in ln]
        assert errors == []
    finally:
        m.stop()


def test_objects_without_owner_fail_closed(tool, tmp_path, users):
    """Even a mount with -o umask=000 shows an object without an owner
    record (another tool's) owner-only: 0600, its directory 0700; a second
    uid reads nothing of it."""
    store = DirStore(tmp_path / "store")
    store.put("tool/out.pt", b"put by another tool")
    m = Ckpt(tool, tmp_path / "m", store,
             opts=["-o", "allow_other,uid=0,gid=0,umask=000"])
    users.reach(m.tmp)
    m.start()
    try:
        b = users.user("ckb")
        f = m.ck / "tool" / "out.pt"
        assert owner(f) == (0, 0, 0o600)
        assert owner(m.ck / "tool") == (0, 0, 0o700)
        assert op(users, b, "read", f) == "EACCES"
        assert op(users, b, "list", m.ck / "tool") == "EACCES"
        assert f.read_bytes() == b"put by another tool"
    finally:
        m.stop()


def test_directory_rename_refused_as_too_long_leaves_no_owner_records(
        tool, tmp_path, store):
    """Renaming a directory to a longer name would take a key below it
    past the store's limit: the rename is refused (ENAMETOOLONG or
    EINVAL), and no owner record is left under the new name (finding 7:
    the records were copied before the refusal and never removed)."""
    m = Ckpt(tool, tmp_path / "m", store)
    m.start()
    try:
        prefix = len(store.prefix) if store.kind == "s3" else 0
        room = 1024 - prefix - len(".dstage-owner/") - \
            len("/.dstage-own") - len("j/")
        j = m.ck / "j"
        j.mkdir()
        d = j
        left = room
        while left > 255 + 1:                 # directories of 200 bytes
            d = d / ("d" * 199)
            d.mkdir()
            left -= 200
        (d / ("f" * left)).write_bytes(b"fits")   # the longest key there is
        top = j / ("d" * 199)
        with pytest.raises(OSError) as ei:
            os.rename(top, j / ("e" * 201))       # two bytes longer
        assert ei.value.errno in (errno.ENAMETOOLONG, errno.EINVAL)
        left_over = [k for k in store.keys()
                     if k.startswith(".dstage-owner/j/" + "e" * 201)]
        assert left_over == []
        # the old name keeps its records
        assert any(k.startswith(".dstage-owner/j/" + "d" * 199 + "/")
                   for k in store.keys())
        assert (d / ("f" * left)).read_bytes() == b"fits"
    finally:
        m.stop()


def test_owner_kept_while_the_store_is_away(tool, tmp_path, faultproxy,
                                            proxied_store):
    """The store refuses every PUT: mkdir and create still work (they need
    no store: owners are kept on the node until the first publish), a
    chmod changes the kept owner, and the first publish once the store is
    back stores the records, the directory's first, before the file."""
    st = proxied_store
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    try:
        faultproxy.add_fault("503", count=1000, match="PUT")
        (m.ck / "away").mkdir(mode=0o750)
        with pytest.raises(OSError):          # its publish fails at close
            with open(m.ck / "away" / "w.bin", "wb") as f:
                f.write(b"weights")
        os.chmod(m.ck / "away" / "w.bin", 0o600)
        assert stat.S_IMODE(os.stat(m.ck / "away" / "w.bin").st_mode) \
            == 0o600
        assert st.get(".dstage-owner/away/w.bin/.dstage-own") is None
        # its publish failed storing the owner record, first of all
        assert "its owner record" in m.log_text()
        faultproxy.clear_faults()
        wait_for(lambda: st.get("away/w.bin") == b"weights", "the retry",
                 30)
        rec = st.get(".dstage-owner/away/w.bin/.dstage-own")
        assert rec is not None and rec.split()[2] == b"0600", rec
        drec = st.get(".dstage-owner/away/.dstage-own")
        assert drec is not None and drec.split()[2] == b"0750", drec
    finally:
        m.stop()


def refusing_store(request, tmp_path, kind):
    """A store ("dir" or "s3") and (block, unblock): while blocked it
    refuses every owner record's write (a directory store whose owner tree
    is blocked by a file; radosgw answering 503 to every PUT)."""
    from test_checkpoints import S3Store
    if kind == "dir":
        st = DirStore(tmp_path / "store")
        blocker = st.root / ".dstage-owner"
        return (st, lambda: blocker.write_bytes(b"in the way"),
                blocker.unlink)
    fp = request.getfixturevalue("faultproxy")
    st = S3Store(fp.rgw, env=fp.env())
    return (st, lambda: fp.add_fault("503", count=100000, match="PUT"),
            fp.clear_faults)


@pytest.mark.parametrize("publisher", ["daemon", "restart"])
@pytest.mark.parametrize("kind", ["dir", "s3"])
def test_owner_outlives_a_failed_publish(tool, tmp_path, users, request,
                                         kind, publisher):
    """Issue 42, finding 2: a user's new 0700 directory and 0600 file are
    created while the store refuses them (a directory store whose owner
    tree is blocked, radosgw answering 503 to every PUT), so the first
    publish fails and dstagefs stops. The file is published later by the
    stager daemon's retry job, or by dstagefs's restart: the owners go to
    the store first (kept in the staging directory's owners/, not in
    dstagefs's memory), so another user can neither list nor read what
    the writer made private, on a fresh mount."""
    from test_lifecycle import Daemon
    st, block, unblock = refusing_store(request, tmp_path, kind)
    a, b = users.user("cko"), users.user("ckp")
    ua, ga = users.uid(a), users.gid(a)
    m = start(tool, tmp_path, st, users, "m1")
    d = None
    try:
        d_, f = m.ck / "jobo", m.ck / "jobo" / "model.pt"
        block()
        assert op(users, a, "mkdir", d_, "700") == "OK"
        assert op(users, a, "create", f, "077") != "OK"  # its publish
        kept = list((m.staging / "owners").iterdir())
        assert len(kept) == 2, kept          # the directory's and the file's
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in kept)
        m.stop()
        unblock()
        want = b"written by %d" % ua
        if publisher == "daemon":
            d = Daemon(tool, tmp_path / "daemon", m).start()
        else:
            m.start()
        wait_for(lambda: st.get("jobo/model.pt") == want,
                 "the %s's publish" % publisher, 60)
        assert st.get(".dstage-owner/jobo/model.pt/.dstage-own") == \
            b"%d %d 0600\n" % (ua, ga)
        assert st.get(".dstage-owner/jobo/.dstage-own") == \
            b"%d %d 0700\n" % (ua, ga)
        assert list((m.staging / "owners").iterdir()) == []
        if d:
            d.stop()
            d = None
        m.stop()
        m.start()                            # a fresh mount reads the store
        assert owner(f) == (ua, ga, 0o600)
        assert owner(d_) == (ua, ga, 0o700)
        for args in [("list", d_), ("read", f), ("stat", f)]:
            assert op(users, b, *args) == "EACCES", args
        assert op(users, a, "read", f) == "OK"
    finally:
        close_all(d, m, st)


def kept_name(key):
    """The name of key's kept owner record in owners/ (ckpt_ownrec.c)."""
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.mark.skipif(shutil.which("strace") is None, reason="no strace")
def test_one_pass_per_publish(tool, tmp_path):
    """A publish opens owners/<SHA-256 of the name> once for the file and
    once for each directory above it (one pass: each record made durable,
    then stored), not twice (once to fsync, once to store): with no record
    kept for the directories (made while the store was there), one ENOENT
    open each, traced with strace around the close that publishes."""
    st = DirStore(tmp_path / "store")
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    tr = None
    try:
        (m.ck / "j" / "a" / "b").mkdir(parents=True)
        key = "j/a/b/f.bin"
        f = open(m.ck / key, "wb")
        f.write(b"one pass")
        f.flush()
        out = tmp_path / "strace.txt"
        tr = subprocess.Popen(["strace", "-f", "-e", "trace=openat", "-o",
                               str(out), "-p", str(m.p.pid)],
                              stderr=subprocess.PIPE, text=True)
        seen = ""
        end = time.time() + 20
        while "attached" not in seen and time.time() < end:
            seen += tr.stderr.readline()
        assert "attached" in seen, seen
        f.close()                               # the publish
        wait_for(lambda: st.get(key) == b"one pass", "the publish", 30)
        tr.send_signal(signal.SIGINT)           # detach
        tr.wait(30)
        tr = None
        opens = {}
        for ln in out.read_text().splitlines():
            mo = re.search(r'openat\(\d+, "([0-9a-f]{64})"', ln)
            if mo:
                opens[mo.group(1)] = opens.get(mo.group(1), 0) + 1
        for d in ["j", "j/a", "j/a/b"]:
            assert opens.get(kept_name(d)) == 1, (d, opens)
        assert opens.get(kept_name(key), 0) >= 1, opens
        assert list((m.staging / "owners").iterdir()) == []
        assert st.get(".dstage-owner/%s/.dstage-own" % key) is not None
    finally:
        if tr:
            tr.kill()
            tr.wait(30)
        m.stop()


@pytest.mark.parametrize("full", ["blocks", "inodes"])
def test_create_fails_when_owners_is_full(tool, tmp_path, full):
    """owners/ is full (a small tmpfs mounted there: no block left for the
    record's line, or no inode for its file): the create fails with
    ENOSPC, the log names the file and owners/, and nothing half-made
    stays (no record, not even an empty one, no local copy, no journal
    record, nothing in the mount or the store). Once there is room, a
    create works again."""
    st = DirStore(tmp_path / "store")
    m = Ckpt(tool, tmp_path / "m", st)
    m.start()
    owners = m.staging / "owners"
    mounted = False
    try:
        (m.ck / "job").mkdir()
        m.stop()
        opts = "size=4k" if full == "blocks" else "nr_inodes=2"
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts + ",mode=0700",
                        "dstage-test-owners", str(owners)], check=True,
                       timeout=30)
        mounted = True
        filler = owners / ".filler"
        filler.write_bytes(b"f" * 4096)
        with pytest.raises(OSError):              # full indeed
            (owners / ".probe").write_bytes(b"x")
        if (owners / ".probe").exists():
            (owners / ".probe").unlink()
        m.start()
        f = m.ck / "job" / "f.bin"
        with pytest.raises(OSError) as ei:
            with open(f, "wb") as fh:
                fh.write(b"never")
        assert ei.value.errno == errno.ENOSPC, ei.value
        assert "cannot keep the owner of job/f.bin in %s: %s" % (
            owners, os.strerror(errno.ENOSPC)) in m.log_text()
        assert sorted(p.name for p in owners.iterdir()) == [".filler"]
        assert not (m.staging / "tree" / "job" / "f.bin").exists()
        assert list((m.staging / "journal").iterdir()) == []
        assert list((m.staging / "abandoned").iterdir()) == []
        assert not f.exists()
        assert "job" in os.listdir(m.ck) and os.listdir(m.ck / "job") == []
        assert [k for k in st.keys() if "f.bin" in k] == []
        # room again: the same create works, and is published
        filler.unlink()
        f.write_bytes(b"now")
        wait_for(lambda: st.get("job/f.bin") == b"now", "the publish", 30)
        assert st.get(".dstage-owner/job/f.bin/.dstage-own") is not None
    finally:
        m.stop()
        if mounted:
            subprocess.run(["umount", "-l", str(owners)], timeout=30)


@pytest.mark.parametrize("publisher", ["daemon", "restart"])
def test_torn_kept_owner_is_stored_fail_closed(tool, tmp_path, users,
                                               publisher):
    """A kept owner record torn by a crash (garbage in its owners/ file)
    is stored as root's with mode 0000 (fail closed) by whoever publishes
    the file, with a warning naming the file: neither another user nor
    the file's creator reads it on a fresh mount; root still does."""
    from test_lifecycle import Daemon
    st = DirStore(tmp_path / "store")
    a, b = users.user("ckt"), users.user("cku")
    ua = users.uid(a)
    m = start(tool, tmp_path, st, users, "m1")
    d = None
    try:
        key = "jobt/model.pt"
        dt, f = m.ck / "jobt", m.ck / key
        assert op(users, a, "mkdir", dt, "755") == "OK"  # claimed
        # the file's owner record cannot be stored: a file in its way
        blocker = st.root / ".dstage-owner" / key
        blocker.write_bytes(b"in the way")
        assert op(users, a, "create", f, "022") != "OK"  # its publish
        rec = m.staging / "owners" / kept_name(key)
        assert rec.read_bytes().startswith(b"%d " % ua)
        m.stop()
        rec.write_bytes(b"12")                   # torn: no key, no line
        blocker.unlink()
        want = b"written by %d" % ua
        if publisher == "daemon":
            d = Daemon(tool, tmp_path / "daemon", m).start()
        else:
            m.start()
        wait_for(lambda: st.get(key) == want, "the %s's publish" % publisher,
                 60)
        assert st.get(".dstage-owner/%s/.dstage-own" % key) == b"0 0 0000\n"
        log = d.log.read_text() if d else m.log_text()
        assert "the kept owner of %s cannot be read; it is stored as " \
            "root's with mode 0000" % key in log, log[-3000:]
        assert not rec.exists()
        if d:
            d.stop()
            d = None
        m.stop()
        m.start()                               # a fresh mount reads it
        assert owner(f) == (0, 0, 0)
        assert op(users, b, "read", f) == "EACCES"
        assert op(users, a, "read", f) == "EACCES"
        assert f.read_bytes() == want           # root's
    finally:
        if d:
            d.stop()
        m.stop()
