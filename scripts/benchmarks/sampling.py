"""The sampler: tokens/s with and without the KV cache, the roofline fraction of a decode
step, and top-p over a 152k vocabulary against no filter."""

import functools
import statistics

from benchmarks.common import (
    BATCH_SIZES,
    NEW_TOKENS,
    PROMPT_LEN,
    _machine_probe,
    machine_numbers,
    reference_model_config,
    timed,
)


def roofline_seconds(config, batch, prompt_len, new_tokens, flops_per_s, bytes_per_s):
    """Ideal time of prefill + (new_tokens - 1) decode steps for a batch."""
    from replax.model import flops as flops_lib

    param_bytes = flops_lib.param_count(config) * 4
    kv_bytes_per_slot = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    total = max(
        batch * prompt_len * flops_lib.forward_flops_per_token(config, prompt_len) / flops_per_s,
        param_bytes / bytes_per_s,
    )
    for step in range(1, new_tokens):
        context = prompt_len + step
        flops = batch * flops_lib.forward_flops_per_token(config, context)
        read = param_bytes + batch * context * kv_bytes_per_slot
        total += max(flops / flops_per_s, read / bytes_per_s)
    return total


def decode_matmul_fraction(config, batch: int, repeats: int, probe) -> tuple[float, float]:
    """How fast this machine runs a decode step's weight matmuls alone: one token for a
    batch, through every layer (fused q/k/v and gate/up projections, the most favourable
    shapes) and the LM head, in one jitted program. Returns (GFLOP/s, fraction of the
    probe's matmul rate, median over runs each between two probes). A compute-bound
    sampler cannot beat this fraction of the roofline: it does these matmuls and more."""
    import jax
    import jax.numpy as jnp

    d, hd, mlp = config.d_model, config.head_dim, config.mlp_dim
    qkv = (config.num_heads + 2 * config.num_kv_heads) * hd
    layer = lambda: (
        jnp.full((d, qkv), 0.01),
        jnp.full((config.num_heads * hd, d), 0.01),
        jnp.full((d, 2 * mlp), 0.01),
        jnp.full((mlp, d), 0.01),
    )
    weights = ([layer() for _ in range(config.num_layers)], jnp.full((d, config.vocab_size), 0.01))

    def step(x, weights):
        layers, head = weights
        for w_qkv, w_o, w_gate_up, w_down in layers:
            x = x + (x @ w_qkv)[:, : config.num_heads * hd] @ w_o
            gate, up = jnp.split(x @ w_gate_up, 2, axis=1)
            x = x + (jax.nn.silu(gate) * up) @ w_down
        return x @ head

    flops = 2 * batch * (config.num_layers * (d * qkv + config.num_heads * hd * d + 3 * d * mlp))
    flops += 2 * batch * d * config.vocab_size
    fn, x = jax.jit(step), jnp.ones((batch, d), jnp.float32)
    jax.block_until_ready(fn(x, weights))
    rates, fractions = [], []
    for _ in range(10 * repeats):
        before = probe()
        rates.append(flops / timed(fn, x, weights) / 1e9)
        fractions.append(rates[-1] / ((before[0] + probe()[0]) / 2))
    return statistics.median(rates), statistics.median(fractions)


def bench_sampler(repeats: int) -> dict:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    from baselines import nocache_sampler

    from replax.model import flops as flops_lib
    from replax.model import transformer as model_lib
    from replax.sampling import sampler as sampler_lib

    probe = _machine_probe()
    config = reference_model_config()
    dummy = jnp.zeros((1, 1), jnp.int32)
    variables = jax.jit(model_lib.Transformer(config).init)(jax.random.key(0), dummy, dummy)
    params = nn.unbox(variables)["params"]
    out = {}
    for batch in BATCH_SIZES:
        samplers = {
            "cached": sampler_lib.make_sampler(
                config,
                sampler_lib.SamplingConfig(temperature=1.0),
                max_prompt_len=PROMPT_LEN,
                max_new_tokens=NEW_TOKENS,
                stop_ids=(1,),
                pad_id=0,
            ).generate,
            "nocache": nocache_sampler.make_generate(
                config, max_new_tokens=NEW_TOKENS, eos_id=1, pad_id=0, temperature=1.0
            ),
        }
        prompts = np.random.default_rng(batch).integers(2, config.vocab_size, (batch, PROMPT_LEN))
        prompt_ids = jnp.asarray(prompts, jnp.int32)
        prompt_mask = jnp.ones((batch, PROMPT_LEN), bool)
        args = (params, prompt_ids, prompt_mask, jax.random.key(1))
        steps = {}
        for name, generate in samplers.items():  # warm-up: compile, and count the steps
            result = generate(*args)
            steps[name] = int(jnp.max(result.lengths))  # the loop stops when all rows end
        times = {"cached": [], "nocache": []}
        fractions = []
        for _ in range(repeats):
            # The cached run between two machine probes (its roofline at the same load),
            # then the uncached run back to back.
            before = probe()
            times["cached"].append(timed(samplers["cached"], *args))
            after = probe()
            times["nocache"].append(timed(samplers["nocache"], *args))
            roofline_s = roofline_seconds(
                config,
                batch,
                PROMPT_LEN,
                steps["cached"],
                (before[0] + after[0]) / 2 * 1e9,
                (before[1] + after[1]) / 2 * 1e9,
            )
            fractions.append(roofline_s / times["cached"][-1])
        machine = machine_numbers()
        roofline_s = roofline_seconds(
            config,
            batch,
            PROMPT_LEN,
            steps["cached"],
            machine["machine_matmul_gflops"] * 1e9,
            machine["machine_read_gbs"] * 1e9,
        )
        for name, prefix in (("cached", "sampler"), ("nocache", "sampler_nocache")):
            tokens_per_s = batch * steps[name] / statistics.median(times[name])
            out[f"{prefix}_tokens_per_s_b{batch}"] = tokens_per_s
            out[f"{prefix}_seconds_b{batch}"] = sorted(times[name])
        out[f"sampler_roofline_tokens_per_s_b{batch}"] = batch * steps["cached"] / roofline_s
        out[f"sampler_roofline_fraction_b{batch}"] = statistics.median(fractions)
        out[f"sampler_roofline_fractions_b{batch}"] = sorted(fractions)
        gflops, fraction = decode_matmul_fraction(config, batch, repeats, probe)
        out[f"decode_matmul_gflops_b{batch}"] = gflops
        out[f"decode_matmul_fraction_b{batch}"] = fraction
    out.update(machine_numbers())  # the roofline used these
    out["sampler_shapes"] = {
        "vocab_size": config.vocab_size,
        "num_layers": config.num_layers,
        "d_model": config.d_model,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "mlp_dim": config.mlp_dim,
        "dtype": config.dtype,
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "batch_sizes": list(BATCH_SIZES),
        "param_count": flops_lib.param_count(config),
    }
    return out


