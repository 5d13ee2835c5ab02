# SPDX-License-Identifier: MIT
"""The shared tier's trust rule (issue 42, findings 1 and 5): the tier is as
trustworthy as the source, or it is not used. The publisher refuses a tier
that anyone but the service uid can write (group included) and never keeps
a file it found in place unchecked; readers (stage, verify, dstagefs) apply
the same rule, check each tier file against the catalog's reference hash,
and fall back to the store when the tier fails; FIFOs and empty leases in
the tier never hang a node. Each runs on a local directory and on a real
CephFS (ceph-fuse), the forger being a second, unprivileged uid."""
import errno
import hashlib
import json
import os
import shutil
import subprocess
import time

import pytest

from test_shared_tier import FILES, node, shared, tier_metrics
from test_shared_tier_reads import mount
from test_stager import data, make_dataset, stager_dir  # noqa: F401

# dir/b.bin is not listed in SHA256SUMS: its reference is the store's
SUMS = {k: v for k, v in FILES.items() if k != "dir/b.bin"}
BOUND = 30  # seconds: anything longer is a hang


@pytest.fixture(params=["local", "cephfs"])
def pfs(request, stager_dir):
    """A directory of the parallel file system (or a local one)."""
    if request.param == "local":
        d = stager_dir / "pfs"
        d.mkdir()
        yield d
        return
    ceph = request.getfixturevalue("cephfs")
    d = ceph.mount / ("trust-%d-%d" % (os.getpid(), time.monotonic_ns()))
    d.mkdir()
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def mallory(users):
    """A second, unprivileged uid in the tier's group (teamx)."""
    g = users.group("teamx")
    return users, users.user("mal", groups=[g]), g


def tier_node(tool, stager_dir, pfs, own=True):
    """A node with dataset ds registered; its tier pfs/tier (the dataset's
    own setting when own, else the cluster's root). Returns (node, tier)."""
    tier = pfs / "tier"
    tier.mkdir()
    os.chmod(tier, 0o755)
    make_dataset(stager_dir / "src", FILES, sums=SUMS)
    s = node(tool, stager_dir / "n", pfs / "root" if own else tier)
    args = ("--shared-tier", str(tier)) if own else ()
    s.run("add", "ds", "file://%s/src/" % stager_dir, *args, check=True)
    return s, tier


def publish(s):
    p, r = shared(s)
    assert p.returncode == 0, (p.stderr, s.log.read_text()[-2000:])
    return r["dir"]


def as_user(users, who, script, check=True):
    p = users.run(who, ["sh", "-ec", script], timeout=BOUND)
    assert not check or p.returncode == 0, p.stderr
    return p


def forge(users, who, d, key="a.bin"):
    """As who: move the snapshot aside, copy it with key's bytes changed
    (same size) and its MANIFEST line rewritten to the forged hash."""
    v = FILES[key]
    bad = bytes([v[0] ^ 1]) + v[1:]
    h = hashlib.sha256(bad).hexdigest()
    src = "/tmp/forged-%d-%s" % (os.getpid(), h[:8])
    with open(src, "wb") as f:
        f.write(bad)
    os.chmod(src, 0o644)
    as_user(users, who, """
        [ -e {d}.old ] || {{ mv {d} {d}.old; cp -r {d}.old {d}; }}
        rm {d}/data/{k}
        cp {src} {d}/data/{k}
        awk '$4 == "{k}" {{ $1 = "{h}" }} {{ print }}' {d}/MANIFEST \
            > {d}/MANIFEST.new
        rm -f {d}/MANIFEST
        mv {d}/MANIFEST.new {d}/MANIFEST
    """.format(d=d, k=key, src=src, h=h))
    os.unlink(src)
    with open(os.path.join(d, "data", key), "rb") as f:
        assert f.read() == bad
    return bad


