"""Disjoint placement's sampler (`rollout.placement='disjoint'`): a thread on devices of its
own that decodes and scores each generation while the trainer steps, takes the trainer's
weights at the sync points, and hands the rollouts over to the trainer's devices, on the
fixed schedule of `replax.rl.placement.Plan` (its module docstring has the schedule).

Every stored rollout keeps v_g, the version of the policy that generated it, as its step:
its replay age counts the steps since that policy. A checkpoint written while a generation
is in flight first finishes it and stores its rollouts (`pending`), which a resumed run
adds at t_g as the uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any

import jax
import numpy as np

from replax.core import processes, sharding
from replax.rl import placement, rollouts, weight_sync
from replax.run import steps
from replax.run.assemble import Run


@dataclasses.dataclass
class _Job:
    generation: int
    version: int
    params: Any
    prompts: Any
    key: Any
    first_rollout: int


class DisjointRollouts:
    """The sampler's side of a disjoint run: a background thread that decodes, scores on
    the host and moves each generation's rollouts to the trainer's devices, while the
    training loop keeps stepping. `step` is called at the start of every train step."""

    def __init__(self, run: Run, base_key, total_steps: int):
        self.run, self.total_steps = run, total_steps
        # Generation g decodes rollouts [g R, (g + 1) R) of the run, keyed as colocated.
        self._rollout_key = steps.rollout_key(base_key)
        self.plan = placement.Plan(
            steps_per_generation=run.spec.train.max_steps_per_generation,
            max_policy_lag=run.spec.rollout.max_policy_lag,
            sync_every=run.spec.rollout.sync_every,
        )
        self.busy_s = 0.0  # seconds the sampler spent on generations (decode + scoring)
        self.sync_s = 0.0  # seconds of the last weight transfer
        self.sync_bytes = 0  # bytes it moved (with LoRA, after the first, the adapters')
        # With LoRA the frozen base goes to the sampler's devices once (weight_sync).
        self._sync = weight_sync.WeightSync(run.sampler, run.model_config)
        self.wait_s = 0.0  # seconds the trainer waited for the generation it consumed
        # generation -> (start, end) of its decode and scoring, time.time() seconds: two
        # clock reads a generation, so that overlap with training can be read off a run.
        self.spans: dict[int, tuple[float, float]] = {}
        self._results: dict[int, tuple[rollouts.Fresh, int, float]] = {}
        self._failure: BaseException | None = None
        self._done = threading.Condition()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self.consumed: int | None = None  # the generation the last `step` took
        self._submitted = -1  # the last generation handed to the sampler
        self._consumed = -1  # the last generation added to the replay store
        # This process's block of the trainer's rows: on several processes each decodes
        # that block of every batch on its own sampler devices.
        self._rows = sharding.named(run.mesh, ("batch",), run.rules)
        self._block = processes.process_block(self._rows)
        self._thread = threading.Thread(target=self._work, name="replax-sampler", daemon=True)
        self._thread.start()

    def resume(self, step: int, pending=None) -> None:
        """Continues a run at `step`: the generation in flight after step - 1 comes from
        the checkpoint's `pending` (loop state and host arrays of `pending_state`)."""
        g = self.plan.in_flight_after(step)
        if g is None:
            self._submitted = self._consumed = -(-step // self.plan.steps_per_generation) - 1
            return
        if pending is None or pending["generation"] != g:
            raise ValueError(f"checkpoint of step {step}: generation {g} in flight, not stored")
        fresh = self._to_trainer(_fresh_from_host(pending), whole=True)
        self._results[g] = (fresh, pending["version"], 0.0)
        self._submitted, self._consumed = g, g - 1

    def step(self, step: int, params, prompt_iter):
        """At the start of train step `step` (params: the trainer's weights after `step`
        steps): hands the sampler the generations that start now and takes the one added
        now. Returns (Fresh or None, its policy version or None, its generation seconds);
        `consumed` is then the generation taken, or None."""
        taken = None
        g = self.consumed = self.plan.consumed_at(step)
        if g is not None:
            self._submit_through(step, params, prompt_iter, last=g)
            start = time.time()
            taken = self._take(g)
            self.wait_s = time.time() - start
        self._submit_through(step, params, prompt_iter, last=None)
        if taken is None:
            return None, None, 0.0
        return taken

    def policy_lag(self, step: int, fresh) -> dict[str, Any]:
        """The placement record's lag keys: how many steps behind the policy that
        generated the rollouts taken at `step` is (one version a generation)."""
        lag = step - fresh.version if fresh.generated else None
        return {"policy_lag_mean": lag, "policy_lag_max": lag}

    def pending_state(self) -> dict[str, Any] | None:
        """The generation in flight, finished: what a checkpoint stores (loop-state keys
        and host arrays), or None when none is in flight."""
        g = self._submitted
        if g <= self._consumed:
            return None
        fresh, version, _ = self._finished(g, keep=True)
        return _fresh_to_host(fresh, g, version)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=60)

    def _submit_through(self, step, params, prompt_iter, last):
        """Submits every generation starting at `step` (up to `last` when given)."""
        while True:
            g = self._submitted + 1
            if last is not None and g > last:
                return
            if self.plan.started_at(g) != step or self.plan.added_at(g) >= self.total_steps:
                return
            start = time.time()
            # The weights go to the sampler's devices now, before the next train step
            # donates the trainer's copy.
            sampler_params = jax.block_until_ready(self._sync(params))
            self.sync_s, self.sync_bytes = time.time() - start, self._sync.bytes
            prompts = rollouts.gather_prompts(self.run.sampler, next(prompt_iter), self._block)
            first = g * self.run.rollouts_per_step
            self._jobs.put(_Job(g, step, sampler_params, prompts, self._rollout_key, first))
            self._submitted = g

    def _take(self, g):
        taken = self._finished(g)
        self._consumed = g
        return taken

    def _finished(self, g, keep=False):
        """Generation g as Fresh rollouts on the trainer's devices: the exchange between
        processes that ends a generation happens here, on the training thread."""
        with self._done:
            self._done.wait_for(lambda: g in self._results or self._failure is not None)
            self._raise_failure()
            result, version, seconds = self._results.pop(g)
        if isinstance(result, rollouts.Scored):
            result = self._to_trainer(rollouts.finish(result))
        if keep:
            self._results[g] = (result, version, seconds)
        return result, version, seconds

    def _raise_failure(self):
        if self._failure is not None:
            raise RuntimeError("the sampler thread failed") from self._failure

    def _work(self):
        while (job := self._jobs.get()) is not None:
            try:
                start = time.time()
                scored = rollouts.decode_and_score(
                    self.run.sampler,
                    self.run.task,
                    self.run.tokenizer,
                    self.run.spec.rollout.group_size,
                    job.params,
                    job.prompts,
                    job.key,
                    job.first_rollout,
                )
                jax.block_until_ready(scored.out)
                end = time.time()
                seconds = end - start
                with self._done:
                    self.spans[job.generation] = (start, end)
                    self.busy_s += seconds
                    self._results[job.generation] = (scored, job.version, seconds)
                    self._done.notify_all()
            except BaseException as e:  # noqa: BLE001 - re-raised on the training thread
                with self._done:
                    self._failure = e
                    self._done.notify_all()
                return

    def _to_trainer(self, fresh: rollouts.Fresh, whole: bool = False) -> rollouts.Fresh:
        return to_trainer(self.run, self._rows, fresh, whole)


