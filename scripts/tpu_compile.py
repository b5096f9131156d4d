r"""Compiles a run's programs for a TPU slice on this host, which needs no TPU.

  python scripts/tpu_compile.py --config=configs/arith.py --topology=v5e:2x2 \
      [--config.KEY=VALUE ...] [--out=FILE.json] [--programs=train_step,sampler_decode]

It builds the run exactly as scripts/train.py would on that slice (the same spec, meshes,
shardings, step options, dtypes, microbatches, logits chunking, sampler mesh and KV
cache; replax.run.assemble over the slice's devices), lowers each program the run executes
from abstract inputs (nothing is allocated) and compiles it with libtpu's TPU compiler:
the train step, the replay store's add-and-sample, the sampler's weight cast, prefill
and whole decode program (with `--config.rollout.slots=S` the rollout engine's programs in
their place: engine_generate, engine_prefill, engine_refill_decode_chunk and
engine_decode_step), held-out evaluation's greedy and pass@k programs, and with
`rollout.placement=disjoint` over several hosts the weight copy's reshard. A slice of
several hosts compiles the program each of its processes runs (the same global program).

For each program it prints, per device (a chip, or a TensorCore where libtpu lays v4 out
as two): compile seconds; argument, output, alias, temporary and code bytes; the peak
(arguments + outputs - aliased + temporaries + code), and in run (with the train state
and replay store that stay in memory between programs) against the chip's HBM; FLOPs and
bytes accessed by the compiler's cost analysis (a loop's body counted once). Then a
modelled (roofline, never measured) decode step, prefill and train step time and the
generation / training cost per rollout, mu, from the model's FLOPs and HBM traffic at
the chip's peaks (replax/tools/aot.py). With the engine's chunk and step compiled, the
HBM bytes per device of one engine decode step (its refill included) against the ideal,
the weights and the S slots' KV cache read once (`replax.tools.decode_traffic`).

A config whose model weights come from a Hugging Face checkpoint compiles without it:
the config's architecture keys give the shapes, and without the tokenizer files a
stand-in gives the stop and padding ids (the programs' shapes do not depend on them).

Exit 0: every program compiles and its peak is at most 90% of HBM; 1: one does not (each
named); 2: bad input, one line (an unknown topology lists the known ones; no libtpu says
what to install; a mesh that does not divide the slice names both).
"""

import json
import os
import sys

# The host's own backend is the CPU; the programs are compiled for the topology's TPUs.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from replax.core import config_utils  # noqa: E402
from replax.core.config_utils import flag_error_line as _one_line  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT_CONFIG = os.path.join(_ROOT, "configs", "arith.py")
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU slice, e.g. v5e:2x2, v5e-8, v5p:4x4x4.")
_OUT = flags.DEFINE_string("out", None, "Also write the figures to this JSON file.")
_PROGRAMS = flags.DEFINE_list("programs", [], "Compile only these programs (default: all).")

GIB = 2**30


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _parse(argv):
    try:
        config_flags.DEFINE_config_file(
            "config", _DEFAULT_CONFIG, "Config file: configs/NAME.py[:VARIANT].", sys_argv=argv
        )
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 - unknown --config.KEY, bad value, bad file
        _fail(_one_line(e, argv, config_utils.config_from_argv(argv, _DEFAULT_CONFIG)))


def _spec(config):
    """The run spec scripts/train.py would parse; a checkpoint-initialised model without
    its checkpoint starts from a random init (the programs are the same)."""
    from replax.config import build as configuration
    from replax.config import spec as spec_lib
    from replax.tools import experiments

    if config.model.get("init") == "checkpoint" and not config.model.get("checkpoint"):
        with config.unlocked():
            config.model.init = "random"
    file_config = experiments.file_config(flags.FLAGS["config"].config_filename)
    return spec_lib.parse(configuration.fit_task_section(config, file_config))


def _tokenizer(spec, model_config):
    """The run's tokenizer, or without its files a stand-in with the model's vocabulary."""
    from replax.config import build as configuration
    from replax.tools import aot

    if spec.tokenizer.name == "byte" or spec.tokenizer.path or spec.model.checkpoint:
        return configuration.make_tokenizer(spec.tokenizer, spec.model)
    return aot.ShapeTokenizer(model_config.vocab_size)


