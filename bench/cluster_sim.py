#!/usr/bin/env python3
"""cluster_sim: how N dstage nodes staging the same dataset at once load the
store, and how long they take (docs/deployment.md, "Many nodes, one store").

The model, stepped every dt seconds over arrays of N nodes (numpy):

- Each node is told to stage at t = 0 and starts at a uniform random time in
  [0, jitter] (`stager stage --jitter`, the prolog's DSTAGE_STAGE_JITTER).
- A node has `requests` requests to send (`extra` metadata requests, then one
  GET per object part: ceil(object_size / part_size) per object), each
  moving `object_size / parts` bytes.
- Its token buckets (lib/objstore/ratelimit.c, shared by the node's processes): req
  tokens refill at the current rate up to max(1, rate) (one second's worth),
  byte tokens at byte_limit up to byte_limit (a larger request waits for a
  full bucket and leaves it in debt). 0 leaves a bucket out.
- At most `inflight` requests of a node are out at once (s3.max_inflight).
  A request takes latency + bytes / bandwidth, its bandwidth being the
  smaller of conn_bw and store_bw shared by every request in flight.
- The store serves at most store_rps requests in any second; past that it
  answers 503 SlowDown with Retry-After: retry_after. A throttled node
  halves its rate (at most once a second, never below limit / 16), holds
  every request for retry_after, and recovers by limit / 10 per second (the
  AIMD of lib/objstore/ratelimit.c). Throttled requests are sent again.

With the dataset's shared tier (predict_tier, `--tier`; docs/stager.md,
"The shared tier"): every node runs `stage --shared --wait`; the first to
start copies the snapshot from the store into the tier (the model above for
one node alone, or its tier write at tier_node_bw if that is slower) and
publishes it; every node then fills its cache from the tier, the readers
sharing tier_bw (the parallel file system's aggregate) and each reading at
most tier_node_bw. The store serves the copy once and each node only its
`extra` metadata requests (the model above with no objects).

Outputs: the request rate the store sees (peak over any 1 s, mean over the
staging), the 503s, and each node's time-to-staged (from t = 0 to its last
request's answer): median, p99 and max. The step (dt) bounds the time
resolution; 0.01 s is right for a few nodes, 0.05 s is enough for 1,000.

    bench/cluster_sim.py --nodes 1000 --req-limit 20 --jitter 60 \\
        --objects 256 --object-size 32M --store-rps 5000 --store-bw 20G \\
        --dt 0.05

    bench/cluster_sim.py --tier ...   # the same, with and without the tier

tests/integration/test_manynodes.py runs predict() for its 8 nodes and checks
the measurement against it; tests/integration/test_shared_tier_reads.py does
the same with predict_tier() for 8 nodes sharing a tier on CephFS.
"""
import argparse
import json
import math
import sys

import numpy as np

RECOVER_S = 10.0  # lib/objstore/ratelimit.c RATELIMIT_RECOVER_S
FLOOR_DIV = 16.0  # RATELIMIT_FLOOR_DIV
CUT_GAP_S = 1.0  # RATELIMIT_CUT_GAP_MS

DEFAULTS = {
    "nodes": 1000,
    "req_limit": 20.0,  # s3.max_requests_per_second (per node, 0: none)
    "byte_limit": 0.0,  # s3.max_bytes_per_second (per node, 0: none)
    "jitter": 60.0,  # s, DSTAGE_STAGE_JITTER
    "objects": 256,
    "object_size": 32 << 20,
    "part_size": 8 << 20,  # s3 ranged GET size (cache block multiple)
    "extra": 2,  # metadata requests per node (manifest, listing)
    "inflight": 8,  # s3.max_inflight
    "latency": 0.02,  # s, a request's first byte
    "conn_bw": 200e6,  # bytes/s one connection can move
    "store_rps": 5000.0,  # requests/s the store serves before 503s
    "store_bw": 20e9,  # bytes/s the store serves in all
    "retry_after": 1.0,  # s, the store's Retry-After on 503
    "seed": 18,
    "dt": 0.01,  # s per simulated step
    "max_time": 7200.0,  # s, the simulation gives up here
}

