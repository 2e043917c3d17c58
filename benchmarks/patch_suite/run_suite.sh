#!/usr/bin/env bash
# Device proof of issue 46 (docs/patches.md): scripts run UNMODIFIED under `gpudiag profile` with its
# default options (bare run, 2 warm-up + 20-step window, analysis, `--try auto` trials, then each
# measured win written as RUN_DIR/changes/CHANGE.patch and the top one verified by running the
# patched script); per script the patches are collected and `git apply --check`ed in a fresh copy
# of the script's folder (README.md here).
#
#   source .devtools/nsys-env.sh
#   bash benchmarks/patch_suite/run_suite.sh pt|fw|zoo|all|NAME... [-o OUT_DIR]
#   bash benchmarks/patch_suite/run_suite.sh --list
#
# pt:  pytorch/examples scripts copied into .examples/ by prepare_examples.sh: pt_imagenet,
#      pt_word_lm, pt_dcgan, pt_mnist (synthetic wikitext-2 and MNIST made first by make_data.py)
# fw:  names of benchmarks/framework_suite (lightning_resnet50 hf_trainer_bert accelerate_accum
#      loader_bound hf_run_clm accel_cv_example timm_train; any other name of its --list works
#      too): each is run by the framework suite's own run_suite.sh (its arguments, data and time
#      limits), one name per call of it, then collected here
# zoo: zoo34_vision_recipe zoo34_unet_fp32 zoo34_seq2seq_train (benchmarks/zoo34/NAME.py with its
#      defaults, as zoo34/run_proof.sh runs them); zoo34_NAME works for any script there
# PATH.py: any other script, with PS_ARGS as its arguments (its folder in OUT_DIR: the file's stem)
#
# Each pt/zoo script runs from a fresh working directory $RUNS_DIR/scratch/cwd_NAME as
#   $GPUDIAG profile -o $RUNS_DIR/NAME --force $PROFILE_OPTS SCRIPT -- ARGS
# One failing or hanging script never stops the others: each gets PS_TIMEOUT seconds (default
# 540), cut to what is left of PART_DEADLINE (default 550 s from the part's start, data making
# included); a script is not started with less than PS_MIN_START seconds left (default 200): it is
# recorded as skipped, to run by name in the next call.
#
# OUT_DIR (default ${TMPDIR:-/tmp}/gpudiag-patch) gets, per script, NAME/: command.txt, args.txt,
# rc.txt (exit code, wall seconds, limit), profile.log (gpudiag's terminal output), the run
# directory's report.json, script_status.json, bare_status.json, trial_*.json, patch_*.json (the
# verification's runs), gpudiag.log, terminal.log, changes/ (CHANGE.json and CHANGE.patch) and
# patch_check.json (collect.py: git apply --check of each patch); env.txt; then summarize.py
# writes summary.json and summary.md. With $OUT set (the device machine) OUT_DIR is tarred to
# $OUT/ps_LABEL.tar.gz after every script and the table copied to $OUT/ps_LABEL_summary.md
# (2 files).
#
# Environment: PYTHON (python3), GPUDIAG ("$PYTHON -m gpudiag"), EXAMPLES_DIR (.examples at the
# repository root), RUNS_DIR (${TMPDIR:-/tmp}/gpudiag-patch-runs), DATA_DIR ($RUNS_DIR/data),
# PS_TIMEOUT, PS_MIN_START, PART_DEADLINE, PROFILE_OPTS (gpudiag options; empty: the defaults),
# PS_ARGS (appended to every pt/zoo script's arguments; the framework names take FW_ARGS),
# PATCH_CPU=1 (CPU dry run: small sizes and the scripts' CPU switches, FW_CPU=1 for the framework
# names; see cpu_args below).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
fw_suite=$repo/benchmarks/framework_suite
PYTHON=${PYTHON:-python3}
read -r -a gpudiag_cmd <<< "${GPUDIAG:-$PYTHON -m gpudiag}"
read -r -a profile_opts <<< "${PROFILE_OPTS:-}"
read -r -a extra_args <<< "${PS_ARGS:-}"
EXAMPLES_DIR=${EXAMPLES_DIR:-$repo/.examples}
RUNS_DIR=${RUNS_DIR:-${TMPDIR:-/tmp}/gpudiag-patch-runs}
DATA_DIR=${DATA_DIR:-$RUNS_DIR/data}
PS_TIMEOUT=${PS_TIMEOUT:-540}
PS_MIN_START=${PS_MIN_START:-200}
PART_DEADLINE=${PART_DEADLINE:-550}
PATCH_CPU=${PATCH_CPU:-0}
# NVLink multicast stays off on the shared hosts (KINDS.md); output unbuffered so logs are complete
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# `python -m gpudiag` runs from each script's own working directory: this checkout's gpudiag first
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}

