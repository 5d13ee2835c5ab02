#!/usr/bin/env python3
"""faultproxy: a fault-injecting HTTP/1.1 proxy for tests (Python stdlib only).

It sits between a client and an S3 server on 127.0.0.1 and forwards every
request byte for byte (request line and headers verbatim, Host untouched, so
AWS SigV4 signatures still verify; Content-Length, chunked and
Expect: 100-continue bodies; client-side keep-alive). Faults are armed on
command and hit the next `count` requests that match a method and an optional
substring of the request target, then requests pass again.

Fault kinds (`nbytes` counts response *body* bytes; when it is not given the
fault strikes half-way through a body that has a length, or before the
response head when the body is empty or of unknown length):

  503 / slowdown   answer 503 SlowDown with S3 error XML (upstream not called)
  500 / internal   answer 500 InternalError with S3 error XML
  reset            forward, relay `nbytes` of the body, then reset (RST)
  reset_request    reset the client connection after reading the request head
                   (upstream never sees the request: an upload that never
                   landed)
  reset_upload     forward the request head and `nbytes` of its body
                   (default: half of a Content-Length body) upstream, then
                   reset the client connection and close upstream's: an
                   upload cut in the middle of its body (a part the store
                   saw begin and never end); a body no longer than that
                   passes whole
  truncate         forward, relay `nbytes` of the body, then close cleanly
                   (FIN) although Content-Length promised more
  stall            hold `seconds` (default 30) before the response head, or
                   after `nbytes` of the body when given, then carry on
  length_long      announce Content-Length + `nbytes` (default 1024), send the
                   real body, close
  length_short     announce Content-Length - `nbytes` (default half), send the
                   real body, close
  corrupt          flip one bit of the body byte at offset `nbytes`
                   (default: the middle); Content-Length bodies only
  corrupt_request  flip one bit of the *request* body byte at offset
                   `nbytes` (default: the middle) on its way to the server,
                   headers untouched (Content-Length bodies only): a body
                   damaged in transit, which only a checksum the server
                   verifies (Content-MD5, a signed payload hash) can catch
  bare502/503/504  answer that status with no body at all (Content-Length:
                   0): a load balancer or gateway, no S3 error code to go by
  html502/503/504  answer that status with a text/html page (a load
                   balancer's error page), not S3 XML
  429              answer 429 Too Many Requests, no body, with
                   Retry-After: `seconds` (default 1)
  etag             forward, but change the first hex digit of the answer's
                   ETag header (the body stored is intact): a store that
                   holds other bytes than its client sent, as its ETag
                   would show
  Every kind applies to HEAD too (match="HEAD"); a HEAD answer has no body.

Python API (what tests/integration/conftest.py uses):

    p = FaultProxy(upstream_port, upstream_host="127.0.0.1", port=0,
                   control_port=None)
    p.start()                     # p.port, p.endpoint ("http://127.0.0.1:N")
    p.add_fault(kind, count=1, match="GET", path=None, skip=0,
                seconds=None, nbytes=None) -> Fault
    p.clear_faults(); p.pending_faults() -> list of dicts
    p.requests() -> list of dicts (method, target, path, query, range,
                    status, fault, body_bytes: response body bytes relayed)
    p.count(method=None, path=None, range=None) -> int
    p.body_bytes(method="GET", query=None) -> int  (query "": object GETs)
    p.counts() -> {"GET /bucket/key": n, ...}  (query string left out)
    p.reset_stats()
    p.stop()                      # also a context manager

Control endpoint (when control_port is not None; 0 picks a free port):

    POST /fault?kind=503&count=2&match=GET&path=/bkt/key&skip=0&seconds=5&nbytes=100
    POST /clear        POST /reset-stats        GET /stats (JSON)

Command line: faultproxy.py --upstream 127.0.0.1:PORT [--port N]
[--control-port N] prints {"port": N, "control_port": M} and runs until
SIGINT/SIGTERM.
"""

