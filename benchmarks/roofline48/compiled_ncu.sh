#!/usr/bin/env bash
# Device: compiled workloads under `gpudiag profile --ncu`, so that the shapes Inductor's call sites
# record (gpudiag.capture.inductor_provenance) and Nsight Compute's numbers come from the same
# kernels (one launcher, the same kernel names). Run 2026-11-29 on an nvidia-h200:
#   source .devtools/nsys-env.sh; bash benchmarks/roofline48/compiled_ncu.sh "$OUT" triton_gemm vit_compiled
# then, here: python benchmarks/roofline48/collect_compiled.py OUT -o tests/fixtures/roofline48
# The eager SDPA workloads (bert_sdpa, gpt2_sdpa) the same way, 2026-11-29, NCU_TOP=80 (a whole step).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: compiled_ncu.sh OUT NAME...}; shift
for w in "$@"; do
  t0=$(date +%s)
  if [ -n "${DEADLINE:-}" ] && [ $((t0 + ${PROFILE_TIMEOUT:-270})) -gt "$DEADLINE" ]; then echo "$w skipped: deadline"; continue; fi
  timeout "${PROFILE_TIMEOUT:-270}" python3 -m gpudiag profile --ncu --ncu-top "${NCU_TOP:-40}" --no-bare-run --try none \
    -o "/tmp/c_$w" "$here/workloads.py" "$w" > "$out/$w.log" 2>&1
  echo "$w rc $? $(( $(date +%s) - t0 )) s"
  (cd "/tmp/c_$w" && tar cf - profile.sqlite profile.ncu-rep script_status.json report.json 2>/dev/null | xz -T0 -6 > "$out/$w.tar.xz")
  ls -la "/tmp/c_$w" >> "$out/$w.log"
done