def put_rows(run: Run, rows, x, whole: bool = False):
    """Host rows x (this process's block; `whole`: every row, a checkpoint's) as a global
    array on the trainer's mesh, rows split as the replay store's (`rows`: the trainer's
    row sharding)."""
    target = sharding.named(run.mesh, ("batch",) + (None,) * (np.ndim(x) - 1), run.rules)
    if jax.process_count() == 1:
        return jax.device_put(x, target)
    x, r = np.asarray(x), run.rollouts_per_step
    if whole:
        x = x[processes.process_rows(rows, (r,))]
    return processes.global_batch(x, target, r)


def to_trainer(run: Run, rows, fresh: rollouts.Fresh, whole: bool = False) -> rollouts.Fresh:
    """The rollouts on the trainer's mesh (`put_rows`, each array)."""
    put = lambda x: put_rows(run, rows, x, whole)
    return dataclasses.replace(
        fresh,
        prompt_ids=put(fresh.prompt_ids),
        prompt_mask=put(fresh.prompt_mask),
        completion={k: put(v) for k, v in fresh.completion.items()},
        rewards=put(fresh.rewards),
    )


_ARRAYS = ("prompt_ids", "prompt_mask", "rewards", "lengths")


def _fresh_to_host(fresh: rollouts.Fresh, generation: int, version: int) -> dict[str, Any]:
    arrays = {k: processes.to_host(getattr(fresh, k)) for k in _ARRAYS}
    arrays.update({f"completion_{k}": processes.to_host(v) for k, v in fresh.completion.items()})
    return {
        "generation": generation,
        "version": version,
        "reward_mean": fresh.reward_mean,
        "reward_errors": int(fresh.reward_errors),
        "diagnostics": {k: _plain(v) for k, v in fresh.diagnostics.items()},
        "decoded_row_steps": fresh.decoded_row_steps,
        "arrays": arrays,
    }


def _plain(value):
    """A JSON number (or None) of a host statistic."""
    return None if value is None else np.asarray(value).item()


def _fresh_from_host(pending: dict[str, Any]) -> rollouts.Fresh:
    arrays = pending["arrays"]
    completion = {
        k[len("completion_") :]: v for k, v in arrays.items() if k.startswith("completion_")
    }
    return rollouts.Fresh(
        prompt_ids=arrays["prompt_ids"],
        prompt_mask=arrays["prompt_mask"],
        completion=completion,
        rewards=arrays["rewards"],
        reward_mean=pending["reward_mean"],
        reward_errors=pending["reward_errors"],
        lengths=arrays["lengths"],
        diagnostics=dict(pending["diagnostics"]),
        decoded_row_steps=pending.get("decoded_row_steps"),
    )
