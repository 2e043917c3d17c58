#!/usr/bin/env bash
# Device (two GPUs, NCCL): issue 22's distributed rules on real collectives (docs/ranks_proof.md).
# Profiles a data-parallel zoo script in form a (gpudiag profile --nproc-per-node 2), then runs
# its variants by hand under torchrun, bare (rank 0's median step, CUDA events after 4 warm-up).
#
#   source .devtools/nsys-env.sh
#   bash benchmarks/zoo/run_nccl_proof.sh OUT_DIR SCRIPT [RUN...]
#   RUN: name:transport:script flags, e.g. ddp:shm: or fsdp:shm:--fsdp  (profiled)
#        hand:name:transport:flags                                         (bare, by hand)
# transport: p2p (NCCL's default, NVLink) or shm (NCCL_P2P_DISABLE=1: through host memory, as on
# GPUs without peer access). OUT_DIR/<name>/: profile.log, report.json, statuses, profile.sqlite.xz;
# OUT_DIR/hand.tsv: name, transport, flags, median_step_ms.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
RUNS_DIR=${RUNS_DIR:-${TMPDIR:-/tmp}/gpudiag-nccl-runs}
OPTS=${PROFILE_OPTS:---steps 8 --try none}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # KINDS.md
out=${1:?usage: run_nccl_proof.sh OUT_DIR SCRIPT [RUN...]}; script=$here/${2:?script}; shift 2
mkdir -p "$out" "$RUNS_DIR"
snapshot() { [ -n "${OUT:-}" ] && [ -d "$OUT" ] && tar czf "$OUT/$(basename "$out").tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
transport() { if [ "$1" = shm ]; then echo NCCL_P2P_DISABLE=1; else echo NCCL_P2P_DISABLE=0; fi; }

profile() {  # profile <name> <transport> [script flags...]
  local name=$1 env; env=$(transport "$2"); shift 2
  local dir=$out/$name run=$RUNS_DIR/$name start
  mkdir -p "$dir"; rm -rf "$run"; start=$(date +%s)
  # shellcheck disable=SC2086
  env "$env" $PYTHON -m gpudiag profile --nproc-per-node 2 "$script" -o "$run" --force $OPTS -- "$@" > "$dir/profile.log" 2>&1
  echo "exit $? wall_s $(( $(date +%s) - start ))" >> "$dir/profile.log"
  cp "$run"/report.json "$run"/script_status.json "$run"/bare_status.json "$run"/terminal.log "$run"/trial_*.json "$dir"/ 2>/dev/null
  [ -f "$run/profile.sqlite" ] && xz -T0 -c "$run/profile.sqlite" > "$dir/profile.sqlite.xz"
  echo "== $name"; tail -2 "$dir/profile.log"
}

hand() {  # hand <name> <transport> [script flags...]
  local name=$1 tr=$2 env; env=$(transport "$2"); shift 2
  # shellcheck disable=SC2068
  ms=$(env "$env" $PYTHON -m torch.distributed.run --standalone --nproc-per-node 2 "$script" --steps 14 --warmup 4 $@ \
       2>>"$out/hand.err" | sed -n 's/.*median_step_ms \([0-9.]*\).*/\1/p')
  printf '%s\t%s\t%s\t%s\n' "$name" "$tr" "$*" "${ms:-failed}" | tee -a "$out/hand.tsv"
}

for run in "$@"; do
  IFS=: read -r a b c d <<< "$run"
  if [ "$a" = hand ]; then hand "$b" "$c" $d; else profile "$a" "$b" $c; fi
  snapshot
done
