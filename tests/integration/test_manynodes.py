"""Many nodes, one store (issue 18): start jitter for scheduled staging
(`stager stage --jitter`, the Slurm prolog's DSTAGE_STAGE_JITTER) and eight
independent "nodes" on this machine (each its own cache, catalog, socket,
stager daemon and <cache.dir>/ratelimit) staging one dataset from radosgw
through the counting fault proxy: every node verifies, the request rate the
proxy sees stays under the nodes' combined limit, and the measurement
agrees with bench/cluster_sim.py's prediction for 8 nodes."""
import hashlib
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_stager import Stager, data, make_dataset

ROOT = Path(__file__).resolve().parents[2]
PROLOG = ROOT / "packaging" / "slurm" / "prolog"
JITTER_LINE = re.compile(
    rb"stager: start jitter: waiting (\d+)\.(\d{3}) s of at most (\d+) s")


def chosen_jitter(stderr):
    """The delay (s) and bound (s) a `stage --jitter` said it waits."""
    m = JITTER_LINE.search(stderr)
    assert m, stderr
    return int(m.group(1)) + int(m.group(2)) / 1000, int(m.group(3))


def test_stage_jitter_waits_a_bounded_random_time(tool, tmp_path):
    os.chmod(tmp_path, 0o755)
    make_dataset(tmp_path / "src", {"a.bin": data(1, 100000)})
    s = Stager(tool("stager"), tmp_path).start()
    try:
        s.run("add", "ds", "file://%s/src/" % tmp_path, check=True)
        seen = []
        for _ in range(4):
            t0 = time.monotonic()
            p = s.run("stage", "ds", "--wait", "--jitter", "1", check=True)
            took = time.monotonic() - t0
            delay, bound = chosen_jitter(p.stderr)
            assert bound == 1 and 0 <= delay <= 1, p.stderr
            # the wait was applied before the stage (and the stage done)
            assert took >= delay - 0.005, (took, delay)
            seen.append(delay)
        # random: four draws from 0-1000 ms are not all the same
        assert len(set(seen)) > 1, seen
        # no jitter without the option; out of range refused
        p = s.run("stage", "ds", "--wait", check=True)
        assert b"start jitter" not in p.stderr
        p = s.run("stage", "ds", "--jitter", "86401")
        assert p.returncode == 2 and b"--jitter 86401" in p.stderr
    finally:
        s.stop()


def fake_stager(path, log):
    """A stager stand-in for the prolog: records its arguments, says a jitter
    like the real one."""
    path.write_text(
        "#!/bin/bash\n"
        "echo \"$*\" >> %s\n"
        "for a in \"$@\"; do [ \"$a\" = --jitter ] && "
        "echo 'stager: start jitter: waiting 0.123 s of at most 7 s "
        "(--jitter)' >&2; done\n"
        "exit 0\n" % log)
    path.chmod(0o755)


@pytest.mark.parametrize("jitter,first", [("7", "--jitter 7"), ("0", None),
                                          ("junk", None)])
def test_prolog_jitters_only_the_first_stage(tmp_path, jitter, first):
    log = tmp_path / "calls"
    fake_stager(tmp_path / "stager", log)
    env = dict(os.environ, SLURM_JOB_ID="42",
               SLURM_JOB_COMMENT="dstage:ds1,ds2",
               DSTAGE_STAGER=str(tmp_path / "stager"),
               DSTAGE_SLURM_STATE=str(tmp_path / "state"),
               DSTAGE_STAGE_JITTER=jitter)
    p = subprocess.run(["bash", str(PROLOG)], env=env, capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2, calls
    assert calls[0].startswith("stage ds1 --wait")
    assert calls[1] == "stage ds2 --wait"
    if first:
        assert calls[0] == "stage ds1 --wait " + first
        assert b"start jitter: waiting 0.123 s" in p.stderr
    else:
        assert calls[0] == "stage ds1 --wait"
    if jitter == "junk":
        assert b"DSTAGE_STAGE_JITTER='junk'" in p.stderr