PT="pt_imagenet pt_word_lm pt_dcgan pt_mnist"
FW="lightning_resnet50 hf_trainer_bert accelerate_accum loader_bound hf_run_clm accel_cv_example timm_train"
ZOO="zoo34_vision_recipe zoo34_unet_fp32 zoo34_seq2seq_train"

# spec NAME: sets KIND (pt, zoo or fw), SCRIPT, ARGS (array; $CWD and $DATA_DIR expanded when it
# runs), NEEDS (make_data.py parts) or fails. Sizes (README.md): each script trains well past
# gpudiag's 22 profiled steps and a trial's ~14, on synthetic data made on the machine.
spec() {
  KIND=pt; NEEDS=""; ARGS=()
  local E=$EXAMPLES_DIR
  case $1 in
    pt_imagenet) SCRIPT=$E/imagenet/main.py; ARGS=(--dummy -a resnet50 -b 64 --epochs 1) ;;
    pt_word_lm)  SCRIPT=$E/word_language_model/main.py; NEEDS=wikitext
                 ARGS=(--data '$DATA_DIR/wikitext-2' --accel --epochs 1 --use-optimizer --lr 0.001 --save '$CWD/model.pt') ;;
    pt_dcgan)    SCRIPT=$E/dcgan/main.py; ARGS=(--dataset fake --accel --niter 3 --manualSeed 1 --outf '$CWD/out') ;;
    pt_mnist)    SCRIPT=$E/mnist/main.py; NEEDS=mnist; ARGS=(--epochs 1) ;;
    zoo34_*)     KIND=zoo; SCRIPT=$repo/benchmarks/zoo34/${1#zoo34_}.py; [ -f "$SCRIPT" ] || return 1 ;;
    *.py)        KIND=file; SCRIPT=$(realpath "$1" 2>/dev/null) || return 1; [ -f "$SCRIPT" ] || return 1 ;;
    *)           KIND=fw; SCRIPT=""
                 bash "$fw_suite/run_suite.sh" --list 2>/dev/null | awk '{print $1}' | grep -qxF "$1" || return 1 ;;
  esac
}

# CPU dry run: appended after ARGS (argparse keeps the last value), never on the GPU machine
cpu_args() {
  case $1 in
    pt_imagenet) echo "--no-accel -a resnet18 -b 4 -j 2" ;;
    pt_word_lm)  echo "--emsize 32 --nhid 32" ;;
    pt_dcgan)    echo "--batchSize 8 --ngf 16 --ndf 16 --workers 1" ;;
    pt_mnist)    echo "--no-accel" ;;
    zoo34_*)     echo "--tiny" ;;
  esac
}

if [ "${1:-}" = "--list" ]; then
  for n in $PT $ZOO; do spec "$n"; printf '%-22s %s %s\n' "$n" "${SCRIPT#$repo/}" "${ARGS[*]}"; done
  for n in $FW; do printf '%-22s %s\n' "$n" "(framework_suite/run_suite.sh: $(bash "$fw_suite/run_suite.sh" --list | awk -v n="$n" '$1 == n {$1 = ""; print}'))"; done
  exit 0
fi
names=()
out=${TMPDIR:-/tmp}/gpudiag-patch
label=""
while [ $# -gt 0 ]; do
  case $1 in
    -o) out=$2; shift 2 ;;
    pt|fw|zoo) var=${1^^}; read -r -a more <<< "${!var}"; names+=("${more[@]}"); label+="${label:+_}$1"; shift ;;
    all) read -r -a more <<< "$PT $FW $ZOO"; names+=("${more[@]}"); label+="${label:+_}all"; shift ;;
    *) names+=("$1"); label+="${label:+_}$1"; shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || { echo "usage: run_suite.sh pt|fw|zoo|all|NAME... [-o OUT_DIR] (--list)"; exit 2; }
