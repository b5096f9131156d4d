"""What the scripts drive: command lines, comparisons and ahead-of-time compiles.

- `experiments`: config files and overrides from a command line, runs that are reused
  when finished, evaluation of checkpoints, reports.
- `analysis`: the figures of a comparison (tokens and cost to a target accuracy,
  medians, entropy at equal accuracy) from runs' metrics.
- `aot`: every program of a run lowered and compiled for a TPU topology on any host,
  with the compiler's memory and cost analysis.
- `tpu_targets`: TPU slices by name, their chips' published figures, the roofline.

May import: core, text, tasks, model, hf, sampling, replay, rl, config, run.
"""
