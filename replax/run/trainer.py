"""The RL loop: generate -> score -> add -> sample -> step.

Each generating step samples R = prompts_per_step x group_size fresh rollouts with the
KV-cache sampler, scores them on the host (the only host round trip: completions out,
rewards in), freezes their group advantages and behaviour log-probs, adds them to the
replay store, samples a batch of B, and takes one optimizer step. On-policy training is
the special case N = B = R.

`train` takes the run spec (`replax.config.spec.RunSpec`; a ConfigDict is parsed into one, once,
on the way in), makes the run in the stages of `replax.run.assemble` (build, prepare_data,
initial_params, init_states), resumes from its newest readable checkpoint, and runs the
loop; `run_loop` reads top to bottom, one phase of a step under each capitalised comment.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from replax.config import spec as spec_lib
from replax.core import lost_host, processes
from replax.replay import auto as auto_replay
from replax.replay import schedules
from replax.rl import train_step as train_step_lib
from replax.run import checkpoint as checkpoint_lib
from replax.run import frozen_base, progress, runtime, steps
from replax.run import metrics as metrics_lib
from replax.run.assemble import (
    Data,
    Run,
    abstract_states,
    build,
    init_states,
    initial_params,
    prepare_data,
)
from replax.run.disjoint import DisjointRollouts
from replax.run.streaming import StreamRollouts


def train(
    spec: spec_lib.RunSpec | ml_collections.ConfigDict, workdir: str, log=print
) -> dict[str, Any]:
    """Runs (or resumes) one RL run in workdir. Returns a summary dict.

    Raises ConfigError before anything is written for a bad config or workdir, and
    runtime.Preempted after checkpointing when SIGTERM or SIGINT stopped the run."""
    if not isinstance(spec, spec_lib.RunSpec):  # the notebook's and the tests' entry
        spec = spec_lib.parse(spec)
    runtime.check_workdir(workdir)
    run = build(spec, workdir)
    # Warnings (a checkpoint set aside) go to stderr; with several processes, process 0
    # alone reports.
    warn = functools.partial(print, file=sys.stderr)
    if jax.process_index() != 0:
        log = warn = _silent
    if (slow := progress.slow_backend_warning(spec)) is not None:
        warn(slow)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    has_checkpoint = os.path.isdir(ckpt_dir) and any(n.isdigit() for n in os.listdir(ckpt_dir))
    config = spec.to_dict()  # the run's config.json
    runtime.check_resume_config(workdir, config, has_checkpoint)
    os.makedirs(workdir, exist_ok=True)
    with runtime.WorkdirLock(workdir):
        runtime.record_run_config(workdir, config)
        data = prepare_data(run)
        skipped = data.skipped_line(spec.rollout.max_prompt_len)
        if skipped:
            log(skipped)
        checkpointer = checkpoint_lib.Checkpointer(ckpt_dir, max_to_keep=spec.checkpoint_keep)
        stop = runtime.StopRequest().install()
        try:
            prompt_iter = iter(data.prompts)
            states = restore(run, checkpointer, prompt_iter, log, warn)
            if states is None:  # a new run (or none of its checkpoints was readable)
                params = initial_params(run, data, log, stop)
                states = (*init_states(run, params), new_loop_state(run))
                # With LoRA, the frozen base stored (or named) once, outside the steps.
                states[2].lora_base = frozen_base.save_base(run, states[0].params)
            for line in progress.banner(run, states[0]):
                log(line)
            summary = run_loop(
                run, data, checkpointer, *states, prompt_iter, stop, log=log, config=config
            )
            # The prompts the data set left out: split -> [skipped, of how many].
            return {**summary, "skipped_prompts": dict(data.skipped_prompts)}
        finally:
            stop.restore()
            checkpointer.close()


@dataclasses.dataclass
class LoopState:
    """What the loop carries across steps besides the device states; checkpointed."""

    step: int
    account: metrics_lib.ComputeAccount
    base_accuracy: float | None
    wall_s: float
    schedule: schedules.Schedule
    # Steps whose loss, gradient or update was not finite: they changed nothing.
    skipped_steps: int = 0
    # Completions whose reward function raised (each scored 0), since the run began.
    reward_errors: int = 0
    # Disjoint placement: the generation in flight at the checkpoint, finished into it
    # (replax.run.disjoint.DisjointRollouts.pending_state), until the loop takes it back.
    pending: dict[str, Any] | None = None
    # With LoRA, the base the adapters belong to (`frozen_base.fingerprint`); None without.
    lora_base: dict[str, str] | None = None

    def state_dict(self, wall_s: float) -> dict[str, Any]:
        return {
            "lora_base": self.lora_base,
            "step": self.step,
            "account": self.account.as_dict(),
            "base_accuracy": self.base_accuracy,
            "wall_s": wall_s,
            "auto_replay": self.schedule.state_dict(),
            "skipped_steps": self.skipped_steps,
            "reward_errors": self.reward_errors,
        }


def new_loop_state(run: Run) -> LoopState:
    return LoopState(0, metrics_lib.ComputeAccount(), None, 0.0, run.schedule)


def restore(run: Run, checkpointer, prompt_iter, log=print, warn=print):
    """(train_state, replay_state, LoopState) of the newest sealed, intact checkpoint, the
    prompt iterator restored in place; None when there is none. `warn` gets a line for
    each checkpoint set aside on the way."""
    abstract_train, replay_state = abstract_states(run)  # the structure and shardings to fill
    restored = checkpointer.restore_latest(
        train_state=frozen_base.stored(run, abstract_train),
        replay_state=replay_state,
        data_iterator=prompt_iter,
        log=warn,
    )
    if restored is None:
        return None
    train_state, replay_state, saved = restored
    loop = new_loop_state(run)
    # With LoRA the step holds the adapters: their base, checked, completes the params.
    loop.lora_base = saved.get("lora_base")
    base = frozen_base.load_base(run, loop.lora_base, abstract_train.params)
    train_state = frozen_base.whole(run, train_state, base)
    if saved.get("auto_replay"):
        loop.schedule = auto_replay.AutoReplayController.from_state_dict(saved["auto_replay"])
    loop.step, loop.wall_s = saved["step"], saved["wall_s"]
    loop.base_accuracy = saved["base_accuracy"]
    loop.account = metrics_lib.ComputeAccount.from_dict(saved["account"], run.spec.train.batch_size)
    loop.skipped_steps = saved.get("skipped_steps", 0)
    loop.reward_errors = saved.get("reward_errors", 0)
    if saved.get("pending"):
        loop.pending = {**saved["pending"], "arrays": saved["pending_arrays"]}
    log(f"resumed from step {loop.step}")
    return train_state, replay_state, loop


def run_loop(
    run: Run,
    data: Data,
    checkpointer,
    train_state,
    replay_state,
    loop: LoopState,
    prompt_iter,
    stop=None,
    log=print,
    *,
    config: Mapping[str, Any],
):
    """The RL loop from loop.step to total_steps, or until `stop` (a runtime.StopRequest)
    is requested: then it checkpoints the step it finished and raises runtime.Preempted.
    `config` is the run's config.json (run.spec.to_dict()), given to the metrics writer."""
    c, evaluator, schedule, account = run.spec, data.evaluator, loop.schedule, loop.account
    if loop.base_accuracy is None:
        log(f"evaluating the base policy on {len(evaluator.examples)} held-out prompts ...")
        loop.base_accuracy = evaluator.accuracy(train_state.params, jax.random.key(0))
        log(f"base held-out accuracy {loop.base_accuracy:.3f}")
    writer, bar = _outputs(run, loop, config)
    # The schedule's rate of each optimizer update, looked up on the host.
    learning_rates = train_step_lib.learning_rates(c.optimizer, c.total_steps)
    idle = steps.nothing_generated(run)
    base_key, record, stopping = jax.random.key(c.seed), {}, False
    gen_key = steps.rollout_key(base_key)  # colocated: a rollout's key is its place in the run
    t_start = time.time() - loop.wall_s
    disjoint = None
    if c.rollout.placement == "disjoint":  # the sampler on its own devices, in a thread
        sampler_side = StreamRollouts if c.rollout.stream else DisjointRollouts
        disjoint = sampler_side(run, base_key, c.total_steps)
        disjoint.resume(loop.step, loop.pending)
        loop.pending = None
    spent = lambda: bool(c.total_rollouts) and account.gen_rollouts >= c.total_rollouts
    for step in range(loop.step, c.total_steps):
        if spent():
            break  # a resumed run that had already spent its rollout budget
        t_step = time.time()
        if step == c.total_steps - 1:
            bar.doing(step, "last step")
        sample_key = replay_key(base_key, step)
        generated, trains = schedule.should_generate(step), schedule.should_train(step)
        max_age = schedule.max_age()
        once = schedule.draw_once if schedule.varies_training else None
        # Skipped steps, and steps that did not train, did not advance the optimizer's
        # count of updates.
        learning_rate = learning_rates[account.updates - loop.skipped_steps]
        fresh = steps.fresh_rollouts(
            run,
            disjoint,
            step,
            train_state.params,
            prompt_iter,
            gen_key,
            generated,
            idle,
            account.gen_rollouts,
        )
        t1 = time.time()
        replay_state, train_state, step_metrics, stats = steps.add_sample_and_train(
            run,
            replay_state,
            train_state,
            fresh,
            step,
            sample_key,
            max_age,
            trains,
            once,
        )
        train_s = time.time() - t1
        loop.skipped_steps += int(step_metrics.pop("skipped"))
        loop.reward_errors += int(fresh.rollouts.reward_errors or 0)
        # ACCOUNTING AND METRICS
        record = steps.step_record(
            run,
            loop,
            fresh,
            stats,
            step_metrics,
            train_s,
            t_start,
            trained=trains,
            batch_size=run.steps_for(once)[2],
        )
        # The float32 rate as its shortest decimal (1e-4, not 9.99999974e-05).
        record["learning_rate"] = float(str(learning_rate))
        if disjoint is not None:
            record.update(
                steps.placement_record(disjoint, loop, step, fresh, t_start),
                train_start_s=t1 - t_start,
                train_end_s=t1 + train_s - t_start,
            )
        loop.step = step + 1
        lost_host.report("step", loop.step)
        last = loop.step == c.total_steps or spent()
        if c.eval.every and (loop.step % c.eval.every == 0 or last):
            bar.doing(loop.step, f"evaluating on {len(evaluator.examples)} held-out prompts")
            eval_metrics, samples = evaluator.evaluate(train_state.params, eval_key(c.seed))
            record.update(eval_metrics)
            writer.write_samples(loop.step, samples)
        # The step's wall time up to its record: generation, training and evaluation.
        record["step_s"] = time.time() - t_step
        if loop.step % c.log_every == 0 or "eval_accuracy" in record:
            writer.write(loop.step, record)
        bar.update(
            loop.step,
            record["reward_mean"],
            account.gen_tokens,
            account.gen_s,
            record.get("eval_accuracy"),
        )
        # CHECKPOINT, also when asked to stop (every process agrees on the step)
        stopping = _checkpoint_if_due(
            run,
            checkpointer,
            loop,
            train_state,
            replay_state,
            prompt_iter,
            stop,
            last,
            t_start,
            log,
            disjoint,
        )
        if last or stopping:
            break
    if disjoint is not None:
        disjoint.close()
    bar.close()
    writer.close()
    if stopping and not last:
        raise runtime.Preempted(stop.signal_name if stop else "preemption", loop.step)
    final = record.get("eval_accuracy")
    if final is None:
        log(f"final evaluation on {len(evaluator.examples)} held-out prompts ...")
        final = evaluator.accuracy(train_state.params, jax.random.key(0))
    return {
        "base_accuracy": loop.base_accuracy,
        "final_accuracy": final,
        "steps": account.steps,
        "wall_s": time.time() - t_start,
        **account.as_dict(),
    }


