#!/usr/bin/env bash
# Device: profile three workloads with --ncu, then compare estimated vs measured classes.
#   source .devtools/nsys-env.sh; bash benchmarks/run_roofline_accuracy.sh OUTDIR
set -uo pipefail
out=${1:?usage: run_roofline_accuracy.sh OUTDIR}; mkdir -p "$out"
prof() { local name=$1 script=$2; shift 2
  python3 -m gpudiag profile "$script" -o "$out/$name" --force --ncu --ncu-top 15 --ncu-max-kernels 200 -- "$@" > "$out/$name.out" 2>&1
  echo "$name: exit $?"; grep -E "^\[ncu\]|--ncu|ERR_" "$out/$name.out" | head -5; }
prof swin_t_train_bf16 examples/swin_train.py --amp bf16 --steps 6
prof gpt2_train_bf16 examples/gpt2_train.py --amp bf16 --steps 6
prof mlp_decode examples/mlp_decode.py --steps 6
python3 benchmarks/roofline_accuracy.py "$out/swin_t_train_bf16" "$out/gpt2_train_bf16" "$out/mlp_decode" --markdown "$out/accuracy.md"
