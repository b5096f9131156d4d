"""Disjoint placement with the stream (`rollout.stream`): the sampler's slots stay full
across generations (`replax.sampling.stream`), and a group enters the trainer's batch as
soon as its G completions are done, whichever generation it belongs to.

The schedule is pinned by the stream's own counts, not by time, so that a run is
reproducible and resumes exactly. With K = train.max_steps_per_generation, S =
rollout.sync_every, L = rollout.max_policy_lag and P prompts a batch:
- the trainer takes batch b, the next P groups the sampler accepted in the order they
  completed, at train step b K (and waits there until they are in);
- while the sampler has accepted a groups, it decodes with the trainer's weights after
  V(a) = floor_S(K (a // P - 1)) steps (0 at first): those the trainer had when it took
  the previous batch, so the sampler waits only if the trainer falls a whole batch
  behind. The trainer hands those versions over at those steps, before it waits;
- a group's version is the one its generation was submitted (its prompts prefilled)
  under, the oldest policy any of its tokens depends on; a group whose lag at the step
  that would take it exceeds L is dropped and counted (`groups_dropped`; L is at least
  `placement.stream_minimum_lag`, so that a group made while one batch fills is kept). Each of its
  tokens keeps the version it was sampled under (`token_lag_mean`); the store ages each
  rollout from its group's version;
- a checkpoint after step t - 1 waits until the sampler needs a version not handed over
  yet (>= t): nothing in flight then depends on weights the resumed run lacks, and the
  stream's state, the groups accepted but not taken and the counts are all it stores.
"""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from replax.core import processes, sharding
from replax.rl import rollouts, scoring, weight_sync
from replax.run import disjoint as disjoint_lib
from replax.run.assemble import Run
from replax.sampling import stream as stream_lib

DEPTH = 2  # generations the stream's queue holds
LAG_KEYS = ("policy_lag_mean", "policy_lag_max", "token_lag_mean", "groups_dropped")


@dataclasses.dataclass
class _Accepted:
    """One accepted group on the host: its G rows."""

    prompt_ids: np.ndarray  # [G, P]
    prompt_mask: np.ndarray
    tokens: np.ndarray  # [G, N]
    mask: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray  # [G]
    versions: np.ndarray  # [G, N] per token, -1 past the length
    rewards: np.ndarray  # [G]
    version: int
    errors: int
    truncated: int
    row_steps: int  # the stream's decoded row-steps when it was accepted
    useful: int  # of which produced a token not dropped, then
    dropped: int  # groups dropped before it
    read_s: float  # when it was read (time.time())


