"""verify --cache says what it found (issue 16), against a real daemon and
the real block cache, with file:// sources.

Covered: bytes flipped in a cached block are reported as that block
(dataset, key, block index, cache file) in text and --json, exit 1, and the
source is not contacted (it is moved away during the check: any read of it
would fail the job with an error); --repair fetches the block again, lists
it as repaired and exits 0; blocks never fetched are reported as missing,
not fetched (source moved away again), told apart from damaged ones in the
same job; --fetch-missing fetches them; `stager show` carries the counts in
the last verify's message; at most 10000 rows, the rest counted. The
counts are kept (catalog schema 7): show --json's last_verify_damaged /
_missing / _mismatched / _repaired, status JOB --json, show's text and the
daemon's dstage_verify_*{dataset} gauges report them, --repair takes them to
0 and counts the blocks repaired, a deleted object file counts as missing,
and a restricted dataset's counts go to dataset="/restricted", unnamed.

Errors name their cause where the user is: `add` with the endpoint on a
closed port, a bad URL scheme, a missing file:// directory, a wrong secret
against the shared radosgw (HTTP 403 SignatureDoesNotMatch): text and
--json carry the URL, the transport error or HTTP status and S3 code, and
the fix; a stage job's error carries the store's cause too. cache.dir (or
its contents) removed under the running daemon: found once, recreated,
named as the cache's side (never as objects missing at the source); one
replaced with mode 0777 refused."""
import json
import os
import shutil
import socket
import stat

import pytest

from test_stager import MiB, Stager, data, make_dataset  # noqa: F401
from test_stager import daemon, stager_dir  # noqa: F401 (fixtures)

# An object's data file holds block b at DATA_OFF + b * BLOCK, DATA_OFF 0
# since format version 3 (header and records are in its sidecar,
# NAME.meta; docs/cache.md).
DATA_OFF = 0
BLOCK = 4 * MiB


def cache_files(root):
    """The objects' data files (their sidecars, NAME.meta, beside them)."""
    return [p for p in (root / "cache" / "objects").rglob("*")
            if p.is_file() and not p.name.endswith(".meta")]


def flip(path, off, n=3):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(n)
        f.seek(off)
        f.write(bytes(x ^ 0xff for x in b))


def hide(src):
    """Move the source's files away, keeping its directory (a file:// store
    checks that at open): any read of the source now fails."""
    away = src.parent / (src.name + "-away")
    os.rename(src, away)
    src.mkdir()


def unhide(src):
    os.rmdir(src)
    os.rename(src.parent / (src.name + "-away"), src)


def text(p):
    return (p.stdout + p.stderr).decode(errors="replace")


def test_damaged_block_reported_not_fetched_then_repaired(daemon, stager_dir):
    files = {"big.bin": data(7, 10 * MiB), "small.bin": data(8, 5000)}
    src = stager_dir / "src"
    make_dataset(src, files)
    daemon.run("add", "ds", "file://%s/" % src, check=True)
    daemon.run("stage", "ds", "--wait", check=True)
    big = [p for p in cache_files(stager_dir)
           if p.stat().st_size >= 10 * MiB]
    assert len(big) == 1
    flip(big[0], DATA_OFF + BLOCK + 2 * MiB + 77)  # block 1, mid-object

    # The source is away: reading any of it would fail the job with an
    # error ("No such file or directory"), not a report of the block.
    hide(src)
    p = daemon.run("verify", "ds", "--cache")
    out = text(p)
    assert p.returncode == 1, out
    assert "DAMAGED ds big.bin block 1: cache file %s" % big[0] in out, out
    assert "small.bin" not in out and "error" not in out, out
    assert "found 1 damaged block(s) in 1 file(s)" in out, out

    p = daemon.run("verify", "ds", "--cache", "--json")
    assert p.returncode == 1, text(p)
    res = json.loads(p.stdout)
    assert res["damaged"] == [{"dataset": "ds", "key": "big.bin",
                               "block": 1, "path": str(big[0])}]
    assert res["missing"] == [] and res["mismatches"] == []
    assert res["repaired"] == [] and res["job"]["state"] == "failed"
    show = daemon.json("show", "ds")
    assert show["last_verify"] == "failed"
    assert "1 damaged block(s)" in show["last_verify_msg"]

    # --repair: fetched again from the (restored) source, listed.
    unhide(src)
    p = daemon.run("verify", "ds", "--cache", "--repair", "--json")
    assert p.returncode == 0, text(p)
    res = json.loads(p.stdout)
    assert [(r["key"], r["block"]) for r in res["repaired"]] == \
        [("big.bin", 1)]
    assert res["damaged"] == [] and res["job"]["state"] == "done"
    assert "repaired 1 damaged block(s)" in res["job"]["error"]

    # Mended: a plain check finds nothing, still without the source.
    hide(src)
    p = daemon.run("verify", "ds", "--cache")
    assert p.returncode == 0, text(p)
    assert "all match" in text(p) and "DAMAGED" not in text(p)
    unhide(src)


