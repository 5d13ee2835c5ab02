#!/bin/bash
# bench/cold_floor.sh [BUILD_DIR]: what a cold byte costs dstagefs in CPU,
# beside the FUSE floor: the same bytes served by a FUSE daemon that does
# nothing but pread them.
#
# One SIZE_MB (default 1024) MiB file on tmpfs (/dev/shm, faster than any
# disk here: the client side's own cost), read with `dd bs=1M`, page cache
# dropped before each read, ROUNDS times (default 3), alternately through
#   dstagefs   a fresh mount of a file:// dataset of it, the block cache
#              empty (cold: every byte fetched, hashed, written O_DIRECT
#              into the cache, replied to the kernel);
#   floor      libfuse's passthrough_hp --nopassthrough over the tmpfs
#              directory (every read a FUSE request answered by a pread:
#              the reply copy and the requests, nothing else);
# and prints each one's MB/s and daemon CPU seconds per GiB (utime + stime,
# /proc/PID/stat), and dstagefs's share of the floor. PERF=1 also records
# dstagefs in the last round (perf record -g) and prints its top symbols:
# where a cold byte's CPU goes (bench/results/history/issue31-*.md). passthrough_hp is the
# build's libfuse's ($DSTAGE_PASSTHROUGH_HP overrides). Needs root
# (drop_caches, FUSE) and SIZE_MB of memory for the file.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/conf.sh
. "$repo/bench/conf.sh"
build=$(cd "${1:-$repo/build}" && pwd)
hp=${DSTAGE_PASSTHROUGH_HP:-/opt/dstage/libfuse/bin/passthrough_hp}
size_mb=${SIZE_MB:-1024} rounds=${ROUNDS:-3}
[ -x "$hp" ] || { echo "cold_floor: $hp not found (scripts/install-deps)" >&2; exit 2; }
work=$(mktemp -d /var/tmp/dstage-cold-floor.XXXXXX)
src=$(mktemp -d /dev/shm/dstage-cold-floor.XXXXXX)
chmod 0755 "$src"
daemon=
cleanup() {
	for m in "$work"/mnt*; do fusermount3 -u "$m" 2>/dev/null || true; done
	[ -z "$daemon" ] || kill "$daemon" 2>/dev/null || true
	rm -rf "$work" "$src"
}
trap cleanup EXIT
head -c $((size_mb << 20)) /dev/urandom >"$src/big"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
# read PID FILE LABEL: dd the file, print MB/s and PID's CPU-s/GiB
read_one() {
	local t0 t1 s e mbs cpu
	sync
	echo 3 >/proc/sys/vm/drop_caches
	t0=$(cpu_ticks "$1")
	s=$(date +%s%N)
	dd if="$2" of=/dev/null bs=1M status=none
	e=$(date +%s%N)
	t1=$(cpu_ticks "$1")
	mbs=$(((size_mb << 20) * 1000 / (e - s)))
	cpu=$(echo "scale=2; ($t1 - $t0) / $hz * 1024 / $size_mb" | bc)
	printf '%-9s %6s MB/s  %5s CPU-s/GiB\n' "$3" "$mbs" "$cpu" >&2
	echo "$cpu"
}

mkdir "$work/mnt-floor"
"$hp" --foreground --nopassthrough "$src" "$work/mnt-floor" >/dev/null 2>&1 &
floor=$!
for _ in $(seq 100); do [ -e "$work/mnt-floor/big" ] && break; sleep 0.1; done

# fresh R: a stager daemon, an empty cache and a dstagefs mount of their
# own under $work/rR and $work/mntR; sets pid (dstagefs) and daemon
fresh() {
	local w="$work/r$1"
	mkdir -p "$w" "$work/mnt$1"
	bench_conf "$w" "$((size_mb * 2 + 64))M"
	export DSTAGE_CONFIG="$w/dstage.conf"
	"$build/stager/stager" daemon >/dev/null 2>"$w/daemon.log" &
	daemon=$!
	for _ in $(seq 100); do [ -S "$w/stager.sock" ] && break; sleep 0.1; done
	"$build/stager/stager" add d "file://$src/" >/dev/null
	"$build/fs/dstagefs" "$work/mnt$1"
	pid=$(pgrep -f "dstagefs $work/mnt$1\$")
}
done_with() { # R
	fusermount3 -u "$work/mnt$1"
	kill "$daemon"
	wait "$daemon" 2>/dev/null || true
	daemon=
}

for r in $(seq "$rounds"); do
	fresh "$r"
	echo "round $r" >&2
	mine=$(read_one "$pid" "$work/mnt$r/datasets/d/big" dstagefs)
	theirs=$(read_one "$floor" "$work/mnt-floor/big" floor)
	echo "  dstagefs: $(echo "scale=2; $mine / $theirs" | bc) of the floor's CPU" >&2
	done_with "$r"
done
if [ "${PERF:-0}" = 1 ]; then
	r=$((rounds + 1))
	fresh "$r"
	sync
	echo 3 >/proc/sys/vm/drop_caches
	perf record -q -g -o "$work/perf.data" -p "$pid" -- \
		dd if="$work/mnt$r/datasets/d/big" of=/dev/null bs=1M status=none
	echo "where dstagefs's CPU went (perf record -g, a cold read):" >&2
	perf report -i "$work/perf.data" --no-children --percent-limit 2 \
		--stdio -g caller,0.5,callee --max-stack 12 2>/dev/null |
		grep -v '^#' | grep -v '^$' | head -60 >&2
	done_with "$r"
fi
fusermount3 -u "$work/mnt-floor"
wait "$floor" 2>/dev/null || true
