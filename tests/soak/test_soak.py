"""The soak's short variant (tests/soak/soak.py; docs/testing.md, "Soak").

Runs the soak for $DSTAGE_SOAK_SECONDS (default 150) with a kill -9 every
60 s (the daemon first, then the mount), against radosgw through the fault
proxy when $DSTAGE_RGW_ENV names a running one (file:// datasets only
otherwise). Needs root, /dev/fuse and fusermount3; the build in
$DSTAGE_BUILD_DIR (default build/). Fails with the soak's summary: the
failures, counts by kind and the processes' samples."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_soak_short(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the soak mounts dstagefs and kills it: needs root")
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        pytest.skip("no /dev/fuse or fusermount3 (apt-get install fuse3)")
    secs = int(os.environ.get("DSTAGE_SOAK_SECONDS", "150"))
    build = os.environ.get("DSTAGE_BUILD_DIR", "build")
    if not os.path.isabs(build):
        build = str(REPO / build)
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(REPO / "tests" / "soak" / "soak.py"),
           "--duration", str(secs), "--kill-every", "60", "--build", build,
           "--json", str(out)]
    if os.environ.get("DSTAGE_RGW_ENV"):
        cmd += ["--rgw-env", os.environ["DSTAGE_RGW_ENV"]]
    # Bounded: the soak's own deadline, its setup and its 120 s join.
    p = subprocess.run(cmd, capture_output=True, timeout=secs + 600)
    assert p.returncode == 0, (p.stdout.decode(errors="replace")[-6000:] +
                               p.stderr.decode(errors="replace")[-3000:])
