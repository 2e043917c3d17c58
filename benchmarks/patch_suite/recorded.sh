#!/usr/bin/env bash
# Device: the top measured win of runs already profiled on a GPU (their report.json committed),
# handed back as a patch and verified by running it (verify_recorded.py), one workload after another:
#
#   source .devtools/nsys-env.sh   # not needed: nothing is profiled here
#   bash benchmarks/patch_suite/recorded.sh NAME... [-o OUT_DIR]
#   bash benchmarks/patch_suite/recorded.sh --list
#
# Names: the framework suite's own workloads (their H200 reports of 2026-11-28) and the zoo's
# recorded trials (tests/fixtures/trials: H200 and H100 reports). Each runs from a fresh working
# directory with its recorded arguments; OUT_DIR (default ${TMPDIR:-/tmp}/patch-rec) gets NAME/
# (verify_recorded.json, changes/, the runs' status files, log.txt); with $OUT set it is tarred to
# $OUT/rec_LABEL.tar.gz after every workload. Budget: REC_BUDGET seconds of verification runs per
# workload (default 150); no workload starts with less than REC_MIN_START (120) s left of
# REC_DEADLINE (540) s from the start.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-python3}
REC_BUDGET=${REC_BUDGET:-150}
REC_MIN_START=${REC_MIN_START:-120}
REC_DEADLINE=${REC_DEADLINE:-540}
FW=$repo/benchmarks/framework_suite
FWDATA=$repo/benchmarks/data/framework_suite/h200-2026-11-28
ZOO=$repo/benchmarks/zoo
TRIALS=$repo/tests/fixtures/trials
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}

# spec NAME: sets REPORT and SCRIPT (the recorded run's arguments are used)
spec() {
  PREP=""
  case $1 in
    lightning_resnet50) REPORT=$FWDATA/call2-fw-gpu0/lightning_resnet50/report.json.xz; SCRIPT=$FW/lightning_resnet50.py ;;
    hf_trainer_bert)    REPORT=$FWDATA/call1-fw-gpu1/hf_trainer_bert/report.json.xz; SCRIPT=$FW/hf_trainer_bert.py ;;
    accelerate_accum)   REPORT=$FWDATA/call2-fw-gpu1/accelerate_accum/report.json.xz; SCRIPT=$FW/accelerate_accum.py ;;
    loader_bound)       REPORT=$FWDATA/call2-fw-gpu0/loader_bound/report.json.xz; SCRIPT=$FW/loader_bound.py ;;
    accel_cv_example)   REPORT=$FWDATA/call3-fw-gpu1/accel_cv_example/report.json.xz
                        SCRIPT=$repo/.frameworks/accelerate/examples/cv_example.py
                        # its recorded arguments name /tmp/fw-runs-gpu1/data/pets: the data is made there
                        PREP="$PYTHON $FW/make_data.py /tmp/fw-runs-gpu1/data --what images,timm-hub"
                        export HF_HOME=/tmp/fw-runs-gpu1/data/hf HF_HUB_OFFLINE=1 ;;
    pt_mnist)           REPORT=$repo/benchmarks/data/patch_suite/h200-2026-11-28/call7/ps-gpu0/pt_mnist/report.json
                        SCRIPT=$repo/.examples/mnist/main.py
                        # it reads ../data from its working directory (a fresh one under /tmp)
                        PREP="$PYTHON $here/make_data.py /tmp/data --what mnist --mnist-root /tmp/data" ;;
    zoo_gnn)            REPORT=$TRIALS/gnn_h200/report.json.xz; SCRIPT=$ZOO/gnn_train.py ;;
    zoo_lstm)           REPORT=$TRIALS/lstm_h200/report.json.xz; SCRIPT=$ZOO/lstm_lm_train.py ;;
    zoo_vit)            REPORT=$TRIALS/vit_h100/report.json.xz; SCRIPT=$ZOO/timm_fp32_train.py ;;
    zoo_decoder)        REPORT=$TRIALS/decoder_h100/report.json.xz; SCRIPT=$ZOO/infer_zoo.py ;;
    zoo_seq2seq)        REPORT=$TRIALS/seq2seq_h100/report.json.xz; SCRIPT=$ZOO/infer_zoo.py ;;
    *) return 1 ;;
  esac
}

if [ "${1:-}" = "--list" ]; then
  for n in lightning_resnet50 hf_trainer_bert accelerate_accum loader_bound accel_cv_example pt_mnist zoo_gnn zoo_lstm zoo_vit zoo_decoder zoo_seq2seq; do
    spec "$n"; echo "$n ${SCRIPT#$repo/} ${REPORT#$repo/}"; done
  exit 0
fi
names=()
out=${TMPDIR:-/tmp}/patch-rec
while [ $# -gt 0 ]; do
  case $1 in -o) out=$2; shift 2 ;; *) names+=("$1"); shift ;; esac
done
[ ${#names[@]} -gt 0 ] || { echo "usage: recorded.sh NAME... [-o OUT_DIR] (--list)"; exit 2; }
label=$(IFS=_; echo "${names[*]}")
mkdir -p "$out"
start=$(date +%s)
for name in "${names[@]}"; do
  left=$((REC_DEADLINE - ($(date +%s) - start)))
  mkdir -p "$out/$name"
  if ! spec "$name"; then echo "unknown name $name" | tee "$out/$name/skipped.txt"; continue; fi
  if [ $left -lt "$REC_MIN_START" ]; then echo "skipped: ${left} s left" | tee "$out/$name/skipped.txt"; continue; fi
  budget=$(( left - 20 < REC_BUDGET ? left - 20 : REC_BUDGET ))
  cwd=$(mktemp -d)
  if [ -n "$PREP" ]; then $PREP > "$out/$name/prep.log" 2>&1 || echo "prep failed" >> "$out/$name/prep.log"; fi
  echo "=== $name ($left s left, verification budget $budget s)"
  (cd "$cwd" && timeout -k 10 $((left - 5)) "$PYTHON" "$here/verify_recorded.py" -o "$out/$name" --budget "$budget" \
     "$REPORT" "$SCRIPT") > "$out/$name/log.txt" 2>&1
  echo "exit $?" >> "$out/$name/log.txt"
  tail -2 "$out/$name/log.txt"
  # the runs' own output is in gpudiag.log; keep its tail only
  [ -f "$out/$name/gpudiag.log" ] && tail -c 20000 "$out/$name/gpudiag.log" > "$out/$name/gpudiag_tail.log" && rm "$out/$name/gpudiag.log"
  rm -rf "$out/$name/changes"/*/src "$cwd"
  [ -n "${OUT:-}" ] && tar -czf "$OUT/rec_$label.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
done
echo "recorded.sh: $((($(date +%s) - start))) s"
