"""The stream (`replax.sampling.stream`) against the engine a generation at a time.

Both decode the same rollouts: --stream_generations generations of the same prompts,
generation g under key fold_in(key, g). `engine_per_generation` runs `Engine.generate` on
each in turn, as disjoint placement's sampler does, every generation's tail decoding
while the slots it freed idle. `stream` queues them into one `Stream` of the same S slots
and K, two generations at a time, the next submitted as soon as the oldest has handed out
its last group. Row-step counts are exact (the machine's load does not change them); the
seconds are medians of --repeats runs after a warm-up.
"""

from __future__ import annotations

import statistics
import time


def compare(engine, params, ids, mask, key, group_size: int, generations: int, repeats: int):
    """The JSON entries `engine_per_generation` and `stream` (each with `seconds`,
    `rollouts_per_s`, `decode_steps`, `useful_row_step_frac`) and `stream_same_rollouts`."""
    import jax
    import numpy as np

    from replax.sampling import stream as stream_lib

    prompts, slots = len(ids), engine.slots
    keys = [jax.random.fold_in(key, g) for g in range(generations)]

    def per_generation():
        outs, steps = [], 0
        for k in keys:
            out, stats = engine.generate_with_stats(params, ids, mask, k, num_samples=group_size)
            outs.append(jax.device_get((out.tokens, out.logprobs, out.lengths)))
            steps += int(stats.decode_steps)
        return outs, steps

    def streamed():
        stream = stream_lib.make_stream(engine, prompts=prompts, num_samples=group_size)
        stream.set_params(params, version=0)
        groups = {}
        while stream.busy or stream.generations < generations:
            while stream.generations < generations and stream.can_submit():
                stream.submit(ids, mask, keys[stream.generations])
            for group in stream.advance():
                groups[(group.generation, group.index)] = jax.device_get(
                    (group.tokens, group.logprobs, group.lengths)
                )
        outs = [
            tuple(np.concatenate([groups[(g, i)][f] for i in range(prompts)]) for f in range(3))
            for g in range(generations)
        ]
        return outs, stream.decode_steps

    runs = {"engine_per_generation": per_generation, "stream": streamed}
    results = {name: fn() for name, fn in runs.items()}  # warm-up: compiles
    seconds = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    total = prompts * group_size * generations
    kept = sum(int(lengths.sum()) for _, _, lengths in results["engine_per_generation"][0])

    def entry(name):
        steps = results[name][1]
        median = statistics.median(seconds[name])
        return {
            "seconds": median,
            "seconds_all": seconds[name],
            "rollouts_per_s": total / median,
            "decode_steps": steps,
            "useful_row_step_frac": kept / (steps * slots),
        }

    same = all(
        np.array_equal(a[0], b[0])
        and np.array_equal(a[2], b[2])
        and np.allclose(a[1], b[1], rtol=1e-6, atol=1e-6)
        for a, b in zip(results["engine_per_generation"][0], results["stream"][0], strict=True)
    )
    return {
        "engine_per_generation": entry("engine_per_generation"),
        "stream": entry("stream"),
        "stream_generations": generations,
        "stream_same_rollouts": bool(same),
    }
