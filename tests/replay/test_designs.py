"""Tests for replax/replay/designs.py: the closed-form designs against a numeric
minimiser, hand-checked values and limits, and the long-run variance of a FIFO buffer."""

import math

import numpy as np
import pytest

from replax.replay import designs as replay_design
from replax.replay.designs import numeric_optimal_design, optimal_design


@pytest.mark.parametrize(
    "mu, rho, alpha, kept",
    [
        (6.0, 0.1, 0.25, 1.0),
        (0.4, 0.1, 0.25, 1.0),
        (6.0, 1.0, 0.1, 1.0),
        (10.0, 0.01, 0.4, 1.0),
        (6.0, 0.0, 0.2, 1.0),
        (6.0, 0.1, 0.25, 0.6),
        (6.0, 0.02, 0.1, 0.3),
    ],
)
def test_closed_form_matches_the_numeric_minimiser(mu, rho, alpha, kept):
    x, y = optimal_design(mu, rho, alpha, kept)
    x_num, y_num = numeric_optimal_design(mu, rho, alpha, kept)
    np.testing.assert_allclose([x, y], [x_num, y_num], rtol=1e-5)
    # The first-order condition in y holds at the optimum: y^2 = mu / (rho + 1 / (f x)).
    np.testing.assert_allclose(y, math.sqrt(mu / (rho + 1 / (kept * x))), rtol=1e-9)
    # And it is a minimum: J is larger a little away in each direction.
    j = lambda x_, y_: replay_design.design_objective(
        x_, y_, mu=mu, rho=rho, alpha=alpha, kept=kept
    )
    for dx, dy in ((1.1, 1), (0.9, 1), (1, 1.1), (1, 0.9)):
        assert j(x * dx, y * dy) > j(x, y)


def test_dropped_rollouts_in_each_design():
    """Rollouts that never enter the buffer cost generation and add no buffer noise. In
    the paper's J the buffer term 1 / (f x) is all they change: the same y*, and a horizon
    1 / f times longer, so the buffer holds as many kept rollouts. In the long-run design
    the buffer term is 1 / f: each generated rollout is worth less, and y* is lower."""
    (x1, y1), (x2, y2) = optimal_design(6.0, 0.05, 0.2), optimal_design(6.0, 0.05, 0.2, 0.6)
    assert y2 == pytest.approx(y1) and x2 == pytest.approx(x1 / 0.6)
    x, y = optimal_design(6.0, 0.05, -0.3, 0.6)  # alpha <= 0: y* = sqrt(mu / rho) as before
    assert x == math.inf and y == pytest.approx(math.sqrt(6.0 / 0.05))
    ys = [replay_design.long_run_design(6.0, 0.05, 0.2, kept)[1] for kept in (1.0, 0.6, 0.3)]
    assert ys[0] > ys[1] > ys[2]
    assert ys[1] == pytest.approx(math.sqrt(6.0 / (1 / 0.6 + 0.05)))
    with pytest.raises(ValueError, match="kept"):
        replay_design.long_run_design(6.0, 0.05, 0.2, 0.0)


def test_hand_checked_design_and_limits():
    # mu = 6, rho = 0.5, alpha = 0.25: y = -0.25 + sqrt(0.0625 + 1.5)) / 0.5 = 2,
    # x = 4 / (0.5 * 8) = 1.
    np.testing.assert_allclose(optimal_design(6.0, 0.5, 0.25), (1.0, 2.0))
    # alpha = 0: no variance growth, keep everything; y = sqrt(mu / rho).
    x, y = optimal_design(4.0, 1.0, 0.0)
    assert x == math.inf and y == pytest.approx(2.0)
    with pytest.raises(ValueError):
        optimal_design(6.0, 0.1, 0.5)


def test_design_moves_the_right_way():
    x1, y1 = optimal_design(2.0, 0.1, 0.25)
    x2, y2 = optimal_design(20.0, 0.1, 0.25)
    assert x2 > x1 and y2 > y1  # costlier generation: more replay, longer horizon
    x3, _ = optimal_design(6.0, 0.1, 0.4)
    x4, _ = optimal_design(6.0, 0.1, 0.1)
    assert x3 < x4  # faster variance growth: shorter horizon


def test_no_variance_growth_or_a_decrease_keeps_everything():
    for alpha in (0.0, -0.3):
        x, y = optimal_design(6.0, 0.5, alpha)
        assert x == math.inf and y == pytest.approx(math.sqrt(6.0 / 0.5))
    with pytest.raises(ValueError):
        optimal_design(6.0, 0.0, -0.1)


@pytest.mark.parametrize(
    "mu, rho, alpha, kept",
    [(6.0, 0.005, -0.4, 1.0), (6.0, 0.5, 0.2, 1.0), (0.5, 2.0, 0.0, 1.0), (6.0, 0.01, -0.3, 0.65)],
)
def test_long_run_design_minimises_its_objective(mu, rho, alpha, kept):
    x, y = replay_design.long_run_design(mu, rho, alpha, kept)
    assert y == pytest.approx(math.sqrt(mu / (1 / kept + rho)))
    j = lambda x_, y_: replay_design.long_run_objective(
        x_, y_, mu=mu, rho=rho, alpha=alpha, kept=kept
    )
    x_at = 16.0 if x == math.inf else x
    for dy in (1.1, 0.9, 2.0, 0.5):
        assert j(x_at, y * dy) > j(x_at, y)
    # x only through sigma^2(x): longer is better when alpha < 0, shorter when alpha > 0.
    if alpha < 0:
        assert x == math.inf and j(64.0, y) < j(8.0, y)
    elif alpha > 0:
        assert x == 1.0 and j(8.0, y) > j(1.0, y)


@pytest.mark.parametrize("generated", [4, 8])
def test_long_run_variance_of_a_fifo_buffer_matches_the_derivation(generated):
    """Monte Carlo of the buffer's noise: R generated rollouts a step of which k = f R
    (unit variance) are kept, a FIFO of N = x k, B = y R draws with replacement a step.
    The step errors summed over T steps have variance T / R (1 / y + 1 / f)
    (long_run_design), not the T / R (1 / y + 1 / (f x)) that independent steps would
    give."""
    rng = np.random.default_rng(0)
    trials, steps, k, x, y = 400, 400, 4, 8, 2
    f = k / generated
    n, b = x * k, y * generated
    noise = rng.standard_normal((trials, steps + x, k))
    draws = rng.integers(0, n, (trials, steps, b))
    generation = np.arange(steps)[None, :, None] + x - 1 - draws // k  # newest = t + x - 1
    errors = noise[np.arange(trials)[:, None, None], generation, draws % k].mean(axis=2)
    per_step = errors.var(axis=(0, 1)) * generated
    long_run = errors.sum(axis=1).var() * generated / steps
    assert per_step == pytest.approx(1 / y + 1 / (f * x), rel=0.05)
    assert long_run == pytest.approx(1 / y + 1 / f, rel=0.1)
