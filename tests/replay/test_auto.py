"""Tests for replax/replay/auto.py: the estimators and the controller (the designs it
plans with: tests/replay/test_designs.py)."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from micro_run import MICRO_OVERRIDES

from replax.replay import auto as auto_replay
from replax.replay.auto import AutoReplayController
from replax.replay.designs import DESIGNS, between_ends, design_objective, long_run_objective
from replax.rl import rollouts, scoring

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---------------------------------------------------------------- the controller


def test_controller_plans_with_the_chosen_design():
    def plan(design):
        controller = AutoReplayController(
            rollouts_per_generation=16, batch_size=32, capacity=4096, mu_override=6.0, design=design
        )
        controller.alpha, controller.rho = -0.3, 0.005
        controller._plan()
        return controller.metrics()

    paper, long_run = plan("paper"), plan("long_run")
    assert paper["auto_y_opt"] == pytest.approx(math.sqrt(6.0 / 0.005))
    assert long_run["auto_y_opt"] == pytest.approx(math.sqrt(6.0 / 1.005))
    # y = period x B / R: the period rounds up from 1 at most to the cap (8 here).
    assert long_run["auto_y"] == pytest.approx(2.0 * max(1.0, math.sqrt(6.0 / 1.005) / 2.0))
    assert paper["auto_y"] == pytest.approx(16.0)  # 8 generations apart, the cap
    # Negative alpha: the horizon is the ring's whole lifetime, N / R generations.
    assert long_run["auto_x"] == pytest.approx(4096 / 16 * long_run["auto_period"])
    with pytest.raises(ValueError, match="design"):
        AutoReplayController(rollouts_per_generation=16, batch_size=32, capacity=64, design="x")


def test_controller_estimates_the_kept_fraction_and_plans_with_it():
    controller = AutoReplayController(
        rollouts_per_generation=16,
        batch_size=32,
        capacity=4096,
        mu_override=6.0,
        design="long_run",
        ema=0.0,
    )
    controller.alpha, controller.rho = -0.3, 0.005
    controller._plan()
    assert controller.kept == 1.0
    full = controller.metrics()
    for step in range(10):  # 6 of 16 kept on the generating steps (every other one)
        controller.observe(kept=6 if step % 2 == 0 else None)
    m = controller.metrics()
    assert m["auto_kept"] == pytest.approx(6 / 16)
    assert m["auto_y_opt"] == pytest.approx(math.sqrt(6.0 / (16 / 6 + 0.005)))
    assert m["auto_y_opt"] < full["auto_y_opt"]
    # The ring holds N / (f R) generations, period steps apart.
    assert m["auto_x"] == pytest.approx(4096 / 6 * m["auto_period"])
    # No rollout kept in a window: clipped to the range, not zero.
    for _ in range(10):
        controller.observe(kept=0)
    assert controller.kept == controller.kept_range[0]


# ---------------------------------------------------------------- estimators


def synthetic_stats(rng, *, alpha, signal, dim=400, half=32, age_fresh=0.0, age_stale=7.0):
    """Half-batch statistics of g + noise, per-rollout noise variance (a + 1)^(2 alpha)."""
    g = np.zeros(dim)
    g[0] = math.sqrt(signal)
    halves = []
    for age in (age_fresh, age_stale):
        variance = (age + 1) ** (2 * alpha)
        halves.append(g + rng.normal(0, math.sqrt(variance / (half * dim)), dim))
    grad_fresh, grad_stale = halves
    cross = grad_fresh @ grad_stale
    return {
        "halves_cross": cross,
        "halves_noise_fresh": grad_fresh @ grad_fresh - cross,
        "halves_noise_stale": grad_stale @ grad_stale - cross,
        "halves_age_fresh": age_fresh,
        "halves_age_stale": age_stale,
    }


def test_estimators_are_exact_on_expected_statistics():
    b, alpha = 32, 0.3
    var_fresh, var_stale = 1.0, 8 ** (2 * alpha)
    u, v = auto_replay.alpha_point(var_fresh / b, var_stale / b, 0.0, 7.0)
    assert v / u == pytest.approx(2 * alpha)
    rho = auto_replay.rho_estimate(
        0.05, var_fresh / b, var_stale / b, half_size=b, rollouts_per_generation=32
    )
    assert rho == pytest.approx(32 * 0.05 / ((var_fresh + var_stale) / 2))
    assert auto_replay.alpha_point(1.0, 2.0, 3.0, 3.0) is None  # equal ages: no information
    assert auto_replay.alpha_point(-1.0, 2.0, 0.0, 3.0) is None


@pytest.mark.parametrize("alpha", [0.1, 0.35])
def test_controller_recovers_alpha_and_rho_from_synthetic_statistics(alpha):
    rng = np.random.default_rng(0)
    signal, r = 0.02, 32
    controller = AutoReplayController(
        rollouts_per_generation=r, batch_size=64, capacity=256, update_every=10, ema=0.9
    )
    for _ in range(600):
        controller.observe(stats=synthetic_stats(rng, alpha=alpha, signal=signal))
        # Steps whose halves have one age (between generations) carry no alpha information
        # and must not dilute it (their noise is 1 per rollout, their signal set for one rho).
        controller.observe(
            stats=synthetic_stats(
                rng,
                alpha=0.0,
                signal=signal / ((1 + 8 ** (2 * alpha)) / 2),
                age_fresh=3,
                age_stale=3,
            )
        )
    true_rho = r * signal / ((1 + 8 ** (2 * alpha)) / 2)
    assert controller.alpha == pytest.approx(alpha, abs=0.03)
    assert controller.rho == pytest.approx(true_rho, rel=0.15)
    m = controller.metrics()
    assert m["auto_alpha"] == controller.alpha and m["auto_rho"] == controller.rho


def planned(mu=None, alpha=0.25, steps=200, gen_s=None, train_s=None):
    rng = np.random.default_rng(1)
    controller = AutoReplayController(
        rollouts_per_generation=32, batch_size=64, capacity=1024, mu_override=mu
    )
    for _ in range(steps):
        controller.observe(
            gen_s=gen_s, train_s=train_s, stats=synthetic_stats(rng, alpha=alpha, signal=0.005)
        )
    return controller


def test_controller_plan_responds_in_the_right_direction():
    cheap, costly = planned(mu=2.0).metrics(), planned(mu=30.0).metrics()
    assert costly["auto_y_opt"] > cheap["auto_y_opt"] and costly["auto_x_opt"] > cheap["auto_x_opt"]
    assert costly["auto_y"] > cheap["auto_y"] and costly["auto_x"] > cheap["auto_x"]
    slow, fast = planned(mu=30.0, alpha=0.1), planned(mu=30.0, alpha=0.4)
    assert fast.metrics()["auto_x_opt"] < slow.metrics()["auto_x_opt"]
    assert fast.max_age() < slow.max_age()


def test_mu_is_measured_from_timings_unless_overridden():
    # 32 rollouts generated in 0.64 s, 64 trained on in 0.32 s: mu = 0.02 / 0.005 = 4.
    measured = planned(gen_s=0.64, train_s=0.32, steps=20)
    assert measured.mu == pytest.approx(4.0)
    assert planned(mu=6.0, gen_s=0.64, train_s=0.32, steps=20).mu == 6.0
    # The first (compiling) observation of each timer is skipped.
    controller = AutoReplayController(rollouts_per_generation=32, batch_size=64, capacity=256)
    controller.observe(gen_s=100.0, train_s=100.0)
    controller.observe(gen_s=0.64, train_s=0.32)
    assert controller.mu == pytest.approx(4.0)


def test_generation_credit_realises_the_period_and_the_horizon_bounds():
    controller = AutoReplayController(rollouts_per_generation=32, batch_size=64, capacity=256)
    controller.period, controller.horizon = 2.5, 7.0
    decisions = [controller.should_generate(step) for step in range(20)]
    assert decisions[0] and sum(decisions) == 8  # one step in 2.5
    assert controller.should_generate(19) == decisions[-1]  # asking twice agrees
    assert controller.max_age() == 6
    # The horizon stays within [max(period + 1, 2), period * N / R] steps.
    controller = planned(mu=1000.0, alpha=0.02)
    assert controller.horizon <= controller.period * 1024 / 32
    controller = planned(mu=0.05, alpha=0.45)
    assert controller.period == 1.0 and controller.horizon == 2.0 and controller.max_age() == 1


def test_the_horizon_is_the_whole_ring_until_staleness_is_measured():
    """The prior alpha (0.25 > 0) plans the shortest horizon; until a window with fresh
    and stale halves of different ages gives a regression point, the controller draws from
    the whole ring as the config's fixed design does, then shortens it as measured."""
    controller = AutoReplayController(
        rollouts_per_generation=32,
        batch_size=64,
        capacity=1024,
        mu_override=6.0,
        update_every=5,
        design="long_run",
    )
    ring = 1024 // 32
    assert controller.metrics()["auto_x_opt"] == 1.0  # what the prior would plan
    # A ring's generation lives `period` steps: the whole ring is period N / R steps old.
    assert controller.horizon == pytest.approx(controller.period * ring)
    rng = np.random.default_rng(0)
    one_age = dict(alpha=0.0, signal=0.005, age_fresh=3, age_stale=3)
    for _ in range(10):  # halves of one age: no information on alpha
        controller.observe(stats=synthetic_stats(rng, **one_age))
    assert controller.reg_uu == 0 and controller.horizon == pytest.approx(controller.period * ring)
    for _ in range(5):
        controller.observe(stats=synthetic_stats(rng, alpha=0.4, signal=0.005))
    # The shortest horizon: one period (y* = 2.34, a generation every 1.17 steps) + 1.
    assert controller.alpha > 0 and controller.horizon == pytest.approx(controller.period + 1)
    assert controller.max_age() == 2
    restored = AutoReplayController.from_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert restored.max_age() == 2


