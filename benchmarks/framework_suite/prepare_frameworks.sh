#!/usr/bin/env bash
# Copy the upstream scripts run_suite.sh runs into .frameworks/ at the repository root (ignored
# through .git/info/exclude: fetched code is never committed):
#
#   LIGHTNING=GIT_DIR_OR_CHECKOUT ACCELERATE=... TIMM=... TRANSFORMERS=... \
#     bash benchmarks/framework_suite/prepare_frameworks.sh
#
# Each source is a clone's .git, a bare mirror (the search tool's `fetch` gives one:
# MIRRORS/OWNER+NAME/repo), or a work tree. TRANSFORMERS may also be a folder holding just
# examples/pytorch/language-modeling/run_clm.py (the transformers repository is too large to
# mirror here; a COMMIT file beside examples/ names the commit it came from). Files:
#
#   lightning/examples/pytorch/basics/transformer.py       Lightning-AI/pytorch-lightning
#   accelerate/examples/cv_example.py                      huggingface/accelerate
#   timm/train.py (HEAD) and timm/train_v1.0.28.py (tag)   huggingface/pytorch-image-models
#   transformers/examples/pytorch/language-modeling/run_clm.py   huggingface/transformers
#
# .frameworks/UPSTREAM.txt records each source's commit. Also adds /.frameworks/, /.whl/ and
# /.devtools/ to .git/info/exclude (the device call carries them).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
dest=${DEST:-$repo/.frameworks}
exclude=$(git -C "$repo" rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for p in /.frameworks/ /.whl/ /.devtools/; do
  grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >> "$exclude"
done
mkdir -p "$dest"
: > "$dest/UPSTREAM.txt.new"

# copy NAME SRC REV PATH [TARGET]: PATH at REV of SRC (git dir, work tree or plain folder) to dest/NAME/TARGET
copy() {
  local name=$1 src=$2 rev=$3 path=$4 target=${5:-$4} commit
  mkdir -p "$dest/$name/$(dirname "$target")"
  if git --git-dir="$src" rev-parse --verify -q "$rev^{commit}" > /dev/null 2>&1; then
    commit=$(git --git-dir="$src" rev-parse "$rev^{commit}")
    git --git-dir="$src" show "$commit:$path" > "$dest/$name/$target"
  elif git -C "$src" rev-parse --verify -q "$rev^{commit}" > /dev/null 2>&1; then
    commit=$(git -C "$src" rev-parse "$rev^{commit}")
    git -C "$src" show "$commit:$path" > "$dest/$name/$target"
  elif [ -f "$src/$path" ]; then
    commit=$(cat "$src/COMMIT" 2>/dev/null || echo unknown)
    cp "$src/$path" "$dest/$name/$target"
  else
    echo "missing: $name $path (from $src at $rev)" >&2
    return 1
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$target" "$path" "$commit" >> "$dest/UPSTREAM.txt.new"
}

fail=0
if [ -n "${LIGHTNING:-}" ]; then
  copy lightning "$LIGHTNING" HEAD examples/pytorch/basics/transformer.py || fail=1
fi
if [ -n "${ACCELERATE:-}" ]; then
  copy accelerate "$ACCELERATE" HEAD examples/cv_example.py || fail=1
fi
if [ -n "${TIMM:-}" ]; then
  copy timm "$TIMM" HEAD train.py || fail=1
  copy timm "$TIMM" v1.0.28 train.py train_v1.0.28.py || echo "(no v1.0.28 tag: only HEAD's train.py)"
fi
if [ -n "${TRANSFORMERS:-}" ]; then
  copy transformers "$TRANSFORMERS" HEAD examples/pytorch/language-modeling/run_clm.py || fail=1
fi
# keep earlier lines for sources not given this time
if [ -f "$dest/UPSTREAM.txt" ]; then
  awk -F'\t' 'NR==FNR {seen[$1"\t"$2]=1; next} !seen[$1"\t"$2]' "$dest/UPSTREAM.txt.new" "$dest/UPSTREAM.txt" \
    >> "$dest/UPSTREAM.txt.new"
fi
sort -u "$dest/UPSTREAM.txt.new" > "$dest/UPSTREAM.txt"
rm -f "$dest/UPSTREAM.txt.new"
column -t -s $'\t' "$dest/UPSTREAM.txt" 2>/dev/null || cat "$dest/UPSTREAM.txt"
du -sh "$dest"
exit $fail
