"""Ahead-of-time compilation of a run's programs for a TPU topology, on any host.

libtpu compiles for a TPU it does not have: `jax.experimental.topologies` describes a
slice (e.g. `v5e:2x2`, four v5e chips) as devices that programs lower and compile for,
and the compiled programs report the TPU compiler's own memory (`memory_analysis()`) and
cost (`cost_analysis()`) figures. `replax.tools.tpu_targets` gives such a slice with its
chips' published figures; `run_programs(run)` lowers every program a run executes from abstract
inputs, with the shardings, dtypes and options `replax.run.assemble` gave it (so the
programs are those scripts/train.py compiles on the slice); `compile_figures` compiles
one and reads its figures; `tpu_targets.roofline_s` models a program's time on a chip
from FLOPs and bytes, which is what the modelled generation / training cost ratio (mu)
comes from. Nothing here runs a program or allocates device memory.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from replax.core import processes, sharding
from replax.model import flops as flops_lib
from replax.rl import evaluation, rollouts
from replax.rl import train_step as train_step_lib
from replax.run import assemble as run_lib
from replax.sampling import decode as decode_lib
from replax.sampling import engine as engine_lib
from replax.sampling import lowering
from replax.tools import tpu_targets

# PROGRAMS


def _struct(shape, dtype, mesh, axes, rules) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.named(mesh, axes, rules))


def _fresh_rollouts(run, rows: int) -> tuple:
    """add_and_sample's inputs of one generating step, abstract: R rows of prompts,
    completions and rewards laid out over the trainer's rows, and the step scalars."""
    mesh, rules, c = run.mesh, run.rules, run.spec.rollout
    row = lambda n, dtype: _struct((rows, n), dtype, mesh, ("batch", None), rules)
    completion = {
        "tokens": row(c.max_new_tokens, jnp.int32),
        "mask": row(c.max_new_tokens, jnp.bool_),
        "logprobs": row(c.max_new_tokens, jnp.float32),
    }
    rewards = _struct((rows,), jnp.float32, mesh, ("batch",), rules)
    scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype, sharding=sharding.replicated(mesh))
    # A stream's rows carry each token's version and their own group's version.
    stream = ()
    if c.stream:
        completion["versions"] = row(c.max_new_tokens, jnp.int32)
        stream = (_struct((rows,), jnp.int32, mesh, ("batch",), rules),)
    return (
        row(c.max_prompt_len, jnp.int32),
        row(c.max_prompt_len, jnp.bool_),
        completion,
        rewards,
        scalar(jnp.int32),
        sharding.abstract_key(mesh),
        scalar(jnp.bool_),
        scalar(jnp.int32),
        *stream,
    )


def _lower_train_step(run, train_state):
    shapes = rollouts.batch_spec(run.spec.train.batch_size, run.seq_len, run.spec.rollout.stream)
    shardings = train_step_lib.batch_shardings(run.mesh, run.rules, shapes)
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in shapes.items()
    }
    with sharding.activation_rules(run.mesh, run.rules):
        return run.train_step.jitted.lower(train_state, batch)


@dataclasses.dataclass(frozen=True)
class Program:
    """A program of a run: `lower()` lowers it from abstract inputs; `holds` names the
    parts of the run's resident state (`resident_bytes`) among its arguments."""

    lower: Callable[[], Any]
    holds: tuple[str, ...] = ()


def device_bytes(tree) -> int:
    """Bytes one device holds of abstract arrays (ShapeDtypeStructs with shardings): the
    largest shard of each leaf."""
    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        shard = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shard) * jnp.dtype(x.dtype).itemsize
    return total


# What a run keeps in device memory from step to step, beside any one program's inputs.
RESIDENT = ("train_state", "replay_store")


def resident_bytes(run) -> dict[str, int]:
    """Per device: the train state (weights and optimizer state), the replay store, and
    of the train state the weights (the sampler's weight cast reads them)."""
    train_state, replay_state = run_lib.abstract_states(run)
    return {
        "train_state": device_bytes(train_state),
        "replay_store": device_bytes(replay_state),
        "train_params": device_bytes(train_state.params),
    }


