"""libdstage.so exports the public API only (lib/libdstage.map, a list of
names): every function the headers of include/dstage/ declare, and nothing
else: not the internal modules (store backends, SigV4, XML/INI parsers,
io_uring, string helpers), nor the private functions of public modules
(cache_obj_range, ckpt_put, catalog_exec, push_exec_run)."""
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


def map_names():
    """The names in the map's global: section (comments dropped)."""
    text = re.sub(r"/\*.*?\*/", "", MAP.read_text(), flags=re.S)
    glob = text.split("global:", 1)[1].split("local:", 1)[0]
    return re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*;", glob, re.M)


def declared():
    names = set()
    for h in sorted((ROOT / "include" / "dstage").glob("*.h")):
        text = re.sub(r"/\*.*?\*/", "", h.read_text(), flags=re.S)
        names.update(DECL.findall(text))
    return names


def test_map_lists_names_not_patterns():
    text = re.sub(r"/\*.*?\*/", "", MAP.read_text(), flags=re.S)
    glob = text.split("global:", 1)[1].split("local:", 1)[0]
    assert "*" not in glob and "?" not in glob, \
        "lib/libdstage.map exports by pattern: list each name"
    names = map_names()
    assert len(names) == len(set(names)), "a name listed twice"


def test_map_is_the_public_headers():
    names = declared()
    listed = set(map_names())
    assert len(names) > 100, len(names)
    assert listed == names, (
        "lib/libdstage.map and include/dstage/ differ: in the headers only "
        "%s; in the map only %s" % (sorted(names - listed),
                                    sorted(listed - names)))


def test_only_public_functions_are_exported(exported):
    stray = sorted(exported - declared())
    assert not stray, "exported but not declared in include/dstage/: %s" % \
        stray
    internal = sorted(s for s in exported if s.startswith(INTERNAL))
    assert not internal, internal


def test_every_public_function_is_exported(exported):
    names = declared()
    assert len(names) > 100, len(names)
    missing = sorted(names - exported)
    assert not missing, "declared in include/dstage/ but not exported " \
        "(list it in lib/libdstage.map): %s" % missing
