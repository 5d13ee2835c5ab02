"""cachectl against a running stager daemon (docs/cachectl.md): status,
pin/unpin, quota, priority, policy, evict, audit; refusals for non-admins
(a second uid through the `users` fixture), invalid input refused before
anything changes, the append-only audit table, and evict while verify jobs
read the same dataset through the cache; gc (dry run, each kind of
garbage, the admin check, a concurrent reader and filler)."""
import fcntl
import hashlib
import json
import os
import socket
import sqlite3
import struct
import threading
import time

import pytest

from test_stager import MiB, Stager, data, make_dataset, stager_dir  # noqa: F401 (a fixture)

FILES = {"a.bin": data(11, 2 * MiB + 7), "dir/b.bin": data(12, 300000),
         "c.txt": b"hello\n"}


class Ctl:
    """cachectl with the daemon's config, as root or as another user."""

    def __init__(self, exe, daemon):
        self.exe, self.d = exe, daemon

    def run(self, *args, prefix=(), timeout=60):
        return __import__("subprocess").run(
            list(prefix) + [self.exe, "--config", str(self.d.cfg)] +
            [str(a) for a in args], env=self.d.env, capture_output=True,
            timeout=timeout)

    def ok(self, *args, prefix=()):
        p = self.run(*args, prefix=prefix)
        assert p.returncode == 0, (args, p.returncode, p.stderr.decode())
        return p

    def json(self, *args, prefix=()):
        return json.loads(self.ok(*args, "--json", prefix=prefix).stdout)

    def audit(self):
        return self.json("audit")