def at_mu(mu, min_y=1.0, rollouts=16, batch=64, onpolicy_batch=None):
    """A long-run controller planning for mu with rho 0.01, alpha < 0 and kept 0.65 (the
    embedded task's estimates), B / R = 4, y at most 8."""
    controller = AutoReplayController(
        rollouts_per_generation=rollouts,
        batch_size=batch,
        capacity=4096,
        mu_override=mu,
        design="long_run",
        max_period=2,
        min_y=min_y,
        onpolicy_batch=onpolicy_batch,
    )
    controller.alpha, controller.rho, controller.kept = -0.3, 0.01, 0.65
    controller._plan()
    return controller


def decisions(controller, steps):
    """(generate, train, max_age) of each step, asked in the loop's order."""
    out = []
    for step in range(steps):
        generate, train = controller.should_generate(step), controller.should_train(step)
        out.append((generate, train, controller.max_age()))
    return out


def test_low_mu_plans_on_policy_and_high_mu_replays():
    # y* = sqrt(mu / (1 / 0.65 + 0.01)) < 1 at mu <= 1: on-policy, y = 1. Every step
    # generates R = 16 and every fourth trains on the B = 64 waiting, 0-3 steps old.
    for mu in (0.5, 1.0):
        controller = at_mu(mu)
        assert controller.draw_once and controller.metrics()["auto_y"] == 1.0
        assert decisions(controller, 8) == [(True, s % 4 == 3, 3 if s % 4 == 3 else s % 4)
                                            for s in range(8)]  # fmt: skip
        assert controller.metrics()["auto_onpolicy"] == 1
    # Between 1 and B / R = 4 only the ends run: y* <= sqrt(1 x 4) = 2 is on-policy (mu = 6:
    # y* = 1.97), above it B / R, every step generating and training (mu = 8: y* = 2.27).
    controller = at_mu(6.0)
    assert controller.y_opt == pytest.approx(math.sqrt(6.0 / (1 / 0.65 + 0.01)))
    assert controller.draw_once and controller.metrics()["auto_y"] == 1.0
    controller = at_mu(8.0)
    assert controller.y_opt == pytest.approx(2.273, abs=1e-3)
    assert not controller.draw_once and controller.metrics()["auto_y"] == 4.0
    assert all(g and t for g, t, _ in decisions(controller, 40))
    # mu = 40: y* = 5.08 above B / R = 4: every step trains, one in 1.27 generates.
    made = decisions(at_mu(40.0), 400)
    assert all(t for _, t, _ in made)
    assert sum(g for g, _, _ in made) == pytest.approx(400 / (math.sqrt(40 / 1.5485) / 4), abs=1)
    # Without the floor of 1 (replay.auto_min_y = 0), y stays at B / R = 4 at low mu.
    controller = at_mu(0.5, min_y=None)
    assert controller.metrics()["auto_y"] == 4.0 and not controller.draw_once
    assert all(g and t for g, t, _ in decisions(controller, 8))
    # A floor between 1 and B / R runs as B / R; one above it is kept.
    assert at_mu(0.5, min_y=2.0).metrics()["auto_y"] == 4.0
    assert at_mu(0.5, min_y=6.0).metrics()["auto_y"] == 6.0
    with pytest.raises(ValueError, match="min_y"):
        at_mu(0.5, min_y=0.5)


