"""bench_s3: a small S3 client for the bench (stdlib only): Signature V4 on
PUT/GET/HEAD over kept-alive http.client connections, and a threaded uploader
for many small objects. It loads data and measures nothing of dstage."""
import datetime
import hashlib
import hmac
import http.client
import queue
import threading
import time
import urllib.parse

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class S3:
    def __init__(self, endpoint, access_key, secret_key, region="us-east-1"):
        u = urllib.parse.urlsplit(endpoint)
        assert u.scheme == "http", "bench talks plain http to its own radosgw"
        self.host, self.port = u.hostname, u.port or 80
        self.hosthdr = f"{self.host}:{self.port}"
        self.ak, self.sk, self.region = access_key, secret_key, region
        self._local = threading.local()

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            c = http.client.HTTPConnection(self.host, self.port, timeout=120)
            self._local.conn = c
        return c

    def _headers(self, method, path, payload_sha, query=""):
        now = datetime.datetime.now(datetime.timezone.utc)
        amzdate = now.strftime("%Y%m%dT%H%M%SZ")
        day = amzdate[:8]
        curi = urllib.parse.quote(path, safe="/~")
        hdrs = {"host": self.hosthdr, "x-amz-content-sha256": payload_sha,
                "x-amz-date": amzdate}
        signed = ";".join(sorted(hdrs))
        canon = "\n".join([method, curi, query,
                           "".join(f"{k}:{hdrs[k]}\n" for k in sorted(hdrs)),
                           signed, payload_sha])
        scope = f"{day}/{self.region}/s3/aws4_request"
        sts = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope,
                         hashlib.sha256(canon.encode()).hexdigest()])
        k = _hmac(("AWS4" + self.sk).encode(), day)
        k = _hmac(_hmac(_hmac(k, self.region), "s3"), "aws4_request")
        sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
        hdrs["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.ak}/{scope}, "
                                 f"SignedHeaders={signed}, Signature={sig}")
        return hdrs

    def request(self, method, path, body=b"", query="", tries=5):
        sha = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
        for attempt in range(tries):
            try:
                c = self._conn()
                h = self._headers(method, path, sha, query)
                c.request(method, path + ("?" + query if query else ""),
                          body=body or None, headers=h)
                r = c.getresponse()
                data = r.read()
                if r.status >= 500 and attempt + 1 < tries:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                return r.status, data
            except (OSError, http.client.HTTPException):
                self._local.conn = None
                if attempt + 1 == tries:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise RuntimeError("unreachable")

    def make_bucket(self, bucket):
        st, data = self.request("PUT", f"/{bucket}")
        if st not in (200, 409):
            raise RuntimeError(f"create bucket {bucket}: HTTP {st} {data[:200]!r}")

    def put(self, bucket, key, body):
        st, data = self.request("PUT", f"/{bucket}/{key}", body)
        if st != 200:
            raise RuntimeError(f"PUT {bucket}/{key}: HTTP {st} {data[:200]!r}")

    def put_many(self, bucket, items, threads=16, deadline_s=3600):
        """items: iterable of (key, bytes or callable returning bytes).
        Uploads with `threads` kept-alive connections; returns the count."""
        q = queue.Queue(maxsize=threads * 4)
        errors = []
        done = [0]
        lock = threading.Lock()
        t_end = time.monotonic() + deadline_s

        def worker():
            while True:
                it = q.get()
                if it is None:
                    return
                if errors:
                    continue
                key, body = it
                try:
                    self.put(bucket, key, body() if callable(body) else body)
                    with lock:
                        done[0] += 1
                except Exception as e:  # noqa: BLE001 (reported below)
                    errors.append(e)

        ws = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
        for w in ws:
            w.start()
        try:
            for it in items:
                if errors or time.monotonic() > t_end:
                    break
                q.put(it)
        finally:
            for _ in ws:
                q.put(None)
            for w in ws:
                w.join()
        if errors:
            raise errors[0]
        if time.monotonic() > t_end:
            raise RuntimeError(f"upload to {bucket} ran past {deadline_s}s")
        return done[0]