def _outputs(run: Run, loop: LoopState, config: Mapping[str, Any]):
    """The run's metrics writer and progress bar (process 0's; silent on the others)."""
    c, primary = run.spec, jax.process_index() == 0
    writer = metrics_lib.MetricsWriter(
        run.workdir,
        resume_step=loop.step,
        enabled=primary,
        config=dict(config),
        wandb_mode=c.log.wandb_mode if c.log.wandb else None,
    )
    bar = progress.make_progress(
        c.total_steps, loop.step, print_every_s=c.log.print_every_s, enabled=primary
    )
    return writer, bar


def replay_key(base_key, step: int):
    """The key the loop step that takes the run from `step` to step + 1 steps done draws
    its replay batch with: the second of fold_in(key(seed), step) split 3 ways (the other
    two, once the step's generation and evaluation keys, are no longer drawn from; the
    split stays so that a run's replay draws are those of the runs made before)."""
    return jax.random.split(jax.random.fold_in(base_key, step), 3)[1]


def eval_key(seed: int):
    """The key every held-out evaluation of the run draws its temperature-1 samples with
    (scripts/evaluate.py too): the same at every checkpoint and in every design, so that
    pass@k compares policies, not draws."""
    return jax.random.fold_in(jax.random.key(seed), 2**31 - 2)


