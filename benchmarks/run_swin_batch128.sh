#!/usr/bin/env bash
# Device: Swin-T bf16 at batch 128, where each kernel is 4x longer and the GPU, not the host, sets
# the step time: gpudiag's prediction (profile) and the measured step time, eager vs --fused.
#   source .devtools/nsys-env.sh; bash benchmarks/run_swin_batch128.sh OUTDIR
set -uo pipefail
out=${1:?usage: run_swin_batch128.sh OUTDIR}; mkdir -p "$out"
python3 -m gpudiag profile examples/swin_train.py -o "$out/swin_b128" --force -- --amp bf16 --steps 10 --batch 128 > "$out/swin_b128.out" 2>&1
echo "profile batch 128: exit $?"; grep -A3 "step time" "$out/swin_b128.out" | head -4
for variant in "" "--fused" "" "--fused"; do
  python3 examples/swin_train.py --amp bf16 --steps 30 --batch 128 --time $variant 2>&1 | tail -1 | tee -a "$out/step_times_b128.txt"
done
