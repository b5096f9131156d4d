"""Rules that span the run spec's sections, each a small named function: `validate_spec`
runs those that need the configuration alone (RunSpec runs it on construction); the others
need what `replax.config.build.build` made (the model, the tokenizer, the task) or the
machine (devices, processes) and run there, before any compute. Each raises ConfigError
with one line naming the key and what is allowed."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from replax.core import sharding
from replax.core.config_utils import ConfigError, require
from replax.model.config import DTYPES
from replax.rl import placement


def validate_spec(spec) -> None:
    """Every rule across sections that the configuration alone decides."""
    validate_buffer_holds_batch_and_step(spec)
    validate_task_sizes(spec)
    validate_auto_mode(spec)
    validate_sequence_fits_model(spec)
    validate_microbatches_with_loss(spec)
    validate_placement(spec)


def validate_buffer_holds_batch_and_step(spec) -> None:
    """N >= B (a batch is drawn from the buffer) and N >= R (it keeps one step's fresh
    rollouts; on-policy: N = B = R)."""
    n, b, r = spec.replay.capacity, spec.train.batch_size, spec.rollouts_per_step
    require(
        n >= b,
        f"replay.capacity={n} is smaller than train.batch_size={b}: capacity must be >= the batch",
    )
    require(
        n >= r,
        f"R = rollout.prompts_per_step x rollout.group_size = "
        f"{spec.rollout.prompts_per_step} x {spec.rollout.group_size} = {r} fresh rollouts "
        f"a step exceeds replay.capacity={n}: the buffer must hold one step's rollouts "
        "(R <= replay.capacity)",
    )


def validate_task_sizes(spec) -> None:
    """The examples written of each split (0: all a file-backed task has) cover a step's
    prompts and the evaluation's. Either key of a pair may be the one the user set, so the
    line names both, the prompts first (the key more often changed), each with a value
    that fits the other."""
    for split, (size_key, size), (prompts_key, prompts) in (
        (
            "train",
            ("task.num_train", spec.task.num_train),
            ("rollout.prompts_per_step", spec.rollout.prompts_per_step),
        ),
        (
            "test",
            ("task.num_test", spec.task.num_test),
            ("eval.num_prompts", spec.eval.num_prompts),
        ),
    ):
        require(
            not size or size >= prompts,
            f"{prompts_key}={prompts} is more than the {size} {split} examples of "
            f"{size_key}={size}: set {prompts_key} to {size} or less, or {size_key} to "
            f"{prompts} or more",
        )


def validate_auto_mode(spec) -> None:
    """Auto mode takes the gradient of each half of the batch, and cannot plan a replay
    ratio below that of generating every step."""
    if spec.replay.mode != "auto":
        return
    b, r = spec.train.batch_size, spec.rollouts_per_step
    require(
        b % 2 == 0,
        f"train.batch_size={b} with replay.mode='auto': the batch splits into two "
        "halves, so it must be even",
    )
    require(
        spec.replay.auto_max_y * r >= b,
        f"replay.auto_max_y={spec.replay.auto_max_y} is below B / R = {b / r:g}, the "
        "replay ratio of generating every step: it must be >= B / R",
    )
    batches, n = spec.replay.auto_onpolicy_batches, spec.replay.capacity
    require(
        batches * b <= n,
        f"replay.auto_onpolicy_batches={batches}: its {batches} x train.batch_size={b} "
        f"rollouts must fit replay.capacity={n}: allowed are 1 to {n // b}",
    )


def validate_sequence_fits_model(spec) -> None:
    """A stored rollout (prompt + completion) fits the model's positions."""
    require(
        spec.seq_len <= spec.model.max_len,
        f"rollout.max_prompt_len + rollout.max_new_tokens = {spec.seq_len} exceeds "
        f"model.max_len={spec.model.max_len}",
    )


def validate_microbatches_with_loss(spec) -> None:
    """m2po masks tokens over the whole batch: it cannot accumulate over microbatches."""
    micro = spec.train.num_microbatches
    require(
        micro == 1 or spec.loss.name != "m2po",
        f"train.num_microbatches={micro} with loss.name='m2po': m2po masks tokens over the "
        "whole batch, so it needs train.num_microbatches=1",
    )


# ------------------------------------------------- with what build made, or the machine


