"""scripts/check-layers' source rule (rule 4): a private header (NAME_i.h)
is included only from its own folder. Run on a throwaway tree beside a
copy of the script, so the rule is seen to fire and to stay quiet."""
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tree(tmp_path, files):
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "check-layers", tmp_path / "scripts")
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (tmp_path / "build" / "lib").mkdir(parents=True)
    p = subprocess.run(["/usr/bin/python3", tmp_path / "scripts" /
                        "check-layers", tmp_path / "build"],
                       capture_output=True, text=True, timeout=60)
    return p.stdout


def test_private_header_from_another_room_is_refused(tmp_path):
    out = tree(tmp_path, {
        "lib/ckpt/ckpt_i.h": "",
        "lib/ckpt/ckpt.c": '#include "ckpt_i.h"\n',
        "lib/lifecycle/lifecycle_stage.c": '#include "ckpt/ckpt_i.h"\n',
        "fs/ckpt/dsfs_ckpt_i.h": "",
        "fs/dsfs.c": '#  include "ckpt/dsfs_ckpt_i.h"\n',
        "fs/ckpt/dsfs_ckpt.c": '#include "dsfs_ckpt_i.h"\n',
    })
    assert ("lib/lifecycle/lifecycle_stage.c includes ckpt/ckpt_i.h, "
            "private to lib/ckpt/") in out
    assert "fs/dsfs.c includes ckpt/dsfs_ckpt_i.h, private to fs/ckpt/" \
        in out
    # a room's own files, and its API headers from anywhere, are fine
    assert "lib/ckpt/ckpt.c includes" not in out
    assert "fs/ckpt/dsfs_ckpt.c includes" not in out


def test_api_header_of_a_room_is_allowed(tmp_path):
    out = tree(tmp_path, {
        "lib/ckpt/ckpt_stage.h": "",
        "lib/lifecycle/lifecycle_stage.c": '#include "ckpt/ckpt_stage.h"\n',
    })
    assert "includes" not in out
