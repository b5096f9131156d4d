"""The RL algorithm: rollouts in, one optimizer step out.

- `rollouts`: generate a step's rollouts, score them (the task's reward), group-normalise
  advantages.
- `scoring`: completions scored on the host (a whole generation or a stream's group) and
  the statistics a generating step reports of them.
- `objectives`: the per-token losses (clipped surrogate with the off-policy correction,
  KL, entropy) and the covariance-based entropy controls.
- `gradients`: the loss and its gradient over microbatches (log-probs chunked).
- `train_step`: the compiled, sharded optimizer step.
- `placement`: the plan of disjoint placement: the sampler's devices and the fixed
  schedule of its generations.
- `weight_sync`: the weight copy to a disjoint sampler (with LoRA, the adapters alone).
- `evaluation`: greedy accuracy and pass@k on held-out prompts.

May import: core, text, tasks, model, sampling, replay.
"""