def validate_placement(spec) -> None:
    """Disjoint placement runs a fixed schedule; its device count means nothing colocated."""
    r = spec.rollout
    if r.stream:
        least = placement.stream_minimum_lag(spec.train.max_steps_per_generation, r.sync_every)
        require(
            r.placement == "disjoint" and r.slots >= 1,
            f"rollout.stream=True with rollout.placement={r.placement!r} and rollout.slots="
            f"{r.slots}: the stream needs rollout.placement='disjoint' and rollout.slots >= 1",
        )
        require(
            r.max_policy_lag >= least,
            f"rollout.max_policy_lag={r.max_policy_lag} with rollout.stream: allowed is >= {least}",
        )
    if r.placement == "colocated":
        require(
            r.num_devices == 0,
            f"rollout.num_devices={r.num_devices}: the sampler's own devices need "
            "rollout.placement='disjoint' (colocated, it decodes on the trainer's)",
        )
        return
    require(
        spec.replay.mode == "fixed",
        "rollout.placement='disjoint' needs replay.mode='fixed': the trainer takes "
        "train.max_steps_per_generation steps per generation (auto mode plans its own)",
    )


def placement_devices(spec, num_devices: int, processes: int) -> tuple[int, int]:
    """(trainer devices, sampler devices) out of num_devices: the same devices colocated.
    Disjoint on several processes, every process gives the sampler the same number k of
    its own devices and decodes its block of each batch there: the sampler's mesh is those
    k (the count returned), the trainer's the rest of every process's."""
    r = spec.rollout
    if r.placement == "colocated":
        return num_devices, num_devices
    n = r.num_devices or num_devices // 2
    require(
        num_devices >= 2,
        f"rollout.placement='disjoint' needs at least 2 devices (one for the sampler, one "
        f"for the trainer) and this machine has {num_devices}: use 'colocated'",
    )
    require(
        1 <= n < num_devices,
        f"rollout.num_devices={r.num_devices} of {num_devices} devices: allowed is "
        f"1 <= num_devices <= {num_devices - 1} (the trainer keeps the rest; 0: half)",
    )
    if processes == 1:
        return num_devices - n, n
    local, k = num_devices // processes, n // processes
    require(
        n % processes == 0 and (local - k) % k == 0,
        f"rollout.num_devices={n} on {processes} processes of {local} devices: every process "
        f"gives the sampler k of its devices, its trainer a multiple of k: allowed are "
        f"{[processes * d for d in range(1, local) if (local - d) % d == 0]}",
    )
    return num_devices - n, k


def logical_shards(spec, logical: str, shape, num_devices: int) -> int:
    """How many ways mesh.rules split a logical axis (e.g. heads over tensor) on the mesh
    of `shape`."""
    shape = sharding.validate_mesh_shape(shape, num_devices)
    rule = sharding.logical_to_spec((logical,), sharding.validate_rules(spec.mesh.rules))[0]
    names = () if rule is None else ((rule,) if isinstance(rule, str) else tuple(rule))
    return int(np.prod([shape[sharding.MESH_AXES.index(n)] for n in names]))


def data_shards(spec, num_devices: int) -> int:
    """How many ways the batch and the buffer split: the data x fsdp mesh axes."""
    shape = sharding.validate_mesh_shape(spec.mesh.shape, num_devices)
    return int(np.prod([shape[sharding.MESH_AXES.index(a)] for a in ("data", "fsdp")]))


def sampler_mesh(spec, num_devices: int) -> tuple[int, int, int]:
    """The sampler's mesh shape, checked against the devices under its own key."""
    try:
        return sharding.validate_mesh_shape(spec.sampler_mesh_shape, num_devices)
    except ValueError as e:
        message = str(e).splitlines()[0].replace("mesh.shape", "rollout.mesh_shape", 1)
        raise ConfigError(message) from None


def validate_vocab(model_config, tokenizer) -> None:
    """Every id the tokenizer makes has an embedding."""
    require(
        model_config.vocab_size >= tokenizer.vocab_size,
        f"model.vocab_size={model_config.vocab_size} is smaller than the tokenizer's "
        f"vocabulary ({tokenizer.vocab_size} ids): it must be >= {tokenizer.vocab_size}",
    )


def prompts_fit_by_bound(spec, longest_prompt_chars: int | None) -> bool:
    """Whether the task's bound on prompt characters alone shows every prompt fits: a
    byte-level tokenizer spends one token per character (UTF-8 byte) and BOS one more."""
    return (
        spec.tokenizer.name == "byte"
        and longest_prompt_chars is not None
        and longest_prompt_chars + 1 <= spec.rollout.max_prompt_len
    )


