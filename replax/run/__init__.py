"""A run: assembled from a spec, trained, checkpointed, observed.

- `assemble`: the mesh, model, sampler, replay store and train step of a spec
  (`build`, `assemble`), the prompt data, the initial parameters.
- `trainer`: the RL loop (`train`, `run_loop`).
- `steps`: one step's phases: the fresh rollouts, add / sample / train, its record.
- `disjoint`: disjoint placement's sampler thread, its weight sync and hand-over.
- `warmstart`: the SFT warm start of a model that cannot yet earn rewards.
- `checkpoint`: sealed orbax checkpoints of the train state and replay store.
- `frozen_base`: with LoRA, the adapters in each checkpoint, the frozen base once.
- `runtime`: workdir lock, resume checks, preemption (SIGTERM stops after a step).
- `metrics`: metrics.jsonl, tensorboard and wandb, and the compute account.
- `progress`: the progress bar and log lines.

May import: core, text, tasks, model, hf, sampling, replay, rl, config.
"""
