"""million_bench: the million-file rows of bench/run (issue 17).

A `file://` dataset of N small objects (default 1,000,000; 16-64 bytes
each, 1,000 a directory) generated under /tmp/dstage-million-N (about
4 KiB of disk each: 4 GiB for a million; removed at the end unless
--keep), then, with a fresh dstage:

  million_register  `stager add m file:///tmp/dstage-million-N/` (files/s;
                    the seconds are in the entry, with where they went
                    (listing, writing in how many transactions, the longest),
                    from the daemon's log line, and how the other writers
                    fared meanwhile: a `stager add` and `remove` of a
                    one-file dataset in a loop, their count, failures and
                    longest wait, and the daemon's "database is locked"
                    lines, which must be none)
  million_ls        `ls -R` of the mount's dataset vs the same tree on
                    local disk (files/s, caches dropped before each)
  million_find      `find` (names only, no stat) vs local
  million_stat      `find -printf '%s'` (a stat of every file) vs local
  million_read      1,000 random files read whole, cold, 1 reader, vs the
                    same files on local disk

and the peak RSS (VmHWM) of dstagefs and of the stager daemon after all of
it, against a target of 256 MiB each (results: memory["dstage, 1M files"]),
with the resident set of both after each step (rss_after_MiB: step ->
[dstagefs, daemon]) to show where memory grows.
Every step is bounded (STEP_TIMEOUT); a step that fails or times out is
recorded with why, and the rest still run where they can: a failure to
register a million files is a finding, reported where it happened.
"""
import os
import random
import re
import shutil
import subprocess
import threading
import time

from benchlib import peak_rss_mib, read_files

MAX_N = 2_000_000
STEP_TIMEOUT = 1800
RSS_TARGET_MiB = 256
READ_N = 1000


def row_defs(L):
    """(id, what, unit, limit, limit is, target) of the million rows."""
    n = L.get("million_files")
    n_txt = f"{n:,}" if n else "N"
    yield ("million_register", f"{n_txt} files (file://): stager add", "files/s", None,
           "", None)
    for rid, what, lim in (("million_ls", "ls -R", "local_million_ls_fps"),
                           ("million_find", "find (names)", "local_million_find_fps"),
                           ("million_stat", "find -printf %s (stat each)",
                            "local_million_stat_fps")):
        yield (rid, f"{n_txt} files: {what} through the mount", "files/s", L.get(lim),
               "the same tree on local disk, caches dropped", 0.5)
    yield ("million_read", f"{n_txt} files: {READ_N:,} random files read, cold", "files/s",
           L.get("local_million_read_fps"), "the same files on local disk, page cache dropped",
           None)


def generate(root, n, log):
    """N files of 16-64 bytes, 1,000 a directory. A tree marked complete is
    reused after a check (each directory there with its count of files;
    a listing of the tree) and the directories that are not are made again:
    one kept with --keep was found with 21 of its 1,000 directories gone."""
    marker = root + ".complete"  # beside the tree, not a file of the dataset
    try:
        with open(marker) as f:
            complete = f.read().strip() == str(n)
    except OSError:
        complete = False
    if not complete:
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
    t = time.monotonic()
    rng = random.Random(1000000)
    remade = 0
    for first in range(0, n, 1000):
        d = os.path.join(root, f"d{first // 1000:04d}")
        count = min(1000, n - first)
        pad = [rng.randint(9, 57) for _ in range(count)]  # the same stream
        if complete:
            try:
                if len(os.listdir(d)) == count:
                    continue
            except FileNotFoundError:
                pass
            remade += 1
        os.makedirs(d, exist_ok=True)
        for i in range(first, first + count):
            with open(os.path.join(d, f"f{i:07d}"), "wb") as f:
                f.write(b"%07d" % i + b"x" * pad[i - first])
    if os.path.exists(marker) and not complete:
        os.unlink(marker)
    with open(marker, "w") as f:
        f.write(f"{n}\n")
    s = time.monotonic() - t
    if complete:
        log(f"million: reusing {root} (checked in {s:.0f}s; {remade} "
            f"directories made again)")
        return 0.0 if not remade else s
    log(f"million: {n:,} files made in {s:.0f}s")
    return s


