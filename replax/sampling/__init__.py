"""Generation: the jitted KV-cache sampler that returns behaviour log-probs.

- `distributions`: temperature and top-p sampling of a token from logits.
- `decode`: prefill and the decode loop (a `lax.while_loop` over tokens, stopping when
  every row has ended) with the KV cache.
- `sampler`: `Sampler`, the compiled, sharded entry point the run and the evaluator call.
- `engine`: the rollout engine, continuous batching: `Engine` stands where a `Sampler`
  does, S slots refilled from a queue, the rollouts the sampler's with rollout keys.
- `slots`: the engine's traced program (slots, the prefilled queue, harvest, refill, the
  decode chunk).
- `stream`: the engine's slots kept full across generations: groups handed out as they
  complete, every token stamped with the policy version it was sampled under.
- `lowering`: its decode program and prefill lowered ahead of time from abstract inputs.

May import: core, model.
"""
