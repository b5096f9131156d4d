"""What the scripts drive: command lines, comparisons and ahead-of-time compiles.

- `experiments`: config files and overrides from a command line, runs that are reused
  when finished, evaluation of checkpoints, reports.
- `analysis`: the figures of a comparison (tokens and cost to a target accuracy,
  medians, entropy at equal accuracy) from runs' metrics.
- `aot`: every program of a run lowered and compiled for a TPU topology on any host,
  with the compiler's memory and cost analysis.
- `report`: a study's files (JSON, markdown tables, the machine it ran on).
- `transfer`: a run's greedy accuracy on the shortest questions of a GSM8K file, and a
  study's transfer figures.
- `study_plan`, `lr_selection`, `study_report`, `study_render`: scripts/compare.py's
  study: every run's config and the runs, each variant's learning rate, compare.json's
  figures, and compare.md with the plots (and sweep.py's heat map).
- `run_store`: a run's identity by its settings, and the small files kept of it so a
  study is rebuilt from committed runs.
- `tpu_targets`: TPU slices by name, their chips' published figures, the roofline.

May import: core, text, tasks, model, hf, sampling, replay, rl, config, run.
"""
