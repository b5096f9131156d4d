"""Tests for replax/tools/study_plan.py: every run's config from the flags, the rate grids
(the grids' selection: test_lr_selection.py; the study end to end:
tests/scripts/test_compare.py)."""

import os

import pytest

from replax.core import config_utils
from replax.tools import experiments as ex
from replax.tools import study_plan

ROOT = ex.ROOT


def test_config_flags_as_train_py_takes_them(tmp_path):
    """--config=FILE[:ARG] and --config.KEY=VALUE, as scripts/train.py reads them; the
    older --override=[VARIANT:]KEY=VALUE still applies, after them."""
    argv = [
        f"--workdir={tmp_path}",
        f"--config={os.path.join(ROOT, 'configs/arith.py')}",
        "--config.replay.capacity=128",
        "--config.optimizer.learning_rate=3e-4",
        "--override=replay:train.batch_size=32",
    ]
    plan = study_plan.Plan(study_plan.parse_args(argv))
    on, rp = (plan.config(v, 1e-4, 0) for v in ("onpolicy", "replay"))
    assert on.replay.capacity == rp.replay.capacity == 128
    assert (on.train.batch_size, rp.train.batch_size) == (64, 32)
    assert plan.lr_grid["replay"] == [1e-4, 3e-4, 9e-4]  # around the overridden rate
    assert ex.variant_arg("qwen3-0.6b,pod", "onpolicy") == "qwen3-0.6b,pod,onpolicy"
    assert ex.variant_arg(None, "replay") == "replay"


def test_lr_grid_flag():
    assert study_plan.parse_lr_grid("onpolicy:1e-4,3e-4; replay:3e-5") == {
        "onpolicy": [1e-4, 3e-4],
        "replay": [3e-5],
    }
    assert study_plan.parse_lr_grid("") == {}
    with pytest.raises(config_utils.ConfigError, match="expected VARIANT:LR,LR"):
        study_plan.parse_lr_grid("1e-4")


@pytest.mark.parametrize("variants", ["onpolicy,replay", "replay", "auto"])
def test_every_design_evaluates_at_the_same_rollout_counts(tmp_path, variants):
    """On-policy generates 64 a step, replay and auto 16: with 16 evaluations of 12,800
    rollouts (800 apart) each evaluates every 768 (on-policy's nearest whole steps), also
    in a study of some of them (two processes, each running its own variants)."""
    argv = [
        f"--workdir={tmp_path}",
        f"--config={os.path.join(ROOT, 'configs/arith.py')}",
        f"--variants={variants}",
        "--budget_rollouts=12800",
        "--num_evals=16",
    ]
    if variants == "auto":
        argv += ["--define=auto=replay", "--override=auto:replay.mode=auto"]
    plan = study_plan.Plan(study_plan.parse_args(argv))
    for v in plan.variants:
        config = plan.config(v, 1e-4, 0)
        assert config.eval.every * ex.rollouts_per_step(config) == 768, v
