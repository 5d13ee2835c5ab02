"""checkpoints/ owned like files on a parallel file system (issue 34).

Each file and directory is its creator's, with the creator's mode; every
access through the mount is checked as the caller, as POSIX does, on one
mount and on a second mount ("node") over the same store; checkpoints/ is
1777. Run as root with two (three) throwaway unprivileged users (the
`users` fixture); a directory store (file://).
"""
import os
import stat
import time

import pytest

from test_checkpoints import Ckpt, DirStore, proxied_store, wait_for  # noqa: F401 (fixture)

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


def start(tool, tmp, store, users, name):
    # umask=000: the review's setup, where every user could do anything
    m = Ckpt(tool, tmp / name, store, opts=["-o", "allow_other,umask=000"])
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


def test_two_mounts_same_store_and_remount(tool, tmp_path, users):
    store = DirStore(tmp_path / "store")
    m1 = start(tool, tmp_path, store, users, "m1")
    m2 = start(tool, tmp_path, store, users, "m2")
    try:
        a, b = users.user("cka"), users.user("ckb")
        ua = users.uid(a)
        d1, d2 = m1.ck / "teamA", m2.ck / "teamA"
        assert op(users, a, "mkdir", d1, "755") == "OK"
        assert op(users, a, "create", d1 / "model.pt", "022") == "OK"
        assert op(users, a, "chmod", d1 / "model.pt", "600") == "OK"
        f2 = d2 / "model.pt"
        wait_for(lambda: f2.exists(), 10, "model.pt on the second mount")
        assert owner(f2) == (ua, users.gid(a), 0o600)
        assert owner(d2) == (ua, users.gid(a), 0o755)
        expect(users, b, [(("read", f2), "EACCES"),
                          (("write", f2), "EACCES"),
                          (("truncate", f2), "EACCES"),
                          (("unlink", f2), "EACCES"),
                          (("rename", f2, m2.ck / "x"), "EACCES"),
                          (("rename", d2, m2.ck / "x"), "EPERM"),
                          (("rmdir", d2), "EPERM"),
                          (("chmod", f2, "644"), "EPERM")])
        assert store.get("teamA/model.pt") == b"written by %d" % ua
        # a chmod on one node is in force on the other within a second
        assert op(users, a, "chmod", f2, "400") == "OK"
        wait_for(lambda: mode(d1 / "model.pt") == 0o400, 5,
                 "the chmod on the first mount")
        # and kept across a remount
        m1.stop()
        m1.start()
        assert owner(d1 / "model.pt") == (ua, users.gid(a), 0o400)
        assert op(users, b, "read", d1 / "model.pt") == "EACCES"
        # a rename keeps the owner and mode, on both nodes
        assert op(users, a, "rename", d1 / "model.pt", d1 / "m2.pt") == "OK"
        assert owner(d1 / "m2.pt") == (ua, users.gid(a), 0o400)
        wait_for(lambda: (d2 / "m2.pt").exists(), 5, "m2.pt on m2")
        assert owner(d2 / "m2.pt") == (ua, users.gid(a), 0o400)
    finally:
        m2.stop()
        m1.stop()


def test_objects_without_owner_get_the_mount_default(tool, tmp_path,
                                                     users):
    store = DirStore(tmp_path / "store")
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
        wait_for(lambda: st.get("away/w.bin") == b"weights", 30,
                 "the retry")
        rec = st.get(".dstage-owner/away/w.bin/.dstage-own")
        assert rec is not None and rec.split()[2] == b"0600", rec
        drec = st.get(".dstage-owner/away/.dstage-own")
        assert drec is not None and drec.split()[2] == b"0750", drec
    finally:
        m.stop()
