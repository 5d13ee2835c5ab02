"""Per-node limits on requests to the source (s3.max_requests_per_second,
s3.max_bytes_per_second) and throttling answers (429, 503 SlowDown,
Retry-After), measured at tests/faultproxy.py in front of radosgw: the
timestamps of the requests the proxy saw."""
import hashlib
import random
import subprocess
import time

import pytest

from test_objstore import Store

DATA = random.Random(18).randbytes(3 * 1024 * 1024 + 77)

FAST = {
    "DSTAGE_S3_BACKOFF_BASE": "20ms",
    "DSTAGE_S3_BACKOFF_MAX": "200ms",
    "DSTAGE_S3_LOW_SPEED_TIME": "2s",
    "DSTAGE_S3_CONNECT_TIMEOUT": "2s",
    "DSTAGE_S3_MAX_ATTEMPTS": "5",
    "DSTAGE_S3_DEADLINE": "60s",
}


@pytest.fixture
def limited(tool, rgw, faultproxy, request, tmp_path):
    """(store through the proxy, proxy, bucket) with object 'blob'; the
    bucket is emptied and deleted afterwards."""
    bucket = "rl-" + hashlib.sha1(request.node.name.encode()).hexdigest()[:20]
    rgw.make_bucket(bucket)
    direct = Store(tool("objstore_tool"), f"s3://{bucket}/", rgw.env())
    try:
        direct.put_bytes("blob", DATA, tmp_path)
        env = faultproxy.env(**FAST)
        yield (Store(tool("objstore_tool"), f"s3://{bucket}/", env),
               faultproxy, bucket)
    finally:
        direct.run("rm", "blob", check=False)
        rgw.curl("/" + bucket, "-X", "DELETE", "-o", "/dev/null")


def times(proxy, method="GET"):
    return sorted(r["t"] for r in proxy.requests()
                  if r["method"] == method and "/blob" in r["path"])


def most_in_a_second(ts):
    """The largest number of timestamps within any 1 s window."""
    best, j = 0, 0
    for i, t in enumerate(ts):
        while ts[j] <= t - 1.0:
            j += 1
        best = max(best, i - j + 1)
    return best


def test_429_retry_after_waited(limited):
    store, proxy, _ = limited
    proxy.add_fault("429", count=1, match="GET", path="/blob", seconds=2)
    p = store.get("blob", 0, 100000, check=False)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout == DATA[:100000]
    ts = times(proxy)
    assert len(ts) == 2, ts
    # the retry came no sooner than the store asked (the backoff alone would
    # retry within 20-200 ms)
    assert ts[1] - ts[0] >= 1.95, ts[1] - ts[0]
    assert ts[1] - ts[0] < 10


def test_retry_after_holds_the_whole_process(limited):
    """A Retry-After holds every request of the process, not only the one
    that got it: the next ranges wait too."""
    store, proxy, _ = limited
    proxy.add_fault("429", count=1, match="GET", path="/blob", skip=2,
                    seconds=2)
    p = store.run("cat", "blob", "256K", check=False,
                  env={"DSTAGE_S3_MAX_INFLIGHT": "1"})
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout == DATA
    reqs = sorted((r["t"], r["fault"]) for r in proxy.requests()
                  if r["method"] == "GET" and "/blob" in r["path"])
    t429 = [t for t, f in reqs if f == "429"]
    assert len(t429) == 1, reqs
    later = [t - t429[0] for t, _ in reqs if t > t429[0]]
    assert later and min(later) >= 1.95, later


def test_503_retry_after_capped_by_deadline(limited):
    """A Retry-After beyond s3.deadline ends the request with ETIMEDOUT at
    once, not after a minute's sleep."""
    store, proxy, _ = limited
    proxy.add_fault("503", count=100, match="GET", path="/blob")
    proxy.throttle_retry_after = 3600  # on every 503 SlowDown
    t = time.monotonic()
    p = store.get("blob", 0, 100, check=False,
                  env={"DSTAGE_S3_DEADLINE": "3s"})
    assert p.returncode == 1
    err = p.stderr.decode()
    assert "deadline of 3000 ms reached" in err and "ETIMEDOUT" in err, err
    assert proxy.count("GET", "/blob") == 1
    assert time.monotonic() - t < 10


