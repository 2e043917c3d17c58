#!/usr/bin/env bash
# Device: training scripts run through four frameworks (Lightning, the HF Trainer, Accelerate,
# timm's train.py), unmodified, under `gpudiag profile` with its DEFAULT options, plus the by-hand
# changes timed bare (README.md here).
#
#   source .devtools/nsys-env.sh
#   bash benchmarks/framework_suite/run_suite.sh part1|part2|group1|group2|group3|hand1|hand2|hand|all|NAME... [-o OUT_DIR]
#   bash benchmarks/framework_suite/run_suite.sh --list
#
# part1: our own workloads (this folder): lightning_resnet50 hf_trainer_bert accelerate_accum
#        lightning_closure_lbfgs loader_bound
# part2: upstream scripts copied into .frameworks/ by prepare_frameworks.sh: pl_transformer
#        (Lightning's examples/pytorch/basics/transformer.py), hf_run_clm (transformers'
#        run_clm.py), accel_cv_example (Accelerate's examples/cv_example.py), timm_train (timm's
#        train.py); their data is made first, on the machine, by make_data.py (~10-20 s)
# group1/group2/group3: the nine in threes (for calls with trials): lightning_resnet50
#        hf_trainer_bert accelerate_accum | loader_bound lightning_closure_lbfgs pl_transformer |
#        hf_run_clm timm_train accel_cv_example
# hand1: hand.sh for lightning_resnet50 and hf_trainer_bert; hand2: accelerate_accum, loader_bound;
#        hand: all four (NAME hand:WORKLOAD runs one; HAND_<WORKLOAD>='--change a|--change b'
#        replaces its arms; ROUNDS (default 3) is hand.sh's)
#
# Each profiled script runs from a fresh working directory $RUNS_DIR/scratch/cwd_NAME as
#   $GPUDIAG profile -o $RUNS_DIR/NAME --force $PROFILE_OPTS SCRIPT -- ARGS
# (PROFILE_OPTS empty: gpudiag's defaults: bare run, 2 warm-up + 20-step window, analysis, then
# --try auto within --try-budget 300 s). One failing or hanging script never stops the others:
# each gets FW_TIMEOUT seconds (default 480), cut to what is left of PART_DEADLINE (default 540 s
# from the part's start, data making included); a script is not started with less than FW_MIN_START
# seconds left (default 150): it is recorded as skipped, to run by name in the next call.
#
# OUT_DIR (default ${TMPDIR:-/tmp}/gpudiag-fw) gets, per script, NAME/: command.txt, args.txt,
# rc.txt (exit code, wall seconds), profile.log (gpudiag's terminal output), and from the run
# directory report.json, script_status.json, bare_status.json, gpudiag.log, stage_times.json and
# the trial_*.json files; per hand workload, hand_WORKLOAD/ (runs.tsv, run_NN_ARM.log,
# interval.json, hand.json); env.txt; then summarize.py writes summary.json and summary.md. With
# $OUT set (the device machine), OUT_DIR is tarred to $OUT/fw_LABEL.tar.gz after every script and
# the summary copied to $OUT/fw_LABEL_summary.md (2 files).
#
# Environment: PYTHON (python3), GPUDIAG ("$PYTHON -m gpudiag"), FRAMEWORKS (.frameworks at the
# repository root), RUNS_DIR (${TMPDIR:-/tmp}/gpudiag-fw-runs), DATA_DIR ($RUNS_DIR/data),
# FW_TIMEOUT, FW_MIN_START, PART_DEADLINE, PROFILE_OPTS, FW_ARGS (appended to every profiled
# script's arguments), FW_CPU=1 (CPU dry run: small sizes and CPU flags; see fw_cpu_args below).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-python3}
read -r -a gpudiag_cmd <<< "${GPUDIAG:-$PYTHON -m gpudiag}"
read -r -a profile_opts <<< "${PROFILE_OPTS:-}"
read -r -a extra_args <<< "${FW_ARGS:-}"
FRAMEWORKS=${FRAMEWORKS:-$repo/.frameworks}
RUNS_DIR=${RUNS_DIR:-${TMPDIR:-/tmp}/gpudiag-fw-runs}
DATA_DIR=${DATA_DIR:-$RUNS_DIR/data}
FW_TIMEOUT=${FW_TIMEOUT:-480}
FW_MIN_START=${FW_MIN_START:-150}
PART_DEADLINE=${PART_DEADLINE:-540}
FW_CPU=${FW_CPU:-0}
# NVLink multicast stays off on the shared hosts (KINDS.md); output unbuffered so logs are complete;
# no network there: the Hugging Face libraries read only local files and caches
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HOME=$DATA_DIR/hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# `python -m gpudiag` runs from each script's own working directory: this checkout's gpudiag first
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}

