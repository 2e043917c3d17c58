#!/usr/bin/env bash
# Device: run each zoo workload plain and under `gpudiag profile`, check that both runs print the
# same per-step losses/checksums, and collect what gpudiag wrote (benchmarks/zoo/README.md).
#
#   source .devtools/nsys-env.sh   # if nsys is not on PATH
#   bash benchmarks/zoo/run_zoo.sh OUT_DIR [WORKLOAD...]   # default: the core five; 'all': every variant
#   bash benchmarks/zoo/run_zoo.sh --list
#
# Per workload, OUT_DIR/<name>/ gets: commands.txt, plain.log and profiled.log (stdout+stderr),
# compare.txt (compare_losses.py), report.json, script_status.json, gpudiag.log, profile.sqlite.xz
# and status.txt; OUT_DIR/summary.tsv has one line per workload and OUT_DIR/env.txt the versions.
# A failing workload is recorded and the next one runs; the exit code is 1 if any failed.
#
# Environment: PYTHON (python3), GPUDIAG (command for gpudiag; default "$PYTHON -m gpudiag"),
# RUNS_DIR (where gpudiag's full run directories go; default ${TMPDIR:-/tmp}/gpudiag-zoo-runs),
# ZOO_TIMEOUT (seconds per run, default 300), PROFILE_OPTS (extra `gpudiag profile` options),
# ZOO_ARGS (appended to every script's arguments, e.g. "--tiny --device cpu --steps 4").
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
read -r -a gpudiag_cmd <<< "${GPUDIAG:-$PYTHON -m gpudiag}"
read -r -a profile_opts <<< "${PROFILE_OPTS:-}"
read -r -a extra_args <<< "${ZOO_ARGS:-}"
RUNS_DIR=${RUNS_DIR:-${TMPDIR:-/tmp}/gpudiag-zoo-runs}
ZOO_TIMEOUT=${ZOO_TIMEOUT:-300}

CORE="llama resnet50 bert_compile gpt2_decode vit"
ALL="llama resnet50 resnet50_cl resnet50_cl_compile bert_compile bert_compile_encoder bert_compile_ro bert_compile_ma bert_compile_ca bert_eager gpt2_decode gpt2_decode_user_graph gpt2_decode_eager vit"

# name -> script and arguments (GPU sizes: each plain + profiled pair is meant to stay under ~90 s)
workload() {
  case $1 in
    llama)                  echo "llama_train.py --steps 20" ;;
    resnet50)               echo "resnet50_train.py --steps 20" ;;
    resnet50_cl)            echo "resnet50_train.py --steps 20 --channels-last" ;;
    resnet50_cl_compile)    echo "resnet50_train.py --steps 20 --channels-last --compile" ;;
    bert_compile)           echo "bert_compile_train.py --steps 20" ;;
    bert_compile_encoder)   echo "bert_compile_train.py --steps 20 --compile-submodule" ;;
    bert_compile_ro)        echo "bert_compile_train.py --steps 20 --mode reduce-overhead" ;;
    bert_compile_ma)        echo "bert_compile_train.py --steps 20 --mode max-autotune" ;;
    bert_compile_ca)        echo "bert_compile_train.py --steps 20 --compiled-autograd" ;;
    bert_eager)             echo "bert_compile_train.py --steps 20 --no-compile" ;;
    gpt2_decode)            echo "gpt2_decode_graphs.py --steps 32" ;;
    gpt2_decode_user_graph) echo "gpt2_decode_graphs.py --steps 32 --user-graph" ;;
    gpt2_decode_eager)      echo "gpt2_decode_graphs.py --steps 32 --eager" ;;
    vit)                    echo "vit_inference.py --steps 20" ;;
    *) return 1 ;;
  esac
}

if [ "${1:-}" = "--list" ]; then
  for name in $ALL; do printf '%-24s %s\n' "$name" "$(workload "$name")"; done
  exit 0
fi
out=${1:?usage: run_zoo.sh OUT_DIR [WORKLOAD...|all] (run_zoo.sh --list shows the workloads)}
shift
names=("$@")
[ ${#names[@]} -eq 0 ] && read -r -a names <<< "$CORE"
[ "${names[*]}" = "all" ] && read -r -a names <<< "$ALL"
mkdir -p "$out" "$RUNS_DIR"
out=$(cd "$out" && pwd)

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname)"
  echo "git: $(git -C "$here" rev-parse --short HEAD 2>/dev/null) $(git -C "$here" status --porcelain 2>/dev/null | wc -l) changed files"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PYTHON" - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "triton", "transformers", "torchvision", "timm", "gpudiag"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"), *([f"cuda {module.version.cuda}"] if name == "torch" else []))
    except Exception as exc:  # noqa: BLE001
        print(name, "not importable:", type(exc).__name__, exc)
