#!/usr/bin/env bash
# Device: for each workload, an nsys export made without gpudiag (plain `nsys profile`, default
# traces, no gpudiag ranges) and an Nsight Compute report of one steady-state step (the same
# sections `gpudiag profile --ncu` collects: --set roofline, LaunchStats, Occupancy), then both
# xz-compressed into OUT/NAME/ with the log.
#   source .devtools/nsys-env.sh; bash benchmarks/roofline48/capture.sh OUT NAME [NAME ...]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: capture.sh OUT NAME...}; shift
NCU=${GPUDIAG_NCU:-$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
NSYS=${GPUDIAG_NSYS:-$(command -v nsys)}
EXTRA=$(python3 -c "from gpudiag.capture.ncu import EXTRA_METRICS; print(EXTRA_METRICS)")
for name in "$@"; do
  d=$out/$name; mkdir -p "$d"; t0=$(date +%s)
  # one call of the device tool lasts at most 600 s: a workload needs ~150 s, so none starts later
  if [ -n "${DEADLINE:-}" ] && [ $((t0 + 150)) -gt "$DEADLINE" ]; then echo "$name skipped: deadline"; continue; fi
  timeout "${NSYS_TIMEOUT:-100}" "$NSYS" profile -t cuda,nvtx,osrt -s none --cpuctxsw=none -f true \
    -o "$d/profile" --export sqlite python3 "$here/workloads.py" "$name" > "$d/nsys.log" 2>&1
  echo "$name nsys exit $? $(( $(date +%s) - t0 )) s"; t1=$(date +%s)
  NCU_STEP_RANGE=1 timeout "${NCU_TIMEOUT:-170}" "$NCU" --target-processes all --clock-control none \
    --set roofline --section LaunchStats --section Occupancy --metrics "$EXTRA" \
    --nvtx --nvtx-include "ncu_step/" --launch-count "${NCU_MAX:-500}" -f -o "$d/profile" \
    python3 "$here/workloads.py" "$name" --steps 6 > "$d/ncu.log" 2>&1
  echo "$name ncu exit $? $(( $(date +%s) - t1 )) s; $(grep -c '==PROF==' "$d/ncu.log") prof lines"
  rm -f "$d/profile.nsys-rep"
  xz -T0 -6 "$d"/profile.sqlite "$d"/profile.ncu-rep 2>/dev/null
  ls -la "$d"
done