@pytest.mark.parametrize("design", ["long_run", "paper"])
def test_between_the_ends_auto_runs_the_end_its_design_rates_cheaper(design):
    """For y* between 1 and B / R the controller runs the end with the lower J at the
    planned horizon, checked against the objective itself over a range of mu."""
    objective = {"long_run": long_run_objective, "paper": design_objective}[design]
    seen = set()
    for mu in np.geomspace(0.3, 30, 41):
        controller = AutoReplayController(
            rollouts_per_generation=16, batch_size=64, capacity=4096, mu_override=float(mu),
            design=design, max_period=2, min_y=1.0,
        )  # fmt: skip
        controller.alpha, controller.rho, controller.kept = 0.2, 0.05, 0.65
        controller.reg_uu = 1.0  # staleness measured: the horizon is the design's x*
        controller._plan()
        x, y_opt = DESIGNS[design](float(mu), 0.05, 0.2, 0.65)
        if not 1 < y_opt < 4:
            continue
        cost = {y: objective(x, y, mu=float(mu), rho=0.05, alpha=0.2, kept=0.65) for y in (1, 4)}
        assert controller.y == min(cost, key=cost.get), (mu, y_opt, cost)
        seen.add(controller.y)
    assert seen == {1.0, 4.0}  # the range crosses the switch
    assert between_ends(0.5, 1, 4) == 0.5 and between_ends(5.0, 1, 4) == 5.0


