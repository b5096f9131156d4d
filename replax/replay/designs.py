r"""The auto-replay design: the replay ratio y = B / R and staleness horizon x = N / R
that minimise the cost of a target loss, for measured mu (generation / training cost per
rollout), rho (gradient correlation), alpha (staleness exponent) and kept fraction f.

`DESIGNS` holds the two closed forms: 'paper' (`optimal_design`, the paper's J(x, y)
minimised exactly) and 'long_run' (`long_run_design`, y* = sqrt(mu / (1 / f + rho))).
`numeric_optimal_design` minimises J numerically, to check them. docs/auto_replay.md has
the derivations; `replax.replay.auto` the controller that plans with them online.
"""

from __future__ import annotations

import math


def design_objective(
    x: float, y: float, *, mu: float, rho: float, alpha: float, kept: float = 1.0
) -> float:
    """J(x, y) with sigma(x) = x^alpha (tau = 1: tau only scales J); `kept` the fraction
    of generated rollouts that enter the buffer (the buffer holds kept x R of them)."""
    return x ** (2 * alpha) * (1 + y / mu) * (1 / y + 1 / (kept * x) + rho)


def _check_kept(kept: float):
    if not 0 < kept <= 1:
        raise ValueError(f"need 0 < kept <= 1; got kept={kept}")


def optimal_design(mu: float, rho: float, alpha: float, kept: float = 1.0) -> tuple[float, float]:
    """The closed-form minimiser (x*, y*) of J; x* is inf when alpha <= 0 (no variance
    growth, or a decrease: J falls with x, keep everything; then y* = sqrt(mu / rho)).

    With a kept fraction f < 1, J(x, y; mu, rho) = J(x, z; mu / f, f rho) / f for z = y / f
    (the batch over the rollouts kept per generation): the design is the f = 1 one at
    (mu / f, f rho), with y* = f z*. That leaves y* as it was and makes x* 1 / f times
    longer: the buffer holds as many kept rollouts as it would without drops."""
    if not (mu > 0 and rho >= 0 and alpha < 0.5) or (alpha <= 0 and rho == 0):
        raise ValueError(
            f"need mu > 0, rho >= 0, alpha < 1/2, and rho > 0 when alpha <= 0; got "
            f"mu={mu}, rho={rho}, alpha={alpha}"
        )
    _check_kept(kept)
    mu, rho = mu / kept, rho * kept
    if alpha <= 0:
        return math.inf, kept * math.sqrt(mu / rho)
    root = math.sqrt(alpha**2 + mu * rho * (1 - 2 * alpha))
    z = mu * (1 - 2 * alpha) / (alpha + root)
    return z**2 / (2 * alpha * (mu + z)), kept * z


def long_run_objective(
    x: float, y: float, *, mu: float, rho: float, alpha: float, kept: float = 1.0
) -> float:
    """J with the long-run variance of the step gradient: the buffer term 1 / kept in
    place of 1 / (kept x) (see `long_run_design`). x matters through sigma^2(x) =
    x^(2 alpha) alone."""
    return x ** (2 * alpha) * (1 + y / mu) * (1 / y + 1 / kept + rho)


def long_run_design(mu: float, rho: float, alpha: float, kept: float = 1.0) -> tuple[float, float]:
    """Minimiser (x*, y*) of `long_run_objective`: y* = sqrt(mu / (1 / f + rho)) for the
    kept fraction f (sqrt(mu / (1 + rho)) when every rollout is kept); x* = inf when
    alpha <= 0 (stale rollouts no noisier: keep them all) and 1 otherwise (as short as
    allowed: the controller keeps at least two generations).

    Why the long-run variance. J charges each step the variance of its own gradient,
    s^2 / R (1 / y + 1 / x + rho) in units where a fresh rollout's noise is s^2: the batch
    is a sample of B from a buffer of N = x R whose mean itself is off by s^2 / N. That
    buffer error is shared by every step the same rollouts are in. A rollout lives x
    steps, so the errors of steps t and t + k share (x - k) / x of their rollouts and
    covary by s^2 / N (1 - k / x). SGD adds the steps' errors up, and summed over all lags
    (-x, x) the covariance is s^2 / N (1 + 2 sum_k (1 - k / x)) = s^2 x / N = s^2 / R,
    whatever x is. Equivalently, a rollout is drawn y times on average over its life and
    each draw adds its noise / B: over T steps the errors sum to variance
    T R (y + y^2) s^2 / B^2 = T s^2 / R (1 / y + 1). So over a run much longer than a
    rollout's life the buffer term is 1, not 1 / x, and dJ/dy = 0 gives y^2 = mu / (1 +
    rho): replay pays off while a reused sample costs (B / mu) less than a fresh one's
    noise is worth, independent of the horizon.

    Dropped rollouts (zero-advantage groups, `replay.drop_zero_advantage`) cost their
    generation and never enter the buffer: of the R generated per generation only f R
    carry noise into it, so the buffer term is 1 / f in units of the R generated, and
    y^2 = mu / (1 / f + rho).
    """
    if not (mu > 0 and rho >= 0 and alpha < 0.5):
        raise ValueError(
            f"need mu > 0, rho >= 0, alpha < 1/2; got mu={mu}, rho={rho}, alpha={alpha}"
        )
    _check_kept(kept)
    return (math.inf if alpha <= 0 else 1.0), math.sqrt(mu / (1 / kept + rho))


DESIGNS = {"paper": optimal_design, "long_run": long_run_design}


def between_ends(y_opt: float, low: float, high: float) -> float:
    """The y to run for a planned y* in [low, high], where only the two ends run well.

    Both designs' J is, in y at a fixed x, 1 / y + y / y*^2 up to a factor and a constant,
    so the end with the lower J is `low` iff y* <= sqrt(low high). Between on-policy and
    B / R the only knob is skipping optimizer steps on some generating steps; on the
    embedded task that ran dearer than both ends (docs/auto_replay.md), so
    `replax.replay.auto` runs the cheaper end."""
    if not low < y_opt < high:
        return y_opt
    return low if y_opt * y_opt <= low * high else high


def _golden_section(f, lo: float, hi: float, iterations: int = 120) -> float:
    """Minimiser of a unimodal f on [lo, hi]."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def numeric_optimal_design(
    mu: float,
    rho: float,
    alpha: float,
    kept: float = 1.0,
    bounds: tuple[float, float] = (1e-4, 1e6),
) -> tuple[float, float]:
    """Minimises J numerically: golden section over log x of min over log y (J is
    unimodal in log y for fixed x, and so is the profile in log x when alpha < 1/2)."""
    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    j = lambda x, y: design_objective(x, y, mu=mu, rho=rho, alpha=alpha, kept=kept)

    def best_log_y(log_x):
        x = math.exp(log_x)
        return _golden_section(lambda ly: j(x, math.exp(ly)), lo, hi)

    def profile(log_x):
        return j(math.exp(log_x), math.exp(best_log_y(log_x)))

    log_x = _golden_section(profile, lo, hi)
    return math.exp(log_x), math.exp(best_log_y(log_x))
