"""Registration shares the catalog's write lock (lib/catalog/catalog_register.c;
docs/catalog.md, "Writers"): while a large dataset registers from a store
that lists slowly, the daemon's other writers (requests that add and remove
a dataset or queue a stage job, the job dispatcher, the audit trail) never
wait out the busy bound: none of them fails and the daemon never logs
"database is locked".

Before the fix the registration held the write lock across the listing of
each batch of 20,000 keys and took it again at once, so at a million files
the job dispatcher logged "database is locked" every ~7 s and requests
failed. The store here is a fake S3 on 127.0.0.1 that serves ListObjectsV2
pages of 1,000 keys: the first batch's pages at once, the second batch's
after a delay each, so that listing it takes longer than the busy bound
(5 s): a registration that holds the lock while it lists makes the
requests fail."""
import http.server
import os
import threading
import time
import urllib.parse

from test_stager import Stager

PAGE = 1000
FAST_PAGES = 20  # one batch of CATALOG_BATCH (lib/catalog/catalog_i.h) keys
SLOW_PAGES = 20
PAGE_DELAY_S = 0.35  # a slow page: 7 s for the second batch
N_KEYS = (FAST_PAGES + SLOW_PAGES) * PAGE
ETAG = "&quot;0123456789abcdef0123456789abcdef&quot;"


class SlowListS3:
    """ListObjectsV2 of N_KEYS keys ds/dDDD/fNNNNNNN (10 bytes each), PAGE
    a page, the pages after the first FAST_PAGES each after PAGE_DELAY_S;
    the continuation token is the page number. Nothing else is served
    (registration only lists)."""

    def __init__(self):
        outer = self
        self.pages = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                q = urllib.parse.parse_qs(urllib.parse.urlsplit(
                    self.path).query)
                if q.get("list-type") != ["2"]:
                    self.send_error(404)
                    return
                page = int(q.get("continuation-token", ["0"])[0])
                if page >= FAST_PAGES:
                    time.sleep(PAGE_DELAY_S)
                outer.pages += 1
                body = outer.listing(page).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       daemon=True)
        self.thread.start()
        self.endpoint = "http://127.0.0.1:%d" % self.server.server_port

    @staticmethod
    def listing(page):
        first = page * PAGE
        last = min(first + PAGE, N_KEYS)
        more = last < N_KEYS
        out = ['<?xml version="1.0" encoding="UTF-8"?>'
               '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
               '2006-03-01/"><Name>bkt</Name><Prefix>ds/</Prefix>'
               "<KeyCount>%d</KeyCount><MaxKeys>%d</MaxKeys>"
               "<IsTruncated>%s</IsTruncated>"
               % (last - first, PAGE, "true" if more else "false")]
        if more:
            out.append("<NextContinuationToken>%d</NextContinuationToken>"
                       % (page + 1))
        for i in range(first, last):
            out.append("<Contents><Key>ds/d%03d/f%07d</Key>"
                       "<LastModified>2026-01-01T00:00:00.000Z"
                       "</LastModified><ETag>%s</ETag><Size>10</Size>"
                       "<StorageClass>STANDARD</StorageClass></Contents>"
                       % (i // 1000, i, ETAG))
        out.append("</ListBucketResult>")
        return "".join(out)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_writers_get_in_while_a_large_dataset_registers(tool, tmp_path):
    s3 = SlowListS3()
    env = dict(os.environ, HOME=str(tmp_path),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
              "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        env.pop(k, None)
    small = tmp_path / "small"
    small.mkdir()
    (small / "a").write_bytes(b"abc")
    s = Stager(tool("stager"), tmp_path, env=env)
    with open(s.cfg, "a") as f:
        f.write("[s3]\nendpoint = %s\nmax_attempts = 1\n" % s3.endpoint)
    failed, during = [], 0
    try:
        s.start()
        s.run("add", "small", "file://%s/" % small, check=True)
        done = threading.Event()
        result = {}

        def register():
            t = time.monotonic()
            result["p"] = s.run("add", "big", "s3://bkt/ds/", timeout=300)
            result["s"] = time.monotonic() - t
            done.set()

        th = threading.Thread(target=register)
        th.start()
        # Mutating requests, one after another, while it registers; the
        # stage jobs also make the dispatcher claim and finish jobs.
        deadline = time.monotonic() + 240
        i = 0
        while not done.is_set() and time.monotonic() < deadline:
            for args in (("stage", "small"),
                         ("add", "s%d" % i, "file://%s/" % small),
                         ("remove", "s%d" % i)):
                p = s.run(*args, timeout=60)
                if p.returncode:
                    failed.append((args, p.returncode,
                                   p.stderr.decode(errors="replace")))
                if not done.is_set():
                    during += 1
            i += 1
        th.join(300)
        p = result["p"]
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        assert s.json("show", "big")["files"] == N_KEYS
        assert s3.pages == N_KEYS // PAGE
    finally:
        s.stop()
        s3.close()
    log = s.log.read_text()
    assert during >= 6, (during, result.get("s"))
    assert not failed, failed
    assert "database is locked" not in log, log[-3000:]
