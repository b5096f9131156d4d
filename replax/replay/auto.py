r"""Auto replay: choose the replay ratio y = B / R and the staleness horizon x = N / R online.

With `replay.mode='auto'` the RL loop asks an `AutoReplayController` each step whether to
generate R fresh rollouts, whether to train, and how old a sampled rollout may be (a max
age, the horizon x). B and R are fixed: a generation period k makes y = k B / R above
B / R; y = 1 is on-policy (`replay.auto_min_y`): every step generates and a step trains
once the on-policy batch (`replay.auto_onpolicy_batches` x B) of fresh rollouts waits,
each drawn once. A y* between 1 and B / R plans the end of the two that the design rates
cheaper (`between_ends`). It
estimates mu (generation / training seconds per rollout, or `replay.mu`), the staleness
exponent alpha and the correlation rho (from the train step's fresh / stale half-batch
gradient statistics) and the kept fraction f, and every `update_every` steps re-plans
(x*, y*) with a design of `replay_design.DESIGNS` ('long_run', the config's default, or
'paper'). Until a window has measured staleness (halves of different ages), the horizon
is the whole ring, as in the fixed design. docs/auto_replay.md has the derivations, the
estimators and the config keys; tests/replay/test_designs.py checks the closed forms.
"""

from __future__ import annotations

import math
from typing import Any

from replax.replay.designs import DESIGNS, between_ends

# The train step's half-batch statistics this plans from.
STAT_KEYS = (
    "halves_cross", "halves_noise_fresh", "halves_noise_stale", "halves_age_fresh",
    "halves_age_stale",
)  # fmt: skip


# ------------------------------------------------------------------------ estimators


def alpha_point(noise_fresh, noise_stale, age_fresh, age_stale) -> tuple[float, float] | None:
    """One regression point (u, v) = (log age ratio, log noise ratio) from pooled half
    statistics, or None when it carries no information (equal ages, noise <= 0)."""
    u = math.log((age_stale + 1.0) / (age_fresh + 1.0))
    if u < 1e-3 or noise_fresh <= 0 or noise_stale <= 0:
        return None
    return u, math.log(noise_stale / noise_fresh)


def rho_estimate(cross, noise_fresh, noise_stale, *, half_size, rollouts_per_generation):
    """rho = R S / s^2 with s^2 = b (n_A + n_B) / 2 (pooled sums are fine: the ratio is
    scale-free in the number of steps pooled). None when the noise is not positive."""
    per_rollout_noise = half_size * (noise_fresh + noise_stale) / 2
    if per_rollout_noise <= 0:
        return None
    return rollouts_per_generation * cross / per_rollout_noise


def _clip(value, lo, hi):
    return min(max(value, lo), hi)


