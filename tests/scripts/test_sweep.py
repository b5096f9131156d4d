"""Tests for scripts/sweep.py: named refinements, then a 2 x 2 grid end to end."""

import importlib.util
import json
import os

import pytest

from replax.core import config_utils
from replax.tools import experiments as ex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("sweep", os.path.join(ROOT, "scripts/sweep.py"))
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)


def test_refinements_are_config_overrides():
    base = ex.load_config(os.path.join(ROOT, "configs/arith.py"), "replay")
    assert sweep.refinement_overrides("pb0.2", base) == {
        "replay.strategy": "positive_bias",
        "replay.delta": 0.2,
    }
    assert sweep.refinement_overrides("maxage4", base) == {"replay.max_age": 4}
    assert sweep.refinement_overrides("asymre", base) == {"loss.name": "asymre"}
    flipped = not base.replay.drop_zero_advantage
    assert sweep.refinement_overrides("zeroadv", base) == {"replay.drop_zero_advantage": flipped}
    with pytest.raises(config_utils.ConfigError):
        sweep.refinement_overrides("bogus", base)


def test_a_variant_in_config_is_the_variant():
    args = sweep.parse_args(["--workdir=/tmp/unused", "--config=configs/arith.py:onpolicy"])
    assert args.variant == "onpolicy"
    with pytest.raises(config_utils.ConfigError, match="give the variant once"):
        sweep.parse_args(
            ["--workdir=/tmp/unused", "--config=configs/arith.py:onpolicy", "--variant=replay"]
        )


MICRO = [
    "model.num_layers=1",
    "model.d_model=32",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.head_dim=16",
    "model.mlp_dim=64",
    "model.init=random",
    "task.num_train=64",
    "task.num_test=16",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "eval.num_prompts=16",
    "eval.pass_k=2",
    "eval.pass_k_prompts=8",
]


def test_sweep_end_to_end_on_a_micro_grid(tmp_path):
    # R = 8: x in {2, 4} (N = 16, 32), y in {1, 4} (B = 8, 32); x=2, y=4 has N < B.
    workdir = tmp_path / "sweep"
    argv = [
        f"--workdir={workdir}",
        "--x=2,4",
        "--y=1,4",
        "--refinements=pb0.5",
        "--refine_at=4,1",
        "--target=0.0",
        "--budget_rollouts=32",
        "--num_evals=2",
        # The --config.KEY=VALUE form of scripts/train.py (compare's test keeps --override).
        *[f"--config.{o}" for o in MICRO],
    ]
    assert sweep.main(argv) == 0
    payload = json.loads((workdir / "sweep.json").read_text())
    cells = {c["name"]: c for c in payload["cells"]}
    assert set(cells) == {"x2_y1", "x4_y1", "x2_y4", "x4_y4", "x4_y1_pb0.5"}
    assert not cells["x2_y4"]["feasible"] and "capacity" in cells["x2_y4"]["reason"]
    for name in ("x2_y1", "x4_y1", "x4_y4", "x4_y1_pb0.5"):
        cell = cells[name]
        assert cell["feasible"] and cell["cost_to_target"] == 0  # the target is 0
        assert cell["per_seed"]["final_accuracy"] and cell["run_dirs"] == [f"runs/{name}/seed0"]
    assert cells["x4_y4"]["overrides"] == {"train.batch_size": 32, "replay.capacity": 32}
    assert cells["x4_y1_pb0.5"]["overrides"]["replay.strategy"] == "positive_bias"
    assert payload["R"] == 8 and payload["best"] in cells
    assert (workdir / "sweep.png").stat().st_size > 10_000
    assert "| x2_y4 | 2 | 4 | 32 | 16 | n/a |" in (workdir / "sweep.md").read_text()
