#!/usr/bin/env bash
# Device: the trials' proof (docs/trials_proof.md). Per workload: `gpudiag profile` with its
# defaults (step window, default trials), then the same changes the trials made, made by hand in
# the script (zoo_changes.py flags), each run bare over the trials' window (4 warm-up + 10 steps,
# CUDA events, median), the baseline first.
#
#   source .devtools/nsys-env.sh
#   bash benchmarks/zoo/run_trials_proof.sh OUT_DIR gnn lstm ...      # --list shows the workloads
#
# OUT_DIR/<name>/: profile.log (gpudiag's terminal output, with its wall time), report.json,
# script_status.json, trial_*.json, hand.tsv (change, median_step_ms), gpudiag.log, profile.sqlite.xz.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
RUNS_DIR=${RUNS_DIR:-${TMPDIR:-/tmp}/gpudiag-trial-runs}

workload() {
  case $1 in
    gnn)      echo "gnn_train.py" ;;
    t5)       echo "t5_train.py" ;;
    lstm)     echo "lstm_lm_train.py" ;;
    generate) echo "generate_nvtx.py" ;;
    convnext) echo "timm_fp32_train.py --model convnext_tiny" ;;
    vit)      echo "timm_fp32_train.py --model vit_small_patch16_224 --batch 64" ;;
    mixer|encoder|decoder|seq2seq|serve) echo "infer_zoo.py --kind $1" ;;
    *) return 1 ;;
  esac
}
if [ "${1:-}" = "--list" ]; then
  for n in gnn t5 lstm generate convnext vit mixer encoder decoder seq2seq serve; do printf '%-10s %s\n' "$n" "$(workload "$n")"; done; exit 0
fi
out=${1:?usage: run_trials_proof.sh OUT_DIR WORKLOAD...}; shift
# on the device machine, $OUT comes back even when the call runs past its limit: keep it current
snapshot() { [ -n "${OUT:-}" ] && [ -d "$OUT" ] && tar czf "$OUT/$1.tgz" -C "$out" "$1"; }
mkdir -p "$out" "$RUNS_DIR"
for name in "$@"; do
  read -r -a cmd <<< "$(workload "$name")" || { echo "unknown workload $name"; continue; }
  script="$here/${cmd[0]}"; args=("${cmd[@]:1}")
  dir="$out/$name"; run="$RUNS_DIR/$name"; mkdir -p "$dir"
  start=$(date +%s)
  $PYTHON -m gpudiag profile "$script" -o "$run" --force ${PROFILE_OPTS:-} -- "${args[@]}" > "$dir/profile.log" 2>&1
  echo "exit $? wall_s $(( $(date +%s) - start ))" >> "$dir/profile.log"
  cp "$run"/report.json "$run"/script_status.json "$run"/bare_status.json "$run"/gpudiag.log "$dir"/ 2>/dev/null
  cp "$run"/trial_*.json "$dir"/ 2>/dev/null
  [ -f "$run/profile.sqlite" ] && xz -T0 -c "$run/profile.sqlite" > "$dir/profile.sqlite.xz"
  snapshot "$name"
  changes=$($PYTHON -c "import json,sys; print(' '.join(t['change'] for t in json.load(open(sys.argv[1])).get('trials') or []))" "$run/report.json" 2>/dev/null)
  flags=$($PYTHON -c "import sys; sys.path.insert(0, '$here'); import zoo_changes; print(' '.join(zoo_changes.FLAGS.get(c, '-') for c in sys.argv[1:]))" $changes)
  : > "$dir/hand.tsv"
  set -- "$@"
  i=0; read -r -a flag_list <<< "$flags"; read -r -a change_list <<< "$changes"
  for variant in baseline "${change_list[@]}"; do
    flag=""; [ "$variant" != baseline ] && flag=${flag_list[$i]} && i=$((i + 1))
    [ "$flag" = "-" ] && { printf '%s\t%s\n' "$variant" "no-hand-flag" >> "$dir/hand.tsv"; continue; }
    ms=$($PYTHON "$script" "${args[@]}" --steps 14 --warmup 4 $flag 2>>"$dir/hand.err" | sed -n 's/.*median_step_ms \([0-9.]*\).*/\1/p')
    printf '%s\t%s\n' "$variant" "${ms:-failed}" >> "$dir/hand.tsv"
    snapshot "$name"
  done
  echo "== $name: trials [$changes]"; cat "$dir/hand.tsv"; tail -3 "$dir/profile.log"
  snapshot "$name"
done
