#!/usr/bin/env bash
# mu, decode tokens/s and train-step MFU on this machine's accelerator in under 8 minutes
# (scripts/device_mu.py at Qwen2.5-0.5B's shape in bfloat16, random init: it needs jax,
# flax, optax and absl, nothing else). Writes device_mu.json into $OUT, or the current
# folder; extra arguments go to scripts/device_mu.py.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv 2>/dev/null || true
timeout 450 python3 scripts/device_mu.py --out="$out/device_mu.json" "$@"
