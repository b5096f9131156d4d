r"""LoRA's two speed questions on this machine (docs/lora.md):

  python scripts/lora_bench.py --what=decode [--rank=16]
  python scripts/lora_bench.py --what=sync [--rank=16]

decode: the sampler with the adapters applied on the fly, merged into the weights, and
the base model alone, on the benchmark's reference model (vocab 512, 4 layers, d_model
256, fp32), 64 rows of 16 prompt + 64 new tokens, interleaved repetitions; and the merge.
sync: disjoint placement's weight sync on 8 simulated CPU devices (trainer 4, sampler 4)
of a SmolLM2-135M-shaped model, the whole tree against the adapters alone, by the path
`weight_sync.WeightSync` takes in one process (a device_put of the tree given, then the cast).
"""

import argparse
import dataclasses
import os
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--what", choices=("decode", "sync"), required=True)
parser.add_argument("--rank", type=int, default=16)
parser.add_argument("--repeats", type=int, default=15)
ARGS = parser.parse_args()
if ARGS.what == "sync":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from replax.core import sharding  # noqa: E402
from replax.model import lora  # noqa: E402
from replax.model import transformer as model_lib  # noqa: E402
from replax.rl import train_step as train_step_lib  # noqa: E402
from replax.sampling import sampler as sampler_lib  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def decode():
    base = model_lib.ModelConfig(
        vocab_size=512,
        num_layers=4,
        d_model=256,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        mlp_dim=1024,
        max_len=128,
    )
    config = dataclasses.replace(base, lora_rank=ARGS.rank)
    tokens = jnp.zeros((1, 4), jnp.int32)
    params = nn.unbox(model_lib.Transformer(config).init(jax.random.key(0), tokens, tokens))
    # Trained adapters (B != 0), so that nothing is skipped for being zero.
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.01 if "lora_b" in jax.tree_util.keystr(p) else x, params["params"]
    )
    merge = jax.jit(lambda p: lora.merged(p, config))
    settings = dict(max_prompt_len=16, max_new_tokens=64, stop_ids=(511,), pad_id=0)
    cases = {
        "adapters applied": (sampler_lib.make_sampler(config, **settings), params),
        "adapters merged": (sampler_lib.make_sampler(base, **settings), merge(params)),
        "base alone": (sampler_lib.make_sampler(base, **settings), lora.without_adapters(params)),
    }
    rows = 64
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 500, (rows, 16)), jnp.int32)
    mask = jnp.ones_like(ids, bool)
    run = lambda s, p, r: lambda: s.generate(p, ids, mask, jax.random.key(r)).tokens
    for s, p in cases.values():
        timed(run(s, p, 0))  # compiled
    timed(lambda: merge(params))
    times = {name: [] for name in cases}
    merges = []
    for r in range(ARGS.repeats):
        for name, (s, p) in cases.items():
            times[name].append(timed(run(s, p, r)))
        merges.append(timed(lambda: merge(params)))
    for name, t in times.items():
        print(
            f"{name:17s} median {np.median(t) * 1e3:7.1f} ms ({rows * 64 / np.median(t):6.0f} "
            f"tokens/s), fastest {min(t) * 1e3:7.1f} ms"
        )
    print(f"merge (jitted, once a sync): median {np.median(merges) * 1e3:.2f} ms")


def sync():
    config = model_lib.ModelConfig(
        vocab_size=49152,
        num_layers=30,
        d_model=576,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        mlp_dim=1536,
        max_len=256,
        lora_rank=ARGS.rank,
    )
    rules = sharding.validate_rules(sharding.DEFAULT_RULES)
    devices = jax.devices()
    trainer = sharding.make_mesh((1, 4, 1), devices[:4])
    sampler_mesh = sharding.make_mesh((1, 4, 1), devices[4:])
    optimizer = train_step_lib.make_optimizer(train_step_lib.OptimizerConfig())
    state, _ = train_step_lib.init_train_state(
        model_lib.Transformer(config), optimizer, jax.random.key(0), trainer, rules
    )
    sampler = sampler_lib.make_sampler(
        config,
        max_prompt_len=16,
        max_new_tokens=16,
        stop_ids=(0,),
        pad_id=0,
        mesh=sampler_mesh,
        rules=rules,
    )
    adapters = lora.partition(state.params, True)[0]
    targets = lora.partition(sampler.params_shardings, True)[0]
    whole = lambda: sampler.prepare_params(state.params)
    only = lambda: sampler.cast_params(jax.device_put(adapters, targets))
    timed(whole), timed(only)
    t_whole, t_only = [], []
    for _ in range(ARGS.repeats):
        t_whole.append(timed(whole))
        t_only.append(timed(only))
    mib = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree)) / 2**20
    print(f"whole tree {mib(state.params):7.1f} MiB: sync_s median {np.median(t_whole):.3f}")
    print(f"adapters   {mib(adapters):7.2f} MiB: sync_s median {np.median(t_only):.3f}")


if __name__ == "__main__":
    {"decode": decode, "sync": sync}[ARGS.what]()
