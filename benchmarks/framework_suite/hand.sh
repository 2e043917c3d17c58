#!/usr/bin/env bash
# A change made by hand against the unchanged script, timed bare (no gpudiag), interleaved, each
# run its own process, in the same call:
#
#   bash benchmarks/framework_suite/hand.sh NAME SCRIPT 'CHANGE ARGS' ['CHANGE ARGS'...]
#   BASE_ARGS='--accumulate-grad-batches 2 --max-steps 35' \
#     bash benchmarks/framework_suite/hand.sh lightning_resnet50 benchmarks/framework_suite/lightning_resnet50.py \
#     '--precision bf16-mixed' '--channels-last'
#
# Order: ROUNDS rounds of (baseline, each change in turn), then one more baseline: ROUNDS=3 and one
# change give A B A B A B A. Every run is `FW_STEP_TIMES=1 FW_WARMUP=WARMUP python SCRIPT BASE_ARGS
# [CHANGE ARGS] --quiet-steps`: the script's step clock (fwcommon.py: one CUDA event per real
# optimizer step) prints STEP_TIMES_MS (the steps after the warm-up) and median_step_ms. Then
# benchmarks/zoo34/interval.py gives each change's saving with a 95 % two-level bootstrap interval
# (runs, then steps within runs), and hand.json gathers, per arm, the runs' medians, their min and
# max, and the interval.
#
# HAND_DIR (default ${TMPDIR:-/tmp}/fw-hand/NAME) gets run_NN_<arm>.log, runs.tsv, interval.txt,
# interval.json and hand.json. Environment: PYTHON (python3), ROUNDS (3), WARMUP (5), BASE_ARGS,
# HAND_TIMEOUT (seconds per run, default 240), HAND_STOP_AT (a Unix time: no run starts after
# it minus the longest run so far). Arm names come from the arguments: '--precision bf16-mixed' ->
# precision-bf16-mixed, '--workers 8 --pin-memory' -> workers-8-pin-memory.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-5}
HAND_TIMEOUT=${HAND_TIMEOUT:-240}
read -r -a base_args <<< "${BASE_ARGS:-}"

name=${1:?usage: hand.sh NAME SCRIPT 'CHANGE ARGS' ['CHANGE ARGS'...]}
script=${2:?usage: hand.sh NAME SCRIPT 'CHANGE ARGS' ['CHANGE ARGS'...]}
shift 2
[ $# -ge 1 ] || { echo "hand.sh: give at least one change, e.g. '--precision bf16-mixed'" >&2; exit 2; }
[ -f "$script" ] || { echo "hand.sh: no $script" >&2; exit 2; }
dir=${HAND_DIR:-${TMPDIR:-/tmp}/fw-hand/$name}
mkdir -p "$dir"
rm -f "$dir"/run_*.log "$dir/runs.tsv" "$dir/interval.txt" "$dir/interval.json" "$dir/hand.json"

arm_name() {
  local words name="" w
  read -r -a words <<< "$1"
  for w in "${words[@]}"; do name+="${name:+-}${w#--}"; done
  echo "${name//[^A-Za-z0-9_.+-]/_}"
}

arms=(baseline)
specs=("")
for change in "$@"; do arms+=("$(arm_name "$change")"); specs+=("$change"); done
order=()
for ((r = 0; r < ROUNDS; r++)); do for ((k = 0; k < ${#arms[@]}; k++)); do order+=("$k"); done; done
order+=(0)

echo "hand.sh: $name, ${#order[@]} runs (${ROUNDS} rounds of ${arms[*]}, then baseline): $script ${base_args[*]:-}"
printf 'index\tarm\tlog\tmedian_ms\trc\twall_s\n' > "$dir/runs.tsv"
n=0
longest=0
for k in "${order[@]}"; do
  n=$((n + 1))
  arm=${arms[$k]}
  if [ -n "${HAND_STOP_AT:-}" ] && [ $(( $(date +%s) + longest + 5 )) -gt "$HAND_STOP_AT" ]; then
    echo "stopped before run $n: the deadline leaves no room for another run (${longest} s each)" | tee "$dir/stopped.txt"
    break
  fi
  read -r -a change_args <<< "${specs[$k]}"
  log=$(printf 'run_%02d_%s.log' "$n" "$arm")
  start=$SECONDS
  {
    echo "\$ FW_STEP_TIMES=1 FW_WARMUP=$WARMUP $PYTHON $script ${base_args[*]:-} ${change_args[*]:-} --quiet-steps"
    FW_STEP_TIMES=1 FW_WARMUP=$WARMUP PYTHONUNBUFFERED=1 timeout -k 20 "$HAND_TIMEOUT" "$PYTHON" "$script" \
      "${base_args[@]}" "${change_args[@]}" --quiet-steps 2>&1
    echo "exit $?"
  } > "$dir/$log"
  took=$((SECONDS - start))
  [ $took -gt $longest ] && longest=$took
  rc=$(tail -1 "$dir/$log" | awk '{print $2}')
  ms=$(grep -m1 '^median_step_ms ' "$dir/$log" | awk '{print $2}')
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$arm" "$log" "${ms:-FAIL}" "$rc" "$took" >> "$dir/runs.tsv"
  printf 'run %2d %-28s median_step_ms %-10s exit %s  %ss\n' "$n" "$arm" "${ms:-FAIL}" "$rc" "$took"
  [ "$rc" = 0 ] || tail -5 "$dir/$log" | sed 's/^/    /'
done
"$PYTHON" "$here/../zoo34/interval.py" "$dir" | tee "$dir/interval.txt"
"$PYTHON" - "$dir" "$name" "$script" "${base_args[*]:-}" <<'EOF'
import csv, json, sys, pathlib
d, name, script, base = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
arms = {}
with open(d / "runs.tsv", newline="") as f:
    for row in csv.DictReader(f, delimiter="\t"):
        a = arms.setdefault(row["arm"], {"run_medians_ms": [], "failed_runs": 0})
        try:
            a["run_medians_ms"].append(float(row["median_ms"]))
        except ValueError:
            a["failed_runs"] += 1
for a in arms.values():
    m = sorted(a["run_medians_ms"])
    a.update(median_of_runs_ms=(m[len(m) // 2] if len(m) % 2 else (m[len(m) // 2 - 1] + m[len(m) // 2]) / 2) if m else None,
             min_ms=m[0] if m else None, max_ms=m[-1] if m else None)
try:
    interval = json.loads((d / "interval.json").read_text()).get("changes", {})
except (OSError, ValueError):
    interval = {}
(d / "hand.json").write_text(json.dumps({"workload": name, "script": script, "base_args": base, "arms": arms,
                                         "changes": interval}, indent=1))
EOF
