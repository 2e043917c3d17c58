#!/usr/bin/env bash
# Two run_suite.sh lists at once on a two-GPU machine, one per GPU, each pinned to half the cores
# (device time is the scarce resource: one call does the work of two; the trials and the by-hand
# runs of one list are interleaved on its own GPU, so their comparisons stay within one GPU):
#
#   bash benchmarks/framework_suite/device_pair.sh "NAMES FOR GPU 0" "NAMES FOR GPU 1"
#
# Each list's output goes to /tmp/fw-gpuK (RUNS_DIR /tmp/fw-runs-gpuK); run_suite.sh tars it into
# $OUT as usual, and this script's own logs come back as $OUT/pair_gpuK.log. SUITE picks another
# driver with the same arguments (benchmarks/patch_suite/run_suite.sh); PAIR_TAG (default fw) names
# the folders: /tmp/TAG-gpuK, /tmp/TAG-runs-gpuK.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
n=$(nproc)
half=$((n / 2))
out=${OUT:-${TMPDIR:-/tmp}}
suite=${SUITE:-$here/run_suite.sh}
tag=${PAIR_TAG:-fw}
for k in 0 1; do
  list=${1:?usage: device_pair.sh "NAMES" "NAMES"}
  [ $k = 1 ] && list=${2:?usage: device_pair.sh "NAMES" "NAMES"}
  cores="$((k * half))-$((k * half + half - 1))"
  # shellcheck disable=SC2086 # the list is words on purpose
  CUDA_VISIBLE_DEVICES=$k RUNS_DIR=/tmp/$tag-runs-gpu$k taskset -c "$cores" \
    bash "$suite" $list -o /tmp/$tag-gpu$k > "$out/pair_gpu$k.log" 2>&1 &
done
wait
