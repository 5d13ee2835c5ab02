"""Staging shares that a few uids cannot use to starve the rest (issue 42,
finding 6): with checkpoints.uid_staging_size unset, a uid's share of
checkpoints.staging_size falls as more uids hold staging bytes (S/(N+1),
N the uids holding bytes there, the writer included), so two uids' sparse
files leave room for a third; files of killed writers in abandoned/ count
against their uid until removed, and are removed (oldest first, logged
with the file and its uid) when a write needs their room.
Run as root with throwaway unprivileged users (the `users` fixture) on
one mount with allow_other; a directory store (file://).
"""
import os
import signal
import time

import pytest

from test_checkpoints import Ckpt, DirStore, store
from waits import wait_for  # noqa: F401
from test_ckpt_uid_bounds import MB, hold, op

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")


@pytest.fixture
def shared(tool, tmp_path, users):
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"),
             staging_size="64M", opts=["-o", "allow_other,umask=000"])
    users.reach(m.tmp)
    m.start()
    for d in ("a", "b", "c"):
        (m.ck / d).mkdir()
        os.chmod(m.ck / d, 0o777)
    try:
        yield m
    finally:
        m.stop()


def hold_most(users, user, path, sizes):
    """Hold open a sparse file of the first of sizes (MB) user may (a
    new name each try: a refused one is left to its killed writer)."""
    for size in sizes:
        p, got = hold(users, user, "%s%d" % (path, size), size * MB, 0)
        if got == "OK":
            return p, size
        p.kill()
        p.wait()
        assert got == "EDQUOT", got
    raise AssertionError("no size of %r was allowed" % (sizes,))


def test_two_uids_cannot_starve_a_third(shared, users):
    m = shared
    a, b, c = (users.user(n) for n in ("cqa", "cqb", "cqc"))
    pa, sa = hold_most(users, a, m.ck / "a" / "big", (64, 32, 16))
    pb, sb = hold_most(users, b, m.ck / "b" / "big", (64, 32, 16))
    try:
        # alone, A had half; B, the second, a third
        assert (sa, sb) == (32, 16)
        # (one line each 10 s: A's)
        assert ("uid %d reached checkpoints.uid_staging_size (%d bytes, "
                "its share of checkpoints.staging_size with 1 uids "
                "holding staging bytes" % (users.uid(a), 32 * MB)) \
            in m.log_text()
        # a third uid still writes (its share: a quarter)
        assert op(users, c, "write", m.ck / "c" / "w", 8 * MB) == "OK"
        assert os.path.getsize(m.store.root / "c" / "w") == 8 * MB
    finally:
        for p in (pa, pb):
            p.kill()
            p.wait()


def test_abandoned_files_make_room_oldest_first(shared, users):
    m = shared
    a, b, c = (users.user(n) for n in ("cqa", "cqb", "cqc"))
    ab = m.staging / "abandoned"
    # two writers killed (kill -9), A's first: 32 + 20 MB in abandoned/
    for user, d, size in ((a, "a", 32), (b, "b", 20)):
        p, got = hold(users, user, m.ck / d / "killed", size * MB, 0)
        assert got == "OK"
        p.send_signal(signal.SIGKILL)
        p.wait()
        wait_for(lambda: any(n.endswith("-killed") and
                             os.stat(ab / n).st_uid == users.uid(user)
                             for n in os.listdir(ab)),
                 "the abandoned file of uid %d" % users.uid(user), 20)
        time.sleep(1.1)  # distinct mtimes
    (old,) = [n for n in os.listdir(ab)
              if os.stat(ab / n).st_uid == users.uid(a)]
    # they still count against their uids
    assert op(users, a, "write", m.ck / "a" / "more", 1 * MB) == "EDQUOT"
    # C's 16 MB (its share) needs more than the 12 MB left: A's (the
    # oldest) abandoned file is removed for it, B's stays
    assert op(users, c, "write", m.ck / "c" / "w", 16 * MB) == "OK"
    assert os.path.getsize(m.store.root / "c" / "w") == 16 * MB
    left = os.listdir(ab)
    assert old not in left
    assert [n for n in left if os.stat(ab / n).st_uid == users.uid(b)]
    assert ("removed the abandoned file %s/abandoned/%s of uid %d"
            % (m.staging, old, users.uid(a))) in m.log_text()
