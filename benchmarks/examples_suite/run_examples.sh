#!/usr/bin/env bash
# Device: pytorch/examples scripts, unmodified, under `gpudiag profile --try none` (README.md here).
#
#   source .devtools/nsys-env.sh
#   bash benchmarks/examples_suite/run_examples.sh part1|part2|ddp|all|NAME... [-o OUT_DIR]
#   bash benchmarks/examples_suite/run_examples.sh --list
#
# The scripts are read from $EXAMPLES (default: .examples/ at the repository root, a copy of
# pytorch/examples that is never committed: prepare_examples.sh makes it). Each one runs from a
# fresh working directory under $RUNS_DIR/scratch (MNIST's fake raw files in $RUNS_DIR/scratch/data, the
# '../data' the mnist and vae scripts read), as
#   gpudiag profile --try none -o $RUNS_DIR/NAME --force SCRIPT -- ARGS
# and the DDP tutorial also as `python -m torch.distributed.run --nproc-per-node 2 -m gpudiag profile
# ...` (only with 2 GPUs or more; else 'skipped: one GPU'). One failing or hanging script never
# stops the others: each has EX_TIMEOUT seconds (default 150), and once the part has run
# PART_DEADLINE seconds (default 400) the scripts left are recorded as skipped.
#
# OUT_DIR (default ${TMPDIR:-/tmp}/gpudiag-examples) gets, per script, NAME/: command.txt, rc.txt
# (gpudiag's exit code and wall seconds), profile.log (gpudiag's terminal output, the script's
# output within it), and from the run directory report.json, script_status.json, bare_status.json,
# gpudiag.log (for the torchrun form: rank*/ with each rank's files and terminal.log); then
# summarize.py writes OUT_DIR/summary.json and OUT_DIR/summary.md. When $OUT is set (the device
# machine), OUT_DIR is tarred to $OUT/examples_PART.tar.gz after every script and the summary
# copied to $OUT/examples_PART_summary.md.
#
# Environment: PYTHON (python3), GPUDIAG ("$PYTHON -m gpudiag"), EXAMPLES, RUNS_DIR
# (${TMPDIR:-/tmp}/gpudiag-examples-runs), EX_TIMEOUT, PART_DEADLINE, PROFILE_OPTS (extra gpudiag
# options), EX_ARGS (appended to every script's arguments, e.g. '--no-accel' for a CPU dry run).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-python3}
read -r -a gpudiag_cmd <<< "${GPUDIAG:-$PYTHON -m gpudiag}"
read -r -a profile_opts <<< "${PROFILE_OPTS:-}"
read -r -a extra_args <<< "${EX_ARGS:-}"
EXAMPLES=${EXAMPLES:-$repo/.examples}
RUNS_DIR=${RUNS_DIR:-${TMPDIR:-/tmp}/gpudiag-examples-runs}
EX_TIMEOUT=${EX_TIMEOUT:-150}
PART_DEADLINE=${PART_DEADLINE:-400}
# NVLink multicast stays off on the shared hosts (KINDS.md); output unbuffered so logs are complete
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

PART1="imagenet_j0 imagenet_j4 word_lm dcgan"
PART2="vae mnist vision_recipe word_lm_adamw ddp_nproc ddp_torchrun"
DDP="ddp_nproc ddp_torchrun"

