r"""A long run of a micro config that watches host memory and compilation.

  python scripts/soak.py --workdir=/tmp/soak --steps=1000 [--config.KEY=VALUE ...]

Trains configs/arith.py with a tiny policy for --steps steps in this process while a
thread samples the process's resident memory every second and a JAX monitoring listener
records every XLA compilation. Prints one JSON object: the resident memory after the
first evaluation and at the end (MiB), the growth between them, the replay store's own
size, the compilations after the first --warmup_steps steps (by then every program has
run once: there should be none), and skipped_steps from metrics.jsonl.
"""

import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file("config", os.path.join(_ROOT, "configs", "arith.py"))
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (a new one).", required=True)
_STEPS = flags.DEFINE_integer("steps", 1000, "RL steps.")
_WARMUP = flags.DEFINE_integer(
    "warmup_steps",
    250,
    "Steps allowed to compile: by then every program (the step, the "
    "evaluation, the checkpoint's finiteness check) has run once.",
)
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
MICRO = {
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.num_kv_heads": 1,
    "model.head_dim": 16,
    "model.mlp_dim": 64,
    "model.init": "random",
    "task.num_train": 512,
    "task.num_test": 64,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
    "train.batch_size": 16,
    "replay.capacity": 256,
    "eval.num_prompts": 64,
    "eval.pass_k": 2,
    "eval.pass_k_prompts": 8,
    "eval.every": 100,
    "checkpoint_every": 250,
}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv):
    del argv
    logging.set_verbosity(logging.ERROR)
    import jax

    from replax.run import metrics, trainer

    config = _CONFIG.value
    for key, value in MICRO.items():
        *parents, name = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[name] = value
    config.total_steps = _STEPS.value
    compiles, samples, done = [], [], threading.Event()
    metrics_file = os.path.join(_WORKDIR.value, "metrics.jsonl")

    def steps_done() -> int:
        """Steps logged so far (log_every is 1): when an event happened."""
        if not os.path.exists(metrics_file):
            return 0
        with open(metrics_file) as f:
            return sum(1 for _ in f)

    def on_event(event, duration, **_):
        if event == COMPILE_EVENT:
            compiles.append(steps_done())

    jax.monitoring.register_event_duration_secs_listener(on_event)

    def sample():
        while not done.wait(1.0):
            samples.append((steps_done(), _rss_mib()))

    threading.Thread(target=sample, daemon=True).start()
    start = time.time()
    trainer.train(config, _WORKDIR.value, log=lambda _: None)
    done.set()
    records = metrics.read_metrics(_WORKDIR.value)
    first_eval = next(r["step"] for r in records if "eval_accuracy" in r)
    after_eval = [rss for step, rss in samples if step > first_eval]
    n, seq = config.replay.capacity, config.rollout.max_prompt_len + config.rollout.max_new_tokens
    store_mib = n * (seq * (4 + 1 + 4 + 4) + 3 * 4 + 4 * 4) / 2**20
    print(
        json.dumps(
            {
                "steps": records[-1]["step"],
                "rss_mib_after_first_eval": round(after_eval[0], 1),
                "rss_mib_end": round(after_eval[-1], 1),
                "rss_growth_mib": round(after_eval[-1] - after_eval[0], 1),
                "rss_growth_mib_max": round(max(after_eval) - after_eval[0], 1),
                "replay_store_mib": round(store_mib, 2),
                "compilations_total": len(compiles),
                "compilations_after_warmup": sum(step > _WARMUP.value for step in compiles),
                "skipped_steps": records[-1]["skipped_steps"],
                "wall_s": round(time.time() - start, 1),
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    from replax.core.config_utils import parse_flags_or_exit

    app.run(main, flags_parser=parse_flags_or_exit)
