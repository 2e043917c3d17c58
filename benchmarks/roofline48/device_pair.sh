#!/usr/bin/env bash
# nvidia-h200-x2: two capture.sh lists at once, one per GPU; logs and one tar per GPU into $OUT.
#   source .devtools/nsys-env.sh; bash benchmarks/roofline48/device_pair.sh "conv swinv2" "decoder moe"
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${OUT:-/tmp}; export DEADLINE=${DEADLINE:-$(( $(date +%s) + 560 ))}
for k in 0 1; do
  list=${1:?usage}; [ $k = 1 ] && list=${2:?usage}
  # shellcheck disable=SC2086 # the list is words on purpose
  CUDA_VISIBLE_DEVICES=$k bash "$here/capture.sh" /tmp/r48-gpu$k $list > "$out/r48_gpu$k.log" 2>&1 &
done
wait
# one tar per workload (each under the 16 MiB a returned file may have), the two logs as one file
for k in 0 1; do for d in /tmp/r48-gpu$k/*/; do tar -C "$d/.." -cf "$out/r48_$(basename "$d").tar" "$(basename "$d")"; done; done
cat "$out"/r48_gpu*.log > "$out/r48.log" && rm -f "$out"/r48_gpu*.log
ls -la "$out"
