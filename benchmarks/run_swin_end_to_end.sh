#!/usr/bin/env bash
# Device: Swin-T bf16 training step time before and after the kernels gpudiag recommends for it,
# and with torch.compile for comparison (examples/swin_train.py; CUDA events, median of the steps
# after 5 warm-up steps), then gpudiag's own view of the fused run.
#   source .devtools/nsys-env.sh; bash benchmarks/run_swin_end_to_end.sh OUTDIR [STEPS]
set -uo pipefail
out=${1:?usage: run_swin_end_to_end.sh OUTDIR [STEPS]}; steps=${2:-40}; mkdir -p "$out"
for variant in "" "--fused" "" "--fused"; do  # interleaved twice: drift shows as a difference between repeats
  python3 examples/swin_train.py --amp bf16 --steps "$steps" --time $variant 2>&1 | tail -1 | tee -a "$out/step_times.txt"
done
python3 examples/swin_train.py --amp bf16 --steps "$steps" --time --compile 2>&1 | tail -1 | tee -a "$out/step_times.txt"
python3 -m gpudiag profile examples/swin_train.py -o "$out/swin_fused" --force -- --amp bf16 --steps 10 --fused > "$out/swin_fused.out" 2>&1
echo "profile of the fused run: exit $?"; grep -A3 "step time" "$out/swin_fused.out" | head -5
