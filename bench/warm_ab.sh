#!/bin/bash
# bench/warm_ab.sh [BUILD_DIR...]: the warm read through dstagefs, by build,
# interleaved with dd of the same cache files.
#
# Stages FILES x SIZE_MB MiB (default 4 x 512) from a file:// source with
# the first build's stager, then ROUNDS times (default 3), page cache
# dropped before each read:
#   - for each build: dd bs=4M of every file through a fresh dstagefs mount
#     (a fresh reader: blocks checked in place, then spliced), then, in the
#     same mount, caches dropped again, a second pass (blocks already
#     verified by this process);
#   - dd bs=4M of the cache files themselves (the limit);
# and prints MB/s for each, with dstagefs's CPU seconds per GiB (utime +
# stime, /proc/PID/stat) over the fresh read. The disk under the cache
# swings from minute to minute here, hence the interleaving: compare
# figures of one round. docs/cache.md cites its runs. Needs root
# (drop_caches, FUSE), SIZE_MB x FILES of disk twice over. Prints the
# extents (filefrag) of the staged cache files and of their sources first.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/conf.sh
. "$repo/bench/conf.sh"
builds=()
for b in "${@:-$repo/build}"; do builds+=("$(cd "$b" && pwd)"); done
files=${FILES:-4} size_mb=${SIZE_MB:-512} rounds=${ROUNDS:-3}
work=$(mktemp -d /var/tmp/dstage-warm-ab.XXXXXX)
mnt=$work/mnt
cleanup() {
	fusermount3 -u "$mnt" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/src" "$mnt"
for i in $(seq "$files"); do
	head -c $((size_mb << 20)) /dev/urandom >"$work/src/f$i"
done
# Room for four times the data: a stage allocates an object's room in one
# piece only while twice its size is free below the high mark (docs/cache.md)
bench_conf "$work" "$((files * size_mb * 4))M"
export DSTAGE_CONFIG=$work/dstage.conf
bench_stage "${builds[0]}" "$work"
# How the stage laid the files out (docs/cache.md: one piece each).
extents() { filefrag "$@" 2>/dev/null | awk '{n += $2} END {print n}'; }
echo "extents: cache files $(extents $(find "$work/cache/objects" -type f \
	! -name '*.meta')), source files $(extents "$work"/src/f*)"

total=$((files * size_mb << 20))
tck=$(getconf CLK_TCK)
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
mbps() { echo "scale=0; $total / 1000000 / ($2 - $1)" | bc; }
read_all() { # read_all DIR: dd every file of the dataset
	for i in $(seq "$files"); do
		dd if="$1/f$i" of=/dev/null bs=4M 2>/dev/null
	done
}
for r in $(seq "$rounds"); do
	for b in "${builds[@]}"; do
		"$b/fs/dstagefs" "$mnt"
		pid=$(pgrep -n -f "dstagefs $mnt")
		drop
		c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
		t0=$(now)
		read_all "$mnt/datasets/d"
		t1=$(now)
		c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
		drop
		t2=$(now)
		read_all "$mnt/datasets/d"
		t3=$(now)
		fusermount3 -u "$mnt"
		cpu=$(echo "scale=2; ($c1 - $c0) * 1073741824 / $tck / $total" | bc)
		echo "round $r $b: fresh mount $(mbps "$t0" "$t1") MB/s" \
			"(dstagefs $cpu cpu-s/GiB), second pass" \
			"$(mbps "$t2" "$t3") MB/s"
	done
	drop
	t0=$(now)
	find "$work/cache/objects" -type f -size +1M \
		-exec dd if={} of=/dev/null bs=4M status=none \;
	t1=$(now)
	echo "round $r dd of the cache files: $(mbps "$t0" "$t1") MB/s"
done
