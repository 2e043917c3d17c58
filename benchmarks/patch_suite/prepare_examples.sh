#!/usr/bin/env bash
# Copy the pytorch/examples scripts the patch suite runs into .examples/ at the repository root
# (ignored through .git/info/exclude: fetched code is never committed; the device call carries
# .examples):
#
#   EXAMPLES=GIT_DIR_OR_CHECKOUT bash benchmarks/patch_suite/prepare_examples.sh
#
# EXAMPLES: a clone's .git, a bare mirror (the search tool's `fetch` of github:pytorch/examples
# gives MIRRORS/pytorch+examples/repo) or a work tree. Files (each script's folder holds only what
# the script imports from it, so a patch's `git apply --check` in a copy of the folder is exact):
#
#   imagenet/main.py  word_language_model/{main,model,data}.py  dcgan/main.py  mnist/main.py
#
# No data: wikitext-2 (word_language_model) and MNIST are synthesized on the device by
# make_data.py. .examples/UPSTREAM.txt records path and commit per file. Files other suites put in
# .examples (benchmarks/examples_suite/prepare_examples.sh) are left alone.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
src=${EXAMPLES:?set EXAMPLES to a pytorch/examples git dir, bare mirror or checkout}
dest=${DEST:-$repo/.examples}
files=(imagenet/main.py word_language_model/main.py word_language_model/model.py word_language_model/data.py
       dcgan/main.py mnist/main.py)

exclude=$(git -C "$repo" rev-parse --git-path info/exclude)
case $exclude in /*) ;; *) exclude=$repo/$exclude ;; esac
mkdir -p "$(dirname "$exclude")"
for p in /.examples/ /.whl/ /.devtools/; do
  grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >> "$exclude"
done

if git --git-dir="$src" rev-parse --verify -q "HEAD^{commit}" > /dev/null 2>&1; then
  commit=$(git --git-dir="$src" rev-parse "HEAD^{commit}")
  get() { git --git-dir="$src" show "$commit:$1"; }
elif git -C "$src" rev-parse --verify -q "HEAD^{commit}" > /dev/null 2>&1; then
  commit=$(git -C "$src" rev-parse "HEAD^{commit}")
  get() { git -C "$src" show "$commit:$1"; }
else
  commit=$(cat "$src/COMMIT" 2>/dev/null || echo unknown)
  get() { cat "$src/$1"; }
fi
date=$(git --git-dir="$src" log -1 --format=%cs "$commit" 2>/dev/null || git -C "$src" log -1 --format=%cs 2>/dev/null || echo "")

mkdir -p "$dest"
fail=0
: > "$dest/UPSTREAM.txt.new"
for f in "${files[@]}"; do
  mkdir -p "$dest/$(dirname "$f")"
  if get "$f" > "$dest/$f.tmp" 2>/dev/null; then
    mv "$dest/$f.tmp" "$dest/$f"
    printf 'pytorch/examples\t%s\t%s\t%s\n' "$f" "$commit" "$date" >> "$dest/UPSTREAM.txt.new"
  else
    rm -f "$dest/$f.tmp"; echo "missing upstream: $f" >&2; fail=1
  fi
done
mv "$dest/UPSTREAM.txt.new" "$dest/UPSTREAM.txt"
column -t -s $'\t' "$dest/UPSTREAM.txt" 2>/dev/null || cat "$dest/UPSTREAM.txt"
du -sh "$dest"
exit $fail