label=${label//[^A-Za-z0-9_.+-]/_}
label=${label:0:60}
part_start=$SECONDS
mkdir -p "$out" "$RUNS_DIR/scratch"
out=$(cd "$out" && pwd)

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname); cpus: $(nproc); gpus: $(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  echo "nsys: $(command -v nsys || echo "not on PATH; GPUDIAG_NSYS=${GPUDIAG_NSYS:-unset}")"
  echo "examples: $EXAMPLES_DIR"; sed 's/^/  /' "$EXAMPLES_DIR/UPSTREAM.txt" 2>/dev/null
  "$PYTHON" -c 'import importlib
for n in ("torch", "torchvision", "libcst", "yaml", "gpudiag"):
    try:
        m = importlib.import_module(n); print(n, getattr(m, "__version__", "?"), getattr(m, "__file__", ""))
    except Exception as e: print(n, "not importable:", e)' 2>&1
  git -C "$repo" log -1 --format='gpudiag commit: %h %cs %s' 2>/dev/null
  echo "gpudiag command: ${gpudiag_cmd[*]}; options: ${profile_opts[*]:-defaults}; extra script args: ${extra_args[*]:-none}; PATCH_CPU=$PATCH_CPU"
  echo "PS_TIMEOUT=$PS_TIMEOUT PS_MIN_START=$PS_MIN_START PART_DEADLINE=$PART_DEADLINE"
} > "$out/env.txt"
cat "$out/env.txt"