def test_the_on_policy_batch_sets_when_on_policy_steps_train_and_what_they_cost():
    """With an on-policy batch of 2 B = 128, every eighth step trains on the 8 R waiting
    (0-7 steps old); its seconds count per rollout of that batch, and its halves' noise
    (which falls as 1 / the half's size) is pooled as at B's halves."""
    controller = at_mu(0.5, onpolicy_batch=128)
    assert controller.onpolicy_batch == 128 and controller.draw_once
    assert decisions(controller, 16) == [(True, s % 8 == 7, 7 if s % 8 == 7 else s % 8)
                                         for s in range(16)]  # fmt: skip
    plain = at_mu(0.5)
    stats = dict(zip(auto_replay.STAT_KEYS, (0.01, 0.02, 0.03, 0.0, 3.0), strict=True))
    for c, steps in ((controller, 8), (plain, 4)):
        for step in range(16, 16 + steps):
            trains = c.should_generate(step) and c.should_train(step)
            c.observe(gen_s=1.0, train_s=2.0 if trains else None, stats=stats if trains else None)
    assert controller.train_seen == plain.train_seen == 1
    controller.warmup = plain.warmup = 0
    controller.observe(train_s=2.0, stats=stats)  # as if the last step had trained
    plain.observe(train_s=2.0, stats=stats)
    assert controller.train_per_rollout == pytest.approx(2.0 / 128)
    assert plain.train_per_rollout == pytest.approx(2.0 / 64)
    assert controller.window["halves_noise_fresh"] == pytest.approx(2 * 2 * 0.02)
    assert plain.window["halves_noise_fresh"] == pytest.approx(2 * 0.02)
    assert controller.window["halves_cross"] == plain.window["halves_cross"] == 2 * 0.01
    with pytest.raises(ValueError, match="onpolicy_batch"):
        at_mu(0.5, onpolicy_batch=8192)  # more than the ring holds


