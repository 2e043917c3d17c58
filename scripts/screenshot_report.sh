#!/usr/bin/env bash
# Screenshot a report.html in headless Chromium (Debian's `chromium` package):
#   scripts/screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]
# The flags keep Chromium off the network (the report is self-contained and needs none).
set -euo pipefail
report=${1:?usage: screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]}
out=${2:?usage: screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]}
size=${3:-1280x2400}
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars --virtual-time-budget=5000 \
  --window-size="${size/x/,}" --screenshot="$out" "file://$(realpath "$report")" 2>/dev/null
echo "$out"
