r"""Benchmarks replax on this machine and writes one JSON object.

  python scripts/bench.py --out=bench.json [--only=machine,sampler] [--repeats=5]

Each group is a function returning a dict of keys; the dicts are merged into one JSON
object, written to --out and printed. Times are taken after a warm-up call, blocking on
the result, as the median of --repeats runs. The machine is shared and noisy, so the
load average is recorded next to the numbers.

Groups:
  machine  machine_matmul_gflops (jitted fp32 2048x2048 matmul), machine_read_gbs (sum of
           a 256 MiB fp32 array), machine_matmul_gflops_per_cpu_s (the matmul's FLOPs per
           CPU-second of this process): medians over this group's runs and those the
           sampler and train groups interleave with their own (each sees the same load).
  sampler  sampler_tokens_per_s_b{8,64} (KV cache) and sampler_nocache_tokens_per_s_b{8,64}
           (scripts/baselines/nocache_sampler.py: the full forward over the whole token
           buffer for every new token, also one jitted loop), timed back to back;
           sampler_roofline_fraction_b{8,64} = achieved tokens/s over the roofline
           tokens/s, where each forward call (the prefill and every decode step) takes
           max(flops / machine matmul flops, bytes / machine read bandwidth),
           flops = matmul FLOPs over the valid context and bytes = parameters + the KV
           cache of the valid context. Each cached run sits between two machine probes and
           the fraction is the median over runs of (roofline time at the probes' mean /
           run time), so that a load change between the probes and the runs does not skew
           it; sampler_roofline_tokens_per_s_b* uses the median machine numbers.
           decode_matmul_gflops_b{8,64}, decode_matmul_fraction_b{8,64}: one decode step's
           weight matmuls alone (fused projections, one program) against the probe's
           matmul rate, the ceiling of the roofline fraction for a compute-bound decode.
  top_p    sampler_top_p_s_b8, sampler_top_p1_s_b8: median seconds of one sampler call
           (B = 8, prompt 16, 16 new tokens, temperature 1) with top_p = 0.95 and with
           top_p = 1 (no filter), the reference model with vocabulary 151,936 (Qwen2's)
           and its final norm scaled x8 so that, like a trained model's, the distribution
           is peaked (sampler_top_p_candidate_mass_min: the least probability the 64
           candidates hold over every row and decode step of the top_p = 0.95 call;
           below 0.95 that step sorted the whole vocabulary);
           sampler_top_p_time_ratio = top_p 0.95 / top_p 1.
  replay   replay_add_us, replay_sample_us (N = 4096 slots) and the `_64k` keys (N = 65536):
           median microseconds of one jitted, blocking call (state donated) that adds 64 /
           samples 64 LLM-shaped items (tokens int32[160], behaviour log-probs and loss mask
           f32[160], reward, advantage f32, policy version int32), uniform strategy, one
           shard, buffer filled past capacity. With flashbax installed, its item buffer
           (make_item_buffer, add donated) on the same items is timed interleaved with ours:
           flashbax_add_us, flashbax_sample_us (+ `_64k`) and replay_vs_flashbax_speedup[_64k]
           = (flashbax add + sample) / (ours add + sample). replay_add_kernels,
           replay_sample_kernels (and flashbax_*_kernels): kernels (thunks) in the compiled
           program at N = 4096, which set these calls' cost on XLA:CPU more than the bytes
           they move.
  train    train_step_s, train_tokens_per_s, train_mfu: the replax train step (PPO loss,
           AdamW, global-norm clipping, state donated) on one device, batch 64 x 160 tokens
           (16 prompt, left-padded, + 144 completion, padded after EOS), the reference model
           with max_len 160. MFU = flops.train_flops(config, 64, 160) / step time / machine
           matmul FLOP/s, each step paired with the machine probes around it (as the
           sampler's roofline); train_cpu_s is the median process CPU seconds per step and
           train_mfu_cpu the same ratio per CPU-second of this process (step FLOPs / its CPU
           seconds over the matmul's FLOPs per CPU-second), which other load barely moves.
  hand_tuned  (only with --only) the hand-written pieces against their plain jax forms,
           back to back: see scripts/benchmarks/hand_tuned.py.
  placement  (only with --only) colocated against disjoint placement, a step's wall time
           when generation and training cost the same: scripts/benchmarks/placement.py.
  covariance  (only with --only) the plain train step against KL-Cov's (loss.kl_cov_frac =
           0.002) on configs/smollm2.py's shape, batch and microbatches, alternated:
           covariance_{plain,kl_cov}_step_s (wall) and _cpu_s, their ratios, the passes each
           step ran and its train_flops: scripts/benchmarks/covariance.py.
Reference model (design.md): vocab 512, 4 layers, d_model 256, 4 heads, 2 kv heads,
head_dim 64, MLP 1024, fp32; prompt 16 tokens, 64 new tokens.
"""

import os
import sys
import time

from absl import app, flags
from benchmarks.common import bench_machine, print_and_write
from benchmarks.covariance import bench_covariance
from benchmarks.hand_tuned import bench_hand_tuned
from benchmarks.placement import bench_placement
from benchmarks.replay import bench_replay
from benchmarks.sampling import bench_sampler, bench_top_p
from benchmarks.train import bench_train

_OUT = flags.DEFINE_string("out", None, "Write the JSON object to this file.")
_ONLY = flags.DEFINE_list(
    "only",
    None,
    "Comma-separated groups to run (default: all but hand_tuned, placement, covariance).",
)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per measurement (median).")

GROUPS = {
    "machine": bench_machine,
    "sampler": bench_sampler,
    "top_p": bench_top_p,
    "replay": bench_replay,
    "train": bench_train,
    "hand_tuned": bench_hand_tuned,
    "placement": bench_placement,
    "covariance": bench_covariance,
}
DEFAULT_GROUPS = ["machine", "sampler", "top_p", "replay", "train"]


def main(argv):
    del argv
    import jax

    only = _ONLY.value or DEFAULT_GROUPS
    unknown = [g for g in only if g not in GROUPS]
    if unknown:
        print(f"error: --only={','.join(unknown)}: allowed are {','.join(GROUPS)}", file=sys.stderr)
        sys.exit(2)
    if _REPEATS.value < 1:
        print(f"error: --repeats={_REPEATS.value}: must be >= 1", file=sys.stderr)
        sys.exit(2)
    result = {
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "cpu_count": os.cpu_count(),
        "repeats": _REPEATS.value,
        "loadavg_start": list(os.getloadavg()),
    }
    for name in only:
        start = time.perf_counter()
        result.update(GROUPS[name](_REPEATS.value))
        result[f"{name}_bench_s"] = time.perf_counter() - start
    result["loadavg_end"] = list(os.getloadavg())
    print_and_write(result, _OUT.value, indent=2, sort_keys=True)


if __name__ == "__main__":
    from replax.core.config_utils import parse_flags_or_exit

    app.run(main, flags_parser=parse_flags_or_exit)