def test_missing_told_apart_from_damaged(daemon, stager_dir):
    files = {"a.bin": data(1, 6 * MiB), "b.bin": data(2, 9 * MiB),
             "c.txt": b"hello\n"}
    src = stager_dir / "src"
    make_dataset(src, files)
    daemon.run("add", "ds", "file://%s/" % src, check=True)
    # Only a.bin is staged: b.bin, c.txt and SHA256SUMS were never fetched.
    daemon.run("stage", "ds", "--files", "a.bin", "--wait", check=True)
    (obj,) = cache_files(stager_dir)
    flip(obj, DATA_OFF + 5 * MiB)  # a.bin's block 1

    hide(src)
    p = daemon.run("verify", "ds", "--json")  # --cache is the default
    assert p.returncode == 1, text(p)
    res = json.loads(p.stdout)
    assert [(d["key"], d["block"]) for d in res["damaged"]] == [("a.bin", 1)]
    missing = {m["key"]: m["blocks"] for m in res["missing"]}
    assert missing == {"b.bin": 3, "c.txt": 1, "SHA256SUMS": 1}, res
    assert res["fetched"] == [] and "error" not in res["job"]["error"]
    assert len(cache_files(stager_dir)) == 1  # nothing fetched
    p = daemon.run("verify", "ds", "--cache")
    out = text(p)
    assert "MISSING ds b.bin: 3 block(s) not in the cache" in out, out
    assert "DAMAGED ds a.bin block 1" in out, out
    assert "4 file(s) missing" not in out  # a.bin is damaged, not missing
    assert "5 block(s) of 3 file(s) missing from the cache" in out, out

    # --fetch-missing fetches what is missing, not what is damaged.
    unhide(src)
    p = daemon.run("verify", "ds", "--fetch-missing", "--json")
    assert p.returncode == 1, text(p)
    res = json.loads(p.stdout)
    assert {m["key"] for m in res["fetched"]} == {"b.bin", "c.txt",
                                                   "SHA256SUMS"}
    assert [d["key"] for d in res["damaged"]] == ["a.bin"]
    assert res["missing"] == []
    p = daemon.run("verify", "ds", "--repair")
    assert p.returncode == 0, text(p)
    assert "REPAIRED ds a.bin block 1" in text(p)
    hide(src)
    p = daemon.run("verify", "ds")
    assert p.returncode == 0 and "all match" in text(p), text(p)
    unhide(src)


# ---- errors that name their cause, where the user is ----

def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def ms_free(text):
    """text with each elapsed time curl puts in its messages ("after 12
    ms") made the same."""
    import re
    return re.sub(r"after \d+ ms", "after N ms", text)


def failed_add(s, url):
    """add NAME url, failing: (text on stderr, the --json error object)."""
    p = s.run("add", "x", url)
    assert p.returncode != 0
    err = p.stderr.decode(errors="replace")
    pj = s.run("add", "x", url, "--json")
    assert pj.returncode == p.returncode, pj.stderr
    doc = json.loads(pj.stdout)["error"]
    # the same message, but for curl's "after N ms" (two runs, two times)
    assert ms_free(doc["message"]) in ms_free(err), (doc, err)
    assert "x" not in [d["name"] for d in s.json("list")]
    return err, doc


def unreachable_store_stager(tool, stager_dir):
    """A started daemon whose S3 endpoint is a closed loopback port (two
    quick attempts a request): (the Stager, the port)."""
    port = closed_port()
    env = dict(os.environ, AWS_ENDPOINT_URL="http://127.0.0.1:%d" % port,
               AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
               AWS_SECRET_ACCESS_KEY="secret")
    s = Stager(tool("stager"), stager_dir, env=env, args=())
    s.cfg.write_text(s.cfg.read_text() +
                     "[s3]\nmax_attempts = 2\nbackoff_base = 1ms\n")
    return s.start(), port


