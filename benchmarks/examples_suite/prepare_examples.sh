#!/usr/bin/env bash
# Copy the pytorch/examples scripts run_examples.sh runs into .examples/ at the repository root
# (git-ignored through .git/info/exclude: fetched code is never committed), folders kept:
#
#   bash benchmarks/examples_suite/prepare_examples.sh GIT_DIR     # a clone's .git, or a bare mirror
#   bash benchmarks/examples_suite/prepare_examples.sh CHECKOUT    # a work tree of pytorch/examples
#
# Files: imagenet/main.py, word_language_model/{main,model,data}.py and data/wikitext-2,
# dcgan/main.py, vae/main.py, mnist/main.py, distributed/ddp-tutorial-series/{multigpu_torchrun,
# datautils}.py. When wikitext-2's train.txt is missing (a mirror that leaves out its largest
# files), it is made from valid.txt + test.txt (about 2.3 MB instead of 10.8 MB: an epoch of 661
# batches at batch 20 and bptt 35 instead of 2983). .examples/UPSTREAM_COMMIT records the commit.
# The lead's device call then names .examples in `carry`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
src=${1:?usage: prepare_examples.sh GIT_DIR_OR_CHECKOUT}
dest=${DEST:-$repo/.examples}
files=(imagenet/main.py word_language_model/main.py word_language_model/model.py word_language_model/data.py
       word_language_model/data/wikitext-2/README word_language_model/data/wikitext-2/train.txt
       word_language_model/data/wikitext-2/valid.txt word_language_model/data/wikitext-2/test.txt
       dcgan/main.py vae/main.py mnist/main.py
       distributed/ddp-tutorial-series/multigpu_torchrun.py distributed/ddp-tutorial-series/datautils.py)

if git --git-dir="$src" rev-parse HEAD > /dev/null 2>&1; then
  get() { git --git-dir="$src" show "HEAD:$1"; }
  commit=$(git --git-dir="$src" rev-parse HEAD)
else
  get() { cat "$src/$1"; }
  commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
fi
mkdir -p "$dest"
grep -qx '/.examples/' "$repo/.git/info/exclude" 2>/dev/null || { mkdir -p "$repo/.git/info"; echo '/.examples/' >> "$repo/.git/info/exclude"; }
for f in "${files[@]}"; do
  mkdir -p "$dest/$(dirname "$f")"
  if ! get "$f" > "$dest/$f" 2>/dev/null; then
    rm -f "$dest/$f"
    echo "missing upstream: $f"
  fi
done
wt=$dest/word_language_model/data/wikitext-2
if [ ! -s "$wt/train.txt" ]; then
  cat "$wt/valid.txt" "$wt/test.txt" > "$wt/train.txt"
  echo "train.txt made from valid.txt + test.txt"
fi
echo "$commit" > "$dest/UPSTREAM_COMMIT"
du -sh "$dest"
