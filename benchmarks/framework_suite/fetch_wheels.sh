#!/usr/bin/env bash
# Download into .whl/ (repository root, ignored through .git/info/exclude) the Python wheels the GPU
# machine lacks for this suite: gpudiag's own dependencies missing from its image, and what
# transformers' run_clm.py imports. The device call names .whl in `carry` and starts with
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
#
#   bash benchmarks/framework_suite/fetch_wheels.sh        # WHL_DIR (default .whl), PYTHON (python3)
#
# The image (the device tool's KINDS.md package list, read 2026-11-17) already has click, pandas,
# numpy, pyarrow, jinja2, rich, scipy, pluggy, python-dateutil, tabulate, narwhals (plotly's),
# xxhash, fsspec, huggingface-hub, requests, aiohttp, pyyaml, tqdm, tensorboard, timm, lightning,
# transformers, accelerate, torchvision. Missing, and fetched here (versions: constraints.txt's
# where it pins them, so the device runs what CI tests):
#   gpudiag:       sqlite-utils (+ sqlite-fts4, click-default-group; it needs click >= 8.3.1, so
#                  click 8.5.1 travels too), plotly, adbc-driver-sqlite (+ adbc-driver-manager)
#   gpudiag's patches (docs/patches.md; benchmarks/patch_suite): libcst (its one need on Python 3.12,
#                  pyyaml, is in the image)
#   run_clm.py:    datasets, evaluate (imported at the top; evaluate.load is only called with
#                  --do_eval, which the suite does not pass), dill, multiprocess
# Left out on purpose: connectorx (a 57 MB wheel; gpudiag's columnar reader falls back to pandas
# without it, slower on large exports), ncu-report (only for --ncu, which the suite does not use).
# plotly's wheel is trimmed to what report.html needs (plotly.min.js is kept; the Jupyter widget
# bundle, the JupyterLab extension and the sample data sets go: 9.7 MB -> ~5 MB).
# pip's --no-deps fetches none of a wheel's needs: each is named here. One version of each, or
# the install stops.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-python3}
dest=${WHL_DIR:-$repo/.whl}
exclude=$(git -C "$repo" rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")" "$dest"
grep -qxF /.whl/ "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"

wheels=(
  sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4 click==8.5.1
  plotly==7.1.0
  adbc-driver-sqlite==1.13.0 adbc-driver-manager==1.13.0
  libcst==1.9.0
  datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19
)
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "${wheels[@]}" 2>&1 \
  | grep -v "^WARNING: Location" || true

# plotly: drop what report.html never loads, and those files' RECORD lines
"$PYTHON" - "$dest" <<'EOF'
import sys, zipfile, pathlib, shutil
dest = pathlib.Path(sys.argv[1])
drop = ("plotly/package_data/widgetbundle.js", "plotly/labextension/", "plotly/package_data/datasets/")
for whl in dest.glob("plotly-*.whl"):
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        if not any(n.startswith(drop) or ".data/data/share/" in n for n in names):
            continue  # trimmed already
        tmp = whl.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in z.infolist():
                n = info.filename
                if n.startswith(drop) or ".data/data/share/" in n:
                    continue
                data = z.read(n)
                if n.endswith(".dist-info/RECORD"):
                    data = b"".join(line for line in data.splitlines(keepends=True)
                                    if not (line.startswith(tuple(d.encode() for d in drop)) or b".data/data/share/" in line))
                out.writestr(info, data)
    shutil.move(tmp, whl)
    print(f"trimmed {whl.name}: {whl.stat().st_size / 2**20:.1f} MiB")
EOF

# one version of each distribution
dupes=$(ls "$dest"/*.whl | xargs -n1 basename | sed -E 's/^([A-Za-z0-9_.]+)-[0-9].*/\1/' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dupes" ] || { echo "more than one version of: $dupes (remove the older from $dest)" >&2; exit 1; }
ls -l "$dest"/*.whl | awk '{printf "%8.1f KiB  %s\n", $5 / 1024, $NF}'
du -sh "$dest"
