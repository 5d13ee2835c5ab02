"""million_bench: the million-file rows of bench/run (issue 17).

A `file://` dataset of N small objects (default 1,000,000; 16-64 bytes
each, 1,000 a directory) generated under /tmp/dstage-million-N (about
4 KiB of disk each: 4 GiB for a million; removed at the end unless
--keep), then, with a fresh dstage:

  million_register  `stager add m file:///tmp/dstage-million-N/` (files/s;
                    the seconds are in the entry)
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
import shutil
import subprocess
import time

from benchlib import peak_rss_mib, read_files
from fair_bench import Setup

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
    """N files of 16-64 bytes, 1,000 a directory; reused if complete."""
    marker = root + ".complete"  # beside the tree, not a file of the dataset
    try:
        with open(marker) as f:
            if f.read().strip() == str(n):
                log(f"million: reusing {root}")
                return 0.0
    except OSError:
        pass
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    t = time.monotonic()
    rng = random.Random(1000000)
    for i in range(n):
        if i % 1000 == 0:
            d = os.path.join(root, f"d{i // 1000:04d}")
            os.makedirs(d)
        with open(os.path.join(d, f"f{i:07d}"), "wb") as f:
            f.write(b"%07d" % i + b"x" * rng.randint(9, 57))
    with open(marker, "w") as f:
        f.write(f"{n}\n")
    s = time.monotonic() - t
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
            s = Setup(b, "million", {"m": f"file://{root}/"})
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
        reg = s.register_s["m"]
        b.put("million_register", "dstage", n / reg, seconds=round(reg, 1))
        log(f"million: registered in {reg:.1f}s ({n / reg:.0f} files/s)")
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