def peak_in_run(figures: Mapping[str, Any], program: Program, resident: Mapping[str, int]) -> int:
    """A program's peak while the run's resident state also sits in the devices' memory:
    its own peak plus the resident parts that are not among its arguments."""
    held = sum(resident[k] for k in program.holds)
    return figures["peak_bytes_per_chip"] + sum(resident[k] for k in RESIDENT) - held


def run_programs(run, eval_mesh=None) -> dict[str, Program]:
    """name -> `Program`: how to lower that program of `run` (a `replax.run.assemble.Run`) from
    abstract inputs: each is what the run's loop calls, at the run's shapes.

    train_step: one optimizer step on B rollouts. replay_add_and_sample: freeze the
    fresh rollouts' advantages, add them to the store, draw the batch. sampler_weights: the
    policy's weights cast and laid out for the sampler (on the sampler's devices; with
    disjoint placement, after the copy to them). sampler_prefill: the prompts into the
    KV cache. sampler_decode: the whole generation program (prefill and token loop) of
    R = prompts x G rows. With rollout.slots > 0 the run generates through the rollout
    engine instead, and its programs replace those two (`Engine.lower_programs`):
    engine_generate, engine_prefill, engine_refill_decode_chunk, engine_decode_step.
    eval_greedy / eval_pass_at_k: held-out evaluation's programs.
    weight_copy (disjoint placement over several hosts): the reshard that moves the
    trainer's weights to every host's sampler layout.
    """
    c = run.spec
    train_state, replay_state = run_lib.abstract_states(run)
    params = train_state.params
    sampler = run.sampler
    eval_mesh = eval_mesh or sampler.mesh
    colocated = set(sampler.mesh.devices.flat) == set(run.mesh.devices.flat)
    programs = {
        "train_step": Program(lambda: _lower_train_step(run, train_state), ("train_state",)),
        "replay_add_and_sample": Program(
            lambda: run.add_and_sample.lower(
                replay_state, *_fresh_rollouts(run, c.rollouts_per_step)
            ),
            ("replay_store",),
        ),
        "sampler_weights": Program(
            lambda: _lower_prepare(sampler, params), ("train_params",) if colocated else ()
        ),
    }
    if isinstance(sampler, engine_lib.Engine):
        # The run generates through the engine: its programs are what a step runs, and
        # the static decode is never compiled.
        engine = sampler.lower_programs(params, c.rollout.prompts_per_step, c.rollout.group_size)
        programs.update({name: Program(lower) for name, lower in engine.items()})
    else:
        programs["sampler_prefill"] = Program(
            lambda: lowering.lower_prefill(
                sampler, params, c.rollout.prompts_per_step, c.rollout.group_size
            )
        )
        programs["sampler_decode"] = Program(
            lambda: lowering.lower(
                sampler, params, c.rollout.prompts_per_step, c.rollout.group_size
            )
        )
    greedy, sample = evaluation.make_samplers(
        run.model_config,
        run.tokenizer,
        max_prompt_len=c.rollout.max_prompt_len,
        max_new_tokens=c.rollout.max_new_tokens,
        mesh=eval_mesh,
        rules=run.rules,
        **c.rollout.numerics(),
    )
    # Evaluation decodes eval.max_rows rows a call (`evaluation.Evaluator`).
    greedy_prompts = c.eval.num_prompts // c.eval.blocks(c.eval.num_prompts, 1)
    programs["eval_greedy"] = Program(lambda: lowering.lower(greedy, params, greedy_prompts))
    if c.eval.pass_k > 0 and c.eval.pass_k_prompts > 0:
        prompts = min(c.eval.pass_k_prompts, c.eval.num_prompts)
        prompts //= c.eval.blocks(prompts, c.eval.pass_k)
        programs["eval_pass_at_k"] = Program(
            lambda: lowering.lower(sample, params, prompts, c.eval.pass_k)
        )
    if not colocated:
        copy = _weight_copy(run, params)
        if copy is not None:
            programs["weight_copy"] = Program(copy, ("train_params",))
    return programs


def _lower_prepare(sampler, params):
    """The sampler's cast-and-reshard of the weights, from params in the sampler's layout
    and the policy's dtype (where a disjoint copy leaves them, or colocated, where the
    trainer's layout is resharded inside the same program)."""
    source_devices = jax.tree_util.tree_leaves(params)[0].sharding.device_set
    if source_devices != set(sampler.mesh.devices.flat):  # disjoint: after the copy
        params = jax.tree_util.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            params,
            sampler._params_shardings,
        )
    return sampler._prepare.lower(params)


