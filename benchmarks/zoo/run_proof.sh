#!/usr/bin/env bash
# Device: the measurements behind docs/proof.md (issue 11's proof table), in one call.
#
#   source .devtools/nsys-env.sh
#   bash benchmarks/zoo/run_proof.sh OUT_DIR [resnet|llama|stability|kernels...]
#
# resnet:    ResNet-50 NCHW vs channels_last (2 interleaved rounds), then channels_last + torch.compile
# llama:     Llama baseline vs AdamW(fused=True) (2 rounds), torch.compile, gpudiag.fused.hf.apply
# stability: three `gpudiag profile` captures of ResNet-50 NCHW (the same script, back to back)
# kernels:   benchmarks/bench_kernels.py (every reference kernel compiled and checked on the GPU)
# Each part writes OUT_DIR/<part>.tsv or OUT_DIR/<part>/ and a log; see before_after.py.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
out=${1:?usage: run_proof.sh OUT_DIR [part...]}; shift
mkdir -p "$out"
parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(resnet llama stability)
ba() { "$PYTHON" "$here/before_after.py" "$@"; }
for part in "${parts[@]}"; do
  echo "=== $part"
  case $part in
    resnet)
      ba "$out/resnet.tsv" --rounds 2 "resnet50|resnet50_train.py --steps 30" "resnet50_cl|resnet50_train.py --steps 30 --channels-last"
      ba "$out/resnet_compile.tsv" --rounds 1 "resnet50_cl_compile|resnet50_train.py --steps 30 --channels-last --compile" ;;
    llama)
      ba "$out/llama.tsv" --rounds 2 "llama|llama_train.py --steps 30" "llama_fused_adamw|llama_train.py --steps 30 --fused-optimizer"
      ba "$out/llama_compile.tsv" --rounds 1 "llama_compile|llama_train.py --steps 30 --compile" ;;
    llama_kernels)
      ba "$out/llama_kernels.tsv" --rounds 2 "llama|llama_train.py --steps 30" "llama_gpudiag_kernels|llama_train.py --steps 30 --gpudiag-kernels" ;;
    stability)
      for i in 1 2 3; do
        run=$out/stability/run$i
        "$PYTHON" -m gpudiag profile "$here/resnet50_train.py" -o "$run" --force -- --steps 20 > "$out/stability_run$i.log" 2>&1
        echo "capture $i: exit $?"
        xz -T0 -6 "$run/profile.sqlite" 2> /dev/null
        find "$run" -mindepth 1 -maxdepth 1 ! -name 'report.json' ! -name 'script_status.json' ! -name 'profile.sqlite.xz' -exec rm -rf {} +
      done ;;
    kernels)
      "$PYTHON" "$here/../bench_kernels.py" > "$out/kernels.log" 2>&1; echo "bench_kernels: exit $?"; tail -40 "$out/kernels.log" ;;
    *) echo "unknown part $part" ;;
  esac
done