def raw(sock, line):
    """One request straight to the daemon (bypassing cachectl's own
    checks): the end line's rc and msg."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(str(sock))
    s.sendall(line.encode() + b"\n")
    buf = b""
    deadline = time.time() + 30
    while b"type=end" not in buf and time.time() < deadline:
        b = s.recv(65536)
        if not b:
            break
        buf += b
    s.close()
    end = [ln for ln in buf.decode().split("\n") if "type=end" in ln][0]
    f = dict(x.split("=", 1) for x in end.split("\t"))
    return int(f["rc"]), f.get("msg", "")


@pytest.fixture
def env(tool, stager_dir):
    make_dataset(stager_dir / "src", FILES)
    s = Stager(tool("stager"), stager_dir, cache_size="64M").start()
    try:
        s.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
        s.run("stage", "ds", "--wait", check=True)
        yield s, Ctl(tool("cachectl"), s)
    finally:
        s.stop()


def ds_row(st, name="ds"):
    return [d for d in st["datasets"] if d["name"] == name][0]


def state(ctl):
    """What a refused change must leave as it was."""
    st = ctl.json("status")
    return (ds_row(st), ctl.json("policy", "show"), len(ctl.audit()))


def test_status(env):
    s, ctl = env
    size = sum(len(v) for v in FILES.values()) + \
        len((s.root / "src" / "SHA256SUMS").read_bytes())
    st = ctl.json("status")
    assert st["capacity"] == 64 * MiB and st["capacity_from"] == "config"
    assert st["high_watermark"] == 90 and st["low_watermark"] == 80
    assert st["used"] >= size and st["free"] == st["capacity"] - st["used"]
    d = ds_row(st)
    assert d["bytes"] == size and d["cached"] == size
    assert d["pinned"] == 0 and d["quota"] == 0 and d["priority"] == 0
    assert st["bytes_from_source"] >= size and st["jobs_running"] == 0
    # a verify through the cache reads what is there: hits, from cache
    s.run("verify", "ds", check=True)
    st2 = ctl.json("status")
    assert st2["hits"] > st["hits"]
    assert st2["bytes_from_cache"] >= st["bytes_from_cache"] + size
    text = ctl.ok("status").stdout.decode()
    assert "hit ratio" in text and "ds " in text and "watermarks" in text


def test_mutations_take_effect_and_are_audited(env):
    s, ctl = env
    ctl.ok("pin", "ds")
    ctl.ok("quota", "ds", "10M")
    ctl.ok("priority", "ds", "-5")
    d = ds_row(ctl.json("status"))
    assert (d["pinned"], d["quota"], d["priority"]) == (1, 10 * MiB, -5)
    # the stager sees the same catalog at once
    ls = s.json("list")[0]
    assert ls["pinned"] == 1 and ls["priority"] == -5
    ctl.ok("quota", "ds", "none")
    ctl.ok("unpin", "ds")
    d = ds_row(ctl.json("status"))
    assert (d["pinned"], d["quota"]) == (0, 0)
    a = ctl.audit()
    got = [(r["action"], r["target"], r["old"], r["new"]) for r in a]
    assert ("dataset.add", "ds", "", "file://%s/src/" % s.root) in got
    assert ("stage", "ds", "", "") in got
    assert ("pin", "ds", "unpinned", "pinned") in got
    assert ("quota", "ds", "0", str(10 * MiB)) in got
    assert ("priority", "ds", "0", "-5") in got
    assert ("quota", "ds", str(10 * MiB), "0") in got
    assert ("unpin", "ds", "pinned", "unpinned") in got
    assert all(r["uid"] == 0 and r["user"] == "root" for r in a)
    # filters
    assert len(ctl.json("audit", "--user", "root")) == len(a)
    assert len(ctl.json("audit", "--user", "0")) == len(a)
    assert ctl.json("audit", "--user", "nobody-here") == []
    assert ctl.json("audit", "--since", str(int(time.time()) + 3600)) == []
    assert len(ctl.json("audit", "--since", "1h")) == len(a)
    # stager's cancel is recorded with the state it had
    text = ctl.ok("audit").stdout.decode()
    assert "pin ds: unpinned -> pinned" in text


def test_policy_set_show_and_persisted(env):
    s, ctl = env
    p = ctl.json("policy", "set", "--capacity", "128M",
                 "--high-watermark", "95", "--low-watermark", "85%")
    assert (p["capacity"], p["high_watermark"], p["low_watermark"]) == \
        (128 * MiB, 95, 85)
    assert p["capacity_from"] == "catalog" and p["low_from"] == "catalog"
    a = [r for r in ctl.audit() if r["action"] == "policy.set"]
    assert [(r["target"], r["old"], r["new"]) for r in a][:3] == [
        ("cache.size", str(64 * MiB), str(128 * MiB)),
        ("cache.high_watermark", "90", "95"),
        ("cache.low_watermark", "80", "85")]
    # stager's "larger than the cache" check uses it
    ctl.ok("policy", "set", "--capacity", "1M")
    r = s.run("stage", "ds")
    assert r.returncode == 1 and b"larger than the cache (1.0 MiB, " \
        b"cachectl policy)" in r.stderr, r.stderr
    ctl.ok("policy", "set", "--capacity", "128M")
    s.stop()
    s.start()
    p = ctl.json("policy", "show")
    assert (p["capacity"], p["high_watermark"], p["low_watermark"]) == \
        (128 * MiB, 95, 85)
    assert ctl.json("status")["capacity"] == 128 * MiB


def test_policy_reaches_the_running_cache(env):
    """A capacity and watermarks set with policy set are the running
    cache's own: an eviction takes the newest at once (reservations
    within CACHE_POLICY_TTL, 2 s) and goes down to the new low
    watermark."""
    s, ctl = env
    used = ctl.json("status")["used"]
    assert used > 1 * MiB
    ctl.ok("policy", "set", "--capacity", "2M", "--high-watermark", "50",
           "--low-watermark", "25")
    r = ctl.json("evict", "--to-low-watermark")
    st = ctl.json("status")
    assert st["used"] <= 2 * MiB // 100 * 25, (r, st)
    assert r["freed"] >= used - 2 * MiB // 100 * 25


def test_cache_ignores_bad_limits_in_the_catalog(env):
    """Watermarks written to the catalog by hand, low above high, are not
    taken by the running cache: it keeps its limits and logs why."""
    s, ctl = env
    used = ctl.json("status")["used"]
    db = sqlite3.connect(str(s.root / "catalog.db"), timeout=10)
    db.executemany("INSERT INTO policy(key, value, updated) VALUES(?, ?, 0)",
                   [("cache.size", str(2 * MiB)),
                    ("cache.high_watermark", "50"),
                    ("cache.low_watermark", "60")])
    db.commit()
    db.close()
    r = ctl.json("evict", "--to-low-watermark")
    assert r["freed"] == 0 and ctl.json("status")["used"] == used
    assert "low must be below high" in s.log.read_text()


@pytest.mark.parametrize("args,rc,msg", [
    (("quota", "ds", "-5"), 2, "quota '-5'"),
    (("quota", "ds", "12XB"), 2, "quota '12XB'"),
    (("quota", "ds", "0"), 2, "quota '0'"),
    (("quota", "nosuch", "5M"), 5, "no dataset named nosuch"),
    (("pin", "nosuch"), 5, "no dataset named nosuch"),
    (("priority", "ds", "5000"), 2, "-1000 to 1000"),
    (("priority", "ds", "x"), 2, "priority 'x'"),
    (("policy", "set", "--low-watermark", "95"), 2,
     "low watermark 95% is not below the high watermark 90%"),
    (("policy", "set", "--high-watermark", "50"), 2,
     "low watermark 80% is not below the high watermark 50%"),
    (("policy", "set", "--capacity", "-1G"), 2, "--capacity '-1G'"),
    (("policy", "set", "--high-watermark", "101"), 2, "1 to 100"),
    (("policy", "set"), 2, "give --capacity"),
    (("evict",), 2, "give a DATASET, --to-low-watermark or --older-than"),
    (("evict", "ds", "--older-than", "1h"), 2, "(one of them)"),
    (("evict", "--older-than", "0"), 2, "--older-than '0'"),
    (("evict", "--older-than", "-1h"), 2, "--older-than '-1h'"),
    (("evict", "--older-than", "3y"), 2, "--older-than '3y'"),
    (("evict", "nosuch"), 5, "no dataset named nosuch"),
    (("audit", "--since", "yesterday-ish"), 2, "--since 'yesterday-ish'"),
])
def test_invalid_input_refused_before_any_change(env, args, rc, msg):
    s, ctl = env
    before = state(ctl)
    p = ctl.run(*args)
    assert p.returncode == rc, p.stderr.decode()
    assert msg in p.stderr.decode()
    assert state(ctl) == before


@pytest.mark.parametrize("line,msg", [
    ("cmd=cache.quota\tname=ds\tquota=-5", "quota ds: '-5' is not a size"),
    ("cmd=cache.quota\tname=ds\tquota=1e9", "is not a size"),
    ("cmd=cache.priority\tname=ds\tpriority=1001", "-1000 to 1000"),
    ("cmd=cache.policy.set\tcapacity=10", "at least 1 MiB"),
    ("cmd=cache.policy.set\thigh=0", "percentage from 1 to 100"),
    ("cmd=cache.policy.set\tlow=90\thigh=90", "is not below"),
    ("cmd=cache.evict\tname=ds\tto_low=1", "(one of them)"),
    ("cmd=cache.evict\tolder_than=-1", "older_than=-1: expected seconds"),
    ("cmd=cache.evict\tolder_than=0", "older_than=0: expected seconds"),
])
def test_daemon_checks_input_itself(env, line, msg):
    """The daemon does not trust its client: the same refusals when the
    request comes straight to the socket."""
    s, ctl = env
    before = state(ctl)
    rc, m = raw(s.sock, line)
    assert rc == -22 and msg in m, m
    assert state(ctl) == before


def test_quota_below_pinned_bytes_refused(env):
    s, ctl = env
    ctl.ok("pin", "ds")
    cached = ds_row(ctl.json("status"))["cached"]
    before = state(ctl)
    p = ctl.run("quota", "ds", str(cached - 1))
    assert p.returncode == 2
    assert ("below the %d bytes it has pinned" % cached) in p.stderr.decode()
    assert state(ctl) == before
    ctl.ok("quota", "ds", str(cached))  # at least what it holds: fine
    ctl.ok("unpin", "ds")
    ctl.ok("quota", "ds", "1K")  # unpinned: the quota evicts instead


def test_evict(env):
    s, ctl = env
    cached = ds_row(ctl.json("status"))["cached"]
    r = ctl.json("evict", "ds", "--dry-run")
    assert r["freed"] == cached and r["dry_run"] == 1
    assert ds_row(ctl.json("status"))["cached"] == cached
    assert not [a for a in ctl.audit() if a["action"] == "evict"]
    r = ctl.json("evict", "ds")
    assert r["freed"] == cached and r["busy_files"] == 0
    assert ds_row(ctl.json("status"))["cached"] == 0
    assert [(a["target"], a["new"]) for a in ctl.audit()
            if a["action"] == "evict"] == [("ds", str(cached))]
    # fetched again on the next read (verify fetches what is missing only
    # when asked to)
    s.run("verify", "ds", "--fetch-missing", check=True)
    assert ds_row(ctl.json("status"))["cached"] == cached
    # down to the low watermark: 80% of 64M is more than is used
    r = ctl.json("evict", "--to-low-watermark", "--dry-run")
    assert r["freed"] == 0
    ctl.ok("policy", "set", "--capacity", "2M", "--high-watermark", "20",
           "--low-watermark", "10")
    r = ctl.json("evict", "--to-low-watermark", "--dry-run")
    assert r["freed"] == ctl.json("status")["used"] - (2 * MiB // 100 * 10)


def test_evict_older_than_and_last_access(env):
    s, ctl = env
    t0 = time.time()
    d = ds_row(ctl.json("status"))
    cached = d["cached"]
    assert t0 - 120 <= d["last_access"] <= t0 + 1
    # everything was read moments ago: nothing is older than an hour
    r = ctl.json("evict", "--older-than", "1h")
    assert r["freed"] == 0 and ds_row(ctl.json("status"))["cached"] == cached
    time.sleep(2.2)  # access times are kept to the second
    r = ctl.json("evict", "--older-than", "1s", "--dry-run")
    assert r["freed"] == cached and r["dry_run"] == 1
    assert ds_row(ctl.json("status"))["cached"] == cached
    r = ctl.json("evict", "--older-than", "1s")
    assert r["freed"] == cached
    assert ds_row(ctl.json("status"))["cached"] == 0
    got = [(a["target"], a["new"]) for a in ctl.audit()
           if a["action"] == "evict"]
    assert got == [("older-than 3600s", "0"), ("older-than 1s", str(cached))]


def test_evict_while_reading(env):
    """verify --cache --fetch-missing jobs read the dataset through the
    cache and compare every file's SHA-256 while evict drops it again and
    again: every verify passes (an open file is left to its reader, a
    dropped one is fetched again)."""
    s, ctl = env
    results, stop = [], threading.Event()

    def reader():
        for _ in range(30):
            if stop.is_set():
                break
            p = s.run("verify", "ds", "--cache", "--fetch-missing",
                      timeout=120)
            results.append((p.returncode, p.stdout + p.stderr))

    t = threading.Thread(target=reader)
    t.start()
    freed = busy = 0
    deadline = time.time() + 60
    try:
        for _ in range(200):
            if time.time() > deadline or len(results) >= 8:
                break
            r = ctl.json("evict", "ds")
            freed += r["freed"]
            busy += r["busy_files"]
    finally:
        stop.set()
        t.join(180)
    assert results and all(rc == 0 for rc, _ in results), results
    assert freed > 0  # the evictions did take data away between reads


def test_non_admin_reads_status_and_is_refused_changes(tool, stager_dir,
                                                        users):
    g = users.group("adm")
    team = users.group("team")
    outsider = users.user("out")
    admin = users.user("adm", groups=[g])
    make_dataset(stager_dir / "src", FILES)
    s = Stager(tool("stager"), stager_dir, admin_group=g).start()
    users.reach(stager_dir)
    ctl = Ctl(tool("cachectl"), s)
    try:
        s.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
        s.run("add", "secret", "file://%s/src/" % stager_dir,
              "--group", team, check=True)
        out = users.prefix(outsider)
        st = ctl.json("status", prefix=out)
        assert [d["name"] for d in st["datasets"]] == ["ds"]
        assert "secret" not in ctl.ok("status", prefix=out).stdout.decode()
        assert ctl.json("policy", "show", prefix=out)["capacity"] > 0
        before = state(ctl)
        for args in (("pin", "ds"), ("unpin", "ds"), ("quota", "ds", "1M"),
                     ("priority", "ds", "3"),
                     ("policy", "set", "--capacity", "1G"),
                     ("evict", "ds"), ("evict", "--to-low-watermark"),
                     ("audit",), ("pin", "secret")):
            p = ctl.run(*args, prefix=out)
            err = p.stderr.decode()
            assert p.returncode == 4, (args, p.returncode, err)
            assert "permission denied" in err and ("group '%s'" % g) in err
            assert ("uid %d (%s)" % (users.uid(outsider), outsider)) in err
        assert state(ctl) == before
        # a member of the admin group may, and is recorded by name
        ctl.ok("pin", "ds", prefix=users.prefix(admin))
        a = ctl.audit()[-1]
        assert (a["action"], a["uid"], a["user"]) == \
            ("pin", users.uid(admin), admin)
        assert ctl.ok("audit", "--user", admin).stdout.count(b"\n") == 1
    finally:
        s.stop()


def test_audit_table_append_only(env):
    s, ctl = env
    ctl.ok("pin", "ds")
    n = len(ctl.audit())
    db = sqlite3.connect(str(s.root / "catalog.db"), timeout=10)
    for sql in ("UPDATE audit SET user = 'x'", "DELETE FROM audit"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute(sql)
            db.commit()
    db.close()
    assert len(ctl.audit()) == n


def test_audit_write_failure_reported(env):
    """A change whose audit record cannot be written stays made, and the
    admin who asked is told so (exit 0, a warning naming the failure), as
    is the daemon's log; the next change, audited again, carries none.
    The insert is made to fail by a trigger added to the real catalog."""
    s, ctl = env
    n = len(ctl.audit())
    db = sqlite3.connect(str(s.root / "catalog.db"), timeout=10)
    db.execute("CREATE TRIGGER test_no_insert BEFORE INSERT ON audit BEGIN "
               "SELECT RAISE(ABORT, 'audit disk gone (test)'); END")
    db.commit()
    p = ctl.ok("pin", "ds")
    err = p.stderr.decode()
    assert "cachectl: warning: pin ds was done, but its audit record " \
        "could not be written" in err, err
    assert ds_row(ctl.json("status"))["pinned"] == 1  # the change stands
    assert len(ctl.audit()) == n
    p = ctl.ok("priority", "ds", "3")  # a stager-side writer too
    assert "warning: priority ds was done" in p.stderr.decode()
    db.execute("DROP TRIGGER test_no_insert")
    db.commit()
    db.close()
    p = ctl.ok("unpin", "ds")
    assert p.stderr.decode() == ""  # no warning left over on the request
    got = [(r["action"], r["target"]) for r in ctl.audit()]
    assert got.count(("unpin", "ds")) == 1 and len(got) == n + 1


def test_help_and_exit_codes(env, tool):
    s, ctl = env
    for cmd in ("status", "pin", "unpin", "quota", "priority", "policy",
                "evict", "gc", "audit"):
        p = ctl.run(cmd, "--help")
        assert p.returncode == 0 and b"usage: cachectl " + cmd.encode() \
            in p.stdout
    assert ctl.run("--help").returncode == 0
    assert ctl.run("frobnicate").returncode == 2
    assert ctl.run("pin").returncode == 2
    assert ctl.run("status", "--dry-run").returncode == 2
    s.stop()
    p = ctl.run("status")
    assert p.returncode == 3 and b"not running" in p.stderr
    s.start()


# ---- gc: orphans, stale catalog rows, staging leftovers ----

HOUR = 3600


def cache_files(s):
    """{path: key} of the daemon's objects' data files (the key from the
    header in the sidecar, PATH.meta: the dataset's name, then the key, at
    offset 64)."""
    out = {}
    for m in sorted((s.root / "cache" / "objects").glob("*/*.meta")):
        h = m.read_bytes()[:4096]
        p = m.with_name(m.name[:-len(".meta")])
        if h[:8] != b"DSTGOBJ1" or not p.exists():
            continue
        dl, kl = struct.unpack_from("<II", h, 32)
        out[p] = h[64 + dl:64 + dl + kl].decode()
    return out


def make_orphan(s, ctl):
    """Change c.txt (and so SHA256SUMS) and refresh ds: the old versions'
    cache files are no longer owned by any catalog entry. Returns their
    paths."""
    old = sorted(p for p, k in cache_files(s).items()
                 if k in ("c.txt", "SHA256SUMS"))
    assert len(old) == 2
    src = s.root / "src"
    (src / "c.txt").write_bytes(b"hello, again\n")
    (src / "SHA256SUMS").write_text("".join(
        "%s  %s\n" % (hashlib.sha256((src / k).read_bytes()).hexdigest(), k)
        for k in sorted(FILES)))
    s.run("refresh", "ds", check=True)
    return old


def blocks_rows(s, sql=None):
    """The blocks table's rows per path (after running sql). The daemon is
    stopped meanwhile: a sqlite3 connection of another process must not
    overlap the daemon's (see the note on catalog_file_guard in the
    commit that added this)."""
    s.stop()
    db = sqlite3.connect(str(s.root / "catalog.db"), timeout=10)
    try:
        if sql:
            db.execute(sql)
            db.commit()
        return db.execute("SELECT o.path, count(*) FROM blocks b JOIN "
                          "objects o ON o.id = b.object_id GROUP BY "
                          "o.path ORDER BY o.path").fetchall()
    finally:
        db.close()
        s.start()


def make_stale_rows(s):
    """Per-block rows for a.bin (cached) and dir/b.bin, whose cache file is
    then removed: b.bin's rows are stale."""
    blocks_rows(s, "INSERT INTO blocks(object_id, block, state, checksum) "
                "SELECT o.id, k.b, 1, 0 FROM objects o JOIN manifests m ON "
                "m.id = o.manifest_id AND m.state = 1, (SELECT 0 AS b UNION "
                "SELECT 1) k WHERE o.path IN ('a.bin', 'dir/b.bin')")
    b = [p for p, k in cache_files(s).items() if k == "dir/b.bin"]
    assert len(b) == 1
    b[0].unlink()
    assert blocks_rows(s) == [("a.bin", 2), ("dir/b.bin", 2)]


