"""pinning: the "store elsewhere" mode of bench/run and the CPU meter of
its cold and stage rows (issue 17).

Store elsewhere. On a GPU node the object store runs on other machines;
on the bench machine it shares the cores with the client. So for the rows
whose speed the store decides (cold reads, stage, their curl limits) the
store's processes (ceph-mon, ceph-osd, radosgw: the pids scripts/rgw
records in RGW_DIR/pids) are pinned, all threads, to their own CPU set
(`taskset -a -cp`), and the client side (the bench process itself, so
every reader, curl, dd, dstagefs, stager daemon, s3fs and rclone it starts
inherits the set, as under `taskset -c`) to the rest. The split scales with
the core count (cpu_split): 2 cores 1 + 1; N >= 3 cores: N // 4 (at least
1) for the store, the rest for the client; 1 core: no split (the mode is
then the same as shared, and the results say so). Warm rows (the store is
not involved) run "shared": every process may use every core. Pinning.restore
(bench/run's cleanup, also on SIGTERM/SIGINT) puts every affinity back; a
run killed with SIGKILL leaves the store pinned: `taskset -a -cp 0-N PID`
for each pid in RGW_DIR/pids undoes it.

CPU meter. utime + stime from /proc/PID/stat (all threads of the process)
of the system's processes (dstagefs and the stager daemon; s3fs; rclone),
of the store's processes, and getrusage of the bench process itself and of
its reaped children (the readers, curl, `stager stage`), before and after
a phase, as CPU-seconds per GiB moved; and the page faults of the
system's processes per GiB (what bench/cold_cpu.sh used to count by hand).
"""
import os
import resource
import subprocess

GiB = 1 << 30
TCK = os.sysconf("SC_CLK_TCK")
STORE_NAMES = ("ceph-mon", "ceph-osd", "radosgw")


def cpu_split(n):
    """(store cpus, client cpus) as sorted lists, or (None, None) when n
    cores cannot be split. The store takes the last cores."""
    if n < 2:
        return None, None
    k = 1 if n < 4 else n // 4
    cpus = list(range(n))
    return cpus[n - k:], cpus[:n - k]


def cpulist(cpus):
    return ",".join(str(c) for c in cpus)


def stat_fields(st):
    """The fields of a /proc/PID/stat text after the command name (field 3
    on; the name may hold spaces and parentheses)."""
    return st[st.rindex(")") + 2:].split()


def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (field 3 on);
    None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except OSError:
        return None
    return stat_fields(st)


def stat_cpu_s(st, tck=TCK):
    """utime + stime (fields 14 and 15) of a /proc/PID/stat text, seconds."""
    fields = stat_fields(st)
    return (int(fields[11]) + int(fields[12])) / tck


def cpu_s_per_gib(before, after, nbytes, tck=TCK):
    """CPU-seconds per GiB moved from two /proc/PID/stat texts of the same
    process, taken before and after a phase that moved nbytes; None when
    nothing moved or a sample is missing (the process was gone)."""
    if not nbytes or before is None or after is None:
        return None
    return round((stat_cpu_s(after, tck) - stat_cpu_s(before, tck)) / (nbytes / GiB), 3)


def proc_cpu_s(pid):
    """utime + stime of a live process (all its threads), seconds; None if
    it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / TCK


def proc_faults(pid):
    """Page faults (minor + major) of a live process so far; None if gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[7]) + int(fields[9])


def _comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def store_pids(rgw_dir):
    """Live store daemons recorded in rgw_dir/pids (scripts/rgw): {pid: name}."""
    out = {}
    try:
        with open(os.path.join(rgw_dir, "pids")) as f:
            pids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return out
    for p in pids:
        name = _comm(p)
        if name and any(name.startswith(n[:15]) for n in STORE_NAMES):
            out[p] = name
    return out


