"""The Slurm stage-in (packaging/slurm/) on a real single-node Slurm.

The harness starts munged, slurmctld and slurmd from Debian's packages on
127.0.0.1 in a temporary directory (its own slurm.conf, ports, munge socket
and spool; nothing of the host's Slurm is touched) and stops them at the end.
The node runs a stager daemon and a dstagefs mount on its own configuration;
the Prolog, TaskProlog and Epilog are the packaged scripts, called through a
two-line wrapper that points them at that configuration (slurmd gives
prologs a fresh environment).

  - a job naming a registered dataset (`--comment=dstage:ds1`) starts with
    the dataset staged and verified, reads every byte through the mount, and
    the mount's counters show 0 bytes fetched from the source meanwhile;
  - a job naming a missing dataset fails: state FAILED, the reason in its
    output and AdminComment, its script never runs, and the node stays in
    service (not drained);
  - the Epilog waits for the job's checkpoints: a checkpoint the store
    (a file:// store on its own tmpfs, remounted read-only to make it
    refuse) did not take at close keeps the job COMPLETING until the store
    takes it, then the job completes; with the store still refusing at
    DSTAGE_PUBLISH_TIMEOUT the job gets the reason (file, cause) in its
    AdminComment and the node is drained; a checkpoint whose writer was
    killed (abandoned) gets the reason too, and the node stays in service.

Skips when slurmctld, slurmd, munged or sbatch is missing (scripts/install-deps
installs them) or when not root. About 20-40 s.
"""
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from waits import wait_for

REPO = Path(__file__).resolve().parents[2]
SLURM_DIR = REPO / "packaging" / "slurm"
PROGRAMS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "scontrol",
            "squeue", "sinfo")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (slurmd, FUSE)"),
    pytest.mark.skipif(
        any(shutil.which(p) is None for p in PROGRAMS),
        reason="Slurm or munge not installed (scripts/install-deps installs "
        "slurmctld slurmd slurm-client munge)"),
]

NODE = "dstage1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc, timeout=15):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def mounted(path):
    # bounded: a mount whose dstagefs hangs must fail the test, not stall it
    return subprocess.run(["mountpoint", "-q", str(path)],
                          timeout=30).returncode == 0


class Node:
    """A dstage node: a file:// dataset, a stager daemon and a mount."""

    def __init__(self, root, build_dir):
        self.root = root
        self.stager = str(build_dir / "stager" / "stager")
        self.dstagefs = str(build_dir / "fs" / "dstagefs")
        self.src = root / "store" / "ds1"
        self.mnt = root / "data"
        self.ckstore = root / "ckstore"  # the checkpoint store, a tmpfs
        self.conf = root / "dstage.conf"
        self.daemon = None

    def start(self):
        self.src.mkdir(parents=True)
        (self.src / "shards").mkdir()
        files = {"shards/shard-0.tar": os.urandom(3 << 20),
                 "shards/shard-1.tar": os.urandom(1 << 20),
                 "labels.csv": b"label,count\n"}
        for k, v in files.items():
            (self.src / k).write_bytes(v)
        (self.src / "SHA256SUMS").write_text("".join(
            f"{hashlib.sha256(v).hexdigest()}  {k}\n"
            for k, v in sorted(files.items())))
        self.size = sum(len(v) for v in files.values())
        self.conf.write_text(
            f"[cache]\ndir = {self.root}/cache\nsize = 256M\n"
            f"[catalog]\npath = {self.root}/catalog.db\n"
            f"[daemon]\nsocket = {self.root}/stager.sock\n"
            f"[checkpoints]\nstore = file://{self.ckstore}/\n"
            f"staging_dir = {self.root}/staging\nretry_interval = 1s\n"
            "[log]\nlevel = info\n")
        # its own file system, so that a read-only remount makes the store
        # refuse (root writes through any chmod)
        self.ckstore.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m",
                        "dstage-ckstore", str(self.ckstore)], check=True,
                       timeout=30)
        self.env = dict(os.environ, DSTAGE_CONFIG=str(self.conf))
        self.daemon = subprocess.Popen(
            [self.stager, "daemon"], env=self.env,
            stdout=open(self.root / "daemon.log", "wb"),
            stderr=subprocess.STDOUT)
        wait_for(lambda: (self.root / "stager.sock").exists(),
                 "the stager socket", 20)
        self.run("add", "ds1", f"file://{self.src}/")
        self.mnt.mkdir()
        subprocess.run([self.dstagefs, "-o", "allow_other", str(self.mnt)],
                       env=self.env, check=True, timeout=30)
        wait_for(lambda: mounted(self.mnt), "the mount", 20)

    def run(self, *args, check=True):
        return subprocess.run([self.stager, *args], env=self.env, check=check,
                              capture_output=True, text=True, timeout=60)

    def show(self):
        import json
        return json.loads(self.run("show", "ds1", "--json").stdout)

    def stats(self):
        text = (self.mnt / ".dstage" / "stats").read_text()
        return {k: int(v) for k, v in
                (line.split() for line in text.splitlines() if line.strip())
                if v.isdigit()}

    def stop(self):
        if mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", str(self.mnt)], timeout=30)
        stop(self.daemon)
        if mounted(self.ckstore):
            subprocess.run(["umount", str(self.ckstore)], timeout=30)

    def store_writable(self, rw):
        subprocess.run(["mount", "-o", "remount," + ("rw" if rw else "ro"),
                        str(self.ckstore)], check=True, timeout=30)


