"""Ahead-of-time memory and compile-time figures of the train step, on simulated devices.

Builds `replax.rl.train_step.make_train_step` for a model shape, batch and mesh from abstract
inputs only (ShapeDtypeStructs with NamedShardings: nothing is allocated), lowers and
compiles it, and prints one JSON object with `compiled.memory_analysis()` per device
(argument, output, alias, temp, generated code bytes), the compiled HLO's size and the
lower / compile seconds. On CPU the bytes are indicative; compare slopes and differences.

    python scripts/memory.py --mode=slope --shape=7b --layers=4,8 --batch=8 --seq=2048 \
        --mesh=1,8,1 --vocab=8192
    python scripts/memory.py --mode=microbatch --shape=7b --layers=4 --batch=8,32 \
        --microbatches=4 --seq=2048 --mesh=1,8,1 --vocab=8192
    python scripts/memory.py --mode=vocab --shape=0.5b --layers=2 --batch=64 --seq=1024 \
        --mesh=1,4,2 --vocab=8192,151936 --chunk=128
    python scripts/memory.py --mode=depth --shape=7b --layers=4,32 --batch=8 --seq=2048 \
        --mesh=1,8,1 --vocab=8192
    python scripts/memory.py --mode=pod --devices=64 --layers=2,4,28 --chunk=128

Modes: `single` (one compile per --layers / --batch / --vocab value, no summary),
`slope` (temp per layer between the first two --layers), `microbatch` (temp at each
--batch, with --microbatches, relative to the first), `vocab` (temp at the second --vocab
minus the first), `depth` (compile seconds and HLO size at each --layers), `pod` (Qwen2.5-7B
at the pod's per-chip batch: per-layer slope x depth + fixed parts against a chip's HBM,
and the full depth's own compile when --layers includes 28). Under nn.scan take depths of
at least 2: XLA folds a one-iteration loop away, and a 1-layer step is not on the line.

Model fields and step options that the installed replax does not have yet are recorded
under `unsupported` and left out, so the same command measures the code before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchmarks import abstract_step  # noqa: E402
from benchmarks.common import print_and_write  # noqa: E402

GIB = 2**30

# Qwen2.5-7B on a v5p-128 slice: 128 TensorCores, 64 chips (a chip's 2 cores are one
# device), 256 sequences of 2048 tokens per step. Google's v5p page gives "95GB" of HBM2e
# per chip; counted as 95e9 bytes (88.5 GiB), the smaller reading.
POD = dict(
    layers=28,
    vocab=152_064,
    batch=256,
    seq=2048,
    chips=64,
    hbm_bytes=95 * 10**9,
    margin=0.2,
    tied=False,
)


def ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="memory.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="single")
    p.add_argument(
        "--shape", default="7b", help=f"layer shape preset: {', '.join(abstract_step.SHAPES)}"
    )
    p.add_argument("--layers", type=ints, default=[4, 8], help="comma-separated depths")
    p.add_argument("--batch", type=ints, default=[8], help="comma-separated global batch sizes")
    p.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    p.add_argument("--vocab", type=ints, default=[8192], help="comma-separated vocabularies")
    p.add_argument("--mesh", type=ints, default=[1, 8, 1], help="data,fsdp,tensor")
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices")
    p.add_argument("--tied", type=int, default=1, help="1: tied embedding head, 0: lm_head")
    p.add_argument("--scan", type=int, default=1, help="model.scan_layers")
    p.add_argument("--remat", default="full", help="model.remat_policy")
    p.add_argument("--attention", default="", help="model.attention ('' = the default)")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (params stay float32)")
    p.add_argument("--state_dtype", default="", help="optimizer state dtype ('' = default)")
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--chunk", type=int, default=0, help="logits_chunk_size (0: step default)")
    p.add_argument("--hlo", type=int, default=0, help="1: also count the compiled HLO's text")
    p.add_argument("--out", default="", help="also write the JSON here")
    args = p.parse_args(argv)
    if args.shape not in abstract_step.SHAPES:
        p.error(f"--shape={args.shape!r}: allowed are {', '.join(abstract_step.SHAPES)}")
    if args.mode not in ("single", "slope", "microbatch", "vocab", "depth", "pod"):
        p.error(f"--mode={args.mode!r}: single, slope, microbatch, vocab, depth or pod")
    if len(args.mesh) != 3:
        p.error(f"--mesh={args.mesh}: three entries (data, fsdp, tensor)")
    return args


def _set_devices(count: int) -> None:
    """Simulated CPU devices; must run before jax is imported."""
    if "jax" in sys.modules:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def figures(args, *, layers, batch, vocab, microbatches=None) -> dict:
    config, unsupported = abstract_step.model_config(
        args.shape,
        layers=layers,
        vocab=vocab,
        seq=args.seq,
        tied=bool(args.tied),
        scan_layers=bool(args.scan),
        remat_policy=args.remat,
        attention=args.attention,
        dtype=args.dtype,
    )
    result = abstract_step.compile_step(
        config,
        batch_size=batch,
        seq=args.seq,
        mesh_shape=args.mesh,
        microbatches=args.microbatches if microbatches is None else microbatches,
        chunk=args.chunk,
        state_dtype=args.state_dtype,
        hlo=bool(args.hlo),
    )
    result["unsupported"] = {**unsupported, **result["unsupported"]}
    result.update(
        layers=layers, batch=batch, vocab=vocab, microbatches=microbatches or args.microbatches
    )
    print(json.dumps(result), file=sys.stderr, flush=True)
    return result


def gib(x: float) -> float:
    return round(x / GIB, 4)


def state_bytes_per_chip(config, chips: int) -> int:
    """Bytes of the train state (parameters and optimizer state) each chip holds on an
    all-fsdp mesh of `chips` devices: a leaf whose sharding names `fsdp` is split
    `chips` ways, the others (tensor-parallel only, on a mesh with tensor = 1) are whole."""
    import jax

    from replax.core import sharding
    from replax.model import transformer as model_lib
    from replax.rl import train_step as train_step_lib

    optimizer = train_step_lib.make_optimizer(train_step_lib.OptimizerConfig(learning_rate=1e-6))
    mesh = sharding.make_mesh((1, -1, 1))
    rules = sharding.validate_rules(sharding.DEFAULT_RULES)
    state, _ = abstract_step.abstract_state(
        train_step_lib, model_lib.Transformer(config), optimizer, mesh, rules
    )
    total = 0
    for leaf in jax.tree.leaves(state):
        nbytes = leaf.size * leaf.dtype.itemsize
        split = "fsdp" in jax.tree.leaves(tuple(leaf.sharding.spec))
        total += nbytes // chips if split else nbytes
    return total


def pod_estimate(args) -> dict:
    """Qwen2.5-7B at the pod's per-chip batch, compiled at each --layers depth.

    The simulated mesh is all-fsdp over --devices with POD batch / chips sequences per
    device. The per-layer temp slope and the fixed temp come from the first two depths; the
    train state a chip holds at the full depth is counted from its abstract shapes for
    `chips` ways of fsdp. With --devices below the pod's 64 chips, the simulated step's
    sharded gradients are larger than the pod's, so the temp figures are an upper bound.
    """
    per_chip = POD["batch"] // POD["chips"]
    args.mesh = [1, args.devices, 1]
    args.seq = POD["seq"]
    args.tied = int(POD["tied"])
    runs = [
        figures(args, layers=n, batch=per_chip * args.devices, vocab=POD["vocab"])
        for n in args.layers
    ]
    (n1, n2), (r1, r2) = args.layers[:2], runs[:2]
    slope = (r2["temp_size_in_bytes"] - r1["temp_size_in_bytes"]) / (n2 - n1)
    fixed_temp = r1["temp_size_in_bytes"] - n1 * slope
    depth = POD["layers"]
    config, _ = abstract_step.model_config(
        args.shape,
        layers=depth,
        vocab=POD["vocab"],
        seq=POD["seq"],
        tied=POD["tied"],
        scan_layers=bool(args.scan),
        remat_policy=args.remat,
        dtype=args.dtype,
    )
    state = state_bytes_per_chip(config, POD["chips"])
    # tokens int32, attention_mask bool, loss_mask and behaviour_logprobs float32.
    batch = per_chip * POD["seq"] * (4 + 1 + 4 + 4)
    # The state is donated (its outputs alias it): a step holds the state, the batch and
    # the temporaries.
    extrapolated = state + batch + fixed_temp + depth * slope
    # A compile at the full depth too (--layers=2,4,28; cheap under scan): the temp is the
    # peak over the step, and the optimizer update's per-layer buffers overtake the
    # backward pass's fixed ones only at larger depths, so a slope between small depths
    # can understate the per-layer cost. The larger of the two figures is the estimate.
    full = [r for r in runs if r["layers"] == depth]
    direct = state + batch + full[0]["temp_size_in_bytes"] if full else None
    total = max(extrapolated, direct or 0)
    hbm = POD["hbm_bytes"]
    budget = hbm * (1 - POD["margin"])
    return {
        "runs": runs,
        "per_chip_sequences": per_chip,
        "temp_slope_gib_per_layer": gib(slope),
        "temp_fixed_gib": gib(fixed_temp),
        "state_gib_per_chip": gib(state),
        "batch_gib_per_chip": gib(batch),
        "extrapolated_gib": gib(extrapolated),
        "full_depth_gib": None if direct is None else gib(direct),
        "estimate_gib": gib(total),
        "hbm_gib": gib(hbm),
        "budget_gib": gib(budget),
        "fits": bool(total <= budget),
    }


def summarise(args, runs) -> dict:
    temp = [r["temp_size_in_bytes"] for r in runs]
    if args.mode == "slope":
        n1, n2 = args.layers[:2]
        return {"temp_slope_gib_per_layer": gib((temp[1] - temp[0]) / (n2 - n1))}
    if args.mode == "microbatch":
        return {"temp_ratio_to_first": [round(t / temp[0], 4) for t in temp]}
    if args.mode == "vocab":
        return {"temp_delta_gib": gib(temp[1] - temp[0])}
    if args.mode == "depth":
        out = {
            "compile_seconds_ratio": round(
                runs[-1]["compile_seconds"] / runs[0]["compile_seconds"], 3
            )
        }
        if "hlo_chars" in runs[0]:
            out["hlo_chars_ratio"] = round(runs[-1]["hlo_chars"] / runs[0]["hlo_chars"], 3)
        return out
    return {}


def measure(args) -> dict:
    """The figures of --mode: the runs and their summary."""
    if args.mode == "pod":
        return pod_estimate(args)
    if args.mode == "depth":
        args.hlo = 1
    runs = [
        # microbatch: the first batch in one pass, the others in --microbatches.
        figures(args, layers=n, batch=b, vocab=v, microbatches=1 if first else None)
        for n in args.layers
        for first, b in zip([args.mode == "microbatch"] + [False] * len(args.batch), args.batch)
        for v in args.vocab
    ]
    return {"runs": runs, **summarise(args, runs)}


def git_revision(root: str) -> str:
    """The commit of the replax that was imported (root: its checkout), plus ' + working
    tree' when tracked files differ from it; a copy outside git names itself in REVISION."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        path = os.path.join(root, "REVISION")
        return open(path).read().strip() if os.path.exists(path) else "unknown"
    return head + (" + working tree" if dirty else "")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _set_devices(args.devices)
    import jax

    if len(jax.devices()) != args.devices:
        print(f"memory.py: {len(jax.devices())} devices, not {args.devices}", file=sys.stderr)
        return 2
    result = {"command": " ".join(["python", "scripts/memory.py", *sys.argv[1:]])}
    import replax

    result["replax"] = os.path.dirname(os.path.abspath(replax.__file__))
    result["revision"] = git_revision(os.path.dirname(result["replax"]))
    try:
        result.update(measure(args))
    except ValueError as e:  # a bad shape, dtype, option or batch: before compiling
        print(f"memory.py: {e}", file=sys.stderr)
        return 2
    print_and_write(result, args.out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
