r"""Evaluates a run's checkpoint, or a Hugging Face directory, on the held-out split.

  python scripts/evaluate.py --workdir=runs/arith [--step=N] [--config.eval.num_prompts=2000]
  python scripts/evaluate.py --checkpoint=HF_DIR [--config=configs/gsm8k.py[:VARIANT]] \
      [--workdir=DIR] [--config.KEY=VALUE ...]

A run (--workdir, by default the run of train.py's default, runs/arith): evaluated under
its own configuration (WORKDIR/config.json), with the params of its latest sealed
checkpoint whose files match their checksums, or of step N. The checkpoint fixes the
rest, so only how the evaluation runs may be overridden: --config.eval.*, mesh.*,
rollout.mesh_shape and task.data_dir. A step that is not a sealed checkpoint: exit 2,
one line naming the sealed ones.

A Hugging Face directory (--checkpoint, e.g. the base model of a run): --config gives the
task and the evaluation (default configs/gsm8k.py, which needs
--config.task.data_path), with model.checkpoint set to the directory (its tokenizer too,
unless the config names another). With --workdir, the data set is built in WORKDIR/data
(unless task.data_dir) and the result written to WORKDIR/eval.json; without it, the data
goes to a temporary directory and the result is printed only.

Prints greedy pass@1 (eval_accuracy), pass@k at temperature 1 and mean token entropy as
one JSON object. A run's checkpoint draws its temperature-1 samples with the key the run's
own evaluation of that step drew them with, so with unchanged eval.* settings the figures
are those in its metrics.jsonl at that step (a Hugging Face directory: key 0). The JSON
names the step (a run) or the directory (--checkpoint) evaluated; a run's goes to
WORKDIR/eval.json too. Bad input: exit 2, one line on stderr. absl's --verbosity
is honoured (default: errors only).
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from replax.core import config_utils  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RUN_CONFIG = os.path.join(_ROOT, "configs", "arith.py")  # train.py's default run
_HF_CONFIG = os.path.join(_ROOT, "configs", "gsm8k.py")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "The run to evaluate (default runs/arith), or where --checkpoint's go."
)
_STEP = flags.DEFINE_integer("step", None, "The run's checkpoint step (default: the latest).")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A Hugging Face directory to evaluate instead of a run."
)
# What a run's evaluation may change: how it evaluates, not what the checkpoint holds.
_RUN_OVERRIDES = ("eval.", "mesh.", "rollout.mesh_shape", "task.data_dir")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _given(argv, name: str) -> str | None:
    """The value of --name=VALUE or --name VALUE on the command line, or None."""
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _run_config(workdir: str) -> dict:
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        _fail(
            f"--workdir={workdir} has no config.json: not a replax run directory (a Hugging "
            "Face directory is evaluated with --checkpoint=DIR)"
        )
    with open(path) as f:
        return json.load(f)


def _parse(argv):
    """The command line, with the config flag a run (its config.json) or --checkpoint (a
    config file) needs, so that --config.KEY=VALUE applies to the right config."""
    import ml_collections

    if _given(argv, "checkpoint") is None:
        workdir = _given(argv, "workdir") or config_utils.default_workdir(_RUN_CONFIG, _ROOT)
        if not os.path.exists(workdir):
            _fail(
                f"--workdir={workdir} does not exist: give the workdir of a run (as train.py "
                "wrote it), or --checkpoint=HF_DIR [--config=configs/NAME.py] to evaluate a "
                "Hugging Face directory"
            )
        if _given(argv, "config") is not None:
            _fail(
                "--config with a run: the run is evaluated under its own config "
                "(WORKDIR/config.json); give --config.KEY=VALUE overrides alone, or "
                "--checkpoint=HF_DIR to evaluate a Hugging Face directory"
            )
        config = _run_config(workdir)
        define = lambda: config_flags.DEFINE_config_dict(
            "config", ml_collections.ConfigDict(config), "The run's config (config.json)."
        )
    else:
        config = None
        define = lambda: config_flags.DEFINE_config_file(
            "config",
            _HF_CONFIG,
            "The task's config file: configs/NAME.py[:VARIANT].",
            sys_argv=argv,
        )
    try:
        define()
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 - unknown --config.KEY, bad value, bad file
        config = config if config is not None else config_utils.config_from_argv(argv, _HF_CONFIG)
        _fail(config_utils.flag_error_line(e, argv, config))


def _overrides() -> list[str]:
    return [
        name[len("config.") :]
        for name in flags.FLAGS
        if name.startswith("config.") and flags.FLAGS[name].present
    ]


def _evaluate_run(workdir: str):
    from replax.config import spec as spec_lib
    from replax.tools import experiments

    fixed = [k for k in _overrides() if not k.startswith(_RUN_OVERRIDES)]
    if fixed:
        _fail(
            f"--config.{fixed[0]}: a run's checkpoint fixes it; a run's evaluation takes "
            f"--config.KEY=VALUE for {', '.join(k + '*' * k.endswith('.') for k in _RUN_OVERRIDES)}"
        )
    spec = spec_lib.parse(flags.FLAGS.config)
    metrics = experiments.evaluate_checkpoint(spec, workdir, step=_STEP.value)
    return metrics, os.path.join(workdir, "eval.json")


def _evaluate_directory(checkpoint: str, workdir: str | None):
    from replax.config import build as configuration
    from replax.config import spec as spec_lib
    from replax.tools import experiments

    if _STEP.value is not None:
        _fail("--step picks a run's checkpoint (--workdir); --checkpoint is one directory")
    if not os.path.isdir(checkpoint):
        _fail(f"--checkpoint={checkpoint}: no such directory")
    config = flags.FLAGS.config
    config_file = flags.FLAGS["config"].config_filename
    tokenizer_file = os.path.join(checkpoint, "tokenizer.json")
    if config.tokenizer.name == "hf" and not config.tokenizer.path:
        if not os.path.isfile(tokenizer_file):
            given = _given(sys.argv, "config") or "configs/gsm8k.py (the default)"
            _fail(
                f"--checkpoint={checkpoint} has no tokenizer.json, and --config={given} reads "
                f"the tokenizer from it ({tokenizer_file}): "
                "give --config=configs/NAME.py of the model's task (e.g. configs/arith.py for "
                "a byte-tokenizer model) or --config.tokenizer.path=DIR"
            )
    file_config = experiments.file_config(config_file)
    with config.unlocked():
        config.model.init, config.model.checkpoint = "checkpoint", checkpoint
    spec = spec_lib.parse(configuration.fit_task_section(config, file_config))
    if workdir is None:  # the data set goes to a temporary directory
        with tempfile.TemporaryDirectory(prefix="replax_eval_") as tmp:
            return experiments.evaluate_pretrained(spec, tmp), None
    return experiments.evaluate_pretrained(spec, workdir), os.path.join(workdir, "eval.json")


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)
    from replax.run import runtime

    checkpoint = _CHECKPOINT.value
    try:  # every check runs before any compute (the run is built, then evaluated)
        if checkpoint is None:
            workdir = _WORKDIR.value or config_utils.default_workdir(_RUN_CONFIG, _ROOT)
            metrics, out = _evaluate_run(workdir)
        else:
            if _WORKDIR.value:
                runtime.check_workdir(_WORKDIR.value)
            metrics, out = _evaluate_directory(checkpoint, _WORKDIR.value)
    except config_utils.ConfigError as e:
        _fail(str(e))
    if out is not None:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump(metrics, f)
    print(json.dumps(metrics))


if __name__ == "__main__":
    app.run(main, flags_parser=_parse)