snapshot() {
  [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
  tar czf "$OUT/ps_$label.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" 2>/dev/null
}

# data of the pt scripts, made once (kept in DATA_DIR for later calls on the same machine); MNIST
# where the mnist example looks for it: '../data' of its working directory
needs=""
for name in "${names[@]}"; do spec "$name" 2>/dev/null && needs+="${needs:+,}$NEEDS"; done
needs=$(tr ',' '\n' <<< "$needs" | grep -v '^$' | sort -u | paste -sd, -)
if [ -n "$needs" ]; then
  data_args=()
  [ "$PATCH_CPU" = 1 ] && data_args=(--words 40000 --mnist-train 2000 --mnist-test 500)
  echo "=== data: $needs"
  "$PYTHON" "$here/make_data.py" "$DATA_DIR" --what "$needs" --mnist-root "$RUNS_DIR/scratch/data" "${data_args[@]}" 2>&1 \
    | tee "$out/make_data.log"
fi

left() { echo $((PART_DEADLINE - (SECONDS - part_start))); }

# run_fw NAME LIMIT: the framework suite runs it (its spec, data, cwd and copies), into $out/NAME
run_fw() {
  local name=$1 limit=$2 fwout=$out/.fw
  rm -rf "$fwout/$name"
  # its own OUT tar stays off (few files come back from the device); its deadline is what is left of ours
  env -u OUT RUNS_DIR="$RUNS_DIR" DATA_DIR="$DATA_DIR" PYTHON="$PYTHON" GPUDIAG="${gpudiag_cmd[*]}" PROFILE_OPTS="${profile_opts[*]}" \
    FW_TIMEOUT="$limit" FW_MIN_START=0 PART_DEADLINE="$limit" FW_CPU="$PATCH_CPU" \
    bash "$fw_suite/run_suite.sh" "$name" -o "$fwout" > "$out/$name.fw.log" 2>&1
  rm -rf "$dir"; mkdir -p "$dir"
  [ -d "$fwout/$name" ] && cp -r "$fwout/$name/." "$dir/"
  mv "$out/$name.fw.log" "$dir/framework_suite.log"
  [ -f "$dir/summary.json" ] && mv "$dir/summary.json" "$dir/framework_summary.json"  # its own summarize.py's row
  # the script is the word before the first `--` of its command line (command.txt's second line)
  SCRIPT=$(awk 'NR == 2 {for (i = 2; i <= NF; i++) if ($i == "--") {print $(i - 1); exit}}' "$dir/command.txt" 2>/dev/null)
}

for name in "${names[@]}"; do
  dir=$out/$name
  case $name in *.py) dir=$out/$(basename "$name" .py) ;; esac
  rm -rf "$dir"; mkdir -p "$dir"
  if ! spec "$name"; then echo "unknown script name $name" | tee "$dir/skipped.txt"; continue; fi
  remaining=$(left)
  if [ "$remaining" -lt "$PS_MIN_START" ]; then
    echo "skipped: ${remaining} s left of the part deadline (${PART_DEADLINE} s), fewer than PS_MIN_START=$PS_MIN_START" > "$dir/skipped.txt"
    echo "=== $name: skipped (deadline)"; snapshot; continue
  fi
  limit=$(( remaining < PS_TIMEOUT ? remaining : PS_TIMEOUT ))
  run=$RUNS_DIR/$(basename "$dir")
  cwd=$RUNS_DIR/scratch/cwd_$(basename "$dir")
  if [ "$KIND" = fw ]; then
    echo "=== $name (framework_suite, timeout ${limit} s)"
    run_fw "$name" "$limit"
    cat "$dir/rc.txt" 2>/dev/null | awk '{print "gpudiag exit " $1 ", " $2 " s"}'
  else
    if [ ! -f "$SCRIPT" ]; then
      echo "skipped: $SCRIPT missing (run prepare_examples.sh and carry .examples)" > "$dir/skipped.txt"
      echo "=== $name: $SCRIPT missing"; snapshot; continue
    fi
    rm -rf "$cwd"; mkdir -p "$cwd"
    script_args=()
    for a in "${ARGS[@]}"; do a=${a//\$CWD/$cwd}; script_args+=("${a//\$DATA_DIR/$DATA_DIR}"); done
    if [ "$PATCH_CPU" = 1 ]; then read -r -a more <<< "$(cpu_args "$name")"; script_args+=("${more[@]}"); fi
    script_args+=("${extra_args[@]}")
    printf '%q ' "${script_args[@]}" > "$dir/args.txt"; echo >> "$dir/args.txt"
    rm -rf "$run"
    cmd=("${gpudiag_cmd[@]}" profile -o "$run" --force "${profile_opts[@]}" "$SCRIPT" -- "${script_args[@]}")
    echo "=== $name (timeout ${limit} s)"
    { echo "cd $cwd"; printf '%q ' "${cmd[@]}"; echo; } | tee "$dir/command.txt"
    start=$SECONDS
    (cd "$cwd" && exec timeout -k 20 "$limit" "${cmd[@]}") > "$dir/profile.log" 2>&1
    rc=$?
    wall=$((SECONDS - start))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then  # timed out: end what this run left (nsys starts its own session)
      for p in /proc/[0-9]*; do
        [ "$(readlink "$p/cwd" 2>/dev/null)" = "$cwd" ] && kill -9 "${p#/proc/}" 2>/dev/null
      done
    fi
    echo "$rc $wall $limit" > "$dir/rc.txt"
    echo "gpudiag exit $rc$([ $rc -eq 124 ] && echo " (timeout ${limit} s)"), ${wall} s"
    for f in "$run"/*.json "$run/gpudiag.log" "$run/terminal.log"; do
      [ -f "$f" ] && [ "$(stat -c %s "$f")" -lt 20000000 ] && cp "$f" "$dir/"
    done
    ls -la "$run" > "$dir/run_files.txt" 2>/dev/null
    ls "$cwd" > "$dir/cwd_files.txt" 2>/dev/null
  fi
  echo "$SCRIPT" > "$dir/script.txt"
  "$PYTHON" "$here/collect.py" "$run" "$SCRIPT" "$dir" 2>&1 | tee "$dir/collect.log"
  "$PYTHON" "$here/summarize.py" "$out" --only "$(basename "$dir")" --quiet || true
  snapshot
done

rm -rf "$out/.fw"
"$PYTHON" "$here/summarize.py" "$out"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$out/summary.md" "$OUT/ps_${label}_summary.md" 2>/dev/null
fi
snapshot
echo "part ${label}: $((SECONDS - part_start)) s"
