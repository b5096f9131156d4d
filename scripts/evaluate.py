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

    from replax import config_utils, configuration, experiments
    from replax import spec as spec_lib

    config = _CONFIG.value
    try:  # evaluate_checkpoint builds the run, and so checks it, before any compute
        file_config = experiments.file_config(flags.FLAGS["config"].config_filename)
        spec = spec_lib.parse(configuration.fit_task_section(config, file_config))
        metrics = experiments.evaluate_checkpoint(spec, _WORKDIR.value)
    except config_utils.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    with open(os.path.join(_WORKDIR.value, "eval.json"), "w") as f:
        json.dump(metrics, f)
    print(json.dumps(metrics))


if __name__ == "__main__":
    app.run(main)