PART1="lightning_resnet50 hf_trainer_bert accelerate_accum lightning_closure_lbfgs loader_bound"
PART2="pl_transformer hf_run_clm accel_cv_example timm_train"
# groups of three for calls that run trials (README: what fits a 10-minute call with which options)
GROUP1="lightning_resnet50 hf_trainer_bert accelerate_accum"
GROUP2="loader_bound lightning_closure_lbfgs pl_transformer"
GROUP3="hf_run_clm timm_train accel_cv_example"
HAND1="hand:lightning_resnet50 hand:hf_trainer_bert"
HAND2="hand:accelerate_accum hand:loader_bound"

TIMM_SCRIPT=""
timm_train_py() {  # sets TIMM_SCRIPT: the train.py for the installed timm (HEAD's needs timm >= 1.0.29)
  [ -n "$TIMM_SCRIPT" ] && return 0
  local v
  v=$("$PYTHON" -c 'import timm; print(timm.__version__)' 2>/dev/null || echo 0)
  TIMM_SCRIPT=$FRAMEWORKS/timm/train.py
  if [ -f "$FRAMEWORKS/timm/train_v1.0.28.py" ] && [ "$(printf '%s\n' "$v" 1.0.29 | sort -V | head -1)" != 1.0.29 ]; then
    TIMM_SCRIPT=$FRAMEWORKS/timm/train_v1.0.28.py
  fi
}

# spec NAME: sets SCRIPT, ARGS (array; $CWD and $DATA_DIR are expanded when it runs), NEEDS (what
# make_data.py must make first), SETUP (a function run in the fresh working directory) or fails.
spec() {
  NEEDS=""; SETUP=":"; ARGS=()
  local F=$FRAMEWORKS
  case $1 in
    lightning_resnet50)      SCRIPT=$here/lightning_resnet50.py; ARGS=(--accumulate-grad-batches 2 --max-steps 200) ;;
    hf_trainer_bert)         SCRIPT=$here/hf_trainer_bert.py; ARGS=(--gradient-accumulation-steps 2 --max-steps 200) ;;
    accelerate_accum)        SCRIPT=$here/accelerate_accum.py; ARGS=(--grad-accum 4 --max-steps 200) ;;
    lightning_closure_lbfgs) SCRIPT=$here/lightning_closure_lbfgs.py; ARGS=(--max-steps 200) ;;
    loader_bound)            SCRIPT=$here/loader_bound.py; ARGS=(--workers 0 --max-steps 200) ;;
    pl_transformer)
      SCRIPT=$F/lightning/examples/pytorch/basics/transformer.py; NEEDS=text
      SETUP='mkdir -p data && ln -sf "$DATA_DIR/text/wikitext-2.txt" data/wikitext-2.txt' ;;
    hf_run_clm)
      SCRIPT=$F/transformers/examples/pytorch/language-modeling/run_clm.py; NEEDS=text,tokenizer
      ARGS=(--model_type gpt2 --tokenizer_name '$DATA_DIR/tokenizer' --train_file '$DATA_DIR/text/wikitext-2.txt'
            --do_train --per_device_train_batch_size 8 --gradient_accumulation_steps 2 --block_size 512
            --max_steps 200 --logging_steps 1 --save_strategy no --report_to none --output_dir '$CWD/out' --seed 0) ;;
    accel_cv_example)
      SCRIPT=$F/accelerate/examples/cv_example.py; NEEDS=images,timm-hub; ARGS=(--data_dir '$DATA_DIR/pets') ;;
    timm_train)
      timm_train_py; SCRIPT=$TIMM_SCRIPT; NEEDS=images
      ARGS=('$DATA_DIR/imagefolder' --model resnet50 --num-classes 10 --batch-size 64 --amp --grad-accum-steps 2
            --epochs 2 --log-interval 1 --workers 8 --output '$CWD/out' --experiment timm_train) ;;
    *) return 1 ;;
  esac
}