class Slurm:
    """munged + slurmctld + slurmd on 127.0.0.1, all state under dir."""

    def __init__(self, root, node):
        self.d = root
        self.node = node
        self.procs = []

    def wrapper(self, name):
        """The packaged script NAME, run with this node's settings."""
        w = self.d / f"{name}.sh"
        w.write_text(
            "#!/bin/bash\n"
            f"export SLURM_CONF={self.d}/slurm.conf\n"
            f"export DSTAGE_CONFIG={self.node.conf}\n"
            f"export DSTAGE_STAGER={self.node.stager}\n"
            f"export DSTAGE_SLURM_STATE={self.d}/state\n"
            "export DSTAGE_STAGE_TIMEOUT=60\n"
            # the tests choose it per job (test_ckpt_*)
            f"DSTAGE_PUBLISH_TIMEOUT=$(cat {self.d}/publish-timeout "
            "2>/dev/null || echo 30)\n"
            "export DSTAGE_PUBLISH_TIMEOUT\n"
            f"exec {SLURM_DIR / name} \"$@\"\n")
        w.chmod(0o755)
        return w

    def start(self):
        d = self.d
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_sock = d / "munge.sock"
        self.spawn("munged", [
            "munged", "-F", "--force", f"--key-file={key}",
            f"--socket={self.munge_sock}", f"--pid-file={d}/munged.pid",
            f"--seed-file={d}/munge.seed", f"--log-file={d}/munged.log"])
        wait_for(self.munge_sock.exists, "the munge socket", 10)
        (d / "ctld").mkdir()
        (d / "spool").mkdir()
        conf = f"""ClusterName=dstagetest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.munge_sock}
CredType=cred/munge
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
MinJobAge=600
Prolog={self.wrapper("prolog")}
TaskProlog={self.wrapper("taskprolog")}
Epilog={self.wrapper("epilog")}
PrologFlags=Alloc
PrologEpilogTimeout=90
NodeName={NODE} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP
"""
        (d / "slurm.conf").write_text(conf)
        self.env = dict(os.environ, SLURM_CONF=str(d / "slurm.conf"))
        self.spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self.spawn("slurmd", ["slurmd", "-D", "-N", NODE])
        wait_for(lambda: self.node_state() == "idle", "the node to be idle",
                 30, 0.5)

    def spawn(self, name, argv):
        env = getattr(self, "env", os.environ)
        p = subprocess.Popen(argv, env=env,
                             stdout=open(self.d / f"{name}.out", "wb"),
                             stderr=subprocess.STDOUT)
        self.procs.append(p)

    def cmd(self, *argv, check=True):
        return subprocess.run(list(argv), env=self.env, check=check,
                              capture_output=True, text=True, timeout=30)

    def node_state(self):
        r = self.cmd("sinfo", "-h", "-n", NODE, "-o", "%t", check=False)
        return r.stdout.strip() if r.returncode == 0 else ""

    def submit(self, comment, script, users=None, user=None, outdir=None):
        """sbatch as root, or as user (users fixture) writing to outdir."""
        out = (outdir or self.d) / "job-%j.out"
        argv = ["sbatch", "--parsable", f"--comment={comment}",
                f"--output={out}", "--time=5", "--wrap", script]
        if user:
            r = users.run(user, argv, env=self.env, cwd=outdir, text=True,
                          timeout=30)
            assert r.returncode == 0, r.stderr
        else:
            r = self.cmd(*argv)
        job = r.stdout.strip().split(";")[0]
        return job, Path(str(out).replace("%j", job))

    def job(self, job):
        r = self.cmd("scontrol", "show", "job", "-o", job)
        return r.stdout

    def wait_job(self, job, timeout=90):
        def done():
            info = self.job(job)
            st = re.search(r"JobState=(\S+)", info).group(1)
            return info if st in ("COMPLETED", "FAILED", "CANCELLED",
                                  "TIMEOUT", "NODE_FAIL") else None
        return wait_for(done, f"job {job} to end", timeout, 0.5)

    def logs(self):
        text = ""
        for f in sorted(self.d.glob("*.log")) + sorted(self.d.glob("*.out")):
            text += f"---- {f.name}\n{f.read_text(errors='replace')[-3000:]}\n"
        return text

    def stop(self):
        for p in reversed(self.procs):
            stop(p)


