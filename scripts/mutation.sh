#!/usr/bin/env bash
# Mutation testing of gpudiag's analysis core (issue 25, part 0), on demand and weekly
# (.github/workflows/mutation.yml), not in every CI run: mutmut changes one thing at a time in the
# modules of [tool.mutmut] only_mutate (pyproject.toml) and runs the tests that reach it.
#
#   python -m pip install -e ".[test,mutation]"
#   bash scripts/mutation.sh            # then: mutmut results; mutmut show <mutant>
#
# Prints the score: killed / (killed + survived + timed out); mutants no selected test reaches
# ("no tests") are counted apart. Record it with the date in docs/mutation.md.
set -uo pipefail
cd "$(dirname "$0")/.."
rm -rf mutants
mutmut run --max-children "${MUTMUT_CHILDREN:-2}" > /dev/null 2>&1
mutmut results --all true | python3 -c '
import collections, sys
counts = collections.Counter(line.rsplit(": ", 1)[-1].strip() for line in sys.stdin if ": " in line)
killed, survived, timeout = counts["killed"], counts["survived"], counts["timeout"]
tried = killed + survived + timeout
print(dict(counts))
untested = counts["no tests"]
print(f"mutation score: {killed}/{tried} = {100 * killed / max(tried, 1):.1f} %  (no tests: {untested})")
'
