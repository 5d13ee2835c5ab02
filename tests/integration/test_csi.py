"""dstage-csi (csi/, issue 43): the CSI node plugin on its unix socket beside
a real stager daemon and a real dstagefs mount, driven by a real gRPC client
(Debian's python3-grpcio) with stubs generated here by protoc from
csi/csi.proto, making each call as node-driver-registrar (GetPluginInfo,
NodeGetInfo), the livenessprobe (Probe) and kubelet (NodeGetCapabilities,
NodePublishVolume with podInfoOnMount's keys, NodeGetVolumeStats,
NodeUnpublishVolume) make it.

Covered: Identity and NodeGetInfo; a dataset publish that stages and
verifies through the daemon (UNAVAILABLE with the job's progress meanwhile,
then a read-only bind holding the dataset's bytes), idempotent publish and
unpublish; subPath; every error code the issue lists, each naming its
cause; two pods publishing one dataset at once while a stage runs (one
stage job, one verify job); a checkpoint volume written by a second uid
(files keep its uid); a restricted dataset refused to a namespace not
allowed and served to one allowed (cachectl csi-allow, audited); kill -9
of the plugin between publish and unpublish; a dstagefs restart under a
published volume (re-bound, also seen through a HostToContainer copy); a
second call on a target while one is in flight (ABORTED); a stagingTimeout
whose clock goes on across kill -9 of the plugin.

Needs root (mounts), grpcio and protoc with grpc_python_plugin; skips
otherwise. About 30-60 s.
"""
import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from waits import wait_for

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20

try:
    import grpc
except ImportError:  # pragma: no cover
    grpc = None

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts)"),
    pytest.mark.skipif(grpc is None, reason="python3-grpcio not installed"),
    pytest.mark.skipif(
        not shutil.which("protoc") or not shutil.which("grpc_python_plugin"),
        reason="protoc and grpc_python_plugin needed (protobuf-compiler, "
        "protobuf-compiler-grpc)"),
]

READER = 3   # VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY
WRITER = 1   # SINGLE_NODE_WRITER


def mounts_at(path):
    """How many mounts /proc/self/mountinfo holds at path."""
    n = 0
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].encode().decode("unicode_escape")
        if mp == str(path):
            n += 1
    return n


def mount_opts(path):
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        if f[4] == str(path):
            opts = f[5]
    return opts.split(",")


def stale(path):
    try:
        os.statvfs(path)  # a stat may come from the kernel's cache
        return False
    except OSError as e:
        return e.errno == 107  # ENOTCONN