def build(config, topology: str):
    """(target, run, programs) for the config on the topology; ConfigError, ValueError
    or ImportError for bad input, before anything compiles."""
    from replax.config import build as configuration
    from replax.run import assemble as run_lib
    from replax.tools import aot, tpu_targets

    target = tpu_targets.target(topology)
    spec = _spec(config)
    model_config = configuration.model_config(spec.model)
    try:
        configuration.check_machine(spec, model_config, len(target.devices), target.hosts, "tpu")
    except config_utils.ConfigError as e:
        raise config_utils.ConfigError(
            f"--topology={target.name} ({len(target.devices)} devices, {target.hosts} host(s)): {e}"
        ) from None
    built = configuration.Built(
        model_config=model_config, tokenizer=_tokenizer(spec, model_config), task=None
    )
    run = run_lib.assemble(spec, "", built, devices=target.devices)
    return target, run, aot.run_programs(run, eval_mesh=run_lib.eval_mesh(run))


def _table(rows: dict, target) -> str:
    head = (
        f"{'program':<22} {'compile s':>9} {'args':>7} {'out':>7} {'alias':>7} {'temp':>7} "
        f"{'code':>6} {'peak':>7} {'in run':>7} {'% HBM':>6} {'GFLOP':>9} {'GB read':>8}"
    )
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"{name:<22} did not compile: {r['error']}")
            continue
        g = lambda key, r=r: f"{r[key] / GIB:7.3f}"
        lines.append(
            f"{name:<22} {r['compile_s']:9.1f} {g('argument_bytes')} {g('output_bytes')} "
            f"{g('alias_bytes')} {g('temp_bytes')} {r['code_bytes'] / GIB:6.3f} "
            f"{g('peak_bytes_per_chip')} {g('peak_in_run_bytes_per_chip')} "
            f"{100 * r['peak_fraction']:6.1f} "
            f"{r['flops'] / 1e9:9.2f} {r['bytes_accessed'] / 1e9:8.3f}"
        )
    hbm = target.hbm_bytes_per_device / GIB
    lines.append(
        f"(GiB per device; 'in run': with the train state and replay store also resident; "
        f"HBM {hbm:.1f} GiB per device, fits at <= 90% in run)"
    )
    return "\n".join(lines)


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)
    if not _TOPOLOGY.value:
        _fail("--topology is required, e.g. --topology=v5e:2x2")
    config_file = flags.FLAGS["config"].config_filename.split(":")[0]
    if not os.path.isfile(config_file):
        _fail(f"--config={config_file}: no such file (e.g. --config=configs/arith.py)")
    import jax.numpy as jnp

    from replax.tools import aot, decode_traffic, tpu_targets

    try:
        target, run, programs = build(flags.FLAGS.config, _TOPOLOGY.value)
    except (config_utils.ConfigError, ValueError, ImportError) as e:
        _fail(str(e).splitlines()[0])
    unknown = sorted(set(_PROGRAMS.value) - set(programs))
    if unknown:
        _fail(f"--programs={','.join(unknown)}: this run's programs are {', '.join(programs)}")
    chosen = {k: v for k, v in programs.items() if not _PROGRAMS.value or k in _PROGRAMS.value}
    print(
        f"{target.name}: {target.chips} chips, {len(target.devices)} devices, {target.hosts} "
        f"host(s); train mesh {dict(run.mesh.shape)}, sampler mesh {dict(run.sampler.mesh.shape)}",
        flush=True,
    )
    resident = aot.resident_bytes(run)
    hbm = target.hbm_bytes_per_device
    rows = {}
    for name, program in chosen.items():
        print(f"compiling {name} ...", flush=True)
        try:
            _, rows[name] = aot.compile_figures(program.lower, hbm)
            in_run = aot.peak_in_run(rows[name], program, resident)
            rows[name]["peak_in_run_bytes_per_chip"] = in_run
            rows[name]["fits"] = in_run <= tpu_targets.FIT_FRACTION * hbm
            rows[name]["peak_fraction"] = round(in_run / hbm, 4)
        except Exception as e:  # noqa: BLE001 - what the TPU compiler rejects, reported
            rows[name] = {
                "error": f"{type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0]
            }
    print(_table(rows, target))
    sampler_bytes = jnp.dtype(run.sampler.model_config.jnp_dtype).itemsize
    modelled = aot.modelled_mu(run.spec, run.model_config, target.chip, target.chips, sampler_bytes)
    print(
        f"modelled at the chip's peaks (roofline, not measured): decode step "
        f"{1e3 * modelled['decode_step_s']:.3f} ms, prefill {1e3 * modelled['prefill_s']:.3f} "
        f"ms, train step {1e3 * modelled['train_step_s']:.2f} ms; mu {modelled['mu']:.2f} "
        "(the paper's measured mu: 5.3 at 7B, 6.8 at Qwen3-0.6B)"
    )
    traffic = None
    if {"engine_decode_step", "engine_refill_decode_chunk"} <= set(rows) and not any(
        "error" in rows[n] for n in ("engine_decode_step", "engine_refill_decode_chunk")
    ):
        print("counting the engine's decode step's HBM bytes ...", flush=True)
        in_generate = "engine_generate" in rows and "error" not in rows["engine_generate"]
        traffic = decode_traffic.engine_decode_traffic(run, programs, generate=in_generate)
        print(
            f"engine decode step (S = {traffic['slots']}, K = {traffic['refill_every']}): "
            f"{traffic['per_step_hbm_bytes'] / GIB:.3f} GiB of HBM a step per device "
            f"(a chunk of K steps and its refill, over K; the step alone "
            f"{traffic['step_hbm_bytes'] / GIB:.3f}) against the ideal "
            f"{traffic['ideal_bytes'] / GIB:.3f} (weights "
            f"{traffic['ideal_weights_bytes'] / GIB:.3f} + live KV "
            f"{traffic['ideal_kv_bytes'] / GIB:.3f} read once): "
            f"{traffic['ratio']:.2f}x"
        )
        if traffic["generate_per_step_hbm_bytes"] is not None:
            print(
                f"inside engine_generate: {traffic['generate_per_step_hbm_bytes'] / GIB:.3f} "
                f"GiB a step (its chunk loop over K): {traffic['generate_ratio']:.2f}x"
            )
    compiled_mu = None
    if traffic is not None and all(
        n in rows and "error" not in rows[n] for n in ("engine_prefill", "train_step")
    ):
        print("modelling mu from the compiled programs' bytes ...", flush=True)
        compiled_mu = decode_traffic.compiled_mu(run, programs, traffic, target.chip, target.chips)
        print(
            f"mu {compiled_mu['mu']:.2f} modelled from the compiled programs (HBM bytes with "
            f"loops multiplied out, at the chip's peaks; slots full, completions at the cap; "
            f"not measured): decode step {1e3 * compiled_mu['decode_step_s']:.3f} ms, train "
            f"step {1e3 * compiled_mu['train_step_s']:.2f} ms"
        )
    failed = [n for n, r in rows.items() if "error" in r or not r["fits"]]
    result = {
        "topology": target.name,
        "chips": target.chips,
        "hosts": target.hosts,
        "devices": len(target.devices),
        "hbm_bytes_per_chip": target.chip.hbm_bytes,
        "hbm_bytes_per_device": target.hbm_bytes_per_device,
        "fits": not failed,
        "resident_bytes_per_chip": resident,
        "programs": rows,
        "modelled": modelled,
        "engine_decode_traffic": traffic,
        "modelled_compiled": compiled_mu,
        "config": flags.FLAGS["config"].config_filename,
        "command": " ".join(["python", "scripts/tpu_compile.py", *sys.argv[1:]]),
        "train_mesh": dict(run.mesh.shape),
        "sampler_mesh": dict(run.sampler.mesh.shape),
    }
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if failed:
        for name in failed:
            r = rows[name]
            why = r.get("error") or (
                f"peak {r['peak_in_run_bytes_per_chip'] / GIB:.2f} GiB in run is over 90% of "
                f"{target.hbm_bytes_per_device / GIB:.1f} GiB"
            )
            print(f"{name}: {why}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=_parse)
