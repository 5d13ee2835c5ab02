"""The object-store client under injected faults (tests/faultproxy.py between
the client and radosgw): every fault is retried to success or ends in a clear
error, and no wrong byte is ever returned."""
import hashlib
import random
import time

import pytest

from test_objstore import Store

# Short budgets so that failures end quickly.
FAST = {
    "DSTAGE_S3_BACKOFF_BASE": "20ms",
    "DSTAGE_S3_BACKOFF_MAX": "200ms",
    "DSTAGE_S3_LOW_SPEED_TIME": "1s",
    "DSTAGE_S3_CONNECT_TIMEOUT": "1s",
    "DSTAGE_S3_MAX_ATTEMPTS": "5",
    "DSTAGE_S3_DEADLINE": "20s",
    "DSTAGE_TOOL_STATS": "1",
}

DATA = random.Random(42).randbytes(3 * 1024 * 1024 + 333)


@pytest.fixture
def proxied(tool, rgw, faultproxy, request, tmp_path):
    """(store through the proxy, direct store, proxy) with object 'blob'."""
    bucket = "f-" + hashlib.sha1(request.node.name.encode()).hexdigest()[:20]
    rgw.make_bucket(bucket)
    direct = Store(tool("objstore_tool"), f"s3://{bucket}/", rgw.env())
    direct.put_bytes("blob", DATA, tmp_path)
    env = faultproxy.env(**FAST)
    return Store(tool("objstore_tool"), f"s3://{bucket}/", env), direct, faultproxy


def stats(p):
    import json
    lines = [l for l in p.stderr.decode().splitlines() if l.startswith("{")]
    return json.loads(lines[-1])


@pytest.mark.parametrize("kind,nbytes", [
    ("503", None), ("500", None), ("reset", 1000), ("reset", None),
    ("truncate", 4096), ("truncate", None), ("length_long", None),
    ("length_short", None), ("stall", None), ("reset_request", None),
])
def test_ranged_get_fault_retried_to_success(proxied, kind, nbytes):
    store, _, proxy = proxied
    off, length = 12345, 2 * 1024 * 1024
    proxy.add_fault(kind, count=2, match="GET", path="/blob", nbytes=nbytes,
                    seconds=5 if kind == "stall" else None)
    t = time.monotonic()
    p = store.get("blob", off, length, check=False)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout == DATA[off:off + length]
    assert stats(p)["retries"] == 2
    assert proxy.count("GET", "/blob") == 3
    assert not proxy.pending_faults()
    if kind == "stall":  # the low-speed timeout (1 s) cut the stall short
        assert time.monotonic() - t < 5


def test_whole_object_with_faults_in_parallel_ranges(proxied):
    store, _, proxy = proxied
    proxy.add_fault("reset", count=3, match="GET", path="/blob", nbytes=100000)
    proxy.add_fault("503", count=2, match="GET", path="/blob")
    p = store.run("cat", "blob", "256K", check=False)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout == DATA
    assert stats(p)["retries"] == 5


def test_list_and_head_retried(proxied):
    store, _, proxy = proxied
    proxy.add_fault("503", count=2, match="GET")
    rows = store.ls()
    assert [r[0] for r in rows] == ["blob"]
    proxy.add_fault("500", count=1, match="HEAD")
    assert int(store.head("blob").stdout.split(b"\t")[0]) == len(DATA)


def test_put_retried_after_server_errors_and_resets(proxied, tmp_path):
    store, direct, proxy = proxied
    proxy.add_fault("500", count=1, match="PUT")
    proxy.add_fault("reset_request", count=1, match="PUT")
    store.put_bytes("up/one", b"payload" * 1000, tmp_path)
    assert direct.get("up/one", 0, 1 << 20).stdout == b"payload" * 1000


def test_multipart_with_part_and_complete_faults(proxied, tmp_path):
    store, direct, proxy = proxied
    data = random.Random(9).randbytes(70 * 1024 * 1024)  # > 64M threshold
    proxy.add_fault("503", count=2, match="PUT", path="partNumber=2")
    proxy.add_fault("reset_request", count=1, match="PUT", path="partNumber=4")
    proxy.add_fault("500", count=1, match="POST", path="uploadId=")
    store.put_bytes("mp/big", data, tmp_path)
    got = direct.run("cat", "mp/big", "8M").stdout
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    # Part 2 sent three times, part 4 twice, the complete twice.
    assert proxy.count("PUT", "partNumber=2&") == 3
    assert proxy.count("PUT", "partNumber=4&") == 2
    assert proxy.count("PUT", "partNumber=1&") == 1
    assert proxy.count("POST", "uploadId=") == 2


def test_multipart_failure_aborts_upload(proxied, rgw, tmp_path):
    store, direct, proxy = proxied
    data = b"x" * (65 * 1024 * 1024)
    proxy.add_fault("500", count=100, match="PUT", path="partNumber=3")
    src = tmp_path / "src"
    src.write_bytes(data)
    p = store.run("put", "mp/fail", str(src), check=False)
    assert p.returncode == 1
    err = p.stderr.decode()
    assert "HTTP 500 InternalError" in err and "EIO" in err
    assert proxy.count("DELETE", "uploadId=") == 1
    assert direct.head("mp/fail", check=False).returncode == 1
    # No upload is left behind.
    out = rgw.curl("/" + store.url[5:].split("/")[0] + "?uploads").stdout.decode()
    assert "<UploadId>" not in out


