"""Control bytes never reach the terminal from any column `stager` prints
(stager/client.c; issue 42, "guards proven on their own path"): a file://
source whose directory name holds ESC and CR, staged after its file was
removed, so that the job's error message holds them too. stage --wait,
verify --source, jobs, status, show, list and an error line on stderr
print them escaped as \\xHH. So do the commands that need no daemon:
`ls` of a store holding such a name, and `verify PATH` of a tree holding
one (its report lines)."""
import re

from test_stager import Stager, make_dataset, stager_dir  # noqa: F401

RAW = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")  # any control byte but \t \n


def raw_bytes(outs):
    """Each output holding a raw control byte, with the bytes around it."""
    bad = []
    for what, b in outs.items():
        m = RAW.search(b)
        if m:
            bad.append("%s: %r" % (what, b[max(0, m.start() - 40):
                                           m.start() + 40]))
    return bad


def test_control_bytes_escaped_in_every_column(tool, stager_dir):
    s = Stager(tool("stager"), stager_dir).start()
    try:
        src = stager_dir / "src\x1b[2J\rhidden"
        make_dataset(src, {"a.bin": b"a" * 4096})
        s.run("add", "ds", "file://%s/" % src, check=True)
        (src / "a.bin").unlink()  # staging fails naming its path
        outs = {}
        p = s.run("stage", "ds", "--wait")
        assert p.returncode != 0
        outs["stage --wait"] = p.stdout + p.stderr
        p = s.run("verify", "ds", "--source")
        outs["verify --source"] = p.stdout + p.stderr
        jobs = s.json("jobs")
        assert any("\x1b" in j.get("error", "") for j in jobs), jobs
        for args in (["jobs"], ["status", str(jobs[0]["job"])],
                     ["status"], ["show", "ds"], ["list"]):
            p = s.run(*args)
            assert p.returncode == 0, (args, p.stderr)
            outs[" ".join(args)] = p.stdout + p.stderr
        p = s.run("add", "ds2", "file://%s/gone\x1b[2J/" % stager_dir)
        assert p.returncode != 0
        outs["add's error"] = p.stdout + p.stderr
        bad = raw_bytes(outs)
        assert not bad, "raw control bytes printed:\n" + "\n".join(bad)
        assert b"\\x1b" in outs["show ds"], outs["show ds"]
    finally:
        s.stop()


def test_control_bytes_escaped_without_the_daemon(tool, stager_dir,
                                                  tmp_path):
    """`stager ls URL` prints a store's keys, `stager verify PATH` (a tree
    read through an overlay mount) its report lines naming files: names
    with ESC, CR and BEL come out as \\xHH."""
    from test_overlay import Overlay, adhoc
    s = Stager(tool("stager"), stager_dir)
    src = stager_dir / "tree"
    make_dataset(src, {"ok.bin": b"o" * 100, "x\x1b[2J\rbad.bin": b"b" * 100})
    outs = {}
    p = s.run("ls", "file://%s/" % src)
    assert p.returncode == 0, p.stderr
    assert b"\\x1b" in p.stdout, p.stdout
    outs["ls"] = p.stdout + p.stderr
    (tmp_path / "ov").mkdir()
    ov = Overlay(tool, tmp_path / "ov")
    try:
        ds = ov.pfs / "ds"
        make_dataset(ds, {"ok.bin": b"o" * 100,
                          "y\x1b]0;t\x07.bin": b"y" * 10})
        # changed after SHA256SUMS was written: named in verify's report
        (ds / "y\x1b]0;t\x07.bin").write_bytes(b"z" * 10)
        ov.start()
        p = adhoc(ov, "verify", ds)
        outs["verify PATH"] = p.stdout + p.stderr
        assert b"\\x1b" in outs["verify PATH"], outs["verify PATH"]
    finally:
        ov.close()
    bad = raw_bytes(outs)
    assert not bad, "raw control bytes printed:\n" + "\n".join(bad)
