"""bench/benchlib.py: what the single-purpose bench scripts share (sizes on
the command line, a radosgw to run against)."""
import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_size(s):
    """'4M', '1G', '512K' or plain bytes."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult \
        else int(s)


def rgw_env(tmp):
    """(environment, rgw dir to stop or None): the radosgw named by RGW_DIR
    and AWS_ENDPOINT_URL if both are set, else a new one under tmp
    (scripts/rgw), its env.json values added to the environment."""
    if os.environ.get("RGW_DIR") and os.environ.get("AWS_ENDPOINT_URL"):
        return dict(os.environ), None
    d = os.path.join(tmp, "rgw")
    subprocess.run([os.path.join(REPO, "scripts", "rgw"), "start", d],
                   check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(d, "env.json")) as f:
        info = json.load(f)
    env = dict(os.environ, **{k: str(v) for k, v in info.items()
                              if not isinstance(v, list)})
    return env, d