def age(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))


def make_leftovers(s):
    """Torn and stray files in the cache, temporary journal records and
    abandoned partial files in the checkpoint staging directory: old ones
    (2 h), and young ones (a minute, 45 minutes) gc keeps by default.
    Returns (old, young, middle) path lists."""
    objs = s.root / "cache" / "objects"
    st = s.root / "staging"
    for d in (objs / "ab", st / "journal", st / "abandoned"):
        d.mkdir(parents=True, exist_ok=True)
    old = [objs / "ab" / ("0" * 30), objs / "ab" / "fill.tmp",
           objs / "stray", st / "journal" / ".41.tmp",
           st / "abandoned" / "41-partial.bin"]
    young = [objs / "ab" / "young.tmp", st / "abandoned" / "42-young.bin"]
    middle = [st / "journal" / ".43.tmp"]
    keep = [st / "journal" / "44"]  # a record, not a temporary: never
    for p in old + young + middle + keep:
        p.write_bytes(b"DSTGOBJ1 torn" if p.name.startswith("0") else
                      os.urandom(5000))
    for p in old + keep:
        age(p, 2 * HOUR)
    for p in middle:
        age(p, 45 * 60)
    return old, young, middle, keep


@pytest.fixture
def gcenv(env):
    """env, with checkpoints.staging_dir set (the daemon restarted)."""
    s, ctl = env
    s.stop()
    with open(s.cfg, "a") as f:
        f.write("[checkpoints]\nstaging_dir = %s/staging\n" % s.root)
    s.start()
    return s, ctl


