"""Shared fixtures for the integration tests.

rgw (session)      a throwaway single-node Ceph radosgw started by scripts/rgw
                   (or the one described by $DSTAGE_RGW_ENV, an env.json of a
                   cluster that is already running, which is then left alone).
                   Attributes: dir, port, endpoint, access_key, secret_key,
                   region, pids. Methods:
                     env(**overrides) -> dict   os.environ + AWS_* for it
                     make_bucket(name) -> name  (idempotent)
                     drop_bucket(name, keys)  deletes keys, then the bucket
                     curl(path, *args, endpoint=None, secret=None,
                          timeout=60, payload_sha256=EMPTY, input=None)
                          -> CompletedProcess (signed curl)
                     put_object(bucket, key, data, endpoint=None) -> status
                     aws(*args, check=True) -> CompletedProcess (/usr/bin/aws)
build_dir          Path of the CMake build tree: $DSTAGE_BUILD_DIR or
                   <repo>/build (relative paths are taken from the repo root).
tool               tool(name) -> str: path of a built binary, looked up in
                   <build>/tests, <build>, then <build>/{fs,stager,cachectl,
                   bench}; fails the test when it was not built.
faultproxy         (function) a tests/faultproxy.FaultProxy in front of rgw,
                   with a control port; plus env(**overrides) pointing
                   AWS_ENDPOINT_URL at the proxy, and .rgw.
cephfs             (session) a throwaway single-node CephFS started by
                   scripts/cephfs (its own mon, memstore OSD and MDS, no
                   radosgw), mounted with ceph-fuse; started the first time
                   a test asks for it, unmounted and stopped at the end of
                   the session; skips naming the Debian packages when
                   ceph-mds, ceph-fuse (or the cluster's tools) are missing.
                   Attributes: mount (Path of the ceph-fuse mount), dir,
                   conf (its ceph.conf), pids, start_seconds (start-up time,
                   also printed in the session's report).
users              (function) throwaway local users and groups for access
                   tests, run as a second, unprivileged uid (needs root,
                   useradd and setpriv; skips otherwise). Methods:
                     group(name) -> name           groupadd
                     user(name, groups=()) -> name useradd, no home, no shell
                     uid(user) / gid(user) -> int
                     run(user, cmd, **kw) -> CompletedProcess (setpriv with
                         the user's uid, gid and supplementary groups)
                     popen(user, cmd, **kw) -> Popen
                     reach(path)  make path's parents traversable by others
                   Everything created is removed at teardown.
"""
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from faultproxy import FaultProxy  # noqa: E402

RGW_SCRIPT = REPO / "scripts" / "rgw"
CEPHFS_SCRIPT = REPO / "scripts" / "cephfs"
AWS_CLI = "/usr/bin/aws" if os.path.exists("/usr/bin/aws") else shutil.which("aws")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
RGW_PACKAGES = {"ceph-mon": "ceph-mon", "ceph-osd": "ceph-osd",
                "radosgw": "radosgw", "radosgw-admin": "radosgw",
                "ceph": "ceph-common", "monmaptool": "ceph-common",
                "ceph-authtool": "ceph-common", "curl": "curl"}
CEPHFS_PACKAGES = {"ceph-mon": "ceph-mon", "ceph-osd": "ceph-osd",
                   "ceph-mds": "ceph-mds", "ceph-fuse": "ceph-fuse",
                   "ceph": "ceph-common", "monmaptool": "ceph-common",
                   "ceph-authtool": "ceph-common", "fusermount3": "fuse3"}
# Variables from the caller's environment that would point the tools at some
# other S3 account.
AWS_SCRUB = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
             "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
             "AWS_DEFAULT_PROFILE")