import argparse
import http.server
import json
import select
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse

MAX_HEAD = 64 * 1024          # request/response head size limit
MAX_HEADERS = 200
MAX_CHUNK_LINE = 4096
MAX_REQUESTS_PER_CONN = 100000
MAX_CONNECTIONS = 512
PIECE = 256 * 1024            # relay granularity
IDLE_TIMEOUT = 120.0          # seconds a socket may sit silent
DRAIN_LIMIT = 1 << 30         # most request-body bytes we discard

KINDS = ("503", "500", "reset", "reset_request", "reset_upload",
         "truncate", "stall",
         "length_long", "length_short", "corrupt", "bare502", "bare503",
         "bare504", "html502", "html503", "html504", "429",
         "corrupt_request", "etag")
REASONS = {429: "Too Many Requests", 500: "Internal Server Error",
           502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout"}
ALIASES = {"slowdown": "503", "internal": "500", "internalerror": "500",
           "timeout": "stall", "truncated": "truncate"}


class ProxyClosed(Exception):
    """The proxy is stopping, or a peer went away."""


class Reader:
    """Buffered reads from a socket, every read bounded."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        data = self.sock.recv(PIECE)
        if not data:
            raise EOFError
        self.buf += data

    def read_head(self):
        """Bytes up to and including the blank line. EOFError if the peer
        closed before sending anything."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise ValueError("head too large")
            self._fill()
        i = self.buf.index(b"\r\n\r\n") + 4
        head, self.buf = self.buf[:i], self.buf[i:]
        return head

    def read_line(self):
        while b"\r\n" not in self.buf:
            if len(self.buf) > MAX_CHUNK_LINE:
                raise ValueError("line too long")
            self._fill()
        i = self.buf.index(b"\r\n") + 2
        line, self.buf = self.buf[:i], self.buf[i:]
        return line

    def read_some(self, limit):
        if not self.buf:
            self._fill()
        piece, self.buf = self.buf[:limit], self.buf[limit:]
        return piece

    def read_exact(self, n):
        out = []
        while n > 0:
            piece = self.read_some(min(n, PIECE))
            out.append(piece)
            n -= len(piece)
        return b"".join(out)


def parse_head(head):
    """(first line, [(name, value)], {lowercase name: value})."""
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0]
    headers = []
    for line in lines[1:MAX_HEADERS + 1]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return first, headers, {n.lower(): v for n, v in headers}


def body_pieces(reader, framing):
    """Yield the raw bytes of a message body (chunk framing included)."""
    kind, n = framing
    if kind == "length":
        while n > 0:
            piece = reader.read_some(min(n, PIECE))
            n -= len(piece)
            yield piece
    elif kind == "chunked":
        for _ in range(1 << 30):
            line = reader.read_line()
            yield line
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                for _ in range(MAX_HEADERS):   # trailers, then a blank line
                    t = reader.read_line()
                    yield t
                    if t == b"\r\n":
                        return
                raise ValueError("too many trailers")
            left = size + 2
            while left > 0:
                piece = reader.read_some(min(left, PIECE))
                left -= len(piece)
                yield piece
    elif kind == "close":
        for _ in range(1 << 40):
            try:
                piece = reader.read_some(PIECE)
            except EOFError:
                return
            yield piece


def request_framing(h):
    if "chunked" in h.get("transfer-encoding", "").lower():
        return ("chunked", 0)
    return ("length", int(h.get("content-length", "0") or 0))


def response_framing(method, status, h):
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return ("length", 0)
    if "chunked" in h.get("transfer-encoding", "").lower():
        return ("chunked", 0)
    if "content-length" in h:
        return ("length", int(h["content-length"]))
    return ("close", 0)


def wants_close(version, h):
    conn = h.get("connection", "").lower()
    if "close" in conn:
        return True
    return version == "HTTP/1.0" and "keep-alive" not in conn