def test_unreachable_endpoint_named(tool, stager_dir):
    s, port = unreachable_store_stager(tool, stager_dir)
    try:
        err, doc = failed_add(s, "s3://bucket/p/")
        assert "s3://bucket/p/" in err and "127.0.0.1 port %d" % port in err
        assert "Input/output error" in err  # the errno, with its cause:
        assert "Couldn't connect to server" in err, err
        assert "s3.endpoint" in err, err  # the hint
        assert doc["code"] == "EIO" and doc["errno"] == 5
    finally:
        s.stop()


def raw_requests(sock, reqs):
    """Send reqs (dicts of fields) on ONE connection, one after the other;
    return each request's end line as a dict."""
    ends = []
    with socket.socket(socket.AF_UNIX) as c:
        c.settimeout(60)
        c.connect(str(sock))
        buf = b""
        for req in reqs:
            c.sendall(("\t".join("%s=%s" % kv for kv in req.items())
                       + "\n").encode())
            end = None
            while end is None:
                while b"\n" not in buf:
                    d = c.recv(65536)
                    assert d, "daemon closed the connection"
                    buf += d
                ln, buf = buf.split(b"\n", 1)
                f = dict(x.split("=", 1) for x in ln.decode().split("\t")
                         if "=" in x)
                if f.get("type") == "end":
                    end = f
            ends.append(end)
    return ends


def test_cause_is_per_request(tool, stager_dir):
    """A request's error carries the cause logged while serving IT, never
    one left by an earlier request on the same connection (the daemon
    clears the thread's cause before and after each request; the test
    fails with both clears removed)."""
    s, _ = unreachable_store_stager(tool, stager_dir)
    try:
        first, second, third = raw_requests(s.sock, [
            {"cmd": "add", "name": "x", "url": "s3://bucket/p/"},
            {"cmd": "show", "name": "nosuch"},
            {"cmd": "add", "name": "y", "url": "file:///nonexistent-ds/"},
        ])
        assert int(first["rc"]) != 0
        assert "Couldn't connect to server" in first["msg"], first
        assert int(second["rc"]) != 0 and int(third["rc"]) != 0
        for later in (second, third):
            assert "Couldn't connect" not in later["msg"], later
            assert "127.0.0.1 port" not in later["msg"], later
        assert "nonexistent-ds" in third["msg"], third
    finally:
        s.stop()


def test_bad_url_scheme_named(daemon):
    err, doc = failed_add(daemon, "http://foo/bar")
    assert "unsupported store URL 'http://foo/bar'" in err, err
    assert "s3://BUCKET/PREFIX/ or file:///DIR/" in err, err
    assert doc["code"] == "EINVAL"
    err, doc = failed_add(daemon, "file:///nonexistent-dstage-dir/")
    assert "cannot open directory /nonexistent-dstage-dir" in err, err
    assert doc["code"] == "ENOENT"


def test_wrong_credentials_named(tool, stager_dir, rgw):
    bucket = rgw.make_bucket("verify-creds-%d" % os.getpid())
    assert rgw.put_object(bucket, "p/a.bin", b"abc") == 200
    env = rgw.env(AWS_SECRET_ACCESS_KEY="wrong" + rgw.secret_key[5:])
    s = Stager(tool("stager"), stager_dir, env=env).start()
    try:
        err, doc = failed_add(s, "s3://%s/p/" % bucket)
        assert "s3://%s/p/" % bucket in err, err
        assert "HTTP 403 SignatureDoesNotMatch" in err, err
        assert "AWS_SECRET_ACCESS_KEY" in err, err  # the hint
        assert doc["code"] in ("EACCES", "EPERM"), doc
    finally:
        s.stop()
    # the right secret: the same URL registers
    s = Stager(tool("stager"), stager_dir, env=rgw.env()).start()
    try:
        s.run("add", "x", "s3://%s/p/" % bucket, check=True)
    finally:
        s.stop()


def empty_cache(root, whole):
    cache = root / "cache"
    if whole:
        shutil.rmtree(cache)
        return
    for p in cache.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


