"""Integration tests of the checkpoint lifecycle (lib/lifecycle/, lib/format/lifecycle.c,
stager/daemon/daemon_lifecycle.c, `stager lifecycle`, `cachectl lifecycle`)
and of the stager daemon's publish-retry job, against a real dstagefs mount
and a running daemon that share a staging directory and a store (a
directory, and radosgw).

The rules' clock is injected with `lifecycle run --as-of T`: checkpoints
written now are judged as if T had come.
"""
import json
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from test_checkpoints import (Ckpt, DirStore, S3Store, catalog_rows, sha,
                              writer)
from waits import wait_for
from test_stager import Stager

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"),
                                reason="no /dev/fuse")

DAY = 86400


class Daemon(Stager):
    """A stager daemon whose [checkpoints] are those of mount m."""

    def __init__(self, tool, root, m, env=None, interval="0"):
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        super().__init__(tool("stager"), root, env=env or m.store.env)
        self.cachectl = tool("cachectl")
        self.cfg.write_text(
            self.cfg.read_text() +
            "[checkpoints]\nstore = %s\nstaging_dir = %s\n"
            "retry_interval = 1s\nlifecycle_interval = %s\n%s" %
            (m.store.url, m.staging_dir, interval, m.store.conf))

    def lc(self, *args, check=True):
        return self.run("lifecycle", *args, check=check)

    def lc_json(self, *args):
        return json.loads(self.lc(*args, "--json").stdout)

    def ctl(self, *args, prefix=()):
        return subprocess.run(list(prefix) + [self.cachectl, "--config",
                                              str(self.cfg)] + list(args),
                              env=self.env, capture_output=True, timeout=120)

    def audit(self):
        p = self.ctl("audit", "--json")
        assert p.returncode == 0, p.stderr
        return [a for a in json.loads(p.stdout)
                if a["action"].startswith("lifecycle.")]