@pytest.mark.parametrize("onpolicy_batch", [None, 16])
def test_the_on_policy_path_trains_each_rollout_once_zero_advantage_groups_included(
    onpolicy_batch,
):
    """At low mu, the controller and the compiled add-and-sample together: every rollout
    generated (groups of equal rewards too) is in exactly one trained batch, of B or of
    the on-policy batch."""
    from replax.replay.store import ReplayConfig, make_replay_buffer

    r, g, b, prompt_len, new_tokens = 4, 2, 8, 2, 2
    controller = at_mu(0.5, rollouts=r, batch=b, onpolicy_batch=onpolicy_batch)
    b = controller.onpolicy_batch
    every = b // r
    buffer = make_replay_buffer(ReplayConfig(capacity=64, strategy="positive_bias"))
    add_and_sample = jax.jit(
        rollouts.make_add_and_sample(
            buffer, group_size=g, batch_size=b, normalize_std=True, drop_zero_advantage=True
        )
    )
    state = buffer.init(rollouts.rollout_spec(prompt_len + new_tokens))
    completion = {
        "tokens": jnp.ones((r, new_tokens), jnp.int32),
        "mask": jnp.ones((r, new_tokens), bool),
        "logprobs": jnp.zeros((r, new_tokens), jnp.float32),
    }
    trained = []
    for step in range(12):
        generate, train = controller.should_generate(step), controller.should_train(step)
        assert generate and train == (step % every == every - 1)
        ids = 100 + r * step + jnp.arange(r, dtype=jnp.int32)  # rollout ids, in the prompt
        rewards = jnp.array([1.0, 1.0, 0.0, 1.0])  # the first group has zero advantage
        state, batch, _ = add_and_sample(
            state,
            jnp.stack([ids, ids], axis=1),
            jnp.ones((r, prompt_len), bool),
            completion,
            rewards,
            jnp.int32(step),
            jax.random.key(step),
            jnp.bool_(True),
            jnp.int32(controller.max_age()),
            once=jnp.bool_(controller.draw_once),
            train=jnp.bool_(train),
        )
        if train:
            trained += np.asarray(batch["tokens"][:, 0]).tolist()
            assert (np.asarray(batch["times_sampled"]) == 0).all()
    assert sorted(trained) == list(range(100, 100 + 12 * r))
    assert int(state.times_sampled.sum()) == 12 * r  # no draw counted twice, none uncounted


def test_state_round_trip_through_json():
    controller = planned(mu=None, gen_s=0.5, train_s=0.2, steps=37)
    for step in range(5):
        controller.should_generate(step)
    restored = AutoReplayController.from_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert restored.metrics() == controller.metrics()
    assert restored.state_dict() == controller.state_dict()
    rng = np.random.default_rng(3)
    for step in range(5, 40):
        stats = synthetic_stats(rng, alpha=0.2, signal=0.01)
        assert restored.should_generate(step) == controller.should_generate(step)
        restored.observe(gen_s=0.4, train_s=0.2, stats=stats, kept=step % 32)
        controller.observe(gen_s=0.4, train_s=0.2, stats=stats, kept=step % 32)
    assert restored.metrics() == controller.metrics()
    assert controller.kept < 1.0
    # A state saved before the kept fraction was estimated restores with every rollout kept.
    old = {
        k: v
        for k, v in controller.state_dict().items()
        if k not in ("kept", "kept_init", "kept_range", "window_kept", "window_generated")
    }
    assert AutoReplayController.from_state_dict(old).kept == 1.0
    # A state saved with a training fraction's credit restores as one without it.
    older = {**controller.state_dict(), "train_credit": 0.4}
    plain = AutoReplayController.from_state_dict(controller.state_dict())
    assert AutoReplayController.from_state_dict(older).state_dict() == plain.state_dict()


