"""Integration tests of the stager daemon's connection caps across uids
(stager/daemon/daemon_conn.c; issue 42, finding 8): four non-root uids
holding their most connections each must not fill the daemon's socket.
The last --max-conns / 8 connections are kept for uids that hold none, so
a fifth uid still gets answered, and root (never counted) too; a uid past
its own share is refused with a message naming the limit."""
import json
import os
import select
import subprocess
import time

from test_stager import Stager, stager_dir  # noqa: F401 (a fixture)

# Run as a test uid: open n raw connections to the socket, wait a second
# for refusals, print {"held", "refused", "msgs"} and hold the rest.
HOLD = r'''
import json, select, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
conns = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    conns.append(s)
got, shut = {s: b"" for s in conns}, set()
end = time.monotonic() + 1.0
while time.monotonic() < end:
    live = [s for s in conns if s not in shut]
    r, _, _ = select.select(live, [], [], max(0, end - time.monotonic()))
    for s in r:
        b = s.recv(4096)
        got[s] += b
        if not b:
            shut.add(s)
refused = [got[s].decode(errors="replace") for s in conns
           if b"too many connections" in got[s]]
print(json.dumps({"held": n - len(refused), "refused": len(refused),
                  "msgs": sorted(set(refused))}), flush=True)
time.sleep(60)
'''


def holder(users, s, script, name, n):
    u = users.user(name)
    p = users.popen(u, ["/usr/bin/python3", script, s.sock, str(n)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    r, _, _ = select.select([p.stdout], [], [], 30)
    assert r, "no line from %s's holder within 30 s" % name
    line = p.stdout.readline()
    assert line, p.stderr.read()
    return u, p, json.loads(line)


def test_four_uids_cannot_fill_the_socket(tool, stager_dir, users):
    """Defaults (--max-conns 64, --max-conns-per-uid 16): uids A..D each
    try 17 connections; A is refused its 17th naming
    --max-conns-per-uid; together A..D hold no more than 56; a fifth uid's
    list is answered, and root's."""
    s = Stager(tool("stager"), stager_dir,
               args=["--idle-timeout", "60s"]).start()
    script = stager_dir / "hold.py"
    script.write_text(HOLD)
    os.chmod(script, 0o644)
    procs = []
    try:
        got = {}
        for name in ("ua", "ub", "uc", "ud"):
            u, p, got[name] = holder(users, s, script, name, 17)
            procs.append(p)
            if name == "ua":
                ua = u
        e = users.user("ue")
        p = users.run(e, [s.exe, "--config", s.cfg, "list"], env=s.env)
        assert p.returncode == 0, (got, p.stderr)
        t0 = time.monotonic()
        assert s.run("list").returncode == 0  # root
        assert time.monotonic() - t0 < 5
        assert sum(g["held"] for g in got.values()) <= 56, got
        assert got["ua"]["held"] == 16, got
        assert got["ua"]["refused"] == 1, got
        assert "uid %d has its most connections open, 16 (daemon " \
            "--max-conns-per-uid)" % users.uid(ua) in got["ua"]["msgs"][0], got
        assert any("kept for uids holding none" in m
                   for m in got["ud"]["msgs"]), got
    finally:
        for p in procs:
            p.kill()
            p.wait()
        s.stop()
