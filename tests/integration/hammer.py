"""Hammer open/read/close and opendir/readdir/releasedir on a mount, from
many threads, checking every reply's bytes (tests/integration/
test_lifetimes.py runs it, as root and as a second uid, in several
processes at once).

    python3 hammer.py SPEC.json

SPEC: {"seconds": S, "threads": T, "iters": N,
       "files": [{"path": P, "expect": FILE or null, "kind": K}],
       "dirs": [{"path": P, "names": [...]}]}

kind "bytes": every read must equal FILE's bytes at its offset; "stats":
the text is "key integer" lines; "summary": "key value" lines or "no list
yet". Texts are made per open, so every read of one open file must also
agree with the others.

Each thread runs at most N rounds and stops after S seconds; a round
picks a target and does one of:
  shared  open, start two reader threads on the same descriptor, then
          drop the file from under them with dup2(/dev/null): the last
          reference goes while they read (RELEASE racing READ); the
          number stays taken until they are joined, so no other open can
          reuse it meanwhile. A read gives the bytes, or nothing (it ran
          on /dev/null).
  own     open, read everything, close.
  dir     listdir of a path, and listdir through a shared directory
          descriptor dropped the same way (RELEASEDIR racing READDIR);
          scandir with stat (READDIRPLUS).

Prints one JSON line: rounds, reads, bad (the first few wrong replies or
unexpected errors). Exit 0 when nothing was bad.
"""
import errno
import json
import os
import random
import re
import sys
import threading
import time

STATS_LINE = re.compile(rb"^[a-z_]+ [0-9]+$")
SUMMARY_LINE = re.compile(rb"^[a-z_]+ [^ ]+( [^ ]+)*$")
CLOSED = (errno.EBADF, errno.ENOTDIR)


class Hammer:
    def __init__(self, spec):
        self.spec = spec
        self.end = time.monotonic() + float(spec["seconds"])
        self.lock = threading.Lock()
        self.rounds = self.reads = 0
        self.bad = []
        self.expect = {}
        for f in spec.get("files", []):
            if f.get("expect"):
                with open(f["expect"], "rb") as e:
                    self.expect[f["path"]] = e.read()
        self.devnull = os.open("/dev/null", os.O_RDONLY)

    def fail(self, what):
        with self.lock:
            if len(self.bad) < 10:
                self.bad.append(what)

    def text_ok(self, f, data):
        kind = f["kind"]
        if kind == "bytes":
            return True  # checked against the expected bytes by offset
        if not data.endswith(b"\n"):
            return False
        lines = data[:-1].split(b"\n")
        if kind == "stats":
            return all(STATS_LINE.match(x) for x in lines)
        return data == b"no list yet\n" or \
            all(SUMMARY_LINE.match(x) for x in lines)

    def check(self, f, off, data, first):
        """A read of f at off gave data; first: [bytes of this open's
        read at 0] (texts) or None."""
        with self.lock:
            self.reads += 1
        exp = self.expect.get(f["path"])
        if exp is not None:
            if data != exp[off:off + len(data)] or \
                    (off < len(exp) and not data and first is None):
                self.fail("%s: %d bytes at %d differ" %
                          (f["path"], len(data), off))
            return
        if off == 0 and data and not self.text_ok(f, data):
            self.fail("%s: bad text %r" % (f["path"], data[:200]))
        if first is not None and data and first[0] is not None and \
                data != first[0][off:off + len(data)]:
            self.fail("%s: two reads of one open differ: %r / %r" %
                      (f["path"], first[0][:100], data[:100]))

    def size_of(self, f):
        exp = self.expect.get(f["path"])
        return len(exp) if exp is not None else 4096

    def shared_file(self, f, rnd):
        fd = os.open(f["path"], os.O_RDONLY)
        size = self.size_of(f)
        first = [None]
        try:
            first[0] = os.pread(fd, 1 << 16, 0)
            self.check(f, 0, first[0], None)
        except OSError as e:
            self.fail("%s: first read: %s" % (f["path"], e))
        if f["kind"] == "bytes":
            first = None
        offs = [[rnd.randrange(0, max(size, 1)) for _ in range(4)]
                for _ in range(2)]

        def reader(mine):
            for off in mine:
                try:
                    data = os.pread(fd, 65536, off)
                except OSError as e:
                    if e.errno not in CLOSED:
                        self.fail("%s: read at %d: %s" % (f["path"], off, e))
                    return
                if not data:
                    return  # /dev/null by now, or past the end
                self.check(f, off, data, first)

        ts = [threading.Thread(target=reader, args=(o,)) for o in offs]
        for t in ts:
            t.start()
        os.dup2(self.devnull, fd)  # the file's last reference goes
        for t in ts:
            t.join(30)
        os.close(fd)

    def own_file(self, f):
        with open(f["path"], "rb", buffering=0) as fh:
            data = b""
            while True:
                b = fh.read(1 << 16)
                if not b:
                    break
                data += b
        self.check(f, 0, data, None)
        exp = self.expect.get(f["path"])
        if exp is not None and data != exp:
            self.fail("%s: whole read of %d bytes, %d expected" %
                      (f["path"], len(data), len(exp)))

    def names_ok(self, d, names, how, whole=True):
        """whole: names must be the listing; else (threads sharing one
        directory offset: one may see the end, another a rewind) each
        name must be in it."""
        with self.lock:
            self.reads += 1
        if (sorted(names) != sorted(d["names"]) if whole
                else not set(names) <= set(d["names"])):
            self.fail("%s (%s): %s, expected %s" %
                      (d["path"], how, sorted(names)[:20], d["names"][:20]))

    def dir_round(self, d):
        self.names_ok(d, os.listdir(d["path"]), "listdir")
        with os.scandir(d["path"]) as it:
            names = []
            for e in it:
                e.stat(follow_symlinks=False)
                names.append(e.name)
        self.names_ok(d, names, "scandir")
        fd = os.open(d["path"], os.O_RDONLY | os.O_DIRECTORY)

        def lister():
            for _ in range(3):
                try:
                    names = os.listdir(fd)
                except OSError as e:
                    if e.errno not in CLOSED:
                        self.fail("%s: listdir(fd): %s" % (d["path"], e))
                    return
                self.names_ok(d, names, "listdir(fd)", whole=False)

        ts = [threading.Thread(target=lister) for _ in range(2)]
        for t in ts:
            t.start()
        os.dup2(self.devnull, fd)
        for t in ts:
            t.join(30)
        os.close(fd)

    def worker(self, seed):
        rnd = random.Random(seed)
        files = self.spec.get("files", [])
        dirs = self.spec.get("dirs", [])
        for _ in range(int(self.spec["iters"])):
            if time.monotonic() >= self.end:
                break
            with self.lock:
                self.rounds += 1
            try:
                pick = rnd.randrange(len(files) * 2 + len(dirs))
                if pick < len(files):
                    self.shared_file(files[pick], rnd)
                elif pick < 2 * len(files):
                    self.own_file(files[pick - len(files)])
                else:
                    self.dir_round(dirs[pick - 2 * len(files)])
            except OSError as e:
                self.fail("round: %s" % e)

    def run(self):
        ts = [threading.Thread(target=self.worker, args=(i,))
              for i in range(int(self.spec["threads"]))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(float(self.spec["seconds"]) + 60)
        return {"rounds": self.rounds, "reads": self.reads, "bad": self.bad,
                "hung": sum(t.is_alive() for t in ts)}


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out = Hammer(spec).run()
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0 if not out["bad"] and not out["hung"] else 1)


if __name__ == "__main__":
    main()