def test_gc_dry_run_changes_nothing(gcenv):
    s, ctl = gcenv
    orphans = make_orphan(s, ctl)
    make_stale_rows(s)
    old, young, middle, keep = make_leftovers(s)
    files = sorted(p for p in s.root.rglob("*") if p.is_file()
                   and "catalog.db" not in p.name and p.name != "daemon.log")
    n_audit = len(ctl.audit())
    r = ctl.json("gc", "--dry-run")
    assert r["dry_run"] == 1 and r["min_age"] == HOUR
    assert (r["orphan_files"], r["stale_objects"], r["stale_rows"],
            r["leftover_files"]) == (2, 1, 2, len(old))
    # an object's bytes: its data file's and its sidecar's
    assert r["orphan_bytes"] == sum(
        q.stat().st_blocks * 512
        for p in orphans for q in (p, p.with_name(p.name + ".meta")))
    assert sorted(p for p in s.root.rglob("*") if p.is_file()
                  and "catalog.db" not in p.name
                  and p.name != "daemon.log") == files
    assert blocks_rows(s) == [("a.bin", 2), ("dir/b.bin", 2)]
    assert len(ctl.audit()) == n_audit
    text = ctl.ok("gc", "--dry-run").stdout.decode()
    assert "would remove 2 cache files" in text


