"""x-amz-meta-sha256 on objects published from parts (issues 14 and 22).

An upload in parts that begins before the content's SHA-256 is known (a
checkpoint sent while it is written; `stager push` of a large file, hashed
as its parts are read) gets the hash afterwards with objstore_set_sha256:
a copy of the object onto itself (x-amz-metadata-directive: REPLACE),
conditional on the ETag just published, carrying over the metadata the
object had. Checked against radosgw: the store op itself (metadata kept,
a wrong ETag refused and nothing changed, a file:// store a no-op), a
checkpoint published from overlapped parts and a multipart push (HEAD
shows the content's hash; the drill and `verify --source` pass), and an
object replaced between the commit and the stamp (never stamped, a
warning names it).
"""
import hashlib
import json
import os
import random
import subprocess
import threading

from test_checkpoints import (Ckpt, S3Store, catalog_rows, drill,
                              open_uploads, sha)
from waits import wait_for
from test_objstore import SMALL_PARTS, Store
from test_push import RgwDest, push, text
from test_stager import MiB, Stager
from test_stager import stager_dir  # noqa: F401 (fixture)

def head(rgw, bucket, key):
    """The headers of a HEAD of /bucket/key, names lower-cased."""
    p = rgw.curl("/%s/%s" % (bucket, key), "-I")
    out = {}
    for line in p.stdout.decode(errors="replace").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k.strip().lower()] = v.strip()
    return out


def put_with_meta(rgw, bucket, key, data, tmp_path):
    src = tmp_path / "meta-src"
    src.write_bytes(data)
    p = rgw.curl("/%s/%s" % (bucket, key), "-T", str(src),
                 "-H", "Content-Type: text/x-ckpt",
                 "-H", "x-amz-meta-owner: alice",
                 "-o", "/dev/null", "-w", "%{http_code}",
                 payload_sha256="UNSIGNED-PAYLOAD")
    assert p.stdout == b"200", p.stderr


# ---- the store op ----

def test_set_sha256_keeps_metadata_and_checks_the_etag(tool, rgw, tmp_path):
    bucket = rgw.make_bucket("meta-" + os.urandom(4).hex())
    st = Store(tool("objstore_tool"), "s3://%s/pfx/" % bucket, rgw.env())
    try:
        data = random.Random(1).randbytes(300000)
        want = hashlib.sha256(data).hexdigest()
        put_with_meta(rgw, bucket, "pfx/a.bin", data, tmp_path)
        before = head(rgw, bucket, "pfx/a.bin")
        # Another version's ETag: refused before any copy, nothing changes.
        p = st.run("set-sha256", "a.bin", '"%s"' % ("0" * 32), want,
                   check=False)
        assert p.returncode == 1 and b"ESTALE" in p.stderr, p.stderr
        assert "x-amz-meta-sha256" not in head(rgw, bucket, "pfx/a.bin")
        # The published ETag: stamped, the rest kept.
        p = st.run("set-sha256", "a.bin", before["etag"], want)
        after = head(rgw, bucket, "pfx/a.bin")
        assert after.get("x-amz-meta-sha256") == want, after
        assert after["content-type"] == "text/x-ckpt", after
        assert after.get("x-amz-meta-owner") == "alice", after
        assert after["etag"] == before["etag"]
        assert p.stdout.decode().strip() == before["etag"]
        assert rgw.curl("/%s/pfx/a.bin" % bucket).stdout == data
        # Uploaded in parts, no ETag given: the one a HEAD finds.
        big = random.Random(2).randbytes(11 * MiB)
        (tmp_path / "big").write_bytes(big)
        st.run("upload", "big.bin", str(tmp_path / "big"), env=SMALL_PARTS)
        assert "x-amz-meta-sha256" not in head(rgw, bucket, "pfx/big.bin")
        st.run("set-sha256", "big.bin", "-",
               hashlib.sha256(big).hexdigest())
        h = head(rgw, bucket, "pfx/big.bin")
        assert h.get("x-amz-meta-sha256") == hashlib.sha256(big).hexdigest()
        assert h["etag"].endswith('-3"'), h
        p = st.run("set-sha256", "gone.bin", "-", want, check=False)
        assert p.returncode == 1 and b"ENOENT" in p.stderr
    finally:
        for k in ("a.bin", "big.bin"):
            st.run("rm", k, check=False)
        rgw.curl("/" + bucket, "-X", "DELETE")


