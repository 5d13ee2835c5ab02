"""One owner per directory of checkpoints/, agreed through the store
(issue 42, finding 3).

A directory's name is claimed in the store when dstagefs makes it (its
owner record is created only if absent: O_EXCL-like on a directory store,
If-None-Match: * on S3), so a second node's mkdir of the same name by
another user fails with EEXIST and shows the first owner's directory; the
owner's own mkdir on another node yields its directory, as before. A
record kept on a node while the store was away never overwrites another
owner's record in the store: the first publish below the directory is
refused. And a node's kept record never overrides the store's for access
checks. Two mounts ("nodes") over one store, a directory store and
radosgw, as two unprivileged uids (the `users` fixture: run as root).
"""
import os
import subprocess

import pytest

from test_checkpoints import S3Store, close_all, \
    store  # noqa: F401 (fixtures)
from waits import wait_for
from test_ckpt_owners import expect, op, owner, refusing_store, start, \
    two  # noqa: F401 (fixtures)


# B's writer: opens, says so, and closes (publishes) when told.
WRITER = r'''
import errno, sys
f = open(sys.argv[1], "wb")
f.write(b"written by B")
print("open", flush=True)
sys.stdin.readline()
try:
    f.close()
    print("OK")
except OSError as e:
    print(errno.errorcode[e.errno])
'''


def rec(st, key):
    return st.get(".dstage-owner/%s/.dstage-own" % key)


def want(users, user, mode):
    return b"%d %d %04o\n" % (users.uid(user), users.gid(user), mode)


def test_radosgw_honours_if_none_match(rgw):
    """The S3 claim's primitive: radosgw refuses a PUT with If-None-Match: *
    over an existing key with 412 (so the claim is atomic there)."""
    st = S3Store(rgw)
    try:
        path = "/%s/%sclaim" % (st.bucket, st.prefix)
        codes = []
        for body in (b"first", b"second"):
            p = rgw.curl(path, "-X", "PUT", "-H", "If-None-Match: *",
                         "--data-binary", "@-", "-o", "/dev/null",
                         "-w", "%{http_code}",
                         payload_sha256="UNSIGNED-PAYLOAD", input=body)
            codes.append(p.stdout.decode())
        assert codes == ["200", "412"], codes
        assert st.get("claim") == b"first"
    finally:
        st.cleanup()


def test_mkdir_claims_the_name_in_the_store(two, users):
    """A's mkdir on node 1 stores its record at once; B's mkdir of the
    same name on node 2 (before any publish) fails with EEXIST and node 2
    shows A's directory; A's own mkdir there yields it. B can neither list
    nor remove nor rename in it on either node; A's record is never
    overwritten and A creates files in it from both nodes."""
    m1, m2 = two
    st = m1.store
    a, b = users.user("cka"), users.user("ckb")
    d1, d2 = m1.ck / "jobA", m2.ck / "jobA"
    assert op(users, a, "mkdir", d1, "700") == "OK"
    assert rec(st, "jobA") == want(users, a, 0o700)
    assert op(users, b, "mkdir", d2, "755") == "EEXIST"
    assert rec(st, "jobA") == want(users, a, 0o700)
    wait_for(lambda: os.path.isdir(d2), "A's jobA on node 2", 5)
    assert owner(d2) == (users.uid(a), users.gid(a), 0o700)
    assert op(users, b, "create", d2 / "b.pt", "022") == "EACCES"
    assert op(users, a, "create", d1 / "a.pt", "077") == "OK"
    assert op(users, a, "create", d2 / "a2.pt", "077") == "OK"
    assert rec(st, "jobA") == want(users, a, 0o700)
    wait_for(lambda: (d2 / "a.pt").exists() and (d1 / "a2.pt").exists(),
             "A's files on both nodes", 10)
    for d, other in ((d1, m1.ck), (d2, m2.ck)):
        expect(users, b, [(("list", d), "EACCES"),
                          (("unlink", d / "a.pt"), "EACCES"),
                          (("rename", d / "a.pt", other / "took"),
                           "EACCES"),
                          (("rmdir", d), "EPERM")])
    # every rank of A's job may mkdir the job's directory on its node
    assert op(users, a, "mkdir", m2.ck / "jobA2", "750") == "OK"
    assert op(users, a, "mkdir", m1.ck / "jobA2", "700") == "OK"
    assert rec(st, "jobA2") == want(users, a, 0o750)
    assert owner(m1.ck / "jobA2") == (users.uid(a), users.gid(a), 0o750)
    assert st.get("jobA/a.pt") == b"written by %d" % users.uid(a)