@pytest.mark.parametrize("whole", [False, True], ids=["contents", "dir"])
def test_cache_dir_removed_under_daemon(daemon, stager_dir, whole):
    files = {"a.bin": data(1, 5 * MiB), "b.bin": data(2, 100)}
    make_dataset(stager_dir / "src", files)
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    daemon.run("stage", "ds", "--wait", check=True)
    cache = stager_dir / "cache"
    empty_cache(stager_dir, whole)

    # verify --cache: the cache's side, named with its path; the blocks
    # are missing from the (recreated) cache, not from the source.
    p = daemon.run("verify", "ds", "--cache")
    out = text(p)
    assert p.returncode == 1, out
    assert "cache.dir %s had been removed under the daemon: recreated " \
        "empty" % cache in out, out
    assert "MISSING ds a.bin" in out and "source" not in out, out
    assert "No such file" not in out, out
    assert (cache / "objects").is_dir() and (cache / "dstage-cache").is_file()
    assert stat.S_IMODE((cache / "objects").stat().st_mode) == 0o700

    # Staging again works, and the damage was reported once.
    p = daemon.run("stage", "ds", "--wait")
    assert p.returncode == 0, text(p)
    assert "removed" not in text(p)
    p = daemon.run("verify", "ds", "--cache")
    assert p.returncode == 0 and "all match" in text(p), text(p)
    log = daemon.log.read_text(errors="replace")
    assert log.count("removed under the running process") == 1, log


def test_cache_dir_replaced_unsafely_refused(daemon, stager_dir):
    make_dataset(stager_dir / "src", {"a.bin": data(1, 100000)})
    daemon.run("add", "ds", "file://%s/src/" % stager_dir, check=True)
    daemon.run("stage", "ds", "--wait", check=True)
    cache = stager_dir / "cache"
    shutil.rmtree(cache)
    cache.mkdir()
    os.chmod(cache, 0o777)  # anyone could plant cache files here
    p = daemon.run("stage", "ds", "--wait")
    out = text(p)
    assert p.returncode == 1, out
    assert "the cache failed, not the source: cache.dir %s is damaged and " \
        "cannot be recreated (Permission denied" % cache in out, out
    assert "a.bin" not in out, out
    log = daemon.log.read_text(errors="replace")
    assert "chmod 0700" in log, log


def test_stage_job_error_names_the_store_cause(tool, stager_dir, rgw):
    """A job's error (not only a request's) carries the store's cause."""
    bucket = rgw.make_bucket("verify-job-%d" % os.getpid())
    assert rgw.put_object(bucket, "p/a.bin", data(3, 300000)) == 200
    s = Stager(tool("stager"), stager_dir, env=rgw.env())
    s.cfg.write_text(s.cfg.read_text() +
                     "[s3]\nmax_attempts = 2\nbackoff_base = 1ms\n")
    s.start()
    try:
        s.run("add", "ds", "s3://%s/p/" % bucket, check=True)
    finally:
        s.stop()
    port = closed_port()
    s.env = rgw.env(AWS_ENDPOINT_URL="http://127.0.0.1:%d" % port)
    s.start()
    try:
        p = s.run("stage", "ds", "--wait")
        out = text(p)
        assert p.returncode == 1, out
        assert "a.bin: Input/output error: s3: GET " \
            "http://127.0.0.1:%d/%s/p/a.bin" % (port, bucket) in out, out
        assert "Couldn't connect to server" in out, out
        assert "s3.endpoint" in out, out
    finally:
        s.stop()


def test_missing_list_capped(daemon, stager_dir):
    """A never-staged dataset of many files: every file counted, at most
    10000 rows kept (RUNNER_FOUND_MAX), the rest said in the message."""
    src = stager_dir / "src"
    src.mkdir()
    for i in range(10003):
        (src / ("f%05d" % i)).write_bytes(b"x")
    daemon.run("add", "ds", "file://%s/" % src, check=True)
    p = daemon.run("verify", "ds", "--json", timeout=300)
    assert p.returncode == 1, text(p)
    res = json.loads(p.stdout)
    assert len(res["missing"]) == 10000
    assert "10003 block(s) of 10003 file(s) missing" in res["job"]["error"]
    assert "only the first 10000 listed, 3 more not" in res["job"]["error"]