def test_request_rate_respected(limited):
    store, proxy, _ = limited
    rate = 8
    # 3 MB in 64 KiB ranges: 49 GETs, in parallel without a limit
    t = time.monotonic()
    p = store.run("cat", "blob", "64K", check=False,
                  env={"DSTAGE_S3_MAX_REQUESTS_PER_SECOND": str(rate)})
    took = time.monotonic() - t
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout == DATA
    ts = times(proxy)
    n = len(ts)
    assert n >= 40, n
    # a burst of one second's worth, then the rate: at least (n - rate) /
    # rate seconds from first to last request (10% slack)
    assert ts[-1] - ts[0] >= 0.9 * (n - 1 - rate) / rate, (ts[-1] - ts[0], n)
    # and no second sees more than a burst plus a second's worth
    assert most_in_a_second(ts) <= 2 * rate + 1, most_in_a_second(ts)
    assert took < 30


def test_byte_rate_respected(limited):
    store, proxy, _ = limited
    # 1 MiB/s: the 3 MiB object takes at least 2 s (the first second's
    # worth is a burst)
    t = time.monotonic()
    p = store.run("cat", "blob", "256K", check=False,
                  env={"DSTAGE_S3_MAX_BYTES_PER_SECOND": "1M"})
    took = time.monotonic() - t
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout == DATA
    ts = times(proxy)
    assert ts[-1] - ts[0] >= 1.8, ts[-1] - ts[0]
    assert took < 30


NODES = 8
STORE_RPS = 40  # what the proxy serves; above it, 503 SlowDown
NODE_RPS = 20  # each node's limit: 8 x 20 = 4 x what the store takes


def run_nodes(store, rate):
    env = dict(store.env)
    env.update({"DSTAGE_S3_MAX_REQUESTS_PER_SECOND": str(rate),
                "DSTAGE_S3_MAX_ATTEMPTS": "30",
                "OBJSTORE_TOOL_CHECK_RX": "1"})
    procs = [subprocess.Popen([store.tool, store.url, "cat", "blob", "128K"],
                              env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for _ in range(NODES)]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out, err))
    return outs


def test_eight_nodes_back_off_together(limited):
    """8 processes ("nodes", each its own limiter) fetch the object through
    a proxy that throttles above STORE_RPS: every node gets the right bytes,
    and the AIMD backoff keeps throttled answers a minority of requests."""
    store, proxy, _ = limited
    proxy.throttle_rps = STORE_RPS
    t = time.monotonic()
    outs = run_nodes(store, NODE_RPS)
    took = time.monotonic() - t
    for rc, out, err in outs:
        assert rc == 0, err.decode()
        assert out == DATA
    reqs = [r for r in proxy.requests() if "/blob" in r["path"]]
    throttled = sum(1 for r in reqs if r.get("throttled"))
    served = len(reqs) - throttled
    print("nodes: %d requests, %d throttled, %.1f s" %
          (len(reqs), throttled, took))
    assert served >= NODES * 25
    # without the backoff each node keeps asking at 20/s, 4 x the store's
    # rate: about 3 throttled answers per request served (measured: 604 to
    # 208); with it about 1 to 1
    assert throttled < 1.5 * served, (throttled, served)
    assert took < 90


def test_held_past_deadline_fails_fast(limited):
    """A request the limits would hold past s3.deadline ends at once, named,
    instead of waiting to be sent with no time left."""
    store, proxy, _ = limited
    t = time.monotonic()
    p = store.run("cat", "blob", "64K", check=False, timeout=60,
                  env={"DSTAGE_S3_MAX_REQUESTS_PER_SECOND": "1",
                       "DSTAGE_S3_DEADLINE": "2s"})
    err = p.stderr.decode()
    assert p.returncode == 1, (time.monotonic() - t, proxy.count("GET"), err)
    assert "held past s3.deadline" in err, err
    assert proxy.count("GET", "/blob") <= 3
    assert time.monotonic() - t < 10