EOF
  echo "gpudiag command: ${gpudiag_cmd[*]}; extra profile options: ${profile_opts[*]:-none}; extra script args: ${extra_args[*]:-none}"
} > "$out/env.txt"
cat "$out/env.txt"

[ -f "$out/summary.tsv" ] || printf 'workload\tstatus\tplain_rc\tprofile_rc\tcompare_rc\tplain_median_ms\tprofiled_median_ms\tplain_s\tprofiled_s\tproblems\n' > "$out/summary.tsv"

compress() {  # compress SRC DEST (xz with all cores if there is one, else Python's lzma)
  if command -v xz > /dev/null; then
    xz -T0 -6 -c "$1" > "$2"
  else
    "$PYTHON" -c 'import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], "rb"), lzma.open(sys.argv[2], "wb", preset=6))' "$1" "$2"
  fi
}

median_of() { grep -m1 '^median_step_ms ' "$1" 2>/dev/null | awk '{print $2}'; }

failed=0
for name in "${names[@]}"; do
  echo "=== $name"
  dir=$out/$name
  mkdir -p "$dir"
  if ! spec=$(workload "$name"); then
    echo "unknown workload '$name' (run_zoo.sh --list)" | tee "$dir/status.txt"
    printf '%s\tFAIL\t-\t-\t-\t-\t-\t-\t-\tunknown workload\n' "$name" >> "$out/summary.tsv"
    failed=1
    continue
  fi
  read -r -a words <<< "$spec"
  script=$here/${words[0]}
  args=("${words[@]:1}" "${extra_args[@]}")
  run=$RUNS_DIR/$name
  rm -f "$dir"/{plain.log,profiled.log,compare.txt,report.json,script_status.json,gpudiag.log,profile.sqlite.xz,status.txt}
  {
    echo "$PYTHON $script ${args[*]}"
    echo "${gpudiag_cmd[*]} profile $script -o $run --force ${profile_opts[*]} -- ${args[*]}"
  } > "$dir/commands.txt"

  start=$SECONDS
  timeout -k 30 "$ZOO_TIMEOUT" "$PYTHON" "$script" "${args[@]}" > "$dir/plain.log" 2>&1
  plain_rc=$?
  plain_s=$((SECONDS - start))
  echo "plain run: exit $plain_rc, ${plain_s} s, median_step_ms $(median_of "$dir/plain.log")"

  start=$SECONDS
  timeout -k 30 "$ZOO_TIMEOUT" "${gpudiag_cmd[@]}" profile "$script" -o "$run" --force "${profile_opts[@]}" -- "${args[@]}" \
    > "$dir/profiled.log" 2>&1
  profile_rc=$?
  profiled_s=$((SECONDS - start))
  echo "profiled run: exit $profile_rc, ${profiled_s} s, median_step_ms $(median_of "$dir/profiled.log")"

  "$PYTHON" "$here/compare_losses.py" "$dir/plain.log" "$dir/profiled.log" > "$dir/compare.txt" 2>&1
  compare_rc=$?
  tail -1 "$dir/compare.txt"

  problems=()
  [ "$plain_rc" -eq 0 ] || problems+=("plain run exit $plain_rc$([ "$plain_rc" -eq 124 ] && echo ' (timeout)')")
  [ "$profile_rc" -eq 0 ] || problems+=("profiled run exit $profile_rc$([ "$profile_rc" -eq 124 ] && echo ' (timeout)')")
  [ "$compare_rc" -eq 0 ] || problems+=("compare_losses exit $compare_rc")
  for f in report.json script_status.json gpudiag.log; do
    cp "$run/$f" "$dir/" 2> /dev/null || problems+=("no $f")
  done
  if [ -f "$run/profile.sqlite" ]; then
    compress "$run/profile.sqlite" "$dir/profile.sqlite.xz" || problems+=("compressing profile.sqlite failed")
  else
    problems+=("no profile.sqlite")
  fi

  if [ ${#problems[@]} -eq 0 ]; then
    status=OK
  else
    status=FAIL
    failed=1
  fi
  detail=$(IFS=';'; echo "${problems[*]:-}")
  echo "$status${detail:+: $detail}" | tee "$dir/status.txt"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$plain_rc" "$profile_rc" "$compare_rc" \
    "$(median_of "$dir/plain.log")" "$(median_of "$dir/profiled.log")" "$plain_s" "$profiled_s" "$detail" >> "$out/summary.tsv"
done

echo "=== summary ($out/summary.tsv)"
column -t -s $'\t' "$out/summary.tsv" 2> /dev/null || cat "$out/summary.tsv"
exit $failed
