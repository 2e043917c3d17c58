#!/usr/bin/env bash
# Mutation testing of gpudiag's analysis core (issue 25 part 0, issue 35 part 6), on demand and
# weekly (.github/workflows/mutation.yml), not in every CI run: mutmut changes one thing at a time
# in the modules of [tool.mutmut] only_mutate (pyproject.toml) and runs the tests that reach it.
#
#   python -m pip install -e ".[test,mutation]"
#   MUTMUT_SAMPLE=50 bash scripts/mutation.sh      # 50 mutants per module, a FRESH random draw (the headline)
#   MUTMUT_SAMPLE=50 MUTMUT_SEED=41 bash scripts/mutation.sh    # the same draw again (the seed is printed)
#   MUTMUT_MODULES="gpudiag/analysis/rules/host.py gpudiag/analysis/steps/step_stats.py" ...
#                                                  # draw and score these modules only (of only_mutate)
#   MUTMUT_NAMES_FROM=survivors.txt bash scripts/mutation.sh   # these mutants only (one name per line)
#   bash scripts/mutation.sh                       # every mutant (hours on 2 cores)
#   MUTMUT_CHILDREN=1 ...                          # one mutant at a time (default 2)
#   then: mutmut results; mutmut show <mutant>
#
# The headline score is a fresh draw: without MUTMUT_SEED each run draws with a new random seed,
# printed first so that the draw can be rerun, and the draw is scored before any test is written
# against its survivors (a draw whose survivors tests were then written to kill measures those
# tests, not the suite: docs/mutation.md keeps such passes apart, as history).
#
# Score per module and pooled: killed / drawn, where drawn counts every mutant that was run:
# survived, "no tests" (no selected test reaches the mutated function: a survivor, not left out),
# timeout, suspicious and segfault all count as not killed. Printed with a 90 % Clopper-Pearson
# interval (exact binomial; scipy), the uncertainty of estimating a module's score from a random
# sample of its mutants (Wong & Mathur, "Reducing the cost of mutation testing", JSS 1995): at
# n = 50 and 45 killed, 80-96 %. The pooled interval treats the modules' draws as one sample.
# Survivors are listed by name (mutmut show NAME). Record the result with the date and seed in
# docs/mutation.md.
set -uo pipefail
cd "$(dirname "$0")/.."
rm -rf mutants
# a private temporary folder: pytest keeps only the three newest pytest-N folders of
# $TMPDIR/pytest-of-$USER, so another pytest on the machine could delete this run's exports mid-run
tmp="$(mktemp -d "${TMPDIR:-/tmp}/mutation.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp"
names=()
seed=""
if [ -n "${MUTMUT_NAMES_FROM:-}" ]; then
  # a list of mutants, one name per line (e.g. the survivors of the last run, after new tests)
  mutmut run "gpudiag.no-such-mutant" > /dev/null 2>&1
  mapfile -t names < "$MUTMUT_NAMES_FROM"
elif [ -n "${MUTMUT_SAMPLE:-}" ]; then
  seed="${MUTMUT_SEED:-$(python3 -c 'import secrets; print(secrets.randbelow(10**6))')}"
  echo "draw: MUTMUT_SAMPLE=$MUTMUT_SAMPLE MUTMUT_SEED=$seed${MUTMUT_MODULES:+ MUTMUT_MODULES=\"$MUTMUT_MODULES\"}"
  # mutmut writes every mutant's name into mutants/**/*.meta before it refuses a filter that
  # matches none: generate, then draw the sample from those names.
  mutmut run "gpudiag.no-such-mutant" > /dev/null 2>&1
  mapfile -t names < <(python3 - "$MUTMUT_SAMPLE" "$seed" "${MUTMUT_MODULES:-}" <<'EOF'
import glob, json, random, sys
n, seed, modules = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split()
for meta in sorted(glob.glob("mutants/**/*.py.meta", recursive=True)):
    if modules and meta[len("mutants/"):-len(".meta")] not in modules:
        continue
    keys = sorted(json.load(open(meta))["exit_code_by_key"])
    # one generator per module: a module's draw does not depend on which other modules are listed
    rng = random.Random(f"{seed}:{meta}")
    print("\n".join(rng.sample(keys, min(n, len(keys)))))
EOF
)
  if [ "${#names[@]}" -eq 0 ]; then
    echo "no mutants drawn (MUTMUT_MODULES names no module of only_mutate?)" >&2
    exit 2
  fi
elif [ -n "${MUTMUT_MODULES:-}" ]; then
  # every mutant of these modules (mutmut matches names with fnmatch)
  for m in $MUTMUT_MODULES; do m="${m%.py}"; names+=("${m//\//.}.*"); done
fi
mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "${names[@]}" > /dev/null 2>&1
MUTMUT_DRAW_SEED="$seed" python3 - "${MUTMUT_MODULES:-}" "${names[@]}" <<'EOF'
import collections, fnmatch, glob, json, os, sys
from scipy.stats import beta
from mutmut.stats import status_by_exit_code as status  # mutmut's own reading of an exit code

modules, chosen = sys.argv[1].split(), set(sys.argv[2:])
NOT_RUN = {"not checked", "skipped", "check was interrupted by user"}


def score(killed: int, drawn: int) -> str:
    """killed / drawn in %, with the 90 % Clopper-Pearson interval."""
    if not drawn:
        return "no mutant run"
    low = beta.ppf(0.05, killed, drawn - killed + 1) if killed else 0.0
    high = beta.ppf(0.95, killed + 1, drawn - killed) if killed < drawn else 1.0
    return f"{killed}/{drawn} = {100 * killed / drawn:.1f} % (90 % interval {100 * low:.0f}-{100 * high:.0f} %)"


total, survivors = collections.Counter(), []
for meta in sorted(glob.glob("mutants/**/*.py.meta", recursive=True)):
    name = meta[len("mutants/"):-len(".meta")]
    if modules and name not in modules:
        continue
    codes = {k: v for k, v in json.load(open(meta))["exit_code_by_key"].items() 
             if not chosen or k in chosen or any(fnmatch.fnmatch(k, c) for c in chosen if "*" in c)}
    counts = collections.Counter(status[v] for v in codes.values())
    total.update(counts)
    killed = counts["killed"] + counts["caught by type check"]
    drawn = sum(c for s, c in counts.items() if s not in NOT_RUN)
    others = ", ".join(f"{s} {counts[s]}" for s in ("survived", "no tests", "timeout", "suspicious", "segfault"))
    print(f"{name}: {score(killed, drawn)}  ({others})")
    survivors += [f"  {k}  [{status[v]}]" for k, v in sorted(codes.items())
                  if status[v] not in NOT_RUN | {"killed", "caught by type check"}]
killed = total["killed"] + total["caught by type check"]
drawn = sum(c for s, c in total.items() if s not in NOT_RUN)
seed = os.environ.get("MUTMUT_DRAW_SEED")
print(f"mutation score{f' (seed {seed})' if seed else ''}: {score(killed, drawn)}  "
      f"(\"no tests\" counted as survivors: {total['no tests']}; not run: {sum(total[s] for s in NOT_RUN)})")
if survivors:
    print("not killed (mutmut show NAME):")
    print("\n".join(survivors))
EOF