@pytest.fixture(scope="module")
def cluster(build_dir):
    # Not under pytest's basetemp: pytest resets /tmp/pytest-of-root to 0700
    # whenever a session starts, and the job's user must reach the mount.
    root = Path(tempfile.mkdtemp(prefix="dstage-slurm-", dir="/tmp"))
    root.chmod(0o755)
    node = Node(root / "node", build_dir)
    (root / "node").mkdir()
    slurm = Slurm(root / "slurm", node)
    (root / "slurm").mkdir()
    try:
        node.start()
        slurm.start()
        yield node, slurm
    finally:
        slurm.stop()
        node.stop()
        print(slurm.logs())
        if not mounted(node.mnt) and not mounted(node.ckstore):
            shutil.rmtree(root, ignore_errors=True)


def test_job_reads_its_staged_dataset_and_nothing_from_the_source(cluster):
    node, slurm = cluster
    assert node.show()["cached"] == 0, "staged before the job: test is void"
    before = node.stats()
    job, out = slurm.submit(
        "dstage:ds1",
        f"cd {node.mnt}/datasets/ds1 && sha256sum -c SHA256SUMS && "
        "cat shards/* labels.csv | wc -c")
    info = slurm.wait_job(job)
    text = out.read_text() if out.exists() else "(no output file)"
    assert "JobState=COMPLETED" in info, f"{info}\n{text}\n{slurm.logs()}"
    assert "ExitCode=0:0" in info
    lines = text.splitlines()
    assert "shards/shard-0.tar: OK" in lines and "labels.csv: OK" in lines
    assert lines[-1].strip() == str(node.size)
    shown = node.show()
    assert shown["cached"] == shown["bytes"]
    assert shown["verified_files"] == shown["files"]
    assert shown["mismatched_files"] == 0
    after = node.stats()
    assert after["bytes_from_source"] == before["bytes_from_source"], \
        "the job's reads went to the source: the prolog did not stage"
    # Served from the cache: through dstagefs, or (whole, staged objects)
    # by the kernel from the cache's files in passthrough, which dstagefs
    # counts as opens, not bytes (docs/dstagefs.md, "Passthrough").
    served = after["bytes_from_cache"] - before["bytes_from_cache"]
    passed = after.get("fs_passthrough_opens", 0) - \
        before.get("fs_passthrough_opens", 0)
    assert served >= node.size or passed >= 3, (served, passed)