# ------------------------------------------------------------ the trainer in auto mode

AUTO_MICRO = {
    **MICRO_OVERRIDES,
    "replay.capacity": 64,
    "eval.every": 4,
    "checkpoint_every": 4,
    "total_steps": 8,
    "replay.mode": "auto",
    "replay.auto_every": 3,
    # Plan for an accelerator (mu = 20: generate about every 4th step); the micro policy
    # solves nothing, so an entropy bonus gives the gradient statistics something to see.
    "replay.mu": 20.0,
    "replay.drop_zero_advantage": False,
    "loss.entropy_coef": 0.01,
}


def train_micro(tmp_path, name, variant, overrides):
    """Trains configs/arith.py's `variant` with AUTO_MICRO and `overrides` in tmp_path/name
    (the data shared under tmp_path); returns its metrics.jsonl records."""
    from replax.run import metrics as metrics_lib
    from replax.run import trainer
    from replax.tools import experiments

    c = experiments.load_config(os.path.join(ROOT, "configs/arith.py"), variant)
    for key, value in {**AUTO_MICRO, **overrides}.items():
        experiments.set_value(c, key, value)
    c.task.data_dir = str(tmp_path / "data")
    os.makedirs(c.task.data_dir, exist_ok=True)
    trainer.train(c, str(tmp_path / name), log=lambda _: None)
    return metrics_lib.read_metrics(str(tmp_path / name))


def test_trainer_in_auto_mode_generates_periodically_and_resumes_exactly(tmp_path):
    from replax.run import metrics as metrics_lib
    from replax.run import trainer
    from replax.tools import experiments

    def config(total_steps):
        c = experiments.load_config(os.path.join(ROOT, "configs/arith.py"), "replay")
        for key, value in {**AUTO_MICRO, "total_steps": total_steps}.items():
            experiments.set_value(c, key, value)
        c.task.data_dir = str(tmp_path / "data")
        os.makedirs(c.task.data_dir, exist_ok=True)
        return c

    timing = metrics_lib.TIMING_KEYS
    strip = lambda records: [{k: v for k, v in r.items() if k not in timing} for r in records]
    with experiments.compilation_cache(str(tmp_path / "jax_cache")):
        trainer.train(config(8), str(tmp_path / "full"), log=lambda _: None)
        trainer.train(config(4), str(tmp_path / "resumed"), log=lambda _: None)
        trainer.train(config(8), str(tmp_path / "resumed"), log=lambda _: None)
    records = metrics_lib.read_metrics(str(tmp_path / "full"))
    assert [r["step"] for r in records] == list(range(1, 9))
    generated = [r["auto_generate"] for r in records]
    assert generated[0] == 1 and 2 <= sum(generated) < 8
    assert records[-1]["gen_rollouts"] == 8 * sum(generated)
    assert records[-1]["train_rollouts"] == 16 * 8
    # A step that generated nothing has no reward, not the last generating step's.
    assert all((r["reward_mean"] is None) == (not r["auto_generate"]) for r in records)
    # Nor completion statistics; the rate and the step's seconds are on every step.
    for r in records:
        for key in (*scoring.FRESH_KEYS, "gen_tokens_per_s", "rollout_entropy"):
            assert (r[key] is None) == (not r["auto_generate"]), (key, r["step"])
        assert r["learning_rate"] > 0 and r["step_s"] > 0
    keys = ("auto_mu", "auto_alpha", "auto_rho", "auto_kept", "auto_y", "auto_x")
    for key in (*keys, *auto_replay.STAT_KEYS):
        assert key in records[-1], key
    assert records[-1]["auto_mu"] == 20.0
    assert all(r["replay_age_max"] <= r["auto_max_age"] for r in records)
    assert strip(metrics_lib.read_metrics(str(tmp_path / "resumed"))) == strip(records)