def _weight_copy(run, params):
    """The cross-host stage of the disjoint weight copy (`processes.copy_to_process_mesh`),
    lowered for the process whose sampler devices run_programs sees; None on one host,
    where the copy is a device-to-device transfer with no program of its own."""
    if len({d.process_index for d in run.mesh.devices.flat}) == 1:
        return None
    targets = jax.tree_util.tree_leaves(run.sampler._params_shardings)
    leaves = jax.tree_util.tree_leaves(params)
    stage = processes.process_copy_stage(leaves, targets)
    return lambda: stage.lower(leaves)


# FIGURES

MEMORY_FIELDS = {
    "argument_bytes": "argument_size_in_bytes",
    "output_bytes": "output_size_in_bytes",
    "alias_bytes": "alias_size_in_bytes",
    "temp_bytes": "temp_size_in_bytes",
    "code_bytes": "generated_code_size_in_bytes",
}


def compile_figures(lower: Callable[[], Any], hbm_bytes: int) -> tuple[Any, dict[str, Any]]:
    """(compiled, figures): lower and compile one program; its per-device memory (the
    arguments and outputs it holds, less the outputs that reuse donated arguments, plus
    temporaries and code: the peak), FLOPs and bytes accessed as the compiler counts them
    (a loop's body once, whatever its trip count), and the seconds taken."""
    start = time.perf_counter()
    lowered = lower()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    out = {key: int(getattr(memory, field)) for key, field in MEMORY_FIELDS.items()}
    out["peak_bytes_per_chip"] = (
        out["argument_bytes"]
        + out["output_bytes"]
        - out["alias_bytes"]
        + out["temp_bytes"]
        + out["code_bytes"]
    )
    out["peak_fraction"] = round(out["peak_bytes_per_chip"] / hbm_bytes, 4)
    out["fits"] = out["peak_bytes_per_chip"] <= tpu_targets.FIT_FRACTION * hbm_bytes
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list | tuple):  # older jax: one dict per computation
        cost = cost[0] if cost else {}
    out["flops"] = float(cost.get("flops", 0.0))
    out["bytes_accessed"] = float(cost.get("bytes accessed", 0.0))
    out["compile_s"] = round(seconds, 2)
    return compiled, out


def _mean_cache_len(prompt_len: int, new_tokens: int) -> float:
    """The mean number of cache slots a decode step reads: step t of the loop reads its
    segment's cache of P - 1 + (segment end) slots (`replax.sampling.decode`)."""
    ends = decode_lib._segment_ends(new_tokens)
    total, start = 0, 0
    for end in ends:
        total += (end - start) * (prompt_len - 1 + end)
        start = end
    return total / new_tokens


def modelled_mu_of_config(config_flag: str, topology: str, overrides=None) -> dict[str, Any]:
    """`modelled_mu` of a config file's run (`FILE[:VARIANT]`, as --config takes it, with
    {KEY: VALUE} overrides) on a slice: what compare.py's
    --mu_model=tpu:FILE[:VARIANT]:TOPOLOGY uses."""
    from replax.config import build as configuration
    from replax.config import spec as spec_lib
    from replax.tools import experiments

    config = experiments.file_config(config_flag)
    for key, value in (overrides or {}).items():
        experiments.set_value(config, key, value)
    if config.model.get("init") == "checkpoint" and not config.model.get("checkpoint"):
        config.model.init = "random"  # the shapes are the config's; no weights needed
    spec = spec_lib.parse(config)
    model_config = configuration.model_config(spec.model)
    generation, chips = tpu_targets.slice_chips(topology)
    dtype = spec.rollout.dtype or model_config.dtype
    return modelled_mu(
        spec, model_config, tpu_targets.CHIPS[generation], chips, jnp.dtype(dtype).itemsize
    )