def test_missing_dataset_fails_the_job_with_the_reason(cluster):
    node, slurm = cluster
    job, out = slurm.submit("dstage:ds1,nosuch", "echo THE-JOB-RAN")
    info = slurm.wait_job(job)
    text = out.read_text() if out.exists() else ""
    assert "JobState=FAILED" in info, f"{info}\n{text}\n{slurm.logs()}"
    assert not re.search(r"ExitCode=0:", info)
    reason = "dstage: dataset 'nosuch' is not registered on this node"
    assert reason in text, text
    assert "THE-JOB-RAN" not in text
    assert reason in info, "no AdminComment: " + info
    ctld = (slurm.d / "slurmctld.log").read_text()
    assert f"setting admin_comment to {reason}" in ctld
    # The job's fault, not the node's: the node is still in service.
    assert wait_for(lambda: slurm.node_state() == "idle", "node idle", 15)
    # The epilog forgot the reason.
    assert not (slurm.d / "state" / f"{job}.failed").exists()


def test_bad_dataset_name_fails_the_job(cluster):
    node, slurm = cluster
    job, out = slurm.submit("dstage:../etc", "echo THE-JOB-RAN")
    info = slurm.wait_job(job)
    text = out.read_text() if out.exists() else ""
    assert "JobState=FAILED" in info
    assert "bad dataset name '../etc'" in text and "THE-JOB-RAN" not in text


def test_job_without_datasets_runs_untouched(cluster):
    node, slurm = cluster
    job, out = slurm.submit("just a comment", "echo THE-JOB-RAN")
    info = slurm.wait_job(job)
    assert "JobState=COMPLETED" in info
    assert out.read_text().strip() == "THE-JOB-RAN"


def test_a_users_jobs_read_staged_data_and_see_the_reason(cluster, users):
    """As an ordinary user: the TaskProlog runs as the user and must read
    the reason the root Prolog left; the job reads through the shared mount."""
    node, slurm = cluster
    user = users.user("dsjob")
    outdir = slurm.d / "out-user"
    outdir.mkdir()
    os.chown(outdir, users.uid(user), users.gid(user))
    users.reach(outdir)
    users.reach(node.mnt.parent)  # the mount itself is read-only
    (slurm.d / "state").mkdir(mode=0o755, exist_ok=True)
    users.reach(slurm.d / "state")
    job, out = slurm.submit("dstage:ds1",
                            f"sha256sum {node.mnt}/datasets/ds1/labels.csv",
                            users, user, outdir)
    info = slurm.wait_job(job)
    assert "JobState=COMPLETED" in info, info + slurm.logs()
    want = hashlib.sha256(b"label,count\n").hexdigest()
    assert out.read_text().split()[0] == want
    job, out = slurm.submit("dstage:nosuch", "echo THE-JOB-RAN", users, user,
                            outdir)
    info = slurm.wait_job(job)
    text = out.read_text()
    assert "JobState=FAILED" in info
    assert "dstage: dataset 'nosuch' is not registered" in text, text
    assert "THE-JOB-RAN" not in text


# ---- the Epilog waits for the job's checkpoints (issue 32) ----

CKPT_JOB = ("python3 -c 'import sys\n"
            "try:\n"
            "    with open(sys.argv[1], \"wb\") as f: f.write(sys.argv[2].encode())\n"
            "except OSError as e: print(\"close:\", e)\n"
            "print(\"CKPT-WRITTEN\")' {path} {data}")


def state_of(info):
    return re.search(r"JobState=(\S+)", info).group(1)


def ckpt_submit(node, slurm, name, data, timeout):
    (slurm.d / "publish-timeout").write_text(f"{timeout}\n")
    (node.mnt / "checkpoints" / name).mkdir(exist_ok=True)
    path = node.mnt / "checkpoints" / name / "step-1.pt"
    return slurm.submit("ckpt", CKPT_JOB.format(path=path, data=data))


def unpublished(node):
    r = node.run("unpublished", "--json", check=False)
    assert r.returncode in (0, 1), r.stderr
    import json
    return json.loads(r.stdout)


