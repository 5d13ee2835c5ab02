#!/bin/bash
# bench/cold_cpu.sh [BUILD_DIR] [bench/run options]: what a cold byte costs
# in CPU, per GiB.
# bench/cold_cpu.sh --ab BASE_BUILD NEW_BUILD [PAIRS]: two builds compared
# on a file:// source, interleaved (docs/cache.md, "What a cold byte costs").
#
# The by-hand version of this script is folded into bench/run (issue 17):
# every cold and stage row there carries CPU-seconds per GiB (utime + stime
# from /proc/PID/stat of dstagefs + the stager daemon, of curl for the
# limit, and of the store) and dstagefs's page faults per GiB. This runs
# just those rows, quick-sized, without peers:
#   dstage    cold read and stage against radosgw, the store on its own
#             cores (bench/pinning.py), with curl's 8 ranged GETs as limit;
#   shared    the same with store and client sharing every core;
#   file      cold read and stage from a file:// source on tmpfs, limit the
#             cache disk's O_DIRECT write, alternated.
# Give it two builds' directories in turn to compare them. docs/cache.md
# ("Bench") explains the figures. Needs root (drop_caches, FUSE).
# Extra options go to bench/run (e.g. --rgw DIR to use a running radosgw).
#
# --ab: PAIRS rounds (default 3), each running base then new for
#   cold    a 1 GiB object through a fresh dstagefs (`dd bs=4M`), cache
#           empty, page cache dropped: dstagefs's CPU-s/GiB;
#   steady  the same after a 384 MiB object was read through that mount
#           first (its fill buffers are then faulted in: the first-touch
#           zeroing of a fresh process is not counted);
#   stage   `stager stage` of the 1 GiB object: the daemon's CPU-s/GiB;
#   stage2  the same after the daemon staged the 384 MiB object first;
# then SHA-256's own cost (`openssl speed -evp sha256`, 8 MiB buffers).
# AB_NEW_S3="KEY = VALUE[; KEY = VALUE...]": settings of the [s3] section
#   given to NEW's runs alone (the same build twice, one setting apart:
#   AB_NEW_S3="max_inflight = 1" bench/cold_cpu.sh --ab build build).
# Source: file:// on /dev/shm (faster than the cache disk). Load from other
# work moves every figure: read each pair, not one run.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

ab_conf() { # DIR [S3]: a fresh config, cache and catalog under DIR;
	# S3: more [s3] settings, ';'-separated
	local s3=${2:-}
	s3=${s3//;/$'\n'}
	cat >"$1/dstage.conf" <<CONF
[cache]
dir = $1/cache
size = 16G
block_size = 4M
[catalog]
path = $1/catalog.db
[daemon]
socket = $1/stager.sock
[s3]
endpoint = http://127.0.0.1:9
region = us-east-1
$s3
[log]
level = warn
CONF
}

ab_cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }

ab_wait() { # COUNT TEST...: up to COUNT tenths of a second for test
	local n=$1
	shift
	while ! "$@" && [ "$n" -gt 0 ]; do
		sleep 0.1
		n=$((n - 1))
	done
	"$@"
}

ab_one() { # BUILD MODE SRC (one/, warm/) [S3]: prints "MODE CPU-s/GiB MB/s"
	local build=$1 mode=$2 src=$3 w dpid fpid c0 c1 t0 t1 size pid
	w=$(mktemp -d /tmp/dstage-cold-ab.XXXXXX)
	ab_conf "$w" "${4:-}"
	"$build/stager/stager" --config "$w/dstage.conf" daemon >"$w/daemon.log" 2>&1 &
	dpid=$!
	ab_wait 100 test -S "$w/stager.sock"
	"$build/stager/stager" --config "$w/dstage.conf" add f "file://$src/one/" >/dev/null
	"$build/stager/stager" --config "$w/dstage.conf" add w "file://$src/warm/" >/dev/null
	size=$(stat -c %s "$src/one/blob.bin")
	if [ "${mode#stage}" != "$mode" ]; then
		pid=$dpid
		sync
		echo 3 >/proc/sys/vm/drop_caches
		if [ "$mode" = stage2 ]; then
			"$build/stager/stager" --config "$w/dstage.conf" stage w --wait >/dev/null
		fi
		c0=$(ab_cpu $pid)
		t0=$(date +%s.%N)
		"$build/stager/stager" --config "$w/dstage.conf" stage f --wait >/dev/null
	else
		mkdir "$w/mnt"
		"$build/fs/dstagefs" --config "$w/dstage.conf" -f "$w/mnt" >"$w/fs.log" 2>&1 &
		fpid=$!
		pid=$fpid
		ab_wait 100 test -e "$w/mnt/datasets/f/blob.bin"
		sync
		echo 3 >/proc/sys/vm/drop_caches
		if [ "$mode" = steady ]; then
			dd if="$w/mnt/datasets/w/warm.bin" of=/dev/null bs=4M status=none
		fi
		c0=$(ab_cpu $pid)
		t0=$(date +%s.%N)
		dd if="$w/mnt/datasets/f/blob.bin" of=/dev/null bs=4M status=none
	fi
	t1=$(date +%s.%N)
	c1=$(ab_cpu $pid)
	if [ "$pid" != "$dpid" ]; then
		fusermount3 -u "$w/mnt"
		wait "$fpid" || true
	fi
	kill "$dpid"
	wait "$dpid" || true
	rm -rf "$w"
	awk -v m="$mode" -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" \
		-v s="$size" -v t0="$t0" -v t1="$t1" 'BEGIN {
		printf "%-6s %.2f CPU-s/GiB %5.0f MB/s\n", m,
			c / hz / (s / 2^30), s / (t1 - t0) / 1e6 }'
}

ab() { # BASE NEW PAIRS
	local base new pairs src i m b d s3
	base=$(cd "$1" && pwd)
	new=$(cd "$2" && pwd)
	pairs=${3:-3}
	src=$(mktemp -d /dev/shm/dstage-cold-ab.XXXXXX)
	AB_SRC=$src
	trap 'rm -rf "$AB_SRC"' EXIT
	mkdir "$src/one" "$src/warm"
	head -c $((1 << 30)) /dev/urandom >"$src/one/blob.bin"
	head -c $((384 << 20)) /dev/urandom >"$src/warm/warm.bin"
	for i in $(seq "$pairs"); do
		for m in cold steady stage stage2; do
			for b in base new; do
				if [ $b = base ]; then d=$base s3=; else d=$new s3=${AB_NEW_S3:-}; fi
				echo "pair $i $b $(ab_one "$d" $m "$src" "$s3")"
			done
		done
		openssl speed -evp sha256 -seconds 2 -bytes 8388608 2>/dev/null |
			awk -v i="$i" '/^sha256/ { v = $2; sub("k", "", v);
			printf "pair %s sha256 %.2f CPU-s/GiB (%.2f GB/s)\n", i,
				2^30 / (v * 1e3), v / 1e6 }'
	done
}

if [ "${1:-}" = --ab ]; then
	shift
	[ $# -ge 2 ] || { echo "usage: $0 --ab BASE_BUILD NEW_BUILD [PAIRS]" >&2; exit 2; }
	ab "$@"
	exit 0
fi
build=$(cd "${1:-$repo/build}" && pwd)
[ $# -gt 0 ] && shift
DSTAGE_BUILD_DIR=$build exec "$repo/bench/run" --quick --no-peers \
	--rows dstage,shared,file --out "${TMPDIR:-/tmp}/dstage-cold-cpu" "$@"
