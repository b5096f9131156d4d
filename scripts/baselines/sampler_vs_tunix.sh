#!/usr/bin/env bash
# replax's sampler and Tunix's, alternately, PAIRS times each (default 3), at whatever
# load the machine has: compare the pairs, not numbers taken at different times. The
# last line gives, per pair at batch 64, replax / Tunix in wall tokens/s and in tokens
# per process CPU-second, and their medians.
#   bash scripts/baselines/sampler_vs_tunix.sh [TUNIX_VENV_PYTHON] [PAIRS]
# TUNIX_VENV_PYTHON (or $BASELINE_PYTHON): the python of the baseline virtualenv (see
# tunix_sampler.py's docstring); REPLAX_PYTHON: replax's (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/../.."
TUNIX_PY=${1:-${BASELINE_PYTHON:?give the baseline virtualenv python as the first argument or BASELINE_PYTHON}}
PAIRS=${2:-3}
REPLAX_PY=${REPLAX_PYTHON:-.venv/bin/python}
log=$(mktemp)
for _ in $(seq "$PAIRS"); do
  echo "tunix  $("$TUNIX_PY" scripts/baselines/tunix_sampler.py --repeats=5 | tail -1)" | tee -a "$log"
  echo "replax $("$REPLAX_PY" scripts/baselines/replax_sampler.py --repeats=5 | tail -1)" | tee -a "$log"
done
"$REPLAX_PY" - "$log" <<'PY'
import json, statistics, sys
rows = [line.split(" ", 1) for line in open(sys.argv[1])]
tunix = [json.loads(r) for name, r in rows if name == "tunix"]
ours = [json.loads(r) for name, r in rows if name == "replax"]
wall = [o["replax_sampler_tokens_per_s_b64"] / t["tunix_sampler_tokens_per_s_b64"] for t, o in zip(tunix, ours)]
# Tokens per process CPU-second; Tunix always decodes 64 new tokens per row.
cpu = [
    (o["replax_sampler_steps_b64"] / o["replax_sampler_cpu_s_b64_median"])
    / (64 / t["tunix_sampler_cpu_s_b64_median"])
    for t, o in zip(tunix, ours)
]
print(json.dumps({
    "replax_over_tunix_wall_b64": [round(x, 2) for x in wall],
    "replax_over_tunix_cpu_b64": [round(x, 2) for x in cpu],
    "median_wall": round(statistics.median(wall), 2),
    "median_cpu": round(statistics.median(cpu), 2),
}))
PY
rm -f "$log"