class Pinning:
    """Pins the store and the client side for one mode at a time, and puts
    everything back as it was (restore)."""

    def __init__(self, rgw_dir, ncpu=None, log=print):
        self.rgw_dir = rgw_dir
        self.log = log
        self.ncpu = ncpu or os.cpu_count()
        self.store, self.client = cpu_split(self.ncpu)
        self.all = list(range(self.ncpu))
        self.saved = {}          # pid -> affinity before we touched it
        self.self_saved = os.sched_getaffinity(0)
        self.mode = "shared"
        self.switches = 0

    def record(self):
        """What the results JSON says about the split."""
        if not self.store:
            return {"cores": self.ncpu, "store_cpus": None, "client_cpus": None,
                    "rule": "1 core: no split, store and client share it"}
        return {"cores": self.ncpu, "store_cpus": cpulist(self.store),
                "client_cpus": cpulist(self.client),
                "rule": "2 or 3 cores: 1 for the store, the rest for the client; "
                        "N >= 4: N // 4 for the store, the rest for the client",
                "store_pids": {str(p): n for p, n in store_pids(self.rgw_dir).items()}}

    def _taskset(self, pid, cpus):
        if pid not in self.saved:
            try:
                self.saved[pid] = os.sched_getaffinity(pid)
            except OSError:
                return False
        r = subprocess.run(["taskset", "-a", "-cp", cpulist(cpus), str(pid)],
                           capture_output=True, text=True, timeout=30)
        if r.returncode:
            self.log(f"pinning: taskset {pid}: {r.stderr.strip()[:200]}")
        return r.returncode == 0

    def set(self, mode, client_pids=()):
        """mode 'elsewhere' or 'shared'. client_pids: processes already
        started (dstagefs, daemon, peers) to move with the bench process."""
        if not self.store or mode == self.mode and not client_pids:
            self.mode = mode
            return
        store_cpus, client_cpus = ((self.store, self.client) if mode == "elsewhere"
                                   else (self.all, self.all))
        for p in store_pids(self.rgw_dir):
            self._taskset(p, store_cpus)
        for p in client_pids:
            if p and proc_cpu_s(p) is not None:
                self._taskset(p, client_cpus)
        os.sched_setaffinity(0, set(client_cpus))
        if mode != self.mode:
            self.switches += 1
        self.mode = mode

    def restore(self):
        """Every process we pinned back to its own affinity (the store's
        processes may be shared with others: this always runs)."""
        for pid, cpus in self.saved.items():
            if proc_cpu_s(pid) is not None:
                subprocess.run(["taskset", "-a", "-cp", cpulist(sorted(cpus)), str(pid)],
                               capture_output=True, timeout=30)
        self.saved.clear()
        os.sched_setaffinity(0, self.self_saved)
        self.mode = "shared"


class Meter:
    """CPU seconds spent over one phase. pids: the measured system's
    processes; store: the store's pids; the bench process and its reaped
    children (readers, curl, stager CLI) are counted as 'reader'."""

    def __init__(self, pids=(), store=()):
        self.pids = [p for p in pids if p]
        self.store = list(store)
        self.t0 = self._snap()

    def _snap(self):
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {"sys": {p: proc_cpu_s(p) for p in self.pids},
                "faults": {p: proc_faults(p) for p in self.pids},
                "store": {p: proc_cpu_s(p) for p in self.store},
                "reader": s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime}

    @staticmethod
    def _delta(a, b):
        tot, seen = 0.0, False
        for p, v in a.items():
            w = b.get(p)
            if v is not None and w is not None:
                tot += w - v
                seen = True
        return tot if seen else None

    def stop(self, nbytes, reader_is_system=False):
        """{cpu_s_per_GiB, store_cpu_s_per_GiB, reader_cpu_s_per_GiB} over
        nbytes (absent figures are left out). reader_is_system: the
        reader's CPU is the system's (curl, dd, `stager stage`)."""
        t1 = self._snap()
        if not nbytes:
            return {}
        g = nbytes / GiB
        out = {}
        reader = t1["reader"] - self.t0["reader"]
        sys_s = self._delta(self.t0["sys"], t1["sys"])
        if reader_is_system:
            sys_s = (sys_s or 0.0) + reader
        if sys_s is not None:
            out["cpu_s_per_GiB"] = round(sys_s / g, 3)
        flt = self._delta(self.t0["faults"], t1["faults"])
        if flt is not None:
            out["faults_per_GiB"] = round(flt / g)
        st = self._delta(self.t0["store"], t1["store"])
        if st is not None:
            out["store_cpu_s_per_GiB"] = round(st / g, 3)
        if not reader_is_system:
            out["reader_cpu_s_per_GiB"] = round(reader / g, 3)
        return out
