"""configs/arith.py with benchmarks/slow_reward.py's task: the embedded default's policy and
loop, scoring that waits task.reward_s seconds a batch (the `placement` benchmark).

  PYTHONPATH=scripts python scripts/train.py \
      --config=scripts/benchmarks/slow_reward_config.py --config.task.reward_s=0.5 ...
"""

import os

from replax.core.config_utils import load_module

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def get_config(arg=None):
    c = load_module(os.path.join(_ROOT, "configs", "arith.py")).get_config(arg)
    c.task.name = "benchmarks.slow_reward:make_task"
    c.task.reward_s = 0.0
    c.task.completions = c.rollout.prompts_per_step * c.rollout.group_size
    return c