def plain_error(kind, seconds, method):
    """The answer of a bare/html 5xx or a 429 fault: (head, body); the head
    without the Connection header and the blank line."""
    status = int(kind[-3:])
    extra = ""
    if kind.startswith("html"):
        body = ("<html><head><title>%d %s</title></head><body><center><h1>"
                "%d %s</h1></center><hr><center>nginx</center></body>"
                "</html>\r\n" % (status, REASONS[status], status,
                                  REASONS[status])).encode()
        ctype = "text/html"
    else:
        body, ctype = b"", "text/plain"
    if status == 429:
        extra = "Retry-After: %d\r\n" % int(1 if seconds is None
                                              else seconds)
    head = ("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            "%sServer: faultproxy-lb\r\n" % (status, REASONS[status], ctype,
                                              len(body), extra))
    return status, head, (b"" if method == "HEAD" else body)


def s3_error(status, code, message, resource, req_id, method):
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code>'
            "<Message>%s</Message><Resource>%s</Resource>"
            "<RequestId>%s</RequestId></Error>" %
            (code, message, resource, req_id)).encode()
    reason = {500: "Internal Server Error", 503: "Service Unavailable"}[status]
    head = ("HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\n"
            "Content-Length: %d\r\nx-amz-request-id: %s\r\n"
            "Server: faultproxy\r\n" % (status, reason, len(body), req_id))
    return head, (b"" if method == "HEAD" else body)


class Fault:
    def __init__(self, kind, count=1, match="GET", path=None, skip=0,
                 seconds=None, nbytes=None):
        k = ALIASES.get(str(kind).lower(), str(kind).lower())
        if k not in KINDS:
            raise ValueError("unknown fault kind %r (one of %s)" %
                             (kind, ", ".join(KINDS)))
        self.kind = k
        self.count = int(count)
        self.match = (match or "*").upper()
        self.path = path
        self.skip = int(skip)
        self.seconds = None if seconds is None else float(seconds)
        self.nbytes = None if nbytes is None else int(nbytes)
        self.hits = 0

    def matches(self, method, target):
        if self.match not in ("*", "ANY") and self.match != method:
            return False
        return self.path is None or self.path in target

    def as_dict(self):
        return {"kind": self.kind, "count": self.count, "match": self.match,
                "path": self.path, "skip": self.skip, "seconds": self.seconds,
                "nbytes": self.nbytes, "hits": self.hits}


