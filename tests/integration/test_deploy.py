"""Installation and packaging (packaging/, man/, docs/deployment.md).

- `cmake --install` of the build under test into a temporary prefix: the
  layout, libdstage.so's soname, dstage.pc and the public headers (a program
  including every installed header is compiled and linked with pkg-config
  and run), the sample configuration (every key, accepted by the parser);
- the systemd units: `systemd-analyze verify` (skipped only when
  systemd-analyze is missing), ordering, restart and hardening settings;
- the man pages against `--help` and the configuration key table, both ways;
- the Kubernetes manifests (kubectl parsing, API field names through Debian's
  python3-kubernetes models) and their entrypoints run directly;
- the .deb made by CPack from the build under test: its declared Depends
  cover every library the binaries load, and it installs into a fresh
  Debian 12 root (debootstrap minbase, cached between runs as a tarball in
  $DSTAGE_DEBOOTSTRAP_CACHE) with apt, where `stager --help`,
  `dstagefs --help` and the demo's steps run. DSTAGE_DEB=path tests that
  .deb instead (packaging/build-deb's release package).
The fresh-root test downloads from deb.debian.org (debootstrap once, then
the package's dependencies): it skips when the mirror cannot be reached.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from waits import wait_for

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "packaging"
K8S = PKG / "kubernetes"
ROOT = os.geteuid() == 0


def run(*argv, check=True, timeout=120, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    r = subprocess.run([str(a) for a in argv], timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{argv} exited {r.returncode}\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


def mounted(path):
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


# ---------------------------------------------------------------- install

@pytest.fixture(scope="module")
def prefix(tmp_path_factory, build_dir):
    """`cmake --install` into a real prefix (paths in the units resolve)."""
    p = tmp_path_factory.mktemp("prefix")
    run("cmake", "--install", build_dir, "--prefix", p)
    return p


@pytest.fixture(scope="module")
def stager_bin(build_dir):
    return str(build_dir / "stager" / "stager")


@pytest.fixture(scope="module")
def dstagefs_bin(build_dir):
    return str(build_dir / "fs" / "dstagefs")


def test_install_layout(prefix):
    for f in ("bin/stager", "bin/dstagefs", "bin/cachectl"):
        assert os.access(prefix / f, os.X_OK), f
    libs = list(prefix.glob("lib*/**/libdstage.so.0"))
    assert len(libs) == 1, "no libdstage.so.0"
    lib = libs[0]
    assert lib.is_symlink() and (lib.parent / "libdstage.so").exists()
    dyn = run("readelf", "-d", lib).stdout
    assert "Library soname: [libdstage.so.0]" in dyn
    headers = sorted(p.name for p in (prefix / "include" / "dstage").glob("*.h"))
    assert headers == sorted(p.name for p in
                             (REPO / "include" / "dstage").glob("*.h"))
    for page in ("man1/stager.1", "man8/dstagefs.8", "man5/dstage.conf.5"):
        assert (prefix / "share" / "man" / page).is_file(), page
    units = prefix / "lib" / "systemd" / "system"
    assert (units / "dstage-stager.service").is_file()
    assert (units / "dstagefs.service").is_file()
    assert (prefix / "etc" / "dstage" / "dstage.conf").is_file()
    assert (prefix / "etc" / "default" / "dstage").is_file()
    for s in ("slurm/prolog", "slurm/taskprolog", "slurm/epilog",
              "kubernetes/entrypoint", "kubernetes/stage-init"):
        assert os.access(prefix / "share" / "dstage" / s, os.X_OK), s
    # Paths in installed files are the install's own.
    unit = (units / "dstage-stager.service").read_text()
    assert f"ExecStart={prefix}/bin/stager daemon" in unit
    assert f"EnvironmentFile=-{prefix}/etc/default/dstage" in unit


def cmake_cache(build_dir, key):
    m = re.search(rf"(?m)^{key}:\w+=(.*)$",
                  (build_dir / "CMakeCache.txt").read_text())
    return m.group(1) if m else ""


def test_pkgconfig_links_a_program_with_every_public_header(prefix, tmp_path,
                                                            build_dir):
    pcdir = next(prefix.glob("lib*/**/pkgconfig"))
    env = dict(os.environ, PKG_CONFIG_PATH=str(pcdir))
    flags = run("pkg-config", "--cflags", "--libs", "dstage", env=env).stdout
    assert f"-I{prefix}/include" in flags and "-ldstage" in flags
    src = tmp_path / "use.c"
    incs = "".join(f"#include <dstage/{h.name}>\n" for h in
                   sorted((prefix / "include" / "dstage").glob("*.h")))
    src.write_text(incs + "#include <stdio.h>\n"
                   "int main(void)\n{\n"
                   "\tputs(log_level_name(log_level_parse(\"debug\")));\n"
                   "\treturn 0;\n}\n")
    exe = tmp_path / "use"
    cc = [cmake_cache(build_dir, "CMAKE_C_COMPILER") or "cc"]
    if cmake_cache(build_dir, "DSTAGE_SANITIZE") == "ON":
        # The sanitized library needs the sanitizers' runtime in the program.
        cc.append("-fsanitize=address,undefined")
    run(*cc, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror", src, "-o",
        exe, *flags.split())
    lib = next(prefix.glob("lib*/**/libdstage.so.0")).parent
    needed = run("readelf", "-d", exe).stdout
    assert "[libdstage.so.0]" in needed, "linked the static archive"
    out = run(exe, env=dict(os.environ, LD_LIBRARY_PATH=str(lib))).stdout
    assert out.strip() == "debug"


def sample_keys(text):
    keys, section = [], None
    for line in text.splitlines():
        m = re.match(r"^\[(\w+)\]", line)
        if m:
            section = m.group(1)
        m = re.match(r"^#?(\w+) = (.+)$", line)
        if m:
            keys.append((f"{section}.{m.group(1)}", m.group(2)))
    return keys


def doc_keys():
    """key -> default column of docs/configuration.md's table."""
    rows = {}
    for line in (REPO / "docs" / "configuration.md").read_text().splitlines():
        m = re.match(r"^\| `([a-z0-9_]+\.[a-z0-9_]+)` \| (.*?) \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    assert len(rows) > 20, "docs/configuration.md's key table not found"
    return rows


def parser_keys():
    """The keys the configuration parser knows (lib/format/config.c key table)."""
    keys = set()
    for f in (REPO / "lib").rglob("*.c"):
        keys |= set(re.findall(r'\{\s*"([a-z0-9_]+\.[a-z0-9_]+)",\s*CT_',
                               f.read_text()))
    assert len(keys) > 20, \
        "the parser's key table was not found: update parser_keys()"
    return keys


def test_sample_config_lists_every_key_and_parses(prefix, stager_bin,
                                                  tmp_path):
    sample = (prefix / "etc" / "dstage" / "dstage.conf").read_text()
    keys = dict(sample_keys(sample))
    assert set(keys) == set(doc_keys()), \
        "packaging/dstage.conf and docs/configuration.md differ"
    # Every line commented out: the sample changes nothing by itself.
    assert not [ln for ln in sample.splitlines()
                if ln and not ln.startswith(("#", "["))]
    # With every key set as shown, the parser accepts it.
    live = re.sub(r"(?m)^#(\w+ = )", r"\1", sample)
    live = live.replace("/var/cache/dstage", str(tmp_path / "cache"))
    live = live.replace("/var/lib/dstage", str(tmp_path / "lib"))
    live = live.replace("/etc/dstage/credentials", str(tmp_path / "creds"))
    (tmp_path / "creds").write_text("[default]\naws_access_key_id = a\n"
                                    "aws_secret_access_key = b\n")
    (tmp_path / "creds").chmod(0o600)
    conf = tmp_path / "live.conf"
    conf.write_text(live)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_text("x")
    r = run(stager_bin, "--config", conf, "ls", f"file://{tmp_path}/src/",
            check=False)
    assert r.returncode == 0, r.stderr
    assert "f" in r.stdout


# ---------------------------------------------------------------- systemd

def unit(prefix, name):
    """{key: [values]} of a unit file (all sections)."""
    out = {}
    for line in (prefix / "lib" / "systemd" / "system" / name).read_text(
    ).splitlines():
        m = re.match(r"^(\w+)=(.*)$", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed")
def test_units_pass_systemd_analyze_verify(prefix):
    units = sorted((prefix / "lib" / "systemd" / "system").glob("*.service"))
    assert len(units) == 2
    # MANPATH: verify also checks the Documentation= man pages exist.
    env = dict(os.environ, MANPATH=str(prefix / "share" / "man"))
    r = run("systemd-analyze", "verify", *units, check=False, env=env)
    assert r.returncode == 0 and not r.stderr.strip() and \
        not r.stdout.strip(), r.stdout + r.stderr


def test_stager_unit_ordering_restart_and_hardening(prefix):
    u = unit(prefix, "dstage-stager.service")
    after = " ".join(u["After"])
    assert "network-online.target" in after and "local-fs.target" in after
    assert "/var/cache/dstage" in u["RequiresMountsFor"][0]
    assert u["Restart"] == ["on-failure"]
    for k, v in {"NoNewPrivileges": "yes", "ProtectSystem": "strict",
                 "ProtectHome": "yes", "PrivateTmp": "yes",
                 "RuntimeDirectory": "dstage", "RuntimeDirectoryMode": "0755",
                 "StateDirectoryMode": "0700",
                 "CacheDirectoryMode": "0700"}.items():
        assert u.get(k) == [v], k
    rw = u["ReadWritePaths"][0].split()
    for p in ("/var/cache/dstage", "/var/lib/dstage", "/run/dstage"):
        assert p in rw


def test_dstagefs_unit_mounts_where_the_host_sees_it(prefix):
    u = unit(prefix, "dstagefs.service")
    assert "DSTAGE_MOUNT=/data" in u["Environment"][0]
    assert u["ExecStart"][0].endswith("${DSTAGE_MOUNT}")
    assert u["Type"] == ["forking"], "ready must mean mounted"
    assert u["Restart"] == ["on-failure"]
    assert u["NoNewPrivileges"] == ["yes"]
    assert "/dev/fuse rw" in u["DeviceAllow"]
    # Each of these gives the service its own mount namespace, where the
    # FUSE mount would stay invisible to the host's jobs.
    for k in ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
              "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths",
              "ProtectKernelTunables", "ProtectKernelModules",
              "ProtectKernelLogs", "ProtectControlGroups", "PrivateMounts",
              "TemporaryFileSystem", "BindPaths", "RootDirectory"):
        assert k not in u, f"{k} would hide the mount from the host"


# ---------------------------------------------------------------- man pages

def man_text(name):
    """The page's source with roff escapes for '-' and fonts removed."""
    t = (REPO / "man" / name).read_text()
    t = re.sub(r"\\f[BIRP]", "", t)
    return t.replace("\\-", "-")


LONG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def help_text(*argv):
    r = run(*argv, check=False)
    assert r.returncode == 0, f"{argv}: {r.stderr}"
    return r.stdout + r.stderr


def stager_help(stager_bin):
    top = help_text(stager_bin, "--help")
    cmds = re.findall(r"(?m)^  ([a-z]+)\s", top.split("Commands:")[1])
    assert len(cmds) >= 10, top
    return top, {c: help_text(stager_bin, c, "--help") for c in cmds}


def test_stager_man_page_matches_help(stager_bin):
    page = man_text("stager.1")
    top, per = stager_help(stager_bin)
    helped = set(LONG.findall(top))
    for cmd, text in per.items():
        assert re.search(rf"(?m)^\.(B|BI) {cmd}\b", page), \
            f"stager {cmd} is not in man/stager.1"
        helped |= set(LONG.findall(text))
    paged = set(LONG.findall(page))
    assert helped - paged == set(), "options missing from man/stager.1"
    assert paged - helped == set(), "man/stager.1 has options --help lacks"
    for code in re.findall(r"(\d) ([a-z][a-z ]+?)[,.(]", top):
        assert re.search(rf"(?m)^\.TP\n{code[0]}\n{code[1]}", page), code


def test_cachectl_man_page_matches_help(build_dir):
    exe = str(build_dir / "cachectl" / "cachectl")
    top = help_text(exe, "--help")
    cmds = re.findall(r"(?m)^  ([a-z]+)\s", top.split("commands:")[1])
    assert len(cmds) >= 8, top
    page = man_text("cachectl.8")
    helped = set(LONG.findall(top))
    for cmd in cmds:
        assert re.search(rf"(?m)^\.(B|BI) {cmd}\b", page), \
            f"cachectl {cmd} is not in man/cachectl.8"
        helped |= set(LONG.findall(help_text(exe, cmd, "--help")))
    paged = set(LONG.findall(page))
    assert helped - paged == set(), "options missing from man/cachectl.8"
    assert paged - helped == set(), "man/cachectl.8 has options --help lacks"
    for code in re.findall(r"(\d) ([a-z][a-z ]+?)[,.(]", top):
        assert re.search(rf"(?m)^\.TP\n{code[0]}\n{code[1]}", page), code


def dstagefs_options(text):
    opts = set(LONG.findall(text))
    opts |= {f"-o {o}" for o in re.findall(r"-o ([a-z_]+)", text)}
    opts |= set(re.findall(r"(?m)^\s*(-[a-zA-Z])\b", text))
    return opts


def test_dstagefs_man_page_matches_help(dstagefs_bin):
    text = help_text(dstagefs_bin, "--help")
    page = man_text("dstagefs.8")
    helped = dstagefs_options(text)
    # The page sets single letters as ".B -f", ".BR -h , ...".
    paged = dstagefs_options(page.replace(".BR ", "").replace(".B ", "")
                             .replace(".BI ", "").replace('"', ""))
    assert len(helped) > 15
    assert helped - paged == set(), "options missing from man/dstagefs.8"
    assert paged - helped == set(), "man/dstagefs.8 has options --help lacks"
    for code, what in re.findall(r"(?m)^  (\d)  (.+)$", text):
        assert re.search(rf"(?m)^\.TP\n{code}\n{re.escape(what[:20])}",
                         page), (code, what)


def test_dstage_conf_man_page_matches_the_key_table():
    page = man_text("dstage.conf.5")
    documented = doc_keys()
    paged = dict(re.findall(
        r"(?m)^\.B ([a-z0-9_]+\.[a-z0-9_]+)\n(?:.*\n){2}Default: (.*?); "
        r"environment:", page))
    assert set(paged) == set(documented), \
        "man/dstage.conf.5 and docs/configuration.md list different keys"
    assert set(documented) == parser_keys(), \
        "docs/configuration.md and the parser's key list differ"
    for k, d in documented.items():
        assert paged[k] == d.replace("`", ""), k


# ---------------------------------------------------------------- kubernetes

def k8s_docs(name):
    import yaml
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


K8S_MANIFESTS = ("daemonset.yaml", "training-job.yaml", "csi-driver.yaml",
                 "dataset-pv.yaml", "training-job-csi.yaml")


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="kubectl not installed")
def test_k8s_manifests_parse_with_kubectl():
    for name in K8S_MANIFESTS:
        r = run("kubectl", "label", "--local", "-f", K8S / name, "-o", "name",
                "dstage-check=1", check=False,
                env=dict(os.environ, KUBECONFIG="/dev/null"))
        assert r.returncode == 0, r.stderr
        kinds = [ln.split("/")[0] for ln in r.stdout.split()]
        assert kinds, r.stdout
    assert "daemonset.apps" in run(
        "kubectl", "label", "--local", "-f", K8S / "daemonset.yaml", "-o",
        "name", "x=1", env=dict(os.environ, KUBECONFIG="/dev/null")).stdout


