"""Server-side copies in parts (UploadPartCopy), above s3.copy_threshold.

objstore_copy (checkpoint renames) and objstore_set_sha256 (the self-copy
that stamps x-amz-meta-sha256 after an upload in parts) of objects larger
than one CopyObject may copy (5 GiB) go as CreateMultipartUpload,
UploadPartCopy of each range, CompleteMultipartUpload; aborted on any
failure. The threshold and part size are lowered to 5 MiB here
(DSTAGE_S3_COPY_THRESHOLD, DSTAGE_S3_COPY_PART_SIZE), so a 23 MiB object
is copied in 5 parts, the last one short. Checked against radosgw: a
rename in <mount>/checkpoints/ (bytes, metadata, old key gone, no upload
left open), the stamp of a checkpoint published from overlapped parts
(hash on the object, the ETag the journal records is the new object's),
a source replaced during the copy (ESTALE, nothing published, upload
aborted), and a 503 or resets on one UploadPartCopy (retried; or, with
the retries spent, a clean failure with the upload aborted).
"""
import hashlib
import os
import random
import threading

from test_checkpoints import Ckpt, S3Store, open_uploads, sha
from waits import wait_for
from test_ckpt_meta import head, put_with_meta, write_overlapped
from test_objstore import Store

MiB = 1 << 20
SIZE = 23 * MiB + 12345                 # 5 parts of 5 MiB, the last short
COPY_PARTS = {"DSTAGE_S3_COPY_THRESHOLD": "5M",
              "DSTAGE_S3_COPY_PART_SIZE": "5M"}
FAST = {"DSTAGE_S3_MAX_ATTEMPTS": "3", "DSTAGE_S3_BACKOFF_BASE": "50ms",
        "DSTAGE_S3_BACKOFF_MAX": "200ms"}


def part_copies(proxy, key):
    """The UploadPartCopy requests the proxy saw for /bucket/key."""
    return [r for r in proxy.requests()
            if r["method"] == "PUT" and r["path"] == key
            and "partNumber=" in (r["query"] or "")]


def uploads(rgw, bucket):
    st = S3Store.__new__(S3Store)
    st.kind, st.rgw, st.bucket = "s3", rgw, bucket
    return open_uploads(st)


class Bucket:
    """A fresh bucket, objstore_tool on s3://bucket/pfx/ through env."""

    def __init__(self, tool, rgw, env):
        self.rgw = rgw
        self.name = rgw.make_bucket("cp-" + os.urandom(4).hex())
        self.st = Store(tool("objstore_tool"), "s3://%s/pfx/" % self.name,
                        dict(env, **COPY_PARTS, **FAST))

    def get(self, key):
        return self.rgw.curl("/%s/pfx/%s" % (self.name, key)).stdout

    def head(self, key):
        return head(self.rgw, self.name, "pfx/" + key)

    def cleanup(self):
        for u in uploads(self.rgw, self.name):
            self.rgw.aws("s3api", "abort-multipart-upload", "--bucket",
                         self.name, "--key", u[0], "--upload-id", u[1],
                         check=False)
        for k in ("a.bin", "b.bin"):
            self.rgw.curl("/%s/pfx/%s" % (self.name, k), "-X", "DELETE")
        self.rgw.curl("/" + self.name, "-X", "DELETE")


# ---- 1. a rename in <mount>/checkpoints/ above the threshold ----