# hand_spec WORKLOAD: sets HSCRIPT, HBASE (base arguments of every run) and HARMS (the changes)
hand_spec() {
  local var
  case $1 in
    lightning_resnet50) HSCRIPT=$here/lightning_resnet50.py; HBASE="--accumulate-grad-batches 2 --max-steps 35 --num-samples 1280"
                        HARMS=("--precision bf16-mixed" "--channels-last" "--workers 8 --pin-memory") ;;
    hf_trainer_bert)    HSCRIPT=$here/hf_trainer_bert.py; HBASE="--gradient-accumulation-steps 2 --max-steps 35"
                        HARMS=("--bf16" "--tf32") ;;
    accelerate_accum)   HSCRIPT=$here/accelerate_accum.py; HBASE="--grad-accum 4 --max-steps 35"
                        HARMS=("--mixed-precision bf16" "--tf32") ;;
    loader_bound)       HSCRIPT=$here/loader_bound.py; HBASE="--workers 0 --max-steps 35"
                        HARMS=("--workers 8 --pin-memory") ;;
    lightning_closure_lbfgs) HSCRIPT=$here/lightning_closure_lbfgs.py; HBASE="--max-steps 35"; HARMS=("--tf32") ;;
    *) return 1 ;;
  esac
  var="HAND_$1"
  if [ -n "${!var:-}" ]; then IFS='|' read -r -a HARMS <<< "${!var}"; fi
  [ "$FW_CPU" = 1 ] && HBASE="$HBASE --tiny --max-steps 4"
  return 0
}

# CPU dry run: small sizes and the scripts' own CPU switches (not for the GPU machine)
fw_cpu_args() {
  case $1 in
    lightning_resnet50|hf_trainer_bert|accelerate_accum|lightning_closure_lbfgs|loader_bound) echo "--tiny --max-steps 30" ;;
    hf_run_clm) echo "--use_cpu --config_overrides n_layer=2,n_embd=64,n_head=2 --block_size 64 --per_device_train_batch_size 2" ;;
    accel_cv_example) echo "--cpu" ;;
    timm_train) echo "--device cpu --model resnet18 --img-size 64 --batch-size 8 --workers 2" ;;
  esac
}

if [ "${1:-}" = "--list" ]; then
  for n in $PART1 $PART2; do spec "$n"; printf '%-24s %s %s\n' "$n" "${SCRIPT#$repo/}" "${ARGS[*]}"; done
  for n in $HAND1 $HAND2; do hand_spec "${n#hand:}"; printf '%-24s %s | %s\n' "$n" "$HBASE" "$(IFS='|'; echo "${HARMS[*]}")"; done
  exit 0
fi
names=()
out=${TMPDIR:-/tmp}/gpudiag-fw
label=""
while [ $# -gt 0 ]; do
  case $1 in
    -o) out=$2; shift 2 ;;
    part1) read -r -a more <<< "$PART1"; names+=("${more[@]}"); label+="${label:+_}part1"; shift ;;
    part2) read -r -a more <<< "$PART2"; names+=("${more[@]}"); label+="${label:+_}part2"; shift ;;
    group1|group2|group3)
      var=${1^^}; read -r -a more <<< "${!var}"; names+=("${more[@]}"); label+="${label:+_}$1"; shift ;;
    hand1) read -r -a more <<< "$HAND1"; names+=("${more[@]}"); label+="${label:+_}hand1"; shift ;;
    hand2) read -r -a more <<< "$HAND2"; names+=("${more[@]}"); label+="${label:+_}hand2"; shift ;;
    hand)  read -r -a more <<< "$HAND1 $HAND2"; names+=("${more[@]}"); label+="${label:+_}hand"; shift ;;
    all)   read -r -a more <<< "$PART1 $PART2"; names+=("${more[@]}"); label+="${label:+_}all"; shift ;;
    *) names+=("$1"); label+="${label:+_}${1//:/-}"; shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || { echo "usage: run_suite.sh part1|part2|group1|group2|group3|hand1|hand2|hand|all|NAME... [-o OUT_DIR] (--list)"; exit 2; }
label=${label:0:60}
part_start=$SECONDS
mkdir -p "$out" "$RUNS_DIR/scratch"
out=$(cd "$out" && pwd)

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname); cpus: $(nproc); gpus: $(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 0)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  echo "nsys: $(command -v nsys || echo "not on PATH; GPUDIAG_NSYS=${GPUDIAG_NSYS:-unset}")"
  echo "frameworks: $FRAMEWORKS"; sed 's/^/  /' "$FRAMEWORKS/UPSTREAM.txt" 2>/dev/null
  "$PYTHON" -c 'import importlib
for n in ("torch", "torchvision", "lightning", "transformers", "accelerate", "timm", "datasets", "evaluate",
          "sqlite_utils", "plotly", "click", "pyarrow", "fsspec", "huggingface_hub", "gpudiag"):
    try:
        m = importlib.import_module(n); print(n, getattr(m, "__version__", "?"), getattr(m, "__file__", ""))
    except Exception as e: print(n, "not importable:", e)' 2>&1
  echo "gpudiag command: ${gpudiag_cmd[*]}; options: ${profile_opts[*]:-defaults}; extra script args: ${extra_args[*]:-none}; FW_CPU=$FW_CPU"
  echo "FW_TIMEOUT=$FW_TIMEOUT FW_MIN_START=$FW_MIN_START PART_DEADLINE=$PART_DEADLINE"
} > "$out/env.txt"
cat "$out/env.txt"