def stage_verify(s):
    p = s.run("stage", "ds", "--wait", timeout=BOUND)
    assert p.returncode == 0, (p.stdout, p.stderr, s.log.read_text()[-3000:])
    cache = s.run("verify", "ds", timeout=BOUND)
    source = s.run("verify", "ds", "--source", timeout=BOUND)
    assert cache.returncode == 0, (cache.stdout, cache.stderr)
    assert source.returncode == 0, (source.stdout, source.stderr)


def forged_by_service(mallory, tier, d, *keys):
    """keys forged (forge) by a group member, then the copy taken over
    by the service uid as its own: a trusted tier with forged files."""
    users, mal, g = mallory
    shutil.chown(tier, group=g)
    os.chmod(tier, 0o775)
    users.reach(tier)
    for k in keys:
        forge(users, mal, d, key=k)
    subprocess.run(["chown", "-R", "root:root", str(tier)], check=True)
    os.chmod(tier, 0o755)
    shutil.rmtree(d + ".old")


def read_all(m):
    root = m.mnt / "datasets" / "ds"
    for k, v in FILES.items():
        p = subprocess.run(["cat", str(root / k)], capture_output=True,
                           timeout=BOUND)
        assert p.returncode == 0, (k, p.stderr)
        assert hashlib.sha256(p.stdout).digest() == \
            hashlib.sha256(v).digest(), k


# ---- finding 1: a tier others can write ----

def test_group_writable_tier_refused_by_publisher(tool, stager_dir, pfs,
                                                  mallory):
    users, _, g = mallory
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        shutil.chown(tier, group=g)
        os.chmod(tier, 0o775)
        p, _ = shared(s)
        assert p.returncode != 0
        assert "writable by group" in s.log.read_text()
        assert not list(tier.iterdir())
        # a directory below a good root that the group may write
        os.chmod(tier, 0o755)
        d = publish(s)
        os.unlink(os.path.join(d, "MANIFEST"))
        os.chmod(d, 0o775)
        shutil.chown(d, group=g)
        p, _ = shared(s)
        assert p.returncode != 0, p.stdout
        assert "%s is writable by group" % d in s.log.read_text()
        assert not os.path.exists(os.path.join(d, "MANIFEST"))
    finally:
        s.stop()


def test_group_member_forgery_not_served(tool, stager_dir, pfs, mallory):
    """A member of the tier's group swaps a file and its MANIFEST line:
    every reader falls back to the store and serves the source's bytes."""
    users, mal, g = mallory
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        d = publish(s)
        # an admin makes the tier the team's
        shutil.chown(tier, group=g)
        os.chmod(tier, 0o775)
        users.reach(tier)
        forge(users, mal, d)
        forge(users, mal, d, key="dir/b.bin")
        m = mount(s, tool)
        try:
            read_all(m)
            st = m.stats()
            assert st.get("tier_fallbacks_untrusted", 0) >= 1, st
            assert st["tier_bytes"] == 0, st
        finally:
            m.cleanup()
        stage_verify(s)
        log = s.log.read_text()
        assert "%s is writable by group" % tier in log, log[-3000:]
        assert log.count("is writable by group") == 1, log[-3000:]
        mt = tier_metrics(s)
        assert mt['dstage_shared_tier_fallbacks_total{cause="untrusted"}'] \
            >= 1, mt
        assert mt["dstage_shared_tier_bytes_total"] == 0, mt
    finally:
        s.stop()


def test_forged_copy_in_a_trusted_tier_checked_by_reference(
        tool, stager_dir, pfs, mallory):
    """Forged by the service uid's hand (a bad tool, a restore): the
    tier's MANIFEST agrees with the forged bytes, the catalog does not."""
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        d = publish(s)
        forged_by_service(mallory, tier, d, "a.bin", "dir/b.bin")
        stage_verify(s)
        log = s.log.read_text()
        assert "a.bin: SHA-256 mismatch" in log, log[-3000:]
        m = mount(s, tool, "mnt2")
        try:
            read_all(m)
        finally:
            m.cleanup()
    finally:
        s.stop()


