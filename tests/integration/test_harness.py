"""Tests of the test harness itself: the radosgw fixture (scripts/rgw) and the
fault-injecting proxy (tests/faultproxy.py), observed with plain curl."""
import json
import os
import random
import subprocess
import time
import urllib.request

import pytest

from conftest import RGW_SCRIPT

SIZE = 1 << 20  # the test object: 1 MiB of random bytes


@pytest.fixture(scope="module")
def obj(rgw):
    """(bucket, key, data) of an object stored in rgw."""
    bucket = rgw.make_bucket("harness")
    data = random.Random(42).randbytes(SIZE)
    assert rgw.put_object(bucket, "obj.bin", data) == 200
    return bucket, "obj.bin", data


def code_of(p):
    """The %{http_code} that curl printed last (after '\\n')."""
    return int(p.stdout.rsplit(b"\n", 1)[-1])


def body_of(p):
    return p.stdout.rsplit(b"\n", 1)[0]


def get(rgw, path, *args, endpoint=None, timeout=60):
    return rgw.curl(path, "-o", "-", "-w", "\n%{http_code}", *args,
                    endpoint=endpoint, timeout=timeout)


# ---- the radosgw fixture ---------------------------------------------------

def test_rgw_answers_a_signed_request(rgw):
    p = get(rgw, "/")
    assert p.returncode == 0, p.stderr
    assert code_of(p) == 200
    assert b"<ListAllMyBucketsResult" in body_of(p)


def test_rgw_rejects_a_wrong_secret(rgw):
    p = rgw.curl("/", "-o", "-", "-w", "\n%{http_code}", secret="not-the-secret")
    assert p.returncode == 0, p.stderr
    assert code_of(p) == 403
    assert b"<Code>SignatureDoesNotMatch</Code>" in body_of(p)


def test_rgw_rejects_anonymous_listing(rgw, obj):
    """Unsigned requests see none of our buckets (the obj fixture made one
    before this runs): radosgw lists anonymous's own buckets, none, with a
    200, and refuses our bucket's listing and object with a 403."""
    bucket, key, _ = obj

    def anonymous(path):
        return subprocess.run(["curl", "-sS", "-o", "-", "-w",
                               "\n%{http_code}", rgw.endpoint + path],
                              capture_output=True, timeout=30)
    p = anonymous("/")
    assert code_of(p) == 200, p.stdout
    assert b"<ID>anonymous</ID>" in body_of(p)
    assert b"<Buckets></Buckets>" in body_of(p)
    assert bucket.encode() not in body_of(p)
    p = anonymous("/%s?list-type=2" % bucket)
    assert code_of(p) == 403, p.stdout
    assert b"<Code>AccessDenied</Code>" in body_of(p)
    assert key.encode() not in body_of(p)
    p = anonymous("/%s/%s" % (bucket, key))
    assert code_of(p) == 403


def test_rgw_object_round_trip_and_range(rgw, obj):
    bucket, key, data = obj
    p = get(rgw, "/%s/%s" % (bucket, key))
    assert code_of(p) == 200 and body_of(p) == data
    p = get(rgw, "/%s/%s" % (bucket, key), "-H", "Range: bytes=1000-1999")
    assert code_of(p) == 206 and body_of(p) == data[1000:2000]


def test_make_bucket_is_idempotent(rgw):
    assert rgw.make_bucket("twice") == "twice"
    assert rgw.make_bucket("twice") == "twice"


def test_env_files_describe_the_server(rgw):
    if not rgw.owned:
        pytest.skip("rgw given by DSTAGE_RGW_ENV")
    info = json.loads((rgw.dir / "env.json").read_text())
    assert info["AWS_ENDPOINT_URL"] == "http://127.0.0.1:%d" % rgw.port
    assert len(info["RGW_PIDS"]) == 3
    for pid in info["RGW_PIDS"]:
        assert os.path.exists("/proc/%d" % pid)
    sh = subprocess.run(["bash", "-c", ". %s/env && echo $AWS_ENDPOINT_URL "
                         "$AWS_ACCESS_KEY_ID $AWS_REGION" % rgw.dir],
                        capture_output=True, text=True, timeout=10)
    assert sh.stdout.split() == [rgw.endpoint, rgw.access_key, "us-east-1"]