def strict_roundtrip(doc):
    """Deserialize into the API models and back: a field the API does not
    know is dropped, so the two differ."""
    kubernetes = pytest.importorskip(
        "kubernetes", reason="python3-kubernetes not installed")
    client = kubernetes.client.ApiClient()
    group = doc["apiVersion"].split("/")[0]
    version = doc["apiVersion"].split("/")[-1]
    prefix = {"v1": "V1", "apps": "V1", "batch": "V1",
              "storage.k8s.io": "V1"}[group]
    assert version == "v1"
    cls = prefix + doc["kind"]

    class Resp:
        data = json.dumps(doc)
    obj = client.deserialize(Resp(), cls)
    back = client.sanitize_for_serialization(obj)

    def norm(x):
        if isinstance(x, dict):
            return {k: norm(v) for k, v in x.items() if v is not None}
        if isinstance(x, list):
            return [norm(v) for v in x]
        return str(x) if isinstance(x, (int, float)) else x
    return norm(doc), norm(back)


def test_k8s_manifests_use_only_known_api_fields():
    for name in K8S_MANIFESTS:
        for doc in k8s_docs(name):
            a, b = strict_roundtrip(doc)
            assert a == b, f"{name}: {doc['kind']}: unknown or mistyped field"


def test_k8s_daemonset_settings():
    docs = {d["kind"]: d for d in k8s_docs("daemonset.yaml")}
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    c = {x["name"]: x for x in spec["containers"]}
    assert set(c) == {"stager", "dstagefs", "dstage-csi",
                      "node-driver-registrar", "liveness-probe"}
    fs = c["dstagefs"]
    assert fs["securityContext"]["privileged"] is True
    mnt = {m["name"]: m for m in fs["volumeMounts"]}
    assert mnt["data"]["mountPropagation"] == "Bidirectional"
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["credentials"]["secret"]["defaultMode"] == 0o600
    assert vols["cache"]["hostPath"]["path"].startswith("/mnt/nvme")
    assert vols["fuse"]["hostPath"]["path"] == "/dev/fuse"
    st = c["stager"]["securityContext"]
    assert st["allowPrivilegeEscalation"] is False
    assert "ALL" in st["capabilities"]["drop"]
    conf = docs["ConfigMap"]["data"]["dstage.conf"]
    assert "secret" not in conf.lower().replace("secrets/", "")
    assert "aws_secret_access_key" not in (K8S / "daemonset.yaml").read_text()
    job = k8s_docs("training-job.yaml")[0]["spec"]["template"]["spec"]
    init = job["initContainers"][0]
    assert "stage-init" in init["command"][0]
    train = job["containers"][0]
    m = {v["name"]: v for v in train["volumeMounts"]}
    assert m["data"]["readOnly"] is True
    assert m["data"]["mountPropagation"] == "HostToContainer"