def _opening(text: str, prefix: int, words: int = 6) -> str:
    """The first few words of a prompt after the `prefix` characters every prompt shares
    (a chat template's system turn), so that the message shows the question."""
    head = text[prefix:].split()
    return " ".join(head[:words]) + (" ..." if len(head) > words else "")


def long_prompts(
    spec, prompts: Mapping[str, Sequence[str]], lengths: Mapping[str, np.ndarray]
) -> dict[str, tuple[int, ...]]:
    """The prompts (index in the split, per split) longer than rollout.max_prompt_len,
    given each split's prompt texts and token counts as the run feeds them. With
    task.long_prompts='error' any such prompt is a ConfigError naming the longest; with
    'skip' they are returned, to be left out, and what is left must still cover a step's
    prompts and the evaluation's."""
    limit = spec.rollout.max_prompt_len
    over = {split: tuple(int(i) for i in np.flatnonzero(n > limit)) for split, n in lengths.items()}
    count = sum(len(v) for v in over.values())
    if not count:
        return {}
    if spec.task.long_prompts == "error":
        split, index = max(
            ((s, i) for s, v in over.items() for i in v), key=lambda si: lengths[si[0]][si[1]]
        )
        texts = [t for split_texts in prompts.values() for t in split_texts]
        shared = len(os.path.commonprefix([min(texts), max(texts)])) if len(texts) > 1 else 0
        total = sum(len(v) for v in prompts.values())
        opening = _opening(prompts[split][index], shared)
        raise ConfigError(
            f"rollout.max_prompt_len={limit} is shorter than {count} of the task's {total} "
            f"prompts: the longest, {split} prompt {index} ({opening!r}), is "
            f"{lengths[split][index]} tokens; raise rollout.max_prompt_len or set "
            "task.long_prompts='skip' to leave them out"
        )
    for split, key, least in (
        ("train", "rollout.prompts_per_step", spec.rollout.prompts_per_step),
        ("test", "eval.num_prompts", spec.eval.num_prompts),
    ):
        left = len(lengths[split]) - len(over[split])
        require(
            left >= least,
            f"task.long_prompts='skip' leaves {left} of {len(lengths[split])} {split} prompts "
            f"(rollout.max_prompt_len={limit}): {key}={least} needs at least as many",
        )
    return {split: v for split, v in over.items() if v}


def validate_answers_fit(spec, longest_answer: int | None):
    """A correct answer fits in a completion: a byte-level tokenizer spends one token per
    character, EOS one more (other tokenizers are not measured by characters)."""
    if spec.tokenizer.name != "byte" or longest_answer is None:
        return
    limit = spec.rollout.max_new_tokens
    require(
        longest_answer + 1 <= limit,
        f"rollout.max_new_tokens={limit} is shorter than the task's longest answer "
        f"({longest_answer + 1} tokens with EOS)",
    )


def validate_heads_split(
    spec, model_config, sampler_shape, num_devices: int, sampler_devices: int | None = None
) -> None:
    """Attention heads split over the tensor axis, of training's mesh (over num_devices)
    and of the sampler's (over sampler_devices; None: the same devices)."""
    sampler_devices = num_devices if sampler_devices is None else sampler_devices
    meshes = (
        ("mesh.shape", spec.mesh.shape, num_devices),
        ("rollout.mesh_shape", sampler_shape, sampler_devices),
    )
    for mesh_key, shape, devices in meshes:
        for key, value, logical in (
            ("model.num_heads", model_config.num_heads, "heads"),
            ("model.num_kv_heads", model_config.num_kv_heads, "kv_heads"),
        ):
            split = logical_shards(spec, logical, shape, devices)
            require(
                value % split == 0,
                f"{key}={value} is not divisible by the {split} shards of '{logical}' on "
                f"{mesh_key}={tuple(shape)}: use a multiple of {split} or a smaller tensor axis",
            )