def test_second_start_in_a_running_dir_is_refused(rgw):
    if not rgw.owned:
        pytest.skip("rgw given by DSTAGE_RGW_ENV")
    p = subprocess.run([str(RGW_SCRIPT), "start", str(rgw.dir)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "already has a running cluster" in p.stderr
    assert get(rgw, "/").returncode == 0  # and it is still serving


def test_awscli_works_with_the_env(rgw, obj):
    p = rgw.aws("s3api", "head-object", "--bucket", obj[0], "--key", obj[1])
    assert json.loads(p.stdout)["ContentLength"] == SIZE


# ---- the proxy: pass-through -------------------------------------------------

def test_proxy_forwards_get_put_and_keeps_alive(rgw, obj, faultproxy):
    bucket, key, data = obj
    path = "/%s/%s" % (bucket, key)
    # Two transfers in one curl: the second must reuse the connection.
    p = rgw.curl(path, "-o", "/dev/null", "-w", "%{http_code} %{num_connects}\n",
                 faultproxy.endpoint + path, "-o", "/dev/null",
                 endpoint=faultproxy.endpoint)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [b"200", b"1", b"200", b"0"]
    assert faultproxy.count("GET", path) == 2
    assert faultproxy.counts()["GET " + path] == 2
    # Signed through the proxy's port, verified by rgw.
    new = random.Random(1).randbytes(3 << 20)
    assert rgw.put_object(bucket, "via-proxy", new,
                          endpoint=faultproxy.endpoint) == 200
    p = get(rgw, "/%s/via-proxy" % bucket)
    assert body_of(p) == new
    assert faultproxy.count("PUT") == 1


def test_proxy_relays_chunked_responses_and_requests(rgw, obj, faultproxy):
    bucket = obj[0]
    direct = get(rgw, "/%s?list-type=2" % bucket)
    p = get(rgw, "/%s?list-type=2" % bucket, endpoint=faultproxy.endpoint)
    assert code_of(p) == 200 and b"<Key>obj.bin</Key>" in body_of(p)
    assert body_of(p) == body_of(direct)
    assert faultproxy.requests()[-1]["query"] == "list-type=2"
    # rgw refuses chunked uploads (411); the proxy must relay that answer.
    p = rgw.curl("/%s/chunked" % bucket, "-T", "-", "-o", "/dev/null",
                 "-w", "%{http_code}", endpoint=faultproxy.endpoint,
                 payload_sha256="UNSIGNED-PAYLOAD", input=b"x" * 100000,
                 timeout=30)
    assert p.stdout == b"411", p.stderr


# ---- the proxy: faults ---------------------------------------------------------

def test_fault_503_slowdown_then_pass(rgw, obj, faultproxy):
    path = "/%s/%s" % obj[:2]
    faultproxy.add_fault("503", count=2, match="GET")
    codes = []
    for _ in range(3):
        p = get(rgw, path, endpoint=faultproxy.endpoint)
        codes.append(code_of(p))
        if codes[-1] == 503:
            assert b"<Code>SlowDown</Code>" in body_of(p)
    assert codes == [503, 503, 200]
    assert [r["fault"] for r in faultproxy.requests()] == ["503", "503", None]
    assert faultproxy.pending_faults() == []


def test_fault_500_internal_error(rgw, obj, faultproxy):
    path = "/%s/%s" % obj[:2]
    faultproxy.add_fault("500", count=1, match="GET")
    p = get(rgw, path, endpoint=faultproxy.endpoint)
    assert code_of(p) == 500 and b"<Code>InternalError</Code>" in body_of(p)
    assert code_of(get(rgw, path, endpoint=faultproxy.endpoint)) == 200


def test_fault_matches_method_path_and_skip(rgw, obj, faultproxy):
    bucket, key, _ = obj
    path = "/%s/%s" % (bucket, key)
    faultproxy.add_fault("503", count=1, match="GET", path="/no/such/key")
    faultproxy.add_fault("503", count=1, match="PUT")
    assert code_of(get(rgw, path, endpoint=faultproxy.endpoint)) == 200
    faultproxy.clear_faults()
    faultproxy.add_fault("503", count=2, match="GET", path=key, skip=1)
    codes = [code_of(get(rgw, path, endpoint=faultproxy.endpoint))
             for _ in range(4)]
    assert codes == [200, 503, 503, 200]
    # HEAD gets the status without a body.
    faultproxy.add_fault("503", count=1, match="HEAD")
    p = rgw.curl(path, "-I", "-o", "/dev/null", "-w", "%{http_code}",
                 endpoint=faultproxy.endpoint)
    assert p.stdout == b"503"


def test_fault_reset_mid_body(rgw, obj, faultproxy):
    path = "/%s/%s" % obj[:2]
    faultproxy.add_fault("reset", count=1, match="GET", nbytes=300000)
    p = rgw.curl(path, "-o", "-", endpoint=faultproxy.endpoint)
    assert p.returncode == 56, (p.returncode, p.stderr)  # recv failure
    assert len(p.stdout) <= 300000
    assert get(rgw, path, endpoint=faultproxy.endpoint).returncode == 0


def test_fault_truncate_body(rgw, obj, faultproxy):
    path = "/%s/%s" % obj[:2]
    faultproxy.add_fault("truncate", count=1, match="GET")
    p = rgw.curl(path, "-o", "-", endpoint=faultproxy.endpoint)
    assert p.returncode == 18, (p.returncode, p.stderr)  # partial file
    assert p.stdout == obj[2][:SIZE // 2]


def test_fault_stall_past_a_timeout(rgw, obj, faultproxy):
    path = "/%s/%s" % obj[:2]
    faultproxy.add_fault("stall", count=1, match="GET", seconds=5)
    t0 = time.monotonic()
    p = rgw.curl(path, "-o", "/dev/null", "--max-time", "1.5",
                 endpoint=faultproxy.endpoint)
    took = time.monotonic() - t0
    assert p.returncode == 28, (p.returncode, p.stderr)  # timeout
    assert 1.4 <= took < 4.5
    # A stall mid-body, shorter than the client's patience, passes.
    faultproxy.add_fault("stall", count=1, match="GET", seconds=1, nbytes=1000)
    t0 = time.monotonic()
    p = get(rgw, path, endpoint=faultproxy.endpoint)
    assert code_of(p) == 200 and body_of(p) == obj[2]
    assert time.monotonic() - t0 >= 0.9


def test_fault_content_length_lies(rgw, obj, faultproxy):
    path = "/%s/%s" % obj[:2]
    faultproxy.add_fault("length_long", count=1, match="GET", nbytes=100)
    p = rgw.curl(path, "-o", "-", endpoint=faultproxy.endpoint)
    assert p.returncode == 18, (p.returncode, p.stderr)
    assert p.stdout == obj[2]
    faultproxy.add_fault("length_short", count=1, match="GET", nbytes=100)
    p = rgw.curl(path, "-o", "-", endpoint=faultproxy.endpoint)
    assert p.stdout == obj[2][:SIZE - 100]


def test_fault_corrupt_flips_one_byte(rgw, obj, faultproxy):
    path = "/%s/%s" % obj[:2]
    faultproxy.add_fault("corrupt", count=1, match="GET", nbytes=12345)
    p = get(rgw, path, endpoint=faultproxy.endpoint)
    got = body_of(p)
    assert code_of(p) == 200 and len(got) == SIZE
    diff = [i for i in range(SIZE) if got[i] != obj[2][i]]
    assert diff == [12345]


def test_fault_reset_request_never_reaches_rgw(rgw, obj, faultproxy):
    bucket = obj[0]
    faultproxy.add_fault("reset_request", count=1, match="PUT")
    p = rgw.curl("/%s/never" % bucket, "-T", "-", "-o", "/dev/null",
                 "-H", "Content-Length: 5", endpoint=faultproxy.endpoint,
                 payload_sha256="UNSIGNED-PAYLOAD", input=b"never")
    assert p.returncode in (52, 55, 56), (p.returncode, p.stderr)
    p = rgw.curl("/%s/never" % bucket, "-I", "-o", "/dev/null",
                 "-w", "%{http_code}")
    assert p.stdout == b"404"


def test_control_endpoint(rgw, obj, faultproxy):
    path = "/%s/%s" % obj[:2]
    ctl = "http://127.0.0.1:%d" % faultproxy.control_port
    req = urllib.request.Request(ctl + "/fault?kind=slowdown&count=1&match=GET&path="
                                 + obj[1], method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.load(r)["kind"] == "503"
    assert code_of(get(rgw, path, endpoint=faultproxy.endpoint)) == 503
    assert code_of(get(rgw, path, endpoint=faultproxy.endpoint)) == 200
    with urllib.request.urlopen(ctl + "/stats", timeout=10) as r:
        stats = json.load(r)
    assert stats["counts"] == {"GET " + path: 2}
    assert [x["status"] for x in stats["requests"]] == [503, 200]
    bad = urllib.request.Request(ctl + "/fault?kind=nonsense", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=10)
    assert e.value.code == 400


def test_proxy_stops_promptly_with_a_stalled_request(rgw, obj):
    from conftest import RgwProxy
    p = RgwProxy(rgw).start()
    p.add_fault("stall", count=1, match="GET", seconds=60)
    c = subprocess.Popen(["curl", "-s", "-o", "/dev/null",
                          p.endpoint + "/%s/%s" % obj[:2]])
    try:
        for _ in range(100):
            if p.count("GET"):
                break
            time.sleep(0.05)
        t0 = time.monotonic()
        p.stop()
        assert time.monotonic() - t0 < 5
        assert c.wait(timeout=10) != 0
    finally:
        if c.poll() is None:
            c.kill()
            c.wait()


def test_rgw_refuses_an_unknown_object_store(tmp_path):
    """DSTAGE_RGW_OBJECTSTORE is memstore or bluestore; anything else is
    refused before a ceph.conf is written (one without an object store
    would start an OSD on Ceph's default)."""
    d = tmp_path / "rgw"
    p = subprocess.run([RGW_SCRIPT, "start", str(d)], capture_output=True, text=True,
                       env=dict(os.environ, DSTAGE_RGW_OBJECTSTORE="filestore"),
                       timeout=60)
    assert p.returncode == 1
    assert "DSTAGE_RGW_OBJECTSTORE must be memstore or bluestore" in p.stderr
    assert not (d / "ceph.conf").exists()