def test_k8s_csi_driver_and_its_volumes():
    """The CSI driver: the plugin beside dstagefs, kubelet's directory
    Bidirectional, the CSIDriver node-only with pod info, and a training
    job that reads a dataset with no hostPath."""
    ds = {d["kind"]: d for d in k8s_docs("daemonset.yaml")}
    spec = ds["DaemonSet"]["spec"]["template"]["spec"]
    c = {x["name"]: x for x in spec["containers"]}
    csi = c["dstage-csi"]
    assert "--endpoint" in csi["command"] and "/data" in csi["command"]
    mnt = {m["name"]: m for m in csi["volumeMounts"]}
    assert mnt["kubelet-dir"]["mountPath"] == "/var/lib/kubelet"
    assert mnt["kubelet-dir"]["mountPropagation"] == "Bidirectional"
    assert mnt["data"]["mountPropagation"] == "HostToContainer"
    reg = c["node-driver-registrar"]["args"]
    assert "--kubelet-registration-path=/var/lib/kubelet/plugins/" \
        "csi.dstage.io/csi.sock" in reg
    assert csi["livenessProbe"]["httpGet"]["port"] == "healthz"
    assert "--health-port=9808" in c["liveness-probe"]["args"]
    drv = k8s_docs("csi-driver.yaml")[0]
    assert drv["metadata"]["name"] == "csi.dstage.io"
    assert drv["spec"]["attachRequired"] is False
    assert drv["spec"]["podInfoOnMount"] is True
    assert drv["spec"]["volumeLifecycleModes"] == ["Persistent", "Ephemeral"]
    job = k8s_docs("training-job-csi.yaml")[0]["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in job["volumes"]}
    assert not any("hostPath" in v for v in job["volumes"])
    assert vols["data"]["csi"]["volumeAttributes"]["dataset"] == \
        "train-set-a"
    assert vols["data"]["csi"]["readOnly"] is True
    m = {v["name"]: v for v in job["containers"][0]["volumeMounts"]}
    assert m["data"]["mountPath"] == "/data"
    assert m["data"]["mountPropagation"] == "HostToContainer"
    pvs = [d for d in k8s_docs("dataset-pv.yaml")
           if d["kind"] == "PersistentVolume"]
    assert {p["spec"]["csi"]["driver"] for p in pvs} == {"csi.dstage.io"}
    kust = K8S / "kustomization.yaml"
    if shutil.which("kubectl"):
        r = run("kubectl", "kustomize", K8S, check=False,
                env=dict(os.environ, KUBECONFIG="/dev/null"))
        assert r.returncode == 0, r.stderr
        assert "csi-node-driver-registrar:" in r.stdout
    assert "images:" in kust.read_text()


@pytest.fixture
def node_env(tmp_path, stager_bin, dstagefs_bin):
    """A dataset and a configuration for running the entrypoints directly."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    data = {"d/a.bin": os.urandom(1 << 20), "b.txt": b"hello\n"}
    for k, v in data.items():
        (src / k).write_bytes(v)
    (src / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256(v).hexdigest()}  {k}\n" for k, v in data.items()))
    conf = tmp_path / "dstage.conf"
    conf.write_text(f"[cache]\ndir = {tmp_path}/cache\nsize = 64M\n"
                    f"[catalog]\npath = {tmp_path}/catalog.db\n"
                    f"[daemon]\nsocket = {tmp_path}/run/stager.sock\n")
    env = dict(os.environ, DSTAGE_CONFIG=str(conf), DSTAGE_STAGER=stager_bin,
               DSTAGE_DSTAGEFS=dstagefs_bin,
               DSTAGE_DAEMON_SOCKET=f"{tmp_path}/run/stager.sock",
               DSTAGE_MOUNT=str(tmp_path / "data"))
    env.pop("DSTAGE_S3_CREDENTIALS_FILE", None)
    return tmp_path, src, env


def stop_proc(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.mark.skipif(not ROOT, reason="needs root for the FUSE mount")
def test_k8s_entrypoints_run_directly(node_env, stager_bin):
    tmp, src, env = node_env
    procs = []
    try:
        procs.append(subprocess.Popen([K8S / "entrypoint", "stager"], env=env))
        wait_for(lambda: (tmp / "run" / "stager.sock").exists(), "socket")
        run(stager_bin, "add", "ds", f"file://{src}/", env=env)
        r = run(K8S / "stage-init", env=dict(env, DSTAGE_DATASETS="ds"),
                check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "all staged: ds" in r.stdout
        r = run(K8S / "stage-init", "nosuch", env=env, check=False)
        assert r.returncode == 5 and "staging 'nosuch' failed" in r.stderr
        procs.append(subprocess.Popen([K8S / "entrypoint", "dstagefs"],
                                      env=dict(env, DSTAGEFS_OPTS="")))
        wait_for(lambda: mounted(tmp / "data"), "the mount")
        got = (tmp / "data" / "datasets" / "ds" / "d" / "a.bin").read_bytes()
        assert got == (src / "d" / "a.bin").read_bytes()
        stats = (tmp / "data" / ".dstage" / "stats").read_text()
        assert re.search(r"(?m)^bytes_from_source 0$", stats), stats
        stop_proc(procs.pop())
        assert not mounted(tmp / "data"), "SIGTERM did not unmount"
    finally:
        for p in procs:
            stop_proc(p)
        if mounted(tmp / "data"):
            subprocess.run(["fusermount3", "-uz", str(tmp / "data")])


def test_k8s_entrypoint_refuses_loose_credentials(node_env):
    tmp, src, env = node_env
    creds = tmp / "credentials"
    creds.write_text("[default]\naws_access_key_id = a\n")
    creds.chmod(0o644)
    r = run(K8S / "entrypoint", "stager", check=False,
            env=dict(env, DSTAGE_S3_CREDENTIALS_FILE=str(creds)))
    assert r.returncode == 2 and "defaultMode: 0600" in r.stderr
    r = run(K8S / "entrypoint", "nonsense", check=False, env=env)
    assert r.returncode == 2 and "usage" in r.stderr
    r = run(K8S / "stage-init", check=False, env=env)
    assert r.returncode == 2 and "no datasets" in r.stderr
    r = run(K8S / "stage-init", "ds", check=False,
            env=dict(env, DSTAGE_SOCKET_WAIT="1"))
    assert r.returncode == 3 and "no stager daemon socket" in r.stderr


# ---------------------------------------------------------------- the .deb

@pytest.fixture(scope="module")
def deb(tmp_path_factory, build_dir):
    """The .deb CPack makes from the build under test, or $DSTAGE_DEB (the
    one packaging/build-deb made, to test the release package)."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb not installed")
    if os.environ.get("DSTAGE_DEB"):
        return Path(os.environ["DSTAGE_DEB"]).resolve()
    out = tmp_path_factory.mktemp("deb")
    run("cpack", "-G", "DEB", "-B", out, cwd=build_dir, timeout=300)
    debs = list(out.glob("dstage_*.deb"))
    assert len(debs) == 1
    return debs[0]


