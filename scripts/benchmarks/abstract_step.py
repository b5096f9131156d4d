"""A train step lowered and compiled from abstract inputs (ShapeDtypeStructs with
NamedShardings: nothing is allocated), for scripts/memory.py: the layer shapes it names,
the model config of one, the abstract batch and train state, and the compiled step's
`memory_analysis()` and lower / compile seconds. Options the installed replax lacks come
back under `unsupported`, so the same command measures the code before and after.
jax and replax are imported inside the functions: the caller sets the simulated devices
first.
"""

import dataclasses
import inspect
import time

# Layer shapes of the targets. `7b` is Qwen2.5-7B's layer (the pod mode adds its
# depth, vocabulary and untied head); `0.5b` is Qwen2.5-0.5B's.
SHAPES = {
    "7b": dict(d_model=3584, num_heads=28, num_kv_heads=4, head_dim=128, mlp_dim=18944),
    "0.5b": dict(d_model=896, num_heads=14, num_kv_heads=2, head_dim=64, mlp_dim=4864),
    "tiny": dict(d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=128),
}
MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)


def model_config(shape: str, *, layers: int, vocab: int, seq: int, tied: bool, **options):
    """A ModelConfig of the preset shape; options (scan_layers, remat_policy, attention,
    dtype) the installed ModelConfig lacks come back in the second value."""
    from replax.model import transformer as model_lib

    fields = {f.name for f in dataclasses.fields(model_lib.ModelConfig)}
    kwargs = dict(SHAPES[shape], num_layers=layers, vocab_size=vocab, max_len=seq)
    kwargs.update(tie_embeddings=tied, param_dtype="float32")
    unsupported = {}
    for name, value in options.items():
        if value in ("", None):
            continue
        if name in fields:
            kwargs[name] = value
        else:
            unsupported[name] = value
    return model_lib.ModelConfig(**kwargs), unsupported


def abstract_batch(batch_size: int, seq: int, shardings) -> dict:
    """ShapeDtypeStructs of a train-step batch (see replax.rl.train_step's docstring)."""
    import jax
    import jax.numpy as jnp

    shapes = {
        "tokens": ((batch_size, seq), jnp.int32),
        "attention_mask": ((batch_size, seq), jnp.bool_),
        "loss_mask": ((batch_size, seq), jnp.float32),
        "behaviour_logprobs": ((batch_size, seq), jnp.float32),
        "advantage": ((batch_size,), jnp.float32),
        "reward": ((batch_size,), jnp.float32),
        "baseline": ((batch_size,), jnp.float32),
        "importance_weights": ((batch_size,), jnp.float32),
        "age": ((batch_size,), jnp.int32),
        "times_sampled": ((batch_size,), jnp.int32),
    }
    structs = {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in shapes.items()}
    if shardings is None:
        return structs
    return {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in structs.items()
    }


def abstract_state(train_step_lib, model, optimizer, mesh, rules):
    """(abstract TrainState with shardings, its shardings): the train step's own helper
    when it has one, else eval_shape of its init with `train_state_shardings`."""
    import flax.linen as nn
    import jax

    helper = getattr(train_step_lib, "abstract_train_state", None)
    if helper is not None:
        out = helper(model, optimizer, mesh, rules)
        abstract = out[0] if isinstance(out, tuple) else out
        shardings = jax.tree.map(lambda x: x.sharding, abstract)
        return abstract, shardings
    shardings = train_step_lib.train_state_shardings(model, optimizer, mesh, rules)
    boxed = jax.eval_shape(train_step_lib._init_fn(model, optimizer, False), jax.random.key(0))
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        nn.unbox(boxed),
        shardings,
    )
    return abstract, shardings


def compile_step(
    config,
    *,
    batch_size: int,
    seq: int,
    mesh_shape,
    microbatches: int = 1,
    chunk: int = 0,
    state_dtype: str = "",
    hlo: bool = False,
) -> dict:
    """Lowers and compiles one train step from abstract inputs; returns its figures."""

    from replax.core import sharding
    from replax.rl import objectives
    from replax.rl import train_step as train_step_lib

    unsupported = {}
    opt_fields = {f.name for f in dataclasses.fields(train_step_lib.OptimizerConfig)}
    opt_kwargs = dict(learning_rate=1e-6)
    if state_dtype:
        if "state_dtype" in opt_fields:
            opt_kwargs["state_dtype"] = state_dtype
        else:
            unsupported["state_dtype"] = state_dtype
    optimizer = train_step_lib.make_optimizer(train_step_lib.OptimizerConfig(**opt_kwargs))
    mesh = sharding.make_mesh(mesh_shape)
    rules = sharding.validate_rules(sharding.DEFAULT_RULES)
    sharding.check_batch("batch", batch_size, mesh, rules)
    from replax.model import transformer as model_lib

    model = model_lib.Transformer(config)
    state, state_shardings = abstract_state(train_step_lib, model, optimizer, mesh, rules)
    batch_sharding = train_step_lib.batch_shardings(
        mesh, rules, abstract_batch(batch_size, seq, None)
    )
    batch = abstract_batch(batch_size, seq, batch_sharding)

    step_options = {}
    accepted = inspect.signature(train_step_lib.make_train_step).parameters
    # Each option with the value that means "off" (what a step without it does).
    options = (
        ("num_microbatches", microbatches, 1),
        ("logits_chunk_size", chunk, 0),
    )
    for name, value, off in options:
        if name in accepted:
            step_options[name] = value
        elif value != off:
            unsupported[name] = value
    step = train_step_lib.make_train_step(
        model,
        optimizer,
        objectives.LossConfig(name="ppo"),
        mesh,
        rules,
        state_shardings,
        batch_sharding,
        **step_options,
    )
    start = time.perf_counter()
    with sharding.activation_rules(mesh, rules):
        lowered = step.jitted.lower(state, batch)
    lowered_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    out = {f: int(getattr(analysis, f)) for f in MEMORY_FIELDS}
    out.update(lower_seconds=round(lowered_s, 2), compile_seconds=round(compile_s, 2))
    if hlo:
        text = compiled.as_text()
        out.update(hlo_chars=len(text), hlo_lines=text.count("\n"))
    out["unsupported"] = unsupported
    return out
