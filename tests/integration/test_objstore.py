"""Integration tests of the object-store client (lib/objstore/objstore.c, s3store.c,
filestore.c) through tests/tools/objstore_tool, against a real radosgw and a
real directory, and through the fault-injecting proxy."""
import hashlib
import json
import os
import random
import re
import subprocess
import time
from pathlib import Path

import pytest

SPECIAL_KEYS = [
    "plain.txt",
    "with space.txt",
    "plus+sign.bin",
    "percent%41.bin",
    "eq=amp&.bin",
    "tilde~x",
    "utf8/caf\u00e9/\u65e5\u672c\u8a9e.txt",
    "deep/a/b/c/d/e/f.txt",
    "semi;colon,comma'quote(paren)",
    "star*question?hash#",
]


class Store:
    """objstore_tool bound to one URL and environment."""

    def __init__(self, tool, url, env):
        self.tool, self.url, self.env = tool, url, env

    def run(self, *args, check=True, input=None, timeout=300, env=None):
        e = dict(self.env)
        e["OBJSTORE_TOOL_CHECK_RX"] = "1"  # cat checks objstore_get.on_data
        e.update(env or {})
        p = subprocess.run([self.tool, self.url] + list(args), env=e,
                           capture_output=True, timeout=timeout, input=input)
        if check and p.returncode != 0:
            raise AssertionError(f"objstore_tool {args} failed: "
                                 f"{p.stderr.decode(errors='replace')}")
        return p

    def put_bytes(self, key, data, tmp_path):
        src = tmp_path / ("src-" + hashlib.sha1(key.encode()).hexdigest())
        src.write_bytes(data)
        self.run("put", key, str(src))

    def get(self, key, off, length, etag=None, **kw):
        args = ["get", key, str(off), str(length)] + ([etag] if etag else [])
        return self.run(*args, **kw)

    def ls(self, prefix=""):
        out = self.run("ls", prefix).stdout.decode()
        rows = []
        for line in out.splitlines():
            size, etag, mtime, key = line.split("\t", 3)
            rows.append((key, int(size), etag))
        return rows

    def head(self, key, **kw):
        return self.run("head", key, **kw)