def test_rename_above_copy_threshold_copies_in_parts(tool, tmp_path,
                                                      faultproxy):
    rgw = faultproxy.rgw
    store = S3Store(rgw, env=faultproxy.env())
    m = Ckpt(tool, tmp_path / "m", store,
             env=dict(store.env, **COPY_PARTS))
    m.start()
    try:
        (m.ck / "job").mkdir()
        data = random.Random(7).randbytes(SIZE)
        (m.ck / "job" / "a.bin").write_bytes(data)     # published at close
        m.check_published("job/a.bin", sha(data))
        before = head(rgw, store.bucket, store.prefix + "job/a.bin")
        assert before.get("x-amz-meta-sha256") == sha(data), before
        faultproxy.reset_stats()
        os.rename(m.ck / "job" / "a.bin", m.ck / "job" / "b.bin")
        key = "/%s/%sjob/b.bin" % (store.bucket, store.prefix)
        assert len(part_copies(faultproxy, key)) == 5, faultproxy.counts()
        m.check_published("job/b.bin", sha(data))       # bytes and sidecar
        assert store.get("job/a.bin") is None
        assert "job/a.bin" not in store.keys()
        after = head(rgw, store.bucket, store.prefix + "job/b.bin")
        assert after["etag"].endswith('-5"'), after     # 5 copied parts
        assert after.get("x-amz-meta-sha256") == sha(data), after
        assert after["content-type"] == before["content-type"], after
        assert int(after["content-length"]) == SIZE
        assert open_uploads(store) == []
        assert "cannot rename" not in m.log_text(), m.log_text()
        with open(m.ck / "job" / "b.bin", "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == sha(data)
    finally:
        m.stop()
        store.cleanup()


def test_copy_in_parts_keeps_the_sources_metadata(tool, rgw, tmp_path):
    b = Bucket(tool, rgw, rgw.env())
    try:
        data = random.Random(8).randbytes(SIZE)
        put_with_meta(rgw, b.name, "pfx/a.bin", data, tmp_path)
        b.st.run("set-sha256", "a.bin", "-", sha(data))
        src = b.head("a.bin")
        b.st.run("cp", "a.bin", "b.bin")
        h = b.head("b.bin")
        assert h["etag"].endswith('-5"'), h
        assert h["content-type"] == "text/x-ckpt", h
        assert h.get("x-amz-meta-owner") == "alice", h
        assert h.get("x-amz-meta-sha256") == sha(data), h
        assert b.get("b.bin") == data
        assert b.head("a.bin")["etag"] == src["etag"]  # source untouched
        assert uploads(rgw, b.name) == []
    finally:
        b.cleanup()


# ---- 2. the stamp of a checkpoint published from overlapped parts ----

def journal_etags(m):
    """The ETags of the journal's records (the store's staging
    subdirectory's journal/<ino>): "STATE SHA SIZE ETAG", with a fifth
    field "%" when the key below is escaped (docs/checkpoints.md)."""
    out = []
    for f in (m.staging / "journal").iterdir():
        first = f.read_text(errors="replace").split("\n", 1)[0].split()
        if len(first) in (4, 5) and first[0] == "C" and \
                first[4:] in ([], ["%"]):
            out.append(first[3])
    return out


def test_overlapped_checkpoint_above_copy_threshold_gets_sha256(
        tool, tmp_path, rgw):
    store = S3Store(rgw)
    m = Ckpt(tool, tmp_path / "m", store,
             env=dict(store.env, **COPY_PARTS))
    m.start()
    try:
        (m.ck / "job").mkdir()
        data = os.urandom(36 << 20)     # 5 upload parts, 8 copied parts
        os.close(write_overlapped(m, "big.bin", data))
        m.check_published("job/big.bin", sha(data))
        h = head(rgw, store.bucket, store.prefix + "job/big.bin")
        assert h.get("x-amz-meta-sha256") == sha(data), (h, m.log_text())
        # the stamp's copy in parts made a new object: 36 MiB in 5 MiB parts
        assert h["etag"].endswith('-8"'), h
        assert h["content-type"] == "binary/octet-stream", h
        assert "larger than S3 copies" not in m.log_text()
        assert open_uploads(store) == []
        # The ETag the journal records is the new object's (else the next
        # lookup would take the object for another node's version).
        assert h["etag"] in journal_etags(m), (h, journal_etags(m))
    finally:
        m.stop()
        store.cleanup()


def test_set_sha256_in_parts_answers_the_new_etag(tool, rgw, tmp_path):
    b = Bucket(tool, rgw, rgw.env())
    try:
        data = random.Random(9).randbytes(SIZE)
        put_with_meta(rgw, b.name, "pfx/a.bin", data, tmp_path)
        before = b.head("a.bin")
        p = b.st.run("set-sha256", "a.bin", before["etag"], sha(data))
        h = b.head("a.bin")
        assert h.get("x-amz-meta-sha256") == sha(data), h
        assert h["content-type"] == "text/x-ckpt", h
        assert h.get("x-amz-meta-owner") == "alice", h
        assert h["etag"].endswith('-5"') and h["etag"] != before["etag"], h
        assert p.stdout.decode().strip() == h["etag"]
        assert b.get("a.bin") == data
        assert uploads(rgw, b.name) == []
    finally:
        b.cleanup()


# ---- 3. failures ----

def test_source_replaced_during_the_copy_fails_with_estale(
        tool, rgw, faultproxy):
    """The fault proxy holds the answer to part 2 while the test stores
    another version of the source: radosgw ignores the parts' if-match
    headers, so the HEAD after the parts must catch it. The copy fails with
    ESTALE, nothing is under the destination, the upload is aborted."""
    b = Bucket(tool, rgw, faultproxy.env())
    try:
        data = random.Random(10).randbytes(SIZE)
        assert rgw.put_object(b.name, "pfx/a.bin", data) == 200
        faultproxy.reset_stats()
        faultproxy.add_fault("stall", count=1, match="PUT",
                             path="partNumber=2&", seconds=3)
        done = {}
        t = threading.Thread(target=lambda: done.update(
            p=b.st.run("cp", "a.bin", "b.bin", check=False)), daemon=True)
        t.start()
        wait_for(lambda: faultproxy.count("PUT", path="partNumber=2&"),
                 "the copy of part 2", 60)
        other = random.Random(11).randbytes(SIZE)
        assert rgw.put_object(b.name, "pfx/a.bin", other) == 200
        t.join(120)
        assert not t.is_alive() and "p" in done
        p = done["p"]
        err = p.stderr.decode(errors="replace")
        assert p.returncode == 1 and "ESTALE" in err, err
        assert "was replaced during the copy" in err, err
        assert b.rgw.curl("/%s/pfx/b.bin" % b.name, "-o", "/dev/null",
                          "-w", "%{http_code}").stdout == b"404"
        assert uploads(rgw, b.name) == []
        assert any(r["method"] == "DELETE" and "uploadId=" in r["query"]
                   for r in faultproxy.requests())
        assert b.get("a.bin") == other
    finally:
        b.cleanup()


def test_stamp_of_a_source_replaced_during_the_copy_is_refused(
        tool, rgw, faultproxy, tmp_path):
    b = Bucket(tool, rgw, faultproxy.env())
    try:
        data = random.Random(12).randbytes(SIZE)
        put_with_meta(rgw, b.name, "pfx/a.bin", data, tmp_path)
        etag = b.head("a.bin")["etag"]
        faultproxy.add_fault("stall", count=1, match="PUT",
                             path="partNumber=2&", seconds=3)
        done = {}
        t = threading.Thread(target=lambda: done.update(
            p=b.st.run("set-sha256", "a.bin", etag, sha(data),
                       check=False)), daemon=True)
        t.start()
        wait_for(lambda: faultproxy.count("PUT", path="partNumber=2&"),
                 "the copy of part 2", 60)
        other = random.Random(13).randbytes(SIZE)
        assert rgw.put_object(b.name, "pfx/a.bin", other) == 200
        t.join(120)
        p = done["p"]
        assert p.returncode == 1 and b"ESTALE" in p.stderr, p.stderr
        h = b.head("a.bin")
        assert "x-amz-meta-sha256" not in h, h   # never another's hash
        assert b.get("a.bin") == other
        assert uploads(rgw, b.name) == []
    finally:
        b.cleanup()


def test_a_503_on_one_part_copy_is_retried(tool, rgw, faultproxy):
    b = Bucket(tool, rgw, faultproxy.env())
    try:
        data = random.Random(14).randbytes(SIZE)
        assert rgw.put_object(b.name, "pfx/a.bin", data) == 200
        faultproxy.reset_stats()
        faultproxy.add_fault("503", count=1, match="PUT",
                             path="partNumber=3&")
        b.st.run("cp", "a.bin", "b.bin")
        assert b.get("b.bin") == data
        key = "/%s/pfx/b.bin" % b.name
        p3 = [r["status"] for r in part_copies(faultproxy, key)
              if "partNumber=3&" in r["query"]]
        assert p3 == [503, 200], part_copies(faultproxy, key)
        assert len(part_copies(faultproxy, key)) == 6   # 5 parts, 1 retry
        assert uploads(rgw, b.name) == []
    finally:
        b.cleanup()


def test_resets_on_one_part_copy_fail_cleanly(tool, rgw, faultproxy):
    """Every attempt at part 4 is reset: the copy fails with EIO once the
    retries are spent, the upload is aborted, nothing is published."""
    b = Bucket(tool, rgw, faultproxy.env())
    try:
        data = random.Random(15).randbytes(SIZE)
        assert rgw.put_object(b.name, "pfx/a.bin", data) == 200
        faultproxy.reset_stats()
        faultproxy.add_fault("reset", count=100, match="PUT",
                             path="partNumber=4&")
        p = b.st.run("cp", "a.bin", "b.bin", check=False)
        assert p.returncode == 1 and b"EIO" in p.stderr, p.stderr
        key = "/%s/pfx/b.bin" % b.name
        p4 = [r for r in part_copies(faultproxy, key)
              if "partNumber=4&" in r["query"]]
        assert len(p4) == 3, p4                          # max_attempts
        assert b.rgw.curl(key, "-o", "/dev/null", "-w",
                          "%{http_code}").stdout == b"404"
        assert uploads(rgw, b.name) == []
        assert any(r["method"] == "DELETE" and "uploadId=" in r["query"]
                   for r in faultproxy.requests())
    finally:
        faultproxy.clear_faults()
        b.cleanup()
