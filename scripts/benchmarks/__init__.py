"""The measurements of scripts/bench.py, one module per thing measured (bench.py's
docstring says what each key means). replax is imported inside the functions, so that
`--only` loads only what it runs."""