def validate_microbatches(spec, shards: int) -> None:
    """Microbatches split the batch (auto mode: each half of it) over the data shards."""
    micro, b = spec.train.num_microbatches, spec.train.batch_size
    auto = spec.replay.mode == "auto"
    split = b // 2 if auto else b
    what = "half of train.batch_size" if auto else "train.batch_size"
    # The batch itself must split over the data shards, whatever the microbatches.
    require(
        split % shards == 0,
        f"train.batch_size={b}: {'half of it' if auto else 'it'} must split over the "
        f"{shards} data-parallel shards: use a multiple of {shards * (2 if auto else 1)}",
    )
    require(
        split % micro == 0 and (split // micro) % shards == 0,
        f"train.num_microbatches={micro}: must divide {what}={split} into microbatches "
        f"that split over the {shards} data shards",
    )


def validate_rollout_batch(spec, sampler_shape, num_devices: int, processes: int):
    """A step's rollouts split over the sampler's data shards, and its prompts over the
    processes (each reads its own block of every batch of prompts)."""
    r = spec.rollouts_per_step
    split = logical_shards(spec, "batch", sampler_shape, num_devices)
    where = f"the {split} data shards of rollout.mesh_shape={tuple(sampler_shape)}"
    if spec.rollout.placement == "disjoint" and processes > 1:
        # Each process decodes its R / processes rows on its own sampler mesh.
        split *= processes
        where += f" on each of {processes} processes"
    require(
        r % split == 0, f"rollout R = prompts_per_step x group_size={r} is not divisible by {where}"
    )
    slots = spec.rollout.slots
    for key in ("slots", "max_admit"):  # each data shard's slots admit their share
        value = getattr(spec.rollout, key)
        message = f"rollout.{key}={value} is not divisible by {where}"
        require(value % split == 0, f"{message}: allowed are multiples of {split}")
    halvings = spec.rollout.drain_halvings
    require(
        not slots or (slots % 2**halvings == 0 and (slots >> halvings) % split == 0),
        f"rollout.drain_halvings={halvings}: rollout.slots={slots} / 2^{halvings} is not a "
        f"whole multiple of {where}: allowed are halvings that leave one",
    )
    require(
        spec.rollout.prompts_per_step % processes == 0,
        f"rollout.prompts_per_step={spec.rollout.prompts_per_step} is not divisible by the "
        f"{processes} processes: each process reads as many prompts",
    )


def engine_cache_bytes(spec, model_config, sampler_shape, sampler_devices: int) -> int:
    """Bytes of the rollout engine's KV cache on one sampler device: rollout.slots rows
    of max_prompt_len - 1 + max_new_tokens slots, keys and values of every layer, rows
    over the data shards and kv heads over the tensor shards."""
    c = spec.rollout
    rows = -(-c.slots // logical_shards(spec, "batch", sampler_shape, sampler_devices))
    tensor = logical_shards(spec, "kv_heads", sampler_shape, sampler_devices)
    kv_heads = -(-model_config.num_kv_heads // tensor)
    dtype = c.cache_dtype or c.dtype or model_config.dtype
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    length = c.max_prompt_len - 1 + c.max_new_tokens
    return 2 * model_config.num_layers * rows * kv_heads * length * model_config.head_dim * itemsize


def validate_engine_cache(
    spec, model_config, sampler_shape, sampler_devices: int, bytes_limit: int | None
) -> None:
    """The engine's slots fit the sampler devices' memory (bytes_limit per device, None:
    unknown, as on a CPU): the cache alone, the weights and the rest come on top (what
    scripts/tpu_compile.py measures)."""
    if not spec.rollout.slots or not bytes_limit:
        return
    need = engine_cache_bytes(spec, model_config, sampler_shape, sampler_devices)
    data_shards = logical_shards(spec, "batch", sampler_shape, sampler_devices)
    row_bytes = need // -(-spec.rollout.slots // data_shards)
    fits = int(bytes_limit // row_bytes) * data_shards
    require(
        need <= bytes_limit,
        f"rollout.slots={spec.rollout.slots}: its KV cache needs {need / 2**30:.1f} GiB per "
        f"device, more than the device's {bytes_limit / 2**30:.1f} GiB: allowed are at most "
        f"{fits} slots (fewer, with the weights beside them)",
    )


def validate_data_shards(spec, shards: int) -> None:
    """Every batch, the buffer and the evaluation's rows split over the data shards."""
    for key, value in (
        ("rollout R = prompts_per_step x group_size", spec.rollouts_per_step),
        ("train.batch_size", spec.train.batch_size),
        ("replay.capacity", spec.replay.capacity),
        ("eval.num_prompts", spec.eval.num_prompts),
        ("eval.pass_k_prompts x eval.pass_k (rows sampled for pass@k)", spec.eval.pass_k_rows),
    ):
        require(
            value % shards == 0,
            f"{key}={value} is not divisible by the {shards} data shards of mesh.shape="
            f"{tuple(spec.mesh.shape)}",
        )
