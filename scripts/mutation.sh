#!/usr/bin/env bash
# Mutation testing of gpudiag's analysis core (issue 25, part 0), on demand and weekly
# (.github/workflows/mutation.yml), not in every CI run: mutmut changes one thing at a time in the
# modules of [tool.mutmut] only_mutate (pyproject.toml) and runs the tests that reach it.
#
#   python -m pip install -e ".[test,mutation]"
#   bash scripts/mutation.sh                       # every mutant (hours on 2 cores)
#   MUTMUT_SAMPLE=50 bash scripts/mutation.sh      # 50 mutants per module, drawn at random (seed 25)
#   MUTMUT_NAMES_FROM=survivors.txt bash scripts/mutation.sh   # these mutants only (one name per line)
#   then: mutmut results; mutmut show <mutant>
#
# Prints the score per module and in all: killed / (killed + survived + timed out); mutants no
# selected test reaches ("no tests") are counted apart. A sample of n mutants estimates a module's
# score within about 2 x sqrt(p (1 - p) / n) (a binomial proportion's 95 % interval; random mutant
# sampling: Wong & Mathur, "Reducing the cost of mutation testing", JSS 1995). Record the result
# with the date in docs/mutation.md.
set -uo pipefail
cd "$(dirname "$0")/.."
rm -rf mutants
names=()
if [ -n "${MUTMUT_NAMES_FROM:-}" ]; then
  # a list of mutants, one name per line (e.g. the survivors of the last run, after new tests)
  mutmut run "gpudiag.no-such-mutant" > /dev/null 2>&1
  mapfile -t names < "$MUTMUT_NAMES_FROM"
elif [ -n "${MUTMUT_SAMPLE:-}" ]; then
  # mutmut writes every mutant's name into mutants/**/*.meta before it refuses a filter that
  # matches none: generate, then draw the sample from those names.
  mutmut run "gpudiag.no-such-mutant" > /dev/null 2>&1
  mapfile -t names < <(python3 - "$MUTMUT_SAMPLE" "${MUTMUT_SEED:-25}" <<'EOF'
import glob, json, random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
for meta in sorted(glob.glob("mutants/**/*.py.meta", recursive=True)):
    keys = sorted(json.load(open(meta))["exit_code_by_key"])
    # one generator per module: a module's draw does not depend on which other modules are listed
    rng = random.Random(f"{seed}:{meta}")
    print("\n".join(rng.sample(keys, min(n, len(keys)))))
EOF
)
fi
mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "${names[@]}" > /dev/null 2>&1
python3 - "${names[@]}" <<'EOF'
import collections, glob, json, sys
from mutmut.stats import status_by_exit_code as status  # mutmut's own reading of an exit code
chosen = set(sys.argv[1:])
total = collections.Counter()
for meta in sorted(glob.glob("mutants/**/*.py.meta", recursive=True)):
    codes = json.load(open(meta))["exit_code_by_key"]
    counts = collections.Counter(status[v] for k, v in codes.items()
                                 if not chosen or k in chosen)
    total.update(counts)
    tried = counts["killed"] + counts["survived"] + counts["timeout"]
    name = meta[len("mutants/"):-len(".meta")]
    print(f"{name}: {counts['killed']}/{tried} = {100 * counts['killed'] / max(tried, 1):.1f} %  "
          f"(survived {counts['survived']}, timeout {counts['timeout']}, no tests {counts['no tests']})")
tried = total["killed"] + total["survived"] + total["timeout"]
print(f"mutation score: {total['killed']}/{tried} = {100 * total['killed'] / max(tried, 1):.1f} %  "
      f"(no tests: {total['no tests']}, not checked: {total['not checked']})")
EOF