class Node:
    """A node: datasets on a file:// store, a stager daemon, a dstagefs
    mount, a kubelet directory (rshared, as kubelet's) and dstage-csi."""

    def __init__(self, root, build):
        self.root = root
        self.build = build
        self.stager = str(build / "stager" / "stager")
        self.cachectl = str(build / "cachectl" / "cachectl")
        self.dstagefs = str(build / "fs" / "dstagefs")
        self.csi = str(build / "csi" / "dstage-csi")
        self.mnt = root / "data"
        self.kubelet = root / "kubelet"
        self.sock = root / "csi.sock"
        self.state = root / "csi-state"
        self.conf = root / "dstage.conf"
        self.fs = self.daemon = self.plugin = None
        self.sources = {}

    # -- setup --
    def dataset(self, name, files, group=None):
        src = self.root / "store" / name
        for k, v in files.items():
            (src / k).parent.mkdir(parents=True, exist_ok=True)
            (src / k).write_bytes(v)
        (src / "SHA256SUMS").write_text("".join(
            f"{hashlib.sha256(v).hexdigest()}  {k}\n"
            for k, v in sorted(files.items())))
        self.sources[name] = files
        args = ["add", name, f"file://{src}/"]
        if group:
            args += ["--group", group]
        self.run(*args)

    def start(self):
        self.conf.write_text(
            f"[cache]\ndir = {self.root}/cache\nsize = 256M\n"
            f"[catalog]\npath = {self.root}/catalog.db\n"
            f"[daemon]\nsocket = {self.root}/stager.sock\n"
            f"[checkpoints]\nstore = file://{self.root}/ckstore/\n"
            f"staging_dir = {self.root}/staging\n"
            "[log]\nlevel = info\n")
        (self.root / "ckstore").mkdir()
        self.env = dict(os.environ, DSTAGE_CONFIG=str(self.conf))
        self.daemon = subprocess.Popen(
            [self.stager, "daemon"], env=self.env,
            stdout=open(self.root / "daemon.log", "ab"),
            stderr=subprocess.STDOUT)
        wait_for(lambda: (self.root / "stager.sock").exists(),
                 "the stager socket", 20)
        self.mnt.mkdir()
        self.start_fs()
        # kubelet's directory is rshared (the DaemonSet's Bidirectional
        # /var/lib/kubelet): binds made under it propagate to the pods'
        # HostToContainer copies.
        self.kubelet.mkdir()
        subprocess.run(["mount", "--bind", str(self.kubelet),
                        str(self.kubelet)], check=True)
        subprocess.run(["mount", "--make-rshared", str(self.kubelet)],
                       check=True)
        self.start_csi()

    def start_fs(self):
        self.fs = subprocess.Popen(
            [self.dstagefs, "-f", "-o", "allow_other", str(self.mnt)],
            env=self.env, stdout=open(self.root / "dstagefs.log", "ab"),
            stderr=subprocess.STDOUT)
        wait_for(lambda: mounts_at(self.mnt) and
                 (self.mnt / "datasets").is_dir(), "the mount", 20)

    def start_csi(self, *extra, sock=None, mount=None, env=None):
        sock = sock or self.sock
        p = subprocess.Popen(
            [self.csi, "--endpoint", f"unix://{sock}",
             "--mount", str(mount or self.mnt), "--state-dir",
             str(self.state), "--node-id", "node-1", "--recheck", "200",
             "--retry-after", "2", "--metrics-textfile",
             str(self.root / "csi.prom"), *extra],
            env=env or self.env, stdout=open(self.root / "csi.log", "ab"),
            stderr=subprocess.STDOUT)
        wait_for(lambda: sock.exists(), "the plugin's socket", 20)
        if sock == self.sock:
            self.plugin = p
        return p

    def stop(self):
        for p in (self.plugin,):
            if p and p.poll() is None:
                p.terminate()
                p.wait(10)
        subprocess.run(["umount", "-R", "-l", str(self.kubelet)],
                       capture_output=True)
        if mounts_at(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)],
                           capture_output=True)
        for p in (self.fs, self.daemon):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()

    # -- tools --
    def run(self, *args, check=True):
        r = subprocess.run([self.stager, *args], env=self.env,
                           capture_output=True, text=True, timeout=60)
        if check and r.returncode:
            raise AssertionError(f"stager {args}: {r.stderr}")
        return r

    def jobs(self, name, kind):
        out = json.loads(self.run("jobs", "--all", "--json").stdout)
        return [j for j in out if j.get("dataset") == name and
                j.get("kind") == kind]

    def target(self, pod, vol="data"):
        d = self.kubelet / "pods" / pod / "volumes" / "kubernetes.io~csi" / vol
        d.mkdir(parents=True, exist_ok=True)
        return d / "mount"


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """The stubs, generated now from the project's csi/csi.proto."""
    out = tmp_path_factory.mktemp("csi-stubs")
    subprocess.run(
        ["protoc", "-I", str(REPO / "csi"), "-I", "/usr/include",
         f"--python_out={out}", f"--grpc_out={out}",
         "--plugin=protoc-gen-grpc=" + shutil.which("grpc_python_plugin"),
         "csi.proto"], check=True)
    sys.path.insert(0, str(out))
    import csi_pb2
    import csi_pb2_grpc
    return csi_pb2, csi_pb2_grpc


@pytest.fixture(scope="module")
def node(tmp_path_factory, build_dir):
    if not (build_dir / "csi" / "dstage-csi").exists():
        pytest.skip("dstage-csi was not built (gRPC or protobuf missing)")
    n = Node(tmp_path_factory.mktemp("csi"), build_dir)
    try:
        n.start()
        n.dataset("train-set-a", {
            "shards/shard-0.tar": os.urandom(2 * MiB),
            "shards/shard-1.tar": os.urandom(MiB),
            "labels.csv": b"label,count\n"})
        yield n
    finally:
        n.stop()


class Client:
    def __init__(self, pb, sock):
        self.pb, self.grpc = pb
        # its own connections: the global pool would hand a new channel
        # the connection of a plugin killed a moment ago
        self.ch = grpc.insecure_channel(
            f"unix://{sock}", options=[("grpc.use_local_subchannel_pool", 1)])
        self.identity = self.grpc.IdentityStub(self.ch)
        self.node = self.grpc.NodeStub(self.ch)

    def cap(self, mode=READER, block=False):
        VC = self.pb.VolumeCapability
        if block:
            return VC(block=VC.BlockVolume(),
                      access_mode=VC.AccessMode(mode=mode))
        return VC(mount=VC.MountVolume(),
                  access_mode=VC.AccessMode(mode=mode))

    def publish(self, target, ctx, volume_id="pv-train", mode=READER,
                readonly=True, ns="team-a", cap=True, block=False,
                pod="pod-1"):
        """NodePublishVolume as kubelet makes it (podInfoOnMount)."""
        c = dict(ctx)
        if ns is not None:
            c.update({"csi.storage.k8s.io/pod.name": pod,
                      "csi.storage.k8s.io/pod.namespace": ns,
                      "csi.storage.k8s.io/pod.uid": pod + "-uid",
                      "csi.storage.k8s.io/serviceAccount.name": "default",
                      "csi.storage.k8s.io/ephemeral": "false"})
        req = self.pb.NodePublishVolumeRequest(
            volume_id=volume_id, target_path=str(target), readonly=readonly,
            volume_context=c)
        if cap:
            req.volume_capability.CopyFrom(self.cap(mode, block))
        return self.node.NodePublishVolume(req, timeout=30)

    def publish_ready(self, *a, timeout=60, retry=("UNAVAILABLE",), **kw):
        """Publish as kubelet retries it; the messages seen meanwhile."""
        retry = [getattr(grpc.StatusCode, c) for c in retry]
        seen = []
        end = time.monotonic() + timeout
        while True:
            try:
                self.publish(*a, **kw)
                return seen
            except grpc.RpcError as e:
                if e.code() not in retry or \
                        time.monotonic() > end:
                    raise
                seen.append(e.details())
                time.sleep(0.2)

    def unpublish(self, target, volume_id="pv-train"):
        return self.node.NodeUnpublishVolume(
            self.pb.NodeUnpublishVolumeRequest(volume_id=volume_id,
                                               target_path=str(target)),
            timeout=30)

    def stats(self, target, volume_id="pv-train"):
        return self.node.NodeGetVolumeStats(
            self.pb.NodeGetVolumeStatsRequest(volume_id=volume_id,
                                              volume_path=str(target)),
            timeout=30)


