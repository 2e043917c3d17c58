#!/usr/bin/env bash
# Device probe: does gpudiag's bare run (launcher with CaptureConfig(bare=True)) slow a launch-bound
# script? GPT-2 decode with CUDA graphs (one gpudiag.step() per token), plain vs bare, alternated
# twice, then the cost of the per-step peak-memory read/reset the launcher does at each boundary.
#   bash benchmarks/probes/bare_run_overhead.sh
set -uo pipefail
cd "$(dirname "$0")/../zoo"
bare='{"steps_from": "auto", "warmup_steps": 2, "bare": true}'
for i in 1 2; do
  echo "plain: $(python3 gpt2_decode_graphs.py --steps 64 2>&1 | grep median_step_ms)"
  echo "bare:  $(python3 -m gpudiag.capture.launch --config "$bare" --status /tmp/bare.json gpt2_decode_graphs.py --steps 64 2>&1 | grep median_step_ms)"
done
python3 - <<'PY'
import time, torch
x = torch.randn(1 << 20, device="cuda"); torch.cuda.synchronize()
for name, fn in [("max_memory_allocated", torch.cuda.max_memory_allocated),
                 ("reset_peak_memory_stats", torch.cuda.reset_peak_memory_stats)]:
    t = time.perf_counter_ns()
    for _ in range(1000):
        fn()
    print(f"{name}: {(time.perf_counter_ns() - t) / 1000 / 1e3:.1f} us per call")
PY