def test_rollout_budget_stops_the_run_and_counts_as_finished(tmp_path):
    from replax.run import metrics as metrics_lib
    from replax.run import trainer
    from replax.tools import analysis, experiments

    c = experiments.load_config(os.path.join(ROOT, "configs/arith.py"), "replay")
    for key, value in AUTO_MICRO.items():
        experiments.set_value(c, key, value)
    c.task.data_dir = str(tmp_path / "data")
    os.makedirs(c.task.data_dir, exist_ok=True)
    # Auto mode in a comparison: the budget is in generated rollouts, the steps are room.
    experiments.finalize_config(
        c, budget_rollouts=16, num_evals=2, seed=0, learning_rate=1e-4, shared_dir=str(tmp_path)
    )
    r = experiments.rollouts_per_step(c)
    assert c.total_rollouts == 16 and c.eval.every == 1
    assert c.total_steps == 16 // r * int(c.replay.auto_max_y * r / c.train.batch_size)
    workdir = str(tmp_path / "run")
    with experiments.compilation_cache(str(tmp_path / "jax_cache")):
        summary = trainer.train(c, workdir, log=lambda _: None)
        records = metrics_lib.read_metrics(workdir)
        assert records[-1]["gen_rollouts"] == 16 and records[-2]["gen_rollouts"] < 16
        assert len(records) < c.total_steps and summary["steps"] == len(records)
        assert "eval_accuracy" in records[-1]
        assert analysis.is_finished(workdir, c.total_steps, c.total_rollouts)
        assert not analysis.is_finished(workdir, c.total_steps)
        # Run again: the budget is spent, nothing more is generated or logged.
        trainer.train(c, workdir, log=lambda _: None)
    assert metrics_lib.read_metrics(workdir) == records


