#!/usr/bin/env bash
# Device probe (2026-11-25): why did the bf16-autocast trial measure 31.7 ms/step on ConvNeXt-T
# training (H100) where the same change by hand measured 22.1 ms? Same machine, one call:
# the hand change around the call and as model.forward, then the launcher with the hand flag, then
# the trial, then the trial with the launcher's forward hooks logged. Prints one line per variant.
set -u
cd "$(dirname "$0")/../zoo"
S=(timm_fp32_train.py --model ${MODEL:-convnext_tiny} --steps 14 --warmup 4)
med() { python3 -c "import json,statistics,sys; d=json.load(open(sys.argv[1])); v=[x for k,x in d['step_gpu_ns'].items() if int(k)>=5]; print(round(statistics.median(v)/1e6,3), 'ms', d.get('trial'))" "$1"; }
echo "hand bf16 (call):    $(python3 "${S[@]}" --bf16-autocast | grep median)"
echo "hand bf16 (forward): $(python3 "${S[@]}" --bf16-autocast --autocast-form forward | grep median)"
CFG='{"bare": true, "warmup_steps": 4, "window_steps": 10'
python3 -m gpudiag.capture.launch --config "$CFG}" --status /tmp/s1.json "${S[@]}" --bf16-autocast > /tmp/l1.log 2>&1
echo "launcher + hand flag: $(med /tmp/s1.json)"
python3 -m gpudiag.capture.launch --config "$CFG, \"trial\": \"bf16-autocast\"}" --status /tmp/s2.json "${S[@]}" > /tmp/l2.log 2>&1
echo "launcher trial:       $(med /tmp/s2.json)"
python3 -m gpudiag.capture.launch --config "$CFG, \"trial\": \"tf32\"}" --status /tmp/s3.json "${S[@]}" > /tmp/l3.log 2>&1
echo "launcher trial tf32:  $(med /tmp/s3.json)"
tail -3 /tmp/l2.log
