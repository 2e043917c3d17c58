#!/usr/bin/env bash
# A change made by hand against the bare script, interleaved, each run its own process:
#
#   bash benchmarks/zoo34/hand.sh WORKLOAD 'CHANGE ARGS' ['CHANGE ARGS'...]
#   bash benchmarks/zoo34/hand.sh gnn_sage '--hand compile'
#   bash benchmarks/zoo34/hand.sh vision_recipe '--workers 8'
#   ROUNDS=2 bash benchmarks/zoo34/hand.sh seq2seq_train '--hand tf32' '--hand bf16-autocast'
#
# Order: ROUNDS rounds of (baseline, each change in turn), then one more baseline: one change and
# ROUNDS=3 gives A B A B A B A. Every run is `python WORKLOAD.py --steps STEPS --warmup WARMUP
# BASE_ARGS [CHANGE ARGS]` (STEPS counts the warm-up: 35 and 5 give 30 measured steps); its own
# per-step times (CUDA events) and median come from its STEP_TIMES_MS / median_step_ms lines. Each
# run's median is printed as it ends; then interval.py gives each change's saving with a 95 %
# bootstrap interval.
#
# HAND_DIR (default ${TMPDIR:-/tmp}/zoo34-hand/WORKLOAD) gets run_NN_<arm>.log, runs.tsv,
# interval.txt and interval.json. Environment: PYTHON (python3), ROUNDS (3), STEPS (35), WARMUP (5),
# BASE_ARGS (arguments of every run), HAND_TIMEOUT (seconds per run, default 300).
# The arm of a change is named after its arguments: '--hand compile' -> compile, '--workers 8' -> workers-8.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-35}
WARMUP=${WARMUP:-5}
HAND_TIMEOUT=${HAND_TIMEOUT:-300}
read -r -a base_args <<< "${BASE_ARGS:-}"

workload=${1:?usage: hand.sh WORKLOAD 'CHANGE ARGS' ['CHANGE ARGS'...]}
shift
[ $# -ge 1 ] || { echo "hand.sh: give at least one change, e.g. '--hand compile'" >&2; exit 2; }
script=$here/${workload%.py}.py
[ -f "$script" ] || { echo "hand.sh: no $script" >&2; exit 2; }
dir=${HAND_DIR:-${TMPDIR:-/tmp}/zoo34-hand/${workload%.py}}
mkdir -p "$dir"
rm -f "$dir"/run_*.log "$dir/runs.tsv" "$dir/interval.txt" "$dir/interval.json"

arm_name() {  # '--hand compile' -> compile; '--workers 8' -> workers-8; '--hand a --hand b' -> a+b
  local words name=""
  read -r -a words <<< "$1"
  local i=0
  while [ $i -lt ${#words[@]} ]; do
    local w=${words[$i]}
    if [ "$w" = "--hand" ] && [ $((i + 1)) -lt ${#words[@]} ]; then
      name+="${name:+-}${words[$((i + 1))]}"; i=$((i + 2)); continue
    fi
    name+="${name:+-}${w#--}"; i=$((i + 1))
  done
  echo "${name//[^A-Za-z0-9_.+-]/_}"
}

arms=(baseline)
specs=("")
for change in "$@"; do arms+=("$(arm_name "$change")"); specs+=("$change"); done
order=()
for ((r = 0; r < ROUNDS; r++)); do for ((k = 0; k < ${#arms[@]}; k++)); do order+=("$k"); done; done
order+=(0)

echo "hand.sh: $workload, ${#order[@]} runs (${ROUNDS} rounds of ${arms[*]}, then baseline), --steps $STEPS --warmup $WARMUP ${base_args[*]:-}"
printf 'index\tarm\tlog\tmedian_ms\trc\twall_s\n' > "$dir/runs.tsv"
n=0
for k in "${order[@]}"; do
  n=$((n + 1))
  arm=${arms[$k]}
  read -r -a change_args <<< "${specs[$k]}"
  log=$(printf 'run_%02d_%s.log' "$n" "$arm")
  start=$SECONDS
  {
    echo "\$ $PYTHON $script --steps $STEPS --warmup $WARMUP ${base_args[*]:-} ${change_args[*]:-}"
    PYTHONUNBUFFERED=1 timeout -k 20 "$HAND_TIMEOUT" "$PYTHON" "$script" --steps "$STEPS" --warmup "$WARMUP" \
      "${base_args[@]}" "${change_args[@]}" 2>&1
    echo "exit $?"
  } > "$dir/$log"
  rc=$(tail -1 "$dir/$log" | awk '{print $2}')
  ms=$(grep -m1 '^median_step_ms ' "$dir/$log" | awk '{print $2}')
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$arm" "$log" "${ms:-FAIL}" "$rc" "$((SECONDS - start))" >> "$dir/runs.tsv"
  printf 'run %2d %-28s median_step_ms %-10s exit %s  %ss\n' "$n" "$arm" "${ms:-FAIL}" "$rc" "$((SECONDS - start))"
  [ "$rc" = 0 ] || tail -5 "$dir/$log" | sed 's/^/    /'
done
"$PYTHON" "$here/interval.py" "$dir" | tee "$dir/interval.txt"