@pytest.fixture
def client(node, pb):
    c = Client(pb, node.sock)
    yield c
    c.ch.close()


def code_of(fn, *a, **kw):
    with pytest.raises(grpc.RpcError) as ei:
        fn(*a, **kw)
    return ei.value.code(), ei.value.details()


def read_tree(d):
    return {str(p.relative_to(d)): p.read_bytes()
            for p in Path(d).rglob("*") if p.is_file()}


# ---- tests ----------------------------------------------------------------

def test_identity_and_node_info(node, client, pb):
    """What node-driver-registrar and the livenessprobe ask."""
    csi_pb2 = pb[0]
    info = client.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == "csi.dstage.io"
    assert info.vendor_version
    caps = client.identity.GetPluginCapabilities(
        csi_pb2.GetPluginCapabilitiesRequest())
    # no controller service: static and inline volumes only
    assert not [c for c in caps.capabilities
                if c.service.type == c.service.CONTROLLER_SERVICE]
    probe = client.identity.Probe(csi_pb2.ProbeRequest())
    assert probe.ready.value is True
    ncaps = client.node.NodeGetCapabilities(
        csi_pb2.NodeGetCapabilitiesRequest())
    types = {c.rpc.type for c in ncaps.capabilities}
    assert csi_pb2.NodeServiceCapability.RPC.GET_VOLUME_STATS in types
    assert csi_pb2.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME \
        not in types
    assert client.node.NodeGetInfo(
        csi_pb2.NodeGetInfoRequest()).node_id == "node-1"
    # kubelet (root) only: connecting needs write permission
    assert os.stat(node.sock).st_mode & 0o022 == 0
    assert os.stat(node.state).st_mode & 0o777 == 0o700


def test_dataset_publish_stages_verifies_and_binds_read_only(node, client):
    t = node.target("pod-a")
    assert not node.jobs("train-set-a", "stage")
    seen = client.publish_ready(t, {"dataset": "train-set-a"})
    # the first answer was the retryable one, naming the job
    assert seen and "train-set-a" in seen[0] and "job" in seen[0], seen
    assert read_tree(t) == {**node.sources["train-set-a"],
                            "SHA256SUMS": (node.root / "store" /
                                           "train-set-a" /
                                           "SHA256SUMS").read_bytes()}
    assert "ro" in mount_opts(t)
    with pytest.raises(OSError):
        (t / "new").write_bytes(b"x")
    stage, verify = (node.jobs("train-set-a", "stage"),
                     node.jobs("train-set-a", "verify"))
    assert len(stage) == 1 and stage[0]["state"] == "done", stage
    assert len(verify) == 1 and verify[0]["state"] == "done", verify
    # idempotent: the same publish again is OK and mounts nothing more
    client.publish(t, {"dataset": "train-set-a"})
    assert mounts_at(t) == 1
    assert len(node.jobs("train-set-a", "stage")) == 1
    st = client.stats(t)
    assert st.usage and not st.volume_condition.abnormal
    client.unpublish(t)
    assert not t.exists() and mounts_at(t) == 0
    client.unpublish(t)  # idempotent
    code, msg = code_of(client.stats, t)
    assert code == grpc.StatusCode.NOT_FOUND, msg


def test_ephemeral_inline_volume_and_subpath(node, client):
    """An inline volume: kubelet sends SINGLE_NODE_WRITER with readOnly."""
    t = node.target("pod-e")
    client.publish_ready(t, {"dataset": "train-set-a", "subPath": "shards",
                             "csi.storage.k8s.io/ephemeral": "true"},
                         volume_id="csi-0123abcd", mode=WRITER,
                         readonly=True)
    assert sorted(os.listdir(t)) == ["shard-0.tar", "shard-1.tar"]
    client.unpublish(t, volume_id="csi-0123abcd")
    t2 = node.target("pod-e2")
    code, msg = code_of(client.publish, t2, {"dataset": "train-set-a",
                                             "subPath": "nothing"})
    assert code == grpc.StatusCode.NOT_FOUND and "nothing" in msg, msg
    assert not t2.exists()


