"""Helpers for the experiment scripts (compare.py, sweep.py, evaluate.py): their shared
command line (absl flags with `--config=FILE[:ARG]` and `--config.KEY=VALUE`, as
scripts/train.py takes them), config files and `KEY=VALUE` overrides, the settings every
comparison run fixes, running or evaluating one resumable run in process, and writing a
study's report. Analysis of finished runs lives in `replax.tools.analysis`, which reads
metrics.jsonl alone.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import ml_collections

from replax.config import spec as spec_lib
from replax.core import config_utils
from replax.tools import analysis, report

# ------------------------------------------------------------- command line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "arith.py")


def flag_definer(values) -> Callable[..., None]:
    """define(kind, name, default, text, **kwargs): absl's DEFINE_kind into `values`, a
    study script's own FlagValues (parse_command_line's `define` gets them)."""
    from absl import flags

    def define(kind: str, name: str, default, text: str, **kwargs) -> None:
        getattr(flags, f"DEFINE_{kind}")(name, default, text, flag_values=values, **kwargs)

    return define


def parse_command_line(prog: str, argv: list[str], define: Callable[[Any], None]):
    """The absl FlagValues of a study script's command line: `--config=FILE[:ARG]` and
    `--config.KEY=VALUE` (ml_collections config_flags, as scripts/train.py reads them;
    each KEY must be a key of the file's config), `--workdir` (required), `--override`
    (repeatable `[SCOPE:]KEY=VALUE`, the older spelling of --config.KEY=VALUE; a SCOPE
    is what the script says) and `--compilation_cache`, plus the flags `define(flag_values)`
    defines. Raises ConfigError with one line for any bad flag."""
    from absl import flags
    from ml_collections import config_flags

    argv = [prog, *argv]
    values = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "The study's directory.", flag_values=values)
    flags.DEFINE_multi_string(
        "override",
        [],
        "[SCOPE:]KEY=VALUE (repeatable): as --config.KEY=VALUE",
        flag_values=values,
    )
    flags.DEFINE_string(
        "compilation_cache",
        None,
        "JAX persistent compilation cache dir (default WORKDIR/jax_cache; 'none': off)",
        flag_values=values,
    )
    define(values)
    try:  # the config file loads here, and each --config.KEY=VALUE applies to it
        config_flags.DEFINE_config_file(
            "config",
            DEFAULT_CONFIG,
            "Config file: configs/NAME.py[:ARG].",
            flag_values=values,
            sys_argv=argv,
        )
        rest = values(argv)
    except Exception as e:  # noqa: BLE001 - unknown flag or --config.KEY, bad value
        file = config_utils.config_from_argv(argv, DEFAULT_CONFIG)
        raise config_utils.ConfigError(config_utils.flag_error_line(e, argv, file)) from None
    if rest[1:]:
        raise config_utils.ConfigError(f"unexpected arguments {rest[1:]}: flags are --NAME=VALUE")
    path, _ = config_file(values)
    if not os.path.isfile(path):
        raise config_utils.ConfigError(
            f"--config={path}: no such file (e.g. --config=configs/arith.py)"
        )
    if not values.workdir:
        raise config_utils.ConfigError("--workdir is required")
    return values


def config_file(values) -> tuple[str, str | None]:
    """(FILE, ARG or None) of --config=FILE[:ARG]."""
    path, _, arg = values["config"].config_filename.partition(":")
    return path, arg or None


def command_line_overrides(values) -> list[tuple[str | None, str, Any]]:
    """The overrides of a command line as (scope or None, key, value): each
    --config.KEY=VALUE (every run; typed as config_flags parsed it), then each
    --override=[SCOPE:]KEY=VALUE (a string, typed like the field when applied)."""
    given = [
        (None, name[len("config.") :], values[name].value)
        for name in values
        if name.startswith("config.") and values[name].present
    ]
    return given + [split_override(o) for o in values.override]


def variant_arg(arg: str | None, variant: str | None) -> str | None:
    """The get_config argument of `variant` under --config=FILE:ARG: ARG's parts, then the
    variant's (configs/gsm8k.py:qwen3-0.6b,pod with variant onpolicy ->
    'qwen3-0.6b,pod,onpolicy')."""
    return ",".join(p for p in (arg, variant) if p) or None


# ------------------------------------------------------------------- configs


def load_config(path: str, variant: str | None = None) -> ml_collections.ConfigDict:
    """get_config(variant) of a config file (configs/NAME.py)."""
    return config_utils.load_module(path).get_config(variant)


def file_config(config_flag: str) -> ml_collections.ConfigDict:
    """The config of `--config=PATH[:ARG]` as the file gives it, without --config.* overrides
    (what `configuration.fit_task_section` compares the overridden config with)."""
    path, _, arg = config_flag.partition(":")
    return load_config(path, arg or None)


def config_variants(path: str) -> tuple[str, ...]:
    """The VARIANTS a config file declares (empty if it declares none)."""
    return tuple(getattr(config_utils.load_module(path), "VARIANTS", ()))


def parse_value(text: str, current: Any) -> Any:
    """A command-line value, typed like the config field it replaces."""
    if isinstance(current, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise config_utils.ConfigError(f"expected a bool, got {text!r}")
        return text.lower() in ("true", "1")
    if isinstance(current, int):
        value = float(text)
        if value != int(value):
            raise config_utils.ConfigError(f"expected an int, got {text!r}")
        return int(value)
    if isinstance(current, float):
        return float(text)
    if isinstance(current, str):
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def set_value(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """config[key] = value for a dotted key that must already exist."""
    *parents, leaf = key.split(".")
    node = config
    try:
        for part in parents:
            node = node[part]
        current = node[leaf]
    except (KeyError, AttributeError):
        hint = config_utils.did_you_mean(key, config_utils.flat_keys(config))
        raise config_utils.ConfigError(f"unknown config key {key!r}{hint}") from None
    if isinstance(value, str) and not isinstance(current, str):
        try:
            value = parse_value(value, current)
        except config_utils.ConfigError as e:
            raise config_utils.ConfigError(f"{key}={value!r}: {e}") from None
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    node[leaf] = value


def split_override(text: str) -> tuple[str | None, str, str]:
    """`[SCOPE:]KEY=VALUE` -> (scope or None, key, value)."""
    left, sep, value = text.partition("=")
    if not sep or not left:
        raise config_utils.ConfigError(f"override {text!r}: expected [SCOPE:]KEY=VALUE")
    scope, colon, key = left.rpartition(":")
    return (scope if colon else None), key.strip(), value


def rollouts_per_step(config: ml_collections.ConfigDict) -> int:
    """R = prompts_per_step x group_size of a config not yet parsed (it may be changed)."""
    return config.rollout.prompts_per_step * config.rollout.group_size


def finalize_config(
    config,
    *,
    budget_rollouts: int,
    num_evals: int,
    seed: int,
    learning_rate: float,
    shared_dir: str,
    explicit: Iterable[str] = (),
    eval_quantum: int = 0,
):
    """Sets what every comparison run fixes: total_steps = budget / R (an equal generated
    budget), evaluations at equal generation spacing (a multiple of eval_quantum rollouts
    when given: the R of every design compared, so that all evaluate at the same rollout
    counts), the seed and rate, and the dataset
    and warm start shared by all runs under shared_dir (runs with one seed share one base).
    An auto-mode run generates on some steps only: it stops on total_rollouts = budget,
    with room for the most steps its largest replay ratio (replay.auto_max_y) can take.
    Keys in `explicit` (set by the user's overrides) are left alone."""
    explicit = set(explicit)
    r = rollouts_per_step(config)
    config.total_steps = max(budget_rollouts // r, 1)
    if "eval.every" not in explicit:  # spaced for a run that generates every step
        q = eval_quantum or r
        if q % r:
            raise ValueError(f"eval_quantum={q} is not a multiple of R={r}")
        steps = q // r  # a quantum's steps
        config.eval.every = max(1, round(config.total_steps / num_evals / steps)) * steps
    if config.replay.mode == "auto":
        config.total_rollouts = budget_rollouts
        b = config.train.batch_size
        config.total_steps *= spec_lib.auto_max_period(config.replay.auto_max_y, r, b)
    if "checkpoint_every" not in explicit:
        config.checkpoint_every = min(config.checkpoint_every, config.total_steps)
    config.seed = seed
    config.optimizer.learning_rate = learning_rate
    if not config.task.data_dir:
        config.task.data_dir = os.path.join(shared_dir, "data")
    if not config.warmstart.cache_dir:
        config.warmstart.cache_dir = os.path.join(shared_dir, "base")
    return config


# ---------------------------------------------------------------------- runs


def ensure_run(
    spec: spec_lib.RunSpec, workdir: str, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Runs (or resumes) the run in workdir unless its last record is at total_steps.
    Returns the trainer's summary (saved in workdir/summary.json), or what is known."""
    summary_path = os.path.join(workdir, analysis.SUMMARY_FILE)
    if analysis.is_finished(workdir, spec.total_steps, spec.total_rollouts):
        log(f"done already: {workdir}")
        if os.path.exists(summary_path):
            with open(summary_path) as f:
                return json.load(f)
        return {}
    from replax.run import trainer  # imported late: scripts parse flags before JAX starts

    log(f"running {workdir} ({spec.total_steps} steps)")
    t0 = time.time()
    summary = trainer.train(spec, workdir, log=lambda m: log(f"  {m}"))
    log(
        f"  final accuracy {summary['final_accuracy']:.3f} (base "
        f"{summary['base_accuracy']:.3f}) in {time.time() - t0:.0f} s"
    )
    report.write_json(summary_path, summary)
    with open(summary_path) as f:
        return json.load(f)


def evaluate_checkpoint(
    spec: spec_lib.RunSpec, workdir: str, step: int | None = None, warn=None, key: int | None = None
) -> dict[str, Any]:
    """The run's held-out evaluation (greedy accuracy, pass@k at temperature 1, entropy;
    the sizes in spec.eval) of its latest sealed checkpoint whose files match their
    checksums, or of `step` (ConfigError, naming the sealed ones, if it is not one), with
    the key the run's own evaluations drew their temperature-1 samples with
    (`trainer.eval_key`; `key=0`: key(0)), so that pass@k and entropy are the logged ones
    under the same settings. `warn` (default stderr) gets a line for each newer checkpoint
    passed over. Builds the run and reads its data; never reruns a warm start."""
    import jax

    from replax.run import assemble as run_lib
    from replax.run import (
        checkpoint,  # imported late, as in ensure_run
        frozen_base,
        trainer,
    )

    warn = warn or (lambda line: print(line, file=sys.stderr))
    ckpt_dir = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(ckpt_dir):
        raise config_utils.ConfigError(f"--workdir={workdir} has no checkpoints/")
    checkpointer = checkpoint.Checkpointer(ckpt_dir)
    try:  # the seal is checked before anything is built
        step = checkpointer.pick_sealed(step, log=warn)
        run = run_lib.build(spec, workdir)
        data = run_lib.prepare_data(run)
        train_state, _ = run_lib.abstract_states(run)  # the structure to restore into
        state = frozen_base.restore_train_state(run, checkpointer, step, train_state)
    finally:
        checkpointer.close()
    rng = trainer.eval_key(spec.seed) if key is None else jax.random.key(key)
    return {"step": step, **_evaluate(data, state.params, rng)}


def evaluate_pretrained(spec: spec_lib.RunSpec, workdir: str) -> dict[str, Any]:
    """The held-out evaluation, as `evaluate_checkpoint` makes it, of the Hugging Face
    directory of spec.model.checkpoint (model.init='checkpoint'); the data set is built
    in workdir/data unless task.data_dir says."""
    import jax

    from replax.run import assemble as run_lib

    run = run_lib.build(spec, workdir)
    data = run_lib.prepare_data(run)
    params = run_lib.initial_params(run, data, log=lambda line: None)
    return {"checkpoint": spec.model.checkpoint, **_evaluate(data, params, jax.random.key(0))}


def _evaluate(data, params, rng) -> dict[str, float]:
    metrics = data.evaluator(params, rng)
    return {k: float(v) for k, v in metrics.items()}


def final_evaluation(
    spec: spec_lib.RunSpec, workdir: str, pass_k_prompts: int, log=print
) -> dict[str, Any]:
    """evaluate_checkpoint of a finished run with pass@k over `pass_k_prompts` held-out
    prompts (the runs' own evaluations use eval.pass_k_prompts, 64 by default: one
    prompt moves pass@k by 1.6 points). Cached in workdir/final_eval_pass{n}.json."""
    path = os.path.join(workdir, f"final_eval_pass{pass_k_prompts}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    spec = dataclasses.replace(
        spec, eval=dataclasses.replace(spec.eval, pass_k_prompts=pass_k_prompts)
    )
    # key(0), as the studies' results were made with (their own prompts' count differs from
    # the run's evaluations anyway).
    result = evaluate_checkpoint(spec, workdir, key=0)
    log(f"final evaluation of {workdir}: pass@k {result.get('eval_pass_at_k')}")
    with open(path, "w") as f:
        json.dump(result, f)
    return result


GSM8K_CONFIG = os.path.join(ROOT, "configs", "gsm8k.py")


def cache_dir(flag: str | None, workdir: str) -> str | None:
    """--compilation_cache: a directory, 'none' (off), or unset (WORKDIR/jax_cache)."""
    path = flag or os.path.join(workdir, "jax_cache")
    return None if path == "none" else path


@contextlib.contextmanager
def compilation_cache(path: str | None, min_compile_s: float = 0.2):
    """JAX's persistent compilation cache in `path` for the duration (None: unchanged).
    Runs of one comparison compile the same programs again and again; on a CPU the cache
    makes a micro run about 3x faster. Restores the previous settings afterwards."""
    if not path:
        yield
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    previous = [getattr(jax.config, name) for name in names]
    os.makedirs(path, exist_ok=True)
    for name, value in zip(names, (path, min_compile_s)):
        jax.config.update(name, value)
    cc.reset_cache()  # a cache checked (and found off) before would stay off
    try:
        yield
    finally:
        for name, value in zip(names, previous):
            jax.config.update(name, value)
        cc.reset_cache()