def test_set_sha256_on_a_directory_store_checks_only(tool, tmp_path):
    root = tmp_path / "dir"
    root.mkdir()
    (root / "f").write_bytes(b"x")
    st = Store(tool("objstore_tool"), "file://%s/" % root, dict(os.environ))
    want = hashlib.sha256(b"x").hexdigest()
    st.run("set-sha256", "f", "-", want)
    p = st.run("set-sha256", "f", '"nope"', want, check=False)
    assert p.returncode == 1 and b"ESTALE" in p.stderr
    assert sorted(os.listdir(root)) == ["f"]


# ---- checkpoints ----

def write_overlapped(m, name, data):
    """Write data so that its upload in parts begins while it is written
    (8 MiB parts), return the open fd (the caller closes: the publish)."""
    fd = os.open(m.ck / "job" / name, os.O_CREAT | os.O_WRONLY)
    for off in range(0, len(data) - (4 << 20), 1 << 20):
        os.pwrite(fd, data[off:off + (1 << 20)], off)
    wait_for(lambda: open_uploads(m.store), "an open upload", 30)
    off = len(data) - (4 << 20)
    os.pwrite(fd, data[off:], off)
    return fd


def test_checkpoint_from_overlapped_parts_gets_sha256(tool, tmp_path, rgw):
    store = S3Store(rgw)
    m = Ckpt(tool, tmp_path / "m", store)
    m.start()
    try:
        (m.ck / "job").mkdir()
        data = os.urandom(36 << 20)                   # 5 parts of 8 MiB
        os.close(write_overlapped(m, "step-10.bin", data))
        m.check_published("job/step-10.bin", sha(data))
        h = head(rgw, store.bucket, store.prefix + "job/step-10.bin")
        assert h.get("x-amz-meta-sha256") == sha(data), h
        assert h["etag"].endswith('-5"'), h            # the overlapped parts
        # the Content-Type a single PUT gets (it was application/xml, the
        # CreateMultipartUpload request's own), kept by the stamp
        assert h["content-type"] == "binary/octet-stream", h
        assert "x-amz-meta-sha256" not in m.log_text()
        # The drill restores it and checks it.
        out = tmp_path / "drill"
        p = subprocess.run([tool("stager"), "drill", "job", "--to",
                            str(out), "--json"], env=m.env,
                           capture_output=True, timeout=300, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        rep = json.loads(p.stdout)
        assert rep["files"] == 1 and rep["ok"] and rep["bad"] == [], rep
        # Without its sidecar the drill checks the object's own header.
        store.rgw.curl("/%s/%s.dstage-sha256/job/step-10.bin" %
                       (store.bucket, store.prefix), "-X", "DELETE")
        assert store.get(".dstage-sha256/job/step-10.bin") is None
        p = subprocess.run([tool("stager"), "drill", "job", "--to",
                            str(tmp_path / "drill2"), "--json"], env=m.env,
                           capture_output=True, timeout=300, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        rep = json.loads(p.stdout)
        assert rep["files"] == 1 and rep["ok"] and rep["bad"] == [], rep
    finally:
        m.stop()
        store.cleanup()


def test_stamp_turned_off_leaves_sidecar_and_catalog(tool, tmp_path, rgw):
    """checkpoints.stamp_sha256 = false (AWS rewrites the data of a copy
    onto itself): no x-amz-meta-sha256 on an object from overlapped parts,
    the sidecar and the catalog hold its hash, and the drill passes."""
    store = S3Store(rgw)
    m = Ckpt(tool, tmp_path / "m", store,
             env=dict(store.env, DSTAGE_CHECKPOINTS_STAMP_SHA256="false"))
    m.start()
    try:
        (m.ck / "job").mkdir()
        data = os.urandom(36 << 20)                   # 5 parts of 8 MiB
        os.close(write_overlapped(m, "step-11.bin", data))
        m.check_published("job/step-11.bin", sha(data))
        h = head(rgw, store.bucket, store.prefix + "job/step-11.bin")
        assert "x-amz-meta-sha256" not in h, h
        assert h["etag"].endswith('-5"'), h
        assert catalog_rows(m)["job/step-11.bin"] == (sha(data), len(data))
        rc, out, err = drill(tool, m, tmp_path, "job", "--to",
                             tmp_path / "drill", "--json")
        assert rc == 0 and json.loads(out)["ok"], out + err
    finally:
        m.stop()
        store.cleanup()


def test_checkpoint_replaced_before_the_stamp_is_not_stamped(
        tool, tmp_path, faultproxy):
    """The object is replaced between CompleteMultipartUpload and the copy
    that stamps it (the fault proxy holds the answer to the stamp's HEAD
    while the test stores another version): the copy's if-match refuses
    it, the other version gets no hash that is not its own, close still
    returns 0 and a warning names the key."""
    store = S3Store(faultproxy.rgw, env=faultproxy.env())
    m = Ckpt(tool, tmp_path / "m", store)
    m.start()
    try:
        (m.ck / "job").mkdir()
        data = os.urandom(36 << 20)
        fd = write_overlapped(m, "s.bin", data)
        key = "/%s/%sjob/s.bin" % (store.bucket, store.prefix)
        faultproxy.reset_stats()
        faultproxy.add_fault("stall", count=1, match="HEAD", path=key,
                             seconds=4)
        done = {}
        t = threading.Thread(target=lambda: done.update(
            rc=os.close(fd)), daemon=True)
        t.start()
        wait_for(lambda: faultproxy.count("HEAD", path=key),
                 "the stamp's HEAD", 60)
        other = b"another writer's version\n"
        store.put("job/s.bin", other)
        t.join(120)
        assert not t.is_alive() and "rc" in done
        h = head(faultproxy.rgw, store.bucket, store.prefix + "job/s.bin")
        assert "x-amz-meta-sha256" not in h, h
        copies = [r for r in faultproxy.requests()
                  if r["method"] == "PUT" and r["path"] == key
                  and not r["query"]]
        assert [r["status"] for r in copies] == [412], copies
        assert "job/s.bin was replaced" in m.log_text(), m.log_text()
    finally:
        m.stop()
        store.cleanup()


# ---- stager push ----

def test_multipart_push_gets_sha256(tool, stager_dir, faultproxy):  # noqa: F811,E501
    dest = RgwDest(faultproxy.rgw, faultproxy)
    src = stager_dir / "src"
    src.mkdir()
    body = os.urandom(12 * MiB)
    (src / "big.bin").write_bytes(body)
    (src / "small.txt").write_bytes(b"small\n")
    s = Stager(tool("stager"), stager_dir, env=dest.env)
    with open(s.cfg, "a") as f:  # 12 MiB: three parts of 5 MiB
        f.write("[s3]\nmultipart_threshold = 5M\npart_size = 5M\n")
    s.start()
    try:
        p = push(s, str(src), dest.url, "--name", "mp", "--verify")
        assert p.returncode == 0, text(p)
        h = head(faultproxy.rgw, dest.bucket, dest.prefix + "/big.bin")
        assert h.get("x-amz-meta-sha256") == \
            hashlib.sha256(body).hexdigest(), h
        assert h["etag"].endswith('-3"'), h
        assert h["content-type"] == "binary/octet-stream", h
        h = head(faultproxy.rgw, dest.bucket, dest.prefix + "/small.txt")
        assert h.get("x-amz-meta-sha256") == \
            hashlib.sha256(b"small\n").hexdigest(), h
        p = s.run("verify", "mp", "--source")
        assert p.returncode == 0, text(p)
    finally:
        s.stop()
        dest.empty(tool("stager"))