def deb_depends(deb):
    info = run("dpkg-deb", "-f", deb, "Depends").stdout
    return {d.strip().split()[0] for d in info.split(",")}


def test_deb_declares_every_library_it_loads(deb, tmp_path):
    deps = deb_depends(deb)
    run("dpkg-deb", "-x", deb, tmp_path)
    elfs = [tmp_path / "usr" / "bin" / "stager",
            tmp_path / "usr" / "bin" / "dstagefs",
            *(tmp_path / "usr").glob("lib*/**/libdstage.so.0.*")]
    # dstage-csi, when the package was built with gRPC (csi/)
    elfs += list((tmp_path / "usr" / "bin").glob("dstage-csi"))
    needed = set()
    for e in elfs:
        needed |= set(re.findall(r"\[(lib[^\]]+\.so[^\]]*)\]",
                                 run("readelf", "-d", e).stdout))
    needed.discard("libdstage.so.0")
    assert {"libcurl.so.4", "libsqlite3.so.0"} <= needed
    if not any(lib.startswith("libfuse3.so.") for lib in needed):
        # install-deps' libfuse 3.17, linked statically (docs/deployment.md):
        # its licence ships, and no libfuse package is required.
        doc = tmp_path / "usr" / "share" / "doc" / "dstage" / "libfuse"
        assert (doc / "LGPL2.txt").is_file() and (doc / "LICENSE").is_file()
        assert not {"libfuse3-3", "libfuse3-4"} & deps, deps
    cache = run("ldconfig", "-p").stdout
    for lib in sorted(needed):
        m = re.search(rf"\s{re.escape(lib)} \(libc6,x86-64[^)]*\) => (\S+)",
                      cache)
        assert m, f"{lib} not found by ldconfig on this host"
        owner = run("dpkg", "-S", os.path.realpath(m.group(1)),
                    check=False).stdout
        if not owner:
            owner = run("dpkg", "-S", m.group(1)).stdout
        pkg = owner.split(":")[0]
        base = run("dpkg-query", "-W", "-f", "${Essential}${Protected}",
                   pkg).stdout
        # Essential or protected packages (libgcc-s1, which sanitized builds
        # load) are in every Debian root, minbase included.
        assert pkg in deps or "yes" in base, \
            f"{lib} comes from {pkg}, not in Depends {deps}"
    assert "fuse3" in deps, "fusermount3 (for unmounting) comes from fuse3"
    ctl = run("dpkg-deb", "-I", deb).stdout
    assert "conffiles" in ctl and "postinst" in ctl