TIER_DEFAULTS = {
    "tier_bw": 100e9,  # bytes/s the parallel file system serves in all
    "tier_node_bw": 2e9,  # bytes/s one node reads from (or writes to) it
}


def parse_size(s):
    s = str(s).strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if s and s[-1].upper() in mult:
        return float(s[:-1]) * mult[s[-1].upper()]
    return float(s)


def predict(**kw):
    """Run the model; returns a dict of its outputs (see the module doc)."""
    p = dict(DEFAULTS)
    unknown = set(kw) - set(p)
    if unknown:
        raise TypeError("unknown parameters: %s" % sorted(unknown))
    p.update(kw)
    dt = float(p["dt"])
    n = int(p["nodes"])
    rng = np.random.default_rng(int(p["seed"]))
    parts = max(1, math.ceil(p["object_size"] / p["part_size"]))
    req_bytes = p["object_size"] / parts
    total_req = int(p["extra"] + p["objects"] * parts)
    rmax, bmax = float(p["req_limit"]), float(p["byte_limit"])
    floor = min(rmax, max(0.5, rmax / FLOOR_DIV)) if rmax > 0 else 0.0

    start = rng.uniform(0, p["jitter"], n) if p["jitter"] > 0 else \
        np.zeros(n)
    left = np.full(n, total_req, dtype=np.int64)  # not yet answered
    unsent = np.full(n, total_req, dtype=np.int64)
    rate = np.full(n, rmax)
    tok = np.full(n, max(1.0, rmax))
    btok = np.full(n, bmax)
    hold = np.zeros(n)
    last_cut = np.full(n, -1e9)
    done_at = np.full(n, np.nan)
    # requests answered at a future step: a ring of rows
    ring_len = int(math.ceil(120.0 / dt))
    ring = np.zeros((ring_len, n), dtype=np.int64)
    window = np.zeros(int(round(1.0 / dt)), dtype=np.int64)
    served_per_step = []
    inflight = np.zeros(n, dtype=np.int64)
    n503 = 0
    steps = int(p["max_time"] / dt)
    k = 0
    for k in range(steps):
        t = k * dt
        # answers arriving now
        row = ring[k % ring_len]
        inflight -= row
        left -= row
        finished = (left == 0) & np.isnan(done_at)
        done_at[finished] = t
        row[:] = 0
        if not np.isnan(done_at).any():
            break
        active = (t >= start) & (unsent > 0) & (t >= hold)
        if rmax > 0:
            rate = np.minimum(rmax, rate + rmax / RECOVER_S * dt)
            tok = np.minimum(np.maximum(1.0, rate), tok + rate * dt)
        if bmax > 0:
            btok = np.minimum(bmax, btok + bmax * dt)
        want = np.where(active, np.minimum(unsent, p["inflight"] - inflight),
                        0)
        want = np.maximum(want, 0)
        if rmax > 0:
            want = np.minimum(want, np.floor(tok).astype(np.int64))
        if bmax > 0:
            need = min(req_bytes, bmax)
            ok = btok >= need
            nb = np.where(ok, 1 + np.floor((btok - need) / req_bytes), 0)
            want = np.minimum(want, nb.astype(np.int64))
        sent = int(want.sum())
        if rmax > 0:
            tok -= want
        if bmax > 0:
            btok -= want * req_bytes
        # the store: at most store_rps served in any second
        room = max(0, int(p["store_rps"] - window.sum()))
        served = want
        if sent > room:
            # the excess, spread over the senders, is answered 503
            frac = room / sent
            served = np.floor(want * frac).astype(np.int64)
            short = room - int(served.sum())
            if short > 0:
                idx = rng.choice(np.flatnonzero(want > served), short,
                                 replace=False)
                served[idx] += 1
            throttled = want - served
            n503 += int(throttled.sum())
            hit = throttled > 0
            cut = hit & (t >= last_cut + CUT_GAP_S)
            if rmax > 0:
                rate = np.where(cut, np.maximum(floor, rate / 2), rate)
                tok = np.minimum(tok, np.maximum(1.0, rate))
            last_cut = np.where(cut, t, last_cut)
            hold = np.where(hit, t + p["retry_after"], hold)
        window[k % len(window)] = int(served.sum())
        served_per_step.append(int(served.sum()))
        unsent -= served
        inflight += served
        total_inflight = max(1, int(inflight.sum()))
        bw = min(p["conn_bw"], p["store_bw"] / total_inflight)
        lat = p["latency"] + req_bytes / bw
        due = k + max(1, int(math.ceil(lat / dt)))
        if due - k >= ring_len:
            due = k + ring_len - 1
        ring[due % ring_len] += served
    series = np.array(served_per_step, dtype=np.int64)
    per_s = int(round(1.0 / dt))
    if len(series) >= per_s:
        sums = np.convolve(series, np.ones(per_s, dtype=np.int64), "valid")
        peak = int(sums.max())
    else:
        peak = int(series.sum())
    nz = np.flatnonzero(series)
    span = (nz[-1] - nz[0] + 1) * dt if len(nz) else 0.0
    done = done_at[~np.isnan(done_at)]
    return {
        "params": p,
        "requests_per_node": total_req,
        "requests": int(series.sum()),
        "peak_rps": peak,
        "mean_rps": float(series.sum() / span) if span else 0.0,
        "throttled_503": n503,
        "staged_nodes": int(len(done)),
        "time_to_staged_median_s": float(np.median(done)) if len(done)
        else None,
        "time_to_staged_p99_s": float(np.percentile(done, 99)) if len(done)
        else None,
        "time_to_staged_max_s": float(done.max()) if len(done) else None,
        "simulated_s": (k + 1) * dt,
    }