def test_gc_removes_orphans(gcenv):
    s, ctl = gcenv
    orphans = make_orphan(s, ctl)
    owned = [p for p in cache_files(s) if p not in orphans]
    assert len(owned) == 2
    r = ctl.json("gc")
    assert (r["orphan_files"], r["busy_files"], r["dry_run"]) == (2, 0, 0)
    assert not any(p.exists() for p in orphans)
    assert not any(p.with_name(p.name + ".meta").exists() for p in orphans)
    assert all(p.exists() for p in owned)
    assert all(p.with_name(p.name + ".meta").exists() for p in owned)
    # what the catalog owns is intact: verify reads it from the cache
    s.run("verify", "ds", "--cache", "--fetch-missing", check=True)
    a = [a for a in ctl.audit() if a["action"] == "gc"]
    assert [(x["target"], x["new"].split(",")[0]) for x in a] == \
        [("cache", "orphans 2 (%d bytes)" % r["orphan_bytes"])]
    assert ctl.json("gc")["orphan_files"] == 0


def test_gc_removes_stale_catalog_rows(gcenv):
    s, ctl = gcenv
    make_stale_rows(s)
    r = ctl.json("gc")
    assert (r["stale_objects"], r["stale_rows"]) == (1, 2)
    assert blocks_rows(s) == [("a.bin", 2)]  # its file is there: kept
    assert ctl.json("gc")["stale_rows"] == 0


