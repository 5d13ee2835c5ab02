#!/bin/bash
# bench/uring_ab.sh: FUSE over io_uring against /dev/fuse, alternated
# (issue 31). Three dstage builds, each its own bench/run of the same rows
# (default: file,ceiling; ROWS=...), ROUNDS times (default 2) in turn:
#
#   dev      BUILD_DEV (default build/): libfuse 3.17 from install-deps,
#            requests read from /dev/fuse
#   318      BUILD_318: the same sources on sid's libfuse 3.18
#            (DSTAGE_LIBFUSE_SUITE=sid DSTAGE_LIBFUSE_PREFIX=/opt/dstage/
#            libfuse-sid scripts/install-deps; cmake -DDSTAGE_LIBFUSE_PREFIX=
#            /opt/dstage/libfuse-sid), still /dev/fuse: the version alone
#   uring    BUILD_318 mounted -o io_uring, enable_uring = Y (bench/run
#            --fuse-opts io_uring): the transport
#
# passthrough_hp is each build's libfuse's (PT_HP_DEV, PT_HP_318). Results
# go to OUT (default bench/results/issue31/uring-ab), one directory per
# run; docs/benchmarks.md's table is drawn from their .json files
# (bench/results/current.json, bench/run --report). Needs
# root (drop_caches, FUSE, the module parameter). QUICK=0 for the full
# profile.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dev=${BUILD_DEV:-$repo/build} b318=${BUILD_318:?BUILD_318: a build on libfuse 3.18}
pt_dev=${PT_HP_DEV:-/opt/dstage/libfuse/bin/passthrough_hp}
pt_318=${PT_HP_318:-/opt/dstage/libfuse-sid/bin/passthrough_hp}
rows=${ROWS:-file,ceiling} rounds=${ROUNDS:-2}
out=${OUT:-$repo/bench/results/issue31/uring-ab}
quick=--quick
[ "${QUICK:-1}" = 0 ] && quick=
mkdir -p "$out"
for r in $(seq "$rounds"); do
	for v in dev 318 uring; do
		case $v in
		dev) build=$dev pt=$pt_dev extra=() ;;
		318) build=$b318 pt=$pt_318 extra=() ;;
		uring) build=$b318 pt=$pt_318 extra=(--fuse-opts io_uring) ;;
		esac
		echo "uring_ab: round $r: $v ($build)"
		DSTAGE_BUILD_DIR=$build DSTAGE_PASSTHROUGH_HP=$pt \
			"$repo/bench/run" $quick --no-peers --rows "$rows" \
			"${extra[@]}" --out "$out/$v-$r" >"$out/$v-$r.log" 2>&1 ||
			{ echo "uring_ab: $v round $r failed: $out/$v-$r.log" >&2; exit 1; }
	done
done
echo "uring_ab: done: $out"