def test_error_codes_name_their_cause(node, client, pb):
    t = node.target("pod-err")
    ds = {"dataset": "train-set-a"}
    cases = [
        (dict(target=""), grpc.StatusCode.INVALID_ARGUMENT, "target_path"),
        (dict(cap=False), grpc.StatusCode.INVALID_ARGUMENT,
         "volume_capability"),
        (dict(block=True), grpc.StatusCode.INVALID_ARGUMENT, "block"),
        (dict(mode=WRITER, readonly=False),
         grpc.StatusCode.INVALID_ARGUMENT, "read-only"),
        (dict(ctx={"dataset": "train-set-a", "verify": "maybe"}),
         grpc.StatusCode.INVALID_ARGUMENT, "verify"),
        (dict(ctx={"datset": "train-set-a"}),
         grpc.StatusCode.INVALID_ARGUMENT, "datset"),
        (dict(ctx={}), grpc.StatusCode.INVALID_ARGUMENT, "no dataset"),
        (dict(ctx={"dataset": "train-set-a", "subPath": "../x"}),
         grpc.StatusCode.INVALID_ARGUMENT, "subPath"),
        (dict(ctx={"dataset": "../etc"}),
         grpc.StatusCode.INVALID_ARGUMENT, "dataset"),
        (dict(ctx={"dataset": "no-such-set"}), grpc.StatusCode.NOT_FOUND,
         "no-such-set"),
    ]
    for kw, want, word in cases:
        target = kw.pop("target", t)
        ctx = kw.pop("ctx", ds)
        code, msg = code_of(client.publish, target, ctx, **kw)
        assert code == want and word in msg, (kw, ctx, code, msg)
        assert not t.exists()
    code, msg = code_of(client.unpublish, "")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, msg

    # a target that holds another volume
    client.publish_ready(t, ds)
    code, msg = code_of(client.publish, t, ds, volume_id="pv-other")
    assert code == grpc.StatusCode.ALREADY_EXISTS and str(t) in msg, msg
    client.unpublish(t)

    # dstagefs not mounted at --mount: a second plugin on an empty dir
    empty = node.root / "not-a-mount"
    empty.mkdir(exist_ok=True)
    sock = node.root / "csi2.sock"
    p = node.start_csi(sock=sock, mount=empty)
    try:
        c2 = Client(pb, sock)
        code, msg = code_of(c2.publish, t, ds)
        assert code == grpc.StatusCode.FAILED_PRECONDITION, msg
        assert "dstagefs is not mounted at " + str(empty) in msg, msg
        code, msg = code_of(c2.identity.Probe, pb[0].ProbeRequest())
        assert code == grpc.StatusCode.FAILED_PRECONDITION, msg
        c2.ch.close()
    finally:
        p.terminate()
        p.wait(10)

    # no stager daemon on the node: retryable, naming the socket
    gone = node.root / "no-daemon.sock"
    p = node.start_csi(sock=sock, env=dict(
        node.env, DSTAGE_DAEMON_SOCKET=str(gone)))
    try:
        c3 = Client(pb, sock)
        code, msg = code_of(c3.publish, t, ds)
        assert code == grpc.StatusCode.UNAVAILABLE, msg
        assert str(gone) in msg and "stager daemon" in msg, msg
        c3.ch.close()
    finally:
        p.terminate()
        p.wait(10)


def test_two_pods_join_one_stage_and_see_progress(node, client):
    node.dataset("set-b", {"a.bin": os.urandom(3 * MiB),
                           "b.bin": os.urandom(3 * MiB)})
    # an admin's slow stage is running: the pods join it
    r = node.run("stage", "set-b", "--bandwidth", "2M")
    wait_for(lambda: any(j["state"] == "running"
                         for j in node.jobs("set-b", "stage")),
             "the stage to run", 20)
    targets = [node.target(f"pod-b{i}") for i in range(2)]
    seen, errors = [[], []], []

    def pod(i):
        try:
            seen[i] = client.publish_ready(
                targets[i], {"dataset": "set-b"}, pod=f"pod-b{i}",
                volume_id="csi-b%d" % i, mode=WRITER,
                timeout=90)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=pod, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    stages = node.jobs("set-b", "stage")
    assert len(stages) == 1, stages
    assert len(node.jobs("set-b", "verify")) == 1
    job = str(stages[0]["job"])
    for s in seen:
        # the pod's events: the job being staged, with its progress
        assert any(f"job {job}" in m and "staged" in m and "%" in m
                   for m in s), s
    for i, t in enumerate(targets):
        assert (t / "a.bin").read_bytes() == node.sources["set-b"]["a.bin"]
        client.unpublish(t, volume_id="csi-b%d" % i)
    assert r.returncode == 0
    # the counters: publishes, waits for staging, failures by cause
    prom = node.root / "csi.prom"

    def counters():
        if not prom.exists():
            return None
        m = dict(ln.rsplit(" ", 1) for ln in prom.read_text().splitlines()
                 if ln and not ln.startswith("#"))
        return m if int(m["dstage_csi_publishes_total"]) >= 2 else None
    m = wait_for(counters, "the metrics file", 15)
    assert int(m["dstage_csi_staging_waits_total"]) >= 2
    assert int(m['dstage_csi_failures_total{cause="unavailable"}']) >= 2
    assert int(m['dstage_csi_failures_total{cause="invalid_argument"}']) >= 1