DEBOOTSTRAP_CACHE = Path(os.environ.get("DSTAGE_DEBOOTSTRAP_CACHE",
                                        "/var/tmp/dstage-debootstrap"))


def fresh_root(dest):
    """A fresh minimal Debian 12 root at dest: a pristine debootstrap
    (minbase) kept as a tarball, made once."""
    tarball = DEBOOTSTRAP_CACHE / "bookworm-minbase.tar"
    if not tarball.exists():
        DEBOOTSTRAP_CACHE.mkdir(parents=True, exist_ok=True)
        build = DEBOOTSTRAP_CACHE / "root.tmp"
        shutil.rmtree(build, ignore_errors=True)
        r = run("debootstrap", "--variant=minbase", "bookworm", build,
                "http://deb.debian.org/debian", check=False, timeout=900)
        if r.returncode != 0:
            shutil.rmtree(build, ignore_errors=True)
            pytest.skip("debootstrap failed (no mirror?): " + r.stderr[-500:])
        run("tar", "-C", build, "-cf", f"{tarball}.tmp", ".", timeout=300)
        os.rename(f"{tarball}.tmp", tarball)
        shutil.rmtree(build, ignore_errors=True)
    dest.mkdir()
    run("tar", "-C", dest, "-xf", tarball, timeout=300)


