"""The rollout engine's decode step against its ideal HBM traffic, on a TPU slice's compiled
programs: what `scripts/tpu_compile.py` reports as `engine_decode_traffic` (docs/tpu.md),
and mu modelled from those programs' own bytes (`compiled_mu`).
The bytes are counted from each program's optimised HLO (`replax.tools.hbm_traffic`),
loops at their bounds, since the compiler's own `bytes accessed` counts a loop body once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from replax.model import flops as flops_lib
from replax.run import assemble as run_lib
from replax.sampling import lowering
from replax.tools import hbm_traffic, tpu_targets

# Asynchronous collective fusion splits a collective over several fusions that pass its
# buffers through, which `hbm_traffic` cannot attribute; turned off for the byte count,
# the collectives are plain instructions moving the same bytes.
TRAFFIC_OPTIONS = {"xla_tpu_enable_async_collective_fusion": False}


def _traffic_hlo(programs: Mapping[str, Any], name: str) -> str:
    """Program `name` compiled for the byte count, as optimised HLO text."""
    return programs[name].lower().compile(compiler_options=TRAFFIC_OPTIONS).as_text()


def generation_chunk_bytes(hlo_text: str, steps_in_chunk: int) -> float | None:
    """The bytes of one trip of a generation program's chunk loop (harvest, refill and its
    loop of K decode steps, counted K times): the costliest loop, outermost first, whose
    body runs a loop bounded by K. None when no loop runs one."""
    best = None

    def search(found):
        nonlocal best
        for loop in found:
            if any(inner["trips"] == steps_in_chunk for inner in loop["inner"]):
                best = max(best or 0.0, loop["bytes_per_trip"])
            search(loop["inner"])

    search(hbm_traffic.loops(hlo_text))
    return best


def engine_decode_traffic(
    run, programs: Mapping[str, Any], generate: bool = False
) -> dict[str, Any]:
    """The HBM bytes per device of one decode step of the run's engine, compiled, against
    the ideal: the weights (in the sampler's dtype) and the live KV cache of the S slots
    (P - 1 + N positions each) read once, split over the sampler's devices.

    per_step: `engine_refill_decode_chunk`, one harvest and refill and K = refill_every
    decode steps (its decode loop counted K times: its bound), over K: what the engine
    moves a step, the refill included. step: `engine_decode_step` alone, a program of its
    own (so with its own copies in and out of the donated slots, which a chunk makes
    once for K steps). Both with the layer loop counted L times (`hbm_traffic`).
    generate: also `engine_generate`'s own chunk loop over K (`generation_chunk_bytes`):
    what a generation in the run moves a step, its slots' layouts the compiler's choice
    inside one program (one more compile)."""
    engine = run.sampler
    counts = {}
    for name in ("engine_decode_step", "engine_refill_decode_chunk"):
        counts[name] = hbm_traffic.hbm_bytes(_traffic_hlo(programs, name))
    step = counts["engine_decode_step"]["total"]
    chunk = counts["engine_refill_decode_chunk"]
    # A loop without a constant bound is counted once: then the chunk holds one step.
    k = 1 if chunk["unknown_trip_counts"] else engine.refill_every
    per_step = chunk["total"] / k
    train_state, _ = run_lib.abstract_states(run)
    c = run.spec.rollout
    params = lowering.abstract_inputs(engine, c.prompts_per_step, train_state.params)[0]
    weights = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(params))
    cfg = engine.model_config
    cache_dtype = engine._cache_dtype or cfg.jnp_dtype
    per_position = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim  # keys and values
    cache_len = c.max_prompt_len - 1 + c.max_new_tokens
    kv = engine.slots * cache_len * per_position * jnp.dtype(cache_dtype).itemsize
    devices = engine.mesh.devices.size
    ideal = (weights + kv) / devices
    in_generate = None
    if generate:
        hlo = _traffic_hlo(programs, "engine_generate")
        chunk_bytes = generation_chunk_bytes(hlo, engine.refill_every)
        in_generate = None if chunk_bytes is None else chunk_bytes / engine.refill_every
    return {
        "slots": engine.slots,
        "refill_every": engine.refill_every,
        "step_hbm_bytes": step,
        "per_step_hbm_bytes": per_step,
        "ideal_weights_bytes": weights / devices,
        "ideal_kv_bytes": kv / devices,
        "ideal_bytes": ideal,
        "ratio": per_step / ideal,
        "step_ratio": step / ideal,
        "steps_in_chunk": k,
        "generate_per_step_hbm_bytes": in_generate,
        "generate_ratio": None if in_generate is None else in_generate / ideal,
        "largest": {name: count["largest"] for name, count in counts.items()},
    }


def compiled_mu(run, programs: Mapping[str, Any], traffic, chip: tpu_targets.Chip, chips: int):
    """mu modelled from the compiled programs: each phase at the chip's peaks
    (`tpu_targets.roofline_s`) on the HBM bytes its optimised HLO moves per device, loops
    multiplied out (`hbm_traffic`; the sampler's collectives count as the bytes they move,
    not as interconnect time), and on the FLOPs of the run's own accounting
    (`replax.model.flops`). Generation: the engine's prefill program once, then
    R x N / S decode steps at `traffic`'s bytes a step (the refill included): every slot
    full, every completion at the length cap N, as the roofline's. Training: the train
    step's program. A model of the compiled programs, not a measurement."""
    spec, cfg = run.spec, run.sampler.model_config
    devices = run.sampler.mesh.devices.size
    per_device = tpu_targets.Chip(
        chip.hbm_bytes,
        chip.bf16_flops_per_s * chips / devices,
        chip.hbm_bytes_per_s * chips / devices,
    )
    hbm = {}
    for name in ("engine_prefill", "train_step"):
        hbm[name] = hbm_traffic.hbm_bytes(_traffic_hlo(programs, name))["total"]
    c, r, b = spec.rollout, spec.rollouts_per_step, spec.train.batch_size
    p, n, slots = c.max_prompt_len, c.max_new_tokens, traffic["slots"]
    step_flops = slots * flops_lib.forward_flops_per_token(cfg, p + n / 2) / devices
    decode_step_s = tpu_targets.roofline_s(step_flops, traffic["per_step_hbm_bytes"], per_device)
    prefill_flops = c.prompts_per_step * p * flops_lib.forward_flops_per_token(cfg, p / 2)
    prefill_s = tpu_targets.roofline_s(prefill_flops / devices, hbm["engine_prefill"], per_device)
    decode_steps = r * n / slots
    generation_s = prefill_s + decode_steps * decode_step_s
    train_devices = run.mesh.devices.size
    train_flops = flops_lib.train_flops(run.model_config, b, spec.seq_len) / train_devices
    train_s = tpu_targets.roofline_s(train_flops, hbm["train_step"], per_device)
    return {
        "decode_step_s": decode_step_s,
        "decode_steps": decode_steps,
        "prefill_s": prefill_s,
        "generation_s": generation_s,
        "train_step_s": train_s,
        "generation_s_per_rollout": generation_s / r,
        "train_s_per_rollout": train_s / b,
        "mu": (generation_s / r) / (train_s / b),
        "prefill_hbm_bytes": hbm["engine_prefill"],
        "train_step_hbm_bytes": hbm["train_step"],
        "label": "modelled from the compiled programs' HBM bytes (loops multiplied out) at the "
        "chip's peaks; slots full, completions at the cap; not measured",
    }