class StreamRollouts:
    """The sampler's side of a streaming disjoint run, with DisjointRollouts' interface
    (`resume`, `step`, `pending_state`, `close` and the placement record's counters)."""

    def __init__(self, run: Run, base_key, total_steps: int):
        c = run.spec
        self.run, self.base_key = run, base_key
        self.k, self.sync_every = c.train.max_steps_per_generation, c.rollout.sync_every
        self.max_lag, self.group_size = c.rollout.max_policy_lag, c.rollout.group_size
        self._rows = sharding.named(run.mesh, ("batch",), run.rules)
        self._block = processes.process_block(self._rows)
        self.prompts = run.rollouts_per_step // self.group_size // self._block[1]
        self.batches = -(-total_steps // self.k)  # the batches the trainer takes
        self.stream = stream_lib.make_stream(
            run.sampler, prompts=self.prompts, num_samples=self.group_size, depth=DEPTH
        )
        self._sync = weight_sync.WeightSync(run.sampler, run.model_config)
        self._versions = sorted({self.version_for(m * self.prompts) for m in range(self.batches)})
        self.busy_s = self.sync_s = self.wait_s = 0.0
        self.sync_bytes = 0
        self.spans: dict[int, tuple[float, float]] = {}
        self.consumed: int | None = None
        self._lags: dict[str, Any] = dict.fromkeys(LAG_KEYS)
        self._cv = threading.Condition()
        self._mailbox: dict[int, Any] = {}  # version -> weights on the sampler's devices
        self._blocked_on: int | None = None
        self._closing = self._finished = False
        self._failure: BaseException | None = None
        self._prompt_iter = None
        # What a checkpoint stores (`_counts`), all advanced by the sampler's thread alone.
        self._accepted = self._dropped = self._submitted = 0
        self._ready: dict[int, _Accepted] = {}  # accepted index -> group, until taken
        self._inputs: dict[int, dict] = {}  # generation -> its host prompts, until out
        self._out: dict[int, int] = {}  # generation -> groups handed out so far
        self._last_row_steps = self._last_useful = 0  # at the end of the batch taken last
        self._dropped_tokens = 0
        self._thread = threading.Thread(target=self._work, name="replax-stream", daemon=True)

    def version_for(self, accepted: int) -> int:
        """V(a): the weights the sampler decodes with after `accepted` groups."""
        m = accepted // self.prompts - 1
        return max(0, (self.k * m) // self.sync_every * self.sync_every)

    # ---- the training thread

    def resume(self, step: int, pending=None) -> None:
        if pending is not None:
            p, arrays = jax.process_index(), pending["arrays"]
            blob = np.asarray(arrays["state"])[p, : int(np.asarray(arrays["sizes"])[p])]
            state = pickle.loads(blob.tobytes())
            self.stream.load_state_dict(state.pop("stream"))
            for key, value in state.items():
                setattr(self, key, value)
        elif step:
            raise ValueError(f"checkpoint of step {step}: the stream's state is not stored")
        self._thread.start()

    def step(self, step: int, params, prompt_iter):
        """At the start of train step `step`: hands over the weights the sampler will
        need, then takes batch step / K when one is due. Returns (Fresh or None, the
        rows' versions on the trainer's mesh, its generation seconds)."""
        self._prompt_iter = prompt_iter
        if step in self._versions:
            start = time.time()
            synced = jax.block_until_ready(self._sync(params))
            self.sync_s, self.sync_bytes = time.time() - start, self._sync.bytes
            with self._cv:
                self._mailbox[step] = synced
                self._cv.notify_all()
        self.consumed = None
        if step % self.k:  # the rows' versions of a step that takes none, for one program
            local = self.prompts * self.group_size
            return None, disjoint_lib.put_rows(self.run, self._rows, np.full(local, step)), 0.0
        b = self.consumed = step // self.k
        start = time.time()
        with self._cv:
            self._cv.wait_for(
                lambda: self._accepted >= (b + 1) * self.prompts or self._failure is not None
            )
            self._raise_failure()
            groups = [self._ready.pop(i) for i in range(b * self.prompts, (b + 1) * self.prompts)]
        self.wait_s = time.time() - start
        return self._batch(step, b, groups)

    def pending_state(self) -> dict[str, Any]:
        """The stream's state once it waits for weights not handed over yet (or is done):
        a pickled host copy, as one uint8 array."""
        with self._cv:
            self._cv.wait_for(
                lambda: (
                    self._finished
                    or self._failure is not None
                    or (self._blocked_on is not None and self._blocked_on not in self._mailbox)
                )
            )
            self._raise_failure()
            state = {"stream": self.stream.state_dict(), **self._counts()}
        blob = np.frombuffer(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        # Each process's own stream, in one array every process holds (a checkpoint saves
        # it once): row p is process p's, `sizes` its length.
        sizes = np.array([len(blob)])
        if jax.process_count() > 1:
            sizes = multihost_utils.process_allgather(sizes).reshape(-1)
            padded = np.zeros(int(sizes.max()), np.uint8)
            padded[: len(blob)] = blob
            blob = multihost_utils.process_allgather(padded)
        arrays = {"state": blob.reshape(len(sizes), -1), "sizes": sizes}
        stream = self.stream
        return {
            "stream": 1,
            "accepted": state["_accepted"],
            # Rollouts queued and decoding in the slots when it was taken.
            "queued": stream._submitted - stream._next,
            "decoding": stream._live,
            "arrays": arrays,
        }

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def policy_lag(self, step: int, fresh) -> dict[str, Any]:
        """The placement record's lag keys of the batch taken at `step`."""
        return self._lags if fresh.generated else dict.fromkeys(self._lags)

    def _counts(self) -> dict[str, Any]:
        names = ("_accepted", "_dropped", "_submitted", "_ready", "_inputs", "_out")
        names += ("_last_row_steps", "_last_useful", "_dropped_tokens")
        return {k: getattr(self, k) for k in names}

    def _raise_failure(self):
        if self._failure is not None:
            raise RuntimeError("the stream's sampler thread failed") from self._failure

    def _batch(self, step, b, groups):
        """Batch b's groups as Fresh rollouts on the trainer's mesh."""
        cat = lambda name: np.concatenate([getattr(g, name) for g in groups])
        rewards, lengths = cat("rewards"), cat("lengths")
        rows = np.repeat([g.version for g in groups], self.group_size).astype(np.int32)
        lag = step - rows
        completion = {k: cat(k) for k in ("tokens", "mask", "logprobs", "versions")}
        tokens = completion["versions"]  # each token's version, -1 past the length
        token_lag = np.where(tokens >= 0, step - tokens, 0).sum(), (tokens >= 0).sum()
        counts = [g.errors for g in groups], [g.truncated for g in groups]
        # The row-steps decoded since the last batch was taken, and those of them that
        # produced a token not dropped: groups span batches, so their own lengths over the
        # window's row-steps would not be a fraction.
        decoded = groups[-1].row_steps - self._last_row_steps
        useful = groups[-1].useful - self._last_useful
        self._last_row_steps, self._last_useful = groups[-1].row_steps, groups[-1].useful
        local = [sum(counts[0]), sum(counts[1]), decoded, useful, *token_lag, lag.sum()]
        errors, truncated, decoded, useful, lag_sum, token_count, row_lag = (
            processes.sum_over_processes(np.array(local))
        )
        all_rewards, all_lengths = rewards, lengths
        lag_max = lag.max()
        if jax.process_count() > 1:
            all_rewards, all_lengths = scoring.blocks_in_order(self._block[0], rewards, lengths)
            lag_max = multihost_utils.process_allgather(np.int32(lag_max)).max()
        self._lags = {
            "policy_lag_mean": float(row_lag / len(all_rewards)),
            "policy_lag_max": int(lag_max),
            "token_lag_mean": float(lag_sum / max(token_count, 1)),
            # As counted when the batch's last group was accepted (the sampler, ahead,
            # may have dropped more since): the same on every run.
            "groups_dropped": groups[-1].dropped,
        }
        self.spans[b] = (groups[0].read_s, groups[-1].read_s)
        fresh = rollouts.Fresh(
            prompt_ids=cat("prompt_ids"),
            prompt_mask=cat("prompt_mask"),
            completion=completion,
            rewards=rewards,
            reward_mean=float(all_rewards.mean()),
            reward_errors=int(errors),
            lengths=all_lengths,
            diagnostics=scoring.completion_stats(
                all_rewards, all_lengths, int(truncated), self.group_size
            ),
            decoded_row_steps=int(decoded),
            useful_row_steps=int(useful),
        )
        fresh = disjoint_lib.to_trainer(self.run, self._rows, fresh)
        seconds = self.spans[b][1] - self.spans[b][0]
        return fresh, disjoint_lib.put_rows(self.run, self._rows, rows), seconds

    # ---- the sampler's thread

    def _work(self):
        try:
            stream = self.stream
            while self._accepted < self.batches * self.prompts and not self._closing:
                version = self.version_for(self._accepted)
                if version != stream.version:
                    params = self._weights(version)
                    if params is None:
                        return
                    stream.set_params(params, version)
                start = time.time()
                while stream.can_submit() and not self._closing:
                    self._submit()
                for group in stream.advance():
                    self._take_group(group)
                self.busy_s += time.time() - start
            with self._cv:
                self._finished = True
                self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - re-raised on the training thread
            with self._cv:
                self._failure = e
                self._cv.notify_all()

    def _weights(self, version):
        """The weights of `version`, once the trainer hands them over (None: closing)."""
        with self._cv:
            self._blocked_on = version
            self._cv.notify_all()
            self._cv.wait_for(lambda: version in self._mailbox or self._closing)
            self._blocked_on = None
            if self._closing:
                return None
            for old in sorted(v for v in self._mailbox if v <= version):
                params = self._mailbox.pop(old)
            return params

    def _submit(self):
        """The next generation: the prompts and key colocated training would use at step
        g K, queued behind the ones in flight."""
        g = self._submitted
        prompts = rollouts.gather_prompts(self.run.sampler, next(self._prompt_iter), self._block)
        key = jax.random.split(jax.random.fold_in(self.base_key, g * self.k), 3)[0]
        self.stream.submit(
            prompts["prompt_ids"],
            prompts["prompt_mask"],
            key,
            row_block=prompts.get("row_block", (0, 1)),
        )
        keep = ("prompt_ids", "prompt_mask", "answer", "prompt_text")
        self._inputs[g] = {k: np.asarray(prompts[k]) for k in keep if k in prompts}
        self._out[g] = 0
        self._submitted += 1

    def _take_group(self, group: stream_lib.Group):
        """Scores a completed group and accepts it into the next batch, or drops it when
        its lag at that batch's step would exceed max_policy_lag."""
        g, i = group.generation, group.index
        inputs = self._inputs[g]
        self._out[g] += 1
        if self._out[g] == self.prompts:
            del self._inputs[g], self._out[g]
        batch = self._accepted // self.prompts
        if batch * self.k - group.version > self.max_lag:
            self._dropped += 1
            self._dropped_tokens += int(np.sum(jax.device_get(group.lengths)))
            return
        host = {k: np.asarray(v) for k, v in jax.device_get(dataclasses.asdict(group)).items()}
        rewards, errors, truncated = scoring.score_completions(
            self.run.task,
            self.run.tokenizer,
            self.run.sampler.stop_ids,
            {k: v[i : i + 1] for k, v in inputs.items()},
            host["tokens"],
            host["lengths"],
            self.group_size,
        )
        repeat = lambda x: np.repeat(x[i : i + 1], self.group_size, axis=0)
        accepted = _Accepted(
            repeat(inputs["prompt_ids"]),
            repeat(inputs["prompt_mask"]),
            host["tokens"],
            host["mask"],
            host["logprobs"],
            host["lengths"],
            host["versions"],
            rewards,
            group.version,
            errors,
            truncated,
            self.stream.decode_steps * self.stream.engine.slots,
            self.stream.useful_row_steps - self._dropped_tokens,
            self._dropped,
            time.time(),
        )
        with self._cv:
            self._ready[self._accepted] = accepted
            self._accepted += 1
            self._cv.notify_all()