def test_rename_onto_a_name_claimed_on_another_node(two, users):
    """B's empty jobR on node 2 is only a record in the store: node 1 does
    not list it. A's rename of its own directory onto that name on node 1
    fails with EEXIST and leaves B's record and A's directory as they
    were; A's rename onto a name A claimed on node 2 succeeds, as A's
    mkdir there would; onto a free name, the new name is A's."""
    m1, m2 = two
    st = m1.store
    a, b = users.user("cka"), users.user("ckb")
    top1 = m1.ck
    assert op(users, b, "mkdir", m2.ck / "jobR", "700") == "OK"
    assert rec(st, "jobR") == want(users, b, 0o700)
    assert "jobR" not in os.listdir(top1)
    assert op(users, a, "mkdir", top1 / "mine", "750") == "OK"
    assert op(users, a, "create", top1 / "mine/a.pt", "077") == "OK"
    assert op(users, a, "rename", top1 / "mine",
              top1 / "jobR") == "EEXIST"
    assert rec(st, "jobR") == want(users, b, 0o700)
    assert rec(st, "mine") == want(users, a, 0o750)
    assert st.get("mine/a.pt") == b"written by %d" % users.uid(a)
    assert st.get("jobR/a.pt") is None
    assert "mine is not renamed to jobR: that name is uid " \
        "%d's directory" % users.uid(b) in m1.log_text()
    # the same uid's claim on another node: the rename yields it
    assert op(users, a, "mkdir", m2.ck / "jobS", "700") == "OK"
    assert op(users, a, "rename", top1 / "mine",
              top1 / "jobS") == "OK"
    assert rec(st, "jobS") == want(users, a, 0o750)
    assert rec(st, "mine") is None
    assert st.get("jobS/a.pt") == b"written by %d" % users.uid(a)
    # a free name: claimed for A
    assert op(users, a, "rename", top1 / "jobS",
              top1 / "jobT") == "OK"
    assert rec(st, "jobT") == want(users, a, 0o750)
    assert st.get("jobT/a.pt") == b"written by %d" % users.uid(a)


@pytest.mark.parametrize("kind", ["dir", "s3"])
def test_kept_directory_does_not_overwrite_the_stores(tool, tmp_path, users,
                                                      request, kind):
    """B makes jobX on node 2 while the store refuses writes (B's record
    is kept there); then A makes jobX on node 1 with the store back (A's
    claim is stored) and publishes in it. B's first publish below jobX on
    node 2 is refused and leaves A's record alone; node 2 takes the store's
    owner within about a second (B no longer lists, creates, removes or
    renames there), and A still creates files in its directory."""
    st, block, unblock = refusing_store(request, tmp_path, kind)
    a, b = users.user("cka"), users.user("ckb")
    m1 = start(tool, tmp_path, st, users, "m1")
    m2 = None
    try:
        m2 = start(tool, tmp_path, st, users, "m2")
        d1, d2 = m1.ck / "jobX", m2.ck / "jobX"
        block()
        assert op(users, b, "mkdir", d2, "777") == "OK"    # kept on node 2
        w = users.popen(b, ["/usr/bin/python3", "-c", WRITER, d2 / "b.pt"],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert w.stdout.readline() == b"open\n"
        unblock()
        assert rec(st, "jobX") is None
        assert op(users, a, "mkdir", d1, "700") == "OK"    # claimed
        assert rec(st, "jobX") == want(users, a, 0o700)
        assert op(users, a, "create", d1 / "a.pt", "077") == "OK"
        # B's publish under jobX (at its close): refused, A's record stays
        out, _ = w.communicate(b"close\n", timeout=60)
        assert out.decode().strip() != "OK"
        assert rec(st, "jobX") == want(users, a, 0o700)
        assert st.get("jobX/b.pt") is None
        log = m2.log_text()
        assert "jobX/b.pt is not published: its directory jobX is uid " \
            "%d's" % users.uid(a) in log, log[-2000:]
        wait_for(lambda: owner(d2) == (users.uid(a), users.gid(a), 0o700),
                 "node 2 taking the store's owner of jobX", 5)
        wait_for(lambda: (d2 / "a.pt").exists(), "a.pt on node 2", 10)
        for d, top in ((d1, m1.ck), (d2, m2.ck)):
            expect(users, b, [(("list", d), "EACCES"),
                              (("create", d / "b2.pt", "022"), "EACCES"),
                              (("unlink", d / "a.pt"), "EACCES"),
                              (("rename", d / "a.pt", top / "took"),
                               "EACCES")])
        assert op(users, a, "create", d1 / "a2.pt", "077") == "OK"
        assert op(users, a, "create", d2 / "a3.pt", "077") == "OK"
        assert rec(st, "jobX") == want(users, a, 0o700)
        assert st.get("jobX/a3.pt") == b"written by %d" % users.uid(a)
    finally:
        close_all(m2, m1, st)
