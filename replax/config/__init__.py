"""From a config file to a typed, validated run specification.

- `sections`: the typed sections of what a run is made of (model, tokenizer, mesh, task,
  warm start, logging), each with its keys' checks.
- `learning`: the sections of how it learns (rollout, replay, loss, optimizer, train,
  eval).
- `spec`: `RunSpec`, built from an ml_collections config (unknown keys refused).
- `validation`: the rules that span sections.
- `migration`: renamed keys of older configs and checkpoints.
- `build`: the model config, tokenizer, task and schedule a spec describes, and the
  checks against the machine.

May import: core, text, tasks, model, hf, sampling, replay, rl.
"""
