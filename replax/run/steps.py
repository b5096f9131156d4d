"""One step of the RL loop, in the phases `replax.run.trainer.run_loop` calls in turn:
the fresh rollouts (generated here, or taken from the disjoint sampler), the add, sample
and train step on the devices, and the step's record with its cost accounted."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from replax.core import processes, sharding
from replax.model import flops as flops_lib
from replax.rl import rollouts
from replax.run import metrics as metrics_lib
from replax.run.assemble import Run


@dataclasses.dataclass
class StepRollouts:
    """A step's fresh rollouts (`idle` when it generated none) and what they cost."""

    rollouts: rollouts.Fresh
    generated: bool
    gen_s: float
    # Disjoint placement: the step of the policy that generated them (None: colocated).
    version: int | None = None
    disjoint: bool = False


def rollout_key(base_key):
    """The key colocated generation folds each rollout's index in the run into. Designs
    that generate different numbers a step (on-policy's 64, replay's 16) then draw the same
    rollout of the stream alike, from the same prompt (the prompt stream has one order
    whatever the batch): they differ by design, not by draws (common random numbers). The
    index folded in here is beyond any step number's. Disjoint placement folds in the same
    indices: generation g holds rollouts [g R, (g + 1) R)."""
    return jax.random.fold_in(base_key, 2**31 - 1)


def fresh_rollouts(
    run: Run, disjoint, step, params, prompt_iter, key, generated, idle, first_rollout=0
) -> StepRollouts:
    """GENERATE R rollouts (G completions of each prompt) and SCORE them on the host; with
    disjoint placement, take the sampler thread's finished ones and hand it the next.
    Colocated, rollout i of the step draws from fold_in(key, first_rollout + i): key is
    the run's and first_rollout the rollouts generated before the step, so a rollout's
    draws follow from its place in the run's stream, not from the step that made it."""
    if disjoint is not None:
        fresh, version, gen_s = disjoint.step(step, params, prompt_iter)
        return StepRollouts(fresh or idle, fresh is not None, gen_s, version, disjoint=True)
    if not generated:
        return StepRollouts(idle, False, 0.0)
    t0 = time.time()
    c = run.spec
    prompts, g = next(prompt_iter), c.rollout.group_size
    fresh = rollouts.generate_and_score(
        run.sampler, run.task, run.tokenizer, g, params, prompts, key, first_rollout
    )
    return StepRollouts(fresh, True, time.time() - t0)


def add_sample_and_train(
    run: Run,
    replay_state,
    train_state,
    fresh: StepRollouts,
    step,
    key,
    max_age,
    trains=True,
    once=None,
):
    """ADD the fresh rollouts, SAMPLE a batch, STEP the optimizer, on the devices (no
    step when `trains` is false: the train step's metrics are then None). once: None
    (fixed mode), or whether the batch is fresh rollouts drawn once each (auto mode).
    Returns (replay_state, train_state, step_metrics, stats) on the host."""
    made = fresh.rollouts
    varies = {}
    if once is not None:  # auto mode: the same program whether it trains or not
        varies = dict(once=jnp.bool_(once), train=jnp.bool_(trains))
    add_and_sample, train_step, _ = run.steps_for(once)
    replay_state, batch, stats = add_and_sample(
        replay_state,
        made.prompt_ids,
        made.prompt_mask,
        made.completion,
        jnp.asarray(made.rewards),
        jnp.int32(step),
        key,
        jnp.bool_(fresh.generated),
        jnp.int32(max_age),
        _version(fresh, step),
        **varies,
    )
    if not trains:  # the same keys as a trained step's record, without values
        keys = _train_metric_keys(run, train_step, train_state, batch)
        return (
            replay_state,
            train_state,
            {**dict.fromkeys(keys), "skipped": 0},
            (jax.device_get(stats)),
        )
    train_state, step_metrics = train_step(train_state, batch)
    step_metrics, stats = jax.device_get((step_metrics, stats))
    return replay_state, train_state, step_metrics, stats


def _useful_row_steps(fresh: rollouts.Fresh) -> int:
    """Decoded row-steps that produced a kept token: the completions' own tokens, unless
    the sampler counted them itself (a stream's batch holds tokens decoded in the row-steps
    of earlier batches)."""
    if fresh.useful_row_steps is not None:
        return fresh.useful_row_steps
    return int(fresh.lengths.sum())


def _version(fresh: StepRollouts, step):
    """Disjoint: the generating policy's step, so that ages count from it (the stream: per
    row, on the trainer's mesh, on every step); colocated: None (the step itself)."""
    if not fresh.disjoint:
        return None
    if fresh.version is None:
        return jnp.int32(step)
    return fresh.version if np.ndim(fresh.version) else jnp.int32(fresh.version)


# The train step's metric names, per compiled train step (traced once, not per step).
_TRAIN_KEYS: dict[int, tuple[str, ...]] = {}


def _train_metric_keys(run: Run, train_step, train_state, batch) -> tuple[str, ...]:
    jitted = train_step.jitted
    if id(jitted) not in _TRAIN_KEYS:
        with sharding.activation_rules(run.mesh, run.rules):
            _, shapes = jax.eval_shape(jitted, train_state, batch)
        _TRAIN_KEYS[id(jitted)] = tuple(shapes)
    return _TRAIN_KEYS[id(jitted)]