@pytest.fixture
def file_store(tool, tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    env = dict(os.environ, DSTAGE_LOG_LEVEL="info")
    return Store(tool("objstore_tool"), f"file://{root}/", env), root


@pytest.fixture
def s3_store(tool, rgw, request):
    bucket = "t-" + hashlib.sha1(request.node.name.encode()).hexdigest()[:20]
    rgw.make_bucket(bucket)
    return Store(tool("objstore_tool"), f"s3://{bucket}/pfx/", rgw.env())


@pytest.fixture(params=["s3", "file"])
def store(request, tmp_path):
    if request.param == "s3":
        return request.getfixturevalue("s3_store")
    return request.getfixturevalue("file_store")[0]


def test_special_keys_round_trip(store, tmp_path):
    for i, key in enumerate(SPECIAL_KEYS):
        store.put_bytes(key, f"{i}:{key}".encode(), tmp_path)
    listed = store.ls()
    assert [k for k, _, _ in listed] == sorted(SPECIAL_KEYS,
                                               key=lambda k: k.encode())
    for i, key in enumerate(SPECIAL_KEYS):
        want = f"{i}:{key}".encode()
        assert store.get(key, 0, 4096).stdout == want
        size = int(store.head(key).stdout.split(b"\t")[0])
        assert size == len(want)


def test_ranged_gets_at_odd_offsets(store, tmp_path):
    rnd = random.Random(7)
    data = rnd.randbytes(3 * 1024 * 1024 + 17)
    store.put_bytes("blob", data, tmp_path)
    etag = store.head("blob").stdout.decode().split("\t")[1]
    cases = [(0, 1), (1, 1), (4095, 3), (len(data) - 1, 1), (len(data) - 5, 100),
             (1 << 20, 1 << 20), (12345, 777777)]
    cases += [(rnd.randrange(len(data)), rnd.randrange(1, 300000)) for _ in range(10)]
    for off, length in cases:
        got = store.get("blob", off, length, etag).stdout
        assert got == data[off:off + length], (off, length)
    # Past the end: ERANGE, and no bytes.
    p = store.get("blob", len(data), 10, check=False)
    assert p.returncode == 1 and b"ERANGE" in p.stderr and p.stdout == b""
    # A whole read with several ranges in flight.
    p = store.run("cat", "blob", "256K")
    assert p.stdout == data


def test_empty_and_one_byte_objects(store, tmp_path):
    store.put_bytes("empty", b"", tmp_path)
    store.put_bytes("one", b"x", tmp_path)
    assert store.get("empty", 0, 100).stdout == b""
    assert store.get("one", 0, 100).stdout == b"x"
    assert store.head("empty").stdout.split(b"\t")[0] == b"0"


def test_if_match_detects_replacement(store, tmp_path):
    store.put_bytes("snap", b"version one", tmp_path)
    etag = store.head("snap").stdout.decode().split("\t")[1]
    time.sleep(0.01)
    store.put_bytes("snap", b"version two!", tmp_path)
    p = store.get("snap", 0, 5, etag, check=False)
    assert p.returncode == 1 and b"ESTALE" in p.stderr
    assert p.stdout == b""


def test_missing_key_delete_copy(store, tmp_path):
    p = store.head("nope", check=False)
    assert p.returncode == 1 and b"ENOENT" in p.stderr
    p = store.get("nope", 0, 1, check=False)
    assert p.returncode == 1 and b"ENOENT" in p.stderr
    store.put_bytes("a/src", b"copy me", tmp_path)
    store.run("cp", "a/src", "b/dst")
    assert store.get("b/dst", 0, 100).stdout == b"copy me"
    store.run("rm", "a/src")
    store.run("rm", "a/src")  # deleting a missing key succeeds
    assert [k for k, _, _ in store.ls()] == ["b/dst"]


def test_file_store_refuses_escaping_keys(file_store, tmp_path):
    store, root = file_store
    (tmp_path / "secret").write_bytes(b"do not read")
    for key, err in [("../secret", "EINVAL"), ("a/../../secret", "EINVAL"),
                     ("/etc/passwd", "EINVAL"), ("a//b", "EINVAL"),
                     ("./x", "EINVAL"), ("x" * 256, "ENAMETOOLONG")]:
        p = store.get(key, 0, 10, check=False)
        assert p.returncode == 1, key
        assert p.stderr.rstrip().endswith(b"error: " + err.encode()), \
            (key, p.stderr)
        assert p.stdout == b""
        src = tmp_path / "payload"
        src.write_bytes(b"evil")
        p = store.run("put", key, str(src), check=False)
        assert p.returncode == 1, key
    assert (tmp_path / "secret").read_bytes() == b"do not read"
    assert not list(root.iterdir())


def test_file_store_lists_in_s3_order_and_hides_temp_files(file_store):
    store, root = file_store
    for rel in ["a/b", "a-x", "a.b", "a0", "b/c/d", "ab"]:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rel.encode())
    (root / ".dstage-tmp.0123").write_bytes(b"partial")
    keys = [k for k, _, _ in store.ls()]
    assert keys == sorted(["a/b", "a-x", "a.b", "a0", "b/c/d", "ab"],
                          key=lambda k: k.encode())
    assert [k for k, _, _ in store.ls("a/")] == ["a/b"]
    assert [k for k, _, _ in store.ls("b/c")] == ["b/c/d"]


def test_listing_2500_keys_across_pages(s3_store):
    s3_store.run("fill", "many/k", "2500", timeout=600)
    p = s3_store.run("ls", "many/", env={"DSTAGE_TOOL_STATS": "1"})
    keys = [line.split("\t")[3] for line in p.stdout.decode().splitlines()]
    assert keys == [f"many/k{i:05d}" for i in range(2500)]
    stats = p.stderr.decode().strip().splitlines()[-1]
    assert '"requests": 3,' in stats, stats  # 1000 keys a page


