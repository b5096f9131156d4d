#!/bin/bash
# replax's train step against Tunix's GRPO train step, alternated in the same time window.
#
#   BASELINE_PYTHON=VENV/bin/python scripts/baselines/train_back_to_back.sh [ROUNDS] [OUT_DIR]
#
# BASELINE_PYTHON: the python of the baseline virtualenv (see tunix_grpo_step.py's
# docstring); REPLAX_PYTHON: replax's (default .venv/bin/python); OUT_DIR: default a new
# temporary directory.
#
# Each round runs `scripts/bench.py --only=train` (the project's .venv) and then
# tunix_grpo_step.py (the baseline venv, see its docstring) on the same shape: batch 64 x
# 160 tokens, the reference model, fp32, one step = forward + backward + AdamW. The machine
# is shared, so compare rounds pairwise and look at CPU-seconds per step as well as
# tokens/s; each line ends with the load average before and after.
set -euo pipefail
ROUNDS=${1:-3}
OUT=${2:-$(mktemp -d)}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BASELINE_PYTHON=${BASELINE_PYTHON:?set BASELINE_PYTHON to the baseline virtualenv python}
REPLAX_PYTHON=${REPLAX_PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
cd "$ROOT"
for round in $(seq "$ROUNDS"); do
  "$REPLAX_PYTHON" scripts/bench.py --only=train --repeats=5 --out="$OUT/replax_$round.json" \
    > /dev/null
  (cd scripts/baselines && "$BASELINE_PYTHON" tunix_grpo_step.py --steps=5 2> /dev/null) \
    | tail -1 > "$OUT/tunix_$round.json"
  "$REPLAX_PYTHON" - "$OUT/replax_$round.json" "$OUT/tunix_$round.json" << 'EOF'
import json, sys

ours, tunix = (json.load(open(path)) for path in sys.argv[1:])
print(
    f"replax {ours['train_tokens_per_s']:7.0f} tokens/s {ours['train_cpu_s']:5.2f} CPU-s "
    f"(load {ours['loadavg_start'][0]:.1f}-{ours['loadavg_end'][0]:.1f}) | "
    f"tunix {tunix['tunix_grpo_train_tokens_per_s']:7.0f} tokens/s "
    f"{tunix['step_cpu_s_median']:5.2f} CPU-s "
    f"(load {tunix['load_avg_start'][0]:.1f}-{tunix['load_avg_end'][0]:.1f}) | "
    f"ratio {ours['train_tokens_per_s'] / tunix['tunix_grpo_train_tokens_per_s']:.2f} tokens/s, "
    f"{tunix['step_cpu_s_median'] / ours['train_cpu_s']:.2f} CPU-s"
)
EOF
done
