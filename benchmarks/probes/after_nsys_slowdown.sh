#!/usr/bin/env bash
# Device probe: is a host-bound script slower right after an nsys capture, and what is still
# running then? (docs/representativeness.md: runs right after a capture measured 14-56 % slower.)
#   source .devtools/nsys-env.sh; bash benchmarks/probes/after_nsys_slowdown.sh
set -u
script="benchmarks/zoo/generate_nvtx.py"
run() { python3 "$script" --steps 8 --warmup 3 2>/dev/null | sed -n 's/.*median_step_ms \([0-9.]*\).*/\1/p'; }
echo "before nsys: $(run) ms"
nsys profile --trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none --force-overwrite=true -o /tmp/probe_nsys \
  python3 "$script" --steps 6 > /tmp/probe_nsys.log 2>&1
echo "processes right after nsys:"; ps -eo pid,pcpu,etime,args | grep -i -E "nsys|qdstrm|quadd|cupti" | grep -v grep | cut -c1-160
echo "right after nsys: $(run) ms"
echo "again: $(run) ms"
sleep 20
echo "processes 20 s later:"; ps -eo pid,pcpu,etime,args | grep -i -E "nsys|qdstrm|quadd" | grep -v grep | cut -c1-160
echo "20 s later: $(run) ms"