def test_persistent_503_is_a_clear_error_not_a_hang(proxied):
    store, _, proxy = proxied
    proxy.add_fault("503", count=1000, match="GET")
    t = time.monotonic()
    p = store.get("blob", 0, 100, check=False)
    assert p.returncode == 1 and p.stdout == b""
    err = p.stderr.decode()
    assert "503 SlowDown" in err and "attempt 5 of 5" in err and "EIO" in err
    assert proxy.count("GET", "/blob") == 5
    assert time.monotonic() - t < 10


def test_stall_past_deadline_times_out(proxied):
    store, _, proxy = proxied
    proxy.add_fault("stall", count=1000, match="GET", seconds=30)
    t = time.monotonic()
    p = store.get("blob", 0, 100, check=False,
                  env={"DSTAGE_S3_DEADLINE": "3s", "DSTAGE_S3_MAX_ATTEMPTS": "100"})
    elapsed = time.monotonic() - t
    assert p.returncode == 1 and p.stdout == b""
    assert b"ETIMEDOUT" in p.stderr
    assert elapsed < 8, elapsed


def test_server_down_is_a_clear_error(tool, rgw, tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    store = Store(tool("objstore_tool"), "s3://nobucket/",
                  rgw.env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", **FAST))
    t = time.monotonic()
    p = store.get("k", 0, 10, check=False)
    assert p.returncode == 1 and b"EIO" in p.stderr
    assert b"127.0.0.1" in p.stderr
    assert time.monotonic() - t < 10


def test_no_retry_on_client_errors(proxied):
    store, _, proxy = proxied
    p = store.get("missing-key", 0, 10, check=False)
    assert p.returncode == 1 and b"ENOENT" in p.stderr
    assert proxy.count("GET", "/missing-key") == 1
    assert stats(p)["retries"] == 0


# ---- a body damaged on its way to the store (Content-MD5)

def put_with_fault(proxied, tmp_path, key, size, kind, count, path):
    """objstore_tool put of size random bytes (5 MiB parts above 5 MiB)
    through the proxy, with `count` faults of `kind` armed on the PUTs
    whose target holds `path`; (the process, the bytes)."""
    store, direct, proxy = proxied
    data = random.Random(size).randbytes(size)
    src = tmp_path / "src"
    src.write_bytes(data)
    direct.run("rm", key)       # the bucket is named after the test
    proxy.add_fault(kind, count=count, match="PUT", path=path)
    p = store.run("put", key, str(src), check=False,
                  env={"DSTAGE_S3_PART_SIZE": "5M",
                       "DSTAGE_S3_MULTIPART_THRESHOLD": "5M"})
    return p, data


def stored_bytes(direct, key, tmp_path):
    out = tmp_path / "back"
    direct.run("cat", key, "4M", str(out))
    return out.read_bytes()


@pytest.mark.parametrize("size", [1_000_000, 11 * 1024 * 1024])
def test_corrupted_upload_body_refused_and_retried(proxied, tmp_path, size):
    """The proxy flips one bit of the first upload body (a single PUT, or
    an UploadPart, whose payload is UNSIGNED: only Content-MD5 guards it).
    radosgw must refuse it (BadDigest), the client retries, and the stored
    object is exactly the file. Without Content-MD5 the part would be
    stored damaged and the comparison below fails."""
    _, direct, proxy = proxied
    p, data = put_with_fault(proxied, tmp_path, "up", size,
                             "corrupt_request", 1, "/up")
    assert p.returncode == 0, p.stderr.decode()
    assert not proxy.pending_faults()
    err = p.stderr.decode()
    assert "BadDigest" in err or "XAmzContentSHA256Mismatch" in err, err
    if size > 5 * 1024 * 1024:
        assert "BadDigest" in err, err   # parts: Content-MD5 alone
    assert stats(p)["retries"] >= 1
    assert stored_bytes(direct, "up", tmp_path) == data


def test_upload_cut_mid_body_retried(proxied, tmp_path):
    """The connection of the first UploadPart is reset half-way through
    its body (the store saw the part begin and never end): the client
    retries that part and the stored object is exactly the file."""
    _, direct, proxy = proxied
    p, data = put_with_fault(proxied, tmp_path, "cut", 11 * 1024 * 1024,
                             "reset_upload", 1, "partNumber=1&")
    assert p.returncode == 0, p.stderr.decode()
    assert not proxy.pending_faults()
    part1 = [r for r in proxy.requests() if "partNumber=1&" in r["target"]]
    # cut, then sent again (by the client's retry, or by libcurl's own
    # fresh connect when a reused connection dies before any answer)
    assert part1[0]["fault"] == "reset_upload" and part1[0]["status"] is None
    assert len(part1) >= 2 and part1[-1]["status"] == 200
    assert stored_bytes(direct, "cut", tmp_path) == data


def test_corrupted_upload_body_every_time_fails_cleanly(proxied, tmp_path):
    """Every attempt damaged: an error (EIO), no object under the key and
    no multipart upload left open."""
    store, direct, proxy = proxied
    p, _ = put_with_fault(proxied, tmp_path, "bad", 11 * 1024 * 1024,
                          "corrupt_request", 100, "partNumber=1&")
    assert p.returncode == 1
    assert "BadDigest" in p.stderr.decode()
    assert "EIO" in p.stderr.decode().splitlines()[-1]
    assert direct.head("bad", check=False).returncode == 1
    bucket = store.url[5:].split("/")[0]
    out = proxy.rgw.aws("s3api", "list-multipart-uploads", "--bucket",
                        bucket, "--output", "json").stdout.decode()
    assert "Uploads" not in out, out