# NAME -> "FORM|SCRIPT|ARGS" (FORM: single, nproc (gpudiag --nproc-per-node 2), torchrun (torchrun -m
# gpudiag)); $CWD is the script's working directory. Sizes: each script runs past gpudiag's window
# (2 warm-up + 20 steps) by itself, which gpudiag then ends.
spec() {
  local E=$EXAMPLES
  case $1 in
    imagenet_j0)   echo "single|$E/imagenet/main.py|--dummy -a resnet18 -b 64 -j 0 --epochs 1 --print-freq 1" ;;
    imagenet_j4)   echo "single|$E/imagenet/main.py|--dummy -a resnet18 -b 64 -j 4 --epochs 1 --print-freq 1" ;;
    word_lm)       echo "single|$E/word_language_model/main.py|--data $E/word_language_model/data/wikitext-2 --accel --epochs 1 --log-interval 1 --save \$CWD/model.pt" ;;
    word_lm_adamw) echo "single|$E/word_language_model/main.py|--data $E/word_language_model/data/wikitext-2 --accel --epochs 1 --log-interval 1 --use-optimizer --lr 0.001 --save \$CWD/model.pt" ;;
    dcgan)         echo "single|$E/dcgan/main.py|--dataset fake --accel --niter 2 --workers 2 --manualSeed 1 --outf \$CWD/out" ;;
    vae)           echo "single|$E/vae/main.py|--epochs 1 --log-interval 1" ;;
    mnist)         echo "single|$E/mnist/main.py|--epochs 1 --log-interval 1" ;;
    vision_recipe) echo "single|$repo/benchmarks/zoo34/vision_recipe.py|--workers 2 --log-every 1" ;;
    ddp_nproc)     echo "nproc|$E/distributed/ddp-tutorial-series/multigpu_torchrun.py|3 100 --batch_size 32" ;;
    ddp_torchrun)  echo "torchrun|$E/distributed/ddp-tutorial-series/multigpu_torchrun.py|3 100 --batch_size 32" ;;
    *) return 1 ;;
  esac
}

if [ "${1:-}" = "--list" ]; then
  for n in $PART1 $PART2; do printf '%-14s %s\n' "$n" "$(spec "$n")"; done
  exit 0
fi
names=()
out=${TMPDIR:-/tmp}/gpudiag-examples
label=""
while [ $# -gt 0 ]; do
  case $1 in
    -o) out=$2; shift 2 ;;
    part1) read -r -a more <<< "$PART1"; names+=("${more[@]}"); label+="${label:+_}part1"; shift ;;
    part2) read -r -a more <<< "$PART2"; names+=("${more[@]}"); label+="${label:+_}part2"; shift ;;
    ddp)   read -r -a more <<< "$DDP"; names+=("${more[@]}"); label+="${label:+_}ddp"; shift ;;
    all)   read -r -a more <<< "$PART1 $PART2"; names+=("${more[@]}"); label+="${label:+_}all"; shift ;;
    *) names+=("$1"); label+="${label:+_}$1"; shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || { echo "usage: run_examples.sh part1|part2|ddp|all|NAME... [-o OUT_DIR] (--list)"; exit 2; }
label=${label:0:60}
mkdir -p "$out" "$RUNS_DIR/scratch"
out=$(cd "$out" && pwd)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname); cpus: $(nproc); gpus: ${ngpu:-0}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  echo "examples: $EXAMPLES (upstream $(cat "$EXAMPLES/UPSTREAM_COMMIT" 2>/dev/null || echo unknown))"
  echo "nsys: $(command -v nsys || echo "not on PATH; GPUDIAG_NSYS=${GPUDIAG_NSYS:-unset}")"
  "$PYTHON" -c 'import importlib
for n in ("torch", "torchvision", "transformers", "gpudiag"):
    try:
        m = importlib.import_module(n); print(n, getattr(m, "__version__", "?"))
    except Exception as e: print(n, "not importable:", e)' 2>&1
  echo "gpudiag command: ${gpudiag_cmd[*]}; options: ${profile_opts[*]:-none}; extra script args: ${extra_args[*]:-none}"
} > "$out/env.txt"
cat "$out/env.txt"

# fake MNIST once (mnist and vae read '../data' from their working directory)
[ -f "$RUNS_DIR/scratch/data/MNIST/raw/t10k-labels-idx1-ubyte" ] || \
  "$PYTHON" "$here/fake_mnist.py" "$RUNS_DIR/scratch/data" --train 10000 --test 2000

