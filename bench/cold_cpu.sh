#!/bin/bash
# bench/cold_cpu.sh [BUILD_DIR]: what a cold read costs in CPU, per GiB.
#
# Starts a throwaway radosgw (scripts/rgw), uploads one 1 GiB object, then
# twice each, page cache dropped before every read:
#   - curl, 8 parallel ranged GETs of 128 MiB (bench/run's cold limit);
#   - dd bs=4M of the object through a fresh dstagefs mount, empty cache;
# and prints MB/s and the CPU seconds (utime + stime from /proc/PID/stat)
# that radosgw + ceph-osd and dstagefs spent per GiB moved, and dstagefs's
# page faults over the read (fill buffers on huge pages: thousands, where
# 4 KiB pages took ~50,000 a GiB). Give it two builds' directories in turn
# to compare them. docs/cache.md ("Bench") explains the figures. Needs
# root (drop_caches, FUSE) and about 4 GiB of RAM.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
work=$(mktemp -d /tmp/dstage-cold-cpu.XXXXXX)
mnt=$work/mnt
cleanup() {
	fusermount3 -u "$mnt" 2>/dev/null || true
	if [ -n "${daemon:-}" ]; then kill "$daemon" 2>/dev/null || true; fi
	"$repo/scripts/rgw" stop "$work/rgw" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

"$repo/scripts/rgw" start "$work/rgw" >/dev/null
# shellcheck disable=SC1091
. "$work/rgw/env"
size=$((1 << 30))
head -c $size /dev/urandom >"$work/obj"
aws --endpoint-url "$AWS_ENDPOINT_URL" s3 mb s3://cpu >/dev/null
aws --endpoint-url "$AWS_ENDPOINT_URL" s3 cp "$work/obj" s3://cpu/d/obj \
	--only-show-errors
rm "$work/obj"

cat >"$work/dstage.conf" <<CONF
[cache]
dir = $work/cache
size = 4G
[catalog]
path = $work/catalog.db
[daemon]
socket = $work/stager.sock
[log]
level = warn
CONF
export DSTAGE_CONFIG=$work/dstage.conf
"$build/stager/stager" daemon >"$work/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 50); do [ -S "$work/stager.sock" ] && break; sleep 0.1; done
"$build/stager/stager" add d s3://cpu/d/ >/dev/null
mkdir -p "$mnt"

tck=$(getconf CLK_TCK)
cpu() { # cpu PATTERN: clock ticks used so far by the processes matching it
	local t=0 p
	for p in $(pgrep -f "$1"); do
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo $t
}
faults() { # faults PATTERN: page faults (minor + major) of the processes
	local t=0 p
	for p in $(pgrep -f "$1"); do
		t=$((t + $(awk '{print $10 + $12}' "/proc/$p/stat")))
	done
	echo $t
}
per_gib() { echo "scale=2; ($2 - $1) * 1073741824 / $tck / $size" | bc; }
mbps() { echo "scale=0; $1 / 1000000 / ($3 - $2)" | bc; }

for run in 1 2; do
	sync
	echo 3 >/proc/sys/vm/drop_caches
	r0=$(cpu "radosgw|ceph-osd")
	t0=$(date +%s.%N)
	part=$((size / 8))
	pids=()
	for i in 0 1 2 3 4 5 6 7; do
		curl -sf --aws-sigv4 "aws:amz:us-east-1:s3" \
			--user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
			-H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
			-r $((i * part))-$(((i + 1) * part - 1)) \
			"$AWS_ENDPOINT_URL/cpu/d/obj" -o /dev/null &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p"; done
	t1=$(date +%s.%N)
	r1=$(cpu "radosgw|ceph-osd")
	echo "run $run curl 8 x 128 MiB: $(mbps $size "$t0" "$t1") MB/s," \
		"radosgw+osd $(per_gib "$r0" "$r1") cpu-s/GiB"

	rm -rf "$work/cache"
	"$build/fs/dstagefs" "$mnt"
	sync
	echo 3 >/proc/sys/vm/drop_caches
	r0=$(cpu "radosgw|ceph-osd")
	d0=$(cpu "dstagefs $mnt")
	f0=$(faults "dstagefs $mnt")
	t0=$(date +%s.%N)
	dd if="$mnt/datasets/d/obj" of=/dev/null bs=4M 2>/dev/null
	t1=$(date +%s.%N)
	r1=$(cpu "radosgw|ceph-osd")
	d1=$(cpu "dstagefs $mnt")
	f1=$(faults "dstagefs $mnt")
	fusermount3 -u "$mnt"
	echo "run $run dstagefs cold dd: $(mbps $size "$t0" "$t1") MB/s," \
		"radosgw+osd $(per_gib "$r0" "$r1") cpu-s/GiB," \
		"dstagefs $(per_gib "$d0" "$d1") cpu-s/GiB," \
		"$((f1 - f0)) page faults"
done