def test_planted_file_not_kept_unchecked(tool, stager_dir, pfs, mallory):
    users, mal, g = mallory
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        d = publish(s)
        os.unlink(os.path.join(d, "MANIFEST"))
        # planted before the publish, same size as the source's file
        v = FILES["dir/b.bin"]
        with open(os.path.join(d, "data", "dir", "b.bin"), "wb") as f:
            f.write(bytes([v[0] ^ 1]) + v[1:])
        p, r = shared(s)
        assert p.returncode == 0, p.stderr
        assert int(r["kept"]) == len(FILES) - 1, r
        with open(os.path.join(d, "data", "dir", "b.bin"), "rb") as f:
            assert f.read() == v
        # a plant by another uid makes the snapshot untrusted: refused
        os.unlink(os.path.join(d, "MANIFEST"))
        shutil.chown(tier, group=g)
        os.chmod(tier, 0o775)
        users.reach(tier)
        as_user(users, mal, "echo x > %s/data/planted" % d, check=False)
        os.chmod(tier, 0o755)
        p, _ = shared(s)
        if os.path.exists(os.path.join(d, "data", "planted")):
            assert p.returncode != 0
            assert "is owned by uid" in s.log.read_text()
    finally:
        s.stop()


def test_world_writable_tier_ignored_by_readers(tool, stager_dir, pfs,
                                               users):
    eve = users.user("eve")
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        d = publish(s)
        os.chmod(tier, 0o777)
        users.reach(tier)
        as_user(users, eve, "mv %s %s.x && mkdir %s && cp -r %s.x/. %s/"
                % (d, d, d, d, d))
        stage_verify(s)
        log = s.log.read_text()
        assert "%s is writable by others" % tier in log, log[-3000:]
        mt = tier_metrics(s)
        assert mt["dstage_shared_tier_bytes_total"] == 0, mt
    finally:
        s.stop()


# ---- finding 5: FIFOs and empty leases ----

def test_fifo_manifest_hangs_nothing(tool, stager_dir, pfs, users):
    s, tier = tier_node(tool, stager_dir, pfs)
    m = None
    try:
        d = publish(s)
        man = os.path.join(d, "MANIFEST")
        os.unlink(man)
        os.mkfifo(man)
        m = mount(s, tool)  # a new mount comes up
        read_all(m)
        stage_verify(s)
        t0 = time.monotonic()
        p, _ = shared(s, "--timeout", "2s")
        assert time.monotonic() - t0 < BOUND
        assert "MANIFEST is not a regular file" in s.log.read_text()
        del p
    finally:
        if m:
            m.cleanup()
        s.stop()


def test_fifo_and_empty_lease_expire(tool, stager_dir, pfs):
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        d = publish(s)
        os.unlink(os.path.join(d, "MANIFEST"))
        lease = os.path.join(d, ".lease")
        os.mkfifo(lease)
        t0 = time.monotonic()
        p, _ = shared(s, "--timeout", "1s")
        assert time.monotonic() - t0 < 10, "a FIFO lease hung the request"
        assert "is not a regular file" in s.log.read_text()
        os.unlink(lease)
        open(lease, "w").close()  # empty: its writer died at once
        p, _ = shared(s, "--timeout", "1s")
        assert p.returncode != 0  # not yet expired (lease period 2s)
        time.sleep(2.5)
        p, r = shared(s)
        assert p.returncode == 0, (p.stderr, s.log.read_text()[-2000:])
        assert r["took_over"] in ("1", 1, True), r
    finally:
        s.stop()


# ---- issue 42: status names a tier not used; reference hashes ----

def tier_status(s, tool):
    """stager show ds and cachectl status, text and --json."""
    show = s.run("show", "ds", check=True).stdout.decode()
    js = s.json("show", "ds")
    ctl = [tool("cachectl"), "--config", str(s.cfg), "status"]
    ctext = subprocess.run(ctl, env=s.env, capture_output=True,
                           timeout=BOUND, check=True).stdout.decode()
    cjs = json.loads(subprocess.run(ctl + ["--json"], env=s.env,
                                    capture_output=True, timeout=BOUND,
                                    check=True).stdout)
    row = [r for r in cjs["datasets"] if r["name"] == "ds"][0]
    return show, js, ctext, row


