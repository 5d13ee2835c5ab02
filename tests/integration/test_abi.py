"""libdstage.so exports the public API only (lib/libdstage.map): every
function the headers of include/dstage/ declare, and nothing of the internal
modules (store backends, SigV4, XML/INI parsers, io_uring, string helpers)."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "lib" / "libdstage.map"
INTERNAL = ("s3req_", "s3store_", "s3xml_", "sigv4_", "strutil_", "uring_",
            "inifile_", "creds_", "filestore_")
# a declaration: a return type, then NAME( at the start of a line's words
DECL = re.compile(r"^(?!static|#|\s|typedef|struct \w+ \{)[A-Za-z_][\w \*]*?"
                  r"\b([a-z][a-z0-9_]*)\(", re.M)


@pytest.fixture(scope="module")
def exported(build_dir):
    so = Path(build_dir) / "lib" / "libdstage.so"
    if not so.exists():
        pytest.skip("no libdstage.so in this build (DSTAGE_SHARED=OFF)")
    out = subprocess.run(["nm", "-D", "--defined-only", str(so)],
                         capture_output=True, text=True, check=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] != "A":
            syms.add(parts[2].split("@")[0])
    return syms


def map_prefixes():
    return [g.rstrip("*") for g in re.findall(r"^\s+([a-z0-9_]+_\*);",
                                              MAP.read_text(), re.M)]


def declared():
    names = set()
    for h in sorted((ROOT / "include" / "dstage").glob("*.h")):
        text = re.sub(r"/\*.*?\*/", "", h.read_text(), flags=re.S)
        names.update(DECL.findall(text))
    return names


def test_only_public_prefixes_are_exported(exported):
    prefixes = tuple(map_prefixes())
    assert prefixes
    stray = sorted(s for s in exported if not s.startswith(prefixes))
    assert not stray, stray
    internal = sorted(s for s in exported if s.startswith(INTERNAL))
    assert not internal, internal


def test_every_public_function_is_exported(exported):
    names = declared()
    assert len(names) > 100, len(names)
    missing = sorted(names - exported)
    assert not missing, "declared in include/dstage/ but not exported " \
        "(add the module's prefix to lib/libdstage.map): %s" % missing
