#!/bin/bash
# bench/open_ab.sh BUILD_A BUILD_B: where a small file's time goes, by
# build: two dstagefs mounts over one staged cache, read in turn by
# bench/open_lat (one reader: stat, open, read, close, in microseconds).
#
# Writes FILES small files (default 6,000 of 1-150 KB) and stages them with
# BUILD_B's stager, then mounts BUILD_A's and BUILD_B's dstagefs over the
# same cache (each under RLIMIT_NOFILE NOFILE, default 768: an open-object
# table of 128, as a dataset far larger than the table would find it; 0
# keeps the shell's), reads every file once through each (their first
# opens), then ROUNDS times (default 3), for A then B: page cache dropped
# (DROP=3, the default: dentries and inodes too; DROP=1: the data only, the
# second epoch of a job whose names stayed in memory), every file read
# through the mount. Prints open_lat's line for each read and B's cache
# counters (cache_passthrough_remembered: opens the whole-object memo
# answered). Compare figures of one round: the disk here swings from
# minute to minute. Needs root (drop_caches, FUSE passthrough).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/conf.sh
. "$repo/bench/conf.sh"
if [ $# -ne 2 ]; then
	echo "usage: bench/open_ab.sh BUILD_A BUILD_B" >&2
	exit 2
fi
a=$(cd "$1" && pwd) b=$(cd "$2" && pwd)
files=${FILES:-6000} rounds=${ROUNDS:-3} drop=${DROP:-3}
nofile=${NOFILE:-768}
work=$(mktemp -d /var/tmp/dstage-open-ab.XXXXXX)
cleanup() {
	for m in A B; do fusermount3 -u "$work/m$m" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

python3 - "$work/src" "$files" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rnd = random.Random(17)
for i in range(n):
    p = os.path.join(root, f"d{i % 10}", f"f{i:06d}")
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(rnd.randbytes(rnd.randint(1000, 150000)))
PY
bench_conf "$work" 8G
export DSTAGE_CONFIG=$work/dstage.conf
bench_stage "$b" "$work"
(cd "$work/src" && find . -type f | sort | sed 's|^\./|datasets/d/|') \
	>"$work/list"

limit=()
[ "$nofile" != 0 ] && limit=(prlimit "--nofile=$nofile:$nofile")
mkdir "$work/mA" "$work/mB"
"${limit[@]}" "$a/fs/dstagefs" "$work/mA"
"${limit[@]}" "$b/fs/dstagefs" "$work/mB"
lat() { "$b/bench/open_lat" "$work/m$1" <"$work/list"; }
for m in A B; do lat $m >/dev/null; done
for r in $(seq "$rounds"); do
	for m in A B; do
		sync
		echo "$drop" >/proc/sys/vm/drop_caches
		echo "round $r $m ($([ $m = A ] && echo "$a" || echo "$b")): $(lat $m)"
	done
done
grep -E '^cache_passthrough_remembered|^fs_passthrough_opens' \
	"$work/mB/.dstage/stats" || true
