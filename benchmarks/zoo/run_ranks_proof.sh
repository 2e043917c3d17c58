#!/usr/bin/env bash
# Device: issue 22's proof (docs/ranks_proof.md). Two ranks on one GPU (gloo: NCCL refuses two
# ranks on one device) running benchmarks/zoo/ddp_train.py, profiled in both launch forms:
#   a: gpudiag profile --nproc-per-node 2 ddp_train.py        (one capture of the whole job)
#   b: torchrun --nproc-per-node 2 -m gpudiag profile ...      (one capture per rank, OUT/rank<k>/)
# for DDP and FSDP2, plus a straggler (rank 1 sleeps 20 ms in its data step), then the same jobs
# by hand under torchrun, bare (rank 0 prints its median step, CUDA events after 4 warm-up steps).
#
#   source .devtools/nsys-env.sh
#   bash benchmarks/zoo/run_ranks_proof.sh OUT_DIR [RUN...]     # runs: ddp_a ddp_b fsdp_a fsdp_b straggler hand
#
# OUT_DIR/<run>/: profile.log (with exit code and wall time), report.json, script_status.json,
# bare_status.json, trial_*.json, gpudiag.log, rank<k>/ (form b), profile.sqlite.xz (form a).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
RUNS_DIR=${RUNS_DIR:-${TMPDIR:-/tmp}/gpudiag-rank-runs}
OPTS=${PROFILE_OPTS:---steps 8 --try none}
# NVLink multicast stays off wherever NCCL or PyTorch's symmetric memory could start (KINDS.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
script="$here/ddp_train.py"
out=${1:?usage: run_ranks_proof.sh OUT_DIR [RUN...]}; shift
[ $# -eq 0 ] && set -- ddp_a straggler fsdp_a ddp_b fsdp_b hand
mkdir -p "$out" "$RUNS_DIR"
snapshot() { [ -n "${OUT:-}" ] && [ -d "$OUT" ] && tar czf "$OUT/$1.tgz" -C "$out" "$1"; }

keep() {  # keep <name> <run dir>: the small files of one gpudiag run directory
  local dir=$out/$1 run=$2
  cp "$run"/report.json "$run"/script_status.json "$run"/bare_status.json "$run"/gpudiag.log "$dir"/ 2>/dev/null
  cp "$run"/trial_*.json "$run"/terminal.log "$dir"/ 2>/dev/null
  [ -f "$run/profile.sqlite" ] && xz -T0 -c "$run/profile.sqlite" > "$dir/profile.sqlite.xz"
  return 0
}

profile() {  # profile <name> <form a|b> [script args...]
  local name=$1 form=$2; shift 2
  # shellcheck disable=SC2206
  set -- "$@" ${ZOO_ARGS:-}  # e.g. ZOO_ARGS="--tiny --device cpu" for a dry run on a CPU with a fake nsys
  local dir=$out/$name run=$RUNS_DIR/$name start
  mkdir -p "$dir"; rm -rf "$run"; start=$(date +%s)
  if [ "$form" = a ]; then
    # shellcheck disable=SC2086
    $PYTHON -m gpudiag profile --nproc-per-node 2 "$script" -o "$run" --force $OPTS -- "$@" > "$dir/profile.log" 2>&1
  else
    # shellcheck disable=SC2086
    $PYTHON -m torch.distributed.run --standalone --nproc-per-node 2 -m gpudiag profile "$script" -o "$run" $OPTS \
      -- "$@" > "$dir/profile.log" 2>&1
  fi
  echo "exit $? wall_s $(( $(date +%s) - start ))" >> "$dir/profile.log"
  if [ "$form" = a ]; then keep "$name" "$run"; else
    for r in "$run"/rank*; do mkdir -p "$dir/$(basename "$r")"; keep "$name/$(basename "$r")" "$r"; rm -f "$dir/$(basename "$r")/profile.sqlite.xz"; done
  fi
  echo "== $name"; tail -2 "$dir/profile.log"
  snapshot "$name"
}

hand() {  # the jobs by hand under torchrun, bare: rank 0's median step (ms)
  mkdir -p "$out/hand"; : > "$out/hand/hand.tsv"
  for variant in "ddp:" "fsdp:--fsdp" "straggler:--straggle-rank 1 --straggle-ms 20"; do
    name=${variant%%:*}; flags=${variant#*:}
    # shellcheck disable=SC2086
    ms=$($PYTHON -m torch.distributed.run --standalone --nproc-per-node 2 "$script" --steps 14 --warmup 4 $flags ${ZOO_ARGS:-} \
         2>>"$out/hand/hand.err" | sed -n 's/.*median_step_ms \([0-9.]*\).*/\1/p')
    printf '%s\t%s\n' "$name" "${ms:-failed}" >> "$out/hand/hand.tsv"
    snapshot hand
  done
  cat "$out/hand/hand.tsv"
}

for run in "$@"; do
  case $run in
    ddp_a)     OPTS="--steps 8 --try-budget 120" profile ddp_a a ;;  # the default trials, under the launcher
    ddp_b)     profile ddp_b b ;;
    fsdp_a)    profile fsdp_a a --fsdp ;;
    fsdp_b)    profile fsdp_b b --fsdp ;;
    straggler) profile straggler a --straggle-rank 1 --straggle-ms 20 ;;
    hand)      hand ;;
    *) echo "unknown run $run" ;;
  esac
done
