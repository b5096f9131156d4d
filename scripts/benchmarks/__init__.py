"""The measurements of scripts/bench.py, one module per thing measured (bench.py's
docstring says what each key means), and what other benchmark scripts share: `common`
(timing, the machine probe, the JSON a script hands back), `abstract_step` (the train step
compiled from abstract inputs, scripts/memory.py's). replax is imported inside the
functions, so that `--only` loads only what it runs."""
