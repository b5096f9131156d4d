"""Config of a user's task (tests/user_task.py) on the embedded default's policy and loop:
the task section is the user's own, the rest comes from configs/arith.py.

  python scripts/train.py --config=tests/user_task_config.py --workdir=DIR
"""

import os
import sys

import ml_collections

from replax.core.config_utils import load_module

_HERE = os.path.dirname(os.path.abspath(__file__))
# `user_task:make_task` is imported by name: its directory must be on the path.
sys.path.insert(0, _HERE)


def _arith_config(arg):
    path = os.path.join(os.path.dirname(_HERE), "configs", "arith.py")
    return load_module(path).get_config(arg)


def get_config(arg=None):
    c = _arith_config(arg)
    c.task = ml_collections.ConfigDict()
    c.task.name = "user_task:make_task"
    c.task.length = 3
    c.task.data_seed = 0
    c.task.num_train = 256
    c.task.num_test = 64
    c.task.data_dir = ""
    c.task.long_prompts = "error"
    c.model.init = "random"
    return c