def test_pods_at_once_start_one_stage(node, client):
    """Eight publishes at the same instant, nothing staged yet: the daemon's
    join=1 queues one stage and one verify for all of them. (A publish whose
    show came before the first stage was queued and whose submit came after
    it ended once queued a second stage: join=1 after=SEEN closes that,
    shown step by step in the next test.)"""
    node.dataset("set-c", {"c.bin": os.urandom(2 * MiB)})
    targets = [node.target(f"pod-c{i}") for i in range(8)]
    go, errors = threading.Barrier(8), []

    def pod(i):
        try:
            go.wait()
            client.publish_ready(targets[i], {"dataset": "set-c"},
                                 volume_id=f"csi-c{i}", pod=f"pod-c{i}")
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=pod, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(node.jobs("set-c", "stage")) == 1
    assert len(node.jobs("set-c", "verify")) == 1
    for i, t in enumerate(targets):
        assert (t / "c.bin").stat().st_size == 2 * MiB
        client.unpublish(t, volume_id=f"csi-c{i}")


def daemon_call(node, **fields):
    """One request on the stager daemon's socket (docs/stager.md,
    "Protocol"): its rows and its end line, as dicts."""
    line = "\t".join(f"{k}={v}" for k, v in fields.items()) + "\n"
    with socket.socket(socket.AF_UNIX) as c:
        c.settimeout(30)
        c.connect(str(node.root / "stager.sock"))
        c.sendall(line.encode())
        buf = b""
        while not buf.endswith(b"\n") or b"type=end" not in buf:
            got = c.recv(65536)
            assert got, buf
            buf += got
    msgs = [dict(f.split("=", 1) for f in ln.split("\t"))
            for ln in buf.decode().splitlines()]
    return msgs[:-1], msgs[-1]


def test_a_publish_that_looked_before_a_stage_ended_joins_it(node, client):
    """The race behind two stage jobs, step by step: a publish's show sees
    nothing staged (seen_stage=0), another pod's stage then runs and ends,
    and only then does the first publish ask for a stage. With after=SEEN
    the daemon answers the ended job (joined=1) rather than queue a second;
    a caller that saw that job (after=its id) gets a new one; and dstage-csi
    publishes the volume with the one stage and one verify."""
    node.dataset("set-j", {"j.bin": os.urandom(1 * MiB)})
    rows, end = daemon_call(node, cmd="show", name="set-j")
    assert end["rc"] == "0", end
    seen = int(rows[0]["seen_stage"])
    assert seen == 0 and rows[0]["active_stage"] == "0", rows
    node.run("stage", "set-j", "--wait")          # another pod's, ended
    first = node.jobs("set-j", "stage")
    assert [j["state"] for j in first] == ["done"], first
    rows, end = daemon_call(node, cmd="stage", name="set-j", join=1,
                            after=seen)
    assert end["rc"] == "0", end
    assert rows[0]["job"] == str(first[0]["job"]), rows
    assert rows[0].get("joined") == "1", rows
    assert len(node.jobs("set-j", "stage")) == 1
    # after= the ended job's own id: nothing newer, nothing running, so a
    # new stage is queued (a dataset evicted since its stage is staged again)
    rows, end = daemon_call(node, cmd="stage", name="set-j", join=1,
                            after=first[0]["job"])
    assert end["rc"] == "0" and "joined" not in rows[0], (rows, end)
    assert int(rows[0]["job"]) > first[0]["job"]
    wait_for(lambda: all(j["state"] == "done"
                         for j in node.jobs("set-j", "stage")),
             "the second stage", 30)
    rows, end = daemon_call(node, cmd="show", name="set-j")
    assert rows[0]["seen_stage"] == rows[0]["last_stage_job"] != "0", rows
    for bad in ("x", "-1", "9223372036854775808"):
        rows, end = daemon_call(node, cmd="stage", name="set-j", join=1,
                                after=bad)
        assert end["rc"] == "-22" and "after=" in end["msg"], end
    assert len(node.jobs("set-j", "stage")) == 2
    t = node.target("pod-j")
    client.publish_ready(t, {"dataset": "set-j"}, volume_id="csi-j")
    assert len(node.jobs("set-j", "stage")) == 2     # staged: none started
    assert len(node.jobs("set-j", "verify")) == 1
    assert (t / "j.bin").read_bytes() == node.sources["set-j"]["j.bin"]
    client.unpublish(t, volume_id="csi-j")


