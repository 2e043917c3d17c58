#!/usr/bin/env bash
# Device: the same workloads under `gpudiag profile` (op ranges and shapes on its detail step), the
# capture and export only, for the "with shapes" half of issue 48's comparison. Run 2026-11-28 on an
# nvidia-h200 (two calls; the 8-file limit of one call holds four workloads):
#   source .devtools/nsys-env.sh; bash benchmarks/roofline48/shapes.sh "$OUT" encoder conv decoder swinv2 decode moe
# then, here: python benchmarks/roofline48/collect_shapes.py OUT -o tests/fixtures/roofline48
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: shapes.sh OUT NAME...}; shift
for w in "$@"; do
  t0=$(date +%s)
  timeout "${PROFILE_TIMEOUT:-120}" python3 -m gpudiag profile --no-analysis --no-bare-run --try none -o "/tmp/r_$w" \
    "$here/workloads.py" "$w" > "$out/$w.log" 2>&1
  echo "$w rc $? $(( $(date +%s) - t0 )) s"
  [ -f "/tmp/r_$w/profile.sqlite" ] && xz -T0 -3 -c "/tmp/r_$w/profile.sqlite" > "$out/${w}_shapes.sqlite.xz"
  cp "/tmp/r_$w/script_status.json" "$out/${w}_status.json"
done