def _checkpoint_if_due(
    run: Run,
    checkpointer,
    loop: LoopState,
    train_state,
    replay_state,
    prompt_iter,
    stop,
    last,
    t_start,
    log,
    disjoint=None,
) -> bool:
    """Saves the step just finished when it is due, the last one, or the run is asked to
    stop (by `stop` on any process, or by the checkpointer's preemption notice); never from
    a non-finite state. Returns whether the run stops here."""
    c = run.spec
    asked = processes.any_process(stop is not None and stop.requested)
    stopping = asked or checkpointer.reached_preemption(loop.step)
    saving = loop.step % c.checkpoint_every == 0 or last or stopping
    if saving and not train_step_lib.all_finite(train_state):
        log(f"step {loop.step}: the train state is not finite; no checkpoint written")
    elif saving:
        # A generation in flight is finished and stored with the step (disjoint placement).
        pending = None if disjoint is None else disjoint.pending_state()
        loop_state = loop.state_dict(wall_s=time.time() - t_start)
        if pending is not None:
            loop_state["pending"] = {k: v for k, v in pending.items() if k != "arrays"}
        checkpointer.save(
            loop.step,
            train_state=frozen_base.stored(run, train_state),
            replay_state=replay_state,
            loop_state=loop_state,
            data_iterator=prompt_iter,
            pending=None if pending is None else pending["arrays"],
        )
    return stopping


def _silent(*args, **kwargs) -> None:
    del args, kwargs
