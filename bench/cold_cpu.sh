#!/bin/bash
# bench/cold_cpu.sh [BUILD_DIR] [bench/run options]: what a cold byte costs
# in CPU, per GiB.
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
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
[ $# -gt 0 ] && shift
DSTAGE_BUILD_DIR=$build exec "$repo/bench/run" --quick --no-peers \
	--rows dstage,shared,file --out "${TMPDIR:-/tmp}/dstage-cold-cpu" "$@"