snapshot() {
  [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
  tar czf "$OUT/fw_$label.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" 2>/dev/null
}

# what the chosen scripts need, made once (kept in DATA_DIR for later calls on the same machine)
needs=""
for name in "${names[@]}"; do spec "$name" 2>/dev/null && needs+="${needs:+,}$NEEDS"; done
needs=$(tr ',' '\n' <<< "$needs" | grep -v '^$' | sort -u | paste -sd, -)
if [ -n "$needs" ]; then
  data_args=()
  [ "$FW_CPU" = 1 ] && data_args=(--images 640 --val-images 64 --pet-images 400 --words 200000)
  echo "=== data: $needs"
  start=$SECONDS
  "$PYTHON" "$here/make_data.py" "$DATA_DIR" --what "$needs" "${data_args[@]}" 2>&1 | tee "$out/make_data.log"
  echo "data made in $((SECONDS - start)) s" | tee -a "$out/make_data.log"
fi

left() { echo $((PART_DEADLINE - (SECONDS - part_start))); }

run_hand() {
  local workload=$1 dir=$out/hand_$1 remaining
  rm -rf "$dir"; mkdir -p "$dir"
  if ! hand_spec "$workload"; then echo "no hand spec for $workload" | tee "$dir/skipped.txt"; return; fi
  remaining=$(left)
  if [ "$remaining" -lt 60 ]; then
    echo "skipped: part deadline (${PART_DEADLINE} s) passed" > "$dir/skipped.txt"; echo "=== hand:$workload: skipped (deadline)"; return
  fi
  echo "=== hand:$workload (${remaining} s left)"
  HAND_DIR=$dir BASE_ARGS="$HBASE" HAND_STOP_AT=$(( $(date +%s) + remaining )) PYTHON=$PYTHON \
    bash "$here/hand.sh" "$workload" "$HSCRIPT" "${HARMS[@]}"
}

for name in "${names[@]}"; do
  if [ "${name#hand:}" != "$name" ]; then run_hand "${name#hand:}"; snapshot; continue; fi
  dir=$out/$name
  rm -rf "$dir"; mkdir -p "$dir"
  if ! spec "$name"; then echo "unknown script name $name" | tee "$dir/skipped.txt"; continue; fi
  remaining=$(left)
  if [ "$remaining" -lt "$FW_MIN_START" ]; then
    echo "skipped: ${remaining} s left of the part deadline (${PART_DEADLINE} s), fewer than FW_MIN_START=$FW_MIN_START" > "$dir/skipped.txt"
    echo "=== $name: skipped (deadline)"; snapshot; continue
  fi
  if [ ! -f "$SCRIPT" ]; then
    echo "skipped: $SCRIPT missing (run prepare_frameworks.sh and carry .frameworks)" > "$dir/skipped.txt"
    echo "=== $name: $SCRIPT missing"; snapshot; continue
  fi
  cwd=$RUNS_DIR/scratch/cwd_$name
  rm -rf "$cwd"; mkdir -p "$cwd"
  (cd "$cwd" && DATA_DIR=$DATA_DIR eval "$SETUP")
  script_args=()
  for a in "${ARGS[@]}"; do a=${a//\$CWD/$cwd}; script_args+=("${a//\$DATA_DIR/$DATA_DIR}"); done
  if [ "$FW_CPU" = 1 ]; then read -r -a cpu_args <<< "$(fw_cpu_args "$name")"; script_args+=("${cpu_args[@]}"); fi
  script_args+=("${extra_args[@]}")
  printf '%q ' "${script_args[@]}" > "$dir/args.txt"; echo >> "$dir/args.txt"
  run=$RUNS_DIR/$name
  rm -rf "$run"
  cmd=("${gpudiag_cmd[@]}" profile -o "$run" --force "${profile_opts[@]}" "$SCRIPT" -- "${script_args[@]}")
  limit=$(( remaining < FW_TIMEOUT ? remaining : FW_TIMEOUT ))
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
  "$PYTHON" "$here/summarize.py" "$out" --only "$name" --quiet || true
  snapshot
done

"$PYTHON" "$here/summarize.py" "$out"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$out/summary.md" "$OUT/fw_${label}_summary.md" 2>/dev/null
fi
snapshot
echo "part ${label}: $((SECONDS - part_start)) s"