snapshot() {
  [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
  tar czf "$OUT/examples_$label.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" 2>/dev/null
}

part_start=$SECONDS
for name in "${names[@]}"; do
  dir=$out/$name
  rm -rf "$dir"; mkdir -p "$dir"
  if ! line=$(spec "$name"); then
    echo "unknown script name $name" | tee "$dir/skipped.txt"; continue
  fi
  IFS='|' read -r form script args <<< "$line"
  echo "$args" > "$dir/args.txt"
  if [ "$form" != single ] && [ "${ngpu:-0}" -lt 2 ]; then
    echo "skipped: one GPU (${ngpu:-0} visible)" > "$dir/skipped.txt"; echo "=== $name: skipped (${ngpu:-0} GPU visible)"; snapshot; continue
  fi
  if [ $((SECONDS - part_start)) -gt "$PART_DEADLINE" ]; then
    echo "skipped: part deadline (${PART_DEADLINE} s) passed" > "$dir/skipped.txt"; echo "=== $name: skipped (deadline)"; snapshot; continue
  fi
  if [ ! -f "$script" ]; then
    echo "skipped: $script missing (run prepare_examples.sh and carry .examples)" > "$dir/skipped.txt"
    echo "=== $name: $script missing"; snapshot; continue
  fi
  cwd=$RUNS_DIR/scratch/cwd_$name
  rm -rf "$cwd"; mkdir -p "$cwd/results" "$cwd/out"
  read -r -a script_args <<< "${args//\$CWD/$cwd}"
  script_args+=("${extra_args[@]}")
  run=$RUNS_DIR/$name
  rm -rf "$run"
  case $form in
    single)   cmd=("${gpudiag_cmd[@]}" profile --try none -o "$run" --force "${profile_opts[@]}" "$script" -- "${script_args[@]}") ;;
    nproc)    cmd=("${gpudiag_cmd[@]}" profile --nproc-per-node 2 --try none -o "$run" --force "${profile_opts[@]}" "$script" -- "${script_args[@]}") ;;
    torchrun) cmd=("$PYTHON" -m torch.distributed.run --nproc-per-node 2 -m gpudiag profile --try none -o "$run" --force
                   "${profile_opts[@]}" "$script" -- "${script_args[@]}") ;;
  esac
  echo "=== $name"
  printf '%s\n' "cd $cwd" "${cmd[*]}" | tee "$dir/command.txt"
  start=$SECONDS
  (cd "$cwd" && exec timeout -k 20 "$EX_TIMEOUT" "${cmd[@]}") > "$dir/profile.log" 2>&1
  rc=$?
  wall=$((SECONDS - start))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then  # timed out: end what this run left (nsys starts its own session)
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/cwd" 2>/dev/null)" = "$cwd" ] && kill -9 "${p#/proc/}" 2>/dev/null
    done
  fi
  echo "$rc $wall" > "$dir/rc.txt"
  echo "gpudiag exit $rc$([ $rc -eq 124 ] && echo ' (timeout)'), ${wall} s"
  for f in report.json script_status.json bare_status.json gpudiag.log terminal.log; do
    [ -f "$run/$f" ] && cp "$run/$f" "$dir/"
  done
  for rank in "$run"/rank*; do
    [ -d "$rank" ] || continue
    mkdir -p "$dir/$(basename "$rank")"
    for f in report.json script_status.json bare_status.json gpudiag.log terminal.log; do
      [ -f "$rank/$f" ] && cp "$rank/$f" "$dir/$(basename "$rank")/"
    done
  done
  ls "$cwd" > "$dir/cwd_files.txt" 2>/dev/null
  "$PYTHON" "$here/summarize.py" "$out" --only "$name" --quiet || true
  snapshot
done

"$PYTHON" "$here/summarize.py" "$out"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$out/summary.md" "$OUT/examples_${label}_summary.md" 2>/dev/null
fi
snapshot
