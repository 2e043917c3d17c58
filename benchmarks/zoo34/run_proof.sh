#!/usr/bin/env bash
# Device: one zoo34 workload under `gpudiag profile` (with its trials), then its hand change(s)
# made by hand and timed interleaved (hand.sh), the results tarred for the trip back.
#
#   source .devtools/nsys-env.sh
#   bash benchmarks/zoo34/run_proof.sh WORKLOAD [OUT_DIR]
#   bash benchmarks/zoo34/run_proof.sh --list
#
# Stages (PARTS, default "profile hand"):
#   profile: gpudiag profile WORKLOAD.py --try-budget $TRY_BUDGET -o RUNS_DIR/WORKLOAD --force -- $PROFILE_ARGS
#            (the script runs until gpudiag ends it: bare run, 2 warm-up + 20-step capture, analysis,
#            then the trials gpudiag picks); gpudiag's terminal output -> profile.log
#   hand:    hand.sh WORKLOAD with the workload's hand changes (below; CHANGES='a;b' overrides,
#            changes separated by ';'), ROUNDS/STEPS/WARMUP per workload unless set
# OUT_DIR (default ${TMPDIR:-/tmp}/zoo34-proof) gets WORKLOAD/profile/ (profile.log, report.json,
# script_status.json, bare_status.json, trial_*.json, gpudiag.log, wall.txt) and WORKLOAD/hand/
# (hand.sh's logs, runs.tsv, interval.txt/json). When $OUT is set (the device machine) the
# workload's folder is tarred to $OUT/zoo34_WORKLOAD.tar.gz after every stage (so a call cut at its
# limit still brings back what ran), and the export, xz-compressed, to $OUT/zoo34_WORKLOAD.sqlite.xz
# when under 15 MB (KEEP_SQLITE=0: never).
# Environment: PYTHON (python3), GPUDIAG ("$PYTHON -m gpudiag"), RUNS_DIR, TRY_BUDGET (150),
# PROFILE_ARGS (the script's arguments under gpudiag; default none), PROFILE_OPTS (extra gpudiag
# options), PROFILE_TIMEOUT (seconds, default 420).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
read -r -a gpudiag_cmd <<< "${GPUDIAG:-$PYTHON -m gpudiag}"
RUNS_DIR=${RUNS_DIR:-${TMPDIR:-/tmp}/zoo34-runs}
TRY_BUDGET=${TRY_BUDGET:-150}
PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-420}
PARTS=${PARTS:-profile hand}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# workload -> hand changes (';'-separated) and hand.sh's ROUNDS STEPS WARMUP (sized for ~4 min a
# workload on an H100, profile and trials included; see README.md)
spec() {
  case $1 in
    vision_recipe) echo "--workers 8|3 35 5" ;;
    gnn_sage)      echo "--hand compile|3 35 5" ;;
    host_server)   echo "--hand compile-graphs;--hand gpu-input|2 45 5" ;;
    audio_server)  echo "--hand gpu-features;--hand compile-graphs|2 45 5" ;;
    hf_generate)   echo "--hand static-cache;--hand compile-graphs|2 16 4" ;;
    seq2seq_train) echo "--hand compile;--hand bf16-autocast;--hand fused-optimizer;--hand tf32|2 35 5" ;;
    unet_fp32)     echo "--hand channels-last;--hand tf32;--hand cudnn-benchmark;--hand bf16-autocast|2 35 5" ;;
    *) return 1 ;;
  esac
}
ALL="vision_recipe gnn_sage host_server audio_server hf_generate seq2seq_train unet_fp32"
if [ "${1:-}" = "--list" ]; then
  for w in $ALL; do printf '%-14s %s\n' "$w" "$(spec "$w")"; done
  exit 0
fi
workload=${1:?usage: run_proof.sh WORKLOAD [OUT_DIR] (--list shows them)}
workload=${workload%.py}
spec_line=$(spec "$workload") || { echo "unknown workload $workload ($ALL)"; exit 2; }
out=${2:-${TMPDIR:-/tmp}/zoo34-proof}
mkdir -p "$out/$workload" "$RUNS_DIR"
out=$(cd "$out" && pwd)
dir=$out/$workload
IFS='|' read -r changes_spec sizes <<< "$spec_line"
read -r rounds steps warmup <<< "$sizes"
IFS=';' read -r -a changes <<< "${CHANGES:-$changes_spec}"

snapshot() {
  [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
  tar czf "$OUT/zoo34_$workload.tar.gz" -C "$out" "$workload" 2>/dev/null
}

{
  echo "date: $(date -u +%FT%TZ)"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "cpus: $(nproc)"
  "$PYTHON" -c 'import importlib
for n in ("torch", "torchvision", "transformers", "torch_geometric", "gpudiag"):
    try:
        m = importlib.import_module(n); print(n, getattr(m, "__version__", "?"))
    except Exception as e: print(n, "not importable:", e)' 2>&1
} > "$dir/env.txt"

for part in $PARTS; do
  case $part in
    profile)
      pdir=$dir/profile; run=$RUNS_DIR/$workload
      mkdir -p "$pdir"; rm -f "$pdir"/*
      read -r -a profile_args <<< "${PROFILE_ARGS:-}"
      read -r -a profile_opts <<< "${PROFILE_OPTS:-}"
      cmd=("${gpudiag_cmd[@]}" profile "$here/$workload.py" --try-budget "$TRY_BUDGET" -o "$run" --force
           "${profile_opts[@]}" -- "${profile_args[@]}")
      echo "=== $workload: ${cmd[*]}"
      echo "${cmd[*]}" > "$pdir/command.txt"
      start=$SECONDS
      timeout -k 30 "$PROFILE_TIMEOUT" "${cmd[@]}" > "$pdir/profile.log" 2>&1
      rc=$?
      echo "exit $rc wall_s $((SECONDS - start))" | tee "$pdir/wall.txt"
      cp "$run"/report.json "$run"/script_status.json "$run"/bare_status.json "$run"/gpudiag.log "$pdir"/ 2>/dev/null
      cp "$run"/trial_*.json "$pdir"/ 2>/dev/null
      grep -E '^\[try\]|saving|trial' "$pdir/profile.log" | tail -20
      if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && [ "${KEEP_SQLITE:-1}" = 1 ] && [ -f "$run/profile.sqlite" ]; then
        xz -T0 -6 -c "$run/profile.sqlite" > "$OUT/zoo34_$workload.sqlite.xz" 2>/dev/null
        if [ "$(stat -c %s "$OUT/zoo34_$workload.sqlite.xz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
          rm -f "$OUT/zoo34_$workload.sqlite.xz"; echo "export over 15 MB compressed: not kept" >> "$pdir/wall.txt"
        fi
      fi
      snapshot ;;
    hand)
      echo "=== $workload: hand changes: ${changes[*]} (ROUNDS ${ROUNDS:-$rounds}, STEPS ${STEPS:-$steps}, WARMUP ${WARMUP:-$warmup})"
      HAND_DIR=$dir/hand ROUNDS=${ROUNDS:-$rounds} STEPS=${STEPS:-$steps} WARMUP=${WARMUP:-$warmup} PYTHON=$PYTHON \
        bash "$here/hand.sh" "$workload" "${changes[@]}"
      snapshot ;;
    *) echo "unknown part $part (profile, hand)" ;;
  esac
done
snapshot
