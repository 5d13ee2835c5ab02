"""A build without the CSI plugin (csi/, issue 43): DSTAGE_CSI=OFF, or AUTO
on a host without gRPC, configures the rest of dstage, says at configure
time that dstage-csi is left out, and has no dstage-csi target (nor its unit
test, nor its install rule); DSTAGE_CSI=ON without gRPC, or a value that is
not AUTO/ON/OFF, fails the configure naming what is missing.

Configure only, in a temporary tree (one fresh configure, then quick
reconfigures of the same tree: about 10 s on 2 cores). A host without gRPC
is made by a pkg-config search path holding every .pc file but gRPC's
(PKG_CONFIG_LIBDIR), and a grpc_cpp_plugin named that is not there. The
whole build of such a tree, and its unit tests, is scripts/test's "fallback
build" stage (-DDSTAGE_CSI=OFF), which checks that no dstage-csi comes out
of it.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LEFT_OUT = "the CSI plugin (dstage-csi) is left out"

pytestmark = pytest.mark.skipif(
    not shutil.which("cmake"), reason="cmake not installed")


def no_grpc_pc_dir(d):
    """A pkg-config directory of links to every .pc file pkg-config finds
    but grpc++'s and grpc's: this host as if libgrpc++-dev were missing."""
    d.mkdir()
    path = subprocess.run(["pkg-config", "--variable", "pc_path",
                           "pkg-config"], capture_output=True, text=True,
                          check=True).stdout.strip()
    for p in path.split(":"):
        for pc in sorted(Path(p).glob("*.pc")):
            if not pc.name.startswith("grpc") and not (d / pc.name).exists():
                (d / pc.name).symlink_to(pc)
    return d


def configure(tree, *args, pc_dir):
    env = dict(os.environ, CC=os.environ.get("CC", "gcc"),
               CXX=os.environ.get("CXX", "g++"), PKG_CONFIG_LIBDIR=str(pc_dir))
    return subprocess.run(["nice", "-n", "19", "cmake", "-S", str(REPO),
                           "-B", str(tree), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def targets(tree):
    r = subprocess.run(["cmake", "--build", str(tree), "--target", "help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def assert_left_out(tree, r):
    assert r.returncode == 0, r.stdout + r.stderr
    names = targets(tree)
    assert "dstage-csi" not in names and "test_csi_core" not in names
    install = (tree / "packaging" / "cmake_install.cmake").read_text()
    assert "dstage-csi" not in install          # nor its man page
    for t in ("dstagefs", "stager", "cachectl"):    # the rest is there
        assert t in names


def test_csi_off_and_without_grpc(tmp_path):
    pc = no_grpc_pc_dir(tmp_path / "pkgconfig")
    tree = tmp_path / "build-no-csi"
    r = configure(tree, "-DDSTAGE_CSI=OFF", pc_dir=pc)
    assert f"{LEFT_OUT}: DSTAGE_CSI=OFF" in r.stdout, r.stdout + r.stderr
    assert_left_out(tree, r)

    # AUTO (the default) on a host without gRPC: left out, saying what is
    # missing and how to say it is meant
    gone = tmp_path / "no-such" / "grpc_cpp_plugin"
    r = configure(tree, "-DDSTAGE_CSI=AUTO",
                  f"-DDSTAGE_GRPC_CPP_PLUGIN={gone}", pc_dir=pc)
    assert LEFT_OUT in r.stdout, r.stdout + r.stderr
    for word in ("libgrpc++-dev", f"DSTAGE_GRPC_CPP_PLUGIN={gone} is not "
                 "there", "-DDSTAGE_CSI=OFF"):
        assert word in r.stdout, (word, r.stdout)
    assert_left_out(tree, r)

    # ON there: the configure fails, naming the packages
    r = configure(tree, "-DDSTAGE_CSI=ON", pc_dir=pc)
    assert r.returncode != 0, r.stdout
    err = " ".join(r.stderr.split())
    assert "DSTAGE_CSI=ON but dstage-csi cannot be built" in err, err
    assert "libgrpc++-dev" in err and "protobuf-compiler-grpc" in err, err

    r = configure(tree, "-DDSTAGE_CSI=maybe", pc_dir=pc)
    assert r.returncode != 0, r.stdout
    err = " ".join(r.stderr.split())
    assert "DSTAGE_CSI=maybe: expected AUTO, ON or OFF" in err, err