def _times(done):
    done = np.asarray(done, dtype=float)
    return {
        "time_to_staged_median_s": float(np.median(done)),
        "time_to_staged_p99_s": float(np.percentile(done, 99)),
        "time_to_staged_max_s": float(done.max()),
    }


def predict_tier(**kw):
    """The model with the dataset's shared tier (see the module doc).
    Returns the store's requests and bytes, the time the copy was published,
    each node's time-to-staged (median, p99, max), and the same figures
    without the tier (predict() on the same parameters) under "without"."""
    p = dict(DEFAULTS, **TIER_DEFAULTS)
    unknown = set(kw) - set(p)
    if unknown:
        raise TypeError("unknown parameters: %s" % sorted(unknown))
    p.update(kw)
    base = {k: v for k, v in p.items() if k in DEFAULTS}
    n, dt = int(p["nodes"]), float(p["dt"])
    rng = np.random.default_rng(int(p["seed"]))
    start = rng.uniform(0, p["jitter"], n) if p["jitter"] > 0 else \
        np.zeros(n)
    size = float(p["objects"]) * float(p["object_size"])
    # the publisher: the first node to start, alone on the store
    pub = predict(**dict(base, nodes=1, jitter=0))
    copy_s = max(pub["time_to_staged_max_s"] or 0.0,
                 size / p["tier_node_bw"])
    published = float(start.min()) + copy_s
    # everybody's metadata requests (the listing, the manifest)
    meta = predict(**dict(base, objects=0)) if p["extra"] > 0 else \
        {"requests": 0, "peak_rps": 0, "throttled_503": 0}
    # the fills: processor sharing of tier_bw, each node capped
    begin = np.maximum(start, published)
    left = np.full(n, size)
    done_at = np.where(left <= 0, begin, np.nan)
    t = float(begin.min())
    end = t + p["max_time"]
    while np.isnan(done_at).any() and t < end:
        active = (begin <= t) & np.isnan(done_at)
        k = int(active.sum())
        if k:
            rate = min(p["tier_node_bw"], p["tier_bw"] / k)
            left[active] -= rate * dt
            fin = active & (left <= 0)
            done_at[fin] = t + dt
        t += dt
    without = predict(**base)
    out = {
        "params": p,
        "store_requests": int(pub["requests"] + meta["requests"]),
        "store_bytes": size,
        "store_peak_rps": max(pub["peak_rps"], meta["peak_rps"]),
        "throttled_503": pub["throttled_503"] + meta["throttled_503"],
        "published_s": published,
        "staged_nodes": int((~np.isnan(done_at)).sum()),
        "without": {
            "store_requests": without["requests"],
            "store_bytes": size * n,
            "store_peak_rps": without["peak_rps"],
            "throttled_503": without["throttled_503"],
            "staged_nodes": without["staged_nodes"],
            "time_to_staged_median_s": without["time_to_staged_median_s"],
            "time_to_staged_p99_s": without["time_to_staged_p99_s"],
            "time_to_staged_max_s": without["time_to_staged_max_s"],
        },
    }
    out.update(_times(done_at[~np.isnan(done_at)]) if out["staged_nodes"]
               else {"time_to_staged_median_s": None,
                     "time_to_staged_p99_s": None,
                     "time_to_staged_max_s": None})
    return out