def test_epilog_waits_until_the_checkpoint_is_published(cluster):
    node, slurm = cluster
    data = os.urandom(8).hex()
    node.store_writable(False)
    try:
        job, out = ckpt_submit(node, slurm, "job-a", data, 60)
        # the script ends; its checkpoint is closed but not in the store
        wait_for(lambda: out.exists() and "CKPT-WRITTEN" in out.read_text(),
                 "the job's script to write its checkpoint", 60, 0.3)
        assert not (node.ckstore / "job-a" / "step-1.pt").exists()
        # the job stays COMPLETING while the epilog waits
        wait_for(lambda: "COMPLETING" in slurm.job(job), "COMPLETING", 30,
                 0.2)
        rows = unpublished(node)
        assert [r["key"] for r in rows] == ["job-a/step-1.pt"], rows
        assert rows[0]["state"] == "unpublished"
        time.sleep(3)
        info = slurm.job(job)
        assert "COMPLETING" in info, "the epilog did not wait: " + info
    finally:
        node.store_writable(True)
    info = slurm.wait_job(job, 60)
    while "COMPLETING" in info:
        time.sleep(0.3)
        info = slurm.job(job)
    assert state_of(info) == "COMPLETED", f"{info}\n{slurm.logs()}"
    assert "ExitCode=0:0" in info
    assert "dstage-epilog" not in out.read_text()
    stored = node.ckstore / "job-a" / "step-1.pt"
    assert stored.read_text() == data
    assert unpublished(node) == []
    assert wait_for(lambda: slurm.node_state() == "idle", "node idle", 15)


def test_epilog_fails_the_job_when_the_store_refuses(cluster):
    node, slurm = cluster
    node.store_writable(False)
    try:
        t0 = time.monotonic()
        job, out = ckpt_submit(node, slurm, "job-b", "b", 4)
        info = slurm.wait_job(job, 60)
        while "COMPLETING" in info:
            time.sleep(0.3)
            info = slurm.job(job)
        took = time.monotonic() - t0
        text = out.read_text() if out.exists() else ""
        assert "CKPT-WRITTEN" in text, text
        # the job's record cannot change once it has finished: the reason
        # is at the end of its output, and in the node's drain reason
        reason = text.splitlines()[-1] if text else ""
        assert reason.startswith(
            "dstage-epilog: dstage: 1 checkpoint file(s) written by this "
            "job are not in the checkpoint store after 4s "
            "(DSTAGE_PUBLISH_TIMEOUT)"), f"{info}\n{text}\n{slurm.logs()}"
        assert "job-b/step-1.pt unpublished" in reason, reason
        assert "Read-only file system" in reason, reason
        assert took < 40, f"the epilog took {took:.0f}s with a 4s timeout"
        ctld = (slurm.d / "slurmctld.log").read_text()
        assert f"epilog error JobId={job} Node={NODE}" in ctld, ctld
        # the node's checkpoints cannot leave it: drained, with the reason
        wait_for(lambda: "drain" in slurm.node_state(), "the node drained",
                 15)
        node_info = slurm.cmd("scontrol", "show", "node", NODE).stdout
        assert f"Reason=dstage: job {job}: 1 checkpoint file(s)" in \
            node_info, node_info
        print(info)
    finally:
        node.store_writable(True)
        slurm.cmd("scontrol", "update", f"NodeName={NODE}", "State=RESUME",
                  check=False)
    # the retry publishes it once the store takes it again
    wait_for(lambda: (node.ckstore / "job-b" / "step-1.pt").exists(),
             "the retry to publish job-b", 30)
    wait_for(lambda: slurm.node_state() == "idle", "node idle again", 30)


def test_epilog_names_an_abandoned_checkpoint(cluster):
    node, slurm = cluster
    (slurm.d / "publish-timeout").write_text("3\n")
    (node.mnt / "checkpoints" / "job-c").mkdir()
    path = node.mnt / "checkpoints" / "job-c" / "step-1.pt"
    job, out = slurm.submit(
        "ckpt",
        f"python3 -c 'import os; f = open(\"{path}\", \"wb\"); "
        "f.write(b\"partial\"); f.flush(); os.kill(os.getpid(), 9)'")
    info = slurm.wait_job(job, 60)
    while "COMPLETING" in info:
        time.sleep(0.3)
        info = slurm.job(job)
    text = out.read_text() if out.exists() else ""
    reason = text.splitlines()[-1] if text else ""
    assert "not in the checkpoint store after 3s" in reason, \
        f"{info}\n{text}\n{slurm.logs()}"
    assert re.search(r"abandoned/\d+-step-1\.pt abandoned", reason), reason
    assert "its writer was killed" in reason
    # the job's own doing: the node stays in service
    time.sleep(2)
    assert slurm.node_state() == "idle", slurm.node_state()