@pytest.mark.skipif(not ROOT or shutil.which("debootstrap") is None,
                    reason="needs root and debootstrap")
def test_deb_installs_on_fresh_debian_12_and_runs(deb, tmp_path):
    root = tmp_path / "root"
    fresh_root(root)
    mounts = []

    def bind(src, dst, *opts):
        (root / dst).mkdir(parents=True, exist_ok=True)
        run("mount", *opts, src, root / dst)
        mounts.append(root / dst)
        # Private: nothing done under the root reaches the host's mounts.
        run("mount", "--make-private", root / dst)
    try:
        bind("proc", "proc", "-t", "proc")
        # /dev alone, not recursive (/dev/fuse, /dev/null, /dev/urandom).
        bind("/dev", "dev", "--bind")
        shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
        for f in Path("/etc/apt/apt.conf.d").glob("99*"):
            shutil.copy(f, root / "etc" / "apt" / "apt.conf.d" / f.name)
        shutil.copy(deb, root / "tmp" / deb.name)

        def chroot(script, check=True, timeout=600):
            return run("chroot", root, "/bin/bash", "-euc", script,
                       check=check, timeout=timeout,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                            "DEBIAN_FRONTEND": "noninteractive",
                            "LC_ALL": "C.UTF-8"})
        r = chroot("apt-get update -q >/dev/null && apt-get install -y -q "
                   f"--no-install-recommends /tmp/{deb.name}", check=False)
        if r.returncode != 0 and "Could not resolve" in r.stdout + r.stderr:
            pytest.skip("the Debian mirror is not reachable")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        out = chroot("stager --help; dstagefs --help; dpkg -s dstage | "
                     "grep Status; getent group dstage; "
                     "ls /etc/dstage/dstage.conf").stdout
        assert "usage: stager" in out and "Mount the dstage namespace" in out
        assert "install ok installed" in out and "dstage:x:" in out
        # The demo's steps with the installed programs.
        demo = r"""
            w=/tmp/demo; mkdir -p $w/src/sub $w/data
            head -c 3000000 /dev/urandom >$w/src/sub/shard.tar
            echo hello >$w/src/a.txt
            (cd $w/src && sha256sum sub/shard.tar a.txt >SHA256SUMS)
            printf '[cache]\ndir = %s\nsize = 64M\n[catalog]\npath = %s\n[daemon]\nsocket = %s\n' \
                $w/cache $w/cat.db $w/s.sock >$w/c.conf
            export DSTAGE_CONFIG=$w/c.conf
            stager daemon >$w/daemon.log 2>&1 &
            for i in $(seq 100); do [ -S $w/s.sock ] && break; sleep 0.1; done
            stager add sample file://$w/src/
            stager stage sample --wait
            stager verify sample --cache
            dstagefs $w/data
            (cd $w/data/datasets/sample && sha256sum -c SHA256SUMS)
            grep '^bytes_from_source ' $w/data/.dstage/stats
            fusermount3 -u $w/data
            kill %1; wait || true
            echo DEMO-OK
        """
        r = chroot(demo, check=False, timeout=180)
        assert r.returncode == 0 and "DEMO-OK" in r.stdout, \
            r.stdout[-3000:] + r.stderr[-3000:]
        assert "sub/shard.tar: OK" in r.stdout
        assert "bytes_from_source 0" in r.stdout
    finally:
        data = root / "tmp" / "demo" / "data"
        if mounted(data):
            subprocess.run(["umount", "-l", str(data)])
        for m in reversed(mounts):
            subprocess.run(["umount", "-l", str(m)])
        # Never delete through a mount that is still there.
        if not any(mounted(m) for m in mounts):
            shutil.rmtree(root, ignore_errors=True)
