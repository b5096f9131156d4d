"""replax's KV-cache sampler on the reference model, timed like tunix_sampler.py.

  python scripts/baselines/replax_sampler.py [--repeats=7]     (the project's venv)

Same shape and protocol as scripts/baselines/tunix_sampler.py (vocab 512, 4 layers,
d_model 256, 4 heads, 2 kv heads, head_dim 64, MLP 1024, fp32; 16-token prompts, 64 new
tokens, temperature 1, batch 8 and 64; median over repeats after warm-up). Run the two
scripts alternately to compare them at the same load (sampler_vs_tunix.sh does).
Prints one JSON line.
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from benchmarks.common import reference_model_config  # noqa: E402  (scripts/benchmarks)

from replax.model import transformer as model_lib  # noqa: E402
from replax.sampling import sampler as sampler_lib  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    config = reference_model_config()
    dummy = jnp.zeros((1, 1), jnp.int32)
    params = nn.unbox(model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy))
    params = params["params"]
    out = {"load_avg_start": os.getloadavg()[0]}
    for batch in (8, 64):
        # EOS id 1 is outside what the random prompts use but can be sampled: the
        # token count is taken from the run itself.
        sampler = sampler_lib.make_sampler(
            config,
            sampler_lib.SamplingConfig(temperature=1.0),
            max_prompt_len=16,
            max_new_tokens=64,
            stop_ids=(1,),
            pad_id=0,
        )
        prompts = np.random.default_rng(batch).integers(2, 512, (batch, 16)).astype(np.int32)
        mask = np.ones((batch, 16), bool)
        result = sampler.generate(params, prompts, mask, jax.random.key(1))
        steps = int(jnp.max(result.lengths))
        times, cpu = [], []
        for _ in range(args.repeats):
            t, c = time.perf_counter(), time.process_time()
            jax.block_until_ready(sampler.generate(params, prompts, mask, jax.random.key(1)))
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        out[f"replax_sampler_tokens_per_s_b{batch}"] = batch * steps / float(np.median(times))
        # Process CPU seconds (all threads): less sensitive to a busy neighbour than wall.
        out[f"replax_sampler_cpu_s_b{batch}_median"] = round(float(np.median(cpu)), 4)
        out[f"replax_sampler_steps_b{batch}"] = steps
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