def rss_mib(pid):
    """Resident set now (VmRSS) of a live process, MiB; None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def timed(b, cmd):
    """Seconds of cmd (stdout to /dev/null), caches dropped first; (None,
    why) if it failed or ran past STEP_TIMEOUT."""
    b.drop_caches()
    t = time.monotonic()
    try:
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=STEP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, f"{cmd[0]} ran past {STEP_TIMEOUT} s"
    if r.returncode:
        return None, f"{' '.join(cmd[:2])}: exit {r.returncode}: {r.stderr[-300:].decode(errors='replace')}"
    return time.monotonic() - t, None


REG_LINE = re.compile(
    r"dataset m registered, (\d+) bad keys \((\d+) files; ([\d.]+) s: listing "
    r"([\d.]+), writing ([\d.]+) in (\d+) transactions of at most (\d+) ms, "
    r"making it current ([\d.]+)\)")


class Writers:
    """Other writers while the million registers: `stager add` and `remove`
    of a one-file dataset, one after another, until stopped."""

    def __init__(self, b, conf, src):
        self.b, self.conf, self.src = b, conf, src
        self.n, self.failed, self.longest = 0, [], 0.0
        self.stop = threading.Event()
        self.th = threading.Thread(target=self.loop, daemon=True)
        self.th.start()

    def loop(self):
        i = 0
        while not self.stop.is_set():
            for args in (("add", f"w{i}", f"file://{self.src}/"), ("remove", f"w{i}")):
                t = time.monotonic()
                r = subprocess.run([self.b.stager, "--config", self.conf, *args],
                                   env=self.b.env, capture_output=True, timeout=120)
                took = time.monotonic() - t
                self.n += 1
                self.longest = max(self.longest, took)
                if r.returncode:
                    self.failed.append(f"{' '.join(args[:2])}: exit {r.returncode}: "
                                       + r.stderr.decode(errors="replace")[-200:])
            i += 1
            self.stop.wait(0.5)

    def end(self):
        self.stop.set()
        self.th.join(300)
        return {"requests": self.n, "failed": len(self.failed),
                "first_failure": self.failed[0] if self.failed else None,
                "longest_request_s": round(self.longest, 2)}


class Million:
    """A fresh dstage (as fair_bench.Setup, with the daemon logging at info
    so that the registration's line says where its time went), the
    million registered while Writers run, then mounted."""

    def __init__(self, b, url):
        self.b, self.fpr, self.mnt = b, None, None
        self.d, self.conf = b.dstage_conf("million", "16G")
        with open(self.conf) as f:
            text = f.read()
        with open(self.conf, "w") as f:
            f.write(text.replace("level = warn", "level = info"))
        self.log_path = os.path.join(b.work, "million-daemon.log")
        self.dpr = b.start_daemon(self.d, self.conf, "million-daemon")
        tiny = os.path.join(self.d, "tiny")
        os.makedirs(tiny)
        with open(os.path.join(tiny, "a"), "wb") as f:
            f.write(b"a")
        w = Writers(b, self.conf, tiny)
        t = time.monotonic()
        try:
            b.stager_cmd(self.conf, "add", "m", url, timeout=3600)
        finally:
            self.register_s = time.monotonic() - t
            self.writers = w.end()
        self.mnt = os.path.join(self.d, "mnt")
        os.makedirs(self.mnt)
        self.fpr = b.spawn("million-fs", [b.dstagefs, "--config", self.conf, "-f", self.mnt])
        b.mounts.append(self.mnt)
        b.mount_wait(self.mnt, self.fpr, self.path("m"))

    def register_detail(self):
        """What the daemon's log says of the registration."""
        with open(self.log_path, errors="replace") as f:
            text = f.read()
        out = {"locked_log_lines": text.count("database is locked")}
        m = REG_LINE.search(text)
        if m:
            out.update(files=int(m[2]), daemon_s=float(m[3]), listing_s=float(m[4]),
                       writing_s=float(m[5]), transactions=int(m[6]),
                       longest_transaction_ms=int(m[7]), make_current_s=float(m[8]))
        return out

    def path(self, ds, key=""):
        return os.path.join(self.mnt, "datasets", ds, key)

    def close(self):
        if self.mnt:
            self.b.unmount(self.mnt, self.fpr)
        self.b.stop("million-daemon", self.dpr)
        shutil.rmtree(self.d, ignore_errors=True)


def run(b, log):
    n = b.p["million_n"]
    if not 0 < n <= MAX_N:
        raise ValueError(f"million: {n} files: must be 1..{MAX_N}")
    root = f"/tmp/dstage-million-{n}"
    L = b.limits
    L["million_files"] = n
    L["million_generate_s"] = round(generate(root, n, log), 1)
    mem = b.memory.setdefault("dstage, 1M files" if n == 1_000_000 else f"dstage, {n:,} files",
                              {})
    s = None
    try:
        b.mode("shared")
        t = time.monotonic()
        try:
            s = Million(b, f"file://{root}/")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, RuntimeError) as e:
            err = getattr(e, "stderr", None)
            why = f"registration failed after {time.monotonic() - t:.0f} s: " + (
                err[-400:].decode(errors="replace") if isinstance(err, bytes) else str(e))
            b.put("million_register", "dstage", None, why=why)
            b.notes.append(f"million: {why}")
            d = next((pr for nm, pr in b.procs if nm == "million-daemon"), None)
            if d is not None:
                mem["daemon_peak_rss_MiB"] = peak_rss_mib(d.pid)
            log(f"million: {why}")
            return
        steps = mem.setdefault("rss_after_MiB", {})  # step -> [dstagefs, daemon]

        def after(step):
            steps[step] = [rss_mib(s.fpr.pid), rss_mib(s.dpr.pid)]
        after("register+mount")
        reg = s.register_s
        detail = s.register_detail()
        b.put("million_register", "dstage", n / reg, seconds=round(reg, 1), **detail,
              writers_alongside=s.writers)
        log(f"million: registered in {reg:.1f}s ({n / reg:.0f} files/s): {detail}; "
            f"writers alongside: {s.writers}")
        if detail["locked_log_lines"] or s.writers["failed"]:
            b.notes.append(f"million: while it registered, {s.writers['failed']} of "
                           f"{s.writers['requests']} other requests failed and the daemon "
                           f"logged 'database is locked' {detail['locked_log_lines']} times")
        mnt_root = s.path("m")
        for rid, cmd in (("ls", ["ls", "-R"]), ("find", ["find"]),
                         ("stat", ["find", "{}", "-printf", "%s\n"])):
            local_s, why = timed(b, [c.replace("{}", root) for c in cmd]
                                 + ([root] if "{}" not in cmd else []))
            if local_s:
                L[f"local_million_{rid}_fps"] = round(n / local_s, 1)
            m_s, why = timed(b, [c.replace("{}", mnt_root) for c in cmd]
                             + ([mnt_root] if "{}" not in cmd else []))
            b.put(f"million_{rid}", "dstage", None if m_s is None else n / m_s, why=why,
                  seconds=None if m_s is None else round(m_s, 2),
                  local_seconds=None if local_s is None else round(local_s, 2))
            after(rid)
            log(f"million: {' '.join(cmd)}: mount "
                f"{'failed: ' + why if m_s is None else f'{m_s:.1f}s'}, local "
                f"{local_s if local_s is None else round(local_s, 1)}s")
        pick = random.Random(1000).sample(range(n), min(READ_N, n))
        rel = [f"d{i // 1000:04d}/f{i:07d}" for i in pick]
        for where, base in (("local", root), ("mount", mnt_root)):
            b.drop_caches()
            f_, nb, sec, _ = read_files([os.path.join(base, r) for r in rel], 1,
                                                time.monotonic() + STEP_TIMEOUT)
            if where == "local":
                L["local_million_read_fps"] = round(f_ / sec, 1)
            else:
                b.put("million_read", "dstage", f_ / sec, f_ < len(rel), files=f_,
                      seconds=round(sec, 2))
            log(f"million: {READ_N} random files, {where}: {f_ / sec:.0f} files/s")
        after("read")
        mem["fuse_peak_rss_MiB"] = peak_rss_mib(s.fpr.pid)
        mem["daemon_peak_rss_MiB"] = peak_rss_mib(s.dpr.pid)
        mem["target_MiB"] = RSS_TARGET_MiB
        log(f"million: peak RSS dstagefs {mem['fuse_peak_rss_MiB']} MiB, daemon "
            f"{mem['daemon_peak_rss_MiB']} MiB (target {RSS_TARGET_MiB} each)")
        over = [k for k in ("fuse_peak_rss_MiB", "daemon_peak_rss_MiB")
                if (mem.get(k) or 0) > RSS_TARGET_MiB]
        if over:
            b.notes.append(f"million: peak RSS over the {RSS_TARGET_MiB} MiB target: "
                           + ", ".join(f"{k} {mem[k]}" for k in over))
    finally:
        if s is not None:
            s.close()
        if not b.args.keep:
            shutil.rmtree(root, ignore_errors=True)
            if os.path.exists(root + ".complete"):
                os.unlink(root + ".complete")