def test_status_names_an_untrusted_tier(tool, stager_dir, pfs, mallory):
    """dstagefs's and the daemon's refusals of a group-writable tier are
    counted per dataset and named by stager show and cachectl status."""
    users, mal, g = mallory
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        d = publish(s)
        show, js, ctext, row = tier_status(s, tool)
        assert "not used" not in show + ctext, (show, ctext)
        assert "tier_untrusted" not in js and "tier_untrusted" not in row
        shutil.chown(tier, group=g)
        os.chmod(tier, 0o775)
        users.reach(tier)
        forge(users, mal, d)
        m = mount(s, tool)
        try:
            read_all(m)
        finally:
            m.cleanup()
        stage_verify(s)
        show, js, ctext, row = tier_status(s, tool)
        why = "%s is writable by group" % tier
        # the mount, the stage and verify --cache (verify --source reads
        # no tier)
        assert js["tier_untrusted"] >= 3, js
        assert js["tier_untrusted_what"] == why, js
        assert js["tier_untrusted_first"] <= js["tier_untrusted_last"]
        assert row["tier_untrusted"] == js["tier_untrusted"], row
        assert row["tier_untrusted_what"] == why, row
        line = "not used (untrusted): %s (%d times since" % (
            why, js["tier_untrusted"])
        assert "shared tier: " + line in show, show
        assert "ds: shared tier " + line in ctext, ctext
        # put right: the next reader's open forgets it
        subprocess.run(["chown", "-R", "root:root", str(tier)], check=True)
        os.chmod(tier, 0o755)
        shutil.rmtree(d)
        os.rename(d + ".old", d)
        time.sleep(2.1)  # the trust walk's memo
        stage_verify(s)
        show, js, ctext, row = tier_status(s, tool)
        assert "tier_untrusted" not in js, js
        assert "not used" not in show + ctext, (show, ctext)
    finally:
        s.stop()


def test_status_names_a_mismatch(tool, stager_dir, pfs, mallory):
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        d = publish(s)
        forged_by_service(mallory, tier, d, "a.bin")
        stage_verify(s)
        show, js, ctext, row = tier_status(s, tool)
        why = "%s/data/a.bin differs from its reference hash" % d
        assert js.get("tier_mismatch", 0) >= 1, js
        assert js["tier_mismatch_what"] == why, js
        assert row["tier_mismatch_what"] == why, row
        assert "not used (mismatch): " + why in show, show
        assert "tier_untrusted" not in js, js
    finally:
        s.stop()


def test_status_names_a_fifo_manifest(tool, stager_dir, pfs):
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        d = publish(s)
        man = os.path.join(d, "MANIFEST")
        os.unlink(man)
        os.mkfifo(man)
        stage_verify(s)
        _, js, _, row = tier_status(s, tool)
        assert js.get("tier_not_regular", 0) >= 1, js
        assert man in js["tier_not_regular_what"], js
        assert row["tier_not_regular"] == js["tier_not_regular"], row
    finally:
        s.stop()


