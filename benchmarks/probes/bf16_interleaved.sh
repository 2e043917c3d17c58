#!/usr/bin/env bash
# Device probe (issue 21): do the bf16-autocast trial and the same change by hand agree when they
# run in the same conditions? ROUNDS x (hand-made bf16 autocast, the trial under gpudiag's
# launcher), interleaved, on a timm fp32 training script; a TF32 pair and the fp32 baseline first.
# One line per run: variant, round, median step ms (CUDA events, steps 5..13).
#   MODEL=convnext_tiny ROUNDS=3 bash benchmarks/probes/bf16_interleaved.sh
set -u
cd "$(dirname "$0")/../zoo"
S=(timm_fp32_train.py --model ${MODEL:-convnext_tiny} --steps 14 --warmup 4)
CFG='{"bare": true, "warmup_steps": 4, "window_steps": 10'
med() { python3 -c "import json,statistics,sys; d=json.load(open(sys.argv[1])); v=[x for k,x in d['step_gpu_ns'].items() if int(k)>=5]; print(round(statistics.median(v)/1e6,3))" "$1" 2>/dev/null || echo failed; }
hand() { python3 "${S[@]}" "$@" 2>/dev/null | sed -n 's/.*median_step_ms \([0-9.]*\).*/\1/p'; }
trial() { python3 -m gpudiag.capture.launch --config "$CFG, \"trial\": \"$1\"}" --status /tmp/t.json "${S[@]}" > /tmp/t.log 2>&1; med /tmp/t.json; }
echo -e "${MODEL:-convnext_tiny}\tbaseline\t0\t$(hand)"
echo -e "${MODEL:-convnext_tiny}\ttf32 hand\t0\t$(hand --tf32)"
echo -e "${MODEL:-convnext_tiny}\ttf32 trial\t0\t$(trial tf32)"
for r in $(seq 1 "${ROUNDS:-3}"); do
  echo -e "${MODEL:-convnext_tiny}\tbf16 hand\t$r\t$(hand --bf16-autocast)"
  echo -e "${MODEL:-convnext_tiny}\tbf16 trial\t$r\t$(trial bf16-autocast)"
done
