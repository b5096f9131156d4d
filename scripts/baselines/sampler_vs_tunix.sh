#!/usr/bin/env bash
# replax's sampler and Tunix's, alternately, three times each, at whatever load the
# machine has: compare the pairs, not numbers taken at different times.
#   bash scripts/baselines/sampler_vs_tunix.sh [TUNIX_VENV_PYTHON]
set -euo pipefail
cd "$(dirname "$0")/../.."
TUNIX_PY=${1:-/work/baselines/venv/bin/python}
for i in 1 2 3; do
  echo "tunix  $("$TUNIX_PY" scripts/baselines/tunix_sampler.py --repeats=5 | tail -1)"
  echo "replax $(.venv/bin/python scripts/baselines/replax_sampler.py --repeats=5 | tail -1)"
done