def test_checkpoint_volume_files_belong_to_their_writer(node, client, users):
    t = node.target("pod-ck", vol="ckpt")
    client.publish(t, {"checkpoints": "job-7"}, volume_id="pv-ck",
                   mode=WRITER, readonly=False)
    assert "rw" in mount_opts(t)
    u = users.user("trainer")
    users.reach(t)
    r = users.run(u, ["sh", "-c", f"echo step-1 > {t}/epoch-1.pt"])
    assert r.returncode == 0, r.stderr
    st = os.stat(node.mnt / "checkpoints" / "job-7" / "epoch-1.pt")
    assert st.st_uid == users.uid(u)
    assert os.stat(t / "epoch-1.pt").st_uid == users.uid(u)
    client.unpublish(t, volume_id="pv-ck")
    assert (node.mnt / "checkpoints" / "job-7" /
            "epoch-1.pt").read_text() == "step-1\n"


def test_restricted_dataset_only_to_allowed_namespaces(node, client):
    node.dataset("secret-set", {"x.bin": os.urandom(4096)},
                 group="research")
    t = node.target("pod-s")
    code, msg = code_of(client.publish, t, {"dataset": "secret-set"},
                        ns="team-b")
    assert code == grpc.StatusCode.PERMISSION_DENIED, msg
    assert "research" in msg and "team-b" in msg, msg
    r = subprocess.run([node.cachectl, "csi-allow", "secret-set",
                        "team-a,team-c"], env=node.env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    client.publish_ready(t, {"dataset": "secret-set"}, ns="team-a")
    assert (t / "x.bin").stat().st_size == 4096
    client.unpublish(t)
    code, msg = code_of(client.publish, t, {"dataset": "secret-set"},
                        ns="team-b")
    assert code == grpc.StatusCode.PERMISSION_DENIED, msg
    code, msg = code_of(client.publish, t, {"dataset": "secret-set"},
                        ns=None)
    assert code == grpc.StatusCode.PERMISSION_DENIED, msg
    assert "podInfoOnMount" in msg
    audit = subprocess.run([node.cachectl, "audit", "--json"],
                           env=node.env, capture_output=True, text=True)
    assert "csi.allow" in audit.stdout and "team-a,team-c" in audit.stdout


def restart_plugin(node, pb):
    """kill -9 the node's plugin and start another on the same state
    directory; a client of the new one."""
    node.plugin.send_signal(signal.SIGKILL)
    node.plugin.wait(10)
    node.sock.unlink()
    node.start_csi()
    return Client(pb, node.sock)


def test_kill9_of_the_plugin_between_publish_and_unpublish(node, client, pb):
    t = node.target("pod-k")
    client.publish_ready(t, {"dataset": "train-set-a"})
    c = restart_plugin(node, pb)
    try:
        c.publish(t, {"dataset": "train-set-a"})  # still published: OK
        assert mounts_at(t) == 1
        assert (t / "labels.csv").read_bytes() == b"label,count\n"
        c.unpublish(t)
        assert mounts_at(t) == 0 and not t.exists()
    finally:
        c.ch.close()


def test_dstagefs_restart_rebinds_published_targets(node, pb):
    c = Client(pb, node.sock)
    t = node.target("pod-r")
    c.publish_ready(t, {"dataset": "train-set-a"})
    # the application container's view: a HostToContainer (rslave) copy
    view = node.root / "container-view"
    view.mkdir()
    subprocess.run(["mount", "--rbind", str(t), str(view)], check=True)
    subprocess.run(["mount", "--make-rslave", str(view)], check=True)
    try:
        want = node.sources["train-set-a"]["shards/shard-1.tar"]
        assert (view / "shards" / "shard-1.tar").read_bytes() == want
        node.fs.send_signal(signal.SIGKILL)
        node.fs.wait(10)
        wait_for(lambda: stale(t), "the target to go stale", 10)
        st = c.stats(t)
        assert st.volume_condition.abnormal
        subprocess.run(["fusermount3", "-u", "-z", str(node.mnt)],
                       check=True)
        node.start_fs()
        wait_for(lambda: not stale(t), "the re-bind", 20)
        assert (t / "shards" / "shard-1.tar").read_bytes() == want
        assert (view / "shards" / "shard-1.tar").read_bytes() == want
        assert "ro" in mount_opts(t)
        assert not c.stats(t).volume_condition.abnormal
        c.unpublish(t)
        assert mounts_at(t) == 0 and not t.exists()
    finally:
        subprocess.run(["umount", "-R", "-l", str(view)],
                       capture_output=True)
        c.ch.close()


def test_verify_false_publishes_after_the_stage_alone(node, client):
    node.dataset("set-nv", {"n.bin": os.urandom(MiB)})
    t = node.target("pod-nv")
    client.publish_ready(t, {"dataset": "set-nv", "verify": "false"})
    assert len(node.jobs("set-nv", "stage")) == 1
    assert node.jobs("set-nv", "verify") == []
    client.unpublish(t)


def test_a_failed_stage_fails_the_publish_with_its_own_error(node, client):
    node.dataset("set-bad", {"f.bin": os.urandom(MiB)})
    # the source changes under the registered snapshot: the stage fails
    (node.root / "store" / "set-bad" / "f.bin").write_bytes(
        os.urandom(MiB + 1))
    t = node.target("pod-bad")
    with pytest.raises(grpc.RpcError) as ei:
        client.publish_ready(t, {"dataset": "set-bad"})
    e = ei.value
    stage = node.jobs("set-bad", "stage")
    assert len(stage) == 1 and stage[0]["state"] == "failed", stage
    assert e.code() == grpc.StatusCode.INTERNAL, e.details()
    assert f"job {stage[0]['job']}" in e.details()
    assert stage[0]["error"][:60] in e.details(), (stage, e.details())
    assert not t.exists()
    # kubelet's next retries within --retry-after start no second stage
    code, msg = code_of(client.publish, t, {"dataset": "set-bad"})
    assert code == grpc.StatusCode.INTERNAL
    assert len(node.jobs("set-bad", "stage")) == 1


def test_staging_timeout_is_deadline_exceeded(node, client):
    node.dataset("set-slow", {"s.bin": os.urandom(4 * MiB)})
    node.run("stage", "set-slow", "--bandwidth", "1M")
    t = node.target("pod-slow")
    ctx = {"dataset": "set-slow", "stagingTimeout": "1s"}
    code, msg = code_of(client.publish, t, ctx)
    assert code == grpc.StatusCode.UNAVAILABLE, msg
    time.sleep(2.2)
    code, msg = code_of(client.publish, t, ctx)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED, msg
    assert "stagingTimeout" in msg and "set-slow" in msg
    # once staged, the same volume publishes
    wait_for(lambda: node.jobs("set-slow", "stage")[0]["state"] == "done",
             "the slow stage", 30, 0.5)
    client.publish_ready(t, ctx, retry=("UNAVAILABLE", "DEADLINE_EXCEEDED"))
    client.unpublish(t)


def test_staging_timeout_survives_a_restart_of_the_plugin(node, client, pb):
    """The first wait's time is kept in the state directory: a plugin killed
    while a pod waits for staging, and started again, answers
    DEADLINE_EXCEEDED at the original deadline, not stagingTimeout after
    its own start (or never, restarted often enough). An unpublish drops the
    clock, and so does the publish that succeeds."""
    node.dataset("set-slow2", {"s.bin": os.urandom(10 * MiB)})
    node.run("stage", "set-slow2", "--bandwidth", "1M")      # about 10 s
    t = node.target("pod-slow2")
    ctx = {"dataset": "set-slow2", "stagingTimeout": "4s"}
    t0 = time.time()
    code, msg = code_of(client.publish, t, ctx)
    assert code == grpc.StatusCode.UNAVAILABLE and "waited 0s" in msg, msg
    waits = list(node.state.glob("*.wait"))
    assert [f"target={t}" in w.read_text() for w in waits] == [True], waits
    time.sleep(2.5)
    c = restart_plugin(node, pb)
    try:
        # counting on from the first wait, not from the restart
        seen = []
        while not seen or "waited" not in seen[-1]:
            code, msg = code_of(c.publish, t, ctx)
            assert code == grpc.StatusCode.UNAVAILABLE, msg
            seen.append(msg)
            assert len(seen) < 5, seen
        assert int(re.search(r"waited (\d+)s", msg).group(1)) >= 2, seen

        # DEADLINE_EXCEEDED at the first wait's deadline: more than 4 whole
        # seconds after it, by t0 + 5.5; a clock restarted with the plugin
        # (after t0 + 2.5, floored) would not pass it before t0 + 6.5
        def deadline():
            code, msg = code_of(c.publish, t, ctx)
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return msg
            assert code == grpc.StatusCode.UNAVAILABLE, msg
            assert time.time() < t0 + 6.3, msg
            return None
        msg = wait_for(deadline, "DEADLINE_EXCEEDED", 10, 0.2)
        assert time.time() >= t0 + 4, msg
        assert "stagingTimeout of 4s" in msg and "set-slow2" in msg, msg
        assert node.jobs("set-slow2", "stage")[0]["state"] == "running"
        # the pod is gone: its clock with it; a new pod's starts at 0
        c.unpublish(t)
        assert not list(node.state.glob("*.wait"))
        code, msg = code_of(c.publish, t, ctx)
        assert code == grpc.StatusCode.UNAVAILABLE and "waited 0s" in msg
        wait_for(lambda: node.jobs("set-slow2", "stage")[0]["state"] ==
                 "done", "the slow stage", 30, 0.5)
        c.publish_ready(t, ctx, retry=("UNAVAILABLE", "DEADLINE_EXCEEDED"))
        assert not list(node.state.glob("*.wait"))
        c.unpublish(t)
    finally:
        c.ch.close()


class HeldDaemon:
    """A stager daemon socket that holds the first request made on it until
    released, then relays it, and every later one at once, to the node's
    daemon: a daemon stuck for a while, as under load."""

    def __init__(self, path, real):
        self.path, self.real = path, str(real)
        self.held = threading.Event()    # the first request has come
        self.go = threading.Event()
        self.srv = socket.socket(socket.AF_UNIX)
        self.srv.bind(str(path))
        self.srv.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        first = True
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return       # closed
            threading.Thread(target=self._relay, args=(c, first),
                             daemon=True).start()
            first = False

    def _relay(self, c, hold):
        with c, socket.socket(socket.AF_UNIX) as d:
            if hold:
                c.recv(1, socket.MSG_PEEK)
                self.held.set()
                self.go.wait(60)
            d.connect(self.real)
            while True:
                ready, _, _ = select.select([c, d], [], [], 60)
                for s in ready:
                    got = s.recv(65536)
                    if not got:
                        return
                    (d if s is c else c).sendall(got)
                if not ready:
                    return

    def close(self):
        self.go.set()
        self.srv.close()


def outcome(fn, *a, **kw):
    """The call's status code: OK or its error's."""
    try:
        fn(*a, **kw)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def test_a_second_call_on_a_target_in_flight_is_aborted(node, pb):
    """Two calls on one target at once (a CO that lost track of its first
    one, as a restarted kubelet may): the second, a publish or an
    unpublish, is answered ABORTED naming the target, and once the first is
    done the next call goes through. The first is held for real, in the
    plugin's request to its stager daemon (a second plugin whose daemon
    socket holds the first request). The same volume at another target is
    not held up: calls are serialized per target."""
    gate = HeldDaemon(node.root / "held-daemon.sock",
                      node.root / "stager.sock")
    sock = node.root / "csi-abort.sock"
    p = node.start_csi(sock=sock, env=dict(
        node.env, DSTAGE_DAEMON_SOCKET=str(gate.path)))
    c = Client(pb, sock)
    t, other = node.target("pod-ab"), node.target("pod-ab2")
    ctx = {"dataset": "train-set-a"}
    first = []
    th = threading.Thread(
        target=lambda: first.append(outcome(c.publish, t, ctx)))
    try:
        th.start()
        assert gate.held.wait(20), "the first publish never asked the daemon"
        code, msg = code_of(c.publish, t, ctx)
        assert code == grpc.StatusCode.ABORTED, msg
        assert f"another call on {t} is in progress" in msg, msg
        code, msg = code_of(c.unpublish, t)
        assert code == grpc.StatusCode.ABORTED, msg
        assert f"another call on {t} is in progress" in msg, msg
        assert outcome(c.publish, other, ctx) in (
            grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE)
        assert th.is_alive() and not first
        gate.go.set()
        th.join(30)
        assert first and first[0] in (
            grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE), first
        c.publish_ready(t, ctx)
        assert mounts_at(t) == 1
        assert (t / "labels.csv").read_bytes() == b"label,count\n"
        c.unpublish(t)
        c.unpublish(other)
        assert mounts_at(t) == 0 and mounts_at(other) == 0
    finally:
        gate.close()
        th.join(30)
        c.ch.close()
        p.terminate()
        p.wait(10)


def test_a_stuck_daemon_fails_the_publish_after_daemon_timeout(node, pb):
    """A stager daemon that never answers (its socket accepts and holds the
    request) does not hold a publish, or its target, for good: after
    --daemon-timeout the publish answers UNAVAILABLE naming the timeout,
    the target is free again (no ABORTED), and once the daemon answers the
    next publish goes through."""
    gate = HeldDaemon(node.root / "stuck-daemon.sock",
                      node.root / "stager.sock")
    sock = node.root / "csi-stuck.sock"
    p = node.start_csi("--daemon-timeout", "2", sock=sock, env=dict(
        node.env, DSTAGE_DAEMON_SOCKET=str(gate.path)))
    c = Client(pb, sock)
    t = node.target("pod-stuck")
    ctx = {"dataset": "train-set-a"}
    try:
        t0 = time.monotonic()
        code, msg = code_of(c.publish, t, ctx)
        took = time.monotonic() - t0
        assert code == grpc.StatusCode.UNAVAILABLE, msg
        assert "did not answer within 2 s (--daemon-timeout)" in msg, msg
        assert 1.5 < took < 20, took
        assert gate.held.is_set()
        gate.go.set()
        c.publish_ready(t, ctx)
        assert (t / "labels.csv").read_bytes() == b"label,count\n"
        c.unpublish(t)
        assert mounts_at(t) == 0
    finally:
        gate.go.set()
        gate.close()
        c.ch.close()
        p.terminate()
        p.wait(10)


def test_man_page_matches_help(node):
    text = subprocess.run([node.csi, "--help"], capture_output=True,
                          text=True, check=True).stdout
    page = (REPO / "man" / "dstage-csi.8").read_text().replace("\\-", "-")
    opts = set(re.findall(r"--[a-z][a-z-]+", text))
    assert opts == set(re.findall(r"--[a-z][a-z-]+", page))
