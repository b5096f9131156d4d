"""The plan of disjoint placement (`rollout.placement='disjoint'`): which devices the
sampler takes, and when each generation starts and is consumed. The sampler's thread that
follows the plan is replax.run.disjoint.

The schedule is fixed, so that a run is reproducible and resumes exactly; timing only
decides who waits. With K = train.max_steps_per_generation, L = rollout.max_policy_lag
and S = rollout.sync_every:
- generation g (R fresh rollouts) enters the replay store at train step t_g = g K, so the
  trainer takes K steps per generation, replaying while the next one is in flight, and
  waits at t_g when generation g is not ready yet;
- generation g decodes with the trainer's weights after v_g steps: the earliest multiple
  of S at or after max(t_g - L, t_{g-1}), and t_g when there is none before it. The
  sampler takes new weights only then, in one transfer (`weight_sync`: of the whole
  tree, or with LoRA of the adapters once the base is there), so a fresh
  rollout is t_g - v_g <= L train steps behind the trainer (its policy lag), and one
  generation at most is in flight (it starts once the previous one has been consumed);
- the prompts and the PRNG key of generation g are those colocated training would use at
  step t_g, so with L = 0 a disjoint run trains exactly as a colocated one.
"""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class Plan:
    """When each generation starts and when it is consumed (see the module docstring)."""

    steps_per_generation: int  # K
    max_policy_lag: int  # L
    sync_every: int  # S

    def added_at(self, g: int) -> int:
        """t_g: the train step at which generation g enters the replay store."""
        return g * self.steps_per_generation

    def started_at(self, g: int) -> int:
        """v_g: the train step whose weights generation g decodes with."""
        t = self.added_at(g)
        if g == 0:
            return 0
        earliest = max(t - self.max_policy_lag, self.added_at(g - 1))
        synced = -(-earliest // self.sync_every) * self.sync_every
        return min(synced, t)

    def consumed_at(self, step: int) -> int | None:
        """The generation added at this step, or None."""
        k = self.steps_per_generation
        return step // k if step % k == 0 else None

    def in_flight_after(self, step: int) -> int | None:
        """The generation started before `step` and not yet consumed (what a checkpoint
        written after step - 1 holds as pending), or None."""
        g = -(-step // self.steps_per_generation)  # the first one consumed at or after step
        return g if self.started_at(g) < step else None


def stream_minimum_lag(steps_per_generation: int, sync_every: int) -> int:
    """The smallest rollout.max_policy_lag a stream (`rollout.stream`, replax.run.streaming)
    runs with: the largest lag of a group submitted and completed while one batch fills,
    which must be kept, or every group could be dropped."""
    return steps_per_generation + sync_every - 1


def split_devices(num_devices: int, devices=None):
    """(trainer devices, sampler devices): the sampler takes the last num_devices. On
    several processes each gives it the last num_devices / processes of its own, and its
    sampler devices are this process's alone (each process decodes its block of a batch
    by itself: no value crosses processes while generation runs beside training)."""
    devices = list(jax.devices() if devices is None else devices)
    processes = sorted({d.process_index for d in devices})
    if len(processes) == 1:
        return devices[: len(devices) - num_devices], devices[len(devices) - num_devices :]
    k = num_devices // len(processes)
    trainer, sampler = [], []
    for p in processes:
        own = sorted((d for d in devices if d.process_index == p), key=lambda d: d.id)
        trainer += own[: len(own) - k]
        if p == jax.process_index():
            sampler = own[len(own) - k :]
    return trainer, sampler


def sampler_device_count(placement: str, requested: int, num_devices: int) -> int:
    """The devices the sampler takes out of num_devices (0 when it shares the trainer's):
    `requested` (rollout.num_devices) when disjoint, half of them when that is 0."""
    if placement != "disjoint":
        return 0
    return requested or num_devices // 2