def metrics_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    """{sample with labels: value} of the daemon's metrics page, and the
    page."""
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                timeout=5) as r:
        page = r.read().decode()
    samples = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            samples[k] = float(v)
    return samples, page


@pytest.fixture
def mdaemon(tool, stager_dir):
    """A daemon with its metrics endpoint on a free loopback port."""
    s = Stager(tool("stager"), stager_dir)
    s.port = metrics_port()
    with open(s.cfg, "a") as f:
        f.write("[metrics]\nlisten = 127.0.0.1:%d\n" % s.port)
    s.start()
    yield s
    s.stop()


def counts(show):
    return tuple(show.get("last_verify_" + k) for k in
                 ("damaged", "missing", "mismatched", "repaired"))


def gauges(port, ds):
    s = scrape(port)[0]
    return tuple(s.get('dstage_verify_%s{dataset="%s"}' % (n, ds))
                 for n in ("damaged_blocks", "missing_blocks",
                           "mismatched_files"))


def test_counts_in_show_status_and_metrics(mdaemon, stager_dir):
    """The last verify's counts are kept (catalog, schema 7) and reported
    as numbers by show --json and status --json, in show's text, and as
    per-dataset gauges; --repair takes them to 0 and counts what it
    repaired; never-fetched blocks count as missing."""
    d = mdaemon
    files = {"big.bin": data(11, 10 * MiB), "small.bin": data(12, 5000)}
    src = stager_dir / "src"
    make_dataset(src, files)
    d.run("add", "ds", "file://%s/" % src, check=True)
    d.run("stage", "ds", "--wait", check=True)
    (big,) = [p for p in cache_files(stager_dir)
              if p.stat().st_size >= 10 * MiB]
    flip(big, DATA_OFF + 77)  # block 0
    flip(big, DATA_OFF + 2 * BLOCK + 5)  # block 2

    p = d.run("verify", "ds", "--cache", "--json")
    assert p.returncode == 1, text(p)
    job = json.loads(p.stdout)["job"]["job"]
    show = d.json("show", "ds")
    assert show["last_verify"] == "failed"
    assert counts(show) == (2, 0, 0, 0), show
    assert gauges(d.port, "ds") == (2, 0, 0)
    st = d.json("status", str(job))
    st = st[0] if isinstance(st, list) else st
    assert (st["damaged_blocks"], st["missing_blocks"],
            st["mismatched_files"], st["repaired_blocks"]) == (2, 0, 0, 0)
    out = d.run("show", "ds", check=True).stdout.decode()
    assert "2 damaged blocks, 0 missing, 0 files differ, 0 blocks " \
        "repaired" in out, out

    p = d.run("verify", "ds", "--cache", "--repair")
    assert p.returncode == 0, text(p)
    show = d.json("show", "ds")
    assert show["last_verify"] == "done"
    assert counts(show) == (0, 0, 0, 2), show
    assert gauges(d.port, "ds") == (0, 0, 0)

    # A block that was never fetched counts as missing, not damaged.
    os.unlink(big)
    p = d.run("verify", "ds", "--cache")
    assert p.returncode == 1, text(p)
    show = d.json("show", "ds")
    assert counts(show) == (0, 3, 0, 0), show
    assert gauges(d.port, "ds") == (0, 3, 0)


def test_counts_of_a_restricted_dataset_not_named(mdaemon, stager_dir):
    """A dataset with a group is never named on the metrics page: its
    counts go to dataset="/restricted"."""
    d = mdaemon
    src = stager_dir / "src"
    make_dataset(src, {"f.bin": data(13, 5 * MiB)})
    d.run("add", "secret-ds", "file://%s/" % src, "--group", "root",
          check=True)
    d.run("stage", "secret-ds", "--wait", check=True)
    (obj,) = [p for p in cache_files(stager_dir)
              if p.stat().st_size >= 5 * MiB]
    flip(obj, DATA_OFF + BLOCK + 9)
    assert d.run("verify", "secret-ds", "--cache").returncode == 1
    assert counts(d.json("show", "secret-ds")) == (1, 0, 0, 0)
    s, page = scrape(d.port)
    assert s['dstage_verify_damaged_blocks{dataset="/restricted"}'] == 1
    assert "secret-ds" not in page
