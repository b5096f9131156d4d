r"""Evaluates a run's latest checkpoint on the held-out split.

  python scripts/evaluate.py --config=configs/arith.py --workdir=runs/arith \
      [--config.eval.num_prompts=2000] [--config.eval.pass_k=16]

Prints greedy pass@1, pass@k at temperature 1 and mean token entropy as one JSON object
(and writes it to WORKDIR/eval.json). The config must describe the run in WORKDIR.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_ROOT, "configs", "arith.py"), "The run's config file."
)
_WORKDIR = flags.DEFINE_string("workdir", os.path.join(_ROOT, "runs", "arith"), "The run's dir.")


def main(argv):
    del argv
    logging.set_verbosity(logging.ERROR)
    import jax

    from replax import checkpoint, config_utils, trainer

    config = _CONFIG.value
    try:
        trainer.validate(config)
    except config_utils.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    ckpt_dir = os.path.join(_WORKDIR.value, "checkpoints")
    if not os.path.isdir(ckpt_dir):
        print(f"error: --workdir={_WORKDIR.value} has no checkpoints/", file=sys.stderr)
        sys.exit(2)
    run = trainer.build(config, _WORKDIR.value, log=lambda *_: None)
    checkpointer = checkpoint.Checkpointer(ckpt_dir)
    step = checkpointer.latest_step()
    train_state = checkpointer.restore_train_state(step, train_state=run.train_state)
    checkpointer.close()
    metrics = {"step": step, **run.evaluator(train_state.params, jax.random.key(0))}
    with open(os.path.join(_WORKDIR.value, "eval.json"), "w") as f:
        json.dump(metrics, f)
    print(json.dumps(metrics))


if __name__ == "__main__":
    app.run(main)