def raw(sock, **fields):
    """One request over the socket, bypassing the client's checks."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(str(sock))
    s.sendall(("\t".join("%s=%s" % kv for kv in fields.items()) +
               "\n").encode())
    buf = b""
    for _ in range(1000):
        d = s.recv(65536)
        if not d:
            break
        buf += d
        if b"type=end" in buf and buf.endswith(b"\n"):
            break
    s.close()
    for ln in buf.decode().splitlines():
        f = dict(x.split("=", 1) for x in ln.split("\t") if "=" in x)
        if f.get("type") == "end":
            return int(f["rc"]), f.get("msg", "")
    raise AssertionError("no end line: %r" % buf)


@pytest.fixture
def dirmount(tool, tmp_path):
    m = Ckpt(tool, tmp_path / "m", DirStore(tmp_path / "store"))
    m.start()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture
def daemon(tool, tmp_path, dirmount):
    d = Daemon(tool, tmp_path / "d", dirmount).start()
    try:
        yield d
    finally:
        d.stop()


# ---- rules: add, list, remove, refusals, audit ----

def test_rules_add_list_remove_refused_and_audited(daemon):
    d = daemon
    p = d.lc("add", "llm-*", "--keep-local", "2", "--shared-days", "7",
             "--delete-days", "30", "--keep-every", "1000", "--archive",
             "s3://archive/ckpt/", "--storage-class", "GLACIER")
    assert b"added rule" in p.stdout
    r = d.lc_json("add", "vit", "--delete-days", "5")
    assert r["pattern"] == "vit" and r["keep_local"] == 1
    rules = d.lc_json("list")
    assert [x["pattern"] for x in rules] == ["llm-*", "vit"]
    assert rules[0]["storage_class"] == "GLACIER"
    assert rules[0]["shared_days"] == 7 and rules[0]["keep_every"] == 1000
    # cachectl sees the same rules through the same requests
    p = d.ctl("lifecycle", "list", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == rules

    # contradictory rules are refused before anything changes
    bad = [
        (["x", "--shared-days", "30", "--delete-days", "7", "--archive",
          "file:///tmp/a/"], b"--delete-days 7 is less than"),
        (["x", "--keep-local", "0"], b"--keep-local 0"),
        (["x[", "--keep-local", "1"], b"'[' without its ']'"),
        (["x", "--shared-days", "3"], b"needs --archive"),
        (["llm-*"], b"exists"),
    ]
    n_audit = len(d.audit())
    for args, msg in bad:
        p = d.lc("add", *args, check=False)
        assert p.returncode == 2, (args, p.stderr)
        assert msg in p.stderr, (args, p.stderr)
    # the daemon refuses them too when a client does not check first
    rc, msg = raw(d.sock, cmd="lifecycle.add", name="y", keep_local="3",
                  shared_days="10", delete_days="2", archive="s3://a/")
    assert rc == -22 and "less than --shared-days" in msg, msg
    rc, msg = raw(d.sock, cmd="lifecycle.add", name="y", keep_local="0")
    assert rc == -22 and "keep at least 1" in msg, msg
    rc, msg = raw(d.sock, cmd="lifecycle.add", name="y", keep_local="-1")
    assert rc == -22 and "whole number" in msg, msg
    assert d.lc_json("list") == rules
    assert len(d.audit()) == n_audit

    p = d.ctl("lifecycle", "remove", "vit")
    assert p.returncode == 0, p.stderr
    assert d.lc("remove", "nope", check=False).returncode == 5
    assert [x["pattern"] for x in d.lc_json("list")] == ["llm-*"]
    acts = [(a["action"], a["target"]) for a in d.audit()]
    assert acts == [("lifecycle.add", "llm-*"), ("lifecycle.add", "vit"),
                    ("lifecycle.remove", "vit")]
    rm = d.audit()[-1]
    assert "delete-days=5" in rm["old"] and rm["uid"] == 0


def test_non_admin_refused(tmp_path, daemon, users):
    d = daemon
    users.reach(d.root)
    user = users.user("lcna")
    pre = users.prefix(user)
    d.lc("add", "j", "--keep-local", "1")
    before = d.lc_json("list")
    p = d.run("lifecycle", "list", prefix=pre)
    assert p.returncode == 0, p.stderr
    for args in (["add", "k", "--keep-local", "2"], ["remove", "j"],
                 ["run"], ["run", "--dry-run"]):
        p = d.run("lifecycle", *args, prefix=pre)
        assert p.returncode == 4, (args, p.stderr)
        assert b"permission denied" in p.stderr, p.stderr
        p = d.ctl("lifecycle", *args, prefix=pre)
        assert p.returncode == 4, (args, p.stderr)
    assert d.lc_json("list") == before


# ---- recall on read, not on stat ----

def test_stat_shows_archived_without_recall_read_recalls_audited(
        tool, tmp_path, users):
    """A stat of an archived checkpoint (any uid) shows it and its size
    and recalls nothing; an open for read by a reader the mount lets read
    recalls it and writes one lifecycle.recall audit record with the
    reader's uid, in the catalog `cachectl audit` reads. Tested as a
    second, unprivileged uid and as root. Fails with the recall at lookup
    of before (the stat recalls, unaudited)."""
    store, arch = DirStore(tmp_path / "store"), DirStore(tmp_path / "arch")
    # allow_other: the second uid uses the mount, as on a shared node
    m = Ckpt(tool, tmp_path / "m", store, opts=["-o", "allow_other"])
    m.start()
    d = None
    try:
        d = Daemon(tool, tmp_path / "d", m)
        # one node's catalog: the daemon's is dstagefs's
        d.cfg.write_text(d.cfg.read_text().replace(
            str(d.root / "catalog.db"), str(m.tmp / "catalog.db")))
        d.start()
        want = write_checkpoints(m, "llm")
        d.lc("add", "llm", "--shared-days", "1", "--archive", arch.url)
        r = d.lc_json("run", "--as-of", str(int(time.time()) + 3 * DAY))
        assert r["archived"] == 6 and r["errors"] == 0, r
        assert store.get("llm/step-300.pt") is None
        user = users.user("lcrd")
        uid = users.uid(user)
        users.reach(m.tmp)
        n_audit = len(d.audit())
        time.sleep(1.2)   # the kernel's entry and attribute timeouts

        # stat, as the second uid and as root: the size, no recall
        for f in ("step-300.pt", "step-400.pt"):
            path = m.ck / "llm" / f
            p = users.run(user, ["stat", "-c", "%s %F", path])
            assert p.returncode == 0, p.stderr
            assert p.stdout.decode().split()[0] == str(len(want[f])), \
                p.stdout
            assert os.stat(path).st_size == len(want[f])
        p = users.run(user, ["stat", "-c", "%F", m.ck / "llm" / "step-600"])
        assert p.returncode == 0 and b"directory" in p.stdout, p
        time.sleep(1.2)   # and a getattr after the attributes expire
        assert os.stat(m.ck / "llm" / "step-300.pt").st_size == \
            len(want["step-300.pt"])
        for f in ("step-300.pt", "step-400.pt"):
            assert store.get("llm/" + f) is None, f
            assert store.get("llm/.dstage-archived/" + f) is not None, f
        assert "recall" not in m.log_text()
        assert len(d.audit()) == n_audit

        # a read by the second uid recalls, audited as that uid
        p = users.run(user, ["sha256sum", m.ck / "llm" / "step-300.pt"])
        assert p.returncode == 0, p.stderr
        assert p.stdout.decode().split()[0] == sha(want["step-300.pt"])
        assert store.get("llm/step-300.pt") == want["step-300.pt"]
        assert store.get("llm/.dstage-archived/step-300.pt") is None
        assert store.get("llm/step-400.pt") is None  # only what was read
        rec = [a for a in d.audit() if a["action"] == "lifecycle.recall"]
        assert len(rec) == 1, rec
        assert rec[0]["uid"] == uid and rec[0]["user"] == user, rec
        assert rec[0]["target"] == "llm/step-300.pt", rec
        assert rec[0]["old"] == "from " + arch.url, rec
        # read again: in the store now, no second record
        assert (m.ck / "llm" / "step-300.pt").read_bytes() == \
            want["step-300.pt"]
        assert len([a for a in d.audit()
                    if a["action"] == "lifecycle.recall"]) == 1

        # root's read of a file in an archived directory checkpoint
        assert (m.ck / "llm" / "step-600" / "shard1").read_bytes() == \
            want["step-600/shard1"]
        rec = [a for a in d.audit() if a["action"] == "lifecycle.recall"]
        assert len(rec) == 2 and rec[1]["uid"] == 0 and \
            rec[1]["target"] == "llm/step-600", rec
        assert store.get("llm/step-600/shard0") == want["step-600/shard0"]
    finally:
        if d:
            d.stop()
        m.stop()


# ---- move, archive, recall, delete ----

def write_checkpoints(m, job):
    """step-100.pt .. step-500.pt (files) and step-600/ (a directory)."""
    (m.ck / job).mkdir()
    want = {}
    for s in range(100, 600, 100):
        b = os.urandom(70000 + s)
        (m.ck / job / ("step-%d.pt" % s)).write_bytes(b)
        want["step-%d.pt" % s] = b
    (m.ck / job / "step-600").mkdir()
    for i in range(2):
        b = os.urandom(50000 + i)
        (m.ck / job / "step-600" / ("shard%d" % i)).write_bytes(b)
        want["step-600/shard%d" % i] = b
    return want


def archive_store(kind, tmp_path, rgw=None):
    if kind == "dir":
        return DirStore(tmp_path / "archive"), ""
    return S3Store(rgw), "STANDARD"


@pytest.mark.parametrize("kind", ["dir", "s3"])
def test_archive_recall_delete_with_injected_clock(tool, tmp_path, kind,
                                                   request):
    rgw = request.getfixturevalue("rgw") if kind == "s3" else None
    store = DirStore(tmp_path / "store") if kind == "dir" else S3Store(rgw)
    arch, cls = archive_store(kind, tmp_path, rgw)
    m = Ckpt(tool, tmp_path / "m", store)
    m.start()
    d = None
    try:
        d = Daemon(tool, tmp_path / "d", m).start()
        want = write_checkpoints(m, "llm")
        t0 = int(time.time())
        args = ["add", "llm", "--keep-local", "1", "--shared-days", "3",
                "--delete-days", "20", "--keep-every", "400", "--archive",
                arch.url]
        d.lc(*args + (["--storage-class", cls] if cls else []))
        d.lc("add", "other", "--delete-days", "1")

        # today: only the local copies of all but the newest go
        keys = store.keys()
        r = d.lc_json("run")
        assert r["archived"] == r["deleted"] == r["errors"] == 0, r
        assert sorted(a["target"] for a in r["actions"]
                      if a["action"] == "drop-local") == \
            ["llm/step-%d.pt" % s for s in range(100, 600, 100)], r
        assert store.keys() == keys
        tree = m.staging / "tree" / "llm"
        assert sorted(p.name for p in tree.rglob("*")) == \
            ["shard0", "shard1", "step-600"]
        assert (m.ck / "llm" / "step-100.pt").read_bytes() == \
            want["step-100.pt"]         # now read from the store

        # a dry run 5 days on: says it would archive all six, changes
        # nothing (store, local copies, audit)
        keys = store.keys()
        local = sorted(str(p) for p in m.staging.rglob("*"))
        n_audit = len(d.audit())
        r = d.lc_json("run", "--dry-run", "--as-of", str(t0 + 5 * DAY))
        assert r["dry_run"] == 1 and r["archived"] == 6, r
        arch_acts = sorted(a["target"] for a in r["actions"]
                           if a["action"] == "archive")
        assert arch_acts == ["llm/step-%d%s" % (s, "" if s == 600 else ".pt")
                             for s in range(100, 700, 100)]
        assert store.keys() == keys
        assert sorted(str(p) for p in m.staging.rglob("*")) == local
        assert len(d.audit()) == n_audit

        # the run itself
        r = d.lc_json("run", "--as-of", str(t0 + 5 * DAY))
        assert r["archived"] == 6 and r["errors"] == 0, r
        left = [k for k in store.keys() if k.startswith("llm/")]
        assert sorted(left) == sorted(
            "llm/.dstage-archived/step-%d%s" % (s, "" if s == 600 else ".pt")
            for s in range(100, 700, 100)), left
        for k, b in want.items():
            assert sha(arch.get("llm/" + k)) == sha(b), k
            side = arch.get(".dstage-sha256/llm/" + k)
            assert side and side.decode().split()[0] == sha(b), k
        assert not list((m.staging / "tree" / "llm").rglob("*.pt"))

        # reading through the mount recalls them: the same bytes
        time.sleep(1.2)   # the kernel's entry and attribute timeouts
        assert (m.ck / "llm" / "step-300.pt").read_bytes() == \
            want["step-300.pt"]
        for i in range(2):
            k = "step-600/shard%d" % i
            assert (m.ck / "llm" / k).read_bytes() == want[k]
        assert store.get("llm/step-300.pt") == want["step-300.pt"]
        assert store.get("llm/.dstage-archived/step-300.pt") is None
        assert store.get("llm/.dstage-archived/step-600") is None
        assert "recalled llm/step-300.pt" in m.log_text()

        # 25 days on: deleted from every tier but the newest (step-600)
        # and the multiples of 400 (step-400)
        r = d.lc_json("run", "--as-of", str(t0 + 25 * DAY))
        assert r["errors"] == 0, r
        deleted = sorted(a["target"] for a in r["actions"]
                         if a["action"] == "delete")
        assert deleted == ["llm/step-%d.pt" % s for s in (100, 200, 300, 500)]
        for s in (100, 200, 300, 500):
            k = "llm/step-%d.pt" % s
            for st in (store, arch):
                assert st.get(k) is None, k
                assert st.get(".dstage-sha256/" + k) is None, k
            assert store.get("llm/.dstage-archived/step-%d.pt" % s) is None
        assert arch.get("llm/step-400.pt") == want["step-400.pt"]
        # step-600, recalled above, was archived again (3 days on the
        # shared tier as of then) and is recalled again
        assert [a["target"] for a in r["actions"]
                if a["action"] == "archive"] == ["llm/step-600"], r
        assert arch.get("llm/step-600/shard0") == want["step-600/shard0"]
        time.sleep(1.2)
        assert (m.ck / "llm" / "step-400.pt").read_bytes() == \
            want["step-400.pt"]
        assert (m.ck / "llm" / "step-600" / "shard1").read_bytes() == \
            want["step-600/shard1"]
        assert not (m.ck / "llm" / "step-100.pt").exists()

        # every move and deletion is audited, with its rule
        acts = d.audit()
        moved = [a for a in acts if a["action"] == "lifecycle.archive"]
        gone = [a for a in acts if a["action"] == "lifecycle.delete"]
        assert len(moved) == 7 and len(gone) == 4, acts
        assert all("rule 1" in a["new"] for a in moved + gone)
        assert all(a["new"].startswith("to " + arch.url)
                   for a in moved)
    finally:
        if d:
            d.stop()
        m.stop()
        for st in (store, arch):
            if hasattr(st, "cleanup"):
                st.cleanup()


def test_newest_complete_never_deleted(daemon, dirmount):
    m, d = dirmount, daemon
    (m.ck / "old").mkdir()
    for s in (1, 2, 3):
        (m.ck / "old" / ("ep%d" % s)).write_bytes(b"x" * s)
    d.lc("add", "old", "--delete-days", "1")
    r = d.lc_json("run", "--as-of", str(int(time.time()) + 400 * DAY))
    assert sorted(a["target"] for a in r["actions"]
                  if a["action"] == "delete") == ["old/ep1", "old/ep2"]
    assert m.store.get("old/ep3") == b"xxx"


def test_schedule_applies_the_rules(tool, tmp_path, dirmount):
    m = dirmount
    (m.ck / "sj").mkdir()
    for s in (1, 2):
        (m.ck / "sj" / ("step-%d" % s)).write_bytes(b"s" * 1000 * s)
    tree = m.staging / "tree" / "sj"
    assert sorted(os.listdir(tree)) == ["step-1", "step-2"]
    d = Daemon(tool, tmp_path / "d", m, interval="1s").start()
    try:
        d.lc("add", "sj", "--keep-local", "1")
        wait_for(lambda: os.listdir(tree) == ["step-2"], "the scheduled run",
                 30)
        # its audit record comes after the drop: wait for it too (read at
        # once, it raced the daemon in the ASan stage)
        a = wait_for(lambda: [x for x in d.audit()
                              if x["action"] == "lifecycle.drop-local"],
                     "the drop's audit record", 30)
        assert [(x["target"], x["user"], x["uid"]) for x in a] == \
            [("sj/step-1", "lifecycle schedule", 0)], a
        assert m.store.get("sj/step-1") == b"s" * 1000
    finally:
        d.stop()


# ---- the retry job and abandoned files ----

def test_retry_job_publishes_after_the_store_returns(tool, tmp_path,
                                                    dirmount):
    m = dirmount
    (m.ck / "rj").mkdir()
    # the store cannot take rj/...: rj is a file there
    m.store.put("rj", b"in the way")
    data = os.urandom(300000)
    with pytest.raises(OSError):
        with open(m.ck / "rj" / "x.bin", "wb") as f:
            f.write(data)
    # dstagefs stops: only the daemon's retry job can publish it now
    m.stop()
    d = Daemon(tool, tmp_path / "d", m).start()
    try:
        def state():
            rows = [j for j in d.json("jobs") if j.get("kind") == "publish"]
            return rows[0] if rows else None
        row = wait_for(lambda: (state() or {}).get("state") == "retrying"
                       and state(), "a failed retry", 30)
        assert row["dataset"] == "rj/x.bin" and row["error"], row
        p = d.run("jobs", check=True)
        assert b"publish" in p.stdout and b"rj/x.bin" in p.stdout
        assert not (m.store.root / "rj").is_dir()
        (m.store.root / "rj").unlink()      # the store is back
        m.wait_published("rj/x.bin", sha(data), 60, "the retry job's publish")
        wait_for(lambda: (state() or {}).get("state") == "published",
                 "the entry's state", 30)
        assert "published to" in d.log.read_text()
        # its record is C now: a restarted dstagefs does not publish again
        rec = [p.read_text() for p in (m.staging / "journal").iterdir()
               if not p.name.startswith(".")]
        assert any(r.startswith("C ") and "rj/x.bin" in r for r in rec), rec
        # and the daemon recorded its SHA-256 in its catalog
        rows = catalog_rows(m, d.root / "catalog.db")
        assert rows["rj/x.bin"] == (sha(data), len(data)), rows
    finally:
        d.stop()


def test_abandoned_listed_then_removed(daemon, dirmount):
    m, d = dirmount, daemon
    (m.ck / "k").mkdir()
    w = writer(m.ck / "k" / "partial.bin", 2, close=False)
    assert w.stdout.readline().strip() == b"ready"
    w.kill()
    w.wait(30)
    wait_for(lambda: list((m.staging / "abandoned").iterdir()),
             "the abandoned file", 10)
    name = os.listdir(m.staging / "abandoned")[0]
    rows = [j for j in d.json("jobs") if j.get("kind") == "abandoned"]
    assert [r["dataset"] for r in rows] == [name], rows
    assert rows[0]["total"] == 2 << 20
    assert b"abandoned" in d.run("jobs", check=True).stdout
    # kept for checkpoints.abandoned_keep (168h): a run now keeps it, a
    # dry run 8 days on says it goes, the run 8 days on removes it
    d.lc("run")
    assert os.listdir(m.staging / "abandoned") == [name]
    later = str(int(time.time()) + 8 * DAY)
    r = d.lc_json("run", "--dry-run", "--as-of", later)
    assert [a["target"] for a in r["actions"]] == [name], r
    assert os.listdir(m.staging / "abandoned") == [name]
    r = d.lc_json("run", "--as-of", later)
    assert r["abandoned"] == 1, r
    assert os.listdir(m.staging / "abandoned") == []
    assert [a["target"] for a in d.audit()
            if a["action"] == "lifecycle.abandoned"] == [name]
    assert not [j for j in d.json("jobs") if j.get("kind") == "abandoned"]


def test_s3_storage_class_sent_and_failed_move_keeps_the_store(tool,
                                                              tmp_path, rgw):
    """radosgw refuses a storage class it does not know: so the class is
    sent with the archive's PUTs; and a move that fails leaves the
    checkpoint whole in the store (the objects are deleted only after
    the archive has them and the marker is written)."""
    store, arch = S3Store(rgw), S3Store(rgw)
    m = Ckpt(tool, tmp_path / "m", store)
    m.start()
    d = None
    try:
        d = Daemon(tool, tmp_path / "d", m).start()
        (m.ck / "sc").mkdir()
        b = os.urandom(100000)
        (m.ck / "sc" / "step-1").write_bytes(b)
        later = str(int(time.time()) + 2 * DAY)
        d.lc("add", "sc", "--shared-days", "1", "--archive", arch.url,
             "--storage-class", "NO_SUCH_CLASS")
        p = d.lc("run", "--as-of", later, "--json", check=False)
        assert p.returncode == 1, (p.stdout, p.stderr)
        r = json.loads(p.stdout)
        assert r["errors"] == 1 and r["archived"] == 0, r
        assert store.get("sc/step-1") == b
        assert store.get("sc/.dstage-archived/step-1") is None
        assert not [a for a in d.audit() if a["action"] ==
                    "lifecycle.archive"]
        d.lc("remove", "sc")
        d.lc("add", "sc", "--shared-days", "1", "--archive", arch.url,
             "--storage-class", "STANDARD")
        r = d.lc_json("run", "--as-of", later)
        assert r["archived"] == 1 and r["errors"] == 0, r
        assert arch.get("sc/step-1") == b
        assert store.get("sc/step-1") is None
    finally:
        if d:
            d.stop()
        m.stop()
        store.cleanup()
        arch.cleanup()
