"""From a config file to a typed, validated run specification.

- `sections`: the typed sections (model, rollout, replay, loss, train, ...), each with
  its keys' checks.
- `spec`: `RunSpec`, built from an ml_collections config (unknown keys refused).
- `validation`: the rules that span sections.
- `migration`: renamed keys of older configs and checkpoints.
- `build`: the model config, tokenizer, task and schedule a spec describes, and the
  checks against the machine.

May import: core, text, tasks, model, hf, sampling, replay, rl.
"""