def parse_mu_model(text: str) -> tuple[str, str] | None:
    """'tpu:FILE[:VARIANT]:TOPOLOGY' -> (FILE[:VARIANT], TOPOLOGY); None for a number."""
    match = re.fullmatch(r"tpu:(?P<config>.+):(?P<topology>(v4|v5e|v5p|v6e)(:[\dx]+|-\d+))", text)
    if match:
        return match.group("config"), match.group("topology")
    try:
        float(text)
    except ValueError:
        raise ValueError(
            f"--mu_model={text}: a number, or tpu:CONFIG_FILE[:VARIANT]:TOPOLOGY "
            "(e.g. tpu:configs/gsm8k.py:qwen2.5-1.5b-instruct:v5e-8)"
        ) from None
    return None


def modelled_mu(
    spec, model_config, chip: tpu_targets.Chip, chips: int, sampler_dtype_bytes: int
) -> dict[str, Any]:
    """The modelled cost of generating and of training on one rollout on `chips` chips, from
    the model's matmul FLOPs (`replax.model.flops`, the accounting the runs use) and the bytes
    each phase must move through HBM, at the chip's peaks (`tpu_targets.roofline_s`): a lower bound
    of each phase's time, never a measurement.

    The compiler's own cost_analysis cannot give these totals: it counts the body of a
    loop once, and the layers (nn.scan), microbatches, logits chunks and decode steps are
    all loops. The bytes: a decode step reads every weight and the KV cache of its rows,
    a prefill the weights once and writes the cache, a train step reads the weights
    in the forward, the recomputation and the backward pass and updates the float32
    weights and two Adam moments. Chips split FLOPs and bytes evenly (data and fsdp
    parallel rows, sharded weights).
    """
    c = spec.rollout
    r, b = spec.rollouts_per_step, spec.train.batch_size
    p, n = c.max_prompt_len, c.max_new_tokens
    layers, kv, d = model_config.num_layers, model_config.num_kv_heads, model_config.head_dim
    weights = flops_lib.param_count(model_config)
    cache_len = _mean_cache_len(p, n)
    kv_bytes_per_slot = 2 * layers * kv * d * sampler_dtype_bytes  # keys and values
    # DECODE: one token for each of R rows.
    step_flops = r * flops_lib.forward_flops_per_token(model_config, cache_len)
    step_bytes = weights * sampler_dtype_bytes + r * cache_len * kv_bytes_per_slot
    decode_step_s = tpu_targets.roofline_s(step_flops / chips, step_bytes / chips, chip)
    # PREFILL: the P prompt tokens of each of the R / G prompts (repeated per row after).
    prompts = c.prompts_per_step
    prefill_flops = prompts * p * flops_lib.forward_flops_per_token(model_config, p / 2)
    prefill_bytes = weights * sampler_dtype_bytes + r * p * kv_bytes_per_slot
    prefill_s = tpu_targets.roofline_s(prefill_flops / chips, prefill_bytes / chips, chip)
    generation_s = prefill_s + n * decode_step_s
    # TRAIN: forward, recomputed forward (remat) and backward (2x) on B x T tokens.
    seq = spec.seq_len
    recompute = 1.0 if model_config.remat_policy != "none" else 0.0
    train_flops = (3.0 + recompute) * b * seq * flops_lib.forward_flops_per_token(model_config, seq)
    param_bytes = weights * jnp.dtype(model_config.param_dtype).itemsize
    compute_bytes = weights * jnp.dtype(model_config.dtype).itemsize
    passes = spec.train.num_microbatches * (3.0 + recompute)
    # Adam: read and write the float32 weights, both moments and the gradient.
    train_bytes = passes * compute_bytes + 7 * param_bytes
    train_s = tpu_targets.roofline_s(train_flops / chips, train_bytes / chips, chip)
    gen_per_rollout = generation_s / r
    train_per_rollout = train_s / b
    return {
        "decode_step_s": decode_step_s,
        "prefill_s": prefill_s,
        "generation_s": generation_s,
        "train_step_s": train_s,
        "generation_s_per_rollout": gen_per_rollout,
        "train_s_per_rollout": train_per_rollout,
        "mu": gen_per_rollout / train_per_rollout,
        "mean_cache_len": cache_len,
    }


class ShapeTokenizer:
    """What a run's programs take from a tokenizer (stop and padding ids, the sampled
    vocabulary), for compiling a model whose tokenizer files are not at hand: the ids
    change no shape, so the compiled programs are those of the real tokenizer."""

    def __init__(self, vocab_size: int):
        self.stop_ids = (vocab_size - 1,)
        self.pad_id = 0
        self.sample_limit = vocab_size