def test_multipart_200mb_round_trip(s3_store, tmp_path):
    src = tmp_path / "big"
    h = hashlib.sha256()
    rnd = random.Random(200)
    with open(src, "wb") as f:
        for _ in range(25):
            chunk = rnd.randbytes(8 << 20)
            h.update(chunk)
            f.write(chunk)
    p = s3_store.run("put", "ckpt/model.pt", str(src), env={"DSTAGE_TOOL_STATS": "1"})
    # 200 MiB in 16 MiB parts: initiate + 13 parts + complete.
    assert '"requests": 15' in p.stderr.decode(), p.stderr
    src.unlink()
    out = tmp_path / "back"
    s3_store.run("cat", "ckpt/model.pt", "8M", str(out))
    with open(out, "rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == h.hexdigest()
    etag = s3_store.head("ckpt/model.pt").stdout.decode().split("\t")[1]
    assert etag.strip('"').endswith("-13")


def test_wrong_secret_names_signature_error(s3_store):
    p = s3_store.run("ls", check=False, env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert p.returncode == 1
    err = p.stderr.decode()
    assert "SignatureDoesNotMatch" in err and "EACCES" in err
    assert "not-the-secret" not in err
    p = s3_store.run("head", "anything", check=False,
                     env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert p.returncode == 1 and b"SignatureDoesNotMatch" in p.stderr


def test_session_token_not_sent_over_plain_http(s3_store):
    """The shared radosgw is http://: a session token is refused there
    (never sent in clear) unless s3.allow_insecure_token says otherwise,
    and plain http is always warned about."""
    p = s3_store.run("ls")
    assert b"is plain http: requests and data cross the network " \
        b"unencrypted" in p.stderr, p.stderr
    token = {"AWS_SESSION_TOKEN": "FAKE-SESSION-TOKEN-0123"}
    p = s3_store.run("ls", check=False, env=token)
    assert p.returncode == 1
    assert b"refusing to send the session token" in p.stderr
    assert b"s3.allow_insecure_token = yes" in p.stderr
    assert p.stderr.rstrip().endswith(b"error: EACCES"), p.stderr
    assert b"FAKE-SESSION-TOKEN" not in p.stderr
    p = s3_store.run("ls", check=False,
                     env=dict(token, DSTAGE_S3_ALLOW_INSECURE_TOKEN="yes"))
    assert b"refusing to send the session token" not in p.stderr
    assert not p.stderr.rstrip().endswith(b"error: EACCES")


def test_world_readable_credentials_file_refused(s3_store, tmp_path):
    cred = tmp_path / "credentials"
    cred.write_text("[default]\naws_access_key_id = AKIDEXAMPLE\n"
                    "aws_secret_access_key = sekrit-value\n")
    cred.chmod(0o644)
    p = s3_store.run("ls", check=False, env={"DSTAGE_S3_CREDENTIALS_FILE": str(cred)})
    assert p.returncode == 1
    err = p.stderr.decode()
    assert str(cred) in err and "chmod 600" in err and "sekrit" not in err


def test_virtual_host_style(tool, rgw, tmp_path):
    """bucket.localhost:PORT (scripts/rgw sets rgw dns name = localhost)."""
    bucket = rgw.make_bucket("vhost-style-bucket")
    env = rgw.env(AWS_ENDPOINT_URL=f"http://localhost:{rgw.port}",
                  DSTAGE_S3_PATH_STYLE="false", DSTAGE_LOG_LEVEL="debug")
    vh = Store(tool("objstore_tool"), f"s3://{bucket}/p/", env)
    path = Store(tool("objstore_tool"), f"s3://{bucket}/p/", rgw.env())
    vh.put_bytes("dir/key with space+plus", b"virtual host", tmp_path)
    assert path.get("dir/key with space+plus", 0, 100).stdout == b"virtual host"
    assert [k for k, _, _ in vh.ls()] == ["dir/key with space+plus"]
    p = vh.get("dir/key with space+plus", 8, 4)
    assert p.stdout == b"host"


# ---- uploads in parts (objstore_upload_*), Content-MD5, x-amz-meta-sha256

SMALL_PARTS = {"DSTAGE_S3_PART_SIZE": "5M",
               "DSTAGE_S3_MULTIPART_THRESHOLD": "5M"}


def test_upload_parts_out_of_order_round_trip(store, tmp_path):
    """objstore_upload_begin/part_fd/commit: parts sent last to first
    land as one object with the bytes of the file."""
    data = random.Random(7).randbytes(12 * 1024 * 1024 + 7)  # 3 parts of 5M
    src = tmp_path / "src"
    src.write_bytes(data)
    p = store.run("upload", "up/obj", str(src), env=SMALL_PARTS)
    assert p.stdout.strip(), "no upload id printed"
    out = tmp_path / "back"
    store.run("cat", "up/obj", "4M", str(out))
    assert out.read_bytes() == data
    # An empty object is an upload of no parts.
    (tmp_path / "empty").write_bytes(b"")
    store.run("upload", "up/empty", str(tmp_path / "empty"), env=SMALL_PARTS)
    assert store.head("up/empty").stdout.split(b"\t")[0] == b"0"


def test_upload_left_open_then_aborted_by_id(store, tmp_path, request):
    """An upload whose process died never shows under its key; its id
    aborts it later (S3: ListMultipartUploads is empty again; file://:
    the temporary file is gone)."""
    src = tmp_path / "src"
    src.write_bytes(random.Random(8).randbytes(11 * 1024 * 1024))
    p = store.run("upload", "left/obj", str(src), "leave", env=SMALL_PARTS)
    upload_id = p.stdout.decode().strip()
    assert upload_id
    assert store.head("left/obj", check=False).returncode == 1
    assert [k for k, _, _ in store.ls("left/")] == []
    if store.url.startswith("s3://"):
        rgw = request.getfixturevalue("rgw")
        bucket = store.url[5:].split("/")[0]

        def open_uploads():
            out = rgw.aws("s3api", "list-multipart-uploads", "--bucket",
                          bucket, "--output", "json").stdout.decode()
            return [u["UploadId"] for u in
                    (json.loads(out) if out.strip() else {}).get("Uploads", [])]
        assert upload_id in open_uploads()
        store.run("abort-id", "left/obj", upload_id)
        assert upload_id not in open_uploads()
    else:
        d = Path(store.url[7:]) / "left"
        assert (d / upload_id).exists()
        store.run("abort-id", "left/obj", upload_id)
        assert not (d / upload_id).exists()
    # Aborting again is no error.
    store.run("abort-id", "left/obj", upload_id)


def test_upload_list_names_open_uploads(store, tmp_path, request):
    """objstore_upload_list: an upload left open is listed under its
    prefix (with its id and a plausible start time), not under another
    prefix, and no longer once aborted by that id."""
    src = tmp_path / "src"
    src.write_bytes(random.Random(9).randbytes(11 * 1024 * 1024))

    def uploads(prefix):
        out = store.run("uploads", prefix).stdout.decode()
        return [line.split("\t", 2) for line in out.splitlines()]
    try:
        store.put_bytes("lst/done", b"done", tmp_path)  # not an upload
        ids = []
        for key in ("lst/a/obj", "lst/b"):
            p = store.run("upload", key, str(src), "leave", env=SMALL_PARTS)
            ids.append(p.stdout.decode().strip())
        rows = uploads("lst/")
        assert sorted(r[1] for r in rows) == sorted(ids), rows
        now = time.time()
        for initiated, _, key in rows:
            assert abs(int(initiated) - now) < 600, rows
            if store.url.startswith("s3://"):
                assert key in ("lst/a/obj", "lst/b"), rows
            else:  # the temporary file's own path, in the key's directory
                assert key.rsplit("/", 1)[0] in ("lst/a", "lst"), rows
        assert [r[1] for r in uploads("lst/a/")] == [ids[0]]
        assert uploads("other/") == []
        for _, upload_id, key in rows:
            store.run("abort-id", key, upload_id)
        assert uploads("lst/") == []
        assert uploads("") == []
    finally:
        for _, upload_id, key in uploads(""):
            store.run("abort-id", key, upload_id, check=False)
        store.run("rm", "lst/done", check=False)
        if store.url.startswith("s3://"):
            bucket = store.url[5:].split("/")[0]
            request.getfixturevalue("rgw").aws(
                "s3api", "delete-bucket", "--bucket", bucket)


@pytest.mark.parametrize("size", [1000, 11 * 1024 * 1024])
def test_put_records_sha256_metadata(s3_store, rgw, tmp_path, size):
    """x-amz-meta-sha256 on the object: single PUT and multipart."""
    data = random.Random(size).randbytes(size)
    src = tmp_path / "src"
    src.write_bytes(data)
    s3_store.run("put", "meta/obj", str(src), env=SMALL_PARTS)
    bucket = s3_store.url[5:].split("/")[0]
    out = rgw.aws("s3api", "head-object", "--bucket", bucket, "--key",
                  "pfx/meta/obj", "--output", "json").stdout.decode()
    info = json.loads(out)
    assert info["Metadata"].get("sha256") == hashlib.sha256(data).hexdigest()
    assert info["ContentLength"] == size


def test_file_store_sweeps_stale_temporaries(file_store, tmp_path):
    """Issue 32: temporaries a dead writer left (a put killed after it made
    its file) are removed at the store's first write once older than
    store.tmp_max_age; a fresh one (a put in progress), files that only
    look like ours, links and real objects are left alone."""
    store, root = file_store
    store.put_bytes("d/real.bin", b"real", tmp_path)
    old = time.time() - 3600
    # A put killed by kill -9: its temporary with its writer's name.
    p = subprocess.Popen(["sleep", "60"])
    p.kill()
    p.wait()
    dead = root / "d" / (".dstage-tmp.0badcafe.%d.0123456789abcdef" % p.pid)
    legacy = root / "e" / "f" / ".dstage-tmp.fedcba9876543210"
    fresh = root / "d" / ".dstage-tmp.0badcafe.1.1111111111111111"
    not_ours = root / "d" / ".dstage-tmp.keep-me"
    outside = tmp_path / "outside"
    outside.mkdir()
    beyond = outside / ".dstage-tmp.0badcafe.7.2222222222222222"
    legacy.parent.mkdir(parents=True)
    for f in (dead, legacy, fresh, not_ours, beyond):
        f.write_bytes(b"partial")
    (root / "link").symlink_to(outside)               # never followed
    planted_link = root / "d" / ".dstage-tmp.0badcafe.8.3333333333333333"
    planted_link.symlink_to(root / "d" / "real.bin")  # not a regular file
    for f in (dead, legacy, not_ours, beyond):
        os.utime(f, (old, old))
    os.utime(planted_link, (old, old), follow_symlinks=False)
    # Reads (and a store not written to) remove nothing.
    assert [k for k, _, _ in store.ls()] == ["d/real.bin"]
    assert dead.exists() and legacy.exists()
    # The first write of a handle with a small max age sweeps.
    p = store.run("put", "d/new.bin", str(tmp_path / ("src-" + hashlib.sha1(
        b"d/real.bin").hexdigest())), env={"DSTAGE_STORE_TMP_MAX_AGE": "60s"})
    log = p.stderr.decode()
    assert not dead.exists() and not legacy.exists()
    assert "removed stale temporary file 'd/%s'" % dead.name in log, log
    assert "'e/f/%s'" % legacy.name in log, log
    assert fresh.exists(), "a fresh temporary (a live put) was swept"
    assert not_ours.exists() and beyond.exists()
    assert planted_link.is_symlink()
    assert (root / "d" / "real.bin").read_bytes() == b"real"
    assert (root / "d" / "new.bin").read_bytes() == b"real"
    # 0 turns the sweep off.
    os.utime(fresh, (old, old))
    store.run("put", "d/new2.bin", str(tmp_path / ("src-" + hashlib.sha1(
        b"d/real.bin").hexdigest())), env={"DSTAGE_STORE_TMP_MAX_AGE": "0"})
    assert fresh.exists()
    # New temporaries carry host, pid and random parts (upload left open).
    src = tmp_path / "src"
    src.write_bytes(b"x" * 100)
    up = store.run("upload", "u/obj", str(src), "leave",
                   env=SMALL_PARTS).stdout.decode().strip()
    assert re.fullmatch(r"\.dstage-tmp\.[0-9a-f]{8}\.[0-9]+\.[0-9a-f]{16}",
                        up), up