def test_unlisted_file_read_and_hashed_from_the_store(tool, stager_dir, pfs,
                                                     mallory):
    """dir/b.bin has no line in SHA256SUMS: its copy in a trusted tier,
    changed with its MANIFEST line by the service uid's own hand, is never
    read; the stage records the store's hash, so verify --cache and
    --source agree with the source's bytes."""
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        d = publish(s)
        forged_by_service(mallory, tier, d, "dir/b.bin")
        before = tier_metrics(s)
        stage_verify(s)
        mt = tier_metrics(s)
        k = 'dstage_shared_tier_fallbacks_total{cause="unchecked"}'
        assert mt[k] > before.get(k, 0), mt
        # the hash the stage recorded is the store's: a forged one would
        # fail verify --source (stage_verify) and show as a mismatch here
        js = s.json("show", "ds")
        assert js["mismatched_files"] == 0, js
        assert js["verified_files"] == js["files"], js
        m = mount(s, tool)
        try:
            read_all(m)
        finally:
            m.cleanup()
        # the cache holds the store's bytes (a reread through a second
        # verify --cache, after the mount read them too)
        p = s.run("verify", "ds", timeout=BOUND)
        assert p.returncode == 0, (p.stdout, p.stderr)
    finally:
        s.stop()


def test_tier_made_writable_after_the_mount_opened_it(tool, stager_dir, pfs,
                                                      mallory):
    """The rule held when dstagefs opened the copy and read a file from it;
    then the tier is made the group's (writable by a second uid). A file
    read after that comes from the store, counted untrusted and named by
    status: the rule is asked again before each read the tier would serve
    (the walk's memo, at most 2 s old), not only at open."""
    users, mal, g = mallory
    s, tier = tier_node(tool, stager_dir, pfs)
    try:
        publish(s)
        m = mount(s, tool)
        try:
            root = m.mnt / "datasets" / "ds"
            assert (root / "dir/sub/c.txt").read_bytes() == \
                FILES["dir/sub/c.txt"]
            st = m.stats()
            served = st["tier_bytes"]
            assert served > 0 and not st.get("tier_fallbacks_untrusted"), st
            shutil.chown(tier, group=g)
            os.chmod(tier, 0o775)
            time.sleep(2.1)  # the trust walk's memo
            assert (root / "a.bin").read_bytes() == FILES["a.bin"]
            st = m.stats()
            assert st.get("tier_fallbacks_untrusted", 0) >= 1, st
            assert st["tier_bytes"] == served, st
        finally:
            m.cleanup()
        show, js, _, _ = tier_status(s, tool)
        assert js.get("tier_untrusted", 0) >= 1, js
        assert "no longer keeps the trust rule" in js["tier_untrusted_what"]
    finally:
        s.stop()


def test_status_when_tier_health_cannot_be_kept(tool, stager_dir, mallory):
    """<cache.dir>/tier-health is a directory: a refused (group-writable)
    tier is still not used (stage and verify pass, from the source), each
    refusal that cannot be counted is logged naming the file, and stager
    show and cachectl status still answer, saying the tier's status is
    unknown and why rather than nothing; once the file can be kept again,
    the next refusal is counted."""
    users, mal, g = mallory
    (stager_dir / "pfs").mkdir()
    s, tier = tier_node(tool, stager_dir, stager_dir / "pfs")
    try:
        d = publish(s)
        health = s.root / "cache" / "tier-health"
        if health.exists():
            health.unlink()
        health.mkdir()
        shutil.chown(tier, group=g)
        os.chmod(tier, 0o775)
        stage_verify(s)
        show, js, ctext, row = tier_status(s, tool)
        why = "%s: %s" % (health, os.strerror(errno.EISDIR))
        assert js["tier_health_error"] == why, js
        assert row["tier_health_error"] == why, row
        assert "shared tier: status unknown (%s)" % why in show, show
        assert ctext.count("shared tier status unknown (%s)" % why) == 1, \
            ctext
        assert "tier_untrusted" not in js, js
        log = s.log.read_text()
        assert "shared tier: %s: %s (not counted there: ds's tier not " \
            "used (untrusted): %s is writable by group" % (
                health, os.strerror(errno.EISDIR), tier) in log, log[-3000:]
        assert d and os.path.isdir(d)
        health.rmdir()
        stage_verify(s)
        show, js, ctext, row = tier_status(s, tool)
        assert "tier_health_error" not in js, js
        assert js.get("tier_untrusted", 0) >= 1, js
        assert "status unknown" not in show + ctext, (show, ctext)
    finally:
        s.stop()