def nothing_generated(run: Run) -> rollouts.Fresh:
    """What a step without fresh rollouts feeds the add-and-sample (which stores none)."""
    c = run.spec
    return rollouts.nothing_generated(
        run.rollouts_per_step,
        c.rollout.max_prompt_len,
        c.rollout.max_new_tokens,
        run.mesh,
        run.rules,
        token_versions=c.rollout.stream,
    )


def step_record(
    run: Run,
    loop,
    step_rollouts: StepRollouts,
    stats,
    step_metrics,
    train_s,
    t_start,
    trained=True,
    batch_size=None,
):
    """The metrics of one loop step, after accounting its cost and telling the schedule
    what it took; seconds are process 0's on every process (auto replay plans by them).
    batch_size: the rollouts the step trained on (None: train.batch_size)."""
    account, schedule = loop.account, loop.schedule
    fresh, generated = step_rollouts.rollouts, step_rollouts.generated
    seconds = processes.from_process_zero(np.array([step_rollouts.gen_s, train_s]))
    gen_s, train_s = (float(t) for t in seconds)
    passes = None
    if trained:  # a step that did not train logs its train metrics as null
        passes = flops_lib.TrainPasses(
            forward=float(step_metrics["forward_passes"]),
            backward=float(step_metrics["backward_passes"]),
        )
    account_step(
        account,
        run,
        fresh.lengths,
        gen_s,
        train_s,
        fresh.decoded_row_steps,
        passes,
        trained=trained,
        batch_size=batch_size,
    )
    kept = int(stats["rollouts_kept"]) if generated else None
    schedule.observe(
        gen_s=gen_s if generated else None,
        train_s=train_s if trained else None,
        stats=step_metrics if trained else None,
        kept=kept,
    )
    return {
        "wall_s": time.time() - t_start,
        **account.as_dict(),
        "mu_measured": account.mu_measured(),
        # A step that generates nothing has no reward (nor completions) to report.
        "reward_mean": fresh.reward_mean,
        # Cumulative, as skipped_steps.
        "reward_errors": loop.reward_errors,
        **fresh.diagnostics,
        "gen_tokens_per_s": int(fresh.lengths.sum()) / gen_s if generated and gen_s else None,
        # Decoded row-steps that produced a kept token: what the rollout engine raises.
        "useful_row_step_frac": (
            _useful_row_steps(fresh) / fresh.decoded_row_steps
            if generated and fresh.decoded_row_steps
            else None
        ),
        "skipped_steps": loop.skipped_steps,
        **stats,
        "rollout_entropy": float(stats["rollout_entropy"]) if generated else None,
        **step_metrics,
        **schedule.metrics(),
    }


def placement_record(disjoint, loop, step, fresh: StepRollouts, t_start):
    """Disjoint placement's metrics: how far behind the fresh rollouts' policy was, how
    busy each side was, the last weight transfer, and replay's realised ratio."""
    wall = max(time.time() - t_start, 1e-9)
    account = loop.account
    generated = fresh.generated
    # When the generation added now ran, in seconds of the run (none for one finished
    # into a checkpoint before a resume).
    span = disjoint.spans.pop(disjoint.consumed, None) if generated else None
    return {
        "gen_start_s": None if span is None else span[0] - t_start,
        "gen_end_s": None if span is None else span[1] - t_start,
        **disjoint.policy_lag(step, fresh),
        "sampler_busy_frac": disjoint.busy_s / wall,
        "trainer_busy_frac": account.train_s / wall,
        "sync_s": disjoint.sync_s,
        "sync_bytes": disjoint.sync_bytes,
        "wait_s": disjoint.wait_s if generated else 0.0,
        "replay_ratio_realised": account.train_rollouts / max(account.gen_rollouts, 1),
    }


def account_step(
    account: metrics_lib.ComputeAccount,
    run: Run,
    lengths,
    gen_s,
    train_s,
    decoded_row_steps: int | None = None,
    passes: flops_lib.TrainPasses | None = None,
    trained: bool = True,
    batch_size: int | None = None,
) -> None:
    """Adds one step's generation (lengths int[R] of the completions, or None when the
    step generated nothing; decoded_row_steps: the row-steps the sampler decoded, None:
    R x the longest, as the static sampler does) and training (none when not `trained`)
    to the compute account; passes: what the train step ran (its `forward_passes` and
    `backward_passes` metrics; None: one forward and one backward); batch_size: the
    rollouts trained on (None: train.batch_size)."""
    passes = passes or flops_lib.TrainPasses()
    c, r, b = run.spec, run.rollouts_per_step, batch_size or run.spec.train.batch_size
    if lengths is not None:
        account.gen_tokens += int(lengths.sum())
        decoded = r * int(lengths.max()) if decoded_row_steps is None else decoded_row_steps
        account.gen_flops += flops_lib.generate_flops(
            run.model_config, r, c.rollout.max_prompt_len, 0, run.seq_len
        ) + decoded * flops_lib.forward_flops_per_token(run.model_config, run.seq_len)
        account.gen_rollouts += r
    account.gen_s += gen_s
    account.steps += 1
    if trained:
        account.train_flops += flops_lib.train_flops(run.model_config, b, run.seq_len, passes)
        account.train_cost += b * passes.relative_cost
        account.train_s += train_s
        account.train_rollouts += b
        account.updates += 1