class Rgw:
    def __init__(self, info, owned):
        self.dir = Path(info["RGW_DIR"])
        self.port = int(info["RGW_PORT"])
        self.endpoint = info["AWS_ENDPOINT_URL"]
        self.access_key = info["AWS_ACCESS_KEY_ID"]
        self.secret_key = info["AWS_SECRET_ACCESS_KEY"]
        self.region = info.get("AWS_REGION", "us-east-1")
        self.pids = list(info.get("RGW_PIDS", []))
        self.owned = owned

    def env(self, **overrides):
        e = {k: v for k, v in os.environ.items() if k not in AWS_SCRUB}
        e.update(AWS_ACCESS_KEY_ID=self.access_key,
                 AWS_SECRET_ACCESS_KEY=self.secret_key,
                 AWS_ENDPOINT_URL=self.endpoint,
                 AWS_REGION=self.region,
                 AWS_DEFAULT_REGION=self.region)
        e.update({k: str(v) for k, v in overrides.items()})
        return e

    def curl(self, path, *args, endpoint=None, secret=None, timeout=60,
             payload_sha256=EMPTY_SHA256, input=None):
        """Signed curl request of `path` ("/bucket/key"). The body comes back
        in stdout; `-w`, `-T FILE` etc. go in args. curl 7.88 does not send
        x-amz-content-sha256 itself and radosgw requires it, so it is added:
        the empty-body hash by default (GET/HEAD/DELETE, empty PUTs); pass
        payload_sha256="UNSIGNED-PAYLOAD" (or the body's hash) for uploads."""
        cmd = ["curl", "-sS", "--aws-sigv4",
               "aws:amz:%s:s3" % self.region,
               "--user", "%s:%s" % (self.access_key, secret or self.secret_key),
               "-H", "x-amz-content-sha256: " + payload_sha256]
        cmd += list(args) + [(endpoint or self.endpoint) + path]
        return subprocess.run(cmd, capture_output=True, timeout=timeout,
                              input=input)

    def put_object(self, bucket, key, data, endpoint=None):
        """PUT bytes as /bucket/key with curl; returns the HTTP status."""
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            p = self.curl("/%s/%s" % (bucket, key), "-T", f.name,
                          "-o", "/dev/null", "-w", "%{http_code}",
                          endpoint=endpoint,
                          payload_sha256="UNSIGNED-PAYLOAD")
        if p.returncode != 0:
            raise AssertionError("put_object: curl rc %d: %s" %
                                 (p.returncode, p.stderr.decode(errors="replace")))
        return int(p.stdout.decode())

    def aws(self, *args, check=True, timeout=600):
        if AWS_CLI is None:
            pytest.skip("awscli missing: install the Debian package 'awscli'")
        p = subprocess.run([AWS_CLI, "--endpoint-url", self.endpoint] +
                           list(args), env=self.env(), capture_output=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError("aws %s failed: %s" %
                                 (" ".join(args), p.stderr.decode(errors="replace")))
        return p

    def drop_bucket(self, name, keys):
        """Delete keys (best effort), then the bucket."""
        for k in keys:
            self.curl("/%s/%s" % (name, k), "-X", "DELETE", "-o",
                      "/dev/null")
        self.curl("/" + name, "-X", "DELETE", "-o", "/dev/null")

    def make_bucket(self, name):
        p = self.curl("/" + name, "-X", "PUT", "-o", "-", "-w",
                      "\n%{http_code}")
        out = p.stdout.decode(errors="replace")
        code = out.rsplit("\n", 1)[-1]
        if p.returncode != 0 or (code != "200" and
                                 "BucketAlreadyOwnedByYou" not in out):
            raise AssertionError("make_bucket %s: curl rc %d, %s %s" %
                                 (name, p.returncode, out,
                                  p.stderr.decode(errors="replace")))
        return name


@pytest.fixture(scope="session")
def rgw(tmp_path_factory):
    given = os.environ.get("DSTAGE_RGW_ENV")
    if given:
        with open(given) as f:
            yield Rgw(json.load(f), owned=False)
        return
    missing = sorted({pkg for b, pkg in RGW_PACKAGES.items()
                      if shutil.which(b) is None})
    if missing:
        pytest.skip("radosgw test server unavailable: install the Debian "
                    "package(s) %s (or run scripts/install-deps)" %
                    " ".join(missing))
    d = tmp_path_factory.mktemp("rgw")
    p = subprocess.run([str(RGW_SCRIPT), "start", str(d)],
                       capture_output=True, timeout=300)
    if p.returncode != 0:
        pytest.fail("scripts/rgw start failed (rc %d):\n%s\n%s" %
                    (p.returncode, p.stdout.decode(errors="replace"),
                     p.stderr.decode(errors="replace")), pytrace=False)
    with open(d / "env.json") as f:
        r = Rgw(json.load(f), owned=True)
    try:
        yield r
    finally:
        subprocess.run([str(RGW_SCRIPT), "stop", str(d)],
                       capture_output=True, timeout=120)


class CephFS:
    def __init__(self, info):
        self.dir = Path(info["CEPHFS_DIR"])
        self.mount = Path(info["CEPHFS_MOUNT"])
        self.conf = Path(info["CEPHFS_CONF"])
        self.pids = list(info["CEPHFS_PIDS"])
        self.start_seconds = None  # measured by the fixture


@pytest.fixture(scope="session")
def cephfs(tmp_path_factory, request):
    missing = sorted({pkg for b, pkg in CEPHFS_PACKAGES.items()
                      if shutil.which(b) is None})
    if missing:
        pytest.skip("CephFS test cluster unavailable: install the Debian "
                    "package(s) %s (or run scripts/install-deps)" %
                    " ".join(missing))
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("CephFS test cluster: ceph-fuse needs root and /dev/fuse")
    d = tmp_path_factory.mktemp("cephfs")
    t0 = time.monotonic()
    p = subprocess.run([str(CEPHFS_SCRIPT), "start", str(d)],
                       capture_output=True, timeout=180)
    if p.returncode != 0:
        pytest.fail("scripts/cephfs start failed (rc %d):\n%s\n%s" %
                    (p.returncode, p.stdout.decode(errors="replace"),
                     p.stderr.decode(errors="replace")), pytrace=False)
    with open(d / "env.json") as f:
        c = CephFS(json.load(f))
    c.start_seconds = round(time.monotonic() - t0, 1)
    rep = request.config.pluginmanager.get_plugin("terminalreporter")
    if rep is not None:
        rep.write_line("cephfs: started and mounted in %gs (%s)" %
                       (c.start_seconds, c.mount))
    try:
        yield c
    finally:
        p = subprocess.run([str(CEPHFS_SCRIPT), "stop", str(d)],
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode(errors="replace")


@pytest.fixture(scope="session")
def build_dir():
    b = Path(os.environ.get("DSTAGE_BUILD_DIR", "build"))
    if not b.is_absolute():
        b = REPO / b
    return b


@pytest.fixture(scope="session")
def tool(build_dir):
    def find(name):
        for sub in ("tests", ".", "fs", "stager", "cachectl", "bench"):
            p = build_dir / sub / name
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
        pytest.fail("%s is not built in %s (cmake --build %s)" %
                    (name, build_dir, build_dir), pytrace=False)
    return find


@pytest.fixture
def faults(tool, tmp_path):
    """faults(NAME) -> (environment, log): run a program with
    tests/preload/faults.c injecting fault NAME (see that file); each
    injected failure appends a byte to log, so a test can check the
    fallback was taken."""
    shim = str(Path(tool("cache_tool")).parent / "faults.so")
    assert os.path.exists(shim), shim

    def env(name):
        log = tmp_path / ("fault-" + name)
        return {"LD_PRELOAD": shim, "DSTAGE_FAULT": name,
                "DSTAGE_FAULT_LOG": str(log)}, log
    return env


def injected(log):
    """How many failures faults.so injected (see the faults fixture)."""
    return log.stat().st_size if log.exists() else 0


class RgwProxy(FaultProxy):
    """A FaultProxy in front of the session's radosgw."""

    def __init__(self, rgw):
        super().__init__(rgw.port, control_port=0)
        self.rgw = rgw

    def env(self, **overrides):
        o = {"AWS_ENDPOINT_URL": self.endpoint}
        o.update(overrides)
        return self.rgw.env(**o)


@pytest.fixture
def faultproxy(rgw):
    p = RgwProxy(rgw).start()
    try:
        yield p
    finally:
        p.stop()


class LocalUsers:
    """See the `users` fixture."""

    def __init__(self):
        self.tag = "%05d" % (os.getpid() % 100000)
        self.created = []  # (command, name), undone in reverse

    def group(self, name):
        name = name + self.tag
        subprocess.run(["groupadd", name], check=True, capture_output=True)
        self.created.append(("groupdel", name))
        return name

    def user(self, name, groups=()):
        name = name + self.tag
        extra = ["-G", ",".join(groups)] if groups else []
        subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin"] +
                       extra + [name], check=True, capture_output=True)
        self.created.append(("userdel", name))
        return name

    def uid(self, user):
        return pwd.getpwnam(user).pw_uid

    def gid(self, user):
        return pwd.getpwnam(user).pw_gid

    def prefix(self, user):
        pw = pwd.getpwnam(user)
        return ["setpriv", "--reuid", str(pw.pw_uid), "--regid",
                str(pw.pw_gid), "--init-groups", "--"]

    def run(self, user, cmd, timeout=60, **kw):
        kw.setdefault("capture_output", True)
        return subprocess.run(self.prefix(user) + [str(c) for c in cmd],
                              timeout=timeout, **kw)

    def popen(self, user, cmd, **kw):
        return subprocess.Popen(self.prefix(user) + [str(c) for c in cmd],
                                **kw)

    def reach(self, path):
        for p in [Path(path)] + list(Path(path).parents):
            if str(p) in ("/", "/tmp"):
                break
            os.chmod(p, os.stat(p).st_mode | 0o005)

    def cleanup(self):
        for cmd, name in reversed(self.created):
            subprocess.run([cmd, name], capture_output=True)
        self.created = []


@pytest.fixture
def users():
    if os.geteuid() != 0 or not shutil.which("useradd") or \
            not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv")
    u = LocalUsers()
    try:
        yield u
    finally:
        u.cleanup()