def _print_tier(r):
    w = r["without"]
    print("%d nodes, shared tier: the store serves %d requests, %.3g GB "
          "(without: %d requests, %.3g GB); %d x 503 (without: %d)"
          % (r["params"]["nodes"], r["store_requests"],
             r["store_bytes"] / 1e9, w["store_requests"],
             w["store_bytes"] / 1e9, r["throttled_503"], w["throttled_503"]))
    print("copy published at %.1f s" % r["published_s"])
    for name, x in (("with the tier", r), ("without", w)):
        if x["staged_nodes"]:
            print("time to staged (%s): median %.1f s, p99 %.1f s, "
                  "max %.1f s (%d of %d nodes)"
                  % (name, x["time_to_staged_median_s"],
                     x["time_to_staged_p99_s"], x["time_to_staged_max_s"],
                     x["staged_nodes"], r["params"]["nodes"]))
        else:
            print("time to staged (%s): no node staged within %.0f s"
                  % (name, r["params"]["max_time"]))


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Predict the store's request rate and the nodes' "
        "time-to-staged when N dstage nodes stage one dataset "
        "(docs/deployment.md, 'Many nodes, one store').")
    for name, v in DEFAULTS.items():
        flag = "--" + name.replace("_", "-")
        if name in ("object_size", "part_size", "conn_bw", "store_bw",
                    "byte_limit"):
            ap.add_argument(flag, type=parse_size, default=v,
                            help="default %s (K/M/G suffixes)" % v)
        else:
            ap.add_argument(flag, type=type(v), default=v,
                            help="default %s" % v)
    for name, v in TIER_DEFAULTS.items():
        ap.add_argument("--" + name.replace("_", "-"), type=parse_size,
                        default=v, help="with --tier; default %s" % v)
    ap.add_argument("--tier", action="store_true",
                    help="model the dataset's shared tier, and print both "
                    "ways")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args(argv)
    kw = {k: getattr(a, k) for k in DEFAULTS}
    if a.tier:
        kw.update({k: getattr(a, k) for k in TIER_DEFAULTS})
        r = predict_tier(**kw)
        if a.json:
            json.dump(r, sys.stdout, indent=1)
            print()
        else:
            _print_tier(r)
        return 0
    r = predict(**kw)
    if a.json:
        json.dump(r, sys.stdout, indent=1)
        print()
        return 0
    print("%d nodes x %d requests: peak %d req/s, mean %.1f req/s, %d x 503"
          % (r["params"]["nodes"], r["requests_per_node"], r["peak_rps"],
             r["mean_rps"], r["throttled_503"]))
    if r["staged_nodes"]:
        print("time to staged: median %.1f s, p99 %.1f s, max %.1f s "
              "(%d of %d nodes)" % (r["time_to_staged_median_s"],
                                    r["time_to_staged_p99_s"],
                                    r["time_to_staged_max_s"],
                                    r["staged_nodes"], r["params"]["nodes"]))
    else:
        print("no node staged within %.0f s" % r["params"]["max_time"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