TOP_P_VOCAB = 151_936
TOP_P_NEW_TOKENS = 16


def _decode_step_candidate_mass(model, params, prompt_ids, prompt_mask, out, sampling):
    """float32[R, N]: the probability the top-p candidates held at every step of the decode
    loop that produced `out` (1 past its last step), from one forward pass over prompt +
    completion as the loop fed them (stopped rows fed pad, completion slots all valid
    keys). The sampler sorts the whole vocabulary at a step when any row's is below top_p."""
    import jax
    import jax.numpy as jnp

    from replax.model import transformer as model_lib

    tokens = jnp.concatenate([prompt_ids, out.tokens], axis=1)  # [R, P + N]
    mask = jnp.concatenate([prompt_mask, jnp.ones(out.tokens.shape, bool)], axis=1)
    positions = model_lib.positions_from_mask(mask)
    logits = jax.jit(model.apply)({"params": params}, tokens, positions, mask)
    p, n = prompt_ids.shape[1], out.tokens.shape[1]
    step_logits = logits[:, p - 1 : p - 1 + n] / sampling.temperature  # [R, N, V]
    probs = jax.nn.softmax(step_logits, axis=-1)
    mass = jnp.sum(jax.lax.top_k(probs, sampling.top_p_candidates)[0], axis=-1)  # [R, N]
    ran = jnp.arange(n) < jnp.max(out.lengths)  # the loop stops once every row has
    return jnp.where(ran[None, :], mass, 1.0)


def bench_top_p(repeats: int) -> dict:
    import dataclasses

    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    from replax.model import transformer as model_lib
    from replax.sampling import sampler as sampler_lib

    config = dataclasses.replace(
        reference_model_config(),
        vocab_size=TOP_P_VOCAB,
        max_len=PROMPT_LEN + TOP_P_NEW_TOKENS,
    )
    model = model_lib.Transformer(config)
    dummy = jnp.zeros((1, 1), jnp.int32)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), dummy, dummy))["params"]
    # Logits of std ~8 over 152k tokens: a few tokens hold most of the mass.
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * 8.0
    batch = 8
    prompts = np.random.default_rng(0).integers(2, config.vocab_size, (batch, PROMPT_LEN))
    prompt_ids = jnp.asarray(prompts, jnp.int32)
    prompt_mask = jnp.ones((batch, PROMPT_LEN), bool)
    sampler = sampler_lib.make_sampler(
        config,
        sampler_lib.SamplingConfig(temperature=1.0),
        max_prompt_len=PROMPT_LEN,
        max_new_tokens=TOP_P_NEW_TOKENS,
        stop_ids=(1,),
        pad_id=0,
    )
    args = (params, prompt_ids, prompt_mask, jax.random.key(1))
    generate = {top_p: functools.partial(sampler.generate, top_p=top_p) for top_p in (0.95, 1.0)}
    steps = {top_p: int(jnp.max(fn(*args).lengths)) for top_p, fn in generate.items()}
    times = {top_p: [] for top_p in generate}
    for _ in range(repeats):  # interleaved: each sees the same load
        for top_p, fn in generate.items():
            times[top_p].append(timed(fn, *args))
    candidate_mass = _decode_step_candidate_mass(
        model, params, prompt_ids, prompt_mask, generate[0.95](*args), sampler.sampling
    )
    top_p_s, top_p1_s = statistics.median(times[0.95]), statistics.median(times[1.0])
    return {
        "sampler_top_p_s_b8": top_p_s,
        "sampler_top_p1_s_b8": top_p1_s,
        "sampler_top_p_time_ratio": top_p_s / top_p1_s,
        "sampler_top_p_seconds_b8": sorted(times[0.95]),
        "sampler_top_p1_seconds_b8": sorted(times[1.0]),
        "sampler_top_p_steps": [steps[0.95], steps[1.0]],
        "sampler_top_p_candidate_mass_min": float(jnp.min(candidate_mass)),
        "sampler_top_p_vocab_size": TOP_P_VOCAB,
        "sampler_top_p_candidates": sampler.sampling.top_p_candidates,
    }
