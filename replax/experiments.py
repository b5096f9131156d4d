"""Helpers shared by the experiment scripts (scripts/compare.py, scripts/sweep.py).

Loading a config file and applying `KEY=VALUE` overrides, running one resumable run in
process, reading a run back as a summary (final metrics, when it first reaches a target
accuracy, its cost under the paper's model), medians and interquartile ranges over
seeds with "never" as +inf, accuracy curves on a common grid, machine information and
markdown tables. The paper's cost of a run up to a point is sum over steps of B + mu R
= train_rollouts + mu gen_rollouts (cumulative counts in metrics.jsonl), in units of
training on one rollout.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ml_collections
import numpy as np

from replax import config_utils
from replax import metrics as metrics_lib

SUMMARY_FILE = "summary.json"


# ------------------------------------------------------------------- configs


def load_config(path: str, variant: str | None = None) -> ml_collections.ConfigDict:
    """get_config(variant) of a config file (configs/NAME.py)."""
    spec = importlib.util.spec_from_file_location(f"_replax_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)


def config_variants(path: str) -> tuple[str, ...]:
    """The VARIANTS a config file declares (empty if it declares none)."""
    spec = importlib.util.spec_from_file_location(f"_replax_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(getattr(module, "VARIANTS", ()))


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
        raise config_utils.ConfigError(f"unknown config key {key!r}") from None
    if isinstance(value, str) and not isinstance(current, str):
        value = parse_value(value, current)
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


def rollouts_per_step(config) -> int:
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
):
    """Sets what every comparison run fixes: total_steps = budget / R (an equal generated
    budget), evaluations at equal generation spacing, the seed and rate, and the dataset
    and warm start shared by all runs under shared_dir (runs with one seed share one base).
    An auto-mode run generates on some steps only: it stops on total_rollouts = budget,
    with room for the most steps its largest replay ratio (replay.auto_max_y) can take.
    Keys in `explicit` (set by the user's overrides) are left alone."""
    explicit = set(explicit)
    r = rollouts_per_step(config)
    config.total_steps = max(budget_rollouts // r, 1)
    if "eval.every" not in explicit:  # spaced for a run that generates every step
        config.eval.every = max(1, round(config.total_steps / num_evals))
    if config.replay.mode == "auto":
        config.total_rollouts = budget_rollouts
        config.total_steps *= config_utils.auto_max_period(config)
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


def last_record(workdir: str) -> dict[str, Any] | None:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    records = metrics_lib.read_metrics(workdir)
    return records[-1] if records else None


def is_finished(workdir: str, total_steps: int, total_rollouts: int = 0) -> bool:
    """The run's last record is at total_steps, or past its generated-rollout budget."""
    record = last_record(workdir)
    if record is None:
        return False
    spent = bool(total_rollouts) and record.get("gen_rollouts", 0) >= total_rollouts
    return record["step"] == total_steps or spent


def ensure_run(config, workdir: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs (or resumes) the run in workdir unless its last record is at total_steps.
    Returns the trainer's summary (saved in workdir/summary.json), or what is known."""
    summary_path = os.path.join(workdir, SUMMARY_FILE)
    if is_finished(workdir, config.total_steps, config.get("total_rollouts", 0)):
        log(f"done already: {workdir}")
        if os.path.exists(summary_path):
            with open(summary_path) as f:
                return json.load(f)
        return {}
    from replax import trainer  # imported late: scripts parse flags before JAX starts

    log(f"running {workdir} ({config.total_steps} steps)")
    t0 = time.time()
    summary = trainer.train(config, workdir, log=lambda m: log(f"  {m}"))
    summary = {k: metrics_lib._to_python(v) for k, v in summary.items()}
    log(
        f"  final accuracy {summary['final_accuracy']:.3f} (base "
        f"{summary['base_accuracy']:.3f}) in {time.time() - t0:.0f} s"
    )
    with open(summary_path, "w") as f:
        json.dump(summary, f)
    return summary


def evaluate_checkpoint(config, workdir: str) -> dict[str, Any]:
    """The run's held-out evaluation (greedy accuracy, pass@k at temperature 1, entropy;
    the sizes in config.eval) of its latest checkpoint, with the evaluation key 0."""
    import jax

    from replax import checkpoint, trainer  # imported late, as in ensure_run

    ckpt_dir = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(ckpt_dir):
        raise config_utils.ConfigError(f"--workdir={workdir} has no checkpoints/")
    run = trainer.build(config, workdir, log=lambda *_: None)
    checkpointer = checkpoint.Checkpointer(ckpt_dir)
    try:
        step = checkpointer.latest_step()
        state = checkpointer.restore_train_state(step, train_state=run.train_state)
    finally:
        checkpointer.close()
    metrics = run.evaluator(state.params, jax.random.key(0))
    return {"step": step, **{k: metrics_lib._to_python(v) for k, v in metrics.items()}}


def final_evaluation(config, workdir: str, pass_k_prompts: int, log=print) -> dict[str, Any]:
    """evaluate_checkpoint of a finished run with pass@k over `pass_k_prompts` held-out
    prompts (the runs' own evaluations use config.eval.pass_k_prompts, 64 by default: one
    prompt moves pass@k by 1.6 points). Cached in workdir/final_eval_pass{n}.json."""
    path = os.path.join(workdir, f"final_eval_pass{pass_k_prompts}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    config = ml_collections.ConfigDict(config.to_dict())
    config.eval.pass_k_prompts = pass_k_prompts
    result = evaluate_checkpoint(config, workdir)
    log(f"final evaluation of {workdir}: pass@k {result.get('eval_pass_at_k')}")
    with open(path, "w") as f:
        json.dump(result, f)
    return result


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


def modelled_cost(record: dict[str, Any], mu: float) -> float:
    """The paper's cost up to a record: train_rollouts + mu gen_rollouts."""
    return record["train_rollouts"] + mu * record["gen_rollouts"]


def eval_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("eval_accuracy") is not None]


def first_reach(records, target: float, base_accuracy: float | None = None):
    """The record (or a zero-cost start when the base already reaches the target) at which
    held-out accuracy first reaches target; None if it never does."""
    if base_accuracy is not None and base_accuracy >= target - 1e-9:
        return {"step": 0, "gen_tokens": 0, "train_rollouts": 0, "gen_rollouts": 0, "wall_s": 0.0}
    for r in eval_records(records):
        if r["eval_accuracy"] >= target - 1e-9:
            return r
    return None


def steady_mu(records) -> float | None:
    """Generation / training seconds per rollout after the first logged step, whose
    seconds include compilation (the trainer's mu_measured counts them)."""
    first, last = records[0], records[-1]
    try:
        gen = (last["gen_s"] - first["gen_s"]) / (last["gen_rollouts"] - first["gen_rollouts"])
        train = (last["train_s"] - first["train_s"]) / (
            last["train_rollouts"] - first["train_rollouts"]
        )
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return gen / train if train > 0 else None


def summarize_run(records, *, base_accuracy: float | None = None) -> dict[str, Any]:
    """Final metrics of one run (target-independent)."""
    evals = eval_records(records)
    if not evals:
        raise ValueError("the run has no evaluation record")
    last, final_eval = records[-1], evals[-1]
    return {
        "final_accuracy": final_eval["eval_accuracy"],
        "mean_accuracy": float(np.mean([r["eval_accuracy"] for r in evals])),
        "pass_at_k": final_eval.get("eval_pass_at_k"),
        "entropy": final_eval.get("entropy"),
        "gen_tokens": last["gen_tokens"],
        "wall_s": last["wall_s"],
        "gen_s": last["gen_s"],
        "train_s": last["train_s"],
        "train_rollouts": last["train_rollouts"],
        "gen_rollouts": last["gen_rollouts"],
        "mu_measured": last.get("mu_measured"),
        "mu_measured_steady": steady_mu(records),
        "steps": last["step"],
        "base_accuracy": base_accuracy,
    }


def to_target(records, target: float, mus: dict[str, float], base_accuracy=None):
    """Generated tokens and modelled costs (one per named mu) when the run first reaches
    target; inf for each when it never does."""
    hit = first_reach(records, target, base_accuracy)
    if hit is None:
        return {"gen_tokens_to_target": math.inf, **{k: math.inf for k in mus}}
    return {
        "gen_tokens_to_target": hit["gen_tokens"],
        **{k: modelled_cost(hit, mu) for k, mu in mus.items()},
    }


def load_run(workdir: str) -> tuple[list[dict[str, Any]], float | None]:
    """(metrics records, base accuracy or None) of a finished run."""
    records = metrics_lib.read_metrics(workdir)
    base = None
    path = os.path.join(workdir, SUMMARY_FILE)
    if os.path.exists(path):
        with open(path) as f:
            base = json.load(f).get("base_accuracy")
    return records, base


# --------------------------------------------------------------- statistics


def _finite_or_none(value):
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def median(values: Iterable[float | None], *, none_is_inf: bool = True) -> float | None:
    """Median with None read as +inf ("never"), or skipped when none_is_inf is False;
    None if the median is inf or there are no values."""
    values = [math.inf if v is None else float(v) for v in values if none_is_inf or v is not None]
    if not values:
        return None
    return _finite_or_none(np.median(values))


def iqr(values: Iterable[float | None]) -> list[float | None] | None:
    """[25th, 75th] percentiles with None read as +inf; a quartile that reaches into
    the never-reached runs is None."""
    values = [math.inf if v is None else float(v) for v in values]
    if not values:
        return None
    never = 1e300  # np.percentile cannot interpolate inf; any mix with this is "never"
    array = np.where(np.isinf(np.array(values)), never, values)
    return [None if q >= never * 1e-3 else float(q) for q in np.percentile(array, [25, 75])]


def aggregate(
    per_seed: Sequence[dict[str, Any]], keys: Sequence[str], never_keys: Sequence[str] = ()
) -> dict[str, Any]:
    """Medians over seeds of keys, plus `per_seed` lists and `iqr` pairs. In never_keys
    (e.g. tokens to target) a missing value is +inf, elsewhere it is skipped."""
    out: dict[str, Any] = {}
    for k in keys:
        out[k] = median([s.get(k) for s in per_seed], none_is_inf=k in never_keys)
    out["per_seed"] = {k: [_finite_or_none(s.get(k)) for s in per_seed] for k in keys}
    out["iqr"] = {k: iqr([s.get(k) for s in per_seed]) for k in keys}
    return out


def ratio(numerator, denominator) -> float | None:
    if numerator is None or denominator in (None, 0):
        return None
    return float(numerator) / float(denominator)


# ------------------------------------------------------------------- curves


def accuracy_curve(records, x: Callable[[dict[str, Any]], float], base_accuracy=None):
    """(xs, accuracies) of the evaluation records, starting at (0, base) when known."""
    evals = eval_records(records)
    xs = [float(x(r)) for r in evals]
    ys = [float(r["eval_accuracy"]) for r in evals]
    if base_accuracy is not None:
        xs, ys = [0.0, *xs], [float(base_accuracy), *ys]
    return np.asarray(xs), np.asarray(ys)


def median_band(curves, num_points: int = 100):
    """Median and quartiles over curves interpolated on a common grid that stops at the
    shortest curve's end (no extrapolation). curves: list of (xs, ys)."""
    curves = [(xs, ys) for xs, ys in curves if len(xs)]
    if not curves:
        return None
    start = max(xs[0] for xs, _ in curves)
    stop = min(xs[-1] for xs, _ in curves)
    if stop < start:
        start, stop = min(xs[0] for xs, _ in curves), max(xs[-1] for xs, _ in curves)
    grid = np.linspace(start, stop, num_points)
    values = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])
    q1, med, q3 = np.percentile(values, [25, 50, 75], axis=0)
    return grid, med, q1, q3


# ------------------------------------------------------------------- reporting


def machine_info() -> dict[str, Any]:
    info = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import jax

        info["jax"] = jax.__version__
        info["backend"] = jax.default_backend()
        info["devices"] = [str(d) for d in jax.devices()]
    except Exception as e:  # noqa: BLE001 - information only
        info["jax_error"] = str(e)
    return info


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def fmt(value, kind: str = "num") -> str:
    """Table cell: 'never' for None/inf, percent, integer or short float."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "never"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "lr":
        return f"{value:g}"
    return f"{value:.3g}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_json(path: str, payload: dict[str, Any]) -> None:
    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, (np.generic, np.ndarray)):
            return clean(value.tolist())
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(clean(payload), f, indent=2)
    os.replace(tmp, path)