@pytest.mark.parametrize("onpolicy_batches", [1, 2])
def test_trainer_at_low_mu_runs_on_policy(tmp_path, onpolicy_batches):
    """replay.mu = 0.5 (y* < 1): every step generates R = 8 and trains once the on-policy
    batch (B = 16, or 2 B with replay.auto_onpolicy_batches = 2) waits, each rollout drawn for the
    first time: trained = generated after each update, one update a batch."""
    from replax.run import metrics as metrics_lib
    from replax.run import trainer
    from replax.tools import experiments

    c = experiments.load_config(os.path.join(ROOT, "configs/arith.py"), "replay")
    low_mu = {
        **AUTO_MICRO,
        "replay.mu": 0.5,
        "replay.drop_zero_advantage": True,
        "replay.auto_onpolicy_batches": onpolicy_batches,
    }
    for key, value in low_mu.items():
        experiments.set_value(c, key, value)
    c.task.data_dir = str(tmp_path / "data")
    os.makedirs(c.task.data_dir, exist_ok=True)
    with experiments.compilation_cache(str(tmp_path / "jax_cache")):
        trainer.train(c, str(tmp_path / "run"), log=lambda _: None)
    records = metrics_lib.read_metrics(str(tmp_path / "run"))
    every = onpolicy_batches * 16 // 8
    assert [r["auto_train"] for r in records] == [int(s % every == every - 1) for s in range(8)]
    assert all(r["auto_generate"] == 1 and r["auto_onpolicy"] == 1 for r in records)
    for r in records:
        if r["auto_train"]:
            assert r["train_rollouts"] == r["gen_rollouts"] == 8 * r["step"]
            assert r["updates"] == r["step"] // every
            assert r["replay_reuse_mean"] == 0.0 and r["replay_age_max"] == every - 1
        else:
            assert r["loss"] is None and r["train_rollouts"] == 8 * every * (r["step"] // every)


def test_at_the_floor_and_before_estimates_auto_is_the_fixed_design(tmp_path):
    """replay.auto_min_y = 0 at low mu keeps y at B / R, and until its first estimates
    the controller draws from the whole ring: the run is the fixed design's, step for step
    (the train step's half-batch statistics added, the controller's own keys aside)."""
    from replax.run import metrics as metrics_lib
    from replax.tools import experiments

    run = lambda name, **overrides: train_micro(tmp_path, name, "replay", overrides)

    with experiments.compilation_cache(str(tmp_path / "jax_cache")):
        short = {"total_steps": 5, "eval.every": 5, "checkpoint_every": 5}
        low_mu = {"replay.mu": 0.5, "replay.auto_min_y": 0.0, "replay.auto_every": 6}
        auto = run("auto", **short, **low_mu)
        fixed = run("fixed", **short, **{"replay.mode": "fixed"})
    assert len(auto) == 5 and auto[-1]["auto_alpha"] == 0.25  # planned from the priors
    assert all(r["auto_y"] == 2.0 and r["auto_generate"] and r["auto_train"] for r in auto)
    ages = [r["replay_age_max"] for r in fixed]
    assert max(ages) >= 2  # a limit of two generations would have parted the runs
    skip = (*metrics_lib.TIMING_KEYS, *auto_replay.STAT_KEYS)
    for a, f in zip(auto, fixed, strict=True):
        assert set(f) <= set(a)
        for key, value in f.items():
            if key in skip or key.startswith("auto_"):
                continue
            if isinstance(value, float):
                assert a[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (key, a["step"])
            else:
                assert a[key] == value, (key, a["step"])


def test_at_low_mu_auto_is_the_on_policy_run(tmp_path):
    """Auto at mu 0.5 (R = 8 a step, an update on B = 16 every second step) against the
    on-policy design (R = B = N = 16 a step, drawn once each), both with on-policy's loss
    and storage settings: every rollout keyed by its place in the run's stream, the prompt
    stream in one order and each once-drawn batch in the order it was added make the two
    the same run, update for update and evaluation for evaluation: auto's on-policy step
    runs on-policy's own program on the same batch. Only the behaviour log-probs differ,
    by float32 rounding (the sampler decodes 8 rows a step against 16, a matmul of another
    shape), and with them the importance ratios and the loss, by about 1e-7."""
    from replax.tools import experiments

    low_mu = {"replay.mu": 0.5, "loss.cov_cut_frac": 0.0}
    run = lambda variant, **overrides: train_micro(
        tmp_path, variant, variant, {**low_mu, **overrides}
    )

    with experiments.compilation_cache(str(tmp_path / "jax_cache")):
        auto = run("replay", **{"replay.auto_onpolicy_batches": 1})
        onpolicy = run(
            "onpolicy",
            **{
                "replay.mode": "fixed",
                "rollout.prompts_per_step": 4,
                "replay.capacity": 16,
                "total_steps": 4,
                "eval.every": 2,
                "checkpoint_every": 2,
            },
        )
    trained = [r for r in auto if r["auto_train"]]
    assert [r["step"] for r in trained] == [2, 4, 6, 8] and len(onpolicy) == 4
    for a, o in zip(trained, onpolicy):
        for key in ("gen_tokens", "gen_rollouts", "train_rollouts", "updates", "eval_accuracy"):
            assert a.get(key) == o.get(key), (key, a["step"])
        for key in ("loss", "grad_norm", "is_ratio_max", "train_entropy", "eval_entropy"):
            np.testing.assert_allclose(a.get(key, np.nan), o.get(key, np.nan), rtol=2e-6)
    assert onpolicy[-1]["eval_accuracy"] is not None and onpolicy[0]["loss"] != 0.0