class FaultProxy:
    def __init__(self, upstream_port, upstream_host="127.0.0.1", port=0,
                 control_port=None, host="127.0.0.1",
                 idle_timeout=IDLE_TIMEOUT):
        self.upstream = (upstream_host, int(upstream_port))
        self.host = host
        self.want_port = port
        self.want_control_port = control_port
        self.idle_timeout = idle_timeout
        self.lock = threading.Lock()
        self.faults = []
        self.log = []
        self.stopping = threading.Event()
        self.conns = set()
        self.threads = set()
        self.listener = None
        self.accept_thread = None
        self.control = None
        self.control_thread = None
        self.port = None
        self.control_port = None
        self.req_seq = 0
        # Throttle like a busy store: past throttle_rps requests served in
        # the last second, answer 503 SlowDown (with Retry-After: throttle_retry_after
        # seconds when set) instead of forwarding. Each record has "t", its
        # arrival (time.monotonic()).
        self.throttle_rps = None
        self.throttle_retry_after = None
        # Forwarded GETs: each waits get_delay seconds first (when set);
        # active_gets is how many are being served now (self.lock) and
        # max_active_gets the most at once since start or reset_stats.
        self.get_delay = None
        self.active_gets = 0
        self.max_active_gets = 0

    # ---- public API -------------------------------------------------------
    @property
    def endpoint(self):
        return "http://%s:%d" % (self.host, self.port)

    def start(self):
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((self.host, self.want_port))
        ls.listen(128)
        ls.settimeout(0.2)
        self.listener = ls
        self.port = ls.getsockname()[1]
        self.accept_thread = threading.Thread(target=self._accept_loop,
                                              name="faultproxy-accept",
                                              daemon=True)
        self.accept_thread.start()
        if self.want_control_port is not None:
            self._start_control(self.want_control_port)
        return self

    def stop(self, timeout=10.0):
        self.stopping.set()
        if self.control is not None:
            self.control.shutdown()
            self.control.server_close()
        if self.accept_thread is not None:
            self.accept_thread.join(timeout)
        if self.listener is not None:
            self.listener.close()
        with self.lock:
            conns = list(self.conns)
            threads = list(self.threads)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def add_fault(self, kind, count=1, match="GET", path=None, skip=0,
                  seconds=None, nbytes=None):
        f = Fault(kind, count, match, path, skip, seconds, nbytes)
        with self.lock:
            self.faults.append(f)
        return f

    def clear_faults(self):
        with self.lock:
            self.faults = []

    def pending_faults(self):
        with self.lock:
            return [f.as_dict() for f in self.faults if f.count > 0]

    def requests(self):
        with self.lock:
            return [dict(r) for r in self.log]

    def count(self, method=None, path=None, range=None):
        n = 0
        for r in self.requests():
            if method is not None and r["method"] != method.upper():
                continue
            if path is not None and path not in r["target"]:
                continue
            if range is not None and r["range"] != range:
                continue
            n += 1
        return n

    def body_bytes(self, method="GET", query=None):
        """Response body bytes relayed for method's requests (those whose
        query string is `query` when given, "" for plain object GETs)."""
        return sum(r.get("body_bytes", 0) for r in self.requests()
                   if r["method"] == method.upper() and
                   (query is None or r["query"] == query))

    def counts(self):
        out = {}
        for r in self.requests():
            k = "%s %s" % (r["method"], r["path"])
            out[k] = out.get(k, 0) + 1
        return out

    def reset_stats(self):
        with self.lock:
            self.log = []
            self.max_active_gets = self.active_gets

    def _over_rate(self, now):
        """With throttle_rps set: True when that many requests were served
        (not throttled) in the second before now."""
        if not self.throttle_rps:
            return False
        n = 0
        with self.lock:
            for r in reversed(self.log[:-1]):
                if r["t"] <= now - 1.0:
                    break
                n += not r.get("throttled")
        return n >= self.throttle_rps

    # ---- internals ----------------------------------------------------------
    def _take_fault(self, method, target):
        with self.lock:
            for f in self.faults:
                if f.count <= 0 or not f.matches(method, target):
                    continue
                if f.skip > 0:
                    f.skip -= 1
                    return None
                f.count -= 1
                f.hits += 1
                return f
        return None

    def _accept_loop(self):
        while not self.stopping.is_set():
            try:
                cs, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                if len(self.conns) >= MAX_CONNECTIONS:
                    cs.close()
                    continue
                self.conns.add(cs)
            t = threading.Thread(target=self._serve, args=(cs,),
                                 name="faultproxy-conn", daemon=True)
            with self.lock:
                self.threads.add(t)
            t.start()

    def _forget(self, sock):
        with self.lock:
            self.conns.discard(sock)

    def _serve(self, cs):
        cs.settimeout(self.idle_timeout)
        cs.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = Reader(cs)
        try:
            for _ in range(MAX_REQUESTS_PER_CONN):
                if self.stopping.is_set():
                    break
                if not self._one_request(cs, reader):
                    break
        except (EOFError, OSError, ValueError, ProxyClosed):
            pass
        finally:
            self._forget(cs)
            try:
                cs.close()
            except OSError:
                pass
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _sleep(self, seconds):
        """Sleep, but wake up when the proxy stops."""
        if self.stopping.wait(seconds):
            raise ProxyClosed()

    @staticmethod
    def _reset(sock):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                            struct.pack("ii", 1, 0))
        except OSError:
            pass
        sock.close()

    def _one_request(self, cs, reader):
        """Serve one request; return True to keep the connection."""
        try:
            head = reader.read_head()
        except EOFError:
            return False
        first, _, h = parse_head(head)
        parts = first.split(" ")
        if len(parts) != 3:
            raise ValueError("bad request line")
        method, target, version = parts[0].upper(), parts[1], parts[2]
        url = urllib.parse.urlsplit(target)
        rec = {"method": method, "target": target, "path": url.path,
               "query": url.query, "range": h.get("range"), "status": None,
               "fault": None, "t": time.monotonic()}
        with self.lock:
            self.log.append(rec)
            self.req_seq += 1
            seq = self.req_seq
        fault = self._take_fault(method, target)
        if fault is None and self._over_rate(rec["t"]):
            fault = Fault("503", 1, method)
            rec["throttled"] = True
        if fault is not None:
            rec["fault"] = fault.kind
        client_close = wants_close(version, h)
        expect = "100-continue" in h.get("expect", "").lower()
        framing = request_framing(h)

        if fault is not None and fault.kind == "reset_request":
            self._reset(cs)
            return False

        if fault is not None and (fault.kind in ("503", "500", "429") or
                                  fault.kind[:4] in ("bare", "html")):
            if fault.kind in ("503", "500"):
                if fault.seconds:
                    self._sleep(fault.seconds)
                code, msg = (("SlowDown", "Please reduce your request rate.")
                             if fault.kind == "503" else
                             ("InternalError", "We encountered an internal "
                              "error. Please try again."))
                status = int(fault.kind)
                rhead, body = s3_error(status, code, msg, url.path,
                                       "faultproxy-%d" % seq, method)
            else:
                status, rhead, body = plain_error(fault.kind, fault.seconds,
                                                  method)
            # Without the body in hand (Expect: 100-continue) we cannot keep
            # the connection in sync: answer and close.
            keep = not expect and not client_close
            if keep:
                drained = 0
                for piece in body_pieces(reader, framing):
                    drained += len(piece)
                    if drained > DRAIN_LIMIT:
                        keep = False
                        break
            if self.throttle_retry_after and fault.kind == "503":
                rhead += "Retry-After: %d\r\n" % self.throttle_retry_after
            rhead += "Connection: %s\r\n\r\n" % ("keep-alive" if keep
                                                 else "close")
            cs.sendall(rhead.encode() + body)
            rec["status"] = status
            return keep

        try:
            us = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            body = b"faultproxy: upstream unreachable\n"
            cs.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: %d\r\n"
                       b"Connection: close\r\n\r\n%s" % (len(body), body))
            rec["status"] = 502
            return False
        us.settimeout(self.idle_timeout)
        us.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.lock:
            self.conns.add(us)
        get = method == "GET"
        if get:
            with self.lock:
                self.active_gets += 1
                self.max_active_gets = max(self.max_active_gets,
                                           self.active_gets)
        try:
            if get and self.get_delay:
                self._sleep(self.get_delay)
            return self._forward(cs, reader, us, head, method, framing,
                                 expect, client_close, fault, rec)
        finally:
            if get:
                with self.lock:
                    self.active_gets -= 1
            self._forget(us)
            try:
                us.close()
            except OSError:
                pass

    def _forward(self, cs, reader, us, head, method, framing, expect,
                 client_close, fault, rec):
        ureader = Reader(us)
        us.sendall(head)
        rhead = None
        if expect:
            # Relay the upstream's 100 Continue (or its early final answer);
            # if the client stops waiting and sends the body, forward it.
            for _ in range(int(self.idle_timeout * 10) + 1):
                if self.stopping.is_set():
                    raise ProxyClosed()
                if reader.buf:
                    break
                r, _, _ = select.select([us, cs], [], [], 0.1)
                if us in r:
                    rhead = ureader.read_head()
                    break
                if cs in r:
                    break
            if rhead is not None:
                status = int(parse_head(rhead)[0].split(" ")[1])
                if status == 100:
                    cs.sendall(rhead)
                    rhead = None
                else:
                    # Final answer before the body: relay and close, since
                    # the client may or may not send the body now.
                    client_close = True
        if rhead is None:
            flip = None
            if fault is not None and fault.kind == "corrupt_request" and \
                    framing[0] == "length" and framing[1] > 0:
                flip = (fault.nbytes if fault.nbytes is not None
                        else framing[1] // 2)
                flip = min(max(flip, 0), framing[1] - 1)
            cut = None
            if fault is not None and fault.kind == "reset_upload":
                cut = (fault.nbytes if fault.nbytes is not None else
                       framing[1] // 2 if framing[0] == "length" else 0)
            at = 0
            for piece in body_pieces(reader, framing):
                if cut is not None and at + len(piece) > cut:
                    us.sendall(piece[:max(cut - at, 0)])
                    self._reset(cs)
                    return False       # the caller closes upstream's
                if flip is not None and at <= flip < at + len(piece):
                    b = bytearray(piece)
                    b[flip - at] ^= 0x01
                    piece = bytes(b)
                at += len(piece)
                us.sendall(piece)
            for _ in range(10):        # skip stray 1xx answers
                rhead = ureader.read_head()
                status = int(parse_head(rhead)[0].split(" ")[1])
                if status >= 200 or status == 101:
                    break
                if not expect:
                    cs.sendall(rhead)
        first, _, uh = parse_head(rhead)
        status = int(first.split(" ")[1])
        rec["status"] = status
        rframing = response_framing(method, status, uh)
        keep = not client_close and not wants_close(first.split(" ")[0], uh) \
            and rframing[0] != "close"
        return self._relay_response(cs, ureader, rhead, uh, rframing, fault,
                                    keep, rec)

    def _relay_response(self, cs, ureader, rhead, uh, rframing, fault, keep,
                        rec):
        kind = fault.kind if fault is not None else None
        length = rframing[1] if rframing[0] == "length" else None
        if kind in ("length_long", "length_short", "corrupt") and \
                rframing[0] != "length":
            kind = None                # needs a Content-Length body
        cut = None                     # body offset where the fault strikes
        if kind in ("reset", "truncate") or (kind == "stall" and
                                             fault.nbytes is not None):
            if fault.nbytes is not None:
                cut = fault.nbytes
            elif length:
                cut = length // 2
            else:
                cut = -1               # before the head
        if kind == "stall" and cut is None:
            self._sleep(fault.seconds if fault.seconds is not None else 30.0)
        if cut == -1:
            if kind == "reset":
                self._reset(cs)
            elif kind == "truncate":
                cs.shutdown(socket.SHUT_RDWR)
            else:
                self._sleep(fault.seconds if fault.seconds is not None
                            else 30.0)
                cut = None
            if kind in ("reset", "truncate"):
                return False
        if kind in ("length_long", "length_short"):
            if kind == "length_long":
                lie = length + (fault.nbytes if fault.nbytes is not None
                                else 1024)
            else:
                lie = max(0, length - (fault.nbytes if fault.nbytes is not None
                                       else max(1, length // 2)))
            rhead = self._set_content_length(rhead, lie)
            keep = False
        if kind == "etag":
            rhead = self._alter_etag(rhead)
        flip = None
        if kind == "corrupt" and length:
            flip = fault.nbytes if fault.nbytes is not None else length // 2
            flip = min(max(flip, 0), length - 1)
        cs.sendall(rhead)
        sent = 0
        for piece in body_pieces(ureader, rframing):
            if flip is not None and sent <= flip < sent + len(piece):
                b = bytearray(piece)
                b[flip - sent] ^= 0x01
                piece = bytes(b)
            if cut is not None and sent + len(piece) >= cut:
                head_part, piece = piece[:cut - sent], piece[cut - sent:]
                cs.sendall(head_part)
                sent = cut
                if kind == "reset":
                    self._reset(cs)
                    return False
                if kind == "truncate":
                    cs.shutdown(socket.SHUT_RDWR)
                    return False
                # stall mid-body, then carry on
                self._sleep(fault.seconds if fault.seconds is not None
                            else 30.0)
                cut = None
            cs.sendall(piece)
            sent += len(piece)
            rec["body_bytes"] = sent
        if cut is not None and kind in ("reset", "truncate"):
            # The body ended before `nbytes`: strike at its end.
            if kind == "reset":
                self._reset(cs)
            else:
                cs.shutdown(socket.SHUT_RDWR)
            return False
        if not keep:
            try:
                cs.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        return keep

    @staticmethod
    def _alter_etag(rhead):
        out = []
        for line in rhead.decode("latin-1").split("\r\n"):
            name, sep, val = line.partition(":")
            if sep and name.strip().lower() == "etag":
                v = list(val)
                for i, c in enumerate(v):
                    if c in "0123456789abcdefABCDEF":
                        v[i] = "1" if c == "0" else "0"
                        break
                line = name + sep + "".join(v)
            out.append(line)
        return "\r\n".join(out).encode("latin-1")

    @staticmethod
    def _set_content_length(rhead, n):
        lines = rhead.decode("latin-1").split("\r\n")
        out = []
        for line in lines:
            if line.lower().startswith("content-length:"):
                line = "Content-Length: %d" % n
            elif line.lower().startswith("connection:"):
                line = "Connection: close"
            out.append(line)
        return "\r\n".join(out).encode("latin-1")

    # ---- control endpoint ---------------------------------------------------
    def _start_control(self, port):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code, obj):
                body = (json.dumps(obj, indent=1) + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                u = urllib.parse.urlsplit(self.path)
                if u.path == "/stats":
                    self._reply(200, {"counts": proxy.counts(),
                                      "requests": proxy.requests(),
                                      "faults": proxy.pending_faults()})
                else:
                    self._reply(404, {"error": "GET /stats"})

            def do_POST(self):
                u = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(u.query))
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(min(n, 65536))
                try:
                    if u.path == "/fault":
                        f = proxy.add_fault(
                            q.get("kind", ""), int(q.get("count", 1)),
                            q.get("match", "GET"), q.get("path"),
                            int(q.get("skip", 0)),
                            q.get("seconds"),
                            q.get("nbytes", q.get("bytes")))
                        self._reply(200, f.as_dict())
                    elif u.path == "/clear":
                        proxy.clear_faults()
                        self._reply(200, {"ok": True})
                    elif u.path in ("/reset-stats", "/reset"):
                        proxy.reset_stats()
                        self._reply(200, {"ok": True})
                    else:
                        self._reply(404, {"error": "unknown path"})
                except (ValueError, TypeError) as e:
                    self._reply(400, {"error": str(e)})

        srv = http.server.ThreadingHTTPServer((self.host, port), Handler)
        srv.daemon_threads = True
        self.control = srv
        self.control_port = srv.server_address[1]
        self.control_thread = threading.Thread(
            target=srv.serve_forever, kwargs={"poll_interval": 0.2},
            name="faultproxy-control", daemon=True)
        self.control_thread.start()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the server")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--control-port", type=int, default=0)
    args = ap.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    p = FaultProxy(int(port), upstream_host=host or "127.0.0.1",
                   port=args.port, control_port=args.control_port)
    p.start()
    print(json.dumps({"port": p.port, "control_port": p.control_port}),
          flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: done.set())
    signal.signal(signal.SIGINT, lambda *a: done.set())
    while not done.wait(1.0):
        pass
    p.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