def test_gc_removes_staging_leftovers(gcenv):
    s, ctl = gcenv
    old, young, middle, keep = make_leftovers(s)
    used = ctl.json("status")["used"]
    r = ctl.json("gc")
    assert r["leftover_files"] == len(old) and r["orphan_files"] == 0
    assert not any(p.exists() for p in old)
    assert all(p.exists() for p in young + middle + keep)
    # the torn file had the magic, so the cache counted it: no more
    assert ctl.json("status")["used"] <= used
    r = ctl.json("gc", "--older-than", "30m")
    assert r["leftover_files"] == len(middle)
    assert all(p.exists() for p in young + keep)
    assert not any(p.exists() for p in middle)
    s.run("verify", "ds", "--cache", check=True)  # the cache is whole


def ofd_lock(fd, byte, kind):
    """Take an OFD lock on one byte of fd, as the cache does (a reader:
    the shared in-use byte; a filler: a block's byte, exclusively)."""
    fl = struct.pack("hh4xqqi4x", kind, os.SEEK_SET, byte, 1, 0)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, fl)


INUSE = 1 << 62  # CACHE_LOCK_INUSE (lib/cache/cache_i.h); block b: INUSE + 1 + b


def test_gc_safe_with_concurrent_reader(gcenv):
    """A file another process reads (its in-use lock) or fills (a block's
    lock) is never removed: reported busy, removed once released. And
    verify jobs reading the dataset while gc runs again and again all
    pass."""
    s, ctl = gcenv
    orphan, other = make_orphan(s, ctl)
    assert ctl.json("gc", "--dry-run")["orphan_files"] == 2
    free = 1  # the first gc removes the other orphan, nobody holds it
    for byte, kind in ((INUSE, fcntl.F_RDLCK), (INUSE + 1, fcntl.F_WRLCK)):
        fd = os.open(orphan, os.O_RDWR)
        try:
            ofd_lock(fd, byte, kind)
            r = ctl.json("gc")
            assert (r["orphan_files"], r["busy_files"]) == (free, 1), r
            assert orphan.exists() and not other.exists()
            free = 0
        finally:
            os.close(fd)  # the kernel drops the OFD locks
    results, stop = [], threading.Event()

    def reader():
        for _ in range(20):
            if stop.is_set():
                break
            p = s.run("verify", "ds", "--cache", "--fetch-missing",
                      timeout=120)
            results.append((p.returncode, p.stdout + p.stderr))

    t = threading.Thread(target=reader)
    t.start()
    removed = 0
    deadline = time.time() + 60
    try:
        for _ in range(100):
            if time.time() > deadline or len(results) >= 5:
                break
            removed += ctl.json("gc")["orphan_files"]
    finally:
        stop.set()
        t.join(180)
    assert results and all(rc == 0 for rc, _ in results), results
    assert removed == 1 and not orphan.exists()


def test_gc_refused_for_non_admin(tool, stager_dir, users):
    make_dataset(stager_dir / "src", FILES)
    s = Stager(tool("stager"), stager_dir).start()
    users.reach(stager_dir)
    ctl = Ctl(tool("cachectl"), s)
    try:
        s.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
        s.run("stage", "ds", "--wait", check=True)
        orphans = make_orphan(s, ctl)
        out = users.prefix(users.user("gcout"))
        n_audit = len(ctl.audit())
        for args in (("gc",), ("gc", "--dry-run")):
            p = ctl.run(*args, prefix=out)
            assert p.returncode == 4, (args, p.returncode, p.stderr)
            assert b"permission denied" in p.stderr
        assert all(p.exists() for p in orphans)
        assert len(ctl.audit()) == n_audit
        assert ctl.json("gc")["orphan_files"] == 2  # root may
    finally:
        s.stop()