class AutoReplayController:
    """Plans the generation period and the staleness horizon from online estimates.

    Per step, in order: `should_generate(step)` (generate R fresh rollouts this step?),
    `max_age()` (the sampling limit for this step), then after the step
    `observe(gen_s=..., train_s=..., stats=...)` with gen_s only on generating steps and
    stats the `halves_*` scalars of the train step. `metrics()` is what to log.
    """

    # The train step reports the fresh / stale half-batch statistics this plans from.
    half_batch_stats = True
    # Below B / R some steps generate without training (replax.replay.schedules).
    varies_training = True
    # The age limit of the latest `max_age()` call.
    last_max_age: int | None = None

    _CONFIG = (
        "rollouts_per_generation", "batch_size", "capacity", "mu_override", "update_every",
        "alpha_init", "rho_init", "mu_init", "kept_init", "ema", "alpha_range", "rho_range",
        "mu_range", "kept_range", "max_period", "min_horizon", "warmup", "design", "min_y",
        "onpolicy_batch",
    )  # fmt: skip

    def __init__(
        self,
        *,
        rollouts_per_generation: int,
        batch_size: int,
        capacity: int,
        mu_override: float | None = None,
        update_every: int = 10,
        alpha_init: float = 0.25,
        rho_init: float = 0.1,
        mu_init: float = 1.0,
        kept_init: float = 1.0,
        ema: float = 0.8,
        alpha_range: tuple[float, float] = (-0.45, 0.45),
        rho_range: tuple[float, float] = (1e-3, 1e3),
        mu_range: tuple[float, float] = (1e-2, 1e3),
        kept_range: tuple[float, float] = (0.05, 1.0),
        max_period: int = 8,
        min_horizon: int = 2,
        warmup: int = 1,
        design: str = "paper",
        min_y: float | None = None,
        onpolicy_batch: int | None = None,
    ):
        if min(rollouts_per_generation, batch_size, capacity, update_every, max_period) < 1:
            raise ValueError("rollouts, batch size, capacity, update_every, max_period >= 1")
        if capacity < rollouts_per_generation:
            raise ValueError(f"capacity={capacity} < rollouts_per_generation")
        if not 0 <= ema < 1:
            raise ValueError(f"ema={ema} must lie in [0, 1)")
        if design not in DESIGNS:
            raise ValueError(f"design={design!r}; allowed: {', '.join(DESIGNS)}")
        highest = max_period * batch_size / rollouts_per_generation
        if min_y is not None and not 1 <= min_y <= highest:
            raise ValueError(f"min_y={min_y} must lie in [1, max_period B / R]")
        # The lowest y to plan: None keeps the floor of generating every step, B / R;
        # 1 lets the plan go on-policy.
        self.min_y = min_y
        # On-policy steps train on this many fresh rollouts (None: B).
        if onpolicy_batch is not None and (onpolicy_batch < 1 or onpolicy_batch > capacity):
            raise ValueError(f"onpolicy_batch={onpolicy_batch} must lie in [1, capacity]")
        self.onpolicy_batch = onpolicy_batch or batch_size
        self.design = design
        self.rollouts_per_generation = rollouts_per_generation
        self.batch_size = batch_size
        self.capacity = capacity
        self.mu_override = mu_override if mu_override and mu_override > 0 else None
        self.update_every = update_every
        self.alpha_init, self.rho_init, self.mu_init = alpha_init, rho_init, mu_init
        self.kept_init = kept_init
        self.ema = ema
        self.alpha_range = tuple(alpha_range)
        self.rho_range = tuple(rho_range)
        self.mu_range = tuple(mu_range)
        self.kept_range = tuple(kept_range)
        self.max_period = max_period
        self.min_horizon = min_horizon
        # Warm-up observations of each timer are skipped (they include compilation).
        self.warmup = warmup
        # Timers: EMAs of seconds per generated / trained rollout, and counts seen.
        self.gen_per_rollout: float | None = None
        self.train_per_rollout: float | None = None
        self.gen_seen = 0
        self.train_seen = 0
        # Estimates.
        self.alpha = alpha_init
        self.rho = rho_init
        self.kept = kept_init
        # Regression through the origin: decayed data sums; the prior is one fixed
        # pseudo-point at u = log 2.
        self.reg_uu = 0.0
        self.reg_uv = 0.0
        # Statistics pooled over the current planning window: all steps (for rho), and the
        # steps whose halves differ in age (for alpha).
        self.window = dict.fromkeys(STAT_KEYS, 0.0)
        self.window_steps = 0
        self.mixed = dict.fromkeys(STAT_KEYS, 0.0)
        self.mixed_steps = 0
        # Rollouts kept / generated over the window's generating steps.
        self.window_kept = 0
        self.window_generated = 0
        self.observed = 0
        # Plan and the generation credit.
        self.credit = 1.0
        self.last_step: int | None = None
        self.last_generate = True
        # On-policy, the fresh rollouts stored and not yet trained on.
        self.train_step, self.last_train = None, True
        self.waiting = self.once_max_age = 0
        self.x_opt = self.y_opt = math.nan
        self.y = batch_size / rollouts_per_generation
        self.period = 1.0
        self.once = False
        self.horizon = float(max(min_horizon, 1))
        self._plan()

    # ---------------------------------------------------------------- decisions

    @property
    def mu(self) -> float:
        if self.mu_override is not None:
            return self.mu_override
        if self.gen_per_rollout is None or not self.train_per_rollout:
            return self.mu_init
        return _clip(self.gen_per_rollout / self.train_per_rollout, *self.mu_range)

    def should_generate(self, step: int) -> bool:
        """Whether to generate on `step` (asked once per step; repeated asks agree)."""
        step = int(step)
        if step == self.last_step:
            return self.last_generate
        generate = self.credit >= 1.0 - 1e-9 or self.last_step is None
        if generate:
            self.credit = max(self.credit - 1.0, 0.0)
        self.credit += 1.0 / self.period  # stays below 1 + 1/period: no bursts
        self.last_step, self.last_generate = step, generate
        return generate

    def should_train(self, step: int) -> bool:
        """Whether `step` takes an optimizer step (asked after `should_generate(step)`;
        repeated asks agree). On-policy, it trains once the on-policy batch is waiting."""
        step = int(step)
        if step == self.train_step:
            return self.last_train
        incoming = self.rollouts_per_generation if self.should_generate(step) else 0
        if self.once:
            pending = self.waiting + incoming
            train = pending >= self.onpolicy_batch
            # The oldest rollout waiting was generated this many steps ago (one a step).
            self.once_max_age = max(math.ceil(pending / self.rollouts_per_generation) - 1, 0)
            self.waiting = pending - (self.onpolicy_batch if train else 0)
        else:
            train = True
        self.train_step, self.last_train = step, train
        return train

    @property
    def trained_batch(self) -> int:
        """The rollouts a training step takes in the current plan (it changes only when
        the plan does, after the step is observed)."""
        return self.onpolicy_batch if self.once else self.batch_size

    @property
    def draw_once(self) -> bool:
        """Whether this step's batch is the waiting fresh rollouts, each drawn once."""
        return self.once

    def max_age(self) -> int:
        """Items older than this many steps are not sampled."""
        if self.once:
            self.last_max_age = self.once_max_age
        else:
            self.last_max_age = max(int(math.ceil(self.horizon - 1e-9)) - 1, 0)
        return self.last_max_age

    # ------------------------------------------------------------- observations

    def observe(
        self,
        gen_s: float | None = None,
        train_s: float | None = None,
        stats=None,
        kept: int | None = None,
    ):
        """Feeds one step's timings (seconds of this step), half-batch statistics and, on
        generating steps, how many of the R fresh rollouts entered the buffer."""
        if kept is not None:
            self.window_kept += int(kept)
            self.window_generated += self.rollouts_per_generation
        if gen_s is not None:
            self.gen_seen += 1
            if self.gen_seen > self.warmup:
                value = float(gen_s) / self.rollouts_per_generation
                self.gen_per_rollout = self._smooth(self.gen_per_rollout, value)
        if train_s is not None:
            self.train_seen += 1
            if self.train_seen > self.warmup:
                value = float(train_s) / self.trained_batch
                self.train_per_rollout = self._smooth(self.train_per_rollout, value)
        if stats and STAT_KEYS[0] in stats:  # a replay step's (on-policy steps have none)
            values = {k: float(stats[k]) for k in STAT_KEYS}
            # A half's noise falls as 1 / its size: pooled as at the replay batch's halves.
            for k in ("halves_noise_fresh", "halves_noise_stale"):
                values[k] *= self.trained_batch / self.batch_size
            if all(math.isfinite(v) for v in values.values()):
                for k, v in values.items():
                    self.window[k] += v
                self.window_steps += 1
                if values["halves_age_stale"] - values["halves_age_fresh"] >= 0.5:
                    for k, v in values.items():
                        self.mixed[k] += v
                    self.mixed_steps += 1
        self.observed += 1
        if self.observed % self.update_every == 0:
            self._update_estimates()
            self._plan()

    def _smooth(self, old, new):
        return new if old is None else self.ema * old + (1 - self.ema) * new

    def _update_estimates(self):
        if self.mixed_steps:
            m = {k: v / self.mixed_steps for k, v in self.mixed.items()}
            point = alpha_point(
                m["halves_noise_fresh"],
                m["halves_noise_stale"],
                m["halves_age_fresh"],
                m["halves_age_stale"],
            )
            if point is not None:
                u, v = point
                self.reg_uu = self.ema * self.reg_uu + u * u
                self.reg_uv = self.ema * self.reg_uv + u * v
                prior_uu = math.log(2.0) ** 2
                slope = (self.reg_uv + prior_uu * 2 * self.alpha_init) / (self.reg_uu + prior_uu)
                self.alpha = _clip(slope / 2, *self.alpha_range)
        if self.window_steps:
            w = {k: v / self.window_steps for k, v in self.window.items()}
            rho = rho_estimate(
                w["halves_cross"],
                w["halves_noise_fresh"],
                w["halves_noise_stale"],
                half_size=self.batch_size // 2,
                rollouts_per_generation=self.rollouts_per_generation,
            )
            if rho is not None:
                rho = _clip(rho, *self.rho_range)
                # EMA in log space: rho spans orders of magnitude.
                self.rho = math.exp(self.ema * math.log(self.rho) + (1 - self.ema) * math.log(rho))
        self.window = dict.fromkeys(STAT_KEYS, 0.0)
        self.window_steps = 0
        self.mixed = dict.fromkeys(STAT_KEYS, 0.0)
        self.mixed_steps = 0
        if self.window_generated:
            kept = _clip(self.window_kept / self.window_generated, *self.kept_range)
            self.kept = self._smooth(self.kept, kept)
        self.window_kept = self.window_generated = 0

    def _plan(self):
        x, y = DESIGNS[self.design](self.mu, self.rho, self.alpha, self.kept)
        self.x_opt, self.y_opt = x, y
        r, b = self.rollouts_per_generation, self.batch_size
        # The floor: 1 (on-policy), or B / R and up (a floor between them runs as B / R:
        # nothing between the two ends is run).
        lowest = 1.0 if self.min_y == 1 else max(self.min_y or 0.0, b / r)
        self.y = between_ends(_clip(y, lowest, self.max_period * b / r), lowest, b / r)
        self.period = _clip(self.y * r / b, 1.0, float(self.max_period))
        # At y = 1 the batch is the on-policy batch of fresh rollouts, each trained on
        # once: on-policy, at on-policy's cost.
        once = self.y <= 1.0 + 1e-9
        if once and not self.once:
            self.waiting = 0  # counted from here: what came before was drawn or dropped
        self.once = once
        # Steps a rollout survives in the ring: kept R enter it per generation.
        longest = self.period * self.capacity / (self.kept * r)
        shortest = max(self.period + 1, float(self.min_horizon))
        if self.reg_uu > 0:
            self.horizon = _clip(x, min(shortest, longest), longest)
        else:
            # No staleness measured yet: the prior alpha (> 0) alone would plan the
            # shortest horizon and part the run from the config's design (which draws
            # from the whole ring) before anything says stale rollouts are worse.
            self.horizon = longest

    # ---------------------------------------------------------------- reporting

    def metrics(self) -> dict[str, float]:
        return {
            "auto_mu": self.mu,
            "auto_alpha": self.alpha,
            "auto_rho": self.rho,
            "auto_kept": self.kept,
            "auto_y": self.y,
            "auto_x": self.horizon,
            "auto_y_opt": self.y_opt,
            "auto_x_opt": self.x_opt if math.isfinite(self.x_opt) else None,
            "auto_period": self.period,
            "auto_max_age": self.last_max_age,  # the limit the step just taken used
            "auto_generate": int(self.last_generate),
            "auto_train": int(self.last_train),
            "auto_onpolicy": int(self.once),
        }

    # What a checkpoint holds besides _CONFIG and the two windows: the timers, estimates
    # and credits. A state saved before the kept fraction or the on-policy count lacks
    # _LATER's keys; the defaults (every rollout kept, every step trains) are what that
    # controller did. An older state's training credit is ignored: the load re-plans.
    _STATE = (
        "gen_per_rollout", "train_per_rollout", "gen_seen", "train_seen", "alpha", "rho",
        "reg_uu", "reg_uv", "window_steps", "mixed_steps", "observed", "credit", "last_step",
        "last_generate",
    )  # fmt: skip
    _LATER = (
        "kept", "window_kept", "window_generated", "train_step",
        "last_train", "waiting", "once", "once_max_age",
    )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state (for checkpoints)."""
        state = {k: getattr(self, k) for k in (*self._CONFIG, *self._STATE, *self._LATER)}
        for k in ("alpha_range", "rho_range", "mu_range", "kept_range"):
            state[k] = list(state[k])
        return {**state, "window": dict(self.window), "mixed": dict(self.mixed)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> AutoReplayController:
        controller = cls(**{k: state[k] for k in cls._CONFIG if k in state})
        for k in (*cls._STATE, *(k for k in cls._LATER if k in state)):
            setattr(controller, k, state[k])
        controller.window = dict(state["window"])
        controller.mixed = dict(state["mixed"])
        controller._plan()
        return controller
